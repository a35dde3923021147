//! HLO verifier: checks a module the way XLA's `HloVerifier` does and reports
//! every problem found, not just the first.
//!
//! Checks, in order (each phase only looks at what earlier phases found sound):
//! 1. Structure ([`structure`]): entry id, unique computation names and
//!    module-wide unique instruction names, root in range, parameters numbered
//!    `0..n` exactly once and matching the computation's parameter table,
//!    operand and control-predecessor ids in range and defined before use
//!    (XLA's parser resolves names only against instructions already read, so
//!    a use before its definition is not valid HLO), called computations in
//!    range and the call graph acyclic.
//! 2. Per-instruction form ([`attrs`]): operand counts (`Opcode::arity` plus
//!    the variadic ops' own rules) and the attributes XLA's parser requires;
//!    collective attributes ([`collectives`]): group mode, replica groups
//!    naming `0..n` once each (of one size where XLA requires it),
//!    collective-permute pairs.
//!    Async chains ([`async_chain`]): an update or done names the wrapped
//!    opcode, computation and thread of its start; a computation is wrapped
//!    by one start at most.
//! 3. Called-computation signatures ([`calls`]): reducers, comparators, map
//!    functions, while condition/body, conditional branches, call, fusion and
//!    async computations.
//! 4. Shapes ([`shapes`]): each declared shape against
//!    `xla_hlo_ir::shape_inference` (ignoring layouts and dynamic-dimension
//!    flags, like XLA's `ShapeUtil::Compatible`), plus the dedicated rules for
//!    ops whose shape cannot be inferred (broadcast, reshape, convert, iota, ...).
//!    An instruction whose shape neither can check (a `custom-call`, an
//!    operand with unbounded dimensions, ...) is listed as unchecked
//!    ([`UncheckedShape`]): not an error, since XLA accepts the written shape.
//! 5. Shardings ([`sharding`]), Shardy annotations ([`sdy`]) and the module header (entry computation layout,
//!    input/output aliasing, buffer donors).
//!
//! [`verify`] returns the errors; [`verify_report`] also lists the unchecked
//! instructions; [`load::load_module_file`] reads, parses and verifies a file
//! for the command-line tools.
//!
//! Invariants: `verify` never panics, whatever the module holds (ids out of
//! range, malformed attributes, huge sizes); an `Ok(())` module satisfies
//! every invariant the other crates rely on (ids in range, defs before uses);
//! unchecked instructions never make a module fail.

mod async_chain;
mod attrs;
mod calls;
mod collectives;
mod header;
pub mod load;
mod sdy;
mod shapes;
mod sharding;
mod structure;
#[cfg(test)]
mod tests;

use std::fmt;
use xla_hlo_ir::{HloComputation, HloModule, InstrId, Opcode, Shape};

/// One problem found in a module.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifierError {
    /// The computation it was found in (`<module>` for header problems).
    pub computation: String,
    /// The instruction, when the problem belongs to one.
    pub instruction: Option<String>,
    pub message: String,
}

impl fmt::Display for VerifierError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.instruction {
            Some(i) => write!(f, "{}/{}: {}", self.computation, i, self.message),
            None => write!(f, "{}: {}", self.computation, self.message),
        }
    }
}

/// Every problem found in a module, in the order found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifierErrors(pub Vec<VerifierError>);

impl VerifierErrors {
    pub fn len(&self) -> usize {
        self.0.len()
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    pub fn iter(&self) -> impl Iterator<Item = &VerifierError> {
        self.0.iter()
    }
}

impl fmt::Display for VerifierErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for VerifierErrors {}

/// An instruction whose declared shape could not be checked: shape inference
/// cannot derive it and no dedicated rule covers it. Not an error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UncheckedShape {
    pub computation: String,
    pub instruction: String,
    pub opcode: Opcode,
    /// Why it could not be checked.
    pub reason: String,
}

impl fmt::Display for UncheckedShape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}: {} shape not checked: {}",
            self.computation, self.instruction, self.opcode, self.reason
        )
    }
}

/// Everything verification found: the errors (the module is valid when
/// there are none) and the instructions whose shape could not be checked,
/// each in the order found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VerifierReport {
    pub errors: Vec<VerifierError>,
    pub unchecked: Vec<UncheckedShape>,
}

impl VerifierReport {
    pub fn is_valid(&self) -> bool {
        self.errors.is_empty()
    }

    /// The errors, as [`verify`] returns them.
    pub fn into_result(self) -> Result<(), VerifierErrors> {
        if self.errors.is_empty() {
            Ok(())
        } else {
            Err(VerifierErrors(self.errors))
        }
    }

    /// One line: `N error(s), M instruction(s) with unchecked shapes`.
    pub fn summary(&self) -> String {
        format!(
            "{} error(s), {} instruction(s) with unchecked shapes",
            self.errors.len(),
            self.unchecked.len()
        )
    }
}

/// The summary, then one line per error and per unchecked instruction.
impl fmt::Display for VerifierReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.summary())?;
        for e in &self.errors {
            write!(f, "\n{e}")?;
        }
        for u in &self.unchecked {
            write!(f, "\n{u}")?;
        }
        Ok(())
    }
}

/// Verifies `module`, returning every error found.
pub fn verify(module: &HloModule) -> Result<(), VerifierErrors> {
    run(module, false).into_result()
}

/// Verifies `module`, returning every error found and every instruction
/// whose shape could not be checked.
pub fn verify_report(module: &HloModule) -> VerifierReport {
    run(module, true)
}

/// Runs every check; lists unchecked instructions only when `list_unchecked`
/// (so that [`verify`] spends nothing on them).
fn run(module: &HloModule, list_unchecked: bool) -> VerifierReport {
    let mut r = Report {
        list_unchecked,
        ..Report::default()
    };
    let status = structure::check(module, &mut r);
    let sdy_meshes = sdy::module_meshes(module, &mut r);
    for (ci, comp) in module.computations.iter().enumerate() {
        let cs = &status.comps[ci];
        for ii in 0..comp.instructions.len() {
            let at = At {
                module,
                comp,
                instr_id: InstrId(ii as u32),
            };
            let form_ok = attrs::check(&at, cs.operands_ok[ii], &mut r);
            let collectives_ok = collectives::check(&at, &mut r);
            let calls_ok = cs.calls_ok[ii];
            if cs.operands_ok[ii] {
                async_chain::check(&at, &mut r);
            }
            if cs.operands_ok[ii] && form_ok && calls_ok && collectives_ok {
                let sig_ok = calls::check(&at, &status, &mut r);
                if sig_ok {
                    shapes::check(&at, &mut r);
                }
            }
            sharding::check(&at, &mut r);
            sdy::check(&at, &sdy_meshes, &mut r);
        }
    }
    async_chain::check_module(module, &mut r);
    header::check(module, &status, &mut r);
    VerifierReport {
        errors: r.errors,
        unchecked: r.unchecked,
    }
}

/// Collects errors and unchecked instructions.
#[derive(Default)]
pub(crate) struct Report {
    pub errors: Vec<VerifierError>,
    pub unchecked: Vec<UncheckedShape>,
    /// Whether [`At::unchecked`] records anything.
    pub list_unchecked: bool,
}

impl Report {
    pub fn comp(&mut self, comp: &str, message: impl Into<String>) {
        self.errors.push(VerifierError {
            computation: comp.to_string(),
            instruction: None,
            message: message.into(),
        });
    }
    pub fn instr(&mut self, comp: &str, instr: &str, message: impl Into<String>) {
        self.errors.push(VerifierError {
            computation: comp.to_string(),
            instruction: Some(instr.to_string()),
            message: message.into(),
        });
    }
}

/// The instruction being checked, with its surroundings.
pub(crate) struct At<'a> {
    pub module: &'a HloModule,
    pub comp: &'a HloComputation,
    pub instr_id: InstrId,
}

impl<'a> At<'a> {
    pub fn instr(&self) -> &'a xla_hlo_ir::HloInstruction {
        // In range by construction (ids come from enumerating the arena).
        &self.comp.instructions[self.instr_id.index()]
    }
    pub fn err(&self, r: &mut Report, message: impl Into<String>) {
        r.instr(&self.comp.name, &self.instr().name, message);
    }
    /// Lists the instruction as one whose shape could not be checked.
    pub fn unchecked(&self, r: &mut Report, reason: impl Into<String>) {
        if !r.list_unchecked {
            return;
        }
        let instr = self.instr();
        r.unchecked.push(UncheckedShape {
            computation: self.comp.name.clone(),
            instruction: instr.name.clone(),
            opcode: instr.opcode,
            reason: reason.into(),
        });
    }
    /// Operand shapes; only called once operands are known to be in range.
    pub fn operand_shapes(&self) -> Vec<&'a Shape> {
        self.instr()
            .operands
            .iter()
            .filter_map(|o| self.comp.instructions.get(o.index()).map(|i| &i.shape))
            .collect()
    }
    pub fn operand_shape(&self, i: usize) -> Option<&'a Shape> {
        let id = self.instr().operands.get(i)?;
        self.comp.instructions.get(id.index()).map(|i| &i.shape)
    }
}

/// Same shape ignoring layouts and dynamic-dimension flags (XLA's
/// `ShapeUtil::Compatible`).
pub(crate) fn compatible(a: &Shape, b: &Shape) -> bool {
    match (a, b) {
        (Shape::Array(x), Shape::Array(y)) => x.element_type == y.element_type && x.dims == y.dims,
        (Shape::Tuple(x), Shape::Tuple(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| compatible(p, q))
        }
        (Shape::Buffer(x), Shape::Buffer(y)) => compatible(x, y),
        _ => false,
    }
}

/// A shape printed without layouts, for messages.
pub(crate) fn show(s: &Shape) -> String {
    s.without_layout().to_string()
}

/// The root's shape, if the root id is in range.
pub(crate) fn root_shape(c: &HloComputation) -> Option<&Shape> {
    c.instructions.get(c.root.index()).map(|i| &i.shape)
}

/// Parameter shapes in parameter-number order, if the parameter table is sound.
pub(crate) fn param_shapes(c: &HloComputation) -> Option<Vec<&Shape>> {
    c.parameters
        .iter()
        .map(|p| {
            c.instructions
                .get(p.index())
                .filter(|i| i.opcode == xla_hlo_ir::Opcode::Parameter)
                .map(|i| &i.shape)
        })
        .collect()
}

/// True for a rank-0 data array.
pub(crate) fn is_scalar(s: &Shape) -> bool {
    matches!(s, Shape::Array(a) if a.rank() == 0 && a.element_type.is_array_type())
}
