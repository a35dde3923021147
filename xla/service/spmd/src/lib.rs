//! SPMD partitioner: turns a module whose instructions carry shardings
//! (after sharding propagation) into the program each of `N` devices runs,
//! as XLA's `spmd-partitioning` pass does: local shapes, `partition-id`
//! driven offsets, and the collectives (all-gather, all-reduce,
//! reduce-scatter, all-to-all, collective-permute) that move data between
//! shardings.
//!
//! Structure, bottom to top (a module names only modules above it in this
//! list; `tools/check_module_cycles.py` checks there is no loop):
//! - [`error`], [`memo`] (the storage of memo tables), [`shapes`] (shape
//!   and literal helpers), [`consistent`] (which reductions consistent mode
//!   lets a handler split across devices);
//! - [`grid`]: `Grid`, the working form of an array sharding, its digit
//!   form, device groups, derived grids and their cache (`GridCache`);
//! - [`value`]: shardings of values (`ValueSharding`), partitioned values
//!   (`PValue`), local shapes, converting IR shardings;
//! - [`plan`]: planning the cheapest reshard between two grids;
//! - [`context`]: the per-module state (`ModuleContext`: names, channels,
//!   reducers, partitioned callees) and its memo tables (`PartitionCache`);
//! - [`builder`]: emitting instructions and collectives;
//! - [`reshard`]: emitting a reshard plan;
//! - [`part`]: the partitioning state of one computation (`Part`) and the
//!   operations handlers use on it (operands, reshards, costs);
//! - [`exchange`] (window exchanges, with [`assemble`] placing pieces one
//!   by one) and [`helpers`]: what handlers share;
//! - the handlers: [`handlers`] (elementwise, constants, iota, tuples,
//!   broadcast, transpose, reduce, custom-calls, the generic fallback),
//!   [`reshape`], [`window`] (slice, pad, reduce-window,
//!   select-and-scatter, concatenate), [`dynamic_slice`], [`reorder`]
//!   (sort, top-k, reverse), [`dot`] (dot, convolution), [`gather`]
//!   (gather, scatter), [`linalg`] (cholesky, triangular-solve);
//! - [`preprocess`]: rewrites of the sharded module before partitioning
//!   (a pad and the slice of it merged into one pad);
//! - [`partition`]: the driver (computations in definition order, the
//!   opcode dispatch, control flow, called computations);
//! - this file: the `spmd-partitioning` pass.
//!
//! Glossary:
//! - *tile*: the part of a global array one device holds; every tile of a
//!   dim split `t` ways has `ceil(X / t)` elements, valid data first, so
//!   trailing tiles may hold padding (XLA's uneven sharding).
//! - *local* / *global*: a per-device array or shape / the unpartitioned
//!   one.
//! - `Grid`: a tiled sharding as a device array over `[tiles of dim 0, ..,
//!   tiles of dim r-1, replication]`; the last dim, the *replication dim*,
//!   lists the devices that hold the same tile.
//! - *digit form* (`DigitForm`): a grid whose device array is a transposed
//!   iota (XLA's `IotaTileAssignment`), kept as mixed-radix digits of the
//!   device id instead of a device list, so grid operations cost O(rank).
//! - `ValueSharding`: a value's sharding in working form: a grid per array,
//!   manual, a tuple of those, or opaque (tokens, never partitioned).
//! - `PValue`: a partitioned value: its local instruction, its global
//!   shape, its `ValueSharding` (field `vs`).
//! - `Part`: the state of partitioning one computation; `orig_comp` is the
//!   original computation, `b` the builder of the new one.
//! - *reshard*: moving a value from one layout to another (collectives and
//!   local slices); *plan*: the steps of one reshard, with their bytes.
//! - *handler*: the function that partitions one opcode; it returns the
//!   value in the layout it chose, or `None` to fall back (operands
//!   replicated, the op run on the global shape).
//!
//! Invariants: the partitioned module verifies; entry parameters and the
//! root keep their (global) shardings so callers can split inputs and
//! assemble outputs; every other sharding is removed; nothing panics on
//! malformed input (errors are `SpmdError`).

// Index loops over several parallel arrays and keyed memo tables read
// better as written.
#![allow(clippy::needless_range_loop, clippy::type_complexity)]

pub mod assemble;
pub mod builder;
pub mod combine;
pub mod consistent;
pub mod context;
pub mod decompose;
pub mod dot;
pub mod dynamic_slice;
pub mod error;
pub mod exchange;
pub mod gather;
pub mod grid;
pub mod handlers;
pub mod helpers;
pub mod linalg;
pub mod memo;
pub mod part;
pub mod partition;
pub mod plan;
pub mod preprocess;
pub mod redistribute;
pub mod reorder;
pub mod reshape;
pub mod reshard;
pub mod rng;
pub mod shapes;
pub mod unreduced;
pub mod value;
pub mod window;
pub mod windowed_einsum;

pub use error::SpmdError;

use std::collections::BTreeMap;
use xla_hlo_ir::stats::ModuleStats;
use xla_hlo_ir::{HloModule, Opcode};
use xla_hlo_pass::{Pass, PassError};

/// Options of the partitioner.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpmdOptions {
    /// Number of partitions; `None` reads `num_partitions` from the module.
    pub num_partitions: Option<i64>,
    /// Consistent mode (see [`consistent`]): reductions are split across
    /// devices only where that reproduces the single-device order.
    pub consistent: bool,
}

/// What partitioning did: handler uses and the communication of the result.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PartitionSummary {
    pub num_partitions: i64,
    /// Uses per `opcode:handler` (`fallback` = replicated execution).
    pub handlers: BTreeMap<String, usize>,
    /// Static collective counts of the partitioned module.
    pub collectives: BTreeMap<String, usize>,
    /// Bytes per device of every collective result (static).
    pub collective_bytes: u64,
    pub collective_bytes_by_op: BTreeMap<String, u64>,
    /// The module changed (shardings removed, instructions added or
    /// removed, shapes or computations changed).
    pub changed: bool,
}

/// Partitions `module` in place.
pub fn partition_module(
    module: &mut HloModule,
    options: &SpmdOptions,
) -> Result<PartitionSummary, SpmdError> {
    let n = options
        .num_partitions
        .unwrap_or_else(|| module.num_partitions().max(devices_in_shardings(module)))
        .max(1);
    let placeholder = HloModule {
        name: String::new(),
        config: Default::default(),
        stack_frame_index: None,
        computations: Vec::new(),
        entry: module.entry,
    };
    let mut orig = std::mem::replace(module, placeholder);
    let base_change =
        sharding_or_header_changes(&orig, n) | (preprocess::preprocess(&mut orig) > 0);
    let orig_entry: Vec<xla_hlo_ir::Shape> = {
        let e = orig.entry_computation();
        let mut v: Vec<xla_hlo_ir::Shape> = e
            .parameters
            .iter()
            .filter_map(|p| e.instructions.get(p.index()).map(|i| i.shape.clone()))
            .collect();
        v.push(e.root_instr().shape.clone());
        v
    };
    match partition_owned(&orig, n, options.consistent) {
        Ok((partitioned, summary_ctx, new_comps)) => {
            // The computations partitioning leaves as they are move over,
            // without their shardings.
            let comps = partitioned
                .into_iter()
                .enumerate()
                .map(|(i, comp)| {
                    comp.unwrap_or_else(|| {
                        let mut kept = std::mem::replace(
                            &mut orig.computations[i],
                            xla_hlo_ir::HloComputation::new(""),
                        );
                        for instr in kept.instructions.iter_mut() {
                            instr.sharding = None;
                        }
                        kept
                    })
                })
                .collect();
            *module = HloModule {
                computations: comps,
                ..orig
            };
            let changed = base_change || new_comps || summary_ctx.changes > 0;
            finish(module, n, summary_ctx, changed, &orig_entry)
        }
        Err(e) => {
            *module = orig;
            Err(e)
        }
    }
}

/// Partitions `orig`; returns the new computation list (`None` for a
/// computation left as it is, to be moved over from `orig`) and the
/// context.
fn partition_owned(
    orig: &HloModule,
    n: i64,
    consistent: bool,
) -> Result<
    (
        Vec<Option<xla_hlo_ir::HloComputation>>,
        context::ModuleContext,
        bool,
    ),
    SpmdError,
> {
    let mut ctx = context::ModuleContext::new(orig, n);
    ctx.consistent = consistent;
    let entry = orig.entry;
    let ec = orig.comp(entry);
    let mut params = Vec::new();
    for &pid in &ec.parameters {
        let instr = ec
            .instructions
            .get(pid.index())
            .ok_or_else(|| SpmdError::Invalid("entry parameter table is broken".into()))?;
        params.push(value::sharding_of(
            instr,
            n,
            &ctx.cache.shardings,
            &ctx.cache.grids,
        )?);
    }
    let root_vs = value::sharding_of(ec.root_instr(), n, &ctx.cache.shardings, &ctx.cache.grids)?;
    let (mut new_entry, _) =
        partition::partition_computation(orig, &mut ctx, entry, &params, Some(&root_vs), &ec.name)?;
    // Keep the global shardings on the entry parameters and root.
    for (k, &pid) in new_entry.parameters.clone().iter().enumerate() {
        if let Some(&op) = ec.parameters.get(k) {
            new_entry.instr_mut(pid).sharding = ec.instr(op).sharding.clone();
        }
    }
    let root = new_entry.root;
    new_entry.instr_mut(root).sharding = Some(
        ec.root_instr()
            .sharding
            .clone()
            .unwrap_or_else(|| std::sync::Arc::new(root_vs.to_ir())),
    );
    let mut comps = Vec::with_capacity(orig.computations.len() + ctx.new_comps.len());
    for i in 0..orig.computations.len() {
        let cid = xla_hlo_ir::CompId(i as u32);
        if cid == entry {
            comps.push(Some(std::mem::replace(
                &mut new_entry,
                xla_hlo_ir::HloComputation::new(""),
            )));
        } else {
            comps.push(ctx.replaced.remove(&cid));
        }
    }
    let new_comps = !ctx.new_comps.is_empty();
    comps.extend(ctx.new_comps.drain(..).map(Some));
    Ok((comps, ctx, new_comps))
}

/// Changes partitioning makes whatever it emits: shardings removed from
/// instructions other than the entry parameters and root, a root sharding
/// added, a new partition count.
fn sharding_or_header_changes(orig: &HloModule, n: i64) -> bool {
    if orig.config.num_partitions != Some(n) {
        return true;
    }
    let entry = orig.entry;
    if orig.entry_computation().root_instr().sharding.is_none() {
        return true;
    }
    orig.computations.iter().enumerate().any(|(ci, c)| {
        c.instructions.iter().enumerate().any(|(ii, i)| {
            i.sharding.is_some()
                && !(ci == entry.index() && (i.opcode == Opcode::Parameter || ii == c.root.index()))
        })
    })
}

fn finish(
    module: &mut HloModule,
    n: i64,
    ctx: context::ModuleContext,
    changed: bool,
    orig_entry: &[xla_hlo_ir::Shape],
) -> Result<PartitionSummary, SpmdError> {
    module.config.num_partitions = Some(n);
    let reordered = order_callees_first(module);
    let entry = module.entry;
    let e = module.comp(entry);
    let param_shapes: Vec<xla_hlo_ir::Shape> = e
        .parameters
        .iter()
        .map(|&p| e.instr(p).shape.clone())
        .collect();
    let result_shape = e.root_instr().shape.clone();
    let shapes_changed = param_shapes.len() + 1 != orig_entry.len()
        || param_shapes
            .iter()
            .chain(std::iter::once(&result_shape))
            .zip(orig_entry)
            .any(|(a, b)| a != b);
    if let Some(layout) = module.config.entry_computation_layout.as_mut() {
        layout.parameters = param_shapes;
        layout.result = result_shape;
    }
    let stats = ModuleStats::of(module);
    Ok(PartitionSummary {
        num_partitions: n,
        handlers: ctx
            .handler_counts
            .iter()
            .map(|((op, h), &c)| (format!("{}:{h}", op.name()), c))
            .collect(),
        collectives: stats.collectives,
        collective_bytes: stats.collective_bytes,
        collective_bytes_by_op: stats.collective_bytes_by_op,
        changed: changed || reordered || shapes_changed,
    })
}

/// The number of devices the module's tiled shardings use (1 when none):
/// the partition count of modules whose header leaves it out.
pub fn devices_in_shardings(module: &HloModule) -> i64 {
    use xla_hlo_ir::sharding::ShardingKind;
    let mut n = 1;
    for c in &module.computations {
        for i in &c.instructions {
            for leaf in i.sharding.iter().flat_map(|s| s.leaves()) {
                match &leaf.kind {
                    ShardingKind::Tiled {
                        tile_assignment, ..
                    } => n = n.max(tile_assignment.num_tiles()),
                    ShardingKind::Named(ns) => {
                        n = n.max(ns.mesh.axes.iter().map(|a| a.1).product())
                    }
                    _ => {}
                }
            }
        }
    }
    n
}

/// Reorders computations so that every computation comes after the ones it
/// calls (see `xla_hlo_utils::inline::order_callees_first`).
pub(crate) fn order_callees_first(module: &mut HloModule) -> bool {
    xla_hlo_utils::inline::order_callees_first(module)
}

/// The `spmd-partitioning` pass.
#[derive(Clone, Debug, Default)]
pub struct SpmdPartitioner {
    pub options: SpmdOptions,
    /// Summary of the last run.
    pub last_summary: Option<PartitionSummary>,
}

impl SpmdPartitioner {
    pub fn new(options: SpmdOptions) -> SpmdPartitioner {
        SpmdPartitioner {
            options,
            last_summary: None,
        }
    }
}

impl Pass for SpmdPartitioner {
    fn name(&self) -> &str {
        "spmd-partitioning"
    }
    fn run(&mut self, module: &mut HloModule) -> Result<bool, PassError> {
        let summary = partition_module(module, &self.options).map_err(|e| PassError::Failed {
            pass: "spmd-partitioning".into(),
            message: e.to_string(),
        })?;
        let changed = summary.changed;
        self.last_summary = Some(summary);
        Ok(changed)
    }
}

/// True when the module uses no collectives (a partitioned module without
/// communication).
pub fn is_communication_free(module: &HloModule) -> bool {
    module.computations.iter().all(|c| {
        c.instructions
            .iter()
            .all(|i| !i.opcode.is_collective() || i.opcode == Opcode::PartitionId)
    })
}
