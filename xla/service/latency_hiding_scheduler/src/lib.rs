//! Latency-hiding scheduling for HLO modules, after XLA's
//! `latency_hiding_scheduler.cc`: a pass that turns collectives into
//! async start/done pairs (`async-collective-creator`), a list scheduler
//! that orders each computation so that communication overlaps
//! independent compute within per-resource overlap limits and an optional
//! memory limit (`latency-hiding-scheduler`), cost models behind one trait
//! (XLA's approximate units, an analytical NVLink/roofline model with
//! H100/H200 defaults, measured tables), a discrete-event simulator with
//! lower bounds, a schedule validator and Chrome/Perfetto traces.
//!
//! Invariants: the scheduler's output is a module whose arena order is a
//! valid schedule (`is_scheduled=true`; every dependency respected, every
//! start before its done, overlap limits and the memory limit kept) that
//! the verifier and XLA's parser accept; schedules are deterministic;
//! nothing here panics on malformed input (errors are `SchedulerError` or
//! `PassError`).

pub mod calls;
pub mod convert;
pub mod cost;
pub mod error;
pub mod exact;
pub mod graph;
pub mod kinds;
pub mod memory;
pub mod pass;
pub mod report;
pub mod scheduler;
pub mod simulator;
pub mod trace;
pub mod validate;

pub use convert::{convert_collectives, AsyncCollectiveCreator, AsyncConversionConfig};
pub use cost::{
    cost_model_from_spec, AnalyticalCostModel, ApproximateCostModel, CostModel, CostTable, GpuSpec,
    TableCostModel,
};
pub use error::SchedulerError;
pub use graph::CompSummary;
pub use kinds::{ResourceKind, NUM_RESOURCES};
pub use pass::{schedule_module, LatencyHidingScheduler, ScheduleStats, SchedulerConfig};
pub use report::{exact_gaps, ComputationGap, ScheduleReport};
pub use scheduler::{MemoryPolicy, PressureOrder, Priority};
pub use simulator::{simulate_module, ModuleSimulation, Timeline};
pub use trace::chrome_trace;
pub use validate::{validate_schedule, Validation, Violation};
