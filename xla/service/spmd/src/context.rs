//! The per-module partitioning context (`ModuleContext`): state shared by every
//! computation being partitioned (unique names, channel ids, reducer
//! computations created on demand, partitioned callees, handler counts) and
//! the module's memo tables (`PartitionCache`).
//!
//! Invariants: names are unique across the module (original names are kept
//! for the clone of the original instruction); channel ids are above every
//! id the module already uses; the cache lives as long as the module's
//! partitioning and changes no result (every table memoizes a pure
//! function, keyed by value).

use crate::grid::{Grid, GridCache, Groups};
use crate::plan::{Plan, PlanCache};
use crate::value::{ShardingCache, ValueSharding};
use rustc_hash::{FxHashMap, FxHashSet};
use xla_hlo_ir::{
    AttrKey, AttrValue, CollectiveDeviceList, CompId, HloComputation, HloInstruction, HloModule,
    Opcode, PrimitiveType, Shape,
};
use xla_hlo_utils::inline::{name_hash, set_suffixed_name};

/// The memo tables of one module's partitioning: derived grids, reshard
/// plans, converted shardings. Every table memoizes a pure function, keyed
/// by value, so the cache changes no result; it lives as long as the
/// module's `ModuleContext`.
#[derive(Default)]
pub struct PartitionCache {
    pub grids: GridCache,
    pub plans: PlanCache,
    pub shardings: ShardingCache,
}

impl PartitionCache {
    /// The cheapest reshard plan from `src` to `tgt` for an array of `dims`
    /// with `bytes` bytes per element (memoized).
    pub fn plan(&self, src: &Grid, tgt: &Grid, dims: &[i64], bytes: u64) -> Plan {
        self.plans.plan(&self.grids, src, tgt, dims, bytes)
    }
}

/// Module-wide state shared by every computation being partitioned.
pub struct ModuleContext {
    /// Number of partitions (devices).
    pub n: i64,
    /// Hashes (`name_hash`) of the names emitted instructions took, and of
    /// the original module's names: a hash collision can only skip a free
    /// name, never give one twice.
    used_names: FxHashSet<u64>,
    reserved: FxHashSet<u64>,
    /// Next suffix to try per name stem.
    next_suffix: FxHashMap<String, u64>,
    next_channel: i64,
    /// Computations created by the partitioner (reducers), appended to the
    /// module at the end; ids start at `first_new_comp`.
    pub new_comps: Vec<HloComputation>,
    pub first_new_comp: usize,
    reducers: FxHashMap<(Opcode, PrimitiveType), CompId>,
    /// Original computations replaced by their partitioned form.
    pub replaced: FxHashMap<CompId, HloComputation>,
    /// Partitioned called computations by (original, parameter shardings,
    /// root sharding).
    #[allow(clippy::type_complexity)]
    pub partitioned:
        FxHashMap<(CompId, Vec<ValueSharding>, Option<ValueSharding>), (CompId, ValueSharding)>,
    /// Instructions added or removed beyond clones of the original ones
    /// (the pass reports a change when nonzero).
    pub changes: usize,
    /// Handler uses by `opcode:handler`.
    pub handler_counts: FxHashMap<(Opcode, &'static str), usize>,
    /// Memo tables of the module's partitioning.
    pub cache: PartitionCache,
    /// Consistent mode (`SpmdOptions::consistent`).
    pub consistent: bool,
}

impl ModuleContext {
    pub fn new(module: &HloModule, n: i64) -> ModuleContext {
        let mut reserved = FxHashSet::default();
        let mut next_channel = 1;
        for c in &module.computations {
            reserved.insert(name_hash(&c.name));
            for i in &c.instructions {
                reserved.insert(name_hash(&i.name));
                if let Some(ch) = i.channel_id() {
                    next_channel = next_channel.max(ch + 1);
                }
            }
        }
        ModuleContext {
            n,
            used_names: FxHashSet::default(),
            reserved,
            next_suffix: FxHashMap::default(),
            next_channel,
            new_comps: Vec::new(),
            first_new_comp: module.computations.len(),
            reducers: FxHashMap::default(),
            replaced: FxHashMap::default(),
            partitioned: FxHashMap::default(),
            handler_counts: Default::default(),
            changes: 0,
            cache: PartitionCache::default(),
            consistent: false,
        }
    }

    /// `name` itself when no emitted instruction took it yet (original
    /// names are kept for the clone of the original instruction).
    pub fn orig_name(&mut self, name: &str) -> String {
        if self.used_names.insert(name_hash(name)) {
            name.to_string()
        } else {
            self.fresh(name)
        }
    }

    /// A new name `base.N` not used anywhere in the module.
    pub fn fresh(&mut self, base: &str) -> String {
        let stem = match base.rsplit_once('.') {
            Some((s, tail)) if !s.is_empty() && tail.chars().all(|c| c.is_ascii_digit()) => s,
            _ => base,
        };
        if !self.reserved.contains(&name_hash(stem)) && self.used_names.insert(name_hash(stem)) {
            return stem.to_string();
        }
        let mut k = self.next_suffix.get(stem).copied().unwrap_or(1);
        let mut cand = String::with_capacity(stem.len() + 6);
        loop {
            set_suffixed_name(&mut cand, stem, k);
            k += 1;
            let hash = name_hash(&cand);
            if !self.reserved.contains(&hash) && self.used_names.insert(hash) {
                match self.next_suffix.get_mut(stem) {
                    Some(next) => *next = k,
                    None => {
                        self.next_suffix.insert(stem.to_string(), k);
                    }
                }
                return cand;
            }
        }
    }

    pub fn channel(&mut self) -> i64 {
        let c = self.next_channel;
        self.next_channel += 1;
        c
    }

    /// A scalar `(x, y) -> op(x, y)` computation of element type `ty`.
    pub fn reducer(&mut self, op: Opcode, ty: PrimitiveType) -> CompId {
        if let Some(&c) = self.reducers.get(&(op, ty)) {
            return c;
        }
        let name = self.fresh(&format!("{}.{}.spmd", op.name(), ty.name()));
        let mut comp = HloComputation::new(name);
        let s = Shape::scalar(ty);
        let mut x = HloInstruction::new(self.fresh("x"), Opcode::Parameter, s.clone(), vec![]);
        x.parameter_number = Some(0);
        let mut y = HloInstruction::new(self.fresh("y"), Opcode::Parameter, s.clone(), vec![]);
        y.parameter_number = Some(1);
        let xi = comp.add(x);
        let yi = comp.add(y);
        let r = comp.add(HloInstruction::new(
            self.fresh(op.name()),
            op,
            s,
            vec![xi, yi],
        ));
        comp.root = r;
        let id = CompId((self.first_new_comp + self.new_comps.len()) as u32);
        self.new_comps.push(comp);
        self.reducers.insert((op, ty), id);
        id
    }

    /// A sort comparator ordering by values of `value_ty` alone with
    /// compare `direction`: parameters `(v_lhs, v_rhs)`, then `(i_lhs,
    /// i_rhs)` of `index_ty` when given (a sort of values and indices).
    pub fn value_comparator(
        &mut self,
        value_ty: PrimitiveType,
        index_ty: Option<PrimitiveType>,
        direction: &str,
    ) -> CompId {
        let name = self.fresh(&format!("compare-{}.spmd", value_ty.name()));
        let mut comp = HloComputation::new(name);
        let mut params = Vec::new();
        let mut types = vec![value_ty, value_ty];
        types.extend(index_ty.into_iter().flat_map(|t| [t, t]));
        for (k, ty) in types.into_iter().enumerate() {
            let mut p = HloInstruction::new(
                self.fresh(&format!("p{k}")),
                Opcode::Parameter,
                Shape::scalar(ty),
                vec![],
            );
            p.parameter_number = Some(k as i64);
            params.push(comp.add(p));
        }
        let mut cmp = HloInstruction::new(
            self.fresh("compare"),
            Opcode::Compare,
            Shape::scalar(PrimitiveType::Pred),
            vec![params[0], params[1]],
        );
        cmp.set_attr(AttrKey::Direction, AttrValue::Ident(direction.into()));
        comp.root = comp.add(cmp);
        let id = CompId((self.first_new_comp + self.new_comps.len()) as u32);
        self.new_comps.push(comp);
        id
    }

    /// Replica groups in the shortest form (iota whenever possible).
    pub fn groups(&mut self, groups: &Groups) -> CollectiveDeviceList {
        groups.list.clone()
    }
}
