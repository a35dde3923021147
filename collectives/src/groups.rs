//! Participant groups: from an HLO collective's `replica_groups`,
//! `channel_id` and `use_global_device_ids` to groups of global device ids,
//! following XLA's `GetParticipatingDevicesGroups`
//! (xla/service/collective_ops_utils.cc), with the group mode
//! (`GetCollectiveOpGroupMode`) of [`xla_hlo_ir::collective_groups`],
//! re-exported here as [`GroupMode`].
//!
//! Devices are numbered by their logical (flattened) id
//! `replica * num_partitions + partition`, XLA's default device assignment;
//! a backend that places devices differently maps these ids itself.
//!
//! How each group mode expands:
//! | `channel_id` | `use_global_device_ids` | mode | ids in `replica_groups` |
//! |---|---|---|---|
//! | absent | absent/false | cross-replica | replica ids, one group per partition |
//! | absent | true | error | |
//! | present | absent (all-to-all, permute, broadcast) | cross-partition | partition ids, one group per replica |
//! | present | false | cross-replica-and-partition | replica ids, all partitions of those replicas |
//! | present | true | flattened id | global ids |
//!
//! An empty group list means one group of every replica (partition for
//! cross-partition); XLA rejects it in flattened-id mode.
//!
//! Invariants of every [`ParticipantGroups`]: ids are in range, and no device
//! appears twice (in one group or across groups). Group order and the order
//! inside a group are XLA's: a device's rank is its index in its group.

use crate::error::{CollectiveError, Result};
use std::collections::HashMap;
use xla_hlo_ir::CollectiveDeviceList;

pub use xla_hlo_ir::collective_groups::GroupMode;

/// Global (flattened) device id: `replica * num_partitions + partition`.
pub type DeviceId = usize;

/// The replica x partition grid of a program.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Topology {
    pub num_replicas: usize,
    pub num_partitions: usize,
}

impl Topology {
    pub fn new(num_replicas: usize, num_partitions: usize) -> Result<Topology> {
        if num_replicas == 0 || num_partitions == 0 {
            return Err(CollectiveError::InvalidGroups(format!(
                "topology needs at least one replica and partition, got {num_replicas}x{num_partitions}"
            )));
        }
        num_replicas
            .checked_mul(num_partitions)
            .ok_or_else(|| CollectiveError::InvalidGroups("device count overflows".into()))?;
        Ok(Topology {
            num_replicas,
            num_partitions,
        })
    }

    pub fn num_devices(&self) -> usize {
        self.num_replicas * self.num_partitions
    }

    /// Global id of (replica, partition).
    pub fn device_id(&self, replica: usize, partition: usize) -> DeviceId {
        replica * self.num_partitions + partition
    }

    /// (replica, partition) of a global id.
    pub fn logical_id(&self, device: DeviceId) -> (usize, usize) {
        (device / self.num_partitions, device % self.num_partitions)
    }
}

/// The disjoint participant groups of one collective.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParticipantGroups {
    groups: Vec<Vec<DeviceId>>,
    /// device -> (group index, rank in group)
    index: HashMap<DeviceId, (usize, usize)>,
}

impl ParticipantGroups {
    /// Checks that `groups` are disjoint and within `0..num_devices`.
    pub fn new(groups: Vec<Vec<DeviceId>>, num_devices: usize) -> Result<ParticipantGroups> {
        let mut index = HashMap::new();
        for (g, group) in groups.iter().enumerate() {
            if group.is_empty() {
                return Err(CollectiveError::InvalidGroups(format!(
                    "group {g} is empty"
                )));
            }
            for (rank, &d) in group.iter().enumerate() {
                if d >= num_devices {
                    return Err(CollectiveError::InvalidGroups(format!(
                        "device {d} in group {g} is out of range (devices 0..{num_devices})"
                    )));
                }
                if index.insert(d, (g, rank)).is_some() {
                    return Err(CollectiveError::InvalidGroups(format!(
                        "device {d} appears twice in replica groups {groups:?}"
                    )));
                }
            }
        }
        Ok(ParticipantGroups { groups, index })
    }

    /// XLA's participant groups of global device ids. `replica_groups` are
    /// the explicit groups (`CollectiveDeviceList::groups()`); empty means
    /// all.
    pub fn from_replica_groups(
        replica_groups: &[Vec<i64>],
        mode: GroupMode,
        topology: Topology,
    ) -> Result<ParticipantGroups> {
        let Topology {
            num_replicas: nr,
            num_partitions: np,
        } = topology;
        let bound = match mode {
            GroupMode::CrossReplica | GroupMode::CrossReplicaAndPartition => nr,
            GroupMode::CrossPartition => np,
            GroupMode::FlattenedId => nr * np,
        };
        let mut id_groups: Vec<Vec<usize>> = Vec::with_capacity(replica_groups.len());
        for g in replica_groups {
            let mut ids = Vec::with_capacity(g.len());
            for &id in g {
                match usize::try_from(id) {
                    Ok(i) if i < bound => ids.push(i),
                    _ => {
                        return Err(CollectiveError::InvalidGroups(format!(
                            "id {id} in replica group {g:?} is out of range for {} (0..{bound})",
                            mode.name()
                        )))
                    }
                }
            }
            id_groups.push(ids);
        }
        if id_groups.is_empty() {
            if mode == GroupMode::FlattenedId {
                return Err(CollectiveError::InvalidGroups(
                    "replica groups cannot be empty for kFlattenedID mode".into(),
                ));
            }
            id_groups.push((0..bound).collect());
        }
        let mut groups = Vec::new();
        match mode {
            GroupMode::CrossReplica => {
                for g in &id_groups {
                    for p in 0..np {
                        groups.push(g.iter().map(|&r| topology.device_id(r, p)).collect());
                    }
                }
            }
            GroupMode::CrossPartition => {
                for g in &id_groups {
                    for r in 0..nr {
                        groups.push(g.iter().map(|&p| topology.device_id(r, p)).collect());
                    }
                }
            }
            GroupMode::CrossReplicaAndPartition => {
                for g in &id_groups {
                    groups.push(
                        g.iter()
                            .flat_map(|&r| (0..np).map(move |p| topology.device_id(r, p)))
                            .collect(),
                    );
                }
            }
            GroupMode::FlattenedId => groups = id_groups,
        }
        ParticipantGroups::new(groups, topology.num_devices())
    }

    /// Same, from a `replica_groups=` value in any of its three spellings.
    pub fn from_device_list(
        list: &CollectiveDeviceList,
        mode: GroupMode,
        topology: Topology,
    ) -> Result<ParticipantGroups> {
        let groups = list.groups().ok_or_else(|| {
            CollectiveError::InvalidGroups(format!("cannot expand replica_groups={list}"))
        })?;
        ParticipantGroups::from_replica_groups(&groups, mode, topology)
    }

    /// Same, from the raw HLO attributes.
    pub fn from_hlo(
        list: &CollectiveDeviceList,
        channel_id: Option<i64>,
        use_global_device_ids: Option<bool>,
        topology: Topology,
    ) -> Result<ParticipantGroups> {
        let mode = GroupMode::from_attributes(channel_id.is_some(), use_global_device_ids)
            .map_err(|e| CollectiveError::InvalidGroups(e.to_string()))?;
        ParticipantGroups::from_device_list(list, mode, topology)
    }

    pub fn groups(&self) -> &[Vec<DeviceId>] {
        &self.groups
    }

    /// The group `device` belongs to, or an error naming the device (XLA:
    /// "doesn't appear in replica groups").
    pub fn group_of(&self, device: DeviceId) -> Result<&[DeviceId]> {
        self.index
            .get(&device)
            .map(|&(g, _)| self.groups[g].as_slice())
            .ok_or_else(|| {
                CollectiveError::InvalidGroups(format!(
                    "device {device} doesn't appear in replica groups {:?}",
                    self.groups
                ))
            })
    }

    /// `device`'s rank in its group.
    pub fn rank_of(&self, device: DeviceId) -> Option<usize> {
        self.index.get(&device).map(|&(_, r)| r)
    }

    /// True when every device of `0..num_devices` is in some group.
    pub fn covers(&self, num_devices: usize) -> bool {
        (0..num_devices).all(|d| self.index.contains_key(&d))
    }
}

/// A collective-permute's view from one device: the devices that execute it
/// together and the global (source, target) pairs among them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PermutePlan {
    /// The devices executing this collective-permute together (all replicas
    /// of this device's partition, or all partitions of its replica).
    pub group: Vec<DeviceId>,
    /// Global (source, target) pairs inside `group`.
    pub pairs: Vec<(DeviceId, DeviceId)>,
}

/// Checks XLA's rule that no device sends twice or receives twice.
pub fn check_pairs(pairs: &[(DeviceId, DeviceId)]) -> Result<()> {
    let mut sources = HashMap::new();
    let mut targets = HashMap::new();
    for &(s, t) in pairs {
        if sources.insert(s, t).is_some() {
            return Err(CollectiveError::InvalidGroups(format!(
                "device {s} is the source of two pairs in {pairs:?}"
            )));
        }
        if targets.insert(t, s).is_some() {
            return Err(CollectiveError::InvalidGroups(format!(
                "device {t} is the target of two pairs in {pairs:?}"
            )));
        }
    }
    Ok(())
}

/// XLA's collective-permute: `source_target_pairs` are replica ids without a
/// channel_id (the permute runs within each partition) and partition ids
/// with one (within each replica). Returns `device`'s plan.
pub fn permute_plan(
    source_target_pairs: &[(i64, i64)],
    has_channel_id: bool,
    topology: Topology,
    device: DeviceId,
) -> Result<PermutePlan> {
    if device >= topology.num_devices() {
        return Err(CollectiveError::InvalidGroups(format!(
            "device {device} out of range (devices 0..{})",
            topology.num_devices()
        )));
    }
    let (replica, partition) = topology.logical_id(device);
    let (bound, to_global): (usize, Box<dyn Fn(usize) -> DeviceId>) = if has_channel_id {
        (
            topology.num_partitions,
            Box::new(move |p| topology.device_id(replica, p)),
        )
    } else {
        (
            topology.num_replicas,
            Box::new(move |r| topology.device_id(r, partition)),
        )
    };
    let mut pairs = Vec::with_capacity(source_target_pairs.len());
    for &(s, t) in source_target_pairs {
        let conv = |id: i64| -> Result<usize> {
            usize::try_from(id)
                .ok()
                .filter(|&i| i < bound)
                .ok_or_else(|| {
                    CollectiveError::InvalidGroups(format!(
                        "id {id} in source_target_pairs is out of range (0..{bound})"
                    ))
                })
        };
        pairs.push((to_global(conv(s)?), to_global(conv(t)?)));
    }
    check_pairs(&pairs)?;
    Ok(PermutePlan {
        group: (0..bound).map(to_global).collect(),
        pairs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn groups(
        rg: &[Vec<i64>],
        channel: bool,
        global: Option<bool>,
        nr: usize,
        np: usize,
    ) -> Vec<Vec<DeviceId>> {
        let mode = GroupMode::from_attributes(channel, global).unwrap();
        ParticipantGroups::from_replica_groups(rg, mode, Topology::new(nr, np).unwrap())
            .unwrap()
            .groups()
            .to_vec()
    }

    #[test]
    fn modes() {
        assert!(GroupMode::from_attributes(false, Some(true)).is_err());
        assert_eq!(
            GroupMode::from_attributes(true, None).unwrap(),
            GroupMode::CrossPartition
        );
    }

    /// The examples of XLA's collective_ops_utils.h, with the device
    /// assignment {{33,34},{44,45},{55,56}} replaced by logical ids
    /// {{0,1},{2,3},{4,5}}.
    #[test]
    fn xla_header_examples() {
        assert_eq!(
            groups(&[vec![0], vec![1, 2]], false, None, 3, 2),
            vec![vec![0], vec![1], vec![2, 4], vec![3, 5]]
        );
        assert_eq!(
            groups(
                &[vec![0], vec![1, 2], vec![3, 4, 5]],
                true,
                Some(true),
                3,
                2
            ),
            vec![vec![0], vec![1, 2], vec![3, 4, 5]]
        );
    }

    #[test]
    fn cross_partition_and_replica_and_partition() {
        assert_eq!(
            groups(&[vec![1, 0]], true, None, 2, 2),
            vec![vec![1, 0], vec![3, 2]]
        );
        assert_eq!(
            groups(&[vec![0], vec![1]], true, Some(false), 2, 3),
            vec![vec![0, 1, 2], vec![3, 4, 5]]
        );
        assert_eq!(groups(&[], false, None, 2, 2), vec![vec![0, 2], vec![1, 3]]);
        assert_eq!(groups(&[], true, None, 2, 2), vec![vec![0, 1], vec![2, 3]]);
        assert_eq!(groups(&[], true, Some(false), 2, 2), vec![vec![0, 1, 2, 3]]);
    }

    #[test]
    fn errors() {
        let t = Topology::new(2, 2).unwrap();
        assert!(ParticipantGroups::from_replica_groups(&[], GroupMode::FlattenedId, t).is_err());
        assert!(
            ParticipantGroups::from_replica_groups(&[vec![0, 0]], GroupMode::CrossReplica, t)
                .is_err()
        );
        assert!(
            ParticipantGroups::from_replica_groups(&[vec![0, 2]], GroupMode::CrossReplica, t)
                .is_err()
        );
        assert!(
            ParticipantGroups::from_replica_groups(&[vec![-1]], GroupMode::FlattenedId, t).is_err()
        );
        let g = ParticipantGroups::from_replica_groups(&[vec![0, 1]], GroupMode::FlattenedId, t)
            .unwrap();
        assert!(g.group_of(3).is_err());
        assert!(!g.covers(4));
    }

    #[test]
    fn iota_and_mesh_lists() {
        let t = Topology::new(1, 8).unwrap();
        let list = CollectiveDeviceList::Iota {
            num_groups: 2,
            group_size: 4,
            reshape_dims: vec![4, 2],
            perm: vec![1, 0],
        };
        let g = ParticipantGroups::from_hlo(&list, Some(1), Some(true), t).unwrap();
        assert_eq!(g.groups(), &[vec![0, 2, 4, 6], vec![1, 3, 5, 7]]);
        assert_eq!(g.rank_of(4), Some(2));
        assert_eq!(g.group_of(5).unwrap(), &[1, 3, 5, 7]);
    }

    #[test]
    fn mesh_axes_list() {
        use xla_hlo_ir::mesh::{AxisRef, Mesh};
        let t = Topology::new(1, 8).unwrap();
        let list = CollectiveDeviceList::MeshAxes {
            mesh: Mesh::new(vec![("x".into(), 2), ("y".into(), 4)]),
            axes: vec![AxisRef::axis("x")],
        };
        let g = ParticipantGroups::from_hlo(&list, Some(3), Some(true), t).unwrap();
        assert_eq!(
            g.groups(),
            &[vec![0, 4], vec![1, 5], vec![2, 6], vec![3, 7]]
        );
        let bad = CollectiveDeviceList::MeshAxes {
            mesh: Mesh::new(vec![("x".into(), 2)]),
            axes: vec![AxisRef::axis("nope")],
        };
        assert!(ParticipantGroups::from_hlo(&bad, Some(3), Some(true), t).is_err());
    }

    #[test]
    fn permute() {
        let t = Topology::new(2, 3).unwrap();
        // cross-partition: partition pairs inside replica 1
        let plan = permute_plan(&[(0, 1), (1, 2)], true, t, 4).unwrap();
        assert_eq!(plan.group, vec![3, 4, 5]);
        assert_eq!(plan.pairs, vec![(3, 4), (4, 5)]);
        // cross-replica: replica pairs inside partition 2
        let plan = permute_plan(&[(1, 0)], false, t, 2).unwrap();
        assert_eq!(plan.group, vec![2, 5]);
        assert_eq!(plan.pairs, vec![(5, 2)]);
        assert!(permute_plan(&[(0, 1), (0, 2)], true, t, 0).is_err());
        assert!(permute_plan(&[(0, 1), (2, 1)], true, t, 0).is_err());
        assert!(permute_plan(&[(0, 3)], true, t, 0).is_err());
    }
}
