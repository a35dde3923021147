//! `.npy` input and output for arrays (the `npyz` crate), plus the argument
//! conventions of the corpus: bf16 and f8 arrays travel as float32 holding
//! exactly-representable values.
//!
//! Invariants: reading never panics on a malformed file (errors name the
//! file); Fortran-ordered files are transposed to row-major; writing uses
//! the array's own numpy dtype, with bf16/f8 widened to float32.

use crate::elementwise::convert;
use crate::error::EvalError;
use crate::value::{Array, Data};
use npyz::{DType, TypeChar, WriterBuilder};
use std::path::Path;
use xla_hlo_ir::{PrimitiveType, Shape};

fn io_err(path: &Path, e: impl std::fmt::Display) -> EvalError {
    EvalError::Io(format!("{}: {e}", path.display()))
}

/// Reads an `.npy` file into an array of the matching element type.
pub fn read_npy(path: &Path) -> Result<Array, EvalError> {
    let bytes = std::fs::read(path).map_err(|e| io_err(path, e))?;
    read_npy_bytes(&bytes).map_err(|e| io_err(path, e))
}

/// Parses `.npy` bytes.
pub fn read_npy_bytes(bytes: &[u8]) -> Result<Array, String> {
    let npy = npyz::NpyFile::new(bytes).map_err(|e| e.to_string())?;
    let shape: Vec<i64> = npy.shape().iter().map(|&d| d as i64).collect();
    let fortran = npy.order() == npyz::Order::Fortran;
    let DType::Plain(ts) = npy.dtype() else {
        return Err("structured dtypes are not supported".into());
    };
    let size = ts.size_field();
    macro_rules! rd {
        ($T:ty) => {
            npy.into_vec::<$T>().map_err(|e| e.to_string())?
        };
    }
    let (ty, data) = match (ts.type_char(), size) {
        (TypeChar::Bool, 1) => (PrimitiveType::Pred, Data::Pred(rd!(bool))),
        (TypeChar::Int, 1) => (PrimitiveType::S8, Data::S8(rd!(i8))),
        (TypeChar::Int, 2) => (PrimitiveType::S16, Data::S16(rd!(i16))),
        (TypeChar::Int, 4) => (PrimitiveType::S32, Data::S32(rd!(i32))),
        (TypeChar::Int, 8) => (PrimitiveType::S64, Data::S64(rd!(i64))),
        (TypeChar::Uint, 1) => (PrimitiveType::U8, Data::U8(rd!(u8))),
        (TypeChar::Uint, 2) => (PrimitiveType::U16, Data::U16(rd!(u16))),
        (TypeChar::Uint, 4) => (PrimitiveType::U32, Data::U32(rd!(u32))),
        (TypeChar::Uint, 8) => (PrimitiveType::U64, Data::U64(rd!(u64))),
        (TypeChar::Float, 2) => (PrimitiveType::F16, Data::F16(rd!(half::f16))),
        (TypeChar::Float, 4) => (PrimitiveType::F32, Data::F32(rd!(f32))),
        (TypeChar::Float, 8) => (PrimitiveType::F64, Data::F64(rd!(f64))),
        (TypeChar::Complex, 8) => (PrimitiveType::C64, Data::C64(rd!(crate::value::Complex32))),
        (TypeChar::Complex, 16) => (
            PrimitiveType::C128,
            Data::C128(rd!(crate::value::Complex64)),
        ),
        (c, s) => return Err(format!("unsupported dtype {}{s}", c.to_str())),
    };
    if fortran && shape.len() > 1 {
        let rev: Vec<i64> = shape.iter().rev().copied().collect();
        let a = Array::new(ty, rev, data).map_err(|e| e.to_string())?;
        let perm: Vec<i64> = (0..shape.len() as i64).rev().collect();
        return crate::data::transpose(&a, &perm).map_err(|e| e.to_string());
    }
    Array::new(ty, shape, data).map_err(|e| e.to_string())
}

/// Loads entry parameter `index` (named `name`) of `shape` from `path`.
/// Float32 files are accepted for bf16, f16 and f8 parameters (converted
/// with round-to-nearest-even, exact for representable values).
pub fn load_argument(
    path: &Path,
    index: usize,
    name: &str,
    shape: &Shape,
) -> Result<Array, EvalError> {
    let a = read_npy(path)?;
    let Some(s) = shape.as_array() else {
        return Err(EvalError::invalid(format!(
            "parameter {index} (%{name}) has tuple shape {shape}; only array parameters can be loaded from .npy"
        )));
    };
    let ty_ok = a.ty == s.element_type
        || (a.ty == PrimitiveType::F32
            && s.element_type.is_float()
            && s.element_type != PrimitiveType::F64);
    if !ty_ok || a.dims != s.dims {
        return Err(EvalError::ArgumentShape {
            index,
            name: name.to_string(),
            expected: shape.without_layout().to_string(),
            got: format!("{} (from {})", a.shape(), path.display()),
        });
    }
    if a.ty != s.element_type {
        return convert(&a, s.element_type);
    }
    Ok(a)
}

/// Writes an array as `.npy` (bf16 and f8 widened to float32).
pub fn write_npy(path: &Path, a: &Array) -> Result<(), EvalError> {
    let shape: Vec<u64> = a.dims.iter().map(|&d| d.max(0) as u64).collect();
    let file = std::fs::File::create(path).map_err(|e| io_err(path, e))?;
    let w = std::io::BufWriter::new(file);
    macro_rules! wr {
        ($T:ty, $v:expr) => {{
            let mut writer = npyz::WriteOptions::<$T>::new()
                .default_dtype()
                .shape(&shape)
                .writer(w)
                .begin_nd()
                .map_err(|e| io_err(path, e))?;
            writer
                .extend($v.iter().copied())
                .map_err(|e| io_err(path, e))?;
            writer.finish().map_err(|e| io_err(path, e))?;
        }};
    }
    match &*a.data {
        Data::Pred(v) => wr!(bool, v),
        Data::S8(v) => wr!(i8, v),
        Data::S16(v) => wr!(i16, v),
        Data::S32(v) => wr!(i32, v),
        Data::S64(v) => wr!(i64, v),
        Data::U8(v) => wr!(u8, v),
        Data::U16(v) => wr!(u16, v),
        Data::U32(v) => wr!(u32, v),
        Data::U64(v) => wr!(u64, v),
        Data::F16(v) => wr!(half::f16, v),
        Data::F32(v) => wr!(f32, v),
        Data::F64(v) => wr!(f64, v),
        Data::C64(v) => wr!(crate::value::Complex32, v),
        Data::C128(v) => wr!(crate::value::Complex64, v),
        Data::Bf16(_) | Data::F8(_) => {
            let w32 = convert(a, PrimitiveType::F32)?;
            match &*w32.data {
                Data::F32(v) => wr!(f32, v),
                _ => return Err(EvalError::Internal("widening to f32".into())),
            }
        }
    }
    Ok(())
}
