//! What the ops of this module share: recognising a called computation as
//! one binary op of its parameters (`binary_reducer`) or one compare
//! (`compare_of_params`), the typed kernels' dispatch on (op, element type)
//! (`dispatch_binop!`), and the scalar plumbing of the generic path (one
//! element as a scalar value, scalars back into an array, a computation's
//! result split into its outputs).
//!
//! Invariants: `binary_reducer` accepts only associative, commutative ops of
//! two distinct parameters, so the fast kernels may reassociate;
//! `dispatch_binop!` covers f32, f64, the integers and pred, and gives
//! `None` for any other (op, type) pair, which the caller then computes
//! another way.

use crate::elementwise::Direction;
use crate::error::{bad, EvalError};
use crate::interp::Evaluator;
use crate::value::{element_count, Array, Data, Value};
use half::{bf16, f16};
use xla_hlo_ir::{AttrKey, CompId, Opcode, PrimitiveType};

/// Native element types that can be read out of `Data`.
pub trait Elem: Copy + Send + Sync + 'static {
    fn slice(d: &Data) -> Option<&[Self]>;
}
macro_rules! elem {
    ($T:ty, $V:ident) => {
        impl Elem for $T {
            fn slice(d: &Data) -> Option<&[Self]> {
                match d {
                    Data::$V(v) => Some(v),
                    _ => None,
                }
            }
        }
    };
}
elem!(bool, Pred);
elem!(i8, S8);
elem!(i16, S16);
elem!(i32, S32);
elem!(i64, S64);
elem!(u8, U8);
elem!(u16, U16);
elem!(u32, U32);
elem!(u64, U64);
elem!(f16, F16);
elem!(bf16, Bf16);
elem!(f32, F32);
elem!(f64, F64);

/// The first element of `a` typed like `_like`.
pub(super) fn scalar_like<T: Elem>(_like: &[T], a: &Array) -> Result<T, EvalError> {
    T::slice(&a.data)
        .and_then(|s| s.first().copied())
        .ok_or_else(|| EvalError::invalid("init value type differs from the operand"))
}

macro_rules! float_binop {
    ($op:expr, $T:ty, $max:expr, $min:expr, $f:ident => $body:expr) => {
        match $op {
            Opcode::Add => {
                let $f = |x: $T, y: $T| x + y;
                Some($body)
            }
            Opcode::Multiply => {
                let $f = |x: $T, y: $T| x * y;
                Some($body)
            }
            Opcode::Maximum => {
                let $f = $max;
                Some($body)
            }
            Opcode::Minimum => {
                let $f = $min;
                Some($body)
            }
            _ => None,
        }
    };
}
macro_rules! int_binop {
    ($op:expr, $T:ty, $f:ident => $body:expr) => {
        match $op {
            Opcode::Add => {
                let $f = |x: $T, y: $T| x.wrapping_add(y);
                Some($body)
            }
            Opcode::Multiply => {
                let $f = |x: $T, y: $T| x.wrapping_mul(y);
                Some($body)
            }
            Opcode::Maximum => {
                let $f = |x: $T, y: $T| x.max(y);
                Some($body)
            }
            Opcode::Minimum => {
                let $f = |x: $T, y: $T| x.min(y);
                Some($body)
            }
            Opcode::And => {
                let $f = |x: $T, y: $T| x & y;
                Some($body)
            }
            Opcode::Or => {
                let $f = |x: $T, y: $T| x | y;
                Some($body)
            }
            Opcode::Xor => {
                let $f = |x: $T, y: $T| x ^ y;
                Some($body)
            }
            _ => None,
        }
    };
}
macro_rules! pred_binop {
    ($op:expr, $f:ident => $body:expr) => {
        match $op {
            Opcode::And | Opcode::Minimum | Opcode::Multiply => {
                let $f = |x: bool, y: bool| x & y;
                Some($body)
            }
            Opcode::Or | Opcode::Maximum | Opcode::Add => {
                let $f = |x: bool, y: bool| x | y;
                Some($body)
            }
            Opcode::Xor => {
                let $f = |x: bool, y: bool| x ^ y;
                Some($body)
            }
            _ => None,
        }
    };
}

/// Runs `$body` (producing a Vec of the element type) with `$v` bound to the
/// typed storage of `$data` and `$f` to the binary op; `None` when the
/// (op, type) pair has no fast kernel. Low-precision floats are widened to
/// f32 and every step is rounded back to the storage type.
macro_rules! dispatch_binop {
    ($op:expr, $arr:expr, $v:ident, $f:ident => $body:expr) => {{
        let arr: &Array = $arr;
        match &*arr.data {
            Data::F32($v) => float_binop!($op, f32, fmax32, fmin32, $f => $body).map(Data::F32),
            Data::F64($v) => float_binop!($op, f64, fmax64, fmin64, $f => $body).map(Data::F64),
            Data::S8($v) => int_binop!($op, i8, $f => $body).map(Data::S8),
            Data::S16($v) => int_binop!($op, i16, $f => $body).map(Data::S16),
            Data::S32($v) => int_binop!($op, i32, $f => $body).map(Data::S32),
            Data::S64($v) => int_binop!($op, i64, $f => $body).map(Data::S64),
            Data::U8($v) => int_binop!($op, u8, $f => $body).map(Data::U8),
            Data::U16($v) => int_binop!($op, u16, $f => $body).map(Data::U16),
            Data::U32($v) => int_binop!($op, u32, $f => $body).map(Data::U32),
            Data::U64($v) => int_binop!($op, u64, $f => $body).map(Data::U64),
            Data::Pred($v) => pred_binop!($op, $f => $body).map(Data::Pred),
            _ => None,
        }
    }};
}
// The macros name `Array`, `Data`, `Opcode`, each other and
// fmax32/fmin32/fmax64/fmin64 unqualified, resolved where they are used:
// a module using `dispatch_binop!` imports all of them.
pub(super) use {dispatch_binop, float_binop, int_binop, pred_binop};

/// If `comp` is `op(param0, param1)` for an associative, commutative op,
/// returns that op.
pub fn binary_reducer(ev: &Evaluator, comp: CompId) -> Option<Opcode> {
    let c = ev.module.computations.get(comp.index())?;
    if c.parameters.len() != 2 {
        return None;
    }
    let root = c.instructions.get(c.root.index())?;
    let op = root.opcode;
    if !matches!(
        op,
        Opcode::Add
            | Opcode::Multiply
            | Opcode::Maximum
            | Opcode::Minimum
            | Opcode::And
            | Opcode::Or
            | Opcode::Xor
    ) {
        return None;
    }
    let p: Vec<i64> = root
        .operands
        .iter()
        .filter_map(|&o| {
            let i = c.instructions.get(o.index())?;
            (i.opcode == Opcode::Parameter).then_some(i.parameter_number?)
        })
        .collect();
    (p.len() == 2 && p[0] != p[1]).then_some(op)
}

/// If `comp` is `compare(param_a, param_b, dir)` returns (a, b, dir, total_order).
pub(crate) fn compare_of_params(
    ev: &Evaluator,
    comp: CompId,
) -> Option<(i64, i64, Direction, bool)> {
    let c = ev.module.computations.get(comp.index())?;
    let root = c.instructions.get(c.root.index())?;
    if root.opcode != Opcode::Compare || root.operands.len() != 2 {
        return None;
    }
    let pn = |k: usize| -> Option<i64> {
        let i = c.instructions.get(root.operands[k].index())?;
        (i.opcode == Opcode::Parameter).then_some(i.parameter_number?)
    };
    let dir = Direction::parse(root.ident_attr(AttrKey::Direction)?)?;
    let total = root.ident_attr(AttrKey::CompareType) == Some("TOTALORDER");
    Some((pn(0)?, pn(1)?, dir, total))
}

pub(super) fn scalar_at(a: &Array, i: usize) -> Value {
    let d = crate::map_data!(&*a.data, v => vec![v[i]]);
    Value::Array(Array::from_parts(a.ty, vec![], d))
}

pub(super) fn scalars_to_array(
    ty: PrimitiveType,
    dims: Vec<i64>,
    items: &[Array],
) -> Result<Array, EvalError> {
    let n = element_count(&dims);
    if items.len() != n {
        return bad("internal: scalar count");
    }
    let mut d = Data::zeros(ty, n)?;
    for (i, s) in items.iter().enumerate() {
        crate::zip_data!(&mut d, &*s.data, dst, src => dst[i] = src[0],
            else return bad(format!("computation returned {} where {} is expected", s.ty, ty)));
    }
    Ok(Array::from_parts(ty, dims, d))
}

/// Splits a computation result into `n` scalar arrays.
pub(super) fn split_result(v: Value, n: usize) -> Result<Vec<Array>, EvalError> {
    match v {
        Value::Array(a) if n == 1 => Ok(vec![a]),
        Value::Tuple(e) if e.len() == n => e
            .into_iter()
            .map(|x| {
                x.into_array()
                    .ok_or_else(|| EvalError::invalid("nested tuple result"))
            })
            .collect(),
        v => bad(format!(
            "computation returned {} but {n} values are expected",
            v.shape_string()
        )),
    }
}
