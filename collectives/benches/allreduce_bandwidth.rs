//! Loopback all-reduce bandwidth: R ranks (threads) each all-reduce (sum) an
//! f32 buffer of M MiB; reported as bus bandwidth (nccl-tests' definition:
//! `size * 2 * (R - 1) / R / time`) next to this machine's single-thread
//! memcpy bandwidth (`size / time` of `copy_from_slice` between two
//! pre-touched buffers), measured in the same run, and their ratio.
//!
//! Run: `cargo bench -p collectives --bench allreduce_bandwidth`.
//! Environment: `COLLECTIVES_BENCH_RANKS` (8), `COLLECTIVES_BENCH_MIB` (64),
//! `COLLECTIVES_BENCH_ITERS` (20). The result is checked, so a fast but
//! wrong all-reduce cannot pass; the process exits non-zero on any error.

use collectives::{Communicator, DeviceBuffer, LoopbackWorld, ReductionKind};
use std::sync::Barrier;
use std::time::{Duration, Instant};

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

/// Times `iters` single-thread memcpys and `iters` `ranks`-way all-reduces
/// of `bytes` bytes per rank, interleaved (memcpy, all-reduce, memcpy, ...)
/// so that both see the same load on a shared machine. Returns per-iteration
/// (memcpy seconds, all-reduce seconds from first call to last return).
fn measure(ranks: usize, bytes: usize, iters: usize) -> Result<Vec<(f64, f64)>, String> {
    let world = LoopbackWorld::new(ranks, Duration::from_secs(120)).map_err(|e| e.to_string())?;
    let comms = world.communicators().map_err(|e| e.to_string())?;
    let group: Vec<usize> = (0..ranks).collect();
    let n = bytes / 4;
    // The main thread (memcpy) and every rank meet here twice per iteration.
    let line = Barrier::new(ranks + 1);
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .enumerate()
            .map(|(r, mut comm)| {
                let (group, line) = (&group, &line);
                s.spawn(move || -> Result<Vec<(Instant, Instant)>, String> {
                    let data: Vec<f32> = (0..n).map(|i| ((i + r) % 7) as f32).collect();
                    let input = DeviceBuffer::from_slice(vec![n as i64], &data)
                        .map_err(|e| e.to_string())?;
                    drop(data);
                    let mut spans = Vec::new();
                    // One warm-up call (checked), then the timed ones.
                    for it in 0..=iters {
                        line.wait();
                        let t0 = Instant::now();
                        let out = comm
                            .all_reduce(group, ReductionKind::Sum, std::slice::from_ref(&input))
                            .map_err(|e| e.to_string());
                        let t1 = Instant::now();
                        line.wait();
                        let out = out?;
                        if it == 0 {
                            let v = out[0].typed::<f32>().ok_or("result is not f32")?;
                            for i in [0, 1, n / 2, n - 1] {
                                let want: f32 = (0..ranks).map(|q| ((i + q) % 7) as f32).sum();
                                if v[i] != want {
                                    return Err(format!("element {i}: {} != {want}", v[i]));
                                }
                            }
                        } else {
                            spans.push((t0, t1));
                        }
                    }
                    Ok(spans)
                })
            })
            .collect();
        let src: Vec<u8> = (0..bytes).map(|i| (i * 31 % 251) as u8).collect();
        let mut dst = vec![1u8; bytes];
        dst.copy_from_slice(&src); // warm-up, touches every page
        let mut copies = Vec::new();
        for _ in 0..=iters {
            let t = Instant::now();
            dst.copy_from_slice(std::hint::black_box(&src));
            std::hint::black_box(&mut dst);
            copies.push(t.elapsed().as_secs_f64());
            line.wait(); // start the all-reduce
            line.wait(); // and wait for it
        }
        let spans: Vec<Vec<(Instant, Instant)>> = handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("thread panicked".into())))
            .collect::<Result<_, _>>()?;
        Ok((0..iters)
            .map(|it| {
                let start = spans
                    .iter()
                    .map(|s| s[it].0)
                    .min()
                    .unwrap_or_else(Instant::now);
                let end = spans.iter().map(|s| s[it].1).max().unwrap_or(start);
                (copies[it + 1], (end - start).as_secs_f64())
            })
            .collect())
    })
}

fn main() {
    let ranks = env_usize("COLLECTIVES_BENCH_RANKS", 8);
    let mib = env_usize("COLLECTIVES_BENCH_MIB", 64);
    let iters = env_usize("COLLECTIVES_BENCH_ITERS", 20);
    let bytes = mib << 20;
    let gb = |b: f64, s: f64| b / s / 1e9;

    let pairs = match measure(ranks, bytes, iters) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("allreduce_bandwidth: {e}");
            std::process::exit(1);
        }
    };
    let best = |v: Vec<f64>| v.iter().cloned().fold(f64::INFINITY, f64::min);
    let copies: Vec<f64> = pairs.iter().map(|p| p.0).collect();
    let reduces: Vec<f64> = pairs.iter().map(|p| p.1).collect();
    let (mc_best, mc_median) = (best(copies.clone()), median(copies));
    let (ar_best, ar_median) = (best(reduces.clone()), median(reduces));
    let bus_factor = 2.0 * (ranks as f64 - 1.0) / ranks as f64;
    let bus_best = gb(bytes as f64 * bus_factor, ar_best);
    let bus_median = gb(bytes as f64 * bus_factor, ar_median);
    let memcpy_best = gb(bytes as f64, mc_best);
    let memcpy_median = gb(bytes as f64, mc_median);
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    println!("loopback all-reduce (sum, f32), {ranks} ranks x {mib} MiB, {iters} iterations, {cores} cores");
    println!(
        "  all-reduce time     best {:8.2} ms   median {:8.2} ms",
        ar_best * 1e3,
        ar_median * 1e3
    );
    println!(
        "  algorithm bandwidth best {:8.2} GB/s",
        gb(bytes as f64, ar_best)
    );
    println!("  bus bandwidth       best {bus_best:8.2} GB/s   median {bus_median:8.2} GB/s");
    println!("  memcpy (1 thread)   best {memcpy_best:8.2} GB/s   median {memcpy_median:8.2} GB/s");
    // Ratio of each all-reduce to the memcpy just before it.
    let pair_ratios: Vec<f64> = pairs
        .iter()
        .map(|&(mc, ar)| gb(bytes as f64 * bus_factor, ar) / gb(bytes as f64, mc))
        .collect();
    println!(
        "  ratio bus/memcpy    best {:8.2}          median {:8.2}   median of pairs {:.2}   (target >= 0.5)",
        bus_best / memcpy_best,
        bus_median / memcpy_median,
        median(pair_ratios)
    );
}
