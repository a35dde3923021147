//! Literals (constant values) of every element type, stored densely in
//! row-major order, and their HLO text form.
//!
//! Storage invariant: `data.len() == element_count * storage_bytes(ty)` (empty
//! for literals whose values the text elided), each
//! element little-endian; sub-byte integers occupy one byte holding the value
//! (sign-extended for signed types); f8/f6/f4 occupy one byte holding their
//! bit pattern; complex numbers are (real, imag) pairs; pred is 0 or 1.
//! Float bit patterns (NaN payloads included) are kept exactly.

use crate::float::{format_float, MiniFloatFormat};
use crate::primitive_type::{PrimitiveType, TypeClass};
use crate::shape::ArrayShape;
use half::{bf16, f16};
use std::fmt;

/// A literal value.
#[derive(Clone, Debug, PartialEq)]
pub enum Literal {
    Array(ArrayLiteral),
    Tuple(Vec<Literal>),
}

/// A dense array literal.
#[derive(Clone, Debug, PartialEq)]
pub struct ArrayLiteral {
    pub shape: ArrayShape,
    pub data: Vec<u8>,
    /// True when the text elided the values (`{...}`); `data` is then empty.
    pub elided: bool,
}

/// Bytes one element of `ty` occupies in literal storage.
pub fn storage_bytes(ty: PrimitiveType) -> usize {
    match ty.class() {
        TypeClass::Token | TypeClass::Opaque => 0,
        _ => ty.byte_width().max(1),
    }
}

impl ArrayLiteral {
    pub fn zeros(shape: ArrayShape) -> ArrayLiteral {
        let n = shape.element_count().max(0) as usize * storage_bytes(shape.element_type);
        ArrayLiteral {
            shape,
            data: vec![0; n],
            elided: false,
        }
    }
    pub fn element_type(&self) -> PrimitiveType {
        self.shape.element_type
    }
    pub fn len(&self) -> usize {
        self.shape.element_count().max(0) as usize
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Storage of element `i`; empty when out of range (or elided).
    fn bytes(&self, i: usize) -> &[u8] {
        let w = storage_bytes(self.element_type());
        self.data.get(i * w..(i + 1) * w).unwrap_or(&[])
    }

    /// Raw little-endian bits of element `i` (complex: the real part's bits in
    /// the low half, imaginary in the high half).
    pub fn bits(&self, i: usize) -> u128 {
        let mut buf = [0u8; 16];
        let b = self.bytes(i);
        buf[..b.len()].copy_from_slice(b);
        u128::from_le_bytes(buf)
    }
    /// Sets element `i`'s bits; out-of-range indices (and elided literals) are ignored.
    pub fn set_bits(&mut self, i: usize, bits: u128) {
        let le = bits.to_le_bytes();
        let w = storage_bytes(self.element_type());
        if let Some(dst) = self.data.get_mut(i * w..(i + 1) * w) {
            dst.copy_from_slice(&le[..w]);
        }
    }

    /// Element `i` as an integer (pred: 0/1; floats truncate).
    pub fn get_i128(&self, i: usize) -> i128 {
        let ty = self.element_type();
        let bits = self.bits(i);
        match ty.class() {
            TypeClass::Pred => (bits & 1) as i128,
            TypeClass::Signed => {
                let width = storage_bytes(ty) as u32 * 8;
                let shift = 128 - width;
                ((bits << shift) as i128) >> shift
            }
            TypeClass::Unsigned => bits as i128,
            TypeClass::Float | TypeClass::Complex => self.get_f64(i) as i128,
            _ => 0,
        }
    }

    /// Element `i` as f64 (the real part for complex types).
    pub fn get_f64(&self, i: usize) -> f64 {
        let ty = self.element_type();
        let bits = self.bits(i);
        float_from_bits(ty, bits).unwrap_or_else(|| match ty.class() {
            TypeClass::Complex => {
                let part = if ty == PrimitiveType::C64 {
                    PrimitiveType::F32
                } else {
                    PrimitiveType::F64
                };
                float_from_bits(part, bits).unwrap_or(0.0)
            }
            _ => self.get_i128(i) as f64,
        })
    }

    /// Sets element `i` from an integer value (wrapping to the type's width).
    pub fn set_int(&mut self, i: usize, v: i128) {
        let ty = self.element_type();
        match ty.class() {
            TypeClass::Float => self.set_f64(i, v as f64),
            TypeClass::Complex => self.set_complex(i, v as f64, 0.0),
            TypeClass::Pred => self.set_bits(i, (v != 0) as u128),
            TypeClass::Signed if ty.bit_width() < 8 => {
                let shift = 128 - ty.bit_width();
                let v = (v << shift) >> shift;
                self.set_bits(i, (v as i8 as u8) as u128)
            }
            TypeClass::Unsigned if ty.bit_width() < 8 => {
                self.set_bits(i, (v as u128) & ((1 << ty.bit_width()) - 1))
            }
            _ => self.set_bits(i, v as u128),
        }
    }

    /// Sets element `i` from an f64, rounding to the element type.
    pub fn set_f64(&mut self, i: usize, v: f64) {
        let ty = self.element_type();
        match float_to_bits(ty, v) {
            Some(bits) => self.set_bits(i, bits),
            None if ty.is_complex() => self.set_complex(i, v, 0.0),
            None => self.set_int(i, v as i128),
        }
    }

    pub fn set_complex(&mut self, i: usize, re: f64, im: f64) {
        match self.element_type() {
            PrimitiveType::C64 => {
                let bits = ((im as f32).to_bits() as u128) << 32 | (re as f32).to_bits() as u128;
                self.set_bits(i, bits)
            }
            PrimitiveType::C128 => {
                let bits = (im.to_bits() as u128) << 64 | re.to_bits() as u128;
                self.set_bits(i, bits)
            }
            _ => self.set_f64(i, re),
        }
    }

    /// The (real, imaginary) parts of a complex element.
    pub fn get_complex(&self, i: usize) -> (f64, f64) {
        let bits = self.bits(i);
        match self.element_type() {
            PrimitiveType::C64 => (
                f32::from_bits(bits as u32) as f64,
                f32::from_bits((bits >> 32) as u32) as f64,
            ),
            PrimitiveType::C128 => (
                f64::from_bits(bits as u64),
                f64::from_bits((bits >> 64) as u64),
            ),
            _ => (self.get_f64(i), 0.0),
        }
    }
}

/// Decodes a float element's bits; `None` for non-float types.
pub fn float_from_bits(ty: PrimitiveType, bits: u128) -> Option<f64> {
    Some(match ty {
        PrimitiveType::F16 => f16::from_bits(bits as u16).to_f64(),
        PrimitiveType::Bf16 => bf16::from_bits(bits as u16).to_f64(),
        PrimitiveType::F32 => f32::from_bits(bits as u32) as f64,
        PrimitiveType::F64 => f64::from_bits(bits as u64),
        _ => MiniFloatFormat::of(ty)?.decode(bits as u32),
    })
}

/// The largest finite value of a float type; `None` for non-float types.
pub fn largest_finite(ty: PrimitiveType) -> Option<f64> {
    Some(match ty {
        PrimitiveType::F16 => f16::MAX.to_f64(),
        PrimitiveType::Bf16 => bf16::MAX.to_f64(),
        PrimitiveType::F32 => f32::MAX as f64,
        PrimitiveType::F64 => f64::MAX,
        _ => MiniFloatFormat::of(ty)?.largest_finite(),
    })
}

/// Encodes an f64 as `ty`'s bits (round to nearest even); `None` for non-float types.
pub fn float_to_bits(ty: PrimitiveType, v: f64) -> Option<u128> {
    Some(match ty {
        PrimitiveType::F16 => f16::from_f32(v as f32).to_bits() as u128,
        PrimitiveType::Bf16 => bf16::from_f32(v as f32).to_bits() as u128,
        PrimitiveType::F32 => (v as f32).to_bits() as u128,
        PrimitiveType::F64 => v.to_bits() as u128,
        _ => MiniFloatFormat::of(ty)?.encode(v) as u128,
    })
}

/// (exponent bits, mantissa bits) of the IEEE-style types that can carry NaN payloads.
pub fn ieee_layout(ty: PrimitiveType) -> Option<(u32, u32)> {
    Some(match ty {
        PrimitiveType::F16 => (5, 10),
        PrimitiveType::Bf16 => (8, 7),
        PrimitiveType::F32 => (8, 23),
        PrimitiveType::F64 => (11, 52),
        _ => return None,
    })
}

/// Builds a NaN of `ty` with the given mantissa payload and sign.
pub fn nan_with_payload(ty: PrimitiveType, payload: u64, negative: bool) -> Option<u128> {
    let (e, m) = ieee_layout(ty)?;
    let mask = (1u128 << m) - 1;
    let payload = payload as u128 & mask;
    if payload == 0 {
        return None;
    }
    let exp = ((1u128 << e) - 1) << m;
    let sign = (negative as u128) << (e + m);
    Some(sign | exp | payload)
}

/// Text of one float element, as XLA's printer writes it.
fn float_text(ty: PrimitiveType, bits: u128) -> String {
    let v = float_from_bits(ty, bits).unwrap_or(0.0);
    if v.is_nan() {
        if let Some((e, m)) = ieee_layout(ty) {
            let payload = bits & ((1u128 << m) - 1);
            let negative = (bits >> (e + m)) & 1 == 1;
            let sign = if negative { "-" } else { "" };
            if payload == 1u128 << (m - 1) {
                return format!("{sign}nan");
            }
            return format!("{sign}nan(0x{payload:x})");
        }
        return "nan".into();
    }
    let (short, long) = match ty {
        PrimitiveType::F64 => (15, 17),
        PrimitiveType::F32 => (6, 9),
        PrimitiveType::F16 => (3, 5),
        PrimitiveType::Bf16 => (2, 4),
        _ => (2, 4),
    };
    format_float(v, short, long, |p| float_to_bits(ty, p) == Some(bits))
}

fn element_text(lit: &ArrayLiteral, i: usize) -> String {
    let ty = lit.element_type();
    match ty.class() {
        TypeClass::Pred => if lit.get_i128(i) != 0 {
            "true"
        } else {
            "false"
        }
        .to_string(),
        TypeClass::Signed | TypeClass::Unsigned => lit.get_i128(i).to_string(),
        TypeClass::Float => float_text(ty, lit.bits(i)),
        TypeClass::Complex => {
            let bits = lit.bits(i);
            let (part, width) = if ty == PrimitiveType::C64 {
                (PrimitiveType::F32, 32)
            } else {
                (PrimitiveType::F64, 64)
            };
            let mask = (1u128 << width) - 1;
            format!(
                "({}, {})",
                float_text(part, bits & mask),
                float_text(part, bits >> width)
            )
        }
        _ => String::new(),
    }
}

impl fmt::Display for ArrayLiteral {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dims = &self.shape.dims;
        if dims.is_empty() {
            return f.write_str(&element_text(self, 0));
        }
        if self.elided {
            return f.write_str("{...}");
        }
        let rank = dims.len();
        let mut next = 0usize;
        fn write_level(
            lit: &ArrayLiteral,
            f: &mut fmt::Formatter<'_>,
            dims: &[i64],
            level: usize,
            rank: usize,
            next: &mut usize,
        ) -> fmt::Result {
            let n = dims[level].max(0) as usize;
            if level + 1 == rank {
                f.write_str("{")?;
                if rank > 1 {
                    f.write_str(" ")?;
                }
                for j in 0..n {
                    if j > 0 {
                        f.write_str(", ")?;
                    }
                    f.write_str(&element_text(lit, *next))?;
                    *next += 1;
                }
                if rank > 1 {
                    f.write_str(" ")?;
                }
                return f.write_str("}");
            }
            f.write_str("{ ")?;
            for j in 0..n {
                if j > 0 {
                    f.write_str(", ")?;
                }
                write_level(lit, f, dims, level + 1, rank, next)?;
            }
            f.write_str(" }")
        }
        write_level(self, f, dims, 0, rank, &mut next)
    }
}

impl fmt::Display for Literal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Literal::Array(a) => write!(f, "{a}"),
            Literal::Tuple(elements) => {
                f.write_str("(")?;
                for (i, e) in elements.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{e}")?;
                }
                f.write_str(")")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_text_forms() {
        let mut lit = ArrayLiteral::zeros(ArrayShape::new(PrimitiveType::F32, vec![5]));
        lit.set_f64(0, 1e-5);
        lit.set_f64(1, f64::NEG_INFINITY);
        lit.set_f64(2, f64::NAN);
        lit.set_bits(3, nan_with_payload(PrimitiveType::F32, 1, false).unwrap());
        lit.set_f64(4, 0.797884583);
        assert_eq!(lit.to_string(), "{1e-05, -inf, nan, nan(0x1), 0.797884583}");
    }

    #[test]
    fn nested_and_signed() {
        let mut lit = ArrayLiteral::zeros(ArrayShape::new(PrimitiveType::S4, vec![2, 2]));
        for (i, v) in [-8, 7, -1, 0].into_iter().enumerate() {
            lit.set_int(i, v);
        }
        assert_eq!(lit.to_string(), "{ { -8, 7 }, { -1, 0 } }");
        assert_eq!(lit.get_i128(0), -8);
    }
}
