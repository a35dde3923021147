//! Pipeline schedules as task tables: for each device, the ordered list of
//! (stage, microbatch, direction) tasks it runs.
//!
//! - GPipe: every forward task, then every backward task.
//! - 1F1B: `p - 1 - d` warm-up forwards on device `d`, then one forward and
//!   one backward in turn, then the remaining backwards (PipeDream-Flush).
//! - Interleaved 1F1B (Megatron-LM): `v` virtual stages per device (stage
//!   `c * p + d` is chunk `c` of device `d`); forwards visit the chunks in
//!   groups of `p` microbatches, backwards the chunks in reverse, after
//!   `2 (p - 1 - d) + (v - 1) p` warm-up forwards.
//!
//! Invariants: every (stage, microbatch, direction) appears exactly once, on
//! the device `stage % p`; each stage runs its microbatches in increasing
//! order in each direction (so point-to-point messages of one value arrive
//! in the order they are consumed).

use crate::error::MpmdError;
use crate::stages::Direction;

/// Which schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScheduleKind {
    GPipe,
    OneFOneB,
    Interleaved,
}

impl ScheduleKind {
    pub fn parse(name: &str) -> Result<ScheduleKind, MpmdError> {
        match name.to_ascii_lowercase().as_str() {
            "gpipe" => Ok(ScheduleKind::GPipe),
            "1f1b" => Ok(ScheduleKind::OneFOneB),
            "interleaved" | "interleaved-1f1b" | "interleaved_1f1b" => {
                Ok(ScheduleKind::Interleaved)
            }
            other => Err(MpmdError::Options(format!(
                "unknown schedule {other:?}: expected gpipe, 1f1b or interleaved"
            ))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ScheduleKind::GPipe => "gpipe",
            ScheduleKind::OneFOneB => "1f1b",
            ScheduleKind::Interleaved => "interleaved",
        }
    }
}

/// One entry of a task table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ScheduledTask {
    pub stage: usize,
    pub microbatch: usize,
    pub direction: Direction,
}

/// The task table of a schedule.
#[derive(Clone, Debug)]
pub struct TaskTable {
    pub kind: ScheduleKind,
    pub num_devices: usize,
    pub virtual_stages: usize,
    pub microbatches: usize,
    /// Per device, its tasks in the order it runs them.
    pub devices: Vec<Vec<ScheduledTask>>,
}

impl TaskTable {
    pub fn num_stages(&self) -> usize {
        self.num_devices * self.virtual_stages
    }
}

/// The task table of `kind` for `p` devices, `v` virtual stages per device
/// and `m` microbatches.
pub fn task_table(
    kind: ScheduleKind,
    p: usize,
    v: usize,
    m: usize,
) -> Result<TaskTable, MpmdError> {
    if p == 0 || v == 0 || m == 0 {
        return Err(MpmdError::Options(format!(
            "devices ({p}), virtual stages ({v}) and microbatches ({m}) must be positive"
        )));
    }
    if kind != ScheduleKind::Interleaved && v != 1 {
        return Err(MpmdError::Options(format!(
            "{} runs one stage per device; {v} virtual stages need the interleaved schedule",
            kind.name()
        )));
    }
    let task = |stage, microbatch, direction| ScheduledTask {
        stage,
        microbatch,
        direction,
    };
    let devices = match kind {
        ScheduleKind::GPipe => (0..p)
            .map(|d| {
                let forward = (0..m).map(|i| task(d, i, Direction::Forward));
                let backward = (0..m).map(|i| task(d, i, Direction::Backward));
                forward.chain(backward).collect()
            })
            .collect(),
        ScheduleKind::OneFOneB => (0..p)
            .map(|d| {
                let warmup = (p - 1 - d).min(m);
                let mut tasks = Vec::with_capacity(2 * m);
                tasks.extend((0..warmup).map(|i| task(d, i, Direction::Forward)));
                for k in 0..m - warmup {
                    tasks.push(task(d, warmup + k, Direction::Forward));
                    tasks.push(task(d, k, Direction::Backward));
                }
                tasks.extend((m - warmup..m).map(|i| task(d, i, Direction::Backward)));
                tasks
            })
            .collect(),
        ScheduleKind::Interleaved => {
            if m % p != 0 {
                return Err(MpmdError::Options(format!(
                    "the interleaved schedule needs the microbatch count ({m}) to be a multiple of the devices ({p})"
                )));
            }
            (0..p).map(|d| interleaved_device(d, p, v, m)).collect()
        }
    };
    Ok(TaskTable {
        kind,
        num_devices: p,
        virtual_stages: v,
        microbatches: m,
        devices,
    })
}

/// Device `d`'s tasks under interleaved 1F1B.
fn interleaved_device(d: usize, p: usize, v: usize, m: usize) -> Vec<ScheduledTask> {
    let steps = m * v;
    let chunk_of = |k: usize, direction: Direction| {
        let chunk = (k % (p * v)) / p;
        match direction {
            Direction::Forward => chunk,
            Direction::Backward => v - 1 - chunk,
        }
    };
    let microbatch_of = |k: usize| (k / (p * v)) * p + k % p;
    let step = |k: usize, direction| ScheduledTask {
        stage: chunk_of(k, direction) * p + d,
        microbatch: microbatch_of(k),
        direction,
    };
    let warmup = (2 * (p - 1 - d) + (v - 1) * p).min(steps);
    let mut tasks = Vec::with_capacity(2 * steps);
    tasks.extend((0..warmup).map(|k| step(k, Direction::Forward)));
    for k in 0..steps - warmup {
        tasks.push(step(warmup + k, Direction::Forward));
        tasks.push(step(k, Direction::Backward));
    }
    tasks.extend((steps - warmup..steps).map(|k| step(k, Direction::Backward)));
    tasks
}
