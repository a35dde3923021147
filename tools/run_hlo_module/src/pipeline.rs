//! `--pipeline SCHEDULE`: the module split into pipeline stages
//! (`xla_mpmd`) and run by the schedule's task table on `--stages` loopback
//! devices (`xla_runtime::pipeline`); the JSON line gains "pipeline": what
//! each device executed (tasks, sends, receives, peak live values and
//! bytes) and the per-stage report with the simulated step.

use anyhow::Result;
use serde_json::{json, Value};
use std::time::Duration;
use xla_hlo_ir::HloModule;
use xla_mpmd::{PipelineOptions, PipelineProgram, ScheduleKind, TaskTable};
use xla_runtime::{Backend, Literal};

/// A split program and its table, ready to run.
pub struct Pipelined {
    pub program: PipelineProgram,
    pub table: TaskTable,
}

impl Pipelined {
    pub fn new(
        module: &HloModule,
        schedule: &str,
        stages: usize,
        virtual_stages: usize,
        tensor_parallel: usize,
        cut_layer_scans: bool,
    ) -> Result<Pipelined> {
        let options = PipelineOptions {
            num_devices: stages,
            virtual_stages,
            tensor_parallel,
            cut_layer_scans,
            ..Default::default()
        };
        let program = xla_mpmd::split_pipeline(module, &options)?;
        let kind = ScheduleKind::parse(schedule)?;
        let table = xla_mpmd::task_table(kind, stages, virtual_stages, program.microbatches())?;
        Ok(Pipelined { program, table })
    }

    /// Runs it; returns the outputs and the devices' report.
    pub fn run(
        &self,
        backend: &dyn Backend,
        args: &[Literal],
        timeout: Duration,
    ) -> Result<(Vec<Literal>, Value)> {
        let run = xla_runtime::pipeline::run_pipeline(
            &self.program,
            &self.table,
            backend,
            args,
            timeout,
        )?;
        let devices: Vec<Value> = run
            .devices
            .iter()
            .enumerate()
            .map(|(d, r)| {
                json!({
                    "device": d,
                    "tasks": r.executed.len(),
                    "sends": r.sends,
                    "receives": r.receives,
                    "peak_live_values": r.peak_live_values,
                    "peak_live_bytes": r.peak_live_bytes,
                })
            })
            .collect();
        Ok((run.outputs, json!({"executed": devices})))
    }

    /// The per-stage report under the analytical cost model.
    pub fn report(&self) -> Result<Value> {
        let model = xla_latency_hiding_scheduler::cost_model_from_spec("analytical")?;
        Ok(xla_mpmd::pipeline_report(
            &self.program,
            &self.table,
            model.as_ref(),
        )?)
    }
}
