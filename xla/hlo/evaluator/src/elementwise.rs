//! Elementwise ops: unary and binary math, integer and bitwise ops, shifts,
//! comparisons (IEEE and total order), select, clamp, convert,
//! bitcast-convert and reduce-precision, with XLA's semantics.
//!
//! Invariants: the element type is matched once per op and the loop body is
//! a monomorphised closure (no per-element dispatch); f16/bf16/f8 math is
//! done in f32 and rounded once to the result type (what XLA's CPU backend
//! does); integer arithmetic wraps; division by zero and overflowing
//! division follow XLA (x/0 = -1 or all ones, x%0 = x, MIN/-1 = MIN,
//! MIN%-1 = 0); shifts by at least the bit width give 0 (or the sign fill
//! for arithmetic right shifts). Large loops run on rayon's pool.

use crate::error::{bad, EvalError};
use crate::value::{element_count, storage_of, Array, Data, Storage};
use half::{bf16, f16};
use rayon::prelude::*;
use xla_hlo_ir::literal::{float_from_bits, float_to_bits};
use xla_hlo_ir::{Opcode, PrimitiveType};

const PAR_MIN: usize = 1 << 15;

#[inline]
pub(crate) fn map1<A: Copy + Sync, R: Send>(a: &[A], f: impl Fn(A) -> R + Sync + Send) -> Vec<R> {
    if a.len() >= PAR_MIN {
        a.par_iter().with_min_len(1 << 13).map(|&x| f(x)).collect()
    } else {
        a.iter().map(|&x| f(x)).collect()
    }
}

#[inline]
pub(crate) fn map2<A: Copy + Sync, B: Copy + Sync, R: Send>(
    a: &[A],
    b: &[B],
    f: impl Fn(A, B) -> R + Sync + Send,
) -> Vec<R> {
    if a.len() >= PAR_MIN {
        a.par_iter()
            .zip(b.par_iter())
            .with_min_len(1 << 13)
            .map(|(&x, &y)| f(x, y))
            .collect()
    } else {
        a.iter().zip(b).map(|(&x, &y)| f(x, y)).collect()
    }
}

#[inline]
fn map3<A: Copy + Sync, B: Copy + Sync, C: Copy + Sync, R: Send>(
    a: &[A],
    b: &[B],
    c: &[C],
    f: impl Fn(A, B, C) -> R + Sync + Send,
) -> Vec<R> {
    if a.len() >= PAR_MIN {
        a.par_iter()
            .zip(b.par_iter())
            .zip(c.par_iter())
            .with_min_len(1 << 13)
            .map(|((&x, &y), &z)| f(x, y, z))
            .collect()
    } else {
        a.iter()
            .zip(b)
            .zip(c)
            .map(|((&x, &y), &z)| f(x, y, z))
            .collect()
    }
}

/// Values of a low-precision float array widened to f32.
pub(crate) fn widen_f32(a: &Array) -> Option<Vec<f32>> {
    Some(match &*a.data {
        Data::F16(v) => map1(v, |x| x.to_f32()),
        Data::Bf16(v) => map1(v, |x| x.to_f32()),
        Data::F8(v) => {
            let ty = a.ty;
            map1(v, move |x| {
                float_from_bits(ty, x as u128).unwrap_or(f64::NAN) as f32
            })
        }
        _ => return None,
    })
}

/// Rounds f32 values to a low-precision float type's storage.
pub(crate) fn narrow_f32(ty: PrimitiveType, v: &[f32]) -> Result<Data, EvalError> {
    Ok(match storage_of(ty)? {
        Storage::F16 => Data::F16(map1(v, f16::from_f32)),
        Storage::Bf16 => Data::Bf16(map1(v, bf16::from_f32)),
        Storage::F32 => Data::F32(v.to_vec()),
        Storage::F8 => Data::F8(map1(v, move |x| {
            float_to_bits(ty, x as f64).unwrap_or(0) as u8
        })),
        _ => return bad(format!("cannot narrow f32 to {ty}")),
    })
}

fn erf_f32(x: f32) -> f32 {
    libm::erff(x)
}

fn logistic_f32(x: f32) -> f32 {
    // Same form as XLA: 1 / (1 + exp(-x)), saturating without NaN.
    1.0 / (1.0 + (-x).exp())
}
fn logistic_f64(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// sign(x) for floats: -1, +1, ±0 for ±0, NaN for NaN.
macro_rules! fsign {
    ($x:expr) => {{
        let x = $x;
        if x.is_nan() || x == 0.0 {
            x
        } else if x > 0.0 {
            1.0
        } else {
            -1.0
        }
    }};
}

macro_rules! float_unary_impl {
    ($T:ty, $op:expr, $v:expr, $erf:expr, $logistic:expr) => {{
        let v: &[$T] = $v;
        use Opcode as O;
        Some(match $op {
            O::Abs => map1(v, |x: $T| x.abs()),
            O::Negate => map1(v, |x: $T| -x),
            O::Exp => map1(v, |x: $T| x.exp()),
            O::Expm1 => map1(v, |x: $T| x.exp_m1()),
            O::Log => map1(v, |x: $T| x.ln()),
            O::Log1p => map1(v, |x: $T| x.ln_1p()),
            O::Sqrt => map1(v, |x: $T| x.sqrt()),
            O::Rsqrt => map1(v, |x: $T| 1.0 / x.sqrt()),
            O::Cbrt => map1(v, |x: $T| x.cbrt()),
            O::Tanh => map1(v, |x: $T| x.tanh()),
            O::Logistic => map1(v, $logistic),
            O::Erf => map1(v, $erf),
            O::Sin => map1(v, |x: $T| x.sin()),
            O::Cos => map1(v, |x: $T| x.cos()),
            O::Tan => map1(v, |x: $T| x.tan()),
            O::Asin => map1(v, |x: $T| x.asin()),
            O::Acos => map1(v, |x: $T| x.acos()),
            O::Atan => map1(v, |x: $T| x.atan()),
            O::Sinh => map1(v, |x: $T| x.sinh()),
            O::Cosh => map1(v, |x: $T| x.cosh()),
            O::Asinh => map1(v, |x: $T| x.asinh()),
            O::Acosh => map1(v, |x: $T| x.acosh()),
            O::Atanh => map1(v, |x: $T| x.atanh()),
            O::Floor => map1(v, |x: $T| x.floor()),
            O::Ceil => map1(v, |x: $T| x.ceil()),
            O::RoundNearestAfz => map1(v, |x: $T| x.round()),
            O::RoundNearestEven => map1(v, |x: $T| x.round_ties_even()),
            O::Sign => map1(v, |x: $T| fsign!(x)),
            O::Copy => v.to_vec(),
            O::Real => v.to_vec(),
            O::Imag => map1(v, |_x: $T| 0.0),
            _ => return None,
        })
    }};
}

fn float_unary_f32(op: Opcode, v: &[f32]) -> Option<Vec<f32>> {
    match op {
        Opcode::Exp => Some(map1(v, crate::fastmath::exp)),
        Opcode::Tanh => Some(map1(v, crate::fastmath::tanh)),
        _ => float_unary_impl!(f32, op, v, erf_f32, logistic_f32),
    }
}
fn float_unary_f64(op: Opcode, v: &[f64]) -> Option<Vec<f64>> {
    float_unary_impl!(f64, op, v, libm::erf, logistic_f64)
}

macro_rules! int_unary_impl {
    ($T:ty, $signed:expr, $op:expr, $v:expr) => {{
        let v: &[$T] = $v;
        use Opcode as O;
        #[allow(unused_comparisons)]
        Some(match $op {
            O::Abs => map1(v, |x: $T| if x < 0 { (0 as $T).wrapping_sub(x) } else { x }),
            O::Negate => map1(v, |x: $T| (0 as $T).wrapping_sub(x)),
            O::Not => map1(v, |x: $T| !x),
            O::Sign => map1(v, |x: $T| {
                if x > 0 {
                    1 as $T
                } else if x == 0 {
                    0 as $T
                } else {
                    (0 as $T).wrapping_sub(1)
                }
            }),
            O::Clz => map1(v, |x: $T| x.leading_zeros() as $T),
            O::PopulationCount => map1(v, |x: $T| x.count_ones() as $T),
            O::Copy => v.to_vec(),
            _ => return None,
        })
    }};
}

/// Applies a unary elementwise opcode.
pub fn unary(op: Opcode, a: &Array) -> Result<Array, EvalError> {
    if op == Opcode::IsFinite {
        let out: Vec<bool> = match &*a.data {
            Data::F32(v) => map1(v, |x| x.is_finite()),
            Data::F64(v) => map1(v, |x| x.is_finite()),
            _ => match widen_f32(a) {
                Some(v) => map1(&v, |x| x.is_finite()),
                None => return bad(format!("is-finite of {}", a.ty)),
            },
        };
        return Ok(Array::from_parts(
            PrimitiveType::Pred,
            a.dims.clone(),
            Data::Pred(out),
        ));
    }
    if let Some(r) = crate::complex::unary(op, a) {
        return r;
    }
    let unsupported = || bad(format!("{} of {} is not supported", op, a.ty));
    let unsup = || EvalError::Invalid(format!("{} of {} is not supported", op, a.ty));
    let data = match &*a.data {
        Data::F32(v) => match float_unary_f32(op, v) {
            Some(r) => Data::F32(r),
            None => return unsupported(),
        },
        Data::F64(v) => match float_unary_f64(op, v) {
            Some(r) => Data::F64(r),
            None => return unsupported(),
        },
        Data::F16(_) | Data::Bf16(_) | Data::F8(_) => {
            let w = widen_f32(a).expect("float storage");
            match float_unary_f32(op, &w) {
                Some(r) => narrow_f32(a.ty, &r)?,
                None => return unsupported(),
            }
        }
        Data::Pred(v) => match op {
            Opcode::Not => Data::Pred(map1(v, |x: bool| !x)),
            Opcode::Copy | Opcode::Abs | Opcode::Sign => Data::Pred(v.clone()),
            _ => return unsupported(),
        },
        Data::S8(v) => Data::S8((|| int_unary_impl!(i8, true, op, v))().ok_or_else(unsup)?),
        Data::S16(v) => Data::S16((|| int_unary_impl!(i16, true, op, v))().ok_or_else(unsup)?),
        Data::S32(v) => Data::S32((|| int_unary_impl!(i32, true, op, v))().ok_or_else(unsup)?),
        Data::S64(v) => Data::S64((|| int_unary_impl!(i64, true, op, v))().ok_or_else(unsup)?),
        Data::U8(v) => Data::U8((|| int_unary_impl!(u8, false, op, v))().ok_or_else(unsup)?),
        Data::U16(v) => Data::U16((|| int_unary_impl!(u16, false, op, v))().ok_or_else(unsup)?),
        Data::U32(v) => Data::U32((|| int_unary_impl!(u32, false, op, v))().ok_or_else(unsup)?),
        Data::U64(v) => Data::U64((|| int_unary_impl!(u64, false, op, v))().ok_or_else(unsup)?),
        Data::C64(_) | Data::C128(_) => return unsupported(),
    };
    Ok(Array::from_parts(a.ty, a.dims.clone(), data))
}

/// XLA's float max/min: NaN propagates.
macro_rules! fmaxnan {
    ($x:expr, $y:expr) => {{
        let (x, y) = ($x, $y);
        if x.is_nan() {
            x
        } else if y.is_nan() {
            y
        } else if x > y {
            x
        } else if y > x {
            y
        } else if x == 0.0 && y == 0.0 {
            // max(-0, +0) = +0
            if x.is_sign_negative() {
                y
            } else {
                x
            }
        } else {
            x
        }
    }};
}
macro_rules! fminnan {
    ($x:expr, $y:expr) => {{
        let (x, y) = ($x, $y);
        if x.is_nan() {
            x
        } else if y.is_nan() {
            y
        } else if x < y {
            x
        } else if y < x {
            y
        } else if x == 0.0 && y == 0.0 {
            if x.is_sign_negative() {
                x
            } else {
                y
            }
        } else {
            x
        }
    }};
}
pub(crate) fn fmax32(x: f32, y: f32) -> f32 {
    fmaxnan!(x, y)
}
pub(crate) fn fmin32(x: f32, y: f32) -> f32 {
    fminnan!(x, y)
}
pub(crate) fn fmax64(x: f64, y: f64) -> f64 {
    fmaxnan!(x, y)
}
pub(crate) fn fmin64(x: f64, y: f64) -> f64 {
    fminnan!(x, y)
}

macro_rules! float_binary_impl {
    ($T:ty, $op:expr, $a:expr, $b:expr, $max:expr, $min:expr) => {{
        let (a, b): (&[$T], &[$T]) = ($a, $b);
        use Opcode as O;
        Some(match $op {
            O::Add => map2(a, b, |x: $T, y: $T| x + y),
            O::Subtract => map2(a, b, |x: $T, y: $T| x - y),
            O::Multiply => map2(a, b, |x: $T, y: $T| x * y),
            O::Divide => map2(a, b, |x: $T, y: $T| x / y),
            O::Remainder => map2(a, b, |x: $T, y: $T| x % y),
            O::Maximum => map2(a, b, $max),
            O::Minimum => map2(a, b, $min),
            O::Power => map2(a, b, |x: $T, y: $T| x.powf(y)),
            O::Atan2 => map2(a, b, |x: $T, y: $T| x.atan2(y)),
            _ => return None,
        })
    }};
}

fn float_binary_f32(op: Opcode, a: &[f32], b: &[f32]) -> Option<Vec<f32>> {
    float_binary_impl!(f32, op, a, b, fmax32, fmin32)
}
fn float_binary_f64(op: Opcode, a: &[f64], b: &[f64]) -> Option<Vec<f64>> {
    float_binary_impl!(f64, op, a, b, fmax64, fmin64)
}

macro_rules! int_binary_impl {
    ($T:ty, $U:ty, $op:expr, $a:expr, $b:expr) => {{
        let (a, b): (&[$T], &[$T]) = ($a, $b);
        const BITS: u32 = <$T>::BITS;
        use Opcode as O;
        #[allow(unused_comparisons)]
        Some(match $op {
            O::Add => map2(a, b, |x: $T, y: $T| x.wrapping_add(y)),
            O::Subtract => map2(a, b, |x: $T, y: $T| x.wrapping_sub(y)),
            O::Multiply => map2(a, b, |x: $T, y: $T| x.wrapping_mul(y)),
            O::Divide => map2(a, b, |x: $T, y: $T| {
                if y == 0 {
                    (0 as $T).wrapping_sub(1)
                } else {
                    x.wrapping_div(y)
                }
            }),
            O::Remainder => map2(a, b, |x: $T, y: $T| if y == 0 { x } else { x.wrapping_rem(y) }),
            O::Maximum => map2(a, b, |x: $T, y: $T| x.max(y)),
            O::Minimum => map2(a, b, |x: $T, y: $T| x.min(y)),
            O::And => map2(a, b, |x: $T, y: $T| x & y),
            O::Or => map2(a, b, |x: $T, y: $T| x | y),
            O::Xor => map2(a, b, |x: $T, y: $T| x ^ y),
            O::ShiftLeft => map2(a, b, |x: $T, y: $T| {
                let s = y as $U;
                if s >= BITS as $U {
                    0
                } else {
                    x << (s as u32)
                }
            }),
            O::ShiftRightLogical => map2(a, b, |x: $T, y: $T| {
                let s = y as $U;
                if s >= BITS as $U {
                    0
                } else {
                    ((x as $U) >> (s as u32)) as $T
                }
            }),
            O::ShiftRightArithmetic => map2(a, b, |x: $T, y: $T| {
                let s = y as $U;
                let s = if s >= BITS as $U { BITS - 1 } else { s as u32 };
                // Arithmetic shift on the signed reinterpretation.
                let neg = (x as $U) >> (BITS - 1) == 1;
                let shifted = (x as $U) >> s;
                let fill = if neg && s > 0 { !((<$U>::MAX) >> s) } else { 0 };
                (shifted | fill) as $T
            }),
            O::Power => map2(a, b, |x: $T, y: $T| {
                if y < 0 {
                    // XLA: x^negative is 1 for x == 1, otherwise 0 (and -1 for x == -1 handled by wrapping).
                    if x == 1 {
                        1
                    } else {
                        0
                    }
                } else {
                    let mut base = x;
                    let mut e = y;
                    let mut acc: $T = 1;
                    while e > 0 {
                        if e & 1 == 1 {
                            acc = acc.wrapping_mul(base);
                        }
                        base = base.wrapping_mul(base);
                        e >>= 1;
                    }
                    acc
                }
            }),
            _ => return None,
        })
    }};
}

/// Applies a binary elementwise opcode (operands of equal type and shape;
/// a scalar operand is broadcast).
pub fn binary(op: Opcode, a: &Array, b: &Array) -> Result<Array, EvalError> {
    let (a, b) = broadcast_scalars(a, b)?;
    if let Some(r) = crate::complex::binary(op, &a, &b) {
        return r;
    }
    let unsupported = || bad(format!("{} of {} is not supported", op, a.ty));
    let unsup = || EvalError::Invalid(format!("{} of {} is not supported", op, a.ty));
    let data = match (&*a.data, &*b.data) {
        (Data::F32(x), Data::F32(y)) => Data::F32(float_binary_f32(op, x, y).ok_or_else(unsup)?),
        (Data::F64(x), Data::F64(y)) => Data::F64(float_binary_f64(op, x, y).ok_or_else(unsup)?),
        (Data::F16(_), Data::F16(_))
        | (Data::Bf16(_), Data::Bf16(_))
        | (Data::F8(_), Data::F8(_)) => {
            let x = widen_f32(&a).expect("float");
            let y = widen_f32(&b).expect("float");
            let r = float_binary_f32(op, &x, &y).ok_or_else(unsup)?;
            narrow_f32(a.ty, &r)?
        }
        (Data::Pred(x), Data::Pred(y)) => Data::Pred(match op {
            Opcode::And | Opcode::Minimum | Opcode::Multiply => map2(x, y, |p, q| p & q),
            Opcode::Or | Opcode::Maximum | Opcode::Add => map2(x, y, |p, q| p | q),
            Opcode::Xor | Opcode::Subtract => map2(x, y, |p, q| p ^ q),
            _ => return unsupported(),
        }),
        (Data::S8(x), Data::S8(y)) => {
            Data::S8((|| int_binary_impl!(i8, u8, op, x, y))().ok_or_else(unsup)?)
        }
        (Data::S16(x), Data::S16(y)) => {
            Data::S16((|| int_binary_impl!(i16, u16, op, x, y))().ok_or_else(unsup)?)
        }
        (Data::S32(x), Data::S32(y)) => {
            Data::S32((|| int_binary_impl!(i32, u32, op, x, y))().ok_or_else(unsup)?)
        }
        (Data::S64(x), Data::S64(y)) => {
            Data::S64((|| int_binary_impl!(i64, u64, op, x, y))().ok_or_else(unsup)?)
        }
        (Data::U8(x), Data::U8(y)) => {
            Data::U8((|| int_binary_impl!(u8, u8, op, x, y))().ok_or_else(unsup)?)
        }
        (Data::U16(x), Data::U16(y)) => {
            Data::U16((|| int_binary_impl!(u16, u16, op, x, y))().ok_or_else(unsup)?)
        }
        (Data::U32(x), Data::U32(y)) => {
            Data::U32((|| int_binary_impl!(u32, u32, op, x, y))().ok_or_else(unsup)?)
        }
        (Data::U64(x), Data::U64(y)) => {
            Data::U64((|| int_binary_impl!(u64, u64, op, x, y))().ok_or_else(unsup)?)
        }
        _ => return bad(format!("{op}: operand types {} and {} differ", a.ty, b.ty)),
    };
    Ok(Array::from_parts(a.ty, a.dims.clone(), data))
}

/// Broadcasts a scalar operand to the other's shape; checks shapes agree.
fn broadcast_scalars(a: &Array, b: &Array) -> Result<(Array, Array), EvalError> {
    if a.dims == b.dims {
        return Ok((a.clone(), b.clone()));
    }
    if a.rank() == 0 {
        return Ok((splat(a, &b.dims), b.clone()));
    }
    if b.rank() == 0 {
        return Ok((a.clone(), splat(b, &a.dims)));
    }
    bad(format!(
        "operand shapes {} and {} differ",
        a.shape(),
        b.shape()
    ))
}

/// A scalar broadcast to `dims`.
pub fn splat(s: &Array, dims: &[i64]) -> Array {
    let n = element_count(dims);
    let data = crate::map_data!(&*s.data, v => vec![v[0]; n]);
    Array::from_parts(s.ty, dims.to_vec(), data)
}

/// Comparison direction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl Direction {
    pub fn parse(s: &str) -> Option<Direction> {
        Some(match s {
            "EQ" => Direction::Eq,
            "NE" => Direction::Ne,
            "LT" => Direction::Lt,
            "LE" => Direction::Le,
            "GT" => Direction::Gt,
            "GE" => Direction::Ge,
            _ => return None,
        })
    }
    #[inline]
    pub fn holds<T: PartialOrd>(self, x: T, y: T) -> bool {
        match self {
            Direction::Eq => x == y,
            Direction::Ne => x != y,
            Direction::Lt => x < y,
            Direction::Le => x <= y,
            Direction::Gt => x > y,
            Direction::Ge => x >= y,
        }
    }
}

/// Maps a float's bits to an integer whose order is XLA's total order
/// (-NaN < -inf < ... < -0 < +0 < ... < inf < NaN).
#[inline]
pub fn total_order_key_f32(x: f32) -> i32 {
    let b = x.to_bits() as i32;
    if b < 0 {
        b ^ 0x7fff_ffff
    } else {
        b
    }
}
#[inline]
pub fn total_order_key_f64(x: f64) -> i64 {
    let b = x.to_bits() as i64;
    if b < 0 {
        b ^ 0x7fff_ffff_ffff_ffff
    } else {
        b
    }
}

/// compare(a, b) with `direction`; `total_order` selects XLA's TOTALORDER.
pub fn compare(
    a: &Array,
    b: &Array,
    dir: Direction,
    total_order: bool,
) -> Result<Array, EvalError> {
    let (a, b) = broadcast_scalars(a, b)?;
    macro_rules! cmp {
        ($x:expr, $y:expr) => {
            map2($x, $y, |p, q| dir.holds(p, q))
        };
    }
    if a.ty.is_complex() {
        let equal = match dir {
            Direction::Eq => true,
            Direction::Ne => false,
            _ => return bad(format!("compare {dir:?} of {} is not supported", a.ty)),
        };
        if let Some(r) = crate::complex::compare(&a, &b, equal) {
            return Ok(Array::from_parts(
                PrimitiveType::Pred,
                a.dims.clone(),
                Data::Pred(r),
            ));
        }
    }
    let out: Vec<bool> = match (&*a.data, &*b.data) {
        (Data::F32(x), Data::F32(y)) => {
            if total_order {
                map2(x, y, |p, q| {
                    dir.holds(total_order_key_f32(p), total_order_key_f32(q))
                })
            } else {
                cmp!(x, y)
            }
        }
        (Data::F64(x), Data::F64(y)) => {
            if total_order {
                map2(x, y, |p, q| {
                    dir.holds(total_order_key_f64(p), total_order_key_f64(q))
                })
            } else {
                cmp!(x, y)
            }
        }
        (Data::F16(_), Data::F16(_))
        | (Data::Bf16(_), Data::Bf16(_))
        | (Data::F8(_), Data::F8(_)) => {
            let x = widen_f32(&a).expect("float");
            let y = widen_f32(&b).expect("float");
            if total_order {
                map2(&x, &y, |p, q| {
                    dir.holds(total_order_key_f32(p), total_order_key_f32(q))
                })
            } else {
                cmp!(&x, &y)
            }
        }
        (Data::Pred(x), Data::Pred(y)) => cmp!(x, y),
        (Data::S8(x), Data::S8(y)) => cmp!(x, y),
        (Data::S16(x), Data::S16(y)) => cmp!(x, y),
        (Data::S32(x), Data::S32(y)) => cmp!(x, y),
        (Data::S64(x), Data::S64(y)) => cmp!(x, y),
        (Data::U8(x), Data::U8(y)) => cmp!(x, y),
        (Data::U16(x), Data::U16(y)) => cmp!(x, y),
        (Data::U32(x), Data::U32(y)) => cmp!(x, y),
        (Data::U64(x), Data::U64(y)) => cmp!(x, y),
        _ => {
            return bad(format!(
                "compare: operand types {} and {} differ",
                a.ty, b.ty
            ))
        }
    };
    Ok(Array::from_parts(
        PrimitiveType::Pred,
        a.dims.clone(),
        Data::Pred(out),
    ))
}

/// select(pred, on_true, on_false); a scalar pred selects whole operands.
pub fn select(p: &Array, t: &Array, f: &Array) -> Result<Array, EvalError> {
    let Data::Pred(pv) = &*p.data else {
        return bad("select: predicate is not pred");
    };
    if t.ty != f.ty || t.dims != f.dims {
        return bad(format!(
            "select: branch shapes {} and {} differ",
            t.shape(),
            f.shape()
        ));
    }
    if p.rank() == 0 && t.rank() != 0 {
        return Ok(if pv[0] { t.clone() } else { f.clone() });
    }
    if p.dims != t.dims {
        return bad(format!(
            "select: predicate shape {} differs from {}",
            p.shape(),
            t.shape()
        ));
    }
    let data = crate::zip_map_data!(&*t.data, &*f.data, x, y => map3(pv, x, y, |c, a, b| if c { a } else { b }), else return bad("select: branch storage differs"));
    Ok(Array::from_parts(t.ty, t.dims.clone(), data))
}

/// clamp(lo, x, hi) = min(max(x, lo), hi); `lo` and `hi` may be scalars.
pub fn clamp(lo: &Array, x: &Array, hi: &Array) -> Result<Array, EvalError> {
    let lo = if lo.rank() == 0 && x.rank() != 0 {
        splat(lo, &x.dims)
    } else {
        lo.clone()
    };
    let hi = if hi.rank() == 0 && x.rank() != 0 {
        splat(hi, &x.dims)
    } else {
        hi.clone()
    };
    let m = binary(Opcode::Maximum, x, &lo)?;
    binary(Opcode::Minimum, &m, &hi)
}

/// Element values as i128 (integers and pred only).
fn ints_i128(a: &Array) -> Option<Vec<i128>> {
    Some(match &*a.data {
        Data::Pred(v) => v.iter().map(|&x| x as i128).collect(),
        Data::S8(v) => v.iter().map(|&x| x as i128).collect(),
        Data::S16(v) => v.iter().map(|&x| x as i128).collect(),
        Data::S32(v) => v.iter().map(|&x| x as i128).collect(),
        Data::S64(v) => v.iter().map(|&x| x as i128).collect(),
        Data::U8(v) => v.iter().map(|&x| x as i128).collect(),
        Data::U16(v) => v.iter().map(|&x| x as i128).collect(),
        Data::U32(v) => v.iter().map(|&x| x as i128).collect(),
        Data::U64(v) => v.iter().map(|&x| x as i128).collect(),
        _ => return None,
    })
}

/// Float element values as f64 (exact).
fn floats_f64(a: &Array) -> Option<Vec<f64>> {
    Some(match &*a.data {
        Data::F16(v) => v.iter().map(|x| x.to_f64()).collect(),
        Data::Bf16(v) => v.iter().map(|x| x.to_f64()).collect(),
        Data::F32(v) => v.iter().map(|&x| x as f64).collect(),
        Data::F64(v) => v.clone(),
        Data::F8(v) => v
            .iter()
            .map(|&x| float_from_bits(a.ty, x as u128).unwrap_or(f64::NAN))
            .collect(),
        _ => return None,
    })
}

/// convert: integers wrap, floats round to nearest even, float to integer
/// truncates toward zero and saturates (NaN gives 0), anything to pred is `!= 0`.
pub fn convert(a: &Array, ty: PrimitiveType) -> Result<Array, EvalError> {
    if a.ty == ty {
        return Ok(a.clone());
    }
    if let Some(r) = crate::complex::convert(a, ty) {
        return r;
    }
    let dims = a.dims.clone();
    // Fast paths for the conversions hot in real models.
    let fast = match (&*a.data, storage_of(ty)?) {
        (Data::F32(v), Storage::Bf16) => Some(Data::Bf16(map1(v, bf16::from_f32))),
        (Data::F32(v), Storage::F16) => Some(Data::F16(map1(v, f16::from_f32))),
        (Data::Bf16(v), Storage::F32) => Some(Data::F32(map1(v, |x| x.to_f32()))),
        (Data::F16(v), Storage::F32) => Some(Data::F32(map1(v, |x| x.to_f32()))),
        (Data::F32(v), Storage::F64) => Some(Data::F64(map1(v, |x| x as f64))),
        (Data::F64(v), Storage::F32) => Some(Data::F32(map1(v, |x| x as f32))),
        (Data::S32(v), Storage::F32) => Some(Data::F32(map1(v, |x| x as f32))),
        (Data::F32(v), Storage::S32) => Some(Data::S32(map1(v, |x| x as i32))),
        (Data::Pred(v), Storage::F32) => Some(Data::F32(map1(v, |x| x as u8 as f32))),
        (Data::Pred(v), Storage::S32) => Some(Data::S32(map1(v, |x| x as i32))),
        (Data::S64(v), Storage::F32) => Some(Data::F32(map1(v, |x| x as f32))),
        (Data::U64(v), Storage::F32) => Some(Data::F32(map1(v, |x| x as f32))),
        (Data::S64(v), Storage::F64) => Some(Data::F64(map1(v, |x| x as f64))),
        (Data::U64(v), Storage::F64) => Some(Data::F64(map1(v, |x| x as f64))),
        _ => None,
    };
    if let Some(d) = fast {
        return Ok(Array::from_parts(ty, dims, d));
    }
    if let Some(f) = floats_f64(a) {
        return Array::from_f64s(ty, dims, &f);
    }
    let Some(v) = ints_i128(a) else {
        return bad(format!("convert from {} is not supported", a.ty));
    };
    let data = match storage_of(ty)? {
        Storage::Pred => Data::Pred(v.iter().map(|&x| x != 0).collect()),
        Storage::S8 => Data::S8(v.iter().map(|&x| x as i8).collect()),
        Storage::S16 => Data::S16(v.iter().map(|&x| x as i16).collect()),
        Storage::S32 => Data::S32(v.iter().map(|&x| x as i32).collect()),
        Storage::S64 => Data::S64(v.iter().map(|&x| x as i64).collect()),
        Storage::U8 => Data::U8(v.iter().map(|&x| x as u8).collect()),
        Storage::U16 => Data::U16(v.iter().map(|&x| x as u16).collect()),
        Storage::U32 => Data::U32(v.iter().map(|&x| x as u32).collect()),
        Storage::U64 => Data::U64(v.iter().map(|&x| x as u64).collect()),
        Storage::F32 => Data::F32(v.iter().map(|&x| x as f32).collect()),
        Storage::F64 => Data::F64(v.iter().map(|&x| x as f64).collect()),
        _ => {
            let f: Vec<f64> = v.iter().map(|&x| x as f64).collect();
            return Array::from_f64s(ty, dims, &f);
        }
    };
    Ok(Array::from_parts(ty, dims, data))
}

/// Little-endian bytes of every element.
pub(crate) fn to_bytes(a: &Array) -> Vec<u8> {
    let mut out = Vec::with_capacity(a.len() * a.ty.byte_width().max(1));
    match &*a.data {
        Data::Pred(v) => v.iter().for_each(|&x| out.push(x as u8)),
        Data::S8(v) => v.iter().for_each(|&x| out.extend(x.to_le_bytes())),
        Data::S16(v) => v.iter().for_each(|&x| out.extend(x.to_le_bytes())),
        Data::S32(v) => v.iter().for_each(|&x| out.extend(x.to_le_bytes())),
        Data::S64(v) => v.iter().for_each(|&x| out.extend(x.to_le_bytes())),
        Data::U8(v) => out.extend_from_slice(v),
        Data::U16(v) => v.iter().for_each(|&x| out.extend(x.to_le_bytes())),
        Data::U32(v) => v.iter().for_each(|&x| out.extend(x.to_le_bytes())),
        Data::U64(v) => v.iter().for_each(|&x| out.extend(x.to_le_bytes())),
        Data::F16(v) => v
            .iter()
            .for_each(|&x| out.extend(x.to_bits().to_le_bytes())),
        Data::Bf16(v) => v
            .iter()
            .for_each(|&x| out.extend(x.to_bits().to_le_bytes())),
        Data::F32(v) => v.iter().for_each(|&x| out.extend(x.to_le_bytes())),
        Data::F64(v) => v.iter().for_each(|&x| out.extend(x.to_le_bytes())),
        Data::F8(v) => out.extend_from_slice(v),
        Data::C64(v) => v.iter().for_each(|z| {
            out.extend(z.re.to_le_bytes());
            out.extend(z.im.to_le_bytes());
        }),
        Data::C128(v) => v.iter().for_each(|z| {
            out.extend(z.re.to_le_bytes());
            out.extend(z.im.to_le_bytes());
        }),
    }
    out
}

/// Builds storage for `ty` from little-endian bytes.
pub(crate) fn from_bytes(ty: PrimitiveType, b: &[u8]) -> Result<Data, EvalError> {
    macro_rules! chunks {
        ($T:ty, $n:expr) => {
            b.chunks_exact($n)
                .map(|c| <$T>::from_le_bytes(c.try_into().expect("chunk size")))
                .collect()
        };
    }
    Ok(match storage_of(ty)? {
        Storage::Pred => Data::Pred(b.iter().map(|&x| x != 0).collect()),
        Storage::S8 => Data::S8(b.iter().map(|&x| x as i8).collect()),
        Storage::S16 => Data::S16(chunks!(i16, 2)),
        Storage::S32 => Data::S32(chunks!(i32, 4)),
        Storage::S64 => Data::S64(chunks!(i64, 8)),
        Storage::U8 => Data::U8(b.to_vec()),
        Storage::U16 => Data::U16(chunks!(u16, 2)),
        Storage::U32 => Data::U32(chunks!(u32, 4)),
        Storage::U64 => Data::U64(chunks!(u64, 8)),
        Storage::F16 => Data::F16(
            b.chunks_exact(2)
                .map(|c| f16::from_bits(u16::from_le_bytes([c[0], c[1]])))
                .collect(),
        ),
        Storage::Bf16 => Data::Bf16(
            b.chunks_exact(2)
                .map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]])))
                .collect(),
        ),
        Storage::F32 => Data::F32(chunks!(f32, 4)),
        Storage::F64 => Data::F64(chunks!(f64, 8)),
        Storage::F8 => Data::F8(b.to_vec()),
        Storage::C64 => {
            let parts: Vec<f32> = chunks!(f32, 4);
            Data::C64(
                parts
                    .chunks_exact(2)
                    .map(|p| crate::value::Complex32::new(p[0], p[1]))
                    .collect(),
            )
        }
        Storage::C128 => {
            let parts: Vec<f64> = chunks!(f64, 8);
            Data::C128(
                parts
                    .chunks_exact(2)
                    .map(|p| crate::value::Complex64::new(p[0], p[1]))
                    .collect(),
            )
        }
    })
}

/// bitcast-convert: reinterprets the bits; with different widths the
/// minor-most dimension of the wider side holds the narrower elements.
pub fn bitcast_convert(a: &Array, ty: PrimitiveType, out_dims: &[i64]) -> Result<Array, EvalError> {
    let bytes = to_bytes(a);
    let n = element_count(out_dims);
    if bytes.len() != n * ty.byte_width().max(1) {
        return bad(format!(
            "bitcast-convert from {} to {ty}{out_dims:?}: sizes differ",
            a.shape()
        ));
    }
    Ok(Array::from_parts(
        ty,
        out_dims.to_vec(),
        from_bytes(ty, &bytes)?,
    ))
}

fn reduce_precision_bits(
    bits: u64,
    src_exp: u32,
    src_mant: u32,
    exp_bits: u32,
    mant_bits: u32,
) -> u64 {
    let total = 1 + src_exp + src_mant;
    let all = if total == 64 {
        u64::MAX
    } else {
        (1u64 << total) - 1
    };
    let mut x = bits;
    if mant_bits < src_mant {
        let shift = src_mant - mant_bits;
        let last_mantissa_bit_mask = 1u64 << shift;
        let base_rounding_bias = (last_mantissa_bit_mask >> 1).wrapping_sub(1);
        let x_last = (x & last_mantissa_bit_mask) >> shift;
        let bias = x_last.wrapping_add(base_rounding_bias);
        let truncation_mask = !(last_mantissa_bit_mask - 1);
        x = (x.wrapping_add(bias) & truncation_mask) & all;
    }
    if exp_bits < src_exp {
        let sign_mask = 1u64 << (total - 1);
        let exp_mask = ((1u64 << src_exp) - 1) << src_mant;
        let exponent_bias = (1u64 << (src_exp - 1)) - 1;
        let reduced_bias = if exp_bits == 0 {
            0
        } else {
            (1u64 << (exp_bits - 1)) - 1
        };
        let reduced_max = exponent_bias + reduced_bias;
        let reduced_min = exponent_bias - reduced_bias;
        let x_exp = x & exp_mask;
        let overflows = x_exp > (reduced_max << src_mant);
        let underflows = x_exp <= (reduced_min << src_mant);
        let signed_zero = x & sign_mask;
        let signed_inf = signed_zero | exp_mask;
        x = if overflows {
            signed_inf
        } else if underflows {
            signed_zero
        } else {
            x
        };
    }
    x
}

/// reduce-precision to `exponent_bits`/`mantissa_bits`, as XLA emulates it.
pub fn reduce_precision(a: &Array, exp_bits: i64, mant_bits: i64) -> Result<Array, EvalError> {
    if exp_bits < 1 || mant_bits < 0 {
        return bad("reduce-precision: bad bit counts");
    }
    let (e, m) = (exp_bits as u32, mant_bits as u32);
    let fix_nan = |orig_nan: bool, r_bits_nan: bool| orig_nan && !r_bits_nan;
    let _ = fix_nan;
    let f32_op = move |x: f32| -> f32 {
        let r = f32::from_bits(
            reduce_precision_bits(x.to_bits() as u64, 8, 23, e.min(8), m.min(23)) as u32,
        );
        if x.is_nan() {
            if m > 0 {
                x
            } else {
                f32::INFINITY.copysign(x)
            }
        } else {
            r
        }
    };
    let data = match &*a.data {
        Data::F32(v) => Data::F32(map1(v, f32_op)),
        Data::F64(v) => Data::F64(map1(v, move |x: f64| {
            let r = f64::from_bits(reduce_precision_bits(
                x.to_bits(),
                11,
                52,
                e.min(11),
                m.min(52),
            ));
            if x.is_nan() {
                if m > 0 {
                    x
                } else {
                    f64::INFINITY.copysign(x)
                }
            } else {
                r
            }
        })),
        _ => match widen_f32(a) {
            Some(w) => narrow_f32(a.ty, &map1(&w, f32_op))?,
            None => return bad(format!("reduce-precision of {}", a.ty)),
        },
    };
    Ok(Array::from_parts(a.ty, a.dims.clone(), data))
}
