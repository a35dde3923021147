//! Async chains: an `async-update` or `async-done` continues the
//! `async-start` it reads (through any updates), so it must say the same
//! thing about the wrapped operation as the start does, as XLA's parser
//! requires:
//! - the wrapped opcode of the sugared forms (`custom-call-update` after a
//!   `custom-call-start`, not `add-update`);
//! - the wrapped computation, where the update or done names one (`calls=`);
//! - the execution thread, where the update or done writes one
//!   (`async_execution_thread`; the start's is `main` when absent).
//!
//! And a computation is wrapped by at most one `async-start`.
//!
//! Invariant: runs only on instructions whose operand ids passed the
//! structural checks; follows operand 0 back to a start, never past an
//! instruction that is not an async op, never more steps than the
//! computation has instructions.

use crate::{At, Report};
use std::collections::HashMap;
use xla_hlo_ir::{AttrKey, CompId, HloInstruction, HloModule, Opcode};

fn wrapped_computation(instr: &HloInstruction) -> Option<CompId> {
    instr.computation_attr(AttrKey::Calls)
}

/// Checks an `async-update` or `async-done` against the start it continues.
pub(crate) fn check(at: &At, r: &mut Report) {
    let instr = at.instr();
    if !matches!(instr.opcode, Opcode::AsyncUpdate | Opcode::AsyncDone) {
        return;
    }
    let Some(start) = chain_start(at) else {
        at.err(
            r,
            format!(
                "{} must read an async-start or async-update",
                instr.opcode.name()
            ),
        );
        return;
    };
    if let (Some(ours), Some(theirs)) = (instr.async_wrapped, start.async_wrapped) {
        if ours != theirs {
            at.err(
                r,
                format!(
                    "the async wrapped opcode is {} at '{}' but {} here",
                    theirs.name(),
                    start.name,
                    ours.name()
                ),
            );
        }
    }
    if let (Some(ours), Some(theirs)) = (wrapped_computation(instr), wrapped_computation(start)) {
        if ours != theirs {
            let name = |c: CompId| {
                at.module
                    .computations
                    .get(c.index())
                    .map_or("?", |c| c.name.as_str())
            };
            at.err(
                r,
                format!(
                    "the async wrapped computation is %{} at '{}' but %{} here",
                    name(theirs),
                    start.name,
                    name(ours)
                ),
            );
        }
    }
    let written = instr.attr(AttrKey::AsyncExecutionThread).is_some();
    if written && instr.async_execution_thread() != start.async_execution_thread() {
        at.err(
            r,
            format!(
                "async_execution_thread is \"{}\" at '{}' but \"{}\" here",
                start.async_execution_thread(),
                start.name,
                instr.async_execution_thread()
            ),
        );
    }
}

/// The `async-start` an update or done continues, following operand 0.
fn chain_start<'a>(at: &At<'a>) -> Option<&'a HloInstruction> {
    let mut current = at.instr();
    for _ in 0..at.comp.instructions.len() {
        let operand = at
            .comp
            .instructions
            .get(current.operands.first()?.index())?;
        match operand.opcode {
            Opcode::AsyncStart => return Some(operand),
            Opcode::AsyncUpdate => current = operand,
            _ => return None,
        }
    }
    None
}

/// Every computation wrapped by more than one `async-start`.
pub(crate) fn check_module(module: &HloModule, r: &mut Report) {
    let mut starts: HashMap<CompId, (&str, &str)> = HashMap::new();
    for comp in &module.computations {
        for instr in &comp.instructions {
            if instr.opcode != Opcode::AsyncStart {
                continue;
            }
            let Some(called) = wrapped_computation(instr) else {
                continue;
            };
            if let Some((first_comp, first)) = starts.insert(called, (&comp.name, &instr.name)) {
                let name = module
                    .computations
                    .get(called.index())
                    .map_or("?", |c| c.name.as_str());
                r.instr(
                    &comp.name,
                    &instr.name,
                    format!(
                        "computation %{name} is wrapped by more than one async-start (also by {first_comp}/{first})"
                    ),
                );
            }
        }
    }
}
