//! Which instructions take tiled shardings from propagation (XLA's
//! `SupportSpatialPartitioning`), and which custom-calls pass their
//! operand's sharding through (`IsPassthroughCustomOps`).
//!
//! Invariant: pure predicates of the graph and the pass's permissions; they
//! read no sharding.

use crate::graph::{CustomCallKind, Graph, Node};
use crate::opcodes::{elementwise_opcodes, opcodes_without_rules};
use xla_hlo_ir::Opcode;

/// Custom-call targets that always pass their operand's sharding through.
const PASS_THROUGH_TARGETS: &[&str] = &["Sharding", "X64Combine", "LayoutConstraint"];

/// Custom-call targets that pass their operand's sharding through when they
/// have one array operand of the result's rank.
const SAME_RANK_PASS_THROUGH_TARGETS: &[&str] = &[
    "ResizeNearest",
    "ResizeBilinear",
    "ResizeNearestGrad",
    "ResizeBilinearGrad",
    "Cholesky",
    "MoveToHost",
    "MoveToDevice",
    "PinToDevice",
    "PinToDeviceSram",
];

/// `IsPassthroughCustomOps`.
pub(super) fn is_pass_through_custom_call(graph: &Graph, node: Node) -> bool {
    let Some(target) = graph.custom_call_target(node) else {
        return false;
    };
    if PASS_THROUGH_TARGETS.contains(&target) {
        return true;
    }
    let instr = graph.instr(node);
    let Some(operand) = graph.operand(node, 0) else {
        return false;
    };
    if instr.operands.len() != 1
        || instr.shape.is_tuple()
        || graph.shape(operand).is_tuple()
        || graph.shape(operand).rank() != instr.shape.rank()
    {
        return false;
    }
    SAME_RANK_PASS_THROUGH_TARGETS.contains(&target)
}

/// `SupportSpatialPartitioning`: whether `node` may get a tiled sharding.
/// Roots of computations no while/conditional/call partitions never do,
/// except the entry root when `allow_output`; entry parameters only when
/// `allow_params`; rng, reverse and custom-calls only for SPMD.
pub(super) fn supports_spatial_partitioning(
    graph: &Graph,
    node: Node,
    allow_output: bool,
    allow_params: bool,
    is_spmd: bool,
) -> bool {
    if graph.is_root(node)
        && !graph.in_partitioned_callee(node)
        && !(node == graph.entry_root() && allow_output)
    {
        return false;
    }
    match graph.opcode(node) {
        elementwise_opcodes!() | Opcode::Map => true,
        Opcode::Rng | Opcode::Reverse => is_spmd,
        Opcode::Broadcast
        | Opcode::Concatenate
        | Opcode::DynamicSlice
        | Opcode::DynamicUpdateSlice
        | Opcode::Gather
        | Opcode::Pad
        | Opcode::Reshape
        | Opcode::Scatter
        | Opcode::Slice
        | Opcode::Transpose => true,
        Opcode::Convolution | Opcode::Dot => true,
        Opcode::Reduce | Opcode::ReduceWindow | Opcode::SelectAndScatter | Opcode::Sort => true,
        Opcode::Conditional
        | Opcode::GetTupleElement
        | Opcode::OptimizationBarrier
        | Opcode::Tuple
        | Opcode::While => true,
        Opcode::Constant | Opcode::Infeed | Opcode::Iota | Opcode::RngBitGenerator => true,
        Opcode::AllReduce | Opcode::CollectivePermute | Opcode::ReduceScatter => true,
        Opcode::Parameter => allow_params || graph.in_partitioned_callee(node),
        Opcode::CustomCall => {
            let barrier = matches!(
                graph.custom_call_kind(node),
                CustomCallKind::ShardBarrierFrom | CustomCallKind::ShardBarrierTo
            );
            is_spmd && (barrier || is_pass_through_custom_call(graph, node))
        }
        Opcode::AllGather
        | Opcode::AllToAll
        | Opcode::CollectiveBroadcast
        | Opcode::RaggedAllToAll
        | Opcode::TopK
        | Opcode::Call
        | Opcode::Outfeed => false,
        opcodes_without_rules!() => false,
    }
}
