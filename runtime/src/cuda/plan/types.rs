//! What a plan is: device buffers, the steps over them (parameter
//! uploads, constants, fused kernels, cuBLAS dots), the expression trees of
//! fused kernels (`Node`, `Expr`), and the entry's result as a tree of
//! buffers (`ValRef`).
//!
//! Invariants: a `BufId` indexes `Plan::buffers`; every node carries its
//! own element type and dimensions, and an `Expr::Input(slot)` indexes its
//! kernel's `inputs`.

use crate::error::RuntimeError;
use xla_hlo_evaluator::Array;
use xla_hlo_ir::PrimitiveType;

/// A device buffer of the plan.
pub type BufId = usize;

#[derive(Clone, Debug, PartialEq)]
pub struct BufferInfo {
    pub ty: PrimitiveType,
    pub dims: Vec<i64>,
    /// The instruction (or planner helper) that produces it.
    pub name: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnOp {
    Neg,
    Exp,
    Log,
    Tanh,
    Sqrt,
    Rsqrt,
    Abs,
    Sin,
    Cos,
    Floor,
    Ceil,
    Sign,
    Log1p,
    Expm1,
    /// Logical for pred, bitwise for integers.
    Not,
    /// Float operand, pred result.
    IsFinite,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Max,
    Min,
    /// Floats only.
    Pow,
    /// fmod for floats; truncated remainder (x when y == 0) for integers.
    Rem,
    /// Logical for pred, bitwise for integers.
    And,
    Or,
    Xor,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmpDir {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

/// One node of a fused expression: its element type and dimensions, and
/// how its value at a row-major linear index is computed.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub ty: PrimitiveType,
    pub dims: Vec<i64>,
    pub expr: Expr,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Expr {
    /// Kernel input `slot`, a buffer with this node's dims, read at the index.
    Input(usize),
    /// A scalar constant.
    Scalar(f64),
    /// The coordinate along `dim`.
    Iota(usize),
    Unary(UnOp, Box<Node>),
    Binary(BinOp, Box<Node>, Box<Node>),
    Compare(CmpDir, Box<Node>, Box<Node>),
    Select(Box<Node>, Box<Node>, Box<Node>),
    Convert(Box<Node>),
    /// Operand dim `j` is this node's dim `dims[j]`.
    Broadcast(Box<Node>, Vec<usize>),
    /// This node's dim `i` is operand dim `perm[i]`.
    Transpose(Box<Node>, Vec<usize>),
    /// Same linear index (row-major reshape or copy).
    Reshape(Box<Node>),
    /// Operand coordinate `i` is `starts[i] + c[i] * strides[i]`.
    Slice(Box<Node>, Vec<i64>, Vec<i64>),
    /// Operands stacked along `dim` (each node carries its own dims).
    Concat(Vec<Node>, usize),
    /// Operand coordinate `(c - low) / (interior + 1)` where that is exact
    /// and in range, else the scalar `value`.
    Pad {
        x: Box<Node>,
        value: Box<Node>,
        low: Vec<i64>,
        interior: Vec<i64>,
    },
    /// A window of `x` (this node's dims) at the scalar `starts`, clamped
    /// into range as XLA clamps them.
    DynSlice(Box<Node>, Vec<Node>),
    /// `x` with `upd` written at the clamped scalar `starts`.
    DynUpdate(Box<Node>, Box<Node>, Vec<Node>),
    /// Reduces operand dims `dims` with `op`, starting from the scalar `init`.
    Reduce {
        x: Box<Node>,
        init: Box<Node>,
        dims: Vec<usize>,
        op: BinOp,
    },
}

/// A generated kernel: `out[i] = root.eval(i)` for every element of `out`.
#[derive(Clone, Debug, PartialEq)]
pub struct FusedKernel {
    /// The kernel's function name (a C identifier, unique in the plan).
    pub name: String,
    pub out: BufId,
    pub inputs: Vec<BufId>,
    pub root: Node,
}

/// `out[b] = lhs[b] (m x k) * rhs[b] (k x n)`, all row-major and contiguous.
#[derive(Clone, Debug, PartialEq)]
pub struct DotStep {
    pub out: BufId,
    pub lhs: BufId,
    pub rhs: BufId,
    pub batch: i64,
    pub m: i64,
    pub n: i64,
    pub k: i64,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Entry parameter `number`, leaf `index` of its (possibly tuple) shape.
    Param {
        out: BufId,
        number: usize,
        index: Vec<usize>,
    },
    Constant {
        out: BufId,
        value: Array,
    },
    Fused(FusedKernel),
    Dot(DotStep),
}

/// A value of the entry computation: a buffer or a tuple of values.
#[derive(Clone, Debug, PartialEq)]
pub enum ValRef {
    Buf(BufId),
    Tuple(Vec<ValRef>),
}

impl ValRef {
    /// The buffers of the leaves, depth-first.
    pub fn leaves(&self) -> Vec<BufId> {
        fn walk(r: &ValRef, out: &mut Vec<BufId>) {
            match r {
                ValRef::Buf(b) => out.push(*b),
                ValRef::Tuple(v) => v.iter().for_each(|x| walk(x, out)),
            }
        }
        let mut out = Vec::new();
        walk(self, &mut out);
        out
    }

    /// The entry's outputs for this root (a tuple root's elements, else
    /// the one value), each leaf made by `leaf`, nested tuples by `tuple`.
    pub fn outputs<V>(
        &self,
        leaf: &dyn Fn(BufId) -> Result<V, RuntimeError>,
        tuple: &dyn Fn(Vec<V>) -> V,
    ) -> Result<Vec<V>, RuntimeError> {
        fn build<V>(
            r: &ValRef,
            f: &dyn Fn(BufId) -> Result<V, RuntimeError>,
            tuple: &dyn Fn(Vec<V>) -> V,
        ) -> Result<V, RuntimeError> {
            match r {
                ValRef::Buf(b) => f(*b),
                ValRef::Tuple(v) => Ok(tuple(
                    v.iter()
                        .map(|x| build(x, f, tuple))
                        .collect::<Result<_, _>>()?,
                )),
            }
        }
        match self {
            ValRef::Tuple(v) => v.iter().map(|x| build(x, leaf, tuple)).collect(),
            r => Ok(vec![build(r, leaf, tuple)?]),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub buffers: Vec<BufferInfo>,
    pub steps: Vec<Step>,
    pub result: ValRef,
}

impl Plan {
    pub fn kernels(&self) -> impl Iterator<Item = &FusedKernel> {
        self.steps.iter().filter_map(|s| match s {
            Step::Fused(k) => Some(k),
            _ => None,
        })
    }
}

impl Node {
    /// Number of nodes in the tree.
    pub fn size(&self) -> usize {
        1 + self.children().iter().map(|c| c.size()).sum::<usize>()
    }

    pub fn children(&self) -> Vec<&Node> {
        match &self.expr {
            Expr::Input(_) | Expr::Scalar(_) | Expr::Iota(_) => vec![],
            Expr::Unary(_, x)
            | Expr::Convert(x)
            | Expr::Broadcast(x, _)
            | Expr::Transpose(x, _)
            | Expr::Reshape(x)
            | Expr::Slice(x, _, _) => vec![x],
            Expr::Binary(_, a, b) | Expr::Compare(_, a, b) => vec![a, b],
            Expr::Concat(parts, _) => parts.iter().collect(),
            Expr::DynSlice(x, st) => std::iter::once(&**x).chain(st.iter()).collect(),
            Expr::DynUpdate(x, u, st) => [&**x, &**u].into_iter().chain(st.iter()).collect(),
            Expr::Pad { x, value, .. } => vec![x, value],
            Expr::Select(p, t, f) => vec![p, t, f],
            Expr::Reduce { x, init, .. } => vec![x, init],
        }
    }
}
