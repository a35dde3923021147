//! `--partition`: runs sharding propagation and the SPMD partitioner on the
//! module (with `--schedule`, then the latency-hiding scheduler under the
//! analytical NVLink cost model); the runtime's launcher then runs the
//! per-device program on N devices, splitting the global arguments by the
//! entry parameters' shardings and assembling the global outputs by the
//! root's sharding (checking that replicas agree).
//!
//! Invariant: the outputs have the unpartitioned module's shapes, in its
//! flattened output order, so they compare with the same expected arrays.

use anyhow::{anyhow, Result};
use serde_json::{json, Value as Json};
use xla_hlo_ir::{HloModule, Shape};

/// A module partitioned for N devices, ready to run on global arguments.
pub struct Partitioned {
    pub module: HloModule,
    pub devices: i64,
    out_shape: Shape,
    stats: Json,
}

/// What runs after partitioning to create overlap: `windowed-einsum`
/// (`--windowed-einsum-*`), `decompose-collectives`
/// (`--decompose-collectives`) and `combine-collectives`
/// (`--combine-collectives`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Overlap {
    pub threshold_mib: Option<f64>,
    pub by_cost: bool,
    pub bidirectional: bool,
    pub decompose: bool,
    pub combine: bool,
}

/// Runs `windowed-einsum`, `decompose-collectives` and
/// `combine-collectives` (each when asked) on the partitioned module `m`; returns the loops made and the
/// module's static collectives afterwards (a permute in a loop body counts
/// once).
fn add_overlap(m: &mut HloModule, n: i64, overlap: &Overlap) -> Result<Json> {
    let options = xla_pipelines::PipelineOptions {
        num_partitions: Some(n),
        windowed_einsum: xla_pipelines::WindowedEinsumOptions {
            threshold_mib: overlap.threshold_mib.or(Some(0.0)),
            bidirectional: overlap.bidirectional,
            ..Default::default()
        },
        windowed_einsum_by_cost: overlap.by_cost,
        ..Default::default()
    };
    let loops = |m: &HloModule| {
        m.computations
            .iter()
            .flat_map(|c| &c.instructions)
            .filter(|i| i.opcode == xla_hlo_ir::Opcode::While)
            .count()
    };
    let before = loops(m);
    let windows = overlap.threshold_mib.is_some() || overlap.by_cost;
    let passes: Vec<&str> = [
        windows.then_some("windowed-einsum"),
        overlap.decompose.then_some("decompose-collectives"),
        overlap.combine.then_some("combine-collectives"),
    ]
    .into_iter()
    .flatten()
    .collect();
    xla_pipelines::pipeline(&options, "overlap", &passes.join(","))?.run(m)?;
    let stats = xla_hlo_ir::stats::ModuleStats::of(m);
    Ok(json!({
        "loops": loops(m) - before,
        "collectives": stats.collectives,
        "collective_bytes": stats.collective_bytes,
    }))
}

impl Partitioned {
    /// Propagates shardings and partitions `module` for `devices` (default:
    /// the module's `num_partitions`), then windows collective-and-dot
    /// pairs as `overlap` asks.
    /// With `consistent`, the partitioner runs in consistent mode and the
    /// statistics gain what that cost (see [`consistency_cost`]).
    pub fn new(
        module: &HloModule,
        devices: Option<i64>,
        schedule: bool,
        consistent: bool,
        overlap: Overlap,
    ) -> Result<Partitioned> {
        let n = devices.unwrap_or_else(|| module.num_partitions()).max(1);
        let options = xla_pipelines::PipelineOptions {
            num_partitions: Some(n),
            consistent,
            ..Default::default()
        };
        let mut m = module.clone();
        // Propagation changes no shape, so the global outputs have the input's root shape.
        let out_shape = m.entry_computation().root_instr().shape.clone();
        let report = xla_pipelines::spmd_pipeline(&options, false).run(&mut m)?;
        let windowed = if overlap.threshold_mib.is_some()
            || overlap.by_cost
            || overlap.decompose
            || overlap.combine
        {
            Some(add_overlap(&mut m, n, &overlap)?)
        } else {
            None
        };
        let seconds = |pass: &str| {
            report
                .runs
                .iter()
                .filter(|r| r.name == pass)
                .map(|r| r.duration.as_secs_f64())
                .sum::<f64>()
        };
        let (propagation_s, partitioning_s) = (
            seconds("sharding-propagation"),
            seconds("spmd-partitioning"),
        );
        let schedule_report = if schedule {
            Some(schedule_module(&options, &mut m)?)
        } else {
            None
        };
        let s = options
            .partition_summary
            .borrow()
            .clone()
            .ok_or_else(|| anyhow!("the partitioner returned no summary"))?;
        let fallbacks: Vec<&String> = s
            .handlers
            .keys()
            .filter(|k| k.ends_with(":fallback"))
            .collect();
        let stats = json!({
            "num_partitions": n,
            "propagation_s": propagation_s,
            "partitioning_s": partitioning_s,
            "collectives": s.collectives,
            "collective_bytes": s.collective_bytes,
            "collective_bytes_by_op": s.collective_bytes_by_op,
            "fallbacks": fallbacks,
        });
        let mut stats = stats;
        if let Some(windowed) = windowed {
            stats["windowed_einsum"] = windowed;
        }
        if let Some(r) = schedule_report {
            stats["schedule"] = r;
        }
        if consistent {
            stats["consistency"] = consistency_cost(module, n, &m, &s, &options)?;
        }
        Ok(Partitioned {
            module: m,
            devices: n,
            out_shape,
            stats,
        })
    }

    /// How the runtime's launcher runs it: the global shardings on its
    /// entry, the unpartitioned module's result shape, replicas checked.
    pub fn launch_plan(&self) -> xla_runtime::LaunchPlan {
        xla_runtime::LaunchPlan::for_partitioned(&self.module, self.out_shape.clone())
    }

    /// Partitioning statistics for the JSON line.
    pub fn stats(&self) -> Json {
        self.stats.clone()
    }
}

/// What consistent mode cost for `module` on `n` devices: its partitioned
/// program `consistent_module` (summary `consistent`) beside the default
/// mode's, in collective bytes per device and simulated step time (the
/// options' cost model, every collective synchronous, program order), and
/// the instructions whose default layout it changed (`relayouts`: handler
/// notes `<opcode>:consistent-*`).
fn consistency_cost(
    module: &HloModule,
    n: i64,
    consistent_module: &HloModule,
    consistent: &xla_spmd_partitioner::PartitionSummary,
    options: &xla_pipelines::PipelineOptions,
) -> Result<Json> {
    let default_options = xla_pipelines::PipelineOptions {
        num_partitions: Some(n),
        ..Default::default()
    };
    let mut default_module = module.clone();
    xla_pipelines::spmd_pipeline(&default_options, false).run(&mut default_module)?;
    let default = default_options
        .partition_summary
        .borrow()
        .clone()
        .ok_or_else(|| anyhow!("the partitioner returned no summary"))?;
    let simulated_us = |m: &HloModule| -> Result<f64> {
        let lanes = &options.scheduler.overlap_limits;
        Ok(xla_latency_hiding_scheduler::simulator::simulate_module(
            m,
            options.cost_model.as_ref(),
            lanes,
            false,
        )?
        .entry
        .sequential)
    };
    let relayouts: serde_json::Map<String, Json> = consistent
        .handlers
        .iter()
        .filter(|(k, _)| k.contains(":consistent-"))
        .map(|(k, &v)| (k.clone(), json!(v)))
        .collect();
    Ok(json!({
        "default_collective_bytes": default.collective_bytes,
        "collective_bytes": consistent.collective_bytes,
        "extra_bytes": consistent.collective_bytes as i64 - default.collective_bytes as i64,
        "default_simulated_us": simulated_us(&default_module)?,
        "simulated_us": simulated_us(consistent_module)?,
        "relayouts": relayouts,
    }))
}

/// Schedules `m` with the latency-hiding scheduler (the options' cost
/// model, the analytical one); returns the schedule report (makespan, lower
/// bound, sequential makespan, exposed communication, peak memory,
/// scheduler time).
fn schedule_module(options: &xla_pipelines::PipelineOptions, m: &mut HloModule) -> Result<Json> {
    let original = m.clone();
    let report =
        xla_pipelines::pipeline(options, "schedule", xla_pipelines::SCHEDULER_PASS)?.run(m)?;
    let scheduler_ms: f64 = report
        .runs
        .iter()
        .map(|r| r.duration.as_secs_f64() * 1e3)
        .sum();
    let (report, _) = xla_latency_hiding_scheduler::ScheduleReport::compute(
        &original,
        m,
        options.cost_model.as_ref(),
        &options.scheduler.overlap_limits,
        scheduler_ms,
        None,
        false,
    )?;
    Ok(report.to_json())
}
