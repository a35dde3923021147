//! Stages without markers: the scans over stacked layers inside the
//! microbatch loop (JAX's `lax.scan` over a layer axis: a counted while
//! loop whose body indexes layer-stacked weights by its counter, and the
//! reversed scan autodiff makes of it) are each cut into P loops of
//! `layers / P` iterations, chained carry to carry, and the pieces are
//! marked as stage scopes so the scope-based split applies: forward piece
//! k is stage k; the backward scan runs the layers last first, so its
//! piece k is stage P-1-k.
//!
//! Invariants: the cut loops run exactly the iterations of the original, in
//! the same order, on the same carry (one shared body; each piece's
//! condition stops at its bound), so results are unchanged; a scan whose
//! trip count is not a multiple of P (or smaller than P) is refused.

use crate::error::MpmdError;
use crate::stages::{carry_read, scalar_int};
use std::sync::Arc;
use xla_hlo_ir::attrs::{AttrKey, AttrValue};
use xla_hlo_ir::literal::Literal;
use xla_hlo_ir::{CompId, HloComputation, HloInstruction, HloModule, InstrId, Opcode};

/// A counted loop: `counter < limit` with the counter starting at `start`.
struct CountedLoop {
    while_id: InstrId,
    condition: CompId,
    /// The condition's limit constant.
    limit_id: InstrId,
    start: i128,
    limit: i128,
    backward: bool,
}

fn counted_loop(module: &HloModule, comp: &HloComputation, id: InstrId) -> Option<CountedLoop> {
    let instr = comp.instr(id);
    if instr.opcode != Opcode::While {
        return None;
    }
    let condition = instr.computation_attr(AttrKey::Condition)?;
    let cond = module.comp(condition);
    let root = cond.root_instr();
    if root.opcode != Opcode::Compare
        || root.ident_attr(AttrKey::Direction) != Some("LT")
        || root.operands.len() != 2
    {
        return None;
    }
    let counter = carry_read(cond, root.operands[0])?;
    let limit = scalar_int(cond.instr(root.operands[1]))?;
    let init = comp.instr(*instr.operands.first()?);
    if init.opcode != Opcode::Tuple {
        return None;
    }
    let start = scalar_int(comp.instr(*init.operands.get(counter)?))?;
    Some(CountedLoop {
        while_id: id,
        condition,
        limit_id: root.operands[1],
        start,
        limit,
        backward: instr.op_name().is_some_and(|n| n.contains("transpose(")),
    })
}

fn metadata(name: &str) -> AttrValue {
    AttrValue::Raw(Arc::from(format!("{{op_name=\"{name}\"}}").as_str()))
}

/// A copy of `condition` whose limit is `limit`.
fn condition_with_limit(
    module: &HloModule,
    l: &CountedLoop,
    limit: i128,
    k: usize,
) -> HloComputation {
    let mut cond = module.comp(l.condition).clone();
    cond.name = format!("{}.cut{k}", cond.name);
    for instr in &mut cond.instructions {
        instr.name = format!("{}.cut{k}", instr.name);
    }
    let constant = cond.instr_mut(l.limit_id);
    if let Some(Literal::Array(array)) = constant.literal.as_deref_mut() {
        array.set_int(0, limit);
    }
    cond
}

/// Cuts the layer scans of the entry's microbatch loop into `num_stages`
/// marked pieces (see the module header). Returns how many scans were cut.
pub fn cut_layer_scans(
    module: &mut HloModule,
    prefix: &str,
    num_stages: usize,
) -> Result<usize, MpmdError> {
    let entry = module.entry_computation();
    let loops: Vec<InstrId> = entry
        .ids()
        .filter(|&id| {
            let instr = entry.instr(id);
            instr.opcode == Opcode::While
                && instr.computation_attr(AttrKey::Body).is_some_and(|b| {
                    module
                        .comp(b)
                        .instructions
                        .iter()
                        .any(|i| i.opcode == Opcode::While)
                })
        })
        .collect();
    let microbatch_while = match loops.as_slice() {
        [one] => *one,
        [] => {
            return Err(MpmdError::Loop(format!(
                "no while loop of %{} holds a scan over layers to cut into stages",
                entry.name
            )))
        }
        [a, b, ..] => {
            return Err(MpmdError::Loop(format!(
                "two while loops hold inner scans (%{} and %{}); pipeline one loop per program",
                entry.instr(*a).name,
                entry.instr(*b).name
            )))
        }
    };
    let body_id = entry
        .instr(microbatch_while)
        .computation_attr(AttrKey::Body)
        .expect("filtered on it");
    let body = module.comp(body_id);
    let scans: Vec<CountedLoop> = body
        .ids()
        .filter_map(|id| counted_loop(module, body, id))
        .collect();
    if scans.is_empty() {
        return Err(MpmdError::Stages(format!(
            "the microbatch loop's body %{} has no counted scan over layers to cut",
            body.name
        )));
    }
    for scan in &scans {
        let layers = scan.limit - scan.start;
        if layers < num_stages as i128 || layers % num_stages as i128 != 0 {
            return Err(MpmdError::Options(format!(
                "%{} scans {layers} layers, which cannot be cut into {num_stages} stages of equal size",
                body.instr(scan.while_id).name
            )));
        }
    }
    // New conditions, one per piece of each scan.
    let mut conditions: Vec<Vec<CompId>> = Vec::new();
    for scan in &scans {
        let per_stage = (scan.limit - scan.start) / num_stages as i128;
        let mut ids = Vec::new();
        for k in 0..num_stages {
            let cond =
                condition_with_limit(module, scan, scan.start + (k as i128 + 1) * per_stage, k);
            module.computations.push(cond);
            ids.push(CompId(module.computations.len() as u32 - 1));
        }
        conditions.push(ids);
    }
    // Rebuild the body with every scan replaced by its chained pieces.
    let body = module.comp(body_id).clone();
    let mut out = HloComputation::new(body.name.clone());
    out.execution_thread = body.execution_thread.clone();
    let mut map: Vec<InstrId> = Vec::with_capacity(body.instructions.len());
    let stage_name = |scan: &CountedLoop, k: usize| {
        if scan.backward {
            format!("transpose({prefix}{})/while", num_stages - 1 - k)
        } else {
            format!("{prefix}{k}/while")
        }
    };
    for (i, instr) in body.instructions.iter().enumerate() {
        let mut copy = instr.clone();
        copy.operands = copy.operands.iter().map(|o| map[o.index()]).collect();
        copy.control_predecessors = copy
            .control_predecessors
            .iter()
            .map(|o| map[o.index()])
            .collect();
        let Some((s, scan)) = scans
            .iter()
            .enumerate()
            .find(|(_, s)| s.while_id.index() == i)
        else {
            map.push(out.add(copy));
            continue;
        };
        // The original init tuple joins the first piece's stage.
        let init = copy.operands[0];
        out.instr_mut(init)
            .set_attr(AttrKey::Metadata, metadata(&stage_name(scan, 0)));
        let element_count = copy.shape.tuple_elements().len();
        let mut previous: Option<InstrId> = None;
        for (k, &condition) in conditions[s].iter().enumerate() {
            let mut piece = copy.clone();
            piece.name = format!("{}.cut{k}", copy.name);
            piece.set_attr(AttrKey::Condition, AttrValue::Computation(condition));
            piece.set_attr(AttrKey::Metadata, metadata(&stage_name(scan, k)));
            if let Some(prev) = previous {
                let elements: Vec<InstrId> = (0..element_count)
                    .map(|j| {
                        let mut gte = HloInstruction::new(
                            format!("{}.cut{k}.in{j}", copy.name),
                            Opcode::GetTupleElement,
                            copy.shape.tuple_elements()[j].clone(),
                            vec![prev],
                        );
                        gte.set_attr(AttrKey::Index, AttrValue::Int(j as i64));
                        out.add(gte)
                    })
                    .collect();
                let mut tuple = HloInstruction::new(
                    format!("{}.cut{k}.init", copy.name),
                    Opcode::Tuple,
                    copy.shape.clone(),
                    elements,
                );
                tuple.set_attr(AttrKey::Metadata, metadata(&stage_name(scan, k)));
                piece.operands = vec![out.add(tuple)];
            }
            previous = Some(out.add(piece));
        }
        map.push(previous.expect("at least one stage"));
    }
    out.root = map[body.root.index()];
    out.parameters = body.parameters.iter().map(|p| map[p.index()]).collect();
    *module.comp_mut(body_id) = out;
    Ok(scans.len())
}
