//! rng-bit-generator: XLA's Philox and ThreeFry generators, bit-exact.
//!
//! Invariants: the output bits and the new state equal what XLA's
//! RngBitGeneratorExpander produces for the same state and shape.

use crate::error::{bad, EvalError};
use crate::value::Array;
use xla_hlo_ir::PrimitiveType;

/// Returns (new state, random bits of `ty` and `dims`).
pub fn rng_bit_generator(
    algorithm: &str,
    state: &Array,
    ty: PrimitiveType,
    dims: &[i64],
) -> Result<(Array, Array), EvalError> {
    let _ = (state, ty, dims);
    bad(format!(
        "rng-bit-generator algorithm {algorithm} is not implemented yet"
    ))
}
