//! Corpus helpers: regenerating entry arguments from a `case.json`'s
//! counter-based hash generators, checking outputs against an
//! `expected_summary`, and timing XLA (jaxlib) on the same module.
//!
//! Invariants: generated arguments are bit-identical to the corpus
//! generator (murmur3 fmix32 of `i + seed * 0x9E3779B9`); a summary check
//! matches only when every statistic and sample is within tolerance.

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value as Json};
use std::path::Path;
use xla_hlo_evaluator::{Array, Value};
use xla_hlo_ir::Shape;

/// The corpus hash of flat index `i` under `seed`.
pub fn hash_u32(i: u64, seed: u64) -> u32 {
    let mut x = (i as u32).wrapping_add((seed as u32).wrapping_mul(0x9E37_79B9));
    x ^= x >> 16;
    x = x.wrapping_mul(0x85EB_CA6B);
    x ^= x >> 13;
    x = x.wrapping_mul(0xC2B2_AE35);
    x ^= x >> 16;
    x
}

/// Regenerates argument `index` from the case's generator.
pub fn argument(case: &Json, index: usize, name: &str, shape: &Shape) -> Result<Array> {
    let arg = case["args"]
        .as_array()
        .and_then(|a| a.iter().find(|x| x["index"].as_u64() == Some(index as u64)))
        .ok_or_else(|| anyhow!("case.json has no argument {index} (parameter %{name})"))?;
    let s = shape
        .as_array()
        .ok_or_else(|| anyhow!("parameter {index} (%{name}) is not an array"))?;
    let n: usize = s.dims.iter().map(|&d| d.max(0) as usize).product();
    let g = &arg["generator"];
    let kind = g["kind"].as_str().unwrap_or("");
    let values: Vec<f64> = match kind {
        "hash_uniform_float" => {
            let seed = g["seed"]
                .as_u64()
                .ok_or_else(|| anyhow!("generator without seed"))?;
            let scale = g["scale"].as_f64().unwrap_or(1.0) as f32;
            (0..n)
                .map(|i| {
                    let x = hash_u32(i as u64, seed);
                    let u = (2.0 * (x >> 8) as f64 - 16777216.0) as f32 * (1.0f32 / 16777216.0);
                    (u * scale) as f64
                })
                .collect()
        }
        "hash_uniform_int" => {
            let seed = g["seed"]
                .as_u64()
                .ok_or_else(|| anyhow!("generator without seed"))?;
            let lo = g["lo"]
                .as_i64()
                .ok_or_else(|| anyhow!("generator without lo"))?;
            let hi = g["hi"]
                .as_i64()
                .ok_or_else(|| anyhow!("generator without hi"))?;
            let span = (hi - lo).max(1) as u64;
            (0..n)
                .map(|i| (lo + (hash_u32(i as u64, seed) as u64 % span) as i64) as f64)
                .collect()
        }
        "explicit" => match g.get("value").and_then(Json::as_f64) {
            Some(v) => vec![v; n],
            None => bail!(
                "argument {index} (%{name}) is explicit and only available from its .npy file"
            ),
        },
        other => bail!("unknown generator kind {other:?} for argument {index}"),
    };
    Ok(Array::from_f64s(s.element_type, s.dims.clone(), &values)?)
}

fn close(x: f64, y: f64, rtol: f64, atol: f64) -> bool {
    (x - y).abs() <= atol + rtol * y.abs()
}

/// Checks an output against `{sum, abs_sum, sq_sum, min, max, sample_flat_indices,
/// sample_values, first_values}`.
pub fn check_summary(index: usize, a: &Array, s: &Json, rtol: f64, atol: f64) -> Json {
    let v = a.to_f64_vec();
    let n = v.len() as f64;
    let sum: f64 = v.iter().sum();
    let abs_sum: f64 = v.iter().map(|x| x.abs()).sum();
    let sq_sum: f64 = v.iter().map(|x| x * x).sum();
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let get = |k: &str| s.get(k).and_then(Json::as_f64);
    let mut failures = Vec::new();
    let mut check = |what: &str, got: f64, exp: Option<f64>, tol: f64| {
        if let Some(e) = exp {
            if (got - e).abs() > tol || got.is_nan() {
                failures.push(json!({"stat": what, "got": got, "expected": e, "tol": tol}));
            }
        }
    };
    let exp_abs = get("abs_sum").unwrap_or(abs_sum);
    check("sum", sum, get("sum"), rtol * exp_abs + atol * n.sqrt());
    check(
        "abs_sum",
        abs_sum,
        get("abs_sum"),
        rtol * exp_abs + atol * n.sqrt(),
    );
    let exp_sq = get("sq_sum").unwrap_or(sq_sum);
    check(
        "sq_sum",
        sq_sum,
        get("sq_sum"),
        rtol * exp_sq + atol * n.sqrt(),
    );
    check(
        "min",
        min,
        get("min"),
        atol + rtol * get("min").unwrap_or(0.0).abs(),
    );
    check(
        "max",
        max,
        get("max"),
        atol + rtol * get("max").unwrap_or(0.0).abs(),
    );
    let mut max_abs = 0f64;
    let mut max_rel = 0f64;
    let mut sample = |pos: usize, exp: f64, what: &str, failures: &mut Vec<Json>| {
        let got = v.get(pos).copied().unwrap_or(f64::NAN);
        let d = (got - exp).abs();
        max_abs = max_abs.max(d);
        if exp != 0.0 {
            max_rel = max_rel.max(d / exp.abs());
        }
        if !close(got, exp, rtol, atol) {
            failures.push(json!({"stat": what, "flat_index": pos, "got": got, "expected": exp}));
        }
    };
    if let (Some(idx), Some(vals)) = (
        s.get("sample_flat_indices").and_then(Json::as_array),
        s.get("sample_values").and_then(Json::as_array),
    ) {
        for (i, e) in idx.iter().zip(vals) {
            if let (Some(i), Some(e)) = (i.as_u64(), e.as_f64()) {
                sample(i as usize, e, "sample", &mut failures);
            }
        }
    }
    if let Some(vals) = s.get("first_values").and_then(Json::as_array) {
        for (i, e) in vals.iter().enumerate() {
            if let Some(e) = e.as_f64() {
                sample(i, e, "first_value", &mut failures);
            }
        }
    }
    json!({
        "index": index,
        "shape": a.shape().to_string(),
        "summary": {"sum": sum, "abs_sum": abs_sum, "sq_sum": sq_sum, "min": min, "max": max},
        "max_abs_err": max_abs,
        "max_rel_err": max_rel,
        "matched": failures.is_empty(),
        "failures": failures,
    })
}

const XLA_BENCH_SCRIPT: &str = include_str!("../xla_bench.py");

/// Times XLA (jaxlib CPU) on `file` with `args` via the helper script;
/// returns the best wall time of one execution in seconds.
pub fn bench_xla(file: &Path, args: &[Value], repeat: usize) -> Result<f64> {
    let dir = std::env::temp_dir().join(format!("run_hlo_module_xla_{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    for (i, v) in args.iter().enumerate() {
        let a = v.as_array().ok_or_else(|| anyhow!("tuple argument"))?;
        xla_hlo_evaluator::npy::write_npy(&dir.join(format!("arg{i}.npy")), a)?;
    }
    // The script is part of the binary, so an installed or Bazel-built
    // binary does not depend on where its sources were.
    let script = dir.join("xla_bench.py");
    std::fs::write(&script, XLA_BENCH_SCRIPT)?;
    let out = std::process::Command::new("python3")
        .arg(&script)
        .arg(file)
        .arg(&dir)
        .arg(repeat.max(3).to_string())
        .output()
        .context("running python3 for the XLA benchmark")?;
    let _ = std::fs::remove_dir_all(&dir);
    if !out.status.success() {
        bail!(
            "XLA benchmark failed: {}",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("")
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .ok_or_else(|| anyhow!("XLA benchmark printed no result"))?;
    let j: Json = serde_json::from_str(line)?;
    j["xla_s"]
        .as_f64()
        .ok_or_else(|| anyhow!("XLA benchmark result without xla_s"))
}

/// A fake value for parameter `index` when no arguments are given (XLA's
/// `run_hlo_module` makes fake literals the same way): floats uniform in
/// [-1, 1), integers in [0, 8), predicates alternating by hash, all from the
/// corpus hash seeded by the parameter number, so runs repeat exactly.
pub fn fake_value(index: usize, shape: &Shape) -> Result<Value> {
    match shape {
        Shape::Tuple(elements) => Ok(Value::Tuple(
            elements
                .iter()
                .map(|e| fake_value(index, e))
                .collect::<Result<_>>()?,
        )),
        Shape::Buffer(inner) => fake_value(index, inner),
        Shape::Array(s) => {
            let count = usize::try_from(
                s.checked_element_count()
                    .ok_or_else(|| anyhow!("parameter {index}: {shape} has no valid size"))?,
            )?;
            let seed = index as u64 + 1;
            let ty = s.element_type;
            let values: Vec<f64> = (0..count)
                .map(|i| {
                    let x = hash_u32(i as u64, seed);
                    if ty.is_float() {
                        (2.0 * (x >> 8) as f64 - 16777216.0) / 16777216.0
                    } else if ty == xla_hlo_ir::PrimitiveType::Pred {
                        (x & 1) as f64
                    } else {
                        (x % 8) as f64
                    }
                })
                .collect();
            Ok(Value::Array(Array::from_f64s(ty, s.dims.clone(), &values)?))
        }
    }
}
