//! Collectives and the SPMD custom calls.
//!
//! The interpreter runs every collective through the `collectives` crate:
//! the instruction's `replica_groups` / `channel_id` /
//! `use_global_device_ids` / `source_target_pairs` become a call on this
//! device's [`Communicator`] (`collectives::hlo::execute`), which applies
//! XLA's group modes. `evaluate_spmd` runs a module on N loopback devices
//! (threads of one process, `collectives::run_world`).
//!
//! Invariants: device ids are global (`replica * num_partitions +
//! partition`); without a communicator a collective whose group is this
//! device alone is computed locally and anything larger is an error naming
//! the instruction. All-reduce and reduce-scatter whose reducer is not one
//! of the communicator's kinds (add, multiply, min, max, and, or) gather
//! every member's operands and fold them here with the reducer, by the
//! pairwise tree over the members in group order; in consistent mode every
//! all-reduce and reduce-scatter does so, which fixes the combine order
//! whatever the transport (loopback, TCP, NCCL). Custom calls `Sharding`
//! (and other annotation targets) are the identity; `SPMDFullToShardShape`
//! takes this device's tile of its operand's sharding;
//! `SPMDShardToFullShape` gathers every partition's tile.

use crate::error::{bad, EvalError};
use crate::interp::{EvalContext, Evaluator};
use crate::value::{storage_of, Array, Data, Storage, Value};
use collectives::buffer::{cast_slice, HostBytes};
use collectives::hlo::{GroupAttributes, HloCollective};
use collectives::{
    Communicator, DeviceBuffer, DeviceOutcome, ParticipantGroups, ReductionKind, Topology,
};
use half::{bf16, f16};
use std::sync::Mutex;
use std::time::Duration;
use xla_hlo_ir::sharding::{ShardingKind, SingleSharding};
use xla_hlo_ir::{
    AttrKey, AttrValue, CollectiveDeviceList, HloComputation, HloInstruction, HloModule, Opcode,
    Shape,
};
use xla_hlo_utils::reduction_order::fold_values;
use xla_hlo_utils::tiling;

/// A device's communicator as the interpreter holds it (collectives are
/// issued one at a time, in program order).
pub type DeviceCommunicator = Mutex<dyn Communicator>;

/// How long loopback devices wait for each other at a collective: long
/// enough for the slowest device to interpret the work between two
/// collectives of a large module.
pub const LOOPBACK_TIMEOUT: Duration = Duration::from_secs(600);

/// Runs `module` on `num_partitions` loopback devices (threads), device `p`
/// getting `args_of(p)`. Returns each device's outputs (root tuple split),
/// indexed by partition id; the first real failure (not the echo of another
/// device's failure) is the error.
pub fn evaluate_on_devices(
    module: &HloModule,
    num_partitions: i64,
    args_of: &(dyn Fn(i64) -> Result<Vec<Value>, EvalError> + Sync),
) -> Result<Vec<Vec<Value>>, EvalError> {
    let n = num_partitions.max(1);
    let outcomes = collectives::run_world(n as usize, LOOPBACK_TIMEOUT, |device, comm| {
        let p = device as i64;
        let args = args_of(p)?;
        let ctx = EvalContext {
            partition_id: p,
            replica_id: 0,
            num_partitions: Some(n),
            num_replicas: Some(1),
            collectives: Some(comm as &DeviceCommunicator),
            ..EvalContext::default()
        };
        crate::interp::evaluate(module, &args, &ctx)
    })
    .map_err(|e| EvalError::Internal(format!("cannot start loopback devices: {e}")))?;
    first_failure(outcomes)
}

/// The devices' results, or the most telling failure: a device's own error
/// rather than another device's report that a peer failed.
pub fn first_failure<T>(outcomes: Vec<DeviceOutcome<T, EvalError>>) -> Result<Vec<T>, EvalError> {
    let mut out = Vec::with_capacity(outcomes.len());
    let mut first_err: Option<EvalError> = None;
    for (device, o) in outcomes.into_iter().enumerate() {
        let e = match o {
            DeviceOutcome::Done(v) => {
                out.push(v);
                continue;
            }
            DeviceOutcome::Failed(e) => e,
            DeviceOutcome::Panicked(m) => {
                EvalError::Internal(format!("device {device} panicked: {m}"))
            }
        };
        let is_echo = |e: &EvalError| {
            matches!(
                e,
                EvalError::Collective {
                    peer_failed: true,
                    ..
                }
            )
        };
        if first_err
            .as_ref()
            .is_none_or(|f| is_echo(f) && !is_echo(&e))
        {
            first_err = Some(e);
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

/// Runs `module` on `num_partitions` loopback devices, every device getting
/// the same `args`. Returns each device's outputs, indexed by partition id.
pub fn evaluate_spmd(
    module: &HloModule,
    args: &[Value],
    num_partitions: i64,
) -> Result<Vec<Vec<Value>>, EvalError> {
    evaluate_on_devices(module, num_partitions, &|_| Ok(args.to_vec()))
}

/// True when a module needs several devices to run with global semantics
/// (manual-sharding custom calls or collectives).
pub fn needs_spmd(module: &HloModule) -> bool {
    module.computations.iter().any(|c| {
        c.instructions.iter().any(|i| {
            i.opcode.is_collective()
                || (i.opcode == Opcode::CustomCall
                    && matches!(
                        i.ident_attr(AttrKey::CustomCallTarget),
                        Some("SPMDFullToShardShape") | Some("SPMDShardToFullShape")
                    ))
        })
    })
}

/// The interpreter's array as a collectives buffer (one copy).
pub fn to_buffer(a: &Array) -> Result<DeviceBuffer, EvalError> {
    let bytes = match &*a.data {
        Data::Pred(v) => HostBytes::from_slice(&v.iter().map(|&b| b as u8).collect::<Vec<_>>()),
        Data::S8(v) => HostBytes::from_typed(v),
        Data::S16(v) => HostBytes::from_typed(v),
        Data::S32(v) => HostBytes::from_typed(v),
        Data::S64(v) => HostBytes::from_typed(v),
        Data::U8(v) | Data::F8(v) => HostBytes::from_typed(v),
        Data::U16(v) => HostBytes::from_typed(v),
        Data::U32(v) => HostBytes::from_typed(v),
        Data::U64(v) => HostBytes::from_typed(v),
        Data::F16(v) => HostBytes::from_typed(v),
        Data::Bf16(v) => HostBytes::from_typed(v),
        Data::F32(v) => HostBytes::from_typed(v),
        Data::F64(v) => HostBytes::from_typed(v),
        Data::C64(_) | Data::C128(_) => HostBytes::from_slice(&crate::elementwise::to_bytes(a)),
    };
    DeviceBuffer::new(a.ty, a.dims.clone(), bytes)
        .map_err(|e| EvalError::Internal(format!("array to buffer: {e}")))
}

/// A collectives buffer as the interpreter's array (one copy).
pub fn from_buffer(b: &DeviceBuffer) -> Result<Array, EvalError> {
    fn typed<T: collectives::buffer::Pod>(b: &DeviceBuffer) -> Result<Vec<T>, EvalError> {
        cast_slice::<T>(b.bytes())
            .map(|s| s.to_vec())
            .ok_or_else(|| EvalError::Internal("misaligned collective buffer".into()))
    }
    let ty = b.dtype();
    let data = match storage_of(ty)? {
        Storage::Pred => Data::Pred(b.bytes().iter().map(|&x| x != 0).collect()),
        Storage::S8 => Data::S8(typed(b)?),
        Storage::S16 => Data::S16(typed(b)?),
        Storage::S32 => Data::S32(typed(b)?),
        Storage::S64 => Data::S64(typed(b)?),
        Storage::U8 => Data::U8(typed(b)?),
        Storage::U16 => Data::U16(typed(b)?),
        Storage::U32 => Data::U32(typed(b)?),
        Storage::U64 => Data::U64(typed(b)?),
        Storage::F16 => Data::F16(typed::<f16>(b)?),
        Storage::Bf16 => Data::Bf16(typed::<bf16>(b)?),
        Storage::F32 => Data::F32(typed(b)?),
        Storage::F64 => Data::F64(typed(b)?),
        Storage::F8 => Data::F8(typed(b)?),
        Storage::C64 | Storage::C128 => crate::elementwise::from_bytes(ty, b.bytes())?,
    };
    Array::new(ty, b.dims().to_vec(), data)
}

fn collective_err(instr: &HloInstruction, e: collectives::CollectiveError) -> EvalError {
    EvalError::Collective {
        instruction: instr.name.clone(),
        peer_failed: matches!(
            e,
            collectives::CollectiveError::PeerFailed { .. }
                | collectives::CollectiveError::PeerLost { .. }
        ),
        message: e.to_string(),
    }
}

fn topology(ev: &Evaluator) -> Result<Topology, EvalError> {
    let as_count = |n: i64| usize::try_from(n.max(1)).unwrap_or(1);
    Topology::new(as_count(ev.num_replicas()), as_count(ev.num_partitions()))
        .map_err(|e| EvalError::invalid(e.to_string()))
}

fn group_attributes(instr: &HloInstruction) -> GroupAttributes {
    let takes_global_ids = matches!(
        instr.effective_opcode(),
        Opcode::AllReduce | Opcode::AllGather | Opcode::ReduceScatter
    );
    GroupAttributes {
        replica_groups: instr
            .replica_groups()
            .cloned()
            .unwrap_or(CollectiveDeviceList::Explicit(Vec::new())),
        channel_id: instr.channel_id(),
        use_global_device_ids: if takes_global_ids {
            instr.bool_attr(AttrKey::UseGlobalDeviceIds)
        } else {
            None
        },
    }
}

fn source_target_pairs(instr: &HloInstruction) -> Vec<(i64, i64)> {
    match instr.attr(AttrKey::SourceTargetPairs) {
        Some(AttrValue::IntLists(l)) => l
            .iter()
            .filter(|p| p.len() == 2)
            .map(|p| (p[0], p[1]))
            .collect(),
        _ => Vec::new(),
    }
}

/// The communicator's reduction for the instruction's `to_apply`, when it
/// is one (pred add/multiply are or/and, as XLA evaluates them).
fn reduction_kind(ev: &Evaluator, instr: &HloInstruction) -> Option<ReductionKind> {
    let op = crate::reduce::binary_reducer(ev, instr.to_apply()?)?;
    Some(match op {
        Opcode::Add => ReductionKind::Sum,
        Opcode::Multiply => ReductionKind::Product,
        Opcode::Minimum => ReductionKind::Min,
        Opcode::Maximum => ReductionKind::Max,
        Opcode::And => ReductionKind::And,
        Opcode::Or => ReductionKind::Or,
        _ => return None,
    })
}

/// Runs `op` on this device's communicator; without one, only a group of
/// this device alone is allowed and the result is computed locally.
fn run(
    ev: &Evaluator,
    instr: &HloInstruction,
    op: &HloCollective,
    operands: &[Array],
) -> Result<Vec<Array>, EvalError> {
    let topo = topology(ev)?;
    let me = (ev.ctx.replica_id * ev.num_partitions() + ev.ctx.partition_id) as usize;
    let attrs = group_attributes(instr);
    let Some(cell) = ev.ctx.collectives else {
        return run_alone(instr, op, &attrs, topo, me, operands);
    };
    let buffers = operands
        .iter()
        .map(to_buffer)
        .collect::<Result<Vec<_>, _>>()?;
    let mut comm = cell.lock().unwrap_or_else(|e| e.into_inner());
    let out = collectives::hlo::execute(&mut *comm, op, &attrs, topo, &buffers)
        .map_err(|e| collective_err(instr, e))?;
    drop(comm);
    out.iter().map(from_buffer).collect()
}

/// A collective without a communicator: its group must be this device.
fn run_alone(
    instr: &HloInstruction,
    op: &HloCollective,
    attrs: &GroupAttributes,
    topo: Topology,
    me: usize,
    operands: &[Array],
) -> Result<Vec<Array>, EvalError> {
    let err = |e: collectives::CollectiveError| collective_err(instr, e);
    let needs_runtime = |n: usize| EvalError::Collective {
        instruction: instr.name.clone(),
        peer_failed: false,
        message: format!(
            "{} over a group of {n} devices needs a collective communicator (multi-device runtime)",
            instr.opcode
        ),
    };
    if let HloCollective::CollectivePermute {
        source_target_pairs,
    } = op
    {
        let plan = collectives::groups::permute_plan(
            source_target_pairs,
            attrs.channel_id.is_some(),
            topo,
            me,
        )
        .map_err(err)?;
        if plan
            .pairs
            .iter()
            .any(|&(s, t)| s != t && (s == me || t == me))
        {
            return Err(needs_runtime(plan.group.len()));
        }
        let keeps = plan.pairs.contains(&(me, me));
        return operands
            .iter()
            .map(|a| {
                if keeps {
                    Ok(a.clone())
                } else {
                    Array::zeros(a.ty, a.dims.clone())
                }
            })
            .collect();
    }
    let groups = ParticipantGroups::from_hlo(
        &attrs.replica_groups,
        attrs.channel_id,
        attrs.use_global_device_ids,
        topo,
    )
    .map_err(err)?;
    let group = groups.group_of(me).map_err(err)?;
    if group.len() != 1 {
        return Err(needs_runtime(group.len()));
    }
    Ok(operands.to_vec())
}

/// All-reduce or reduce-scatter with a reducer the communicator lacks, or
/// any of them in consistent mode: gather every member's operands, fold
/// them with the reducer by the pairwise tree of
/// `xla_hlo_utils::reduction_order` over the members in group order (never
/// arrival order), and (reduce-scatter) keep this member's part of `dim`.
fn reduce_by_gathering(
    ev: &Evaluator,
    instr: &HloInstruction,
    operands: &[Array],
    scatter_dim: Option<usize>,
) -> Result<Vec<Array>, EvalError> {
    let stacked: Vec<Array> = operands.iter().map(stack_one).collect();
    let gathered = run(
        ev,
        instr,
        &HloCollective::AllGather { dimension: 0 },
        &stacked,
    )?;
    let mut out = Vec::with_capacity(operands.len());
    for (a, g) in operands.iter().zip(&gathered) {
        let members = g.dims.first().copied().unwrap_or(1).max(1) as usize;
        let parts = unstack(g, members, &a.dims)?;
        let acc = fold_values(parts, &mut |x, y| combine(ev, instr, &x, &y))?
            .ok_or_else(|| EvalError::invalid("empty collective group"))?;
        out.push(match scatter_dim {
            None => acc,
            Some(dim) => {
                let rank = my_rank(ev, instr, members)?;
                split_dim(&acc, dim, members, rank)?
            }
        });
    }
    Ok(out)
}

/// This device's rank in its group for instruction `instr`.
fn my_rank(ev: &Evaluator, instr: &HloInstruction, members: usize) -> Result<usize, EvalError> {
    let topo = topology(ev)?;
    let me = (ev.ctx.replica_id * ev.num_partitions() + ev.ctx.partition_id) as usize;
    let attrs = group_attributes(instr);
    let groups = ParticipantGroups::from_hlo(
        &attrs.replica_groups,
        attrs.channel_id,
        attrs.use_global_device_ids,
        topo,
    )
    .map_err(|e| collective_err(instr, e))?;
    let rank = groups
        .rank_of(me)
        .ok_or_else(|| EvalError::invalid(format!("device {me} is in no group")))?;
    if groups.group_of(me).map(|g| g.len()).unwrap_or(0) != members {
        return bad("group size changed between gathering and scattering");
    }
    Ok(rank)
}

fn combine(
    ev: &Evaluator,
    instr: &HloInstruction,
    a: &Array,
    b: &Array,
) -> Result<Array, EvalError> {
    let comp = instr
        .to_apply()
        .ok_or_else(|| EvalError::invalid("reduction collective without to_apply"))?;
    if let Some(op) = crate::reduce::binary_reducer(ev, comp) {
        return crate::elementwise::binary(op, a, b);
    }
    crate::reduce::map(ev, comp, &[a, b], a.ty, &a.dims)
}

fn arrays(ops: Vec<Value>) -> Result<Vec<Array>, EvalError> {
    ops.into_iter()
        .map(|v| {
            v.into_array()
                .ok_or_else(|| EvalError::invalid("collective operand is not an array"))
        })
        .collect()
}

fn pack(mut arrays: Vec<Array>, tuple: bool) -> Value {
    if !tuple && arrays.len() == 1 {
        Value::Array(arrays.remove(0))
    } else {
        Value::Tuple(arrays.into_iter().map(Value::Array).collect())
    }
}

fn split_dim(a: &Array, dim: usize, parts: usize, k: usize) -> Result<Array, EvalError> {
    let n = a.dims[dim];
    if parts == 0 || n % parts as i64 != 0 {
        return bad(format!(
            "dimension {dim} of size {n} does not split into {parts} parts"
        ));
    }
    let c = n / parts as i64;
    let sd: Vec<_> = (0..a.rank())
        .map(|d| xla_hlo_ir::attrs::SliceDim {
            start: if d == dim { c * k as i64 } else { 0 },
            limit: if d == dim {
                c * (k as i64 + 1)
            } else {
                a.dims[d]
            },
            stride: 1,
        })
        .collect();
    crate::data::slice(a, &sd)
}

/// `a` with a new leading dim of size 1 (one member's part of a gather).
fn stack_one(a: &Array) -> Array {
    a.reshaped([1].iter().chain(&a.dims).copied().collect())
}

/// The `members` parts of an array gathered along a leading dim, each
/// reshaped back to `dims`.
fn unstack(all: &Array, members: usize, dims: &[i64]) -> Result<Vec<Array>, EvalError> {
    (0..members)
        .map(|k| Ok(split_dim(all, 0, members, k)?.reshaped(dims.to_vec())))
        .collect()
}

fn dim_attr(instr: &HloInstruction, rank: usize) -> Result<usize, EvalError> {
    let d = instr
        .dimensions()
        .first()
        .copied()
        .ok_or_else(|| EvalError::invalid("missing dimensions"))?;
    usize::try_from(d)
        .ok()
        .filter(|&d| d < rank)
        .ok_or_else(|| EvalError::invalid("collective dimension out of range"))
}

/// Evaluates a collective instruction.
pub fn eval_collective(
    ev: &Evaluator,
    instr: &HloInstruction,
    ops: Vec<Value>,
) -> Result<Value, EvalError> {
    let op = instr.effective_opcode();
    let tuple_result = instr.shape.is_tuple();
    let ops = arrays(ops)?;
    let rank = ops.first().map(|a| a.rank()).unwrap_or(0);
    match op {
        Opcode::AllReduce => {
            let outs = match reduction_kind(ev, instr).filter(|_| !ev.ctx.consistent) {
                Some(kind) => run(ev, instr, &HloCollective::AllReduce(kind), &ops)?,
                None => reduce_by_gathering(ev, instr, &ops, None)?,
            };
            Ok(pack(outs, tuple_result))
        }
        Opcode::AllGather => {
            let dimension = dim_attr(instr, rank)?;
            let outs = run(ev, instr, &HloCollective::AllGather { dimension }, &ops)?;
            if instr.opcode == Opcode::AllGatherStart {
                // ((operands), (results)) or (operand, result)
                let n = ops.len();
                return Ok(Value::Tuple(vec![pack(ops, n > 1), pack(outs, n > 1)]));
            }
            Ok(pack(outs, tuple_result))
        }
        Opcode::ReduceScatter => {
            let dimension = dim_attr(instr, rank)?;
            let outs = match reduction_kind(ev, instr).filter(|_| !ev.ctx.consistent) {
                Some(kind) => run(
                    ev,
                    instr,
                    &HloCollective::ReduceScatter { kind, dimension },
                    &ops,
                )?,
                None => reduce_by_gathering(ev, instr, &ops, Some(dimension))?,
            };
            Ok(pack(outs, tuple_result))
        }
        Opcode::AllToAll => {
            if instr.dimensions().is_empty() {
                let outs = run(
                    ev,
                    instr,
                    &HloCollective::AllToAll { dimension: None },
                    &ops,
                )?;
                return Ok(pack(outs, true));
            }
            let dimension = Some(dim_attr(instr, rank)?);
            let outs = run(ev, instr, &HloCollective::AllToAll { dimension }, &ops)?;
            Ok(pack(outs, tuple_result))
        }
        Opcode::CollectiveBroadcast => {
            let outs = run(ev, instr, &HloCollective::CollectiveBroadcast, &ops)?;
            Ok(pack(outs, tuple_result))
        }
        Opcode::CollectivePermute => {
            let input = ops
                .into_iter()
                .next()
                .ok_or_else(|| EvalError::invalid("collective-permute without operand"))?;
            let permute = HloCollective::CollectivePermute {
                source_target_pairs: source_target_pairs(instr),
            };
            let result = run(ev, instr, &permute, std::slice::from_ref(&input))?
                .into_iter()
                .next()
                .ok_or_else(|| EvalError::invalid("collective-permute returned nothing"))?;
            if instr.opcode == Opcode::CollectivePermuteStart {
                let mut items = vec![Value::Array(input), Value::Array(result)];
                if let Shape::Tuple(e) = &instr.shape {
                    for s in e.iter().skip(2) {
                        items.push(Value::zeros(s)?);
                    }
                }
                return Ok(Value::Tuple(items));
            }
            Ok(Value::Array(result))
        }
        other => Err(EvalError::UnsupportedOpcode {
            opcode: other,
            instruction: instr.name.clone(),
        }),
    }
}

fn single(s: &xla_hlo_ir::HloSharding) -> Option<&SingleSharding> {
    s.leaves().first()
}

/// Custom-call targets that return their first operand on one device
/// (annotations and placements).
pub fn is_identity_custom_call(target: &str) -> bool {
    matches!(
        target,
        "Sharding"
            | "LayoutConstraint"
            | "MoveToHost"
            | "MoveToDevice"
            | "annotate_device_placement"
            | "ShardBarrierFrom"
            | "ShardBarrierTo"
            | "X64Combine"
    )
}

/// Evaluates a custom-call.
pub fn eval_custom_call(
    ev: &Evaluator,
    comp: &HloComputation,
    instr: &HloInstruction,
    ops: Vec<Value>,
) -> Result<Value, EvalError> {
    let target = instr.ident_attr(AttrKey::CustomCallTarget).unwrap_or("");
    let first = || {
        ops.first()
            .cloned()
            .ok_or_else(|| EvalError::invalid("custom-call without operands"))
    };
    match target {
        t if is_identity_custom_call(t) => first(),
        "SPMDFullToShardShape" => {
            let full = first()?.into_array().ok_or_else(|| {
                EvalError::invalid("SPMDFullToShardShape operand is not an array")
            })?;
            let out_dims = instr.shape.dims().to_vec();
            if out_dims == full.dims {
                return Ok(Value::Array(full));
            }
            let src = instr
                .operands
                .first()
                .and_then(|o| comp.instructions.get(o.index()))
                .and_then(|i| i.sharding.as_deref())
                .and_then(single)
                .ok_or_else(|| {
                    EvalError::invalid("SPMDFullToShardShape operand has no sharding")
                })?;
            let offsets = tiling::device_tile(src, &full.dims, ev.ctx.partition_id)
                .map_err(tiling_err)?
                .offsets;
            Ok(Value::Array(extract_tile(&full, &offsets, &out_dims)?))
        }
        "SPMDShardToFullShape" => {
            let shard = first()?.into_array().ok_or_else(|| {
                EvalError::invalid("SPMDShardToFullShape operand is not an array")
            })?;
            let out_dims = instr.shape.dims().to_vec();
            let dst = instr
                .sharding
                .as_deref()
                .and_then(single)
                .ok_or_else(|| EvalError::invalid("SPMDShardToFullShape has no sharding"))?;
            if out_dims == shard.dims && !matches!(dst.kind, ShardingKind::Tiled { .. }) {
                return Ok(Value::Array(shard));
            }
            let parts = gather_partitions(ev, instr, &shard)?;
            Ok(Value::Array(assemble_array(&parts, dst, &out_dims, false)?))
        }
        // jax.lax.top_k on the CPU: the k largest along the last dimension
        // (k from the result), values then s32 indices, ties in index order;
        // a comparator (`to_apply`) whose root is `compare(p0, p1)` LT picks
        // the smallest.
        "TopK" => {
            let input = first()?
                .into_array()
                .ok_or_else(|| EvalError::invalid("TopK operand is not an array"))?;
            let Shape::Tuple(results) = &instr.shape else {
                return Err(EvalError::invalid(
                    "TopK result is not a (values, indices) tuple",
                ));
            };
            let k = results
                .first()
                .and_then(|s| s.dims().last().copied())
                .ok_or_else(|| EvalError::invalid("TopK result has no last dimension"))?;
            let smallest_first = instr
                .to_apply()
                .and_then(|c| crate::reduce::compare_of_params(ev, c))
                .is_some_and(|(a, _, direction, _)| {
                    a == 0 && direction == crate::elementwise::Direction::Lt
                });
            let largest = !smallest_first;
            let (values, indices) = crate::reduce::topk(&input, k, largest)?;
            Ok(Value::Tuple(vec![
                Value::Array(values),
                Value::Array(indices),
            ]))
        }
        _ => Err(EvalError::UnsupportedCustomCall {
            target: target.to_string(),
            instruction: instr.name.clone(),
        }),
    }
}

/// Applies `$f::<T>` to the element vector of an array's data, for the
/// vector's element type `T`, rewrapping a vector result in the same variant.
macro_rules! with_elements {
    ($data:expr, $v:ident => $e:expr) => {
        match $data {
            Data::Pred($v) => Data::Pred($e),
            Data::S8($v) => Data::S8($e),
            Data::S16($v) => Data::S16($e),
            Data::S32($v) => Data::S32($e),
            Data::S64($v) => Data::S64($e),
            Data::U8($v) => Data::U8($e),
            Data::U16($v) => Data::U16($e),
            Data::U32($v) => Data::U32($e),
            Data::U64($v) => Data::U64($e),
            Data::F16($v) => Data::F16($e),
            Data::Bf16($v) => Data::Bf16($e),
            Data::F32($v) => Data::F32($e),
            Data::F64($v) => Data::F64($e),
            Data::F8($v) => Data::F8($e),
            Data::C64($v) => Data::C64($e),
            Data::C128($v) => Data::C128($e),
        }
    };
}

fn tiling_err(e: xla_hlo_utils::ShardingError) -> EvalError {
    EvalError::invalid(e.to_string())
}

/// The tile of `full` at `offsets` with `dims`; parts beyond `full` are zero.
fn extract_tile(full: &Array, offsets: &[i64], dims: &[i64]) -> Result<Array, EvalError> {
    let tile = tiling::DeviceTile {
        offsets: offsets.to_vec(),
        dims: dims.to_vec(),
    };
    let data = with_elements!(&*full.data, v => tiling::extract_tile(v, &full.dims, &tile).map_err(tiling_err)?);
    Array::new(full.ty, dims.to_vec(), data)
}

/// The shard of `full` that `device` holds under `s` (tiles padded with
/// zeros where they pass the end of the array, as XLA pads them).
pub fn shard_array(full: &Array, s: &SingleSharding, device: i64) -> Result<Array, EvalError> {
    let tile = tiling::device_tile(s, &full.dims, device).map_err(tiling_err)?;
    if tile.is_whole(&full.dims) {
        return Ok(full.clone());
    }
    extract_tile(full, &tile.offsets, &tile.dims)
}

/// Reassembles a global array of `global_dims` from every device's shard
/// (`shards[d]` is device d's) under `s`; see `xla_hlo_utils::tiling::assemble`
/// for `check_replicas`.
pub fn assemble_array(
    shards: &[Array],
    s: &SingleSharding,
    global_dims: &[i64],
    check_replicas: bool,
) -> Result<Array, EvalError> {
    let first = shards
        .first()
        .ok_or_else(|| EvalError::invalid("no shards to assemble"))?;
    if !matches!(s.kind, ShardingKind::Tiled { .. }) && !check_replicas {
        return Ok(first.clone());
    }
    if let Some(other) = shards
        .iter()
        .find(|a| a.ty != first.ty || a.dims != first.dims)
    {
        return Err(EvalError::invalid(format!(
            "shards of {} and {} cannot be assembled together",
            first.shape(),
            other.shape()
        )));
    }
    macro_rules! assemble_as {
        ($($variant:ident),*) => {
            match &*first.data {
                $(Data::$variant(_) => {
                    let slices = shards
                        .iter()
                        .map(|a| match &*a.data {
                            Data::$variant(v) => Ok(&v[..]),
                            _ => Err(EvalError::invalid("shards of different element types")),
                        })
                        .collect::<Result<Vec<_>, _>>()?;
                    Data::$variant(
                        tiling::assemble(&slices, &first.dims, s, global_dims, check_replicas)
                            .map_err(tiling_err)?,
                    )
                })*
            }
        };
    }
    let data = assemble_as!(
        Pred, S8, S16, S32, S64, U8, U16, U32, U64, F16, Bf16, F32, F64, F8, C64, C128
    );
    if !matches!(s.kind, ShardingKind::Tiled { .. }) {
        return Ok(first.clone());
    }
    Array::new(first.ty, global_dims.to_vec(), data)
}

/// Every partition's `shard` (of this device's replica), in partition order.
fn gather_partitions(
    ev: &Evaluator,
    instr: &HloInstruction,
    shard: &Array,
) -> Result<Vec<Array>, EvalError> {
    let p_count = ev.num_partitions().max(1);
    if p_count == 1 {
        return Ok(vec![shard.clone()]);
    }
    let Some(cell) = ev.ctx.collectives else {
        return Err(EvalError::Collective {
            instruction: instr.name.clone(),
            peer_failed: false,
            message: format!("gathering {p_count} partitions needs a collective communicator"),
        });
    };
    let base = ev.ctx.replica_id * p_count;
    let group: Vec<usize> = (0..p_count).map(|q| (base + q) as usize).collect();
    let stacked = stack_one(shard);
    let buffer = to_buffer(&stacked)?;
    let mut comm = cell.lock().unwrap_or_else(|e| e.into_inner());
    let gathered = comm
        .all_gather(&group, 0, std::slice::from_ref(&buffer))
        .map_err(|e| collective_err(instr, e))?;
    drop(comm);
    let all = from_buffer(
        gathered
            .first()
            .ok_or_else(|| EvalError::invalid("all-gather returned nothing"))?,
    )?;
    unstack(&all, group.len(), &shard.dims)
}
