//! What a plan is: device buffers, one step list per planned computation
//! (the entry, while conditions and bodies, conditional branches, called
//! computations), the kernels' expression trees (`Node`, `Expr`) and the
//! scalar computations inlined into them (`ScalarComp`: reducers,
//! comparators, scatter combiners, select functions).
//!
//! Invariants: a `BufId` indexes `Plan::buffers` and a computation index
//! `Plan::comps`; every node carries its own element type and dimensions;
//! an `Expr::Input(slot)` indexes its kernel's `inputs` and an
//! `Expr::Param(k)` the parameters of the scalar computation it is in.
//! Buffers are immutable once written: every kernel, dot and constant
//! writes a fresh buffer, and control flow only rebinds buffer ids to
//! values (a while body's results become the next iteration's parameters
//! without a copy).

use xla_hlo_ir::attrs::{
    ConvDimensionNumbers, DotDimensionNumbers, GatherDimensionNumbers, ScatterDimensionNumbers,
    WindowDim,
};
use xla_hlo_ir::{CompId, HloInstruction, PrimitiveType};

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
    Cbrt,
    Abs,
    Sin,
    Cos,
    Tan,
    Floor,
    Ceil,
    Sign,
    Log1p,
    Expm1,
    Erf,
    Logistic,
    /// Round half away from zero.
    RoundAfz,
    /// Round half to even.
    RoundEven,
    /// Logical for pred, bitwise for integers.
    Not,
    /// Float operand, pred result.
    IsFinite,
    Popcnt,
    Clz,
    /// Real and imaginary parts (of complex values; identity and zero for
    /// real ones).
    Real,
    Imag,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Max,
    Min,
    Pow,
    /// fmod for floats; truncated remainder (x when y == 0) for integers.
    Rem,
    Atan2,
    /// Logical for pred, bitwise for integers.
    And,
    Or,
    Xor,
    ShiftLeft,
    ShiftRightLogical,
    ShiftRightArithmetic,
    /// `complex(re, im)`.
    Complex,
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

/// One node of a kernel expression: its element type and dimensions, and
/// how its value at a row-major linear index is computed.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub ty: PrimitiveType,
    pub dims: Vec<i64>,
    pub expr: Expr,
}

/// A scalar computation inlined into kernels (reducer, comparator, scatter
/// combiner, select function): scalar parameters of the given types and one
/// scalar root per result.
#[derive(Clone, Debug, PartialEq)]
pub struct ScalarComp {
    pub params: Vec<PrimitiveType>,
    pub roots: Vec<Node>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Expr {
    /// Kernel input `slot`, a buffer with this node's dims, read at the index.
    Input(usize),
    /// Parameter `k` of the enclosing scalar computation.
    Param(usize),
    /// A floating-point scalar constant.
    Scalar(f64),
    /// An integer or pred scalar constant.
    Int(i128),
    /// The coordinate along `dim`.
    Iota(usize),
    Unary(UnOp, Box<Node>),
    Binary(BinOp, Box<Node>, Box<Node>),
    /// Compare; `total_order` compares floats by XLA's total order.
    Compare {
        dir: CmpDir,
        total_order: bool,
        a: Box<Node>,
        b: Box<Node>,
    },
    Select(Box<Node>, Box<Node>, Box<Node>),
    Convert(Box<Node>),
    /// The operand's bits read as this node's type: same width, or a
    /// narrower type with a trailing dim of `wide / narrow` elements (low
    /// bits first), or a wider one from such a trailing dim.
    BitcastConvert(Box<Node>),
    /// XLA's reduce-precision to `exponent_bits` / `mantissa_bits`.
    ReducePrecision {
        x: Box<Node>,
        exponent_bits: u32,
        mantissa_bits: u32,
    },
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
    /// Result `index` of reducing operand dims `dims` of `xs` with `comp`
    /// (parameters: the accumulators, then the elements), from `inits`.
    Reduce {
        xs: Vec<Node>,
        inits: Vec<Node>,
        dims: Vec<usize>,
        comp: ScalarComp,
        index: usize,
    },
    /// Result `index` of reduce-window (padding and dilation holes are
    /// skipped, as XLA skips them).
    ReduceWindow {
        xs: Vec<Node>,
        inits: Vec<Node>,
        window: Vec<WindowDim>,
        comp: ScalarComp,
        index: usize,
    },
    /// XLA's gather (start indices clamped into range).
    Gather {
        operand: Box<Node>,
        indices: Box<Node>,
        dnums: GatherDimensionNumbers,
        slice_sizes: Vec<i64>,
    },
    /// dot_general summed in the accumulation type (`acc`) per output element.
    Dot {
        lhs: Box<Node>,
        rhs: Box<Node>,
        dnums: DotDimensionNumbers,
    },
    /// XLA's fft over the last `lengths.len()` dims (a direct DFT per output
    /// element, accumulated in double; irfft reads the Hermitian half).
    Fft {
        x: Box<Node>,
        kind: FftKind,
        lengths: Vec<i64>,
    },
    /// Convolution per output element (a direct, implicit-GEMM loop over the
    /// kernel's input features and window).
    Conv {
        lhs: Box<Node>,
        rhs: Box<Node>,
        dnums: ConvDimensionNumbers,
        window: Vec<WindowDim>,
        feature_groups: i64,
        batch_groups: i64,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FftKind {
    Fft,
    Ifft,
    Rfft,
    Irfft,
}

/// What a kernel computes.
#[derive(Clone, Debug, PartialEq)]
pub enum KernelBody {
    /// `outs[k][i] = roots[k] at i`; every root has the dims of every output;
    /// the launch covers the output's elements.
    Elementwise(Vec<Node>),
    /// XLA's scatter into `outs`, which start as copies of the operands
    /// (`Kernel::init`); inputs are `[indices, updates_0, .., updates_k-1]`.
    /// Launch size 1 (updates applied in update order, as XLA's reference
    /// does) unless the indices are unique (one thread per update element).
    Scatter {
        dnums: ScatterDimensionNumbers,
        combiner: ScalarComp,
        /// dims of the operand (and outputs), indices and updates.
        operand_dims: Vec<i64>,
        indices_dims: Vec<i64>,
        update_dims: Vec<i64>,
        unique: bool,
    },
    /// Sorts every row along `dim` of the inputs (same dims), permuting all
    /// of them by `comparator` (parameters: lhs_0, rhs_0, lhs_1, rhs_1, ...);
    /// a stable merge sort per row; the last output is scratch (s64
    /// `[rows, 2 * len]`). Launch size: rows.
    Sort {
        dims: Vec<i64>,
        dim: usize,
        comparator: ScalarComp,
    },
    /// select-and-scatter, one output (operand-shaped) element per thread:
    /// inputs `[operand, source, init]`.
    SelectAndScatter {
        operand_dims: Vec<i64>,
        source_dims: Vec<i64>,
        window: Vec<WindowDim>,
        select: ScalarComp,
        scatter: ScalarComp,
    },
}

/// A generated kernel.
#[derive(Clone, Debug, PartialEq)]
pub struct Kernel {
    /// The kernel's function name (a C identifier, unique in the plan).
    pub name: String,
    pub outs: Vec<BufId>,
    /// `outs[k]` starts as a copy of `init[k]` when given (in-place kernels).
    pub init: Vec<Option<BufId>>,
    pub inputs: Vec<BufId>,
    /// The grid-stride loop's trip count.
    pub launch_size: i64,
    pub body: KernelBody,
}

/// `out[b] = lhs[b] (m x k) * rhs[b] (k x n)`, all row-major and contiguous
/// (cuBLAS on the GPU).
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

/// What a host step does with its instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostKind {
    /// A collective (or its async start), through the device's communicator.
    Collective,
    /// SPMDFullToShardShape / SPMDShardToFullShape (shard_map's boundary).
    ShardShape,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Bytes in the device layout (that of `collectives::DeviceBuffer`).
    Constant {
        out: BufId,
        bytes: Vec<u8>,
    },
    Kernel(Box<Kernel>),
    Dot(DotStep),
    /// The device's partition id (or replica id) as a u32 scalar.
    DeviceId {
        out: BufId,
        replica: bool,
    },
    /// Runs `cond` on the carry and, while it yields true, `body`; `out` is
    /// bound to the last carry.
    While {
        cond: usize,
        body: usize,
        init: ValRef,
        out: ValRef,
    },
    /// Runs branch `index` (pred: true is branch 0; s32 out of range is the
    /// last branch) on its operand.
    Conditional {
        index: BufId,
        index_is_pred: bool,
        branches: Vec<usize>,
        operands: Vec<ValRef>,
        out: ValRef,
    },
    Call {
        comp: usize,
        operands: Vec<ValRef>,
        out: ValRef,
    },
    /// An async collective's done: later work waits for the communication
    /// that produced `value` (a no-op where collectives are synchronous).
    Wait {
        value: ValRef,
    },
    /// An instruction run on the host through the runtime's collectives
    /// (communication, or shard_map's boundary): operands are read back,
    /// the result written to fresh buffers bound to `out`.
    Host {
        kind: HostKind,
        instr: Box<HloInstruction>,
        /// The computation the instruction is in (its operands' shardings).
        comp: CompId,
        operands: Vec<ValRef>,
        out: ValRef,
    },
}

/// A value of a planned computation: a buffer, a token or a tuple.
#[derive(Clone, Debug, PartialEq)]
pub enum ValRef {
    Buf(BufId),
    Token,
    Tuple(Vec<ValRef>),
}

impl ValRef {
    /// The buffers of the leaves, depth-first.
    pub fn leaves(&self) -> Vec<BufId> {
        fn walk(r: &ValRef, out: &mut Vec<BufId>) {
            match r {
                ValRef::Buf(b) => out.push(*b),
                ValRef::Token => {}
                ValRef::Tuple(v) => v.iter().for_each(|x| walk(x, out)),
            }
        }
        let mut out = Vec::new();
        walk(self, &mut out);
        out
    }
}

/// One planned computation: its parameters' buffers, steps and result.
#[derive(Clone, Debug, PartialEq)]
pub struct CompPlan {
    pub name: String,
    pub params: Vec<ValRef>,
    pub steps: Vec<Step>,
    pub result: ValRef,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub buffers: Vec<BufferInfo>,
    pub comps: Vec<CompPlan>,
    pub entry: usize,
}

impl Plan {
    /// Every kernel of every computation.
    pub fn kernels(&self) -> impl Iterator<Item = &Kernel> {
        self.comps.iter().flat_map(|c| {
            c.steps.iter().filter_map(|s| match s {
                Step::Kernel(k) => Some(&**k),
                _ => None,
            })
        })
    }

    pub fn entry(&self) -> &CompPlan {
        &self.comps[self.entry]
    }
}

impl Node {
    pub fn scalar(ty: PrimitiveType, expr: Expr) -> Node {
        Node {
            ty,
            dims: Vec::new(),
            expr,
        }
    }

    /// Number of nodes in the tree.
    pub fn size(&self) -> usize {
        1 + self.children().iter().map(|c| c.size()).sum::<usize>()
    }

    /// Replaces every `Expr::Param(k)` of this tree (outside nested scalar
    /// computations, which have parameters of their own) by `args[k]`.
    pub fn substitute_params(&mut self, args: &[Node]) {
        if let Expr::Param(k) = self.expr {
            if let Some(a) = args.get(k) {
                *self = a.clone();
            }
            return;
        }
        for c in self.children_mut() {
            c.substitute_params(args);
        }
    }

    fn children_mut(&mut self) -> Vec<&mut Node> {
        match &mut self.expr {
            Expr::Input(_) | Expr::Param(_) | Expr::Scalar(_) | Expr::Int(_) | Expr::Iota(_) => {
                vec![]
            }
            Expr::Unary(_, x)
            | Expr::Convert(x)
            | Expr::BitcastConvert(x)
            | Expr::ReducePrecision { x, .. }
            | Expr::Fft { x, .. }
            | Expr::Broadcast(x, _)
            | Expr::Transpose(x, _)
            | Expr::Reshape(x)
            | Expr::Slice(x, _, _) => vec![&mut **x],
            Expr::Binary(_, a, b) | Expr::Compare { a, b, .. } => vec![&mut **a, &mut **b],
            Expr::Concat(parts, _) => parts.iter_mut().collect(),
            Expr::DynSlice(x, st) => std::iter::once(&mut **x).chain(st.iter_mut()).collect(),
            Expr::DynUpdate(x, u, st) => [&mut **x, &mut **u]
                .into_iter()
                .chain(st.iter_mut())
                .collect(),
            Expr::Pad { x, value, .. } => vec![&mut **x, &mut **value],
            Expr::Select(p, t, f) => vec![&mut **p, &mut **t, &mut **f],
            Expr::Reduce { xs, inits, .. } | Expr::ReduceWindow { xs, inits, .. } => {
                xs.iter_mut().chain(inits.iter_mut()).collect()
            }
            Expr::Gather {
                operand, indices, ..
            } => vec![&mut **operand, &mut **indices],
            Expr::Dot { lhs, rhs, .. } | Expr::Conv { lhs, rhs, .. } => {
                vec![&mut **lhs, &mut **rhs]
            }
        }
    }

    pub fn children(&self) -> Vec<&Node> {
        match &self.expr {
            Expr::Input(_) | Expr::Param(_) | Expr::Scalar(_) | Expr::Int(_) | Expr::Iota(_) => {
                vec![]
            }
            Expr::Unary(_, x)
            | Expr::Convert(x)
            | Expr::BitcastConvert(x)
            | Expr::ReducePrecision { x, .. }
            | Expr::Fft { x, .. }
            | Expr::Broadcast(x, _)
            | Expr::Transpose(x, _)
            | Expr::Reshape(x)
            | Expr::Slice(x, _, _) => vec![x],
            Expr::Binary(_, a, b) | Expr::Compare { a, b, .. } => vec![a, b],
            Expr::Concat(parts, _) => parts.iter().collect(),
            Expr::DynSlice(x, st) => std::iter::once(&**x).chain(st.iter()).collect(),
            Expr::DynUpdate(x, u, st) => [&**x, &**u].into_iter().chain(st.iter()).collect(),
            Expr::Pad { x, value, .. } => vec![x, value],
            Expr::Select(p, t, f) => vec![p, t, f],
            Expr::Reduce { xs, inits, .. } | Expr::ReduceWindow { xs, inits, .. } => {
                xs.iter().chain(inits.iter()).collect()
            }
            Expr::Gather {
                operand, indices, ..
            } => vec![operand, indices],
            Expr::Dot { lhs, rhs, .. } | Expr::Conv { lhs, rhs, .. } => vec![lhs, rhs],
        }
    }
}
