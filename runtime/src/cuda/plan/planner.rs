//! The planner: from the entry computation to a `Plan`. Each instruction
//! is either materialized (its own buffer, or tuple of buffers) or inlined
//! into its users' fused kernels; dots become cuBLAS steps on operands
//! transposed into `[batch, m, k]` x `[batch, k, n]` row-major; tuples and
//! get-tuple-element are resolved at plan time.
//!
//! Invariants: an instruction is planned after its operands (an operand
//! defined after its user is an error); a fused tree stops at materialized
//! values, which become its kernel's inputs (each buffer once); every
//! failure is a `RuntimeError::Compile`, naming the instruction where there
//! is one.

use super::eval::is_float;
use super::opcodes::{bin_op, is_fusable, reducer, scalar_constant, un_op};
use super::support::check_supported;
use super::types::{
    BinOp, BufId, BufferInfo, CmpDir, DotStep, Expr, FusedKernel, Node, Plan, Step, ValRef,
};
use crate::error::RuntimeError;
use std::collections::HashMap;
use xla_hlo_evaluator::Value;
use xla_hlo_ir::{AttrKey, HloComputation, HloModule, InstrId, Opcode, PrimitiveType, Shape};

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
