//! The data of one call once every member has arrived (`Work`), and each
//! rank's share of it (`Work::run`; what the share is for each op is listed
//! in the `loopback` module's header).
//!
//! Invariants: `Work::build` validates the call as a whole (shapes,
//! dimensions, pairs) before any rank starts; every shared output is written
//! in disjoint ranges by distinct ranks and taken only after all of them
//! passed the finish barrier (`Work::finish`).

use super::op::Op;
use super::sync::lock;
use crate::buffer::{element_size, DeviceBuffer, HostBytes, Recycler};
use crate::error::{CallSite, CollectiveError, Result};
use crate::groups::DeviceId;
use crate::layout;
use crate::reduce::reduce_into;
use std::sync::{Arc, Mutex};
use xla_hlo_ir::PrimitiveType;

/// The data of one call once every member has arrived.
pub(super) struct Work {
    op: Op,
    n: usize,
    /// `[rank][operand]`.
    inputs: Vec<Vec<DeviceBuffer>>,
    /// One per operand, for shared-output ops.
    outputs: Vec<SharedOutput>,
    /// Output (type, dims) per operand, for shared-output ops.
    output_shapes: Vec<(PrimitiveType, Vec<i64>)>,
    /// Where large result buffers come from.
    recycler: Arc<Recycler>,
}

/// An output buffer that several ranks write in disjoint ranges.
struct SharedOutput {
    ptr: *mut u8,
    len: usize,
    storage: Mutex<Option<HostBytes>>,
}

// SAFETY: the raw pointer targets the heap block owned by `storage`, which
// lives as long as this value; concurrent writers use disjoint ranges
// (`Work::run`), and the storage is taken out only after every writer passed
// the finish barrier (which orders their writes before the read through the
// table mutex).
unsafe impl Send for SharedOutput {}
unsafe impl Sync for SharedOutput {}

impl SharedOutput {
    /// Every byte must be written before [`SharedOutput::take`].
    fn new(len: usize, recycler: &Arc<Recycler>) -> SharedOutput {
        let mut bytes = recycler.take_uninit(len);
        let ptr = bytes.as_mut_ptr();
        SharedOutput {
            ptr,
            len,
            storage: Mutex::new(Some(bytes)),
        }
    }

    /// # Safety
    /// No other thread may access `start..start + len` until the finish
    /// barrier; the range must be in bounds (checked, returns None).
    #[allow(clippy::mut_from_ref)]
    unsafe fn range(&self, start: usize, len: usize) -> Option<&mut [u8]> {
        if start.checked_add(len)? > self.len {
            return None;
        }
        Some(std::slice::from_raw_parts_mut(self.ptr.add(start), len))
    }

    fn take(&self) -> Option<HostBytes> {
        lock(&self.storage).take()
    }
}

fn invalid(call: &CallSite, msg: impl std::fmt::Display) -> CollectiveError {
    CollectiveError::InvalidArgument(format!("{call}: {msg}"))
}

impl Work {
    /// Validates the call as a whole and allocates shared outputs.
    pub(super) fn build(
        op: Op,
        inputs: Vec<Vec<DeviceBuffer>>,
        group: &[DeviceId],
        call: &CallSite,
        recycler: &Arc<Recycler>,
    ) -> Result<Work> {
        let n = inputs.len();
        let mut outputs = Vec::new();
        let mut output_shapes = Vec::new();
        let first = &inputs[0];
        match &op {
            Op::AllReduce(kind) => {
                for b in first {
                    kind.check(b.dtype())?;
                    output_shapes.push((b.dtype(), b.dims().to_vec()));
                }
            }
            Op::AllGather(d) => {
                for b in first {
                    let dims =
                        layout::all_gather_dims(b.dims(), *d, n).map_err(|e| invalid(call, e))?;
                    output_shapes.push((b.dtype(), dims));
                }
            }
            Op::ReduceScatter(kind, d) => {
                for b in first {
                    kind.check(b.dtype())?;
                    layout::reduce_scatter_dims(b.dims(), *d, n).map_err(|e| invalid(call, e))?;
                }
            }
            Op::AllToAll(s, c) => {
                for b in first {
                    layout::all_to_all_dims(b.dims(), *s, *c, n).map_err(|e| invalid(call, e))?;
                }
            }
            Op::AllToAllTuple => {
                for (r, ops) in inputs.iter().enumerate() {
                    if ops.len() != n {
                        return Err(CollectiveError::Mismatch {
                            call: call.clone(),
                            detail: format!(
                                "rank {r} passed {} operands to a tuple all-to-all over {n} ranks",
                                ops.len()
                            ),
                        });
                    }
                }
                for r in 0..n {
                    for j in 0..n {
                        if !inputs[j][r].same_shape(&inputs[r][j]) {
                            return Err(CollectiveError::Mismatch {
                                call: call.clone(),
                                detail: format!(
                                    "rank {j} sends {} to rank {r}, whose operand {j} is {}",
                                    inputs[j][r].shape_string(),
                                    inputs[r][j].shape_string()
                                ),
                            });
                        }
                    }
                }
            }
            Op::Permute(pairs) => {
                crate::groups::check_pairs(pairs)?;
                for &(s, t) in pairs {
                    if !group.contains(&s) || !group.contains(&t) {
                        return Err(CollectiveError::InvalidGroups(format!(
                            "{call}: pair ({s}, {t}) names a device outside the group"
                        )));
                    }
                }
            }
            Op::Broadcast | Op::Barrier => {}
        }
        if op.shared_output() && n > 1 {
            for (dtype, dims) in &output_shapes {
                let len = crate::buffer::element_count(dims)? * element_size(*dtype)?;
                outputs.push(SharedOutput::new(len, recycler));
            }
        }
        Ok(Work {
            op,
            n,
            inputs,
            outputs,
            output_shapes,
            recycler: recycler.clone(),
        })
    }

    /// Does `rank`'s share. Returns the rank's private result, or `None` for
    /// shared-output ops (whose result exists after the finish barrier).
    pub(super) fn run(&self, rank: usize, group: &[DeviceId]) -> Result<Option<Vec<DeviceBuffer>>> {
        let n = self.n;
        if !self.shared() && self.op.shared_output() {
            // One member: its operands are the result (all-reduce, all-gather).
            return Ok(Some(self.inputs[0].clone()));
        }
        match &self.op {
            Op::AllReduce(kind) => {
                for (i, out) in self.outputs.iter().enumerate() {
                    let dtype = self.output_shapes[i].0;
                    let esize = element_size(dtype)?;
                    let count = out.len / esize.max(1);
                    let lo = count * rank / n;
                    let hi = count * (rank + 1) / n;
                    let (a, b) = (lo * esize, hi * esize);
                    let srcs: Vec<&[u8]> = self
                        .inputs
                        .iter()
                        .map(|ops| &ops[i].bytes()[a..b])
                        .collect();
                    // SAFETY: rank r alone writes elements [count*r/n, count*(r+1)/n).
                    let dst = unsafe { out.range(a, b - a) }
                        .ok_or_else(|| CollectiveError::InvalidArgument("output range".into()))?;
                    reduce_into(*kind, dtype, &srcs, dst)?;
                }
                Ok(None)
            }
            Op::AllGather(d) => {
                for (i, out) in self.outputs.iter().enumerate() {
                    let mine = &self.inputs[rank][i];
                    let (outer, dim, inner) =
                        layout::split_at(mine.dims(), *d, mine.element_size());
                    let blk = dim * inner;
                    for o in 0..outer {
                        // SAFETY: rank r alone writes block (o, r) of each row.
                        let dst =
                            unsafe { out.range((o * n + rank) * blk, blk) }.ok_or_else(|| {
                                CollectiveError::InvalidArgument("output range".into())
                            })?;
                        dst.copy_from_slice(&mine.bytes()[o * blk..(o + 1) * blk]);
                    }
                }
                Ok(None)
            }
            Op::ReduceScatter(kind, d) => {
                let mut results = Vec::new();
                for i in 0..self.inputs[rank].len() {
                    let mine = &self.inputs[rank][i];
                    let dims = layout::reduce_scatter_dims(mine.dims(), *d, n)?;
                    let (outer, dim, inner) =
                        layout::split_at(mine.dims(), *d, mine.element_size());
                    let seg = dim / n * inner;
                    // Every byte is written below.
                    let mut out = self.recycler.take_uninit(outer * seg);
                    for o in 0..outer {
                        let start = o * dim * inner + rank * seg;
                        let srcs: Vec<&[u8]> = self
                            .inputs
                            .iter()
                            .map(|ops| &ops[i].bytes()[start..start + seg])
                            .collect();
                        reduce_into(
                            *kind,
                            mine.dtype(),
                            &srcs,
                            &mut out.as_bytes_mut()[o * seg..(o + 1) * seg],
                        )?;
                    }
                    results.push(DeviceBuffer::new(mine.dtype(), dims, out)?);
                }
                Ok(Some(results))
            }
            Op::AllToAll(s, c) => {
                let mut results = Vec::new();
                for i in 0..self.inputs[rank].len() {
                    let mine = &self.inputs[rank][i];
                    let dims = layout::all_to_all_dims(mine.dims(), *s, *c, n)?;
                    let esize = mine.element_size();
                    let mut piece: Vec<usize> = mine.dims().iter().map(|&x| x as usize).collect();
                    piece[*s] /= n;
                    // The blocks of all members tile the output.
                    let mut out = self
                        .recycler
                        .take_uninit(crate::buffer::element_count(&dims)? * esize);
                    for (j, ops) in self.inputs.iter().enumerate() {
                        let mut src_start = vec![0; piece.len()];
                        src_start[*s] = rank * piece[*s];
                        let mut dst_start = vec![0; piece.len()];
                        dst_start[*c] = j * piece[*c];
                        layout::copy_block(
                            ops[i].bytes(),
                            ops[i].dims(),
                            &src_start,
                            out.as_bytes_mut(),
                            &dims,
                            &dst_start,
                            &piece,
                            esize,
                        )?;
                    }
                    results.push(DeviceBuffer::new(mine.dtype(), dims, out)?);
                }
                Ok(Some(results))
            }
            Op::AllToAllTuple => Ok(Some((0..n).map(|j| self.inputs[j][rank].clone()).collect())),
            Op::Permute(pairs) => {
                let me = group[rank];
                let mine = &self.inputs[rank];
                match pairs.iter().find(|&&(_, t)| t == me) {
                    Some(&(s, _)) => {
                        let src = group.iter().position(|&d| d == s).unwrap_or(rank);
                        Ok(Some(self.inputs[src].clone()))
                    }
                    None => Ok(Some(
                        mine.iter()
                            .map(|b| {
                                let zeros = self.recycler.take_zeroed(b.bytes().len());
                                DeviceBuffer::new(b.dtype(), b.dims().to_vec(), zeros)
                            })
                            .collect::<Result<_>>()?,
                    )),
                }
            }
            Op::Broadcast => Ok(Some(self.inputs[0].clone())),
            Op::Barrier => Ok(Some(Vec::new())),
        }
    }

    /// Whether the result is a shared output that needs the finish barrier.
    pub(super) fn shared(&self) -> bool {
        self.op.shared_output() && self.n > 1
    }

    /// The shared results, once every member has run.
    pub(super) fn finish(&self) -> Result<Vec<DeviceBuffer>> {
        self.outputs
            .iter()
            .zip(&self.output_shapes)
            .map(|(out, (dtype, dims))| {
                let bytes = out
                    .take()
                    .ok_or_else(|| CollectiveError::InvalidArgument("output taken twice".into()))?;
                DeviceBuffer::new(*dtype, dims.clone(), bytes)
            })
            .collect()
    }
}
