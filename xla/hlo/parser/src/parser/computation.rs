//! One computation: `name (p: shape, ...) -> shape { instructions }`, the
//! signature optional (read and dropped, the parameters say the same, after
//! its result is checked against the root's shape), then an optional
//! `, execution_thread="..."`.
//!
//! Invariants: at its closing brace every operand and control-predecessor
//! name is resolved or an error; a computation has at least one
//! instruction, at most one ROOT (the last instruction otherwise) and no
//! gap in its parameter numbers.

use super::names::{ComputationState, PendingComp, RefSlot};
use super::state::Parser;
use crate::cursor::PResult;
use rustc_hash::FxHashMap;
use xla_hlo_ir::module::{CompId, HloComputation, InstrId};

impl<'a> Parser<'a> {
    pub(super) fn computation(
        &mut self,
        id: CompId,
    ) -> PResult<(HloComputation, Vec<PendingComp<'a>>, &'a str)> {
        let name = self.c.ident()?;
        // The signature repeats what the parameters say; only its result is
        // kept, to check it against the root's shape as XLA does.
        let mut signature_result = None;
        if self.c.peek() == Some(b'(') {
            self.c.expect(b'(')?;
            if !self.c.eat(b')') {
                loop {
                    self.c.ident()?;
                    self.c.expect(b':')?;
                    self.shape()?;
                    if self.c.eat(b')') {
                        break;
                    }
                    self.c.expect(b',')?;
                }
            }
            if !self.c.eat_str("->") {
                return Err(self.c.expected("'->'"));
            }
            self.c.skip_ws();
            let pos = self.c.pos;
            signature_result = Some((pos, self.shape()?));
        }
        self.c.expect(b'{')?;
        // Size the arenas by the lines up to the closing brace of the body
        // (one instruction per line as printed; an over-estimate costs an
        // instruction's full size per slot, so lines, not bytes, are counted).
        let body_len = self.c.src[self.c.pos..].find("\n}").unwrap_or(0);
        let body = &self.c.src.as_bytes()[self.c.pos..self.c.pos + body_len];
        let estimate = body.iter().filter(|&&b| b == b'\n').count() + 1;
        let mut state = ComputationState {
            comp: HloComputation::new(name),
            names: FxHashMap::with_capacity_and_hasher(estimate, Default::default()),
            pending: Vec::new(),
        };
        state.comp.instructions.reserve(estimate);
        let mut pending_comps = Vec::new();
        let mut root: Option<InstrId> = None;
        loop {
            if self.c.eat(b'}') {
                break;
            }
            if self.c.at_end() {
                return Err(self.c.expected("'}' closing the computation"));
            }
            let pos = self.c.pos;
            let is_root = self.c.eat_keyword("ROOT");
            let instr_id = self.instruction(&mut state, id, &mut pending_comps)?;
            if is_root {
                if root.is_some() {
                    return Err(self.err(pos, "more than one ROOT instruction"));
                }
                root = Some(instr_id);
            }
        }
        if state.comp.instructions.is_empty() {
            return Err(self.err(
                self.c.pos,
                format!("computation '{name}' has no instructions"),
            ));
        }
        if self.c.peek() == Some(b',') {
            let save = self.c.pos;
            self.c.eat(b',');
            if self.c.eat_keyword("execution_thread") {
                self.c.expect(b'=')?;
                state.comp.execution_thread = Some(self.c.string()?);
            } else {
                self.c.pos = save;
            }
        }
        for p in std::mem::take(&mut state.pending) {
            let Some(&target) = state.names.get(p.name) else {
                return Err(self.err(
                    p.pos,
                    format!(
                        "instruction '{}' is not defined in computation '{name}'",
                        p.name
                    ),
                ));
            };
            let instr = &mut state.comp.instructions[p.instr];
            match p.slot {
                RefSlot::Operand(i) => instr.operands[i] = target,
                RefSlot::ControlPredecessor(i) => instr.control_predecessors[i] = target,
            }
        }
        let count = state.comp.instructions.len();
        state.comp.root = root.unwrap_or(InstrId(count as u32 - 1));
        if let Some((pos, result)) = signature_result {
            let root = &state.comp.instructions[state.comp.root.index()];
            if !result.compatible(&root.shape) {
                return Err(self.err(
                    pos,
                    format!(
                        "computation '{name}' is declared to return {result}, not compatible with its root '{}', {}",
                        root.name, root.shape
                    ),
                ));
            }
        }
        for (n, &p) in state.comp.parameters.iter().enumerate() {
            if p == InstrId(u32::MAX) {
                return Err(self.err(
                    self.c.pos,
                    format!("computation '{name}' has no parameter({n})"),
                ));
            }
        }
        Ok((state.comp, pending_comps, name))
    }
}
