//! What the scheduler needs to know about an instruction: which resource
//! (collective kind) it uses, whether it starts or ends an asynchronous
//! operation, which start a done belongs to, and the facts a cost model
//! needs about a collective (bytes moved, group size, nodes spanned).
//!
//! Invariants: classification never panics on malformed modules (dangling
//! ids, missing callees give `None`); an async start and its done always
//! report the same `ResourceKind`; `pair_start` follows `async-update`
//! chains, so a done always resolves to the start that opened it.

use xla_hlo_ir::stats::collective_output_shape;
use xla_hlo_ir::{AttrKey, CompId, HloComputation, HloInstruction, HloModule, InstrId, Opcode};

/// A resource an asynchronous operation occupies between its start and its
/// done (XLA's `ResourceType`, one per collective kind).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ResourceKind {
    AllReduce,
    AllGather,
    ReduceScatter,
    AllToAll,
    CollectivePermute,
    CollectiveBroadcast,
    RaggedAllToAll,
    Copy,
    SendRecv,
    /// Async wrappers around anything else (custom calls, fusions).
    AsyncCompute,
}

/// Number of resource kinds.
pub const NUM_RESOURCES: usize = 10;

impl ResourceKind {
    /// Every kind, in index order.
    pub const ALL: [ResourceKind; NUM_RESOURCES] = [
        ResourceKind::AllReduce,
        ResourceKind::AllGather,
        ResourceKind::ReduceScatter,
        ResourceKind::AllToAll,
        ResourceKind::CollectivePermute,
        ResourceKind::CollectiveBroadcast,
        ResourceKind::RaggedAllToAll,
        ResourceKind::Copy,
        ResourceKind::SendRecv,
        ResourceKind::AsyncCompute,
    ];

    pub fn index(self) -> usize {
        self as usize
    }

    /// Stable kebab-case name (`all-reduce`), used in reports and traces.
    pub fn name(self) -> &'static str {
        match self {
            ResourceKind::AllReduce => "all-reduce",
            ResourceKind::AllGather => "all-gather",
            ResourceKind::ReduceScatter => "reduce-scatter",
            ResourceKind::AllToAll => "all-to-all",
            ResourceKind::CollectivePermute => "collective-permute",
            ResourceKind::CollectiveBroadcast => "collective-broadcast",
            ResourceKind::RaggedAllToAll => "ragged-all-to-all",
            ResourceKind::Copy => "copy",
            ResourceKind::SendRecv => "send-recv",
            ResourceKind::AsyncCompute => "async-compute",
        }
    }

    pub fn from_name(name: &str) -> Option<ResourceKind> {
        ResourceKind::ALL.iter().copied().find(|k| k.name() == name)
    }

    /// The resource of a (synchronous) collective opcode.
    pub fn of_collective(op: Opcode) -> Option<ResourceKind> {
        Some(match op {
            Opcode::AllReduce | Opcode::AllReduceStart | Opcode::AllReduceDone => {
                ResourceKind::AllReduce
            }
            Opcode::AllGather | Opcode::AllGatherStart | Opcode::AllGatherDone => {
                ResourceKind::AllGather
            }
            Opcode::ReduceScatter => ResourceKind::ReduceScatter,
            Opcode::AllToAll => ResourceKind::AllToAll,
            Opcode::CollectivePermute
            | Opcode::CollectivePermuteStart
            | Opcode::CollectivePermuteDone => ResourceKind::CollectivePermute,
            Opcode::CollectiveBroadcast => ResourceKind::CollectiveBroadcast,
            Opcode::RaggedAllToAll => ResourceKind::RaggedAllToAll,
            _ => return None,
        })
    }

    /// True for the kinds that move data between devices.
    pub fn is_collective(self) -> bool {
        !matches!(self, ResourceKind::Copy | ResourceKind::AsyncCompute)
    }
}

/// The part an instruction plays in asynchronous execution.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AsyncRole {
    /// Starts an operation on the resource (`all-reduce-start`, `async-start`, `copy-start`, `send`, `recv`).
    Start(ResourceKind),
    /// An `async-update` between a start and its done.
    Update(ResourceKind),
    /// Waits for the operation (`all-reduce-done`, `async-done`, ...).
    Done(ResourceKind),
}

/// The opcode a generic `async-start` wraps: the sugared opcode, or the
/// root of its `calls=` computation.
pub fn wrapped_opcode(module: &HloModule, instr: &HloInstruction) -> Option<Opcode> {
    if let Some(w) = instr.async_wrapped {
        return Some(w);
    }
    let c = instr.computation_attr(AttrKey::Calls)?;
    let comp = module.computations.get(c.index())?;
    comp.instructions.get(comp.root.index()).map(|r| r.opcode)
}

fn async_kind(module: &HloModule, instr: &HloInstruction) -> ResourceKind {
    wrapped_opcode(module, instr)
        .and_then(ResourceKind::of_collective)
        .unwrap_or(ResourceKind::AsyncCompute)
}

/// The async role of `id` in `comp`, or `None` for ordinary instructions
/// (including synchronous collectives).
pub fn async_role(module: &HloModule, comp: &HloComputation, id: InstrId) -> Option<AsyncRole> {
    let instr = comp.instructions.get(id.index())?;
    let role = match instr.opcode {
        Opcode::AllReduceStart | Opcode::AllGatherStart | Opcode::CollectivePermuteStart => {
            AsyncRole::Start(ResourceKind::of_collective(instr.opcode)?)
        }
        Opcode::AllReduceDone | Opcode::AllGatherDone | Opcode::CollectivePermuteDone => {
            AsyncRole::Done(ResourceKind::of_collective(instr.opcode)?)
        }
        Opcode::CopyStart => AsyncRole::Start(ResourceKind::Copy),
        Opcode::CopyDone => AsyncRole::Done(ResourceKind::Copy),
        Opcode::Send | Opcode::Recv => AsyncRole::Start(ResourceKind::SendRecv),
        Opcode::SendDone | Opcode::RecvDone => AsyncRole::Done(ResourceKind::SendRecv),
        Opcode::AsyncStart => AsyncRole::Start(async_kind(module, instr)),
        Opcode::AsyncUpdate | Opcode::AsyncDone => {
            let start = pair_start(comp, id)?;
            let kind = async_kind(module, comp.instructions.get(start.index())?);
            if instr.opcode == Opcode::AsyncUpdate {
                AsyncRole::Update(kind)
            } else {
                AsyncRole::Done(kind)
            }
        }
        _ => return None,
    };
    Some(role)
}

fn is_start_opcode(op: Opcode) -> bool {
    matches!(
        op,
        Opcode::AllReduceStart
            | Opcode::AllGatherStart
            | Opcode::CollectivePermuteStart
            | Opcode::CopyStart
            | Opcode::Send
            | Opcode::Recv
            | Opcode::AsyncStart
    )
}

/// For a done (or update), the start it belongs to: its operand, through
/// any `async-update`s. `None` when the chain does not end at a start.
pub fn pair_start(comp: &HloComputation, done: InstrId) -> Option<InstrId> {
    let mut cur = *comp.instructions.get(done.index())?.operands.first()?;
    for _ in 0..comp.instructions.len() {
        let i = comp.instructions.get(cur.index())?;
        if is_start_opcode(i.opcode) {
            return Some(cur);
        }
        if i.opcode != Opcode::AsyncUpdate {
            return None;
        }
        cur = *i.operands.first()?;
    }
    None
}

/// The resource a synchronous collective uses (it blocks the compute
/// stream while it runs).
pub fn sync_collective_kind(instr: &HloInstruction) -> Option<ResourceKind> {
    match instr.opcode {
        Opcode::AllReduce
        | Opcode::AllGather
        | Opcode::ReduceScatter
        | Opcode::AllToAll
        | Opcode::CollectivePermute
        | Opcode::CollectiveBroadcast
        | Opcode::RaggedAllToAll => ResourceKind::of_collective(instr.opcode),
        _ => None,
    }
}

/// Facts about one collective that cost models use.
#[derive(Clone, Debug, PartialEq)]
pub struct CollectiveInfo {
    pub kind: ResourceKind,
    /// The collective performed (`all-reduce`, ... ; `copy` for copy-start).
    pub opcode: Opcode,
    /// Bytes of the operands.
    pub bytes_in: u64,
    /// Bytes of the result.
    pub bytes_out: u64,
    /// Participants per group (1 when unknown or trivial).
    pub group_size: i64,
    /// Device ids of the first group, when the groups are known.
    pub first_group: Option<Vec<i64>>,
    /// Number of source-target pairs (collective-permute).
    pub num_pairs: usize,
}

impl CollectiveInfo {
    /// The information for a synchronous collective or an async start of
    /// one (native, sugared or generic with `calls=`). `None` for other
    /// instructions.
    pub fn of(module: &HloModule, comp: &HloComputation, id: InstrId) -> Option<CollectiveInfo> {
        let instr = comp.instructions.get(id.index())?;
        // Generic async-start: describe the wrapped instruction.
        if instr.opcode == Opcode::AsyncStart && instr.async_wrapped.is_none() {
            let c: CompId = instr.computation_attr(AttrKey::Calls)?;
            let callee = module.computations.get(c.index())?;
            let info = CollectiveInfo::of(module, callee, callee.root);
            return match info {
                Some(i) => Some(i),
                None => {
                    let root = callee.instructions.get(callee.root.index())?;
                    Some(CollectiveInfo {
                        kind: ResourceKind::AsyncCompute,
                        opcode: root.opcode,
                        bytes_in: operand_bytes(callee, root),
                        bytes_out: root.shape.byte_size(),
                        group_size: 1,
                        first_group: None,
                        num_pairs: 0,
                    })
                }
            };
        }
        let (op, kind) = match instr.opcode {
            Opcode::CopyStart => (Opcode::Copy, ResourceKind::Copy),
            Opcode::AsyncStart => {
                let w = instr.async_wrapped?;
                (w, ResourceKind::of_collective(w)?)
            }
            Opcode::AllReduceStart | Opcode::AllGatherStart | Opcode::CollectivePermuteStart => {
                let s = instr.opcode.sync_collective()?;
                (s, ResourceKind::of_collective(s)?)
            }
            Opcode::Send | Opcode::Recv => (instr.opcode, ResourceKind::SendRecv),
            _ => {
                let k = sync_collective_kind(instr)?;
                (instr.opcode, k)
            }
        };
        let bytes_out = match instr.opcode {
            Opcode::CopyStart => instr
                .shape
                .tuple_elements()
                .first()
                .map_or(0, |s| s.byte_size()),
            Opcode::Send => operand_bytes(comp, instr),
            Opcode::Recv => instr
                .shape
                .tuple_elements()
                .first()
                .map_or(0, |s| s.byte_size()),
            _ => collective_output_shape(instr).byte_size(),
        };
        let bytes_in = operand_bytes(comp, instr);
        let groups = instr.replica_groups().and_then(|g| g.groups());
        let first_group = groups
            .as_ref()
            .and_then(|g| g.first().cloned())
            .filter(|g| !g.is_empty());
        let group_size = match &first_group {
            Some(g) => g.len() as i64,
            None => match op {
                Opcode::CollectivePermute => 2,
                _ => xla_hlo_ir::shape_inference::collective_group_size(Some(module), instr, op)
                    .ok()
                    .flatten()
                    .unwrap_or_else(|| module.num_partitions().max(module.replica_count())),
            },
        }
        .max(1);
        let num_pairs = match instr.attr(AttrKey::SourceTargetPairs) {
            Some(xla_hlo_ir::AttrValue::IntLists(p)) => p.len(),
            _ => 0,
        };
        let first_group = first_group.or_else(|| match instr.attr(AttrKey::SourceTargetPairs) {
            Some(xla_hlo_ir::AttrValue::IntLists(p)) => p.first().cloned(),
            _ => None,
        });
        Some(CollectiveInfo {
            kind,
            opcode: op,
            bytes_in,
            bytes_out,
            group_size,
            first_group,
            num_pairs,
        })
    }

    /// The bytes that define the collective's size in nccl-tests terms:
    /// the full buffer (all-gather output, reduce-scatter input, the
    /// all-reduce / all-to-all / permute buffer).
    pub fn message_bytes(&self) -> u64 {
        match self.opcode {
            Opcode::ReduceScatter => self.bytes_in.max(self.bytes_out),
            Opcode::AllGather => self.bytes_out.max(self.bytes_in),
            _ => self.bytes_out,
        }
    }
}

fn operand_bytes(comp: &HloComputation, instr: &HloInstruction) -> u64 {
    instr
        .operands
        .iter()
        .filter_map(|o| comp.instructions.get(o.index()))
        .map(|o| o.shape.byte_size())
        .sum()
}

/// Instructions that cost nothing on the compute stream (bookkeeping,
/// aliasing, constants, parameters).
pub fn is_nop(instr: &HloInstruction) -> bool {
    match instr.opcode {
        Opcode::Parameter
        | Opcode::Constant
        | Opcode::GetTupleElement
        | Opcode::Tuple
        | Opcode::Bitcast
        | Opcode::AfterAll
        | Opcode::AddDependency
        | Opcode::PartitionId
        | Opcode::ReplicaId
        | Opcode::OptimizationBarrier
        | Opcode::Domain => true,
        Opcode::CustomCall => matches!(
            instr.ident_attr(AttrKey::CustomCallTarget),
            Some("Sharding") | Some("SPMDFullToShardShape") | Some("SPMDShardToFullShape")
        ),
        _ => false,
    }
}

/// True for instructions whose relative order must be kept (side effects).
pub fn has_side_effect(instr: &HloInstruction) -> bool {
    match instr.opcode {
        Opcode::Send
        | Opcode::SendDone
        | Opcode::Recv
        | Opcode::RecvDone
        | Opcode::Infeed
        | Opcode::Outfeed
        | Opcode::Rng
        | Opcode::RngGetAndUpdateState => true,
        Opcode::CustomCall => instr.bool_attr(AttrKey::CustomCallHasSideEffect) == Some(true),
        _ => false,
    }
}
