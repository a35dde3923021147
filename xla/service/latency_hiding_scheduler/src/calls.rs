//! The call graph: computations in callee-before-caller order, which
//! computations are sequential (scheduled) as opposed to fused or wrapped,
//! and while-loop trip counts.
//!
//! Invariants: `callee_first_order` lists every computation exactly once,
//! callees before callers when the call graph is acyclic (a cyclic or
//! dangling graph still yields every computation once); trip counts are
//! only reported when the loop has the canonical counted form, else `None`.

use xla_hlo_ir::call_graph::CallGraph;
use xla_hlo_ir::{AttrKey, CompId, HloComputation, HloInstruction, HloModule, Literal, Opcode};

/// Every computation, callees first (post-order from the entry, then the
/// unreachable ones in arena order).
pub fn callee_first_order(module: &HloModule) -> Vec<CompId> {
    let graph = CallGraph::new(module);
    graph.post_order(std::iter::once(module.entry).chain(graph.all()))
}

/// How a computation is used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompUse {
    /// Runs as a sequence of kernels: the entry, while bodies and
    /// conditions, branches, call targets. These get scheduled.
    Sequential,
    /// Fused, or applied element by element (reducers, comparators), or the
    /// body of an async wrapper: kept as it is (topologically ordered).
    Embedded,
}

/// The use of every computation (indexed by `CompId`).
pub fn computation_uses(module: &HloModule) -> Vec<CompUse> {
    let n = module.computations.len();
    let mut uses = vec![CompUse::Embedded; n];
    if let Some(u) = uses.get_mut(module.entry.index()) {
        *u = CompUse::Sequential;
    }
    for comp in &module.computations {
        for i in &comp.instructions {
            let seq_keys: &[AttrKey] = match i.opcode {
                Opcode::While => &[AttrKey::Body, AttrKey::Condition],
                Opcode::Call => &[AttrKey::ToApply],
                Opcode::Conditional => &[
                    AttrKey::BranchComputations,
                    AttrKey::TrueComputation,
                    AttrKey::FalseComputation,
                ],
                _ => &[],
            };
            for a in &i.attrs {
                if !seq_keys.contains(&a.key) {
                    continue;
                }
                match &a.value {
                    xla_hlo_ir::AttrValue::Computation(c) => {
                        if let Some(u) = uses.get_mut(c.index()) {
                            *u = CompUse::Sequential;
                        }
                    }
                    xla_hlo_ir::AttrValue::Computations(cs) => {
                        for c in cs {
                            if let Some(u) = uses.get_mut(c.index()) {
                                *u = CompUse::Sequential;
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    uses
}

fn scalar_int(lit: &Literal) -> Option<i64> {
    match lit {
        Literal::Array(a) if a.len() == 1 && a.element_type().is_integer() => {
            i64::try_from(a.get_i128(0)).ok()
        }
        _ => None,
    }
}

fn operand<'a>(
    comp: &'a HloComputation,
    i: &HloInstruction,
    k: usize,
) -> Option<&'a HloInstruction> {
    i.operands
        .get(k)
        .and_then(|o| comp.instructions.get(o.index()))
}

/// Follows `get-tuple-element(tuple(...))` and copies/converts to the
/// instruction that defines element `index` of `instr`.
fn constant_value(comp: &HloComputation, instr: &HloInstruction, depth: usize) -> Option<i64> {
    if depth > 16 {
        return None;
    }
    match instr.opcode {
        Opcode::Constant => instr.literal.as_deref().and_then(scalar_int),
        Opcode::Copy | Opcode::Convert | Opcode::Bitcast | Opcode::Reshape => {
            constant_value(comp, operand(comp, instr, 0)?, depth + 1)
        }
        Opcode::GetTupleElement => {
            let k = instr.int_attr(AttrKey::Index)? as usize;
            let t = operand(comp, instr, 0)?;
            if t.opcode == Opcode::Tuple {
                constant_value(comp, operand(comp, t, k)?, depth + 1)
            } else {
                None
            }
        }
        _ => None,
    }
}

/// The index `k` when `instr` is `get-tuple-element(parameter(0)), index=k`.
fn param_element(comp: &HloComputation, instr: &HloInstruction) -> Option<usize> {
    let mut cur = instr;
    for _ in 0..4 {
        match cur.opcode {
            Opcode::Copy | Opcode::Convert | Opcode::Bitcast => cur = operand(comp, cur, 0)?,
            _ => break,
        }
    }
    if cur.opcode != Opcode::GetTupleElement {
        return None;
    }
    let p = operand(comp, cur, 0)?;
    if p.opcode != Opcode::Parameter {
        return None;
    }
    usize::try_from(cur.int_attr(AttrKey::Index)?).ok()
}

/// Trip count of a counted loop: condition `compare(gte(p, k), constant(N))`
/// (LT/LE/GT/GE/NE, either operand order), body updating element `k` by a
/// constant step, initial value constant. `None` otherwise.
pub fn while_trip_count(
    module: &HloModule,
    comp: &HloComputation,
    w: &HloInstruction,
) -> Option<u64> {
    if let Some(xla_hlo_ir::AttrValue::Raw(cfg)) = w.attr(AttrKey::BackendConfig) {
        if let Some(pos) = cfg.find("\"n\":\"") {
            let rest = &cfg[pos + 5..];
            if let Some(end) = rest.find('"') {
                if let Ok(n) = rest[..end].parse::<u64>() {
                    return Some(n);
                }
            }
        }
    }
    let cond = module
        .computations
        .get(w.computation_attr(AttrKey::Condition)?.index())?;
    let body = module
        .computations
        .get(w.computation_attr(AttrKey::Body)?.index())?;
    let root = cond.instructions.get(cond.root.index())?;
    if root.opcode != Opcode::Compare {
        return None;
    }
    let dir = root.ident_attr(AttrKey::Direction)?;
    let a = operand(cond, root, 0)?;
    let b = operand(cond, root, 1)?;
    let (k, limit, dir) = match (param_element(cond, a), constant_value(cond, b, 0)) {
        (Some(k), Some(n)) => (k, n, dir.to_string()),
        _ => {
            let k = param_element(cond, b)?;
            let n = constant_value(cond, a, 0)?;
            let flipped = match dir {
                "LT" => "GT",
                "LE" => "GE",
                "GT" => "LT",
                "GE" => "LE",
                d => d,
            };
            (k, n, flipped.to_string())
        }
    };
    // Initial value.
    let init = operand(comp, w, 0)?;
    let start = if init.opcode == Opcode::Tuple {
        constant_value(comp, operand(comp, init, k)?, 0)?
    } else {
        return None;
    };
    // Step: body root tuple element k = add(gte(param, k), constant(step)).
    let broot = body.instructions.get(body.root.index())?;
    if broot.opcode != Opcode::Tuple {
        return None;
    }
    let upd = operand(body, broot, k)?;
    let step = match upd.opcode {
        Opcode::Add => {
            let (x, y) = (operand(body, upd, 0)?, operand(body, upd, 1)?);
            if param_element(body, x) == Some(k) {
                constant_value(body, y, 0)?
            } else if param_element(body, y) == Some(k) {
                constant_value(body, x, 0)?
            } else {
                return None;
            }
        }
        Opcode::Subtract => {
            let (x, y) = (operand(body, upd, 0)?, operand(body, upd, 1)?);
            if param_element(body, x) != Some(k) {
                return None;
            }
            -constant_value(body, y, 0)?
        }
        _ => return None,
    };
    if step == 0 {
        return None;
    }
    let span: i128 = match (dir.as_str(), step > 0) {
        ("LT", true) | ("NE", true) => limit as i128 - start as i128,
        ("LE", true) => limit as i128 - start as i128 + 1,
        ("GT", false) | ("NE", false) => start as i128 - limit as i128,
        ("GE", false) => start as i128 - limit as i128 + 1,
        _ => return None,
    };
    if span <= 0 {
        return Some(0);
    }
    let s = step.unsigned_abs() as i128;
    u64::try_from((span + s - 1) / s).ok()
}
