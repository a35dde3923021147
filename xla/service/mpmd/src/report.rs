//! The per-stage report of a pipelined program under a schedule: each
//! stage's work (instructions, compute time under a cost model), what it
//! sends per microbatch, its peak live activations (microbatches and
//! bytes), and the simulated step: makespan, per-device busy and idle time,
//! the idle (bubble) fraction beside the schedule's closed form and beside
//! the same table simulated with uniform stages (forward 1, backward 2).
//!
//! Invariant: live activation bytes count what the runtime keeps for a
//! stage's backward task (values read by it that forward tasks produced),
//! times the peak number of microbatches between forward and backward.

use crate::error::MpmdError;
use crate::schedule::{ScheduleKind, TaskTable};
use crate::simulate::{simulate, Simulation};
use crate::split::TaskInput;
use crate::stages::{Direction, TaskKey};
use crate::PipelineProgram;
use serde_json::{json, Value};
use xla_latency_hiding_scheduler::CostModel;

/// Bytes per microsecond between two devices (450 GB/s, one direction of
/// an H100's NVLink) for the simulated transfers.
pub const LINK_BYTES_PER_US: f64 = 450_000.0;

/// The idle fraction a schedule has with uniform stages and free transfers.
pub fn closed_form_idle_fraction(kind: ScheduleKind, p: usize, v: usize, m: usize) -> f64 {
    let (p, v, m) = (p as f64, v as f64, m as f64);
    match kind {
        ScheduleKind::GPipe | ScheduleKind::OneFOneB => (p - 1.0) / (m + p - 1.0),
        ScheduleKind::Interleaved => (p - 1.0) / (v * m + p - 1.0),
    }
}

/// `table` simulated with uniform stages (forward 1, backward 2, free
/// transfers): the premise of the closed forms.
pub fn simulate_uniform(
    program: &PipelineProgram,
    table: &TaskTable,
) -> Result<Simulation, MpmdError> {
    simulate(
        table,
        |key| program.dependencies(key),
        |t| match t.direction {
            Direction::Forward => 1.0,
            Direction::Backward => 2.0,
        },
        |_, _| 0.0,
    )
}

/// The report as one JSON object.
pub fn pipeline_report(
    program: &PipelineProgram,
    table: &TaskTable,
    model: &dyn CostModel,
) -> Result<Value, MpmdError> {
    let s = program.num_stages();
    let p = program.num_devices;
    let costs = program.task_costs(model)?;
    let sizes = program.task_sizes();
    let cost_of = |stage: usize, direction: Direction| costs[TaskKey { stage, direction }.order(s)];
    let simulated = simulate(
        table,
        |key| program.dependencies(key),
        |t| cost_of(t.stage, t.direction),
        |t, dep| {
            let bytes: u64 = program
                .task(TaskKey {
                    stage: t.stage,
                    direction: t.direction,
                })
                .inputs
                .iter()
                .filter_map(|i| match i {
                    TaskInput::Value(v) if program.values[*v].producer == dep.order(s) => {
                        Some(program.values[*v].shape.byte_size())
                    }
                    _ => None,
                })
                .sum();
            bytes as f64 / LINK_BYTES_PER_US
        },
    )?;
    let uniform = simulate_uniform(program, table)?;
    let stages: Vec<Value> = (0..s)
        .map(|stage| {
            let forward = TaskKey {
                stage,
                direction: Direction::Forward,
            };
            let backward = TaskKey {
                stage,
                direction: Direction::Backward,
            };
            let device = program.device_of_stage(stage);
            let sends: usize = [forward, backward]
                .iter()
                .map(|key| {
                    program
                        .values
                        .iter()
                        .filter(|v| v.producer == key.order(s))
                        .map(|v| {
                            let destinations = program.destination_devices(v);
                            destinations.iter().filter(|&&d| d != device).count()
                        })
                        .sum::<usize>()
                })
                .sum();
            let kept_bytes: u64 = program
                .task(backward)
                .inputs
                .iter()
                .filter_map(|i| match i {
                    TaskInput::Value(v) if program.values[*v].producer < s => {
                        Some(program.values[*v].shape.byte_size())
                    }
                    _ => None,
                })
                .sum();
            let peak = simulated.peak_live_microbatches[stage];
            let sent_bytes = program.sent_bytes(forward) + program.sent_bytes(backward);
            json!({
                "stage": stage,
                "device": device,
                "forward_instructions": sizes[forward.order(s)],
                "backward_instructions": sizes[backward.order(s)],
                "forward_us": cost_of(stage, Direction::Forward),
                "backward_us": cost_of(stage, Direction::Backward),
                "sends_per_microbatch": sends,
                "sent_bytes_per_microbatch": sent_bytes,
                "peak_live_microbatches": peak,
                "kept_bytes_per_microbatch": kept_bytes,
                "peak_live_activation_bytes": kept_bytes * peak as u64,
            })
        })
        .collect();
    let devices: Vec<Value> = (0..p)
        .map(|d| {
            json!({
                "device": d,
                "tasks": table.devices[d].len(),
                "busy_us": simulated.busy[d],
                "idle_us": simulated.makespan - simulated.busy[d],
            })
        })
        .collect();
    let closed_form = closed_form_idle_fraction(
        table.kind,
        p,
        program.virtual_stages,
        program.microbatches(),
    );
    Ok(json!({
        "schedule": table.kind.name(),
        "devices": p,
        "virtual_stages": program.virtual_stages,
        "stages": s,
        "microbatches": program.microbatches(),
        "cost_model": model.name(),
        "makespan_us": simulated.makespan,
        "idle_fraction": simulated.idle_fraction,
        "uniform_stages_idle_fraction": uniform.idle_fraction,
        "closed_form_idle_fraction": closed_form,
        "per_stage": stages,
        "per_device": devices,
    }))
}
