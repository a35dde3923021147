//! Unreduced values: an array whose sharding has an `unreduced` subgroup
//! (`last_tile_dims={unreduced}`, Shardy's `unreduced={axes}`) may be held
//! as partial sums, one per device of each unreduced group, whose sum is
//! the array. The grid of such a sharding folds the unreduced subgroup into
//! replication (`Grid::from_sharding`); which local values actually hold
//! partial sums is recorded in `Part::partial`, keyed by local instruction.
//!
//! Rules (as XLA's partitioner treats unreduced shardings):
//! - a dot whose sharding is unreduced over exactly the devices its
//!   contracted dims are split over skips its all-reduce (the result is
//!   partial);
//! - copy, negate, add, subtract and `Sharding` custom calls keep partial
//!   sums partial when every operand is partial over the same groups in the
//!   same layout and their own sharding is unreduced over those groups;
//! - `SPMDFullToShardShape` hands partial sums into the manual region as
//!   they are (the region reduces them itself); a full value whose sharding
//!   says unreduced enters as partial sums too (the whole value on the first
//!   device of each group, zeros elsewhere);
//! - every other use, and a computation's root, sees the all-reduced value.
//!
//! Invariant: a local value in `Part::partial` has its grid's local shape
//! and sums, over each of its groups, to the local tile of the array.

use crate::error::SpmdError;
use crate::grid::{DevGroups, Groups};
use crate::part::Part;
use crate::value::PValue;
use std::sync::Arc;
use xla_hlo_ir::sharding::{ShardingKind, SubgroupType};
use xla_hlo_ir::{AttrKey, HloInstruction, HloSharding, InstrId, Opcode, PrimitiveType, Shape};
use xla_hlo_utils::Sharding;

/// True when the IR sharding names an unreduced subgroup (cheap check).
fn mentions_unreduced(s: &HloSharding) -> bool {
    match s {
        HloSharding::Single(leaf) => match &leaf.kind {
            ShardingKind::Unreduced => true,
            ShardingKind::Tiled { last_tile_dims, .. } => {
                last_tile_dims.contains(&SubgroupType::Unreduced)
            }
            _ => false,
        },
        HloSharding::Tuple(_) => false,
    }
}

/// The device groups over which an array with sharding `s` is unreduced
/// (`None` when it is not).
pub fn unreduced_groups(
    s: Option<&HloSharding>,
    shape: &Shape,
    n: i64,
) -> Result<Option<Groups>, SpmdError> {
    let Some(s) = s.filter(|s| mentions_unreduced(s) && shape.is_array()) else {
        return Ok(None);
    };
    let HloSharding::Single(leaf) = s else {
        return Ok(None);
    };
    let bad = |message: String| SpmdError::Sharding {
        instruction: String::new(),
        message,
    };
    match Sharding::from_ir(leaf).map_err(|e| bad(e.to_string()))? {
        Sharding::Unreduced => Ok(Some(Arc::new(DevGroups::from_lists(&[(0..n).collect()])))),
        Sharding::Tiled(t) => {
            let rank = t.data_rank();
            let nd = t.tiles().num_dims();
            let unreduced: Vec<usize> = t
                .subgroups()
                .iter()
                .enumerate()
                .filter(|(_, ty)| **ty == SubgroupType::Unreduced)
                .map(|(i, _)| rank + i)
                .collect();
            if unreduced.is_empty() {
                return Ok(None);
            }
            let size: i64 = unreduced.iter().map(|&d| t.tiles().dim(d)).product();
            let mut perm: Vec<usize> = (0..nd).filter(|d| !unreduced.contains(d)).collect();
            perm.extend(&unreduced);
            let moved = t.tiles().transpose(&perm);
            if moved.devices().len() as i64 != n {
                return Err(bad(format!(
                    "sharding over {} devices in a module of {n} partitions",
                    moved.devices().len()
                )));
            }
            let lists: Vec<Vec<i64>> = moved
                .devices()
                .chunks(size.max(1) as usize)
                .map(|c| {
                    let mut c = c.to_vec();
                    c.sort_unstable();
                    c
                })
                .collect();
            Ok(Some(Arc::new(DevGroups::from_lists(&lists))))
        }
        _ => Ok(None),
    }
}

/// The groups as sorted lists of sorted devices (for comparison).
fn canonical(g: &DevGroups) -> Vec<Vec<i64>> {
    let mut lists = g.lists();
    for l in &mut lists {
        l.sort_unstable();
    }
    lists.sort_unstable();
    lists
}

/// Whether two groupings hold the same device sets.
pub fn same_groups(a: &DevGroups, b: &DevGroups) -> bool {
    a == b || (a.count == b.count && a.size == b.size && canonical(a) == canonical(b))
}

/// Ops that keep partial sums partial (linear in every operand).
fn is_linear(instr: &HloInstruction) -> bool {
    match instr.opcode {
        Opcode::Copy | Opcode::Negate | Opcode::Add | Opcode::Subtract => true,
        Opcode::CustomCall => instr.ident_attr(AttrKey::CustomCallTarget) == Some("Sharding"),
        _ => false,
    }
}

fn is_full_to_shard(instr: &HloInstruction) -> bool {
    instr.opcode == Opcode::CustomCall
        && instr.ident_attr(AttrKey::CustomCallTarget) == Some("SPMDFullToShardShape")
}

impl Part<'_, '_> {
    /// The groups over which `instr`'s own sharding is unreduced.
    pub fn unreduced_target(&self, instr: &HloInstruction) -> Result<Option<Groups>, SpmdError> {
        unreduced_groups(instr.sharding.as_deref(), &instr.shape, self.n()).map_err(|e| match e {
            SpmdError::Sharding { message, .. } => SpmdError::Sharding {
                instruction: instr.name.clone(),
                message,
            },
            other => other,
        })
    }

    /// Settles the partial-sum state of `instr`'s operands before it is
    /// partitioned: returns the groups its result stays partial over (when
    /// it is a linear op on partial sums, see the module doc); otherwise
    /// all-reduces every partial operand it reads (once: the reduced value
    /// replaces the operand's), except for `SPMDFullToShardShape`.
    pub fn settle_partial_operands(
        &mut self,
        instr: &HloInstruction,
    ) -> Result<Option<Groups>, SpmdError> {
        if is_full_to_shard(instr) {
            self.enter_manual_partial(instr)?;
            return Ok(None);
        }
        if self.partial.is_empty() {
            return Ok(None);
        }
        let partial_ops: Vec<(InstrId, Groups)> = instr
            .operands
            .iter()
            .filter_map(|&o| {
                let v = self.vals.get(o.index())?.as_ref()?;
                self.partial.get(&v.id).map(|g| (o, g.clone()))
            })
            .collect();
        if partial_ops.is_empty() {
            return Ok(None);
        }
        if is_linear(instr) && partial_ops.len() == instr.operands.len() {
            if let (Some(want), Ok(target)) = (self.unreduced_target(instr)?, self.target(instr)) {
                let keeps = partial_ops.iter().all(|(o, g)| {
                    same_groups(g, &want)
                        && self.vals[o.index()].as_ref().map(|v| &v.vs) == Some(&target)
                });
                if keeps {
                    return Ok(Some(want));
                }
            }
        }
        for (o, groups) in partial_ops {
            self.reduce_partial(o, &groups)?;
        }
        Ok(None)
    }

    /// All-reduces the partial value of original instruction `orig` over
    /// `groups`; the sum becomes that instruction's value.
    fn reduce_partial(&mut self, orig: InstrId, groups: &Groups) -> Result<(), SpmdError> {
        let v = self.val(orig)?;
        let id = self.b.all_reduce(v.id, groups, Opcode::Add)?;
        self.vals[orig.index()] = Some(PValue { id, ..v });
        Ok(())
    }

    /// The root of a computation is never partial.
    pub fn reduced(&mut self, orig: InstrId) -> Result<PValue, SpmdError> {
        let v = self.val(orig)?;
        if let Some(groups) = self.partial.get(&v.id).cloned() {
            self.reduce_partial(orig, &groups)?;
        }
        self.val(orig)
    }

    /// A full value entering a manual region where its sharding says
    /// unreduced becomes partial sums: the value on the first device of
    /// each group, zeros on the others.
    fn enter_manual_partial(&mut self, instr: &HloInstruction) -> Result<(), SpmdError> {
        let Some(&o) = instr.operands.first() else {
            return Ok(());
        };
        let operand = self.orig_comp.instr(o);
        let Some(groups) = self.unreduced_target(operand)? else {
            return Ok(());
        };
        let v = self.val(o)?;
        if self.partial.contains_key(&v.id) {
            return Ok(());
        }
        let mut first = vec![0i64; self.n() as usize];
        for list in groups.lists() {
            if let Some(&d) = list.iter().min() {
                if let Some(slot) = first.get_mut(d as usize) {
                    *slot = 1;
                }
            }
        }
        let table: Arc<[i64]> = first.into();
        let is_first = self.b.table(&table);
        let one = self.b.scalar(PrimitiveType::S32, 1);
        let keep = self.b.compare(is_first, one, "EQ");
        let dims = self.b.dims(v.id);
        let keep = self.b.splat(keep, &dims);
        let zero = self.b.zero_of(v.id)?;
        let zeros = self.b.splat(zero, &dims);
        let id = self.b.select(keep, v.id, zeros);
        self.partial.insert(id, groups);
        self.vals[o.index()] = Some(PValue { id, ..v });
        Ok(())
    }
}
