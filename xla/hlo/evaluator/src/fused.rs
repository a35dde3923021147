//! Fast paths of the interpreter loop for f32 elementwise chains: binary
//! ops read broadcast operands through strides instead of materialising the
//! broadcast, and unary/binary ops write into an operand's buffer when that
//! operand dies at the op and its storage is not shared.
//!
//! Invariants: results are bit-identical to the unfused ops (the same scalar
//! function is applied to the same element pairs); a lazy broadcast is only
//! created for a broadcast whose every user is a binary elementwise op, and
//! the interpreter materialises it whenever a fast path declines.

use crate::elementwise::{fmax32, fmin32};
use crate::index::strides;
use crate::value::{Array, Data};
use rayon::prelude::*;
use std::sync::Arc;
use xla_hlo_ir::{Opcode, PrimitiveType};

/// A broadcast not yet materialised: `src` read through `bstrides` (one per
/// result dim, 0 along broadcast dims).
#[derive(Clone, Debug)]
pub struct LazyBroadcast {
    pub src: Array,
    pub dims: Vec<i64>,
    pub bstrides: Vec<isize>,
}

impl LazyBroadcast {
    pub fn new(src: Array, dims: Vec<i64>, dimensions: &[i64]) -> Option<LazyBroadcast> {
        if dimensions.len() != src.rank() {
            return None;
        }
        let st = strides(&src.dims);
        let mut b = vec![0isize; dims.len()];
        for (k, &d) in dimensions.iter().enumerate() {
            let d = usize::try_from(d).ok().filter(|&d| d < dims.len())?;
            if dims[d] != src.dims[k] {
                return None;
            }
            b[d] = st[k] as isize;
        }
        Some(LazyBroadcast {
            src,
            dims,
            bstrides: b,
        })
    }
    pub fn materialize(&self) -> Array {
        let od = crate::index::udims(&self.dims);
        let data = crate::map_data!(&*self.src.data, v => {
            if v.is_empty() { Vec::new() } else { crate::index::strided_gather(v, 0, &od, &self.bstrides) }
        });
        if self.src.is_empty() {
            return Array::zeros(self.src.ty, self.dims.clone())
                .unwrap_or_else(|_| self.src.clone());
        }
        Array {
            ty: self.src.ty,
            dims: self.dims.clone(),
            data: Arc::new(data),
        }
    }
}

/// An operand of a fused binary op.
pub enum Operand<'a> {
    /// A dense array; `owned` when this op may reuse its buffer.
    Dense(Array, bool),
    Lazy(&'a LazyBroadcast),
}

pub fn is_fusable_binary(op: Opcode) -> bool {
    matches!(
        op,
        Opcode::Add
            | Opcode::Subtract
            | Opcode::Multiply
            | Opcode::Divide
            | Opcode::Maximum
            | Opcode::Minimum
            | Opcode::Power
    )
}

pub fn is_inplace_unary(op: Opcode) -> bool {
    matches!(
        op,
        Opcode::Abs
            | Opcode::Negate
            | Opcode::Exp
            | Opcode::Expm1
            | Opcode::Log
            | Opcode::Log1p
            | Opcode::Sqrt
            | Opcode::Rsqrt
            | Opcode::Tanh
            | Opcode::Logistic
            | Opcode::Sin
            | Opcode::Cos
            | Opcode::Floor
            | Opcode::Ceil
    )
}

const CHUNK: usize = 1 << 14;

/// Applies `f` to every element of `v` in place (parallel for large arrays).
fn for_each_mut(v: &mut [f32], f: impl Fn(&mut [f32]) + Sync + Send) {
    if v.len() >= 1 << 15 {
        v.par_chunks_mut(CHUNK).for_each(f);
    } else {
        f(v)
    }
}

/// Unary f32 op in place on an owned array; None when not applicable.
pub fn unary_inplace(op: Opcode, mut a: Array) -> Option<Array> {
    if a.ty != PrimitiveType::F32 {
        return None;
    }
    let Data::F32(v) = Arc::get_mut(&mut a.data)? else {
        return None;
    };
    macro_rules! go {
        ($f:expr) => {{
            let f = $f;
            for_each_mut(v, |c| {
                for x in c.iter_mut() {
                    *x = f(*x);
                }
            })
        }};
    }
    match op {
        Opcode::Abs => go!(|x: f32| x.abs()),
        Opcode::Negate => go!(|x: f32| -x),
        Opcode::Exp => for_each_mut(v, crate::fastmath::exp_slice),
        Opcode::Expm1 => go!(|x: f32| x.exp_m1()),
        Opcode::Log => go!(|x: f32| x.ln()),
        Opcode::Log1p => go!(|x: f32| x.ln_1p()),
        Opcode::Sqrt => go!(|x: f32| x.sqrt()),
        Opcode::Rsqrt => go!(|x: f32| 1.0 / x.sqrt()),
        Opcode::Tanh => for_each_mut(v, crate::fastmath::tanh_slice),
        Opcode::Logistic => go!(|x: f32| 1.0 / (1.0 + (-x).exp())),
        Opcode::Sin => go!(|x: f32| x.sin()),
        Opcode::Cos => go!(|x: f32| x.cos()),
        Opcode::Floor => go!(|x: f32| x.floor()),
        Opcode::Ceil => go!(|x: f32| x.ceil()),
        _ => return None,
    }
    Some(a)
}

/// Source view of the second operand: per result row, where its elements are.
struct View<'a> {
    data: &'a [f32],
    /// strides in result dims
    st: Vec<isize>,
}

impl View<'_> {
    /// Fills `row` (or returns a borrowed slice) for the result row starting
    /// at multi-index `idx` (last dim 0), length `len`.
    #[inline]
    fn row<'b>(&'b self, idx: &[usize], len: usize, tmp: &'b mut Vec<f32>) -> RowSrc<'b> {
        let rank = idx.len();
        let base: isize = idx
            .iter()
            .zip(&self.st)
            .map(|(&i, &s)| i as isize * s)
            .sum();
        let s = self.st[rank - 1];
        if s == 0 {
            RowSrc::Scalar(self.data[base as usize])
        } else if s == 1 {
            RowSrc::Slice(&self.data[base as usize..base as usize + len])
        } else {
            tmp.clear();
            let mut p = base;
            for _ in 0..len {
                tmp.push(self.data[p as usize]);
                p += s;
            }
            RowSrc::Slice(tmp)
        }
    }
}

enum RowSrc<'a> {
    Scalar(f32),
    Slice(&'a [f32]),
}

/// out = op(a, b) for f32, where a and/or b may be lazy broadcasts or dense
/// arrays; writes into an owned dense operand's buffer when possible.
pub fn binary_f32(op: Opcode, a: Operand<'_>, b: Operand<'_>, out_dims: &[i64]) -> Option<Array> {
    let is_f32 = |o: &Operand| match o {
        Operand::Dense(x, _) => x.ty == PrimitiveType::F32 && x.dims == out_dims,
        Operand::Lazy(l) => l.src.ty == PrimitiveType::F32 && l.dims == out_dims,
    };
    if !is_f32(&a) || !is_f32(&b) || out_dims.is_empty() {
        return None;
    }
    // The "primary" operand is dense and provides the output buffer; the
    // other is read through a view. Keep track of operand order.
    let (primary, other, swapped) = match (a, b) {
        (Operand::Dense(x, o), other) => ((x, o), other, false),
        (other, Operand::Dense(y, o)) => ((y, o), other, true),
        (Operand::Lazy(l), other) => ((l.materialize(), true), other, false),
    };
    let (mut pa, owned) = primary;
    let other_arr;
    let view = match &other {
        Operand::Dense(x, _) => {
            other_arr = x.clone();
            let st = strides(&other_arr.dims)
                .iter()
                .map(|&s| s as isize)
                .collect();
            View {
                data: match &*other_arr.data {
                    Data::F32(v) => v,
                    _ => return None,
                },
                st,
            }
        }
        Operand::Lazy(l) => View {
            data: match &*l.src.data {
                Data::F32(v) => v,
                _ => return None,
            },
            st: l.bstrides.clone(),
        },
    };
    let n: usize = out_dims.iter().map(|&d| d as usize).product();
    if n == 0 || view.data.is_empty() {
        return None;
    }
    let mut out_buf: Vec<f32>;
    let reuse = owned && Arc::get_mut(&mut pa.data).is_some();
    let src_primary: Option<Arc<Data>> = if reuse { None } else { Some(pa.data.clone()) };
    if reuse {
        out_buf = match Arc::get_mut(&mut pa.data) {
            Some(Data::F32(v)) => std::mem::take(v),
            _ => return None,
        };
    } else {
        out_buf = match &*pa.data {
            Data::F32(v) => v.clone(),
            _ => return None,
        };
    }
    let _ = src_primary;
    let od: Vec<usize> = out_dims.iter().map(|&d| d as usize).collect();
    let inner = *od.last().expect("rank > 0");
    macro_rules! run {
        ($f:expr) => {{
            let f = $f;
            let rows_per_chunk = (CHUNK / inner.max(1)).max(1);
            let work = |(c, chunk): (usize, &mut [f32])| {
                let mut idx = vec![0usize; od.len()];
                crate::index::unflatten(c * rows_per_chunk * inner, &od, &mut idx);
                let mut tmp = Vec::new();
                for row in chunk.chunks_mut(inner) {
                    match view.row(&idx, inner, &mut tmp) {
                        RowSrc::Scalar(s) => {
                            if swapped {
                                for x in row.iter_mut() {
                                    *x = f(s, *x);
                                }
                            } else {
                                for x in row.iter_mut() {
                                    *x = f(*x, s);
                                }
                            }
                        }
                        RowSrc::Slice(sl) => {
                            if swapped {
                                for (x, &s) in row.iter_mut().zip(sl) {
                                    *x = f(s, *x);
                                }
                            } else {
                                for (x, &s) in row.iter_mut().zip(sl) {
                                    *x = f(*x, s);
                                }
                            }
                        }
                    }
                    // advance idx by one row
                    let r = idx.len();
                    if r >= 2 {
                        crate::index::next_index(&mut idx[..r - 1], &od[..r - 1]);
                    }
                }
            };
            if n >= 1 << 15 {
                out_buf
                    .par_chunks_mut(rows_per_chunk * inner)
                    .enumerate()
                    .for_each(work);
            } else {
                out_buf
                    .chunks_mut(rows_per_chunk * inner)
                    .enumerate()
                    .for_each(work);
            }
        }};
    }
    match op {
        Opcode::Add => run!(|x: f32, y: f32| x + y),
        Opcode::Subtract => run!(|x: f32, y: f32| x - y),
        Opcode::Multiply => run!(|x: f32, y: f32| x * y),
        Opcode::Divide => run!(|x: f32, y: f32| x / y),
        Opcode::Maximum => run!(fmax32),
        Opcode::Minimum => run!(fmin32),
        Opcode::Power => run!(|x: f32, y: f32| x.powf(y)),
        _ => return None,
    }
    Some(Array {
        ty: PrimitiveType::F32,
        dims: out_dims.to_vec(),
        data: Arc::new(Data::F32(out_buf)),
    })
}
