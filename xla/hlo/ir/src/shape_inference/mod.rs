//! Shape inference: the result shape XLA's `ShapeInference` gives an
//! instruction from its opcode, operand shapes and attributes. The parser uses
//! it for instructions written without a shape; the verifier checks every
//! instruction's declared shape against it.
//!
//! Two kinds of failure are kept apart ([`InferError`]): `NotInferable` when
//! XLA itself needs the written shape (`convert`, `reshape`, `iota`,
//! `custom-call`, async starts, ...), and `Invalid` when the operands or
//! attributes admit no shape at all (mismatched dimensions, out-of-range
//! dimension numbers, ...). The verifier reports the second kind as an error
//! and lists instructions of the first as unchecked.
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
//! Layout: this module holds the entry points, the operand accessors and
//! helpers every rule shares, and the dispatch from opcode to rule; the rules
//! live in one submodule per op family ([`elementwise`], [`data_movement`],
//! [`reduction`], [`window`], [`linear_algebra`], [`collectives`],
//! [`async_ops`], [`tuples_and_control`]). Submodules depend only on this
//! module and on [`window`], never on each other otherwise.
//!
//! Invariant: never panics, on any input; all size arithmetic is checked.

use crate::attrs::AttrKey;
use crate::module::{CompId, HloComputation, HloInstruction, HloModule};
use crate::opcode::Opcode;
use crate::primitive_type::PrimitiveType;
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
    ($($arg:tt)*) => { return Err($crate::shape_inference::InferError::Invalid(format!($($arg)*))) };
}

fn not_inferable<T>(what: impl Into<String>) -> R<T> {
    Err(InferError::NotInferable(what.into()))
}

mod async_ops;
mod collectives;
mod data_movement;
mod elementwise;
mod linear_algebra;
mod reduction;
mod tuples_and_control;
mod window;

pub use collectives::{collective_group_size, written_group_size};
pub use window::window_output_size;

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

fn tuple_or_single(ops: &[&Shape]) -> Shape {
    if ops.len() == 1 {
        ops[0].clone()
    } else {
        Shape::Tuple(ops.iter().map(|s| (*s).clone()).collect())
    }
}

fn single_or_tuple(mut shapes: Vec<Shape>) -> Shape {
    if shapes.len() == 1 {
        shapes.remove(0)
    } else {
        Shape::Tuple(shapes)
    }
}

/// The rule for each opcode. The match lists every opcode, so a new one
/// does not compile until it is given a rule (or listed as needing its
/// written shape).
fn infer(opcode: Opcode, cx: &Cx) -> R<Shape> {
    use elementwise::{BinaryTypeRule, UnaryTypeRule};
    use Opcode as O;
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

        O::Add
        | O::Subtract
        | O::Multiply
        | O::Divide
        | O::Remainder
        | O::Power
        | O::Atan2
        | O::Maximum
        | O::Minimum
        | O::Mulhi => elementwise::infer_binary(opcode, BinaryTypeRule::Any, cx),
        O::Compare => elementwise::infer_binary(opcode, BinaryTypeRule::AnyToPred, cx),
        O::Complex => elementwise::infer_binary(opcode, BinaryTypeRule::FloatToComplex, cx),
        O::And | O::Or | O::Xor => {
            elementwise::infer_binary(opcode, BinaryTypeRule::PredOrInteger, cx)
        }
        O::ShiftLeft | O::ShiftRightArithmetic | O::ShiftRightLogical => {
            elementwise::infer_binary(opcode, BinaryTypeRule::Integer, cx)
        }
        O::Select => elementwise::infer_select(cx),
        // Copy takes any shape, tuples included (XLA's `InferUnaryOpShape`).
        O::Copy => {
            cx.exact_operands(1)?;
            Ok(cx.op(0)?.clone())
        }
        O::Clamp => elementwise::infer_clamp(cx),
        O::Negate | O::Sign => elementwise::infer_unary(opcode, UnaryTypeRule::Any, cx),
        O::Abs => elementwise::infer_unary(opcode, UnaryTypeRule::ComplexToComponent, cx),
        O::Real | O::Imag => elementwise::infer_unary(opcode, UnaryTypeRule::RealOrComplexPart, cx),
        O::IsFinite => elementwise::infer_unary(opcode, UnaryTypeRule::FloatToPred, cx),
        O::Not => elementwise::infer_unary(opcode, UnaryTypeRule::PredOrInteger, cx),
        O::PopulationCount | O::Clz => elementwise::infer_unary(opcode, UnaryTypeRule::Integer, cx),
        O::Floor | O::Ceil | O::RoundNearestAfz | O::RoundNearestEven | O::ReducePrecision => {
            elementwise::infer_unary(opcode, UnaryTypeRule::Float, cx)
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
        | O::Sinh => elementwise::infer_unary(opcode, UnaryTypeRule::FloatOrComplex, cx),

        O::Broadcast => data_movement::infer_broadcast(cx),
        O::Transpose => data_movement::infer_transpose(cx),
        O::Reverse => data_movement::infer_reverse(cx),
        O::Slice => data_movement::infer_slice(cx),
        O::DynamicSlice => data_movement::infer_dynamic_slice(cx),
        O::DynamicUpdateSlice => data_movement::infer_dynamic_update_slice(cx),
        O::Pad => data_movement::infer_pad(cx),
        O::Concatenate => data_movement::infer_concatenate(cx),
        O::Reduce => reduction::infer_reduce(cx),
        O::ReduceWindow => reduction::infer_reduce_window(cx),
        O::SelectAndScatter => reduction::infer_select_and_scatter(cx),
        O::Dot => linear_algebra::infer_dot(cx),
        O::Convolution => linear_algebra::infer_convolution(cx),
        O::Gather => data_movement::infer_gather(cx),
        O::Scatter => data_movement::infer_scatter(cx),
        O::GetTupleElement => tuples_and_control::infer_get_tuple_element(cx),
        O::Tuple => Ok(Shape::Tuple(cx.ops.iter().map(|s| (*s).clone()).collect())),
        O::While => {
            cx.exact_operands(1)?;
            Ok(cx.op(0)?.clone())
        }
        O::Call => Ok(cx.comp_root_shape(AttrKey::ToApply)?.clone()),
        O::Conditional => tuples_and_control::infer_conditional(cx),
        O::Map => reduction::infer_map(cx),
        O::Sort => reduction::infer_sort(cx),
        O::TopK => reduction::infer_topk(cx),

        O::AllReduce | O::AllReduceStart | O::CollectiveBroadcast => {
            collectives::infer_all_reduce(opcode, cx)
        }
        O::AllGather | O::ReduceScatter => collectives::infer_gather_scatter_collective(opcode, cx),
        O::AllToAll => collectives::infer_all_to_all(opcode, cx),
        O::CollectivePermute => collectives::infer_collective_permute(cx),
        O::RaggedAllToAll => {
            cx.exact_operands(6)?;
            Ok(cx.op(1)?.clone())
        }
        O::AllReduceDone => {
            cx.exact_operands(1)?;
            Ok(cx.op(0)?.clone())
        }
        O::AllGatherDone | O::CollectivePermuteDone | O::AsyncDone => async_ops::infer_done(cx),
        O::AsyncUpdate => {
            cx.exact_operands(1)?;
            Ok(cx.op(0)?.clone())
        }
        O::CopyStart => async_ops::infer_copy_start(cx),
        O::CopyDone => async_ops::infer_copy_done(cx),
        O::PartitionId | O::ReplicaId => {
            cx.exact_operands(0)?;
            Ok(Shape::scalar(PrimitiveType::U32))
        }
        O::AfterAll => tuples_and_control::infer_after_all(cx),
        O::Outfeed => Ok(Shape::token()),
        O::AddDependency => tuples_and_control::infer_add_dependency(cx),
        O::OptimizationBarrier | O::Domain => {
            cx.exact_operands(1)?;
            Ok(cx.op(0)?.clone())
        }
        O::GetDimensionSize => data_movement::infer_get_dimension_size(cx),
        O::SetDimensionSize => data_movement::infer_set_dimension_size(cx),
        O::Cholesky => linear_algebra::infer_cholesky(cx),
        O::TriangularSolve => linear_algebra::infer_triangular_solve(cx),
        O::BatchNormTraining | O::BatchNormGrad | O::BatchNormInference => {
            linear_algebra::infer_batch_norm(opcode, cx)
        }
        O::Fft => linear_algebra::infer_fft(cx),
    }
}

#[cfg(test)]
mod tests;
