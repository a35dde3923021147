//! Emitting the per-device program: a `Builder` appends instructions to
//! one new computation, with helpers for every op the partitioner emits
//! (collectives with explicit or iota replica groups, partition-id-indexed
//! offset tables, masks, pads and slices); names, channel ids and reducers
//! come from the module's `ModuleContext`.
//!
//! Invariants: every emitted instruction has its exact local shape (the
//! verifier re-checks them all); names are unique across the module;
//! collectives use `channel_id` + `use_global_device_ids=true` (all-reduce,
//! all-gather, reduce-scatter) or cross-partition ids (all-to-all,
//! collective-permute), so partition ids are device ids.

use crate::context::ModuleContext;
use crate::error::{invalid, SpmdError};
use crate::grid::Groups;
use crate::shapes::{arr, elem, scalar_literal, with_dims};
use rustc_hash::{FxHashMap, FxHashSet};
use xla_hlo_ir::attrs::{PaddingDim, SliceDim};
use xla_hlo_ir::literal::ArrayLiteral;
use xla_hlo_ir::{
    ArrayShape, AttrKey, AttrValue, CompId, HloComputation, HloInstruction, InstrId, Literal,
    Opcode, PrimitiveType, Shape,
};

/// Appends instructions to one computation.
pub struct Builder<'c> {
    pub ctx: &'c mut ModuleContext,
    pub comp: HloComputation,
    pid: Option<InstrId>,
    tables: FxHashMap<usize, (std::sync::Arc<[i64]>, InstrId)>,
    consts: FxHashMap<(PrimitiveType, i64), InstrId>,
    /// Instructions some emitted instruction takes as an operand.
    used: FxHashSet<InstrId>,
}

impl<'c> Builder<'c> {
    pub fn new(ctx: &'c mut ModuleContext, name: &str, capacity: usize) -> Builder<'c> {
        let mut comp = HloComputation::new(name);
        comp.instructions.reserve(capacity);
        Builder {
            ctx,
            comp,
            pid: None,
            tables: FxHashMap::default(),
            consts: FxHashMap::default(),
            used: FxHashSet::default(),
        }
    }

    #[inline]
    pub fn n(&self) -> i64 {
        self.ctx.n
    }
    #[inline]
    pub fn shape(&self, id: InstrId) -> &Shape {
        &self.comp.instr(id).shape
    }
    #[inline]
    pub fn dims(&self, id: InstrId) -> Vec<i64> {
        self.comp.instr(id).shape.dims().to_vec()
    }
    pub fn ty(&self, id: InstrId) -> Result<PrimitiveType, SpmdError> {
        elem(self.shape(id))
    }

    /// Appends a fully built instruction.
    #[inline]
    pub fn push(&mut self, instr: HloInstruction) -> InstrId {
        self.append(instr)
    }

    /// Appends `instr`, recording its operands as used.
    fn append(&mut self, instr: HloInstruction) -> InstrId {
        self.used.extend(instr.operands.iter().copied());
        self.comp.add(instr)
    }

    /// Whether an emitted instruction takes `id` as an operand.
    pub fn is_used(&self, id: InstrId) -> bool {
        self.used.contains(&id)
    }

    /// Appends a new instruction named after `base`.
    pub fn add(
        &mut self,
        base: &str,
        op: Opcode,
        shape: Shape,
        operands: Vec<InstrId>,
        attrs: Vec<(AttrKey, AttrValue)>,
    ) -> InstrId {
        let mut i = HloInstruction::new(self.ctx.fresh(base), op, shape, operands);
        for (k, v) in attrs {
            i.set_attr(k, v);
        }
        self.ctx.changes += 1;
        self.append(i)
    }

    pub fn constant(&mut self, lit: Literal, shape: Shape) -> InstrId {
        let mut i =
            HloInstruction::new(self.ctx.fresh("constant"), Opcode::Constant, shape, vec![]);
        i.literal = Some(Box::new(lit));
        self.ctx.changes += 1;
        self.append(i)
    }

    /// A scalar constant (cached per type and integral value).
    pub fn scalar(&mut self, ty: PrimitiveType, v: i64) -> InstrId {
        if let Some(&id) = self.consts.get(&(ty, v)) {
            return id;
        }
        let id = self.constant(scalar_literal(ty, v as f64), Shape::scalar(ty));
        self.consts.insert((ty, v), id);
        id
    }

    pub fn partition_id(&mut self) -> InstrId {
        if let Some(p) = self.pid {
            return p;
        }
        let p = self.add(
            "partition-id",
            Opcode::PartitionId,
            Shape::scalar(PrimitiveType::U32),
            vec![],
            vec![],
        );
        self.pid = Some(p);
        p
    }

    /// A scalar s32 whose value on partition `p` is `table[p]` (a constant
    /// when every entry is equal); cached per table (by identity).
    pub fn table(&mut self, table: &std::sync::Arc<[i64]>) -> InstrId {
        let k = std::sync::Arc::as_ptr(table) as *const i64 as usize;
        if let Some((_, id)) = self.tables.get(&k) {
            return *id;
        }
        let id = self.table_uncached(table);
        self.tables.insert(k, (table.clone(), id));
        id
    }

    fn table_uncached(&mut self, table: &[i64]) -> InstrId {
        if let Some(&first) = table.first() {
            if table.iter().all(|&v| v == first) {
                return self.scalar(PrimitiveType::S32, first);
            }
        }
        let n = table.len() as i64;
        let mut lit = ArrayLiteral::zeros(ArrayShape::new(PrimitiveType::S32, vec![0]));
        lit.shape = ArrayShape::new(PrimitiveType::S32, vec![n]);
        lit.data = table
            .iter()
            .flat_map(|&v| (v as i32).to_le_bytes())
            .collect();
        let c = self.constant(Literal::Array(lit), arr(PrimitiveType::S32, vec![n]));
        let p = self.partition_id();
        let ds = self.add(
            "dynamic-slice",
            Opcode::DynamicSlice,
            arr(PrimitiveType::S32, vec![1]),
            vec![c, p],
            vec![(AttrKey::DynamicSliceSizes, AttrValue::Ints(vec![1]))],
        );
        self.add(
            "reshape",
            Opcode::Reshape,
            Shape::scalar(PrimitiveType::S32),
            vec![ds],
            vec![],
        )
    }

    pub fn reshape(&mut self, x: InstrId, dims: &[i64]) -> InstrId {
        if self.dims(x) == dims {
            return x;
        }
        let shape = with_dims(self.shape(x), dims);
        let shape = if shape.rank() == self.shape(x).rank() {
            shape
        } else {
            arr(
                elem(self.shape(x)).unwrap_or(PrimitiveType::F32),
                dims.to_vec(),
            )
        };
        self.add("reshape", Opcode::Reshape, shape, vec![x], vec![])
    }

    pub fn transpose(&mut self, x: InstrId, perm: &[usize]) -> InstrId {
        if perm.iter().enumerate().all(|(i, &p)| i == p) {
            return x;
        }
        let d = self.dims(x);
        let nd: Vec<i64> = perm.iter().map(|&p| d[p]).collect();
        let ty = self.ty(x).unwrap_or(PrimitiveType::F32);
        self.add(
            "transpose",
            Opcode::Transpose,
            arr(ty, nd),
            vec![x],
            vec![(
                AttrKey::Dimensions,
                AttrValue::Ints(perm.iter().map(|&p| p as i64).collect()),
            )],
        )
    }

    pub fn broadcast(&mut self, x: InstrId, dims: &[i64], map: &[i64]) -> InstrId {
        let ty = self.ty(x).unwrap_or(PrimitiveType::F32);
        self.add(
            "broadcast",
            Opcode::Broadcast,
            arr(ty, dims.to_vec()),
            vec![x],
            vec![(AttrKey::Dimensions, AttrValue::Ints(map.to_vec()))],
        )
    }

    /// Static slice `[start, start+size)` (stride 1) on the given dims.
    pub fn slice(&mut self, x: InstrId, ranges: &[(i64, i64, i64)]) -> InstrId {
        let d = self.dims(x);
        if ranges
            .iter()
            .zip(&d)
            .all(|(&(s, l, st), &x)| s == 0 && l == x && st == 1)
        {
            return x;
        }
        let sd: Vec<SliceDim> = ranges
            .iter()
            .map(|&(start, limit, stride)| SliceDim {
                start,
                limit,
                stride,
            })
            .collect();
        let nd: Vec<i64> = ranges
            .iter()
            .map(|&(s, l, st)| (l - s + st - 1) / st)
            .collect();
        let shape = with_dims(self.shape(x), &nd);
        self.add(
            "slice",
            Opcode::Slice,
            shape,
            vec![x],
            vec![(AttrKey::Slice, AttrValue::Slice(sd))],
        )
    }

    /// Slices every dim to `[0, size)`.
    pub fn slice_to(&mut self, x: InstrId, sizes: &[i64]) -> InstrId {
        let r: Vec<(i64, i64, i64)> = sizes.iter().map(|&s| (0, s, 1)).collect();
        self.slice(x, &r)
    }

    /// Pads with `value` (a scalar instruction) low/high per dim.
    pub fn pad(&mut self, x: InstrId, value: InstrId, lo_hi: &[(i64, i64)]) -> InstrId {
        if lo_hi.iter().all(|&(l, h)| l == 0 && h == 0) {
            return x;
        }
        let d = self.dims(x);
        let nd: Vec<i64> = d.iter().zip(lo_hi).map(|(&x, &(l, h))| x + l + h).collect();
        let shape = with_dims(self.shape(x), &nd);
        let p: Vec<PaddingDim> = lo_hi
            .iter()
            .map(|&(low, high)| PaddingDim {
                low,
                high,
                interior: 0,
            })
            .collect();
        self.add(
            "pad",
            Opcode::Pad,
            shape,
            vec![x, value],
            vec![(AttrKey::Padding, AttrValue::Padding(p))],
        )
    }

    /// A zero scalar of `x`'s element type.
    pub fn zero_of(&mut self, x: InstrId) -> Result<InstrId, SpmdError> {
        let ty = self.ty(x)?;
        Ok(self.scalar(ty, 0))
    }

    pub fn pad_zero(&mut self, x: InstrId, lo_hi: &[(i64, i64)]) -> Result<InstrId, SpmdError> {
        if lo_hi.iter().all(|&(l, h)| l == 0 && h == 0) {
            return Ok(x);
        }
        let z = self.zero_of(x)?;
        Ok(self.pad(x, z, lo_hi))
    }

    pub fn dynamic_slice(&mut self, x: InstrId, starts: Vec<InstrId>, sizes: &[i64]) -> InstrId {
        let shape = with_dims(self.shape(x), sizes);
        let mut ops = vec![x];
        ops.extend(starts);
        self.add(
            "dynamic-slice",
            Opcode::DynamicSlice,
            shape,
            ops,
            vec![(AttrKey::DynamicSliceSizes, AttrValue::Ints(sizes.to_vec()))],
        )
    }

    pub fn concatenate(&mut self, parts: Vec<InstrId>, dim: usize) -> InstrId {
        if parts.len() == 1 {
            return parts[0];
        }
        let mut d = self.dims(parts[0]);
        d[dim] = parts
            .iter()
            .map(|&p| self.comp.instr(p).shape.dims()[dim])
            .sum();
        let shape = with_dims(self.shape(parts[0]), &d);
        self.add(
            "concatenate",
            Opcode::Concatenate,
            shape,
            parts,
            vec![(AttrKey::Dimensions, AttrValue::Ints(vec![dim as i64]))],
        )
    }

    pub fn binary(&mut self, op: Opcode, a: InstrId, b: InstrId) -> InstrId {
        let shape = self.shape(a).clone();
        self.add(op.name(), op, shape, vec![a, b], vec![])
    }

    pub fn compare(&mut self, a: InstrId, b: InstrId, dir: &str) -> InstrId {
        let d = self.dims(a);
        self.add(
            "compare",
            Opcode::Compare,
            arr(PrimitiveType::Pred, d),
            vec![a, b],
            vec![(AttrKey::Direction, AttrValue::Ident(dir.into()))],
        )
    }

    pub fn select(&mut self, p: InstrId, a: InstrId, b: InstrId) -> InstrId {
        let shape = self.shape(a).clone();
        self.add("select", Opcode::Select, shape, vec![p, a, b], vec![])
    }

    pub fn iota(&mut self, ty: PrimitiveType, dims: &[i64], dim: usize) -> InstrId {
        self.add(
            "iota",
            Opcode::Iota,
            arr(ty, dims.to_vec()),
            vec![],
            vec![(AttrKey::IotaDimension, AttrValue::Int(dim as i64))],
        )
    }

    /// A scalar broadcast to `dims`.
    pub fn splat(&mut self, s: InstrId, dims: &[i64]) -> InstrId {
        if dims.is_empty() {
            return s;
        }
        self.broadcast(s, dims, &[])
    }

    /// A pred array over `dims`: true where `lo <= iota(dim) + offset < hi`
    /// (`offset` an s32 scalar instruction).
    pub fn range_mask(
        &mut self,
        dims: &[i64],
        dim: usize,
        offset: InstrId,
        lo: Option<i64>,
        hi: Option<i64>,
    ) -> InstrId {
        let io = self.iota(PrimitiveType::S32, dims, dim);
        let ob = self.splat(offset, dims);
        let idx = self.binary(Opcode::Add, io, ob);
        let mut mask = None;
        if let Some(lo) = lo {
            let c = self.scalar(PrimitiveType::S32, lo);
            let cb = self.splat(c, dims);
            mask = Some(self.compare(idx, cb, "GE"));
        }
        if let Some(hi) = hi {
            let c = self.scalar(PrimitiveType::S32, hi);
            let cb = self.splat(c, dims);
            let m = self.compare(idx, cb, "LT");
            mask = Some(match mask {
                Some(prev) => self.binary(Opcode::And, prev, m),
                None => m,
            });
        }
        match mask {
            Some(m) => m,
            None => {
                let t = self.scalar(PrimitiveType::Pred, 1);
                self.splat(t, dims)
            }
        }
    }

    // ----- collectives -----

    pub fn all_gather(&mut self, x: InstrId, dim: usize, groups: &Groups) -> InstrId {
        let mut d = self.dims(x);
        let g = groups.size;
        d[dim] *= g;
        let shape = with_dims(self.shape(x), &d);
        let ch = self.ctx.channel();
        let rg = self.ctx.groups(groups);
        self.add(
            "all-gather",
            Opcode::AllGather,
            shape,
            vec![x],
            vec![
                (AttrKey::ChannelId, AttrValue::Int(ch)),
                (
                    AttrKey::ReplicaGroups,
                    AttrValue::ReplicaGroups(Box::new(rg)),
                ),
                (AttrKey::Dimensions, AttrValue::Ints(vec![dim as i64])),
                (AttrKey::UseGlobalDeviceIds, AttrValue::Bool(true)),
            ],
        )
    }

    /// All-reduce with the computation `to_apply`.
    pub fn all_reduce_with(&mut self, x: InstrId, groups: &Groups, to_apply: CompId) -> InstrId {
        let shape = self.shape(x).clone();
        let ch = self.ctx.channel();
        let rg = self.ctx.groups(groups);
        self.add(
            "all-reduce",
            Opcode::AllReduce,
            shape,
            vec![x],
            vec![
                (AttrKey::ChannelId, AttrValue::Int(ch)),
                (
                    AttrKey::ReplicaGroups,
                    AttrValue::ReplicaGroups(Box::new(rg)),
                ),
                (AttrKey::UseGlobalDeviceIds, AttrValue::Bool(true)),
                (AttrKey::ToApply, AttrValue::Computation(to_apply)),
            ],
        )
    }

    /// All-reduce with a scalar binary op (`add`, `maximum`, `or`, ...).
    pub fn all_reduce(
        &mut self,
        x: InstrId,
        groups: &Groups,
        op: Opcode,
    ) -> Result<InstrId, SpmdError> {
        let ty = self.ty(x)?;
        let op = if ty == PrimitiveType::Pred && op == Opcode::Add {
            Opcode::Or
        } else {
            op
        };
        let c = self.ctx.reducer(op, ty);
        Ok(self.all_reduce_with(x, groups, c))
    }

    pub fn reduce_scatter(
        &mut self,
        x: InstrId,
        dim: usize,
        groups: &Groups,
        op: Opcode,
    ) -> Result<InstrId, SpmdError> {
        let ty = self.ty(x)?;
        let op = if ty == PrimitiveType::Pred && op == Opcode::Add {
            Opcode::Or
        } else {
            op
        };
        let c = self.ctx.reducer(op, ty);
        self.reduce_scatter_with(x, dim, groups, c)
    }

    /// Reduce-scatter with the computation `c`.
    pub fn reduce_scatter_with(
        &mut self,
        x: InstrId,
        dim: usize,
        groups: &Groups,
        c: CompId,
    ) -> Result<InstrId, SpmdError> {
        let mut d = self.dims(x);
        let g = groups.size;
        if d[dim] % g != 0 {
            return invalid("reduce-scatter of an indivisible dim");
        }
        d[dim] /= g;
        let shape = with_dims(self.shape(x), &d);
        let ch = self.ctx.channel();
        let rg = self.ctx.groups(groups);
        Ok(self.add(
            "reduce-scatter",
            Opcode::ReduceScatter,
            shape,
            vec![x],
            vec![
                (AttrKey::ChannelId, AttrValue::Int(ch)),
                (
                    AttrKey::ReplicaGroups,
                    AttrValue::ReplicaGroups(Box::new(rg)),
                ),
                (AttrKey::UseGlobalDeviceIds, AttrValue::Bool(true)),
                (AttrKey::Dimensions, AttrValue::Ints(vec![dim as i64])),
                (AttrKey::ToApply, AttrValue::Computation(c)),
            ],
        ))
    }

    pub fn all_to_all(&mut self, x: InstrId, dim: usize, groups: &Groups) -> InstrId {
        let shape = self.shape(x).clone();
        let ch = self.ctx.channel();
        let rg = self.ctx.groups(groups);
        self.add(
            "all-to-all",
            Opcode::AllToAll,
            shape,
            vec![x],
            vec![
                (AttrKey::ChannelId, AttrValue::Int(ch)),
                (
                    AttrKey::ReplicaGroups,
                    AttrValue::ReplicaGroups(Box::new(rg)),
                ),
                (AttrKey::Dimensions, AttrValue::Ints(vec![dim as i64])),
            ],
        )
    }

    pub fn collective_permute(&mut self, x: InstrId, pairs: &[(i64, i64)]) -> InstrId {
        let shape = self.shape(x).clone();
        let ch = self.ctx.channel();
        self.add(
            "collective-permute",
            Opcode::CollectivePermute,
            shape,
            vec![x],
            vec![
                (AttrKey::ChannelId, AttrValue::Int(ch)),
                (
                    AttrKey::SourceTargetPairs,
                    AttrValue::IntLists(pairs.iter().map(|&(a, b)| vec![a, b]).collect()),
                ),
            ],
        )
    }
}
