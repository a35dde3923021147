//! Output comparison with XLA-test semantics: integers and pred exactly,
//! floats within `|a - b| <= atol + rtol * |b|`, NaN only matching NaN and
//! infinities only matching themselves; complex elements part by part
//! (real and imaginary each as a float).
//!
//! Invariant: `matched` is true exactly when `mismatches == 0` and the
//! shapes agree.

use crate::value::Array;
use xla_hlo_ir::PrimitiveType;

/// The result of comparing an output with its expected value.
#[derive(Clone, Debug, PartialEq)]
pub struct Comparison {
    pub shape_ok: bool,
    pub max_abs_err: f64,
    pub max_rel_err: f64,
    pub mismatches: usize,
    /// (flat index, got, expected) of the first mismatch.
    pub first_mismatch: Option<(usize, f64, f64)>,
}

impl Comparison {
    pub fn matched(&self) -> bool {
        self.shape_ok && self.mismatches == 0
    }
}

/// Compares `got` with `expected` (whose element type may be a widened
/// float, e.g. bf16 values stored as f32).
pub fn compare(got: &Array, expected: &Array, rtol: f64, atol: f64) -> Comparison {
    let mut c = Comparison {
        shape_ok: got.dims == expected.dims,
        max_abs_err: 0.0,
        max_rel_err: 0.0,
        mismatches: 0,
        first_mismatch: None,
    };
    if !c.shape_ok {
        return c;
    }
    let complex = got.ty.is_complex();
    let exact = !got.ty.is_float() && !complex;
    let wide_int = matches!(got.ty, PrimitiveType::U64 | PrimitiveType::S64);
    let float_ok = |x: f64, y: f64| {
        if x.is_nan() || y.is_nan() {
            x.is_nan() && y.is_nan()
        } else if x.is_infinite() || y.is_infinite() {
            x == y
        } else {
            (x - y).abs() <= atol + rtol * y.abs()
        }
    };
    for i in 0..got.len() {
        let (x, y) = (got.get_f64(i), expected.get_f64(i));
        let both = [(x, y), (got.get_imag(i), expected.get_imag(i))];
        let pairs = &both[..if complex { 2 } else { 1 }];
        let ok = if exact {
            if wide_int {
                got.get_i64(i) == expected.get_i64(i)
            } else {
                x == y
            }
        } else {
            pairs.iter().all(|&(p, q)| float_ok(p, q))
        };
        for &(p, q) in pairs {
            if p.is_finite() && q.is_finite() {
                let d = (p - q).abs();
                c.max_abs_err = c.max_abs_err.max(d);
                if q != 0.0 {
                    c.max_rel_err = c.max_rel_err.max(d / q.abs());
                }
            }
        }
        if !ok {
            c.mismatches += 1;
            if c.first_mismatch.is_none() {
                c.first_mismatch = Some((i, x, y));
            }
        }
    }
    c
}
