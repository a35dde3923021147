//! Cross-process all-reduce bandwidth over TCP on 127.0.0.1: R processes
//! (this binary re-run as children) join a `TcpTransport` world through a
//! `TcpStoreServer` in the parent and all-reduce (sum) an f32 buffer of M
//! MiB; reported as bus bandwidth (nccl-tests' `size * 2 * (R - 1) / R /
//! time`, time from the earliest start to the latest return) beside a
//! plain single-stream TCP copy of the same size between two processes,
//! measured in the same run (copy, all-reduce, copy, ...), and their ratio.
//!
//! Run: `cargo bench -p collectives --bench tcp_allreduce_bandwidth`.
//! Environment: `COLLECTIVES_BENCH_RANKS` (2), `COLLECTIVES_BENCH_MIB` (64),
//! `COLLECTIVES_BENCH_ITERS` (10), `COLLECTIVES_BENCH_ROUNDS` (3: each round
//! is one copy measurement and one all-reduce measurement). The all-reduce
//! result is checked; any error exits non-zero. The in-process loopback
//! figure beside memcpy is `--bench allreduce_bandwidth`.

use collectives::{
    Communicator, DeviceBuffer, KeyValueStore, ReductionKind, StagedCommunicator, TcpConfig,
    TcpStore, TcpStoreServer, TcpTransport,
};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const ROLE: &str = "TCP_BENCH_ROLE";
const STORE: &str = "TCP_BENCH_STORE";
const RANK: &str = "TCP_BENCH_RANK";
const PREFIX: &str = "TCP_BENCH_PREFIX";
const TIMEOUT: Duration = Duration::from_secs(120);

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&v| v > 0)
        .unwrap_or(default)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

type BenchResult<T> = Result<T, String>;

fn fail(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Child: receives `iters` copies of `bytes` over one TCP stream; prints
/// each copy's seconds (from its "go" byte to the last byte received).
fn copy_receiver(store: &TcpStore, prefix: &str, bytes: usize, iters: usize) -> BenchResult<()> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(fail)?;
    let addr = listener.local_addr().map_err(fail)?.to_string();
    store
        .set(&format!("{prefix}/copy"), addr.as_bytes())
        .map_err(fail)?;
    let (mut stream, _) = listener.accept().map_err(fail)?;
    stream.set_nodelay(true).map_err(fail)?;
    let mut buf = vec![0u8; bytes];
    let mut times = Vec::new();
    for _ in 0..=iters {
        let t = Instant::now();
        stream.write_all(&[1]).map_err(fail)?;
        stream.read_exact(&mut buf).map_err(fail)?;
        times.push(t.elapsed().as_secs_f64());
    }
    if buf[bytes - 1] != ((bytes - 1) * 31 % 251) as u8 {
        return Err("copy: wrong bytes received".into());
    }
    print_times(&times[1..]);
    Ok(())
}

/// Child: sends `iters` copies of `bytes`, each after the receiver's "go".
fn copy_sender(store: &TcpStore, prefix: &str, bytes: usize, iters: usize) -> BenchResult<()> {
    let addr = store
        .get(&format!("{prefix}/copy"), TIMEOUT)
        .map_err(fail)?;
    let mut stream = TcpStream::connect(String::from_utf8_lossy(&addr).as_ref()).map_err(fail)?;
    stream.set_nodelay(true).map_err(fail)?;
    let data: Vec<u8> = (0..bytes).map(|i| (i * 31 % 251) as u8).collect();
    let mut go = [0u8; 1];
    for _ in 0..=iters {
        stream.read_exact(&mut go).map_err(fail)?;
        stream.write_all(&data).map_err(fail)?;
    }
    Ok(())
}

/// Child: one rank of the all-reduce world; prints each iteration's
/// (start, end) as seconds since a common barrier.
fn all_reduce_rank(
    store: &TcpStore,
    prefix: &str,
    rank: usize,
    ranks: usize,
    bytes: usize,
    iters: usize,
) -> BenchResult<()> {
    let transport = TcpTransport::connect(
        store,
        &TcpConfig {
            prefix: format!("{prefix}/world"),
            rank,
            world_size: ranks,
            bind_host: "127.0.0.1".into(),
            timeout: TIMEOUT,
            ranks_per_process: 1,
        },
    )
    .map_err(fail)?;
    let mut comm = StagedCommunicator::new(transport);
    let group: Vec<usize> = (0..ranks).collect();
    let n = bytes / 4;
    let data: Vec<f32> = (0..n).map(|i| ((i + rank) % 7) as f32).collect();
    let input = DeviceBuffer::from_slice(vec![n as i64], &data).map_err(fail)?;
    drop(data);
    let token = DeviceBuffer::from_slice(vec![1], &[0f32]).map_err(fail)?;
    let mut times = Vec::new();
    for it in 0..=iters {
        // A one-element all-reduce lines the ranks up.
        comm.all_reduce(&group, ReductionKind::Sum, std::slice::from_ref(&token))
            .map_err(fail)?;
        let t = Instant::now();
        let out = comm
            .all_reduce(&group, ReductionKind::Sum, std::slice::from_ref(&input))
            .map_err(fail)?;
        let took = t.elapsed().as_secs_f64();
        if it == 0 {
            let v = out[0].typed::<f32>().ok_or("result is not f32")?;
            for i in [0, 1, n / 2, n - 1] {
                let want: f32 = (0..ranks).map(|q| ((i + q) % 7) as f32).sum();
                if v[i] != want {
                    return Err(format!("element {i}: {} != {want}", v[i]));
                }
            }
        } else {
            times.push(took);
        }
    }
    print_times(&times);
    Ok(())
}

fn print_times(times: &[f64]) {
    let words: Vec<String> = times.iter().map(|t| format!("{t:.9}")).collect();
    println!("TIMES {}", words.join(" "));
}

fn child(role: &str, bytes: usize, iters: usize) -> BenchResult<()> {
    let store_addr = std::env::var(STORE).map_err(fail)?;
    let prefix = std::env::var(PREFIX).map_err(fail)?;
    let store = TcpStore::connect(store_addr.as_str(), TIMEOUT).map_err(fail)?;
    match role {
        "copy-recv" => copy_receiver(&store, &prefix, bytes, iters),
        "copy-send" => copy_sender(&store, &prefix, bytes, iters),
        "allreduce" => {
            let rank = env_usize(RANK, 0);
            let ranks = env_usize("COLLECTIVES_BENCH_RANKS", 2);
            all_reduce_rank(&store, &prefix, rank, ranks, bytes, iters)
        }
        other => Err(format!("unknown role {other}")),
    }
}

/// Runs children with the given (role, rank) and returns each one's times.
fn run_children(
    server: &TcpStoreServer,
    prefix: &str,
    roles: &[(&str, usize)],
) -> BenchResult<Vec<Vec<f64>>> {
    let exe = std::env::current_exe().map_err(fail)?;
    let mut children = Vec::new();
    for &(role, rank) in roles {
        let child = Command::new(&exe)
            .env(ROLE, role)
            .env(STORE, server.local_addr().to_string())
            .env(PREFIX, prefix)
            .env(RANK, rank.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(fail)?;
        children.push(child);
    }
    let mut all = Vec::new();
    for (mut c, (role, rank)) in children.into_iter().zip(roles) {
        let mut times = Vec::new();
        if let Some(out) = c.stdout.take() {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if let Some(rest) = line.strip_prefix("TIMES ") {
                    times = rest.split(' ').filter_map(|w| w.parse().ok()).collect();
                }
            }
        }
        let status = c.wait().map_err(fail)?;
        if !status.success() {
            return Err(format!("{role} {rank} failed: {status}"));
        }
        all.push(times);
    }
    Ok(all)
}

fn main() {
    let ranks = env_usize("COLLECTIVES_BENCH_RANKS", 2);
    let mib = env_usize("COLLECTIVES_BENCH_MIB", 64);
    let iters = env_usize("COLLECTIVES_BENCH_ITERS", 10);
    let rounds = env_usize("COLLECTIVES_BENCH_ROUNDS", 3);
    let bytes = mib << 20;
    if let Ok(role) = std::env::var(ROLE) {
        if let Err(e) = child(&role, bytes, iters) {
            eprintln!("tcp_allreduce_bandwidth ({role}): {e}");
            std::process::exit(1);
        }
        return;
    }
    let result = (|| -> BenchResult<(Vec<f64>, Vec<f64>)> {
        let server = TcpStoreServer::bind("127.0.0.1:0").map_err(fail)?;
        let (mut copies, mut reduces) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            let c = run_children(
                &server,
                &format!("copy{round}"),
                &[("copy-recv", 0), ("copy-send", 1)],
            )?;
            copies.extend(c[0].iter().copied());
            let roles: Vec<(&str, usize)> = (0..ranks).map(|r| ("allreduce", r)).collect();
            let per_rank = run_children(&server, &format!("allreduce{round}"), &roles)?;
            for it in 0..iters {
                let slowest = per_rank
                    .iter()
                    .filter_map(|t| t.get(it).copied())
                    .fold(0.0, f64::max);
                reduces.push(slowest);
            }
        }
        Ok((copies, reduces))
    })();
    let (copies, reduces) = match result {
        Ok(r) => r,
        Err(e) => {
            eprintln!("tcp_allreduce_bandwidth: {e}");
            std::process::exit(1);
        }
    };
    let gb = |b: f64, s: f64| b / s / 1e9;
    let best = |v: &[f64]| v.iter().cloned().fold(f64::INFINITY, f64::min);
    let bus_factor = 2.0 * (ranks as f64 - 1.0) / ranks as f64;
    let size = bytes as f64;
    let (copy_best, copy_median) = (gb(size, best(&copies)), gb(size, median(copies.clone())));
    let (bus_best, bus_median) = (
        gb(size * bus_factor, best(&reduces)),
        gb(size * bus_factor, median(reduces.clone())),
    );
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    println!(
        "cross-process all-reduce over TCP (sum, f32), {ranks} processes x {mib} MiB, {rounds} rounds x {iters} iterations, {cores} cores"
    );
    println!(
        "  all-reduce time       best {:8.2} ms   median {:8.2} ms",
        best(&reduces) * 1e3,
        median(reduces.clone()) * 1e3
    );
    println!("  bus bandwidth         best {bus_best:8.2} GB/s   median {bus_median:8.2} GB/s");
    println!("  TCP copy (1 stream)   best {copy_best:8.2} GB/s   median {copy_median:8.2} GB/s");
    println!(
        "  ratio bus/TCP copy    best {:8.2}          median {:8.2}   (target >= 0.5)",
        bus_best / copy_best,
        bus_median / copy_median
    );
}
