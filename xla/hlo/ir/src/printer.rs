//! HLO text printer: writes modules in the syntax XLA's parser reads (and
//! XLA's own printer writes), with `%` names and long lists annotated by
//! `/*index=N*/` comments as XLA does.
//!
//! Invariant: the printer never fails on a well-formed module and never
//! panics on a malformed one (dangling ids print as `%<bad:iN>`); parsing
//! its output yields an equal module.

use crate::attrs::{write_escaped, AttrValue};
use crate::module::{CompId, HloComputation, HloInstruction, HloModule, InstrId};
use crate::opcode::Opcode;
use std::fmt::{self, Write};

struct InstrPrinter<'a> {
    module: &'a HloModule,
    comp: &'a HloComputation,
    instr: &'a HloInstruction,
}

fn instr_name(comp: &HloComputation, id: InstrId) -> String {
    match comp.instructions.get(id.index()) {
        Some(i) => i.name.clone(),
        None => format!("<bad:{id}>"),
    }
}

fn comp_name(module: &HloModule, id: CompId) -> String {
    match module.computations.get(id.index()) {
        Some(c) => c.name.clone(),
        None => format!("<bad:{id}>"),
    }
}

/// The opcode as written: sugared async ops print as `<wrapped>-start` etc.
pub fn opcode_text(instr: &HloInstruction) -> String {
    opcode_text_of(instr.async_wrapped, instr.opcode)
}

/// [`opcode_text`] of an instruction with this wrapped opcode and opcode.
pub fn opcode_text_of(async_wrapped: Option<Opcode>, opcode: Opcode) -> String {
    match (async_wrapped, opcode) {
        (Some(w), Opcode::AsyncStart) => format!("{}-start", w.name()),
        (Some(w), Opcode::AsyncUpdate) => format!("{}-update", w.name()),
        (Some(w), Opcode::AsyncDone) => format!("{}-done", w.name()),
        (_, op) => op.name().to_string(),
    }
}

impl fmt::Display for InstrPrinter<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let instr = self.instr;
        write!(
            f,
            "%{} = {} {}(",
            instr.name,
            instr.shape,
            opcode_text(instr)
        )?;
        if let Some(n) = instr.parameter_number {
            write!(f, "{n}")?;
        } else if let Some(lit) = &instr.literal {
            write!(f, "{lit}")?;
        } else {
            for (i, &op) in instr.operands.iter().enumerate() {
                if i > 0 {
                    f.write_str(", ")?;
                    if i % 5 == 0 {
                        write!(f, "/*index={i}*/")?;
                    }
                }
                write!(f, "%{}", instr_name(self.comp, op))?;
            }
        }
        f.write_str(")")?;
        let names = |c: CompId| comp_name(self.module, c);
        for a in instr.attrs.iter().filter(|a| !a.key.is_trailing()) {
            write_attr(f, a, &names)?;
        }
        if let Some(sharding) = &instr.sharding {
            write!(f, ", sharding={sharding}")?;
        }
        if !instr.control_predecessors.is_empty() {
            f.write_str(", control-predecessors={")?;
            for (i, &p) in instr.control_predecessors.iter().enumerate() {
                if i > 0 {
                    f.write_str(", ")?;
                }
                write!(f, "%{}", instr_name(self.comp, p))?;
            }
            f.write_str("}")?;
        }
        for a in instr.attrs.iter().filter(|a| a.key.is_trailing()) {
            write_attr(f, a, &names)?;
        }
        Ok(())
    }
}

fn write_attr(
    f: &mut fmt::Formatter<'_>,
    a: &crate::attrs::Attribute,
    names: &dyn Fn(CompId) -> String,
) -> fmt::Result {
    match &a.value {
        AttrValue::Unknown { name, .. } => write!(f, ", {name}=")?,
        _ => write!(f, ", {}=", a.key.name())?,
    }
    a.value.write(f, names)
}

/// Prints one instruction (without indentation or `ROOT`).
pub fn instruction_to_string(module: &HloModule, comp: &HloComputation, id: InstrId) -> String {
    match comp.instructions.get(id.index()) {
        Some(instr) => InstrPrinter {
            module,
            comp,
            instr,
        }
        .to_string(),
        None => format!("<bad instruction {id}>"),
    }
}

fn write_computation(f: &mut fmt::Formatter<'_>, module: &HloModule, id: CompId) -> fmt::Result {
    let comp = module.comp(id);
    if id == module.entry {
        f.write_str("ENTRY ")?;
    }
    write!(f, "%{} (", comp.name)?;
    for (i, &p) in comp.parameters.iter().enumerate() {
        if i > 0 {
            f.write_str(", ")?;
        }
        match comp.instructions.get(p.index()) {
            Some(instr) => write!(f, "{}: {}", instr.name, instr.shape.without_layout())?,
            None => write!(f, "<missing parameter {i}>: ()")?,
        }
    }
    let result = comp
        .instructions
        .get(comp.root.index())
        .map(|r| r.shape.without_layout().to_string())
        .unwrap_or_else(|| "()".into());
    writeln!(f, ") -> {result} {{")?;
    for (i, instr) in comp.instructions.iter().enumerate() {
        f.write_str(if InstrId(i as u32) == comp.root {
            "  ROOT "
        } else {
            "  "
        })?;
        writeln!(
            f,
            "{}",
            InstrPrinter {
                module,
                comp,
                instr
            }
        )?;
    }
    f.write_str("}")?;
    if let Some(thread) = &comp.execution_thread {
        f.write_str(", execution_thread=")?;
        write_escaped(f, thread)?;
    }
    f.write_str("\n")
}

fn write_bools(f: &mut fmt::Formatter<'_>, v: &[bool]) -> fmt::Result {
    f.write_str("{")?;
    crate::shape::write_joined(f, v, ",")?;
    f.write_str("}")
}

fn write_index(f: &mut fmt::Formatter<'_>, index: &[i64]) -> fmt::Result {
    f.write_str("{")?;
    crate::shape::write_joined(f, index, ",")?;
    f.write_str("}")
}

fn write_header(f: &mut fmt::Formatter<'_>, m: &HloModule) -> fmt::Result {
    let c = &m.config;
    write!(f, "HloModule {}", m.name)?;
    if c.is_scheduled {
        f.write_str(", is_scheduled=true")?;
    }
    if let Some(aliases) = &c.input_output_alias {
        f.write_str(", input_output_alias={ ")?;
        for (i, a) in aliases.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write_index(f, &a.output_index)?;
            write!(f, ": ({}, ", a.parameter_number)?;
            write_index(f, &a.parameter_index)?;
            if let Some(kind) = &a.kind {
                write!(f, ", {kind}")?;
            }
            f.write_str(")")?;
        }
        f.write_str(" }")?;
    }
    if let Some(donors) = &c.buffer_donor {
        f.write_str(", buffer_donor={ ")?;
        for (i, d) in donors.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "({}, ", d.parameter_number)?;
            write_index(f, &d.parameter_index)?;
            f.write_str(")")?;
        }
        f.write_str(" }")?;
    }
    if let Some(v) = c.alias_passthrough_params {
        write!(f, ", alias_passthrough_params={v}")?;
    }
    if let Some(layout) = &c.entry_computation_layout {
        f.write_str(", entry_computation_layout={(")?;
        for (i, p) in layout.parameters.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
                if i % 5 == 0 {
                    write!(f, "/*index={i}*/")?;
                }
            }
            write!(f, "{p}")?;
        }
        write!(f, ")->{}}}", layout.result)?;
    }
    if let Some(v) = &c.allow_spmd_sharding_propagation_to_parameters {
        f.write_str(", allow_spmd_sharding_propagation_to_parameters=")?;
        write_bools(f, v)?;
    }
    if let Some(v) = &c.allow_spmd_sharding_propagation_to_output {
        f.write_str(", allow_spmd_sharding_propagation_to_output=")?;
        write_bools(f, v)?;
    }
    if let Some(v) = c.replica_count {
        write!(f, ", replica_count={v}")?;
    }
    if let Some(v) = c.num_partitions {
        write!(f, ", num_partitions={v}")?;
    }
    if let Some(v) = &c.frontend_attributes {
        write!(f, ", frontend_attributes={v}")?;
    }
    for (name, value) in &c.other {
        write!(f, ", {name}={value}")?;
    }
    f.write_str("\n")
}

impl fmt::Display for HloModule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_header(f, self)?;
        if let Some(index) = &self.stack_frame_index {
            write!(f, "\n{index}\n")?;
        }
        for id in self.comp_ids() {
            f.write_str("\n")?;
            write_computation(f, self, id)?;
        }
        Ok(())
    }
}

impl HloModule {
    /// The module as HLO text.
    pub fn to_text(&self) -> String {
        let mut s = String::with_capacity(self.instruction_count() * 96);
        // Writing into a String cannot fail.
        let _ = write!(s, "{self}");
        s
    }
}
