//! Host-side byte layout of device buffers (pure CPU): little-endian
//! elements, bf16 as its 16 bits, pred as one 0/1 byte.

use crate::error::RuntimeError;
use xla_hlo_evaluator::{Array, Data};
use xla_hlo_ir::literal::{float_from_bits, float_to_bits};
use xla_hlo_ir::PrimitiveType;

fn exec_err(m: impl Into<String>) -> RuntimeError {
    RuntimeError::Device {
        backend: "cuda",
        message: m.into(),
    }
}

/// Bytes per element as the kernels store them.
pub fn elem_bytes(ty: PrimitiveType) -> usize {
    match ty {
        PrimitiveType::Pred | PrimitiveType::U8 => 1,
        PrimitiveType::Bf16 => 2,
        PrimitiveType::S32 | PrimitiveType::U32 | PrimitiveType::F32 => 4,
        _ => 8,
    }
}

/// An array as the device stores it (little-endian; pred as 0/1 bytes).
pub fn array_to_bytes(a: &Array) -> Result<Vec<u8>, RuntimeError> {
    let mut out = Vec::with_capacity(a.len() * elem_bytes(a.ty));
    match (&*a.data, a.ty) {
        (Data::Pred(v), _) => out.extend(v.iter().map(|b| *b as u8)),
        (Data::U8(v), _) => out.extend_from_slice(v),
        (Data::S32(v), _) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        (Data::U32(v), _) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        (Data::S64(v), _) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        (Data::F32(v), _) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        (Data::F64(v), _) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        (_, PrimitiveType::Bf16) => {
            for x in a.to_f64_vec() {
                let b = float_to_bits(PrimitiveType::Bf16, x).unwrap_or(0) as u16;
                out.extend_from_slice(&b.to_le_bytes());
            }
        }
        (_, t) => return Err(exec_err(format!("element type {} on the GPU", t.name()))),
    }
    Ok(out)
}

/// The inverse of [`array_to_bytes`].
pub fn bytes_to_array(ty: PrimitiveType, dims: Vec<i64>, b: &[u8]) -> Result<Array, RuntimeError> {
    let w = elem_bytes(ty);
    let n: i64 = dims.iter().product();
    let b = &b[..(n as usize * w).min(b.len())];
    let ch = b.chunks_exact(w);
    let data = match ty {
        PrimitiveType::Pred => Data::Pred(b.iter().map(|x| *x != 0).collect()),
        PrimitiveType::U8 => Data::U8(b.to_vec()),
        PrimitiveType::S32 => Data::S32(
            ch.map(|c| i32::from_le_bytes(c.try_into().unwrap()))
                .collect(),
        ),
        PrimitiveType::U32 => Data::U32(
            ch.map(|c| u32::from_le_bytes(c.try_into().unwrap()))
                .collect(),
        ),
        PrimitiveType::S64 => Data::S64(
            ch.map(|c| i64::from_le_bytes(c.try_into().unwrap()))
                .collect(),
        ),
        PrimitiveType::F32 => Data::F32(
            ch.map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect(),
        ),
        PrimitiveType::F64 => Data::F64(
            ch.map(|c| f64::from_le_bytes(c.try_into().unwrap()))
                .collect(),
        ),
        PrimitiveType::Bf16 => {
            let v: Vec<f64> = ch
                .map(|c| {
                    float_from_bits(
                        PrimitiveType::Bf16,
                        u16::from_le_bytes([c[0], c[1]]) as u128,
                    )
                    .unwrap_or(f64::NAN)
                })
                .collect();
            return Array::from_f64s(ty, dims, &v).map_err(|e| exec_err(e.to_string()));
        }
        t => return Err(exec_err(format!("element type {} on the GPU", t.name()))),
    };
    Array::new(ty, dims, data).map_err(|e| exec_err(e.to_string()))
}
