//! `run_hlo_module`: runs an HLO module on the reference interpreter with
//! global (single-device) semantics, reading entry arguments from .npy files
//! (or regenerating them from a corpus `case.json`, or making fake ones when
//! neither is given, as XLA's `run_hlo_module` does), optionally writing the
//! outputs and comparing them with expected arrays or an expected summary,
//! and printing one JSON line with per-output errors and the wall time.
//!
//! Invariants: the module (and the `--shardings-from` module) is verified
//! before anything runs; arguments are checked against the memory limit
//! before they are made, and each result before it is allocated. Exit
//! status 0 only when every comparison requested matched (or none was
//! requested); 1 for outputs that differ and for every error (bad input,
//! a module that does not verify or does not fit), as `hlo-opt`; every
//! failure names the file, parameter or instruction at fault. Modules with manual-sharding regions or
//! collectives run on `num_partitions` loopback devices so that global
//! semantics hold; all others run on one device.

mod generate;
mod partition;
mod pipeline;
mod spawn;

use anyhow::{anyhow, bail, Context, Result};
use clap::Parser;
use serde_json::{json, Value as Json};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use xla_hlo_evaluator::npy::{load_argument, read_npy, write_npy};
use xla_hlo_evaluator::{evaluate, needs_spmd, Array, EvalContext, Value};
use xla_hlo_ir::HloModule;
use xla_runtime::{Backend, Executable, LaunchPlan, ProcessGroup};

#[derive(Parser, Debug)]
#[command(
    name = "run_hlo_module",
    about = "Run an HLO module on the reference interpreter"
)]
struct Cli {
    /// The HLO text file (default with --case: DIR/input.hlo).
    #[arg(required_unless_present = "case")]
    file: Option<PathBuf>,
    /// A case folder (testdata/cases/NAME or a corpus case): FILE defaults
    /// to its input.hlo, --args/--expected to its args/ and expected/ when
    /// present, --case-json to its case.json.
    #[arg(long, value_name = "DIR")]
    case: Option<PathBuf>,
    /// Folder with arg0.npy, arg1.npy, ... (entry parameter order).
    #[arg(long)]
    args: Option<PathBuf>,
    /// Folder with out0.npy, out1.npy, ... to compare against.
    #[arg(long)]
    expected: Option<PathBuf>,
    /// Relative tolerance for float outputs.
    #[arg(long)]
    rtol: Option<f64>,
    /// Absolute tolerance for float outputs.
    #[arg(long)]
    atol: Option<f64>,
    /// Folder to write out0.npy, out1.npy, ... into.
    #[arg(long)]
    output: Option<PathBuf>,
    /// A corpus case.json: regenerates arguments from its generators when
    /// --args is absent, checks its expected_summary when --expected is
    /// absent, and supplies default tolerances.
    #[arg(long)]
    case_json: Option<PathBuf>,
    /// Number of loopback devices (default: num_partitions when the module
    /// needs several devices for global semantics, else 1).
    #[arg(long)]
    devices: Option<i64>,
    /// Also time XLA (jaxlib, CPU) on the same module and print the ratio.
    #[arg(long)]
    bench_xla: bool,
    /// Runs of the module to time (the minimum is reported).
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// Treat FILE as a partitioned per-device program (e.g. a corpus
    /// xla_partitioned.hlo) and run it on --devices N (default: its
    /// num_partitions) through the runtime's launcher: arguments are global
    /// (this module's signature) and split by the entry parameters'
    /// shardings, taken from this module by parameter number (FILE's own
    /// where this one has none); outputs are assembled by this module's root
    /// sharding into its root's global shapes. E.g. the case's propagated.hlo.
    #[arg(long, value_name = "GLOBAL.hlo", alias = "partitioned")]
    shardings_from: Option<PathBuf>,
    /// Propagate shardings, partition the module for --devices N (default:
    /// its num_partitions) and run the per-device program on N loopback
    /// devices: arguments are split and outputs assembled by the entry
    /// shardings; the JSON line gains "partition" statistics.
    #[arg(long)]
    partition: bool,
    /// With --partition: schedule the partitioned module with the
    /// latency-hiding scheduler (analytical cost model) before running it;
    /// the JSON line gains the schedule report.
    #[arg(long, requires = "partition")]
    schedule: bool,
    /// Bytes the arguments together, and each instruction's result, may
    /// take, e.g. 20GiB or 16000000000 (default: the memory the machine has
    /// available). A module over it is refused before anything is
    /// allocated, naming the parameter or instruction and the bytes it needs.
    #[arg(long, value_name = "BYTES", value_parser = xla_hlo_ir::units::parse_byte_count)]
    memory_limit: Option<u64>,
    /// Seconds the whole run may take (e.g. a loop that never ends is a
    /// valid program); past it the run stops with an error and exit 1,
    /// before any output file is written.
    #[arg(long, value_name = "SECONDS")]
    time_limit: Option<f64>,
    /// Run across P processes, each owning N/P of the devices (with
    /// --process-id and --coordinator); process 0 assembles, compares and
    /// writes the outputs, the others print a short JSON line.
    #[arg(long, value_name = "P", requires_all = ["process_id", "coordinator"])]
    num_processes: Option<usize>,
    /// This process's index, 0..P.
    #[arg(long, value_name = "I")]
    process_id: Option<usize>,
    /// HOST:PORT of the coordinator (a TCP key-value store). Process 0
    /// starts it there unless --external-coordinator.
    #[arg(long, value_name = "HOST:PORT")]
    coordinator: Option<String>,
    /// The coordinator runs separately (`kv_store_server`, --spawn-local).
    #[arg(long)]
    external_coordinator: bool,
    /// Address this process's devices listen on for their peers (default:
    /// the coordinator's host).
    #[arg(long, value_name = "HOST")]
    bind_host: Option<String>,
    /// Seconds a device waits for a peer (joining, every collective) before
    /// the run fails naming it.
    #[arg(long, value_name = "SECONDS", default_value_t = 600.0)]
    timeout: f64,
    /// Start P local processes of this command (a coordinator on
    /// 127.0.0.1, devices split among them) and report process 0's result;
    /// exit 1 when any process fails.
    #[arg(long, value_name = "P", conflicts_with_all = ["num_processes", "process_id", "coordinator"])]
    spawn_local: Option<usize>,
    /// Backend that runs the module: `cpu` (the interpreter) or `cuda`.
    #[arg(long, default_value = "cpu")]
    backend: String,
    /// What collectives between processes go through: `tcp` (sockets, the
    /// CPU fallback) or `nccl` (one GPU per device; builds with the `nccl`
    /// feature).
    #[arg(long, default_value = "tcp", value_parser = ["tcp", "nccl"])]
    collectives: String,
    /// Consistent mode (single-device consistency): the interpreter combines
    /// every floating-point reduction (reduce, dot, convolution, all-reduce,
    /// reduce-scatter) by one pairwise-tree order, on any number of devices;
    /// with --partition the partitioner splits a reduction across devices
    /// only where that reproduces the order, so outputs are bitwise those of
    /// the single-device run in this mode. Slower than the default. With
    /// --partition the JSON line gains "consistency": collective bytes and
    /// simulated time against the default mode.
    #[arg(long)]
    consistent: bool,
    /// Also run the unpartitioned module (FILE, or the --shardings-from
    /// module) on one device in the same mode and require every output to
    /// be bitwise equal to it (exit 1 otherwise); the JSON line gains
    /// "single_device": {"identical", "differing_outputs"}.
    #[arg(long)]
    compare_single_device: bool,
    /// With --partition: window every dot whose all-gathered operand has
    /// at least this many MiB into a loop over windows passed by
    /// collective-permute (collective matmul; XLA's
    /// xla_gpu_threshold_for_windowed_einsum_mib); 0 = wherever legal.
    #[arg(long, value_name = "MIB", requires = "partition", value_parser = parse_mib)]
    windowed_einsum_threshold_mib: Option<f64>,
    /// With --partition: window only the pairs whose loop the analytical
    /// cost model says pays, and only when the simulated step gets shorter
    /// (every size, unless --windowed-einsum-threshold-mib limits it).
    #[arg(long, requires = "partition")]
    windowed_einsum_by_cost: bool,
    /// With --partition: windowed loops send windows both ways round the
    /// ring in groups of 5 or more devices (half the iterations).
    #[arg(long, requires = "partition")]
    windowed_einsum_bidirectional: bool,
    /// With --partition: split collectives and the dots they feed or come
    /// from into chunks that overlap, where the analytical cost model says
    /// it pays and the simulated step gets shorter (Concerto's
    /// decomposition; results bitwise unchanged in --consistent mode).
    #[arg(long, requires = "partition")]
    decompose_collectives: bool,
    /// With --partition: combine independent all-reduces, all-gathers or
    /// reduce-scatters of one kind into one collective (XLA's collective
    /// combiners, within XLA's GPU thresholds), where the analytical cost
    /// model says it pays (results bitwise unchanged).
    #[arg(long, requires = "partition")]
    combine_collectives: bool,
    /// Pipeline parallelism: split the module's microbatch loop (a scan
    /// whose body marks stages with jax.named_scope("stage_K")) into stage
    /// programs and run them by this schedule's task table (`gpipe`,
    /// `1f1b`, `interleaved`) on --stages loopback devices; the JSON line
    /// gains "pipeline": per-device tasks, sends, receives and peak live
    /// values, and the per-stage report with the simulated step.
    #[arg(long, conflicts_with_all = ["partition", "shardings_from", "num_processes", "spawn_local", "devices", "consistent"])]
    pipeline: Option<String>,
    /// With --pipeline: devices in the pipeline.
    #[arg(long, default_value_t = 4)]
    stages: usize,
    /// With --pipeline: stages per device (the interleaved schedule).
    #[arg(long, default_value_t = 1)]
    virtual_stages: usize,
    /// With --pipeline: devices per stage; each stage program is
    /// partitioned for them (the module's shardings, over this many
    /// partitions), so --stages P runs on P x T loopback devices.
    #[arg(long, default_value_t = 1)]
    tensor_parallel: usize,
    /// With --pipeline: make the stages by cutting the microbatch loop's
    /// scans over stacked layers (a `lax.scan` over a layer axis, forward
    /// and backward) into --stages x --virtual-stages equal pieces instead
    /// of reading `stage_K` scopes.
    #[arg(long)]
    cut_layer_scans: bool,
}

impl Cli {
    /// Fills FILE, --args, --expected and --case-json from --case.
    fn resolve_case(mut self) -> Cli {
        if let Some(dir) = self.case.clone() {
            let existing = |p: PathBuf| p.exists().then_some(p);
            self.file = self.file.or_else(|| Some(dir.join("input.hlo")));
            self.args = self.args.or_else(|| existing(dir.join("args")));
            self.expected = self.expected.or_else(|| existing(dir.join("expected")));
            self.case_json = self.case_json.or_else(|| existing(dir.join("case.json")));
        }
        self
    }

    fn file(&self) -> &Path {
        self.file.as_deref().unwrap_or(Path::new("-"))
    }
}

/// Stops the process with an error once `seconds` have passed, unless
/// evaluation finished first (the returned flag, set before outputs are
/// written; the watchdog holds its lock while it stops the process, so a
/// stop never leaves a half-written output file).
fn start_watchdog(file: String, seconds: f64) -> Arc<Mutex<bool>> {
    let finished = Arc::new(Mutex::new(false));
    let flag = finished.clone();
    let limit = Duration::try_from_secs_f64(seconds.max(0.0)).unwrap_or(Duration::MAX);
    std::thread::spawn(move || {
        std::thread::sleep(limit);
        let done = flag.lock().unwrap_or_else(|e| e.into_inner());
        if !*done {
            let message =
                format!("the time limit of {seconds} s ran out before the module finished");
            println!("{}", json!({"file": file, "error": message}));
            eprintln!("error: {message}");
            std::process::exit(1);
        }
    });
    finished
}

/// A size in MiB: a finite number >= 0.
fn parse_mib(text: &str) -> std::result::Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("'{text}': expected a number of MiB >= 0")),
    }
}

fn main() {
    // Warnings (e.g. the scheduler's under --partition --schedule) on
    // stderr; RUST_LOG=info shows each pass's time.
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = Cli::parse().resolve_case();
    if let Some(processes) = cli.spawn_local {
        std::process::exit(match spawn::spawn_local(processes, cli.timeout) {
            Ok(code) => code,
            Err(e) => {
                eprintln!("error: {e:#}");
                1
            }
        });
    }
    match run(&cli) {
        Ok(ok) => std::process::exit(if ok { 0 } else { 1 }),
        Err(e) => {
            let line = json!({"file": cli.file().display().to_string(), "error": format!("{e:#}")});
            println!("{line}");
            eprintln!("error: {e:#}");
            std::process::exit(1);
        }
    }
}

/// A module with Shardy annotations (a default JAX lowering): annotations
/// that only constrain shardings are imported as their GSPMD forms, which
/// the interpreter runs as copies; a manual computation (shard_map) is
/// written in per-device shapes, so the module only runs partitioned, and
/// `true` says so (as XLA would, it is partitioned over its devices).
fn needs_shardy_partitioning(module: &mut HloModule, per_device_program: bool) -> Result<bool> {
    use xla_pipelines::shardy_import;
    if per_device_program || !shardy_import::has_shardy_annotations(module) {
        return Ok(false);
    }
    if shardy_import::has_manual_computation(module) {
        eprintln!(
            "note: the module has Shardy manual computations (shard_map), written in per-device shapes; running it partitioned on {} devices, as with --partition",
            module.num_partitions()
        );
        return Ok(true);
    }
    shardy_import::import(module).map_err(anyhow::Error::msg)?;
    Ok(false)
}

/// Reads, parses and verifies a module: nothing runs on a module that does
/// not verify (the verifier's message names the file and instruction).
fn parse_file(path: &Path) -> Result<HloModule> {
    xla_hlo_verifier::load::load_module_file(path, true).map_err(anyhow::Error::msg)
}

/// Refuses parameter `index` when its argument would not fit in what is
/// left of `limit` after `used` bytes of earlier arguments.
fn check_argument_bytes(
    index: usize,
    name: &str,
    shape: &xla_hlo_ir::Shape,
    used: &mut u64,
    limit: u64,
) -> Result<()> {
    use xla_hlo_ir::units::format_bytes;
    let shape_text = shape.without_layout();
    let Some(needed) = shape.checked_byte_size() else {
        bail!("parameter {index} (%{name}): {shape_text} needs more than 2^64 bytes");
    };
    match needed.checked_add(*used) {
        Some(total) if total <= limit => {
            *used = total;
            Ok(())
        }
        _ if *used == 0 => bail!(
            "parameter {index} (%{name}): {shape_text} needs {} ({needed} bytes), the memory limit is {} ({limit} bytes)",
            format_bytes(needed),
            format_bytes(limit)
        ),
        _ => bail!(
            "parameter {index} (%{name}): {shape_text} needs {} ({needed} bytes); with the {} of {} that is over the memory limit of {} ({limit} bytes)",
            format_bytes(needed),
            format_bytes(*used),
            if index == 1 {
                "parameter 0".to_string()
            } else {
                format!("parameters 0-{}", index - 1)
            },
            format_bytes(limit)
        ),
    }
}

/// Interprets `module` on one device (partition 0 of 1, replica 0 of 1).
fn evaluate_on_one_device(
    module: &HloModule,
    args: &[Value],
    memory_limit: u64,
    consistent: bool,
) -> Result<Vec<Value>> {
    let ctx = EvalContext {
        num_partitions: Some(1),
        num_replicas: Some(1),
        memory_limit: Some(memory_limit),
        consistent,
        ..EvalContext::default()
    };
    Ok(evaluate(module, args, &ctx)?)
}

/// Runs `reference` (an unpartitioned module) with global semantics and
/// compares each of `outputs` with its result bit for bit: on one device,
/// or, for a module whose collectives or manual regions need its devices
/// (a shard_map written with explicit collectives), on its
/// `num_partitions` devices each given the whole arguments. Shardy
/// annotations are imported first; a Shardy manual computation is written
/// in per-device shapes and has no global run, which is an error.
fn compare_with_single_device(
    reference: &HloModule,
    args: &[Value],
    outputs: &[Array],
    memory_limit: u64,
    consistent: bool,
) -> Result<Json> {
    use xla_pipelines::shardy_import;
    let context = "the single-device run (--compare-single-device)";
    let mut imported;
    let mut reference = reference;
    if shardy_import::has_shardy_annotations(reference) {
        if shardy_import::has_manual_computation(reference) {
            bail!("{context}: the module has Shardy manual computations (shard_map), written in per-device shapes, so it has no single-device run to compare with");
        }
        imported = reference.clone();
        shardy_import::import(&mut imported).map_err(anyhow::Error::msg)?;
        reference = &imported;
    }
    let results = if needs_spmd(reference) {
        let exe = xla_runtime::CpuBackend.compile(reference)?;
        let mut plan =
            LaunchPlan::replicated(reference, reference.num_partitions().max(1) as usize);
        plan.consistent = consistent;
        let literals = xla_runtime::cpu::literals_from_values(args)?;
        xla_runtime::cpu::values_from_literals(
            &xla_runtime::run_spmd(exe.as_ref(), &literals, &plan).context(context)?,
        )?
    } else {
        evaluate_on_one_device(reference, args, memory_limit, consistent).context(context)?
    };
    let want: Vec<Array> = results
        .iter()
        .flat_map(|v| v.leaves().into_iter().cloned())
        .collect();
    if want.len() != outputs.len() {
        bail!(
            "the single-device run has {} outputs, the run {}",
            want.len(),
            outputs.len()
        );
    }
    let bits = |a: &Array| -> Result<Vec<u8>> {
        Ok(xla_hlo_evaluator::collective::to_buffer(a)?.to_vec())
    };
    let mut differing = Vec::new();
    for (i, (got, want)) in outputs.iter().zip(&want).enumerate() {
        if got.ty != want.ty || got.dims != want.dims || bits(got)? != bits(want)? {
            differing.push(i);
        }
    }
    Ok(json!({"identical": differing.is_empty(), "differing_outputs": differing}))
}

fn load_json(path: &Path) -> Result<Json> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

fn run(cli: &Cli) -> Result<bool> {
    let t_total = Instant::now();
    let evaluated = cli
        .time_limit
        .map(|seconds| start_watchdog(cli.file().display().to_string(), seconds));
    let mut module = parse_file(cli.file())?;
    let partition =
        cli.partition || needs_shardy_partitioning(&mut module, cli.shardings_from.is_some())?;
    let case = match &cli.case_json {
        Some(p) => Some(load_json(p)?),
        None => None,
    };
    let global = match &cli.shardings_from {
        Some(p) => Some(parse_file(p)?),
        None => None,
    };
    let memory_limit = cli
        .memory_limit
        .or_else(xla_hlo_evaluator::memory::available_memory_bytes)
        .unwrap_or(u64::MAX);
    // Arguments follow the global module's signature.
    let entry = global.as_ref().unwrap_or(&module).entry_computation();
    let mut args = Vec::new();
    let mut argument_bytes = 0u64;
    for (i, &p) in entry.parameters.iter().enumerate() {
        let instr = entry
            .instructions
            .get(p.index())
            .ok_or_else(|| anyhow!("entry parameter {i} is missing"))?;
        check_argument_bytes(
            i,
            &instr.name,
            &instr.shape,
            &mut argument_bytes,
            memory_limit,
        )?;
        let value = match (&cli.args, &case) {
            (Some(dir), _) => {
                let path = dir.join(format!("arg{i}.npy"));
                if !path.exists() {
                    bail!(
                        "missing argument file {} for parameter {i} (%{}, {})",
                        path.display(),
                        instr.name,
                        instr.shape
                    );
                }
                Value::Array(load_argument(&path, i, &instr.name, &instr.shape)?)
            }
            (None, Some(case)) => {
                Value::Array(generate::argument(case, i, &instr.name, &instr.shape)?)
            }
            (None, None) => generate::fake_value(i, &instr.shape)?,
        };
        args.push(value);
    }
    let devices = cli.devices.unwrap_or_else(|| {
        if needs_spmd(&module) || global.is_some() {
            module.num_partitions()
        } else {
            1
        }
    });
    let partitioned = if partition {
        Some(partition::Partitioned::new(
            &module,
            cli.devices,
            cli.schedule,
            cli.consistent,
            partition::Overlap {
                threshold_mib: cli.windowed_einsum_threshold_mib,
                by_cost: cli.windowed_einsum_by_cost,
                bidirectional: cli.windowed_einsum_bidirectional,
                decompose: cli.decompose_collectives,
                combine: cli.combine_collectives,
            },
        )?)
    } else {
        None
    };
    let devices = partitioned.as_ref().map(|p| p.devices).unwrap_or(devices);
    // Every multi-device mode runs through the runtime's launcher.
    let backend = xla_runtime::backend(&cli.backend)?;
    let launch: Option<(Box<dyn Executable>, LaunchPlan)> = if let Some(pm) = &partitioned {
        let mut plan = pm.launch_plan();
        plan.num_partitions = pm.devices as usize;
        Some((backend.compile(&pm.module)?, plan))
    } else if let Some(g) = &global {
        Some((
            backend.compile(&module)?,
            launch_plan(&module, g, cli.devices)?,
        ))
    } else if devices > 1 || cli.num_processes.is_some() || backend.name() != "cpu" {
        // One device on a backend other than the interpreter still runs
        // through the launcher, so the backend is the one that runs.
        Some((
            backend.compile(&module)?,
            LaunchPlan::replicated(&module, devices.max(1) as usize),
        ))
    } else {
        None
    };
    let launch = launch.map(|(exe, mut plan)| {
        plan.consistent = cli.consistent;
        (exe, plan)
    });
    let timeout = Duration::try_from_secs_f64(cli.timeout.max(0.001))
        .map_err(|e| anyhow!("--timeout {}: {e}", cli.timeout))?;
    let processes = process_group(cli, timeout)?;
    let fingerprint = match (&processes, &launch) {
        (Some(_), Some((exe, _))) => program_fingerprint(exe.module(), &args)?,
        _ => 0,
    };
    // The runtime's interface takes literals (host bytes): converted once.
    let literal_args: Vec<xla_runtime::Literal> = match &launch {
        Some(_) => xla_runtime::cpu::literals_from_values(&args)?,
        None => Vec::new(),
    };
    let to_values = |literals: Vec<xla_runtime::Literal>| -> Result<Vec<Value>> {
        Ok(xla_runtime::cpu::values_from_literals(&literals)?)
    };
    let pipelined = match &cli.pipeline {
        Some(schedule) => Some(pipeline::Pipelined::new(
            &module,
            schedule,
            cli.stages,
            cli.virtual_stages,
            cli.tensor_parallel,
            cli.cut_layer_scans,
        )?),
        None => None,
    };
    let pipeline_args = match &pipelined {
        Some(_) => xla_runtime::cpu::literals_from_values(&args)?,
        None => Vec::new(),
    };
    let mut pipeline_json = None;
    let mut best = f64::INFINITY;
    let mut outputs = Vec::new();
    for attempt in 0..cli.repeat.max(1) {
        let t = Instant::now();
        if let Some(pipelined) = &pipelined {
            let (literals, executed) = pipelined.run(backend.as_ref(), &pipeline_args, timeout)?;
            outputs = to_values(literals)?;
            pipeline_json = Some(executed);
            best = best.min(t.elapsed().as_secs_f64());
            continue;
        }
        outputs = match (&launch, &processes) {
            (Some((exe, plan)), Some(group)) => {
                let mut plan = plan.clone();
                plan.timeout = timeout;
                let mut group = group.clone();
                group.job = format!("{}/run{attempt}", group.job);
                match xla_runtime::run_spmd_processes(
                    exe.as_ref(),
                    &literal_args,
                    &plan,
                    &group,
                    fingerprint,
                )? {
                    Some(outputs) => to_values(outputs)?,
                    None => {
                        best = best.min(t.elapsed().as_secs_f64());
                        continue;
                    }
                }
            }
            (Some((exe, plan)), None) => {
                to_values(xla_runtime::run_spmd(exe.as_ref(), &literal_args, plan)?)?
            }
            (None, _) => evaluate_on_one_device(&module, &args, memory_limit, cli.consistent)?,
        };
        best = best.min(t.elapsed().as_secs_f64());
    }
    if let Some(group) = processes.as_ref().filter(|g| g.process_id != 0) {
        if let Some(flag) = &evaluated {
            *flag.lock().unwrap_or_else(|e| e.into_inner()) = true;
        }
        let per_process = devices.max(1) as usize / group.num_processes;
        let first = group.process_id * per_process;
        println!(
            "{}",
            json!({
                "file": cli.file().display().to_string(),
                "process": group.process_id,
                "devices": (first..first + per_process).collect::<Vec<_>>(),
                "eval_s": best,
                "wall_s": t_total.elapsed().as_secs_f64(),
            })
        );
        return Ok(true);
    }
    let flat: Vec<Array> = outputs
        .iter()
        .flat_map(|v| v.leaves().into_iter().cloned())
        .collect();
    if let Some(flag) = &evaluated {
        *flag.lock().unwrap_or_else(|e| e.into_inner()) = true;
    }
    if let Some(dir) = &cli.output {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        for (i, a) in flat.iter().enumerate() {
            write_npy(&dir.join(format!("out{i}.npy")), a)?;
        }
    }
    let single_device = if cli.compare_single_device {
        let reference = global.as_ref().unwrap_or(&module);
        Some(compare_with_single_device(
            reference,
            &args,
            &flat,
            memory_limit,
            cli.consistent,
        )?)
    } else {
        None
    };
    let case_tol = |k: &str| case.as_ref().and_then(|c| c.get(k)).and_then(Json::as_f64);
    let rtol = cli.rtol.or_else(|| case_tol("rtol")).unwrap_or(1e-5);
    let atol = cli.atol.or_else(|| case_tol("atol")).unwrap_or(1e-5);
    let mut report = Vec::new();
    let mut all_ok = true;
    let mut compared = false;
    if let Some(dir) = &cli.expected {
        compared = true;
        for (i, a) in flat.iter().enumerate() {
            let path = dir.join(format!("out{i}.npy"));
            let r = match read_npy(&path) {
                Ok(e) => compare(i, a, &e, rtol, atol),
                Err(e) => json!({"index": i, "matched": false, "error": e.to_string()}),
            };
            all_ok &= r["matched"].as_bool().unwrap_or(false);
            report.push(r);
        }
        let extra = dir.join(format!("out{}.npy", flat.len()));
        if extra.exists() {
            all_ok = false;
            report.push(json!({"index": flat.len(), "matched": false, "error": "expected has more outputs than the module produced"}));
        }
    } else if let Some(summary) = case
        .as_ref()
        .and_then(|c| c.get("expected_summary"))
        .and_then(Json::as_array)
    {
        compared = true;
        for (i, a) in flat.iter().enumerate() {
            let r = match summary.get(i) {
                Some(s) => generate::check_summary(i, a, s, rtol, atol),
                None => json!({"index": i, "matched": false, "error": "no expected summary"}),
            };
            all_ok &= r["matched"].as_bool().unwrap_or(false);
            report.push(r);
        }
    } else {
        for (i, a) in flat.iter().enumerate() {
            report.push(json!({"index": i, "shape": a.shape().to_string()}));
        }
    }
    let mut line = json!({
        "file": cli.file().display().to_string(),
        "devices": devices,
        "outputs": report,
        "eval_s": best,
        "wall_s": t_total.elapsed().as_secs_f64(),
    });
    if let Some(pm) = &partitioned {
        let mut stats = pm.stats();
        if let Some(xla) = case.as_ref().and_then(|c| c.get("xla_collective_bytes")) {
            stats["xla_collective_bytes"] = xla.clone();
        }
        eprint!(
            "{}",
            summary(&stats, devices, best, compared.then_some(all_ok))
        );
        line["partition"] = stats;
    }
    if let (Some(pipelined), Some(mut executed)) = (&pipelined, pipeline_json) {
        executed["report"] = pipelined.report()?;
        line["devices"] = json!(cli.stages * cli.tensor_parallel);
        line["pipeline"] = executed;
    }
    if compared {
        line["all_matched"] = json!(all_ok);
    }
    let mut single_device_ok = true;
    if let Some(report) = single_device {
        single_device_ok = report["identical"].as_bool().unwrap_or(false);
        line["single_device"] = report;
    }
    if cli.bench_xla {
        match generate::bench_xla(cli.file(), &args, cli.repeat.max(1)) {
            Ok(xla_s) => {
                line["xla_s"] = json!(xla_s);
                line["ratio_vs_xla"] = json!(best / xla_s);
            }
            Err(e) => line["xla_error"] = json!(format!("{e:#}")),
        }
    }
    println!("{line}");
    Ok((!compared || all_ok) && single_device_ok)
}

/// This process's place in a multi-process run (`--num-processes`), if any.
fn process_group(cli: &Cli, timeout: Duration) -> Result<Option<ProcessGroup>> {
    let Some(num_processes) = cli.num_processes else {
        return Ok(None);
    };
    let coordinator = cli
        .coordinator
        .clone()
        .ok_or_else(|| anyhow!("--num-processes needs --coordinator HOST:PORT"))?;
    let process_id = cli
        .process_id
        .ok_or_else(|| anyhow!("--num-processes needs --process-id"))?;
    let bind_host = match &cli.bind_host {
        Some(h) => h.clone(),
        None => coordinator
            .rsplit_once(':')
            .map(|(host, _)| host.trim_matches(['[', ']']).to_string())
            .ok_or_else(|| anyhow!("--coordinator {coordinator:?} is not HOST:PORT"))?,
    };
    Ok(Some(ProcessGroup {
        num_processes,
        process_id,
        coordinator,
        host_coordinator: !cli.external_coordinator,
        bind_host,
        timeout,
        job: "run_hlo_module".into(),
        transport: match cli.collectives.as_str() {
            "nccl" => xla_runtime::CollectivesTransport::Nccl,
            _ => xla_runtime::CollectivesTransport::Tcp,
        },
    }))
}

/// What every process of a run must hold alike: the program it runs and
/// its global arguments.
fn program_fingerprint(module: &HloModule, args: &[Value]) -> Result<u64> {
    let text = module.to_string();
    let mut buffers = Vec::new();
    for a in args.iter().flat_map(|v| v.leaves()) {
        buffers.push(xla_hlo_evaluator::collective::to_buffer(a)?);
    }
    let mut parts: Vec<&[u8]> = vec![text.as_bytes()];
    parts.extend(buffers.iter().map(|b| b.bytes()));
    Ok(xla_runtime::distributed::fingerprint(&parts))
}

/// How to run partitioned `module` on global data described by `global`
/// (`--devices` must match the module's `num_partitions` when it has one).
fn launch_plan(module: &HloModule, global: &HloModule, devices: Option<i64>) -> Result<LaunchPlan> {
    let declared = module.num_partitions();
    let n = devices.unwrap_or(declared).max(1);
    if declared > 1 && n != declared {
        bail!("the partitioned module is for num_partitions={declared} but --devices is {n}");
    }
    Ok(LaunchPlan::from_global_module(module, global, n as usize)?)
}

/// A short human-readable report of a --partition run (stderr; stdout
/// keeps the one JSON line).
fn summary(stats: &Json, devices: i64, eval_s: f64, matched: Option<bool>) -> String {
    let f = |k: &str| stats.get(k).and_then(Json::as_f64).unwrap_or(0.0);
    let mut out = format!(
        "propagated in {:.2} ms, partitioned for {devices} devices in {:.2} ms\n",
        f("propagation_s") * 1e3,
        f("partitioning_s") * 1e3
    );
    let kinds: Vec<String> = stats
        .get("collectives")
        .and_then(Json::as_object)
        .map(|m| {
            m.iter()
                .filter(|(_, v)| v.as_u64().unwrap_or(0) > 0)
                .map(|(k, v)| format!("{k} x{v}"))
                .collect()
        })
        .unwrap_or_default();
    let ours = stats["collective_bytes"].as_u64().unwrap_or(0);
    out += &format!(
        "collectives: {} ({ours} bytes per device",
        if kinds.is_empty() {
            "none".to_string()
        } else {
            kinds.join(", ")
        }
    );
    match stats.get("xla_collective_bytes").and_then(Json::as_u64) {
        Some(xla) => out += &format!("; XLA's partitioner: {xla} bytes)\n"),
        None => out += ")\n",
    }
    if let Some(s) = stats.get("schedule") {
        let g = |k: &str| s.get(k).and_then(Json::as_f64).unwrap_or(0.0);
        out += &format!(
            "scheduled in {:.2} ms: makespan {:.1} us (lower bound {:.1} us, sequential {:.1} us), exposed communication {:.1} us\n",
            g("scheduler_ms"),
            g("makespan_us"),
            g("lower_bound_us"),
            g("sequential_makespan_us"),
            g("exposed_comm_us")
        );
    }
    out += &format!(
        "ran on {devices} loopback devices in {:.3} s{}\n",
        eval_s,
        match matched {
            Some(true) => ": outputs match XLA's",
            Some(false) => ": OUTPUTS DIFFER from the expected ones",
            None => "",
        }
    );
    out
}

/// Compares one output with its expected array.
fn compare(index: usize, a: &Array, e: &Array, rtol: f64, atol: f64) -> Json {
    let c = xla_hlo_evaluator::compare::compare(a, e, rtol, atol);
    let mut out = json!({
        "index": index,
        "shape": a.shape().to_string(),
        "max_abs_err": c.max_abs_err,
        "max_rel_err": c.max_rel_err,
        "mismatches": c.mismatches,
        "matched": c.matched(),
    });
    if !c.shape_ok {
        out["error"] = json!(format!(
            "shape {:?} differs from expected {:?}",
            a.dims, e.dims
        ));
    }
    if let Some((i, x, y)) = c.first_mismatch {
        out["first_mismatch"] = json!({"flat_index": i, "got": x, "expected": y});
    }
    out
}
