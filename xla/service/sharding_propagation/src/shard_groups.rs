//! Shard groups (`shard_as N` / `shard_like N` on user shardings): members
//! of a group propagate shardings to each other during the fix point, and
//! after the first pass over the levels every member of a `shard_as` group
//! takes the group's common sharding.
//!
//! Invariants: groups are kept in order of first appearance (reverse post
//! order, computation by computation), members in order of appearance;
//! a node belongs to at most one group.

use crate::graph::Node;
use crate::state::{normalize, PropagationState};
use rustc_hash::FxHashMap;
use xla_hlo_ir::sharding::ShardGroup;
use xla_hlo_utils::merge::{find_common_sharding, merge_sharding_if_compatible};
use xla_hlo_utils::ops::partially_replicate_all_except;
use xla_hlo_utils::{InstrSharding, Sharding};

#[derive(Default)]
pub(crate) struct ShardGroups {
    /// Each group with its members.
    groups: Vec<(ShardGroup, Vec<Node>)>,
    /// Index in `groups` of each member's group.
    group_of: FxHashMap<Node, usize>,
}

impl ShardGroups {
    /// Adds `node` to `group`.
    pub fn add(&mut self, node: Node, group: ShardGroup) {
        let index = match self.groups.iter().position(|(g, _)| *g == group) {
            Some(index) => index,
            None => {
                self.groups.push((group, Vec::new()));
                self.groups.len() - 1
            }
        };
        self.groups[index].1.push(node);
        self.group_of.insert(node, index);
    }

    pub fn is_empty(&self) -> bool {
        self.group_of.is_empty()
    }

    pub fn contains(&self, node: Node) -> bool {
        self.group_of.contains_key(&node)
    }

    /// The members of `node`'s group (`node` included).
    pub fn members(&self, node: Node) -> Option<&[Node]> {
        let &index = self.group_of.get(&node)?;
        Some(self.groups[index].1.as_slice())
    }

    /// Gives every member of each `shard_as` group the members' common
    /// sharding (or, without one, the first non-replicated member's).
    pub fn align_shard_as_groups(
        &self,
        state: &mut PropagationState,
        provided: &[bool],
        unspecified: &FxHashMap<Node, Vec<usize>>,
    ) {
        for (group, members) in &self.groups {
            if !matches!(group, ShardGroup::As(_)) {
                continue;
            }
            let mut shardings = Vec::new();
            let mut default: Option<Sharding> = None;
            for &member in members {
                if let Some(InstrSharding::Single(sharding)) = &state.shardings[member as usize] {
                    shardings.push(sharding.clone());
                    if default.as_ref().is_none_or(|d| d.is_replicated()) {
                        default = Some(sharding.clone());
                    }
                }
            }
            let Some(common) = find_common_sharding(&shardings, default.as_ref()).or(default)
            else {
                continue;
            };
            for &member in members {
                if provided[member as usize] {
                    // As in XLA, the merged sharding is then replaced by the
                    // common one below.
                    if let (Some(spec), Some(InstrSharding::Single(current))) = (
                        unspecified.get(&member),
                        state.shardings[member as usize].clone(),
                    ) {
                        let partial = partially_replicate_all_except(&common, spec);
                        let mut merged = current;
                        let min_tiles = merged.num_tiles() + 1;
                        merge_sharding_if_compatible(&partial, min_tiles, &mut merged);
                    }
                }
                let new = normalize(
                    state.graph.shape(member),
                    InstrSharding::Single(common.clone()),
                );
                if state.shardings[member as usize].as_ref() != Some(&new) {
                    state.store_normalized(member, new);
                }
            }
        }
    }
}
