//! `complete-shardings`: gives `{replicated}` to every instruction still
//! without a sharding in a computation the partitioner partitions (the entry
//! and the bodies, conditions, branches and callees of while, conditional
//! and call), which is what the partitioner assumes for them anyway.
//! Reducer and comparator computations (`to_apply`) are left alone.
//!
//! Invariants: only unsharded instructions change; tokens are skipped;
//! `run` returns `true` exactly when some instruction got a sharding.

use xla_hlo_ir::sharding::{ShardingKind, SingleSharding};
use xla_hlo_ir::{AttrKey, HloModule, HloSharding, Opcode, Shape};
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
        let n = module.computations.len();
        let mut partitioned = vec![false; n];
        if module.entry.index() < n {
            partitioned[module.entry.index()] = true;
        }
        for c in &module.computations {
            for i in &c.instructions {
                let callees = match i.opcode {
                    Opcode::While => [AttrKey::Body, AttrKey::Condition]
                        .iter()
                        .filter_map(|&k| i.computation_attr(k))
                        .collect(),
                    Opcode::Conditional | Opcode::Call => i.called_computations(),
                    _ => vec![],
                };
                for cc in callees {
                    if cc.index() < n {
                        partitioned[cc.index()] = true;
                    }
                }
            }
        }
        let mut changed = false;
        for (ci, c) in module.computations.iter_mut().enumerate() {
            if !partitioned[ci] {
                continue;
            }
            for i in &mut c.instructions {
                if i.sharding.is_none() && !i.shape.is_token() {
                    i.sharding = Some(replicated_for(&i.shape));
                    changed = true;
                }
            }
        }
        Ok(changed)
    }
}
