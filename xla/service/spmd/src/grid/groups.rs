//! `DevGroups`: the device groups of a collective, with the replica-group
//! attribute in its shortest form (iota whenever the groups are an iota
//! pattern).
//!
//! Invariant: every group has `size` devices and `count * size` is the
//! number of devices.

use std::sync::Arc;
use xla_hlo_ir::CollectiveDeviceList;
use xla_hlo_utils::TileArray;

/// The device groups of a collective: every group has `size` devices;
/// `list` is the replica-group attribute (iota form whenever possible).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevGroups {
    pub count: i64,
    pub size: i64,
    pub list: CollectiveDeviceList,
}

impl DevGroups {
    /// Groups from explicit lists (iota form when they are an iota pattern).
    pub fn from_lists(groups: &[Vec<i64>]) -> DevGroups {
        let g = groups.len() as i64;
        let s = groups.first().map(|x| x.len()).unwrap_or(0) as i64;
        if g > 0 && s > 0 && groups.iter().all(|x| x.len() as i64 == s) {
            let flat: Vec<i64> = groups.iter().flatten().copied().collect();
            if let Ok(t) = TileArray::new(vec![g, s], flat) {
                if let Some((reshape_dims, perm)) = t.to_iota() {
                    return DevGroups {
                        count: g,
                        size: s,
                        list: CollectiveDeviceList::Iota {
                            num_groups: g,
                            group_size: s,
                            reshape_dims,
                            perm,
                        },
                    };
                }
            }
        }
        DevGroups {
            count: g,
            size: s.max(1),
            list: CollectiveDeviceList::Explicit(groups.to_vec()),
        }
    }

    /// The groups as explicit device lists.
    pub fn lists(&self) -> Vec<Vec<i64>> {
        match &self.list {
            CollectiveDeviceList::Explicit(v) => v.clone(),
            CollectiveDeviceList::Iota {
                num_groups,
                group_size,
                reshape_dims,
                perm,
            } => {
                let n: i64 = reshape_dims.iter().product();
                let t = TileArray::new(vec![n], (0..n).collect()).expect("iota");
                let t = t.reshape(reshape_dims.clone());
                let t = if perm.is_empty() {
                    t
                } else {
                    let p: Vec<usize> = perm.iter().map(|&x| x as usize).collect();
                    t.transpose(&p)
                };
                let _ = num_groups;
                t.devices()
                    .chunks((*group_size).max(1) as usize)
                    .map(|c| c.to_vec())
                    .collect()
            }
            _ => Vec::new(),
        }
    }
}

/// Device groups of a collective (shared).
pub type Groups = Arc<DevGroups>;
