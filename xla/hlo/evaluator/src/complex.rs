//! Complex element types (c64, c128): the elementwise ops XLA allows on
//! them, the `complex` constructor, and `fft`.
//!
//! Invariants:
//! - c64 arithmetic is done in `Complex32` and c128 in `Complex64`, as
//!   XLA's CPU backend computes them; `abs`, `real` and `imag` return the
//!   component type (f32 for c64, f64 for c128).
//! - `fft` transforms the last `fft_length.len()` dims (1 to 3) with a
//!   direct DFT per dim, accumulated in f64 and rounded once to the
//!   result type: exact to the rounding of the result, O(n^2) per dim,
//!   which is fine for an interpreter of test-sized transforms.
//! - Every shape or type mismatch is an error, never a panic.

use crate::error::{bad, EvalError};
use crate::value::{element_count, Array, Complex32, Complex64, Data};
use num_complex::ComplexFloat;
use xla_hlo_ir::{Opcode, PrimitiveType};

fn map1<A: Copy, R>(a: &[A], f: impl Fn(A) -> R) -> Vec<R> {
    a.iter().map(|&x| f(x)).collect()
}

fn map2<A: Copy, B: Copy, R>(a: &[A], b: &[B], f: impl Fn(A, B) -> R) -> Vec<R> {
    a.iter().zip(b).map(|(&x, &y)| f(x, y)).collect()
}

/// A unary op on a complex array, or `None` when `a` is not complex.
pub fn unary(op: Opcode, a: &Array) -> Option<Result<Array, EvalError>> {
    match &*a.data {
        Data::C64(v) => Some(unary_typed(op, a, v, PrimitiveType::F32)),
        Data::C128(v) => Some(unary_typed(op, a, v, PrimitiveType::F64)),
        _ => None,
    }
}

/// The complex element types' arithmetic, generic over the component.
trait ComplexElement: ComplexFloat + Send + Sync + 'static {
    fn wrap(v: Vec<Self>) -> Data;
    fn wrap_real(v: Vec<Self::Real>) -> Data;
    fn from_parts(re: f64, im: f64) -> Self;
    fn parts(self) -> (f64, f64);
    fn from_real(re: Self::Real) -> Self;
}

impl ComplexElement for Complex32 {
    fn wrap(v: Vec<Self>) -> Data {
        Data::C64(v)
    }
    fn wrap_real(v: Vec<f32>) -> Data {
        Data::F32(v)
    }
    fn from_parts(re: f64, im: f64) -> Self {
        Complex32::new(re as f32, im as f32)
    }
    fn parts(self) -> (f64, f64) {
        (self.re as f64, self.im as f64)
    }
    fn from_real(re: f32) -> Self {
        Complex32::new(re, 0.0)
    }
}

impl ComplexElement for Complex64 {
    fn wrap(v: Vec<Self>) -> Data {
        Data::C128(v)
    }
    fn wrap_real(v: Vec<f64>) -> Data {
        Data::F64(v)
    }
    fn from_parts(re: f64, im: f64) -> Self {
        Complex64::new(re, im)
    }
    fn parts(self) -> (f64, f64) {
        (self.re, self.im)
    }
    fn from_real(re: f64) -> Self {
        Complex64::new(re, 0.0)
    }
}

fn unary_typed<T: ComplexElement>(
    op: Opcode,
    a: &Array,
    v: &[T],
    real_ty: PrimitiveType,
) -> Result<Array, EvalError>
where
    T::Real: Send + Sync,
{
    let real = |out: Vec<T::Real>| Array::new(real_ty, a.dims.clone(), T::wrap_real(out));
    let same = |out: Vec<T>| Array::new(a.ty, a.dims.clone(), T::wrap(out));
    match op {
        Opcode::Real => real(map1(v, |z: T| z.re())),
        Opcode::Imag => real(map1(v, |z: T| z.im())),
        Opcode::Abs => real(map1(v, |z: T| z.abs())),
        Opcode::Copy => same(v.to_vec()),
        Opcode::Negate => same(map1(v, |z: T| -z)),
        Opcode::Exp => same(map1(v, |z: T| z.exp())),
        Opcode::Expm1 => same(map1(v, |z: T| z.exp() - T::one())),
        Opcode::Log => same(map1(v, |z: T| z.ln())),
        Opcode::Log1p => same(map1(v, |z: T| (z + T::one()).ln())),
        Opcode::Sqrt => same(map1(v, |z: T| z.sqrt())),
        Opcode::Rsqrt => same(map1(v, |z: T| z.sqrt().recip())),
        Opcode::Cbrt => same(map1(v, |z: T| z.cbrt())),
        Opcode::Sin => same(map1(v, |z: T| z.sin())),
        Opcode::Cos => same(map1(v, |z: T| z.cos())),
        Opcode::Tan => same(map1(v, |z: T| z.tan())),
        Opcode::Tanh => same(map1(v, |z: T| z.tanh())),
        Opcode::Sign => same(map1(v, |z: T| {
            if z == T::zero() {
                z
            } else {
                z / T::from_real(z.abs())
            }
        })),
        _ => bad(format!("{op} of {} is not supported", a.ty)),
    }
}

/// A binary op on complex arrays of equal shape, or `None` when they are
/// not both complex of one type.
pub fn binary(op: Opcode, a: &Array, b: &Array) -> Option<Result<Array, EvalError>> {
    match (&*a.data, &*b.data) {
        (Data::C64(x), Data::C64(y)) => Some(binary_typed(op, a, x, y)),
        (Data::C128(x), Data::C128(y)) => Some(binary_typed(op, a, x, y)),
        _ => None,
    }
}

fn binary_typed<T: ComplexElement>(
    op: Opcode,
    a: &Array,
    x: &[T],
    y: &[T],
) -> Result<Array, EvalError> {
    let out: Vec<T> = match op {
        Opcode::Add => map2(x, y, |p, q| p + q),
        Opcode::Subtract => map2(x, y, |p, q| p - q),
        Opcode::Multiply => map2(x, y, |p, q| p * q),
        Opcode::Divide => map2(x, y, |p, q| p / q),
        Opcode::Power => map2(x, y, |p: T, q: T| {
            if q == T::zero() {
                T::one()
            } else if p == T::zero() && q.parts().0 > 0.0 {
                T::zero()
            } else {
                (q * p.ln()).exp()
            }
        }),
        _ => return bad(format!("{op} of {} is not supported", a.ty)),
    };
    Array::new(a.ty, a.dims.clone(), T::wrap(out))
}

/// compare of complex arrays for equality (`equal`) or inequality, the
/// only directions XLA allows on them; `None` when they are not both
/// complex of one type.
pub fn compare(a: &Array, b: &Array, equal: bool) -> Option<Vec<bool>> {
    match (&*a.data, &*b.data) {
        (Data::C64(x), Data::C64(y)) => Some(map2(x, y, |p, q| (p == q) == equal)),
        (Data::C128(x), Data::C128(y)) => Some(map2(x, y, |p, q| (p == q) == equal)),
        _ => None,
    }
}

/// complex(re, im): the complex type whose components are the operands'.
pub fn make_complex(re: &Array, im: &Array) -> Result<Array, EvalError> {
    if re.dims != im.dims || re.ty != im.ty {
        return bad(format!(
            "complex: operand shapes {} and {} differ",
            re.shape(),
            im.shape()
        ));
    }
    match (&*re.data, &*im.data) {
        (Data::F32(x), Data::F32(y)) => Array::new(
            PrimitiveType::C64,
            re.dims.clone(),
            Data::C64(map2(x, y, Complex32::new)),
        ),
        (Data::F64(x), Data::F64(y)) => Array::new(
            PrimitiveType::C128,
            re.dims.clone(),
            Data::C128(map2(x, y, Complex64::new)),
        ),
        _ => bad(format!("complex of {} is not supported", re.ty)),
    }
}

/// convert into a complex type (from any real type, the value as the real
/// part) or between complex types; `None` when `ty` is not complex.
/// Complex to real is refused, as XLA's shape inference refuses it.
pub fn convert(a: &Array, ty: PrimitiveType) -> Option<Result<Array, EvalError>> {
    if !matches!(ty, PrimitiveType::C64 | PrimitiveType::C128) {
        return match &*a.data {
            Data::C64(_) | Data::C128(_) => Some(bad(format!(
                "convert from {} to {ty}: a complex value has no real conversion (use real or imag)",
                a.ty
            ))),
            _ => None,
        };
    }
    let data = data_from_parts(ty, &parts_of(a))?;
    Some(Array::new(ty, a.dims.clone(), data))
}

/// Every element as a (real, imaginary) f64 pair (real types: imaginary 0).
fn parts_of(a: &Array) -> Vec<(f64, f64)> {
    match &*a.data {
        Data::C64(v) => v.iter().map(|z| z.parts()).collect(),
        Data::C128(v) => v.iter().map(|z| z.parts()).collect(),
        _ => a.to_f64_vec().into_iter().map(|x| (x, 0.0)).collect(),
    }
}

/// Storage of `ty` built from (real, imaginary) pairs, rounded once; real
/// float types keep the real parts. `None` for other types.
fn data_from_parts(ty: PrimitiveType, parts: &[(f64, f64)]) -> Option<Data> {
    Some(match ty {
        PrimitiveType::C64 => Data::C64(
            parts
                .iter()
                .map(|&(r, i)| Complex32::from_parts(r, i))
                .collect(),
        ),
        PrimitiveType::C128 => Data::C128(
            parts
                .iter()
                .map(|&(r, i)| Complex64::from_parts(r, i))
                .collect(),
        ),
        PrimitiveType::F32 => Data::F32(parts.iter().map(|&(r, _)| r as f32).collect()),
        PrimitiveType::F64 => Data::F64(parts.iter().map(|&(r, _)| r).collect()),
        _ => return None,
    })
}

/// The kinds of `fft`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FftType {
    /// Complex to complex, forward.
    Fft,
    /// Complex to complex, inverse (scaled by 1/n).
    Ifft,
    /// Real to complex, forward; the last dim keeps `n/2 + 1` outputs.
    Rfft,
    /// Complex to real, inverse; the last dim's `n/2 + 1` inputs give `n`
    /// outputs (Hermitian symmetry).
    Irfft,
}

impl FftType {
    pub fn parse(name: &str) -> Option<FftType> {
        Some(match name {
            "FFT" => FftType::Fft,
            "IFFT" => FftType::Ifft,
            "RFFT" => FftType::Rfft,
            "IRFFT" => FftType::Irfft,
            _ => return None,
        })
    }
}

/// fft of `a` over its last `lengths.len()` dims into `out_ty[out_dims]`.
pub fn fft(
    a: &Array,
    kind: FftType,
    lengths: &[i64],
    out_ty: PrimitiveType,
    out_dims: &[i64],
) -> Result<Array, EvalError> {
    let rank = a.rank();
    let k = lengths.len();
    if !(1..=3).contains(&k) || k > rank || out_dims.len() != rank {
        return bad(format!(
            "fft: {k} fft lengths for an operand of rank {rank}"
        ));
    }
    let inner = &a.dims[rank - k..];
    let expected_in: Vec<i64> = match kind {
        FftType::Fft | FftType::Ifft | FftType::Rfft => lengths.to_vec(),
        FftType::Irfft => {
            let mut v = lengths.to_vec();
            v[k - 1] = lengths[k - 1] / 2 + 1;
            v
        }
    };
    let expected_out: Vec<i64> = match kind {
        FftType::Rfft => {
            let mut v = lengths.to_vec();
            v[k - 1] = lengths[k - 1] / 2 + 1;
            v
        }
        _ => lengths.to_vec(),
    };
    if inner != &expected_in[..] || out_dims[rank - k..] != expected_out[..] {
        return bad(format!(
            "fft: operand {} and result dims {out_dims:?} do not fit fft_length {lengths:?}",
            a.shape()
        ));
    }
    if out_dims[..rank - k] != a.dims[..rank - k] {
        return bad("fft: batch dims of operand and result differ");
    }
    let input_complex = matches!(&*a.data, Data::C64(_) | Data::C128(_));
    if input_complex == (kind == FftType::Rfft) {
        return bad(format!("fft {kind:?} of {} is not supported", a.ty));
    }
    // Every element as an f64 pair, laid out on the full transform grid
    // (`lengths`), the last dim completed by symmetry for IRFFT.
    let values = parts_of(a);
    let batch = element_count(&a.dims[..rank - k]);
    let per_in = element_count(inner);
    let full = element_count(lengths);
    let per_out = element_count(&expected_out);
    let inverse = matches!(kind, FftType::Ifft | FftType::Irfft);
    let mut out: Vec<(f64, f64)> = Vec::with_capacity(batch * per_out);
    for b in 0..batch {
        let block = &values[b * per_in..(b + 1) * per_in];
        let mut grid = if kind == FftType::Irfft {
            hermitian_complete(block, lengths)
        } else {
            block.to_vec()
        };
        debug_assert_eq!(grid.len(), full);
        for d in 0..k {
            dft_along(&mut grid, lengths, d, inverse);
        }
        if inverse {
            let scale = 1.0 / full as f64;
            grid.iter_mut()
                .for_each(|z| *z = (z.0 * scale, z.1 * scale));
        }
        if kind == FftType::Rfft {
            let keep = expected_out[k - 1] as usize;
            let last = lengths[k - 1] as usize;
            for row in grid.chunks(last) {
                out.extend_from_slice(&row[..keep]);
            }
        } else {
            out.extend(grid);
        }
    }
    let Some(data) = data_from_parts(out_ty, &out) else {
        return bad(format!("fft into {out_ty} is not supported"));
    };
    Array::new(out_ty, out_dims.to_vec(), data)
}

/// The full spectrum of an IRFFT input: the last dim's `n/2 + 1` stored
/// values, the rest mirrored as conjugates of the index-negated positions.
fn hermitian_complete(block: &[(f64, f64)], lengths: &[i64]) -> Vec<(f64, f64)> {
    let k = lengths.len();
    let n_last = lengths[k - 1] as usize;
    let stored = n_last / 2 + 1;
    let outer: Vec<usize> = lengths[..k - 1].iter().map(|&x| x as usize).collect();
    let outer_count: usize = outer.iter().product();
    let mut grid = vec![(0.0, 0.0); outer_count * n_last];
    for o in 0..outer_count {
        // The index of -o (each outer coordinate negated mod its length).
        let mut neg = 0usize;
        let mut rest = o;
        let mut stride = 1usize;
        for &len in outer.iter().rev() {
            let c = rest % len;
            rest /= len;
            neg += ((len - c) % len) * stride;
            stride *= len;
        }
        for j in 0..n_last {
            grid[o * n_last + j] = if j < stored {
                block[o * stored + j]
            } else {
                let (r, i) = block[neg * stored + (n_last - j)];
                (r, -i)
            };
        }
    }
    grid
}

/// A DFT along transform dim `d` of `grid` (laid out row-major by
/// `lengths`), in place; `inverse` uses the positive exponent (unscaled).
fn dft_along(grid: &mut [(f64, f64)], lengths: &[i64], d: usize, inverse: bool) {
    let n = lengths[d] as usize;
    if n <= 1 {
        return;
    }
    let inner: usize = lengths[d + 1..].iter().map(|&x| x as usize).product();
    let outer = grid.len() / (n * inner);
    let sign = if inverse { 1.0 } else { -1.0 };
    let twiddle: Vec<(f64, f64)> = (0..n)
        .map(|t| {
            let angle = sign * 2.0 * std::f64::consts::PI * t as f64 / n as f64;
            (angle.cos(), angle.sin())
        })
        .collect();
    let mut line = vec![(0.0, 0.0); n];
    for o in 0..outer {
        for i in 0..inner {
            let at = |j: usize| (o * n + j) * inner + i;
            for (j, slot) in line.iter_mut().enumerate() {
                *slot = grid[at(j)];
            }
            for f in 0..n {
                let (mut re, mut im) = (0.0, 0.0);
                for (j, &(xr, xi)) in line.iter().enumerate() {
                    let (wr, wi) = twiddle[(f * j) % n];
                    re += xr * wr - xi * wi;
                    im += xr * wi + xi * wr;
                }
                grid[at(f)] = (re, im);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c64(dims: Vec<i64>, v: &[(f32, f32)]) -> Array {
        Array::new(
            PrimitiveType::C64,
            dims,
            Data::C64(v.iter().map(|&(r, i)| Complex32::new(r, i)).collect()),
        )
        .unwrap()
    }

    fn parts(a: &Array) -> Vec<(f32, f32)> {
        match &*a.data {
            Data::C64(v) => v.iter().map(|z| (z.re, z.im)).collect(),
            _ => panic!("not c64"),
        }
    }

    fn close(a: &[(f32, f32)], b: &[(f32, f32)]) -> bool {
        a.len() == b.len()
            && a.iter()
                .zip(b)
                .all(|(x, y)| (x.0 - y.0).abs() < 1e-4 && (x.1 - y.1).abs() < 1e-4)
    }

    #[test]
    fn fft_of_an_impulse_is_flat_and_ifft_inverts() {
        let x = c64(vec![4], &[(1.0, 0.0), (0.0, 0.0), (0.0, 0.0), (0.0, 0.0)]);
        let y = fft(&x, FftType::Fft, &[4], PrimitiveType::C64, &[4]).unwrap();
        assert!(close(&parts(&y), &[(1.0, 0.0); 4]));
        let z = c64(vec![4], &[(1.0, 2.0), (3.0, -1.0), (0.5, 0.0), (-2.0, 4.0)]);
        let f = fft(&z, FftType::Fft, &[4], PrimitiveType::C64, &[4]).unwrap();
        // X[1] = sum x_j e^{-2 pi i j/4} = x0 - i x1 - x2 + i x3.
        let p = parts(&f);
        assert!(close(
            &p[1..2],
            &[(1.0 - 1.0 - 0.5 - 4.0, 2.0 - 3.0 - 0.0 - 2.0)]
        ));
        let back = fft(&f, FftType::Ifft, &[4], PrimitiveType::C64, &[4]).unwrap();
        assert!(close(&parts(&back), &parts(&z)));
    }

    #[test]
    fn rfft_and_irfft_round_trip_in_two_dims() {
        let vals: Vec<f32> = (0..12).map(|i| (i as f32 * 0.7).sin()).collect();
        let x = Array::from_f32(vec![3, 4], vals.clone()).unwrap();
        let spec = fft(&x, FftType::Rfft, &[3, 4], PrimitiveType::C64, &[3, 3]).unwrap();
        // The DC term is the sum of every element.
        let sum: f32 = vals.iter().sum();
        assert!(close(&parts(&spec)[..1], &[(sum, 0.0)]));
        let back = fft(&spec, FftType::Irfft, &[3, 4], PrimitiveType::F32, &[3, 4]).unwrap();
        let got = back.to_f64_vec();
        assert!(got
            .iter()
            .zip(&vals)
            .all(|(g, v)| (*g as f32 - v).abs() < 1e-5));
    }

    #[test]
    fn complex_arithmetic_and_parts() {
        let a = c64(vec![2], &[(1.0, 2.0), (3.0, -4.0)]);
        let b = c64(vec![2], &[(0.0, 1.0), (1.0, 1.0)]);
        let m = binary(Opcode::Multiply, &a, &b).unwrap().unwrap();
        assert_eq!(parts(&m), vec![(-2.0, 1.0), (7.0, -1.0)]);
        let abs = unary(Opcode::Abs, &a).unwrap().unwrap();
        assert_eq!(abs.ty, PrimitiveType::F32);
        assert!((abs.get_f64(1) - 5.0).abs() < 1e-6);
        let im = unary(Opcode::Imag, &a).unwrap().unwrap();
        assert_eq!(im.to_f64_vec(), vec![2.0, -4.0]);
        let re = unary(Opcode::Real, &a).unwrap().unwrap();
        let z = make_complex(&re, &im).unwrap();
        assert_eq!(z, a);
        assert!(convert(&a, PrimitiveType::F32).unwrap().is_err());
        assert!(binary(Opcode::Maximum, &a, &b).unwrap().is_err());
        assert_eq!(compare(&a, &a, true), Some(vec![true, true]));
        assert_eq!(compare(&a, &b, false), Some(vec![true, true]));
        let real = Array::from_f32(vec![2], vec![1.0, 2.0]).unwrap();
        assert!(compare(&real, &real, true).is_none());
    }
}
