//! Constant literals for a given shape: tuples, scalars, nested `{...}`
//! arrays, the elided `{...}`, and every element type's value syntax
//! (pred, integers with range checks, floats with NaN payloads, complex).
//!
//! Invariants: a literal's element count is bounded (`MAX_LITERAL_ELEMENTS`,
//! and no more elements than the text has bytes) before anything is
//! allocated; every level checks its element count against the shape.

use super::state::Parser;
use super::values::parse_f64;
use crate::cursor::PResult;
use xla_hlo_ir::literal::{
    float_from_bits, float_to_bits, largest_finite, nan_with_payload, ArrayLiteral, Literal,
};
use xla_hlo_ir::shape::{ArrayShape, Shape};
use xla_hlo_ir::{PrimitiveType, TypeClass};

/// Largest array (in elements) a literal or shape may describe; guards
/// against allocating absurd amounts for hostile input.
const MAX_LITERAL_ELEMENTS: i64 = 1 << 31;

impl<'a> Parser<'a> {
    pub(super) fn literal(&mut self, shape: &Shape) -> PResult<Literal> {
        self.enter()?;
        let r = self.literal_inner(shape);
        self.leave();
        r
    }

    fn literal_inner(&mut self, shape: &Shape) -> PResult<Literal> {
        match shape {
            Shape::Tuple(elements) => {
                self.c.expect(b'(')?;
                let mut out = Vec::new();
                for (i, e) in elements.iter().enumerate() {
                    if i > 0 {
                        self.c.expect(b',')?;
                    }
                    out.push(self.literal(e)?);
                }
                self.c.expect(b')')?;
                Ok(Literal::Tuple(out))
            }
            Shape::Buffer(inner) => self.literal(inner),
            Shape::Array(a) => {
                let pos = self.c.pos;
                let count = a
                    .dims
                    .iter()
                    .try_fold(1i64, |acc, &d| acc.checked_mul(d.max(0)));
                match count {
                    Some(n) if n <= MAX_LITERAL_ELEMENTS => {}
                    _ => return Err(self.err(pos, "literal is too large")),
                }
                if !a.element_type.is_array_type() {
                    return Err(self.err(
                        pos,
                        format!("a {} constant cannot be written", a.element_type),
                    ));
                }
                let shape = ArrayShape {
                    layout: None,
                    ..a.clone()
                };
                if !a.dims.is_empty() && self.c.eat_str("{...}") {
                    return Ok(Literal::Array(ArrayLiteral {
                        shape,
                        data: Vec::new(),
                        elided: true,
                    }));
                }
                // Every written element takes at least one byte of text.
                let remaining = self.c.src.len() - self.c.pos;
                if shape.element_count() as usize > remaining + 1 {
                    return Err(self.err(
                        pos,
                        format!(
                            "literal of shape {shape} has more elements than the text has bytes"
                        ),
                    ));
                }
                let mut lit = ArrayLiteral::zeros(shape);
                if a.dims.is_empty() {
                    self.element(&mut lit, 0)?;
                    return Ok(Literal::Array(lit));
                }
                let mut next = 0usize;
                self.literal_level(&mut lit, 0, &mut next)?;
                Ok(Literal::Array(lit))
            }
        }
    }

    fn literal_level(
        &mut self,
        lit: &mut ArrayLiteral,
        level: usize,
        next: &mut usize,
    ) -> PResult<()> {
        let rank = lit.shape.dims.len();
        let n = lit.shape.dims[level].max(0) as usize;
        let open = self.c.pos;
        self.c.expect(b'{')?;
        for j in 0..n {
            if j > 0 {
                self.c.expect(b',')?;
            }
            if level + 1 == rank {
                self.element(lit, *next)?;
                *next += 1;
            } else {
                self.enter()?;
                let r = self.literal_level(lit, level + 1, next);
                self.leave();
                r?;
            }
        }
        if !self.c.eat(b'}') {
            return Err(self.err(
                open,
                format!(
                    "literal dimension {level} should have {n} elements (shape {})",
                    lit.shape
                ),
            ));
        }
        Ok(())
    }

    fn element(&mut self, lit: &mut ArrayLiteral, i: usize) -> PResult<()> {
        let ty = lit.element_type();
        self.c.skip_ws();
        let pos = self.c.pos;
        match ty.class() {
            TypeClass::Pred => {
                let v = match self.c.peek_raw() {
                    Some(b't') | Some(b'f') => self.bool_value()?,
                    _ => match self.c.int()? {
                        0 => false,
                        1 => true,
                        v => return Err(self.err(pos, format!("{v} is not a pred value"))),
                    },
                };
                lit.set_int(i, v as i128);
            }
            TypeClass::Signed | TypeClass::Unsigned => {
                let text = self.c.number_text()?;
                let mut v: i128 = text.parse().map_err(|_| {
                    self.err(pos, format!("expected an integer for {ty}, found '{text}'"))
                })?;
                let bits = ty.bit_width();
                // XLA reads integers as s64 and stores them into u64 as they
                // are: a negative u64 element wraps around (`u64[] constant(-1)`
                // is the largest u64).
                if ty == PrimitiveType::U64 && (i64::MIN as i128..0).contains(&v) {
                    v += 1i128 << 64;
                }
                let (lo, hi) = if ty.is_signed_int() {
                    (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1)
                } else {
                    (0, (1i128 << bits) - 1)
                };
                if v < lo || v > hi {
                    return Err(self.err(pos, format!("value {v} is out of range for {ty}")));
                }
                lit.set_int(i, v);
            }
            TypeClass::Float => {
                let text = self.c.number_text()?;
                let bits = float_bits(ty, text).map_err(|m| self.err(pos, m))?;
                lit.set_bits(i, bits);
            }
            TypeClass::Complex => {
                let part = if ty == PrimitiveType::C64 {
                    PrimitiveType::F32
                } else {
                    PrimitiveType::F64
                };
                self.c.expect(b'(')?;
                let re_pos = self.c.pos;
                let re = self.c.number_text()?;
                self.c.expect(b',')?;
                let im = self.c.number_text()?;
                self.c.expect(b')')?;
                let width = if ty == PrimitiveType::C64 { 32 } else { 64 };
                let component = |name: &str, text: &str| {
                    float_bits(part, text)
                        .map_err(|m| self.err(re_pos, format!("{name} part of a {ty} value: {m}")))
                };
                let re_bits = component("real", re)?;
                let im_bits = component("imaginary", im)?;
                lit.set_bits(i, im_bits << width | re_bits);
            }
            TypeClass::Token | TypeClass::Opaque => {
                return Err(self.err(pos, format!("a {ty} value cannot be written")))
            }
        }
        Ok(())
    }
}

/// The bits of a float element written as `text` (NaN payloads kept), or
/// why XLA's parser refuses it: a finite value that rounds to no finite value
/// of `ty`, a decimal beyond f64, or a NaN payload `ty` cannot hold.
fn float_bits(ty: PrimitiveType, text: &str) -> Result<u128, String> {
    let negative = text.starts_with('-');
    let body = text.trim_start_matches(['-', '+']);
    if let Some(payload) = body.strip_prefix("nan(").and_then(|p| p.strip_suffix(')')) {
        return nan_bits(ty, payload, negative);
    }
    let v = parse_f64(text).ok_or_else(|| format!("expected a {ty} value, found '{text}'"))?;
    if v.is_nan() {
        // default quiet NaN, with the sign as written
        let bits = float_to_bits(ty, f64::NAN).ok_or_else(|| format!("{ty} has no NaN"))?;
        return Ok(match (negative, xla_hlo_ir::literal::ieee_layout(ty)) {
            (true, Some((e, m))) => bits | 1u128 << (e + m),
            _ => bits,
        });
    }
    if v.is_infinite() && !matches!(body, "inf") {
        return Err(format!(
            "constant {text} is out of range for double (+/-{:e})",
            f64::MAX
        ));
    }
    let bits = float_to_bits(ty, v).ok_or_else(|| format!("a {ty} value cannot be written"))?;
    let rounded = float_from_bits(ty, bits).unwrap_or(f64::NAN);
    if v.is_finite() && !rounded.is_finite() {
        let max = largest_finite(ty).unwrap_or(f64::MAX);
        return Err(format!(
            "value {text} is out of range for {ty}, namely [{}, {}]",
            -max, max
        ));
    }
    Ok(bits)
}

/// A NaN of `ty` with the payload written in hex (`nan(0x...)`), as XLA's
/// parser allows it: a nonzero payload that fits f64's mantissa, and then
/// the mantissa of `ty` (f64's quiet-NaN payload alone means the type's own
/// quiet NaN); types without NaN payloads (the f8/f4 formats) take none.
fn nan_bits(ty: PrimitiveType, payload_text: &str, negative: bool) -> Result<u128, String> {
    const F64_MANTISSA: u64 = (1 << 52) - 1;
    const F64_QUIET: u64 = 1 << 51;
    let payload = payload_text
        .strip_prefix("0x")
        .and_then(|hex| u64::from_str_radix(hex, 16).ok())
        .filter(|&p| p != 0 && p <= F64_MANTISSA)
        .ok_or_else(|| {
            format!("malformed NaN payload '{payload_text}' (expected 0x1 to 0x{F64_MANTISSA:x})")
        })?;
    let Some((_, m)) = xla_hlo_ir::literal::ieee_layout(ty) else {
        if payload == F64_QUIET {
            return float_to_bits(ty, f64::NAN).ok_or_else(|| format!("{ty} has no NaN"));
        }
        return Err(format!(
            "NaN payload 0x{payload:x}: {ty} does not support payloads"
        ));
    };
    let mask = (1u64 << m) - 1;
    let payload = if payload == F64_QUIET {
        1 << (m - 1)
    } else {
        payload
    };
    if payload > mask {
        return Err(format!(
            "NaN payload 0x{payload:x} is out of range for {ty} (largest 0x{mask:x})"
        ));
    }
    nan_with_payload(ty, payload, negative).ok_or_else(|| format!("{ty} has no NaN"))
}
