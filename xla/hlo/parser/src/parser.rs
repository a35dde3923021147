//! The HLO module parser: header, stack-frame index, computations,
//! instructions, shapes, layouts, literals, shardings, replica groups and
//! every typed attribute of `xla_hlo_ir::attrs`.
//!
//! Invariants: the parser never panics and always terminates, whatever the
//! input; every error carries the position of the offending text and says
//! what was expected. Names may be used before they are defined (operands,
//! control predecessors, called computations); they are resolved at the end
//! of their computation or module, and unresolved names are errors.

use crate::cursor::{Cursor, PResult};
use crate::error::ParseError;
use rustc_hash::FxHashMap;
use xla_hlo_ir::attrs::{
    AttrKey, AttrValue, Attribute, ConvDimensionNumbers, PaddingDim, SliceDim, ValueKind, Window,
    WindowDim,
};
use xla_hlo_ir::literal::{float_to_bits, nan_with_payload, ArrayLiteral, Literal};
use xla_hlo_ir::mesh::{AxisRef, DeviceIdsPlacement, Mesh, MeshDeviceIds};
use xla_hlo_ir::module::{
    AliasEntry, BufferDonor, CompId, ComputationLayout, HloComputation, HloInstruction, HloModule,
    InstrId, ModuleConfig,
};
use xla_hlo_ir::replica_groups::CollectiveDeviceList;
use xla_hlo_ir::shape::{ArrayShape, Layout, Shape, UNBOUNDED};
use xla_hlo_ir::sharding::{
    HloSharding, NamedDim, NamedDims, NamedSharding, ShardGroup, ShardingKind, SingleSharding,
    SubgroupType, TileAssignment,
};
use xla_hlo_ir::{Opcode, PrimitiveType, TypeClass};

/// Largest array (in elements) a literal or shape may describe; guards
/// against allocating absurd amounts for hostile input.
const MAX_LITERAL_ELEMENTS: i64 = 1 << 31;

/// Parameter numbers beyond this are rejected (XLA's largest modules have a few thousand).
const MAX_PARAMETERS: i64 = 1 << 20;

/// Parses a whole HLO module.
pub fn parse_module(text: &str) -> Result<HloModule, ParseError> {
    let mut p = Parser::new(text);
    p.module()
}

/// Parses one shape, e.g. `f32[2,3]{1,0}` or `(s32[], f32[4])`.
pub fn parse_shape(text: &str) -> Result<Shape, ParseError> {
    let mut p = Parser::new(text);
    let s = p.shape()?;
    p.expect_end()?;
    Ok(s)
}

/// Parses one sharding, e.g. `{devices=[2,1]<=[2]}`.
pub fn parse_sharding(text: &str) -> Result<HloSharding, ParseError> {
    let mut p = Parser::new(text);
    let s = p.sharding()?;
    p.expect_end()?;
    Ok(s)
}

/// Parses a replica-group list, e.g. `[2,4]<=[8]` or `{{0,1},{2,3}}`.
pub fn parse_replica_groups(text: &str) -> Result<CollectiveDeviceList, ParseError> {
    let mut p = Parser::new(text);
    let g = p.replica_groups()?;
    p.expect_end()?;
    Ok(g)
}

struct Parser<'a> {
    c: Cursor<'a>,
    /// Nesting depth of shapes/literals, bounded to keep recursion finite.
    depth: usize,
    /// Computations read so far, and their names (for shape inference of
    /// instructions that call them).
    computations: Vec<HloComputation>,
    comp_names: FxHashMap<&'a str, CompId>,
}

const MAX_DEPTH: usize = 256;

impl<'a> Parser<'a> {
    fn new(text: &'a str) -> Parser<'a> {
        Parser {
            c: Cursor::new(text),
            depth: 0,
            computations: Vec::new(),
            comp_names: FxHashMap::default(),
        }
    }
}

/// A name used before its definition, to resolve later.
struct PendingRef<'a> {
    instr: usize,
    slot: RefSlot,
    name: &'a str,
    pos: usize,
}

enum RefSlot {
    Operand(usize),
    ControlPredecessor(usize),
}

/// A computation name used in an attribute, to resolve at module end.
struct PendingComp<'a> {
    comp: usize,
    instr: usize,
    /// Attribute keys are unique per instruction (duplicates are rejected).
    attr: AttrKey,
    index: usize,
    name: &'a str,
    pos: usize,
}

struct ComputationState<'a> {
    comp: HloComputation,
    names: FxHashMap<&'a str, InstrId>,
    pending: Vec<PendingRef<'a>>,
}

impl<'a> Parser<'a> {
    fn err(&self, pos: usize, msg: impl Into<String>) -> ParseError {
        self.c.error_at(pos, msg)
    }

    fn expect_end(&mut self) -> PResult<()> {
        self.c.skip_ws();
        if self.c.at_end() {
            Ok(())
        } else {
            Err(self.c.expected("end of input"))
        }
    }

    fn enter(&mut self) -> PResult<()> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(self.err(self.c.pos, "nesting is too deep"));
        }
        Ok(())
    }

    fn leave(&mut self) {
        self.depth -= 1;
    }

    // ----------------------------------------------------------------- module

    fn module(&mut self) -> PResult<HloModule> {
        let mut name = String::from("module");
        let mut config = ModuleConfig::default();
        if self.c.eat_keyword("HloModule") {
            name = self.c.ident()?.to_string();
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

    fn bool_value(&mut self) -> PResult<bool> {
        let pos = self.c.pos;
        match self.c.word()? {
            "true" => Ok(true),
            "false" => Ok(false),
            other => Err(self.err(pos, format!("expected true or false, found '{other}'"))),
        }
    }

    fn bools_value(&mut self) -> PResult<Vec<bool>> {
        if self.c.peek() != Some(b'{') {
            return Ok(vec![self.bool_value()?]);
        }
        self.c.expect(b'{')?;
        let mut out = Vec::new();
        while !self.c.eat(b'}') {
            if !out.is_empty() {
                self.c.expect(b',')?;
            }
            out.push(self.bool_value()?);
        }
        Ok(out)
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

    // ------------------------------------------------------------ computation

    fn computation(
        &mut self,
        id: CompId,
    ) -> PResult<(HloComputation, Vec<PendingComp<'a>>, &'a str)> {
        let name = self.c.ident()?;
        if self.c.peek() == Some(b'(') {
            // The signature repeats what the parameters say; read and drop it.
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
            self.shape()?;
        }
        self.c.expect(b'{')?;
        // Size the arenas from the text up to the closing brace of the body
        // (instructions average well over 40 bytes of text).
        let body_len = self.c.src[self.c.pos..].find("\n}").unwrap_or(0);
        let estimate = body_len / 48;
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

    /// Resolves a reference to an instruction by name, or records it for later.
    fn reference(
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

    fn instruction(
        &mut self,
        state: &mut ComputationState<'a>,
        comp_id: CompId,
        pending_comps: &mut Vec<PendingComp<'a>>,
    ) -> PResult<InstrId> {
        let name_pos = self.c.pos;
        let name = self.c.ident()?;
        self.c.expect(b'=')?;
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
            name,
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
                if !self.c.eat(b')') {
                    loop {
                        if self.at_shape() {
                            self.shape()?;
                        }
                        self.c.skip_ws();
                        let pos = self.c.pos;
                        let operand = self.c.ident()?;
                        if self.c.peek() == Some(b'(') {
                            return Err(self.err(pos, "nested instructions as operands are not supported; name the operand instead"));
                        }
                        let slot = RefSlot::Operand(instr.operands.len());
                        let id = self.reference(state, operand, pos, slot);
                        instr.operands.push(id);
                        if self.c.eat(b')') {
                            break;
                        }
                        self.c.expect(b',')?;
                    }
                }
            }
        }

        while self.c.eat(b',') {
            self.attribute(&mut instr, state, comp_id, pending_comps)?;
        }
        // The printer writes trailing attributes (metadata, backend_config, ...)
        // last; keep the same order so that parse(print(m)) == m.
        if instr.attrs.iter().any(|a| a.key.is_trailing()) {
            instr.attrs.sort_by_key(|a| a.key.is_trailing());
        }

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
        if state.names.contains_key(name) {
            return Err(self.err(name_pos, format!("instruction '{name}' is defined twice")));
        }
        let id = state.comp.add(instr);
        state.names.insert(name, id);
        Ok(id)
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

    fn attribute(
        &mut self,
        instr: &mut HloInstruction,
        state: &mut ComputationState<'a>,
        comp_id: CompId,
        pending_comps: &mut Vec<PendingComp<'a>>,
    ) -> PResult<()> {
        self.c.skip_ws();
        let key_pos = self.c.pos;
        let key_text = self.c.ident()?;
        self.c.expect(b'=')?;
        match key_text {
            "sharding" => {
                if instr.sharding.is_some() {
                    return Err(self.err(key_pos, "duplicate attribute 'sharding'"));
                }
                instr.sharding = Some(self.sharding()?);
                return Ok(());
            }
            "control-predecessors" => {
                self.c.expect(b'{')?;
                while !self.c.eat(b'}') {
                    if !instr.control_predecessors.is_empty() {
                        self.c.expect(b',')?;
                    }
                    self.c.skip_ws();
                    let pos = self.c.pos;
                    let name = self.c.ident()?;
                    let slot = RefSlot::ControlPredecessor(instr.control_predecessors.len());
                    let id = self.reference(state, name, pos, slot);
                    instr.control_predecessors.push(id);
                }
                return Ok(());
            }
            _ => {}
        }
        let key = AttrKey::from_name(key_text);
        let duplicate = if key == AttrKey::Unknown {
            instr
                .attrs
                .iter()
                .any(|a| matches!(&a.value, AttrValue::Unknown { name, .. } if name == key_text))
        } else {
            instr.has_attr(key)
        };
        if duplicate {
            return Err(self.err(key_pos, format!("duplicate attribute '{key_text}'")));
        }
        let mut comp_ref = |name: &'a str, pos: usize, index: usize| {
            pending_comps.push(PendingComp {
                comp: comp_id.index(),
                instr: state.comp.instructions.len(),
                attr: key,
                index,
                name,
                pos,
            });
            CompId(u32::MAX)
        };
        let value = match key.kind() {
            ValueKind::Int => AttrValue::Int(self.c.int()?),
            ValueKind::Float => {
                let pos = self.c.pos;
                let text = self.c.number_text()?;
                AttrValue::Float(parse_f64(text).ok_or_else(|| self.err(pos, "malformed number"))?)
            }
            ValueKind::Bool => AttrValue::Bool(self.bool_value()?),
            ValueKind::Ident => AttrValue::Ident(self.c.word()?.to_string()),
            ValueKind::Str => AttrValue::Str(self.c.string()?),
            ValueKind::Ints => AttrValue::Ints(self.int_list(b'{', b'}')?),
            ValueKind::IntLists => AttrValue::IntLists(self.int_lists()?),
            ValueKind::IntsOrLists => {
                let save = self.c.pos;
                self.c.expect(b'{')?;
                let nested = self.c.peek() == Some(b'{');
                self.c.pos = save;
                if nested {
                    AttrValue::IntLists(self.int_lists()?)
                } else {
                    AttrValue::Ints(self.int_list(b'{', b'}')?)
                }
            }
            ValueKind::Bools => AttrValue::Bools(self.bools_value()?),
            ValueKind::Idents => {
                self.c.expect(b'{')?;
                let mut out = Vec::new();
                while !self.c.eat(b'}') {
                    if !out.is_empty() {
                        self.c.expect(b',')?;
                    }
                    out.push(self.c.word()?.to_string());
                }
                AttrValue::Idents(out)
            }
            ValueKind::Computation => {
                self.c.skip_ws();
                let pos = self.c.pos;
                let name = self.c.ident()?;
                AttrValue::Computation(comp_ref(name, pos, 0))
            }
            ValueKind::Computations => {
                self.c.expect(b'{')?;
                let mut out = Vec::new();
                while !self.c.eat(b'}') {
                    if !out.is_empty() {
                        self.c.expect(b',')?;
                    }
                    self.c.skip_ws();
                    let pos = self.c.pos;
                    let name = self.c.ident()?;
                    out.push(comp_ref(name, pos, out.len()));
                }
                AttrValue::Computations(out)
            }
            ValueKind::Slice => AttrValue::Slice(self.slice_value()?),
            ValueKind::Padding => AttrValue::Padding(self.padding_value()?),
            ValueKind::Window => AttrValue::Window(self.window_value()?),
            ValueKind::DimLabels => AttrValue::DimLabels(self.dim_labels()?),
            ValueKind::ReplicaGroups => AttrValue::ReplicaGroups(self.replica_groups()?),
            ValueKind::Shapes => {
                self.c.expect(b'{')?;
                let mut out = Vec::new();
                while !self.c.eat(b'}') {
                    if !out.is_empty() {
                        self.c.expect(b',')?;
                    }
                    out.push(self.shape()?);
                }
                AttrValue::Shapes(out)
            }
            ValueKind::Shape => AttrValue::Shape(self.shape()?),
            ValueKind::Raw if key == AttrKey::Unknown => AttrValue::Unknown {
                name: key_text.to_string(),
                text: self.c.raw_value()?.to_string(),
            },
            ValueKind::Raw => AttrValue::Raw(self.c.raw_value()?.to_string()),
        };
        instr.attrs.push(Attribute { key, value });
        Ok(())
    }

    // ------------------------------------------------------------ attr values

    /// `{1,2,3}` (or with other delimiters), possibly empty.
    fn int_list(&mut self, open: u8, close: u8) -> PResult<Vec<i64>> {
        self.c.expect(open)?;
        let mut out = Vec::new();
        while !self.c.eat(close) {
            if !out.is_empty() {
                self.c.expect(b',')?;
            }
            out.push(self.c.int()?);
        }
        Ok(out)
    }

    fn int_lists(&mut self) -> PResult<Vec<Vec<i64>>> {
        self.c.expect(b'{')?;
        let mut out = Vec::new();
        while !self.c.eat(b'}') {
            if !out.is_empty() {
                self.c.expect(b',')?;
            }
            out.push(self.int_list(b'{', b'}')?);
        }
        Ok(out)
    }

    fn slice_value(&mut self) -> PResult<Vec<SliceDim>> {
        self.c.expect(b'{')?;
        let mut out = Vec::new();
        while !self.c.eat(b'}') {
            if !out.is_empty() {
                self.c.expect(b',')?;
            }
            let parts = {
                self.c.expect(b'[')?;
                let mut parts = vec![self.c.int()?];
                while self.c.eat(b':') {
                    parts.push(self.c.int()?);
                }
                self.c.expect(b']')?;
                parts
            };
            let dim = match parts[..] {
                [start, limit] => SliceDim {
                    start,
                    limit,
                    stride: 1,
                },
                [start, limit, stride] => SliceDim {
                    start,
                    limit,
                    stride,
                },
                _ => return Err(self.c.expected("[start:limit] or [start:limit:stride]")),
            };
            out.push(dim);
        }
        Ok(out)
    }

    /// `lo_hi(_interior)?` joined by `x`.
    fn padding_value(&mut self) -> PResult<Vec<PaddingDim>> {
        let mut out = Vec::new();
        self.c.skip_ws();
        if !self
            .c
            .peek_raw()
            .is_some_and(|b| b.is_ascii_digit() || b == b'-')
        {
            return Ok(out);
        }
        loop {
            let low = self.c.int()?;
            self.expect_raw(b'_')?;
            let high = self.c.int()?;
            let interior = if self.c.peek_raw() == Some(b'_') {
                self.c.pos += 1;
                self.c.int()?
            } else {
                0
            };
            out.push(PaddingDim {
                low,
                high,
                interior,
            });
            if self.c.peek_raw() == Some(b'x') {
                self.c.pos += 1;
            } else {
                break;
            }
        }
        Ok(out)
    }

    fn expect_raw(&mut self, b: u8) -> PResult<()> {
        if self.c.peek_raw() == Some(b) {
            self.c.pos += 1;
            Ok(())
        } else {
            Err(self.c.expected(&format!("'{}'", b as char)))
        }
    }

    /// `AxBxC` (no spaces).
    fn x_list(&mut self) -> PResult<Vec<i64>> {
        let mut out = vec![self.c.int()?];
        while self.c.peek_raw() == Some(b'x') {
            self.c.pos += 1;
            out.push(self.c.int()?);
        }
        Ok(out)
    }

    fn window_value(&mut self) -> PResult<Window> {
        self.c.expect(b'{')?;
        let mut sizes: Option<Vec<i64>> = None;
        // (key, its byte offset for errors, one (a, b) pair per window dim)
        type Field<'s> = (&'s str, usize, Vec<(i64, i64)>);
        let mut fields: Vec<Field<'a>> = Vec::new();
        while !self.c.eat(b'}') {
            let pos = self.c.pos;
            let key = self.c.ident()?;
            self.c.expect(b'=')?;
            match key {
                "size" => sizes = Some(self.x_list()?),
                "stride" | "lhs_dilate" | "rhs_dilate" | "rhs_reversal" => {
                    let v = self.x_list()?.into_iter().map(|v| (v, 0)).collect();
                    fields.push((key, pos, v));
                }
                "pad" => {
                    let pads = self.padding_value()?;
                    if pads.iter().any(|p| p.interior != 0) {
                        return Err(self.err(pos, "window padding has no interior part"));
                    }
                    fields.push((key, pos, pads.iter().map(|p| (p.low, p.high)).collect()));
                }
                other => return Err(self.err(pos, format!("unknown window field '{other}'"))),
            }
        }
        let n = sizes
            .as_ref()
            .map(Vec::len)
            .or_else(|| fields.first().map(|f| f.2.len()))
            .unwrap_or(0);
        let mut dims = vec![WindowDim::default(); n];
        if let Some(s) = sizes {
            for (d, v) in dims.iter_mut().zip(s) {
                d.size = v;
            }
        }
        for (key, pos, values) in fields {
            if values.len() != n {
                return Err(self.err(
                    pos,
                    format!(
                        "window field '{key}' has {} dimensions, expected {n}",
                        values.len()
                    ),
                ));
            }
            for (d, (a, b)) in dims.iter_mut().zip(values) {
                match key {
                    "stride" => d.stride = a,
                    "lhs_dilate" => d.lhs_dilation = a,
                    "rhs_dilate" => d.rhs_dilation = a,
                    "rhs_reversal" => d.reversal = a != 0,
                    _ => {
                        d.padding_low = a;
                        d.padding_high = b;
                    }
                }
            }
        }
        Ok(Window { dims })
    }

    fn dim_labels(&mut self) -> PResult<ConvDimensionNumbers> {
        self.c.skip_ws();
        let pos = self.c.pos;
        let start = self.c.pos;
        while self.c.peek_raw().is_some_and(|b| {
            b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'>' || b == b'?'
        }) {
            self.c.pos += 1;
        }
        let text = &self.c.src[start..self.c.pos];
        let bad = |p: &Self| {
            p.err(
                pos,
                format!("malformed dim_labels '{text}', expected e.g. b01f_01io->b01f"),
            )
        };
        let (lhs_rhs, out) = text.split_once("->").ok_or_else(|| bad(self))?;
        let (lhs, rhs) = lhs_rhs.split_once('_').ok_or_else(|| bad(self))?;
        let spatial = |labels: &str, a: char, b: char| -> Option<(i64, i64, Vec<i64>)> {
            let mut first = None;
            let mut second = None;
            let mut spatial: Vec<(u32, i64)> = Vec::new();
            for (i, ch) in labels.chars().enumerate() {
                match ch {
                    c if c == a => first = Some(i as i64),
                    c if c == b => second = Some(i as i64),
                    c if c.is_ascii_digit() => spatial.push((c.to_digit(10)?, i as i64)),
                    _ => return None,
                }
            }
            spatial.sort();
            if spatial.iter().enumerate().any(|(i, s)| s.0 != i as u32) {
                return None;
            }
            Some((first?, second?, spatial.into_iter().map(|s| s.1).collect()))
        };
        let (ib, ifeat, isp) = spatial(lhs, 'b', 'f').ok_or_else(|| bad(self))?;
        let (ki, ko, ksp) = spatial(rhs, 'i', 'o').ok_or_else(|| bad(self))?;
        let (ob, of, osp) = spatial(out, 'b', 'f').ok_or_else(|| bad(self))?;
        if isp.len() != ksp.len() || isp.len() != osp.len() {
            return Err(bad(self));
        }
        Ok(ConvDimensionNumbers {
            input_batch: ib,
            input_feature: ifeat,
            input_spatial: isp,
            kernel_input_feature: ki,
            kernel_output_feature: ko,
            kernel_spatial: ksp,
            output_batch: ob,
            output_feature: of,
            output_spatial: osp,
        })
    }

    fn replica_groups(&mut self) -> PResult<CollectiveDeviceList> {
        match self.c.peek() {
            Some(b'{') => Ok(CollectiveDeviceList::Explicit(self.int_lists()?)),
            Some(b'[') => {
                let pos = self.c.pos;
                let dims = self.int_list(b'[', b']')?;
                let [num_groups, group_size] = dims[..] else {
                    return Err(self.err(pos, "an iota replica group list has exactly 2 dimensions [num_groups,group_size]"));
                };
                if !self.c.eat_str("<=") {
                    return Err(self.c.expected("'<='"));
                }
                let (reshape_dims, perm) = self.iota_tail()?;
                Ok(CollectiveDeviceList::Iota {
                    num_groups,
                    group_size,
                    reshape_dims,
                    perm,
                })
            }
            _ => {
                let mesh = self.mesh()?;
                let axes = self.axis_set()?;
                Ok(CollectiveDeviceList::MeshAxes { mesh, axes })
            }
        }
    }

    /// `[reshape_dims]` then optional `T(perm)`.
    fn iota_tail(&mut self) -> PResult<(Vec<i64>, Vec<i64>)> {
        let reshape_dims = self.int_list(b'[', b']')?;
        let perm = if self.c.peek_raw() == Some(b'T') {
            self.c.pos += 1;
            let pos = self.c.pos;
            let perm = self.int_list(b'(', b')')?;
            if !is_permutation(&perm, reshape_dims.len()) {
                return Err(self.err(
                    pos,
                    "T(...) must be a permutation of the reshape dimensions",
                ));
            }
            perm
        } else {
            Vec::new()
        };
        Ok((reshape_dims, perm))
    }

    fn axis_name(&mut self) -> PResult<String> {
        self.c.skip_ws();
        match self.c.peek_raw() {
            Some(b'\'') | Some(b'"') => self.c.string(),
            _ => Ok(self.c.ident()?.to_string()),
        }
    }

    fn mesh_device_ids(&mut self) -> PResult<MeshDeviceIds> {
        self.c.expect(b'(')?;
        if self.c.peek() == Some(b'[') {
            let (reshape_dims, perm) = self.iota_tail()?;
            self.c.expect(b')')?;
            Ok(MeshDeviceIds::Iota { reshape_dims, perm })
        } else {
            let mut ids = Vec::new();
            while !self.c.eat(b')') {
                if !ids.is_empty() {
                    self.c.expect(b',')?;
                }
                ids.push(self.c.int()?);
            }
            Ok(MeshDeviceIds::Explicit(ids))
        }
    }

    /// `mesh['a'=2,'b'=4]` with device ids inside or after the brackets.
    fn mesh(&mut self) -> PResult<Mesh> {
        if !self.c.eat_keyword("mesh") {
            return Err(self.c.expected("'mesh[', '{' or '['"));
        }
        self.expect_raw(b'[')?;
        let mut mesh = Mesh::new(Vec::new());
        while !self.c.eat(b']') {
            if !mesh.axes.is_empty() || mesh.device_ids.is_some() {
                self.c.expect(b',')?;
            }
            if self.c.eat_keyword("device_ids") {
                self.c.expect(b'=')?;
                mesh.device_ids = Some(self.mesh_device_ids()?);
                mesh.device_ids_placement = DeviceIdsPlacement::InsideBrackets;
                continue;
            }
            let name = self.axis_name()?;
            self.c.expect(b'=')?;
            let size = self.c.int()?;
            mesh.axes.push((name, size));
        }
        let save = self.c.pos;
        if self.c.eat(b',') && self.c.eat_keyword("device_ids") {
            self.c.expect(b'=')?;
            mesh.device_ids = Some(self.mesh_device_ids()?);
            mesh.device_ids_placement = DeviceIdsPlacement::AfterBrackets;
        } else {
            self.c.pos = save;
        }
        Ok(mesh)
    }

    fn axis_ref(&mut self) -> PResult<AxisRef> {
        let name = self.axis_name()?;
        let sub_axis = if self.c.eat(b':') {
            self.c.expect(b'(')?;
            let pre = self.c.int()?;
            self.c.expect(b')')?;
            let size = self.c.int()?;
            Some((pre, size))
        } else {
            None
        };
        Ok(AxisRef { name, sub_axis })
    }

    /// `{'a', 'b':(2)2}`
    fn axis_set(&mut self) -> PResult<Vec<AxisRef>> {
        self.c.expect(b'{')?;
        let mut out = Vec::new();
        while !self.c.eat(b'}') {
            if !out.is_empty() {
                self.c.expect(b',')?;
            }
            out.push(self.axis_ref()?);
        }
        Ok(out)
    }

    // --------------------------------------------------------------- sharding

    fn sharding(&mut self) -> PResult<HloSharding> {
        let save = self.c.pos;
        self.c.expect(b'{')?;
        match self.c.peek() {
            Some(b'{') => {
                let mut elements = Vec::new();
                while !self.c.eat(b'}') {
                    if !elements.is_empty() {
                        self.c.expect(b',')?;
                    }
                    elements.push(self.single_sharding()?);
                }
                Ok(HloSharding::Tuple(elements))
            }
            Some(b'}') => {
                self.c.expect(b'}')?;
                Ok(HloSharding::Tuple(Vec::new()))
            }
            _ => {
                self.c.pos = save;
                Ok(HloSharding::Single(self.single_sharding()?))
            }
        }
    }

    fn single_sharding(&mut self) -> PResult<SingleSharding> {
        let open = self.c.pos;
        self.c.expect(b'{')?;
        let mut kind: Option<ShardingKind> = None;
        let mut replicate_last = false;
        let mut last_tile_dims = Vec::new();
        let mut shard_group = None;
        let mut metadata = None;
        let mut maximal = false;
        while !self.c.eat(b'}') {
            self.c.skip_ws();
            let pos = self.c.pos;
            if self.c.at_end() {
                return Err(self.err(open, "unterminated sharding"));
            }
            let word = self.c.ident()?;
            let set = |p: &Self, kind: &mut Option<ShardingKind>, k: ShardingKind| {
                if kind.is_some() {
                    return Err(p.err(pos, format!("conflicting sharding kinds at '{word}'")));
                }
                *kind = Some(k);
                Ok(())
            };
            match word {
                "replicated" => set(self, &mut kind, ShardingKind::Replicated)?,
                "manual" => set(self, &mut kind, ShardingKind::Manual)?,
                "unknown" => set(self, &mut kind, ShardingKind::Unknown)?,
                "unreduced" => set(self, &mut kind, ShardingKind::Unreduced)?,
                "maximal" => maximal = true,
                "device" => {
                    self.c.expect(b'=')?;
                    let d = self.c.int()?;
                    set(self, &mut kind, ShardingKind::Maximal(d))?;
                }
                "devices" => {
                    self.c.expect(b'=')?;
                    let dims = self.int_list(b'[', b']')?;
                    let ta = if self.c.eat_str("<=") {
                        let (reshape_dims, perm) = self.iota_tail()?;
                        TileAssignment::Iota {
                            dims,
                            reshape_dims,
                            perm,
                        }
                    } else {
                        let mut devices = vec![self.c.int()?];
                        loop {
                            let save = self.c.pos;
                            if !self.c.eat(b',') {
                                break;
                            }
                            self.c.skip_ws();
                            if !self.c.peek_raw().is_some_and(|b| b.is_ascii_digit()) {
                                self.c.pos = save;
                                break;
                            }
                            devices.push(self.c.int()?);
                        }
                        TileAssignment::Explicit { dims, devices }
                    };
                    set(
                        self,
                        &mut kind,
                        ShardingKind::Tiled {
                            tile_assignment: ta,
                            replicate_on_last_tile_dim: false,
                            last_tile_dims: Vec::new(),
                        },
                    )?;
                }
                "last_tile_dim_replicate" => replicate_last = true,
                "last_tile_dims" => {
                    self.c.expect(b'=')?;
                    self.c.expect(b'{')?;
                    while !self.c.eat(b'}') {
                        if !last_tile_dims.is_empty() {
                            self.c.expect(b',')?;
                        }
                        let tpos = self.c.pos;
                        let t = self.c.ident()?;
                        last_tile_dims.push(SubgroupType::from_name(t).ok_or_else(|| {
                            self.err(tpos, format!("unknown subgroup type '{t}'"))
                        })?);
                    }
                }
                "shard_as" => shard_group = Some(ShardGroup::As(self.c.int()?)),
                "shard_like" => shard_group = Some(ShardGroup::Like(self.c.int()?)),
                "metadata" => {
                    self.c.expect(b'=')?;
                    metadata = Some(self.c.balanced()?.to_string());
                }
                "mesh" => {
                    self.c.pos = pos;
                    let named = self.named_sharding()?;
                    set(self, &mut kind, ShardingKind::Named(named))?;
                }
                "maximal_mesh" => {
                    self.expect_raw(b'[')?;
                    if !self.c.eat_keyword("device_id") {
                        return Err(self.c.expected("'device_id'"));
                    }
                    self.c.expect(b'=')?;
                    let d = self.c.int()?;
                    self.c.expect(b']')?;
                    set(self, &mut kind, ShardingKind::MaximalMesh(d))?;
                }
                other => return Err(self.err(pos, format!("unexpected '{other}' in sharding"))),
            }
            self.c.eat(b',');
        }
        let mut kind = match kind {
            Some(k) => k,
            None if maximal => return Err(self.err(open, "maximal sharding needs device=N")),
            None => return Err(self.err(open, "empty sharding")),
        };
        if let ShardingKind::Tiled {
            replicate_on_last_tile_dim,
            last_tile_dims: ltd,
            ..
        } = &mut kind
        {
            *replicate_on_last_tile_dim = replicate_last;
            *ltd = last_tile_dims;
        } else if replicate_last || !last_tile_dims.is_empty() {
            return Err(self.err(
                open,
                "last_tile_dim_replicate/last_tile_dims need devices=[...]",
            ));
        }
        if maximal && !matches!(kind, ShardingKind::Maximal(_)) {
            return Err(self.err(open, "maximal sharding needs device=N"));
        }
        Ok(SingleSharding {
            kind,
            shard_group,
            metadata,
        })
    }

    fn named_sharding(&mut self) -> PResult<NamedSharding> {
        let mesh = self.mesh()?;
        self.c.expect(b',')?;
        let dims = if self.c.eat_keyword("replicated") {
            NamedDims::Replicated
        } else if self.c.eat_keyword("manual") {
            NamedDims::Manual
        } else {
            self.c.expect(b'[')?;
            let mut dims = Vec::new();
            while !self.c.eat(b']') {
                if !dims.is_empty() {
                    self.c.expect(b',')?;
                }
                let axes = self.axis_set()?;
                let open = self.c.eat(b'?');
                dims.push(NamedDim { axes, open });
            }
            NamedDims::Dims(dims)
        };
        let mut named = NamedSharding {
            mesh,
            dims,
            replicated_axes: None,
            unreduced: None,
            manual_axes: None,
        };
        loop {
            let save = self.c.pos;
            if !self.c.eat(b',') {
                break;
            }
            if self.c.eat_keyword("replicated") {
                self.c.expect(b'=')?;
                named.replicated_axes = Some(self.axis_set()?);
            } else if self.c.eat_keyword("manual") {
                self.c.expect(b'=')?;
                named.manual_axes = Some(self.axis_set()?);
            } else if self.c.eat_keyword("unreduced") {
                let op = if self.c.eat(b'=') {
                    Some(self.c.ident()?.to_string())
                } else {
                    None
                };
                named.unreduced = Some((op, self.axis_set()?));
            } else {
                self.c.pos = save;
                break;
            }
        }
        Ok(named)
    }

    // ------------------------------------------------------------------ shape

    fn shape(&mut self) -> PResult<Shape> {
        self.enter()?;
        let r = self.shape_inner();
        self.leave();
        r
    }

    fn shape_inner(&mut self) -> PResult<Shape> {
        if self.c.eat(b'(') {
            let mut elements = Vec::new();
            while !self.c.eat(b')') {
                if !elements.is_empty() {
                    self.c.expect(b',')?;
                }
                elements.push(self.shape()?);
            }
            return Ok(Shape::Tuple(elements));
        }
        self.c.skip_ws();
        let pos = self.c.pos;
        let word = self.c.ident().map_err(|_| self.c.expected("a shape"))?;
        if word == "b" && self.c.peek_raw() == Some(b'(') {
            self.c.pos += 1;
            let inner = self.shape()?;
            self.c.expect(b')')?;
            return Ok(Shape::Buffer(Box::new(inner)));
        }
        let element_type = PrimitiveType::from_name(word).ok_or_else(|| {
            self.err(
                pos,
                format!("expected a shape, found unknown element type '{word}'"),
            )
        })?;
        self.expect_raw(b'[')?;
        let mut dims = Vec::new();
        let mut dynamic = Vec::new();
        while !self.c.eat(b']') {
            if !dims.is_empty() {
                self.c.expect(b',')?;
            }
            if self.c.eat(b'?') {
                dims.push(UNBOUNDED);
                dynamic.push(true);
            } else if self.c.eat_str("<=") {
                let d = self.c.int()?;
                dims.push(d);
                dynamic.push(true);
            } else {
                let dpos = self.c.pos;
                let d = self.c.int()?;
                if d < 0 {
                    return Err(self.err(dpos, format!("negative dimension size {d}")));
                }
                dims.push(d);
                dynamic.push(false);
            }
        }
        if !dynamic.iter().any(|&d| d) {
            dynamic.clear();
        }
        let mut shape = ArrayShape {
            element_type,
            dims,
            dynamic,
            layout: None,
        };
        // A '{' is a layout only when followed by an integer or ':'.
        if self.c.peek_raw() == Some(b'{') || self.c.peek() == Some(b'{') {
            let save = self.c.pos;
            self.c.eat(b'{');
            let next = self.c.peek();
            self.c.pos = save;
            if next.is_some_and(|b| b.is_ascii_digit() || b == b':') {
                let layout = self.layout()?;
                // `{:}` says nothing; keep it as "no layout" so it prints back parseably.
                if !layout.minor_to_major.is_empty() || !layout.is_plain() {
                    shape.layout = Some(layout);
                }
            }
        }
        Ok(Shape::Array(shape))
    }

    fn layout(&mut self) -> PResult<Layout> {
        self.c.expect(b'{')?;
        let mut layout = Layout::default();
        while self.c.peek().is_some_and(|b| b.is_ascii_digit()) {
            layout.minor_to_major.push(self.c.int()?);
            if !self.c.eat(b',') {
                break;
            }
        }
        if self.c.eat(b':') {
            loop {
                self.c.skip_ws();
                let pos = self.c.pos;
                match self.c.peek_raw() {
                    Some(b'}') => break,
                    Some(b'T') => {
                        self.c.pos += 1;
                        while self.c.peek_raw() == Some(b'(') {
                            layout.tiles.push(self.tile()?);
                        }
                    }
                    Some(b'E') => {
                        self.c.pos += 1;
                        self.c.expect(b'(')?;
                        layout.element_size_in_bits = Some(self.c.int()?);
                        self.c.expect(b')')?;
                    }
                    Some(b'S') if self.c.peek_raw_at(1) == Some(b'(') => {
                        self.c.pos += 1;
                        self.c.expect(b'(')?;
                        layout.memory_space = Some(self.c.int()?);
                        self.c.expect(b')')?;
                    }
                    Some(b'D' | b'L' | b'#' | b'*' | b'S' | b'P' | b'M') => {
                        let start = self.c.pos;
                        while self.c.peek_raw().is_some_and(|b| b != b'(' && b != b'}') {
                            self.c.pos += 1;
                        }
                        if self.c.pos - start > 2 {
                            return Err(self.err(pos, "unknown layout item"));
                        }
                        self.c.balanced()?;
                        layout.other.push(self.c.src[start..self.c.pos].to_string());
                    }
                    _ => {
                        return Err(self
                            .c
                            .expected("a layout item (T, E, S, D, L, #, *, SC, P, M) or '}'"))
                    }
                }
            }
        }
        self.c.expect(b'}')?;
        Ok(layout)
    }

    fn tile(&mut self) -> PResult<Vec<i64>> {
        self.c.expect(b'(')?;
        let mut out = Vec::new();
        while !self.c.eat(b')') {
            if !out.is_empty() {
                self.c.expect(b',')?;
            }
            if self.c.eat(b'*') {
                out.push(i64::MIN);
            } else {
                out.push(self.c.int()?);
            }
        }
        Ok(out)
    }

    // ---------------------------------------------------------------- literal

    fn literal(&mut self, shape: &Shape) -> PResult<Literal> {
        self.enter()?;
        let r = self.literal_inner(shape);
        self.leave();
        r
    }

    fn literal_inner(&mut self, shape: &Shape) -> PResult<Literal> {
        match shape {
            Shape::Tuple(elements) => {
                self.c.expect(b'(')?;
                let mut out = Vec::new();
                for (i, e) in elements.iter().enumerate() {
                    if i > 0 {
                        self.c.expect(b',')?;
                    }
                    out.push(self.literal(e)?);
                }
                self.c.expect(b')')?;
                Ok(Literal::Tuple(out))
            }
            Shape::Buffer(inner) => self.literal(inner),
            Shape::Array(a) => {
                let pos = self.c.pos;
                let count = a
                    .dims
                    .iter()
                    .try_fold(1i64, |acc, &d| acc.checked_mul(d.max(0)));
                match count {
                    Some(n) if n <= MAX_LITERAL_ELEMENTS => {}
                    _ => return Err(self.err(pos, "literal is too large")),
                }
                if !a.element_type.is_array_type() {
                    return Err(self.err(
                        pos,
                        format!("a {} constant cannot be written", a.element_type),
                    ));
                }
                let shape = ArrayShape {
                    layout: None,
                    ..a.clone()
                };
                if !a.dims.is_empty() && self.c.eat_str("{...}") {
                    return Ok(Literal::Array(ArrayLiteral {
                        shape,
                        data: Vec::new(),
                        elided: true,
                    }));
                }
                // Every written element takes at least one byte of text.
                let remaining = self.c.src.len() - self.c.pos;
                if shape.element_count() as usize > remaining + 1 {
                    return Err(self.err(
                        pos,
                        format!(
                            "literal of shape {shape} has more elements than the text has bytes"
                        ),
                    ));
                }
                let mut lit = ArrayLiteral::zeros(shape);
                if a.dims.is_empty() {
                    self.element(&mut lit, 0)?;
                    return Ok(Literal::Array(lit));
                }
                let mut next = 0usize;
                self.literal_level(&mut lit, 0, &mut next)?;
                Ok(Literal::Array(lit))
            }
        }
    }

    fn literal_level(
        &mut self,
        lit: &mut ArrayLiteral,
        level: usize,
        next: &mut usize,
    ) -> PResult<()> {
        let rank = lit.shape.dims.len();
        let n = lit.shape.dims[level].max(0) as usize;
        let open = self.c.pos;
        self.c.expect(b'{')?;
        for j in 0..n {
            if j > 0 {
                self.c.expect(b',')?;
            }
            if level + 1 == rank {
                self.element(lit, *next)?;
                *next += 1;
            } else {
                self.enter()?;
                let r = self.literal_level(lit, level + 1, next);
                self.leave();
                r?;
            }
        }
        if !self.c.eat(b'}') {
            return Err(self.err(
                open,
                format!(
                    "literal dimension {level} should have {n} elements (shape {})",
                    lit.shape
                ),
            ));
        }
        Ok(())
    }

    fn element(&mut self, lit: &mut ArrayLiteral, i: usize) -> PResult<()> {
        let ty = lit.element_type();
        self.c.skip_ws();
        let pos = self.c.pos;
        match ty.class() {
            TypeClass::Pred => {
                let v = match self.c.peek_raw() {
                    Some(b't') | Some(b'f') => self.bool_value()?,
                    _ => match self.c.int()? {
                        0 => false,
                        1 => true,
                        v => return Err(self.err(pos, format!("{v} is not a pred value"))),
                    },
                };
                lit.set_int(i, v as i128);
            }
            TypeClass::Signed | TypeClass::Unsigned => {
                let text = self.c.number_text()?;
                let v: i128 = text.parse().map_err(|_| {
                    self.err(pos, format!("expected an integer for {ty}, found '{text}'"))
                })?;
                let bits = ty.bit_width();
                let (lo, hi) = if ty.is_signed_int() {
                    (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1)
                } else {
                    (0, (1i128 << bits) - 1)
                };
                if v < lo || v > hi {
                    return Err(self.err(pos, format!("value {v} is out of range for {ty}")));
                }
                lit.set_int(i, v);
            }
            TypeClass::Float => {
                let text = self.c.number_text()?;
                let bits = float_bits(ty, text).ok_or_else(|| {
                    self.err(pos, format!("expected a {ty} value, found '{text}'"))
                })?;
                lit.set_bits(i, bits);
            }
            TypeClass::Complex => {
                let part = if ty == PrimitiveType::C64 {
                    PrimitiveType::F32
                } else {
                    PrimitiveType::F64
                };
                self.c.expect(b'(')?;
                let re_pos = self.c.pos;
                let re = self.c.number_text()?;
                self.c.expect(b',')?;
                let im = self.c.number_text()?;
                self.c.expect(b')')?;
                let bad = || self.err(re_pos, "malformed complex value");
                let width = if ty == PrimitiveType::C64 { 32 } else { 64 };
                let re_bits = float_bits(part, re).ok_or_else(bad)?;
                let im_bits = float_bits(part, im).ok_or_else(bad)?;
                lit.set_bits(i, im_bits << width | re_bits);
            }
            TypeClass::Token | TypeClass::Opaque => {
                return Err(self.err(pos, format!("a {ty} value cannot be written")))
            }
        }
        Ok(())
    }
}

fn is_permutation(perm: &[i64], n: usize) -> bool {
    let mut seen = vec![false; n];
    perm.len() == n
        && perm.iter().all(|&p| {
            usize::try_from(p)
                .ok()
                .and_then(|p| seen.get_mut(p))
                .is_some_and(|s| !std::mem::replace(s, true))
        })
}

/// Parses a decimal, `inf`, `-inf`, `nan` or `-nan` as f64.
fn parse_f64(text: &str) -> Option<f64> {
    let (neg, body) = match text.strip_prefix('-') {
        Some(b) => (true, b),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    let v = match body {
        "inf" => f64::INFINITY,
        "nan" => f64::NAN,
        _ if body.starts_with("nan(") => f64::NAN,
        _ => body.parse::<f64>().ok()?,
    };
    Some(if neg { -v } else { v })
}

/// The bits of a float element written as `text` (NaN payloads kept).
fn float_bits(ty: PrimitiveType, text: &str) -> Option<u128> {
    let negative = text.starts_with('-');
    let body = text.trim_start_matches(['-', '+']);
    if let Some(payload) = body.strip_prefix("nan(").and_then(|p| p.strip_suffix(')')) {
        let payload = payload.strip_prefix("0x").unwrap_or(payload);
        let payload = u64::from_str_radix(payload, 16).ok()?;
        return nan_with_payload(ty, payload, negative).or_else(|| float_to_bits(ty, f64::NAN));
    }
    let v = parse_f64(text)?;
    if v.is_nan() {
        // default quiet NaN, with the sign as written
        let bits = float_to_bits(ty, f64::NAN)?;
        return Some(match (negative, xla_hlo_ir::literal::ieee_layout(ty)) {
            (true, Some((e, m))) => bits | 1u128 << (e + m),
            _ => bits,
        });
    }
    float_to_bits(ty, v)
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
