//! `complete-shardings`: gives `{replicated}` to every instruction still
//! without a sharding in a computation the partitioner partitions (the entry
//! and the bodies, conditions, branches and callees of while, conditional
//! and call), which is what the partitioner assumes for them anyway.
//! Reducer and comparator computations (`to_apply`) are left alone.
//!
//! Invariants: only unsharded instructions change; tokens are skipped;
//! `run` returns `true` exactly when some instruction got a sharding.

use crate::opcodes::partitioned_callees;
use xla_hlo_ir::sharding::{ShardingKind, SingleSharding};
use xla_hlo_ir::{HloModule, HloSharding, Shape};
use xla_hlo_pass::{Pass, PassError};

/// The `complete-shardings` pass.
#[derive(Clone, Copy, Debug, Default)]
pub struct ShardingCompletion;

fn replicated_for(shape: &Shape) -> HloSharding {
    let leaf = || SingleSharding::new(ShardingKind::Replicated);
    match shape {
        Shape::Tuple(_) => HloSharding::Tuple(shape.leaves().iter().map(|_| leaf()).collect()),
        _ => HloSharding::Single(leaf()),
    }
}

impl Pass for ShardingCompletion {
    fn name(&self) -> &str {
        "complete-shardings"
    }
    fn run(&mut self, module: &mut HloModule) -> Result<bool, PassError> {
        let comp_count = module.computations.len();
        let mut partitioned = vec![false; comp_count];
        if module.entry.index() < comp_count {
            partitioned[module.entry.index()] = true;
        }
        for comp in &module.computations {
            for instr in &comp.instructions {
                for callee in partitioned_callees(instr) {
                    if callee.index() < comp_count {
                        partitioned[callee.index()] = true;
                    }
                }
            }
        }
        let mut changed = false;
        for (comp_index, comp) in module.computations.iter_mut().enumerate() {
            if !partitioned[comp_index] {
                continue;
            }
            for instr in &mut comp.instructions {
                if instr.sharding.is_none() && !instr.shape.is_token() {
                    instr.sharding = Some(std::sync::Arc::new(replicated_for(&instr.shape)));
                    changed = true;
                }
            }
        }
        Ok(changed)
    }
}
