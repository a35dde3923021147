//! Names used before their definition: operands and control predecessors
//! (resolved at the end of their computation) and called computations
//! (resolved as soon as they are known, at the latest at the end of the
//! module).
//!
//! Invariants: an unresolved reference holds the placeholder id
//! `u32::MAX` and a pending record with the text position of the name, so
//! a name that is never defined becomes an error at that position.

use super::state::Parser;
use rustc_hash::FxHashMap;
use xla_hlo_ir::attrs::AttrKey;
use xla_hlo_ir::module::{HloComputation, InstrId};

/// A name used before its definition, to resolve later.
pub(super) struct PendingRef<'a> {
    pub(super) instr: usize,
    pub(super) slot: RefSlot,
    pub(super) name: &'a str,
    pub(super) pos: usize,
}

pub(super) enum RefSlot {
    Operand(usize),
    ControlPredecessor(usize),
}

/// A computation name used in an attribute, to resolve at module end.
pub(super) struct PendingComp<'a> {
    pub(super) comp: usize,
    pub(super) instr: usize,
    /// Attribute keys are unique per instruction (duplicates are rejected).
    pub(super) attr: AttrKey,
    pub(super) index: usize,
    pub(super) name: &'a str,
    pub(super) pos: usize,
}

pub(super) struct ComputationState<'a> {
    pub(super) comp: HloComputation,
    pub(super) names: FxHashMap<&'a str, InstrId>,
    pub(super) pending: Vec<PendingRef<'a>>,
}

impl<'a> Parser<'a> {
    /// Resolves a reference to an instruction by name, or records it for later.
    pub(super) fn reference(
        &self,
        state: &mut ComputationState<'a>,
        name: &'a str,
        pos: usize,
        slot: RefSlot,
    ) -> InstrId {
        match state.names.get(name) {
            Some(&id) => id,
            None => {
                state.pending.push(PendingRef {
                    instr: state.comp.instructions.len(),
                    slot,
                    name,
                    pos,
                });
                InstrId(u32::MAX)
            }
        }
    }
}
