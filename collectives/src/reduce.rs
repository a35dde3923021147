//! Reduction kinds and the elementwise kernels that fold N equal-length
//! inputs into one output.
//!
//! Semantics (shared with `reference`, which computes them element by
//! element, independently of these kernels):
//! * the result is the left fold over the inputs in rank order:
//!   `op(op(op(x0, x1), x2), ...)`;
//! * integers wrap (two's complement, at the type's bit width; sub-byte types
//!   too); `And`/`Or` are bitwise; `Min`/`Max` compare as signed/unsigned;
//! * pred: `Sum`/`Or`/`Max` are logical or, `Product`/`And`/`Min` logical and
//!   (XLA matches `and`/`or` of pred to min/max);
//! * floats: `Min`/`Max` return a canonical NaN when either side is NaN;
//!   f16 and bf16 accumulate in f32 and round once at the end; the f8/f6/f4
//!   types accumulate in f64 and round once; f32/f64 accumulate in their own
//!   type;
//! * complex types support `Sum` and `Product` only;
//! * `And`/`Or` are refused for floating-point and complex types, as XLA's
//!   verifier does.
//!
//! Invariant: kernels never panic on bad input; lengths and kinds are checked
//! up front and reported as errors.

use crate::buffer::{cast_slice, cast_slice_mut, HostBytes, Pod};
use crate::error::{CollectiveError, Result};
use half::{bf16, f16};
use xla_hlo_ir::{PrimitiveType, TypeClass};

/// The reduction an all-reduce or reduce-scatter applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReductionKind {
    Sum,
    Product,
    Min,
    Max,
    And,
    Or,
}

impl ReductionKind {
    pub const ALL: [ReductionKind; 6] = [
        ReductionKind::Sum,
        ReductionKind::Product,
        ReductionKind::Min,
        ReductionKind::Max,
        ReductionKind::And,
        ReductionKind::Or,
    ];

    /// The kind of a reduction computation whose root is the binary HLO
    /// opcode `opcode` applied to the two parameters (`add`, `multiply`,
    /// `minimum`, `maximum`, `and`, `or`).
    pub fn from_opcode(opcode: &str) -> Option<ReductionKind> {
        Some(match opcode {
            "add" => ReductionKind::Sum,
            "multiply" => ReductionKind::Product,
            "minimum" => ReductionKind::Min,
            "maximum" => ReductionKind::Max,
            "and" => ReductionKind::And,
            "or" => ReductionKind::Or,
            _ => return None,
        })
    }

    /// The HLO opcode of the reduction.
    pub fn opcode(self) -> &'static str {
        match self {
            ReductionKind::Sum => "add",
            ReductionKind::Product => "multiply",
            ReductionKind::Min => "minimum",
            ReductionKind::Max => "maximum",
            ReductionKind::And => "and",
            ReductionKind::Or => "or",
        }
    }

    /// Whether this reduction is defined for `dtype`.
    pub fn supports(self, dtype: PrimitiveType) -> bool {
        match dtype.class() {
            TypeClass::Pred | TypeClass::Signed | TypeClass::Unsigned => true,
            TypeClass::Float => !matches!(self, ReductionKind::And | ReductionKind::Or),
            TypeClass::Complex => matches!(self, ReductionKind::Sum | ReductionKind::Product),
            TypeClass::Token | TypeClass::Opaque => false,
        }
    }

    /// Error unless `supports(dtype)`.
    pub fn check(self, dtype: PrimitiveType) -> Result<()> {
        if self.supports(dtype) {
            Ok(())
        } else {
            Err(CollectiveError::Unsupported(format!(
                "reduction {} on element type {dtype}",
                self.opcode()
            )))
        }
    }
}

/// Integer reduction operator (wrapping arithmetic).
macro_rules! int_op {
    ($t:ty, $kind:expr) => {
        match $kind {
            ReductionKind::Sum => |a: $t, b: $t| a.wrapping_add(b),
            ReductionKind::Product => |a: $t, b: $t| a.wrapping_mul(b),
            ReductionKind::Min => |a: $t, b: $t| if b < a { b } else { a },
            ReductionKind::Max => |a: $t, b: $t| if b > a { b } else { a },
            ReductionKind::And => |a: $t, b: $t| a & b,
            ReductionKind::Or => |a: $t, b: $t| a | b,
        }
    };
}

/// Floating-point reduction operator (`And`/`Or` are rejected before this).
macro_rules! float_op {
    ($t:ty, $kind:expr) => {
        match $kind {
            ReductionKind::Sum | ReductionKind::And | ReductionKind::Or => |a: $t, b: $t| a + b,
            ReductionKind::Product => |a: $t, b: $t| a * b,
            ReductionKind::Min => |a: $t, b: $t| {
                if a.is_nan() || b.is_nan() {
                    <$t>::NAN
                } else if b < a {
                    b
                } else {
                    a
                }
            },
            ReductionKind::Max => |a: $t, b: $t| {
                if a.is_nan() || b.is_nan() {
                    <$t>::NAN
                } else if b > a {
                    b
                } else {
                    a
                }
            },
        }
    };
}

/// Same-type float fold, with separate monomorphic closures per kind so
/// the sum and product loops vectorize.
macro_rules! float_fold {
    ($t:ty, $kind:expr, $i:expr, $o:expr) => {
        match $kind {
            ReductionKind::Sum | ReductionKind::And | ReductionKind::Or => {
                fold_same($i, $o, |a: $t, b: $t| a + b)
            }
            ReductionKind::Product => fold_same($i, $o, |a: $t, b: $t| a * b),
            ReductionKind::Min => fold_same($i, $o, |a: $t, b: $t| {
                if a.is_nan() || b.is_nan() {
                    <$t>::NAN
                } else if b < a {
                    b
                } else {
                    a
                }
            }),
            ReductionKind::Max => fold_same($i, $o, |a: $t, b: $t| {
                if a.is_nan() || b.is_nan() {
                    <$t>::NAN
                } else if b > a {
                    b
                } else {
                    a
                }
            }),
        }
    };
}

/// Complex fold over (re, im) pairs stored as a flat slice of the part type.
macro_rules! complex_fold {
    ($t:ty, $kind:expr, $i:expr, $o:expr) => {{
        let inputs: &[&[$t]] = $i;
        let out: &mut [$t] = $o;
        out.copy_from_slice(inputs[0]);
        for inp in &inputs[1..] {
            for (acc, x) in out.chunks_exact_mut(2).zip(inp.chunks_exact(2)) {
                match $kind {
                    ReductionKind::Product => {
                        let (a, b, c, d) = (acc[0], acc[1], x[0], x[1]);
                        acc[0] = a * c - b * d;
                        acc[1] = a * d + b * c;
                    }
                    _ => {
                        acc[0] += x[0];
                        acc[1] += x[1];
                    }
                }
            }
        }
    }};
}

/// Same-type integer fold with one monomorphic closure per kind.
macro_rules! int_fold {
    ($t:ty, $kind:expr, $i:expr, $o:expr) => {
        match $kind {
            ReductionKind::Sum => fold_same($i, $o, |a: $t, b: $t| a.wrapping_add(b)),
            ReductionKind::Product => fold_same($i, $o, |a: $t, b: $t| a.wrapping_mul(b)),
            ReductionKind::Min => fold_same($i, $o, |a: $t, b: $t| if b < a { b } else { a }),
            ReductionKind::Max => fold_same($i, $o, |a: $t, b: $t| if b > a { b } else { a }),
            ReductionKind::And => fold_same($i, $o, |a: $t, b: $t| a & b),
            ReductionKind::Or => fold_same($i, $o, |a: $t, b: $t| a | b),
        }
    };
}

/// Elements handled per block: the output block stays in L1 while every
/// input streams through it once.
const BLOCK: usize = 4096;

/// Folds `inputs` (all of `out.len()` bytes, whole elements of `dtype`) into
/// `out` with `kind`, in input order. With one input this is a copy.
pub fn reduce_into(
    kind: ReductionKind,
    dtype: PrimitiveType,
    inputs: &[&[u8]],
    out: &mut [u8],
) -> Result<()> {
    kind.check(dtype)?;
    let esize = crate::buffer::element_size(dtype)?;
    if inputs.is_empty() {
        return Err(CollectiveError::InvalidArgument(
            "reduction of zero inputs".into(),
        ));
    }
    if out.len() % esize != 0 || inputs.iter().any(|i| i.len() != out.len()) {
        return Err(CollectiveError::InvalidArgument(format!(
            "reduction inputs of {:?} bytes into {} bytes of {dtype}",
            inputs.iter().map(|i| i.len()).collect::<Vec<_>>(),
            out.len()
        )));
    }
    use PrimitiveType as P;
    match dtype {
        P::Pred => typed::<u8>(inputs, out, |i, o| fold_same(i, o, pred_op(kind))),
        P::S8 => typed::<i8>(inputs, out, |i, o| int_fold!(i8, kind, i, o)),
        P::S16 => typed::<i16>(inputs, out, |i, o| int_fold!(i16, kind, i, o)),
        P::S32 => typed::<i32>(inputs, out, |i, o| int_fold!(i32, kind, i, o)),
        P::S64 => typed::<i64>(inputs, out, |i, o| int_fold!(i64, kind, i, o)),
        P::U8 => typed::<u8>(inputs, out, |i, o| int_fold!(u8, kind, i, o)),
        P::U16 => typed::<u16>(inputs, out, |i, o| int_fold!(u16, kind, i, o)),
        P::U32 => typed::<u32>(inputs, out, |i, o| int_fold!(u32, kind, i, o)),
        P::U64 => typed::<u64>(inputs, out, |i, o| int_fold!(u64, kind, i, o)),
        P::S1 | P::S2 | P::S4 => {
            let bits = dtype.bit_width();
            typed::<i8>(inputs, out, |i, o| {
                fold_same(i, o, |a, b| wrap_signed(int_op!(i8, kind)(a, b), bits))
            })
        }
        P::U1 | P::U2 | P::U4 => {
            let mask = ((1u16 << dtype.bit_width()) - 1) as u8;
            typed::<u8>(inputs, out, |i, o| {
                fold_same(i, o, |a, b| int_op!(u8, kind)(a, b) & mask)
            })
        }
        P::F32 => typed::<f32>(inputs, out, |i, o| float_fold!(f32, kind, i, o)),
        P::F64 => typed::<f64>(inputs, out, |i, o| float_fold!(f64, kind, i, o)),
        P::F16 => typed::<f16>(inputs, out, |i, o| {
            fold_widen(
                i,
                o,
                |x: f16| x.to_f32(),
                float_op!(f32, kind),
                f16::from_f32,
            )
        }),
        P::Bf16 => typed::<bf16>(inputs, out, |i, o| {
            fold_widen(
                i,
                o,
                |x: bf16| x.to_f32(),
                float_op!(f32, kind),
                bf16::from_f32,
            )
        }),
        P::C64 => typed::<f32>(inputs, out, |i, o| complex_fold!(f32, kind, i, o)),
        P::C128 => typed::<f64>(inputs, out, |i, o| complex_fold!(f64, kind, i, o)),
        _ => {
            let Some(fmt) = dtype.minifloat_format() else {
                return Err(CollectiveError::Unsupported(format!(
                    "reduction on element type {dtype}"
                )));
            };
            typed::<u8>(inputs, out, |i, o| {
                fold_widen(
                    i,
                    o,
                    |x: u8| fmt.decode(x as u32),
                    float_op!(f64, kind),
                    |v| fmt.encode(v) as u8,
                )
            })
        }
    }
    Ok(())
}

fn pred_op(kind: ReductionKind) -> fn(u8, u8) -> u8 {
    match kind {
        ReductionKind::Sum | ReductionKind::Or | ReductionKind::Max => |a, b| a | b,
        ReductionKind::Product | ReductionKind::And | ReductionKind::Min => |a, b| a & b,
    }
}

/// Sign-extends the low `bits` bits of `v`.
fn wrap_signed(v: i8, bits: u32) -> i8 {
    let shift = 8 - bits;
    (v << shift) >> shift
}

/// Runs `f` on typed views of `inputs` and `out`, copying into aligned
/// scratch only when a slice is misaligned for `T`.
fn typed<T: Pod>(inputs: &[&[u8]], out: &mut [u8], f: impl FnOnce(&[&[T]], &mut [T])) {
    let mut scratch: Vec<HostBytes> = Vec::new();
    let aligned: Vec<bool> = inputs
        .iter()
        .map(|i| cast_slice::<T>(i).is_some())
        .collect();
    for (inp, ok) in inputs.iter().zip(&aligned) {
        if !ok {
            scratch.push(HostBytes::from_slice(inp));
        }
    }
    let mut next_scratch = scratch.iter();
    let views: Vec<&[T]> = inputs
        .iter()
        .zip(&aligned)
        .map(|(inp, ok)| {
            if *ok {
                cast_slice::<T>(inp)
            } else {
                next_scratch.next().and_then(|s| s.typed::<T>())
            }
            .unwrap_or(&[])
        })
        .collect();
    match cast_slice_mut::<T>(out) {
        Some(o) => f(&views, o),
        None => {
            let mut tmp = HostBytes::zeroed(out.len());
            if let Some(o) = tmp.typed_mut::<T>() {
                f(&views, o);
            }
            out.copy_from_slice(tmp.as_bytes());
        }
    }
}

/// `out = fold(op, inputs)`, blocked so that `out`'s block stays in L1,
/// reading up to four inputs per pass (fewer passes over `out`, more
/// concurrent streams for the prefetcher). The fold order is unchanged:
/// `op(op(op(op(x0, x1), x2), x3), ...)`.
fn fold_same<T: Copy>(inputs: &[&[T]], out: &mut [T], op: impl Fn(T, T) -> T + Copy) {
    let n = out.len();
    let mut start = 0;
    while start < n {
        let end = (start + BLOCK).min(n);
        let o = &mut out[start..end];
        let blk = |k: usize| &inputs[k][start..end];
        let first = inputs.len().min(4);
        match first {
            1 => o.copy_from_slice(blk(0)),
            2 => {
                for ((o, &a), &b) in o.iter_mut().zip(blk(0)).zip(blk(1)) {
                    *o = op(a, b);
                }
            }
            3 => {
                for (((o, &a), &b), &c) in o.iter_mut().zip(blk(0)).zip(blk(1)).zip(blk(2)) {
                    *o = op(op(a, b), c);
                }
            }
            _ => {
                for ((((o, &a), &b), &c), &d) in
                    o.iter_mut().zip(blk(0)).zip(blk(1)).zip(blk(2)).zip(blk(3))
                {
                    *o = op(op(op(a, b), c), d);
                }
            }
        }
        let mut k = first;
        while k < inputs.len() {
            let m = (inputs.len() - k).min(4);
            match m {
                1 => {
                    for (o, &a) in o.iter_mut().zip(blk(k)) {
                        *o = op(*o, a);
                    }
                }
                2 => {
                    for ((o, &a), &b) in o.iter_mut().zip(blk(k)).zip(blk(k + 1)) {
                        *o = op(op(*o, a), b);
                    }
                }
                3 => {
                    for (((o, &a), &b), &c) in
                        o.iter_mut().zip(blk(k)).zip(blk(k + 1)).zip(blk(k + 2))
                    {
                        *o = op(op(op(*o, a), b), c);
                    }
                }
                _ => {
                    for ((((o, &a), &b), &c), &d) in o
                        .iter_mut()
                        .zip(blk(k))
                        .zip(blk(k + 1))
                        .zip(blk(k + 2))
                        .zip(blk(k + 3))
                    {
                        *o = op(op(op(op(*o, a), b), c), d);
                    }
                }
            }
            k += m;
        }
        start = end;
    }
}

/// Fold in a wider accumulator type `A`, rounding once per element.
fn fold_widen<T: Copy, A: Copy + Default>(
    inputs: &[&[T]],
    out: &mut [T],
    load: impl Fn(T) -> A,
    op: impl Fn(A, A) -> A,
    store: impl Fn(A) -> T,
) {
    let n = out.len();
    let mut acc = vec![A::default(); BLOCK.min(n)];
    let mut start = 0;
    while start < n {
        let end = (start + BLOCK).min(n);
        let acc = &mut acc[..end - start];
        for (a, &x) in acc.iter_mut().zip(&inputs[0][start..end]) {
            *a = load(x);
        }
        for inp in &inputs[1..] {
            for (a, &x) in acc.iter_mut().zip(&inp[start..end]) {
                *a = op(*a, load(x));
            }
        }
        for (o, &a) in out[start..end].iter_mut().zip(acc.iter()) {
            *o = store(a);
        }
        start = end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(kind: ReductionKind, dtype: PrimitiveType, inputs: &[Vec<u8>]) -> Vec<u8> {
        let views: Vec<&[u8]> = inputs.iter().map(|v| v.as_slice()).collect();
        let mut out = vec![0u8; inputs[0].len()];
        reduce_into(kind, dtype, &views, &mut out).unwrap();
        out
    }

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn float_kinds() {
        let a = f32s(&[1.0, -2.0, f32::NAN]);
        let b = f32s(&[3.0, 5.0, 1.0]);
        let sum = run(
            ReductionKind::Sum,
            PrimitiveType::F32,
            &[a.clone(), b.clone()],
        );
        assert_eq!(&sum[..8], &f32s(&[4.0, 3.0])[..]);
        let max = run(
            ReductionKind::Max,
            PrimitiveType::F32,
            &[a.clone(), b.clone()],
        );
        assert_eq!(&max[..8], &f32s(&[3.0, 5.0])[..]);
        assert!(f32::from_le_bytes(max[8..12].try_into().unwrap()).is_nan());
        let min = run(ReductionKind::Min, PrimitiveType::F32, &[a, b]);
        assert_eq!(&min[..8], &f32s(&[1.0, -2.0])[..]);
        let mut out = vec![0u8; 4];
        assert!(reduce_into(
            ReductionKind::And,
            PrimitiveType::F32,
            &[&[0u8; 4][..]],
            &mut out
        )
        .is_err());
    }

    #[test]
    fn f16_accumulates_in_f32() {
        // 2048 + 1 + 1 in f16 pairwise stays 2048 (spacing 2), in f32 it is 2050.
        let enc = |x: f32| f16::from_f32(x).to_le_bytes().to_vec();
        let out = run(
            ReductionKind::Sum,
            PrimitiveType::F16,
            &[enc(2048.0), enc(1.0), enc(1.0)],
        );
        assert_eq!(f16::from_le_bytes([out[0], out[1]]).to_f32(), 2050.0);
    }

    #[test]
    fn ints_wrap_and_pred_is_logical() {
        let out = run(
            ReductionKind::Sum,
            PrimitiveType::S8,
            &[vec![100], vec![100]],
        );
        assert_eq!(out[0] as i8, -56);
        let out = run(ReductionKind::Sum, PrimitiveType::S4, &[vec![7], vec![1]]);
        assert_eq!(out[0] as i8, -8);
        let out = run(ReductionKind::Sum, PrimitiveType::U4, &[vec![15], vec![2]]);
        assert_eq!(out[0], 1);
        let out = run(
            ReductionKind::Sum,
            PrimitiveType::Pred,
            &[vec![1, 0], vec![1, 0]],
        );
        assert_eq!(out, vec![1, 0]);
        let out = run(
            ReductionKind::Min,
            PrimitiveType::Pred,
            &[vec![1, 0], vec![1, 1]],
        );
        assert_eq!(out, vec![1, 0]);
    }

    #[test]
    fn misaligned_inputs() {
        let a = f32s(&[1.0, 2.0]);
        let mut b = vec![0u8];
        b.extend(f32s(&[3.0, 4.0]));
        let mut out = [0u8; 9];
        reduce_into(
            ReductionKind::Sum,
            PrimitiveType::F32,
            &[&a, &b[1..]],
            &mut out[1..],
        )
        .unwrap();
        assert_eq!(&out[1..], &f32s(&[4.0, 6.0])[..]);
    }

    #[test]
    fn from_opcode_round_trips() {
        for k in ReductionKind::ALL {
            assert_eq!(ReductionKind::from_opcode(k.opcode()), Some(k));
        }
        assert_eq!(ReductionKind::from_opcode("subtract"), None);
    }
}
