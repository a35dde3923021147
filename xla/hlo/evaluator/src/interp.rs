//! The interpreter loop: evaluates a computation's instructions in arena
//! order (defs before uses), dispatching each opcode to its family module,
//! and runs control flow (while, conditional, call, fusion, async wrappers).
//!
//! Invariants: a value is dropped right after its last use, so operands whose
//! storage is no longer shared can be reused; errors raised by an op are
//! wrapped once with the name and opcode of the instruction that raised them
//! (errors from nested computations keep their innermost instruction).

use crate::collective::{self, DeviceCommunicator};
use crate::error::{bad, EvalError};
use crate::value::{Array, Value};
use crate::{data, dot, elementwise as ew, linalg, reduce, rng};
use std::collections::HashMap;
use std::sync::Mutex;
use xla_hlo_ir::{
    AttrKey, CompId, HloComputation, HloInstruction, HloModule, InstrId, Opcode, PrimitiveType,
    Shape,
};

/// Where and how a module runs.
#[derive(Clone, Copy, Default)]
pub struct EvalContext<'a> {
    pub partition_id: i64,
    pub replica_id: i64,
    /// Participants; `None` takes the module's `num_partitions` / `replica_count`.
    pub num_partitions: Option<i64>,
    pub num_replicas: Option<i64>,
    /// This device's communicator; without one, collectives over groups of
    /// this device alone are computed locally and others are errors.
    pub collectives: Option<&'a DeviceCommunicator>,
    /// Bytes one instruction's result may take (see `memory`); `None`: the
    /// memory the machine has available when evaluation starts.
    pub memory_limit: Option<u64>,
    /// Consistent mode: every floating-point reduction (reduce, dot,
    /// convolution, all-reduce, reduce-scatter) combines its elements in the
    /// order of `xla_hlo_utils::reduction_order`, independent of array sizes
    /// and threads, so a program split across devices along aligned tiles
    /// reproduces the single-device bits. Slower than the default.
    pub consistent: bool,
}

/// Evaluates `module`'s entry computation on `args`. The result is the
/// root's value, with a tuple root split into its elements.
pub fn evaluate(
    module: &HloModule,
    args: &[Value],
    ctx: &EvalContext<'_>,
) -> Result<Vec<Value>, EvalError> {
    match evaluate_value(module, args, ctx)? {
        Value::Tuple(v) => Ok(v),
        v => Ok(vec![v]),
    }
}

/// Evaluates the entry computation and returns the root's value unchanged.
pub fn evaluate_value(
    module: &HloModule,
    args: &[Value],
    ctx: &EvalContext<'_>,
) -> Result<Value, EvalError> {
    let ev = Evaluator::new(module, *ctx);
    let entry = module.entry_computation();
    if args.len() != entry.parameters.len() {
        return Err(EvalError::ArgumentCount {
            expected: entry.parameters.len(),
            got: args.len(),
        });
    }
    for (i, (&p, a)) in entry.parameters.iter().zip(args).enumerate() {
        let Some(instr) = entry.instructions.get(p.index()) else {
            return Err(EvalError::invalid(format!(
                "entry parameter {i} is missing"
            )));
        };
        if !a.matches_shape(&instr.shape) {
            return Err(EvalError::ArgumentShape {
                index: i,
                name: instr.name.clone(),
                expected: instr.shape.without_layout().to_string(),
                got: a.shape_string(),
            });
        }
    }
    ev.call(module.entry, args)
}

/// What an instruction produced: a value, or a broadcast kept lazy.
enum Slot {
    Value(Value),
    Lazy(crate::fused::LazyBroadcast),
}

/// Per-computation schedule data: values to drop after each instruction.
struct Plan {
    drops: Vec<Vec<usize>>,
    /// Broadcasts read lazily by their (binary elementwise f32) users.
    lazy: Vec<bool>,
    /// For each instruction, which operand positions die at it (last use,
    /// used once by it): their buffers may be reused.
    dying: Vec<Vec<bool>>,
    /// Bytes each instruction's result allocates (`memory::result_bytes`).
    result_bytes: Vec<Option<u64>>,
}

/// Evaluates computations of one module.
pub struct Evaluator<'m> {
    pub module: &'m HloModule,
    pub ctx: EvalContext<'m>,
    plans: Mutex<HashMap<CompId, std::sync::Arc<Plan>>>,
    /// Time per (opcode, shape) when `XLA_EVAL_PROFILE` is set.
    profile: Option<Mutex<HashMap<String, (f64, usize)>>>,
    /// The resolved memory limit (`u64::MAX`: none).
    memory_limit: u64,
}

impl Drop for Evaluator<'_> {
    fn drop(&mut self) {
        if let Some(p) = &self.profile {
            let p = p.lock().unwrap_or_else(|e| e.into_inner());
            let mut rows: Vec<_> = p.iter().collect();
            rows.sort_by(|a, b| b.1 .0.total_cmp(&a.1 .0));
            let total: f64 = rows.iter().map(|r| r.1 .0).sum();
            eprintln!("profile: {total:.3}s in instructions");
            for (k, (t, n)) in rows.iter().take(40) {
                eprintln!("{t:9.4}s {n:6}x  {k}");
            }
        }
    }
}

fn wrap(instr: &HloInstruction, e: EvalError) -> EvalError {
    match e {
        EvalError::Invalid(message) => EvalError::Instruction {
            instruction: instr.name.clone(),
            opcode: instr.opcode,
            message,
        },
        EvalError::UnsupportedType(t) => EvalError::Instruction {
            instruction: instr.name.clone(),
            opcode: instr.opcode,
            message: format!("unsupported element type {t}"),
        },
        other => other,
    }
}

impl<'m> Evaluator<'m> {
    pub fn new(module: &'m HloModule, ctx: EvalContext<'m>) -> Evaluator<'m> {
        Evaluator {
            module,
            ctx,
            plans: Mutex::new(HashMap::new()),
            profile: std::env::var_os("XLA_EVAL_PROFILE").map(|_| Mutex::new(HashMap::new())),
            memory_limit: ctx
                .memory_limit
                .or_else(crate::memory::available_memory_bytes)
                .unwrap_or(u64::MAX),
        }
    }

    /// How dots and convolutions accumulate (the tree in consistent mode).
    pub fn accumulation(&self) -> dot::Accumulation {
        if self.ctx.consistent {
            dot::Accumulation::Tree
        } else {
            dot::Accumulation::Gemm
        }
    }

    pub fn num_partitions(&self) -> i64 {
        self.ctx
            .num_partitions
            .unwrap_or_else(|| self.module.num_partitions())
            .max(1)
    }
    pub fn num_replicas(&self) -> i64 {
        self.ctx
            .num_replicas
            .unwrap_or_else(|| self.module.replica_count())
            .max(1)
    }

    fn plan(&self, id: CompId, comp: &HloComputation) -> std::sync::Arc<Plan> {
        let mut plans = self.plans.lock().unwrap_or_else(|e| e.into_inner());
        plans
            .entry(id)
            .or_insert_with(|| {
                let n = comp.instructions.len();
                let mut last = vec![usize::MAX; n];
                for (i, instr) in comp.instructions.iter().enumerate() {
                    for op in &instr.operands {
                        if op.index() < n {
                            last[op.index()] = i;
                        }
                    }
                }
                let mut drops = vec![Vec::new(); n];
                for (v, &l) in last.iter().enumerate() {
                    if v != comp.root.index() && l != usize::MAX {
                        drops[l].push(v);
                    }
                }
                let users = comp.users();
                let is_f32 = |s: &Shape| s.element_type() == Some(PrimitiveType::F32);
                let lazy: Vec<bool> = comp
                    .instructions
                    .iter()
                    .enumerate()
                    .map(|(i, instr)| {
                        instr.opcode == Opcode::Broadcast
                            && i != comp.root.index()
                            && is_f32(&instr.shape)
                            && instr.shape.dims().iter().product::<i64>() >= 1024
                            && !users[i].is_empty()
                            && users[i].iter().all(|u| {
                                let ui = &comp.instructions[u.index()];
                                crate::fused::is_fusable_binary(ui.opcode)
                                    && is_f32(&ui.shape)
                                    && ui.operands.iter().filter(|o| o.index() == i).count() == 1
                            })
                    })
                    .collect();
                let dying: Vec<Vec<bool>> = comp
                    .instructions
                    .iter()
                    .enumerate()
                    .map(|(i, instr)| {
                        instr
                            .operands
                            .iter()
                            .map(|o| {
                                let k = o.index();
                                k < n
                                    && last[k] == i
                                    && k != comp.root.index()
                                    && instr.operands.iter().filter(|p| p.index() == k).count() == 1
                            })
                            .collect()
                    })
                    .collect();
                let result_bytes = comp
                    .instructions
                    .iter()
                    .map(crate::memory::result_bytes)
                    .collect();
                std::sync::Arc::new(Plan {
                    drops,
                    lazy,
                    dying,
                    result_bytes,
                })
            })
            .clone()
    }

    fn comp(&self, id: CompId) -> Result<&'m HloComputation, EvalError> {
        self.module
            .computations
            .get(id.index())
            .ok_or_else(|| EvalError::invalid(format!("computation {id} does not exist")))
    }

    /// Evaluates computation `id` on `args`.
    pub fn call(&self, id: CompId, args: &[Value]) -> Result<Value, EvalError> {
        let comp = self.comp(id)?;
        let plan = self.plan(id, comp);
        let n = comp.instructions.len();
        let mut vals: Vec<Option<Value>> = vec![None; n];
        let mut lazy: Vec<Option<crate::fused::LazyBroadcast>> = vec![None; n];
        let profile = self.profile.is_some();
        for (i, instr) in comp.instructions.iter().enumerate() {
            let t = profile.then(std::time::Instant::now);
            crate::memory::check_result_bytes(instr, plan.result_bytes[i], self.memory_limit)?;
            let v = match self.fast_path(instr, i, &plan, &mut vals, &mut lazy) {
                Some(v) => v,
                None => {
                    for op in &instr.operands {
                        let k = op.index();
                        if vals.get(k).is_some_and(Option::is_none) {
                            if let Some(l) = lazy.get(k).and_then(Option::as_ref) {
                                vals[k] = Some(Value::Array(l.materialize()));
                            }
                        }
                    }
                    Slot::Value(
                        self.eval_instr(comp, instr, &vals, args)
                            .map_err(|e| wrap(instr, e))?,
                    )
                }
            };
            if let (Some(t), Some(p)) = (t, &self.profile) {
                if !matches!(
                    instr.opcode,
                    Opcode::While | Opcode::Call | Opcode::Conditional | Opcode::Fusion
                ) {
                    let mut p = p.lock().unwrap_or_else(|e| e.into_inner());
                    let e = p
                        .entry(format!("{} {}", instr.opcode, instr.shape))
                        .or_insert((0.0, 0));
                    e.0 += t.elapsed().as_secs_f64();
                    e.1 += 1;
                }
            }
            match v {
                Slot::Value(v) => vals[i] = Some(v),
                Slot::Lazy(l) => lazy[i] = Some(l),
            }
            for &d in &plan.drops[i] {
                vals[d] = None;
                lazy[d] = None;
            }
        }
        vals.get_mut(comp.root.index())
            .and_then(Option::take)
            .ok_or_else(|| EvalError::invalid(format!("computation {} has no root", comp.name)))
    }

    /// Fused and in-place f32 elementwise paths (see `fused`); None when the
    /// instruction is not eligible, leaving `vals` as it was.
    fn fast_path(
        &self,
        instr: &HloInstruction,
        i: usize,
        plan: &Plan,
        vals: &mut [Option<Value>],
        lazy: &mut [Option<crate::fused::LazyBroadcast>],
    ) -> Option<Slot> {
        use crate::fused::{LazyBroadcast, Operand};
        let f32_array = |v: &Option<Value>, dims: &[i64]| matches!(v, Some(Value::Array(a)) if a.ty == PrimitiveType::F32 && a.dims == dims);
        if plan.lazy[i] {
            let src = vals
                .get(instr.operands.first()?.index())?
                .as_ref()?
                .as_array()?
                .clone();
            return LazyBroadcast::new(src, instr.shape.dims().to_vec(), instr.dimensions())
                .map(Slot::Lazy);
        }
        if instr.shape.element_type() != Some(PrimitiveType::F32) {
            return None;
        }
        let dims = instr.shape.dims();
        if crate::fused::is_fusable_binary(instr.opcode)
            && instr.operands.len() == 2
            && !dims.is_empty()
        {
            let (a, b) = (instr.operands[0].index(), instr.operands[1].index());
            let ok = |k: usize| {
                lazy.get(k)
                    .and_then(Option::as_ref)
                    .is_some_and(|l| l.dims == dims && l.src.ty == PrimitiveType::F32)
                    || vals.get(k).is_some_and(|v| f32_array(v, dims))
            };
            if !ok(a) || !ok(b) {
                return None;
            }
            let take = |k: usize, pos: usize, vals: &mut [Option<Value>]| -> Option<Array> {
                if plan.dying[i][pos] {
                    vals[k].take()?.into_array()
                } else {
                    vals[k].as_ref()?.as_array().cloned()
                }
            };
            let lazy_ro: &[Option<LazyBroadcast>] = lazy;
            let oa = match lazy_ro[a].as_ref() {
                Some(l) => Operand::Lazy(l),
                None => Operand::Dense(take(a, 0, vals)?, plan.dying[i][0]),
            };
            let ob = match lazy_ro[b].as_ref() {
                Some(l) => Operand::Lazy(l),
                None => Operand::Dense(take(b, 1, vals)?, plan.dying[i][1]),
            };
            return crate::fused::binary_f32(instr.opcode, oa, ob, dims)
                .map(|r| Slot::Value(Value::Array(r)));
        }
        if crate::fused::is_inplace_unary(instr.opcode)
            && instr.operands.len() == 1
            && plan.dying[i][0]
        {
            let k = instr.operands[0].index();
            let unique = matches!(vals.get(k), Some(Some(Value::Array(a)))
                if a.ty == PrimitiveType::F32 && a.dims == dims && std::sync::Arc::strong_count(&a.data) == 1);
            if !unique {
                return None;
            }
            let a = vals[k].take()?.into_array()?;
            return crate::fused::unary_inplace(instr.opcode, a)
                .map(|r| Slot::Value(Value::Array(r)));
        }
        None
    }

    /// Calls a computation on scalar/array arguments and expects an array.
    pub fn call_array(&self, id: CompId, args: &[Value]) -> Result<Array, EvalError> {
        match self.call(id, args)? {
            Value::Array(a) => Ok(a),
            v => bad(format!(
                "computation returned {} instead of an array",
                v.shape_string()
            )),
        }
    }

    fn eval_instr(
        &self,
        comp: &HloComputation,
        instr: &HloInstruction,
        vals: &[Option<Value>],
        args: &[Value],
    ) -> Result<Value, EvalError> {
        let operand = |k: usize| -> Result<&Value, EvalError> {
            let id: InstrId = *instr
                .operands
                .get(k)
                .ok_or_else(|| EvalError::invalid(format!("missing operand {k}")))?;
            vals.get(id.index())
                .and_then(Option::as_ref)
                .ok_or_else(|| {
                    EvalError::invalid(format!(
                        "operand {k} (%{}) is not available",
                        comp.instructions
                            .get(id.index())
                            .map(|i| i.name.as_str())
                            .unwrap_or("?")
                    ))
                })
        };
        let arr = |k: usize| -> Result<&Array, EvalError> {
            match operand(k)? {
                Value::Array(a) => Ok(a),
                v => bad(format!(
                    "operand {k} is {} where an array is expected",
                    v.shape_string()
                )),
            }
        };
        let out_array_shape = || -> Result<(PrimitiveType, Vec<i64>), EvalError> {
            match &instr.shape {
                Shape::Array(a) => Ok((a.element_type, a.dims.clone())),
                s => bad(format!("expected an array result shape, got {s}")),
            }
        };
        let op = instr.opcode;
        use Opcode as O;
        let a: Array = match op {
            O::Parameter => {
                let n = instr
                    .parameter_number
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or_else(|| EvalError::invalid("parameter without a number"))?;
                return args
                    .get(n)
                    .cloned()
                    .ok_or_else(|| EvalError::invalid(format!("parameter {n} was not passed")));
            }
            O::Constant => {
                let lit = instr
                    .literal
                    .as_ref()
                    .ok_or_else(|| EvalError::invalid("constant without a literal"))?;
                if let xla_hlo_ir::Literal::Array(al) = &**lit {
                    if al.elided {
                        return bad("constant's value was elided ({...}) in the HLO text");
                    }
                }
                return Value::from_literal(lit);
            }
            O::Tuple => {
                return Ok(Value::Tuple(
                    (0..instr.operands.len())
                        .map(|k| operand(k).cloned())
                        .collect::<Result<_, _>>()?,
                ))
            }
            O::GetTupleElement => {
                let idx = instr.int_attr(AttrKey::Index).unwrap_or(0);
                let t = operand(0)?;
                return t
                    .tuple_elements()
                    .and_then(|e| e.get(usize::try_from(idx).ok()?))
                    .cloned()
                    .ok_or_else(|| EvalError::invalid(format!("tuple index {idx} out of range")));
            }
            O::AfterAll => return Ok(Value::Token),
            O::AddDependency | O::OptimizationBarrier | O::Domain => return operand(0).cloned(),
            O::Call => {
                let c = instr
                    .to_apply()
                    .ok_or_else(|| EvalError::invalid("call without to_apply"))?;
                let ops = self.operand_values(instr, &operand)?;
                return self.call(c, &ops);
            }
            O::Fusion => {
                let c = instr
                    .computation_attr(AttrKey::Calls)
                    .ok_or_else(|| EvalError::invalid("fusion without calls"))?;
                let ops = self.operand_values(instr, &operand)?;
                return self.call(c, &ops);
            }
            O::While => {
                let cond = instr
                    .computation_attr(AttrKey::Condition)
                    .ok_or_else(|| EvalError::invalid("while without condition"))?;
                let body = instr
                    .computation_attr(AttrKey::Body)
                    .ok_or_else(|| EvalError::invalid("while without body"))?;
                let mut state = operand(0)?.clone();
                loop {
                    let p = self.call_array(cond, std::slice::from_ref(&state))?;
                    if p.ty != PrimitiveType::Pred || p.len() != 1 {
                        return bad("while condition did not return pred[]");
                    }
                    if p.get_i64(0) == 0 {
                        break;
                    }
                    state = self.call(body, std::slice::from_ref(&state))?;
                }
                return Ok(state);
            }
            O::Conditional => {
                let sel = arr(0)?;
                if sel.len() != 1 {
                    return bad("conditional selector is not a scalar");
                }
                let branches: Vec<CompId> = if let (Some(t), Some(f)) = (
                    instr.computation_attr(AttrKey::TrueComputation),
                    instr.computation_attr(AttrKey::FalseComputation),
                ) {
                    vec![t, f]
                } else {
                    match instr.attr(AttrKey::BranchComputations) {
                        Some(xla_hlo_ir::AttrValue::Computations(c)) => c.clone(),
                        _ => return bad("conditional without branch computations"),
                    }
                };
                if branches.is_empty() {
                    return bad("conditional without branches");
                }
                let idx = if sel.ty == PrimitiveType::Pred {
                    // true -> branch 0 (true_computation), false -> branch 1
                    if sel.get_i64(0) != 0 {
                        0
                    } else {
                        1
                    }
                } else {
                    let i = sel.get_i64(0);
                    if i < 0 || i as usize >= branches.len() {
                        branches.len() - 1
                    } else {
                        i as usize
                    }
                };
                let arg = operand(idx + 1)?.clone();
                return self.call(branches[idx], &[arg]);
            }
            O::AsyncStart => {
                let c = instr
                    .computation_attr(AttrKey::Calls)
                    .ok_or_else(|| EvalError::invalid("async-start without calls"))?;
                let ops = self.operand_values(instr, &operand)?;
                let r = self.call(c, &ops)?;
                return Ok(Value::Tuple(vec![Value::Tuple(ops), r, Value::Token]));
            }
            O::AsyncUpdate => return operand(0).cloned(),
            O::AsyncDone => {
                return match operand(0)? {
                    Value::Tuple(e) if e.len() >= 2 => Ok(e[1].clone()),
                    v => Ok(v.clone()),
                }
            }
            O::CopyStart => {
                let v = operand(0)?.clone();
                return Ok(Value::Tuple(vec![v.clone(), v, Value::Token]));
            }
            O::CopyDone => {
                return match operand(0)? {
                    Value::Tuple(e) if !e.is_empty() => Ok(e[0].clone()),
                    v => Ok(v.clone()),
                }
            }
            O::AllGatherDone | O::AllReduceDone | O::CollectivePermuteDone => {
                return match operand(0)? {
                    Value::Tuple(e) if op != O::AllReduceDone && e.len() >= 2 => Ok(e[1].clone()),
                    v => Ok(v.clone()),
                }
            }
            O::AllReduce
            | O::AllGather
            | O::AllToAll
            | O::ReduceScatter
            | O::CollectivePermute
            | O::CollectiveBroadcast
            | O::AllReduceStart
            | O::AllGatherStart
            | O::CollectivePermuteStart => {
                let ops = self.operand_values(instr, &operand)?;
                return collective::eval_collective(self, instr, ops);
            }
            O::CustomCall => {
                let ops = self.operand_values(instr, &operand)?;
                return collective::eval_custom_call(self, comp, instr, ops);
            }
            O::Map => {
                let c = instr
                    .to_apply()
                    .ok_or_else(|| EvalError::invalid("map without to_apply"))?;
                let ops: Vec<&Array> = (0..instr.operands.len())
                    .map(arr)
                    .collect::<Result<_, _>>()?;
                let (ty, dims) = out_array_shape()?;
                reduce::map(self, c, &ops, ty, &dims)?
            }
            O::Reduce => {
                let c = instr
                    .to_apply()
                    .ok_or_else(|| EvalError::invalid("reduce without to_apply"))?;
                let n = instr.operands.len() / 2;
                let inputs: Vec<&Array> = (0..n).map(arr).collect::<Result<_, _>>()?;
                let inits: Vec<&Array> = (n..2 * n).map(arr).collect::<Result<_, _>>()?;
                let outs = reduce::reduce(self, c, &inputs, &inits, instr.dimensions())?;
                return Ok(if instr.shape.is_tuple() {
                    Value::Tuple(outs.into_iter().map(Value::Array).collect())
                } else {
                    Value::Array(
                        outs.into_iter()
                            .next()
                            .ok_or_else(|| EvalError::invalid("reduce produced nothing"))?,
                    )
                });
            }
            O::ReduceWindow => {
                let c = instr
                    .to_apply()
                    .ok_or_else(|| EvalError::invalid("reduce-window without to_apply"))?;
                let n = instr.operands.len() / 2;
                let inputs: Vec<&Array> = (0..n).map(arr).collect::<Result<_, _>>()?;
                let inits: Vec<&Array> = (n..2 * n).map(arr).collect::<Result<_, _>>()?;
                let w = instr
                    .window()
                    .ok_or_else(|| EvalError::invalid("reduce-window without window"))?;
                let out_dims = match &instr.shape {
                    Shape::Tuple(e) => e.first().map(|s| s.dims().to_vec()).unwrap_or_default(),
                    s => s.dims().to_vec(),
                };
                let outs = reduce::reduce_window(self, c, &inputs, &inits, w, &out_dims)?;
                return Ok(if instr.shape.is_tuple() {
                    Value::Tuple(outs.into_iter().map(Value::Array).collect())
                } else {
                    Value::Array(
                        outs.into_iter()
                            .next()
                            .ok_or_else(|| EvalError::invalid("reduce-window produced nothing"))?,
                    )
                });
            }
            O::SelectAndScatter => {
                let sel = instr
                    .computation_attr(AttrKey::SelectComputation)
                    .ok_or_else(|| EvalError::invalid("select-and-scatter without select"))?;
                let sc = instr
                    .computation_attr(AttrKey::ScatterComputation)
                    .ok_or_else(|| EvalError::invalid("select-and-scatter without scatter"))?;
                let w = instr
                    .window()
                    .ok_or_else(|| EvalError::invalid("select-and-scatter without window"))?;
                reduce::select_and_scatter(self, sel, sc, arr(0)?, arr(1)?, arr(2)?, w)?
            }
            O::Sort => {
                let c = instr
                    .to_apply()
                    .ok_or_else(|| EvalError::invalid("sort without to_apply"))?;
                let ops: Vec<&Array> = (0..instr.operands.len())
                    .map(arr)
                    .collect::<Result<_, _>>()?;
                let dim = instr.dimensions().first().copied().unwrap_or(0);
                let outs = reduce::sort(self, c, &ops, dim)?;
                return Ok(if instr.shape.is_tuple() {
                    Value::Tuple(outs.into_iter().map(Value::Array).collect())
                } else {
                    Value::Array(
                        outs.into_iter()
                            .next()
                            .ok_or_else(|| EvalError::invalid("sort produced nothing"))?,
                    )
                });
            }
            O::Scatter => {
                let c = instr
                    .to_apply()
                    .ok_or_else(|| EvalError::invalid("scatter without to_apply"))?;
                let n = (instr.operands.len() - 1) / 2;
                let operands: Vec<&Array> = (0..n).map(arr).collect::<Result<_, _>>()?;
                let indices = arr(n)?;
                let updates: Vec<&Array> = (n + 1..2 * n + 1).map(arr).collect::<Result<_, _>>()?;
                let dn = instr.scatter_dimension_numbers();
                let outs = reduce::scatter(self, c, &operands, indices, &updates, &dn)?;
                return Ok(if instr.shape.is_tuple() {
                    Value::Tuple(outs.into_iter().map(Value::Array).collect())
                } else {
                    Value::Array(
                        outs.into_iter()
                            .next()
                            .ok_or_else(|| EvalError::invalid("scatter produced nothing"))?,
                    )
                });
            }
            O::TopK => {
                let k = instr.int_attr(AttrKey::K).unwrap_or(1);
                let largest = instr.bool_attr(AttrKey::Largest).unwrap_or(true);
                let (v, i) = reduce::topk(arr(0)?, k, largest)?;
                return Ok(Value::Tuple(vec![Value::Array(v), Value::Array(i)]));
            }
            O::RngBitGenerator => {
                let algorithm = instr
                    .ident_attr(AttrKey::Algorithm)
                    .unwrap_or("rng_default");
                let state = arr(0)?;
                let Shape::Tuple(parts) = &instr.shape else {
                    return bad("rng-bit-generator result is not a tuple");
                };
                let out = parts
                    .get(1)
                    .and_then(|s| s.as_array())
                    .ok_or_else(|| EvalError::invalid("rng-bit-generator result shape"))?;
                let (new_state, bits) =
                    rng::rng_bit_generator(algorithm, state, out.element_type, &out.dims)?;
                return Ok(Value::Tuple(vec![
                    Value::Array(new_state),
                    Value::Array(bits),
                ]));
            }
            O::Cholesky => {
                let lower = instr.bool_attr(AttrKey::Lower).unwrap_or(false);
                linalg::cholesky(arr(0)?, lower)?
            }
            O::TriangularSolve => {
                let transpose_a = linalg::TransposeA::from_name(
                    instr
                        .ident_attr(AttrKey::TransposeA)
                        .unwrap_or("NO_TRANSPOSE"),
                )?;
                let options = linalg::TriangularSolveOptions {
                    left_side: instr.bool_attr(AttrKey::LeftSide).unwrap_or(false),
                    lower: instr.bool_attr(AttrKey::Lower).unwrap_or(false),
                    unit_diagonal: instr.bool_attr(AttrKey::UnitDiagonal).unwrap_or(false),
                    transpose_a,
                };
                linalg::triangular_solve(arr(0)?, arr(1)?, options)?
            }
            O::PartitionId => Array::scalar_u32(self.ctx.partition_id as u32),
            O::ReplicaId => Array::scalar_u32(self.ctx.replica_id as u32),
            O::Copy => return operand(0).cloned(),
            O::Bitcast | O::Reshape => {
                let (ty, dims) = out_array_shape()?;
                let a = arr(0)?;
                if a.ty != ty && op == O::Reshape {
                    return bad("reshape changes the element type");
                }
                if crate::value::element_count(&dims) != a.len() {
                    return bad(format!("cannot reshape {} elements to {:?}", a.len(), dims));
                }
                if a.ty != ty {
                    ew::bitcast_convert(a, ty, &dims)?
                } else {
                    a.reshaped(dims)
                }
            }
            O::DynamicReshape => {
                let (_, dims) = out_array_shape()?;
                let a = arr(0)?;
                if crate::value::element_count(&dims) != a.len() {
                    return bad("dynamic-reshape with dynamic sizes is not supported");
                }
                a.reshaped(dims)
            }
            O::Broadcast => {
                let (_, dims) = out_array_shape()?;
                data::broadcast(arr(0)?, &dims, instr.dimensions())?
            }
            O::Transpose => data::transpose(arr(0)?, instr.dimensions())?,
            O::Slice => {
                let sd = instr
                    .slice_dims()
                    .ok_or_else(|| EvalError::invalid("slice without slice attribute"))?;
                data::slice(arr(0)?, sd)?
            }
            O::Reverse => data::reverse(arr(0)?, instr.dimensions())?,
            O::DynamicSlice => {
                let sizes = instr.ints_attr(AttrKey::DynamicSliceSizes).ok_or_else(|| {
                    EvalError::invalid("dynamic-slice without dynamic_slice_sizes")
                })?;
                let idx: Vec<&Array> = (1..instr.operands.len())
                    .map(arr)
                    .collect::<Result<_, _>>()?;
                let starts = data::scalar_indices(&idx)?;
                data::dynamic_slice(arr(0)?, &starts, sizes)?
            }
            O::DynamicUpdateSlice => {
                let idx: Vec<&Array> = (2..instr.operands.len())
                    .map(arr)
                    .collect::<Result<_, _>>()?;
                let starts = data::scalar_indices(&idx)?;
                data::dynamic_update_slice(arr(0)?, arr(1)?, &starts)?
            }
            O::Pad => {
                let p = instr
                    .padding()
                    .ok_or_else(|| EvalError::invalid("pad without padding"))?;
                data::pad(arr(0)?, arr(1)?, p)?
            }
            O::Concatenate => {
                let ops: Vec<&Array> = (0..instr.operands.len())
                    .map(arr)
                    .collect::<Result<_, _>>()?;
                let d = instr.dimensions().first().copied().unwrap_or(0);
                data::concatenate(&ops, d)?
            }
            O::Iota => {
                let (ty, dims) = out_array_shape()?;
                let d = instr.int_attr(AttrKey::IotaDimension).unwrap_or(0);
                data::iota(ty, &dims, d)?
            }
            O::Gather => {
                let (_, dims) = out_array_shape()?;
                let sizes = instr
                    .ints_attr(AttrKey::SliceSizes)
                    .ok_or_else(|| EvalError::invalid("gather without slice_sizes"))?;
                data::gather(
                    arr(0)?,
                    arr(1)?,
                    &instr.gather_dimension_numbers(),
                    sizes,
                    &dims,
                )?
            }
            O::GetDimensionSize => {
                let d = instr.dimensions().first().copied().unwrap_or(0);
                let a = arr(0)?;
                let size = usize::try_from(d)
                    .ok()
                    .and_then(|d| a.dims.get(d))
                    .ok_or_else(|| EvalError::invalid("dimension out of range"))?;
                Array::scalar_s32(*size as i32)
            }
            O::SetDimensionSize => arr(0)?.clone(),
            O::Dot => {
                let (ty, dims) = out_array_shape()?;
                let r = dot::dot(
                    arr(0)?,
                    arr(1)?,
                    &instr.dot_dimension_numbers(),
                    ty,
                    self.accumulation(),
                )?;
                if r.dims != dims {
                    return bad(format!(
                        "dot result {:?} differs from the declared shape {:?}",
                        r.dims, dims
                    ));
                }
                r
            }
            O::Convolution => {
                let (ty, dims) = out_array_shape()?;
                let dn = instr
                    .conv_dimension_numbers()
                    .ok_or_else(|| EvalError::invalid("convolution without dim_labels"))?;
                let default_window;
                let w = match instr.window() {
                    Some(w) => w,
                    None => {
                        default_window = xla_hlo_ir::attrs::Window {
                            dims: vec![Default::default(); dn.input_spatial.len()],
                        };
                        &default_window
                    }
                };
                dot::convolution(
                    arr(0)?,
                    arr(1)?,
                    dn,
                    w,
                    instr.int_attr(AttrKey::FeatureGroupCount).unwrap_or(1),
                    instr.int_attr(AttrKey::BatchGroupCount).unwrap_or(1),
                    ty,
                    &dims,
                    self.accumulation(),
                )?
            }
            O::Compare => {
                let dir = instr
                    .ident_attr(AttrKey::Direction)
                    .and_then(ew::Direction::parse)
                    .ok_or_else(|| EvalError::invalid("compare without a valid direction"))?;
                let total = instr.ident_attr(AttrKey::CompareType) == Some("TOTALORDER");
                ew::compare(arr(0)?, arr(1)?, dir, total)?
            }
            O::Select => ew::select(arr(0)?, arr(1)?, arr(2)?)?,
            O::Clamp => ew::clamp(arr(0)?, arr(1)?, arr(2)?)?,
            O::Convert => {
                let (ty, _) = out_array_shape()?;
                ew::convert(arr(0)?, ty)?
            }
            O::BitcastConvert => {
                let (ty, dims) = out_array_shape()?;
                ew::bitcast_convert(arr(0)?, ty, &dims)?
            }
            O::ReducePrecision => ew::reduce_precision(
                arr(0)?,
                instr.int_attr(AttrKey::ExponentBits).unwrap_or(8),
                instr.int_attr(AttrKey::MantissaBits).unwrap_or(23),
            )?,
            O::Complex => crate::complex::make_complex(arr(0)?, arr(1)?)?,
            O::Fft => {
                let (ty, dims) = out_array_shape()?;
                let name = instr.ident_attr(AttrKey::FftType).unwrap_or("FFT");
                let kind = crate::complex::FftType::parse(name)
                    .ok_or_else(|| EvalError::invalid(format!("fft: unknown fft_type {name}")))?;
                let lengths = instr.ints_attr(AttrKey::FftLength).unwrap_or(&[]);
                crate::complex::fft(arr(0)?, kind, lengths, ty, &dims)?
            }
            O::Add
            | O::Subtract
            | O::Multiply
            | O::Divide
            | O::Remainder
            | O::Maximum
            | O::Minimum
            | O::Power
            | O::Atan2
            | O::And
            | O::Or
            | O::Xor
            | O::ShiftLeft
            | O::ShiftRightLogical
            | O::ShiftRightArithmetic => ew::binary(op, arr(0)?, arr(1)?)?,
            O::Abs
            | O::Negate
            | O::Exp
            | O::Expm1
            | O::Log
            | O::Log1p
            | O::Sqrt
            | O::Rsqrt
            | O::Cbrt
            | O::Tanh
            | O::Logistic
            | O::Erf
            | O::Sin
            | O::Cos
            | O::Tan
            | O::Atan
            | O::Asin
            | O::Acos
            | O::Sinh
            | O::Cosh
            | O::Asinh
            | O::Acosh
            | O::Atanh
            | O::Floor
            | O::Ceil
            | O::RoundNearestAfz
            | O::RoundNearestEven
            | O::Sign
            | O::Not
            | O::Clz
            | O::PopulationCount
            | O::IsFinite
            | O::Real
            | O::Imag => ew::unary(op, arr(0)?)?,
            _ => {
                return Err(EvalError::UnsupportedOpcode {
                    opcode: op,
                    instruction: instr.name.clone(),
                })
            }
        };
        Ok(Value::Array(a))
    }

    fn operand_values<'v>(
        &self,
        instr: &HloInstruction,
        operand: &dyn Fn(usize) -> Result<&'v Value, EvalError>,
    ) -> Result<Vec<Value>, EvalError> {
        (0..instr.operands.len())
            .map(|k| operand(k).cloned())
            .collect()
    }
}
