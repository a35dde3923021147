//! Shape inference: the result shape XLA's `ShapeInference` gives an
//! instruction from its opcode, operand shapes and attributes. The parser uses
//! it for instructions written without a shape; the verifier checks every
//! instruction's declared shape against it.
//!
//! Two kinds of failure are kept apart ([`InferError`]): `NotInferable` when
//! XLA itself needs the written shape (`convert`, `reshape`, `iota`,
//! `custom-call`, async starts, ...), and `Invalid` when the operands or
//! attributes admit no shape at all (mismatched dimensions, out-of-range
//! dimension numbers, ...). The verifier reports only the second kind.
//!
//! Conventions:
//! - Results carry no layout, except where the result *is* an operand's shape
//!   (unary elementwise ops, `reverse`, `dynamic-update-slice`, `tuple`,
//!   `get-tuple-element`, `while`, ...), where the operand's layout is kept.
//! - `broadcast` follows XLA's parser: a shapeless `broadcast(x),
//!   dimensions={d...}` infers `d... ++ dims(x)` (`InferBroadcastShape`); the
//!   verifier checks written broadcasts separately.
//! - `dot`/`convolution` take their result element type from
//!   `preferred_element_type` when given (the written shape's type), subject to
//!   XLA's rule that an integer result may not be narrower than its operands.
//! - Operands with unbounded (`?`) dimensions give `NotInferable`.
//!
//! Invariant: never panics, on any input; all size arithmetic is checked.

use crate::attrs::{AttrKey, AttrValue, Window};
use crate::module::{CompId, HloComputation, HloInstruction, HloModule};
use crate::opcode::{Category, Opcode};
use crate::primitive_type::PrimitiveType;
use crate::replica_groups::CollectiveDeviceList;
use crate::shape::{ArrayShape, Shape, UNBOUNDED};
use std::fmt;

/// Why a shape could not be inferred.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InferError {
    /// XLA cannot infer this instruction's shape: it must be written.
    NotInferable(String),
    /// The operands or attributes are inconsistent: no result shape is valid.
    Invalid(String),
}

impl InferError {
    pub fn message(&self) -> &str {
        match self {
            InferError::NotInferable(m) | InferError::Invalid(m) => m,
        }
    }
    pub fn is_invalid(&self) -> bool {
        matches!(self, InferError::Invalid(_))
    }
}

impl fmt::Display for InferError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

type R<T> = Result<T, InferError>;

macro_rules! invalid {
    ($($arg:tt)*) => { return Err(InferError::Invalid(format!($($arg)*))) };
}

fn not_inferable<T>(what: impl Into<String>) -> R<T> {
    Err(InferError::NotInferable(what.into()))
}

/// Infers `instr`'s result shape. `operand_shapes` are the shapes of its
/// operands in order; `computations` (indexable by `CompId`) supply called
/// computations; `module`, when given, supplies the replica and partition
/// counts collectives with empty replica groups need. `instr.shape` is not
/// read.
pub fn infer_shape(
    module: Option<&HloModule>,
    computations: &[HloComputation],
    instr: &HloInstruction,
    operand_shapes: &[&Shape],
) -> Result<Shape, String> {
    infer_shape_detailed(module, computations, instr, operand_shapes, None).map_err(|e| match e {
        InferError::NotInferable(m) => format!("cannot infer the shape of {}: {m}", instr.opcode),
        InferError::Invalid(m) => m,
    })
}

/// Like [`infer_shape`], keeping the kind of failure, with the
/// `preferred_element_type` of `dot`/`convolution`-like ops (normally the
/// written result's element type).
pub fn infer_shape_detailed(
    module: Option<&HloModule>,
    computations: &[HloComputation],
    instr: &HloInstruction,
    operand_shapes: &[&Shape],
    preferred_element_type: Option<PrimitiveType>,
) -> R<Shape> {
    infer_shape_as(
        instr.opcode,
        module,
        computations,
        instr,
        operand_shapes,
        preferred_element_type,
    )
}

/// Infers the shape `instr` would have with opcode `opcode` (used for the op
/// wrapped by a sugared async start, whose attributes live on the start).
pub fn infer_shape_as(
    opcode: Opcode,
    module: Option<&HloModule>,
    computations: &[HloComputation],
    instr: &HloInstruction,
    operand_shapes: &[&Shape],
    preferred_element_type: Option<PrimitiveType>,
) -> R<Shape> {
    let cx = Cx {
        module,
        comps: computations,
        instr,
        ops: operand_shapes,
        preferred: preferred_element_type,
    };
    if operand_shapes.iter().any(|s| has_unbounded(s)) {
        return not_inferable("an operand has an unbounded dimension");
    }
    infer(opcode, &cx)
}

struct Cx<'a> {
    module: Option<&'a HloModule>,
    comps: &'a [HloComputation],
    instr: &'a HloInstruction,
    ops: &'a [&'a Shape],
    preferred: Option<PrimitiveType>,
}

fn has_unbounded(s: &Shape) -> bool {
    match s {
        Shape::Array(a) => a.dims.contains(&UNBOUNDED),
        Shape::Tuple(e) => e.iter().any(has_unbounded),
        Shape::Buffer(b) => has_unbounded(b),
    }
}

impl<'a> Cx<'a> {
    fn op(&self, i: usize) -> R<&'a Shape> {
        match self.ops.get(i) {
            Some(s) => Ok(s),
            None => invalid!("{} expects an operand {i}", self.instr.opcode),
        }
    }
    /// Operand `i` as a data array (not a tuple, token or buffer).
    fn array(&self, i: usize) -> R<&'a ArrayShape> {
        as_array(self.op(i)?, i)
    }
    fn exact_operands(&self, n: usize) -> R<()> {
        if self.ops.len() != n {
            invalid!(
                "{} expects {n} operand(s), got {}",
                self.instr.opcode,
                self.ops.len()
            );
        }
        Ok(())
    }
    fn ints(&self, key: AttrKey) -> &'a [i64] {
        self.instr.ints_attr(key).unwrap_or(&[])
    }
    fn comp(&self, id: CompId) -> R<&'a HloComputation> {
        match self.comps.get(id.index()) {
            Some(c) => Ok(c),
            None => invalid!("called computation {id} does not exist"),
        }
    }
    fn comp_root_shape(&self, key: AttrKey) -> R<&'a Shape> {
        let Some(id) = self.instr.computation_attr(key) else {
            invalid!("{} needs {}=", self.instr.opcode, key.name());
        };
        root_shape(self.comp(id)?)
    }
}

fn root_shape(c: &HloComputation) -> R<&Shape> {
    match c.instructions.get(c.root.index()) {
        Some(r) => Ok(&r.shape),
        None => invalid!("computation {} has no root instruction", c.name),
    }
}

fn as_array(s: &Shape, i: usize) -> R<&ArrayShape> {
    match s {
        Shape::Array(a) if a.element_type.is_array_type() => Ok(a),
        Shape::Buffer(_) => not_inferable("buffer-shaped operand"),
        other => invalid!("operand {i} must be an array, got {other}"),
    }
}

fn array_shape(ty: PrimitiveType, dims: Vec<i64>) -> Shape {
    Shape::Array(ArrayShape::new(ty, dims))
}

/// Array with the given dims and the dynamic flags of `like` where the
/// dimensions line up one to one.
fn array_like_dynamic(ty: PrimitiveType, dims: Vec<i64>, dynamic: Vec<bool>) -> Shape {
    let dynamic = if dynamic.iter().any(|&d| d) && dynamic.len() == dims.len() {
        dynamic
    } else {
        Vec::new()
    };
    Shape::Array(ArrayShape {
        element_type: ty,
        dims,
        dynamic,
        layout: None,
    })
}

fn to_i64(v: i128, what: &str) -> R<i64> {
    match i64::try_from(v) {
        Ok(x) => Ok(x),
        Err(_) => invalid!("{what} overflows"),
    }
}

/// A dimension number checked against a rank.
fn dim_index(d: i64, rank: usize, what: &str) -> R<usize> {
    match usize::try_from(d) {
        Ok(u) if u < rank => Ok(u),
        _ => invalid!("{what} {d} is out of range for rank {rank}"),
    }
}

fn check_unique(dims: &[i64], what: &str) -> R<()> {
    for (i, d) in dims.iter().enumerate() {
        if dims[..i].contains(d) {
            invalid!("{what} has duplicate dimension {d}");
        }
    }
    Ok(())
}

fn complex_component(ty: PrimitiveType) -> Option<PrimitiveType> {
    match ty {
        PrimitiveType::C64 => Some(PrimitiveType::F32),
        PrimitiveType::C128 => Some(PrimitiveType::F64),
        _ => None,
    }
}

/// XLA's `HigherPrecisionElementType`.
fn higher_precision(a: PrimitiveType, b: PrimitiveType) -> PrimitiveType {
    if a == b {
        return a;
    }
    let fa = a.is_float() || a.is_complex();
    let fb = b.is_float() || b.is_complex();
    if fa != fb {
        return if fa { a } else { b };
    }
    if b.bit_width() > a.bit_width() {
        b
    } else {
        a
    }
}

/// XLA's `MaybeUpcast`: the result type of a dot/convolution.
fn maybe_upcast(from: PrimitiveType, preferred: Option<PrimitiveType>) -> R<PrimitiveType> {
    match preferred {
        None => Ok(from),
        Some(p) if p == from => Ok(from),
        Some(p) => {
            if !(from.is_float() || from.is_complex())
                && p.is_integer()
                && p.bit_width() < from.bit_width()
            {
                invalid!("preferred element type {p} is narrower than the operand type {from}");
            }
            if !p.is_array_type() {
                invalid!("preferred element type {p} is not a data type");
            }
            Ok(p)
        }
    }
}

/// The size of a windowed dimension (XLA's `InferWindowOutputShape`).
pub fn window_output_size(base: i64, d: &crate::attrs::WindowDim) -> Result<i64, String> {
    if d.size <= 0 {
        return Err(format!("window size {} must be positive", d.size));
    }
    if d.stride <= 0 {
        return Err(format!("window stride {} must be positive", d.stride));
    }
    if d.lhs_dilation <= 0 || d.rhs_dilation <= 0 {
        return Err("window dilations must be positive".into());
    }
    if base < 0 {
        return Err(format!("negative dimension {base}"));
    }
    let dilated = |bound: i64, dil: i64| -> i128 {
        if bound == 0 {
            0
        } else {
            (bound as i128 - 1) * dil as i128 + 1
        }
    };
    let padded = d.padding_low as i128 + dilated(base, d.lhs_dilation) + d.padding_high as i128;
    let window = dilated(d.size, d.rhs_dilation);
    if padded < 0 {
        return Err(format!(
            "padded dimension {padded} is negative (base {base}, padding {}_{})",
            d.padding_low, d.padding_high
        ));
    }
    let out = if window > padded {
        0
    } else {
        (padded - window) / d.stride as i128 + 1
    };
    i64::try_from(out).map_err(|_| "window output size overflows".to_string())
}

fn window_shape(dims: &[i64], window: &Window) -> R<Vec<i64>> {
    if window.dims.len() != dims.len() {
        invalid!(
            "window has {} dimensions but the operand has rank {}",
            window.dims.len(),
            dims.len()
        );
    }
    let mut out = Vec::with_capacity(dims.len());
    for (i, (&b, w)) in dims.iter().zip(&window.dims).enumerate() {
        match window_output_size(b, w) {
            Ok(s) => out.push(s),
            Err(e) => invalid!("window dimension {i}: {e}"),
        }
    }
    Ok(out)
}

/// The collective's group mode, as XLA's `GetCollectiveOpGroupMode` decides it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupMode {
    CrossReplica,
    CrossPartition,
    CrossReplicaAndPartition,
    FlattenedId,
}

/// Group mode of a collective instruction (`opcode` is the collective it performs).
pub fn group_mode(instr: &HloInstruction, opcode: Opcode) -> Result<GroupMode, String> {
    let has_channel = instr.channel_id().is_some();
    // Ops that carry use_global_device_ids hold a bool that defaults to false.
    let carries_flag = matches!(
        opcode,
        Opcode::AllReduce
            | Opcode::AllReduceStart
            | Opcode::AllGather
            | Opcode::AllGatherStart
            | Opcode::ReduceScatter
    );
    let flag = instr.bool_attr(AttrKey::UseGlobalDeviceIds);
    let flag = if carries_flag {
        Some(flag.unwrap_or(false))
    } else {
        flag
    };
    match (has_channel, flag) {
        (false, Some(true)) => Err("use_global_device_ids=true requires a channel_id".into()),
        (false, _) => Ok(GroupMode::CrossReplica),
        (true, None) => Ok(GroupMode::CrossPartition),
        (true, Some(false)) => Ok(GroupMode::CrossReplicaAndPartition),
        (true, Some(true)) => Ok(GroupMode::FlattenedId),
    }
}

/// Size of the first replica group as written, without expanding the list;
/// `None` when the groups are empty or absent. Errors on malformed lists.
pub fn written_group_size(groups: Option<&CollectiveDeviceList>) -> Result<Option<i64>, String> {
    match groups {
        None => Ok(None),
        Some(CollectiveDeviceList::Explicit(g)) => Ok(g.first().map(|g| g.len() as i64)),
        Some(CollectiveDeviceList::Iota {
            num_groups,
            group_size,
            reshape_dims,
            perm,
        }) => {
            if *num_groups <= 0 || *group_size <= 0 {
                return Err(format!(
                    "iota replica groups [{num_groups},{group_size}] must be positive"
                ));
            }
            let total = checked_product(reshape_dims)
                .ok_or_else(|| "iota replica groups: bad reshape dimensions".to_string())?;
            if (*num_groups as i128) * (*group_size as i128) != total as i128 {
                return Err(format!(
                    "iota replica groups [{num_groups},{group_size}] do not cover the {total} devices of the reshape"
                ));
            }
            if !perm.is_empty() && !is_permutation(perm, reshape_dims.len()) {
                return Err("iota replica groups: transpose is not a permutation".into());
            }
            Ok(Some(*group_size))
        }
        Some(CollectiveDeviceList::MeshAxes { mesh, axes }) => {
            let mut size: i64 = 1;
            for (name, s) in &mesh.axes {
                if *s <= 0 {
                    return Err(format!("mesh axis '{name}' has non-positive size {s}"));
                }
            }
            for a in axes {
                let Some(total) = mesh.axis_size(&a.name) else {
                    return Err(format!(
                        "replica groups name unknown mesh axis '{}'",
                        a.name
                    ));
                };
                let s = match a.sub_axis {
                    None => total,
                    Some((pre, sub)) => {
                        let ok = pre > 0
                            && sub > 0
                            && (pre as i128 * sub as i128) <= total as i128
                            && total % (pre * sub) == 0;
                        if !ok {
                            return Err(format!(
                                "sub-axis '{}':({pre}){sub} does not divide the axis of size {total}",
                                a.name
                            ));
                        }
                        sub
                    }
                };
                size = size
                    .checked_mul(s)
                    .ok_or_else(|| "replica group size overflows".to_string())?;
            }
            Ok(Some(size))
        }
    }
}

/// Product of positive dimensions, `None` if one is non-positive or it overflows.
pub fn checked_product(dims: &[i64]) -> Option<i64> {
    let mut p: i64 = 1;
    for &d in dims {
        if d <= 0 {
            return None;
        }
        p = p.checked_mul(d)?;
    }
    Some(p)
}

/// True when `perm` is a permutation of `0..n`.
pub fn is_permutation(perm: &[i64], n: usize) -> bool {
    if perm.len() != n {
        return false;
    }
    let mut seen = vec![false; n];
    for &p in perm {
        match usize::try_from(p) {
            Ok(u) if u < n && !seen[u] => seen[u] = true,
            _ => return false,
        }
    }
    true
}

/// Number of participants in each group of a collective (XLA's
/// `GetSubgroupSize`). `Ok(None)` when the groups are empty and no module
/// supplies the replica and partition counts.
pub fn collective_group_size(
    module: Option<&HloModule>,
    instr: &HloInstruction,
    opcode: Opcode,
) -> Result<Option<i64>, String> {
    let mode = group_mode(instr, opcode)?;
    let written = written_group_size(instr.replica_groups())?;
    let (replicas, partitions) = match module {
        Some(m) => (Some(m.replica_count()), Some(m.num_partitions())),
        None => (None, None),
    };
    let size = match mode {
        GroupMode::CrossReplica => written.or(replicas),
        GroupMode::CrossReplicaAndPartition => match (written.or(replicas), partitions) {
            (Some(r), Some(p)) => r.checked_mul(p),
            (Some(r), None) if module.is_none() => Some(r),
            _ => None,
        },
        GroupMode::FlattenedId => match written {
            Some(w) => Some(w),
            None => {
                return Err(
                    "empty replica groups are not allowed with use_global_device_ids=true".into(),
                )
            }
        },
        GroupMode::CrossPartition => written.or(partitions),
    };
    match size {
        Some(s) if s <= 0 => Err(format!("replica group size {s} must be positive")),
        s => Ok(s),
    }
}

fn infer(opcode: Opcode, cx: &Cx) -> R<Shape> {
    use Opcode as O;
    let instr = cx.instr;
    match opcode {
        // Ops that need their written shape.
        O::Convert
        | O::BitcastConvert
        | O::StochasticConvert
        | O::Reshape
        | O::DynamicReshape
        | O::Bitcast
        | O::Iota
        | O::Constant
        | O::Parameter
        | O::CustomCall
        | O::Fusion
        | O::Rng
        | O::RngBitGenerator
        | O::RngGetAndUpdateState
        | O::Infeed
        | O::Recv
        | O::RecvDone
        | O::Send
        | O::SendDone
        | O::AsyncStart
        | O::AllGatherStart
        | O::CollectivePermuteStart
        | O::RaggedDot
        | O::ScaledDot
        | O::Scan
        | O::Shuffle
        | O::CollectiveReduce => not_inferable("the shape must be written"),

        O::Compare
        | O::Complex
        | O::Add
        | O::Subtract
        | O::Multiply
        | O::Divide
        | O::Remainder
        | O::Power
        | O::Atan2
        | O::Maximum
        | O::Minimum
        | O::Mulhi
        | O::And
        | O::Or
        | O::Xor
        | O::ShiftLeft
        | O::ShiftRightArithmetic
        | O::ShiftRightLogical => infer_binary(opcode, cx),
        O::Select => infer_select(cx),
        // Copy takes any shape, tuples included (XLA's `InferUnaryOpShape`).
        O::Copy => {
            cx.exact_operands(1)?;
            Ok(cx.op(0)?.clone())
        }
        O::Clamp => infer_clamp(cx),
        op if op.category() == Category::ElementwiseUnary => infer_unary(op, cx),

        O::Broadcast => {
            cx.exact_operands(1)?;
            let a = cx.array(0)?;
            let mut dims = cx.ints(AttrKey::Dimensions).to_vec();
            if dims.iter().any(|&d| d < 0) {
                invalid!("broadcast sizes must be non-negative");
            }
            dims.extend_from_slice(&a.dims);
            Ok(array_shape(a.element_type, dims))
        }
        O::Transpose => {
            cx.exact_operands(1)?;
            let a = cx.array(0)?;
            let perm = instr.dimensions();
            if !is_permutation(perm, a.rank()) {
                invalid!(
                    "transpose dimensions {:?} are not a permutation of the operand's {} dimensions",
                    perm,
                    a.rank()
                );
            }
            let dims = perm.iter().map(|&p| a.dims[p as usize]).collect();
            let dynamic = perm.iter().map(|&p| a.is_dynamic_dim(p as usize)).collect();
            Ok(array_like_dynamic(a.element_type, dims, dynamic))
        }
        O::Reverse => {
            cx.exact_operands(1)?;
            let a = cx.array(0)?;
            for &d in instr.dimensions() {
                dim_index(d, a.rank(), "reverse dimension")?;
            }
            check_unique(instr.dimensions(), "reverse dimensions")?;
            Ok(Shape::Array(a.clone()))
        }
        O::Slice => infer_slice(cx),
        O::DynamicSlice => infer_dynamic_slice(cx),
        O::DynamicUpdateSlice => infer_dynamic_update_slice(cx),
        O::Pad => infer_pad(cx),
        O::Concatenate => infer_concatenate(cx),
        O::Reduce => infer_reduce(cx),
        O::ReduceWindow => infer_reduce_window(cx),
        O::SelectAndScatter => infer_select_and_scatter(cx),
        O::Dot => infer_dot(cx),
        O::Convolution => infer_convolution(cx),
        O::Gather => infer_gather(cx),
        O::Scatter => infer_scatter(cx),
        O::GetTupleElement => {
            cx.exact_operands(1)?;
            let t = cx.op(0)?;
            let Shape::Tuple(elements) = t else {
                invalid!("get-tuple-element operand must be a tuple, got {t}");
            };
            let Some(index) = instr.int_attr(AttrKey::Index) else {
                invalid!("get-tuple-element needs index=");
            };
            match usize::try_from(index).ok().and_then(|i| elements.get(i)) {
                Some(s) => Ok(s.clone()),
                None => invalid!(
                    "tuple index {index} is out of range for a tuple of {} elements",
                    elements.len()
                ),
            }
        }
        O::Tuple => Ok(Shape::Tuple(cx.ops.iter().map(|s| (*s).clone()).collect())),
        O::While => {
            cx.exact_operands(1)?;
            Ok(cx.op(0)?.clone())
        }
        O::Call => Ok(cx.comp_root_shape(AttrKey::ToApply)?.clone()),
        O::Conditional => {
            let first = if let Some(AttrValue::Computations(cs)) =
                instr.attr(AttrKey::BranchComputations)
            {
                match cs.first() {
                    Some(c) => *c,
                    None => invalid!("conditional has no branch computations"),
                }
            } else if let Some(c) = instr.computation_attr(AttrKey::TrueComputation) {
                c
            } else {
                invalid!("conditional needs branch_computations= or true_computation=");
            };
            Ok(root_shape(cx.comp(first)?)?.clone())
        }
        O::Map => {
            if cx.ops.is_empty() {
                invalid!("map needs at least one operand");
            }
            let a0 = cx.array(0)?;
            for i in 1..cx.ops.len() {
                let a = cx.array(i)?;
                if a.dims != a0.dims {
                    invalid!("map operands must have the same dimensions");
                }
            }
            if let Some(dims) = instr.ints_attr(AttrKey::Dimensions) {
                if !dims.iter().copied().eq(0..a0.rank() as i64) {
                    invalid!("map requires dimensions 0..{}, got {dims:?}", a0.rank());
                }
            }
            let root = cx.comp_root_shape(AttrKey::ToApply)?;
            let Some(r) = root.as_array().filter(|r| r.rank() == 0) else {
                invalid!("map's computation must return a scalar, got {root}");
            };
            Ok(array_shape(r.element_type, a0.dims.clone()))
        }
        O::Sort => {
            if cx.ops.is_empty() {
                invalid!("sort needs at least one operand");
            }
            let a0 = cx.array(0)?;
            for i in 1..cx.ops.len() {
                if cx.array(i)?.dims != a0.dims {
                    invalid!("sort operands must have the same dimensions");
                }
            }
            let dims = instr.dimensions();
            if dims.len() != 1 {
                invalid!("sort needs exactly one dimension, got {dims:?}");
            }
            dim_index(dims[0], a0.rank(), "sort dimension")?;
            Ok(tuple_or_single(cx.ops))
        }
        O::TopK => {
            cx.exact_operands(1)?;
            let a = cx.array(0)?;
            let Some(k) = instr.int_attr(AttrKey::K) else {
                invalid!("topk needs k=");
            };
            let Some(last) = a.dims.last() else {
                invalid!("topk operand must have rank >= 1");
            };
            if k < 0 || k > *last {
                invalid!("topk k={k} is out of range for a last dimension of {last}");
            }
            let mut dims = a.dims.clone();
            if let Some(l) = dims.last_mut() {
                *l = k;
            }
            Ok(Shape::Tuple(vec![
                array_shape(a.element_type, dims.clone()),
                array_shape(PrimitiveType::S32, dims),
            ]))
        }

        O::AllReduce | O::AllReduceStart | O::CollectiveBroadcast => {
            if cx.ops.is_empty() {
                invalid!("{opcode} needs at least one operand");
            }
            for i in 0..cx.ops.len() {
                cx.array(i)?;
            }
            Ok(tuple_or_single(cx.ops))
        }
        O::AllGather | O::ReduceScatter => infer_gather_scatter_collective(opcode, cx),
        O::AllToAll => {
            if cx.ops.is_empty() {
                invalid!("all-to-all needs at least one operand");
            }
            let Some(split) = instr.ints_attr(AttrKey::Dimensions) else {
                return Ok(Shape::Tuple(cx.ops.iter().map(|s| (*s).clone()).collect()));
            };
            if split.len() != 1 {
                invalid!("all-to-all needs exactly one split dimension, got {split:?}");
            }
            let size =
                collective_group_size(cx.module, instr, opcode).map_err(InferError::Invalid)?;
            for i in 0..cx.ops.len() {
                let a = cx.array(i)?;
                let d = dim_index(split[0], a.rank(), "all-to-all split dimension")?;
                if let Some(n) = size {
                    if a.dims[d] % n != 0 {
                        invalid!(
                            "all-to-all split dimension size {} is not divisible by the group size {n}",
                            a.dims[d]
                        );
                    }
                }
            }
            Ok(tuple_or_single(cx.ops))
        }
        O::CollectivePermute => {
            if cx.ops.is_empty() {
                invalid!("collective-permute needs at least one operand");
            }
            if instr.has_attr(AttrKey::SliceSizes) || cx.ops.len() == 4 {
                // In-place form: input, output buffer, input and output offsets.
                if cx.ops.len() != 4 {
                    invalid!("in-place collective-permute needs 4 operands");
                }
                return Ok(cx.op(1)?.clone());
            }
            Ok(tuple_or_single(cx.ops))
        }
        O::RaggedAllToAll => {
            cx.exact_operands(6)?;
            Ok(cx.op(1)?.clone())
        }
        O::AllReduceDone => {
            cx.exact_operands(1)?;
            Ok(cx.op(0)?.clone())
        }
        O::AllGatherDone | O::CollectivePermuteDone | O::AsyncDone => {
            cx.exact_operands(1)?;
            match cx.op(0)? {
                Shape::Tuple(e) if e.len() >= 2 => Ok(e[1].clone()),
                _ => not_inferable("the start's shape is not a (operands, output, ...) tuple"),
            }
        }
        O::AsyncUpdate => {
            cx.exact_operands(1)?;
            Ok(cx.op(0)?.clone())
        }
        O::CopyStart => {
            cx.exact_operands(1)?;
            let s = cx.op(0)?.clone();
            Ok(Shape::Tuple(vec![
                s.clone(),
                s,
                Shape::scalar(PrimitiveType::U32),
            ]))
        }
        O::CopyDone => {
            cx.exact_operands(1)?;
            match cx.op(0)? {
                Shape::Tuple(e) if !e.is_empty() => Ok(e[0].clone()),
                other => invalid!("copy-done operand must be a copy-start tuple, got {other}"),
            }
        }
        O::PartitionId | O::ReplicaId => {
            cx.exact_operands(0)?;
            Ok(Shape::scalar(PrimitiveType::U32))
        }
        O::AfterAll => {
            for (i, s) in cx.ops.iter().enumerate() {
                if !s.is_token() {
                    invalid!("after-all operand {i} must be a token, got {s}");
                }
            }
            Ok(Shape::token())
        }
        O::Outfeed => Ok(Shape::token()),
        O::AddDependency => {
            cx.exact_operands(2)?;
            if !cx.op(1)?.is_token() {
                invalid!("add-dependency's second operand must be a token");
            }
            Ok(cx.op(0)?.clone())
        }
        O::OptimizationBarrier | O::Domain => {
            cx.exact_operands(1)?;
            Ok(cx.op(0)?.clone())
        }
        O::GetDimensionSize => {
            cx.exact_operands(1)?;
            let a = cx.array(0)?;
            let dims = instr.dimensions();
            if dims.len() != 1 {
                invalid!("get-dimension-size needs exactly one dimension");
            }
            dim_index(dims[0], a.rank(), "dimension")?;
            Ok(Shape::scalar(PrimitiveType::S32))
        }
        O::SetDimensionSize => {
            cx.exact_operands(2)?;
            let a = cx.array(0)?;
            let size = cx.array(1)?;
            if size.rank() != 0 || !size.element_type.is_integer() {
                invalid!("set-dimension-size's size operand must be an integer scalar");
            }
            let dims = instr.dimensions();
            if dims.len() != 1 {
                invalid!("set-dimension-size needs exactly one dimension");
            }
            let d = dim_index(dims[0], a.rank(), "dimension")?;
            let mut out = a.clone();
            out.layout = None;
            if out.dynamic.len() != out.rank() {
                out.dynamic = vec![false; out.rank()];
            }
            out.dynamic[d] = true;
            Ok(Shape::Array(out))
        }
        O::Cholesky => {
            cx.exact_operands(1)?;
            let a = cx.array(0)?;
            square_minor(a, "cholesky operand")?;
            Ok(Shape::Array(a.clone()))
        }
        O::TriangularSolve => {
            cx.exact_operands(2)?;
            let a = cx.array(0)?;
            let b = cx.array(1)?;
            square_minor(a, "triangular-solve a")?;
            if a.rank() != b.rank() || a.element_type != b.element_type {
                invalid!("triangular-solve operands must have the same rank and element type");
            }
            Ok(Shape::Array(b.clone()))
        }
        O::BatchNormTraining | O::BatchNormGrad | O::BatchNormInference => {
            let a = cx.array(0)?;
            let Some(fi) = instr.int_attr(AttrKey::FeatureIndex) else {
                invalid!("{opcode} needs feature_index=");
            };
            let f = dim_index(fi, a.rank(), "feature_index")?;
            let feature = array_shape(a.element_type, vec![a.dims[f]]);
            if opcode == O::BatchNormInference {
                Ok(Shape::Array(a.clone()))
            } else {
                Ok(Shape::Tuple(vec![
                    Shape::Array(a.clone()),
                    feature.clone(),
                    feature,
                ]))
            }
        }
        O::Fft => infer_fft(cx),
        // Every opcode is covered above; keep the match total for new ones.
        _ => not_inferable("no inference rule"),
    }
}

fn square_minor(a: &ArrayShape, what: &str) -> R<()> {
    let r = a.rank();
    if r < 2 || a.dims[r - 1] != a.dims[r - 2] {
        invalid!("{what} must have square minor dimensions, got {a}");
    }
    Ok(())
}

fn tuple_or_single(ops: &[&Shape]) -> Shape {
    if ops.len() == 1 {
        ops[0].clone()
    } else {
        Shape::Tuple(ops.iter().map(|s| (*s).clone()).collect())
    }
}

fn infer_unary(op: Opcode, cx: &Cx) -> R<Shape> {
    use Opcode as O;
    cx.exact_operands(1)?;
    let a = cx.array(0)?;
    let ty = a.element_type;
    let is_fp = ty.is_float() || ty.is_complex();
    let result_ty = match op {
        O::IsFinite => {
            if !ty.is_float() {
                invalid!("is-finite expects a floating-point operand, got {ty}");
            }
            PrimitiveType::Pred
        }
        O::Real | O::Imag => {
            if let Some(c) = complex_component(ty) {
                c
            } else if ty.is_float() {
                ty
            } else {
                invalid!("{op} expects a floating-point or complex operand, got {ty}");
            }
        }
        O::Abs => complex_component(ty).unwrap_or(ty),
        O::Not => {
            if !(ty == PrimitiveType::Pred || ty.is_integer()) {
                invalid!("not expects a pred or integer operand, got {ty}");
            }
            ty
        }
        O::PopulationCount | O::Clz => {
            if !ty.is_integer() {
                invalid!("{op} expects an integer operand, got {ty}");
            }
            ty
        }
        O::Floor | O::Ceil | O::RoundNearestAfz | O::RoundNearestEven | O::ReducePrecision => {
            if !ty.is_float() {
                invalid!("{op} expects a floating-point operand, got {ty}");
            }
            ty
        }
        O::Exp
        | O::Expm1
        | O::Log
        | O::Log1p
        | O::Logistic
        | O::Sqrt
        | O::Rsqrt
        | O::Cbrt
        | O::Sin
        | O::Cos
        | O::Tan
        | O::Tanh
        | O::Atan
        | O::Erf
        | O::Acos
        | O::Acosh
        | O::Asin
        | O::Asinh
        | O::Atanh
        | O::Cosh
        | O::Sinh => {
            if !is_fp {
                invalid!("{op} expects a floating-point or complex operand, got {ty}");
            }
            ty
        }
        _ => ty,
    };
    let mut out = a.clone();
    out.element_type = result_ty;
    Ok(Shape::Array(out))
}

fn infer_binary(op: Opcode, cx: &Cx) -> R<Shape> {
    cx.exact_operands(2)?;
    let l = cx.array(0)?;
    let r = cx.array(1)?;
    if l.dims != r.dims {
        invalid!(
            "{op} operands must have the same dimensions, got {} and {}",
            Shape::Array(strip(l)),
            Shape::Array(strip(r))
        );
    }
    if l.element_type != r.element_type {
        invalid!(
            "{op} operands must have the same element type, got {} and {}",
            l.element_type,
            r.element_type
        );
    }
    let ty = l.element_type;
    let result_ty = match op {
        Opcode::Compare => PrimitiveType::Pred,
        Opcode::Complex => match ty {
            PrimitiveType::F32 => PrimitiveType::C64,
            PrimitiveType::F64 => PrimitiveType::C128,
            _ => invalid!("complex expects f32 or f64 operands, got {ty}"),
        },
        Opcode::And | Opcode::Or | Opcode::Xor => {
            if !(ty == PrimitiveType::Pred || ty.is_integer()) {
                invalid!("{op} expects pred or integer operands, got {ty}");
            }
            ty
        }
        Opcode::ShiftLeft | Opcode::ShiftRightArithmetic | Opcode::ShiftRightLogical => {
            if !ty.is_integer() {
                invalid!("{op} expects integer operands, got {ty}");
            }
            ty
        }
        _ => ty,
    };
    let dynamic = (0..l.rank())
        .map(|d| l.is_dynamic_dim(d) || r.is_dynamic_dim(d))
        .collect();
    Ok(array_like_dynamic(result_ty, l.dims.clone(), dynamic))
}

fn strip(a: &ArrayShape) -> ArrayShape {
    ArrayShape {
        layout: None,
        ..a.clone()
    }
}

fn infer_select(cx: &Cx) -> R<Shape> {
    cx.exact_operands(3)?;
    let p = cx.array(0)?;
    let t = cx.array(1)?;
    let f = cx.array(2)?;
    if p.element_type != PrimitiveType::Pred {
        invalid!("select's predicate must be pred, got {}", p.element_type);
    }
    if t.dims != f.dims || t.element_type != f.element_type {
        invalid!(
            "select's branches must have the same shape, got {} and {}",
            Shape::Array(strip(t)),
            Shape::Array(strip(f))
        );
    }
    if p.rank() != 0 && p.dims != t.dims {
        invalid!(
            "select's predicate {} must be a scalar or have the branches' dimensions {:?}",
            Shape::Array(strip(p)),
            t.dims
        );
    }
    let dynamic = (0..t.rank())
        .map(|d| t.is_dynamic_dim(d) || f.is_dynamic_dim(d))
        .collect();
    Ok(array_like_dynamic(t.element_type, t.dims.clone(), dynamic))
}

fn infer_clamp(cx: &Cx) -> R<Shape> {
    cx.exact_operands(3)?;
    let lo = cx.array(0)?;
    let x = cx.array(1)?;
    let hi = cx.array(2)?;
    for (b, what) in [(lo, "min"), (hi, "max")] {
        if b.element_type != x.element_type {
            invalid!(
                "clamp {what} has element type {} but the operand has {}",
                b.element_type,
                x.element_type
            );
        }
        if b.rank() != 0 && b.dims != x.dims {
            invalid!("clamp {what} must be a scalar or have the operand's dimensions");
        }
    }
    Ok(Shape::Array(strip(x)))
}

fn infer_slice(cx: &Cx) -> R<Shape> {
    cx.exact_operands(1)?;
    let a = cx.array(0)?;
    let Some(slice) = cx.instr.slice_dims() else {
        invalid!("slice needs slice=");
    };
    if slice.len() != a.rank() {
        invalid!(
            "slice has {} ranges but the operand has rank {}",
            slice.len(),
            a.rank()
        );
    }
    let mut dims = Vec::with_capacity(slice.len());
    for (i, (s, &d)) in slice.iter().zip(&a.dims).enumerate() {
        if s.stride <= 0 {
            invalid!("slice dimension {i}: stride {} must be positive", s.stride);
        }
        if s.start < 0 || s.start > s.limit || s.limit > d {
            invalid!(
                "slice dimension {i}: [{}:{}] is not within [0:{d}]",
                s.start,
                s.limit
            );
        }
        let n = (s.limit as i128 - s.start as i128 + s.stride as i128 - 1) / s.stride as i128;
        dims.push(to_i64(n, "slice size")?);
    }
    Ok(array_shape(a.element_type, dims))
}

/// Checks a dynamic-slice-style list of start indices beginning at operand `first`.
fn check_start_indices(cx: &Cx, first: usize, rank: usize) -> R<()> {
    let n = cx.ops.len().saturating_sub(first);
    let legacy = n == 1 && cx.array(first)?.rank() == 1;
    if legacy {
        // Legacy form: one rank-1 index vector.
        let v = cx.array(first)?;
        if v.dims[0] != rank as i64 || !v.element_type.is_integer() {
            invalid!("start indices vector must be an integer vector of {rank} elements");
        }
        return Ok(());
    }
    if n != rank {
        invalid!("expected {rank} start indices (one per dimension), got {n}");
    }
    let mut ty = None;
    for i in first..cx.ops.len() {
        let s = cx.array(i)?;
        if s.rank() != 0 || !s.element_type.is_integer() {
            invalid!(
                "start index operand {i} must be an integer scalar, got {}",
                Shape::Array(strip(s))
            );
        }
        if *ty.get_or_insert(s.element_type) != s.element_type {
            invalid!("start indices must all have the same type");
        }
    }
    Ok(())
}

fn infer_dynamic_slice(cx: &Cx) -> R<Shape> {
    let a = cx.array(0)?;
    check_start_indices(cx, 1, a.rank())?;
    let Some(sizes) = cx.instr.ints_attr(AttrKey::DynamicSliceSizes) else {
        invalid!("dynamic-slice needs dynamic_slice_sizes=");
    };
    if sizes.len() != a.rank() {
        invalid!(
            "dynamic_slice_sizes has {} entries but the operand has rank {}",
            sizes.len(),
            a.rank()
        );
    }
    for (i, (&s, &d)) in sizes.iter().zip(&a.dims).enumerate() {
        if s < 0 || s > d {
            invalid!("dynamic slice size {s} of dimension {i} is not within [0, {d}]");
        }
    }
    Ok(array_shape(a.element_type, sizes.to_vec()))
}

fn infer_dynamic_update_slice(cx: &Cx) -> R<Shape> {
    let a = cx.array(0)?;
    let u = cx.array(1)?;
    check_start_indices(cx, 2, a.rank())?;
    if u.rank() != a.rank() {
        invalid!(
            "update rank {} does not match the operand rank {}",
            u.rank(),
            a.rank()
        );
    }
    if u.element_type != a.element_type {
        invalid!(
            "update element type {} does not match the operand's {}",
            u.element_type,
            a.element_type
        );
    }
    for (i, (&ud, &d)) in u.dims.iter().zip(&a.dims).enumerate() {
        if ud < 0 || ud > d {
            invalid!("update dimension {i} of size {ud} exceeds the operand's {d}");
        }
    }
    Ok(Shape::Array(a.clone()))
}

fn infer_pad(cx: &Cx) -> R<Shape> {
    cx.exact_operands(2)?;
    let a = cx.array(0)?;
    let v = cx.array(1)?;
    if v.rank() != 0 {
        invalid!("pad value must be a scalar");
    }
    if v.element_type != a.element_type {
        invalid!(
            "pad value type {} does not match the operand's {}",
            v.element_type,
            a.element_type
        );
    }
    let Some(padding) = cx.instr.padding() else {
        invalid!("pad needs padding=");
    };
    if padding.len() != a.rank() {
        invalid!(
            "padding has {} dimensions but the operand has rank {}",
            padding.len(),
            a.rank()
        );
    }
    let mut dims = Vec::with_capacity(a.rank());
    for (i, (p, &d)) in padding.iter().zip(&a.dims).enumerate() {
        if p.interior < 0 {
            invalid!(
                "pad dimension {i}: interior padding {} is negative",
                p.interior
            );
        }
        let n = p.low as i128
            + p.high as i128
            + d as i128
            + (d as i128 - 1).max(0) * p.interior as i128;
        if n < 0 {
            invalid!("pad dimension {i} would have negative size {n}");
        }
        dims.push(to_i64(n, "padded size")?);
    }
    Ok(array_shape(a.element_type, dims))
}

fn infer_concatenate(cx: &Cx) -> R<Shape> {
    if cx.ops.is_empty() {
        invalid!("concatenate needs at least one operand");
    }
    let dims_attr = cx.instr.dimensions();
    if dims_attr.len() != 1 {
        invalid!("concatenate needs exactly one dimension, got {dims_attr:?}");
    }
    let a0 = cx.array(0)?;
    let d = dim_index(dims_attr[0], a0.rank(), "concatenate dimension")?;
    let mut total: i128 = 0;
    for i in 0..cx.ops.len() {
        let a = cx.array(i)?;
        if a.rank() != a0.rank() || a.element_type != a0.element_type {
            invalid!(
                "concatenate operand {i} {} does not match operand 0 {} in rank or element type",
                Shape::Array(strip(a)),
                Shape::Array(strip(a0))
            );
        }
        for (k, (&x, &y)) in a.dims.iter().zip(&a0.dims).enumerate() {
            if k != d && x != y {
                invalid!(
                    "concatenate operand {i} differs from operand 0 in dimension {k} ({x} vs {y})"
                );
            }
        }
        total += a.dims[d] as i128;
    }
    let mut dims = a0.dims.clone();
    dims[d] = to_i64(total, "concatenated size")?;
    Ok(array_shape(a0.element_type, dims))
}

/// Splits reduce-style operands into inputs and init values.
fn inputs_and_inits<'a>(cx: &Cx<'a>) -> R<(Vec<&'a ArrayShape>, Vec<&'a ArrayShape>)> {
    let n = cx.ops.len();
    if n < 2 || n % 2 == 1 {
        invalid!(
            "{} needs N inputs followed by N init values, got {n} operands",
            cx.instr.opcode
        );
    }
    let half = n / 2;
    let mut inputs = Vec::with_capacity(half);
    let mut inits = Vec::with_capacity(half);
    for i in 0..half {
        inputs.push(cx.array(i)?);
    }
    for i in half..n {
        let s = cx.array(i)?;
        if s.rank() != 0 {
            invalid!(
                "init value (operand {i}) must be a scalar, got {}",
                Shape::Array(strip(s))
            );
        }
        inits.push(s);
    }
    for (i, a) in inputs.iter().enumerate().skip(1) {
        if a.dims != inputs[0].dims {
            invalid!(
                "input {i} has dimensions {:?} but input 0 has {:?}",
                a.dims,
                inputs[0].dims
            );
        }
    }
    Ok((inputs, inits))
}

fn infer_reduce(cx: &Cx) -> R<Shape> {
    let (inputs, inits) = inputs_and_inits(cx)?;
    let a0 = inputs[0];
    let dims = cx.instr.dimensions();
    for &d in dims {
        dim_index(d, a0.rank(), "reduce dimension")?;
    }
    check_unique(dims, "reduce dimensions")?;
    let kept: Vec<usize> = (0..a0.rank())
        .filter(|&d| !dims.contains(&(d as i64)))
        .collect();
    let out_dims: Vec<i64> = kept.iter().map(|&d| a0.dims[d]).collect();
    let dynamic: Vec<bool> = kept.iter().map(|&d| a0.is_dynamic_dim(d)).collect();
    let shapes: Vec<Shape> = inits
        .iter()
        .map(|i| array_like_dynamic(i.element_type, out_dims.clone(), dynamic.clone()))
        .collect();
    Ok(single_or_tuple(shapes))
}

fn single_or_tuple(mut shapes: Vec<Shape>) -> Shape {
    if shapes.len() == 1 {
        shapes.remove(0)
    } else {
        Shape::Tuple(shapes)
    }
}

fn infer_reduce_window(cx: &Cx) -> R<Shape> {
    let (inputs, inits) = inputs_and_inits(cx)?;
    let default = Window::default();
    let window = cx.instr.window().unwrap_or(&default);
    let out_dims = window_shape(&inputs[0].dims, window)?;
    let shapes = inits
        .iter()
        .map(|i| array_shape(i.element_type, out_dims.clone()))
        .collect();
    Ok(single_or_tuple(shapes))
}

fn infer_select_and_scatter(cx: &Cx) -> R<Shape> {
    cx.exact_operands(3)?;
    let a = cx.array(0)?;
    let src = cx.array(1)?;
    let init = cx.array(2)?;
    if init.rank() != 0 {
        invalid!("select-and-scatter init value must be a scalar");
    }
    if src.element_type != a.element_type || init.element_type != a.element_type {
        invalid!("select-and-scatter operand, source and init value must share an element type");
    }
    let default = Window::default();
    let window = cx.instr.window().unwrap_or(&default);
    let expected = window_shape(&a.dims, window)?;
    if expected != src.dims {
        invalid!(
            "select-and-scatter source has dimensions {:?} but the window over the operand gives {:?}",
            src.dims,
            expected
        );
    }
    Ok(Shape::Array(a.clone()))
}

fn infer_dot(cx: &Cx) -> R<Shape> {
    if cx.ops.len() < 2 {
        invalid!("dot needs two operands");
    }
    let l = cx.array(0)?;
    let r = cx.array(1)?;
    let dn = cx.instr.dot_dimension_numbers();
    if dn.lhs_batch.len() != dn.rhs_batch.len() {
        invalid!("dot has a different number of lhs and rhs batch dimensions");
    }
    if dn.lhs_contracting.len() != dn.rhs_contracting.len() {
        invalid!("dot has a different number of lhs and rhs contracting dimensions");
    }
    let mut lhs_used: Vec<i64> = dn.lhs_batch.clone();
    lhs_used.extend(&dn.lhs_contracting);
    let mut rhs_used: Vec<i64> = dn.rhs_batch.clone();
    rhs_used.extend(&dn.rhs_contracting);
    check_unique(&lhs_used, "dot lhs batch and contracting dimensions")?;
    check_unique(&rhs_used, "dot rhs batch and contracting dimensions")?;
    for &d in &lhs_used {
        dim_index(d, l.rank(), "dot lhs dimension")?;
    }
    for &d in &rhs_used {
        dim_index(d, r.rank(), "dot rhs dimension")?;
    }
    for (&a, &b) in dn.lhs_batch.iter().zip(&dn.rhs_batch) {
        if l.dims[a as usize] != r.dims[b as usize] {
            invalid!(
                "dot batch dimension sizes differ: lhs dimension {a} is {} but rhs dimension {b} is {}",
                l.dims[a as usize],
                r.dims[b as usize]
            );
        }
    }
    for (&a, &b) in dn.lhs_contracting.iter().zip(&dn.rhs_contracting) {
        if l.dims[a as usize] != r.dims[b as usize] {
            invalid!(
                "dot contracting dimension sizes differ: lhs dimension {a} is {} but rhs dimension {b} is {}",
                l.dims[a as usize],
                r.dims[b as usize]
            );
        }
    }
    let mut dims = Vec::new();
    let mut dynamic = Vec::new();
    for &a in &dn.lhs_batch {
        dims.push(l.dims[a as usize]);
        dynamic.push(l.is_dynamic_dim(a as usize));
    }
    for d in 0..l.rank() {
        if !lhs_used.contains(&(d as i64)) {
            dims.push(l.dims[d]);
            dynamic.push(l.is_dynamic_dim(d));
        }
    }
    for d in 0..r.rank() {
        if !rhs_used.contains(&(d as i64)) {
            dims.push(r.dims[d]);
            dynamic.push(r.is_dynamic_dim(d));
        }
    }
    let ty = maybe_upcast(
        higher_precision(l.element_type, r.element_type),
        cx.preferred,
    )?;
    Ok(array_like_dynamic(ty, dims, dynamic))
}

fn infer_convolution(cx: &Cx) -> R<Shape> {
    if cx.ops.len() < 2 {
        invalid!("convolution needs two operands");
    }
    let l = cx.array(0)?;
    let r = cx.array(1)?;
    let Some(dn) = cx.instr.conv_dimension_numbers() else {
        invalid!("convolution needs dim_labels=");
    };
    let spatial = dn.input_spatial.len();
    if dn.kernel_spatial.len() != spatial || dn.output_spatial.len() != spatial {
        invalid!("dim_labels have different numbers of spatial dimensions");
    }
    let rank = spatial + 2;
    if l.rank() != rank || r.rank() != rank {
        invalid!(
            "convolution operands must have rank {rank} (dim_labels), got {} and {}",
            l.rank(),
            r.rank()
        );
    }
    let mut lhs_dims = vec![dn.input_batch, dn.input_feature];
    lhs_dims.extend(&dn.input_spatial);
    let mut rhs_dims = vec![dn.kernel_input_feature, dn.kernel_output_feature];
    rhs_dims.extend(&dn.kernel_spatial);
    let mut out_dims_idx = vec![dn.output_batch, dn.output_feature];
    out_dims_idx.extend(&dn.output_spatial);
    for (list, what) in [
        (&lhs_dims, "input"),
        (&rhs_dims, "kernel"),
        (&out_dims_idx, "output"),
    ] {
        for &d in list.iter() {
            dim_index(d, rank, &format!("convolution {what} dimension"))?;
        }
        check_unique(list, &format!("convolution {what} dimension labels"))?;
    }
    let fgc = cx.instr.int_attr(AttrKey::FeatureGroupCount).unwrap_or(1);
    let bgc = cx.instr.int_attr(AttrKey::BatchGroupCount).unwrap_or(1);
    if fgc <= 0 || bgc <= 0 {
        invalid!("feature_group_count and batch_group_count must be positive");
    }
    if fgc > 1 && bgc > 1 {
        invalid!("feature_group_count and batch_group_count cannot both exceed 1");
    }
    let input_batch = l.dims[dn.input_batch as usize];
    let input_features = l.dims[dn.input_feature as usize];
    let kernel_in = r.dims[dn.kernel_input_feature as usize];
    let kernel_out = r.dims[dn.kernel_output_feature as usize];
    if input_features % fgc != 0 || input_features / fgc != kernel_in {
        invalid!(
            "input feature size {input_features} / feature_group_count {fgc} does not equal the kernel input feature size {kernel_in}"
        );
    }
    if kernel_out % fgc != 0 {
        invalid!(
            "kernel output feature size {kernel_out} is not divisible by feature_group_count {fgc}"
        );
    }
    if input_batch % bgc != 0 {
        invalid!("input batch size {input_batch} is not divisible by batch_group_count {bgc}");
    }
    if kernel_out % bgc != 0 {
        invalid!(
            "kernel output feature size {kernel_out} is not divisible by batch_group_count {bgc}"
        );
    }
    let default = Window::default();
    let window = cx.instr.window().unwrap_or(&default);
    if window.dims.len() != spatial {
        invalid!(
            "window has {} dimensions but the convolution has {spatial} spatial dimensions",
            window.dims.len()
        );
    }
    let mut out = vec![0i64; rank];
    out[dn.output_batch as usize] = input_batch / bgc;
    out[dn.output_feature as usize] = kernel_out;
    for i in 0..spatial {
        let w = &window.dims[i];
        let k = r.dims[dn.kernel_spatial[i] as usize];
        if w.size != k {
            invalid!(
                "window dimension {i} has size {} but the kernel spatial dimension has size {k}",
                w.size
            );
        }
        let base = l.dims[dn.input_spatial[i] as usize];
        match window_output_size(base, w) {
            Ok(s) => out[dn.output_spatial[i] as usize] = s,
            Err(e) => invalid!("window dimension {i}: {e}"),
        }
    }
    let ty = maybe_upcast(
        higher_precision(l.element_type, r.element_type),
        cx.preferred,
    )?;
    Ok(array_shape(ty, out))
}

fn slice_sizes(instr: &HloInstruction) -> Option<Vec<i64>> {
    match instr.attr(AttrKey::SliceSizes)? {
        AttrValue::Ints(v) => Some(v.clone()),
        AttrValue::IntLists(l) if l.len() == 1 => Some(l[0].clone()),
        _ => None,
    }
}

fn infer_gather(cx: &Cx) -> R<Shape> {
    cx.exact_operands(2)?;
    let a = cx.array(0)?;
    let idx = cx.array(1)?;
    if !idx.element_type.is_integer() {
        invalid!("gather indices must be integers, got {}", idx.element_type);
    }
    let dn = cx.instr.gather_dimension_numbers();
    let Some(sizes) = slice_sizes(cx.instr) else {
        invalid!("gather needs slice_sizes=");
    };
    let ivd = dn.index_vector_dim;
    if ivd < 0 || ivd as usize > idx.rank() {
        invalid!(
            "index_vector_dim {ivd} is out of range for indices of rank {}",
            idx.rank()
        );
    }
    let ivd = ivd as usize;
    let index_vector_size = if ivd < idx.rank() { idx.dims[ivd] } else { 1 };
    if index_vector_size != dn.start_index_map.len() as i64 {
        invalid!(
            "gather index vector size {index_vector_size} does not match start_index_map {:?}",
            dn.start_index_map
        );
    }
    if dn.operand_batching_dims.len() != dn.start_indices_batching_dims.len() {
        invalid!("operand_batching_dims and start_indices_batching_dims differ in length");
    }
    if sizes.len() != a.rank() {
        invalid!(
            "slice_sizes has {} entries but the operand has rank {}",
            sizes.len(),
            a.rank()
        );
    }
    for (i, (&s, &d)) in sizes.iter().zip(&a.dims).enumerate() {
        if s < 0 || s > d {
            invalid!("slice size {s} of dimension {i} is not within [0, {d}]");
        }
    }
    for &d in dn.start_index_map.iter() {
        dim_index(d, a.rank(), "start_index_map entry")?;
    }
    check_unique(&dn.start_index_map, "start_index_map")?;
    let mut removed = dn.collapsed_slice_dims.clone();
    removed.extend(&dn.operand_batching_dims);
    check_unique(&removed, "collapsed_slice_dims and operand_batching_dims")?;
    for &d in &removed {
        let u = dim_index(d, a.rank(), "collapsed or batching dimension")?;
        if sizes[u] > 1 {
            invalid!(
                "collapsed or batching dimension {d} has slice size {} > 1",
                sizes[u]
            );
        }
    }
    for &d in &dn.start_indices_batching_dims {
        let u = dim_index(d, idx.rank(), "start_indices_batching_dims entry")?;
        if u == ivd {
            invalid!("start_indices_batching_dims contains index_vector_dim");
        }
    }
    let offset_sizes: Vec<i64> = (0..a.rank())
        .filter(|d| !removed.contains(&(*d as i64)))
        .map(|d| sizes[d])
        .collect();
    if offset_sizes.len() != dn.offset_dims.len() {
        invalid!(
            "gather has {} offset_dims but {} uncollapsed slice dimensions",
            dn.offset_dims.len(),
            offset_sizes.len()
        );
    }
    let batch: Vec<i64> = (0..idx.rank())
        .filter(|&d| d != ivd)
        .map(|d| idx.dims[d])
        .collect();
    let out_rank = offset_sizes.len() + batch.len();
    check_unique(&dn.offset_dims, "offset_dims")?;
    for w in dn.offset_dims.windows(2) {
        if w[0] > w[1] {
            invalid!("offset_dims must be sorted");
        }
    }
    for &d in &dn.offset_dims {
        dim_index(d, out_rank, "offset_dims entry")?;
    }
    let (mut oi, mut bi) = (0usize, 0usize);
    let mut dims = Vec::with_capacity(out_rank);
    for i in 0..out_rank {
        if dn.offset_dims.contains(&(i as i64)) {
            dims.push(offset_sizes[oi]);
            oi += 1;
        } else {
            match batch.get(bi) {
                Some(&b) => dims.push(b),
                None => invalid!("gather output rank does not add up"),
            }
            bi += 1;
        }
    }
    Ok(array_shape(a.element_type, dims))
}

fn infer_scatter(cx: &Cx) -> R<Shape> {
    let n = cx.ops.len();
    if n < 3 || n & 1 == 0 {
        invalid!("scatter needs N operands, the indices and N updates, got {n} operands");
    }
    let k = (n - 1) / 2;
    let a0 = cx.array(0)?;
    for i in 1..k {
        if cx.array(i)?.dims != a0.dims {
            invalid!("scatter operands must have the same dimensions");
        }
    }
    let idx = cx.array(k)?;
    if !idx.element_type.is_integer() {
        invalid!("scatter indices must be integers, got {}", idx.element_type);
    }
    let dn = cx.instr.scatter_dimension_numbers();
    let ivd = dn.index_vector_dim;
    if ivd < 0 || ivd as usize > idx.rank() {
        invalid!(
            "index_vector_dim {ivd} is out of range for indices of rank {}",
            idx.rank()
        );
    }
    let ivd = ivd as usize;
    let index_vector_size = if ivd < idx.rank() { idx.dims[ivd] } else { 1 };
    if index_vector_size != dn.scatter_dims_to_operand_dims.len() as i64 {
        invalid!(
            "scatter index vector size {index_vector_size} does not match scatter_dims_to_operand_dims {:?}",
            dn.scatter_dims_to_operand_dims
        );
    }
    for &d in &dn.scatter_dims_to_operand_dims {
        dim_index(d, a0.rank(), "scatter_dims_to_operand_dims entry")?;
    }
    let scatter_batch = idx.rank() - usize::from(ivd < idx.rank());
    let u0 = cx.array(k + 1)?;
    for i in k + 1..n {
        let u = cx.array(i)?;
        if u.dims != u0.dims {
            invalid!("scatter updates must have the same dimensions");
        }
        if u.element_type != cx.array(i - k - 1)?.element_type {
            invalid!(
                "scatter update {} has a different element type than its operand",
                i - k - 1
            );
        }
    }
    if u0.rank() != dn.update_window_dims.len() + scatter_batch {
        invalid!(
            "scatter updates have rank {} but update_window_dims ({}) plus scatter dimensions ({scatter_batch}) give {}",
            u0.rank(),
            dn.update_window_dims.len(),
            dn.update_window_dims.len() + scatter_batch
        );
    }
    let window_rank = a0.rank() as i64
        - dn.inserted_window_dims.len() as i64
        - dn.input_batching_dims.len() as i64;
    if dn.update_window_dims.len() as i64 != window_rank {
        invalid!(
            "update_window_dims has {} entries but the operand has {window_rank} window dimensions",
            dn.update_window_dims.len()
        );
    }
    for &d in &dn.update_window_dims {
        dim_index(d, u0.rank(), "update_window_dims entry")?;
    }
    Ok(tuple_or_single(&cx.ops[..k]))
}

fn infer_gather_scatter_collective(opcode: Opcode, cx: &Cx) -> R<Shape> {
    if cx.ops.is_empty() {
        invalid!("{opcode} needs at least one operand");
    }
    let dims = cx.instr.dimensions();
    if dims.len() != 1 {
        invalid!("{opcode} needs exactly one dimension, got {dims:?}");
    }
    let size = match collective_group_size(cx.module, cx.instr, opcode) {
        Ok(Some(s)) => s,
        Ok(None) => return not_inferable("empty replica groups and no module configuration"),
        Err(e) => invalid!("{e}"),
    };
    let mut out = Vec::with_capacity(cx.ops.len());
    for i in 0..cx.ops.len() {
        let a = cx.array(i)?;
        let d = dim_index(dims[0], a.rank(), &format!("{opcode} dimension"))?;
        let mut new_dims = a.dims.clone();
        if opcode == Opcode::AllGather {
            new_dims[d] = match a.dims[d].checked_mul(size) {
                Some(v) => v,
                None => invalid!("all-gather size overflows"),
            };
        } else {
            if a.dims[d] % size != 0 {
                invalid!(
                    "reduce-scatter dimension size {} is not divisible by the group size {size}",
                    a.dims[d]
                );
            }
            new_dims[d] = a.dims[d] / size;
        }
        out.push(array_shape(a.element_type, new_dims));
    }
    Ok(single_or_tuple(out))
}

fn infer_fft(cx: &Cx) -> R<Shape> {
    cx.exact_operands(1)?;
    let a = cx.array(0)?;
    let len = cx.ints(AttrKey::FftLength);
    let Some(kind) = cx.instr.ident_attr(AttrKey::FftType) else {
        invalid!("fft needs fft_type=");
    };
    if len.is_empty() || len.len() > 3 || len.len() > a.rank() {
        invalid!("fft_length must have 1 to 3 entries, at most the operand rank");
    }
    let r = a.rank();
    let tail = &a.dims[r - len.len()..];
    let mut dims = a.dims.clone();
    let ty = a.element_type;
    match kind {
        "FFT" | "IFFT" => {
            if !ty.is_complex() {
                invalid!("{kind} expects a complex operand, got {ty}");
            }
            Ok(array_shape(ty, dims))
        }
        "RFFT" => {
            let out_ty = match ty {
                PrimitiveType::F32 => PrimitiveType::C64,
                PrimitiveType::F64 => PrimitiveType::C128,
                _ => invalid!("RFFT expects an f32 or f64 operand, got {ty}"),
            };
            if tail != len {
                invalid!("RFFT fft_length {len:?} does not match the operand's minor dimensions {tail:?}");
            }
            if let (Some(l), Some(&n)) = (dims.last_mut(), len.last()) {
                if n != 0 {
                    *l = n / 2 + 1;
                }
            }
            Ok(array_shape(out_ty, dims))
        }
        "IRFFT" => {
            let Some(out_ty) = complex_component(ty) else {
                invalid!("IRFFT expects a complex operand, got {ty}");
            };
            let k = len.len();
            if tail[..k - 1] != len[..k - 1] {
                invalid!("IRFFT fft_length {len:?} does not match the operand's minor dimensions {tail:?}");
            }
            if let (Some(l), Some(&n)) = (dims.last_mut(), len.last()) {
                *l = n;
            }
            Ok(array_shape(out_ty, dims))
        }
        other => invalid!("unknown fft_type {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attrs::{PaddingDim, SliceDim, WindowDim};
    use crate::primitive_type::PrimitiveType::*;

    fn instr(op: Opcode) -> HloInstruction {
        HloInstruction::new("x", op, Shape::tuple(vec![]), vec![])
    }
    fn f32s(dims: &[i64]) -> Shape {
        Shape::array(F32, dims.to_vec())
    }
    fn infer1(i: &HloInstruction, ops: &[&Shape]) -> Result<Shape, String> {
        infer_shape(None, &[], i, ops)
    }

    #[test]
    fn elementwise() {
        let a = f32s(&[2, 3]);
        assert_eq!(infer1(&instr(Opcode::Add), &[&a, &a]).unwrap(), a);
        let c = infer1(&instr(Opcode::Compare), &[&a, &a]).unwrap();
        assert_eq!(c, Shape::array(Pred, vec![2, 3]));
        let b = f32s(&[3, 2]);
        assert!(infer1(&instr(Opcode::Add), &[&a, &b]).is_err());
        let z = infer1(&instr(Opcode::Complex), &[&a, &a]).unwrap();
        assert_eq!(z, Shape::array(C64, vec![2, 3]));
        assert_eq!(infer1(&instr(Opcode::Abs), &[&z]).unwrap(), a);
        assert_eq!(infer1(&instr(Opcode::Real), &[&z]).unwrap(), a);
        assert_eq!(
            infer1(&instr(Opcode::IsFinite), &[&a]).unwrap(),
            Shape::array(Pred, vec![2, 3])
        );
        assert!(infer1(&instr(Opcode::Convert), &[&a]).is_err());
        let p = Shape::array(Pred, vec![2, 3]);
        assert_eq!(infer1(&instr(Opcode::Select), &[&p, &a, &a]).unwrap(), a);
    }

    #[test]
    fn dot_general() {
        let mut d = instr(Opcode::Dot);
        d.set_attr(AttrKey::LhsBatchDims, AttrValue::Ints(vec![0]));
        d.set_attr(AttrKey::RhsBatchDims, AttrValue::Ints(vec![0]));
        d.set_attr(AttrKey::LhsContractingDims, AttrValue::Ints(vec![2]));
        d.set_attr(AttrKey::RhsContractingDims, AttrValue::Ints(vec![1]));
        let l = Shape::array(Bf16, vec![4, 5, 6]);
        let r = Shape::array(Bf16, vec![4, 6, 7]);
        assert_eq!(
            infer1(&d, &[&l, &r]).unwrap(),
            Shape::array(Bf16, vec![4, 5, 7])
        );
        let s = infer_shape_detailed(None, &[], &d, &[&l, &r], Some(F32)).unwrap();
        assert_eq!(s, Shape::array(F32, vec![4, 5, 7]));
        let bad = Shape::array(Bf16, vec![4, 7, 7]);
        assert!(infer1(&d, &[&l, &bad]).is_err());
    }

    #[test]
    fn slice_pad_concat() {
        let mut s = instr(Opcode::Slice);
        s.set_attr(
            AttrKey::Slice,
            AttrValue::Slice(vec![
                SliceDim {
                    start: 0,
                    limit: 3,
                    stride: 1,
                },
                SliceDim {
                    start: 1,
                    limit: 8,
                    stride: 2,
                },
            ]),
        );
        let a = f32s(&[4, 8]);
        assert_eq!(infer1(&s, &[&a]).unwrap(), f32s(&[3, 4]));
        let mut p = instr(Opcode::Pad);
        p.set_attr(
            AttrKey::Padding,
            AttrValue::Padding(vec![
                PaddingDim {
                    low: 1,
                    high: 2,
                    interior: 0,
                },
                PaddingDim {
                    low: 0,
                    high: 0,
                    interior: 1,
                },
            ]),
        );
        let z = f32s(&[]);
        assert_eq!(infer1(&p, &[&a, &z]).unwrap(), f32s(&[7, 15]));
        let mut c = instr(Opcode::Concatenate);
        c.set_attr(AttrKey::Dimensions, AttrValue::Ints(vec![1]));
        assert_eq!(infer1(&c, &[&a, &a]).unwrap(), f32s(&[4, 16]));
    }

    #[test]
    fn windows() {
        let w = WindowDim {
            size: 3,
            stride: 2,
            padding_low: 1,
            padding_high: 1,
            ..WindowDim::default()
        };
        assert_eq!(window_output_size(8, &w).unwrap(), 4);
        let w = WindowDim {
            size: 64,
            padding_low: 63,
            ..WindowDim::default()
        };
        assert_eq!(window_output_size(64, &w).unwrap(), 64);
        let bad = WindowDim {
            size: 0,
            ..WindowDim::default()
        };
        assert!(window_output_size(8, &bad).is_err());
    }

    #[test]
    fn broadcast_follows_xla_parser() {
        let mut b = instr(Opcode::Broadcast);
        b.set_attr(AttrKey::Dimensions, AttrValue::Ints(vec![2, 3]));
        assert_eq!(infer1(&b, &[&f32s(&[5])]).unwrap(), f32s(&[2, 3, 5]));
    }

    #[test]
    fn all_gather_group_size() {
        let mut g = instr(Opcode::AllGather);
        g.set_attr(AttrKey::Dimensions, AttrValue::Ints(vec![1]));
        g.set_attr(
            AttrKey::ReplicaGroups,
            AttrValue::ReplicaGroups(CollectiveDeviceList::Iota {
                num_groups: 2,
                group_size: 4,
                reshape_dims: vec![8],
                perm: vec![],
            }),
        );
        g.set_attr(AttrKey::ChannelId, AttrValue::Int(1));
        g.set_attr(AttrKey::UseGlobalDeviceIds, AttrValue::Bool(true));
        assert_eq!(infer1(&g, &[&f32s(&[2, 3])]).unwrap(), f32s(&[2, 12]));
    }

    #[test]
    fn never_panics_on_garbage() {
        let a = f32s(&[2, 3]);
        let t = Shape::tuple(vec![a.clone()]);
        for &op in Opcode::ALL {
            let mut i = instr(op);
            i.set_attr(AttrKey::Dimensions, AttrValue::Ints(vec![7, -1]));
            i.set_attr(AttrKey::Index, AttrValue::Int(9));
            i.set_attr(AttrKey::ToApply, AttrValue::Computation(CompId(99)));
            i.set_attr(AttrKey::FftLength, AttrValue::Ints(vec![i64::MAX]));
            i.set_attr(AttrKey::FftType, AttrValue::Ident("IRFFT".into()));
            for ops in [
                vec![],
                vec![&a],
                vec![&a, &t],
                vec![&t, &t, &a],
                vec![&a, &a, &a, &a],
            ] {
                let _ = infer1(&i, &ops);
            }
        }
    }
}
