//! Sharding propagation: from the few shardings users write (parameters,
//! the root, `Sharding` custom-calls from `with_sharding_constraint`),
//! give every instruction that partitioning needs a sharding, the way XLA's
//! GSPMD `ShardingPropagation` pass does.
//!
//! Algorithm (XLA's; see `driver`, `prepare` and `fixpoint`): `Sharding` custom-calls become copies
//! carrying their sharding (their operand inherits it when unsharded);
//! while/conditional/call boundaries share shardings; then, for
//! aggressiveness levels 0 to 3 (and once more at 3), each computation is
//! swept forward in post order (sharding from operands) and backward in
//! reverse post order (sharding from users) until nothing changes. A
//! per-direction dirty flag (cleared when a neighbour changes) is the
//! worklist: after the first sweep of a level only instructions next to a
//! change are re-inferred, so a level costs O(instructions + changes).
//!
//! Order of preference when operands (or users) disagree, in order:
//! 1. user shardings are never overwritten (except that a while, its body
//!    root and parameters, and its condition parameter, or a
//!    conditional/call and its branch roots, take the first sharding among
//!    them so the boundary is consistent);
//! 2. lower aggressiveness levels win (pass-through ops before others,
//!    broadcasts last);
//! 3. a sharding only replaces another if it is strictly better (manual
//!    over replicated) or a compatible refinement (more tiles that nest in
//!    the current ones; partial shardings are merged when compatible);
//! 4. between two operands of an elementwise op, the earlier operand in
//!    the sweep wins ties; for dot/convolution the operand whose result
//!    sharding the (single-user chain) consumer wants wins, then the
//!    larger operand in bytes.
//!
//! Manual regions: instructions fed by `{manual}` values become manual,
//! except `SPMDShardToFullShape`, which keeps its own sharding; manual
//! shardings are never changed.
//!
//! Modules, each using only modules listed before it: `options`, `level`
//! (aggressiveness levels); `opcodes` (opcode sets and per-opcode facts);
//! `graph` (the module as one indexed graph); `dims` (dot, convolution,
//! gather and scatter dim bookkeeping), `state` (current shardings and the
//! improvement rule), `boundary` (shardings shared across
//! while/conditional/call), `shard_groups`; `infer` (the rules, one
//! submodule per op family, and their dispatch); `fixpoint` (one level's
//! sweeps); `prepare` and `driver` (the pass from start to end);
//! `completion` (the `complete-shardings` pass); `shardy_import` (the
//! `shardy-import` pass: Shardy annotations to GSPMD forms);
//! `sdy_propagation` (Shardy's factor-based propagation on the Shardy
//! annotations themselves, then exported by `shardy_import`: the
//! `sdy-propagation` pass, which `sharding-propagation` runs instead of
//! GSPMD's when the module carries Shardy annotations, unless
//! `ShardingPropagationOptions::shardy_propagation` is off).
//!
//! Invariants: deterministic (no hash-order dependence); running the pass on
//! its own output changes nothing; `run` returns `true` exactly when the
//! module changed; malformed shardings are reported as errors, never panics.

mod boundary;
mod completion;
mod dims;
mod driver;
mod fixpoint;
mod graph;
mod infer;
mod level;
mod opcodes;
mod options;
pub mod pre_spmd;
mod prepare;
pub mod sdy_propagation;
mod shard_groups;
pub mod shardy_import;
mod state;

use xla_hlo_ir::HloModule;
use xla_hlo_pass::{Pass, PassError};

pub use completion::ShardingCompletion;
pub use driver::PropagationStats;
pub use options::ShardingPropagationOptions;

/// The `sharding-propagation` pass.
#[derive(Clone, Debug, Default)]
pub struct ShardingPropagation {
    pub options: ShardingPropagationOptions,
    /// Statistics of the last run.
    pub last_stats: Option<PropagationStats>,
}

impl ShardingPropagation {
    pub fn new(options: ShardingPropagationOptions) -> ShardingPropagation {
        ShardingPropagation {
            options,
            last_stats: None,
        }
    }
}

impl Pass for ShardingPropagation {
    fn name(&self) -> &str {
        "sharding-propagation"
    }
    fn run(&mut self, module: &mut HloModule) -> Result<bool, PassError> {
        if self.options.shardy_propagation && shardy_import::has_shardy_annotations(module) {
            return SdyPropagation.run(module);
        }
        let imported = ShardyImport.run(module)?;
        let prepared = pre_spmd::run(module, self.options.inline_calls);
        let stats =
            driver::propagate(module, &self.options).map_err(|message| PassError::Failed {
                pass: "sharding-propagation".into(),
                message,
            })?;
        let changed = stats.changed || imported || prepared != pre_spmd::PreSpmdStats::default();
        self.last_stats = Some(stats);
        Ok(changed)
    }
}

/// The `shardy-import` pass: Shardy annotations (`xla.sdy.*`) to the GSPMD
/// forms propagation reads; a module without them is unchanged.
#[derive(Clone, Copy, Debug, Default)]
pub struct ShardyImport;

impl Pass for ShardyImport {
    fn name(&self) -> &str {
        "shardy-import"
    }
    fn run(&mut self, module: &mut HloModule) -> Result<bool, PassError> {
        if !shardy_import::has_shardy_annotations(module) {
            return Ok(false);
        }
        let stats = shardy_import::import(module).map_err(|message| PassError::Failed {
            pass: "shardy-import".into(),
            message,
        })?;
        log::info!(
            "shardy-import: the module carries Shardy annotations: {} shardings, {} sharding-group members, {} manual computations, {} function-result shardings imported as GSPMD forms; GSPMD propagation follows",
            stats.shardings,
            stats.sharding_groups,
            stats.manual_computations,
            stats.func_results
        );
        Ok(true)
    }
}

/// The `sdy-propagation` pass: on a module with Shardy annotations,
/// Shardy's propagation (`sdy_propagation`), then the export of its
/// shardings to GSPMD ones (`shardy_import` after propagation), with
/// constraints as copies, as XLA's `shardy-xla` leaves the module for the
/// partitioner; a module without annotations is unchanged.
#[derive(Clone, Copy, Debug, Default)]
pub struct SdyPropagation;

impl Pass for SdyPropagation {
    fn name(&self) -> &str {
        "sdy-propagation"
    }
    fn run(&mut self, module: &mut HloModule) -> Result<bool, PassError> {
        if !shardy_import::has_shardy_annotations(module) {
            return Ok(false);
        }
        let failed = |message| PassError::Failed {
            pass: "sdy-propagation".into(),
            message,
        };
        let prepared = pre_spmd::run(module, true);
        let (stats, propagated) = sdy_propagation::propagate_module(module).map_err(failed)?;
        let imported = shardy_import::import_with(
            module,
            shardy_import::ImportMode::AfterShardyPropagation,
            &propagated,
        )
        .map_err(failed)?;
        let copies = shardy_import::constraints_to_copies(module);
        log::info!(
            "sdy-propagation: the module carries Shardy annotations, so Shardy propagation ran (not GSPMD's), after {} memory annotations were retargeted and {} calls inlined: {} values, {} ops, {} sweeps, {} values sharded before and {} after; exported {} shardings, {} sharding-group members, {} manual computations; {} constraints became copies",
            prepared.memory_annotations,
            prepared.inlined_calls,
            stats.values,
            stats.ops,
            stats.sweeps,
            stats.sharded_before,
            stats.sharded_after,
            imported.shardings,
            imported.sharding_groups,
            imported.manual_computations,
            copies
        );
        Ok(true)
    }
}

/// Runs sharding propagation on `module`; returns whether it changed.
pub fn propagate(
    module: &mut HloModule,
    options: &ShardingPropagationOptions,
) -> Result<bool, PassError> {
    ShardingPropagation::new(options.clone()).run(module)
}
