//! The CPU fallback for collectives across processes: a [`Transport`] over
//! TCP sockets, one connection between every pair of ranks, so that
//! [`crate::StagedCommunicator`] gives XLA's collectives to devices in
//! different processes (or on different hosts) exactly as NCCL does on GPUs.
//!
//! Joining: every rank listens on an ephemeral port of its bind host and
//! publishes `<prefix>/tcp/<rank>` = `host:port` in a key-value store; it
//! connects to every lower rank (retrying until the timeout) and accepts a
//! connection from every higher one. The first frame on a connection is a
//! hello naming the connecting rank, the world size and a hash of the
//! prefix, so a stray or stale connection is refused.
//!
//! Messages are frames: an 8-byte little-endian length, then the bytes. A
//! receive names the length it expects; another length is an error.
//!
//! World collectives fold in rank order, so every result is bitwise equal
//! to the loopback backend's: all-reduce is a direct reduce-scatter (rank r
//! receives chunk r of every rank's operand and folds them in rank order)
//! followed by an all-gather of the reduced chunks; each rank sends and
//! receives `2 (n-1)/n` of the operand, as a ring does.
//!
//! Failure handling: a peer whose connection closes or resets is
//! [`CollectiveError::PeerLost`] at once (a process killed mid-run closes
//! its sockets); a peer silent past the timeout is `PeerLost` too, naming
//! how long we waited. Nothing blocks without a bound.
//!
//! Invariants: receives from different peers run on their own threads and
//! sends on the caller's, so two ranks sending large messages to each other
//! never deadlock; the frames between two ranks stay in program order
//! because both issue their calls in program order.

use crate::buffer::{HostBytes, Recycler};
use crate::error::{CollectiveError, Result};
use crate::reduce::{reduce_into, ReductionKind};
use crate::staged::Transport;
use crate::store::KeyValueStore;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};
use xla_hlo_ir::PrimitiveType;

const HELLO_MAGIC: u64 = 0x5843_4f4c_5443_5031; // "XCOLTCP1"
const HELLO_BYTES: usize = 32;

/// Bound on the memory a rank keeps for reuse by large results (freshly
/// mapped memory costs a page fault per page on first touch).
const POOL_BYTES: usize = 1 << 30;

/// How a rank joins a TCP world.
#[derive(Clone, Debug)]
pub struct TcpConfig {
    /// Key prefix in the store (one per world, e.g. a job name).
    pub prefix: String,
    /// This rank (device id).
    pub rank: usize,
    /// Number of ranks.
    pub world_size: usize,
    /// Address this rank listens on and publishes (`127.0.0.1` for one host).
    pub bind_host: String,
    /// Bound on joining and on every wait for a peer.
    pub timeout: Duration,
    /// Ranks per process, only to name a lost rank's process in errors
    /// (`0`: do not name processes).
    pub ranks_per_process: usize,
}

/// One rank's connections to every other rank.
pub struct TcpTransport {
    rank: usize,
    world: usize,
    /// `peers[p]`: the connection to rank `p` (`None` for this rank).
    peers: Vec<Option<TcpStream>>,
    timeout: Duration,
    ranks_per_process: usize,
    recycler: Arc<Recycler>,
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

fn hello(rank: usize, world: usize, prefix: &str) -> [u8; HELLO_BYTES] {
    let mut out = [0u8; HELLO_BYTES];
    for (i, v) in [
        HELLO_MAGIC,
        rank as u64,
        world as u64,
        fnv1a(prefix.as_bytes()),
    ]
    .into_iter()
    .enumerate()
    {
        out[i * 8..(i + 1) * 8].copy_from_slice(&v.to_le_bytes());
    }
    out
}

fn bootstrap(msg: impl std::fmt::Display) -> CollectiveError {
    CollectiveError::Bootstrap(format!("tcp: {msg}"))
}

impl TcpTransport {
    /// Joins the world described by `config` through `store`.
    pub fn connect(store: &dyn KeyValueStore, config: &TcpConfig) -> Result<TcpTransport> {
        let (rank, world) = (config.rank, config.world_size);
        if rank >= world {
            return Err(CollectiveError::InvalidArgument(format!(
                "rank {rank} out of range for world size {world}"
            )));
        }
        let deadline = Instant::now() + config.timeout;
        let listener = TcpListener::bind((config.bind_host.as_str(), 0)).map_err(|e| {
            bootstrap(format!(
                "rank {rank} cannot listen on {}: {e}",
                config.bind_host
            ))
        })?;
        let port = listener.local_addr().map_err(bootstrap)?.port();
        let key = |r: usize| format!("{}/tcp/{r}", config.prefix);
        store.set(
            &key(rank),
            format!("{}:{port}", config.bind_host).as_bytes(),
        )?;
        let mut transport = TcpTransport {
            rank,
            world,
            peers: (0..world).map(|_| None).collect(),
            timeout: config.timeout,
            ranks_per_process: config.ranks_per_process,
            recycler: Recycler::new(POOL_BYTES),
        };
        for peer in 0..rank {
            let left = deadline.saturating_duration_since(Instant::now());
            let addr = store.get(&key(peer), left).map_err(|e| {
                bootstrap(format!(
                    "{} did not publish its address: {e}",
                    transport.name_rank(peer)
                ))
            })?;
            let addr = String::from_utf8_lossy(&addr).into_owned();
            let mut stream = connect_until(&addr, deadline).map_err(|e| {
                bootstrap(format!(
                    "cannot connect to {} at {addr}: {e}",
                    transport.name_rank(peer)
                ))
            })?;
            stream
                .write_all(&hello(rank, world, &config.prefix))
                .map_err(|e| bootstrap(format!("hello to {}: {e}", transport.name_rank(peer))))?;
            transport.peers[peer] = Some(stream);
        }
        listener.set_nonblocking(true).map_err(bootstrap)?;
        let mut missing = world - rank - 1;
        while missing > 0 {
            match listener.accept() {
                Ok((stream, _)) => {
                    stream.set_nonblocking(false).map_err(bootstrap)?;
                    let left = deadline.saturating_duration_since(Instant::now());
                    stream
                        .set_read_timeout(Some(left.max(Duration::from_millis(10))))
                        .map_err(bootstrap)?;
                    let mut buf = [0u8; HELLO_BYTES];
                    if (&stream).read_exact(&mut buf).is_err() {
                        continue; // not one of ours
                    }
                    let word = |i: usize| {
                        u64::from_le_bytes(buf[i * 8..(i + 1) * 8].try_into().unwrap_or([0; 8]))
                    };
                    let from = word(1) as usize;
                    if word(0) != HELLO_MAGIC || word(3) != fnv1a(config.prefix.as_bytes()) {
                        continue;
                    }
                    if word(2) as usize != world {
                        return Err(bootstrap(format!(
                            "rank {from} joined with world size {} but this rank has {world}",
                            word(2)
                        )));
                    }
                    if from <= rank || from >= world || transport.peers[from].is_some() {
                        return Err(bootstrap(format!(
                            "unexpected connection from rank {from} at rank {rank}"
                        )));
                    }
                    transport.peers[from] = Some(stream);
                    missing -= 1;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        let absent: Vec<usize> = (rank + 1..world)
                            .filter(|&p| transport.peers[p].is_none())
                            .collect();
                        return Err(bootstrap(format!(
                            "rank {rank}: ranks {absent:?} did not connect within {:?}",
                            config.timeout
                        )));
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(e) => return Err(bootstrap(e)),
            }
        }
        for stream in transport.peers.iter().flatten() {
            stream.set_nodelay(true).map_err(bootstrap)?;
            stream
                .set_read_timeout(Some(config.timeout))
                .map_err(bootstrap)?;
            stream
                .set_write_timeout(Some(config.timeout))
                .map_err(bootstrap)?;
        }
        Ok(transport)
    }

    /// A whole world in this process (threads), joined through an
    /// in-memory store on 127.0.0.1; for tests and benchmarks.
    pub fn local_world(n: usize, timeout: Duration) -> Result<Vec<TcpTransport>> {
        let store = crate::store::InMemoryStore::new();
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..n)
                .map(|rank| {
                    let store = &store;
                    s.spawn(move || {
                        TcpTransport::connect(
                            store,
                            &TcpConfig {
                                prefix: "local".into(),
                                rank,
                                world_size: n,
                                bind_host: "127.0.0.1".into(),
                                timeout,
                                ranks_per_process: 0,
                            },
                        )
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(bootstrap("a joining thread panicked")))
                })
                .collect()
        })
    }

    /// "device 5 (process 2)" for messages.
    fn name_rank(&self, rank: usize) -> String {
        match rank.checked_div(self.ranks_per_process) {
            Some(process) => format!("device {rank} (process {process})"),
            None => format!("device {rank}"),
        }
    }

    fn stream(&self, peer: usize) -> Result<&TcpStream> {
        self.peers
            .get(peer)
            .and_then(Option::as_ref)
            .ok_or_else(|| {
                CollectiveError::InvalidArgument(format!(
                    "rank {}: no connection to rank {peer} (world of {})",
                    self.rank, self.world
                ))
            })
    }

    fn lost(&self, peer: usize, e: std::io::Error) -> CollectiveError {
        let reason = match e.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => {
                format!("no message within {:?}", self.timeout)
            }
            ErrorKind::UnexpectedEof => "its connection closed".to_string(),
            _ => format!("its connection failed: {e}"),
        };
        CollectiveError::PeerLost {
            device: peer,
            reason: format!(
                "{} (seen by device {}): {reason}",
                self.name_rank(peer),
                self.rank
            ),
        }
    }

    fn send_frame(&self, peer: usize, bytes: &[u8]) -> Result<()> {
        let mut s = self.stream(peer)?;
        s.write_all(&(bytes.len() as u64).to_le_bytes())
            .and_then(|_| s.write_all(bytes))
            .map_err(|e| self.lost(peer, e))
    }

    /// Receives one frame from `peer` into `out`, which must be its length.
    fn recv_frame_into(&self, peer: usize, out: &mut [u8]) -> Result<()> {
        let mut s = self.stream(peer)?;
        let mut header = [0u8; 8];
        s.read_exact(&mut header).map_err(|e| self.lost(peer, e))?;
        let got = u64::from_le_bytes(header);
        if got != out.len() as u64 {
            return Err(CollectiveError::Backend(format!(
                "tcp: device {} expected {} bytes from {}, got a frame of {got}",
                self.rank,
                out.len(),
                self.name_rank(peer)
            )));
        }
        s.read_exact(out).map_err(|e| self.lost(peer, e))
    }

    /// Element chunk `r` of `elements` split into `world` parts, as a byte
    /// range.
    fn chunk(&self, elements: usize, element_bytes: usize, r: usize) -> std::ops::Range<usize> {
        let per = elements.div_ceil(self.world.max(1));
        let start = (r * per).min(elements);
        let end = ((r + 1) * per).min(elements);
        start * element_bytes..end * element_bytes
    }

    /// Folds, per operand, every rank's piece (this rank's own piece where
    /// `own` gives it, the received ones in `received` peer-major order) in
    /// rank order into `outs`.
    fn fold_in_rank_order(
        &self,
        kind: ReductionKind,
        dtypes: &[PrimitiveType],
        own: &[&[u8]],
        received: &[&[u8]],
        outs: &mut [&mut [u8]],
    ) -> Result<()> {
        let ops = own.len();
        for (i, out) in outs.iter_mut().enumerate() {
            let mut srcs: Vec<&[u8]> = Vec::with_capacity(self.world);
            let mut next = 0;
            for r in 0..self.world {
                if r == self.rank {
                    srcs.push(own[i]);
                } else {
                    srcs.push(received[next * ops + i]);
                    next += 1;
                }
            }
            reduce_into(kind, dtypes[i], &srcs, out)?;
        }
        Ok(())
    }

    /// Sends every `(peer, bytes)` and receives every `(peer, length)`;
    /// returns the received buffers in the order of `recvs`.
    fn exchange_frames(
        &self,
        sends: &[(usize, &[u8])],
        recvs: &[(usize, usize)],
    ) -> Result<Vec<Vec<u8>>> {
        let mut out: Vec<Vec<u8>> = recvs.iter().map(|&(_, len)| vec![0u8; len]).collect();
        let targets = recvs
            .iter()
            .zip(out.iter_mut())
            .map(|(&(p, _), o)| (p, o.as_mut_slice()))
            .collect();
        self.exchange_into(sends, targets)?;
        Ok(out)
    }

    /// Sends every `(peer, bytes)` (in order) while receiving, from each
    /// peer on its own thread, one frame into each `(peer, slice)` in order.
    fn exchange_into(
        &self,
        sends: &[(usize, &[u8])],
        recvs: Vec<(usize, &mut [u8])>,
    ) -> Result<()> {
        let mut by_peer: Vec<Vec<&mut [u8]>> = (0..self.world).map(|_| Vec::new()).collect();
        for (p, slot) in recvs {
            self.stream(p)?;
            by_peer[p].push(slot);
        }
        let this = self;
        let (send_result, recv_results) = std::thread::scope(|s| {
            let readers: Vec<_> = by_peer
                .into_iter()
                .enumerate()
                .filter(|(_, list)| !list.is_empty())
                .map(|(p, list)| {
                    s.spawn(move || -> Result<()> {
                        list.into_iter()
                            .try_for_each(|slot| this.recv_frame_into(p, slot))
                    })
                })
                .collect();
            let send_result: Result<()> =
                sends.iter().try_for_each(|&(p, b)| this.send_frame(p, b));
            let recv_results: Vec<Result<()>> = readers
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(CollectiveError::Backend("tcp: a reader panicked".into()))
                    })
                })
                .collect();
            (send_result, recv_results)
        });
        // A lost peer is the most telling error.
        let mut first_err = send_result.err();
        for e in recv_results.into_iter().filter_map(Result::err) {
            if first_err
                .as_ref()
                .is_none_or(|f| !matches!(f, CollectiveError::PeerLost { .. }))
            {
                first_err = Some(e);
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn peers_in_order(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.world).filter(move |&p| p != self.rank)
    }
}

fn connect_until(addr: &str, deadline: Instant) -> std::io::Result<TcpStream> {
    let mut pause = Duration::from_millis(2);
    loop {
        let result = addr.to_socket_addrs().and_then(|mut addrs| {
            let a = addrs.next().ok_or_else(|| {
                std::io::Error::new(ErrorKind::NotFound, "address resolves to nothing")
            })?;
            let left = deadline.saturating_duration_since(Instant::now());
            TcpStream::connect_timeout(&a, left.max(Duration::from_millis(10)))
        });
        match result {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(100));
            }
        }
    }
}

impl Drop for TcpTransport {
    fn drop(&mut self) {
        for s in self.peers.iter().flatten() {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

impl Transport for TcpTransport {
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
        let sizes: Vec<usize> = dtypes
            .iter()
            .map(|&t| crate::buffer::element_size(t))
            .collect::<Result<_>>()?;
        let chunk = |i: usize, r: usize| self.chunk(bufs[i].len() / sizes[i], sizes[i], r);
        let ops = bufs.len();
        // Reduce-scatter: chunk p of every operand to rank p; every peer's
        // piece of this rank's chunk lands in `pieces` (peer-major).
        let mut sends = Vec::new();
        let mut pieces: Vec<HostBytes> = Vec::new();
        for p in self.peers_in_order() {
            for i in 0..ops {
                sends.push((p, &bufs[i][chunk(i, p)]));
                pieces.push(self.recycler.take_uninit(chunk(i, self.rank).len()));
            }
        }
        let peers: Vec<usize> = self.peers_in_order().collect();
        let targets = pieces
            .iter_mut()
            .enumerate()
            .map(|(k, h)| (peers[k / ops.max(1)], h.as_bytes_mut()))
            .collect();
        self.exchange_into(&sends, targets)?;
        // The reduced chunk goes straight into its place in the result.
        let mut out: Vec<HostBytes> = bufs
            .iter()
            .map(|b| self.recycler.take_uninit(b.len()))
            .collect();
        let own: Vec<&[u8]> = (0..ops).map(|i| &bufs[i][chunk(i, self.rank)]).collect();
        let received: Vec<&[u8]> = pieces.iter().map(HostBytes::as_bytes).collect();
        let mut mine: Vec<&mut [u8]> = out
            .iter_mut()
            .enumerate()
            .map(|(i, h)| &mut h.as_bytes_mut()[chunk(i, self.rank)])
            .collect();
        self.fold_in_rank_order(kind, dtypes, &own, &received, &mut mine)?;
        drop(received);
        drop(pieces);
        // All-gather: this rank's chunk to every peer, theirs into place.
        let mut sends: Vec<(usize, &[u8])> = Vec::new();
        let mut targets: Vec<(usize, &mut [u8])> = Vec::new();
        let mut own_chunks: Vec<&[u8]> = Vec::new();
        for (i, h) in out.iter_mut().enumerate() {
            let mut rest = h.as_bytes_mut();
            for r in 0..self.world {
                let (head, tail) = rest.split_at_mut(chunk(i, r).len());
                rest = tail;
                if r == self.rank {
                    own_chunks.push(head);
                } else {
                    targets.push((r, head));
                }
            }
        }
        for p in self.peers_in_order() {
            sends.extend(own_chunks.iter().map(|c| (p, *c)));
        }
        self.exchange_into(&sends, targets)?;
        Ok(out)
    }

    fn all_gather_world(&mut self, bufs: &[&[u8]]) -> Result<Vec<Vec<u8>>> {
        let mut sends = Vec::new();
        let mut recvs = Vec::new();
        for p in self.peers_in_order() {
            for b in bufs {
                sends.push((p, *b));
                recvs.push((p, b.len()));
            }
        }
        let received = self.exchange_frames(&sends, &recvs)?;
        let mut out: Vec<Vec<u8>> = bufs
            .iter()
            .map(|b| Vec::with_capacity(b.len() * self.world))
            .collect();
        let mut next = 0;
        for r in 0..self.world {
            for (i, b) in bufs.iter().enumerate() {
                if r == self.rank {
                    out[i].extend_from_slice(b);
                } else {
                    out[i].extend_from_slice(&received[next]);
                    next += 1;
                }
            }
        }
        Ok(out)
    }

    fn reduce_scatter_world(
        &mut self,
        kind: ReductionKind,
        dtypes: &[PrimitiveType],
        bufs: &[&[u8]],
    ) -> Result<Vec<Vec<u8>>> {
        let block = |i: usize, r: usize| {
            let len = bufs[i].len() / self.world;
            r * len..(r + 1) * len
        };
        let mut sends = Vec::new();
        let mut recvs = Vec::new();
        for p in self.peers_in_order() {
            for i in 0..bufs.len() {
                sends.push((p, &bufs[i][block(i, p)]));
                recvs.push((p, block(i, self.rank).len()));
            }
        }
        let received = self.exchange_frames(&sends, &recvs)?;
        let received: Vec<&[u8]> = received.iter().map(Vec::as_slice).collect();
        let own: Vec<&[u8]> = (0..bufs.len())
            .map(|i| &bufs[i][block(i, self.rank)])
            .collect();
        let mut out: Vec<Vec<u8>> = own.iter().map(|o| vec![0u8; o.len()]).collect();
        let mut slots: Vec<&mut [u8]> = out.iter_mut().map(Vec::as_mut_slice).collect();
        self.fold_in_rank_order(kind, dtypes, &own, &received, &mut slots)?;
        Ok(out)
    }

    fn exchange(
        &mut self,
        sends: &[(usize, &[u8])],
        recvs: &[(usize, usize)],
    ) -> Result<Vec<Vec<u8>>> {
        self.exchange_frames(sends, recvs)
    }

    fn name(&self) -> &'static str {
        "tcp"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::staged::StagedCommunicator;
    use crate::{Communicator, DeviceBuffer, HostBytes};

    fn f32s(dims: &[i64], v: &[f32]) -> DeviceBuffer {
        DeviceBuffer::new(PrimitiveType::F32, dims.to_vec(), HostBytes::from_typed(v)).unwrap()
    }

    fn run<T: Send>(
        n: usize,
        f: impl Fn(usize, &mut StagedCommunicator<TcpTransport>) -> T + Sync,
    ) -> Vec<T> {
        let transports = TcpTransport::local_world(n, Duration::from_secs(20)).unwrap();
        std::thread::scope(|s| {
            let hs: Vec<_> = transports
                .into_iter()
                .enumerate()
                .map(|(d, t)| {
                    let f = &f;
                    s.spawn(move || f(d, &mut StagedCommunicator::new(t)))
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn all_reduce_folds_in_rank_order() {
        // Float sums whose value depends on the order of addition.
        let values = [1e8f32, 1.0, -1e8, 1.0, 0.5];
        let n = values.len();
        let got = run(n, |d, c| {
            let ops = [f32s(&[7], &[values[d]; 7])];
            c.all_reduce(&(0..n).collect::<Vec<_>>(), ReductionKind::Sum, &ops)
                .unwrap()
        });
        let want = values.iter().fold(0f32, |a, &b| a + b);
        for r in got {
            assert!(r[0]
                .typed::<f32>()
                .unwrap()
                .iter()
                .all(|&v| v.to_bits() == want.to_bits()));
        }
    }

    #[test]
    fn a_dropped_rank_is_named() {
        let got = run(3, |d, c| {
            if d == 2 {
                return Ok(Vec::new());
            }
            let ops = [f32s(&[4], &[1f32; 4])];
            c.all_reduce(&[0, 1, 2], ReductionKind::Sum, &ops)
        });
        for r in &got[..2] {
            let e = r.as_ref().unwrap_err();
            assert!(
                matches!(e, CollectiveError::PeerLost { device: 2, .. }),
                "{e}"
            );
        }
    }

    #[test]
    fn stale_world_size_is_refused() {
        let store = crate::store::InMemoryStore::new();
        let config = |rank, world_size| TcpConfig {
            prefix: "p".into(),
            rank,
            world_size,
            bind_host: "127.0.0.1".into(),
            timeout: Duration::from_millis(500),
            ranks_per_process: 1,
        };
        let (a, b) = std::thread::scope(|s| {
            let a = s.spawn(|| TcpTransport::connect(&store, &config(0, 2)).err());
            let b = s.spawn(|| TcpTransport::connect(&store, &config(1, 3)).err());
            (a.join().unwrap(), b.join().unwrap())
        });
        let e = a.expect("rank 0 must refuse");
        assert!(e.to_string().contains("world size 3"), "{e}");
        assert!(b.is_some());
    }
}
