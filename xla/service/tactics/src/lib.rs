//! Sharding as a schedule of tactics (PartIR's row): a user's parallelism
//! strategy kept apart from the model as an ordered list of tactics over a
//! named mesh (batch parallelism on one axis, Megatron on another, ZeRO-3 on
//! the first, ...; see [`schedule`]). Tactics apply one at a time: each
//! shards the entry parameters it names, then the whole module is
//! propagated and partitioned, and a report says what the tactic bought
//! (collectives and their bytes per device, peak memory per device,
//! simulated step time under the scheduler's cost model).
//!
//! Priorities: a later tactic never changes what an earlier one decided. A
//! tactic that asks for a dimension an earlier tactic sharded on another
//! axis, or for an axis the value already uses, is a conflict: the value
//! keeps the earlier decision and the report names the value, both tactics,
//! both shardings and the bytes the resharding would move. Every value's
//! propagated sharding is checked against the previous step's: the earlier
//! axes of each dimension must still lead it (`changed_earlier` lists any
//! value where propagation did otherwise).
//!
//! Invariants: the bytes a report gives are counted on the partitioned
//! module of that step (they are what partitioning emits); a schedule whose
//! patterns match no parameter is refused, naming the tactic and pattern.

pub mod auto;
pub mod schedule;

use schedule::{glob_match, DimChoice, Schedule, Selector};
use serde_json::{json, Value};
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use xla_hlo_ir::sharding::SingleSharding;
use xla_hlo_ir::stats::ModuleStats;
use xla_hlo_ir::{HloModule, HloSharding, Shape};
use xla_hlo_utils::{NamedMesh, PartitionSpec, Sharding};
use xla_latency_hiding_scheduler::{CostModel, ScheduleReport, NUM_RESOURCES};

use xla_hlo_utils::compare::name_root;

pub use auto::{auto_shard, AutoOptions, AutoPlan};
pub use schedule::{parse_schedule, schedule_to_json};

/// A tactic that could not have its way.
#[derive(Clone, Debug)]
pub struct Conflict {
    pub value: String,
    pub dim: usize,
    pub earlier_tactic: String,
    pub later_tactic: String,
    /// The value's spec as decided, and as the later tactic wanted it.
    pub kept: String,
    pub wanted: String,
    pub reason: String,
    /// Per-device bytes the resharding would move (an all-to-all of the
    /// value's tile).
    pub resharding_bytes: u64,
}

/// What one tactic did and bought.
#[derive(Clone, Debug)]
pub struct TacticReport {
    pub name: String,
    pub axis: String,
    /// Parameters sharded by this tactic, with their spec after it.
    pub sharded: Vec<(String, String)>,
    pub conflicts: Vec<Conflict>,
    /// Collective counts by kind and their bytes per device, counted on the
    /// partitioned module.
    pub collectives: std::collections::BTreeMap<String, usize>,
    pub collective_bytes: u64,
    pub peak_memory_bytes: u64,
    pub simulated_step_us: f64,
    /// Values whose earlier-decided axes the propagation did not keep.
    pub changed_earlier: Vec<String>,
}

/// The result of a schedule: a report per tactic and the last step's
/// propagated and partitioned modules.
pub struct TacticsRun {
    pub reports: Vec<TacticReport>,
    pub propagated: HloModule,
    pub partitioned: HloModule,
}

/// One dimension's decision: the axis and the tactic that put it there.
type DimDecision = Option<(String, usize)>;

/// Each value's decision so far, per dimension.
type Decisions = Vec<Vec<DimDecision>>;

/// Where a value a tactic decides lives in the entry computation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    Parameter(usize),
    Instruction(xla_hlo_ir::InstrId),
    Output(usize),
}

struct ValueInfo {
    place: Place,
    name: String,
    op_name: Option<String>,
    dims: Vec<i64>,
}

fn describe(selector: &Selector) -> String {
    match selector {
        Selector::Parameter(p) => format!("{p:?}"),
        Selector::OpName(p) => format!("op_name {p:?}"),
        Selector::Output(k) => format!("output {k}"),
    }
}

/// The values `selector` names (indices into `values`), adding the
/// intermediates and outputs it names for the first time.
/// A value named for the first time starts from its sharding after the
/// previous tactic (`seed`: its spec then, attributed to that tactic), so a
/// tactic refines it and never drops an earlier axis.
fn match_values(
    module: &HloModule,
    selector: &Selector,
    values: &mut Vec<ValueInfo>,
    decisions: &mut Decisions,
    seed: &dyn Fn(&xla_hlo_ir::HloInstruction) -> Vec<DimDecision>,
) -> Vec<usize> {
    let entry = module.entry_computation();
    let mut add = |place: Place, instr: &xla_hlo_ir::HloInstruction| -> usize {
        if let Some(i) = values.iter().position(|v| v.place == place) {
            return i;
        }
        values.push(ValueInfo {
            place,
            name: instr.name.clone(),
            op_name: instr.op_name().map(str::to_string),
            dims: instr.shape.dims().to_vec(),
        });
        let mut start = seed(instr);
        start.resize(instr.shape.dims().len(), None);
        decisions.push(start);
        values.len() - 1
    };
    match selector {
        Selector::Parameter(pattern) => values
            .iter()
            .enumerate()
            .filter(|(_, v)| {
                matches!(v.place, Place::Parameter(_))
                    && (glob_match(pattern, name_root(&v.name))
                        || glob_match(pattern, &v.name)
                        || v.op_name
                            .as_deref()
                            .is_some_and(|op| glob_match(pattern, op)))
            })
            .map(|(i, _)| i)
            .collect(),
        Selector::OpName(pattern) => entry
            .ids()
            .filter(|&id| {
                let instr = entry.instr(id);
                instr.opcode != xla_hlo_ir::Opcode::Parameter
                    && id != entry.root
                    && instr.shape.is_array()
                    && instr.op_name().is_some_and(|op| glob_match(pattern, op))
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|id| add(Place::Instruction(id), entry.instr(id)))
            .collect(),
        Selector::Output(k) => {
            let root = entry.root_instr();
            let element = if root.opcode == xla_hlo_ir::Opcode::Tuple {
                root.operands.get(*k).map(|&id| entry.instr(id))
            } else {
                (*k == 0).then_some(root)
            };
            element
                .filter(|e| e.shape.is_array())
                .map(|e| vec![add(Place::Output(*k), e)])
                .unwrap_or_default()
        }
    }
}

/// Puts a `Sharding` custom-call (XLA's sharding constraint) after each
/// instruction of `constraints`, its users reading it instead.
fn constrain(
    comp: &mut xla_hlo_ir::HloComputation,
    constraints: &[(xla_hlo_ir::InstrId, SingleSharding)],
) {
    if constraints.is_empty() {
        return;
    }
    use xla_hlo_ir::{AttrKey, AttrValue, HloInstruction, InstrId, Opcode};
    let old = std::mem::take(&mut comp.instructions);
    // Users read `map[old]` (the constraint, where there is one); the
    // parameter table keeps `own[old]`, the instruction itself.
    let mut map: Vec<InstrId> = Vec::with_capacity(old.len());
    let mut own: Vec<InstrId> = Vec::with_capacity(old.len());
    for (i, mut instr) in old.into_iter().enumerate() {
        instr.operands = instr.operands.iter().map(|o| map[o.index()]).collect();
        instr.control_predecessors = instr
            .control_predecessors
            .iter()
            .map(|o| map[o.index()])
            .collect();
        let shape = instr.shape.clone();
        let name = instr.name.clone();
        let id = InstrId(comp.instructions.len() as u32);
        comp.instructions.push(instr);
        own.push(id);
        match constraints.iter().find(|(target, _)| target.index() == i) {
            Some((_, sharding)) => {
                let mut constraint = HloInstruction::new(
                    format!("{name}.tactic_constraint"),
                    Opcode::CustomCall,
                    shape,
                    vec![id],
                );
                constraint.set_attr(AttrKey::CustomCallTarget, AttrValue::Str("Sharding".into()));
                constraint.sharding = Some(Arc::new(HloSharding::Single(sharding.clone())));
                let constraint_id = InstrId(comp.instructions.len() as u32);
                comp.instructions.push(constraint);
                map.push(constraint_id);
            }
            None => map.push(id),
        }
    }
    comp.root = map[comp.root.index()];
    comp.parameters = comp.parameters.iter().map(|p| own[p.index()]).collect();
}

fn spec_text(spec: &PartitionSpec) -> String {
    let dims: Vec<String> = spec
        .dims
        .iter()
        .map(|axes| match axes.as_slice() {
            [] => "_".into(),
            [one] => one.name.clone(),
            many => format!(
                "({})",
                many.iter()
                    .map(|a| a.name.as_str())
                    .collect::<Vec<_>>()
                    .join(",")
            ),
        })
        .collect();
    format!("[{}]", dims.join(","))
}

fn decision_spec(dims: &[DimDecision]) -> PartitionSpec {
    PartitionSpec {
        dims: dims
            .iter()
            .map(|d| {
                d.iter()
                    .map(|(axis, _)| xla_hlo_ir::mesh::AxisRef::axis(axis.clone()))
                    .collect()
            })
            .collect(),
        ..PartitionSpec::default()
    }
}

pub(crate) fn run_passes(module: &mut HloModule, passes: &str) -> Result<(), String> {
    xla_pipelines::run_passes(module, "tactics", passes).map_err(|e| format!("{passes}: {e}"))
}

/// What a partitioned module costs: its collective statistics and its
/// simulated step (the scheduler's simulator under `model`).
pub(crate) fn measure(
    partitioned: &HloModule,
    model: &dyn CostModel,
) -> Result<(ModuleStats, ScheduleReport), String> {
    let (report, _) = ScheduleReport::compute(
        partitioned,
        partitioned,
        model,
        &[1; NUM_RESOURCES],
        0.0,
        None,
        false,
    )
    .map_err(|e| e.to_string())?;
    Ok((ModuleStats::of(partitioned), report))
}

/// Every array instruction's partition spec on `mesh`, by (computation,
/// instruction) name.
fn specs(module: &HloModule, mesh: &NamedMesh) -> HashMap<(String, String), PartitionSpec> {
    let mut out = HashMap::new();
    for comp in &module.computations {
        for instr in &comp.instructions {
            let (Some(sharding), Shape::Array(array)) = (&instr.sharding, &instr.shape) else {
                continue;
            };
            let HloSharding::Single(leaf) = sharding.as_ref() else {
                continue;
            };
            let Ok(s) = Sharding::from_ir(leaf) else {
                continue;
            };
            if let Some(spec) = mesh.spec_of(&s, array.dims.len()) {
                out.insert((comp.name.clone(), instr.name.clone()), spec);
            }
        }
    }
    out
}

/// Applies `schedule` to `module` (see the crate header).
pub fn apply_schedule(
    module: &HloModule,
    schedule: &Schedule,
    model: &dyn CostModel,
) -> Result<TacticsRun, String> {
    let mesh = NamedMesh::new(schedule.mesh.clone()).map_err(|e| format!("mesh: {e}"))?;
    let devices = mesh.num_devices();
    // Calls are inlined first (as propagation would), so that tactics can
    // name the intermediates of called computations by op_name.
    let mut inlined = module.clone();
    xla_hlo_utils::inline::inline_calls(&mut inlined, |_, call| call.sharding.is_none());
    let module = &inlined;
    let original_names: std::collections::HashSet<(String, String)> = module
        .computations
        .iter()
        .flat_map(|c| {
            c.instructions
                .iter()
                .map(move |i| (c.name.clone(), i.name.clone()))
        })
        .collect();
    let axis_size = |axis: &str| {
        schedule
            .mesh
            .iter()
            .find(|(n, _)| n == axis)
            .map(|(_, s)| *s)
            .unwrap_or(1)
    };
    let entry = module.entry_computation();
    // The values tactics decide: the entry parameters first, then the
    // intermediates and outputs tactics name, as they come.
    let mut values: Vec<ValueInfo> = entry
        .parameters
        .iter()
        .enumerate()
        .map(|(p, &id)| {
            let instr = entry.instr(id);
            ValueInfo {
                place: Place::Parameter(p),
                name: instr.name.clone(),
                op_name: instr.op_name().map(str::to_string),
                dims: instr.shape.dims().to_vec(),
            }
        })
        .collect();
    let mut decisions: Decisions = values.iter().map(|v| vec![None; v.dims.len()]).collect();
    let mut reports = Vec::new();
    let mut previous_specs: HashMap<(String, String), PartitionSpec> = HashMap::new();
    let mut last = None;
    let entry_name = module.entry_computation().name.clone();
    for (index, tactic) in schedule.tactics.iter().enumerate() {
        let mut conflicts = Vec::new();
        let mut touched = BTreeSet::new();
        // What propagation derived from the earlier tactics counts as
        // decided by them: a value's dimension sharded after the previous
        // step keeps its axis.
        for (value, dims) in values.iter().zip(decisions.iter_mut()) {
            let Some(spec) = previous_specs.get(&(entry_name.clone(), value.name.clone())) else {
                continue;
            };
            for (dim, axes) in dims.iter_mut().zip(&spec.dims) {
                if dim.is_none() {
                    *dim = axes.first().map(|a| (a.name.clone(), index - 1));
                }
            }
        }
        for target in &tactic.targets {
            let seed = |instr: &xla_hlo_ir::HloInstruction| -> Vec<DimDecision> {
                let Some(spec) = previous_specs.get(&(entry_name.clone(), instr.name.clone()))
                else {
                    return Vec::new();
                };
                spec.dims
                    .iter()
                    .map(|axes| {
                        axes.first()
                            .map(|a| (a.name.clone(), index.saturating_sub(1)))
                    })
                    .collect()
            };
            let matched =
                match_values(module, &target.selector, &mut values, &mut decisions, &seed);
            if matched.is_empty() {
                return Err(format!(
                    "tactic {index} ({}): {} matches no {} (parameters: {})",
                    tactic.name,
                    describe(&target.selector),
                    match target.selector {
                        Selector::Parameter(_) => "entry parameter",
                        Selector::OpName(_) => "array instruction of the entry computation",
                        Selector::Output(_) => "array element of the result",
                    },
                    values
                        .iter()
                        .filter(|v| matches!(v.place, Place::Parameter(_)))
                        .map(|v| v.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
            for p in matched {
                let ValueInfo { name, dims, .. } = &values[p];
                let rank = dims.len();
                let wanted_dim = match target.dim {
                    DimChoice::Dim(d) => Some(d),
                    DimChoice::Last => rank.checked_sub(1),
                    DimChoice::LargestFree => (0..rank)
                        .filter(|&d| decisions[p][d].is_none())
                        .max_by_key(|&d| (dims[d], std::cmp::Reverse(d))),
                };
                let tile_bytes = |spec: &PartitionSpec| -> u64 {
                    let shards: i64 = spec
                        .dims
                        .iter()
                        .flatten()
                        .map(|a| axis_size(&a.name))
                        .product();
                    let elements: i64 = dims.iter().product();
                    (elements.max(0) as u64 * 4) / shards.max(1) as u64
                };
                let kept = decision_spec(&decisions[p]);
                let mut conflict =
                    |dim: usize, earlier: Option<usize>, reason: String, wanted: PartitionSpec| {
                        conflicts.push(Conflict {
                            value: name.clone(),
                            dim,
                            earlier_tactic: earlier
                                .map(|e| schedule.tactics[e].name.clone())
                                .unwrap_or_default(),
                            later_tactic: tactic.name.clone(),
                            kept: spec_text(&kept),
                            wanted: spec_text(&wanted),
                            reason,
                            resharding_bytes: tile_bytes(&kept),
                        });
                    };
                let Some(dim) = wanted_dim.filter(|&d| d < rank) else {
                    conflict(
                        wanted_dim.unwrap_or(0),
                        None,
                        format!(
                            "no dimension to shard (rank {rank}, asked {:?})",
                            target.dim
                        ),
                        kept.clone(),
                    );
                    continue;
                };
                let mut wanted = kept.clone();
                wanted.dims[dim] = vec![xla_hlo_ir::mesh::AxisRef::axis(tactic.axis.clone())];
                match &decisions[p][dim] {
                    Some((axis, _)) if *axis == tactic.axis => continue,
                    Some((axis, earlier)) => {
                        conflict(
                            dim,
                            Some(*earlier),
                            format!("dimension {dim} is already sharded on {axis:?}"),
                            wanted,
                        );
                        continue;
                    }
                    None => {}
                }
                if let Some((other, (_, earlier))) =
                    decisions[p].iter().enumerate().find_map(|(d, x)| {
                        x.as_ref()
                            .filter(|(a, _)| *a == tactic.axis)
                            .map(|x| (d, x))
                    })
                {
                    conflict(
                        dim,
                        Some(*earlier),
                        format!("axis {:?} already shards dimension {other}", tactic.axis),
                        wanted,
                    );
                    continue;
                }
                decisions[p][dim] = Some((tactic.axis.clone(), index));
                touched.insert(p);
            }
        }
        // The module with every decision so far, propagated and partitioned.
        let mut annotated = module.clone();
        annotated.config.num_partitions = Some(devices);
        let entry_id = annotated.entry;
        let mut constraints = Vec::new();
        for (value, dims) in values.iter().zip(&decisions) {
            if dims.iter().all(Option::is_none) {
                continue;
            }
            let spec = decision_spec(dims);
            let sharding = mesh
                .sharding(&spec)
                .map_err(|e| format!("{}: {e}", value.name))?
                .to_ir();
            let entry = annotated.comp_mut(entry_id);
            match value.place {
                Place::Parameter(p) => {
                    let id = entry.parameters[p];
                    entry.instr_mut(id).sharding = Some(Arc::new(HloSharding::Single(sharding)));
                }
                Place::Instruction(id) => constraints.push((id, sharding)),
                Place::Output(k) => {
                    let root = entry.root_instr();
                    let id = if root.opcode == xla_hlo_ir::Opcode::Tuple {
                        root.operands[k]
                    } else {
                        entry.root
                    };
                    constraints.push((id, sharding));
                }
            }
        }
        constrain(annotated.comp_mut(entry_id), &constraints);
        run_passes(&mut annotated, "sharding-propagation")?;
        let current_specs = specs(&annotated, &mesh);
        let mut changed_earlier = Vec::new();
        for (key, before) in &previous_specs {
            // Only the program's own instructions: the copies propagation
            // makes of sharding constraints are named afresh each step.
            if !original_names.contains(key) {
                continue;
            }
            let Some(now) = current_specs.get(key) else {
                continue;
            };
            let kept = before
                .dims
                .iter()
                .zip(&now.dims)
                .all(|(b, n)| n.len() >= b.len() && n[..b.len()] == b[..]);
            if !kept {
                changed_earlier.push(format!(
                    "%{} {} -> {}",
                    key.1,
                    spec_text(before),
                    spec_text(now)
                ));
            }
        }
        changed_earlier.sort();
        let mut partitioned = annotated.clone();
        run_passes(&mut partitioned, "spmd-partitioning")?;
        let (stats, schedule_report) = measure(&partitioned, model)
            .map_err(|e| format!("simulating after {}: {e}", tactic.name))?;
        reports.push(TacticReport {
            name: tactic.name.clone(),
            axis: tactic.axis.clone(),
            sharded: touched
                .iter()
                .map(|&p| {
                    (
                        values[p].name.clone(),
                        spec_text(&decision_spec(&decisions[p])),
                    )
                })
                .collect(),
            conflicts,
            collectives: stats.collectives.clone(),
            collective_bytes: stats.collective_bytes,
            peak_memory_bytes: schedule_report.peak_memory_bytes,
            simulated_step_us: schedule_report.makespan_us,
            changed_earlier,
        });
        previous_specs = current_specs;
        last = Some((annotated, partitioned));
    }
    // No tactic: the module as propagation and partitioning leave it.
    let (propagated, partitioned) = match last {
        Some(modules) => modules,
        None => {
            let mut propagated = module.clone();
            propagated.config.num_partitions = Some(devices);
            run_passes(&mut propagated, "sharding-propagation")?;
            let mut partitioned = propagated.clone();
            run_passes(&mut partitioned, "spmd-partitioning")?;
            (propagated, partitioned)
        }
    };
    Ok(TacticsRun {
        reports,
        propagated,
        partitioned,
    })
}

impl TacticReport {
    pub fn to_json(&self) -> Value {
        let sharded: Vec<Value> = self
            .sharded
            .iter()
            .map(|(value, spec)| json!({"value": value, "spec": spec}))
            .collect();
        json!({
            "tactic": self.name,
            "axis": self.axis,
            "sharded": sharded,
            "conflicts": self.conflicts.iter().map(|c| json!({
                "value": c.value,
                "dim": c.dim,
                "earlier_tactic": c.earlier_tactic,
                "later_tactic": c.later_tactic,
                "kept": c.kept,
                "wanted": c.wanted,
                "reason": c.reason,
                "resharding_bytes": c.resharding_bytes,
            })).collect::<Vec<_>>(),
            "collectives": self.collectives,
            "collective_bytes": self.collective_bytes,
            "peak_memory_bytes": self.peak_memory_bytes,
            "simulated_step_us": self.simulated_step_us,
            "changed_earlier": self.changed_earlier,
        })
    }
}
