//! The one registry of passes that can be run by name, and the standard
//! SPMD pipeline built from it. `hlo-opt --passes`, `run_hlo_module
//! --partition [--schedule]` and the C++ API all build their pipelines here,
//! so a pass is registered, described and configured in one place.
//!
//! Invariants:
//! - every pass the project can run by name is registered here, once, in the
//!   order `hlo-opt --help` lists them;
//! - a registered pass is configured only from [`PipelineOptions`] (no
//!   other state), so the same options give the same pipeline;
//! - the partitioner's summary of its last run is recorded in
//!   [`PipelineOptions::partition_summary`], which is the only way a caller
//!   of a by-name pipeline sees it.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use xla_hlo_ir::HloModule;
use xla_hlo_pass::{Pass, PassError, PassRegistry, Pipeline};
use xla_latency_hiding_scheduler::{CostModel, SchedulerConfig};
pub use xla_sharding_propagation::shardy_import;
pub use xla_sharding_propagation::ShardingPropagationOptions;
pub use xla_spmd_partitioner::windowed_einsum::WindowedEinsumOptions;
use xla_spmd_partitioner::{PartitionSummary, SpmdOptions, SpmdPartitioner};

pub mod combine;
pub mod decompose;
pub mod windowed;

/// Names of the passes of XLA's SPMD pipeline, in order: propagation, then
/// partitioning.
pub const SPMD_PASSES: &[&str] = &["sharding-propagation", "spmd-partitioning"];

/// The scheduling pass that follows [`SPMD_PASSES`] when a schedule is wanted.
pub const SCHEDULER_PASS: &str = "latency-hiding-scheduler";

/// Where the partitioner records the summary of its last run.
pub type SummaryCell = Rc<RefCell<Option<PartitionSummary>>>;

/// How the registered passes are configured.
#[derive(Clone)]
pub struct PipelineOptions {
    /// Partition count for `spmd-partitioning`; `None` reads it from the module.
    pub num_partitions: Option<i64>,
    /// The latency-hiding scheduler's configuration.
    pub scheduler: SchedulerConfig,
    /// The scheduler's cost model.
    pub cost_model: Arc<dyn CostModel>,
    /// Filled by every run of `spmd-partitioning` built from these options.
    pub partition_summary: SummaryCell,
    /// Options of `sharding-propagation` (XLA's `is_spmd`, permissions, ...).
    pub propagation: ShardingPropagationOptions,
    /// `spmd-partitioning` in consistent mode (`SpmdOptions::consistent`).
    pub consistent: bool,
    /// When `windowed-einsum` windows a dot (its threshold; off by default,
    /// and then the standard pipeline does not run it).
    pub windowed_einsum: WindowedEinsumOptions,
    /// `windowed-einsum` windows only the pairs the cost model says pay
    /// (`windowed::WindowedEinsumPass`).
    pub windowed_einsum_by_cost: bool,
    /// The standard pipeline runs `decompose-collectives` after
    /// partitioning (and windowing).
    pub decompose_collectives: bool,
    /// The standard pipeline runs `combine-collectives` after
    /// decomposition (groups within these limits, kept where the cost
    /// model says they pay).
    pub combine_collectives: Option<xla_spmd_partitioner::combine::CombineOptions>,
}

impl Default for PipelineOptions {
    /// XLA's defaults: the partition count from the module, the default
    /// scheduler configuration and the analytical cost model.
    fn default() -> PipelineOptions {
        PipelineOptions {
            num_partitions: None,
            scheduler: SchedulerConfig::default(),
            cost_model: default_cost_model(),
            partition_summary: SummaryCell::default(),
            propagation: Default::default(),
            consistent: false,
            windowed_einsum: WindowedEinsumOptions::default(),
            windowed_einsum_by_cost: false,
            decompose_collectives: false,
            combine_collectives: None,
        }
    }
}

/// The analytical cost model (`--cost-model analytical`), the default.
pub fn default_cost_model() -> Arc<dyn CostModel> {
    xla_latency_hiding_scheduler::cost_model_from_spec("analytical")
        .expect("the analytical cost model needs no input")
}

/// Every pass that can be run by name, configured by `options`.
pub fn registry(options: &PipelineOptions) -> PassRegistry {
    let mut registry = PassRegistry::new();
    registry.register(
        "shardy-import",
        "turn Shardy annotations (xla.sdy.* attributes and custom calls of a default JAX lowering) into GSPMD forms",
        || Box::new(xla_sharding_propagation::ShardyImport),
    );
    registry.register(
        "sdy-propagation",
        "Shardy's propagation on a module with Shardy annotations, exported to GSPMD shardings (XLA's shardy-xla)",
        || Box::new(xla_sharding_propagation::SdyPropagation),
    );
    registry.register(
        "sharding-propagation",
        "complete user shardings to every instruction (XLA's GSPMD propagation; on a module with Shardy annotations, Shardy's propagation as sdy-propagation)",
        {
            let propagation = options.propagation.clone();
            move || Box::new(xla_sharding_propagation::ShardingPropagation::new(propagation.clone()))
        },
    );
    registry.register(
        "complete-shardings",
        "give {replicated} to instructions still unsharded in partitioned computations",
        || Box::new(xla_sharding_propagation::ShardingCompletion),
    );
    let spmd_options = SpmdOptions {
        num_partitions: options.num_partitions,
        consistent: options.consistent,
    };
    let summary = options.partition_summary.clone();
    registry.register(
        "spmd-partitioning",
        "partition a sharded module into the per-device SPMD program (XLA's spmd-partitioning)",
        move || {
            Box::new(RecordSummary {
                partitioner: SpmdPartitioner::new(spmd_options.clone()),
                summary: summary.clone(),
            })
        },
    );
    let windowed = options.windowed_einsum.clone();
    let by_cost = options.windowed_einsum_by_cost;
    let model = options.cost_model.clone();
    let scheduler = options.scheduler.clone();
    registry.register(
        "windowed-einsum",
        "turn all-gather-then-dot and dot-then-reduce-scatter into loops over windows moved by collective-permute (XLA's windowed einsum; --windowed-einsum-threshold-mib, --windowed-einsum-by-cost)",
        move || {
            Box::new(windowed::WindowedEinsumPass {
                options: windowed.clone(),
                by_cost,
                model: model.clone(),
                scheduler: scheduler.clone(),
            })
        },
    );
    let model = options.cost_model.clone();
    let scheduler = options.scheduler.clone();
    registry.register(
        "decompose-collectives",
        "split collectives and the dots they feed or come from into chunks that overlap, where the cost model says it pays (Concerto's decomposition)",
        move || {
            Box::new(decompose::DecomposeCollectives {
                model: model.clone(),
                scheduler: scheduler.clone(),
            })
        },
    );
    let model = options.cost_model.clone();
    let scheduler = options.scheduler.clone();
    let combine_options = options.combine_collectives.clone().unwrap_or_default();
    registry.register(
        "combine-collectives",
        "combine independent all-reduces, all-gathers or reduce-scatters into one where the cost model says it pays (XLA's collective combiners)",
        move || {
            Box::new(combine::CombineCollectives {
                options: combine_options.clone(),
                model: model.clone(),
                scheduler: scheduler.clone(),
            })
        },
    );
    registry.register(
        "async-collective-creator",
        "turn collectives into async start/done pairs (XLA's AsyncCollectiveCreator)",
        || Box::new(xla_latency_hiding_scheduler::AsyncCollectiveCreator::default()),
    );
    let config = options.scheduler.clone();
    let model = options.cost_model.clone();
    registry.register(
        SCHEDULER_PASS,
        "convert collectives to async pairs and schedule them to overlap compute (--cost-model, --memory-limit)",
        move || {
            Box::new(xla_latency_hiding_scheduler::LatencyHidingScheduler::new(
                config.clone(),
                model.clone(),
            ))
        },
    );
    registry
}

/// A pipeline named `name` of the comma-separated `passes` (unknown names
/// are an error listing the known ones).
pub fn pipeline(
    options: &PipelineOptions,
    name: &str,
    passes: &str,
) -> Result<Pipeline, PassError> {
    registry(options).pipeline(name, passes)
}

/// Runs `passes` (names from the registry, comma-separated) on `module`
/// with the default options, verifying after each: for crates that run a
/// few passes on the modules they build (stage programs, tactic steps).
pub fn run_passes(
    module: &mut HloModule,
    pipeline_name: &str,
    passes: &str,
) -> Result<(), PassError> {
    pipeline(&PipelineOptions::default(), pipeline_name, passes)?.run(module)?;
    Ok(())
}

/// The standard SPMD pipeline: [`SPMD_PASSES`], `windowed-einsum` when
/// its threshold is set, `decompose-collectives` and `combine-collectives`
/// when asked, then the
/// scheduler when `schedule` is set.
pub fn spmd_pipeline(options: &PipelineOptions, schedule: bool) -> Pipeline {
    let mut names = SPMD_PASSES.to_vec();
    if options.windowed_einsum.threshold_mib.is_some() {
        names.push("windowed-einsum");
    }
    if options.decompose_collectives {
        names.push("decompose-collectives");
    }
    if options.combine_collectives.is_some() {
        names.push("combine-collectives");
    }
    if schedule {
        names.push(SCHEDULER_PASS);
    }
    pipeline(options, "spmd", &names.join(","))
        .expect("the standard SPMD passes are all registered")
}

/// `spmd-partitioning`, recording the partitioner's summary of each run.
struct RecordSummary {
    partitioner: SpmdPartitioner,
    summary: SummaryCell,
}

impl Pass for RecordSummary {
    fn name(&self) -> &str {
        self.partitioner.name()
    }
    fn run(&mut self, module: &mut HloModule) -> Result<bool, PassError> {
        let result = self.partitioner.run(module);
        *self.summary.borrow_mut() = self.partitioner.last_summary.clone();
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHARDED: &str = "HloModule m, num_partitions=2\n\nENTRY %e (x: f32[8,16], y: f32[16,4]) -> f32[8,4] {\n  %x = f32[8,16]{1,0} parameter(0), sharding={devices=[2,1]<=[2]}\n  %y = f32[16,4]{1,0} parameter(1), sharding={replicated}\n  ROOT %d = f32[8,4]{1,0} dot(%x, %y), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n}\n";

    #[test]
    fn registry_names_every_pass_once() {
        let options = PipelineOptions::default();
        let names: Vec<String> = registry(&options)
            .names()
            .iter()
            .map(|(n, _)| n.to_string())
            .collect();
        assert_eq!(
            names,
            [
                "shardy-import",
                "sdy-propagation",
                "sharding-propagation",
                "complete-shardings",
                "spmd-partitioning",
                "windowed-einsum",
                "decompose-collectives",
                "combine-collectives",
                "async-collective-creator",
                "latency-hiding-scheduler"
            ]
        );
        let e = pipeline(&options, "t", "sharding-propagation,nope")
            .err()
            .expect("unknown pass");
        assert!(e.to_string().contains("unknown pass 'nope'"), "{e}");
    }

    #[test]
    fn spmd_pipeline_partitions_and_records_the_summary() {
        let options = PipelineOptions {
            num_partitions: Some(2),
            ..Default::default()
        };
        let mut module = xla_hlo_parser::parse_module(SHARDED).unwrap();
        let mut pipeline = spmd_pipeline(&options, true);
        assert_eq!(
            pipeline.pass_names(),
            [
                "sharding-propagation",
                "spmd-partitioning",
                "latency-hiding-scheduler"
            ]
        );
        let report = pipeline.run(&mut module).unwrap();
        assert!(report.changed());
        assert!(module.to_text().contains("f32[4,16]"));
        let summary = options.partition_summary.borrow().clone().unwrap();
        assert_eq!(summary.num_partitions, 2);
        // The root may not take a sharding by propagation, so it stays
        // replicated and the f32[8,4] result is all-gathered: 128 bytes.
        assert_eq!(summary.collective_bytes, 128);
        assert_eq!(summary.collectives.get("all-gather"), Some(&1));
    }
}
