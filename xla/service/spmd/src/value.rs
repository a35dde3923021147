//! Shardings of values in the partitioner's working form (`ValueSharding`:
//! a grid per array leaf, manual, tuple, or opaque for tokens), partitioned
//! values (`PValue`), local shapes, and the conversion of IR shardings with
//! its per-module memo (`ShardingCache`).
//!
//! Invariants: a `ValueSharding` has the structure of its value's shape
//! (tuple for tuple, grid of the array's rank for arrays); converting the
//! same IR sharding for the same shape structure gives the same value.

use crate::error::SpmdError;
use crate::grid::{local_dims, Grid, GridCache};
use crate::memo::MemoTable;
use rustc_hash::FxHasher;
use std::hash::{Hash, Hasher};
use std::rc::Rc;
use std::sync::Arc;
use xla_hlo_ir::{HloInstruction, HloSharding, InstrId, Shape};
use xla_hlo_utils::{InstrSharding, Sharding};

/// The sharding of a value: a grid for arrays, manual arrays, tuples, and
/// values that are never partitioned (tokens).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ValueSharding {
    Grid(Grid),
    Manual,
    Tuple(Vec<ValueSharding>),
    Opaque,
}

impl ValueSharding {
    #[inline]
    pub fn grid(&self) -> Option<&Grid> {
        match self {
            ValueSharding::Grid(g) => Some(g),
            _ => None,
        }
    }
    /// Replicated everywhere (for every leaf of `shape`).
    pub fn replicated(shape: &Shape, n: i64) -> ValueSharding {
        ValueSharding::replicated_with(shape, &|rank| Grid::replicated(rank, n))
    }

    /// [`ValueSharding::replicated`] with its grids from `grids`.
    pub fn replicated_in(shape: &Shape, n: i64, grids: &GridCache) -> ValueSharding {
        ValueSharding::replicated_with(shape, &|rank| grids.replicated(rank, n))
    }

    fn replicated_with(shape: &Shape, grid: &dyn Fn(usize) -> Grid) -> ValueSharding {
        match shape {
            Shape::Tuple(e) => ValueSharding::Tuple(
                e.iter()
                    .map(|s| ValueSharding::replicated_with(s, grid))
                    .collect(),
            ),
            s if s.is_array() => ValueSharding::Grid(grid(s.rank())),
            _ => ValueSharding::Opaque,
        }
    }

    /// The same value with every grid interned in `grids`.
    fn interned(self, grids: &GridCache) -> ValueSharding {
        match self {
            ValueSharding::Grid(g) => ValueSharding::Grid(grids.intern(g)),
            ValueSharding::Tuple(e) => {
                ValueSharding::Tuple(e.into_iter().map(|x| x.interned(grids)).collect())
            }
            other => other,
        }
    }
    pub fn is_manual(&self) -> bool {
        match self {
            ValueSharding::Manual => true,
            ValueSharding::Tuple(e) => {
                !e.is_empty()
                    && e.iter()
                        .all(|x| x.is_manual() || *x == ValueSharding::Opaque)
            }
            _ => false,
        }
    }
    pub fn has_manual(&self) -> bool {
        match self {
            ValueSharding::Manual => true,
            ValueSharding::Tuple(e) => e.iter().any(|x| x.has_manual()),
            _ => false,
        }
    }
    /// The IR sharding of this value (tuples flattened).
    pub fn to_ir(&self) -> HloSharding {
        fn leaves(v: &ValueSharding, out: &mut Vec<Sharding>) {
            match v {
                ValueSharding::Grid(g) => out.push(g.to_sharding()),
                ValueSharding::Manual => out.push(Sharding::Manual),
                ValueSharding::Tuple(e) => e.iter().for_each(|x| leaves(x, out)),
                ValueSharding::Opaque => out.push(Sharding::Replicated),
            }
        }
        match self {
            ValueSharding::Tuple(_) => {
                let mut v = Vec::new();
                leaves(self, &mut v);
                InstrSharding::tuple(v).to_ir()
            }
            ValueSharding::Grid(g) => InstrSharding::Single(g.to_sharding()).to_ir(),
            ValueSharding::Manual => HloSharding::manual(),
            ValueSharding::Opaque => HloSharding::replicated(),
        }
    }
}

/// The local shape of a global `shape` under `vs`.
#[inline]
pub fn local_shape(shape: &Shape, vs: &ValueSharding) -> Shape {
    match (shape, vs) {
        (Shape::Tuple(e), ValueSharding::Tuple(v)) if e.len() == v.len() => {
            Shape::Tuple(e.iter().zip(v).map(|(s, x)| local_shape(s, x)).collect())
        }
        (Shape::Array(a), ValueSharding::Grid(g))
            if a.element_type.is_array_type() && g.rank() == a.dims.len() =>
        {
            Shape::Array(a.with_dims(local_dims(&a.dims, g)))
        }
        (s, _) => s.clone(),
    }
}

fn leaf_sharding(s: &Sharding, shape: &Shape, n: i64) -> Result<ValueSharding, SpmdError> {
    if !shape.is_array() {
        return Ok(ValueSharding::Opaque);
    }
    match s {
        Sharding::Manual => Ok(ValueSharding::Manual),
        s => Ok(ValueSharding::Grid(Grid::from_sharding(
            s,
            shape.rank(),
            n,
        )?)),
    }
}

/// The sharding of an instruction (replicated when it has none), through
/// the module's conversion cache. An outfeed's sharding describes its
/// operands, not its token result: the token is replicated.
pub fn sharding_of(
    instr: &HloInstruction,
    n: i64,
    cache: &ShardingCache,
    grids: &GridCache,
) -> Result<ValueSharding, SpmdError> {
    if instr.opcode == xla_hlo_ir::Opcode::Outfeed {
        return Ok(ValueSharding::replicated_in(&instr.shape, n, grids));
    }
    cache
        .convert_shared(grids, instr.sharding.as_ref(), &instr.shape, n)
        .map_err(|e| match e {
            SpmdError::Sharding { message, .. } => SpmdError::Sharding {
                instruction: instr.name.clone(),
                message,
            },
            other => other,
        })
}

/// The sharding of a value of `shape` whose IR sharding is `s` (replicated
/// when `None`).
pub fn sharding_from_ir(
    s: Option<&HloSharding>,
    shape: &Shape,
    n: i64,
) -> Result<ValueSharding, SpmdError> {
    match s {
        None => Ok(ValueSharding::replicated(shape, n)),
        Some(s) => convert_sharding(s, shape, n),
    }
}

/// Memo of converted IR shardings, keyed by value: the leaf sharding
/// kinds, whether it is a tuple, the structure of the shape (see
/// `skeleton`) and the partition count. One cache lives as long as the
/// partitioning of one module.
///
/// Instructions that share one IR sharding (the same `Arc`, as propagation
/// writes them) are also found by pointer, without hashing the sharding;
/// that table holds a clone of each `Arc`, so a pointer is never reused
/// for another sharding while the cache lives.
#[derive(Default)]
pub struct ShardingCache {
    table: MemoTable<(HloSharding, Vec<i64>, i64), ValueSharding>,
    shared: MemoTable<(Arc<HloSharding>, Vec<i64>, i64), ValueSharding>,
}

impl ShardingCache {
    /// [`ShardingCache::convert`], found first by the sharding's pointer.
    pub fn convert_shared(
        &self,
        grids: &GridCache,
        s: Option<&Arc<HloSharding>>,
        shape: &Shape,
        n: i64,
    ) -> Result<ValueSharding, SpmdError> {
        let Some(s) = s else {
            return self.convert(grids, None, shape, n);
        };
        let mut h = FxHasher::default();
        Arc::as_ptr(s).hash(&mut h);
        skeleton(shape, &mut |x| x.hash(&mut h));
        n.hash(&mut h);
        let hk = h.finish();
        let matches = |k: &(Arc<HloSharding>, Vec<i64>, i64)| {
            Arc::ptr_eq(&k.0, s) && k.2 == n && skeleton_is(shape, &k.1)
        };
        if let Some(v) = self.shared.get(hk, matches) {
            return Ok(v);
        }
        let v = self.convert(grids, Some(s), shape, n)?;
        let mut sk = Vec::new();
        skeleton(shape, &mut |x| sk.push(x));
        self.shared.insert(hk, (s.clone(), sk, n), v.clone());
        Ok(v)
    }

    /// [`sharding_from_ir`], memoized (errors are not), its grids interned in
    /// `grids`.
    pub fn convert(
        &self,
        grids: &GridCache,
        s: Option<&HloSharding>,
        shape: &Shape,
        n: i64,
    ) -> Result<ValueSharding, SpmdError> {
        let Some(s) = s else {
            return Ok(ValueSharding::replicated_in(shape, n, grids));
        };
        let mut h = FxHasher::default();
        for leaf in s.leaves() {
            leaf.kind.hash(&mut h);
        }
        s.is_tuple().hash(&mut h);
        skeleton(shape, &mut |x| x.hash(&mut h));
        n.hash(&mut h);
        let hk = h.finish();
        let same = |a: &HloSharding| {
            a.is_tuple() == s.is_tuple()
                && a.leaves().len() == s.leaves().len()
                && a.leaves()
                    .iter()
                    .zip(s.leaves())
                    .all(|(x, y)| x.kind == y.kind)
        };
        let matches =
            |k: &(HloSharding, Vec<i64>, i64)| same(&k.0) && k.2 == n && skeleton_is(shape, &k.1);
        if let Some(v) = self.table.get(hk, matches) {
            return Ok(v);
        }
        let v = convert_sharding(s, shape, n)?.interned(grids);
        let mut sk = Vec::new();
        skeleton(shape, &mut |x| sk.push(x));
        self.table.insert(hk, (s.clone(), sk, n), v.clone());
        Ok(v)
    }
}

/// Visits the structure of a shape that its sharding conversion depends
/// on: leaf ranks (-1 for non-arrays) with tuple sizes encoded as
/// `-(k + 2)`, in order.
fn skeleton(shape: &Shape, out: &mut impl FnMut(i64)) {
    match shape {
        Shape::Tuple(e) => {
            out(-(e.len() as i64) - 2);
            for x in e {
                skeleton(x, out);
            }
        }
        s if s.is_array() => out(s.rank() as i64),
        _ => out(-1),
    }
}

/// True when `sk` is the skeleton of `shape`.
fn skeleton_is(shape: &Shape, sk: &[i64]) -> bool {
    let mut at = 0;
    let mut same = true;
    skeleton(shape, &mut |x| {
        same &= sk.get(at) == Some(&x);
        at += 1;
    });
    same && at == sk.len()
}

/// The grid of an iota-tiled leaf sharding with only replicated subgroups,
/// read straight from the IR (no device list); `None` for anything else.
fn fast_leaf(leaf: &xla_hlo_ir::SingleSharding, shape: &Shape, n: i64) -> Option<ValueSharding> {
    use xla_hlo_ir::sharding::{ShardingKind, SubgroupType, TileAssignment};
    if !shape.is_array() {
        return None;
    }
    match &leaf.kind {
        ShardingKind::Replicated => Some(ValueSharding::Grid(Grid::replicated(shape.rank(), n))),
        ShardingKind::Tiled {
            tile_assignment:
                TileAssignment::Iota {
                    dims,
                    reshape_dims,
                    perm,
                },
            replicate_on_last_tile_dim,
            last_tile_dims,
        } => {
            if last_tile_dims
                .iter()
                .any(|t| *t != SubgroupType::Replicated)
            {
                return None;
            }
            let sub = last_tile_dims.len() + usize::from(*replicate_on_last_tile_dim);
            if dims.len() != shape.rank() + sub || dims.iter().product::<i64>() != n {
                return None;
            }
            let mut gd = dims[..shape.rank()].to_vec();
            gd.push(dims[shape.rank()..].iter().product());
            Grid::from_iota(&gd, reshape_dims, perm).map(ValueSharding::Grid)
        }
        _ => None,
    }
}

fn convert_sharding(s: &HloSharding, shape: &Shape, n: i64) -> Result<ValueSharding, SpmdError> {
    match (s, shape) {
        (HloSharding::Single(leaf), sh) if sh.is_array() => {
            if let Some(v) = fast_leaf(leaf, sh, n) {
                return Ok(v);
            }
        }
        (HloSharding::Tuple(leaves), Shape::Tuple(_)) => {
            fn build(
                shape: &Shape,
                leaves: &[xla_hlo_ir::SingleSharding],
                next: &mut usize,
                n: i64,
            ) -> Option<ValueSharding> {
                match shape {
                    Shape::Tuple(e) => Some(ValueSharding::Tuple(
                        e.iter()
                            .map(|x| build(x, leaves, next, n))
                            .collect::<Option<_>>()?,
                    )),
                    s => {
                        let leaf = leaves.get(*next)?;
                        *next += 1;
                        if s.is_array() {
                            fast_leaf(leaf, s, n)
                        } else {
                            Some(ValueSharding::Opaque)
                        }
                    }
                }
            }
            let mut next = 0;
            if let Some(v) = build(shape, leaves, &mut next, n) {
                if next == leaves.len() {
                    return Ok(v);
                }
            }
        }
        _ => {}
    }
    let is = InstrSharding::from_ir(s, shape)?;
    let leaves = is.leaves();
    fn build(
        shape: &Shape,
        leaves: &[Sharding],
        next: &mut usize,
        n: i64,
    ) -> Result<ValueSharding, SpmdError> {
        match shape {
            Shape::Tuple(e) => Ok(ValueSharding::Tuple(
                e.iter()
                    .map(|x| build(x, leaves, next, n))
                    .collect::<Result<_, _>>()?,
            )),
            s => {
                let leaf = leaves.get(*next).cloned().unwrap_or(Sharding::Replicated);
                *next += 1;
                leaf_sharding(&leaf, s, n)
            }
        }
    }
    let mut next = 0;
    build(shape, leaves, &mut next, n)
}

/// A partitioned value.
#[derive(Clone, Debug)]
pub struct PValue {
    /// The local instruction.
    pub id: InstrId,
    /// The global (unpartitioned) shape (shared).
    pub shape: Rc<Shape>,
    pub vs: ValueSharding,
}

/// Manual everywhere in a tuple tree (tokens stay opaque).
pub fn target_like_manual(v: &ValueSharding) -> ValueSharding {
    match v {
        ValueSharding::Tuple(e) => ValueSharding::Tuple(e.iter().map(target_like_manual).collect()),
        ValueSharding::Opaque => ValueSharding::Opaque,
        _ => ValueSharding::Manual,
    }
}
