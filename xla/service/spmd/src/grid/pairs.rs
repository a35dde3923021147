//! Coordinate pairs of two grids along one dim and per-partition tables
//! (`per_coord`, `offsets`, `pair_table`): what slices, offset tables and
//! permutes between two layouts need, computed with digit counters (no
//! per-device work beyond the table itself) when both grids are in digit
//! form.
//!
//! Invariant: the tables list devices `0..n` in order.

use super::derive::offset_values;
use super::digits::DigitForm;
use super::Grid;
use std::sync::Arc;

impl Grid {
    /// The table over partitions of `vals[coordinate along dim a]`.
    pub fn per_coord(&self, a: usize, vals: &[i64]) -> Arc<[i64]> {
        self.pair_table(self, a, |c, _| vals.get(c as usize).copied().unwrap_or(0))
            .into()
    }

    /// Offsets of every partition's tile along dim `a` (tile size `ts`).
    pub fn offsets(&self, a: usize, ts: i64) -> Arc<[i64]> {
        self.per_coord(a, &offset_values(self.tiles(a), ts))
    }

    /// The distinct pairs (coordinate along dim `a` under this grid, under
    /// `other`) over all devices, sorted (without visiting every
    /// device when both grids are in digit form).
    pub fn coord_pairs(&self, other: &Grid, a: usize) -> Arc<[(i64, i64)]> {
        self.coord_pairs_by_digits(other, a)
            .unwrap_or_else(|| {
                let mut v: Vec<(i64, i64)> = (0..self.num_devices())
                    .map(|d| (self.coord(d, a), other.coord(d, a)))
                    .collect();
                v.sort_unstable();
                v.dedup();
                v
            })
            .into()
    }

    /// True when `pred(coordinate under this grid, under other)` holds for
    /// every device along dim `a`; stops at the first pair that fails
    /// (without visiting every device when both are in digit form).
    pub fn all_pairs(
        &self,
        other: &Grid,
        a: usize,
        mut pred: impl FnMut(i64, i64) -> bool,
    ) -> bool {
        if let (Some(x), Some(y)) = (&self.0.digits, &other.0.digits) {
            if let Some((x, y)) = DigitForm::common(x, y) {
                // Only the digits either coordinate reads, with their place
                // values in each coordinate.
                let (px, py) = (x.places(a), y.places(a));
                let u: Vec<usize> = (0..x.radix.len())
                    .filter(|&k| px[k] != 0 || py[k] != 0)
                    .collect();
                let count: i64 = u.iter().map(|&k| x.radix[k]).product();
                let mut idx = vec![0i64; u.len()];
                let (mut cx, mut cy) = (0i64, 0i64);
                for _ in 0..count {
                    if !pred(cx, cy) {
                        return false;
                    }
                    for (t, &k) in u.iter().enumerate() {
                        idx[t] += 1;
                        cx += px[k];
                        cy += py[k];
                        if idx[t] < x.radix[k] {
                            break;
                        }
                        cx -= px[k] * x.radix[k];
                        cy -= py[k] * x.radix[k];
                        idx[t] = 0;
                    }
                }
                return true;
            }
        }
        (0..self.num_devices()).all(|d| pred(self.coord(d, a), other.coord(d, a)))
    }

    /// The table over devices `d` (in order) of `f(coordinate of d along
    /// dim a under this grid, under other)`: one pass with digit counters
    /// when both are in digit form.
    pub fn pair_table(&self, other: &Grid, a: usize, f: impl Fn(i64, i64) -> i64) -> Vec<i64> {
        let n = self.num_devices();
        if let (Some(x), Some(y)) = (&self.0.digits, &other.0.digits) {
            if let Some((x, y)) = DigitForm::common(x, y) {
                // Place value of each digit in each coordinate (0 if unused).
                let (px, py) = (x.places(a), y.places(a));
                let m = x.radix.len();
                let mut idx = vec![0i64; m];
                let (mut cx, mut cy) = (0i64, 0i64);
                let mut out = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    out.push(f(cx, cy));
                    for k in 0..m {
                        idx[k] += 1;
                        cx += px[k];
                        cy += py[k];
                        if idx[k] < x.radix[k] {
                            break;
                        }
                        cx -= px[k] * x.radix[k];
                        cy -= py[k] * x.radix[k];
                        idx[k] = 0;
                    }
                }
                return out;
            }
        }
        (0..n)
            .map(|d| f(self.coord(d, a), other.coord(d, a)))
            .collect()
    }

    fn coord_pairs_by_digits(&self, other: &Grid, a: usize) -> Option<Vec<(i64, i64)>> {
        let (x, y) = DigitForm::common(self.0.digits.as_ref()?, other.0.digits.as_ref()?)?;
        let mut u: Vec<usize> = x.digs[a].iter().chain(&y.digs[a]).copied().collect();
        u.sort_unstable();
        u.dedup();
        let count: i64 = u.iter().map(|&k| x.radix[k]).product();
        let mut v = Vec::with_capacity(count as usize);
        let mut idx = vec![0i64; u.len()];
        for _ in 0..count {
            let d: i64 = u.iter().zip(&idx).map(|(&k, &i)| i * x.base[k]).sum();
            v.push((x.coord(d, a), y.coord(d, a)));
            for t in 0..u.len() {
                idx[t] += 1;
                if idx[t] < x.radix[u[t]] {
                    break;
                }
                idx[t] = 0;
            }
        }
        v.sort_unstable();
        v.dedup();
        Some(v)
    }
}
