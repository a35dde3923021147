//! Runtime values: dense, typed, row-major arrays and tuples of values.
//!
//! Invariants:
//! - `Array::data.len() == product(dims)` and the `Data` variant matches
//!   `Array::ty` (`storage_of(ty)`): pred is `Pred(Vec<bool>)`, f8 kinds are
//!   `F8(Vec<u8>)` holding bit patterns, c64/c128 are `num_complex`
//!   pairs, every other supported type has its own native vector.
//! - Array storage is shared (`Arc`), so reshape, bitcast, copy, tuple and
//!   get-tuple-element never copy elements; mutation goes through
//!   `Arc::make_mut`, which copies only when the storage is shared.

use crate::error::EvalError;
use half::{bf16, f16};
pub use num_complex::{Complex32, Complex64};
use std::sync::Arc;
use xla_hlo_ir::literal::{float_from_bits, float_to_bits, ArrayLiteral};
use xla_hlo_ir::{Literal, PrimitiveType, Shape};

/// Typed element storage.
#[derive(Clone, Debug, PartialEq)]
pub enum Data {
    Pred(Vec<bool>),
    S8(Vec<i8>),
    S16(Vec<i16>),
    S32(Vec<i32>),
    S64(Vec<i64>),
    U8(Vec<u8>),
    U16(Vec<u16>),
    U32(Vec<u32>),
    U64(Vec<u64>),
    F16(Vec<f16>),
    Bf16(Vec<bf16>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    /// Bit patterns of one of the f8 kinds (the array's `ty` says which).
    F8(Vec<u8>),
    C64(Vec<Complex32>),
    C128(Vec<Complex64>),
}

/// Applies a type-generic expression to the vector inside a `Data`,
/// producing a `Data` of the same variant.
#[macro_export]
#[doc(hidden)]
macro_rules! map_data {
    ($d:expr, $v:ident => $e:expr) => {
        match $d {
            $crate::value::Data::Pred($v) => $crate::value::Data::Pred($e),
            $crate::value::Data::S8($v) => $crate::value::Data::S8($e),
            $crate::value::Data::S16($v) => $crate::value::Data::S16($e),
            $crate::value::Data::S32($v) => $crate::value::Data::S32($e),
            $crate::value::Data::S64($v) => $crate::value::Data::S64($e),
            $crate::value::Data::U8($v) => $crate::value::Data::U8($e),
            $crate::value::Data::U16($v) => $crate::value::Data::U16($e),
            $crate::value::Data::U32($v) => $crate::value::Data::U32($e),
            $crate::value::Data::U64($v) => $crate::value::Data::U64($e),
            $crate::value::Data::F16($v) => $crate::value::Data::F16($e),
            $crate::value::Data::Bf16($v) => $crate::value::Data::Bf16($e),
            $crate::value::Data::F32($v) => $crate::value::Data::F32($e),
            $crate::value::Data::F64($v) => $crate::value::Data::F64($e),
            $crate::value::Data::F8($v) => $crate::value::Data::F8($e),
            $crate::value::Data::C64($v) => $crate::value::Data::C64($e),
            $crate::value::Data::C128($v) => $crate::value::Data::C128($e),
        }
    };
}

/// Applies a type-generic expression to the vector inside a `Data`.
#[macro_export]
#[doc(hidden)]
macro_rules! with_data {
    ($d:expr, $v:ident => $e:expr) => {
        match $d {
            $crate::value::Data::Pred($v) => $e,
            $crate::value::Data::S8($v) => $e,
            $crate::value::Data::S16($v) => $e,
            $crate::value::Data::S32($v) => $e,
            $crate::value::Data::S64($v) => $e,
            $crate::value::Data::U8($v) => $e,
            $crate::value::Data::U16($v) => $e,
            $crate::value::Data::U32($v) => $e,
            $crate::value::Data::U64($v) => $e,
            $crate::value::Data::F16($v) => $e,
            $crate::value::Data::Bf16($v) => $e,
            $crate::value::Data::F32($v) => $e,
            $crate::value::Data::F64($v) => $e,
            $crate::value::Data::F8($v) => $e,
            $crate::value::Data::C64($v) => $e,
            $crate::value::Data::C128($v) => $e,
        }
    };
}

/// Applies a type-generic expression to two `Data` of the same variant.
#[macro_export]
#[doc(hidden)]
macro_rules! zip_data {
    ($a:expr, $b:expr, $x:ident, $y:ident => $e:expr, else $f:expr) => {
        match ($a, $b) {
            ($crate::value::Data::Pred($x), $crate::value::Data::Pred($y)) => $e,
            ($crate::value::Data::S8($x), $crate::value::Data::S8($y)) => $e,
            ($crate::value::Data::S16($x), $crate::value::Data::S16($y)) => $e,
            ($crate::value::Data::S32($x), $crate::value::Data::S32($y)) => $e,
            ($crate::value::Data::S64($x), $crate::value::Data::S64($y)) => $e,
            ($crate::value::Data::U8($x), $crate::value::Data::U8($y)) => $e,
            ($crate::value::Data::U16($x), $crate::value::Data::U16($y)) => $e,
            ($crate::value::Data::U32($x), $crate::value::Data::U32($y)) => $e,
            ($crate::value::Data::U64($x), $crate::value::Data::U64($y)) => $e,
            ($crate::value::Data::F16($x), $crate::value::Data::F16($y)) => $e,
            ($crate::value::Data::Bf16($x), $crate::value::Data::Bf16($y)) => $e,
            ($crate::value::Data::F32($x), $crate::value::Data::F32($y)) => $e,
            ($crate::value::Data::F64($x), $crate::value::Data::F64($y)) => $e,
            ($crate::value::Data::F8($x), $crate::value::Data::F8($y)) => $e,
            ($crate::value::Data::C64($x), $crate::value::Data::C64($y)) => $e,
            ($crate::value::Data::C128($x), $crate::value::Data::C128($y)) => $e,
            _ => $f,
        }
    };
}

/// Applies a type-generic expression to two `Data` of the same variant,
/// producing a `Data` of that variant.
#[macro_export]
#[doc(hidden)]
macro_rules! zip_map_data {
    ($a:expr, $b:expr, $x:ident, $y:ident => $e:expr, else $f:expr) => {
        match ($a, $b) {
            ($crate::value::Data::Pred($x), $crate::value::Data::Pred($y)) => {
                $crate::value::Data::Pred($e)
            }
            ($crate::value::Data::S8($x), $crate::value::Data::S8($y)) => {
                $crate::value::Data::S8($e)
            }
            ($crate::value::Data::S16($x), $crate::value::Data::S16($y)) => {
                $crate::value::Data::S16($e)
            }
            ($crate::value::Data::S32($x), $crate::value::Data::S32($y)) => {
                $crate::value::Data::S32($e)
            }
            ($crate::value::Data::S64($x), $crate::value::Data::S64($y)) => {
                $crate::value::Data::S64($e)
            }
            ($crate::value::Data::U8($x), $crate::value::Data::U8($y)) => {
                $crate::value::Data::U8($e)
            }
            ($crate::value::Data::U16($x), $crate::value::Data::U16($y)) => {
                $crate::value::Data::U16($e)
            }
            ($crate::value::Data::U32($x), $crate::value::Data::U32($y)) => {
                $crate::value::Data::U32($e)
            }
            ($crate::value::Data::U64($x), $crate::value::Data::U64($y)) => {
                $crate::value::Data::U64($e)
            }
            ($crate::value::Data::F16($x), $crate::value::Data::F16($y)) => {
                $crate::value::Data::F16($e)
            }
            ($crate::value::Data::Bf16($x), $crate::value::Data::Bf16($y)) => {
                $crate::value::Data::Bf16($e)
            }
            ($crate::value::Data::F32($x), $crate::value::Data::F32($y)) => {
                $crate::value::Data::F32($e)
            }
            ($crate::value::Data::F64($x), $crate::value::Data::F64($y)) => {
                $crate::value::Data::F64($e)
            }
            ($crate::value::Data::F8($x), $crate::value::Data::F8($y)) => {
                $crate::value::Data::F8($e)
            }
            ($crate::value::Data::C64($x), $crate::value::Data::C64($y)) => {
                $crate::value::Data::C64($e)
            }
            ($crate::value::Data::C128($x), $crate::value::Data::C128($y)) => {
                $crate::value::Data::C128($e)
            }
            _ => $f,
        }
    };
}

impl Data {
    pub fn len(&self) -> usize {
        with_data!(self, v => v.len())
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// A zero-filled (false, 0, +0.0) vector of `n` elements for `ty`.
    pub fn zeros(ty: PrimitiveType, n: usize) -> Result<Data, EvalError> {
        Ok(match storage_of(ty)? {
            Storage::Pred => Data::Pred(vec![false; n]),
            Storage::S8 => Data::S8(vec![0; n]),
            Storage::S16 => Data::S16(vec![0; n]),
            Storage::S32 => Data::S32(vec![0; n]),
            Storage::S64 => Data::S64(vec![0; n]),
            Storage::U8 => Data::U8(vec![0; n]),
            Storage::U16 => Data::U16(vec![0; n]),
            Storage::U32 => Data::U32(vec![0; n]),
            Storage::U64 => Data::U64(vec![0; n]),
            Storage::F16 => Data::F16(vec![f16::ZERO; n]),
            Storage::Bf16 => Data::Bf16(vec![bf16::ZERO; n]),
            Storage::F32 => Data::F32(vec![0.0; n]),
            Storage::F64 => Data::F64(vec![0.0; n]),
            Storage::F8 => Data::F8(vec![0; n]),
            Storage::C64 => Data::C64(vec![Complex32::new(0.0, 0.0); n]),
            Storage::C128 => Data::C128(vec![Complex64::new(0.0, 0.0); n]),
        })
    }
    /// An empty vector of the same variant with room for `n` elements.
    pub fn empty_like(&self, n: usize) -> Data {
        map_data!(self, _v => Vec::with_capacity(n))
    }
}

/// Which `Data` variant stores a type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Storage {
    Pred,
    S8,
    S16,
    S32,
    S64,
    U8,
    U16,
    U32,
    U64,
    F16,
    Bf16,
    F32,
    F64,
    F8,
    C64,
    C128,
}

/// The storage of an element type, or an error for types the interpreter
/// does not hold (sub-byte integers, f6/f4, token, opaque).
pub fn storage_of(ty: PrimitiveType) -> Result<Storage, EvalError> {
    use PrimitiveType as P;
    Ok(match ty {
        P::Pred => Storage::Pred,
        P::S8 => Storage::S8,
        P::S16 => Storage::S16,
        P::S32 => Storage::S32,
        P::S64 => Storage::S64,
        P::U8 => Storage::U8,
        P::U16 => Storage::U16,
        P::U32 => Storage::U32,
        P::U64 => Storage::U64,
        P::F16 => Storage::F16,
        P::Bf16 => Storage::Bf16,
        P::F32 => Storage::F32,
        P::F64 => Storage::F64,
        P::F8E5M2
        | P::F8E4M3
        | P::F8E4M3FN
        | P::F8E4M3B11FNUZ
        | P::F8E3M4
        | P::F8E5M2FNUZ
        | P::F8E4M3FNUZ
        | P::F8E8M0FNU => Storage::F8,
        P::C64 => Storage::C64,
        P::C128 => Storage::C128,
        other => return Err(EvalError::UnsupportedType(other)),
    })
}

/// A dense row-major array.
#[derive(Clone, Debug, PartialEq)]
pub struct Array {
    pub ty: PrimitiveType,
    pub dims: Vec<i64>,
    pub data: Arc<Data>,
}

impl Array {
    /// Builds an array, checking that the element count and storage match.
    pub fn new(ty: PrimitiveType, dims: Vec<i64>, data: Data) -> Result<Array, EvalError> {
        let n = element_count(&dims);
        if data.len() != n {
            return Err(EvalError::Internal(format!(
                "array of {ty}{dims:?} built from {} elements",
                data.len()
            )));
        }
        if storage_of(ty)? != data_storage(&data) {
            return Err(EvalError::Internal(format!(
                "array of {ty} built from mismatched storage"
            )));
        }
        Ok(Array {
            ty,
            dims,
            data: Arc::new(data),
        })
    }
    /// Internal constructor for callers that maintain the invariants.
    pub(crate) fn from_parts(ty: PrimitiveType, dims: Vec<i64>, data: Data) -> Array {
        debug_assert_eq!(data.len(), element_count(&dims));
        Array {
            ty,
            dims,
            data: Arc::new(data),
        }
    }
    pub fn zeros(ty: PrimitiveType, dims: Vec<i64>) -> Result<Array, EvalError> {
        let n = element_count(&dims);
        Ok(Array::from_parts(ty, dims, Data::zeros(ty, n)?))
    }
    pub fn len(&self) -> usize {
        self.data.len()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn rank(&self) -> usize {
        self.dims.len()
    }
    pub fn shape(&self) -> Shape {
        Shape::array(self.ty, self.dims.clone())
    }
    /// The same elements under new dimensions (no copy).
    pub fn reshaped(&self, dims: Vec<i64>) -> Array {
        Array {
            ty: self.ty,
            dims,
            data: self.data.clone(),
        }
    }
    pub fn scalar_f32(v: f32) -> Array {
        Array::from_parts(PrimitiveType::F32, vec![], Data::F32(vec![v]))
    }
    pub fn scalar_s32(v: i32) -> Array {
        Array::from_parts(PrimitiveType::S32, vec![], Data::S32(vec![v]))
    }
    pub fn scalar_u32(v: u32) -> Array {
        Array::from_parts(PrimitiveType::U32, vec![], Data::U32(vec![v]))
    }
    pub fn from_f32(dims: Vec<i64>, v: Vec<f32>) -> Result<Array, EvalError> {
        Array::new(PrimitiveType::F32, dims, Data::F32(v))
    }

    /// Element `i` as an i64 (pred 0/1, floats truncated); for indices.
    pub fn get_i64(&self, i: usize) -> i64 {
        match &*self.data {
            Data::Pred(v) => v[i] as i64,
            Data::S8(v) => v[i] as i64,
            Data::S16(v) => v[i] as i64,
            Data::S32(v) => v[i] as i64,
            Data::S64(v) => v[i],
            Data::U8(v) => v[i] as i64,
            Data::U16(v) => v[i] as i64,
            Data::U32(v) => v[i] as i64,
            Data::U64(v) => v[i] as i64,
            _ => self.get_f64(i) as i64,
        }
    }
    /// Element `i` as f64 (exact for every type but 64-bit integers; the
    /// real part of a complex element).
    pub fn get_f64(&self, i: usize) -> f64 {
        match &*self.data {
            Data::Pred(v) => v[i] as u8 as f64,
            Data::S8(v) => v[i] as f64,
            Data::S16(v) => v[i] as f64,
            Data::S32(v) => v[i] as f64,
            Data::S64(v) => v[i] as f64,
            Data::U8(v) => v[i] as f64,
            Data::U16(v) => v[i] as f64,
            Data::U32(v) => v[i] as f64,
            Data::U64(v) => v[i] as f64,
            Data::F16(v) => v[i].to_f64(),
            Data::Bf16(v) => v[i].to_f64(),
            Data::F32(v) => v[i] as f64,
            Data::F64(v) => v[i],
            Data::F8(v) => float_from_bits(self.ty, v[i] as u128).unwrap_or(f64::NAN),
            Data::C64(v) => v[i].re as f64,
            Data::C128(v) => v[i].re,
        }
    }
    /// The imaginary part of element `i` as f64 (0 for real types).
    pub fn get_imag(&self, i: usize) -> f64 {
        match &*self.data {
            Data::C64(v) => v[i].im as f64,
            Data::C128(v) => v[i].im,
            _ => 0.0,
        }
    }
    /// All elements as f64 (for comparisons and reports).
    pub fn to_f64_vec(&self) -> Vec<f64> {
        (0..self.len()).map(|i| self.get_f64(i)).collect()
    }

    /// Converts a constant literal.
    pub fn from_literal(lit: &ArrayLiteral) -> Result<Array, EvalError> {
        let ty = lit.element_type();
        let n = lit.len();
        let data = match storage_of(ty)? {
            Storage::Pred => Data::Pred((0..n).map(|i| lit.get_i128(i) != 0).collect()),
            Storage::S8 => Data::S8((0..n).map(|i| lit.get_i128(i) as i8).collect()),
            Storage::S16 => Data::S16((0..n).map(|i| lit.get_i128(i) as i16).collect()),
            Storage::S32 => Data::S32((0..n).map(|i| lit.get_i128(i) as i32).collect()),
            Storage::S64 => Data::S64((0..n).map(|i| lit.get_i128(i) as i64).collect()),
            Storage::U8 => Data::U8((0..n).map(|i| lit.get_i128(i) as u8).collect()),
            Storage::U16 => Data::U16((0..n).map(|i| lit.get_i128(i) as u16).collect()),
            Storage::U32 => Data::U32((0..n).map(|i| lit.get_i128(i) as u32).collect()),
            Storage::U64 => Data::U64((0..n).map(|i| lit.get_i128(i) as u64).collect()),
            Storage::F16 => Data::F16((0..n).map(|i| f16::from_bits(lit.bits(i) as u16)).collect()),
            Storage::Bf16 => Data::Bf16(
                (0..n)
                    .map(|i| bf16::from_bits(lit.bits(i) as u16))
                    .collect(),
            ),
            Storage::F32 => Data::F32((0..n).map(|i| f32::from_bits(lit.bits(i) as u32)).collect()),
            Storage::F64 => Data::F64((0..n).map(|i| f64::from_bits(lit.bits(i) as u64)).collect()),
            Storage::F8 => Data::F8((0..n).map(|i| lit.bits(i) as u8).collect()),
            Storage::C64 => Data::C64(
                (0..n)
                    .map(|i| {
                        let (re, im) = lit.get_complex(i);
                        Complex32::new(re as f32, im as f32)
                    })
                    .collect(),
            ),
            Storage::C128 => Data::C128(
                (0..n)
                    .map(|i| {
                        let (re, im) = lit.get_complex(i);
                        Complex64::new(re, im)
                    })
                    .collect(),
            ),
        };
        Ok(Array::from_parts(ty, lit.shape.dims.clone(), data))
    }

    /// Converts to a literal (bit-exact).
    pub fn to_literal(&self) -> ArrayLiteral {
        let mut lit = ArrayLiteral::zeros(xla_hlo_ir::ArrayShape::new(self.ty, self.dims.clone()));
        for i in 0..self.len() {
            match &*self.data {
                Data::C64(v) => {
                    lit.set_complex(i, v[i].re as f64, v[i].im as f64);
                    continue;
                }
                Data::C128(v) => {
                    lit.set_complex(i, v[i].re, v[i].im);
                    continue;
                }
                _ => {}
            }
            let bits: u128 = match &*self.data {
                Data::Pred(v) => v[i] as u128,
                Data::S8(v) => v[i] as u8 as u128,
                Data::S16(v) => v[i] as u16 as u128,
                Data::S32(v) => v[i] as u32 as u128,
                Data::S64(v) => v[i] as u64 as u128,
                Data::U8(v) => v[i] as u128,
                Data::U16(v) => v[i] as u128,
                Data::U32(v) => v[i] as u128,
                Data::U64(v) => v[i] as u128,
                Data::F16(v) => v[i].to_bits() as u128,
                Data::Bf16(v) => v[i].to_bits() as u128,
                Data::F32(v) => v[i].to_bits() as u128,
                Data::F64(v) => v[i].to_bits() as u128,
                Data::F8(v) => v[i] as u128,
                Data::C64(_) | Data::C128(_) => unreachable!("complex elements set above"),
            };
            lit.set_bits(i, bits);
        }
        lit
    }

    /// Builds an array of type `ty` from f64 values (rounded to nearest
    /// even; complex types take them as real parts).
    pub fn from_f64s(ty: PrimitiveType, dims: Vec<i64>, v: &[f64]) -> Result<Array, EvalError> {
        let data = match storage_of(ty)? {
            Storage::Pred => Data::Pred(v.iter().map(|&x| x != 0.0).collect()),
            Storage::S8 => Data::S8(v.iter().map(|&x| x as i8).collect()),
            Storage::S16 => Data::S16(v.iter().map(|&x| x as i16).collect()),
            Storage::S32 => Data::S32(v.iter().map(|&x| x as i32).collect()),
            Storage::S64 => Data::S64(v.iter().map(|&x| x as i64).collect()),
            Storage::U8 => Data::U8(v.iter().map(|&x| x as u8).collect()),
            Storage::U16 => Data::U16(v.iter().map(|&x| x as u16).collect()),
            Storage::U32 => Data::U32(v.iter().map(|&x| x as u32).collect()),
            Storage::U64 => Data::U64(v.iter().map(|&x| x as u64).collect()),
            Storage::F16 => Data::F16(v.iter().map(|&x| f16::from_f64(x)).collect()),
            Storage::Bf16 => Data::Bf16(v.iter().map(|&x| bf16::from_f64(x)).collect()),
            Storage::F32 => Data::F32(v.iter().map(|&x| x as f32).collect()),
            Storage::F64 => Data::F64(v.to_vec()),
            Storage::F8 => Data::F8(
                v.iter()
                    .map(|&x| float_to_bits(ty, x).unwrap_or(0) as u8)
                    .collect(),
            ),
            Storage::C64 => Data::C64(v.iter().map(|&x| Complex32::new(x as f32, 0.0)).collect()),
            Storage::C128 => Data::C128(v.iter().map(|&x| Complex64::new(x, 0.0)).collect()),
        };
        Array::new(ty, dims, data)
    }
}

/// The storage kind of a `Data`.
pub fn data_storage(d: &Data) -> Storage {
    match d {
        Data::Pred(_) => Storage::Pred,
        Data::S8(_) => Storage::S8,
        Data::S16(_) => Storage::S16,
        Data::S32(_) => Storage::S32,
        Data::S64(_) => Storage::S64,
        Data::U8(_) => Storage::U8,
        Data::U16(_) => Storage::U16,
        Data::U32(_) => Storage::U32,
        Data::U64(_) => Storage::U64,
        Data::F16(_) => Storage::F16,
        Data::Bf16(_) => Storage::Bf16,
        Data::F32(_) => Storage::F32,
        Data::F64(_) => Storage::F64,
        Data::F8(_) => Storage::F8,
        Data::C64(_) => Storage::C64,
        Data::C128(_) => Storage::C128,
    }
}

/// Product of dimensions (negative dims count as 0).
pub fn element_count(dims: &[i64]) -> usize {
    dims.iter().map(|&d| d.max(0) as usize).product()
}

/// A runtime value: an array, a tuple, or a token.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Array(Array),
    Tuple(Vec<Value>),
    Token,
}

impl Value {
    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
    pub fn into_array(self) -> Option<Array> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
    pub fn tuple_elements(&self) -> Option<&[Value]> {
        match self {
            Value::Tuple(v) => Some(v),
            _ => None,
        }
    }
    /// Leaves in depth-first order.
    pub fn leaves(&self) -> Vec<&Array> {
        let mut out = Vec::new();
        fn walk<'a>(v: &'a Value, out: &mut Vec<&'a Array>) {
            match v {
                Value::Array(a) => out.push(a),
                Value::Tuple(e) => e.iter().for_each(|x| walk(x, out)),
                Value::Token => {}
            }
        }
        walk(self, &mut out);
        out
    }
    /// Converts a literal (tuples recursively).
    pub fn from_literal(lit: &Literal) -> Result<Value, EvalError> {
        Ok(match lit {
            Literal::Array(a) if a.element_type() == PrimitiveType::Token => Value::Token,
            Literal::Array(a) => Value::Array(Array::from_literal(a)?),
            Literal::Tuple(e) => Value::Tuple(
                e.iter()
                    .map(Value::from_literal)
                    .collect::<Result<_, _>>()?,
            ),
        })
    }
    /// True when the value has `shape` (element types and dims; layouts ignored).
    pub fn matches_shape(&self, shape: &Shape) -> bool {
        match (self, shape) {
            (Value::Array(a), Shape::Array(s)) => s.element_type == a.ty && s.dims == a.dims,
            (Value::Token, Shape::Array(s)) => s.element_type == PrimitiveType::Token,
            (Value::Tuple(v), Shape::Tuple(s)) => {
                v.len() == s.len() && v.iter().zip(s).all(|(x, y)| x.matches_shape(y))
            }
            _ => false,
        }
    }
    /// A short description of the value's shape, for error messages.
    pub fn shape_string(&self) -> String {
        match self {
            Value::Array(a) => format!("{}", a.shape()),
            Value::Token => "token[]".into(),
            Value::Tuple(v) => format!(
                "({})",
                v.iter()
                    .map(|x| x.shape_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
    /// A zero value of `shape` (tokens for token leaves).
    pub fn zeros(shape: &Shape) -> Result<Value, EvalError> {
        Ok(match shape {
            Shape::Tuple(e) => Value::Tuple(e.iter().map(Value::zeros).collect::<Result<_, _>>()?),
            Shape::Array(a) if a.element_type == PrimitiveType::Token => Value::Token,
            Shape::Array(a) => Value::Array(Array::zeros(a.element_type, a.dims.clone())?),
            Shape::Buffer(b) => Value::zeros(b)?,
        })
    }
}

impl From<Array> for Value {
    fn from(a: Array) -> Value {
        Value::Array(a)
    }
}
