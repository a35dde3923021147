//! `--partition`: runs sharding propagation and the SPMD partitioner on the
//! module (with `--schedule`, then the latency-hiding scheduler under the
//! analytical NVLink cost model), then the per-device program on N loopback
//! devices, splitting the global arguments by the entry parameters'
//! shardings and assembling the global outputs by the root's sharding
//! (checking that replicas agree).
//!
//! Invariant: the outputs have the unpartitioned module's shapes, in its
//! flattened output order, so they compare with the same expected arrays.

use anyhow::{anyhow, Result};
use serde_json::{json, Value as Json};
use std::time::Instant;
use xla_hlo_evaluator::Value;
use xla_hlo_ir::{HloModule, Shape};
use xla_hlo_pass::{Pass, Pipeline};

/// A module partitioned for N devices, ready to run on global arguments.
pub struct Partitioned {
    pub module: HloModule,
    pub devices: i64,
    out_shape: Shape,
    stats: Json,
}

impl Partitioned {
    /// Propagates shardings and partitions `module` for `devices` (default:
    /// the module's `num_partitions`).
    pub fn new(module: &HloModule, devices: Option<i64>, schedule: bool) -> Result<Partitioned> {
        let n = devices.unwrap_or_else(|| module.num_partitions()).max(1);
        let mut m = module.clone();
        let t0 = Instant::now();
        Pipeline::new("propagation")
            .add(xla_sharding_propagation::ShardingPropagation::default())
            .run(&mut m)?;
        let t1 = Instant::now();
        let out_shape = m.entry_computation().root_instr().shape.clone();
        let mut pass =
            xla_spmd_partitioner::SpmdPartitioner::new(xla_spmd_partitioner::SpmdOptions {
                num_partitions: Some(n),
            });
        pass.run(&mut m)?;
        let t2 = Instant::now();
        xla_hlo_verifier::verify(&m)
            .map_err(|e| anyhow!("the partitioned module does not verify:\n{e}"))?;
        let schedule_report = if schedule {
            Some(schedule_module(&mut m)?)
        } else {
            None
        };
        let s = pass
            .last_summary
            .clone()
            .ok_or_else(|| anyhow!("the partitioner returned no summary"))?;
        let fallbacks: Vec<&String> = s
            .handlers
            .keys()
            .filter(|k| k.ends_with(":fallback"))
            .collect();
        let stats = json!({
            "num_partitions": n,
            "propagation_s": (t1 - t0).as_secs_f64(),
            "partitioning_s": (t2 - t1).as_secs_f64(),
            "collectives": s.collectives,
            "collective_bytes": s.collective_bytes,
            "collective_bytes_by_op": s.collective_bytes_by_op,
            "fallbacks": fallbacks,
        });
        let mut stats = stats;
        if let Some(r) = schedule_report {
            stats["schedule"] = r;
        }
        Ok(Partitioned {
            module: m,
            devices: n,
            out_shape,
            stats,
        })
    }

    /// Runs on global arguments; returns the global outputs (root tuple split).
    pub fn run(&self, args: &[Value]) -> Result<Vec<Value>> {
        let v = xla_spmd_partitioner::exec::run_partitioned(
            &self.module,
            args,
            &self.out_shape,
            self.devices,
            true,
        )?;
        Ok(match (v, &self.out_shape) {
            (Value::Tuple(e), Shape::Tuple(_)) => e,
            (v, _) => vec![v],
        })
    }

    /// Partitioning statistics for the JSON line.
    pub fn stats(&self) -> Json {
        self.stats.clone()
    }
}

/// Schedules `m` with the latency-hiding scheduler (analytical cost model);
/// returns the schedule report (makespan, lower bound, sequential makespan,
/// exposed communication, peak memory, scheduler time).
fn schedule_module(m: &mut HloModule) -> Result<Json> {
    use xla_latency_hiding_scheduler as lhs;
    let model = lhs::cost_model_from_spec("analytical")?;
    let config = lhs::SchedulerConfig::default();
    let original = m.clone();
    let t = Instant::now();
    lhs::LatencyHidingScheduler::new(config.clone(), model.clone()).run(m)?;
    let scheduler_ms = t.elapsed().as_secs_f64() * 1e3;
    xla_hlo_verifier::verify(m)
        .map_err(|e| anyhow!("the scheduled module does not verify:\n{e}"))?;
    let (report, _) = lhs::ScheduleReport::compute(
        &original,
        m,
        model.as_ref(),
        &config.overlap_limits,
        scheduler_ms,
        None,
        false,
    )?;
    Ok(report.to_json())
}
