//! Runs a plan: the one executor of the CUDA backend, generic over the
//! [`Machine`] that holds its buffers and runs its kernels (the GPU through
//! cudarc, or the host, where the same generated kernels are built by the
//! host C++ compiler: `hostexec.rs`).
//!
//! The host drives control flow: a while loop's condition and a
//! conditional's branch index are read back each time; a computation's
//! parameters are bound to its caller's buffers and its results become the
//! caller's values without copies (buffers are immutable once written, so
//! rebinding is safe). Host steps (collectives, shard_map's boundary) read
//! their operands back, run through the interpreter's collective semantics
//! and the device's communicator (`collectives`), and upload the results.
//!
//! Invariant: `execute_plan` returns the root's value with a tuple root
//! split into its elements, in the runtime's `Literal`s, as
//! `Executable::execute` does.

use super::plan::{BufId, BufferInfo, CompPlan, DotStep, HostKind, Kernel, Plan, Step, ValRef};
use crate::backend::DeviceContext;
use crate::cpu::{eval_context, execute_error, literal_from_value, value_from_literal};
use crate::error::RuntimeError;
use crate::literal::Literal;
use collectives::DeviceBuffer;
use std::rc::Rc;
use xla_hlo_evaluator::collective::{eval_collective, eval_custom_call};
use xla_hlo_evaluator::Evaluator;
use xla_hlo_ir::literal::storage_bytes;
use xla_hlo_ir::{HloInstruction, HloModule, Opcode, PrimitiveType};

/// Where a plan's buffers live and its kernels run.
pub trait Machine {
    type Buf;
    /// A new buffer holding `bytes` (at least one byte is allocated).
    fn upload(&self, bytes: &[u8]) -> Result<Self::Buf, RuntimeError>;
    /// The first `len` bytes of a buffer.
    fn download(&self, buf: &Self::Buf, len: usize) -> Result<Vec<u8>, RuntimeError>;
    /// A new zeroed buffer of `bytes` (at least one).
    fn alloc(&self, bytes: usize) -> Result<Self::Buf, RuntimeError>;
    /// A new buffer with the first `bytes` of `buf`.
    fn copy(&self, buf: &Self::Buf, bytes: usize) -> Result<Self::Buf, RuntimeError>;
    /// Runs a kernel over `kernel.launch_size` with its outputs and inputs.
    fn launch(
        &self,
        kernel: &Kernel,
        outs: &mut [Self::Buf],
        inputs: &[&Self::Buf],
    ) -> Result<(), RuntimeError>;
    /// `out = lhs * rhs` for a dot step (operands of `lhs_ty`, result of
    /// `out_ty`).
    #[allow(clippy::too_many_arguments)]
    fn gemm(
        &self,
        dot: &DotStep,
        lhs_ty: PrimitiveType,
        out_ty: PrimitiveType,
        lhs: &Self::Buf,
        rhs: &Self::Buf,
        out: &mut Self::Buf,
    ) -> Result<(), RuntimeError>;

    /// Runs collective `instr` on the device, started after the work so far
    /// and finished for later work only at [`Machine::wait`]: `Some` with the
    /// result buffer when this machine has a device path for it (one array
    /// operand, one array result), `None` to run it on the host through the
    /// device's communicator. `reducer` is the opcode of `to_apply`'s
    /// root when it combines its two parameters.
    fn collective(
        &self,
        _instr: &HloInstruction,
        _operand: (&Self::Buf, &BufferInfo),
        _result: &BufferInfo,
        _reducer: Option<Opcode>,
        _device: &DeviceContext<'_>,
    ) -> Option<Result<Self::Buf, RuntimeError>> {
        None
    }

    /// Later work waits for the communication that wrote `buf`, if any.
    fn wait(&self, _buf: &Self::Buf) -> Result<(), RuntimeError> {
        Ok(())
    }
}

/// Refuses consistent mode: the kernels do not follow the interpreter's
/// tree reduction order.
pub fn refuse_consistent(
    device: &DeviceContext<'_>,
    backend: &'static str,
) -> Result<(), RuntimeError> {
    if device.consistent {
        return Err(RuntimeError::Device {
            backend,
            message: "the CUDA backend has no consistent mode (its kernels do not follow the tree reduction order); run with --backend cpu".into(),
        });
    }
    Ok(())
}

fn exec_err(m: impl Into<String>) -> RuntimeError {
    RuntimeError::Device {
        backend: "cuda",
        message: m.into(),
    }
}

/// Bytes of buffer `b` of the plan.
pub fn buffer_bytes(plan: &Plan, b: BufId) -> usize {
    let info = &plan.buffers[b];
    info.dims.iter().product::<i64>().max(0) as usize * storage_bytes(info.ty)
}

struct Run<'a, M: Machine> {
    machine: &'a M,
    plan: &'a Plan,
    module: &'a HloModule,
    device: &'a DeviceContext<'a>,
    bufs: Vec<Option<Rc<M::Buf>>>,
}

/// Runs the plan's entry computation on `args` (this device's arguments in
/// entry-parameter order).
pub fn execute_plan<M: Machine>(
    machine: &M,
    plan: &Plan,
    module: &HloModule,
    device: &DeviceContext<'_>,
    args: &[Literal],
) -> Result<Vec<Literal>, RuntimeError> {
    let entry = plan.entry();
    if args.len() != entry.params.len() {
        return Err(RuntimeError::Arguments(format!(
            "{} arguments given, the entry computation takes {}",
            args.len(),
            entry.params.len()
        )));
    }
    let mut run = Run {
        machine,
        plan,
        module,
        device,
        bufs: (0..plan.buffers.len()).map(|_| None).collect(),
    };
    for (i, (p, a)) in entry.params.iter().zip(args).enumerate() {
        run.upload_literal(p, a, &|m| {
            RuntimeError::Arguments(format!("argument {i}: {m}"))
        })?;
    }
    run.comp(entry)?;
    let outputs: Vec<ValRef> = match &entry.result {
        ValRef::Tuple(e) => e.clone(),
        r => vec![r.clone()],
    };
    outputs.iter().map(|r| run.fetch(r)).collect()
}

impl<M: Machine> Run<'_, M> {
    fn get(&self, b: BufId) -> Result<Rc<M::Buf>, RuntimeError> {
        self.bufs[b].clone().ok_or_else(|| {
            exec_err(format!(
                "buffer {} ({}) used before it is written",
                b, self.plan.buffers[b].name
            ))
        })
    }

    /// Uploads a literal into the buffers of `r` (same structure, element
    /// types and dims); `mismatch` makes the error for one that differs.
    fn upload_literal(
        &mut self,
        r: &ValRef,
        l: &Literal,
        mismatch: &dyn Fn(String) -> RuntimeError,
    ) -> Result<(), RuntimeError> {
        match (r, l) {
            (ValRef::Buf(b), Literal::Array(a)) => {
                let info = &self.plan.buffers[*b];
                if a.dims() != info.dims.as_slice() || a.dtype() != info.ty {
                    return Err(mismatch(format!(
                        "expected {}{:?}, got {}",
                        info.ty.name(),
                        info.dims,
                        a.shape_string()
                    )));
                }
                self.bufs[*b] = Some(Rc::new(self.machine.upload(a.bytes())?));
                Ok(())
            }
            (ValRef::Token, _) => Ok(()),
            (ValRef::Tuple(rs), Literal::Tuple(ls)) if rs.len() == ls.len() => {
                for (r, l) in rs.iter().zip(ls) {
                    self.upload_literal(r, l, mismatch)?;
                }
                Ok(())
            }
            _ => Err(mismatch("the value's structure does not match".into())),
        }
    }

    /// Reads the value of `r` back into a literal.
    fn fetch(&self, r: &ValRef) -> Result<Literal, RuntimeError> {
        match r {
            ValRef::Buf(b) => {
                let info = &self.plan.buffers[*b];
                let bytes = self
                    .machine
                    .download(&*self.get(*b)?, buffer_bytes(self.plan, *b))?;
                DeviceBuffer::from_bytes(info.ty, info.dims.clone(), &bytes)
                    .map(Literal::Array)
                    .map_err(|e| exec_err(format!("{}: {e}", info.name)))
            }
            ValRef::Token => Ok(Literal::Token),
            ValRef::Tuple(e) => Ok(Literal::Tuple(
                e.iter().map(|x| self.fetch(x)).collect::<Result<_, _>>()?,
            )),
        }
    }

    fn values(&self, r: &ValRef) -> Result<Vec<Rc<M::Buf>>, RuntimeError> {
        r.leaves().into_iter().map(|b| self.get(b)).collect()
    }

    fn bind(&mut self, r: &ValRef, values: &[Rc<M::Buf>]) -> Result<(), RuntimeError> {
        let leaves = r.leaves();
        if leaves.len() != values.len() {
            return Err(exec_err(format!(
                "binding {} values to {} buffers",
                values.len(),
                leaves.len()
            )));
        }
        for (b, v) in leaves.into_iter().zip(values) {
            self.bufs[b] = Some(v.clone());
        }
        Ok(())
    }

    /// Binds a computation's parameters to `operands` and runs it.
    fn call(
        &mut self,
        ci: usize,
        operands: &[Vec<Rc<M::Buf>>],
    ) -> Result<Vec<Rc<M::Buf>>, RuntimeError> {
        let c = &self.plan.comps[ci];
        if c.params.len() != operands.len() {
            return Err(exec_err(format!(
                "{}: {} operands for {} parameters",
                c.name,
                operands.len(),
                c.params.len()
            )));
        }
        for (p, v) in c.params.iter().zip(operands) {
            self.bind(p, v)?;
        }
        self.comp(c)?;
        self.values(&c.result)
    }

    /// The scalar in buffer `b` as an integer (pred 0/1).
    fn read_scalar(&self, b: BufId) -> Result<i64, RuntimeError> {
        let info = &self.plan.buffers[b];
        let bytes = self
            .machine
            .download(&*self.get(b)?, buffer_bytes(self.plan, b))?;
        let buf = DeviceBuffer::from_bytes(info.ty, info.dims.clone(), &bytes)
            .map_err(|e| exec_err(e.to_string()))?;
        let a = xla_hlo_evaluator::collective::from_buffer(&buf)
            .map_err(|e| exec_err(e.to_string()))?;
        if a.len() != 1 {
            return Err(exec_err(format!("{}: expected a scalar", info.name)));
        }
        Ok(a.get_i64(0))
    }

    fn comp(&mut self, c: &CompPlan) -> Result<(), RuntimeError> {
        for step in &c.steps {
            self.step(step)?;
        }
        Ok(())
    }

    fn step(&mut self, step: &Step) -> Result<(), RuntimeError> {
        let plan = self.plan;
        match step {
            Step::Constant { out, bytes } => {
                self.bufs[*out] = Some(Rc::new(self.machine.upload(bytes)?));
            }
            Step::DeviceId { out, replica } => {
                let id = if *replica {
                    self.device.replica_id
                } else {
                    self.device.partition_id
                };
                self.bufs[*out] = Some(Rc::new(self.machine.upload(&(id as u32).to_le_bytes())?));
            }
            Step::Kernel(k) => {
                let mut outs = Vec::with_capacity(k.outs.len());
                for (o, init) in k.outs.iter().zip(&k.init) {
                    let bytes = buffer_bytes(plan, *o);
                    outs.push(match init {
                        Some(src) => self.machine.copy(&*self.get(*src)?, bytes)?,
                        None => self.machine.alloc(bytes)?,
                    });
                }
                let held: Vec<Rc<M::Buf>> = k
                    .inputs
                    .iter()
                    .map(|b| self.get(*b))
                    .collect::<Result<_, _>>()?;
                let inputs: Vec<&M::Buf> = held.iter().map(|b| &**b).collect();
                if k.launch_size > 0 {
                    self.machine.launch(k, &mut outs, &inputs)?;
                }
                for (o, b) in k.outs.iter().zip(outs) {
                    self.bufs[*o] = Some(Rc::new(b));
                }
            }
            Step::Dot(d) => {
                let mut out = self.machine.alloc(buffer_bytes(plan, d.out))?;
                if d.m > 0 && d.n > 0 && d.batch > 0 && d.k > 0 {
                    let (lhs, rhs) = (self.get(d.lhs)?, self.get(d.rhs)?);
                    let (lt, ot) = (plan.buffers[d.lhs].ty, plan.buffers[d.out].ty);
                    self.machine.gemm(d, lt, ot, &lhs, &rhs, &mut out)?;
                }
                self.bufs[d.out] = Some(Rc::new(out));
            }
            Step::While {
                cond,
                body,
                init,
                out,
            } => {
                let mut carry = self.values(init)?;
                loop {
                    self.call(*cond, std::slice::from_ref(&carry))?;
                    let flag = match &plan.comps[*cond].result {
                        ValRef::Buf(b) => self.read_scalar(*b)?,
                        _ => return Err(exec_err("a while condition that is not a pred")),
                    };
                    if flag == 0 {
                        break;
                    }
                    carry = self.call(*body, std::slice::from_ref(&carry))?;
                }
                self.bind(out, &carry)?;
            }
            Step::Conditional {
                index,
                index_is_pred,
                branches,
                operands,
                out,
            } => {
                let v = self.read_scalar(*index)?;
                let branch = if *index_is_pred {
                    if v != 0 {
                        0
                    } else {
                        1
                    }
                } else if v < 0 || v as usize >= branches.len() {
                    branches.len() - 1
                } else {
                    v as usize
                };
                let arg = self.values(&operands[branch])?;
                let res = self.call(branches[branch], &[arg])?;
                self.bind(out, &res)?;
            }
            Step::Call {
                comp,
                operands,
                out,
            } => {
                let args = operands
                    .iter()
                    .map(|o| self.values(o))
                    .collect::<Result<Vec<_>, _>>()?;
                let res = self.call(*comp, &args)?;
                self.bind(out, &res)?;
            }
            Step::Wait { value } => {
                for v in self.values(value)? {
                    self.machine.wait(&v)?;
                }
            }
            Step::Host {
                kind,
                instr,
                comp,
                operands,
                out,
            } => {
                if *kind == HostKind::Collective && self.on_device(instr, operands, out)? {
                    return Ok(());
                }
                let values = operands
                    .iter()
                    .map(|o| self.fetch(o).and_then(|l| value_from_literal(&l)))
                    .collect::<Result<Vec<_>, _>>()?;
                let ev = Evaluator::new(self.module, eval_context(self.device));
                let result = match kind {
                    HostKind::Collective => eval_collective(&ev, instr, values),
                    HostKind::ShardShape => {
                        eval_custom_call(&ev, self.module.comp(*comp), instr, values)
                    }
                }
                .map_err(execute_error)?;
                let lit = literal_from_value(&result)?;
                self.upload_literal(out, &lit, &|m| {
                    exec_err(format!("{}: the host's result: {m}", instr.name))
                })?;
            }
        }
        Ok(())
    }

    /// Runs a collective through the machine's device path when it has one:
    /// binds the result (and, for async starts, the operand alias and zero
    /// context values); synchronous forms wait at once. `false` when the
    /// machine has no device path for it.
    fn on_device(
        &mut self,
        instr: &HloInstruction,
        operands: &[ValRef],
        out: &ValRef,
    ) -> Result<bool, RuntimeError> {
        let plan = self.plan;
        let [ValRef::Buf(operand)] = operands else {
            return Ok(false);
        };
        let is_start = matches!(
            instr.opcode,
            Opcode::AllReduceStart | Opcode::AllGatherStart | Opcode::CollectivePermuteStart
        );
        let result = match (out, instr.opcode) {
            (ValRef::Buf(r), _) => *r,
            (ValRef::Tuple(e), Opcode::AllGatherStart | Opcode::CollectivePermuteStart) => {
                match e.get(1) {
                    Some(ValRef::Buf(r)) => *r,
                    _ => return Ok(false),
                }
            }
            _ => return Ok(false),
        };
        let held = self.get(*operand)?;
        let reducer = instr.to_apply().and_then(|c| {
            let comp = self.module.comp(c);
            let root = comp.root_instr();
            let of_params = root.operands.len() == 2
                && root
                    .operands
                    .iter()
                    .all(|o| comp.instr(*o).opcode == Opcode::Parameter);
            of_params.then_some(root.opcode)
        });
        let Some(done) = self.machine.collective(
            instr,
            (&held, &plan.buffers[*operand]),
            &plan.buffers[result],
            reducer,
            self.device,
        ) else {
            return Ok(false);
        };
        let buf = Rc::new(done?);
        if !is_start {
            self.machine.wait(&buf)?;
        }
        self.bufs[result] = Some(buf);
        if let ValRef::Tuple(e) = out {
            for (i, leaf) in e.iter().enumerate() {
                match (i, leaf) {
                    (0, r) => self.bind(r, std::slice::from_ref(&held))?,
                    (1, _) => {}
                    (_, r) => {
                        for b in r.leaves() {
                            let zeros = self.machine.alloc(buffer_bytes(plan, b))?;
                            self.bufs[b] = Some(Rc::new(zeros));
                        }
                    }
                }
            }
        }
        Ok(true)
    }
}

/// What one run of a plan's entry computation moves and multiplies, for
/// rooflines: floating-point operations of its dots (cuBLAS steps and dot
/// or convolution kernels, 2 per multiply-add) and bytes read and written
/// by its kernels and dots. Loop bodies and branches are counted once.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PlanCost {
    pub dot_flops: f64,
    pub bytes: f64,
}

/// The cost of the plan's computations (each counted once).
pub fn plan_cost(plan: &Plan) -> PlanCost {
    use super::plan::{Expr, KernelBody, Node};
    fn node_flops(n: &Node) -> f64 {
        let own = match &n.expr {
            Expr::Dot { lhs, dnums, .. } => {
                let k: i64 = dnums
                    .lhs_contracting
                    .iter()
                    .map(|d| lhs.dims[*d as usize])
                    .product();
                2.0 * n.dims.iter().product::<i64>() as f64 * k as f64
            }
            Expr::Conv { rhs, dnums, .. } => {
                let per_output: i64 = rhs.dims.iter().product::<i64>()
                    / rhs.dims[dnums.kernel_output_feature as usize].max(1);
                2.0 * n.dims.iter().product::<i64>() as f64 * per_output as f64
            }
            _ => 0.0,
        };
        own + n.children().iter().map(|c| node_flops(c)).sum::<f64>()
    }
    let mut cost = PlanCost::default();
    for comp in &plan.comps {
        for step in &comp.steps {
            match step {
                Step::Dot(d) => {
                    cost.dot_flops += 2.0 * (d.batch * d.m * d.n * d.k) as f64;
                    cost.bytes += [d.lhs, d.rhs, d.out]
                        .iter()
                        .map(|b| buffer_bytes(plan, *b) as f64)
                        .sum::<f64>();
                }
                Step::Kernel(k) => {
                    cost.bytes += k
                        .outs
                        .iter()
                        .chain(&k.inputs)
                        .map(|b| buffer_bytes(plan, *b) as f64)
                        .sum::<f64>();
                    if let KernelBody::Elementwise(roots) = &k.body {
                        cost.dot_flops += roots.iter().map(node_flops).sum::<f64>();
                    }
                }
                _ => {}
            }
        }
    }
    cost
}
