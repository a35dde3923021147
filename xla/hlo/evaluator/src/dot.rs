//! dot (general dimension numbers) and convolution (all dimension numbers,
//! feature and batch groups, dilations, padding, window reversal), both
//! lowered to batched GEMMs on the `gemm` crate using all cores.
//!
//! Invariants: floating-point products accumulate in f32 for f32 and
//! narrower float types and in f64 for f64, and the result is rounded once
//! to the result type (XLA's CPU behaviour for bf16/f16 dots); integer
//! products accumulate in i64 with wrapping and are truncated to the result
//! type. Operand layouts that gemm can read through strides are not copied.
//! With [`Accumulation::Tree`] (consistent mode) floating-point dots and
//! convolutions instead combine each output element's products by the
//! pairwise tree of `xla_hlo_utils::reduction_order` (a dot: over the
//! contracting index, row-major in the listed order; a convolution: over
//! the input feature, then the kernel's spatial positions, padding and
//! holes contributing zero times the kernel value), products and sums
//! rounded to the accumulation type, so the bits do not depend on the
//! other dims' sizes or the thread count.

use crate::elementwise::{convert, widen_f32};
use crate::error::{bad, EvalError};
use crate::index::strides;
use crate::value::{Array, Data};
use gemm::Parallelism;
use rayon::prelude::*;
use xla_hlo_ir::attrs::{ConvDimensionNumbers, DotDimensionNumbers, Window};
use xla_hlo_ir::{Opcode, PrimitiveType};
use xla_hlo_utils::reduction_order::fold_rows_in_place;

/// How dots and convolutions accumulate floating-point products.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Accumulation {
    /// Blocked GEMM (fast; the order depends on the shapes and threads).
    #[default]
    Gemm,
    /// The consistent order: a pairwise tree per output element.
    Tree,
}

/// Floats the tree kernels accumulate in.
trait TreeScalar:
    Copy + Send + Sync + std::ops::Add<Output = Self> + std::ops::Mul<Output = Self>
{
    const ZERO: Self;
}
impl TreeScalar for f32 {
    const ZERO: f32 = 0.0;
}
impl TreeScalar for f64 {
    const ZERO: f64 = 0.0;
}

/// `[batch, m, k] x [batch, k, n]` (both contiguous) by the pairwise tree
/// over `k` per output element.
fn dot_tree<T: TreeScalar>(batch: usize, m: usize, n: usize, k: usize, l: &[T], r: &[T]) -> Vec<T> {
    let mut out = vec![T::ZERO; batch * m * n];
    if n == 0 || k == 0 {
        return out;
    }
    out.par_chunks_mut(n).enumerate().for_each_init(
        Vec::new,
        |products: &mut Vec<T>, (row, dst)| {
            let (b, i) = (row / m.max(1), row % m.max(1));
            products.clear();
            for kk in 0..k {
                let a = l[(b * m + i) * k + kk];
                products.extend(r[(b * k + kk) * n..][..n].iter().map(|&x| a * x));
            }
            fold_rows_in_place(products, n, &|x, y| x + y);
            dst.copy_from_slice(&products[..n]);
        },
    );
    out
}

/// The operand of a tree dot as a contiguous `[batch, rows, cols]` array in
/// the accumulation type: dims `perm` (batch, then row dims, then column
/// dims) transposed to the front in that order.
fn tree_operand(a: &Array, perm: &[usize], kind: Kind) -> Result<Num, EvalError> {
    let perm: Vec<i64> = perm.iter().map(|&d| d as i64).collect();
    to_num(&crate::data::transpose(a, &perm)?, kind)
}

/// Compute representation of an operand.
enum Num {
    F32(Vec<f32>),
    F64(Vec<f64>),
    I64(Vec<i64>),
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    F32,
    F64,
    I64,
}

/// A dot with a complex result: (a + bi)(c + di) = (ac - bd) + (ad + bc)i,
/// four real dots of the parts in the result's real type.
fn complex_dot(
    lhs: &Array,
    rhs: &Array,
    dn: &DotDimensionNumbers,
    out_ty: PrimitiveType,
    accumulation: Accumulation,
) -> Result<Array, EvalError> {
    let real_ty = if out_ty == PrimitiveType::C128 {
        PrimitiveType::F64
    } else {
        PrimitiveType::F32
    };
    // The real and imaginary parts in `real_ty` (zero for a real operand).
    let parts = |x: &Array| -> Result<(Array, Array), EvalError> {
        let (re, im) = match (
            crate::complex::unary(Opcode::Real, x),
            crate::complex::unary(Opcode::Imag, x),
        ) {
            (Some(re), Some(im)) => (re?, im?),
            _ => {
                let zero = Array::from_f64s(real_ty, vec![], &[0.0])?;
                (x.clone(), crate::elementwise::splat(&zero, &x.dims))
            }
        };
        Ok((convert(&re, real_ty)?, convert(&im, real_ty)?))
    };
    let (a, b) = parts(lhs)?;
    let (c, d) = parts(rhs)?;
    let prod = |x: &Array, y: &Array| dot(x, y, dn, real_ty, accumulation);
    let re = crate::elementwise::binary(Opcode::Subtract, &prod(&a, &c)?, &prod(&b, &d)?)?;
    let im = crate::elementwise::binary(Opcode::Add, &prod(&a, &d)?, &prod(&b, &c)?)?;
    crate::complex::make_complex(&re, &im).and_then(|z| convert(&z, out_ty))
}

fn compute_kind(a: PrimitiveType, b: PrimitiveType, out: PrimitiveType) -> Kind {
    if a == PrimitiveType::F64 || b == PrimitiveType::F64 || out == PrimitiveType::F64 {
        Kind::F64
    } else if a.is_float() || b.is_float() || out.is_float() {
        Kind::F32
    } else {
        Kind::I64
    }
}

fn to_num(a: &Array, k: Kind) -> Result<Num, EvalError> {
    Ok(match k {
        Kind::F32 => match &*a.data {
            Data::F32(v) => Num::F32(v.clone()),
            _ => match widen_f32(a) {
                Some(v) => Num::F32(v),
                None => match &*convert(a, PrimitiveType::F32)?.data {
                    Data::F32(v) => Num::F32(v.clone()),
                    _ => return bad("internal: convert to f32"),
                },
            },
        },
        Kind::F64 => match &*convert(a, PrimitiveType::F64)?.data {
            Data::F64(v) => Num::F64(v.clone()),
            _ => return bad("internal: convert to f64"),
        },
        Kind::I64 => match &*convert(a, PrimitiveType::S64)?.data {
            Data::S64(v) => Num::I64(v.clone()),
            _ => return bad("internal: convert to s64"),
        },
    })
}

/// Borrowed f32 view when possible, avoiding a copy of f32 operands.
fn f32_view(a: &Array) -> Option<&[f32]> {
    match &*a.data {
        Data::F32(v) => Some(v),
        _ => None,
    }
}

fn from_num(n: Num, dims: Vec<i64>, out_ty: PrimitiveType) -> Result<Array, EvalError> {
    let arr = match n {
        Num::F32(v) => Array::from_parts(PrimitiveType::F32, dims, Data::F32(v)),
        Num::F64(v) => Array::from_parts(PrimitiveType::F64, dims, Data::F64(v)),
        Num::I64(v) => Array::from_parts(PrimitiveType::S64, dims, Data::S64(v)),
    };
    convert(&arr, out_ty)
}

/// A batched matrix view: element (b, i, j) at off + b*bs + i*rs + j*cs.
#[derive(Clone, Copy, Debug)]
struct View {
    bs: isize,
    rs: isize,
    cs: isize,
}

/// Tries to view `dims` (grouped as batch, rows, cols in the given dim
/// orders) as a strided 3-d matrix without copying.
fn group_stride(dims: &[i64], st: &[i64], group: &[usize]) -> Option<isize> {
    // A group is viewable when its dims are contiguous with each other in
    // row-major order; its stride is that of the innermost dim (1 if empty).
    if group.is_empty() {
        return Some(0);
    }
    for w in group.windows(2) {
        if st[w[0]] != st[w[1]] * dims[w[1]] {
            return None;
        }
    }
    Some(st[*group.last().expect("nonempty")] as isize)
}

fn strided_view(dims: &[i64], b: &[usize], r: &[usize], c: &[usize]) -> Option<View> {
    let st = strides(dims);
    Some(View {
        bs: group_stride(dims, &st, b)?,
        rs: group_stride(dims, &st, r)?,
        cs: group_stride(dims, &st, c)?,
    })
}

/// Makes an operand readable as [batch, rows, cols]: either a strided view
/// of the original storage or a transposed copy.
fn as_matrix<'a, T: Copy + Send + Sync>(
    v: &'a [T],
    dims: &[i64],
    b: &[usize],
    r: &[usize],
    c: &[usize],
) -> (std::borrow::Cow<'a, [T]>, View) {
    if let Some(view) = strided_view(dims, b, r, c) {
        return (std::borrow::Cow::Borrowed(v), view);
    }
    let st = strides(dims);
    let order: Vec<usize> = b.iter().chain(r).chain(c).copied().collect();
    let od: Vec<usize> = order.iter().map(|&d| dims[d] as usize).collect();
    let os: Vec<isize> = order.iter().map(|&d| st[d] as isize).collect();
    let copied = crate::index::strided_gather(v, 0, &od, &os);
    let rows: i64 = r.iter().map(|&d| dims[d]).product();
    let cols: i64 = c.iter().map(|&d| dims[d]).product();
    (
        std::borrow::Cow::Owned(copied),
        View {
            bs: (rows * cols) as isize,
            rs: cols as isize,
            cs: 1,
        },
    )
}

trait GemmScalar: Copy + Send + Sync + 'static + Default {
    fn zero() -> Self;
    fn one() -> Self;
}
impl GemmScalar for f32 {
    fn zero() -> Self {
        0.0
    }
    fn one() -> Self {
        1.0
    }
}
impl GemmScalar for f64 {
    fn zero() -> Self {
        0.0
    }
    fn one() -> Self {
        1.0
    }
}

struct SendPtr<T>(*mut T);
unsafe impl<T> Send for SendPtr<T> {}
unsafe impl<T> Sync for SendPtr<T> {}
impl<T> SendPtr<T> {
    fn get(&self) -> *mut T {
        self.0
    }
}

/// out[b, i, j] = sum_k lhs[b, i, k] * rhs[b, k, j]; out is dense [B, M, N].
#[allow(clippy::too_many_arguments)]
fn batched_gemm<T: GemmScalar>(
    batch: usize,
    m: usize,
    n: usize,
    k: usize,
    lhs: &[T],
    lv: View,
    rhs: &[T],
    rv: View,
    out: &mut [T],
) {
    if batch == 0 || m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        out.fill(T::zero());
        return;
    }
    let flops = batch * m * n * k;
    let threads = rayon::current_num_threads();
    let per_batch_parallel = batch >= threads && m * n * k < (1 << 22);
    let run = |b: usize, dst: *mut T, par: Parallelism| unsafe {
        // SAFETY: the views were built from the operands' own dims, so every
        // (b, i, k) and (b, k, j) they address lies inside `lhs`/`rhs`; `dst`
        // points at a dense m*n block of `out` owned by this call.
        gemm::gemm(
            m,
            n,
            k,
            dst,
            1,
            n as isize,
            false,
            lhs.as_ptr().offset(b as isize * lv.bs),
            lv.cs,
            lv.rs,
            rhs.as_ptr().offset(b as isize * rv.bs),
            rv.cs,
            rv.rs,
            T::zero(),
            T::one(),
            false,
            false,
            false,
            par,
        )
    };
    if per_batch_parallel {
        let ptr = SendPtr(out.as_mut_ptr());
        (0..batch).into_par_iter().for_each(|b| {
            let dst = unsafe { ptr.get().add(b * m * n) };
            run(b, dst, Parallelism::None);
        });
    } else {
        let par = if flops >= (1 << 18) {
            Parallelism::Rayon(0)
        } else {
            Parallelism::None
        };
        for b in 0..batch {
            let dst = unsafe { out.as_mut_ptr().add(b * m * n) };
            run(b, dst, par);
        }
    }
}

#[allow(clippy::too_many_arguments)] // the GEMM's shape and strides, as BLAS passes them
fn batched_gemm_i64(
    batch: usize,
    m: usize,
    n: usize,
    k: usize,
    lhs: &[i64],
    lv: View,
    rhs: &[i64],
    rv: View,
    out: &mut [i64],
) {
    for b in 0..batch {
        for i in 0..m {
            for j in 0..n {
                let mut acc = 0i64;
                for kk in 0..k {
                    let l = lhs
                        [(b as isize * lv.bs + i as isize * lv.rs + kk as isize * lv.cs) as usize];
                    let r = rhs
                        [(b as isize * rv.bs + kk as isize * rv.rs + j as isize * rv.cs) as usize];
                    acc = acc.wrapping_add(l.wrapping_mul(r));
                }
                out[(b * m + i) * n + j] = acc;
            }
        }
    }
}

fn check_dims(list: &[i64], rank: usize, what: &str) -> Result<Vec<usize>, EvalError> {
    let mut seen = vec![false; rank];
    list.iter()
        .map(|&d| {
            let d = usize::try_from(d)
                .ok()
                .filter(|&d| d < rank && !seen[d])
                .ok_or_else(|| EvalError::Invalid(format!("dot: invalid {what} dimension {d}")))?;
            seen[d] = true;
            Ok(d)
        })
        .collect()
}

/// dot with general dimension numbers; result dims are
/// batch, lhs free, rhs free (XLA's order).
pub fn dot(
    lhs: &Array,
    rhs: &Array,
    dn: &DotDimensionNumbers,
    out_ty: PrimitiveType,
    accumulation: Accumulation,
) -> Result<Array, EvalError> {
    let lb = check_dims(&dn.lhs_batch, lhs.rank(), "lhs batch")?;
    let rb = check_dims(&dn.rhs_batch, rhs.rank(), "rhs batch")?;
    let lc = check_dims(&dn.lhs_contracting, lhs.rank(), "lhs contracting")?;
    let rc = check_dims(&dn.rhs_contracting, rhs.rank(), "rhs contracting")?;
    if lb.len() != rb.len() || lc.len() != rc.len() {
        return bad("dot: batch or contracting dimension counts differ");
    }
    for (&a, &b) in lb.iter().zip(&rb).chain(lc.iter().zip(&rc)) {
        if lhs.dims[a] != rhs.dims[b] {
            return bad(format!(
                "dot: lhs dim {a} ({}) and rhs dim {b} ({}) differ",
                lhs.dims[a], rhs.dims[b]
            ));
        }
    }
    let lf: Vec<usize> = (0..lhs.rank())
        .filter(|d| !lb.contains(d) && !lc.contains(d))
        .collect();
    let rf: Vec<usize> = (0..rhs.rank())
        .filter(|d| !rb.contains(d) && !rc.contains(d))
        .collect();
    let batch: usize = lb.iter().map(|&d| lhs.dims[d] as usize).product();
    let m: usize = lf.iter().map(|&d| lhs.dims[d] as usize).product();
    let n: usize = rf.iter().map(|&d| rhs.dims[d] as usize).product();
    let k: usize = lc.iter().map(|&d| lhs.dims[d] as usize).product();
    let mut out_dims: Vec<i64> = lb.iter().map(|&d| lhs.dims[d]).collect();
    out_dims.extend(lf.iter().map(|&d| lhs.dims[d]));
    out_dims.extend(rf.iter().map(|&d| rhs.dims[d]));
    if out_ty.is_complex() {
        return complex_dot(lhs, rhs, dn, out_ty, accumulation);
    }
    let kind = compute_kind(lhs.ty, rhs.ty, out_ty);
    let total = batch * m * n;
    if accumulation == Accumulation::Tree && kind != Kind::I64 {
        let lperm: Vec<usize> = lb.iter().chain(&lf).chain(&lc).copied().collect();
        let rperm: Vec<usize> = rb.iter().chain(&rc).chain(&rf).copied().collect();
        let result = match (
            tree_operand(lhs, &lperm, kind)?,
            tree_operand(rhs, &rperm, kind)?,
        ) {
            (Num::F32(l), Num::F32(r)) => Num::F32(dot_tree(batch, m, n, k, &l, &r)),
            (Num::F64(l), Num::F64(r)) => Num::F64(dot_tree(batch, m, n, k, &l, &r)),
            _ => return bad("internal: tree dot operands"),
        };
        return from_num(result, out_dims, out_ty);
    }
    let result = match kind {
        Kind::F32 => {
            let lo;
            let ro;
            let lsl: &[f32] = match f32_view(lhs) {
                Some(v) => v,
                None => {
                    lo = match to_num(lhs, kind)? {
                        Num::F32(v) => v,
                        _ => unreachable!(),
                    };
                    &lo
                }
            };
            let rsl: &[f32] = match f32_view(rhs) {
                Some(v) => v,
                None => {
                    ro = match to_num(rhs, kind)? {
                        Num::F32(v) => v,
                        _ => unreachable!(),
                    };
                    &ro
                }
            };
            let (lm, lv) = as_matrix(lsl, &lhs.dims, &lb, &lf, &lc);
            let (rm, rv) = as_matrix(rsl, &rhs.dims, &rb, &rc, &rf);
            let mut out = vec![0f32; total];
            batched_gemm(batch, m, n, k, &lm, lv, &rm, rv, &mut out);
            Num::F32(out)
        }
        Kind::F64 => {
            let (Num::F64(l), Num::F64(r)) = (to_num(lhs, kind)?, to_num(rhs, kind)?) else {
                unreachable!()
            };
            let (lm, lv) = as_matrix(&l, &lhs.dims, &lb, &lf, &lc);
            let (rm, rv) = as_matrix(&r, &rhs.dims, &rb, &rc, &rf);
            let mut out = vec![0f64; total];
            batched_gemm(batch, m, n, k, &lm, lv, &rm, rv, &mut out);
            Num::F64(out)
        }
        Kind::I64 => {
            let (Num::I64(l), Num::I64(r)) = (to_num(lhs, kind)?, to_num(rhs, kind)?) else {
                unreachable!()
            };
            let (lm, lv) = as_matrix(&l, &lhs.dims, &lb, &lf, &lc);
            let (rm, rv) = as_matrix(&r, &rhs.dims, &rb, &rc, &rf);
            let mut out = vec![0i64; total];
            batched_gemm_i64(batch, m, n, k, &lm, lv, &rm, rv, &mut out);
            Num::I64(out)
        }
    };
    from_num(result, out_dims, out_ty)
}

/// Convolution with XLA's semantics. `out_dims` is the result shape.
#[allow(clippy::too_many_arguments)]
pub fn convolution(
    input: &Array,
    kernel: &Array,
    dn: &ConvDimensionNumbers,
    window: &Window,
    feature_groups: i64,
    batch_groups: i64,
    out_ty: PrimitiveType,
    out_dims: &[i64],
    accumulation: Accumulation,
) -> Result<Array, EvalError> {
    let ns = dn.input_spatial.len();
    if dn.kernel_spatial.len() != ns || dn.output_spatial.len() != ns || window.dims.len() != ns {
        return bad("convolution: spatial dimension counts disagree");
    }
    let rank = ns + 2;
    if input.rank() != rank || kernel.rank() != rank || out_dims.len() != rank {
        return bad("convolution: operand ranks disagree with the dimension numbers");
    }
    let g = feature_groups.max(1) as usize;
    let bg = batch_groups.max(1) as usize;
    let ud = |d: i64| -> Result<usize, EvalError> {
        usize::try_from(d)
            .ok()
            .filter(|&d| d < rank)
            .ok_or_else(|| EvalError::Invalid("convolution: dimension out of range".into()))
    };
    // Canonical orders: input [N, S.., C], kernel [KS.., I, O], output [N, OS.., O].
    let mut in_perm = vec![ud(dn.input_batch)?];
    for &d in &dn.input_spatial {
        in_perm.push(ud(d)?);
    }
    in_perm.push(ud(dn.input_feature)?);
    let mut k_perm: Vec<usize> = dn
        .kernel_spatial
        .iter()
        .map(|&d| ud(d))
        .collect::<Result<_, _>>()?;
    k_perm.push(ud(dn.kernel_input_feature)?);
    k_perm.push(ud(dn.kernel_output_feature)?);
    let mut o_perm = vec![ud(dn.output_batch)?];
    for &d in &dn.output_spatial {
        o_perm.push(ud(d)?);
    }
    o_perm.push(ud(dn.output_feature)?);

    let n_in = input.dims[in_perm[0]] as usize;
    let c_in = input.dims[in_perm[ns + 1]] as usize;
    let in_sp: Vec<usize> = (0..ns)
        .map(|i| input.dims[in_perm[1 + i]] as usize)
        .collect();
    let k_sp: Vec<usize> = (0..ns).map(|i| kernel.dims[k_perm[i]] as usize).collect();
    let k_in = kernel.dims[k_perm[ns]] as usize;
    let k_out = kernel.dims[k_perm[ns + 1]] as usize;
    let n_out = out_dims[o_perm[0]] as usize;
    let o_sp: Vec<usize> = (0..ns).map(|i| out_dims[o_perm[1 + i]] as usize).collect();
    let o_feat = out_dims[o_perm[ns + 1]] as usize;
    if c_in != k_in * g
        || k_out % (g * bg) != 0
        || n_in % bg != 0
        || n_out != n_in / bg
        || o_feat != k_out
    {
        return bad(format!(
            "convolution: inconsistent sizes (input features {c_in}, kernel input features {k_in}, feature groups {g}, batch groups {bg}, kernel output features {k_out}, batch {n_in} -> {n_out})"
        ));
    }
    for (i, w) in window.dims.iter().enumerate() {
        if w.size as usize != k_sp[i] || w.stride < 1 || w.lhs_dilation < 1 || w.rhs_dilation < 1 {
            return bad("convolution: window does not match the kernel");
        }
        let n = in_sp[i] as i64;
        let dilated = if n == 0 {
            0
        } else {
            (n - 1) * w.lhs_dilation + 1
        };
        let padded = dilated + w.padding_low + w.padding_high;
        let span = if w.size == 0 {
            0
        } else {
            (w.size - 1) * w.rhs_dilation + 1
        };
        let expect = if padded < span {
            0
        } else {
            (padded - span) / w.stride + 1
        };
        if expect != o_sp[i] as i64 {
            return bad(format!(
                "convolution: spatial dimension {i} gives {expect} outputs but the result has {}",
                o_sp[i]
            ));
        }
    }
    let kind = compute_kind(input.ty, kernel.ty, out_ty);
    let cin_in = crate::data::transpose(
        input,
        &in_perm.iter().map(|&d| d as i64).collect::<Vec<_>>(),
    )?;
    let ker_c = crate::data::transpose(
        kernel,
        &k_perm.iter().map(|&d| d as i64).collect::<Vec<_>>(),
    )?;
    let geom = ConvGeom {
        ns,
        n_out,
        c_in,
        cg: k_in,
        in_sp: in_sp.clone(),
        k_sp: k_sp.clone(),
        o_sp: o_sp.clone(),
        k_out,
        g,
        bg,
        window: window.clone(),
    };
    let out_sp_total: usize = o_sp.iter().product();
    let mut canon_dims: Vec<i64> = vec![n_out as i64];
    canon_dims.extend(o_sp.iter().map(|&x| x as i64));
    canon_dims.push(k_out as i64);
    let result = match kind {
        Kind::F32 => {
            let Num::F32(x) = to_num(&cin_in, kind)? else {
                unreachable!()
            };
            let Num::F32(w) = to_num(&ker_c, kind)? else {
                unreachable!()
            };
            let mut out = vec![0f32; n_out * out_sp_total * k_out];
            match accumulation {
                Accumulation::Gemm => conv_gemm(&geom, &x, &w, &mut out),
                Accumulation::Tree => conv_tree(&geom, &x, &w, &mut out),
            }
            Num::F32(out)
        }
        Kind::F64 => {
            let Num::F64(x) = to_num(&cin_in, kind)? else {
                unreachable!()
            };
            let Num::F64(w) = to_num(&ker_c, kind)? else {
                unreachable!()
            };
            let mut out = vec![0f64; n_out * out_sp_total * k_out];
            match accumulation {
                Accumulation::Gemm => conv_gemm(&geom, &x, &w, &mut out),
                Accumulation::Tree => conv_tree(&geom, &x, &w, &mut out),
            }
            Num::F64(out)
        }
        Kind::I64 => {
            let Num::I64(x) = to_num(&cin_in, kind)? else {
                unreachable!()
            };
            let Num::I64(w) = to_num(&ker_c, kind)? else {
                unreachable!()
            };
            let mut out = vec![0i64; n_out * out_sp_total * k_out];
            conv_naive_i64(&geom, &x, &w, &mut out);
            Num::I64(out)
        }
    };
    let canon = from_num(result, canon_dims, out_ty)?;
    // canonical [N, OS.., O] -> output layout: output dim o_perm[i] = canon dim i.
    let mut inv = vec![0i64; rank];
    for (i, &d) in o_perm.iter().enumerate() {
        inv[d] = i as i64;
    }
    crate::data::transpose(&canon, &inv)
}

struct ConvGeom {
    ns: usize,
    n_out: usize,
    c_in: usize,
    cg: usize,
    in_sp: Vec<usize>,
    k_sp: Vec<usize>,
    o_sp: Vec<usize>,
    k_out: usize,
    g: usize,
    bg: usize,
    window: Window,
}

impl ConvGeom {
    /// Input spatial index for output position `o` and kernel position `k`
    /// along spatial dim `d`, or None when it falls in padding or a hole.
    #[inline]
    fn input_pos(&self, d: usize, o: usize, k: usize) -> Option<usize> {
        let w = &self.window.dims[d];
        let k = if w.reversal { self.k_sp[d] - 1 - k } else { k };
        let pos = o as i64 * w.stride + k as i64 * w.rhs_dilation - w.padding_low;
        if pos < 0 || pos % w.lhs_dilation != 0 {
            return None;
        }
        let i = (pos / w.lhs_dilation) as usize;
        (i < self.in_sp[d]).then_some(i)
    }

    /// Row-major strides of the input's spatial dims.
    fn input_strides(&self) -> Vec<usize> {
        let mut strides = vec![1usize; self.ns];
        for d in (0..self.ns.saturating_sub(1)).rev() {
            strides[d] = strides[d + 1] * self.in_sp[d + 1];
        }
        strides
    }

    /// For output spatial position `opos` (flat), the flat input spatial
    /// position each kernel position (row-major) reads, `None` in padding
    /// or a hole; written into `positions`.
    fn window_positions(&self, opos: usize, strides: &[usize], positions: &mut Vec<Option<usize>>) {
        let ns = self.ns;
        let mut oidx = vec![0usize; ns];
        crate::index::unflatten(opos, &self.o_sp, &mut oidx);
        positions.clear();
        let mut kidx = vec![0usize; ns];
        for _ in 0..self.k_sp.iter().product::<usize>() {
            let position = (0..ns).try_fold(0usize, |acc, d| {
                self.input_pos(d, oidx[d], kidx[d])
                    .map(|i| acc + i * strides[d])
            });
            positions.push(position);
            crate::index::next_index(&mut kidx, &self.k_sp);
        }
    }
}

fn conv_gemm<T: GemmScalar>(geom: &ConvGeom, x: &[T], w: &[T], out: &mut [T]) {
    let ns = geom.ns;
    let ksz: usize = geom.k_sp.iter().product();
    let osz: usize = geom.o_sp.iter().product();
    let isz: usize = geom.in_sp.iter().product();
    let cg = geom.cg;
    let rows = geom.n_out * osz;
    let cols = ksz * cg;
    let blocks = geom.g * geom.bg;
    let oblk = geom.k_out / blocks;
    let in_sp_strides: Vec<usize> = {
        let mut s = vec![1usize; ns];
        for d in (0..ns.saturating_sub(1)).rev() {
            s[d] = s[d + 1] * geom.in_sp[d + 1];
        }
        s
    };
    let mut patches = vec![T::zero(); rows * cols];
    let mut tmp = vec![T::zero(); rows * oblk];
    let nb = geom.n_out;
    for bgi in 0..geom.bg {
        for gi in 0..geom.g {
            let c0 = gi * cg;
            // im2col: row (n, opos), col (kpos, c)
            patches
                .par_chunks_mut(cols.max(1))
                .enumerate()
                .for_each(|(row, prow)| {
                    let n = row / osz.max(1);
                    let opos = row % osz.max(1);
                    let nin = bgi * nb + n;
                    let mut oidx = vec![0usize; ns];
                    crate::index::unflatten(opos, &geom.o_sp, &mut oidx);
                    let mut kidx = vec![0usize; ns];
                    for kp in 0..ksz {
                        let dst = &mut prow[kp * cg..(kp + 1) * cg];
                        let mut ipos = 0usize;
                        let mut valid = true;
                        for d in 0..ns {
                            match geom.input_pos(d, oidx[d], kidx[d]) {
                                Some(i) => ipos += i * in_sp_strides[d],
                                None => {
                                    valid = false;
                                    break;
                                }
                            }
                        }
                        if valid {
                            let base = (nin * isz + ipos) * geom.c_in + c0;
                            dst.copy_from_slice(&x[base..base + cg]);
                        } else {
                            dst.fill(T::zero());
                        }
                        crate::index::next_index(&mut kidx, &geom.k_sp);
                    }
                });
            let blk = bgi * geom.g + gi;
            let o0 = blk * oblk;
            // kernel [KS.., I, O] as matrix [KS*I, O]; columns o0..o0+oblk
            let kview = View {
                bs: 0,
                rs: geom.k_out as isize,
                cs: 1,
            };
            let pview = View {
                bs: 0,
                rs: cols as isize,
                cs: 1,
            };
            batched_gemm(
                1,
                rows,
                oblk,
                cols,
                &patches,
                pview,
                &w[o0..],
                kview,
                &mut tmp,
            );
            for r in 0..rows {
                out[r * geom.k_out + o0..r * geom.k_out + o0 + oblk]
                    .copy_from_slice(&tmp[r * oblk..(r + 1) * oblk]);
            }
        }
    }
}

/// Convolution in the consistent order: per output element, the products
/// over (input feature within the group, kernel position) combined by the
/// pairwise tree; a padding or hole position contributes zero times the
/// kernel value.
fn conv_tree<T: TreeScalar>(geom: &ConvGeom, x: &[T], w: &[T], out: &mut [T]) {
    let osz: usize = geom.o_sp.iter().product();
    let isz: usize = geom.in_sp.iter().product();
    let cg = geom.cg;
    let blocks = geom.g * geom.bg;
    let oblk = geom.k_out / blocks.max(1);
    if geom.k_out == 0 || oblk == 0 {
        return;
    }
    let in_sp_strides = geom.input_strides();
    out.par_chunks_mut(geom.k_out).enumerate().for_each_init(
        || (Vec::new(), Vec::new()),
        |(positions, products): &mut (Vec<Option<usize>>, Vec<T>), (row, dst)| {
            let n = row / osz.max(1);
            geom.window_positions(row % osz.max(1), &in_sp_strides, positions);
            for blk in 0..blocks {
                let (bgi, gi) = (blk / geom.g, blk % geom.g);
                let nin = bgi * geom.n_out + n;
                let o0 = blk * oblk;
                products.clear();
                for c in 0..cg {
                    for (kp, pos) in positions.iter().enumerate() {
                        let xv = match pos {
                            Some(ipos) => x[(nin * isz + ipos) * geom.c_in + gi * cg + c],
                            None => T::ZERO,
                        };
                        let wrow = &w[(kp * cg + c) * geom.k_out + o0..][..oblk];
                        products.extend(wrow.iter().map(|&wv| xv * wv));
                    }
                }
                let dst = &mut dst[o0..o0 + oblk];
                if products.is_empty() {
                    dst.fill(T::ZERO);
                    continue;
                }
                fold_rows_in_place(products, oblk, &|a, b| a + b);
                dst.copy_from_slice(&products[..oblk]);
            }
        },
    );
}

fn conv_naive_i64(geom: &ConvGeom, x: &[i64], w: &[i64], out: &mut [i64]) {
    let osz: usize = geom.o_sp.iter().product();
    let isz: usize = geom.in_sp.iter().product();
    let cg = geom.cg;
    let oblk = geom.k_out / (geom.g * geom.bg);
    let in_sp_strides = geom.input_strides();
    let mut positions = Vec::new();
    for n in 0..geom.n_out {
        for opos in 0..osz {
            geom.window_positions(opos, &in_sp_strides, &mut positions);
            for o in 0..geom.k_out {
                let blk = o / oblk.max(1);
                let bgi = blk / geom.g;
                let gi = blk % geom.g;
                let nin = bgi * geom.n_out + n;
                let mut acc = 0i64;
                for (kp, position) in positions.iter().enumerate() {
                    let Some(ipos) = position else { continue };
                    for c in 0..cg {
                        let xv = x[(nin * isz + ipos) * geom.c_in + gi * cg + c];
                        let wv = w[(kp * cg + c) * geom.k_out + o];
                        acc = acc.wrapping_add(xv.wrapping_mul(wv));
                    }
                }
                out[(n * osz + opos) * geom.k_out + o] = acc;
            }
        }
    }
}
