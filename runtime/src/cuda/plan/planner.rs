//! The planner: from a module to a `Plan`. Every computation the entry
//! reaches by control flow is planned once (`Builder::plan_comp`); in each,
//! an instruction is either materialized (its own buffer, or tuple of
//! buffers) or inlined into its users' kernels. Dots of cuBLAS types
//! become cuBLAS steps on operands transposed into `[batch, m, k]` x
//! `[batch, k, n]` row-major (other dots, and convolutions, are kernels);
//! while, conditional and call become host-driven steps over planned
//! computations; collectives and shard_map's boundary run on the host
//! through the runtime's collectives; tuples and get-tuple-element are
//! resolved at plan time. Reducers, comparators, scatter combiners and
//! select functions are compiled to scalar expressions (`ScalarComp`).
//!
//! Invariants: an instruction is planned after its operands (an operand
//! defined after its user is an error); a kernel expression stops at
//! materialized values, which become its kernel's inputs (each buffer
//! once); every failure is a `RuntimeError::Compile`, naming the
//! instruction where there is one.

use super::opcodes::{bin_op, is_fusable, scalar_constant, un_op};
use super::support::{
    check_supported, is_identity_custom_call, is_shard_shape_custom_call, is_topk_custom_call,
};
use super::types::{
    BinOp, BufId, BufferInfo, CmpDir, CompPlan, DotStep, Expr, FftKind, HostKind, Kernel,
    KernelBody, Node, Plan, ScalarComp, Step, ValRef,
};
use crate::error::RuntimeError;
use std::collections::HashMap;
use xla_hlo_evaluator::collective::to_buffer;
use xla_hlo_evaluator::Value;
use xla_hlo_ir::{
    AttrKey, CompId, HloComputation, HloInstruction, HloModule, InstrId, Opcode, PrimitiveType,
    Shape,
};

fn err(message: impl Into<String>) -> RuntimeError {
    RuntimeError::Compile {
        backend: "cuda",
        message: message.into(),
    }
}

fn array_of(shape: &Shape, name: &str) -> Result<(PrimitiveType, Vec<i64>), RuntimeError> {
    match shape.as_array() {
        Some(a) => Ok((a.element_type, a.dims.clone())),
        None => Err(err(format!("{name}: expected an array shape, got {shape}"))),
    }
}

/// Element type and dims of leaf `index` of a (possibly tuple) shape.
fn leaf_array(
    shape: &Shape,
    index: usize,
    name: &str,
) -> Result<(PrimitiveType, Vec<i64>), RuntimeError> {
    match shape {
        Shape::Tuple(elems) => match elems.get(index) {
            Some(s) => array_of(s, name),
            None => Err(err(format!("{name}: no tuple element {index}"))),
        },
        s => array_of(s, name),
    }
}

/// Types cuBLAS multiplies (lhs = rhs type, result type).
fn cublas_types(l: PrimitiveType, r: PrimitiveType, o: PrimitiveType) -> bool {
    use PrimitiveType as T;
    l == r
        && matches!(
            (l, o),
            (T::F32, T::F32)
                | (T::Bf16, T::Bf16)
                | (T::Bf16, T::F32)
                | (T::F16, T::F16)
                | (T::F16, T::F32)
                | (T::F64, T::F64)
        )
}

/// `name` as a C identifier fragment.
pub fn c_ident(name: &str) -> String {
    name.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// The plan under construction: buffers and computations shared by every
/// computation's planner.
struct Builder<'m> {
    module: &'m HloModule,
    buffers: Vec<BufferInfo>,
    comps: Vec<Option<CompPlan>>,
    planned: HashMap<CompId, usize>,
    kernels: usize,
}

/// Plans every computation the entry reaches. Fails (naming the
/// instruction) on anything the backend cannot run; [`check_supported`]
/// lists every unsupported instruction at once.
pub fn plan_module(module: &HloModule) -> Result<Plan, RuntimeError> {
    check_supported(module).map_err(err)?;
    let mut b = Builder {
        module,
        buffers: Vec::new(),
        comps: Vec::new(),
        planned: HashMap::new(),
        kernels: 0,
    };
    let entry = b.plan_comp(module.entry)?;
    let comps = b
        .comps
        .into_iter()
        .map(|c| c.ok_or_else(|| err("a computation calls itself")))
        .collect::<Result<_, _>>()?;
    Ok(Plan {
        buffers: b.buffers,
        comps,
        entry,
    })
}

impl<'m> Builder<'m> {
    fn new_buf(&mut self, ty: PrimitiveType, dims: Vec<i64>, name: &str) -> BufId {
        self.buffers.push(BufferInfo {
            ty,
            dims,
            name: name.to_string(),
        });
        self.buffers.len() - 1
    }

    /// Fresh buffers for every leaf of `shape` (tokens stay tokens).
    fn fresh(&mut self, shape: &Shape, name: &str) -> ValRef {
        match shape {
            Shape::Tuple(elems) => {
                ValRef::Tuple(elems.iter().map(|s| self.fresh(s, name)).collect())
            }
            s if s.is_token() => ValRef::Token,
            s => {
                let ty = s.element_type().unwrap_or(PrimitiveType::F32);
                let b = self.new_buf(ty, s.dims().to_vec(), name);
                ValRef::Buf(b)
            }
        }
    }

    fn kernel_name(&mut self, name: &str) -> String {
        self.kernels += 1;
        format!("k{}_{}", self.kernels, c_ident(name))
    }

    /// Plans computation `c` once; returns its index in `Plan::comps`.
    fn plan_comp(&mut self, c: CompId) -> Result<usize, RuntimeError> {
        if let Some(i) = self.planned.get(&c) {
            return Ok(*i);
        }
        let index = self.comps.len();
        self.comps.push(None);
        self.planned.insert(c, index);
        let module = self.module;
        let comp = module.comp(c);
        let mut p = CompPlanner {
            exprs: Exprs {
                module,
                comp,
                vals: HashMap::new(),
                scalar: false,
            },
            users: comp.users(),
            steps: Vec::new(),
            comp_id: c,
            b: self,
        };
        let mut params = Vec::new();
        for &pid in &comp.parameters {
            let ins = comp.instr(pid);
            let v = p.b.fresh(&ins.shape, &ins.name);
            p.exprs.vals.insert(pid, v.clone());
            params.push(v);
        }
        for id in comp.ids() {
            let ins = comp.instr(id);
            for o in &ins.operands {
                if o.index() >= id.index() {
                    return Err(err(format!(
                        "{}: operand defined after its user (unsupported order)",
                        ins.name
                    )));
                }
            }
            if ins.opcode != Opcode::Parameter && p.materialized(id) {
                let v = p.lower(id)?;
                p.exprs.vals.insert(id, v);
            }
        }
        let result = p
            .exprs
            .vals
            .get(&comp.root)
            .cloned()
            .ok_or_else(|| err(format!("{}: the root was not planned", comp.name)))?;
        let steps = std::mem::take(&mut p.steps);
        self.comps[index] = Some(CompPlan {
            name: comp.name.clone(),
            params,
            steps,
            result,
        });
        Ok(index)
    }
}

/// Builds kernel expressions in one computation: materialized values are
/// kernel inputs; in a scalar computation, parameters are `Expr::Param`.
struct Exprs<'m> {
    module: &'m HloModule,
    comp: &'m HloComputation,
    vals: HashMap<InstrId, ValRef>,
    scalar: bool,
}

/// Compiles a reducer / comparator / combiner computation into scalar
/// expressions (one root per result; a tuple root gives several).
fn scalar_comp(module: &HloModule, c: CompId, what: &str) -> Result<ScalarComp, RuntimeError> {
    let comp = module.comp(c);
    let e = Exprs {
        module,
        comp,
        vals: HashMap::new(),
        scalar: true,
    };
    let mut params = Vec::new();
    for &pid in &comp.parameters {
        let (ty, dims) = array_of(&comp.instr(pid).shape, &comp.instr(pid).name)?;
        if !dims.is_empty() {
            return Err(err(format!(
                "{what}: computation {} has a non-scalar parameter",
                comp.name
            )));
        }
        params.push(ty);
    }
    let root = comp.root_instr();
    let root_ids: Vec<InstrId> = if root.opcode == Opcode::Tuple {
        root.operands.clone()
    } else {
        vec![comp.root]
    };
    let mut no_inputs = Vec::new();
    let roots = root_ids
        .iter()
        .map(|&r| e.node(r, true, &mut no_inputs, 0))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| err(format!("{what} (computation {}): {e}", comp.name)))?;
    Ok(ScalarComp { params, roots })
}

impl Exprs<'_> {
    fn buf_of(&self, id: InstrId) -> Result<BufId, RuntimeError> {
        match self.vals.get(&id) {
            Some(ValRef::Buf(b)) => Ok(*b),
            Some(_) => Err(err(format!(
                "{}: a tuple used as an array",
                self.comp.instr(id).name
            ))),
            None => Err(err(format!("{}: not planned", self.comp.instr(id).name))),
        }
    }

    /// The expression of `id` (leaf `index` of a tuple-shaped variadic
    /// reduce); materialized operands become inputs.
    fn node(
        &self,
        id: InstrId,
        is_root: bool,
        inputs: &mut Vec<BufId>,
        index: usize,
    ) -> Result<Node, RuntimeError> {
        let ins = self.comp.instr(id);
        let (ty, dims) = leaf_array(&ins.shape, index, &ins.name)?;
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
        let op = |i: usize, inputs: &mut Vec<BufId>| -> Result<Box<Node>, RuntimeError> {
            Ok(Box::new(self.node(ins.operands[i], false, inputs, 0)?))
        };
        let expr = if let Some(u) = un_op(ins.opcode) {
            Expr::Unary(u, op(0, inputs)?)
        } else if let Some(b) = bin_op(ins.opcode) {
            Expr::Binary(b, op(0, inputs)?, op(1, inputs)?)
        } else {
            match ins.opcode {
                Opcode::Parameter if self.scalar => {
                    Expr::Param(ins.parameter_number.unwrap_or(0) as usize)
                }
                Opcode::Constant => scalar_constant(self.comp, id)
                    .ok_or_else(|| err(format!("{}: constant not inlinable", ins.name)))?,
                Opcode::Iota => {
                    Expr::Iota(ins.int_attr(AttrKey::IotaDimension).unwrap_or(0) as usize)
                }
                Opcode::Select => Expr::Select(op(0, inputs)?, op(1, inputs)?, op(2, inputs)?),
                Opcode::Compare => {
                    let dir = match ins.ident_attr(AttrKey::Direction) {
                        Some("EQ") => CmpDir::Eq,
                        Some("NE") => CmpDir::Ne,
                        Some("LT") => CmpDir::Lt,
                        Some("LE") => CmpDir::Le,
                        Some("GT") => CmpDir::Gt,
                        Some("GE") => CmpDir::Ge,
                        d => return Err(err(format!("{}: compare direction {d:?}", ins.name))),
                    };
                    Expr::Compare {
                        dir,
                        total_order: ins.ident_attr(AttrKey::CompareType) == Some("TOTALORDER"),
                        a: op(0, inputs)?,
                        b: op(1, inputs)?,
                    }
                }
                Opcode::Convert => Expr::Convert(op(0, inputs)?),
                Opcode::BitcastConvert => {
                    let x = op(0, inputs)?;
                    let (wi, wo) = (x.ty.bit_width() as i64, ty.bit_width() as i64);
                    let fits = if wi == wo {
                        x.dims == dims
                    } else if wi > wo {
                        dims.split_last() == Some((&(wi / wo), &x.dims[..]))
                    } else {
                        x.dims.split_last() == Some((&(wo / wi), &dims[..]))
                    };
                    if !fits || wi % wo.min(wi).max(1) != 0 || wo % wi.min(wo).max(1) != 0 {
                        return Err(err(format!(
                            "{}: bitcast-convert from {} to {} with these shapes is unsupported",
                            ins.name,
                            x.ty.name(),
                            ty.name()
                        )));
                    }
                    Expr::BitcastConvert(x)
                }
                Opcode::Call if self.scalar => {
                    // A call inside a reducer, comparator or combiner: the
                    // callee's expression with its parameters replaced by
                    // the call's operands.
                    let callee = ins
                        .to_apply()
                        .ok_or_else(|| err(format!("{}: call without to_apply", ins.name)))
                        .and_then(|c| scalar_comp(self.module, c, &ins.name))?;
                    let [root] = callee.roots.as_slice() else {
                        return Err(err(format!(
                            "{}: a call returning a tuple inside a scalar computation is unsupported",
                            ins.name
                        )));
                    };
                    let args = (0..ins.operands.len())
                        .map(|i| op(i, inputs).map(|b| *b))
                        .collect::<Result<Vec<_>, _>>()?;
                    let mut node = root.clone();
                    node.substitute_params(&args);
                    return Ok(node);
                }
                Opcode::ReducePrecision => {
                    if !matches!(
                        ty,
                        PrimitiveType::F32
                            | PrimitiveType::F64
                            | PrimitiveType::Bf16
                            | PrimitiveType::F16
                    ) {
                        return Err(err(format!(
                            "{}: reduce-precision of {} is unsupported",
                            ins.name,
                            ty.name()
                        )));
                    }
                    let e = ins.int_attr(AttrKey::ExponentBits).unwrap_or(8);
                    let m = ins.int_attr(AttrKey::MantissaBits).unwrap_or(23);
                    if !(1..=11).contains(&e) || !(0..=52).contains(&m) {
                        return Err(err(format!(
                            "{}: bad reduce-precision bit counts",
                            ins.name
                        )));
                    }
                    Expr::ReducePrecision {
                        x: op(0, inputs)?,
                        exponent_bits: e as u32,
                        mantissa_bits: m as u32,
                    }
                }
                Opcode::DynamicSlice => {
                    let starts = (1..ins.operands.len())
                        .map(|i| op(i, inputs).map(|b| *b))
                        .collect::<Result<Vec<_>, _>>()?;
                    Expr::DynSlice(op(0, inputs)?, starts)
                }
                Opcode::DynamicUpdateSlice => {
                    let starts = (2..ins.operands.len())
                        .map(|i| op(i, inputs).map(|b| *b))
                        .collect::<Result<Vec<_>, _>>()?;
                    Expr::DynUpdate(op(0, inputs)?, op(1, inputs)?, starts)
                }
                Opcode::Reverse => {
                    // A slice with stride -1 along the reversed dims.
                    let rd = ins.dimensions();
                    let rev = |d: usize| rd.contains(&(d as i64));
                    let starts = (0..dims.len())
                        .map(|d| if rev(d) { dims[d] - 1 } else { 0 })
                        .collect();
                    let strides = (0..dims.len())
                        .map(|d| if rev(d) { -1 } else { 1 })
                        .collect();
                    Expr::Slice(op(0, inputs)?, starts, strides)
                }
                Opcode::Concatenate => {
                    let d = ins.dimensions().first().copied().unwrap_or(0) as usize;
                    let parts = (0..ins.operands.len())
                        .map(|i| op(i, inputs).map(|b| *b))
                        .collect::<Result<Vec<_>, _>>()?;
                    Expr::Concat(parts, d)
                }
                Opcode::Pad => {
                    let pd = ins
                        .padding()
                        .ok_or_else(|| err(format!("{}: pad without padding=", ins.name)))?;
                    Expr::Pad {
                        x: op(0, inputs)?,
                        value: op(1, inputs)?,
                        low: pd.iter().map(|p| p.low).collect(),
                        interior: pd.iter().map(|p| p.interior).collect(),
                    }
                }
                Opcode::Copy | Opcode::Reshape | Opcode::Bitcast => Expr::Reshape(op(0, inputs)?),
                Opcode::CustomCall if is_identity_custom_call(ins) => Expr::Reshape(op(0, inputs)?),
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
                    let lo = widen(op(0, inputs)?);
                    let x = op(1, inputs)?;
                    let hi = widen(op(2, inputs)?);
                    let mx = Node {
                        ty,
                        dims: dims.clone(),
                        expr: Expr::Binary(BinOp::Max, x, lo),
                    };
                    Expr::Binary(BinOp::Min, Box::new(mx), hi)
                }
                Opcode::Broadcast => Expr::Broadcast(
                    op(0, inputs)?,
                    ins.dimensions().iter().map(|d| *d as usize).collect(),
                ),
                Opcode::Transpose => Expr::Transpose(
                    op(0, inputs)?,
                    ins.dimensions().iter().map(|d| *d as usize).collect(),
                ),
                Opcode::Slice => {
                    let sd = ins
                        .slice_dims()
                        .ok_or_else(|| err(format!("{}: slice without slice=", ins.name)))?;
                    Expr::Slice(
                        op(0, inputs)?,
                        sd.iter().map(|s| s.start).collect(),
                        sd.iter().map(|s| s.stride).collect(),
                    )
                }
                Opcode::Reduce | Opcode::ReduceWindow => {
                    let n = ins.operands.len() / 2;
                    let comp = ins
                        .to_apply()
                        .ok_or_else(|| err(format!("{}: no to_apply", ins.name)))
                        .and_then(|c| scalar_comp(self.module, c, &ins.name))?;
                    if comp.roots.len() != n || comp.params.len() != 2 * n {
                        return Err(err(format!(
                            "{}: reducer has {} parameters and {} results for {n} operands",
                            ins.name,
                            comp.params.len(),
                            comp.roots.len()
                        )));
                    }
                    let xs = (0..n)
                        .map(|i| op(i, inputs).map(|b| *b))
                        .collect::<Result<Vec<_>, _>>()?;
                    let inits = (n..2 * n)
                        .map(|i| op(i, inputs).map(|b| *b))
                        .collect::<Result<Vec<_>, _>>()?;
                    if ins.opcode == Opcode::Reduce {
                        Expr::Reduce {
                            xs,
                            inits,
                            dims: ins.dimensions().iter().map(|d| *d as usize).collect(),
                            comp,
                            index,
                        }
                    } else {
                        let w = ins
                            .window()
                            .ok_or_else(|| err(format!("{}: no window", ins.name)))?;
                        Expr::ReduceWindow {
                            xs,
                            inits,
                            window: w.dims.clone(),
                            comp,
                            index,
                        }
                    }
                }
                Opcode::Gather => {
                    let slice_sizes = ins
                        .ints_attr(AttrKey::SliceSizes)
                        .ok_or_else(|| err(format!("{}: gather without slice_sizes", ins.name)))?
                        .to_vec();
                    Expr::Gather {
                        operand: op(0, inputs)?,
                        indices: op(1, inputs)?,
                        dnums: ins.gather_dimension_numbers(),
                        slice_sizes,
                    }
                }
                Opcode::Dot => Expr::Dot {
                    lhs: op(0, inputs)?,
                    rhs: op(1, inputs)?,
                    dnums: ins.dot_dimension_numbers(),
                },
                Opcode::Fft => {
                    let kind = match ins.ident_attr(AttrKey::FftType) {
                        Some("FFT") | None => FftKind::Fft,
                        Some("IFFT") => FftKind::Ifft,
                        Some("RFFT") => FftKind::Rfft,
                        Some("IRFFT") => FftKind::Irfft,
                        Some(t) => return Err(err(format!("{}: fft_type {t}", ins.name))),
                    };
                    let lengths = ins.ints_attr(AttrKey::FftLength).unwrap_or(&[]).to_vec();
                    if lengths.is_empty() || lengths.len() > dims.len() {
                        return Err(err(format!("{}: bad fft_length", ins.name)));
                    }
                    Expr::Fft {
                        x: op(0, inputs)?,
                        kind,
                        lengths,
                    }
                }
                Opcode::Convolution => {
                    let dnums = ins
                        .conv_dimension_numbers()
                        .ok_or_else(|| {
                            err(format!("{}: convolution without dim_labels", ins.name))
                        })?
                        .clone();
                    let window = ins.window().map(|w| w.dims.clone()).unwrap_or_default();
                    Expr::Conv {
                        lhs: op(0, inputs)?,
                        rhs: op(1, inputs)?,
                        dnums,
                        window,
                        feature_groups: ins
                            .int_attr(AttrKey::FeatureGroupCount)
                            .unwrap_or(1)
                            .max(1),
                        batch_groups: ins.int_attr(AttrKey::BatchGroupCount).unwrap_or(1).max(1),
                    }
                }
                o => {
                    return Err(err(format!(
                        "{}: {} cannot be a kernel expression",
                        ins.name,
                        o.name()
                    )))
                }
            }
        };
        Ok(Node { ty, dims, expr })
    }
}

/// Plans the instructions of one computation.
struct CompPlanner<'b, 'm> {
    b: &'b mut Builder<'m>,
    comp_id: CompId,
    exprs: Exprs<'m>,
    users: Vec<Vec<InstrId>>,
    steps: Vec<Step>,
}

/// Whether `ins` can be evaluated inside a user's kernel expression.
fn fusable(ins: &HloInstruction) -> bool {
    is_fusable(ins.opcode) && (ins.opcode != Opcode::CustomCall || is_identity_custom_call(ins))
}

impl CompPlanner<'_, '_> {
    fn comp(&self) -> &HloComputation {
        self.exprs.comp
    }

    /// Whether `id`'s value gets its own buffer (or tuple of buffers)
    /// rather than being inlined into its users' kernels.
    fn materialized(&self, id: InstrId) -> bool {
        let comp = self.comp();
        let ins = comp.instr(id);
        let users = &self.users[id.index()];
        if id == comp.root || users.iter().any(|u| !fusable(comp.instr(*u))) {
            return true;
        }
        if scalar_constant(comp, id).is_some() {
            // Inlined into every user (reduce inits included).
            return false;
        }
        if !fusable(ins)
            || matches!(
                ins.opcode,
                Opcode::Reduce
                    | Opcode::ReduceWindow
                    | Opcode::Gather
                    | Opcode::Convolution
                    | Opcode::Fft
            )
        {
            return true;
        }
        users.len() > 1 && !self.cheap(id)
    }

    /// Recomputed per use instead of materialized.
    fn cheap(&self, id: InstrId) -> bool {
        let comp = self.comp();
        let ins = comp.instr(id);
        match ins.opcode {
            Opcode::Iota => true,
            Opcode::Constant => scalar_constant(comp, id).is_some(),
            Opcode::Broadcast => {
                let o = ins.operands[0];
                let oi = comp.instr(o);
                !fusable(oi) && oi.opcode != Opcode::Constant
                    || scalar_constant(comp, o).is_some()
                    || matches!(oi.opcode, Opcode::Reduce | Opcode::Gather)
            }
            _ => false,
        }
    }

    fn val(&self, id: InstrId) -> Result<ValRef, RuntimeError> {
        self.exprs.vals.get(&id).cloned().ok_or_else(|| {
            err(format!(
                "{}: operand not planned",
                self.comp().instr(id).name
            ))
        })
    }

    fn operand_vals(&self, ins: &HloInstruction) -> Result<Vec<ValRef>, RuntimeError> {
        ins.operands.iter().map(|o| self.val(*o)).collect()
    }

    fn push_kernel(
        &mut self,
        name: &str,
        outs: Vec<BufId>,
        init: Vec<Option<BufId>>,
        inputs: Vec<BufId>,
        launch_size: i64,
        body: KernelBody,
    ) {
        let name = self.b.kernel_name(name);
        self.steps.push(Step::Kernel(Box::new(Kernel {
            name,
            outs,
            init,
            inputs,
            launch_size,
            body,
        })));
    }

    /// An elementwise kernel computing `roots` into fresh buffers.
    fn elementwise(&mut self, name: &str, roots: Vec<Node>, inputs: Vec<BufId>) -> Vec<BufId> {
        let outs: Vec<BufId> = roots
            .iter()
            .map(|r| self.b.new_buf(r.ty, r.dims.clone(), name))
            .collect();
        let n = roots
            .first()
            .map(|r| r.dims.iter().product::<i64>())
            .unwrap_or(0);
        let init = vec![None; outs.len()];
        self.push_kernel(
            name,
            outs.clone(),
            init,
            inputs,
            n,
            KernelBody::Elementwise(roots),
        );
        outs
    }

    fn lower(&mut self, id: InstrId) -> Result<ValRef, RuntimeError> {
        let module = self.b.module;
        let comp = self.exprs.comp;
        let ins = comp.instr(id);
        let name = ins.name.as_str();
        let tuple_elem = |v: ValRef, i: usize| -> Result<ValRef, RuntimeError> {
            match v {
                ValRef::Tuple(e) if i < e.len() => Ok(e[i].clone()),
                _ => Err(err(format!("{name}: expected a tuple with element {i}"))),
            }
        };
        match ins.opcode {
            Opcode::Constant => {
                let lit = ins
                    .literal
                    .as_deref()
                    .ok_or_else(|| err(format!("{name}: constant without literal")))?;
                let value = Value::from_literal(lit)
                    .map_err(|e| err(format!("{name}: {e}")))?
                    .into_array()
                    .ok_or_else(|| err(format!("{name}: tuple constants are unsupported")))?;
                let bytes = to_buffer(&value)
                    .map_err(|e| err(format!("{name}: {e}")))?
                    .bytes()
                    .to_vec();
                let out = self.b.new_buf(value.ty, value.dims.clone(), name);
                self.steps.push(Step::Constant { out, bytes });
                Ok(ValRef::Buf(out))
            }
            Opcode::Tuple => Ok(ValRef::Tuple(self.operand_vals(ins)?)),
            Opcode::GetTupleElement => {
                let index = ins.int_attr(AttrKey::Index).unwrap_or(0) as usize;
                tuple_elem(self.val(ins.operands[0])?, index)
            }
            Opcode::OptimizationBarrier | Opcode::AddDependency | Opcode::AsyncUpdate => {
                self.val(ins.operands[0])
            }
            Opcode::AfterAll => Ok(ValRef::Token),
            Opcode::PartitionId | Opcode::ReplicaId => {
                let out = self.b.new_buf(PrimitiveType::U32, vec![], name);
                self.steps.push(Step::DeviceId {
                    out,
                    replica: ins.opcode == Opcode::ReplicaId,
                });
                Ok(ValRef::Buf(out))
            }
            Opcode::Dot => {
                let (oty, _) = array_of(&ins.shape, name)?;
                let (lty, _) = array_of(&comp.instr(ins.operands[0]).shape, name)?;
                let (rty, _) = array_of(&comp.instr(ins.operands[1]).shape, name)?;
                if cublas_types(lty, rty, oty) {
                    return self.lower_dot(id).map(ValRef::Buf);
                }
                self.lower_elementwise(id)
            }
            Opcode::While => {
                let cond = self.b.plan_comp(
                    ins.computation_attr(AttrKey::Condition)
                        .ok_or_else(|| err(format!("{name}: while without condition")))?,
                )?;
                let body = self.b.plan_comp(
                    ins.computation_attr(AttrKey::Body)
                        .ok_or_else(|| err(format!("{name}: while without body")))?,
                )?;
                let out = self.b.fresh(&ins.shape, name);
                self.steps.push(Step::While {
                    cond,
                    body,
                    init: self.val(ins.operands[0])?,
                    out: out.clone(),
                });
                Ok(out)
            }
            Opcode::Conditional => {
                let index = self.exprs.buf_of(ins.operands[0])?;
                let index_is_pred = self.b.buffers[index].ty == PrimitiveType::Pred;
                let called: Vec<CompId> = if index_is_pred {
                    [AttrKey::TrueComputation, AttrKey::FalseComputation]
                        .iter()
                        .map(|k| {
                            ins.computation_attr(*k)
                                .ok_or_else(|| err(format!("{name}: missing branch")))
                        })
                        .collect::<Result<_, _>>()?
                } else {
                    match ins.attr(AttrKey::BranchComputations) {
                        Some(xla_hlo_ir::attrs::AttrValue::Computations(c)) => c.clone(),
                        _ => return Err(err(format!("{name}: no branch_computations"))),
                    }
                };
                let branches = called
                    .iter()
                    .map(|c| self.b.plan_comp(*c))
                    .collect::<Result<Vec<_>, _>>()?;
                let operands = ins.operands[1..]
                    .iter()
                    .map(|o| self.val(*o))
                    .collect::<Result<_, _>>()?;
                let out = self.b.fresh(&ins.shape, name);
                self.steps.push(Step::Conditional {
                    index,
                    index_is_pred,
                    branches,
                    operands,
                    out: out.clone(),
                });
                Ok(out)
            }
            Opcode::Call => {
                let c = self.b.plan_comp(
                    ins.to_apply()
                        .ok_or_else(|| err(format!("{name}: call without to_apply")))?,
                )?;
                let out = self.b.fresh(&ins.shape, name);
                self.steps.push(Step::Call {
                    comp: c,
                    operands: self.operand_vals(ins)?,
                    out: out.clone(),
                });
                Ok(out)
            }
            Opcode::AsyncStart => {
                let called = ins
                    .computation_attr(AttrKey::Calls)
                    .ok_or_else(|| err(format!("{name}: async-start without calls")))?;
                let c = self.b.plan_comp(called)?;
                let result_shape = module.comp(called).root_instr().shape.clone();
                let out = self.b.fresh(&result_shape, name);
                let operands = self.operand_vals(ins)?;
                self.steps.push(Step::Call {
                    comp: c,
                    operands: operands.clone(),
                    out: out.clone(),
                });
                Ok(ValRef::Tuple(vec![
                    ValRef::Tuple(operands),
                    out,
                    ValRef::Token,
                ]))
            }
            Opcode::AsyncDone => tuple_elem(self.val(ins.operands[0])?, 1),
            Opcode::CopyStart => {
                let v = self.val(ins.operands[0])?;
                Ok(ValRef::Tuple(vec![v.clone(), v, ValRef::Token]))
            }
            Opcode::CopyDone => tuple_elem(self.val(ins.operands[0])?, 0),
            Opcode::AllReduceDone | Opcode::AllGatherDone | Opcode::CollectivePermuteDone => {
                let started = self.val(ins.operands[0])?;
                let result = match started {
                    ValRef::Tuple(e) if ins.opcode != Opcode::AllReduceDone && e.len() >= 2 => {
                        e[1].clone()
                    }
                    v => v,
                };
                self.steps.push(Step::Wait {
                    value: result.clone(),
                });
                Ok(result)
            }
            Opcode::AllReduce
            | Opcode::AllGather
            | Opcode::AllToAll
            | Opcode::ReduceScatter
            | Opcode::CollectivePermute
            | Opcode::CollectiveBroadcast
            | Opcode::AllReduceStart
            | Opcode::AllGatherStart
            | Opcode::CollectivePermuteStart => self.host(id, HostKind::Collective),
            Opcode::CustomCall if is_shard_shape_custom_call(ins) => {
                self.host(id, HostKind::ShardShape)
            }
            Opcode::CustomCall if is_topk_custom_call(ins) => {
                let (_, dims) = leaf_array(&ins.shape, 0, name)?;
                let k = dims.last().copied().unwrap_or(0);
                let largest = !comparator_is_lt(module, ins);
                self.lower_topk(id, k, largest)
            }
            Opcode::TopK => {
                let k = ins.int_attr(AttrKey::K).unwrap_or(1);
                let largest = ins.bool_attr(AttrKey::Largest).unwrap_or(true);
                self.lower_topk(id, k, largest)
            }
            Opcode::Sort => self.lower_sort(id),
            Opcode::Scatter => self.lower_scatter(id),
            Opcode::SelectAndScatter => self.lower_select_and_scatter(id),
            _ => self.lower_elementwise(id),
        }
    }

    /// A kernel computing `id` (every leaf of a variadic reduce's tuple).
    fn lower_elementwise(&mut self, id: InstrId) -> Result<ValRef, RuntimeError> {
        let ins = self.exprs.comp.instr(id);
        let mut inputs = Vec::new();
        if let Shape::Tuple(elems) = &ins.shape {
            if !matches!(ins.opcode, Opcode::Reduce | Opcode::ReduceWindow) {
                return Err(err(format!(
                    "{}: tuple-shaped {} is unsupported",
                    ins.name,
                    ins.opcode.name()
                )));
            }
            let roots = (0..elems.len())
                .map(|i| self.exprs.node(id, true, &mut inputs, i))
                .collect::<Result<Vec<_>, _>>()?;
            let outs = self.elementwise(&ins.name, roots, inputs);
            return Ok(ValRef::Tuple(outs.into_iter().map(ValRef::Buf).collect()));
        }
        let root = self.exprs.node(id, true, &mut inputs, 0)?;
        let outs = self.elementwise(&ins.name, vec![root], inputs);
        Ok(ValRef::Buf(outs[0]))
    }

    /// An instruction run on the host (collectives, shard_map boundaries).
    fn host(&mut self, id: InstrId, kind: HostKind) -> Result<ValRef, RuntimeError> {
        let ins = self.exprs.comp.instr(id);
        let operands = self.operand_vals(ins)?;
        let out = self.b.fresh(&ins.shape, &ins.name);
        self.steps.push(Step::Host {
            kind,
            instr: Box::new(ins.clone()),
            comp: self.comp_id,
            operands,
            out: out.clone(),
        });
        Ok(out)
    }

    fn lower_sort(&mut self, id: InstrId) -> Result<ValRef, RuntimeError> {
        let module = self.b.module;
        let ins = self.exprs.comp.instr(id);
        let comparator = ins
            .to_apply()
            .ok_or_else(|| err(format!("{}: sort without comparator", ins.name)))
            .and_then(|c| scalar_comp(module, c, &ins.name))?;
        let inputs = ins
            .operands
            .iter()
            .map(|o| self.exprs.buf_of(*o))
            .collect::<Result<Vec<_>, _>>()?;
        let dim = ins.dimensions().first().copied().unwrap_or(0) as usize;
        let outs = self.sort_kernel(&ins.name, inputs, dim, comparator)?;
        Ok(if ins.shape.is_tuple() {
            ValRef::Tuple(outs.into_iter().map(ValRef::Buf).collect())
        } else {
            ValRef::Buf(outs[0])
        })
    }

    /// A sort kernel over `inputs` (same dims) along `dim`; returns the
    /// sorted outputs (the scratch buffer is not among them).
    fn sort_kernel(
        &mut self,
        name: &str,
        inputs: Vec<BufId>,
        dim: usize,
        comparator: ScalarComp,
    ) -> Result<Vec<BufId>, RuntimeError> {
        let dims = self.b.buffers[inputs[0]].dims.clone();
        if dim >= dims.len()
            || comparator.params.len() != 2 * inputs.len()
            || comparator.roots.len() != 1
        {
            return Err(err(format!("{name}: bad sort dimension or comparator")));
        }
        let len = dims[dim];
        let rows: i64 = dims.iter().product::<i64>() / len.max(1);
        let mut outs: Vec<BufId> = inputs
            .iter()
            .map(|b| {
                let info = self.b.buffers[*b].clone();
                self.b.new_buf(info.ty, info.dims, name)
            })
            .collect();
        let scratch = self
            .b
            .new_buf(PrimitiveType::S64, vec![rows, 2 * len], name);
        outs.push(scratch);
        let init = vec![None; outs.len()];
        self.push_kernel(
            name,
            outs.clone(),
            init,
            inputs,
            if len == 0 { 0 } else { rows },
            KernelBody::Sort {
                dims,
                dim,
                comparator,
            },
        );
        outs.pop();
        Ok(outs)
    }

    /// top-k along the last dimension: a stable sort of (x, iota) by XLA's
    /// total order (descending when `largest`), then the first k columns.
    fn lower_topk(&mut self, id: InstrId, k: i64, largest: bool) -> Result<ValRef, RuntimeError> {
        let ins = self.exprs.comp.instr(id);
        let name = ins.name.clone();
        let x = self.exprs.buf_of(ins.operands[0])?;
        let info = self.b.buffers[x].clone();
        let rank = info.dims.len();
        if rank == 0 {
            return Err(err(format!("{name}: top-k of a scalar")));
        }
        let iota = Node {
            ty: PrimitiveType::S32,
            dims: info.dims.clone(),
            expr: Expr::Iota(rank - 1),
        };
        let idx = self.elementwise(&format!("{name}_iota"), vec![iota], vec![])[0];
        let param = |k: usize, ty| Box::new(Node::scalar(ty, Expr::Param(k)));
        let comparator = ScalarComp {
            params: vec![info.ty, info.ty, PrimitiveType::S32, PrimitiveType::S32],
            roots: vec![Node::scalar(
                PrimitiveType::Pred,
                Expr::Compare {
                    dir: if largest { CmpDir::Gt } else { CmpDir::Lt },
                    total_order: true,
                    a: param(0, info.ty),
                    b: param(1, info.ty),
                },
            )],
        };
        let sorted = self.sort_kernel(&name, vec![x, idx], rank - 1, comparator)?;
        let mut out_dims = info.dims.clone();
        out_dims[rank - 1] = k;
        let mut leaves = Vec::new();
        for (b, ty) in [(sorted[0], info.ty), (sorted[1], PrimitiveType::S32)] {
            let dims = self.b.buffers[b].dims.clone();
            let root = Node {
                ty,
                dims: out_dims.clone(),
                expr: Expr::Slice(
                    Box::new(Node {
                        ty,
                        dims,
                        expr: Expr::Input(0),
                    }),
                    vec![0; rank],
                    vec![1; rank],
                ),
            };
            leaves.push(ValRef::Buf(self.elementwise(&name, vec![root], vec![b])[0]));
        }
        Ok(ValRef::Tuple(leaves))
    }

    fn lower_scatter(&mut self, id: InstrId) -> Result<ValRef, RuntimeError> {
        let module = self.b.module;
        let ins = self.exprs.comp.instr(id);
        let name = ins.name.clone();
        let n = (ins.operands.len() - 1) / 2;
        let bufs = ins
            .operands
            .iter()
            .map(|o| self.exprs.buf_of(*o))
            .collect::<Result<Vec<_>, _>>()?;
        let combiner = ins
            .to_apply()
            .ok_or_else(|| err(format!("{name}: scatter without to_apply")))
            .and_then(|c| scalar_comp(module, c, &name))?;
        if combiner.params.len() != 2 * n || combiner.roots.len() != n {
            return Err(err(format!(
                "{name}: scatter combiner does not match {n} operands"
            )));
        }
        let operand_dims = self.b.buffers[bufs[0]].dims.clone();
        let indices_dims = self.b.buffers[bufs[n]].dims.clone();
        let update_dims = self.b.buffers[bufs[n + 1]].dims.clone();
        let outs: Vec<BufId> = (0..n)
            .map(|i| {
                let info = self.b.buffers[bufs[i]].clone();
                self.b.new_buf(info.ty, info.dims, &name)
            })
            .collect();
        let unique = ins.bool_attr(AttrKey::UniqueIndices).unwrap_or(false);
        let updates: i64 = update_dims.iter().product();
        let launch = if unique { updates } else { updates.min(1) };
        self.push_kernel(
            &name,
            outs.clone(),
            bufs[..n].iter().map(|b| Some(*b)).collect(),
            bufs[n..].to_vec(),
            launch,
            KernelBody::Scatter {
                dnums: ins.scatter_dimension_numbers(),
                combiner,
                operand_dims,
                indices_dims,
                update_dims,
                unique,
            },
        );
        Ok(if ins.shape.is_tuple() {
            ValRef::Tuple(outs.into_iter().map(ValRef::Buf).collect())
        } else {
            ValRef::Buf(outs[0])
        })
    }

    fn lower_select_and_scatter(&mut self, id: InstrId) -> Result<ValRef, RuntimeError> {
        let module = self.b.module;
        let ins = self.exprs.comp.instr(id);
        let name = ins.name.clone();
        let bufs = ins
            .operands
            .iter()
            .map(|o| self.exprs.buf_of(*o))
            .collect::<Result<Vec<_>, _>>()?;
        let select = ins
            .computation_attr(AttrKey::SelectComputation)
            .ok_or_else(|| err(format!("{name}: no select")))
            .and_then(|c| scalar_comp(module, c, &name))?;
        let scatter = ins
            .computation_attr(AttrKey::ScatterComputation)
            .ok_or_else(|| err(format!("{name}: no scatter")))
            .and_then(|c| scalar_comp(module, c, &name))?;
        let window = ins
            .window()
            .ok_or_else(|| err(format!("{name}: no window")))?
            .dims
            .clone();
        if window
            .iter()
            .any(|w| w.lhs_dilation != 1 || w.rhs_dilation != 1)
        {
            return Err(err(format!(
                "{name}: dilated select-and-scatter is unsupported"
            )));
        }
        let (ty, dims) = array_of(&ins.shape, &name)?;
        let out = self.b.new_buf(ty, dims.clone(), &name);
        let source_dims = self.b.buffers[bufs[1]].dims.clone();
        self.push_kernel(
            &name,
            vec![out],
            vec![None],
            bufs,
            dims.iter().product(),
            KernelBody::SelectAndScatter {
                operand_dims: dims,
                source_dims,
                window,
                select,
                scatter,
            },
        );
        Ok(ValRef::Buf(out))
    }

    fn lower_dot(&mut self, id: InstrId) -> Result<BufId, RuntimeError> {
        let comp = self.exprs.comp;
        let ins = comp.instr(id);
        let name = ins.name.clone();
        let (oty, odims) = array_of(&ins.shape, &name)?;
        let (_, ldims) = array_of(&comp.instr(ins.operands[0]).shape, &name)?;
        let (_, rdims) = array_of(&comp.instr(ins.operands[1]).shape, &name)?;
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
        let out = self.b.new_buf(oty, odims, &name);
        self.steps.push(Step::Dot(DotStep {
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
        let b = self.exprs.buf_of(id)?;
        if perm.iter().enumerate().all(|(i, p)| *p == i as i64) {
            return Ok(b);
        }
        let info = self.b.buffers[b].clone();
        let dims: Vec<i64> = perm.iter().map(|p| info.dims[*p as usize]).collect();
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
        Ok(self.elementwise(name, vec![root], vec![b])[0])
    }
}

/// Whether a TopK custom-call's comparator is `compare(p0, p1), direction=LT`
/// (the k smallest).
fn comparator_is_lt(module: &HloModule, ins: &HloInstruction) -> bool {
    let Some(c) = ins.to_apply() else {
        return false;
    };
    let comp = module.comp(c);
    let root = comp.root_instr();
    root.opcode == Opcode::Compare
        && root.ident_attr(AttrKey::Direction) == Some("LT")
        && root
            .operands
            .first()
            .is_some_and(|o| comp.instr(*o).parameter_number == Some(0))
}
