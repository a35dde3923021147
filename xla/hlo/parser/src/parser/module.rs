//! The module level: the `HloModule name, key=value...` header, the
//! stack-frame index, and the sequence of computations with its ENTRY.
//!
//! Invariants: computation names are unique, and so are instruction names
//! across the module (clashes renamed as XLA does); at the end every called
//! computation name is resolved or an error; there is at most one ENTRY
//! (the last computation otherwise); unknown header attributes keep their
//! raw text and may appear once.

use super::names::PendingComp;
use super::state::Parser;
use super::unique_names::make_instruction_names_unique;
use crate::cursor::PResult;
use xla_hlo_ir::attrs::AttrValue;
use xla_hlo_ir::module::{
    AliasEntry, BufferDonor, CompId, ComputationLayout, HloModule, ModuleConfig,
};

impl<'a> Parser<'a> {
    pub(super) fn module(&mut self) -> PResult<HloModule> {
        let mut name = String::from("module");
        let mut config = ModuleConfig::default();
        if self.c.eat_keyword("HloModule") {
            name = self.c.ident()?.to_string();
            // XLA's older header form: `HloModule name:` (the name lexed as an
            // attribute name, colon attached).
            if self.c.peek_raw() == Some(b':') {
                self.c.pos += 1;
            }
            while self.c.eat(b',') {
                self.module_attribute(&mut config)?;
            }
        }
        let stack_frame_index = self.stack_frame_index()?;

        let mut pending: Vec<PendingComp<'a>> = Vec::new();
        let mut entry: Option<CompId> = None;
        loop {
            self.c.skip_ws();
            if self.c.at_end() {
                break;
            }
            let start = self.c.pos;
            let is_entry = self.c.eat_keyword("ENTRY");
            let id = CompId(self.computations.len() as u32);
            let (comp, comp_pending, comp_name) = self.computation(id)?;
            if self.comp_names.insert(comp_name, id).is_some() {
                return Err(self.err(start, format!("computation '{comp_name}' is defined twice")));
            }
            if is_entry {
                if entry.is_some() {
                    return Err(self.err(start, "more than one ENTRY computation"));
                }
                entry = Some(id);
            }
            pending.extend(comp_pending);
            self.computations.push(comp);
        }
        let mut computations = std::mem::take(&mut self.computations);
        let comp_names = std::mem::take(&mut self.comp_names);
        if computations.is_empty() {
            return Err(self.c.expected("a computation"));
        }
        for p in pending {
            let Some(&target) = comp_names.get(p.name) else {
                return Err(self.err(p.pos, format!("computation '{}' is not defined", p.name)));
            };
            let instr = &mut computations[p.comp].instructions[p.instr];
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
        }
        make_instruction_names_unique(&mut computations);
        let entry = entry.unwrap_or(CompId(computations.len() as u32 - 1));
        Ok(HloModule {
            name,
            config,
            stack_frame_index,
            computations,
            entry,
        })
    }

    fn module_attribute(&mut self, config: &mut ModuleConfig) -> PResult<()> {
        let key_pos = self.c.pos;
        let key = self.c.ident()?;
        self.c.expect(b'=')?;
        match key {
            "is_scheduled" => config.is_scheduled = self.bool_value()?,
            "alias_passthrough_params" => {
                config.alias_passthrough_params = Some(self.bool_value()?)
            }
            "replica_count" => config.replica_count = Some(self.c.int()?),
            "num_partitions" => config.num_partitions = Some(self.c.int()?),
            "entry_computation_layout" => {
                self.c.expect(b'{')?;
                self.c.expect(b'(')?;
                let mut parameters = Vec::new();
                if !self.c.eat(b')') {
                    loop {
                        parameters.push(self.shape()?);
                        if self.c.eat(b')') {
                            break;
                        }
                        self.c.expect(b',')?;
                    }
                }
                if !self.c.eat_str("->") {
                    return Err(self.c.expected("'->'"));
                }
                let result = self.shape()?;
                self.c.expect(b'}')?;
                config.entry_computation_layout = Some(ComputationLayout { parameters, result });
            }
            "allow_spmd_sharding_propagation_to_parameters" => {
                config.allow_spmd_sharding_propagation_to_parameters = Some(self.bools_value()?)
            }
            "allow_spmd_sharding_propagation_to_output" => {
                config.allow_spmd_sharding_propagation_to_output = Some(self.bools_value()?)
            }
            "input_output_alias" => {
                let mut entries = Vec::new();
                self.c.expect(b'{')?;
                while !self.c.eat(b'}') {
                    if !entries.is_empty() {
                        self.c.expect(b',')?;
                    }
                    let output_index = self.shape_index()?;
                    self.c.expect(b':')?;
                    self.c.expect(b'(')?;
                    let parameter_number = self.c.int()?;
                    self.c.expect(b',')?;
                    let parameter_index = self.shape_index()?;
                    let kind = if self.c.eat(b',') {
                        Some(self.c.word()?.to_string())
                    } else {
                        None
                    };
                    self.c.expect(b')')?;
                    entries.push(AliasEntry {
                        output_index,
                        parameter_number,
                        parameter_index,
                        kind,
                    });
                }
                config.input_output_alias = Some(entries);
            }
            "buffer_donor" => {
                let mut donors = Vec::new();
                self.c.expect(b'{')?;
                while !self.c.eat(b'}') {
                    if !donors.is_empty() {
                        self.c.expect(b',')?;
                    }
                    self.c.expect(b'(')?;
                    let parameter_number = self.c.int()?;
                    self.c.expect(b',')?;
                    let parameter_index = self.shape_index()?;
                    self.c.expect(b')')?;
                    donors.push(BufferDonor {
                        parameter_number,
                        parameter_index,
                    });
                }
                config.buffer_donor = Some(donors);
            }
            "frontend_attributes" => {
                config.frontend_attributes = Some(self.c.balanced()?.to_string())
            }
            _ => {
                if config.other.iter().any(|(k, _)| k == key) {
                    return Err(self.err(key_pos, format!("duplicate module attribute '{key}'")));
                }
                let value = self.c.raw_value()?.to_string();
                config.other.push((key.to_string(), value));
            }
        }
        Ok(())
    }

    /// `{}` or `{1,2}`: a shape index.
    fn shape_index(&mut self) -> PResult<Vec<i64>> {
        self.int_list(b'{', b'}')
    }

    /// The optional `FileNames ... StackFrames ...` block, kept verbatim.
    fn stack_frame_index(&mut self) -> PResult<Option<String>> {
        const KEYWORDS: [&str; 4] = ["FileNames", "FunctionNames", "FileLocations", "StackFrames"];
        self.c.skip_ws();
        let start = self.c.pos;
        let mut any = false;
        while let Some(kw) = KEYWORDS.iter().find(|k| self.c.at_keyword(k)) {
            self.c.eat_keyword(kw);
            any = true;
            loop {
                self.c.skip_ws();
                if !self.c.peek_raw().is_some_and(|b| b.is_ascii_digit()) {
                    break;
                }
                self.c.int()?;
                match self.c.peek() {
                    Some(b'"') | Some(b'\'') => {
                        self.c.string()?;
                    }
                    Some(b'{') => {
                        self.c.balanced()?;
                    }
                    _ => return Err(self.c.expected("a string or '{' in the stack-frame index")),
                }
            }
        }
        if !any {
            return Ok(None);
        }
        Ok(Some(self.c.src[start..self.c.pos].trim_end().to_string()))
    }
}
