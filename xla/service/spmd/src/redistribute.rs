//! Planning a redistribution of several dims at once: each device receives
//! the rows of its target tile straight from the devices holding them, in
//! collective-permutes, for tilings that no gather, all-to-all or one-dim
//! retile links (e.g. a transposed mesh on uneven dims: 2x4 tiles of a
//! 5x5 array to 4x2 tiles).
//!
//! A device's target window along a redistributed dim spans consecutive
//! source tiles; its `k`-th piece along the dim comes from the `k`-th of
//! them. Pieces with the same `k` on every dim form a group: one buffer
//! shape, the group's extent per dim being the longest such piece of any
//! device. The first piece along a dim is sent aligned to its end, later
//! ones to their start, so concatenating a device's pieces puts its window
//! in consecutive rows. Within a group each source sends once per
//! collective-permute (a round); a group takes as many rounds as some
//! source has receivers in it.
//!
//! Invariant: the grids agree, device by device, on every dim outside the
//! redistributed ones, so pieces are whole along those dims; every
//! receiver's window lies inside its assembled buffer (padded at the end
//! where the edge window passes it).

use crate::grid::{tile_size, Grid};
use std::collections::HashMap;

/// Most devices a redistribution is planned for: it visits every device
/// once per piece group, which at hundreds of devices and the many
/// reshards of a real step costs more planning time than it saves bytes
/// on the small uneven tilings it is for.
const MAX_DEVICES: i64 = 32;

/// Most collective-permutes one redistribution may take: past it the many
/// small transfers cost more in latency than the bytes they save.
const MAX_ROUNDS: usize = 16;

/// One collective-permute of a group: `(source, receiver)` pairs (remote
/// sources only), and per redistributed dim the row each device starts
/// its sent slice at (in the tile padded at the front by
/// [`Redistribution::front`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Round {
    pub pairs: Vec<(i64, i64)>,
    pub send_starts: Vec<Vec<i64>>,
}

/// A group of pieces: index `k` per redistributed dim, the rounds that
/// carry it, and which devices take their piece from their own tile (at
/// `own_starts`, per dim and device).
#[derive(Clone, Debug, PartialEq)]
pub struct Group {
    pub k: Vec<usize>,
    pub rounds: Vec<Round>,
    /// Per device: the round its piece arrives in (`-1`: none or own).
    pub round_of: Vec<i64>,
    pub own: Vec<i64>,
    pub own_starts: Vec<Vec<i64>>,
}

/// A planned redistribution of `dims`.
#[derive(Clone, Debug, PartialEq)]
pub struct Redistribution {
    pub dims: Vec<usize>,
    /// Per redistributed dim, the extent of each piece index.
    pub extents: Vec<Vec<i64>>,
    /// Per redistributed dim, the zero rows put before the local tile so
    /// that every slice start is non-negative.
    pub front: Vec<i64>,
    pub groups: Vec<Group>,
    /// Per redistributed dim and device, where its window starts in the
    /// assembled buffer.
    pub offsets: Vec<Vec<i64>>,
}

/// One device's pieces along one dim: (source tile, first row, end row)
/// within the source tile, in window order.
type Pieces = Vec<(i64, i64, i64)>;

fn pieces(lo: i64, hi: i64, s1: i64) -> Pieces {
    if lo >= hi {
        return Vec::new();
    }
    (lo / s1..=(hi - 1) / s1)
        .map(|i| (i, lo.max(i * s1) - i * s1, hi.min(i * s1 + s1) - i * s1))
        .collect()
}

/// Plans moving `dims` (global sizes `sizes`, all data dims' sizes) from
/// `cur`'s tiling to `to`'s. `None` when the grids differ on another dim,
/// the device counts differ, there are too many devices, or it would take
/// more than [`MAX_ROUNDS`] collective-permutes.
pub fn redistribute(
    cur: &Grid,
    to: &Grid,
    dims: &[usize],
    sizes: &[i64],
) -> Option<Redistribution> {
    redistribute_within(cur, to, dims, sizes, None)
}

/// [`redistribute`], giving up (`None`) as soon as the groups planned so
/// far cost at least `budget` = (bytes per element, bytes to beat): the
/// plan, when returned, is the same as without a budget.
pub fn redistribute_within(
    cur: &Grid,
    to: &Grid,
    dims: &[usize],
    sizes: &[i64],
    budget: Option<(u64, u64)>,
) -> Option<Redistribution> {
    let n = cur.num_devices();
    let rank = cur.rank();
    if to.num_devices() != n || to.rank() != rank || n > MAX_DEVICES || dims.len() < 2 {
        return None;
    }
    let coords: Vec<Vec<i64>> = (0..n).map(|d| cur.coords(d)[..rank].to_vec()).collect();
    for (d, c) in coords.iter().enumerate() {
        if (0..rank).any(|b| !dims.contains(&b) && to.coord(d as i64, b) != c[b]) {
            return None;
        }
    }
    let mut holders: HashMap<&[i64], Vec<i64>> = HashMap::new();
    for (d, c) in coords.iter().enumerate() {
        holders.entry(&c[..]).or_default().push(d as i64);
    }
    let s1: Vec<i64> = dims
        .iter()
        .map(|&a| tile_size(sizes[a], cur.tiles(a)))
        .collect();
    let s2: Vec<i64> = dims
        .iter()
        .map(|&a| tile_size(sizes[a], to.tiles(a)))
        .collect();
    if s1.iter().chain(&s2).any(|&s| s <= 0) {
        return None;
    }
    // Piece extents depend only on the target tile along each dim; a
    // group with a remote piece takes a round, so past `MAX_ROUNDS` groups
    // the plan is given up before visiting the devices.
    let mut extents: Vec<Vec<i64>> = vec![Vec::new(); dims.len()];
    for (j, &a) in dims.iter().enumerate() {
        for t in 0..to.tiles(a) {
            let lo = t * s2[j];
            for (k, &(_, r0, r1)) in pieces(lo, (lo + s2[j]).min(sizes[a]), s1[j])
                .iter()
                .enumerate()
            {
                if extents[j].len() <= k {
                    extents[j].push(0);
                }
                extents[j][k] = extents[j][k].max(r1 - r0);
            }
        }
    }
    if extents.iter().map(|e| e.len()).product::<usize>() > MAX_ROUNDS {
        return None;
    }
    // Every device's pieces per dim (empty: a padding tile, nothing needed).
    let per_device: Vec<Vec<Pieces>> = (0..n)
        .map(|d| {
            dims.iter()
                .enumerate()
                .map(|(j, &a)| {
                    let lo = to.coord(d, a) * s2[j];
                    pieces(lo, (lo + s2[j]).min(sizes[a]), s1[j])
                })
                .collect()
        })
        .collect();
    // The sent slice's start within the source tile: the first piece ends
    // at its end row, later ones start at row 0.
    let start = |j: usize, k: usize, piece: (i64, i64, i64)| {
        if k == 0 {
            piece.2 - extents[j][0]
        } else {
            piece.1
        }
    };
    let front: Vec<i64> = (0..dims.len())
        .map(|j| {
            per_device
                .iter()
                .filter_map(|pd| pd[j].first().map(|&p| -start(j, 0, p)))
                .max()
                .unwrap_or(0)
                .max(0)
        })
        .collect();
    let mut offsets = vec![vec![0i64; n as usize]; dims.len()];
    for (d, pd) in per_device.iter().enumerate() {
        for (j, p) in pd.iter().enumerate() {
            if let Some(&(_, r0, r1)) = p.first() {
                offsets[j][d] = extents[j][0] - (r1 - r0);
            }
        }
    }
    let mut group_ids: Vec<Vec<usize>> = vec![Vec::new()];
    for e in &extents {
        group_ids = group_ids
            .into_iter()
            .flat_map(|g| {
                (0..e.len()).map(move |k| {
                    let mut g = g.clone();
                    g.push(k);
                    g
                })
            })
            .collect();
    }
    let mut groups = Vec::new();
    for k in group_ids {
        let mut g = Group {
            k: k.clone(),
            rounds: Vec::new(),
            round_of: vec![-1; n as usize],
            own: vec![0; n as usize],
            own_starts: vec![vec![0; n as usize]; dims.len()],
        };
        let mut busy: Vec<std::collections::HashSet<i64>> = Vec::new();
        for (d, pd) in per_device.iter().enumerate() {
            let Some(my) = (0..dims.len())
                .map(|j| pd[j].get(k[j]).copied())
                .collect::<Option<Vec<_>>>()
            else {
                continue;
            };
            let starts: Vec<i64> = (0..dims.len())
                .map(|j| start(j, k[j], my[j]) + front[j])
                .collect();
            let mut key = coords[d].clone();
            for (j, &a) in dims.iter().enumerate() {
                key[a] = my[j].0;
            }
            if key == coords[d] {
                g.own[d] = 1;
                for (j, s) in starts.iter().enumerate() {
                    g.own_starts[j][d] = *s;
                }
                continue;
            }
            let candidates = holders.get(&key[..])?;
            let (round, source) = (0..)
                .find_map(|r| {
                    if r == busy.len() {
                        busy.push(Default::default());
                        g.rounds.push(Round {
                            pairs: Vec::new(),
                            send_starts: vec![vec![0; n as usize]; dims.len()],
                        });
                    }
                    candidates
                        .iter()
                        .find(|h| !busy[r].contains(h))
                        .map(|&h| (r, h))
                })
                .expect("a new round has every holder free");
            busy[round].insert(source);
            let rd = &mut g.rounds[round];
            rd.pairs.push((source, d as i64));
            for (j, s) in starts.iter().enumerate() {
                rd.send_starts[j][source as usize] = *s;
            }
            g.round_of[d] = round as i64;
        }
        for rd in g.rounds.iter_mut() {
            rd.pairs.sort_unstable_by_key(|p| p.1);
        }
        groups.push(g);
        if groups.iter().map(|g| g.rounds.len()).sum::<usize>() > MAX_ROUNDS {
            return None;
        }
        if let Some((bytes, to_beat)) = budget {
            let so_far: u64 = groups
                .iter()
                .map(|g| group_cost(g, &extents, dims, cur, sizes, bytes))
                .sum();
            if so_far >= to_beat {
                return None;
            }
        }
    }
    Some(Redistribution {
        dims: dims.to_vec(),
        extents,
        front,
        groups,
        offsets,
    })
}

/// Bytes per device one group moves: each round one piece of its shape.
fn group_cost(
    g: &Group,
    extents: &[Vec<i64>],
    dims: &[usize],
    cur: &Grid,
    sizes: &[i64],
    bytes: u64,
) -> u64 {
    let other: u64 = (0..sizes.len())
        .filter(|a| !dims.contains(a))
        .map(|a| tile_size(sizes[a], cur.tiles(a)).max(0) as u64)
        .product();
    let piece: u64 =
        g.k.iter()
            .enumerate()
            .map(|(j, &k)| extents[j][k].max(0) as u64)
            .product();
    g.rounds.len() as u64 * piece * other * bytes
}

/// Bytes per device a [`redistribute`] moves: each round moves one piece
/// of its group's shape.
pub fn redistribute_cost(rd: &Redistribution, cur: &Grid, sizes: &[i64], bytes: u64) -> u64 {
    rd.groups
        .iter()
        .map(|g| group_cost(g, &rd.extents, &rd.dims, cur, sizes, bytes))
        .sum()
}
