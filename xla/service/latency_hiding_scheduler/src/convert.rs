//! `async-collective-creator`: turns synchronous collectives into
//! start/done pairs, as XLA's `AsyncCollectiveCreator` does.
//!
//! * `all-reduce`, `all-gather` and `collective-permute` become their
//!   native `-start`/`-done` opcodes (shapes as XLA builds them:
//!   all-reduce-start has the result shape, all-gather-start is
//!   `(operands, results)`, collective-permute-start is
//!   `(operand, result, u32[], u32[])`);
//! * `reduce-scatter`, `all-to-all`, `collective-broadcast`,
//!   `ragged-all-to-all` (and, with `generic`, all of them, as XLA's GPU
//!   pipeline does with `use_generic_async_start_done`) become
//!   `async-start`/`async-done` pairs whose start `calls=` a new
//!   computation `async_computation[.N]` holding the collective:
//!   `((operands), result, u32[]) async-start(...)`.
//!
//! Names: the start is `<name>-start`, the done `<name>-done`; a wrapped
//! collective keeps its name inside the async computation. Control
//! predecessors move to the start; users and control successors now
//! depend on the done. The start is placed right before the done, so the
//! arena stays in dependency order.
//!
//! Invariants: only sequential computations (entry, loop bodies and
//! conditions, branches, call targets) are rewritten; names stay unique;
//! every computation reference stays valid when async computations are
//! inserted (they go right before their caller, callees first); the pass
//! reports `changed` exactly when it converted something.

use crate::calls::{computation_uses, CompUse};
use crate::kinds::{sync_collective_kind, ResourceKind, NUM_RESOURCES};
use rustc_hash::FxHashSet;
use xla_hlo_ir::{
    AttrKey, AttrValue, CompId, HloComputation, HloInstruction, HloModule, InstrId, Opcode,
    PrimitiveType, Shape,
};
use xla_hlo_pass::{Pass, PassError};

/// Which collectives to convert and how.
#[derive(Clone, Debug, PartialEq)]
pub struct AsyncConversionConfig {
    /// Convert collectives of these kinds (indexed by `ResourceKind`).
    pub kinds: [bool; NUM_RESOURCES],
    /// Wrap every collective in `async-start`/`async-done`, not only those
    /// without native start/done opcodes.
    pub generic: bool,
    /// Leave collectives whose result is smaller than this synchronous.
    pub min_bytes: u64,
}

impl Default for AsyncConversionConfig {
    fn default() -> Self {
        let mut kinds = [false; NUM_RESOURCES];
        for k in ResourceKind::ALL {
            kinds[k.index()] = k.is_collective();
        }
        AsyncConversionConfig {
            kinds,
            generic: false,
            min_bytes: 0,
        }
    }
}

/// The pass.
#[derive(Clone, Debug, Default)]
pub struct AsyncCollectiveCreator {
    pub config: AsyncConversionConfig,
}

impl Pass for AsyncCollectiveCreator {
    fn name(&self) -> &str {
        "async-collective-creator"
    }
    fn run(&mut self, module: &mut HloModule) -> Result<bool, PassError> {
        Ok(convert_collectives(module, &self.config) > 0)
    }
}

fn unique(names: &mut FxHashSet<String>, base: &str) -> String {
    if names.insert(base.to_string()) {
        return base.to_string();
    }
    for k in 1u64.. {
        let cand = format!("{base}.{k}");
        if names.insert(cand.clone()) {
            return cand;
        }
    }
    unreachable!("u64 names exhausted")
}

fn u32_scalar() -> Shape {
    Shape::scalar(PrimitiveType::U32)
}

/// Converts the collectives of every sequential computation; returns how
/// many were converted.
pub fn convert_collectives(module: &mut HloModule, cfg: &AsyncConversionConfig) -> usize {
    let uses = computation_uses(module);
    let mut names: FxHashSet<String> = module
        .computations
        .iter()
        .flat_map(|c| c.instructions.iter().map(|i| i.name.clone()))
        .collect();
    let mut comp_names: FxHashSet<String> =
        module.computations.iter().map(|c| c.name.clone()).collect();
    let mut converted = 0;
    // Work on the original computations by their original index, tracking
    // how far insertions have shifted them.
    let original: Vec<bool> = uses.iter().map(|u| *u == CompUse::Sequential).collect();
    let mut shift = 0u32;
    for (orig_idx, &sequential) in original.iter().enumerate() {
        if !sequential {
            continue;
        }
        let ci = orig_idx + shift as usize;
        let (new_comps, count) = convert_computation(module, ci, cfg, &mut names, &mut comp_names);
        converted += count;
        if new_comps.is_empty() {
            continue;
        }
        let k = new_comps.len() as u32;
        // Shift every reference to computations at or after `ci`.
        let at = ci as u32;
        let bump = |c: &mut CompId| {
            if c.0 >= at && c.0 != u32::MAX {
                c.0 += k;
            }
        };
        for comp in module.computations.iter_mut() {
            remap_comp_refs(comp, &bump);
        }
        let mut new_comps = new_comps;
        for (_, comp) in new_comps.iter_mut() {
            remap_comp_refs(comp, &bump);
        }
        if module.entry.0 >= at {
            module.entry.0 += k;
        }
        // The caller moved to ci + k; point its starts at the new computations.
        let caller = &mut module.computations[ci];
        for (j, (start, _)) in new_comps.iter().enumerate() {
            if let Some(s) = caller.instructions.get_mut(start.index()) {
                s.set_attr(
                    AttrKey::Calls,
                    AttrValue::Computation(CompId(at + j as u32)),
                );
            }
        }
        for (j, (_, comp)) in new_comps.into_iter().enumerate() {
            module.computations.insert(ci + j, comp);
        }
        shift += k;
    }
    converted
}

fn remap_comp_refs(comp: &mut HloComputation, f: &impl Fn(&mut CompId)) {
    for instr in comp.instructions.iter_mut() {
        for a in instr.attrs.iter_mut() {
            match &mut a.value {
                AttrValue::Computation(c) => f(c),
                AttrValue::Computations(cs) => cs.iter_mut().for_each(f),
                _ => {}
            }
        }
    }
}

/// How one collective is converted.
enum Plan {
    Native(Opcode, Opcode, Shape),
    Generic(Vec<Shape>),
}

fn plan(
    comp: &HloComputation,
    instr: &HloInstruction,
    cfg: &AsyncConversionConfig,
) -> Option<Plan> {
    let kind = sync_collective_kind(instr)?;
    if !cfg.kinds[kind.index()] || instr.shape.byte_size() < cfg.min_bytes {
        return None;
    }
    let op_shapes: Vec<Shape> = instr
        .operands
        .iter()
        .map(|o| comp.instructions.get(o.index()).map(|i| i.shape.clone()))
        .collect::<Option<_>>()?;
    if op_shapes.is_empty() {
        return None;
    }
    if cfg.generic {
        return Some(Plan::Generic(op_shapes));
    }
    let pack = |v: &[Shape]| {
        if v.len() == 1 {
            v[0].clone()
        } else {
            Shape::Tuple(v.to_vec())
        }
    };
    Some(match instr.opcode {
        Opcode::AllReduce => Plan::Native(
            Opcode::AllReduceStart,
            Opcode::AllReduceDone,
            instr.shape.clone(),
        ),
        Opcode::AllGather => Plan::Native(
            Opcode::AllGatherStart,
            Opcode::AllGatherDone,
            Shape::Tuple(vec![pack(&op_shapes), instr.shape.clone()]),
        ),
        Opcode::CollectivePermute
            if op_shapes.len() == 1 && !instr.has_attr(AttrKey::SliceSizes) =>
        {
            Plan::Native(
                Opcode::CollectivePermuteStart,
                Opcode::CollectivePermuteDone,
                Shape::Tuple(vec![
                    op_shapes[0].clone(),
                    instr.shape.clone(),
                    u32_scalar(),
                    u32_scalar(),
                ]),
            )
        }
        _ => Plan::Generic(op_shapes),
    })
}

/// Rewrites computation `ci`; returns the async computations to insert
/// before it (with the id of the start that calls each) and the count of
/// conversions.
fn convert_computation(
    module: &mut HloModule,
    ci: usize,
    cfg: &AsyncConversionConfig,
    names: &mut FxHashSet<String>,
    comp_names: &mut FxHashSet<String>,
) -> (Vec<(InstrId, HloComputation)>, usize) {
    let comp = &module.computations[ci];
    let plans: Vec<Option<Plan>> = comp
        .instructions
        .iter()
        .map(|i| plan(comp, i, cfg))
        .collect();
    let count = plans.iter().filter(|p| p.is_some()).count();
    if count == 0 {
        return (Vec::new(), 0);
    }
    let n = comp.instructions.len();
    // New ids: each converted collective becomes start + done.
    let mut map = vec![InstrId(0); n];
    let mut next = 0u32;
    for (i, p) in plans.iter().enumerate() {
        if p.is_some() {
            next += 1; // the start
        }
        map[i] = InstrId(next); // the done (or the instruction itself)
        next += 1;
    }
    let remap = |id: InstrId| map.get(id.index()).copied().unwrap_or(id);
    let old = std::mem::take(&mut module.computations[ci].instructions);
    let mut out: Vec<HloInstruction> = Vec::with_capacity(next as usize);
    let mut new_comps = Vec::new();
    for (i, (mut instr, p)) in old.into_iter().zip(plans).enumerate() {
        instr.operands = instr.operands.iter().map(|&o| remap(o)).collect();
        instr.control_predecessors = instr
            .control_predecessors
            .iter()
            .map(|&o| remap(o))
            .collect();
        let Some(p) = p else {
            out.push(instr);
            continue;
        };
        let start_id = InstrId(map[i].0 - 1);
        let start_name = unique(names, &format!("{}-start", instr.name));
        let done_name = unique(names, &format!("{}-done", instr.name));
        let result_shape = instr.shape.clone();
        let sharding = instr.sharding.take();
        match p {
            Plan::Native(start_op, done_op, start_shape) => {
                let mut start = instr;
                start.name = start_name;
                start.opcode = start_op;
                start.shape = start_shape;
                let mut done =
                    HloInstruction::new(done_name, done_op, result_shape, vec![start_id]);
                done.sharding = sharding;
                out.push(start);
                out.push(done);
            }
            Plan::Generic(op_shapes) => {
                let cname = unique(comp_names, "async_computation");
                let mut wrapped = HloComputation::new(cname);
                let mut params = Vec::new();
                for (k, s) in op_shapes.iter().enumerate() {
                    let mut p = HloInstruction::new(
                        unique(names, &format!("{}.arg{k}", instr.name)),
                        Opcode::Parameter,
                        s.clone(),
                        Vec::new(),
                    );
                    p.parameter_number = Some(k as i64);
                    params.push(wrapped.add(p));
                }
                let operands = std::mem::replace(&mut instr.operands, params);
                let control = std::mem::take(&mut instr.control_predecessors);
                let mut inner = instr;
                inner.async_wrapped = None;
                let root = wrapped.add(inner);
                wrapped.root = root;
                let mut start = HloInstruction::new(
                    start_name,
                    Opcode::AsyncStart,
                    Shape::Tuple(vec![
                        Shape::Tuple(op_shapes),
                        result_shape.clone(),
                        u32_scalar(),
                    ]),
                    operands,
                );
                start.control_predecessors = control;
                // Placeholder; set to the inserted computation by the caller.
                start.set_attr(AttrKey::Calls, AttrValue::Computation(CompId(u32::MAX)));
                let mut done =
                    HloInstruction::new(done_name, Opcode::AsyncDone, result_shape, vec![start_id]);
                done.sharding = sharding;
                new_comps.push((start_id, wrapped));
                out.push(start);
                out.push(done);
            }
        }
    }
    let comp = &mut module.computations[ci];
    comp.root = remap(comp.root);
    comp.parameters = comp.parameters.iter().map(|&p| remap(p)).collect();
    comp.instructions = out;
    (new_comps, count)
}
