//! `Part`: the partitioning state of one computation and the operations
//! every handler uses on it: operand values, target shardings, resharding
//! (through a per-computation cache, so one value is resharded at most once
//! per target layout), reshard costs, and cloning the original instruction
//! on local operands with its local shape.
//!
//! Invariants: `vals[i]` is set once instruction `i` is partitioned (in
//! definition order); a cached reshard is keyed by the value's class (the
//! first local value of the same global array), its global dims and the
//! target grid; every value `emit_local` returns has the local shape of its
//! sharding.
//!
//! Speculative reshards: the driver reshards every handler's result to the
//! instruction's own sharding. Until an emitted instruction uses that
//! reshard, it is dead code (removed at the end), so a cost that reads it
//! counts its bytes, and a reshard from it that is cheaper from its source
//! starts from the source instead.

use crate::builder::Builder;
use crate::error::{invalid, unsupported, SpmdError};
use crate::grid::{local_dims, Grid, GridCache, Groups};
use crate::reshard;
use crate::shapes::elem;
use crate::value::{local_shape, sharding_of, PValue, ValueSharding};
use rustc_hash::FxHashMap;
use std::rc::Rc;
use xla_hlo_ir::{
    AttrKey, AttrValue, HloComputation, HloInstruction, HloModule, InstrId, Opcode, Shape,
};

/// The partitioning state of one computation: the original module and
/// computation, the builder of the new computation, the partitioned value
/// of every original instruction defined so far, and the reshard cache.
pub struct Part<'a, 'c> {
    pub orig: &'a HloModule,
    pub orig_comp: &'a HloComputation,
    pub b: Builder<'c>,
    pub vals: Vec<Option<PValue>>,
    /// Reshard cache: (value, global dims, grid) -> the value laid out by
    /// that grid. Values are keyed by their class (see `class_of`), so
    /// every layout of one array that has been built is reused, including
    /// the one a value was resharded from (as XLA's reshard cache does).
    /// The global dims are part of the key: one local buffer can hold
    /// different global arrays (a slice whose tiles are the operand's own
    /// returns the operand's local value for a smaller global shape).
    reshards: FxHashMap<(InstrId, Vec<i64>, Grid), InstrId>,
    /// Local value -> the first local value of the same global array (the
    /// results of reshards belong to their source's class).
    class_of: FxHashMap<InstrId, InstrId>,
    /// Whether the instruction being partitioned is in a partially manual
    /// region, where manual subgroups count as replication in grids: no
    /// reshard may then move data between devices by collective-permute
    /// (its pairs could join different manual groups).
    pub in_partial_manual: bool,
    /// Local values holding partial sums over device groups (unreduced
    /// shardings; see `unreduced`).
    pub partial: FxHashMap<InstrId, Groups>,
    /// The driver's reshards of handler results, by local value.
    speculative: FxHashMap<InstrId, Speculation>,
    /// Per original instruction: a small array computed from constants
    /// only, which the driver computes replicated (what XLA's constant
    /// folding gives), so every layout of it is free.
    pub constant_derived: Vec<bool>,
    /// Per original instruction: the dims along which its value is
    /// constant (a broadcast's new dims, through elementwise ops and
    /// transposes).
    pub broadcast_dims: Vec<Vec<usize>>,
    /// Local value class -> its original instruction's broadcast dims.
    class_broadcast_dims: FxHashMap<InstrId, Vec<usize>>,
}

/// A reshard the driver emitted to an instruction's sharding: its source
/// value and layout, and its bytes per device.
#[derive(Clone, Debug)]
struct Speculation {
    source: InstrId,
    source_grid: Grid,
    bytes: u64,
}

impl<'a, 'c> Part<'a, 'c> {
    /// The state for partitioning `orig_comp` (of `orig`) into `b`'s
    /// computation.
    pub fn new(orig: &'a HloModule, orig_comp: &'a HloComputation, b: Builder<'c>) -> Part<'a, 'c> {
        Part {
            orig,
            orig_comp,
            b,
            vals: vec![None; orig_comp.instructions.len()],
            reshards: FxHashMap::default(),
            class_of: FxHashMap::default(),
            in_partial_manual: false,
            partial: FxHashMap::default(),
            speculative: FxHashMap::default(),
            constant_derived: Vec::new(),
            broadcast_dims: Vec::new(),
            class_broadcast_dims: FxHashMap::default(),
        }
    }

    /// Reshards a handler's result to the instruction's own sharding,
    /// remembering the reshard as speculative (see the module header).
    pub fn reshard_result(&mut self, v: &PValue, t: &ValueSharding) -> Result<PValue, SpmdError> {
        let pending = match (&v.vs, t) {
            (ValueSharding::Grid(s), ValueSharding::Grid(g)) if s != g => {
                Some((s.clone(), self.cost(v, g)))
            }
            _ => None,
        };
        let r = self.reshard(v, t)?;
        if let Some((source_grid, bytes)) = pending {
            if bytes > 0 && r.id != v.id && !self.b.is_used(r.id) {
                self.speculative.insert(
                    r.id,
                    Speculation {
                        source: v.id,
                        source_grid,
                        bytes,
                    },
                );
            }
        }
        Ok(r)
    }

    /// Records that local value `x` holds an array constant along `dims`.
    pub fn set_broadcast_dims(&mut self, x: InstrId, dims: &[usize]) {
        if !dims.is_empty() {
            let class = self.class(x);
            self.class_broadcast_dims
                .entry(class)
                .or_insert_with(|| dims.to_vec());
        }
    }

    /// Whether local value `x`, laid out by `s`, already is its layout by
    /// `t`: the two agree device by device on every dim but the ones the
    /// array is constant along, where they have the same even tile count
    /// (any tile of such a dim holds the same data).
    fn relabels(&self, x: InstrId, s: &Grid, t: &Grid, dims: &[i64]) -> bool {
        let Some(constant) = self.class_broadcast_dims.get(&self.class(x)) else {
            return false;
        };
        if s.rank() != t.rank() || s.num_devices() != t.num_devices() || s.rank() != dims.len() {
            return false;
        }
        let rank = s.rank();
        (0..rank).all(|a| {
            s.tiles(a) == t.tiles(a) && (!constant.contains(&a) || dims[a] % s.tiles(a).max(1) == 0)
        }) && (0..s.num_devices()).all(|d| {
            (0..rank)
                .filter(|a| !constant.contains(a))
                .all(|a| s.coord(d, a) == t.coord(d, a))
        })
    }

    /// The speculative reshard `x` is, while nothing uses it.
    fn pending(&self, x: InstrId) -> Option<&Speculation> {
        self.speculative.get(&x).filter(|_| !self.b.is_used(x))
    }

    #[inline]
    pub fn n(&self) -> i64 {
        self.b.n()
    }

    /// The module's memo of derived grids.
    #[inline]
    pub fn grids(&self) -> &GridCache {
        &self.b.ctx.cache.grids
    }

    /// The partitioned value of an original instruction.
    #[inline]
    pub fn val(&self, id: InstrId) -> Result<PValue, SpmdError> {
        self.vals
            .get(id.index())
            .and_then(|v| v.clone())
            .ok_or_else(|| SpmdError::Invalid(format!("operand {id} used before definition")))
    }

    #[inline]
    pub fn operand(&self, instr: &HloInstruction, k: usize) -> Result<PValue, SpmdError> {
        let id = *instr
            .operands
            .get(k)
            .ok_or_else(|| SpmdError::Invalid(format!("missing operand {k}")))?;
        self.val(id)
    }

    /// The sharding the instruction should get.
    pub fn target(&self, instr: &HloInstruction) -> Result<ValueSharding, SpmdError> {
        sharding_of(instr, self.n(), &self.b.ctx.cache.shardings, self.grids())
    }

    pub fn target_grid(&self, instr: &HloInstruction) -> Result<Grid, SpmdError> {
        match self.target(instr)? {
            ValueSharding::Grid(g) => Ok(g),
            other => unsupported(format!("expected an array sharding, got {other:?}")),
        }
    }

    /// Reshards `v` to `t`.
    pub fn reshard(&mut self, v: &PValue, t: &ValueSharding) -> Result<PValue, SpmdError> {
        if &v.vs == t {
            return Ok(v.clone());
        }
        match (&v.vs, t) {
            (ValueSharding::Grid(s), ValueSharding::Grid(g)) => {
                let id = self.reshard_grid(v.id, s, g, &v.shape)?;
                Ok(PValue {
                    id,
                    shape: v.shape.clone(),
                    vs: t.clone(),
                })
            }
            (ValueSharding::Tuple(src), ValueSharding::Tuple(dst)) if src.len() == dst.len() => {
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
            (ValueSharding::Grid(s), ValueSharding::Manual) if s.is_replicated() => Ok(PValue {
                id: v.id,
                shape: v.shape.clone(),
                vs: ValueSharding::Manual,
            }),
            (_, ValueSharding::Opaque) | (ValueSharding::Opaque, _) => Ok(PValue {
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
        if let Some(&hit) = self.reshards.get(&(class, dims.clone(), t.clone())) {
            return Ok(hit);
        }
        if self.relabels(x, s, t, &dims) {
            self.reshards.insert((class, dims, t.clone()), x);
            return Ok(x);
        }
        let bytes = elem(shape)?.byte_width().max(1) as u64;
        let plan = self.b.ctx.cache.plan(s, t, shape.dims(), bytes);
        if let Some(spec) = self.pending(x).cloned() {
            let from_source = self
                .b
                .ctx
                .cache
                .plan(&spec.source_grid, t, shape.dims(), bytes);
            if from_source.cost < plan.cost + spec.bytes {
                return self.reshard_grid(spec.source, &spec.source_grid, t, shape);
            }
        }
        if self.in_partial_manual
            && plan.steps.iter().any(|step| {
                matches!(
                    step,
                    crate::plan::Step::Permute { .. } | crate::plan::Step::SlicePermute { .. }
                )
            })
        {
            return unsupported("a reshard by collective-permute inside a partially manual region");
        }
        let y = reshard::emit(&mut self.b, x, s, &plan, shape.dims())?;
        self.reshards.insert((class, dims.clone(), t.clone()), y);
        self.reshards.entry((class, dims, s.clone())).or_insert(x);
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
            ValueSharding::Grid(s) => {
                if self.splat_source(v.id).is_some() {
                    return 0;
                }
                if s == t {
                    return self.pending(v.id).map_or(0, |spec| spec.bytes);
                }
                let key = (self.class(v.id), v.shape.dims().to_vec(), t.clone());
                if let Some(&hit) = self.reshards.get(&key).filter(|_| s != t) {
                    return self.pending(hit).map_or(0, |spec| spec.bytes);
                }
                let pending = self.pending(v.id);
                if s == t || self.relabels(v.id, s, t, v.shape.dims()) {
                    return pending.map_or(0, |spec| spec.bytes);
                }
                let bytes = v
                    .shape
                    .element_type()
                    .map(|e| e.byte_width().max(1))
                    .unwrap_or(4) as u64;
                let direct = self.b.ctx.cache.plan(s, t, v.shape.dims(), bytes).cost;
                match pending {
                    Some(spec) => (direct + spec.bytes).min(
                        self.b
                            .ctx
                            .cache
                            .plan(&spec.source_grid, t, v.shape.dims(), bytes)
                            .cost,
                    ),
                    None => direct,
                }
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

    #[inline]
    pub fn reshard_to_grid(&mut self, v: &PValue, g: &Grid) -> Result<InstrId, SpmdError> {
        Ok(self.reshard(v, &ValueSharding::Grid(g.clone()))?.id)
    }

    /// Replicates every leaf.
    pub fn replicate(&mut self, v: &PValue) -> Result<PValue, SpmdError> {
        let t = ValueSharding::replicated_in(&v.shape, self.n(), self.grids());
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
        .map(|mut s| {
            if let (Shape::Array(a), Shape::Array(o)) = (&mut s, &instr.shape) {
                if a.dims.len() == o.dims.len() {
                    a.layout = o.layout.clone();
                }
            }
            s
        })
    }

    /// Clones `instr` on local operands with an inferred local shape and
    /// checks it against the expected local shape of `vs`.
    pub fn emit_local(
        &mut self,
        instr: &HloInstruction,
        ops: Vec<InstrId>,
        vs: &ValueSharding,
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
}
