//! Tests of the grid operations: digit-form results against device-list
//! computations on random grids, and against XLA's reshape sharding.

use super::*;

#[test]
fn remap_and_groups() {
    // [4,2] iota: device = 2*i + j.
    let g = Grid::new(vec![4, 2, 1], (0..8).collect()).unwrap();
    assert_eq!(g.coords(5), vec![2, 1, 0]);
    let groups = g.factor_groups(&[(1, 2)]);
    assert_eq!(
        groups.lists(),
        vec![vec![0, 1], vec![2, 3], vec![4, 5], vec![6, 7]]
    );
    let groups = g.factor_groups(&[(0, 4)]);
    assert_eq!(groups.lists(), vec![vec![0, 2, 4, 6], vec![1, 3, 5, 7]]);
    let r = g.replicate_dims(&[1]);
    assert_eq!(r.dims(), &[4, 1, 2]);
    let t = g.remap(&[Some(1), Some(0)]);
    assert_eq!(t.dims(), &[2, 4, 1]);
    assert_eq!(t.device_at(&[1, 2, 0]), 5);
}

#[test]
fn all_to_all_moves_minor_factor() {
    // dim0 8-way -> dim0 4-way, dim1 2-way.
    let g = Grid::new(vec![8, 1, 1], (0..8).collect()).unwrap();
    let t = g.all_to_all(0, 1, 2).unwrap();
    assert_eq!(t.dims(), &[4, 2, 1]);
    assert_eq!(t.devs(), &(0..8).collect::<Vec<_>>()[..]);
    let full = g.gathered(&[(0, 8)]).unwrap();
    assert!(full.is_replicated());
}

/// A tiny deterministic generator (xorshift).
struct Rng(u64);
impl Rng {
    fn next(&mut self, k: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % k.max(1)
    }
}

/// A random factorization of `n` into `k` factors.
fn factors(rng: &mut Rng, n: i64, k: usize) -> Vec<i64> {
    let mut out = vec![1i64; k];
    let mut rest = n;
    let mut p = 2;
    while rest > 1 {
        while rest % p == 0 {
            rest /= p;
            let i = rng.next(k as u64) as usize;
            out[i] *= p;
        }
        p += 1;
    }
    out
}

/// A random transposed-iota device array over `n` devices.
fn random_devs(rng: &mut Rng, n: i64) -> Vec<i64> {
    let k = 1 + rng.next(4) as usize;
    let rd = factors(rng, n, k);
    let mut perm: Vec<usize> = (0..k).collect();
    for i in (1..k).rev() {
        let j = rng.next(i as u64 + 1) as usize;
        perm.swap(i, j);
    }
    let (_, devs) = transpose_devices(&rd, &(0..n).collect::<Vec<_>>(), &perm);
    if rng.next(8) == 0 {
        // Sometimes not an iota pattern at all.
        let mut d = devs;
        let (i, j) = (rng.next(n as u64) as usize, rng.next(n as u64) as usize);
        d.swap(i, j);
        return d;
    }
    devs
}

fn same(a: &Option<Grid>, b: &Option<Grid>) -> bool {
    match (a, b) {
        (Some(x), Some(y)) => x.dims() == y.dims() && x.devs() == y.devs() && x == y,
        (None, None) => true,
        _ => false,
    }
}

/// Every operation on grids in digit form agrees with the explicit
/// device-list computation.
#[test]
fn digit_form_matches_explicit() {
    let mut rng = Rng(0x9e3779b97f4a7c15);
    let mut sym_seen = 0;
    let mut merges = 0;
    let mut gathers = 0;
    for _ in 0..3000 {
        let n = [1i64, 2, 4, 6, 8, 12, 16, 24, 32, 36, 64][rng.next(11) as usize];
        let rank = 1 + rng.next(3) as usize;
        let dims = factors(&mut rng, n, rank + 1);
        let devs = random_devs(&mut rng, n);
        let g = Grid::new(dims.clone(), devs.clone()).unwrap();
        let e = Grid::new_explicit(dims.clone(), devs.clone());
        assert_eq!(g.devs(), e.devs());
        assert!(g == e || g.0.digits.is_none());
        if g.0.digits.is_some() {
            sym_seen += 1;
        }
        for d in 0..n {
            assert_eq!(g.coords(d), e.coords(d), "{dims:?} {devs:?}");
            assert_eq!(g.device_at(&g.coords(d)), d);
        }
        // Gathers of minor factors.
        let a = rng.next(rank as u64) as usize;
        let divs: Vec<i64> = (1..=g.tiles(a)).filter(|f| g.tiles(a) % f == 0).collect();
        let f = divs[rng.next(divs.len() as u64) as usize];
        let b = rng.next(rank as u64) as usize;
        assert!(same(
            &g.gathered_by_digits(&[(a, f)])
                .or_else(|| g.gathered_by_devices(&[(a, f)])),
            &e.gathered_by_devices(&[(a, f)])
        ));
        assert!(same(&g.all_to_all(a, b, f), &e.all_to_all(a, b, f)) || g.0.digits.is_none());
        let cd: Vec<i64> = (0..rank)
            .map(|x| if x == a { g.tiles(x) / f } else { g.tiles(x) })
            .collect();
        assert!(same(&g.coarsened(&cd), &e.coarsened(&cd)));
        if f > 1 && g.gathered_by_digits(&[(a, f)]).is_some() {
            gathers += 1;
        }
        // Groups.
        let fg = g.factor_groups(&[(a, f)]);
        assert_eq!(
            fg.lists(),
            e.factor_group_lists(&[(a, f)]),
            "{dims:?} {devs:?} {a} {f}"
        );
        if b != a {
            let f2 = g.tiles(b);
            let fg = g.factor_groups(&[(b, f2), (a, f)]);
            assert_eq!(fg.lists(), e.factor_group_lists(&[(b, f2), (a, f)]));
        }
        // Remaps.
        let mut map: Vec<Option<usize>> = (0..rank).map(Some).collect();
        if rng.next(2) == 0 {
            map.swap(0, rank - 1);
        }
        if rng.next(2) == 0 {
            map[a] = None;
        }
        if rng.next(2) == 0 {
            map.insert(0, None);
        }
        assert!(same(&Some(g.remap(&map)), &Some(e.remap_by_devices(&map))));
        // Merges with another grid of the same rank.
        let dims2 = factors(&mut rng, n, rank + 1);
        let devs2 = random_devs(&mut rng, n);
        let h = Grid::new(dims2.clone(), devs2.clone()).unwrap();
        let he = Grid::new_explicit(dims2, devs2);
        let from_y: Vec<usize> = (0..rank).filter(|_| rng.next(2) == 0).collect();
        let m1 = g.merge_by_digits(&h, &from_y);
        if m1.is_some() {
            merges += 1;
            let dims_m: Vec<i64> = (0..rank)
                .map(|x| {
                    if from_y.contains(&x) {
                        h.tiles(x)
                    } else {
                        g.tiles(x)
                    }
                })
                .collect();
            let m2 = Grid::from_coords(&dims_m, n, |d, c| {
                for (x, v) in c.iter_mut().enumerate() {
                    *v = if from_y.contains(&x) {
                        he.coord(d, x)
                    } else {
                        e.coord(d, x)
                    };
                }
            });
            assert!(same(&m1, &m2), "merge {dims:?} {from_y:?}");
        }
        // Coordinate pairs.
        let mut pe: Vec<(i64, i64)> = (0..n).map(|d| (e.coord(d, a), he.coord(d, a))).collect();
        pe.sort_unstable();
        pe.dedup();
        assert_eq!(&g.coord_pairs(&h, a)[..], &pe[..]);
        let tab: Vec<i64> = (0..n)
            .map(|d| e.coord(d, a) * 1000 + he.coord(d, a))
            .collect();
        assert_eq!(g.pair_table(&h, a, |x, y| x * 1000 + y), tab);
        let mut seen = Vec::new();
        assert!(g.all_pairs(&h, a, |x, y| {
            seen.push((x, y));
            true
        }));
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen, pe);
        let bad = pe[rng.next(pe.len() as u64) as usize];
        assert!(!g.all_pairs(&h, a, |x, y| (x, y) != bad));
        // A reduce-scatter layout: h's dims `ks` appended to g's dim `a`
        // (when g leaves them free).
        let ks: Vec<usize> = (0..rank).filter(|_| rng.next(2) == 0).collect();
        if let Some(w) = g.with_minor_from(&h, &ks, a) {
            let gk: i64 = ks.iter().map(|&k| h.tiles(k)).product();
            let dims_w: Vec<i64> = (0..rank)
                .map(|x| if x == a { g.tiles(x) * gk } else { g.tiles(x) })
                .collect();
            let w2 = Grid::from_coords(&dims_w, n, |d, out| {
                let mut r = 0;
                for &k in &ks {
                    r = r * he.tiles(k) + he.coord(d, k);
                }
                for (x, v) in out.iter_mut().enumerate() {
                    let c = e.coord(d, x);
                    *v = if x == a { c * gk + r } else { c };
                }
            });
            assert!(same(&Some(w), &w2), "with_minor_from {dims:?} {ks:?}");
        }
    }
    assert!(
        sym_seen > 1000 && merges > 300 && gathers > 300,
        "{sym_seen} {merges} {gathers}"
    );
}

/// Grids read from iota tile assignments equal the grids of their
/// device lists.
#[test]
fn from_iota_matches_device_lists() {
    let mut rng = Rng(0x2545f4914f6cdd1d);
    let mut hits = 0;
    for _ in 0..3000 {
        let n = [1i64, 2, 4, 6, 8, 12, 16, 24, 32, 64, 2048][rng.next(11) as usize];
        let k = 1 + rng.next(4) as usize;
        let rd = factors(&mut rng, n, k);
        let mut perm: Vec<usize> = (0..k).collect();
        for i in (1..k).rev() {
            let j = rng.next(i as u64 + 1) as usize;
            perm.swap(i, j);
        }
        let (_, devs) = transpose_devices(&rd, &(0..n).collect::<Vec<_>>(), &perm);
        let rank = 1 + rng.next(3) as usize;
        let dims = factors(&mut rng, n, rank + 1);
        let p: Vec<i64> = perm.iter().map(|&x| x as i64).collect();
        let want = Grid::new(dims.clone(), devs).unwrap();
        if let Some(g) = Grid::from_iota(&dims, &rd, &p) {
            hits += 1;
            assert_eq!(g.devs(), want.devs(), "{dims:?} {rd:?} {perm:?}");
            assert!(g == want);
        }
    }
    assert!(hits > 1500, "{hits}");
}

/// Reshaped grids in digit form equal XLA's `ReshapeSharding` through
/// device lists.
#[test]
fn reshaped_matches_reshape_sharding() {
    let mut rng = Rng(0x853c49e6748fea9b);
    let mut hits = 0;
    for _ in 0..4000 {
        let n = [2i64, 4, 8, 16, 32, 64][rng.next(6) as usize];
        let rank = 1 + rng.next(3) as usize;
        let dims = factors(&mut rng, n, rank + 1);
        let devs = random_devs(&mut rng, n);
        let g = Grid::new(dims.clone(), devs).unwrap();
        // A global shape: each dim a multiple (or not) of its tiles.
        let source: Vec<i64> = (0..rank)
            .map(|a| {
                g.tiles(a) * [1i64, 2, 3, 4][rng.next(4) as usize] + i64::from(rng.next(6) == 0)
            })
            .collect();
        let total: i64 = source.iter().product();
        // A random target shape with the same element count.
        let mut target = Vec::new();
        let mut rest = total;
        let mut p = 2;
        let mut fs = Vec::new();
        while rest > 1 {
            while rest % p == 0 {
                rest /= p;
                fs.push(p);
            }
            p += 1;
        }
        let k = 1 + rng.next(4) as usize;
        target.resize(k, 1i64);
        for f in fs {
            let i = rng.next(k as u64) as usize;
            target[i] *= f;
        }
        let want = xla_hlo_utils::ops::reshape_sharding(&source, &target, &g.to_sharding())
            .and_then(|s| Grid::from_sharding(&s, target.len(), n).ok());
        if let Some(got) = g.reshaped(&source, &target) {
            hits += 1;
            assert!(
                same(&got, &want),
                "{source:?} -> {target:?} on {:?}",
                g.dims()
            );
        }
    }
    assert!(hits > 2000, "{hits}");
}
