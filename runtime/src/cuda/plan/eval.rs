//! The CPU semantics of a plan, what the generated kernels compute:
//! index math (`coords`, `linear`), per-node rounding (`round_to`), binary
//! ops (`apply_bin`), `Node::eval`, and `run_plan_on_cpu`, which runs a
//! whole plan with them and a plain f64 matrix product for dots.
//!
//! Invariant: `Node::eval` is the CPU meaning of the kernel `codegen.rs`
//! generates from the same tree (same index math, same per-node rounding),
//! so running a plan here checks its semantics against the interpreter on
//! any machine.

use super::types::{BinOp, BufId, CmpDir, Expr, Node, Plan, Step, UnOp};
use crate::error::RuntimeError;
use xla_hlo_evaluator::{Array, Value};
use xla_hlo_ir::literal::{float_from_bits, float_to_bits};
use xla_hlo_ir::PrimitiveType;

/// Row-major coordinates of linear index `i` in `dims`.
pub fn coords(dims: &[i64], mut i: i64) -> Vec<i64> {
    let mut c = vec![0; dims.len()];
    for d in (0..dims.len()).rev() {
        let n = dims[d].max(1);
        c[d] = i % n;
        i /= n;
    }
    c
}

/// Row-major linear index of coordinates `c` in `dims`.
pub fn linear(dims: &[i64], c: &[i64]) -> i64 {
    dims.iter().zip(c).fold(0, |acc, (d, x)| acc * d + x)
}

/// `v` rounded to what type `ty` can hold (the per-node rounding both the
/// kernels and [`Node::eval`] apply).
pub fn round_to(ty: PrimitiveType, v: f64) -> f64 {
    use PrimitiveType as T;
    match ty {
        T::F32 => v as f32 as f64,
        T::F64 => v,
        T::Bf16 | T::F16 => float_to_bits(ty, v)
            .and_then(|b| float_from_bits(ty, b))
            .unwrap_or(v),
        T::Pred => (v != 0.0) as i32 as f64,
        T::S32 => v as i64 as i32 as f64,
        T::S64 => v as i64 as f64,
        T::U8 => v as i64 as u8 as f64,
        T::U32 => v as i64 as u32 as f64,
        _ => v,
    }
}

pub(super) fn is_float(ty: PrimitiveType) -> bool {
    matches!(
        ty,
        PrimitiveType::F32 | PrimitiveType::F64 | PrimitiveType::Bf16 | PrimitiveType::F16
    )
}

pub fn apply_bin(op: BinOp, ty: PrimitiveType, a: f64, b: f64) -> f64 {
    let v = match op {
        BinOp::Add => a + b,
        BinOp::Sub => a - b,
        BinOp::Mul => a * b,
        BinOp::Div => {
            if is_float(ty) {
                a / b
            } else if b == 0.0 {
                -1.0
            } else {
                (a / b).trunc()
            }
        }
        BinOp::Max => {
            if a.is_nan() || b.is_nan() {
                f64::NAN
            } else {
                a.max(b)
            }
        }
        BinOp::Min => {
            if a.is_nan() || b.is_nan() {
                f64::NAN
            } else {
                a.min(b)
            }
        }
        BinOp::Pow => a.powf(b),
        BinOp::Rem => {
            if is_float(ty) {
                a % b
            } else if b == 0.0 {
                a
            } else {
                a % b
            }
        }
        BinOp::And => ((a as i64) & (b as i64)) as f64,
        BinOp::Or => ((a as i64) | (b as i64)) as f64,
        BinOp::Xor => ((a as i64) ^ (b as i64)) as f64,
    };
    round_to(ty, v)
}

impl Node {
    /// The node's value at row-major linear index `i`; `inputs[slot]` are
    /// the kernel's input buffers as f64.
    pub fn eval(&self, i: i64, inputs: &[&[f64]]) -> f64 {
        let v = match &self.expr {
            Expr::Input(s) => inputs[*s][i as usize],
            Expr::Scalar(v) => *v,
            Expr::Iota(d) => coords(&self.dims, i)[*d] as f64,
            Expr::Unary(op, x) => {
                let a = x.eval(i, inputs);
                match op {
                    UnOp::Neg => -a,
                    UnOp::Exp => a.exp(),
                    UnOp::Log => a.ln(),
                    UnOp::Tanh => a.tanh(),
                    UnOp::Sqrt => a.sqrt(),
                    UnOp::Rsqrt => 1.0 / a.sqrt(),
                    UnOp::Abs => a.abs(),
                    UnOp::Sin => a.sin(),
                    UnOp::Cos => a.cos(),
                    UnOp::Floor => a.floor(),
                    UnOp::Ceil => a.ceil(),
                    UnOp::Sign => {
                        if a > 0.0 {
                            1.0
                        } else if a < 0.0 {
                            -1.0
                        } else {
                            a
                        }
                    }
                    UnOp::Log1p => a.ln_1p(),
                    UnOp::Expm1 => a.exp_m1(),
                    UnOp::Not if self.ty == PrimitiveType::Pred => (a == 0.0) as i32 as f64,
                    UnOp::Not => !(a as i64) as f64,
                    UnOp::IsFinite => a.is_finite() as i32 as f64,
                }
            }
            Expr::Binary(op, a, b) => apply_bin(*op, self.ty, a.eval(i, inputs), b.eval(i, inputs)),
            Expr::Compare(d, a, b) => {
                let (x, y) = (a.eval(i, inputs), b.eval(i, inputs));
                (match d {
                    CmpDir::Eq => x == y,
                    CmpDir::Ne => x != y,
                    CmpDir::Lt => x < y,
                    CmpDir::Le => x <= y,
                    CmpDir::Gt => x > y,
                    CmpDir::Ge => x >= y,
                }) as i32 as f64
            }
            Expr::Select(p, t, f) => {
                if p.eval(i, inputs) != 0.0 {
                    t.eval(i, inputs)
                } else {
                    f.eval(i, inputs)
                }
            }
            Expr::Convert(x) => {
                let a = x.eval(i, inputs);
                if is_float(x.ty) && !is_float(self.ty) && self.ty != PrimitiveType::Pred {
                    // Float to integer: truncate, saturate, NaN -> 0.
                    let t = a.trunc();
                    if t.is_nan() {
                        0.0
                    } else {
                        let (lo, hi) = int_range(self.ty);
                        t.clamp(lo, hi)
                    }
                } else {
                    a
                }
            }
            Expr::Broadcast(x, bd) => {
                let c = coords(&self.dims, i);
                let oc: Vec<i64> = bd.iter().map(|d| c[*d]).collect();
                x.eval(linear(&x.dims, &oc), inputs)
            }
            Expr::Transpose(x, perm) => {
                let c = coords(&self.dims, i);
                let mut oc = vec![0; x.dims.len()];
                for (k, p) in perm.iter().enumerate() {
                    oc[*p] = c[k];
                }
                x.eval(linear(&x.dims, &oc), inputs)
            }
            Expr::Reshape(x) => x.eval(i, inputs),
            Expr::DynSlice(x, starts) => {
                let c = coords(&self.dims, i);
                let oc: Vec<i64> = (0..c.len())
                    .map(|k| {
                        let s = starts[k].eval(0, inputs) as i64;
                        s.clamp(0, (x.dims[k] - self.dims[k]).max(0)) + c[k]
                    })
                    .collect();
                x.eval(linear(&x.dims, &oc), inputs)
            }
            Expr::DynUpdate(x, upd, starts) => {
                let c = coords(&self.dims, i);
                let s: Vec<i64> = (0..c.len())
                    .map(|k| {
                        (starts[k].eval(0, inputs) as i64)
                            .clamp(0, (x.dims[k] - upd.dims[k]).max(0))
                    })
                    .collect();
                if (0..c.len()).all(|k| c[k] >= s[k] && c[k] < s[k] + upd.dims[k]) {
                    let uc: Vec<i64> = (0..c.len()).map(|k| c[k] - s[k]).collect();
                    upd.eval(linear(&upd.dims, &uc), inputs)
                } else {
                    x.eval(i, inputs)
                }
            }
            Expr::Concat(parts, d) => {
                let mut c = coords(&self.dims, i);
                let mut v = f64::NAN;
                for p in parts {
                    if c[*d] < p.dims[*d] {
                        v = p.eval(linear(&p.dims, &c), inputs);
                        break;
                    }
                    c[*d] -= p.dims[*d];
                }
                v
            }
            Expr::Pad {
                x,
                value,
                low,
                interior,
            } => {
                let c = coords(&self.dims, i);
                let mut oc = Vec::with_capacity(c.len());
                for k in 0..c.len() {
                    let p = c[k] - low[k];
                    let s = interior[k] + 1;
                    if p < 0 || p % s != 0 || p / s >= x.dims[k] {
                        break;
                    }
                    oc.push(p / s);
                }
                if oc.len() == c.len() {
                    x.eval(linear(&x.dims, &oc), inputs)
                } else {
                    value.eval(0, inputs)
                }
            }
            Expr::Slice(x, starts, strides) => {
                let c = coords(&self.dims, i);
                let oc: Vec<i64> = (0..c.len())
                    .map(|k| starts[k] + c[k] * strides[k])
                    .collect();
                x.eval(linear(&x.dims, &oc), inputs)
            }
            Expr::Reduce { x, init, dims, op } => {
                let c = coords(&self.dims, i);
                let rdims: Vec<i64> = dims.iter().map(|d| x.dims[*d]).collect();
                let count: i64 = rdims.iter().product();
                let mut acc = init.eval(0, inputs);
                for r in 0..count {
                    let rc = coords(&rdims, r);
                    let (mut kept, mut red) = (0, 0);
                    let oc: Vec<i64> = (0..x.dims.len())
                        .map(|d| {
                            if dims.contains(&d) {
                                red += 1;
                                rc[red - 1]
                            } else {
                                kept += 1;
                                c[kept - 1]
                            }
                        })
                        .collect();
                    acc = apply_bin(*op, self.ty, acc, x.eval(linear(&x.dims, &oc), inputs));
                }
                acc
            }
        };
        round_to(self.ty, v)
    }
}

pub fn int_range(ty: PrimitiveType) -> (f64, f64) {
    match ty {
        PrimitiveType::S32 => (i32::MIN as f64, i32::MAX as f64),
        PrimitiveType::U8 => (0.0, 255.0),
        PrimitiveType::U32 => (0.0, u32::MAX as f64),
        _ => (i64::MIN as f64, i64::MAX as f64),
    }
}

fn leaf_of<'v>(v: &'v Value, index: &[usize]) -> Option<&'v Array> {
    match index.split_first() {
        None => v.as_array(),
        Some((i, rest)) => leaf_of(v.tuple_elements()?.get(*i)?, rest),
    }
}

/// Runs a plan on the CPU with the kernels' semantics ([`Node::eval`]) and
/// a plain f64 matrix product for dots; returns the result like
/// `Executable::execute` (a tuple result split into its elements).
pub fn run_plan_on_cpu(plan: &Plan, args: &[Value]) -> Result<Vec<Value>, RuntimeError> {
    let mut bufs: Vec<Option<Vec<f64>>> = vec![None; plan.buffers.len()];
    let exec = |message: String| RuntimeError::Device {
        backend: "cuda",
        message,
    };
    for step in &plan.steps {
        match step {
            Step::Param { out, number, index } => {
                let a = args
                    .get(*number)
                    .and_then(|v| leaf_of(v, index))
                    .ok_or_else(|| exec(format!("missing argument {number} {index:?}")))?;
                if a.dims != plan.buffers[*out].dims {
                    return Err(exec(format!("argument {number}: wrong dims {:?}", a.dims)));
                }
                bufs[*out] = Some(a.to_f64_vec());
            }
            Step::Constant { out, value } => bufs[*out] = Some(value.to_f64_vec()),
            Step::Fused(k) => {
                let ins: Vec<&[f64]> = k
                    .inputs
                    .iter()
                    .map(|b| bufs[*b].as_deref().unwrap_or(&[]))
                    .collect();
                let n: i64 = plan.buffers[k.out].dims.iter().product();
                let v: Vec<f64> = (0..n).map(|i| k.root.eval(i, &ins)).collect();
                bufs[k.out] = Some(v);
            }
            Step::Dot(d) => {
                let ty = plan.buffers[d.out].ty;
                let a = bufs[d.lhs].as_deref().unwrap_or(&[]);
                let b = bufs[d.rhs].as_deref().unwrap_or(&[]);
                let (m, n, k) = (d.m as usize, d.n as usize, d.k as usize);
                let mut c = vec![0.0; d.batch as usize * m * n];
                for bi in 0..d.batch as usize {
                    for i in 0..m {
                        for j in 0..n {
                            let mut s = 0.0;
                            for l in 0..k {
                                s += a[bi * m * k + i * k + l] * b[bi * k * n + l * n + j];
                            }
                            c[bi * m * n + i * n + j] = round_to(ty, s);
                        }
                    }
                }
                bufs[d.out] = Some(c);
            }
        }
    }
    let to_value = |b: BufId| -> Result<Value, RuntimeError> {
        let info = &plan.buffers[b];
        let v = bufs[b]
            .as_deref()
            .ok_or_else(|| exec("result not computed".into()))?;
        Array::from_f64s(info.ty, info.dims.clone(), v)
            .map(Value::Array)
            .map_err(|e| exec(e.to_string()))
    };
    plan.result.outputs(&to_value, &Value::Tuple)
}
