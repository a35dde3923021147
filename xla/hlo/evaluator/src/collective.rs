//! Collectives and the SPMD custom calls.
//!
//! The interpreter computes every collective's semantics itself (all-reduce,
//! all-gather, reduce-scatter, all-to-all, collective-permute,
//! collective-broadcast, their async starts) on top of one primitive that a
//! runtime provides: `CollectiveHandler::exchange`, a rendezvous in which
//! each member of a device group contributes arrays and receives every
//! member's contribution. `LoopbackCollectives` implements it for devices
//! running as threads of one process; `evaluate_spmd` runs a module on N
//! such devices.
//!
//! Invariants: device ids are global (`replica * num_partitions +
//! partition`); groups are resolved from `replica_groups`, `channel_id` and
//! `use_global_device_ids` exactly as XLA's collective group modes define
//! them; without a handler a collective over a group of one device is the
//! identity and anything larger is an error naming the instruction. Custom
//! calls `Sharding` (and other annotation targets) are the identity;
//! `SPMDFullToShardShape` takes this device's tile of its operand's sharding;
//! `SPMDShardToFullShape` assembles the full array from every partition.

use crate::error::{bad, EvalError};
use crate::interp::{EvalContext, Evaluator};
use crate::value::{Array, Value};
use std::collections::HashMap;
use std::sync::{Condvar, Mutex};
use std::time::Duration;
use xla_hlo_ir::sharding::{ShardingKind, SingleSharding};
use xla_hlo_ir::{AttrKey, AttrValue, HloComputation, HloInstruction, HloModule, Opcode, Shape};

/// One collective as seen by the runtime.
pub struct CollectiveOp<'a> {
    pub opcode: Opcode,
    /// The instruction's name.
    pub name: &'a str,
    pub channel_id: Option<i64>,
    /// How many collectives this device issued before this one; equal on
    /// every member for the same collective in SPMD programs.
    pub seq: u64,
    /// Global device ids of the group, in group order.
    pub group: &'a [i64],
    /// This device's global id (a member of `group`).
    pub me: i64,
}

/// The rendezvous primitive a multi-device runtime provides.
pub trait CollectiveHandler: Send + Sync {
    /// Called by every member of `op.group`; returns the contributions of
    /// all members, in group order.
    fn exchange(
        &self,
        op: &CollectiveOp<'_>,
        contribution: Vec<Array>,
    ) -> Result<Vec<Vec<Array>>, EvalError>;
}

struct Slot {
    parts: HashMap<i64, Vec<Array>>,
    readers_left: usize,
}

/// An in-process rendezvous for devices running as threads.
pub struct LoopbackCollectives {
    slots: Mutex<HashMap<(u64, Vec<i64>), Slot>>,
    cv: Condvar,
    aborted: Mutex<Option<String>>,
    timeout: Duration,
}

impl Default for LoopbackCollectives {
    fn default() -> Self {
        LoopbackCollectives::new()
    }
}

impl LoopbackCollectives {
    pub fn new() -> LoopbackCollectives {
        LoopbackCollectives {
            slots: Mutex::new(HashMap::new()),
            cv: Condvar::new(),
            aborted: Mutex::new(None),
            timeout: Duration::from_secs(600),
        }
    }
    /// Makes every waiting and future exchange fail (a device failed).
    pub fn abort(&self, why: &str) {
        *self.aborted.lock().unwrap_or_else(|e| e.into_inner()) = Some(why.to_string());
        self.cv.notify_all();
    }
    fn aborted(&self) -> Option<String> {
        self.aborted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl CollectiveHandler for LoopbackCollectives {
    fn exchange(
        &self,
        op: &CollectiveOp<'_>,
        contribution: Vec<Array>,
    ) -> Result<Vec<Vec<Array>>, EvalError> {
        let key = (op.seq, op.group.to_vec());
        let err = |m: String| EvalError::Collective {
            instruction: op.name.to_string(),
            message: m,
        };
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        {
            let slot = slots.entry(key.clone()).or_insert_with(|| Slot {
                parts: HashMap::new(),
                readers_left: op.group.len(),
            });
            slot.parts.insert(op.me, contribution);
        }
        self.cv.notify_all();
        let start = std::time::Instant::now();
        loop {
            if let Some(why) = self.aborted() {
                return Err(err(format!("aborted: {why}")));
            }
            let ready = slots
                .get(&key)
                .is_some_and(|s| op.group.iter().all(|d| s.parts.contains_key(d)));
            if ready {
                break;
            }
            if start.elapsed() > self.timeout {
                return Err(err("timed out waiting for the other devices".into()));
            }
            slots = self
                .cv
                .wait_timeout(slots, Duration::from_millis(50))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        let slot = slots.get_mut(&key).expect("ready slot");
        let out: Vec<Vec<Array>> = op
            .group
            .iter()
            .map(|d| slot.parts.get(d).cloned().unwrap_or_default())
            .collect();
        slot.readers_left -= 1;
        if slot.readers_left == 0 {
            slots.remove(&key);
        }
        Ok(out)
    }
}

/// Runs `module` on `num_partitions` devices (threads) with loopback
/// collectives; every device gets the same `args`. Returns each device's
/// outputs (root tuple split), indexed by partition id.
pub fn evaluate_spmd(
    module: &HloModule,
    args: &[Value],
    num_partitions: i64,
) -> Result<Vec<Vec<Value>>, EvalError> {
    let n = num_partitions.max(1);
    let lb = LoopbackCollectives::new();
    let results: Vec<Result<Vec<Value>, EvalError>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|p| {
                let lb = &lb;
                s.spawn(move || {
                    let ctx = EvalContext {
                        partition_id: p,
                        replica_id: 0,
                        num_partitions: Some(n),
                        num_replicas: Some(1),
                        collectives: Some(lb),
                    };
                    let r = crate::interp::evaluate(module, args, &ctx);
                    if let Err(e) = &r {
                        lb.abort(&format!("device {p} failed: {e}"));
                    }
                    r
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(EvalError::Internal("device thread panicked".into())))
            })
            .collect()
    });
    // Report the first real failure rather than an "aborted" echo.
    let mut out = Vec::new();
    let mut first_err: Option<EvalError> = None;
    for r in results {
        match r {
            Ok(v) => out.push(v),
            Err(e) => {
                let is_echo = matches!(&e, EvalError::Collective { message, .. } if message.starts_with("aborted"));
                if first_err.is_none()
                    || (!is_echo && matches!(first_err, Some(EvalError::Collective { .. })))
                {
                    first_err = Some(e);
                }
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(out),
    }
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

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    CrossReplica,
    CrossPartition,
    CrossReplicaAndPartition,
    Flattened,
}

fn mode_of(instr: &HloInstruction, op: Opcode) -> Mode {
    let channel = instr.channel_id().is_some();
    // Only all-reduce, all-gather and reduce-scatter carry
    // use_global_device_ids; the others use cross-partition groups whenever
    // they have a channel id (XLA's GetCollectiveOpGroupMode).
    if !matches!(
        op,
        Opcode::AllReduce
            | Opcode::AllReduceStart
            | Opcode::AllGather
            | Opcode::AllGatherStart
            | Opcode::ReduceScatter
    ) {
        return if channel {
            Mode::CrossPartition
        } else {
            Mode::CrossReplica
        };
    }
    if instr.bool_attr(AttrKey::UseGlobalDeviceIds) == Some(true) {
        Mode::Flattened
    } else if channel {
        Mode::CrossReplicaAndPartition
    } else {
        Mode::CrossReplica
    }
}

/// The device group (global ids) this device belongs to, and its rank in it.
fn my_group(
    ev: &Evaluator,
    instr: &HloInstruction,
    op: Opcode,
) -> Result<(Vec<i64>, usize), EvalError> {
    let p_count = ev.num_partitions();
    let r_count = ev.num_replicas();
    let (r, p) = (ev.ctx.replica_id, ev.ctx.partition_id);
    let me = r * p_count + p;
    let groups = match instr.replica_groups() {
        Some(g) => g
            .groups()
            .ok_or_else(|| EvalError::invalid("replica_groups cannot be expanded"))?,
        None => Vec::new(),
    };
    let mode = mode_of(instr, op);
    let find = |groups: &[Vec<i64>], x: i64, all: i64| -> Result<Vec<i64>, EvalError> {
        if groups.is_empty() {
            return Ok((0..all).collect());
        }
        groups
            .iter()
            .find(|g| g.contains(&x))
            .cloned()
            .ok_or_else(|| EvalError::invalid(format!("device {x} is in no replica group")))
    };
    let devices: Vec<i64> = match mode {
        Mode::CrossReplica => find(&groups, r, r_count)?
            .iter()
            .map(|&rr| rr * p_count + p)
            .collect(),
        Mode::CrossPartition => find(&groups, p, p_count)?
            .iter()
            .map(|&pp| r * p_count + pp)
            .collect(),
        Mode::CrossReplicaAndPartition => find(&groups, r, r_count)?
            .iter()
            .flat_map(|&rr| (0..p_count).map(move |pp| rr * p_count + pp))
            .collect(),
        Mode::Flattened => find(&groups, me, r_count * p_count)?,
    };
    if let Some(&bad_id) = devices.iter().find(|&&d| d < 0 || d >= r_count * p_count) {
        return bad(format!(
            "replica_groups name device {bad_id} but only {r_count} replicas x {p_count} partitions exist ({mode:?} groups)"
        ));
    }
    let rank = devices
        .iter()
        .position(|&d| d == me)
        .ok_or_else(|| EvalError::invalid("this device is not in its own group"))?;
    Ok((devices, rank))
}

fn exchange(
    ev: &Evaluator,
    instr: &HloInstruction,
    op: Opcode,
    group: &[i64],
    me: i64,
    contribution: Vec<Array>,
) -> Result<Vec<Vec<Array>>, EvalError> {
    let seq = {
        let mut s = ev.collective_seq.lock().unwrap_or_else(|e| e.into_inner());
        *s += 1;
        *s - 1
    };
    if group.len() == 1 && group[0] == me {
        return Ok(vec![contribution]);
    }
    let Some(h) = ev.ctx.collectives else {
        return Err(EvalError::Collective {
            instruction: instr.name.clone(),
            message: format!(
                "{op} over a group of {} devices needs a collective handler (multi-device runtime)",
                group.len()
            ),
        });
    };
    let cop = CollectiveOp {
        opcode: op,
        name: &instr.name,
        channel_id: instr.channel_id(),
        seq,
        group,
        me,
    };
    let r = h.exchange(&cop, contribution)?;
    if r.len() != group.len() {
        return Err(EvalError::Collective {
            instruction: instr.name.clone(),
            message: "the handler returned the wrong number of contributions".into(),
        });
    }
    Ok(r)
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
    let me = ev.ctx.replica_id * ev.num_partitions() + ev.ctx.partition_id;
    let tuple_result = instr.shape.is_tuple();
    let ops = arrays(ops)?;
    match op {
        Opcode::AllReduce => {
            let (group, _) = my_group(ev, instr, op)?;
            let parts = exchange(ev, instr, op, &group, me, ops)?;
            let mut acc = parts[0].clone();
            for p in &parts[1..] {
                for (a, b) in acc.iter_mut().zip(p) {
                    *a = combine(ev, instr, a, b)?;
                }
            }
            Ok(pack(acc, tuple_result))
        }
        Opcode::AllGather => {
            let (group, _) = my_group(ev, instr, op)?;
            let rank = ops.first().map(|a| a.rank()).unwrap_or(0);
            let dim = dim_attr(instr, rank)?;
            let n_ops = ops.len();
            let inputs = ops.clone();
            let parts = exchange(ev, instr, op, &group, me, ops)?;
            let mut outs = Vec::new();
            for k in 0..n_ops {
                let pieces: Vec<&Array> = parts
                    .iter()
                    .map(|p| {
                        p.get(k)
                            .ok_or_else(|| EvalError::invalid("missing contribution"))
                    })
                    .collect::<Result<_, _>>()?;
                outs.push(crate::data::concatenate(&pieces, dim as i64)?);
            }
            if instr.opcode == Opcode::AllGatherStart {
                // ((operands), (results)) or (operand, result)
                return Ok(Value::Tuple(vec![
                    pack(inputs, n_ops > 1),
                    pack(outs, n_ops > 1),
                ]));
            }
            Ok(pack(outs, tuple_result))
        }
        Opcode::ReduceScatter => {
            let (group, rank_in_group) = my_group(ev, instr, op)?;
            let rank = ops.first().map(|a| a.rank()).unwrap_or(0);
            let dim = dim_attr(instr, rank)?;
            let parts = exchange(ev, instr, op, &group, me, ops)?;
            let mut acc = parts[0].clone();
            for p in &parts[1..] {
                for (a, b) in acc.iter_mut().zip(p) {
                    *a = combine(ev, instr, a, b)?;
                }
            }
            let outs = acc
                .iter()
                .map(|a| split_dim(a, dim, group.len(), rank_in_group))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(pack(outs, tuple_result))
        }
        Opcode::AllToAll => {
            let (group, rank_in_group) = my_group(ev, instr, op)?;
            let g = group.len();
            if instr.dimensions().is_empty() {
                if ops.len() != g {
                    return bad("tuple all-to-all needs one operand per group member");
                }
                let parts = exchange(ev, instr, op, &group, me, ops)?;
                let outs = parts
                    .iter()
                    .map(|p| {
                        p.get(rank_in_group)
                            .cloned()
                            .ok_or_else(|| EvalError::invalid("missing chunk"))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                return Ok(pack(outs, true));
            }
            let rank = ops.first().map(|a| a.rank()).unwrap_or(0);
            let dim = dim_attr(instr, rank)?;
            let n_ops = ops.len();
            let parts = exchange(ev, instr, op, &group, me, ops)?;
            let mut outs = Vec::new();
            for k in 0..n_ops {
                let chunks: Vec<Array> = parts
                    .iter()
                    .map(|p| {
                        let a = p
                            .get(k)
                            .ok_or_else(|| EvalError::invalid("missing contribution"))?;
                        split_dim(a, dim, g, rank_in_group)
                    })
                    .collect::<Result<_, _>>()?;
                let refs: Vec<&Array> = chunks.iter().collect();
                outs.push(crate::data::concatenate(&refs, dim as i64)?);
            }
            Ok(pack(outs, tuple_result))
        }
        Opcode::CollectiveBroadcast => {
            let (group, _) = my_group(ev, instr, op)?;
            let parts = exchange(ev, instr, op, &group, me, ops)?;
            Ok(pack(parts[0].clone(), tuple_result))
        }
        Opcode::CollectivePermute => {
            let pairs: Vec<(i64, i64)> = match instr.attr(AttrKey::SourceTargetPairs) {
                Some(AttrValue::IntLists(l)) => l
                    .iter()
                    .filter(|p| p.len() == 2)
                    .map(|p| (p[0], p[1]))
                    .collect(),
                _ => Vec::new(),
            };
            let p_count = ev.num_partitions();
            let r_count = ev.num_replicas();
            let (r, p) = (ev.ctx.replica_id, ev.ctx.partition_id);
            let cross_partition = mode_of(instr, op) == Mode::CrossPartition;
            // Everyone in the same domain takes part; ids in pairs are
            // partition ids (cross-partition) or replica ids.
            let (domain, my_id): (Vec<i64>, i64) = if cross_partition {
                ((0..p_count).map(|q| r * p_count + q).collect(), p)
            } else {
                ((0..r_count).map(|q| q * p_count + p).collect(), r)
            };
            let input = ops
                .into_iter()
                .next()
                .ok_or_else(|| EvalError::invalid("collective-permute without operand"))?;
            let template = input.clone();
            let needs_exchange = !(pairs.iter().all(|&(s, t)| s == t) || domain.len() == 1);
            let received: Option<Array> = if needs_exchange {
                let parts = exchange(ev, instr, op, &domain, me, vec![input.clone()])?;
                pairs
                    .iter()
                    .find(|&&(_, t)| t == my_id)
                    .and_then(|&(s, _)| usize::try_from(s).ok())
                    .and_then(|s| parts.get(s).and_then(|v| v.first().cloned()))
            } else {
                pairs
                    .iter()
                    .find(|&&(_, t)| t == my_id)
                    .map(|_| input.clone())
            };
            let result = match received {
                Some(a) => a,
                None => Array::zeros(template.ty, template.dims.clone())?,
            };
            if instr.opcode == Opcode::CollectivePermuteStart {
                let mut items = vec![Value::Array(template), Value::Array(result)];
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

/// Offsets and sizes of `device`'s tile of an array of `dims` under `s`.
pub fn tile_of(
    s: &SingleSharding,
    dims: &[i64],
    device: i64,
) -> Result<(Vec<i64>, Vec<i64>), EvalError> {
    match &s.kind {
        ShardingKind::Tiled {
            tile_assignment, ..
        } => {
            let tdims = tile_assignment.dims();
            if tdims.len() < dims.len() {
                return bad("tile assignment rank is smaller than the array rank");
            }
            let devices = tile_assignment.devices();
            let pos = devices.iter().position(|&d| d == device).ok_or_else(|| {
                EvalError::invalid(format!("device {device} is not in the tile assignment"))
            })?;
            let tsz: Vec<usize> = tdims.iter().map(|&d| d.max(1) as usize).collect();
            let mut idx = vec![0usize; tsz.len()];
            crate::index::unflatten(pos, &tsz, &mut idx);
            let sizes: Vec<i64> = dims
                .iter()
                .zip(tdims)
                .map(|(&d, &t)| (d + t.max(1) - 1) / t.max(1))
                .collect();
            let offsets: Vec<i64> = sizes
                .iter()
                .zip(&idx)
                .map(|(&s, &i)| s * i as i64)
                .collect();
            Ok((offsets, sizes))
        }
        _ => Ok((vec![0; dims.len()], dims.to_vec())),
    }
}

fn single(s: &xla_hlo_ir::HloSharding) -> Option<&SingleSharding> {
    s.leaves().first()
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
        "Sharding"
        | "LayoutConstraint"
        | "MoveToHost"
        | "MoveToDevice"
        | "annotate_device_placement"
        | "ShardBarrierFrom"
        | "ShardBarrierTo"
        | "X64Combine" => first(),
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
                .and_then(|i| i.sharding.as_ref())
                .and_then(single)
                .ok_or_else(|| {
                    EvalError::invalid("SPMDFullToShardShape operand has no sharding")
                })?;
            let (offsets, _) = tile_of(src, &full.dims, ev.ctx.partition_id)?;
            Ok(Value::Array(extract_tile(&full, &offsets, &out_dims)?))
        }
        "SPMDShardToFullShape" => {
            let shard = first()?.into_array().ok_or_else(|| {
                EvalError::invalid("SPMDShardToFullShape operand is not an array")
            })?;
            let out_dims = instr.shape.dims().to_vec();
            let dst = instr
                .sharding
                .as_ref()
                .and_then(single)
                .ok_or_else(|| EvalError::invalid("SPMDShardToFullShape has no sharding"))?;
            if out_dims == shard.dims && !matches!(dst.kind, ShardingKind::Tiled { .. }) {
                return Ok(Value::Array(shard));
            }
            let p_count = ev.num_partitions();
            let r = ev.ctx.replica_id;
            let me = r * p_count + ev.ctx.partition_id;
            let domain: Vec<i64> = (0..p_count).map(|q| r * p_count + q).collect();
            let parts = exchange(ev, instr, Opcode::CustomCall, &domain, me, vec![shard])?;
            let mut full = Array::zeros(
                instr.shape.element_type().ok_or_else(|| {
                    EvalError::invalid("SPMDShardToFullShape result is not an array")
                })?,
                out_dims.clone(),
            )?;
            for (q, part) in parts.iter().enumerate() {
                let piece = part
                    .first()
                    .ok_or_else(|| EvalError::invalid("missing shard"))?;
                let (offsets, _) = tile_of(dst, &out_dims, q as i64)?;
                full = insert_tile(&full, piece, &offsets)?;
            }
            Ok(Value::Array(full))
        }
        _ => Err(EvalError::UnsupportedCustomCall {
            target: target.to_string(),
            instruction: instr.name.clone(),
        }),
    }
}

/// The tile of `full` at `offsets` with `dims`; parts beyond `full` are zero.
fn extract_tile(full: &Array, offsets: &[i64], dims: &[i64]) -> Result<Array, EvalError> {
    if dims.len() != full.rank() || offsets.len() != full.rank() {
        return bad(format!(
            "shard shape {dims:?} does not have the rank of {}",
            full.shape()
        ));
    }
    let valid: Vec<i64> = (0..full.rank())
        .map(|d| (full.dims[d] - offsets[d]).clamp(0, dims[d]))
        .collect();
    let sd: Vec<_> = (0..full.rank())
        .map(|d| xla_hlo_ir::attrs::SliceDim {
            start: offsets[d].min(full.dims[d]),
            limit: offsets[d].min(full.dims[d]) + valid[d],
            stride: 1,
        })
        .collect();
    let part = crate::data::slice(full, &sd)?;
    let zero = Array::zeros(full.ty, dims.to_vec())?;
    crate::data::dynamic_update_slice(&zero, &part, &vec![0; dims.len()])
}

/// Writes the valid part of `tile` into `full` at `offsets`.
fn insert_tile(full: &Array, tile: &Array, offsets: &[i64]) -> Result<Array, EvalError> {
    if tile.rank() != full.rank() || offsets.len() != full.rank() {
        return bad("shard rank differs from the full shape");
    }
    let valid: Vec<i64> = (0..full.rank())
        .map(|d| (full.dims[d] - offsets[d]).clamp(0, tile.dims[d]))
        .collect();
    if valid.iter().any(|&v| v == 0) {
        return Ok(full.clone());
    }
    let sd: Vec<_> = (0..tile.rank())
        .map(|d| xla_hlo_ir::attrs::SliceDim {
            start: 0,
            limit: valid[d],
            stride: 1,
        })
        .collect();
    let part = crate::data::slice(tile, &sd)?;
    crate::data::dynamic_update_slice(full, &part, offsets)
}

/// The shard of `full` that `device` holds under `s` (tiles padded with
/// zeros where they pass the end of the array, as XLA pads them).
pub fn shard_array(full: &Array, s: &SingleSharding, device: i64) -> Result<Array, EvalError> {
    let (offsets, sizes) = tile_of(s, &full.dims, device)?;
    if sizes == full.dims {
        return Ok(full.clone());
    }
    extract_tile(full, &offsets, &sizes)
}

/// Reassembles a global array of `global_dims` from every device's shard
/// (`shards[d]` is device d's) under `s`.
pub fn assemble_array(
    shards: &[Array],
    s: &SingleSharding,
    global_dims: &[i64],
) -> Result<Array, EvalError> {
    let first = shards
        .first()
        .ok_or_else(|| EvalError::invalid("no shards to assemble"))?;
    if !matches!(s.kind, ShardingKind::Tiled { .. }) {
        return Ok(first.clone());
    }
    let mut full = Array::zeros(first.ty, global_dims.to_vec())?;
    for (d, piece) in shards.iter().enumerate() {
        let (offsets, _) = tile_of(s, global_dims, d as i64)?;
        full = insert_tile(&full, piece, &offsets)?;
    }
    Ok(full)
}

/// Runs a partitioned (per-device SPMD) module on `num_partitions` loopback
/// devices: global arguments are sharded by the entry parameters'
/// shardings, and each output leaf is reassembled with `out_shardings[k]`
/// into `out_dims[k]`. Returns the global output leaves.
pub fn evaluate_partitioned(
    module: &HloModule,
    global_args: &[Value],
    out_shardings: &[SingleSharding],
    out_dims: &[Vec<i64>],
) -> Result<Vec<Array>, EvalError> {
    let n = module.num_partitions().max(1);
    let entry = module.entry_computation();
    if global_args.len() != entry.parameters.len() {
        return Err(EvalError::ArgumentCount {
            expected: entry.parameters.len(),
            got: global_args.len(),
        });
    }
    let lb = LoopbackCollectives::new();
    let per_device: Vec<Vec<Value>> = (0..n)
        .map(|d| {
            entry
                .parameters
                .iter()
                .zip(global_args)
                .map(|(&p, a)| {
                    let instr = &entry.instructions[p.index()];
                    let arr = a.as_array().ok_or_else(|| {
                        EvalError::invalid("tuple arguments are not supported here")
                    })?;
                    match instr.sharding.as_ref().and_then(single) {
                        Some(s) => Ok(Value::Array(shard_array(arr, s, d)?)),
                        None => Ok(a.clone()),
                    }
                })
                .collect::<Result<Vec<_>, EvalError>>()
        })
        .collect::<Result<_, _>>()?;
    let results: Vec<Result<Vec<Value>, EvalError>> = std::thread::scope(|s| {
        let handles: Vec<_> = per_device
            .iter()
            .enumerate()
            .map(|(p, args)| {
                let lb = &lb;
                s.spawn(move || {
                    let ctx = EvalContext {
                        partition_id: p as i64,
                        replica_id: 0,
                        num_partitions: Some(n),
                        num_replicas: Some(1),
                        collectives: Some(lb),
                    };
                    let r = crate::interp::evaluate(module, args, &ctx);
                    if let Err(e) = &r {
                        lb.abort(&format!("device {p} failed: {e}"));
                    }
                    r
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(EvalError::Internal("device thread panicked".into())))
            })
            .collect()
    });
    let mut outs: Vec<Vec<Array>> = Vec::new();
    for r in results {
        let v = r?;
        outs.push(
            v.iter()
                .flat_map(|x| x.leaves().into_iter().cloned())
                .collect(),
        );
    }
    let leaves = outs.first().map(|o| o.len()).unwrap_or(0);
    (0..leaves)
        .map(|k| {
            let shards: Vec<Array> = outs.iter().map(|o| o[k].clone()).collect();
            let s = out_shardings
                .get(k)
                .ok_or_else(|| EvalError::invalid(format!("no sharding for output {k}")))?;
            let dims = out_dims
                .get(k)
                .ok_or_else(|| EvalError::invalid(format!("no global shape for output {k}")))?;
            assemble_array(&shards, s, dims)
        })
        .collect()
}
