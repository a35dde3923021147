//! `hlo-opt`: reads an HLO module, verifies it, optionally runs passes on it
//! (`--passes=a,b,c`, verifying after each and dumping with
//! `--dump-after-each DIR`), and prints it (to stdout or atomically to
//! `-o FILE`), its statistics as JSON (`--stats`), or a JSON comparison of
//! its shardings with another module's (`--compare-shardings OTHER.hlo`).
//!
//! Invariants: bad input gives one clear message on stderr (file, line:column,
//! what was expected) and exit code 1, never a panic; `-o` writes through a
//! temporary file renamed into place, so a failed run leaves no partial output.

use anyhow::{Context, Result};
use clap::Parser;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use xla_hlo_ir::stats::ModuleStats;

#[derive(Parser, Debug)]
#[command(
    name = "hlo-opt",
    version,
    about = "Parse, verify, transform and print HLO modules"
)]
struct Args {
    /// The HLO text file to read.
    input: PathBuf,
    /// Write the printed module here instead of stdout.
    #[arg(short = 'o', long = "output")]
    output: Option<PathBuf>,
    /// Print statistics as one JSON object instead of the module.
    #[arg(long)]
    stats: bool,
    /// Skip the verifier (for inspecting broken modules).
    #[arg(long)]
    no_verify: bool,
    /// Run these passes in order, e.g. `--passes=sharding-propagation`
    /// (known: sharding-propagation, complete-shardings). The module is
    /// verified after each.
    #[arg(long, value_delimiter = ',', value_name = "PASS,...")]
    passes: Vec<String>,
    /// Number of partitions for the passes (spmd-partitioning); default:
    /// the module header's num_partitions.
    #[arg(long, value_name = "N")]
    num_partitions: Option<i64>,
    /// Write the module after each pass to DIR/NN.<pass>.hlo.
    #[arg(long, value_name = "DIR", requires = "passes")]
    dump_after_each: Option<PathBuf>,
    /// Print one JSON object {"matched": M, "total": T, "mismatches": [...]}
    /// comparing each instruction's sharding (after the passes) with the
    /// instruction of the same name in OTHER. An instruction counts when
    /// either module gives it a sharding; it matches when both do and the
    /// shardings are equal modulo representation (iota vs explicit devices,
    /// device order within replication groups, tuple spelling). Instructions
    /// sharded by neither module are not counted; one present or sharded in
    /// only one module is a mismatch ("ours" or "other" is null).
    #[arg(long, value_name = "OTHER.hlo", conflicts_with = "stats")]
    compare_shardings: Option<PathBuf>,
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hlo-opt: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// The passes `--passes` can name.
fn registry() -> xla_hlo_pass::PassRegistry {
    let mut r = xla_hlo_pass::PassRegistry::new();
    r.register(
        "sharding-propagation",
        "complete user shardings to every instruction (XLA's GSPMD propagation)",
        || Box::new(xla_sharding_propagation::ShardingPropagation::default()),
    );
    r.register(
        "complete-shardings",
        "give {replicated} to instructions still unsharded in partitioned computations",
        || Box::new(xla_sharding_propagation::ShardingCompletion),
    );
    r.register(
        "spmd-partitioning",
        "partition a sharded module into the per-device SPMD program (XLA's spmd-partitioning)",
        || Box::new(xla_spmd_partitioner::SpmdPartitioner::default()),
    );
    r
}

/// Runs `--passes` on the module.
fn run_passes(args: &Args, module: &mut xla_hlo_ir::HloModule) -> Result<()> {
    if args.passes.is_empty() {
        return Ok(());
    }
    let mut pipeline = registry()
        .pipeline("hlo-opt", &args.passes.join(","))?
        .with_verifier(!args.no_verify);
    if let Some(dir) = &args.dump_after_each {
        pipeline = pipeline.dump_after_each(dir);
    }
    let report = pipeline.run(module)?;
    for r in &report.runs {
        log::info!(
            "pass {}: {:.3} ms, {}",
            r.name,
            r.duration.as_secs_f64() * 1e3,
            if r.changed { "changed" } else { "unchanged" }
        );
    }
    Ok(())
}

/// The `--compare-shardings` JSON.
fn comparison_json(ours: &xla_hlo_ir::HloModule, other: &xla_hlo_ir::HloModule) -> String {
    let c = xla_hlo_utils::compare::compare_module_shardings(ours, other);
    let mismatches: Vec<serde_json::Value> = c
        .mismatches
        .iter()
        .map(|m| {
            serde_json::json!({
                "instruction": m.instruction,
                "computation": m.computation,
                "opcode": m.opcode,
                "ours": m.ours,
                "other": m.other,
            })
        })
        .collect();
    let mut s = serde_json::json!({
        "matched": c.matched,
        "total": c.total,
        "mismatches": mismatches,
    })
    .to_string();
    s.push('\n');
    s
}

fn run(args: &Args) -> Result<()> {
    let mut module = load_module(&args.input, !args.no_verify)?;
    if let Some(n) = args.num_partitions {
        module.config.num_partitions = Some(n);
    }
    run_passes(args, &mut module)?;
    let text = if let Some(other_path) = &args.compare_shardings {
        let other = load_module(other_path, !args.no_verify)?;
        comparison_json(&module, &other)
    } else if args.stats {
        let mut s = ModuleStats::of(&module).to_json().to_string();
        s.push('\n');
        s
    } else {
        module.to_text()
    };
    match &args.output {
        Some(path) => write_atomically(path, text.as_bytes()),
        None => {
            let mut out = std::io::stdout().lock();
            out.write_all(text.as_bytes())
                .context("writing to stdout")?;
            out.flush().context("writing to stdout")
        }
    }
}

/// Reads, parses and (optionally) verifies a module; errors name the file.
fn load_module(path: &Path, verify: bool) -> Result<xla_hlo_ir::HloModule> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let module = xla_hlo_parser::parse_module(&text)
        .map_err(|e| anyhow::anyhow!("{}:{e}", path.display()))?;
    if verify {
        xla_hlo_verifier::verify(&module)
            .map_err(|e| anyhow::anyhow!("{}: the module does not verify:\n{e}", path.display()))?;
    }
    log::info!(
        "read {} ({} instructions)",
        path.display(),
        module.instruction_count()
    );
    Ok(module)
}

/// Writes `bytes` to a temporary file beside `path`, then renames it into place.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let file_name = path
        .file_name()
        .context("the output path has no file name")?;
    let tmp = dir.join(format!(
        ".{}.tmp{}",
        file_name.to_string_lossy(),
        std::process::id()
    ));
    let result = (|| -> Result<()> {
        let mut f = std::fs::File::create(&tmp)
            .with_context(|| format!("cannot create {}", tmp.display()))?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}
