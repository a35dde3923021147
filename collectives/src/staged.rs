//! XLA's collectives on top of the primitives a GPU collective library
//! offers (NCCL's all-reduce, all-gather, reduce-scatter, broadcast over the
//! whole communicator, and grouped send/recv), for host buffers staged
//! through the library.
//!
//! [`StagedCommunicator`] implements [`Communicator`] for any [`Transport`]:
//! * whole-world groups in rank order use the library's native collectives
//!   where the element type and reduction allow it (one group call for all
//!   operands); reduce-scatter and all-gather along an inner dimension
//!   rearrange blocks on the host around the native call;
//! * sub-groups, other element types and reductions (and/or, sub-byte
//!   integers, f8, complex) use grouped send/recv among the group's members
//!   and reduce on the host in rank order (the loopback backend's exact
//!   semantics);
//! * before every call the members exchange a description of it (kind,
//!   parameters, operand shapes), so a disagreement is a
//!   [`CollectiveError::Mismatch`] on every member instead of a hang or
//!   corrupted data, and every member validates the same facts.
//!
//! The NCCL transport lives in `nccl` (feature `nccl`); [`ThreadTransport`]
//! gives the same primitives to threads of one process, so all of this code
//! is tested without a GPU.
//!
//! Invariant: a member only talks to members of the group it was given, so
//! disjoint groups may run the same collective concurrently.

use crate::buffer::{element_count, element_size, DeviceBuffer, HostBytes};
use crate::communicator::{rank_in_group, Communicator};
use crate::error::{CallSite, CollectiveError, CollectiveKind, Result};
use crate::groups::{check_pairs, DeviceId};
use crate::layout;
use crate::reduce::{reduce_into, ReductionKind};
use std::collections::HashMap;
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::time::Duration;
use xla_hlo_ir::PrimitiveType;

/// What a collective library provides, over host byte buffers.
pub trait Transport: Send {
    /// This process's rank in the world communicator.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn world_size(&self) -> usize;
    /// Whether [`Transport::all_reduce_world`] and
    /// [`Transport::reduce_scatter_world`] support this type and reduction.
    fn supports_native(&self, dtype: PrimitiveType, kind: ReductionKind) -> bool;
    /// All-reduce over every rank, one buffer per operand, in one group call.
    fn all_reduce_world(
        &mut self,
        kind: ReductionKind,
        dtypes: &[PrimitiveType],
        bufs: &[&[u8]],
    ) -> Result<Vec<HostBytes>>;
    /// All-gather over every rank: each result is the rank-major
    /// concatenation.
    fn all_gather_world(&mut self, bufs: &[&[u8]]) -> Result<Vec<Vec<u8>>>;
    /// Reduce-scatter over every rank: each input is rank-major blocks, each
    /// result is this rank's block of the reduction.
    fn reduce_scatter_world(
        &mut self,
        kind: ReductionKind,
        dtypes: &[PrimitiveType],
        bufs: &[&[u8]],
    ) -> Result<Vec<Vec<u8>>>;
    /// Grouped point-to-point: every send `(peer, bytes)` and receive
    /// `(peer, length)` in one group call; returns the received buffers in
    /// the order of `recvs`. Peers differ from this rank.
    fn exchange(
        &mut self,
        sends: &[(usize, &[u8])],
        recvs: &[(usize, usize)],
    ) -> Result<Vec<Vec<u8>>>;
    /// Name for messages (`"nccl"`).
    fn name(&self) -> &'static str;
}

/// [`Communicator`] over a [`Transport`]; the device id is the world rank.
pub struct StagedCommunicator<T: Transport> {
    transport: T,
    sequences: HashMap<Vec<DeviceId>, u64>,
    p2p_sequences: HashMap<(DeviceId, DeviceId, u64), u64>,
}

/// Bytes of the call description every member sends.
const DESC_BYTES: usize = 2048;

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

fn shapes(ops: &[DeviceBuffer]) -> String {
    ops.iter()
        .map(|b| b.shape_string())
        .collect::<Vec<_>>()
        .join(",")
}

fn invalid(call: &CallSite, msg: impl std::fmt::Display) -> CollectiveError {
    CollectiveError::InvalidArgument(format!("{call}: {msg}"))
}

impl<T: Transport> StagedCommunicator<T> {
    pub fn new(transport: T) -> StagedCommunicator<T> {
        StagedCommunicator {
            transport,
            sequences: HashMap::new(),
            p2p_sequences: HashMap::new(),
        }
    }

    pub fn transport(&self) -> &T {
        &self.transport
    }

    pub fn transport_mut(&mut self) -> &mut T {
        &mut self.transport
    }

    fn me(&self) -> DeviceId {
        self.transport.rank()
    }

    /// Validates the group and numbers the call.
    fn start(&mut self, kind: CollectiveKind, group: &[DeviceId]) -> Result<(usize, CallSite)> {
        let rank = rank_in_group(group, self.me(), self.transport.world_size())?;
        let s = self.sequences.entry(group.to_vec()).or_insert(0);
        let call = CallSite {
            kind,
            group: group.to_vec(),
            sequence: *s,
        };
        *s += 1;
        Ok((rank, call))
    }

    fn is_world(&self, group: &[DeviceId]) -> bool {
        group.len() == self.transport.world_size() && group.iter().enumerate().all(|(i, &d)| i == d)
    }

    /// Every member sends every other member `payload` (the same length on
    /// all members); returns all payloads in group order.
    fn group_all_gather(
        &mut self,
        group: &[DeviceId],
        rank: usize,
        payloads: &[&[u8]],
    ) -> Result<Vec<Vec<Vec<u8>>>> {
        let n = group.len();
        if self.is_world(group) {
            let gathered = self.transport.all_gather_world(payloads)?;
            return Ok((0..n)
                .map(|r| {
                    gathered
                        .iter()
                        .zip(payloads)
                        .map(|(g, p)| g[r * p.len()..(r + 1) * p.len()].to_vec())
                        .collect()
                })
                .collect());
        }
        let mut sends = Vec::new();
        let mut recvs = Vec::new();
        for (r, &d) in group.iter().enumerate() {
            if r == rank {
                continue;
            }
            for p in payloads {
                sends.push((d, *p));
                recvs.push((d, p.len()));
            }
        }
        let mut received = self.transport.exchange(&sends, &recvs)?.into_iter();
        let mut out = Vec::with_capacity(n);
        for r in 0..n {
            if r == rank {
                out.push(payloads.iter().map(|p| p.to_vec()).collect());
            } else {
                out.push(
                    (0..payloads.len())
                        .map(|_| received.next().unwrap_or_default())
                        .collect(),
                );
            }
        }
        Ok(out)
    }

    /// Exchanges the call description; errors on every member when they
    /// disagree. Returns every member's description.
    fn agree(&mut self, call: &CallSite, rank: usize, desc: &str) -> Result<Vec<String>> {
        let mut msg = vec![0u8; DESC_BYTES];
        msg[..8].copy_from_slice(&fnv1a(desc.as_bytes()).to_le_bytes());
        let text = desc.as_bytes();
        let len = text.len().min(DESC_BYTES - 16);
        msg[8..16].copy_from_slice(&(len as u64).to_le_bytes());
        msg[16..16 + len].copy_from_slice(&text[..len]);
        let all = self.group_all_gather(&call.group, rank, &[&msg])?;
        let decode = |m: &[u8]| -> (u64, String) {
            let hash = u64::from_le_bytes(m[..8].try_into().unwrap_or([0; 8]));
            let len = (u64::from_le_bytes(m[8..16].try_into().unwrap_or([0; 8])) as usize)
                .min(DESC_BYTES - 16);
            (hash, String::from_utf8_lossy(&m[16..16 + len]).into_owned())
        };
        let decoded: Vec<(u64, String)> = all.iter().map(|m| decode(&m[0])).collect();
        if let Some(r) = decoded.iter().position(|d| d.0 != decoded[0].0) {
            return Err(CollectiveError::Mismatch {
                call: call.clone(),
                detail: format!(
                    "rank {r} called {} but rank 0 called {}",
                    decoded[r].1, decoded[0].1
                ),
            });
        }
        Ok(decoded.into_iter().map(|d| d.1).collect())
    }
}

impl<T: Transport> Communicator for StagedCommunicator<T> {
    fn device(&self) -> DeviceId {
        self.me()
    }

    fn num_devices(&self) -> usize {
        self.transport.world_size()
    }

    fn backend_name(&self) -> &'static str {
        self.transport.name()
    }

    fn all_reduce(
        &mut self,
        group: &[DeviceId],
        kind: ReductionKind,
        operands: &[DeviceBuffer],
    ) -> Result<Vec<DeviceBuffer>> {
        let (rank, call) = self.start(CollectiveKind::AllReduce, group)?;
        self.agree(
            &call,
            rank,
            &format!("all-reduce {} {}", kind.opcode(), shapes(operands)),
        )?;
        for b in operands {
            kind.check(b.dtype())?;
        }
        let n = group.len();
        let native = self.is_world(group)
            && operands
                .iter()
                .all(|b| self.transport.supports_native(b.dtype(), kind));
        // A one-member group is the identity; a one-rank world still runs
        // the library's collective (so a single GPU exercises NCCL).
        if n == 1 && !native {
            return Ok(operands.to_vec());
        }
        let bytes: Vec<&[u8]> = operands.iter().map(|b| b.bytes()).collect();
        let results: Vec<HostBytes> = if native {
            let dtypes: Vec<PrimitiveType> = operands.iter().map(|b| b.dtype()).collect();
            self.transport.all_reduce_world(kind, &dtypes, &bytes)?
        } else {
            let all = self.group_all_gather(group, rank, &bytes)?;
            operands
                .iter()
                .enumerate()
                .map(|(i, b)| {
                    let srcs: Vec<&[u8]> = all.iter().map(|r| r[i].as_slice()).collect();
                    let mut out = HostBytes::zeroed(b.bytes().len());
                    reduce_into(kind, b.dtype(), &srcs, out.as_bytes_mut())?;
                    Ok(out)
                })
                .collect::<Result<_>>()?
        };
        operands
            .iter()
            .zip(results)
            .map(|(b, r)| DeviceBuffer::new(b.dtype(), b.dims().to_vec(), r))
            .collect()
    }

    fn all_gather(
        &mut self,
        group: &[DeviceId],
        dimension: usize,
        operands: &[DeviceBuffer],
    ) -> Result<Vec<DeviceBuffer>> {
        let (rank, call) = self.start(CollectiveKind::AllGather, group)?;
        self.agree(
            &call,
            rank,
            &format!("all-gather dim={dimension} {}", shapes(operands)),
        )?;
        let n = group.len();
        let out_dims: Vec<Vec<i64>> = operands
            .iter()
            .map(|b| layout::all_gather_dims(b.dims(), dimension, n).map_err(|e| invalid(&call, e)))
            .collect::<Result<_>>()?;
        if n == 1 && !self.is_world(group) {
            return Ok(operands.to_vec());
        }
        let bytes: Vec<&[u8]> = operands.iter().map(|b| b.bytes()).collect();
        let all = self.group_all_gather(group, rank, &bytes)?;
        operands
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let (outer, dim, inner) = layout::split_at(b.dims(), dimension, b.element_size());
                let blk = dim * inner;
                let mut out = HostBytes::zeroed(outer * n * blk);
                let o = out.as_bytes_mut();
                for (r, parts) in all.iter().enumerate() {
                    for k in 0..outer {
                        let dst = (k * n + r) * blk;
                        o[dst..dst + blk].copy_from_slice(&parts[i][k * blk..(k + 1) * blk]);
                    }
                }
                DeviceBuffer::new(b.dtype(), out_dims[i].clone(), out)
            })
            .collect()
    }

    fn reduce_scatter(
        &mut self,
        group: &[DeviceId],
        kind: ReductionKind,
        dimension: usize,
        operands: &[DeviceBuffer],
    ) -> Result<Vec<DeviceBuffer>> {
        let (rank, call) = self.start(CollectiveKind::ReduceScatter, group)?;
        self.agree(
            &call,
            rank,
            &format!(
                "reduce-scatter {} dim={dimension} {}",
                kind.opcode(),
                shapes(operands)
            ),
        )?;
        let n = group.len();
        let out_dims: Vec<Vec<i64>> = operands
            .iter()
            .map(|b| {
                layout::reduce_scatter_dims(b.dims(), dimension, n).map_err(|e| invalid(&call, e))
            })
            .collect::<Result<_>>()?;
        for b in operands {
            kind.check(b.dtype())?;
        }
        let native = self.is_world(group)
            && operands
                .iter()
                .all(|b| self.transport.supports_native(b.dtype(), kind));
        if n == 1 && !native {
            return Ok(operands.to_vec());
        }
        // Rank-major layout: block r (along `dimension`) of every row, for
        // rank 0, then rank 1, ... ; block r is then contiguous.
        let arranged: Vec<Vec<u8>> = operands
            .iter()
            .map(|b| {
                let (outer, dim, inner) = layout::split_at(b.dims(), dimension, b.element_size());
                let seg = dim / n * inner;
                let mut v = Vec::with_capacity(b.bytes().len());
                for r in 0..n {
                    for k in 0..outer {
                        let s = k * dim * inner + r * seg;
                        v.extend_from_slice(&b.bytes()[s..s + seg]);
                    }
                }
                v
            })
            .collect();
        let results: Vec<Vec<u8>> = if native {
            let dtypes: Vec<PrimitiveType> = operands.iter().map(|b| b.dtype()).collect();
            let views: Vec<&[u8]> = arranged.iter().map(|v| v.as_slice()).collect();
            self.transport.reduce_scatter_world(kind, &dtypes, &views)?
        } else {
            // Send member j its block of every operand; reduce the blocks
            // received for this rank in rank order.
            let chunk = |i: usize, r: usize| {
                let c = arranged[i].len() / n;
                &arranged[i][r * c..(r + 1) * c]
            };
            let mut sends = Vec::new();
            let mut recvs = Vec::new();
            for (r, &d) in group.iter().enumerate() {
                if r != rank {
                    for i in 0..operands.len() {
                        sends.push((d, chunk(i, r)));
                        recvs.push((d, arranged[i].len() / n));
                    }
                }
            }
            let mut received = self.transport.exchange(&sends, &recvs)?.into_iter();
            let mut per_rank: Vec<Vec<Vec<u8>>> = Vec::with_capacity(n);
            for r in 0..n {
                per_rank.push(
                    (0..operands.len())
                        .map(|i| {
                            if r == rank {
                                chunk(i, rank).to_vec()
                            } else {
                                received.next().unwrap_or_default()
                            }
                        })
                        .collect(),
                );
            }
            operands
                .iter()
                .enumerate()
                .map(|(i, b)| {
                    let srcs: Vec<&[u8]> = per_rank.iter().map(|p| p[i].as_slice()).collect();
                    let mut out = vec![0u8; arranged[i].len() / n];
                    reduce_into(kind, b.dtype(), &srcs, &mut out)?;
                    Ok(out)
                })
                .collect::<Result<_>>()?
        };
        operands
            .iter()
            .zip(results)
            .zip(out_dims)
            .map(|((b, r), dims)| DeviceBuffer::from_bytes(b.dtype(), dims, &r))
            .collect()
    }

    fn all_to_all(
        &mut self,
        group: &[DeviceId],
        split_dimension: usize,
        concat_dimension: usize,
        operands: &[DeviceBuffer],
    ) -> Result<Vec<DeviceBuffer>> {
        let (rank, call) = self.start(CollectiveKind::AllToAll, group)?;
        self.agree(
            &call,
            rank,
            &format!(
                "all-to-all split={split_dimension} concat={concat_dimension} {}",
                shapes(operands)
            ),
        )?;
        let n = group.len();
        let (s, c) = (split_dimension, concat_dimension);
        let out_dims: Vec<Vec<i64>> = operands
            .iter()
            .map(|b| layout::all_to_all_dims(b.dims(), s, c, n).map_err(|e| invalid(&call, e)))
            .collect::<Result<_>>()?;
        // Block j (along the split dimension) of operand i, contiguous.
        let piece_dims = |b: &DeviceBuffer| -> Vec<i64> {
            let mut p = b.dims().to_vec();
            p[s] /= n as i64;
            p
        };
        let block = |b: &DeviceBuffer, j: usize| -> Result<Vec<u8>> {
            let pd = piece_dims(b);
            let extent: Vec<usize> = pd.iter().map(|&x| x as usize).collect();
            let mut start = vec![0; extent.len()];
            start[s] = j * extent[s];
            let mut out = vec![0u8; element_count(&pd)? * b.element_size()];
            layout::copy_block(
                b.bytes(),
                b.dims(),
                &start,
                &mut out,
                &pd,
                &vec![0; extent.len()],
                &extent,
                b.element_size(),
            )?;
            Ok(out)
        };
        let mut outgoing: Vec<Vec<Vec<u8>>> = Vec::with_capacity(n); // [member][operand]
        for j in 0..n {
            outgoing.push(
                operands
                    .iter()
                    .map(|b| block(b, j))
                    .collect::<Result<_>>()?,
            );
        }
        let mut sends = Vec::new();
        let mut recvs = Vec::new();
        for (j, &d) in group.iter().enumerate() {
            if j != rank {
                for i in 0..operands.len() {
                    sends.push((d, outgoing[j][i].as_slice()));
                    recvs.push((d, outgoing[j][i].len()));
                }
            }
        }
        let mut received = self.transport.exchange(&sends, &recvs)?.into_iter();
        let mut incoming: Vec<Vec<Vec<u8>>> = Vec::with_capacity(n);
        for j in 0..n {
            incoming.push(
                (0..operands.len())
                    .map(|i| {
                        if j == rank {
                            outgoing[rank][i].clone()
                        } else {
                            received.next().unwrap_or_default()
                        }
                    })
                    .collect(),
            );
        }
        operands
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let pd = piece_dims(b);
                let extent: Vec<usize> = pd.iter().map(|&x| x as usize).collect();
                let esize = b.element_size();
                let mut out = HostBytes::zeroed(element_count(&out_dims[i])? * esize);
                for (j, parts) in incoming.iter().enumerate() {
                    let mut start = vec![0; extent.len()];
                    start[c] = j * extent[c];
                    layout::copy_block(
                        &parts[i],
                        &pd,
                        &vec![0; extent.len()],
                        out.as_bytes_mut(),
                        &out_dims[i],
                        &start,
                        &extent,
                        esize,
                    )?;
                }
                DeviceBuffer::new(b.dtype(), out_dims[i].clone(), out)
            })
            .collect()
    }

    fn all_to_all_tuple(
        &mut self,
        group: &[DeviceId],
        operands: &[DeviceBuffer],
    ) -> Result<Vec<DeviceBuffer>> {
        let (rank, call) = self.start(CollectiveKind::AllToAll, group)?;
        let descs = self.agree_shapes_free(&call, rank, "tuple all-to-all", operands)?;
        let n = group.len();
        if operands.len() != n {
            return Err(CollectiveError::Mismatch {
                call: call.clone(),
                detail: format!(
                    "rank {rank} passed {} operands to a tuple all-to-all over {n} ranks",
                    operands.len()
                ),
            });
        }
        // Member j's shape list must match: j sends its operand `rank` to us,
        // whose shape must be our operand j's.
        let lists: Vec<Vec<&str>> = descs.iter().map(|d| d.split(';').collect()).collect();
        for (j, l) in lists.iter().enumerate() {
            if l.len() != n {
                return Err(CollectiveError::Mismatch {
                    call: call.clone(),
                    detail: format!(
                        "rank {j} passed {} operands to a tuple all-to-all over {n} ranks",
                        l.len()
                    ),
                });
            }
        }
        for r in 0..n {
            for j in 0..n {
                if lists[j][r] != lists[r][j] {
                    return Err(CollectiveError::Mismatch {
                        call: call.clone(),
                        detail: format!(
                            "rank {j} sends {} to rank {r}, whose operand {j} is {}",
                            lists[j][r], lists[r][j]
                        ),
                    });
                }
            }
        }
        let mut sends = Vec::new();
        let mut recvs = Vec::new();
        for (j, &d) in group.iter().enumerate() {
            if j != rank {
                sends.push((d, operands[j].bytes()));
                recvs.push((d, operands[j].bytes().len()));
            }
        }
        let mut received = self.transport.exchange(&sends, &recvs)?.into_iter();
        (0..n)
            .map(|j| {
                if j == rank {
                    Ok(operands[rank].clone())
                } else {
                    let b = &operands[j];
                    DeviceBuffer::from_bytes(
                        b.dtype(),
                        b.dims().to_vec(),
                        &received.next().unwrap_or_default(),
                    )
                }
            })
            .collect()
    }

    fn collective_permute(
        &mut self,
        group: &[DeviceId],
        pairs: &[(DeviceId, DeviceId)],
        operands: &[DeviceBuffer],
    ) -> Result<Vec<DeviceBuffer>> {
        let (rank, call) = self.start(CollectiveKind::CollectivePermute, group)?;
        self.agree(
            &call,
            rank,
            &format!("collective-permute pairs={pairs:?} {}", shapes(operands)),
        )?;
        check_pairs(pairs)?;
        for &(s, t) in pairs {
            if !group.contains(&s) || !group.contains(&t) {
                return Err(CollectiveError::InvalidGroups(format!(
                    "{call}: pair ({s}, {t}) names a device outside the group"
                )));
            }
        }
        let me = self.me();
        let mut sends = Vec::new();
        let mut recvs = Vec::new();
        if let Some(&(_, t)) = pairs.iter().find(|&&(s, t)| s == me && t != me) {
            sends.extend(operands.iter().map(|b| (t, b.bytes())));
        }
        let source = pairs.iter().find(|&&(_, t)| t == me).map(|&(s, _)| s);
        if let Some(s) = source.filter(|&s| s != me) {
            recvs.extend(operands.iter().map(|b| (s, b.bytes().len())));
        }
        let mut received = self.transport.exchange(&sends, &recvs)?.into_iter();
        operands
            .iter()
            .map(|b| match source {
                Some(s) if s == me => Ok(b.clone()),
                Some(_) => DeviceBuffer::from_bytes(
                    b.dtype(),
                    b.dims().to_vec(),
                    &received.next().unwrap_or_default(),
                ),
                None => DeviceBuffer::zeros(b.dtype(), b.dims().to_vec()),
            })
            .collect()
    }

    fn collective_broadcast(
        &mut self,
        group: &[DeviceId],
        operands: &[DeviceBuffer],
    ) -> Result<Vec<DeviceBuffer>> {
        let (rank, call) = self.start(CollectiveKind::CollectiveBroadcast, group)?;
        self.agree(
            &call,
            rank,
            &format!("collective-broadcast {}", shapes(operands)),
        )?;
        if rank == 0 {
            let sends: Vec<(usize, &[u8])> = group[1..]
                .iter()
                .flat_map(|&d| operands.iter().map(move |b| (d, b.bytes())))
                .collect();
            self.transport.exchange(&sends, &[])?;
            Ok(operands.to_vec())
        } else {
            let recvs: Vec<(usize, usize)> = operands
                .iter()
                .map(|b| (group[0], b.bytes().len()))
                .collect();
            let received = self.transport.exchange(&[], &recvs)?;
            operands
                .iter()
                .zip(received)
                .map(|(b, r)| DeviceBuffer::from_bytes(b.dtype(), b.dims().to_vec(), &r))
                .collect()
        }
    }

    fn send(&mut self, peer: DeviceId, tag: u64, buffer: &DeviceBuffer) -> Result<()> {
        self.check_peer(peer)?;
        let _ = self.next_p2p(self.me(), peer, tag);
        if peer == self.me() {
            return Err(CollectiveError::Unsupported(format!(
                "{}: send to self (NCCL pairs a send with a concurrent recv)",
                self.transport.name()
            )));
        }
        self.transport.exchange(&[(peer, buffer.bytes())], &[])?;
        Ok(())
    }

    fn recv(
        &mut self,
        peer: DeviceId,
        tag: u64,
        dtype: PrimitiveType,
        dims: &[i64],
    ) -> Result<DeviceBuffer> {
        self.check_peer(peer)?;
        let _ = self.next_p2p(peer, self.me(), tag);
        if peer == self.me() {
            return Err(CollectiveError::Unsupported(format!(
                "{}: recv from self",
                self.transport.name()
            )));
        }
        let len = element_count(dims)? * element_size(dtype)?;
        let r = self.transport.exchange(&[], &[(peer, len)])?;
        DeviceBuffer::from_bytes(
            dtype,
            dims.to_vec(),
            r.first().map(|v| v.as_slice()).unwrap_or(&[]),
        )
    }

    fn wait_sends(&mut self) -> Result<()> {
        // Sends complete before `send` returns.
        Ok(())
    }

    fn barrier(&mut self, group: &[DeviceId]) -> Result<()> {
        let (rank, call) = self.start(CollectiveKind::Barrier, group)?;
        self.agree(&call, rank, "barrier").map(|_| ())
    }
}

impl<T: Transport> StagedCommunicator<T> {
    /// Like `agree`, for calls whose operand shapes legitimately differ: the
    /// kind must match; returns each member's `;`-joined shape list.
    fn agree_shapes_free(
        &mut self,
        call: &CallSite,
        rank: usize,
        what: &str,
        operands: &[DeviceBuffer],
    ) -> Result<Vec<String>> {
        let list = operands
            .iter()
            .map(|b| b.shape_string())
            .collect::<Vec<_>>()
            .join(";");
        let descs = self.agree_prefix(call, rank, what, &list)?;
        Ok(descs)
    }

    /// Exchanges `what|extra`; errors when `what` differs; returns `extra`s.
    fn agree_prefix(
        &mut self,
        call: &CallSite,
        rank: usize,
        what: &str,
        extra: &str,
    ) -> Result<Vec<String>> {
        let mut msg = vec![0u8; DESC_BYTES];
        let text = format!("{what}|{extra}");
        let t = text.as_bytes();
        let len = t.len().min(DESC_BYTES - 8);
        msg[..8].copy_from_slice(&(len as u64).to_le_bytes());
        msg[8..8 + len].copy_from_slice(&t[..len]);
        let all = self.group_all_gather(&call.group, rank, &[&msg])?;
        let texts: Vec<String> = all
            .iter()
            .map(|m| {
                let m = &m[0];
                let len = (u64::from_le_bytes(m[..8].try_into().unwrap_or([0; 8])) as usize)
                    .min(DESC_BYTES - 8);
                String::from_utf8_lossy(&m[8..8 + len]).into_owned()
            })
            .collect();
        let split: Vec<(&str, &str)> = texts
            .iter()
            .map(|t| t.split_once('|').unwrap_or((t, "")))
            .collect();
        if let Some(r) = split.iter().position(|s| s.0 != split[0].0) {
            return Err(CollectiveError::Mismatch {
                call: call.clone(),
                detail: format!(
                    "rank {r} called {} but rank 0 called {}",
                    split[r].0, split[0].0
                ),
            });
        }
        Ok(split.iter().map(|s| s.1.to_string()).collect())
    }

    fn check_peer(&self, peer: DeviceId) -> Result<()> {
        if peer >= self.transport.world_size() {
            return Err(CollectiveError::InvalidArgument(format!(
                "peer {peer} out of range (devices 0..{})",
                self.transport.world_size()
            )));
        }
        Ok(())
    }

    fn next_p2p(&mut self, from: DeviceId, to: DeviceId, tag: u64) -> u64 {
        let s = self.p2p_sequences.entry((from, to, tag)).or_insert(0);
        *s += 1;
        *s - 1
    }
}

// ---------------------------------------------------------------------------
// A transport over threads, for testing the staged algorithms on the CPU.

/// NCCL's primitives for threads of one process: a channel between every
/// pair of ranks. Native collectives are composed from the same channels, so
/// the staged layer's host-side code paths (rank-major rearrangement, the
/// send/recv fallbacks, agreement) run exactly as with NCCL.
pub struct ThreadTransport {
    rank: usize,
    world: usize,
    senders: Vec<Sender<Vec<u8>>>,
    receivers: Vec<Receiver<Vec<u8>>>,
    timeout: Duration,
}

impl ThreadTransport {
    /// One transport per rank of a world of `n`.
    pub fn world(n: usize, timeout: Duration) -> Vec<ThreadTransport> {
        // chans[from][to]
        let mut senders: Vec<Vec<Option<Sender<Vec<u8>>>>> =
            (0..n).map(|_| (0..n).map(|_| None).collect()).collect();
        let mut receivers: Vec<Vec<Option<Receiver<Vec<u8>>>>> =
            (0..n).map(|_| (0..n).map(|_| None).collect()).collect();
        for from in 0..n {
            for to in 0..n {
                let (s, r) = channel();
                senders[from][to] = Some(s);
                receivers[to][from] = Some(r);
            }
        }
        senders
            .into_iter()
            .zip(receivers)
            .enumerate()
            .map(|(rank, (s, r))| ThreadTransport {
                rank,
                world: n,
                senders: s.into_iter().flatten().collect(),
                receivers: r.into_iter().flatten().collect(),
                timeout,
            })
            .collect()
    }

    fn recv_from(&self, peer: usize, len: usize) -> Result<Vec<u8>> {
        let v = self.receivers[peer]
            .recv_timeout(self.timeout)
            .map_err(|e| {
                CollectiveError::Backend(match e {
                    RecvTimeoutError::Timeout => format!(
                        "rank {}: no message from rank {peer} within {:?}",
                        self.rank, self.timeout
                    ),
                    RecvTimeoutError::Disconnected => {
                        format!("rank {}: rank {peer} is gone", self.rank)
                    }
                })
            })?;
        if v.len() != len {
            return Err(CollectiveError::Backend(format!(
                "rank {}: expected {len} bytes from rank {peer}, got {}",
                self.rank,
                v.len()
            )));
        }
        Ok(v)
    }

    fn send_to(&self, peer: usize, bytes: &[u8]) -> Result<()> {
        self.senders[peer].send(bytes.to_vec()).map_err(|_| {
            CollectiveError::Backend(format!("rank {}: rank {peer} is gone", self.rank))
        })
    }

    fn gather_all(&self, bufs: &[&[u8]]) -> Result<Vec<Vec<Vec<u8>>>> {
        for p in 0..self.world {
            if p != self.rank {
                for b in bufs {
                    self.send_to(p, b)?;
                }
            }
        }
        (0..self.world)
            .map(|p| {
                bufs.iter()
                    .map(|b| {
                        if p == self.rank {
                            Ok(b.to_vec())
                        } else {
                            self.recv_from(p, b.len())
                        }
                    })
                    .collect()
            })
            .collect()
    }
}

impl Transport for ThreadTransport {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.world
    }
    fn supports_native(&self, dtype: PrimitiveType, kind: ReductionKind) -> bool {
        kind.supports(dtype)
    }
    fn all_reduce_world(
        &mut self,
        kind: ReductionKind,
        dtypes: &[PrimitiveType],
        bufs: &[&[u8]],
    ) -> Result<Vec<HostBytes>> {
        let all = self.gather_all(bufs)?;
        (0..bufs.len())
            .map(|i| {
                let srcs: Vec<&[u8]> = all.iter().map(|r| r[i].as_slice()).collect();
                let mut out = HostBytes::zeroed(bufs[i].len());
                reduce_into(kind, dtypes[i], &srcs, out.as_bytes_mut())?;
                Ok(out)
            })
            .collect()
    }
    fn all_gather_world(&mut self, bufs: &[&[u8]]) -> Result<Vec<Vec<u8>>> {
        let all = self.gather_all(bufs)?;
        Ok((0..bufs.len())
            .map(|i| all.iter().flat_map(|r| r[i].iter().copied()).collect())
            .collect())
    }
    fn reduce_scatter_world(
        &mut self,
        kind: ReductionKind,
        dtypes: &[PrimitiveType],
        bufs: &[&[u8]],
    ) -> Result<Vec<Vec<u8>>> {
        let full = self.all_reduce_world(kind, dtypes, bufs)?;
        Ok(full
            .iter()
            .map(|f| {
                let c = f.len() / self.world;
                f.as_bytes()[self.rank * c..(self.rank + 1) * c].to_vec()
            })
            .collect())
    }
    fn exchange(
        &mut self,
        sends: &[(usize, &[u8])],
        recvs: &[(usize, usize)],
    ) -> Result<Vec<Vec<u8>>> {
        for &(p, b) in sends {
            self.send_to(p, b)?;
        }
        recvs
            .iter()
            .map(|&(p, len)| self.recv_from(p, len))
            .collect()
    }
    fn name(&self) -> &'static str {
        "threads"
    }
}
