//! `hlo-opt`: reads an HLO module, verifies it, optionally runs passes on it
//! (`--passes=a,b,c`, verifying after each and dumping with
//! `--dump-after-each DIR`), and prints it (to stdout or atomically to
//! `-o FILE`), its statistics as JSON (`--stats`), or a JSON comparison of
//! its shardings with another module's (`--compare-shardings OTHER.hlo`).
//! With `--passes=latency-hiding-scheduler` it schedules the module under a
//! cost model (`--cost-model`) and memory limit (`--memory-limit`), and
//! `--schedule-report` prints the simulated figures of the result as one
//! JSON object instead of the module; `--trace OUT.json` writes the
//! simulated timeline as a Chrome/Perfetto trace.
//!
//! Invariants: bad input gives one clear message on stderr (file, line:column,
//! what was expected) and exit code 1, never a panic; `-o` writes through a
//! temporary file renamed into place, so a failed run leaves no partial output.

mod allocator;

/// mimalloc (see `allocator` and the workspace Cargo.toml).
#[global_allocator]
static ALLOCATOR: allocator::Mimalloc = allocator::Mimalloc;

use anyhow::{Context, Result};
use clap::Parser;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use xla_hlo_ir::stats::ModuleStats;

#[derive(Parser, Debug, Clone)]
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
    /// With `--passes=...,pipeline` (pipeline last): the pipeline schedule
    /// of the report, `gpipe`, `1f1b` or `interleaved` (with
    /// --virtual-stages > 1).
    #[arg(long, default_value = "1f1b")]
    schedule: String,
    /// With `--passes=...,pipeline`: devices in the pipeline; stages are
    /// the `stage_K` scopes (jax.named_scope) of the microbatch loop,
    /// grouped contiguously.
    #[arg(long, default_value_t = 4)]
    stages: usize,
    /// With `--passes=...,pipeline`: stages per device (interleaved).
    #[arg(long, default_value_t = 1)]
    virtual_stages: usize,
    /// With `--passes=...,pipeline`: devices per stage; each stage program
    /// is then SPMD-partitioned for them (the module's shardings, over this
    /// many partitions).
    #[arg(long, default_value_t = 1)]
    tensor_parallel: usize,
    /// With `--passes=...,pipeline`: make the stages by cutting the
    /// microbatch loop's scans over stacked layers into equal pieces
    /// instead of reading `stage_K` scopes.
    #[arg(long)]
    cut_layer_scans: bool,
    /// With `--passes=...,pipeline`: the microbatch count, checked against
    /// the microbatch loop's trip count.
    #[arg(long)]
    microbatches: Option<usize>,
    /// Apply a tactic schedule (JSON: a named mesh and tactics such as
    /// batch parallelism, Megatron, ZeRO-3; see xla/service/tactics): each
    /// tactic shards the values it names (parameters, intermediates by
    /// op_name, outputs), then the module is propagated
    /// and partitioned; prints the partitioned module after the last tactic
    /// (or, with --report, one JSON object with a report per tactic:
    /// collectives, bytes per device, peak memory, simulated step time,
    /// conflicts).
    #[arg(long, value_name = "SCHEDULE.json")]
    tactics: Option<PathBuf>,
    /// With --tactics: print the per-tactic reports instead of the module.
    #[arg(long, requires = "tactics")]
    report: bool,
    /// Search shardings of the entry parameters over --mesh minimising the
    /// simulated step time (--cost-model) within --memory-limit per device;
    /// prints one JSON object: the plan's figures, the search criterion
    /// and the tactic schedule (re-run it with --tactics).
    #[arg(long, requires = "mesh", conflicts_with = "tactics")]
    auto_shard: bool,
    /// With --auto-shard: the mesh, e.g. `x=2,y=4`.
    #[arg(long)]
    mesh: Option<String>,
    /// With `--passes=...,pipeline`: print the per-stage report (tasks,
    /// sends, peak live activations, simulated busy/idle time under
    /// --cost-model) as one JSON object instead of the stage programs.
    #[arg(long)]
    pipeline_report: bool,
    /// Run these passes in order, e.g. `--passes=sharding-propagation`
    /// (known: shardy-import, sdy-propagation, sharding-propagation,
    /// complete-shardings, spmd-partitioning, windowed-einsum,
    /// decompose-collectives, combine-collectives, async-collective-creator,
    /// latency-hiding-scheduler). The module is verified after each.
    #[arg(long, value_delimiter = ',', value_name = "PASS,...")]
    passes: Vec<String>,
    /// Number of partitions for the passes (spmd-partitioning); default:
    /// the module header's num_partitions.
    #[arg(long, value_name = "N")]
    num_partitions: Option<i64>,
    /// spmd-partitioning in consistent mode: a reduction (reduce, dot,
    /// convolution) is split across devices only where the split reproduces
    /// the single-device order of the interpreter's consistent mode
    /// (`run_hlo_module --consistent`); elsewhere it is reduced whole (each
    /// such instruction logged with RUST_LOG=info)
    #[arg(long)]
    consistent: bool,
    /// XLA's `is_spmd` for sharding-propagation: true propagates for the
    /// SPMD partitioner; false as XLA's pass for per-device placement
    /// (partial shardings never merge; custom-calls, reverses and rng take
    /// no tiles; concatenate operands tiled on the devices their rows land
    /// on; no gather/scatter parallel or passthrough dims)
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    sharding_propagation_is_spmd: bool,
    /// Whether sharding-propagation first inlines calls, as XLA's SPMD
    /// pipeline does before propagation; false propagates through them, as
    /// XLA's ShardingPropagation pass alone (its unit tests) does
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    sharding_propagation_inline_calls: bool,
    /// XLA's execution_threads for sharding-propagation: propagate only in
    /// computations of these threads (default: all)
    #[arg(long, value_delimiter = ',', value_name = "THREAD,...")]
    sharding_propagation_execution_threads: Option<Vec<String>>,
    /// Write the module after each pass to DIR/NN.<pass>.hlo.
    #[arg(long, value_name = "DIR", requires = "passes")]
    dump_after_each: Option<PathBuf>,
    /// Print one JSON object {"matched": M, "total": T, "mismatches": [...],
    /// "paired_by_structure": P, "unpaired_ours": U, "unpaired_other": V}
    /// comparing each instruction's sharding (after the passes) with its
    /// partner in OTHER: the instruction of the same name, else (names
    /// change between XLA's dumps) the k-th one with the same name root
    /// (name without `.N`), opcode and shape. A pair counts when either
    /// module gives it a sharding; it matches when both do and the
    /// shardings are equal modulo representation (iota vs explicit devices,
    /// device order within replication groups, tuple spelling). Pairs
    /// sharded by neither module are not counted; a pair sharded in only one
    /// is a mismatch ("ours" or "other" is null); sharded instructions left
    /// without a partner are counted apart (unpaired_*).
    #[arg(long, value_name = "OTHER.hlo", conflicts_with = "stats")]
    compare_shardings: Option<PathBuf>,
    /// Peak live bytes the latency-hiding scheduler must stay under
    /// (parameters included), e.g. 80000000000, 80GB or 64GiB.
    #[arg(long, value_name = "BYTES", value_parser = xla_hlo_ir::units::parse_byte_count)]
    memory_limit: Option<u64>,
    /// Cost model of the latency-hiding scheduler and of the report:
    /// approximate (XLA's units), analytical (H100 NVLink node; also
    /// analytical:h200) or table:PATH (measured µs per instruction name
    /// over the analytical model).
    #[arg(long, value_name = "MODEL", default_value = "analytical")]
    cost_model: String,
    /// Print one JSON object with the simulated schedule instead of the
    /// module: makespan_us, lower_bound_us, sequential_makespan_us,
    /// exposed_comm_us, peak_memory_bytes, scheduler_ms (and details).
    #[arg(long, conflicts_with_all = ["stats", "compare_shardings"])]
    schedule_report: bool,
    /// Write the simulated timeline as a Chrome/Perfetto trace (JSON) to
    /// this file: the entry computation, and one execution of each loop
    /// body, branch or callee that moves data.
    #[arg(long, value_name = "OUT.json")]
    trace: Option<PathBuf>,
    /// Async operations of one collective kind the scheduler may keep in
    /// flight at once, e.g. `--overlap-limit all-gather=2` (repeatable;
    /// kinds: all-reduce, all-gather, reduce-scatter, all-to-all,
    /// collective-permute, collective-broadcast, ragged-all-to-all, copy,
    /// send-recv, async-compute; default 1 each).
    #[arg(long, value_name = "KIND=N", value_parser = parse_overlap_limit)]
    overlap_limit: Vec<(xla_latency_hiding_scheduler::ResourceKind, usize)>,
    /// Run `--passes` this many times in this process, each time on a fresh
    /// copy of the input module, logging every run's pass times
    /// (`RUST_LOG=info`); the output is the last run's. For timing passes
    /// the way a compiler process runs them: the first run pays for
    /// first-touch page faults and cold caches, later runs do not.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1000))]
    repeat: u32,
    /// The `windowed-einsum` pass windows every all-gather-then-dot and
    /// dot-then-reduce-scatter whose collective's full array has at least
    /// this many MiB (XLA's xla_gpu_threshold_for_windowed_einsum_mib); 0 =
    /// wherever legal; without it (or --windowed-einsum-by-cost) the pass
    /// changes nothing.
    #[arg(long, value_name = "MIB", value_parser = parse_mib)]
    windowed_einsum_threshold_mib: Option<f64>,
    /// `windowed-einsum` windows only the pairs whose collective the
    /// current schedule leaves exposed and whose loop the cost model
    /// (--cost-model) estimates faster, and keeps them only when the
    /// simulated step gets shorter; without --windowed-einsum-threshold-mib
    /// every size is considered.
    #[arg(long)]
    windowed_einsum_by_cost: bool,
    /// `windowed-einsum` sends windows both ways round the ring in groups
    /// of 5 or more devices: about half the iterations, two dots and two
    /// permutes each (smaller groups stay unidirectional).
    #[arg(long)]
    windowed_einsum_bidirectional: bool,
    /// Seconds per computation for the exact scheduler (branch and bound
    /// from the list schedule): the latency-hiding scheduler keeps its
    /// order when faster, and --schedule-report gains "exact": each
    /// computation's schedule beside the best order found and the proven
    /// bound (optimal when the search finished).
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds)]
    exact_time_limit: Option<std::time::Duration>,
}

/// A duration in seconds: a finite number >= 0.
fn parse_seconds(text: &str) -> std::result::Result<std::time::Duration, String> {
    match text.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && (0.0..=86_400.0).contains(&v) => {
            Ok(std::time::Duration::from_secs_f64(v))
        }
        _ => Err(format!("'{text}': expected seconds between 0 and 86400")),
    }
}

/// A size in MiB: a finite number >= 0.
fn parse_mib(text: &str) -> std::result::Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("'{text}': expected a number of MiB >= 0")),
    }
}

/// Reads `KIND=N` with N >= 1.
fn parse_overlap_limit(
    text: &str,
) -> std::result::Result<(xla_latency_hiding_scheduler::ResourceKind, usize), String> {
    let (kind, n) = text
        .split_once('=')
        .ok_or_else(|| format!("'{text}': expected KIND=N, e.g. all-gather=2"))?;
    let kind = xla_latency_hiding_scheduler::ResourceKind::from_name(kind.trim())
        .ok_or_else(|| format!("'{kind}' is not a collective kind"))?;
    match n.trim().parse::<usize>() {
        Ok(n) if n >= 1 => Ok((kind, n)),
        _ => Err(format!("'{n}': the limit must be a whole number >= 1")),
    }
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

/// The scheduler settings the flags ask for.
fn scheduler_config(args: &Args) -> xla_latency_hiding_scheduler::SchedulerConfig {
    let mut config = xla_latency_hiding_scheduler::SchedulerConfig {
        memory_limit: args.memory_limit,
        exact_time_limit: args.exact_time_limit,
        ..Default::default()
    };
    for &(kind, n) in &args.overlap_limit {
        config = config.with_limit(kind, n);
    }
    config
}

/// Runs `--passes` on the module; returns the milliseconds spent in the
/// latency-hiding scheduler.
fn run_passes(
    args: &Args,
    model: &std::sync::Arc<dyn xla_latency_hiding_scheduler::CostModel>,
    module: &mut xla_hlo_ir::HloModule,
) -> Result<f64> {
    if args.passes.is_empty() {
        return Ok(0.0);
    }
    let options = xla_pipelines::PipelineOptions {
        scheduler: scheduler_config(args),
        cost_model: model.clone(),
        propagation: xla_pipelines::ShardingPropagationOptions {
            is_spmd: args.sharding_propagation_is_spmd,
            inline_calls: args.sharding_propagation_inline_calls,
            execution_threads: args.sharding_propagation_execution_threads.clone(),
            ..Default::default()
        },
        consistent: args.consistent,
        windowed_einsum: xla_pipelines::WindowedEinsumOptions {
            threshold_mib: args
                .windowed_einsum_threshold_mib
                .or(args.windowed_einsum_by_cost.then_some(0.0)),
            bidirectional: args.windowed_einsum_bidirectional,
            ..Default::default()
        },
        windowed_einsum_by_cost: args.windowed_einsum_by_cost,
        ..Default::default()
    };
    let mut pipeline = xla_pipelines::pipeline(&options, "hlo-opt", &args.passes.join(","))?
        .with_verifier(!args.no_verify);
    if let Some(dir) = &args.dump_after_each {
        pipeline = pipeline.dump_after_each(dir);
    }
    let report = pipeline.run(module)?;
    let mut scheduler_ms = 0.0;
    for r in &report.runs {
        log::info!(
            "pass {}: {:.3} ms, {}",
            r.name,
            r.duration.as_secs_f64() * 1e3,
            if r.changed { "changed" } else { "unchanged" }
        );
        if r.name == "latency-hiding-scheduler" {
            scheduler_ms += r.duration.as_secs_f64() * 1e3;
        }
    }
    Ok(scheduler_ms)
}

/// The exact scheduler's verdict on every computation of the scheduled
/// module: the entry's figures, the computations whose search finished
/// (optimal), the largest gap of a schedule to its proven bound, and each
/// computation.
fn exact_json(
    module: &xla_hlo_ir::HloModule,
    model: &dyn xla_latency_hiding_scheduler::CostModel,
    config: &xla_latency_hiding_scheduler::SchedulerConfig,
    time_limit: std::time::Duration,
) -> Result<serde_json::Value> {
    let gaps = xla_latency_hiding_scheduler::exact_gaps(
        module,
        model,
        &config.overlap_limits,
        time_limit,
    )?;
    let entry_name = &module.entry_computation().name;
    let entry = gaps.iter().find(|g| &g.computation == entry_name);
    let largest = gaps.iter().map(|g| g.schedule_gap()).fold(0.0f64, f64::max);
    Ok(serde_json::json!({
        "time_limit_s": time_limit.as_secs_f64(),
        "computations": gaps.len(),
        "optimal": gaps.iter().filter(|g| g.optimal).count(),
        "largest_schedule_gap": (largest * 10000.0).round() / 10000.0,
        "entry": entry.map(|g| g.to_json()),
        "by_computation": gaps.iter().map(|g| g.to_json()).collect::<Vec<_>>(),
    }))
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
        "paired_by_structure": c.paired_by_structure,
        "unpaired_ours": c.unpaired_ours,
        "unpaired_other": c.unpaired_other,
    })
    .to_string();
    s.push('\n');
    s
}

fn run(args: &Args) -> Result<()> {
    let model = xla_latency_hiding_scheduler::cost_model_from_spec(&args.cost_model)?;
    let mut module = load_module(&args.input, !args.no_verify)?;
    if let Some(n) = args.num_partitions {
        module.config.num_partitions = Some(n);
    }
    if let Some(path) = &args.tactics {
        return run_tactics(args, path, model.as_ref(), module);
    }
    if args.auto_shard {
        return run_auto_shard(args, model.as_ref(), &module);
    }
    if args.passes.last().map(String::as_str) == Some("pipeline") {
        return run_pipeline(args, model.as_ref(), module);
    }
    if args.passes.iter().any(|p| p == "pipeline") {
        anyhow::bail!(
            "--passes: `pipeline` must be the last pass (it turns the module into one program per stage)"
        );
    }
    let want_schedule = args.schedule_report || args.trace.is_some();
    let original = want_schedule.then(|| module.clone());
    for run in 1..args.repeat {
        log::info!("--repeat: run {run} of {}", args.repeat);
        run_passes(args, &model, &mut module.clone())?;
    }
    let scheduler_ms = run_passes(args, &model, &mut module)?;
    let mut report_json = None;
    if let Some(original) = &original {
        let config = scheduler_config(args);
        let (report, sim) = xla_latency_hiding_scheduler::ScheduleReport::compute(
            original,
            &module,
            model.as_ref(),
            &config.overlap_limits,
            scheduler_ms,
            args.memory_limit,
            args.trace.is_some(),
        )?;
        if let Some(path) = &args.trace {
            let trace = xla_latency_hiding_scheduler::chrome_trace(&sim.timelines, &module.name);
            write_atomically(path, |w| w.write_all(trace.to_string().as_bytes()))?;
        }
        let mut json = report.to_json();
        if let Some(time_limit) = args.exact_time_limit {
            json["exact"] = exact_json(&module, model.as_ref(), &config, time_limit)?;
        }
        report_json = Some(json);
    }
    let report = if let Some(json) = report_json.filter(|_| args.schedule_report) {
        let mut s = json.to_string();
        s.push('\n');
        Some(s)
    } else if let Some(other_path) = &args.compare_shardings {
        let other = load_module(other_path, !args.no_verify)?;
        Some(comparison_json(&module, &other))
    } else if args.stats {
        let mut s = ModuleStats::of(&module).to_json().to_string();
        s.push('\n');
        Some(s)
    } else {
        None
    };
    // The module is printed straight into the output (a large module's
    // text is never held in memory whole).
    let write = |w: &mut dyn Write| -> std::io::Result<()> {
        match &report {
            Some(text) => w.write_all(text.as_bytes()),
            None => {
                let mut buffered = std::io::BufWriter::with_capacity(1 << 16, w);
                write!(buffered, "{module}")?;
                buffered.flush()
            }
        }
    };
    write_output(args.output.as_deref(), write)
}

/// `--passes=...,pipeline`: the passes before `pipeline`, then the MPMD
/// split; prints every stage program (prologue, tasks in chain order,
/// epilogue) or, with --pipeline-report, the per-stage report.
fn run_pipeline(
    args: &Args,
    model: &dyn xla_latency_hiding_scheduler::CostModel,
    mut module: xla_hlo_ir::HloModule,
) -> Result<()> {
    let before = Args {
        passes: args.passes[..args.passes.len() - 1].to_vec(),
        ..args.clone()
    };
    let model_arc = xla_latency_hiding_scheduler::cost_model_from_spec(&args.cost_model)?;
    run_passes(&before, &model_arc, &mut module)?;
    let options = xla_mpmd::PipelineOptions {
        num_devices: args.stages,
        virtual_stages: args.virtual_stages,
        tensor_parallel: args.tensor_parallel,
        cut_layer_scans: args.cut_layer_scans,
        ..Default::default()
    };
    let program = xla_mpmd::split_pipeline(&module, &options)?;
    if let Some(m) = args.microbatches {
        if m != program.microbatches() {
            anyhow::bail!(
                "--microbatches {m}: the microbatch loop runs {} iterations",
                program.microbatches()
            );
        }
    }
    let kind = xla_mpmd::ScheduleKind::parse(&args.schedule)?;
    let table = xla_mpmd::task_table(
        kind,
        program.num_devices,
        program.virtual_stages,
        program.microbatches(),
    )?;
    let text = if args.pipeline_report {
        let mut s = xla_mpmd::pipeline_report(&program, &table, model)?.to_string();
        s.push('\n');
        s
    } else {
        program.to_text()
    };
    let write = |w: &mut dyn Write| -> std::io::Result<()> { w.write_all(text.as_bytes()) };
    write_output(args.output.as_deref(), write)
}

/// `--tactics SCHEDULE.json`: the schedule applied tactic by tactic.
fn run_tactics(
    args: &Args,
    path: &Path,
    model: &dyn xla_latency_hiding_scheduler::CostModel,
    module: xla_hlo_ir::HloModule,
) -> Result<()> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let schedule = xla_tactics::parse_schedule(&text)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let run = xla_tactics::apply_schedule(&module, &schedule, model)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    if args.report {
        let reports: Vec<serde_json::Value> = run.reports.iter().map(|r| r.to_json()).collect();
        let mut text = serde_json::json!({"mesh": schedule.mesh, "tactics": reports}).to_string();
        text.push('\n');
        write_output(args.output.as_deref(), |w| w.write_all(text.as_bytes()))
    } else {
        let partitioned = &run.partitioned;
        write_output(args.output.as_deref(), |w| {
            let mut buffered = std::io::BufWriter::with_capacity(1 << 16, w);
            write!(buffered, "{partitioned}")?;
            buffered.flush()
        })
    }
}

/// `--auto-shard --mesh x=2,y=4 [--memory-limit BYTES]`.
fn run_auto_shard(
    args: &Args,
    model: &dyn xla_latency_hiding_scheduler::CostModel,
    module: &xla_hlo_ir::HloModule,
) -> Result<()> {
    let mesh_text = args.mesh.as_deref().unwrap_or_default();
    let mesh = mesh_text
        .split(',')
        .map(|axis| {
            let (name, size) = axis.split_once('=').ok_or_else(|| {
                anyhow::anyhow!("--mesh {mesh_text:?}: expected name=size pairs, e.g. x=2,y=4")
            })?;
            let size: i64 = size.trim().parse().ok().filter(|&s| s > 0).ok_or_else(|| {
                anyhow::anyhow!("--mesh {mesh_text:?}: axis {name:?} needs a positive size")
            })?;
            Ok((name.trim().to_string(), size))
        })
        .collect::<Result<Vec<_>>>()?;
    let options = xla_tactics::AutoOptions {
        mesh,
        memory_limit: args.memory_limit,
        exhaustive_limit: 4096,
    };
    let plan = xla_tactics::auto_shard(module, &options, model).map_err(anyhow::Error::msg)?;
    let mut text = serde_json::json!({
        "step_us": plan.cost.step_us,
        "peak_memory_bytes": plan.cost.peak_memory_bytes,
        "collective_bytes": plan.cost.collective_bytes,
        "plans_evaluated": plan.evaluated,
        "criterion": plan.criterion,
        "schedule": xla_tactics::schedule_to_json(&plan.schedule),
    })
    .to_string();
    text.push('\n');
    write_output(args.output.as_deref(), |w| w.write_all(text.as_bytes()))
}

/// Writes what `write` writes to `output` (atomically) or to stdout.
fn write_output(
    output: Option<&Path>,
    write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> Result<()> {
    match output {
        Some(path) => write_atomically(path, write),
        None => {
            let mut out = std::io::stdout().lock();
            write(&mut out).context("writing to stdout")?;
            out.flush().context("writing to stdout")
        }
    }
}

/// Reads, parses and (optionally) verifies a module; errors name the file.
fn load_module(path: &Path, verify: bool) -> Result<xla_hlo_ir::HloModule> {
    let module =
        xla_hlo_verifier::load::load_module_file(path, verify).map_err(anyhow::Error::msg)?;
    log::info!(
        "read {} ({} instructions)",
        path.display(),
        module.instruction_count()
    );
    Ok(module)
}

/// Writes what `write` writes to a temporary file beside `path`, then
/// renames it into place. A path that exists and is not a regular file
/// (`/dev/null`, a FIFO, a terminal) is written directly: renaming over it
/// would replace the device or pipe with a regular file.
fn write_atomically(
    path: &Path,
    write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> Result<()> {
    if std::fs::metadata(path).is_ok_and(|m| !m.is_file() && !m.is_dir()) {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .with_context(|| format!("cannot write {}", path.display()))?;
        return write(&mut f).with_context(|| format!("cannot write {}", path.display()));
    }
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
        write(&mut f)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}
