//! One instruction line: `name = shape opcode(operands), attributes...`,
//! with the shape optional (inferred from the operands), async sugar
//! (`reduce-scatter-start`: an async-start wrapping an opcode that has no
//! native async form), parameters and constants.
//!
//! Invariants: a missing shape is inferred only from operands already
//! defined (otherwise an error asks for the shape); trailing attributes
//! (metadata, backend_config, ...) are kept last, as the printer writes
//! them, so parse(print(m)) == m; an instruction name is defined once.

use super::names::{ComputationState, PendingComp, PendingRef, RefSlot};
use super::state::Parser;
use crate::cursor::PResult;
use xla_hlo_ir::attrs::AttrValue;
use xla_hlo_ir::module::{CompId, HloInstruction, InstrId};
use xla_hlo_ir::shape::Shape;
use xla_hlo_ir::{Opcode, PrimitiveType};

/// Parameter numbers beyond this are rejected (XLA's largest modules have a few thousand).
const MAX_PARAMETERS: i64 = 1 << 20;

impl<'a> Parser<'a> {
    /// True if the input continues with a shape (rather than a name or opcode).
    fn at_shape(&mut self) -> bool {
        match self.c.peek() {
            Some(b'(') => true,
            Some(_) => {
                let save = self.c.pos;
                let result = match self.c.ident() {
                    Ok(word) => {
                        let next = self.c.peek_raw();
                        (next == Some(b'[') && PrimitiveType::from_name(word).is_some())
                            || (word == "b" && next == Some(b'('))
                    }
                    Err(_) => false,
                };
                self.c.pos = save;
                result
            }
            None => false,
        }
    }

    pub(super) fn instruction(
        &mut self,
        state: &mut ComputationState<'a>,
        comp_id: CompId,
        pending_comps: &mut Vec<PendingComp<'a>>,
    ) -> PResult<InstrId> {
        let name_pos = self.c.pos;
        let name = self.c.ident()?;
        self.c.expect(b'=')?;
        let id = self.instruction_rhs(state, comp_id, pending_comps, Some(name))?;
        if state.names.contains_key(name) {
            return Err(self.err(name_pos, format!("instruction '{name}' is defined twice")));
        }
        state.names.insert(name, id);
        Ok(id)
    }

    /// `shape opcode(operands), attributes...`: the instruction named `name`,
    /// or, for `None`, a nested instruction written as an operand (XLA's
    /// `add(f32[4] parameter(0), f32[4] parameter(1))`), which takes no
    /// attributes (a comma there separates operands), is named after its
    /// opcode (made unique with the module's names) and cannot be referred
    /// to by name. The instruction is added to the computation before the
    /// one it is an operand of.
    fn instruction_rhs(
        &mut self,
        state: &mut ComputationState<'a>,
        comp_id: CompId,
        pending_comps: &mut Vec<PendingComp<'a>>,
        name: Option<&'a str>,
    ) -> PResult<InstrId> {
        self.enter()?;
        let r = self.instruction_rhs_inner(state, comp_id, pending_comps, name);
        self.leave();
        r
    }

    fn instruction_rhs_inner(
        &mut self,
        state: &mut ComputationState<'a>,
        comp_id: CompId,
        pending_comps: &mut Vec<PendingComp<'a>>,
        name: Option<&'a str>,
    ) -> PResult<InstrId> {
        let shape = if self.at_shape() {
            Some(self.shape()?)
        } else {
            None
        };
        let op_pos = self.c.pos;
        self.c.skip_ws();
        let op_pos = op_pos.max(self.c.pos);
        let op_text = self.c.ident()?;
        let (opcode, async_wrapped) = resolve_opcode(op_text)
            .ok_or_else(|| self.err(op_pos, format!("unknown opcode '{op_text}'")))?;
        let mut instr = HloInstruction::new(
            name.unwrap_or(op_text),
            opcode,
            shape.clone().unwrap_or(Shape::Tuple(Vec::new())),
            Vec::new(),
        );
        instr.async_wrapped = async_wrapped;

        self.c.expect(b'(')?;
        match opcode {
            Opcode::Parameter => {
                let n = self.c.int()?;
                if !(0..MAX_PARAMETERS).contains(&n) {
                    return Err(self.err(op_pos, format!("parameter number {n} is out of range")));
                }
                instr.parameter_number = Some(n);
                self.c.expect(b')')?;
            }
            Opcode::Constant => {
                let Some(shape) = &shape else {
                    return Err(self.err(op_pos, "a constant needs an explicit shape"));
                };
                let lit = self.literal(shape)?;
                instr.literal = Some(Box::new(lit));
                self.c.expect(b')')?;
            }
            _ => {
                // Operands defined later in the computation; recorded once the
                // nested instructions among the operands have been added, so
                // that they name this instruction's final index.
                let mut later: Vec<(usize, &'a str, usize)> = Vec::new();
                if !self.c.eat(b')') {
                    loop {
                        self.c.skip_ws();
                        let start = self.c.pos;
                        let declared = if self.at_shape() {
                            Some(self.shape()?)
                        } else {
                            None
                        };
                        self.c.skip_ws();
                        let pos = self.c.pos;
                        let operand = self.c.ident()?;
                        if self.c.peek() == Some(b'(') {
                            self.c.pos = start;
                            let id = self.instruction_rhs(state, comp_id, pending_comps, None)?;
                            instr.operands.push(id);
                        } else if let Some(&id) = state.names.get(operand) {
                            let defined = &state.comp.instructions[id.index()].shape;
                            if let Some(declared) = declared.filter(|d| !d.compatible(defined)) {
                                return Err(self.err(
                                    start,
                                    format!(
                                        "the declared operand shape {declared} is not compatible with the shape of '{operand}', {defined}"
                                    ),
                                ));
                            }
                            instr.operands.push(id);
                        } else {
                            later.push((instr.operands.len(), operand, pos));
                            instr.operands.push(InstrId(u32::MAX));
                        }
                        if self.c.eat(b')') {
                            break;
                        }
                        self.c.expect(b',')?;
                    }
                }
                for (operand, name, pos) in later {
                    state.pending.push(PendingRef {
                        instr: state.comp.instructions.len(),
                        slot: RefSlot::Operand(operand),
                        name,
                        pos,
                    });
                }
            }
        }

        while name.is_some() && self.c.eat(b',') {
            self.attribute(&mut instr, state, comp_id, pending_comps)?;
        }
        // The printer writes trailing attributes (metadata, backend_config, ...)
        // last; keep the same order so that parse(print(m)) == m.
        if instr.attrs.iter().any(|a| a.key.is_trailing()) {
            instr.attrs.sort_by_key(|a| a.key.is_trailing());
        }
        instr.attrs.shrink_to_fit();

        // Calls to computations already read resolve now (so that shape
        // inference can see them); later ones at the end of the module.
        let here = state.comp.instructions.len();
        pending_comps.retain(|p| {
            if p.comp != comp_id.index() || p.instr != here {
                return true;
            }
            let Some(&target) = self.comp_names.get(p.name) else {
                return true;
            };
            match instr
                .attrs
                .iter_mut()
                .find(|a| a.key == p.attr)
                .map(|a| &mut a.value)
            {
                Some(AttrValue::Computation(c)) => *c = target,
                Some(AttrValue::Computations(cs)) => cs[p.index] = target,
                _ => {}
            }
            false
        });
        if shape.is_none() {
            instr.shape = self.infer(state, &instr, op_pos)?;
        }
        Ok(state.comp.add(instr))
    }

    fn infer(
        &self,
        state: &ComputationState<'a>,
        instr: &HloInstruction,
        pos: usize,
    ) -> PResult<Shape> {
        let mut operand_shapes = Vec::with_capacity(instr.operands.len());
        for &op in &instr.operands {
            match state.comp.instructions.get(op.index()) {
                Some(o) => operand_shapes.push(&o.shape),
                None => {
                    return Err(self.err(
                        pos,
                        "cannot infer the shape: an operand is defined later; write the shape",
                    ))
                }
            }
        }
        xla_hlo_ir::shape_inference::infer_shape(None, &self.computations, instr, &operand_shapes)
            .map_err(|e| self.err(pos, format!("missing shape and {e}")))
    }
}

/// Maps an opcode spelling to (opcode, wrapped opcode for async sugar).
fn resolve_opcode(text: &str) -> Option<(Opcode, Option<Opcode>)> {
    if let Some(op) = Opcode::from_name(text) {
        return Some((op, None));
    }
    for (suffix, async_op) in [
        ("-start", Opcode::AsyncStart),
        ("-update", Opcode::AsyncUpdate),
        ("-done", Opcode::AsyncDone),
    ] {
        if let Some(base) = text.strip_suffix(suffix) {
            let wrapped = Opcode::from_name(base)?;
            if wrapped.has_native_async() {
                return None;
            }
            return Some((async_op, Some(wrapped)));
        }
    }
    None
}
