//! Simulating a task table: each device runs its tasks in table order, a
//! task starting once the device is free and every task it reads from (same
//! microbatch) has finished, plus a transfer time when that task ran on
//! another device. Reports the step time, each device's busy time, the
//! idle (bubble) fraction and the peak number of microbatches whose
//! activations a stage keeps (forward done, backward not yet).
//!
//! Invariant: a table whose dependencies cannot be met in its order is an
//! error naming the device and task that wait forever, never a hang.

use crate::error::MpmdError;
use crate::schedule::{ScheduledTask, TaskTable};
use crate::stages::{Direction, TaskKey};
use std::collections::HashMap;

/// What the simulation found.
#[derive(Clone, Debug)]
pub struct Simulation {
    /// Time from the first task's start to the last task's end.
    pub makespan: f64,
    /// Per device, the time it spends running tasks.
    pub busy: Vec<f64>,
    /// `1 - sum(busy) / (devices * makespan)`.
    pub idle_fraction: f64,
    /// Per stage, the most microbatches between their forward and backward
    /// task at once (counted in table order).
    pub peak_live_microbatches: Vec<usize>,
    /// Start and end of every task, per device in table order.
    pub timeline: Vec<Vec<(ScheduledTask, f64, f64)>>,
}

/// Simulates `table`. `dependencies(task)` lists the (stage, direction)
/// tasks of the same microbatch that `task` reads from; `cost(task)` is
/// its run time and `transfer(from, to)` the time a value takes between
/// two tasks on different devices.
pub fn simulate(
    table: &TaskTable,
    dependencies: impl Fn(TaskKey) -> Vec<TaskKey>,
    cost: impl Fn(&ScheduledTask) -> f64,
    transfer: impl Fn(&ScheduledTask, TaskKey) -> f64,
) -> Result<Simulation, MpmdError> {
    let p = table.num_devices;
    let mut finish: HashMap<(usize, usize, Direction), f64> = HashMap::new();
    let mut next = vec![0usize; p];
    let mut free_at = vec![0.0f64; p];
    let mut busy = vec![0.0f64; p];
    let mut timeline = vec![Vec::new(); p];
    let total: usize = table.devices.iter().map(Vec::len).sum();
    let mut done = 0usize;
    while done < total {
        let mut progressed = false;
        for d in 0..p {
            while let Some(task) = table.devices[d].get(next[d]) {
                let key = TaskKey {
                    stage: task.stage,
                    direction: task.direction,
                };
                let mut ready = free_at[d];
                let mut waiting = false;
                for dep in dependencies(key) {
                    match finish.get(&(dep.stage, task.microbatch, dep.direction)) {
                        Some(&end) => {
                            let delay = if dep.stage % p == d {
                                0.0
                            } else {
                                transfer(task, dep)
                            };
                            ready = ready.max(end + delay);
                        }
                        None => {
                            waiting = true;
                            break;
                        }
                    }
                }
                if waiting {
                    break;
                }
                let end = ready + cost(task);
                busy[d] += end - ready;
                free_at[d] = end;
                finish.insert((task.stage, task.microbatch, task.direction), end);
                timeline[d].push((*task, ready, end));
                next[d] += 1;
                done += 1;
                progressed = true;
            }
        }
        if !progressed {
            let (d, task) = (0..p)
                .find_map(|d| table.devices[d].get(next[d]).map(|t| (d, *t)))
                .expect("some task is left");
            return Err(MpmdError::Options(format!(
                "the {} table deadlocks: device {d} waits forever at stage {} microbatch {} {:?}",
                table.kind.name(),
                task.stage,
                task.microbatch,
                task.direction
            )));
        }
    }
    let makespan = free_at.iter().cloned().fold(0.0, f64::max);
    let idle_fraction = if makespan > 0.0 {
        1.0 - busy.iter().sum::<f64>() / (p as f64 * makespan)
    } else {
        0.0
    };
    let mut peak = vec![0usize; table.num_stages()];
    for tasks in &table.devices {
        let mut live = vec![0usize; table.num_stages()];
        for task in tasks {
            match task.direction {
                Direction::Forward => {
                    live[task.stage] += 1;
                    peak[task.stage] = peak[task.stage].max(live[task.stage]);
                }
                Direction::Backward => live[task.stage] = live[task.stage].saturating_sub(1),
            }
        }
    }
    Ok(Simulation {
        makespan,
        busy,
        idle_fraction,
        peak_live_microbatches: peak,
        timeline,
    })
}
