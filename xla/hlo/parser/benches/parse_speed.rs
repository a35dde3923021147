//! Parse-speed benchmark: our parser's MB/s on the largest modules in
//! ../shared/xla-hlo, beside XLA's own C++ parser (jaxlib's
//! `hlo_module_from_text`) timed on the same files in the same run.
//! Prints a table; asserts nothing (benchmarks report, tests assert).
//!
//! Run: `cargo bench -p xla-hlo-parser --bench parse_speed`

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

const XLA_TIMER: &str = r#"
import sys, time
from jax._src.lib import xla_client
parse = xla_client.hlo.hlo_module_from_text
for path in sys.argv[1:]:
    text = open(path).read()
    best = float("inf")
    deadline = time.perf_counter() + 2.0
    runs = 0
    while runs < 3 or time.perf_counter() < deadline:
        t = time.perf_counter(); parse(text); best = min(best, time.perf_counter() - t); runs += 1
    print(path, best)
"#;

fn shared_dir() -> PathBuf {
    xla_test_paths::checkout_root().join("../shared/xla-hlo")
}

/// Best-of time to parse `text` over about one second.
fn time_ours(text: &str) -> Duration {
    let mut best = Duration::MAX;
    let deadline = Instant::now() + Duration::from_secs(1);
    let mut runs = 0;
    while runs < 3 || Instant::now() < deadline {
        let t = Instant::now();
        let m = xla_hlo_parser::parse_module(text).expect("benchmark input parses");
        best = best.min(t.elapsed());
        std::hint::black_box(m);
        runs += 1;
    }
    best
}

/// XLA's parse times per file, or None when jaxlib is not installed.
fn time_xla(files: &[PathBuf]) -> Option<Vec<f64>> {
    let out = Command::new("python3")
        .arg("-c")
        .arg(XLA_TIMER)
        .args(files)
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect()
}

fn main() {
    let dir = shared_dir();
    let Ok(entries) = std::fs::read_dir(&dir) else {
        println!("parse_speed: {} not found; skipping", dir.display());
        return;
    };
    let mut files: Vec<(u64, PathBuf)> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "hlo"))
        .map(|p| (std::fs::metadata(&p).map(|m| m.len()).unwrap_or(0), p))
        .collect();
    files.sort_by_key(|f| std::cmp::Reverse(f.0));
    files.truncate(4);
    let paths: Vec<PathBuf> = files.iter().map(|f| f.1.clone()).collect();
    let xla = time_xla(&paths);
    if xla.is_none() {
        println!("(jaxlib not installed: XLA's parser not timed)");
    }
    println!(
        "{:<58} {:>9} {:>10} {:>10} {:>8}",
        "file", "MB", "ours MB/s", "XLA MB/s", "ratio"
    );
    for (i, (size, path)) in files.iter().enumerate() {
        let text = std::fs::read_to_string(path).expect("readable");
        let mb = *size as f64 / 1e6;
        let ours = mb / time_ours(&text).as_secs_f64();
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        match xla.as_ref().and_then(|x| x.get(i)) {
            Some(&secs) => {
                let theirs = mb / secs;
                println!(
                    "{name:<58} {mb:>9.3} {ours:>10.1} {theirs:>10.1} {:>7.1}x",
                    ours / theirs
                )
            }
            None => println!("{name:<58} {mb:>9.3} {ours:>10.1} {:>10} {:>8}", "-", "-"),
        }
    }
}
