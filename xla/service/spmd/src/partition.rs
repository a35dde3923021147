//! The partitioning driver: walks each computation in definition order,
//! maps every original instruction to a `PValue` (its local instruction in
//! the new computation, its global shape and its sharding), dispatches to
//! the per-opcode handlers, and reshards values on demand (with a cache, so
//! one value is gathered at most once per target sharding).
//!
//! Called computations (while body/condition, conditional branches, `call`
//! targets) are partitioned with the shardings of their call site; a
//! computation needed with two different signatures is cloned. Computations
//! applied elementwise (reducers, comparators) are kept as they are.
//!
//! Invariants: every handler returns a value whose local instruction has
//! exactly the local shape of its sharding; the generic fallback (operands
//! replicated, op run on the global shape, result sliced) is correct for
//! every opcode without side effects, so handlers may decline by falling back.

use crate::builder::{elem, with_dims, Builder, ModCtx};
use crate::error::{invalid, unsupported, SpmdError};
use crate::grid::{local_dims, Grid, GridCache};
use crate::memo::MemoTable;
use crate::reshard;
use rustc_hash::{FxHashMap, FxHasher};
use std::hash::{Hash, Hasher};
use std::rc::Rc;
use xla_hlo_ir::{
    AttrKey, AttrValue, CompId, HloComputation, HloInstruction, HloModule, HloSharding, InstrId,
    Opcode, Shape,
};
use xla_hlo_utils::{InstrSharding, Sharding};

/// The sharding of a value: a grid for arrays, manual arrays, tuples, and
/// values that are never partitioned (tokens).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum VS {
    Grid(Grid),
    Manual,
    Tuple(Vec<VS>),
    Opaque,
}

impl VS {
    pub fn grid(&self) -> Option<&Grid> {
        match self {
            VS::Grid(g) => Some(g),
            _ => None,
        }
    }
    /// Replicated everywhere (for every leaf of `shape`).
    pub fn replicated(shape: &Shape, n: i64) -> VS {
        VS::replicated_with(shape, &|rank| Grid::replicated(rank, n))
    }

    /// [`VS::replicated`] with its grids from `grids`.
    pub fn replicated_in(shape: &Shape, n: i64, grids: &GridCache) -> VS {
        VS::replicated_with(shape, &|rank| grids.replicated(rank, n))
    }

    fn replicated_with(shape: &Shape, grid: &dyn Fn(usize) -> Grid) -> VS {
        match shape {
            Shape::Tuple(e) => VS::Tuple(e.iter().map(|s| VS::replicated_with(s, grid)).collect()),
            s if s.is_array() => VS::Grid(grid(s.rank())),
            _ => VS::Opaque,
        }
    }

    /// The same value with every grid interned in `grids`.
    fn interned(self, grids: &GridCache) -> VS {
        match self {
            VS::Grid(g) => VS::Grid(grids.intern(g)),
            VS::Tuple(e) => VS::Tuple(e.into_iter().map(|x| x.interned(grids)).collect()),
            other => other,
        }
    }
    pub fn is_manual(&self) -> bool {
        match self {
            VS::Manual => true,
            VS::Tuple(e) => !e.is_empty() && e.iter().all(|x| x.is_manual() || *x == VS::Opaque),
            _ => false,
        }
    }
    pub fn has_manual(&self) -> bool {
        match self {
            VS::Manual => true,
            VS::Tuple(e) => e.iter().any(|x| x.has_manual()),
            _ => false,
        }
    }
    /// The IR sharding of this value (tuples flattened).
    pub fn to_ir(&self) -> HloSharding {
        fn leaves(v: &VS, out: &mut Vec<Sharding>) {
            match v {
                VS::Grid(g) => out.push(g.to_sharding()),
                VS::Manual => out.push(Sharding::Manual),
                VS::Tuple(e) => e.iter().for_each(|x| leaves(x, out)),
                VS::Opaque => out.push(Sharding::Replicated),
            }
        }
        match self {
            VS::Tuple(_) => {
                let mut v = Vec::new();
                leaves(self, &mut v);
                InstrSharding::tuple(v).to_ir()
            }
            VS::Grid(g) => InstrSharding::Single(g.to_sharding()).to_ir(),
            VS::Manual => HloSharding::manual(),
            VS::Opaque => HloSharding::replicated(),
        }
    }
}

/// The local shape of a global `shape` under `vs`.
pub fn local_shape(shape: &Shape, vs: &VS) -> Shape {
    match (shape, vs) {
        (Shape::Tuple(e), VS::Tuple(v)) if e.len() == v.len() => {
            Shape::Tuple(e.iter().zip(v).map(|(s, x)| local_shape(s, x)).collect())
        }
        (s, VS::Grid(g)) if s.is_array() && g.rank() == s.rank() => {
            with_dims(s, &local_dims(s.dims(), g))
        }
        (s, _) => s.clone(),
    }
}

fn leaf_to_vs(s: &Sharding, shape: &Shape, n: i64) -> Result<VS, SpmdError> {
    if !shape.is_array() {
        return Ok(VS::Opaque);
    }
    match s {
        Sharding::Manual => Ok(VS::Manual),
        s => Ok(VS::Grid(Grid::from_sharding(s, shape.rank(), n)?)),
    }
}

/// The sharding of an instruction (replicated when it has none), through
/// the module's conversion cache.
pub fn vs_of(
    instr: &HloInstruction,
    n: i64,
    cache: &ShardingCache,
    grids: &GridCache,
) -> Result<VS, SpmdError> {
    cache
        .convert(grids, instr.sharding.as_ref(), &instr.shape, n)
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
pub fn vs_from_ir(s: Option<&HloSharding>, shape: &Shape, n: i64) -> Result<VS, SpmdError> {
    match s {
        None => Ok(VS::replicated(shape, n)),
        Some(s) => vs_from_ir_uncached(s, shape, n),
    }
}

/// Memo of converted IR shardings, keyed by value: the leaf sharding
/// kinds, whether it is a tuple, the structure of the shape (see
/// [`skeleton`]) and the partition count. One cache lives as long as the
/// partitioning of one module.
#[derive(Default)]
pub struct ShardingCache {
    table: MemoTable<(HloSharding, Vec<i64>, i64), VS>,
}

impl ShardingCache {
    /// [`vs_from_ir`], memoized (errors are not), its grids interned in
    /// `grids`.
    pub fn convert(
        &self,
        grids: &GridCache,
        s: Option<&HloSharding>,
        shape: &Shape,
        n: i64,
    ) -> Result<VS, SpmdError> {
        let Some(s) = s else {
            return Ok(VS::replicated_in(shape, n, grids));
        };
        let mut sk = Vec::new();
        skeleton(shape, &mut sk);
        let mut h = FxHasher::default();
        for leaf in s.leaves() {
            leaf.kind.hash(&mut h);
        }
        s.is_tuple().hash(&mut h);
        sk.hash(&mut h);
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
        if let Some(v) = self.table.get(hk, |k| same(&k.0) && k.1 == sk && k.2 == n) {
            return Ok(v);
        }
        let v = vs_from_ir_uncached(s, shape, n)?.interned(grids);
        self.table.insert(hk, (s.clone(), sk, n), v.clone());
        Ok(v)
    }
}

/// The structure of a shape that its sharding conversion depends on: leaf
/// ranks (-1 for non-arrays) with tuple sizes encoded as `-(k + 2)`.
fn skeleton(shape: &Shape, out: &mut Vec<i64>) {
    match shape {
        Shape::Tuple(e) => {
            out.push(-(e.len() as i64) - 2);
            for x in e {
                skeleton(x, out);
            }
        }
        s if s.is_array() => out.push(s.rank() as i64),
        _ => out.push(-1),
    }
}

/// The grid of an iota-tiled leaf sharding with only replicated subgroups,
/// read straight from the IR (no device list); `None` for anything else.
fn fast_leaf(leaf: &xla_hlo_ir::SingleSharding, shape: &Shape, n: i64) -> Option<VS> {
    use xla_hlo_ir::sharding::{ShardingKind, SubgroupType, TileAssignment};
    if !shape.is_array() {
        return None;
    }
    match &leaf.kind {
        ShardingKind::Replicated => Some(VS::Grid(Grid::replicated(shape.rank(), n))),
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
            Grid::from_iota(&gd, reshape_dims, perm).map(VS::Grid)
        }
        _ => None,
    }
}

fn vs_from_ir_uncached(s: &HloSharding, shape: &Shape, n: i64) -> Result<VS, SpmdError> {
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
            ) -> Option<VS> {
                match shape {
                    Shape::Tuple(e) => Some(VS::Tuple(
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
                            Some(VS::Opaque)
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
    ) -> Result<VS, SpmdError> {
        match shape {
            Shape::Tuple(e) => Ok(VS::Tuple(
                e.iter()
                    .map(|x| build(x, leaves, next, n))
                    .collect::<Result<_, _>>()?,
            )),
            s => {
                let leaf = leaves.get(*next).cloned().unwrap_or(Sharding::Replicated);
                *next += 1;
                leaf_to_vs(&leaf, s, n)
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
    pub vs: VS,
}

/// Partitions one computation.
pub struct Part<'a, 'c> {
    pub orig: &'a HloModule,
    pub oc: &'a HloComputation,
    pub b: Builder<'c>,
    pub vals: Vec<Option<PValue>>,
    /// Reshard cache: (value, global dims, grid) -> the value laid out by
    /// that grid. Values are keyed by their class (see `class_of`), so
    /// every layout of one array that has been built is reused, including
    /// the one a value was resharded from (as XLA's reshard cache does).
    /// The global dims are part of the key: one local buffer can hold
    /// different global arrays (a slice whose tiles are the operand's own
    /// returns the operand's local value for a smaller global shape).
    cache: FxHashMap<(InstrId, Vec<i64>, Grid), InstrId>,
    /// Local value -> the first local value of the same global array (the
    /// results of reshards belong to their source's class).
    class_of: FxHashMap<InstrId, InstrId>,
}

/// Partitions computation `cid` of `orig` with parameter shardings
/// `params`; the root is resharded to `root` when given. Returns the new
/// computation and its root sharding.
pub fn partition_computation(
    orig: &HloModule,
    ctx: &mut ModCtx,
    cid: CompId,
    params: &[VS],
    root: Option<&VS>,
    name: &str,
) -> Result<(HloComputation, VS), SpmdError> {
    let oc = orig.comp(cid);
    let b = Builder::new(ctx, name, oc.instructions.len() * 2 + 16);
    let mut p = Part {
        orig,
        oc,
        b,
        vals: vec![None; oc.instructions.len()],
        cache: FxHashMap::default(),
        class_of: FxHashMap::default(),
    };
    for id in oc.ids() {
        let instr = oc.instr(id);
        let v = if instr.opcode == Opcode::Parameter {
            let k = instr.parameter_number.unwrap_or(0) as usize;
            let vs = params
                .get(k)
                .cloned()
                .ok_or_else(|| SpmdError::Invalid(format!("no sharding for parameter {k}")))?;
            p.parameter(instr, vs)?
        } else {
            p.handle(id).map_err(|e| annotate(e, instr))?
        };
        p.vals[id.index()] = Some(v);
    }
    let rv = p.val(oc.root)?;
    let rv = match root {
        Some(t) => p.reshard(&rv, t)?,
        None => rv,
    };
    p.b.comp.root = rv.id;
    let mut comp = std::mem::replace(&mut p.b.comp, HloComputation::new(""));
    comp.execution_thread = oc.execution_thread.clone();
    let removed = dce(&mut comp);
    p.b.ctx.changes += removed;
    Ok((comp, rv.vs))
}

fn annotate(e: SpmdError, instr: &HloInstruction) -> SpmdError {
    match e {
        SpmdError::Sharding {
            instruction,
            message,
        } if instruction.is_empty() => SpmdError::Sharding {
            instruction: instr.name.clone(),
            message,
        },
        SpmdError::Unsupported(m) => SpmdError::Unsupported(format!("%{}: {m}", instr.name)),
        SpmdError::Invalid(m) => SpmdError::Invalid(format!("%{}: {m}", instr.name)),
        other => other,
    }
}

fn has_side_effect(i: &HloInstruction) -> bool {
    match i.opcode {
        Opcode::CustomCall => i.bool_attr(AttrKey::CustomCallHasSideEffect) == Some(true),
        Opcode::While | Opcode::Conditional | Opcode::Call => true,
        op => matches!(
            op,
            Opcode::Send
                | Opcode::SendDone
                | Opcode::Recv
                | Opcode::RecvDone
                | Opcode::Outfeed
                | Opcode::Infeed
                | Opcode::AfterAll
                | Opcode::AddDependency
                | Opcode::RngGetAndUpdateState
        ),
    }
}

/// Removes instructions nothing live uses (parameters and side effects
/// stay); returns how many were removed.
pub fn dce(comp: &mut HloComputation) -> usize {
    let n = comp.instructions.len();
    let mut live = vec![false; n];
    let mut stack: Vec<usize> = vec![comp.root.index()];
    for (i, instr) in comp.instructions.iter().enumerate() {
        if instr.opcode == Opcode::Parameter || has_side_effect(instr) {
            stack.push(i);
        }
    }
    while let Some(i) = stack.pop() {
        if i >= n || live[i] {
            continue;
        }
        live[i] = true;
        let instr = &comp.instructions[i];
        stack.extend(instr.operands.iter().map(|o| o.index()));
        stack.extend(instr.control_predecessors.iter().map(|o| o.index()));
    }
    if live.iter().all(|&l| l) {
        return 0;
    }
    let old = std::mem::take(&mut comp.instructions);
    let root = comp.root;
    comp.parameters.clear();
    let live_count = live.iter().filter(|&&l| l).count();
    let mut kept = Vec::with_capacity(live_count);
    let mut map = vec![InstrId(u32::MAX); n];
    for (i, mut instr) in old.into_iter().enumerate() {
        if !live[i] {
            continue;
        }
        for o in instr.operands.iter_mut() {
            *o = map[o.index()];
        }
        for p in instr.control_predecessors.iter_mut() {
            *p = map[p.index()];
        }
        let id = InstrId(kept.len() as u32);
        if instr.opcode == Opcode::Parameter {
            if let Some(k) = instr.parameter_number.and_then(|k| usize::try_from(k).ok()) {
                if comp.parameters.len() <= k {
                    comp.parameters.resize(k + 1, InstrId(u32::MAX));
                }
                comp.parameters[k] = id;
            }
        }
        map[i] = id;
        kept.push(instr);
    }
    let removed = n - kept.len();
    comp.instructions = kept;
    comp.root = map[root.index()];
    removed
}

impl<'a, 'c> Part<'a, 'c> {
    pub fn n(&self) -> i64 {
        self.b.n()
    }

    /// The module's memo of derived grids.
    pub fn grids(&self) -> &GridCache {
        &self.b.ctx.cache.grids
    }

    /// The partitioned value of an original instruction.
    pub fn val(&self, id: InstrId) -> Result<PValue, SpmdError> {
        self.vals
            .get(id.index())
            .and_then(|v| v.clone())
            .ok_or_else(|| SpmdError::Invalid(format!("operand {id} used before definition")))
    }

    pub fn operand(&self, instr: &HloInstruction, k: usize) -> Result<PValue, SpmdError> {
        let id = *instr
            .operands
            .get(k)
            .ok_or_else(|| SpmdError::Invalid(format!("missing operand {k}")))?;
        self.val(id)
    }

    /// The sharding the instruction should get.
    pub fn target(&self, instr: &HloInstruction) -> Result<VS, SpmdError> {
        vs_of(instr, self.n(), &self.b.ctx.cache.shardings, self.grids())
    }

    pub fn target_grid(&self, instr: &HloInstruction) -> Result<Grid, SpmdError> {
        match self.target(instr)? {
            VS::Grid(g) => Ok(g),
            other => unsupported(format!("expected an array sharding, got {other:?}")),
        }
    }

    /// Reshards `v` to `t`.
    pub fn reshard(&mut self, v: &PValue, t: &VS) -> Result<PValue, SpmdError> {
        if &v.vs == t {
            return Ok(v.clone());
        }
        match (&v.vs, t) {
            (VS::Grid(s), VS::Grid(g)) => {
                let id = self.reshard_grid(v.id, s, g, &v.shape)?;
                Ok(PValue {
                    id,
                    shape: v.shape.clone(),
                    vs: t.clone(),
                })
            }
            (VS::Tuple(src), VS::Tuple(dst)) if src.len() == dst.len() => {
                let elems = v.shape.tuple_elements().to_vec();
                let mut ids = Vec::new();
                for (k, (s_vs, d_vs)) in src.iter().zip(dst).enumerate() {
                    let shape = elems.get(k).cloned().unwrap_or_else(|| (*v.shape).clone());
                    let g = self.element(v.id, k, local_shape(&shape, s_vs));
                    let ev = PValue {
                        id: g,
                        shape: Rc::new(shape),
                        vs: s_vs.clone(),
                    };
                    ids.push(self.reshard(&ev, d_vs)?.id);
                }
                let lshape = local_shape(&v.shape, t);
                let id = self.b.add("tuple", Opcode::Tuple, lshape, ids, vec![]);
                Ok(PValue {
                    id,
                    shape: v.shape.clone(),
                    vs: t.clone(),
                })
            }
            // A replicated value is usable as is inside a manual region.
            (VS::Grid(s), VS::Manual) if s.is_replicated() => Ok(PValue {
                id: v.id,
                shape: v.shape.clone(),
                vs: VS::Manual,
            }),
            (_, VS::Opaque) | (VS::Opaque, _) => Ok(PValue {
                vs: t.clone(),
                ..v.clone()
            }),
            (a, b) => unsupported(format!("resharding {a:?} to {b:?}")),
        }
    }

    /// Element `k` of local tuple `t`: the tuple's operand when `t` is a
    /// tuple instruction (so reshard caches see the original value), else a
    /// get-tuple-element.
    pub fn element(&mut self, t: InstrId, k: usize, lshape: Shape) -> InstrId {
        let ti = self.b.comp.instr(t);
        if ti.opcode == Opcode::Tuple {
            if let Some(&o) = ti.operands.get(k) {
                return o;
            }
        }
        self.b.add(
            "get-tuple-element",
            Opcode::GetTupleElement,
            lshape,
            vec![t],
            vec![(AttrKey::Index, AttrValue::Int(k as i64))],
        )
    }

    pub fn reshard_grid(
        &mut self,
        x: InstrId,
        s: &Grid,
        t: &Grid,
        shape: &Shape,
    ) -> Result<InstrId, SpmdError> {
        if s == t {
            return Ok(x);
        }
        // A broadcast of a scalar is rebuilt in the target layout: nothing
        // needs to move (as XLA does).
        if let Some(scalar) = self.splat_source(x) {
            let local = local_dims(shape.dims(), t);
            return Ok(self.b.broadcast(scalar, &local, &[]));
        }
        let class = self.class(x);
        let dims = shape.dims().to_vec();
        if let Some(&hit) = self.cache.get(&(class, dims.clone(), t.clone())) {
            return Ok(hit);
        }
        let bytes = elem(shape)?.byte_width().max(1) as u64;
        let plan = self.b.ctx.cache.plan(s, t, shape.dims(), bytes);
        let y = reshard::emit(&mut self.b, x, s, &plan, shape.dims())?;
        self.cache.insert((class, dims.clone(), t.clone()), y);
        self.cache.entry((class, dims, s.clone())).or_insert(x);
        self.class_of.insert(y, class);
        Ok(y)
    }

    /// The scalar a local value broadcasts, when it is a broadcast of one.
    fn splat_source(&self, x: InstrId) -> Option<InstrId> {
        let xi = self.b.comp.instr(x);
        let &[s] = &xi.operands[..] else {
            return None;
        };
        (xi.opcode == Opcode::Broadcast && self.b.shape(s).rank() == 0).then_some(s)
    }

    fn class(&self, x: InstrId) -> InstrId {
        self.class_of.get(&x).copied().unwrap_or(x)
    }

    /// Bytes per device to reshard `v` to `t` (0 when cached).
    pub fn cost(&self, v: &PValue, t: &Grid) -> u64 {
        match &v.vs {
            VS::Grid(s) => {
                let key = (self.class(v.id), v.shape.dims().to_vec(), t.clone());
                if s == t || self.cache.contains_key(&key) || self.splat_source(v.id).is_some() {
                    return 0;
                }
                let bytes = v
                    .shape
                    .element_type()
                    .map(|e| e.byte_width().max(1))
                    .unwrap_or(4) as u64;
                self.b.ctx.cache.plan(s, t, v.shape.dims(), bytes).cost
            }
            _ => 0,
        }
    }

    /// Bytes per device to reshard an array of `shape` from `s` to `t`.
    pub fn cost_of(&self, shape: &Shape, s: &Grid, t: &Grid) -> u64 {
        if s == t {
            return 0;
        }
        let bytes = shape
            .element_type()
            .map(|e| e.byte_width().max(1))
            .unwrap_or(4) as u64;
        self.b.ctx.cache.plan(s, t, shape.dims(), bytes).cost
    }

    pub fn reshard_to_grid(&mut self, v: &PValue, g: &Grid) -> Result<InstrId, SpmdError> {
        Ok(self.reshard(v, &VS::Grid(g.clone()))?.id)
    }

    /// Replicates every leaf.
    pub fn replicate(&mut self, v: &PValue) -> Result<PValue, SpmdError> {
        let t = VS::replicated_in(&v.shape, self.n(), self.grids());
        if v.vs.has_manual() {
            return unsupported("replicating a manual value");
        }
        self.reshard(v, &t)
    }

    /// A clone of `instr` with new operands and shape (the original name is
    /// kept for the first clone).
    pub fn clone_instr(
        &mut self,
        instr: &HloInstruction,
        ops: Vec<InstrId>,
        shape: Shape,
    ) -> InstrId {
        if !instr.control_predecessors.is_empty() {
            self.b.ctx.changes += 1;
        }
        let c = HloInstruction {
            name: self.b.ctx.orig_name(&instr.name),
            opcode: instr.opcode,
            shape,
            operands: ops,
            attrs: instr.attrs.clone(),
            sharding: None,
            control_predecessors: Vec::new(),
            parameter_number: instr.parameter_number,
            literal: instr.literal.clone(),
            async_wrapped: instr.async_wrapped,
        };
        self.b.push(c)
    }

    /// Infers the shape `instr` would have with operands of `shapes`.
    pub fn infer(&self, instr: &HloInstruction, shapes: &[&Shape]) -> Result<Shape, SpmdError> {
        let pref = instr.shape.element_type();
        xla_hlo_ir::shape_inference::infer_shape_detailed(
            None,
            &self.orig.computations,
            instr,
            shapes,
            pref,
        )
        .map_err(|e| SpmdError::Invalid(format!("local shape of %{}: {}", instr.name, e.message())))
        .map(|s| match (&s, &instr.shape) {
            (Shape::Array(a), Shape::Array(o)) if a.dims.len() == o.dims.len() => {
                Shape::Array(xla_hlo_ir::ArrayShape {
                    layout: o.layout.clone(),
                    ..a.clone()
                })
            }
            _ => s,
        })
    }

    /// Clones `instr` on local operands with an inferred local shape and
    /// checks it against the expected local shape of `vs`.
    pub fn emit_local(
        &mut self,
        instr: &HloInstruction,
        ops: Vec<InstrId>,
        vs: &VS,
    ) -> Result<PValue, SpmdError> {
        let want = local_shape(&instr.shape, vs);
        if instr.opcode.is_elementwise() {
            // The result has the operands' (local) dims by construction.
            let id = self.clone_instr(instr, ops, want);
            return Ok(PValue {
                id,
                shape: Rc::new(instr.shape.clone()),
                vs: vs.clone(),
            });
        }
        let shapes: Vec<Shape> = ops.iter().map(|&o| self.b.shape(o).clone()).collect();
        let refs: Vec<&Shape> = shapes.iter().collect();
        let got = match self.infer(instr, &refs) {
            Ok(s) => s,
            Err(_) => want.clone(),
        };
        if !got.compatible(&want) && got.dims() != want.dims() {
            return invalid(format!(
                "local shape {got} differs from the expected {want}"
            ));
        }
        let id = self.clone_instr(instr, ops, want);
        Ok(PValue {
            id,
            shape: Rc::new(instr.shape.clone()),
            vs: vs.clone(),
        })
    }

    /// Counts a handler use (for the partitioning summary).
    pub fn note(&mut self, instr: &HloInstruction, handler: &'static str) {
        *self
            .b
            .ctx
            .handler_counts
            .entry((instr.opcode, handler))
            .or_default() += 1;
    }

    fn parameter(&mut self, instr: &HloInstruction, vs: VS) -> Result<PValue, SpmdError> {
        let mut c = instr.clone();
        c.name = self.b.ctx.orig_name(&instr.name);
        c.shape = local_shape(&instr.shape, &vs);
        c.sharding = None;
        let id = self.b.push(c);
        Ok(PValue {
            id,
            shape: Rc::new(instr.shape.clone()),
            vs,
        })
    }

    /// Dispatches one instruction.
    fn handle(&mut self, id: InstrId) -> Result<PValue, SpmdError> {
        let oc = self.oc;
        let instr = oc.instr(id);
        let target = self.target(instr)?;
        // Manual regions: the op already works on local data.
        if target.is_manual() && !is_spmd_boundary(instr) {
            self.note(instr, "manual");
            return self.manual(instr, target);
        }
        let v = crate::handlers::dispatch(self, instr, &target)?;
        // Every handler's result ends in the instruction's own sharding.
        self.reshard(&v, &target)
    }

    fn manual(&mut self, instr: &HloInstruction, target: VS) -> Result<PValue, SpmdError> {
        let mut ops = Vec::new();
        for k in 0..instr.operands.len() {
            let v = self.operand(instr, k)?;
            let t = match &v.vs {
                VS::Grid(g) if g.is_replicated() => v.vs.clone(),
                VS::Tuple(_) => target_like_manual(&v.vs),
                _ => VS::Manual,
            };
            let v = self.reshard(&v, &t)?;
            ops.push(v.id);
        }
        let called = self.partition_calls_manual(instr)?;
        let mut c = instr.clone();
        c.name = self.b.ctx.orig_name(&instr.name);
        c.operands = ops;
        c.sharding = None;
        c.control_predecessors.clear();
        for (key, cid) in called {
            c.set_attr(key, AttrValue::Computation(cid));
        }
        let id = self.b.push(c);
        Ok(PValue {
            id,
            shape: Rc::new(instr.shape.clone()),
            vs: target,
        })
    }

    /// Control flow inside manual regions: bodies are manual too.
    fn partition_calls_manual(
        &mut self,
        instr: &HloInstruction,
    ) -> Result<Vec<(AttrKey, CompId)>, SpmdError> {
        let keys: &[AttrKey] = match instr.opcode {
            Opcode::While => &[AttrKey::Body, AttrKey::Condition],
            Opcode::Call => &[AttrKey::ToApply],
            Opcode::Conditional => &[AttrKey::TrueComputation, AttrKey::FalseComputation],
            _ => &[],
        };
        let mut out = Vec::new();
        for &k in keys {
            if let Some(cid) = instr.computation_attr(k) {
                let c = self.orig.comp(cid);
                let params: Vec<VS> = c
                    .parameters
                    .iter()
                    .map(|&p| {
                        target_like_manual(&VS::replicated_in(
                            &c.instr(p).shape,
                            self.n(),
                            self.grids(),
                        ))
                    })
                    .collect();
                let (nc, _) = self.partition_sub(cid, &params, None)?;
                out.push((k, nc));
            }
        }
        Ok(out)
    }

    /// Partitions a called computation with these parameter shardings
    /// (root resharded to `root` when given); returns the id to call.
    pub fn partition_sub(
        &mut self,
        cid: CompId,
        params: &[VS],
        root: Option<&VS>,
    ) -> Result<(CompId, VS), SpmdError> {
        let name = self.orig.comp(cid).name.clone();
        let key = (cid, params.to_vec(), root.cloned());
        if let Some(hit) = self.b.ctx.partitioned.get(&key) {
            return Ok(hit.clone());
        }
        let first = !self.b.ctx.replaced.contains_key(&cid);
        let new_name = if first {
            name.clone()
        } else {
            self.b.ctx.fresh(&format!("{name}.spmd"))
        };
        let (comp, rvs) =
            partition_computation(self.orig, &mut *self.b.ctx, cid, params, root, &new_name)?;
        let id = if first {
            self.b.ctx.replaced.insert(cid, comp);
            cid
        } else {
            let id = CompId((self.b.ctx.first_new_comp + self.b.ctx.new_comps.len()) as u32);
            self.b.ctx.new_comps.push(comp);
            id
        };
        self.b.ctx.partitioned.insert(key, (id, rvs.clone()));
        Ok((id, rvs))
    }
}

/// Manual everywhere in a tuple tree (tokens stay opaque).
pub fn target_like_manual(v: &VS) -> VS {
    match v {
        VS::Tuple(e) => VS::Tuple(e.iter().map(target_like_manual).collect()),
        VS::Opaque => VS::Opaque,
        _ => VS::Manual,
    }
}

fn is_spmd_boundary(instr: &HloInstruction) -> bool {
    instr.opcode == Opcode::CustomCall
        && matches!(
            instr.ident_attr(AttrKey::CustomCallTarget),
            Some("SPMDFullToShardShape") | Some("SPMDShardToFullShape")
        )
}
