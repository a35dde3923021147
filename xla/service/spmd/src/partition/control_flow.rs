//! Control flow: while loops, conditionals and calls, whose bodies,
//! branches and callees are partitioned (by the driver, recursively) with
//! the shardings of their call site.
//!
//! Invariant: a while loop's init, body parameter, body root and result
//! share one sharding (the instruction's); a conditional's branches and a
//! call's callee return the instruction's sharding.

use crate::helpers::HandlerResult;
use crate::part::Part;
use crate::value::{local_shape, PValue, ValueSharding};
use std::rc::Rc;
use xla_hlo_ir::{AttrKey, AttrValue, HloInstruction};

pub fn while_loop(
    p: &mut Part<'_, '_>,
    instr: &HloInstruction,
    target: &ValueSharding,
) -> HandlerResult {
    let (Some(body), Some(cond)) = (
        instr.computation_attr(AttrKey::Body),
        instr.computation_attr(AttrKey::Condition),
    ) else {
        return Ok(None);
    };
    let init = p.operand(instr, 0)?;
    let init = p.reshard(&init, target)?;
    let (nb, _) = p.partition_sub(body, std::slice::from_ref(target), Some(target))?;
    let (nc, _) = p.partition_sub(cond, std::slice::from_ref(target), None)?;
    let shape = local_shape(&instr.shape, target);
    let id = p.clone_instr(instr, vec![init.id], shape);
    let w = p.b.comp.instr_mut(id);
    w.set_attr(AttrKey::Body, AttrValue::Computation(nb));
    w.set_attr(AttrKey::Condition, AttrValue::Computation(nc));
    p.note(instr, "while");
    Ok(Some(PValue {
        id,
        shape: Rc::new(instr.shape.clone()),
        vs: target.clone(),
    }))
}

pub fn conditional(
    p: &mut Part<'_, '_>,
    instr: &HloInstruction,
    target: &ValueSharding,
) -> HandlerResult {
    let branches: Vec<(AttrKey, Option<usize>, xla_hlo_ir::CompId)> =
        if let Some(AttrValue::Computations(cs)) = instr.attr(AttrKey::BranchComputations) {
            cs.iter()
                .enumerate()
                .map(|(i, &c)| (AttrKey::BranchComputations, Some(i), c))
                .collect()
        } else {
            match (
                instr.computation_attr(AttrKey::TrueComputation),
                instr.computation_attr(AttrKey::FalseComputation),
            ) {
                (Some(t), Some(f)) => vec![
                    (AttrKey::TrueComputation, None, t),
                    (AttrKey::FalseComputation, None, f),
                ],
                _ => return Ok(None),
            }
        };
    let sel = p.operand(instr, 0)?;
    let sel = p.replicate(&sel)?;
    let mut ops = vec![sel.id];
    let mut new_branches = Vec::new();
    for (i, (_, _, c)) in branches.iter().enumerate() {
        let v = p.operand(instr, i + 1)?;
        ops.push(v.id);
        let (nc, _) = p.partition_sub(*c, std::slice::from_ref(&v.vs), Some(target))?;
        new_branches.push(nc);
    }
    let shape = local_shape(&instr.shape, target);
    let id = p.clone_instr(instr, ops, shape);
    let ci = p.b.comp.instr_mut(id);
    if branches[0].0 == AttrKey::BranchComputations {
        ci.set_attr(
            AttrKey::BranchComputations,
            AttrValue::Computations(new_branches),
        );
    } else {
        ci.set_attr(
            AttrKey::TrueComputation,
            AttrValue::Computation(new_branches[0]),
        );
        ci.set_attr(
            AttrKey::FalseComputation,
            AttrValue::Computation(new_branches[1]),
        );
    }
    p.note(instr, "conditional");
    Ok(Some(PValue {
        id,
        shape: Rc::new(instr.shape.clone()),
        vs: target.clone(),
    }))
}

pub fn call(p: &mut Part<'_, '_>, instr: &HloInstruction, target: &ValueSharding) -> HandlerResult {
    let Some(callee) = instr.to_apply() else {
        return Ok(None);
    };
    let mut ops = Vec::new();
    let mut params = Vec::new();
    for k in 0..instr.operands.len() {
        let v = p.operand(instr, k)?;
        ops.push(v.id);
        params.push(v.vs);
    }
    let (nc, _) = p.partition_sub(callee, &params, Some(target))?;
    let shape = local_shape(&instr.shape, target);
    let id = p.clone_instr(instr, ops, shape);
    p.b.comp
        .instr_mut(id)
        .set_attr(AttrKey::ToApply, AttrValue::Computation(nc));
    p.note(instr, "call");
    Ok(Some(PValue {
        id,
        shape: Rc::new(instr.shape.clone()),
        vs: target.clone(),
    }))
}
