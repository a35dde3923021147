//! Instruction attributes: one closed table of the `key=value` attributes XLA
//! prints, each with the kind of value it holds, and the typed values
//! (windows, slices, padding, convolution dimension labels, ...).
//!
//! Invariants: an attribute's `AttrValue` variant always matches its key's
//! `ValueKind` (the parser guarantees it; builders must keep it); attributes
//! the table does not know are kept verbatim as `AttrKey::Unknown` with an
//! `AttrValue::Unknown` value, so newer XLA text still round-trips.

use crate::replica_groups::CollectiveDeviceList;
use crate::shape::Shape;
use crate::CompId;
use std::fmt;
use std::sync::Arc;

/// How the text of an attribute's value is read and written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueKind {
    Int,
    Float,
    Bool,
    /// A bare word: `direction=EQ`, `kind=kLoop`.
    Ident,
    /// A quoted string: `custom_call_target="foo"`.
    Str,
    /// `{1,2,3}`
    Ints,
    /// `{1,2}` or `{{0,1},{1,2}}` (collective-permute's `slice_sizes`).
    IntsOrLists,
    /// `{{0,1},{1,2}}`
    IntLists,
    /// `{true,false}` or a single `true`.
    Bools,
    /// `{default,high}`
    Idents,
    /// `%comp`
    Computation,
    /// `{%a, %b}`
    Computations,
    /// `{[0:3:1], [0:4]}`
    Slice,
    /// `0_0_0x2_2_1`
    Padding,
    /// `{size=3x3 stride=2x2 pad=1_1x1_1}`
    Window,
    /// `b01f_01io->b01f`
    DimLabels,
    /// `{{0,1},{2,3}}`, `[2,4]<=[8]`, `mesh[...] {...}`
    ReplicaGroups,
    /// `{f32[2]{0}, s32[]}`
    Shapes,
    Shape,
    /// Kept verbatim: a braced block or a quoted string (`backend_config`, `metadata`, ...).
    Raw,
}

macro_rules! attr_keys {
    ($( $variant:ident, $name:literal, $kind:ident; )*) => {
        /// A known attribute name.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum AttrKey { $($variant,)* Unknown }

        impl AttrKey {
            pub fn name(self) -> &'static str {
                match self { $(AttrKey::$variant => $name,)* AttrKey::Unknown => "<unknown>" }
            }
            pub fn from_name(name: &str) -> AttrKey {
                match name { $($name => AttrKey::$variant,)* _ => AttrKey::Unknown }
            }
            /// The value syntax for this key (`Raw` for unknown keys).
            pub fn kind(self) -> ValueKind {
                match self { $(AttrKey::$variant => ValueKind::$kind,)* AttrKey::Unknown => ValueKind::Raw }
            }
        }
    };
}

attr_keys! {
    Algorithm, "algorithm", Ident;
    ApiVersion, "api_version", Ident;
    AsyncExecutionThread, "async_execution_thread", Str;
    BackendConfig, "backend_config", Raw;
    BatchGroupCount, "batch_group_count", Int;
    Body, "body", Computation;
    BranchComputations, "branch_computations", Computations;
    Calls, "calls", Computation;
    CalledComputations, "called_computations", Computations;
    ChannelId, "channel_id", Int;
    CollapsedSliceDims, "collapsed_slice_dims", Ints;
    CompareType, "type", Ident;
    Condition, "condition", Computation;
    ConstrainLayout, "constrain_layout", Bool;
    ConvolutionKind, "convolution_kind", Ident;
    CrossProgramPrefetchIndex, "cross_program_prefetch_index", Int;
    CustomCallHasSideEffect, "custom_call_has_side_effect", Bool;
    CustomCallSchedule, "schedule", Ident;
    CustomCallTarget, "custom_call_target", Str;
    Delta, "delta", Int;
    DimLabels, "dim_labels", DimLabels;
    Dimensions, "dimensions", Ints;
    Direction, "direction", Ident;
    Distribution, "distribution", Ident;
    Domain, "domain", Raw;
    DynamicSliceSizes, "dynamic_slice_sizes", Ints;
    Epsilon, "epsilon", Float;
    ExponentBits, "exponent_bits", Int;
    FalseComputation, "false_computation", Computation;
    FeatureGroupCount, "feature_group_count", Int;
    FeatureIndex, "feature_index", Int;
    FftLength, "fft_length", Ints;
    FftType, "fft_type", Ident;
    FrontendAttributes, "frontend_attributes", Raw;
    FusionKind, "kind", Ident;
    HasDynamicRoot, "has_dynamic_root", Bool;
    Index, "index", Int;
    IndexVectorDim, "index_vector_dim", Int;
    IndicesAreSorted, "indices_are_sorted", Bool;
    InferredDimension, "inferred_dimension", Int;
    InfeedConfig, "infeed_config", Str;
    InputBatchingDims, "input_batching_dims", Ints;
    InsertedWindowDims, "inserted_window_dims", Ints;
    IotaDimension, "iota_dimension", Int;
    IsAssociative, "is_associative", Bool;
    IsComposite, "is_composite", Bool;
    IsHostTransfer, "is_host_transfer", Bool;
    IsReverse, "is_reverse", Bool;
    IsStable, "is_stable", Bool;
    K, "k", Int;
    Largest, "largest", Bool;
    LeftSide, "left_side", Bool;
    LhsBatchDims, "lhs_batch_dims", Ints;
    LhsContractingDims, "lhs_contracting_dims", Ints;
    LhsRaggedDims, "lhs_ragged_dims", Ints;
    Literal, "literal", Raw;
    Lower, "lower", Bool;
    MantissaBits, "mantissa_bits", Int;
    Metadata, "metadata", Raw;
    Mode, "mode", Ident;
    NumCarries, "num_carries", Int;
    OffsetDims, "offset_dims", Ints;
    OperandBatchingDims, "operand_batching_dims", Ints;
    OperandLayoutConstraints, "operand_layout_constraints", Shapes;
    OperandPrecision, "operand_precision", Idents;
    Origin, "origin", Raw;
    OutfeedConfig, "outfeed_config", Str;
    OutfeedShape, "outfeed_shape", Shape;
    OutputToOperandAliasing, "output_to_operand_aliasing", Raw;
    Padding, "padding", Padding;
    PaddingType, "padding_type", Ident;
    ParameterReplication, "parameter_replication", Bools;
    ReplicaGroups, "replica_groups", ReplicaGroups;
    ResultAccuracy, "result_accuracy", Raw;
    RhsBatchDims, "rhs_batch_dims", Ints;
    RhsContractingDims, "rhs_contracting_dims", Ints;
    RhsGroupDims, "rhs_group_dims", Ints;
    ScatterDimsToOperandDims, "scatter_dims_to_operand_dims", Ints;
    ScatterIndicesBatchingDims, "scatter_indices_batching_dims", Ints;
    ScatterComputation, "scatter", Computation;
    SelectComputation, "select", Computation;
    Slice, "slice", Slice;
    SliceSizes, "slice_sizes", IntsOrLists;
    SourceTargetPairs, "source_target_pairs", IntLists;
    SparsityConfig, "sparsity_config", Raw;
    StartIndexMap, "start_index_map", Ints;
    StartIndicesBatchingDims, "start_indices_batching_dims", Ints;
    Statistics, "statistics", Raw;
    ToApply, "to_apply", Computation;
    TransposeA, "transpose_a", Ident;
    TrueComputation, "true_computation", Computation;
    UniqueIndices, "unique_indices", Bool;
    UnitDiagonal, "unit_diagonal", Bool;
    UpdateWindowDims, "update_window_dims", Ints;
    UseGlobalDeviceIds, "use_global_device_ids", Bool;
    Window, "window", Window;
}

impl AttrKey {
    /// Attributes printed after the sharding (XLA prints these last).
    pub fn is_trailing(self) -> bool {
        matches!(
            self,
            AttrKey::FrontendAttributes
                | AttrKey::Statistics
                | AttrKey::Origin
                | AttrKey::Metadata
                | AttrKey::BackendConfig
        )
    }
}

/// A typed attribute value.
#[derive(Clone, Debug, PartialEq)]
pub enum AttrValue {
    Int(i64),
    Float(f64),
    Bool(bool),
    Ident(String),
    /// The string's contents, unescaped.
    Str(String),
    Ints(Vec<i64>),
    IntLists(Vec<Vec<i64>>),
    Bools(Vec<bool>),
    Idents(Vec<String>),
    Computation(CompId),
    Computations(Vec<CompId>),
    Slice(Vec<SliceDim>),
    Padding(Vec<PaddingDim>),
    // The large values are boxed, so that an attribute (most are small:
    // ints, names, metadata text) takes 64 bytes rather than 168.
    Window(Box<Window>),
    DimLabels(Box<ConvDimensionNumbers>),
    ReplicaGroups(Box<CollectiveDeviceList>),
    Shapes(Vec<Shape>),
    Shape(Box<Shape>),
    /// Verbatim source text of the value (braces or quotes included),
    /// shared: metadata text is the bulk of an instruction's attributes, and
    /// the passes copy instructions (inlining, partitioning) without
    /// changing it.
    Raw(Arc<str>),
    /// An attribute the table does not know: its name and verbatim value.
    Unknown {
        name: String,
        text: String,
    },
}

/// One `key=value` attribute of an instruction.
#[derive(Clone, Debug, PartialEq)]
pub struct Attribute {
    pub key: AttrKey,
    pub value: AttrValue,
}

/// One dimension of a `slice={[start:limit:stride], ...}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SliceDim {
    pub start: i64,
    pub limit: i64,
    pub stride: i64,
}

/// One dimension of a pad's `padding=lo_hi_interior`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct PaddingDim {
    pub low: i64,
    pub high: i64,
    pub interior: i64,
}

/// One spatial dimension of a window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WindowDim {
    pub size: i64,
    pub stride: i64,
    pub padding_low: i64,
    pub padding_high: i64,
    pub lhs_dilation: i64,
    pub rhs_dilation: i64,
    pub reversal: bool,
}

impl Default for WindowDim {
    fn default() -> Self {
        WindowDim {
            size: 1,
            stride: 1,
            padding_low: 0,
            padding_high: 0,
            lhs_dilation: 1,
            rhs_dilation: 1,
            reversal: false,
        }
    }
}

/// A window (`reduce-window`, `convolution`, `select-and-scatter`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Window {
    pub dims: Vec<WindowDim>,
}

/// Convolution dimension numbers, as written by `dim_labels=b01f_01io->b01f`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct ConvDimensionNumbers {
    pub input_batch: i64,
    pub input_feature: i64,
    pub input_spatial: Vec<i64>,
    pub kernel_input_feature: i64,
    pub kernel_output_feature: i64,
    pub kernel_spatial: Vec<i64>,
    pub output_batch: i64,
    pub output_feature: i64,
    pub output_spatial: Vec<i64>,
}

/// Dot dimension numbers, gathered from the four `*_dims` attributes.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct DotDimensionNumbers {
    pub lhs_batch: Vec<i64>,
    pub rhs_batch: Vec<i64>,
    pub lhs_contracting: Vec<i64>,
    pub rhs_contracting: Vec<i64>,
}

/// Gather dimension numbers.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct GatherDimensionNumbers {
    pub offset_dims: Vec<i64>,
    pub collapsed_slice_dims: Vec<i64>,
    pub start_index_map: Vec<i64>,
    pub index_vector_dim: i64,
    pub operand_batching_dims: Vec<i64>,
    pub start_indices_batching_dims: Vec<i64>,
}

/// Scatter dimension numbers.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct ScatterDimensionNumbers {
    pub update_window_dims: Vec<i64>,
    pub inserted_window_dims: Vec<i64>,
    pub scatter_dims_to_operand_dims: Vec<i64>,
    pub index_vector_dim: i64,
    pub input_batching_dims: Vec<i64>,
    pub scatter_indices_batching_dims: Vec<i64>,
}

/// Writes a string literal with the escapes XLA's `CEscape` uses.
pub fn write_escaped(f: &mut impl fmt::Write, s: &str) -> fmt::Result {
    f.write_char('"')?;
    for c in s.chars() {
        match c {
            '"' => f.write_str("\\\"")?,
            '\\' => f.write_str("\\\\")?,
            '\n' => f.write_str("\\n")?,
            '\t' => f.write_str("\\t")?,
            '\r' => f.write_str("\\r")?,
            '\'' => f.write_str("\\'")?,
            c if (c as u32) < 0x20 || c as u32 == 0x7f => write!(f, "\\{:03o}", c as u32)?,
            c => f.write_char(c)?,
        }
    }
    f.write_char('"')
}

impl fmt::Display for Window {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("{")?;
        if !self.dims.is_empty() {
            let join = |f: &mut fmt::Formatter<'_>, get: &dyn Fn(&WindowDim) -> String| {
                let parts: Vec<String> = self.dims.iter().map(get).collect();
                f.write_str(&parts.join("x"))
            };
            f.write_str("size=")?;
            join(f, &|d| d.size.to_string())?;
            if self.dims.iter().any(|d| d.stride != 1) {
                f.write_str(" stride=")?;
                join(f, &|d| d.stride.to_string())?;
            }
            if self
                .dims
                .iter()
                .any(|d| d.padding_low != 0 || d.padding_high != 0)
            {
                f.write_str(" pad=")?;
                join(f, &|d| format!("{}_{}", d.padding_low, d.padding_high))?;
            }
            if self.dims.iter().any(|d| d.lhs_dilation != 1) {
                f.write_str(" lhs_dilate=")?;
                join(f, &|d| d.lhs_dilation.to_string())?;
            }
            if self.dims.iter().any(|d| d.rhs_dilation != 1) {
                f.write_str(" rhs_dilate=")?;
                join(f, &|d| d.rhs_dilation.to_string())?;
            }
            if self.dims.iter().any(|d| d.reversal) {
                f.write_str(" rhs_reversal=")?;
                join(f, &|d| (d.reversal as i32).to_string())?;
            }
        }
        f.write_str("}")
    }
}

impl ConvDimensionNumbers {
    /// One operand's labels: as many as the largest dimension named needs
    /// (`rank` at least), `?` for a dimension the numbers do not name (XLA's
    /// printer writes the same; a trailing `?` of the text is not kept).
    fn labels(rank: usize, first: (i64, char), second: (i64, char), spatial: &[i64]) -> String {
        const MAX_LABELS: i64 = 64;
        let named = spatial.iter().chain([&first.0, &second.0]).copied();
        let needed = named.filter(|&d| d < MAX_LABELS).max().map_or(0, |d| d + 1);
        let mut chars = vec!['?'; rank.max(needed.max(0) as usize)];
        let mut put = |d: i64, c: char| {
            if let Some(slot) = usize::try_from(d).ok().and_then(|d| chars.get_mut(d)) {
                *slot = c;
            }
        };
        put(first.0, first.1);
        put(second.0, second.1);
        for (i, &d) in spatial.iter().enumerate() {
            put(d, char::from_digit(i as u32 % 10, 10).unwrap_or('?'));
        }
        chars.into_iter().collect()
    }
}

impl fmt::Display for ConvDimensionNumbers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.input_spatial.len() + 2;
        let lhs = Self::labels(
            n,
            (self.input_batch, 'b'),
            (self.input_feature, 'f'),
            &self.input_spatial,
        );
        let rhs = Self::labels(
            self.kernel_spatial.len() + 2,
            (self.kernel_input_feature, 'i'),
            (self.kernel_output_feature, 'o'),
            &self.kernel_spatial,
        );
        let out = Self::labels(
            self.output_spatial.len() + 2,
            (self.output_batch, 'b'),
            (self.output_feature, 'f'),
            &self.output_spatial,
        );
        write!(f, "{lhs}_{rhs}->{out}")
    }
}

fn write_ints(f: &mut fmt::Formatter<'_>, v: &[i64]) -> fmt::Result {
    f.write_str("{")?;
    crate::shape::write_joined(f, v, ",")?;
    f.write_str("}")
}

impl AttrValue {
    /// Writes the value in HLO text; computation ids are named through `comp_name`.
    pub fn write(
        &self,
        f: &mut fmt::Formatter<'_>,
        comp_name: &dyn Fn(CompId) -> String,
    ) -> fmt::Result {
        match self {
            AttrValue::Int(v) => write!(f, "{v}"),
            AttrValue::Float(v) => {
                f.write_str(&crate::float::format_float(*v, 15, 17, |p| p == *v))
            }
            AttrValue::Bool(v) => write!(f, "{v}"),
            AttrValue::Ident(s) => f.write_str(s),
            AttrValue::Str(s) => write_escaped(f, s),
            AttrValue::Ints(v) => write_ints(f, v),
            AttrValue::IntLists(lists) => {
                f.write_str("{")?;
                for (i, l) in lists.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write_ints(f, l)?;
                }
                f.write_str("}")
            }
            AttrValue::Bools(v) => {
                f.write_str("{")?;
                crate::shape::write_joined(f, v, ",")?;
                f.write_str("}")
            }
            AttrValue::Idents(v) => {
                f.write_str("{")?;
                crate::shape::write_joined(f, v, ",")?;
                f.write_str("}")
            }
            AttrValue::Computation(c) => write!(f, "%{}", comp_name(*c)),
            AttrValue::Computations(cs) => {
                f.write_str("{")?;
                for (i, c) in cs.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "%{}", comp_name(*c))?;
                }
                f.write_str("}")
            }
            AttrValue::Slice(dims) => {
                f.write_str("{")?;
                for (i, d) in dims.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    if d.stride == 1 {
                        write!(f, "[{}:{}]", d.start, d.limit)?;
                    } else {
                        write!(f, "[{}:{}:{}]", d.start, d.limit, d.stride)?;
                    }
                }
                f.write_str("}")
            }
            AttrValue::Padding(dims) => {
                for (i, d) in dims.iter().enumerate() {
                    if i > 0 {
                        f.write_str("x")?;
                    }
                    if d.interior == 0 {
                        write!(f, "{}_{}", d.low, d.high)?;
                    } else {
                        write!(f, "{}_{}_{}", d.low, d.high, d.interior)?;
                    }
                }
                Ok(())
            }
            AttrValue::Window(w) => write!(f, "{w}"),
            AttrValue::DimLabels(d) => write!(f, "{d}"),
            AttrValue::ReplicaGroups(g) => write!(f, "{g}"),
            AttrValue::Shapes(shapes) => {
                f.write_str("{")?;
                crate::shape::write_joined(f, shapes, ", ")?;
                f.write_str("}")
            }
            AttrValue::Shape(s) => write!(f, "{s}"),
            AttrValue::Raw(text) => f.write_str(text),
            AttrValue::Unknown { text, .. } => f.write_str(text),
        }
    }
}
