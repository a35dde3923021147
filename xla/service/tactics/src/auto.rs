//! Automatic sharding: for a named mesh and a per-device memory limit,
//! choose for every entry parameter and mesh axis which dimension (if any)
//! the axis shards, minimising the simulated step time of the propagated
//! and partitioned module (the scheduler's cost model), among the choices
//! whose peak memory per device fits the limit. Ties go to less memory,
//! then fewer collective bytes.
//!
//! Search: every combination when there are at most
//! [`AutoOptions::exhaustive_limit`] (then the result is optimal over the
//! space: the stated criterion is "exhaustive"); otherwise steepest
//! descent from several starts (each axis given one uniform pattern:
//! nothing, or each parameter's first, last or largest dimension; every
//! combination over up to three axes), taking the best single (parameter,
//! axis) change while the objective improves (the criterion is then "local
//! optimum: no single parameter-axis change improves"). A parameter's axes shard distinct dimensions, as a tactic
//! schedule can express. Plans over the memory limit are ranked by how far
//! over they are, so the descent walks towards plans that fit. The result
//! is a tactic schedule (one explicit tactic per axis) the user can read,
//! edit and re-run with `--tactics`.
//!
//! Invariant: every configuration is judged by the same evaluation as a
//! tactic report (propagation, partitioning, simulation), so the plan's
//! figures are what `--tactics` reports for the returned schedule.

use crate::schedule::{DimChoice, Schedule, Tactic, Target};
use crate::{measure, run_passes};
use std::collections::HashMap;
use std::sync::Arc;
use xla_hlo_ir::{HloModule, HloSharding};
use xla_hlo_utils::compare::name_root;
use xla_hlo_utils::{NamedMesh, PartitionSpec};
use xla_latency_hiding_scheduler::CostModel;

#[derive(Clone, Debug)]
pub struct AutoOptions {
    pub mesh: Vec<(String, i64)>,
    /// Peak bytes per device a plan may use.
    pub memory_limit: Option<u64>,
    /// Enumerate every combination up to this many.
    pub exhaustive_limit: usize,
}

/// A plan's figures.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PlanCost {
    /// Peak bytes over the memory limit (0 when the plan fits).
    pub excess_bytes: u64,
    pub step_us: f64,
    pub peak_memory_bytes: u64,
    pub collective_bytes: u64,
}

impl PlanCost {
    /// Fitting first (less excess), then faster, then less memory, then
    /// fewer bytes moved: the search walks through plans that do not fit
    /// towards ones that do.
    fn better_than(&self, other: &PlanCost) -> bool {
        (
            self.excess_bytes,
            self.step_us,
            self.peak_memory_bytes,
            self.collective_bytes,
        ) < (
            other.excess_bytes,
            other.step_us,
            other.peak_memory_bytes,
            other.collective_bytes,
        )
    }

    pub fn fits(&self) -> bool {
        self.excess_bytes == 0
    }
}

/// The chosen plan.
#[derive(Clone, Debug)]
pub struct AutoPlan {
    pub schedule: Schedule,
    pub cost: PlanCost,
    /// Configurations evaluated.
    pub evaluated: usize,
    pub exhaustive: bool,
    pub criterion: String,
}

/// Per parameter, per mesh axis: the dimension the axis shards.
type Config = Vec<Vec<Option<usize>>>;

struct Evaluator<'a> {
    module: &'a HloModule,
    mesh: NamedMesh,
    axes: Vec<String>,
    ranks: Vec<usize>,
    /// Each parameter's dimensions.
    dims: Vec<Vec<i64>>,
    model: &'a dyn CostModel,
    memory_limit: Option<u64>,
    cache: HashMap<Config, Option<PlanCost>>,
}

impl Evaluator<'_> {
    /// The cost of `config`, `None` when it does not partition.
    fn cost(&mut self, config: &Config) -> Option<PlanCost> {
        if !expressible(config) {
            return None;
        }
        if let Some(hit) = self.cache.get(config) {
            return *hit;
        }
        let cost = self.evaluate(config);
        self.cache.insert(config.clone(), cost);
        cost
    }

    fn evaluate(&self, config: &Config) -> Option<PlanCost> {
        let mut module = self.module.clone();
        module.config.num_partitions = Some(self.mesh.num_devices());
        let entry = module.entry;
        for (p, choices) in config.iter().enumerate() {
            let mut spec = PartitionSpec {
                dims: vec![Vec::new(); self.ranks[p]],
                ..PartitionSpec::default()
            };
            for (a, choice) in choices.iter().enumerate() {
                if let Some(d) = choice {
                    spec.dims[*d].push(xla_hlo_ir::mesh::AxisRef::axis(self.axes[a].clone()));
                }
            }
            let sharding = self.mesh.sharding(&spec).ok()?;
            let id = module.comp(entry).parameters[p];
            module.comp_mut(entry).instr_mut(id).sharding =
                Some(Arc::new(HloSharding::Single(sharding.to_ir())));
        }
        run_passes(&mut module, "sharding-propagation,spmd-partitioning").ok()?;
        let (stats, report) = measure(&module, self.model).ok()?;
        Some(PlanCost {
            excess_bytes: self
                .memory_limit
                .map(|limit| report.peak_memory_bytes.saturating_sub(limit))
                .unwrap_or(0),
            step_us: report.makespan_us,
            peak_memory_bytes: report.peak_memory_bytes,
            collective_bytes: stats.collective_bytes,
        })
    }
}

/// Whether every parameter's axes shard distinct dimensions (what a tactic
/// schedule can say: a tactic never shards a dimension an earlier one did).
fn expressible(config: &Config) -> bool {
    config.iter().all(|choices| {
        let dims: Vec<usize> = choices.iter().flatten().copied().collect();
        (1..dims.len()).all(|i| !dims[..i].contains(&dims[i]))
    })
}

/// The choices of one (parameter, axis): none, or a dimension the axis
/// divides evenly.
fn choices(dims: &[i64], axis_size: i64) -> Vec<Option<usize>> {
    std::iter::once(None)
        .chain(
            (0..dims.len())
                .filter(|&d| dims[d] % axis_size == 0)
                .map(Some),
        )
        .collect()
}

/// Searches a plan for `module` (see the module header).
pub fn auto_shard(
    module: &HloModule,
    options: &AutoOptions,
    model: &dyn CostModel,
) -> Result<AutoPlan, String> {
    let mesh = NamedMesh::new(options.mesh.clone()).map_err(|e| format!("mesh: {e}"))?;
    let axes: Vec<(String, i64)> = options
        .mesh
        .iter()
        .filter(|(_, s)| *s > 1)
        .cloned()
        .collect();
    let entry = module.entry_computation();
    let params: Vec<(String, Vec<i64>)> = entry
        .parameters
        .iter()
        .map(|&p| {
            (
                entry.instr(p).name.clone(),
                entry.instr(p).shape.dims().to_vec(),
            )
        })
        .collect();
    let options_of: Vec<Vec<Vec<Option<usize>>>> = params
        .iter()
        .map(|(_, dims)| axes.iter().map(|(_, size)| choices(dims, *size)).collect())
        .collect();
    let mut evaluator = Evaluator {
        module,
        mesh,
        axes: axes.iter().map(|(n, _)| n.clone()).collect(),
        ranks: params.iter().map(|(_, d)| d.len()).collect(),
        dims: params.iter().map(|(_, d)| d.clone()).collect(),
        model,
        memory_limit: options.memory_limit,
        cache: HashMap::new(),
    };
    let space: f64 = options_of
        .iter()
        .flatten()
        .map(|c| c.len() as f64)
        .product();
    let replicated: Config = params.iter().map(|_| vec![None; axes.len()]).collect();
    let (best, exhaustive) = if space <= options.exhaustive_limit as f64 {
        (
            exhaustive_search(&mut evaluator, &options_of, &replicated),
            true,
        )
    } else {
        (
            descent_search(&mut evaluator, &options_of, &replicated),
            false,
        )
    };
    let Some((config, cost)) = best.filter(|(_, cost)| cost.fits()) else {
        return Err(match options.memory_limit {
            Some(limit) => format!("no sharding of the parameters fits {limit} bytes per device"),
            None => "no sharding of the parameters partitions".into(),
        });
    };
    let tactics = axes
        .iter()
        .enumerate()
        .filter_map(|(a, (axis, _))| {
            let targets: Vec<Target> = config
                .iter()
                .enumerate()
                .filter_map(|(p, c)| {
                    c[a].map(|d| Target::parameter(name_root(&params[p].0), DimChoice::Dim(d)))
                })
                .collect();
            (!targets.is_empty()).then(|| Tactic {
                name: format!("auto-{axis}"),
                axis: axis.clone(),
                targets,
            })
        })
        .collect();
    Ok(AutoPlan {
        schedule: Schedule {
            mesh: options.mesh.clone(),
            tactics,
        },
        cost,
        evaluated: evaluator.cache.len(),
        exhaustive,
        criterion: if exhaustive {
            "exhaustive: optimal over every choice of dimension per parameter and axis".into()
        } else {
            "local optimum: no single parameter-axis change improves".into()
        },
    })
}

fn consider(
    best: &mut Option<(Config, PlanCost)>,
    config: &Config,
    cost: Option<PlanCost>,
) -> bool {
    let Some(cost) = cost else { return false };
    if best.as_ref().is_none_or(|(_, b)| cost.better_than(b)) {
        *best = Some((config.clone(), cost));
        return true;
    }
    false
}

fn exhaustive_search(
    evaluator: &mut Evaluator,
    options_of: &[Vec<Vec<Option<usize>>>],
    start: &Config,
) -> Option<(Config, PlanCost)> {
    let slots: Vec<(usize, usize)> = options_of
        .iter()
        .enumerate()
        .flat_map(|(p, per_axis)| (0..per_axis.len()).map(move |a| (p, a)))
        .collect();
    let mut digits = vec![0usize; slots.len()];
    let mut best = None;
    loop {
        let mut config = start.clone();
        for (k, &(p, a)) in slots.iter().enumerate() {
            config[p][a] = options_of[p][a][digits[k]];
        }
        let cost = evaluator.cost(&config);
        consider(&mut best, &config, cost);
        // Next combination (odometer).
        let mut k = 0;
        loop {
            if k == slots.len() {
                return best;
            }
            let (p, a) = slots[k];
            digits[k] += 1;
            if digits[k] < options_of[p][a].len() {
                break;
            }
            digits[k] = 0;
            k += 1;
        }
    }
}

fn descent_search(
    evaluator: &mut Evaluator,
    options_of: &[Vec<Vec<Option<usize>>>],
    replicated: &Config,
) -> Option<(Config, PlanCost)> {
    // Starts: every axis given one uniform pattern (nothing, each
    // parameter's first, last or largest dimension the axis divides), in
    // every combination over the axes; the descent then changes single
    // choices.
    let pattern = |p: usize, a: usize, kind: usize| -> Option<usize> {
        let dims = options_of[p][a].iter().copied().flatten();
        match kind {
            0 => None,
            1 => dims.min(),
            2 => dims.max(),
            _ => dims.max_by_key(|&d| (evaluator.dims[p][d], std::cmp::Reverse(d))),
        }
    };
    let axes = options_of.first().map(Vec::len).unwrap_or(0);
    // Every combination of patterns over up to three axes (64 starts);
    // beyond, one pattern for all axes.
    let combinations = if axes <= 3 {
        4usize.pow(axes as u32)
    } else {
        4
    };
    let mut starts: Vec<Config> = Vec::new();
    for code in 0..combinations {
        let kinds: Vec<usize> = (0..axes)
            .map(|a| {
                if axes <= 3 {
                    (code / 4usize.pow(a as u32)) % 4
                } else {
                    code
                }
            })
            .collect();
        let start: Config = (0..options_of.len())
            .map(|p| (0..axes).map(|a| pattern(p, a, kinds[a])).collect())
            .collect();
        if !starts.contains(&start) {
            starts.push(start);
        }
    }
    let mut best: Option<(Config, PlanCost)> = None;
    debug_assert!(starts.contains(replicated));
    for start in starts {
        let mut current = start.clone();
        let mut current_cost = evaluator.cost(&current);
        // Steepest descent: the best single (parameter, axis) change, until
        // none improves.
        loop {
            let mut step: Option<(Config, PlanCost)> = None;
            for p in 0..options_of.len() {
                for a in 0..options_of[p].len() {
                    for &choice in &options_of[p][a] {
                        if current[p][a] == choice {
                            continue;
                        }
                        let mut candidate = current.clone();
                        candidate[p][a] = choice;
                        let cost = evaluator.cost(&candidate);
                        consider(&mut step, &candidate, cost);
                    }
                }
            }
            match step {
                Some((candidate, cost)) if current_cost.is_none_or(|c| cost.better_than(&c)) => {
                    current = candidate;
                    current_cost = Some(cost);
                }
                _ => break,
            }
        }
        consider(&mut best, &current, current_cost);
    }
    best
}

/// Runs the coordinate descent alone (for comparing it with the exhaustive
/// search on small programs).
pub fn descent_only(
    module: &HloModule,
    options: &AutoOptions,
    model: &dyn CostModel,
) -> Result<AutoPlan, String> {
    let options = AutoOptions {
        exhaustive_limit: 0,
        ..options.clone()
    };
    auto_shard(module, &options, model)
}
