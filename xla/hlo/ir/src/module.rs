//! The HLO graph: modules own computations, computations own instructions,
//! each in an arena addressed by a typed id.
//!
//! Invariants:
//! - `InstrId`s index their own computation's `instructions`; operands and
//!   control predecessors always refer to instructions of the same computation.
//! - `CompId`s index `HloModule::computations`; computations are kept in
//!   printing order, callees normally before callers.
//! - When `config.is_scheduled` is set, each computation's arena order is its
//!   schedule (the order XLA's parser reads as the sequence).
//! - Instruction and computation names are unique within the module (the
//!   verifier checks it).

use crate::attrs::{
    AttrKey, AttrValue, Attribute, ConvDimensionNumbers, DotDimensionNumbers,
    GatherDimensionNumbers, ScatterDimensionNumbers, SliceDim, Window,
};
use crate::literal::Literal;
use crate::opcode::Opcode;
use crate::replica_groups::CollectiveDeviceList;
use crate::shape::Shape;
use crate::sharding::HloSharding;
use std::fmt;
use std::sync::Arc;

macro_rules! entity_id {
    ($name:ident, $prefix:literal) => {
        /// A typed index into an arena.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(pub u32);
        impl $name {
            pub fn index(self) -> usize {
                self.0 as usize
            }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }
    };
}

entity_id!(InstrId, "i");
entity_id!(CompId, "c");

/// One HLO instruction.
#[derive(Clone, Debug, PartialEq)]
pub struct HloInstruction {
    /// Name without the `%` sigil.
    pub name: String,
    pub opcode: Opcode,
    pub shape: Shape,
    pub operands: Vec<InstrId>,
    /// `key=value` attributes other than sharding and control predecessors.
    pub attrs: Vec<Attribute>,
    /// Behind a pointer: most instructions of a large module have none, and
    /// an inline sharding would more than double the size of every
    /// instruction. Shared: propagation gives one sharding to many
    /// instructions (`Arc::make_mut` to change one instruction's copy).
    pub sharding: Option<Arc<HloSharding>>,
    pub control_predecessors: Vec<InstrId>,
    /// `parameter(N)`
    pub parameter_number: Option<i64>,
    /// `constant(...)`
    pub literal: Option<Box<Literal>>,
    /// For async ops written with sugar (`reduce-scatter-start`): the wrapped
    /// opcode; the wrapped op's attributes are kept on this instruction.
    pub async_wrapped: Option<Opcode>,
}

impl HloInstruction {
    pub fn new(
        name: impl Into<String>,
        opcode: Opcode,
        shape: Shape,
        operands: Vec<InstrId>,
    ) -> Self {
        HloInstruction {
            name: name.into(),
            opcode,
            shape,
            operands,
            attrs: Vec::new(),
            sharding: None,
            control_predecessors: Vec::new(),
            parameter_number: None,
            literal: None,
            async_wrapped: None,
        }
    }

    pub fn attr(&self, key: AttrKey) -> Option<&AttrValue> {
        self.attrs.iter().find(|a| a.key == key).map(|a| &a.value)
    }
    pub fn has_attr(&self, key: AttrKey) -> bool {
        self.attr(key).is_some()
    }
    /// Sets (replacing) an attribute.
    pub fn set_attr(&mut self, key: AttrKey, value: AttrValue) {
        match self.attrs.iter_mut().find(|a| a.key == key) {
            Some(a) => a.value = value,
            None => self.attrs.push(Attribute { key, value }),
        }
    }
    pub fn remove_attr(&mut self, key: AttrKey) -> Option<AttrValue> {
        let i = self.attrs.iter().position(|a| a.key == key)?;
        Some(self.attrs.remove(i).value)
    }
    pub fn int_attr(&self, key: AttrKey) -> Option<i64> {
        match self.attr(key)? {
            AttrValue::Int(v) => Some(*v),
            _ => None,
        }
    }
    pub fn bool_attr(&self, key: AttrKey) -> Option<bool> {
        match self.attr(key)? {
            AttrValue::Bool(v) => Some(*v),
            _ => None,
        }
    }
    pub fn ints_attr(&self, key: AttrKey) -> Option<&[i64]> {
        match self.attr(key)? {
            AttrValue::Ints(v) => Some(v),
            _ => None,
        }
    }
    /// The `op_name` of the instruction's `metadata={...}`, if any (escapes
    /// kept as written).
    pub fn op_name(&self) -> Option<&str> {
        let text: &str = match self.attr(AttrKey::Metadata)? {
            AttrValue::Raw(text) => text,
            AttrValue::Str(text) => text,
            _ => return None,
        };
        let start = text.find("op_name=\"")? + "op_name=\"".len();
        let bytes = text.as_bytes();
        let mut end = start;
        while end < bytes.len() && bytes[end] != b'"' {
            end += if bytes[end] == b'\\' { 2 } else { 1 };
        }
        text.get(start..end.min(bytes.len()))
    }
    pub fn ident_attr(&self, key: AttrKey) -> Option<&str> {
        match self.attr(key)? {
            AttrValue::Ident(v) | AttrValue::Str(v) => Some(v),
            _ => None,
        }
    }
    /// The thread an async op runs its computation on (`main` when not written).
    pub fn async_execution_thread(&self) -> &str {
        match self.attr(AttrKey::AsyncExecutionThread) {
            Some(AttrValue::Str(thread)) => thread,
            _ => "main",
        }
    }
    pub fn computation_attr(&self, key: AttrKey) -> Option<CompId> {
        match self.attr(key)? {
            AttrValue::Computation(c) => Some(*c),
            _ => None,
        }
    }
    /// `dimensions={...}` (empty when absent).
    pub fn dimensions(&self) -> &[i64] {
        self.ints_attr(AttrKey::Dimensions).unwrap_or(&[])
    }
    pub fn to_apply(&self) -> Option<CompId> {
        self.computation_attr(AttrKey::ToApply)
    }
    pub fn window(&self) -> Option<&Window> {
        match self.attr(AttrKey::Window)? {
            AttrValue::Window(w) => Some(w),
            _ => None,
        }
    }
    pub fn slice_dims(&self) -> Option<&[SliceDim]> {
        match self.attr(AttrKey::Slice)? {
            AttrValue::Slice(s) => Some(s),
            _ => None,
        }
    }
    pub fn padding(&self) -> Option<&[crate::attrs::PaddingDim]> {
        match self.attr(AttrKey::Padding)? {
            AttrValue::Padding(p) => Some(p),
            _ => None,
        }
    }
    pub fn conv_dimension_numbers(&self) -> Option<&ConvDimensionNumbers> {
        match self.attr(AttrKey::DimLabels)? {
            AttrValue::DimLabels(d) => Some(d),
            _ => None,
        }
    }
    pub fn replica_groups(&self) -> Option<&CollectiveDeviceList> {
        match self.attr(AttrKey::ReplicaGroups)? {
            AttrValue::ReplicaGroups(g) => Some(g),
            _ => None,
        }
    }
    pub fn channel_id(&self) -> Option<i64> {
        self.int_attr(AttrKey::ChannelId)
    }
    pub fn dot_dimension_numbers(&self) -> DotDimensionNumbers {
        let get = |k| self.ints_attr(k).unwrap_or(&[]).to_vec();
        DotDimensionNumbers {
            lhs_batch: get(AttrKey::LhsBatchDims),
            rhs_batch: get(AttrKey::RhsBatchDims),
            lhs_contracting: get(AttrKey::LhsContractingDims),
            rhs_contracting: get(AttrKey::RhsContractingDims),
        }
    }
    pub fn gather_dimension_numbers(&self) -> GatherDimensionNumbers {
        let get = |k| self.ints_attr(k).unwrap_or(&[]).to_vec();
        GatherDimensionNumbers {
            offset_dims: get(AttrKey::OffsetDims),
            collapsed_slice_dims: get(AttrKey::CollapsedSliceDims),
            start_index_map: get(AttrKey::StartIndexMap),
            index_vector_dim: self.int_attr(AttrKey::IndexVectorDim).unwrap_or(0),
            operand_batching_dims: get(AttrKey::OperandBatchingDims),
            start_indices_batching_dims: get(AttrKey::StartIndicesBatchingDims),
        }
    }
    pub fn scatter_dimension_numbers(&self) -> ScatterDimensionNumbers {
        let get = |k| self.ints_attr(k).unwrap_or(&[]).to_vec();
        ScatterDimensionNumbers {
            update_window_dims: get(AttrKey::UpdateWindowDims),
            inserted_window_dims: get(AttrKey::InsertedWindowDims),
            scatter_dims_to_operand_dims: get(AttrKey::ScatterDimsToOperandDims),
            index_vector_dim: self.int_attr(AttrKey::IndexVectorDim).unwrap_or(0),
            input_batching_dims: get(AttrKey::InputBatchingDims),
            scatter_indices_batching_dims: get(AttrKey::ScatterIndicesBatchingDims),
        }
    }
    /// Every computation this instruction calls, in attribute order.
    pub fn called_computations(&self) -> Vec<CompId> {
        self.called_computation_ids().collect()
    }
    /// The computations this instruction calls, in attribute order, without
    /// collecting them.
    pub fn called_computation_ids(&self) -> impl Iterator<Item = CompId> + '_ {
        self.attrs
            .iter()
            .flat_map(|attr| match &attr.value {
                AttrValue::Computation(c) => std::slice::from_ref(c),
                AttrValue::Computations(cs) => cs.as_slice(),
                _ => &[],
            })
            .copied()
    }
    /// The opcode whose semantics this instruction has: the wrapped opcode of
    /// sugared async ops, the synchronous collective of native start ops.
    pub fn effective_opcode(&self) -> Opcode {
        self.async_wrapped
            .or_else(|| self.opcode.sync_collective())
            .unwrap_or(self.opcode)
    }
}

/// A computation: an arena of instructions with a root.
#[derive(Clone, Debug, PartialEq)]
pub struct HloComputation {
    pub name: String,
    pub instructions: Vec<HloInstruction>,
    pub root: InstrId,
    /// Parameter instructions indexed by parameter number.
    pub parameters: Vec<InstrId>,
    /// `execution_thread="..."` after the closing brace, when not the main thread.
    pub execution_thread: Option<String>,
}

impl HloComputation {
    pub fn new(name: impl Into<String>) -> HloComputation {
        HloComputation {
            name: name.into(),
            instructions: Vec::new(),
            root: InstrId(0),
            parameters: Vec::new(),
            execution_thread: None,
        }
    }
    pub fn instr(&self, id: InstrId) -> &HloInstruction {
        &self.instructions[id.index()]
    }
    pub fn instr_mut(&mut self, id: InstrId) -> &mut HloInstruction {
        &mut self.instructions[id.index()]
    }
    pub fn root_instr(&self) -> &HloInstruction {
        self.instr(self.root)
    }
    /// Appends an instruction and returns its id; parameters are registered.
    pub fn add(&mut self, instr: HloInstruction) -> InstrId {
        let id = InstrId(self.instructions.len() as u32);
        if instr.opcode == Opcode::Parameter {
            if let Some(n) = instr.parameter_number.and_then(|n| usize::try_from(n).ok()) {
                if self.parameters.len() <= n {
                    self.parameters.resize(n + 1, InstrId(u32::MAX));
                }
                self.parameters[n] = id;
            }
        }
        self.instructions.push(instr);
        id
    }
    pub fn ids(&self) -> impl Iterator<Item = InstrId> {
        (0..self.instructions.len() as u32).map(InstrId)
    }
    /// Replaces every use of `old` (as an operand or the root) by `new`; a
    /// control dependency on `old` is dropped.
    pub fn replace_uses(&mut self, old: InstrId, new: InstrId) {
        for instr in &mut self.instructions {
            for operand in instr.operands.iter_mut().filter(|o| **o == old) {
                *operand = new;
            }
            instr.control_predecessors.retain(|&p| p != old);
        }
        if self.root == old {
            self.root = new;
        }
    }
    /// Keeps the instructions `keep` marks, in order, renumbering operands,
    /// control predecessors, the parameter table and the root; returns how
    /// many were removed. No kept instruction (nor the root) may refer to a
    /// removed one.
    pub fn retain_instructions(&mut self, keep: &[bool]) -> usize {
        let n = self.instructions.len();
        if keep.iter().take(n).all(|&k| k) {
            return 0;
        }
        let mut map = vec![InstrId(u32::MAX); n];
        let mut next = 0u32;
        for (i, slot) in map.iter_mut().enumerate() {
            if keep.get(i).copied().unwrap_or(true) {
                *slot = InstrId(next);
                next += 1;
            }
        }
        let mut index = 0;
        self.instructions.retain(|_| {
            index += 1;
            map[index - 1] != InstrId(u32::MAX)
        });
        self.parameters.clear();
        for (id, instr) in self.instructions.iter_mut().enumerate() {
            for o in instr.operands.iter_mut() {
                *o = map[o.index()];
            }
            for p in instr.control_predecessors.iter_mut() {
                *p = map[p.index()];
            }
            if instr.opcode == Opcode::Parameter {
                if let Some(k) = instr.parameter_number.and_then(|k| usize::try_from(k).ok()) {
                    if self.parameters.len() <= k {
                        self.parameters.resize(k + 1, InstrId(u32::MAX));
                    }
                    self.parameters[k] = InstrId(id as u32);
                }
            }
        }
        self.root = map[self.root.index()];
        n - self.instructions.len()
    }
    /// The shape of the computation's result.
    pub fn result_shape(&self) -> &Shape {
        &self.root_instr().shape
    }
    pub fn parameter_shapes(&self) -> Vec<&Shape> {
        self.parameters
            .iter()
            .map(|&p| &self.instr(p).shape)
            .collect()
    }
    pub fn find(&self, name: &str) -> Option<InstrId> {
        self.instructions
            .iter()
            .position(|i| i.name == name)
            .map(|i| InstrId(i as u32))
    }
    /// Users of each instruction (a side table rebuilt on demand; operands
    /// that name no instruction are left out).
    pub fn users(&self) -> Vec<Vec<InstrId>> {
        let mut users = vec![Vec::new(); self.instructions.len()];
        for (i, instr) in self.instructions.iter().enumerate() {
            for &op in &instr.operands {
                let Some(list) = users.get_mut(op.index()) else {
                    continue;
                };
                if list.last() != Some(&InstrId(i as u32)) {
                    list.push(InstrId(i as u32));
                }
            }
        }
        users
    }
}

/// One `input_output_alias` entry: `{out_index}: (param, {param_index}, kind)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AliasEntry {
    pub output_index: Vec<i64>,
    pub parameter_number: i64,
    pub parameter_index: Vec<i64>,
    /// `may-alias` or `must-alias` when written.
    pub kind: Option<String>,
}

/// One `buffer_donor` entry: `(param, {param_index})`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BufferDonor {
    pub parameter_number: i64,
    pub parameter_index: Vec<i64>,
}

/// `entry_computation_layout={(params)->result}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ComputationLayout {
    pub parameters: Vec<Shape>,
    pub result: Shape,
}

/// Header attributes of `HloModule`.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct ModuleConfig {
    pub is_scheduled: bool,
    pub input_output_alias: Option<Vec<AliasEntry>>,
    pub buffer_donor: Option<Vec<BufferDonor>>,
    pub alias_passthrough_params: Option<bool>,
    pub entry_computation_layout: Option<ComputationLayout>,
    pub allow_spmd_sharding_propagation_to_parameters: Option<Vec<bool>>,
    pub allow_spmd_sharding_propagation_to_output: Option<Vec<bool>>,
    pub replica_count: Option<i64>,
    pub num_partitions: Option<i64>,
    /// Verbatim `{...}` text.
    pub frontend_attributes: Option<String>,
    /// Other header attributes, name and verbatim value, in the order read.
    pub other: Vec<(String, String)>,
}

/// An HLO module.
#[derive(Clone, Debug, PartialEq)]
pub struct HloModule {
    pub name: String,
    pub config: ModuleConfig,
    /// Verbatim stack-frame index block (`FileNames ... StackFrames ...`), if any.
    pub stack_frame_index: Option<String>,
    pub computations: Vec<HloComputation>,
    pub entry: CompId,
}

impl HloModule {
    pub fn comp(&self, id: CompId) -> &HloComputation {
        &self.computations[id.index()]
    }
    pub fn comp_mut(&mut self, id: CompId) -> &mut HloComputation {
        &mut self.computations[id.index()]
    }
    pub fn entry_computation(&self) -> &HloComputation {
        self.comp(self.entry)
    }
    pub fn comp_ids(&self) -> impl Iterator<Item = CompId> {
        (0..self.computations.len() as u32).map(CompId)
    }
    pub fn find_computation(&self, name: &str) -> Option<CompId> {
        self.computations
            .iter()
            .position(|c| c.name == name)
            .map(|i| CompId(i as u32))
    }
    pub fn num_partitions(&self) -> i64 {
        self.config.num_partitions.unwrap_or(1)
    }
    pub fn replica_count(&self) -> i64 {
        self.config.replica_count.unwrap_or(1)
    }
    /// Total number of instructions over all computations.
    pub fn instruction_count(&self) -> usize {
        self.computations.iter().map(|c| c.instructions.len()).sum()
    }
    /// Finds an instruction by name anywhere in the module.
    pub fn find_instruction(&self, name: &str) -> Option<(CompId, InstrId)> {
        self.comp_ids()
            .find_map(|c| self.comp(c).find(name).map(|i| (c, i)))
    }
}
