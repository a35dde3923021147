//! From an HLO collective instruction to a [`Communicator`] call: the glue an
//! interpreter needs. Given the instruction's opcode-level parameters and
//! its `replica_groups` / `channel_id` / `use_global_device_ids` /
//! `source_target_pairs`, [`execute`] derives the caller's group with XLA's
//! group-mode rules ([`crate::groups`]) and runs the collective.
//!
//! Invariants: attribute combinations XLA rejects (e.g.
//! `use_global_device_ids=true` without `channel_id`, a device in no group,
//! duplicate permute sources) are errors, never panics; the communicator's
//! device id is the caller's flattened id `replica * num_partitions +
//! partition`.

use crate::buffer::DeviceBuffer;
use crate::communicator::Communicator;
use crate::error::{CollectiveError, Result};
use crate::groups::{permute_plan, ParticipantGroups, Topology};
use crate::reduce::ReductionKind;
use xla_hlo_ir::CollectiveDeviceList;

/// The opcode-specific part of a collective instruction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HloCollective {
    /// `all-reduce`, `to_apply` matched to a [`ReductionKind`].
    AllReduce(ReductionKind),
    /// `all-gather`, `dimensions={d}`.
    AllGather { dimension: usize },
    /// `reduce-scatter`, `to_apply` and `dimensions={d}`.
    ReduceScatter {
        kind: ReductionKind,
        dimension: usize,
    },
    /// `all-to-all`: `dimensions={d}` (array form), or `None` (tuple form).
    AllToAll { dimension: Option<usize> },
    /// `collective-permute`, `source_target_pairs` (replica ids without a
    /// channel_id, partition ids with one).
    CollectivePermute {
        source_target_pairs: Vec<(i64, i64)>,
    },
    /// `collective-broadcast`.
    CollectiveBroadcast,
}

/// The attributes that decide who participates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupAttributes {
    pub replica_groups: CollectiveDeviceList,
    pub channel_id: Option<i64>,
    /// `None` for ops without the attribute (all-to-all, permute,
    /// broadcast) or when it is absent.
    pub use_global_device_ids: Option<bool>,
}

/// Runs `op` for the caller (`comm.device()`) of a program with `topology`.
pub fn execute(
    comm: &mut dyn Communicator,
    op: &HloCollective,
    attrs: &GroupAttributes,
    topology: Topology,
    operands: &[DeviceBuffer],
) -> Result<Vec<DeviceBuffer>> {
    let me = comm.device();
    if topology.num_devices() != comm.num_devices() {
        return Err(CollectiveError::InvalidArgument(format!(
            "topology {}x{} has {} devices but the communicator reaches {}",
            topology.num_replicas,
            topology.num_partitions,
            topology.num_devices(),
            comm.num_devices()
        )));
    }
    if let HloCollective::CollectivePermute {
        source_target_pairs,
    } = op
    {
        let plan = permute_plan(
            source_target_pairs,
            attrs.channel_id.is_some(),
            topology,
            me,
        )?;
        return comm.collective_permute(&plan.group, &plan.pairs, operands);
    }
    let groups = ParticipantGroups::from_hlo(
        &attrs.replica_groups,
        attrs.channel_id,
        attrs.use_global_device_ids,
        topology,
    )?;
    let group = groups.group_of(me)?.to_vec();
    match op {
        HloCollective::AllReduce(kind) => comm.all_reduce(&group, *kind, operands),
        HloCollective::AllGather { dimension } => comm.all_gather(&group, *dimension, operands),
        HloCollective::ReduceScatter { kind, dimension } => {
            comm.reduce_scatter(&group, *kind, *dimension, operands)
        }
        HloCollective::AllToAll { dimension: Some(d) } => comm.all_to_all(&group, *d, *d, operands),
        HloCollective::AllToAll { dimension: None } => comm.all_to_all_tuple(&group, operands),
        HloCollective::CollectiveBroadcast => comm.collective_broadcast(&group, operands),
        HloCollective::CollectivePermute { .. } => unreachable!("handled above"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loopback::LoopbackWorld;
    use std::time::Duration;

    fn run(
        topology: Topology,
        op: HloCollective,
        attrs: GroupAttributes,
        input: impl Fn(usize) -> DeviceBuffer + Sync,
    ) -> Vec<Result<Vec<DeviceBuffer>>> {
        let world = LoopbackWorld::new(topology.num_devices(), Duration::from_secs(30)).unwrap();
        let comms = world.communicators().unwrap();
        std::thread::scope(|s| {
            let hs: Vec<_> = comms
                .into_iter()
                .map(|mut c| {
                    let (op, attrs, input) = (&op, &attrs, &input);
                    s.spawn(move || {
                        let x = input(c.device());
                        execute(&mut c, op, attrs, topology, &[x])
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn spmd_all_gather_over_flattened_ids() {
        // 2 replicas x 2 partitions; SPMD-style: channel_id + global ids,
        // groups {0,1},{2,3} as an iota list.
        let t = Topology::new(2, 2).unwrap();
        let attrs = GroupAttributes {
            replica_groups: CollectiveDeviceList::Iota {
                num_groups: 2,
                group_size: 2,
                reshape_dims: vec![4],
                perm: vec![],
            },
            channel_id: Some(1),
            use_global_device_ids: Some(true),
        };
        let out = run(t, HloCollective::AllGather { dimension: 0 }, attrs, |d| {
            DeviceBuffer::from_slice(vec![1], &[d as i32]).unwrap()
        });
        assert_eq!(out[0].as_ref().unwrap()[0].typed::<i32>().unwrap(), &[0, 1]);
        assert_eq!(out[3].as_ref().unwrap()[0].typed::<i32>().unwrap(), &[2, 3]);
    }

    #[test]
    fn cross_replica_all_reduce_and_permute() {
        let t = Topology::new(2, 3).unwrap();
        let attrs = GroupAttributes {
            replica_groups: CollectiveDeviceList::Explicit(vec![]),
            channel_id: None,
            use_global_device_ids: None,
        };
        // cross-replica: device (r, p) sums over replicas of partition p.
        let out = run(
            t,
            HloCollective::AllReduce(ReductionKind::Sum),
            attrs.clone(),
            |d| DeviceBuffer::from_slice(vec![], &[d as i64]).unwrap(),
        );
        for (d, r) in out.iter().enumerate() {
            let p = d % 3;
            assert_eq!(
                r.as_ref().unwrap()[0].typed::<i64>().unwrap(),
                &[(p + p + 3) as i64]
            );
        }
        // permute with a channel: partition pairs within each replica.
        let attrs = GroupAttributes {
            channel_id: Some(2),
            ..attrs
        };
        let op = HloCollective::CollectivePermute {
            source_target_pairs: vec![(0, 1), (1, 2)],
        };
        let out = run(t, op, attrs, |d| {
            DeviceBuffer::from_slice(vec![], &[d as i64]).unwrap()
        });
        let got: Vec<i64> = out
            .iter()
            .map(|r| r.as_ref().unwrap()[0].typed::<i64>().unwrap()[0])
            .collect();
        assert_eq!(got, vec![0, 0, 1, 0, 3, 4]);
    }

    #[test]
    fn invalid_attributes_are_errors() {
        let t = Topology::new(1, 2).unwrap();
        let attrs = GroupAttributes {
            replica_groups: CollectiveDeviceList::Explicit(vec![vec![0, 1]]),
            channel_id: None,
            use_global_device_ids: Some(true),
        };
        let out = run(t, HloCollective::CollectiveBroadcast, attrs, |_| {
            DeviceBuffer::from_slice(vec![], &[1u8]).unwrap()
        });
        assert!(out
            .iter()
            .all(|r| matches!(r, Err(CollectiveError::InvalidGroups(_)))));
        let world = LoopbackWorld::new(3, Duration::from_secs(1)).unwrap();
        let mut c = world.communicator(0).unwrap();
        let attrs = GroupAttributes {
            replica_groups: CollectiveDeviceList::Explicit(vec![]),
            channel_id: None,
            use_global_device_ids: None,
        };
        assert!(execute(&mut c, &HloCollective::CollectiveBroadcast, &attrs, t, &[]).is_err());
    }
}
