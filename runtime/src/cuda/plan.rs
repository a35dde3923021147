//! The CUDA backend's planner (pure CPU code, no cudarc): turns the entry
//! computation into a list of steps over device buffers:
//!
//! * `Fused` kernels: trees of elementwise ops, broadcasts, reshapes,
//!   transposes, slices, iotas, converts and reductions ([`Node`]) that one
//!   generated CUDA kernel evaluates per output element (row-major linear
//!   index; see `codegen.rs`);
//! * `Dot`s for cuBLAS, with operands transposed (by planned fused kernels)
//!   into `[batch, m, k]` x `[batch, k, n]` row-major;
//! * parameters and non-scalar constants (uploads).
//!
//! Tuples and get-tuple-element are resolved here, at plan time.
//!
//! Invariant: [`Node::eval`] is the CPU meaning of the kernel `codegen.rs`
//! generates from the same tree (same index math, same per-node rounding), so
//! [`run_plan_on_cpu`] checks the plan's semantics against the interpreter
//! on any machine.

use crate::backend::RuntimeError;
use std::collections::HashMap;
use xla_hlo_evaluator::{Array, Value};
use xla_hlo_ir::literal::{float_from_bits, float_to_bits};
use xla_hlo_ir::{AttrKey, HloComputation, HloModule, InstrId, Opcode, PrimitiveType, Shape};

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
    /// the one value), each leaf made by `leaf`.
    pub fn outputs(
        &self,
        leaf: &dyn Fn(BufId) -> Result<Value, RuntimeError>,
    ) -> Result<Vec<Value>, RuntimeError> {
        fn build(
            r: &ValRef,
            f: &dyn Fn(BufId) -> Result<Value, RuntimeError>,
        ) -> Result<Value, RuntimeError> {
            match r {
                ValRef::Buf(b) => f(*b),
                ValRef::Tuple(v) => Ok(Value::Tuple(
                    v.iter().map(|x| build(x, f)).collect::<Result<_, _>>()?,
                )),
            }
        }
        match self {
            ValRef::Tuple(v) => v.iter().map(|x| build(x, leaf)).collect(),
            r => Ok(vec![build(r, leaf)?]),
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

/// Element types the CUDA backend handles (storage and arithmetic).
pub fn supported_type(ty: PrimitiveType) -> bool {
    use PrimitiveType as T;
    matches!(
        ty,
        T::Pred | T::S32 | T::S64 | T::U8 | T::U32 | T::F32 | T::F64 | T::Bf16
    )
}

/// Opcodes the CUDA backend plans (everything else is a compile error).
pub fn supported_opcode(op: Opcode) -> bool {
    use Opcode as O;
    matches!(
        op,
        O::Parameter
            | O::Constant
            | O::Tuple
            | O::GetTupleElement
            | O::Add
            | O::Subtract
            | O::Multiply
            | O::Divide
            | O::Maximum
            | O::Minimum
            | O::Negate
            | O::Exp
            | O::Log
            | O::Tanh
            | O::Rsqrt
            | O::Sqrt
            | O::Abs
            | O::Select
            | O::Compare
            | O::Convert
            | O::Copy
            | O::Broadcast
            | O::Reshape
            | O::Transpose
            | O::Slice
            | O::Iota
            | O::Reduce
            | O::Dot
            | O::Sin
            | O::Cos
            | O::Floor
            | O::Ceil
            | O::Sign
            | O::Log1p
            | O::Expm1
            | O::Not
            | O::IsFinite
            | O::Power
            | O::Remainder
            | O::And
            | O::Or
            | O::Xor
            | O::Clamp
            | O::Concatenate
            | O::Pad
            | O::Reverse
            | O::DynamicSlice
            | O::DynamicUpdateSlice
    )
}

/// `custom-call(x), custom_call_target="Sharding"` (a sharding annotation:
/// the identity on one device).
pub fn is_sharding_annotation(ins: &xla_hlo_ir::HloInstruction) -> bool {
    ins.opcode == Opcode::CustomCall
        && ins.operands.len() == 1
        && ins.ident_attr(AttrKey::CustomCallTarget) == Some("Sharding")
}

/// Whether the backend runs this instruction (its opcode, or a supported
/// custom-call).
pub fn supported_instruction(ins: &xla_hlo_ir::HloInstruction) -> bool {
    supported_opcode(ins.opcode) || is_sharding_annotation(ins)
}

/// Lists every entry instruction the backend cannot run (opcode or element
/// type), grouped by opcode with instruction names. `Ok` when all can.
pub fn check_supported(module: &HloModule) -> Result<(), String> {
    let comp = module.entry_computation();
    let mut by_op: Vec<(String, Vec<String>)> = Vec::new();
    let mut push = |key: String, name: &str| match by_op.iter_mut().find(|(k, _)| *k == key) {
        Some((_, v)) => v.push(name.to_string()),
        None => by_op.push((key, vec![name.to_string()])),
    };
    for ins in &comp.instructions {
        if !supported_instruction(ins) {
            push(ins.opcode.name().to_string(), &ins.name);
            continue;
        }
        for leaf in ins.shape.leaves() {
            if let Some(t) = leaf.element_type() {
                if !supported_type(t) {
                    push(format!("element type {}", t.name()), &ins.name);
                }
            } else if leaf.is_token() {
                push("token".to_string(), &ins.name);
            }
        }
    }
    if by_op.is_empty() {
        return Ok(());
    }
    let parts: Vec<String> = by_op
        .iter()
        .map(|(k, v)| format!("{k} ({})", v.join(", ")))
        .collect();
    Err(format!(
        "not supported by the CUDA backend yet: {}",
        parts.join("; ")
    ))
}

fn err(message: impl Into<String>) -> RuntimeError {
    RuntimeError::Compile {
        backend: "cuda",
        message: message.into(),
    }
}

fn un_op(op: Opcode) -> Option<UnOp> {
    Some(match op {
        Opcode::Negate => UnOp::Neg,
        Opcode::Exp => UnOp::Exp,
        Opcode::Log => UnOp::Log,
        Opcode::Tanh => UnOp::Tanh,
        Opcode::Sqrt => UnOp::Sqrt,
        Opcode::Rsqrt => UnOp::Rsqrt,
        Opcode::Abs => UnOp::Abs,
        Opcode::Sin => UnOp::Sin,
        Opcode::Cos => UnOp::Cos,
        Opcode::Floor => UnOp::Floor,
        Opcode::Ceil => UnOp::Ceil,
        Opcode::Sign => UnOp::Sign,
        Opcode::Log1p => UnOp::Log1p,
        Opcode::Expm1 => UnOp::Expm1,
        Opcode::Not => UnOp::Not,
        Opcode::IsFinite => UnOp::IsFinite,
        _ => return None,
    })
}

fn bin_op(op: Opcode) -> Option<BinOp> {
    Some(match op {
        Opcode::Add => BinOp::Add,
        Opcode::Subtract => BinOp::Sub,
        Opcode::Multiply => BinOp::Mul,
        Opcode::Divide => BinOp::Div,
        Opcode::Maximum => BinOp::Max,
        Opcode::Minimum => BinOp::Min,
        Opcode::Power => BinOp::Pow,
        Opcode::Remainder => BinOp::Rem,
        Opcode::And => BinOp::And,
        Opcode::Or => BinOp::Or,
        Opcode::Xor => BinOp::Xor,
        _ => return None,
    })
}

fn is_fusable(op: Opcode) -> bool {
    un_op(op).is_some()
        || bin_op(op).is_some()
        || matches!(
            op,
            Opcode::Select
                | Opcode::Clamp
                | Opcode::Concatenate
                | Opcode::Pad
                | Opcode::Reverse
                | Opcode::DynamicSlice
                | Opcode::DynamicUpdateSlice
                | Opcode::CustomCall
                | Opcode::Compare
                | Opcode::Convert
                | Opcode::Copy
                | Opcode::Broadcast
                | Opcode::Reshape
                | Opcode::Transpose
                | Opcode::Slice
                | Opcode::Iota
                | Opcode::Reduce
        )
}

fn array_of(shape: &Shape, name: &str) -> Result<(PrimitiveType, Vec<i64>), RuntimeError> {
    match shape.as_array() {
        Some(a) => Ok((a.element_type, a.dims.clone())),
        None => Err(err(format!("{name}: expected an array shape, got {shape}"))),
    }
}

fn scalar_constant(comp: &HloComputation, id: InstrId) -> Option<f64> {
    let ins = comp.instr(id);
    if ins.opcode != Opcode::Constant || !ins.shape.dims().is_empty() || !ins.shape.is_array() {
        return None;
    }
    let v = Value::from_literal(ins.literal.as_deref()?).ok()?;
    Some(v.as_array()?.get_f64(0))
}

/// The reducer of a `reduce`: a computation `root = op(p0, p1)`.
fn reducer(module: &HloModule, comp_id: xla_hlo_ir::CompId) -> Option<BinOp> {
    let c = module.comp(comp_id);
    let root = c.root_instr();
    if c.parameters.len() != 2 || root.operands.len() != 2 {
        return None;
    }
    let op = bin_op(root.opcode)?;
    let ps: Vec<Option<i64>> = root
        .operands
        .iter()
        .map(|o| c.instr(*o).parameter_number)
        .collect();
    if ps.iter().all(|p| p.is_some()) && ps[0] != ps[1] {
        Some(op)
    } else {
        None
    }
}

struct Planner<'m> {
    module: &'m HloModule,
    comp: &'m HloComputation,
    users: Vec<Vec<InstrId>>,
    vals: HashMap<InstrId, ValRef>,
    plan: Plan,
}

/// Plans the entry computation. Fails (naming the instruction) on anything
/// the backend cannot run; call [`check_supported`] first for the full list.
pub fn plan_module(module: &HloModule) -> Result<Plan, RuntimeError> {
    check_supported(module).map_err(err)?;
    let comp = module.entry_computation();
    let mut p = Planner {
        module,
        comp,
        users: comp.users(),
        vals: HashMap::new(),
        plan: Plan {
            buffers: Vec::new(),
            steps: Vec::new(),
            result: ValRef::Tuple(Vec::new()),
        },
    };
    for id in comp.ids() {
        for o in &comp.instr(id).operands {
            if o.index() >= id.index() {
                return Err(err(format!(
                    "{}: operand defined after its user (unsupported order)",
                    comp.instr(id).name
                )));
            }
        }
        if p.materialized(id) {
            let v = p.lower(id)?;
            p.vals.insert(id, v);
        }
    }
    p.plan.result = p
        .vals
        .get(&comp.root)
        .cloned()
        .ok_or_else(|| err("the root was not planned"))?;
    Ok(p.plan)
}

impl Planner<'_> {
    fn new_buf(&mut self, ty: PrimitiveType, dims: Vec<i64>, name: &str) -> BufId {
        self.plan.buffers.push(BufferInfo {
            ty,
            dims,
            name: name.to_string(),
        });
        self.plan.buffers.len() - 1
    }

    /// Whether `id`'s value gets its own buffer (or tuple of buffers)
    /// rather than being inlined into its users' kernels.
    fn materialized(&self, id: InstrId) -> bool {
        let ins = self.comp.instr(id);
        let users = &self.users[id.index()];
        let any_unfused_user = users
            .iter()
            .any(|u| !is_fusable(self.comp.instr(*u).opcode));
        if id == self.comp.root || any_unfused_user {
            return true;
        }
        if scalar_constant(self.comp, id).is_some() {
            // Inlined into every fused user (reduce inits included).
            return false;
        }
        if !is_fusable(ins.opcode) || ins.opcode == Opcode::Reduce {
            return true;
        }
        users.len() > 1 && !self.cheap(id)
    }

    /// Recomputed per use instead of materialized.
    fn cheap(&self, id: InstrId) -> bool {
        let ins = self.comp.instr(id);
        match ins.opcode {
            Opcode::Iota => true,
            Opcode::Constant => scalar_constant(self.comp, id).is_some(),
            Opcode::Broadcast => {
                let o = ins.operands[0];
                let oi = self.comp.instr(o);
                !is_fusable(oi.opcode) && oi.opcode != Opcode::Constant
                    || scalar_constant(self.comp, o).is_some()
                    || oi.opcode == Opcode::Reduce
            }
            _ => false,
        }
    }

    fn buf_of(&self, id: InstrId) -> Result<BufId, RuntimeError> {
        match self.vals.get(&id) {
            Some(ValRef::Buf(b)) => Ok(*b),
            Some(ValRef::Tuple(_)) => Err(err(format!(
                "{}: a tuple used as an array",
                self.comp.instr(id).name
            ))),
            None => Err(err(format!("{}: not planned", self.comp.instr(id).name))),
        }
    }

    fn lower(&mut self, id: InstrId) -> Result<ValRef, RuntimeError> {
        let ins = self.comp.instr(id);
        match ins.opcode {
            Opcode::Parameter => {
                let number = ins.parameter_number.unwrap_or(0) as usize;
                Ok(self.lower_param(&ins.shape.clone(), number, &mut Vec::new(), &ins.name))
            }
            Opcode::Constant => {
                let lit = ins
                    .literal
                    .as_deref()
                    .ok_or_else(|| err(format!("{}: constant without literal", ins.name)))?;
                let value = Value::from_literal(lit)
                    .map_err(|e| err(format!("{}: {e}", ins.name)))?
                    .into_array()
                    .ok_or_else(|| err(format!("{}: tuple constants are unsupported", ins.name)))?;
                let out = self.new_buf(value.ty, value.dims.clone(), &ins.name);
                self.plan.steps.push(Step::Constant { out, value });
                Ok(ValRef::Buf(out))
            }
            Opcode::Tuple => Ok(ValRef::Tuple(
                ins.operands
                    .iter()
                    .map(|o| {
                        self.vals
                            .get(o)
                            .cloned()
                            .ok_or_else(|| err(format!("{}: operand not planned", ins.name)))
                    })
                    .collect::<Result<_, _>>()?,
            )),
            Opcode::GetTupleElement => {
                let index = ins.int_attr(AttrKey::Index).unwrap_or(0) as usize;
                match self.vals.get(&ins.operands[0]) {
                    Some(ValRef::Tuple(v)) if index < v.len() => Ok(v[index].clone()),
                    _ => Err(err(format!("{}: bad get-tuple-element", ins.name))),
                }
            }
            Opcode::Dot => self.lower_dot(id).map(ValRef::Buf),
            _ => {
                let (ty, dims) = array_of(&ins.shape, &ins.name)?;
                let out = self.new_buf(ty, dims, &ins.name);
                let mut inputs = Vec::new();
                let root = self.node(id, true, &mut inputs)?;
                let name = format!("k{}_{}", self.plan.steps.len(), c_ident(&ins.name));
                self.plan.steps.push(Step::Fused(FusedKernel {
                    name,
                    out,
                    inputs,
                    root,
                }));
                Ok(ValRef::Buf(out))
            }
        }
    }

    fn lower_param(
        &mut self,
        shape: &Shape,
        number: usize,
        index: &mut Vec<usize>,
        name: &str,
    ) -> ValRef {
        if shape.is_tuple() {
            let mut v = Vec::new();
            for (i, s) in shape.tuple_elements().iter().enumerate() {
                index.push(i);
                v.push(self.lower_param(s, number, index, name));
                index.pop();
            }
            return ValRef::Tuple(v);
        }
        let (ty, dims) = (
            shape.element_type().unwrap_or(PrimitiveType::F32),
            shape.dims().to_vec(),
        );
        let out = self.new_buf(ty, dims, name);
        self.plan.steps.push(Step::Param {
            out,
            number,
            index: index.clone(),
        });
        ValRef::Buf(out)
    }

    /// Builds the expression of `id`; materialized operands become inputs.
    fn node(
        &self,
        id: InstrId,
        is_root: bool,
        inputs: &mut Vec<BufId>,
    ) -> Result<Node, RuntimeError> {
        let ins = self.comp.instr(id);
        let (ty, dims) = array_of(&ins.shape, &ins.name)?;
        if !is_root && self.vals.contains_key(&id) {
            let b = self.buf_of(id)?;
            let slot = match inputs.iter().position(|x| *x == b) {
                Some(s) => s,
                None => {
                    inputs.push(b);
                    inputs.len() - 1
                }
            };
            return Ok(Node {
                ty,
                dims,
                expr: Expr::Input(slot),
            });
        }
        let mut op = |i: usize| -> Result<Box<Node>, RuntimeError> {
            Ok(Box::new(self.node(ins.operands[i], false, inputs)?))
        };
        let expr = if let Some(u) = un_op(ins.opcode) {
            Expr::Unary(u, op(0)?)
        } else if let Some(b) = bin_op(ins.opcode) {
            if b == BinOp::Pow && !is_float(ty) {
                return Err(err(format!("{}: integer power is unsupported", ins.name)));
            }
            Expr::Binary(b, op(0)?, op(1)?)
        } else {
            match ins.opcode {
                Opcode::Constant => Expr::Scalar(
                    scalar_constant(self.comp, id)
                        .ok_or_else(|| err(format!("{}: constant not inlinable", ins.name)))?,
                ),
                Opcode::Iota => {
                    Expr::Iota(ins.int_attr(AttrKey::IotaDimension).unwrap_or(0) as usize)
                }
                Opcode::Select => Expr::Select(op(0)?, op(1)?, op(2)?),
                Opcode::Compare => {
                    let d = match ins.ident_attr(AttrKey::Direction) {
                        Some("EQ") => CmpDir::Eq,
                        Some("NE") => CmpDir::Ne,
                        Some("LT") => CmpDir::Lt,
                        Some("LE") => CmpDir::Le,
                        Some("GT") => CmpDir::Gt,
                        Some("GE") => CmpDir::Ge,
                        d => return Err(err(format!("{}: compare direction {d:?}", ins.name))),
                    };
                    if ins.ident_attr(AttrKey::CompareType) == Some("TOTALORDER") {
                        return Err(err(format!(
                            "{}: TOTALORDER compare is unsupported",
                            ins.name
                        )));
                    }
                    Expr::Compare(d, op(0)?, op(1)?)
                }
                Opcode::Convert => Expr::Convert(op(0)?),
                Opcode::DynamicSlice => {
                    let starts = (1..ins.operands.len())
                        .map(|i| op(i).map(|b| *b))
                        .collect::<Result<Vec<_>, _>>()?;
                    Expr::DynSlice(op(0)?, starts)
                }
                Opcode::DynamicUpdateSlice => {
                    let starts = (2..ins.operands.len())
                        .map(|i| op(i).map(|b| *b))
                        .collect::<Result<Vec<_>, _>>()?;
                    Expr::DynUpdate(op(0)?, op(1)?, starts)
                }
                Opcode::Reverse => {
                    // A slice with stride -1 along the reversed dims.
                    let rd = ins.dimensions();
                    let starts = (0..dims.len())
                        .map(|d| {
                            if rd.contains(&(d as i64)) {
                                dims[d] - 1
                            } else {
                                0
                            }
                        })
                        .collect();
                    let strides = (0..dims.len())
                        .map(|d| if rd.contains(&(d as i64)) { -1 } else { 1 })
                        .collect();
                    Expr::Slice(op(0)?, starts, strides)
                }
                Opcode::Concatenate => {
                    let d = ins.dimensions().first().copied().unwrap_or(0) as usize;
                    let parts = (0..ins.operands.len())
                        .map(|i| op(i).map(|b| *b))
                        .collect::<Result<Vec<_>, _>>()?;
                    Expr::Concat(parts, d)
                }
                Opcode::Pad => {
                    let pd = ins
                        .padding()
                        .ok_or_else(|| err(format!("{}: pad without padding=", ins.name)))?;
                    Expr::Pad {
                        x: op(0)?,
                        value: op(1)?,
                        low: pd.iter().map(|p| p.low).collect(),
                        interior: pd.iter().map(|p| p.interior).collect(),
                    }
                }
                Opcode::Copy | Opcode::Reshape | Opcode::CustomCall => Expr::Reshape(op(0)?),
                Opcode::Clamp => {
                    // min(max(x, lo), hi), scalar bounds broadcast.
                    let widen = |n: Box<Node>| -> Box<Node> {
                        if n.dims.is_empty() && !dims.is_empty() {
                            Box::new(Node {
                                ty: n.ty,
                                dims: dims.clone(),
                                expr: Expr::Broadcast(n, vec![]),
                            })
                        } else {
                            n
                        }
                    };
                    let (lo, x, hi) = (widen(op(0)?), op(1)?, widen(op(2)?));
                    let mx = Node {
                        ty,
                        dims: dims.clone(),
                        expr: Expr::Binary(BinOp::Max, x, lo),
                    };
                    Expr::Binary(BinOp::Min, Box::new(mx), hi)
                }
                Opcode::Broadcast => Expr::Broadcast(
                    op(0)?,
                    ins.dimensions().iter().map(|d| *d as usize).collect(),
                ),
                Opcode::Transpose => Expr::Transpose(
                    op(0)?,
                    ins.dimensions().iter().map(|d| *d as usize).collect(),
                ),
                Opcode::Slice => {
                    let sd = ins
                        .slice_dims()
                        .ok_or_else(|| err(format!("{}: slice without slice=", ins.name)))?;
                    Expr::Slice(
                        op(0)?,
                        sd.iter().map(|s| s.start).collect(),
                        sd.iter().map(|s| s.stride).collect(),
                    )
                }
                Opcode::Reduce => {
                    if ins.operands.len() != 2 {
                        return Err(err(format!("{}: variadic reduce is unsupported", ins.name)));
                    }
                    let r = ins
                        .to_apply()
                        .and_then(|c| reducer(self.module, c))
                        .ok_or_else(|| {
                            err(format!(
                                "{}: reducer must be add/multiply/maximum/minimum of its two parameters",
                                ins.name
                            ))
                        })?;
                    Expr::Reduce {
                        x: op(0)?,
                        init: op(1)?,
                        dims: ins.dimensions().iter().map(|d| *d as usize).collect(),
                        op: r,
                    }
                }
                o => return Err(err(format!("{}: {} cannot be fused", ins.name, o.name()))),
            }
        };
        Ok(Node { ty, dims, expr })
    }

    fn lower_dot(&mut self, id: InstrId) -> Result<BufId, RuntimeError> {
        let ins = self.comp.instr(id);
        let name = ins.name.clone();
        let (oty, odims) = array_of(&ins.shape, &name)?;
        let (lty, ldims) = array_of(&self.comp.instr(ins.operands[0]).shape, &name)?;
        let (rty, rdims) = array_of(&self.comp.instr(ins.operands[1]).shape, &name)?;
        let ok = matches!(
            (lty, rty, oty),
            (PrimitiveType::F32, PrimitiveType::F32, PrimitiveType::F32)
                | (
                    PrimitiveType::Bf16,
                    PrimitiveType::Bf16,
                    PrimitiveType::Bf16
                )
                | (PrimitiveType::Bf16, PrimitiveType::Bf16, PrimitiveType::F32)
        );
        if !ok {
            return Err(err(format!(
                "{name}: dot {}x{}->{} is unsupported (f32 and bf16 only)",
                lty.name(),
                rty.name(),
                oty.name()
            )));
        }
        let dn = ins.dot_dimension_numbers();
        let free = |rank: usize, batch: &[i64], contr: &[i64]| -> Vec<i64> {
            (0..rank as i64)
                .filter(|d| !batch.contains(d) && !contr.contains(d))
                .collect()
        };
        let lfree = free(ldims.len(), &dn.lhs_batch, &dn.lhs_contracting);
        let rfree = free(rdims.len(), &dn.rhs_batch, &dn.rhs_contracting);
        let prod = |dims: &[i64], ds: &[i64]| ds.iter().map(|d| dims[*d as usize]).product::<i64>();
        let batch = prod(&ldims, &dn.lhs_batch);
        let m = prod(&ldims, &lfree);
        let k = prod(&ldims, &dn.lhs_contracting);
        let n = prod(&rdims, &rfree);
        let lperm: Vec<i64> = [dn.lhs_batch.clone(), lfree, dn.lhs_contracting.clone()].concat();
        let rperm: Vec<i64> = [dn.rhs_batch.clone(), dn.rhs_contracting.clone(), rfree].concat();
        let (lop, rop) = (ins.operands[0], ins.operands[1]);
        let lhs = self.canonical(lop, &lperm, &format!("{name}_lhs"))?;
        let rhs = self.canonical(rop, &rperm, &format!("{name}_rhs"))?;
        let out = self.new_buf(oty, odims, &name);
        self.plan.steps.push(Step::Dot(DotStep {
            out,
            lhs,
            rhs,
            batch,
            m,
            n,
            k,
        }));
        Ok(out)
    }

    /// `id`'s buffer with its dims permuted by `perm` (a planned transpose
    /// kernel unless `perm` is the identity).
    fn canonical(&mut self, id: InstrId, perm: &[i64], name: &str) -> Result<BufId, RuntimeError> {
        let b = self.buf_of(id)?;
        if perm.iter().enumerate().all(|(i, p)| *p == i as i64) {
            return Ok(b);
        }
        let info = self.plan.buffers[b].clone();
        let dims: Vec<i64> = perm.iter().map(|p| info.dims[*p as usize]).collect();
        let out = self.new_buf(info.ty, dims.clone(), name);
        let root = Node {
            ty: info.ty,
            dims,
            expr: Expr::Transpose(
                Box::new(Node {
                    ty: info.ty,
                    dims: info.dims.clone(),
                    expr: Expr::Input(0),
                }),
                perm.iter().map(|p| *p as usize).collect(),
            ),
        };
        let kname = format!("k{}_{}", self.plan.steps.len(), c_ident(name));
        self.plan.steps.push(Step::Fused(FusedKernel {
            name: kname,
            out,
            inputs: vec![b],
            root,
        }));
        Ok(out)
    }
}

/// `name` as a C identifier fragment.
pub fn c_ident(name: &str) -> String {
    name.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

// ---------------------------------------------------------------------------
// CPU semantics of the plan (what the generated kernels compute).

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

fn is_float(ty: PrimitiveType) -> bool {
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
    let exec = |m: String| RuntimeError::Execute(xla_hlo_evaluator::EvalError::Internal(m));
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
        Ok(Value::Array(Array::from_f64s(
            info.ty,
            info.dims.clone(),
            v,
        )?))
    };
    plan.result.outputs(&to_value)
}
