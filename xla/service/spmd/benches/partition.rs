//! Benchmark: SPMD partitioning time (after sharding propagation, which is
//! not timed) on the MaxText training step of ../shared/xla-hlo (for XLA's
//! partitioner beside ours in one run, see tools/testdata_gen/
//! xla_pass_speed.py), the DeepSeek step of
//! ../shared/xla-hlo-more and the largest corpus modules, at the module's
//! own count, 64, 512 and 2048 partitions (the last column: time over the
//! time at 64). For other partition counts
//! than the module's, every iota tile assignment over the module's devices
//! is rescaled: the tile dim equal to the old count takes the new count, so
//! an 8-way batch sharding becomes an N-way one.
//!
//! Run: `cargo bench -p xla-spmd-partitioner --bench partition`
//! (`BENCH_FILTER=maxtext` to pick modules, `BENCH_N=2048` one count,
//! `BENCH_FINGERPRINT=1` a hash of each partitioned module's text).
//! Absent files are skipped.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use xla_hlo_ir::sharding::{ShardingKind, TileAssignment};
use xla_hlo_ir::{HloModule, HloSharding};
use xla_hlo_pass::Pass;
use xla_spmd_partitioner::{partition_module, SpmdOptions};

fn shared() -> PathBuf {
    xla_test_paths::checkout_root().join("../shared")
}

fn load(path: &Path) -> Option<HloModule> {
    let text = std::fs::read_to_string(path).ok()?;
    match xla_hlo_parser::parse_module(&text) {
        Ok(m) => Some(m),
        Err(e) => {
            eprintln!("skip {}: {e}", path.display());
            None
        }
    }
}

/// Rescales an iota tile assignment over `old` devices to `new` devices:
/// the first tile dim gains a major factor `new / old`.
fn rescale(s: &mut HloSharding, old: i64, new: i64) {
    let k = new / old;
    let leaves: Vec<&mut xla_hlo_ir::SingleSharding> = match s {
        HloSharding::Single(x) => vec![x],
        HloSharding::Tuple(v) => v.iter_mut().collect(),
    };
    for leaf in leaves {
        if let ShardingKind::Tiled {
            tile_assignment:
                TileAssignment::Iota {
                    dims,
                    reshape_dims,
                    perm,
                },
            ..
        } = &mut leaf.kind
        {
            if reshape_dims.iter().product::<i64>() != old || dims.is_empty() || k <= 1 {
                continue;
            }
            dims[0] *= k;
            let r = reshape_dims.len();
            let mut p: Vec<i64> = vec![0];
            if perm.is_empty() {
                p.extend(1..=r as i64);
            } else {
                p.extend(perm.iter().map(|&x| x + 1));
            }
            reshape_dims.insert(0, k);
            *perm = if p.iter().enumerate().all(|(i, &x)| i as i64 == x) {
                vec![]
            } else {
                p
            };
        }
    }
}

/// The device count the module's shardings use (its `num_partitions`
/// unless the header leaves it out).
fn devices_used(m: &HloModule) -> i64 {
    let mut n = m.num_partitions();
    for c in &m.computations {
        for i in &c.instructions {
            for leaf in i.sharding.iter().flat_map(|s| s.leaves()) {
                if let ShardingKind::Tiled {
                    tile_assignment, ..
                } = &leaf.kind
                {
                    n = n.max(tile_assignment.num_tiles());
                }
            }
        }
    }
    n
}

/// The module with its shardings rescaled from `old` to `new` partitions.
fn with_partitions(m: &HloModule, new: i64) -> HloModule {
    let old = devices_used(m);
    let mut m = m.clone();
    if old != new {
        for c in m.computations.iter_mut() {
            for i in c.instructions.iter_mut() {
                if let Some(s) = i.sharding.as_mut() {
                    rescale(std::sync::Arc::make_mut(s), old, new);
                }
            }
        }
    }
    m.config.num_partitions = Some(new);
    m
}

fn time(module: &HloModule) -> Result<(Duration, Duration, usize), String> {
    let mut samples = Vec::new();
    let budget = Instant::now();
    while samples.len() < 3
        || (budget.elapsed() < Duration::from_millis(1500) && samples.len() < 100)
    {
        let mut m = module.clone();
        let t = Instant::now();
        partition_module(&mut m, &SpmdOptions::default()).map_err(|e| e.to_string())?;
        samples.push(t.elapsed());
    }
    samples.sort();
    Ok((samples[0], samples[samples.len() / 2], samples.len()))
}

/// With `BENCH_FINGERPRINT` set: a hash of the partitioned module's text,
/// to check that a speed change leaves the output alone at every count.
fn print_fingerprint(name: &str, n: i64, module: &HloModule) {
    use std::hash::{Hash, Hasher};
    let mut m = module.clone();
    match partition_module(&mut m, &SpmdOptions::default()) {
        Ok(_) => {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            m.to_string().hash(&mut h);
            println!("fingerprint {name} N={n}: {:016x}", h.finish());
        }
        Err(e) => println!("fingerprint {name} N={n}: error {e}"),
    }
}

fn main() {
    let root = shared();
    let mut files: Vec<(String, PathBuf)> = vec![(
        "maxtext train_step".into(),
        root.join("xla-hlo/nv_maxtext_1n1g_jit_train_step_before_optimization.hlo"),
    )];
    files.push((
        "deepseek train_step".into(),
        root.join("xla-hlo-more/nv_maxtext_deepseek_1n4g_jit_train_step_before_optimization.hlo"),
    ));
    for case in [
        "perf_transformer_block",
        "transformer_block_tp",
        "deep_mlp_16",
    ] {
        files.push((
            format!("corpus {case}"),
            root.join(format!("corpus/cases/{case}/input.hlo")),
        ));
    }
    let filter = std::env::var("BENCH_FILTER").unwrap_or_default();
    println!(
        "{:<28} {:>7} {:>6} {:>10} {:>7}",
        "module", "instrs", "N", "ours (ms)", "vs N=64"
    );
    let mut any = false;
    for (name, path) in files {
        if !name.contains(&filter) {
            continue;
        }
        let Some(mut module) = load(&path) else {
            println!("{name:<28} (absent: {})", path.display());
            continue;
        };
        any = true;
        let mut prop = xla_sharding_propagation::ShardingPropagation::default();
        if let Err(e) = prop.run(&mut module) {
            println!("{name:<28} propagation failed: {e}");
            continue;
        }
        let n0 = devices_used(&module);
        let only: Option<i64> = std::env::var("BENCH_N").ok().and_then(|v| v.parse().ok());
        let mut at_64: Option<f64> = None;
        for n in [n0, 64, 512, 2048] {
            if only.is_some_and(|o| o != n) {
                continue;
            }
            let m = with_partitions(&module, n);
            if std::env::var_os("BENCH_FINGERPRINT").is_some() {
                print_fingerprint(&name, n, &m);
            }
            match time(&m) {
                Ok((t, median, runs)) => {
                    let ms = t.as_secs_f64() * 1e3;
                    if n == 64 {
                        at_64 = Some(ms);
                    }
                    let vs_64 = at_64.map_or("-".into(), |b| format!("{:.2}x", ms / b));
                    println!(
                        "{name:<28} {:>7} {n:>6} {ms:>10.3} {vs_64:>7}   (median {:.3} ms of {runs})",
                        m.instruction_count(),
                        median.as_secs_f64() * 1e3
                    );
                }
                Err(e) => println!("{name:<28} N={n}: {e}"),
            }
        }
    }
    if !any {
        println!("note: ../shared not found; nothing to benchmark");
    }
}
