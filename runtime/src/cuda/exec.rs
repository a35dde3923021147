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

use super::plan::{BufId, CompPlan, DotStep, HostKind, Kernel, Plan, Step, ValRef};
use crate::backend::DeviceContext;
use crate::cpu::{execute_error, literal_from_value, value_from_literal};
use crate::error::RuntimeError;
use crate::literal::Literal;
use collectives::DeviceBuffer;
use std::rc::Rc;
use xla_hlo_evaluator::collective::{eval_collective, eval_custom_call};
use xla_hlo_evaluator::{EvalContext, Evaluator};
use xla_hlo_ir::literal::storage_bytes;
use xla_hlo_ir::{HloModule, PrimitiveType};

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
        run.bind_literal(p, a, &format!("argument {i}"))?;
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

    /// Uploads a literal into the buffers of `r` (same structure).
    fn bind_literal(&mut self, r: &ValRef, l: &Literal, what: &str) -> Result<(), RuntimeError> {
        match (r, l) {
            (ValRef::Buf(b), Literal::Array(a)) => {
                let info = &self.plan.buffers[*b];
                if a.dims() != info.dims.as_slice() || a.dtype() != info.ty {
                    return Err(RuntimeError::Arguments(format!(
                        "{what}: expected {}{:?}, got {}",
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
                    self.bind_literal(r, l, what)?;
                }
                Ok(())
            }
            _ => Err(RuntimeError::Arguments(format!(
                "{what}: the value's structure does not match the parameter"
            ))),
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
            Step::Host {
                kind,
                instr,
                comp,
                operands,
                out,
            } => {
                let values = operands
                    .iter()
                    .map(|o| self.fetch(o).and_then(|l| value_from_literal(&l)))
                    .collect::<Result<Vec<_>, _>>()?;
                let ctx = EvalContext {
                    partition_id: self.device.partition_id,
                    replica_id: self.device.replica_id,
                    num_partitions: Some(self.device.num_partitions),
                    num_replicas: Some(self.device.num_replicas),
                    collectives: self.device.communicator,
                    memory_limit: None,
                    consistent: self.device.consistent,
                };
                let ev = Evaluator::new(self.module, ctx);
                let result = match kind {
                    HostKind::Collective => eval_collective(&ev, instr, values),
                    HostKind::ShardShape => {
                        eval_custom_call(&ev, self.module.comp(*comp), instr, values)
                    }
                }
                .map_err(execute_error)?;
                let lit = literal_from_value(&result)?;
                self.upload_into(out, &lit)?;
            }
        }
        Ok(())
    }

    fn upload_into(&mut self, r: &ValRef, l: &Literal) -> Result<(), RuntimeError> {
        match (r, l) {
            (ValRef::Buf(b), Literal::Array(a)) => {
                self.bufs[*b] = Some(Rc::new(self.machine.upload(a.bytes())?));
                Ok(())
            }
            (ValRef::Token, _) => Ok(()),
            (ValRef::Tuple(rs), Literal::Tuple(ls)) if rs.len() == ls.len() => {
                for (r, l) in rs.iter().zip(ls) {
                    self.upload_into(r, l)?;
                }
                Ok(())
            }
            (ValRef::Tuple(rs), _) if rs.is_empty() => Ok(()),
            (ValRef::Buf(b), Literal::Token) => Err(exec_err(format!(
                "{}: a token where an array was expected",
                self.plan.buffers[*b].name
            ))),
            _ => Err(exec_err("a host step's result does not match its shape")),
        }
    }
}
