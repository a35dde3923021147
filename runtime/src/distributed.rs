//! Running one SPMD executable across processes: each of P processes owns
//! N/P consecutive devices (process `i` devices `i*N/P ..`), runs them as
//! threads, and talks to every other device over TCP (the CPU fallback;
//! NCCL's unique-id exchange uses the same store on GPUs).
//!
//! Bootstrap, through the coordinator (our TCP key-value store, hosted by
//! process 0 or run separately as `kv_store_server`):
//! 1. every process publishes `<job>/process/<i>` = its process count, device
//!    count and the fingerprint of its program and arguments, and reads every
//!    other's; a different process count, device count or fingerprint is
//!    refused before anything runs, naming the process;
//! 2. every device joins the TCP world (`collectives::tcp`);
//! 3. devices run; every device sends its results to device 0, whose
//!    process assembles the global results.
//!
//! Invariants: every wait is bounded by the timeout; a process that dies
//! mid-run (its sockets close) makes every device waiting on it fail at
//! once with an error naming the lost device and its process; only process
//! 0 returns results.

use crate::backend::{DeviceCommunicator, Executable};
use crate::error::{first_failure, RuntimeError};
use crate::launcher::{assemble_results, split_arguments, LaunchPlan};
use crate::literal::Literal;
use collectives::{
    KeyValueStore, StagedCommunicator, TcpConfig, TcpStore, TcpStoreServer, TcpTransport, Transport,
};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// This process's place in a multi-process run.
#[derive(Clone, Debug)]
pub struct ProcessGroup {
    pub num_processes: usize,
    pub process_id: usize,
    /// `HOST:PORT` of the coordinator (key-value store).
    pub coordinator: String,
    /// Process 0 starts the coordinator at that address (otherwise it runs
    /// separately, e.g. `kv_store_server` or `run_hlo_module --spawn-local`).
    pub host_coordinator: bool,
    /// Address this process's devices listen on for their peers.
    pub bind_host: String,
    /// Bound on joining and on every wait for a peer.
    pub timeout: Duration,
    /// Key prefix in the store: one per run.
    pub job: String,
    /// What devices' collectives go through.
    pub transport: CollectivesTransport,
}

/// What every process must agree on.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Membership {
    num_processes: usize,
    num_devices: usize,
    fingerprint: u64,
}

impl Membership {
    fn encode(&self) -> String {
        format!(
            "{} {} {:016x}",
            self.num_processes, self.num_devices, self.fingerprint
        )
    }

    fn decode(text: &[u8]) -> Option<Membership> {
        let text = std::str::from_utf8(text).ok()?;
        let mut words = text.split(' ');
        Some(Membership {
            num_processes: words.next()?.parse().ok()?,
            num_devices: words.next()?.parse().ok()?,
            fingerprint: u64::from_str_radix(words.next()?, 16).ok()?,
        })
    }
}

fn err(message: impl Into<String>) -> RuntimeError {
    RuntimeError::Distributed(message.into())
}

/// A 64-bit FNV-1a hash, for program fingerprints.
pub fn fingerprint(parts: &[&[u8]]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for part in parts {
        for &b in part.iter() {
            h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
        h = (h ^ 0xff).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Runs `exe` on this process's share of `plan.num_partitions` devices;
/// process 0 returns the global results, the others `None`. `fingerprint`
/// identifies the program and arguments; every process must give the same.
pub fn run_spmd_processes(
    exe: &dyn Executable,
    global_args: &[Literal],
    plan: &LaunchPlan,
    group: &ProcessGroup,
    fingerprint: u64,
) -> Result<Option<Vec<Literal>>, RuntimeError> {
    let (p, id) = (group.num_processes, group.process_id);
    let n = plan.num_partitions.max(1);
    if p == 0 || id >= p {
        return Err(err(format!(
            "process id {id} is out of range for {p} processes"
        )));
    }
    if n % p != 0 {
        return Err(err(format!(
            "{n} devices do not divide evenly among {p} processes"
        )));
    }
    split_arguments(global_args, plan, 0)?;
    let _server = if group.host_coordinator && id == 0 {
        Some(
            TcpStoreServer::bind(group.coordinator.as_str()).map_err(|e| {
                err(format!(
                    "process 0 cannot start the coordinator at {}: {e}",
                    group.coordinator
                ))
            })?,
        )
    } else {
        None
    };
    let store = TcpStore::connect(group.coordinator.as_str(), group.timeout).map_err(|e| {
        err(format!(
            "process {id} cannot reach the coordinator at {}: {e}",
            group.coordinator
        ))
    })?;
    let me = Membership {
        num_processes: p,
        num_devices: n,
        fingerprint,
    };
    join(&store, group, &me)?;
    let per_process = n / p;
    let devices: Vec<usize> = (id * per_process..(id + 1) * per_process).collect();
    let outcomes: Vec<Result<Option<Vec<Literal>>, RuntimeError>> = std::thread::scope(|s| {
        let handles: Vec<_> = devices
            .iter()
            .map(|&device| {
                let store = &store;
                s.spawn(move || {
                    run_device(exe, global_args, plan, group, store, device, per_process)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(RuntimeError::Devices("a device thread panicked".into()))
                })
            })
            .collect()
    });
    let outcomes: Vec<_> = outcomes
        .into_iter()
        .map(|r| match r {
            Ok(v) => collectives::DeviceOutcome::Done(v),
            Err(e) => collectives::DeviceOutcome::Failed(e),
        })
        .collect();
    let mut results = first_failure(outcomes)?;
    Ok(match results.first_mut().and_then(Option::take) {
        Some(per_device) => Some(assemble_results(&per_device_split(per_device, n), plan)?),
        None => None,
    })
}

/// Publishes this process's membership and checks every other's.
fn join(store: &TcpStore, group: &ProcessGroup, me: &Membership) -> Result<(), RuntimeError> {
    let (p, id) = (group.num_processes, group.process_id);
    let claimed = store
        .add(&format!("{}/claim/{id}", group.job), 1)
        .map_err(|e| err(format!("coordinator: {e}")))?;
    if claimed > 1 {
        return Err(err(format!(
            "process id {id} is taken: another process of job {:?} joined with it",
            group.job
        )));
    }
    store
        .set(
            &format!("{}/process/{id}", group.job),
            me.encode().as_bytes(),
        )
        .map_err(|e| err(format!("coordinator: {e}")))?;
    let deadline = Instant::now() + group.timeout;
    for other in 0..p {
        if other == id {
            continue;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let text = store
            .get(&format!("{}/process/{other}", group.job), left)
            .map_err(|e| match e {
                collectives::StoreError::Timeout { .. } => err(format!(
                    "process {other} of {p} did not join within {:?} (were {p} processes started, with the same --num-processes?)",
                    group.timeout
                )),
                e => err(format!("coordinator: {e}")),
            })?;
        let theirs = Membership::decode(&text).ok_or_else(|| {
            err(format!(
                "process {other} published an unreadable membership"
            ))
        })?;
        if theirs.num_processes != me.num_processes {
            return Err(err(format!(
                "process {other} was started for {} processes, process {id} for {}",
                theirs.num_processes, me.num_processes
            )));
        }
        if theirs.num_devices != me.num_devices {
            return Err(err(format!(
                "process {other} runs {} devices, process {id} {}",
                theirs.num_devices, me.num_devices
            )));
        }
        if theirs.fingerprint != me.fingerprint {
            return Err(err(format!(
                "process {other} holds a different program or arguments (fingerprint {:016x}, process {id} has {:016x})",
                theirs.fingerprint, me.fingerprint
            )));
        }
    }
    Ok(())
}

/// The transport devices of a multi-process run talk through.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CollectivesTransport {
    /// The pure-Rust fallback: TCP sockets between every pair of devices.
    #[default]
    Tcp,
    /// NCCL, one GPU per device (the process's `k`-th device drives local
    /// GPU `k`), the communicator id exchanged through the coordinator.
    /// Needs the `nccl` feature.
    Nccl,
}

/// One device: join the world, run, send the results to device 0 (which
/// returns every device's results, flattened to leaves).
fn run_device(
    exe: &dyn Executable,
    global_args: &[Literal],
    plan: &LaunchPlan,
    group: &ProcessGroup,
    store: &TcpStore,
    device: usize,
    per_process: usize,
) -> Result<Option<Vec<Literal>>, RuntimeError> {
    let n = plan.num_partitions.max(1);
    // A connection of its own: a store connection serves one request at a
    // time, and a device blocked reading a peer's address must not keep
    // another device of this process from publishing its own.
    let store = TcpStore::connect(store.server_addr(), group.timeout)
        .map_err(|e| err(format!("device {device}: coordinator: {e}")))?;
    let joining =
        |e: collectives::CollectiveError| err(format!("device {device} joining the others: {e}"));
    match group.transport {
        CollectivesTransport::Tcp => {
            let transport = TcpTransport::connect(
                &store,
                &TcpConfig {
                    prefix: format!("{}/devices", group.job),
                    rank: device,
                    world_size: n,
                    bind_host: group.bind_host.clone(),
                    timeout: group.timeout,
                    ranks_per_process: per_process,
                },
            )
            .map_err(joining)?;
            run_on(exe, global_args, plan, device, transport)
        }
        #[cfg(feature = "nccl")]
        CollectivesTransport::Nccl => {
            let transport = collectives::nccl::NcclTransport::from_store(
                &store,
                &format!("{}/nccl", group.job),
                device,
                n,
                device % per_process.max(1),
                group.timeout,
            )
            .map_err(joining)?;
            run_on(exe, global_args, plan, device, transport)
        }
        #[cfg(not(feature = "nccl"))]
        CollectivesTransport::Nccl => {
            let _ = joining;
            Err(err(
                "NCCL collectives are not in this build (build with the `nccl` feature; needs libnccl.so and a GPU per device at run time)",
            ))
        }
    }
}

/// Runs device `device` with collectives over `transport`, then gathers
/// every device's results on device 0.
fn run_on<T: Transport + Send + 'static>(
    exe: &dyn Executable,
    global_args: &[Literal],
    plan: &LaunchPlan,
    device: usize,
    transport: T,
) -> Result<Option<Vec<Literal>>, RuntimeError> {
    let n = plan.num_partitions.max(1);
    let communicator = Mutex::new(StagedCommunicator::new(transport));
    let ctx = crate::launcher::device_context(device, plan, &communicator as &DeviceCommunicator);
    let args = split_arguments(global_args, plan, device as i64)?;
    let outputs = exe.execute(&ctx, &args)?;
    let mut transport = communicator.into_inner().unwrap_or_else(|e| e.into_inner());
    let transport = transport.transport_mut();
    let leaves: Vec<&collectives::DeviceBuffer> = outputs.iter().flat_map(|v| v.leaves()).collect();
    let collective_err = |e: collectives::CollectiveError| RuntimeError::Execute {
        backend: "collectives",
        peer_failed: matches!(e, collectives::CollectiveError::PeerLost { .. }),
        message: format!("gathering results on device 0: {e}"),
    };
    if device != 0 {
        let sends: Vec<(usize, &[u8])> = leaves.iter().map(|b| (0, b.bytes())).collect();
        transport.exchange(&sends, &[]).map_err(collective_err)?;
        return Ok(None);
    }
    // Every device's leaves have this device's shapes (one SPMD program).
    let recvs: Vec<(usize, usize)> = (1..n)
        .flat_map(|d| leaves.iter().map(move |b| (d, b.bytes().len())))
        .collect();
    let received = transport.exchange(&[], &recvs).map_err(collective_err)?;
    let mut all: Vec<Literal> = Vec::with_capacity(n * leaves.len());
    all.extend(leaves.iter().map(|b| Literal::Array((*b).clone())));
    for (k, bytes) in received.iter().enumerate() {
        let like = &leaves[k % leaves.len()];
        let buffer =
            collectives::DeviceBuffer::from_bytes(like.dtype(), like.dims().to_vec(), bytes)
                .map_err(|e| {
                    err(format!(
                        "result {k} received from device {}: {e}",
                        k / leaves.len() + 1
                    ))
                })?;
        all.push(Literal::Array(buffer));
    }
    Ok(Some(all))
}

/// Every device's leaves, from device 0's flat list of all of them.
fn per_device_split(all: Vec<Literal>, n: usize) -> Vec<Vec<Literal>> {
    let per = all.len() / n.max(1);
    let mut out: Vec<Vec<Literal>> = Vec::with_capacity(n);
    let mut it = all.into_iter();
    for _ in 0..n {
        out.push(it.by_ref().take(per).collect());
    }
    out
}
