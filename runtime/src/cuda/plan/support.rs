//! Which instructions the CUDA backend runs: element types, opcodes, the
//! custom-calls it knows, and `check_supported`, which names every
//! unsupported instruction of every computation the module runs at once.
//!
//! Invariant: `plan_module` plans every instruction these checks accept, or
//! fails naming it (attribute combinations such as a bitcast-convert
//! between widths are rejected only there).

use xla_hlo_ir::{AttrKey, HloInstruction, HloModule, Opcode, PrimitiveType};

/// Element types the CUDA backend handles (storage and arithmetic).
pub fn supported_type(ty: PrimitiveType) -> bool {
    use PrimitiveType as T;
    matches!(
        ty,
        T::Pred
            | T::S8
            | T::S16
            | T::S32
            | T::S64
            | T::U8
            | T::U16
            | T::U32
            | T::U64
            | T::F16
            | T::Bf16
            | T::F32
            | T::F64
            | T::F8E5M2
            | T::F8E4M3FN
            | T::C64
            | T::C128
    )
}

/// Opcodes the CUDA backend plans (everything else is a compile error).
pub fn supported_opcode(op: Opcode) -> bool {
    use Opcode as O;
    super::opcodes::un_op(op).is_some()
        || super::opcodes::bin_op(op).is_some()
        || matches!(
            op,
            O::Parameter
                | O::Constant
                | O::Tuple
                | O::GetTupleElement
                | O::Select
                | O::Compare
                | O::Convert
                | O::BitcastConvert
                | O::ReducePrecision
                | O::Copy
                | O::Bitcast
                | O::Broadcast
                | O::Reshape
                | O::Transpose
                | O::Slice
                | O::Iota
                | O::Reduce
                | O::ReduceWindow
                | O::SelectAndScatter
                | O::Dot
                | O::Convolution
                | O::Fft
                | O::Clamp
                | O::Concatenate
                | O::Pad
                | O::Reverse
                | O::DynamicSlice
                | O::DynamicUpdateSlice
                | O::Gather
                | O::Scatter
                | O::Sort
                | O::TopK
                | O::While
                | O::Conditional
                | O::Call
                | O::PartitionId
                | O::ReplicaId
                | O::OptimizationBarrier
                | O::AddDependency
                | O::AfterAll
                | O::AllReduce
                | O::AllGather
                | O::AllToAll
                | O::ReduceScatter
                | O::CollectivePermute
                | O::CollectiveBroadcast
                | O::AllReduceStart
                | O::AllReduceDone
                | O::AllGatherStart
                | O::AllGatherDone
                | O::CollectivePermuteStart
                | O::CollectivePermuteDone
                | O::AsyncStart
                | O::AsyncUpdate
                | O::AsyncDone
                | O::CopyStart
                | O::CopyDone
        )
}

/// Custom-calls that are the identity on one device (annotations), as the
/// interpreter defines them.
pub fn is_identity_custom_call(ins: &HloInstruction) -> bool {
    ins.opcode == Opcode::CustomCall
        && ins.operands.len() == 1
        && ins
            .ident_attr(AttrKey::CustomCallTarget)
            .is_some_and(xla_hlo_evaluator::collective::is_identity_custom_call)
}

/// `custom-call(x), custom_call_target="Sharding"` (a sharding annotation:
/// the identity on one device).
pub fn is_sharding_annotation(ins: &HloInstruction) -> bool {
    is_identity_custom_call(ins) && ins.ident_attr(AttrKey::CustomCallTarget) == Some("Sharding")
}

/// shard_map's boundary custom-calls (run on the host: the full-to-shard
/// slice and the shard-to-full gather go through the collectives layer).
pub fn is_shard_shape_custom_call(ins: &HloInstruction) -> bool {
    ins.opcode == Opcode::CustomCall
        && matches!(
            ins.ident_attr(AttrKey::CustomCallTarget),
            Some("SPMDFullToShardShape" | "SPMDShardToFullShape")
        )
}

/// jax.lax.top_k on the CPU: `custom-call(x), custom_call_target="TopK"`.
pub fn is_topk_custom_call(ins: &HloInstruction) -> bool {
    ins.opcode == Opcode::CustomCall && ins.ident_attr(AttrKey::CustomCallTarget) == Some("TopK")
}

/// Whether the backend runs this instruction (its opcode, or a known
/// custom-call).
pub fn supported_instruction(ins: &HloInstruction) -> bool {
    supported_opcode(ins.opcode)
        || is_identity_custom_call(ins)
        || is_shard_shape_custom_call(ins)
        || is_topk_custom_call(ins)
}

/// Lists every instruction the backend cannot run (opcode or element type)
/// in the computations the entry reaches by control flow (while, call,
/// conditional, async), grouped by opcode with instruction names. `Ok` when
/// all can. Reducers and comparators are checked when they are planned.
pub fn check_supported(module: &HloModule) -> Result<(), String> {
    let mut by_op: Vec<(String, Vec<String>)> = Vec::new();
    let mut push = |key: String, name: &str| match by_op.iter_mut().find(|(k, _)| *k == key) {
        Some((_, v)) => v.push(name.to_string()),
        None => by_op.push((key, vec![name.to_string()])),
    };
    let mut stack = vec![module.entry];
    let mut seen = std::collections::HashSet::new();
    while let Some(c) = stack.pop() {
        if !seen.insert(c) {
            continue;
        }
        for ins in &module.comp(c).instructions {
            if !supported_instruction(ins) {
                let key = if ins.opcode == Opcode::CustomCall {
                    format!(
                        "custom-call {:?}",
                        ins.ident_attr(AttrKey::CustomCallTarget).unwrap_or("")
                    )
                } else {
                    ins.opcode.name().to_string()
                };
                push(key, &ins.name);
                continue;
            }
            if matches!(
                ins.opcode,
                Opcode::While | Opcode::Call | Opcode::Conditional | Opcode::AsyncStart
            ) {
                stack.extend(ins.called_computations());
            }
            for leaf in ins.shape.leaves() {
                if let Some(t) = leaf.element_type() {
                    if !supported_type(t) {
                        push(format!("element type {}", t.name()), &ins.name);
                    }
                }
            }
        }
    }
    if by_op.is_empty() {
        return Ok(());
    }
    let parts: Vec<String> = by_op
        .iter()
        .map(|(k, v)| format!("{k} ({})", v.join(", ")))
        .collect();
    Err(format!(
        "not supported by the CUDA backend: {}",
        parts.join("; ")
    ))
}
