//! `GridCache`: the memo of derived grids, device groups and
//! per-partition tables for the partitioning of one module, and the
//! interning of the grids it hands out.
//!
//! Invariant: every table memoizes a pure function of its key, so a cached
//! result equals a recomputed one; equal requests get the very same table
//! (`Arc`), which the builder emits once per computation.

use super::derive::{offset_values, replicate_dims_map};
use super::{Grid, Groups};
use crate::memo::{hash_of, MemoTable};
use rustc_hash::FxHashSet;
use std::cell::RefCell;
use std::sync::Arc;

/// Memo tables of the grid operations the partitioner repeats, keyed by
/// value, and the set of grids they handed out (interned: an equal result
/// is returned as the grid already handed out, so equal grids share their
/// lazily built device lists and compare by pointer first). One cache lives
/// as long as the partitioning of one module; every operation is a pure
/// function of its inputs, so the cache changes no result.
#[derive(Default)]
pub struct GridCache {
    interned: RefCell<FxHashSet<Grid>>,
    remap: MemoTable<(Grid, Vec<Option<usize>>), Grid>,
    gathered: MemoTable<(Grid, Vec<(usize, i64)>), Option<Grid>>,
    all_to_all: MemoTable<(Grid, usize, usize, i64), Option<Grid>>,
    coarsened: MemoTable<(Grid, Vec<i64>), Option<Grid>>,
    groups: MemoTable<(Grid, Vec<(usize, i64)>), Groups>,
    replicated: MemoTable<(usize, i64), Grid>,
    merged: MemoTable<(Grid, Grid, Vec<usize>), Option<Grid>>,
    per_coord: MemoTable<(Grid, usize, Vec<i64>), Arc<[i64]>>,
    reshapes: MemoTable<(Grid, bool, Vec<i64>, Vec<i64>), Option<Grid>>,
}

impl GridCache {
    /// The grid equal to `g` this cache handed out first (`g` itself when
    /// none).
    pub fn intern(&self, g: Grid) -> Grid {
        let mut set = self.interned.borrow_mut();
        if let Some(x) = set.get(&g) {
            return x.clone();
        }
        set.insert(g.clone());
        g
    }

    fn intern_opt(&self, g: Option<Grid>) -> Option<Grid> {
        g.map(|g| self.intern(g))
    }

    /// [`Grid::remap`], memoized.
    pub fn remap(&self, g: &Grid, map: &[Option<usize>]) -> Grid {
        self.remap.get_or_insert_with(
            hash_of((g, map)),
            |k| k.0 == *g && k.1 == map,
            || (g.clone(), map.to_vec()),
            || self.intern(g.remap(map)),
        )
    }

    /// [`Grid::replicate_dims`], memoized.
    pub fn replicate_dims(&self, g: &Grid, dims: &[usize]) -> Grid {
        self.remap(g, &replicate_dims_map(g.rank(), dims))
    }

    /// [`Grid::gathered`], memoized.
    pub fn gathered(&self, g: &Grid, factors: &[(usize, i64)]) -> Option<Grid> {
        self.gathered.get_or_insert_with(
            hash_of((g, factors)),
            |k| k.0 == *g && k.1 == factors,
            || (g.clone(), factors.to_vec()),
            || self.intern_opt(g.gathered(factors)),
        )
    }

    /// [`Grid::all_to_all`], memoized.
    pub fn all_to_all(&self, g: &Grid, a: usize, b: usize, f: i64) -> Option<Grid> {
        self.all_to_all.get_or_insert_with(
            hash_of((g, a, b, f)),
            |k| k.0 == *g && (k.1, k.2, k.3) == (a, b, f),
            || (g.clone(), a, b, f),
            || self.intern_opt(g.all_to_all(a, b, f)),
        )
    }

    /// [`Grid::coarsened`], memoized.
    pub fn coarsened(&self, g: &Grid, dims: &[i64]) -> Option<Grid> {
        self.coarsened.get_or_insert_with(
            hash_of((g, dims)),
            |k| k.0 == *g && k.1 == dims,
            || (g.clone(), dims.to_vec()),
            || self.intern_opt(g.coarsened(dims)),
        )
    }

    /// [`Grid::factor_groups`], memoized (shared).
    pub fn factor_groups(&self, g: &Grid, factors: &[(usize, i64)]) -> Groups {
        self.groups.get_or_insert_with(
            hash_of((g, factors)),
            |k| k.0 == *g && k.1 == factors,
            || (g.clone(), factors.to_vec()),
            || Arc::new(g.factor_groups(factors)),
        )
    }

    /// [`Grid::replicated`], memoized.
    pub fn replicated(&self, rank: usize, n: i64) -> Grid {
        self.replicated.get_or_insert_with(
            hash_of((rank, n)),
            |k| *k == (rank, n),
            || (rank, n),
            || self.intern(Grid::replicated(rank, n)),
        )
    }

    /// [`Grid::merge`], memoized.
    pub fn merge(&self, x: &Grid, y: &Grid, from_y: &[usize]) -> Option<Grid> {
        self.merged.get_or_insert_with(
            hash_of((x, y, from_y)),
            |k| k.0 == *x && k.1 == *y && k.2 == from_y,
            || (x.clone(), y.clone(), from_y.to_vec()),
            || self.intern_opt(x.merge(y, from_y)),
        )
    }

    /// [`Grid::per_coord`], memoized: equal requests get the same table
    /// (one `Arc`), which the builder emits once per computation.
    pub fn per_coord(&self, g: &Grid, a: usize, vals: &[i64]) -> Arc<[i64]> {
        self.per_coord.get_or_insert_with(
            hash_of((g, a, vals)),
            |k| k.0 == *g && k.1 == a && k.2 == vals,
            || (g.clone(), a, vals.to_vec()),
            || g.per_coord(a, vals),
        )
    }

    /// [`Grid::offsets`], memoized (through [`GridCache::per_coord`]).
    pub fn offsets(&self, g: &Grid, a: usize, ts: i64) -> Arc<[i64]> {
        self.per_coord(g, a, &offset_values(g.tiles(a), ts))
    }

    /// A grid computed over a reshape from dims `from` to `to`, memoized:
    /// `compute` gives it for `g` (`forward`: the output grid of a local
    /// reshape of `g`; else the operand grid that reshapes to `g`).
    pub fn reshape_grid(
        &self,
        g: &Grid,
        forward: bool,
        from: &[i64],
        to: &[i64],
        compute: impl FnOnce() -> Option<Grid>,
    ) -> Option<Grid> {
        self.reshapes.get_or_insert_with(
            hash_of((g, forward, from, to)),
            |k| k.0 == *g && k.1 == forward && k.2 == from && k.3 == to,
            || (g.clone(), forward, from.to_vec(), to.to_vec()),
            || self.intern_opt(compute()),
        )
    }
}
