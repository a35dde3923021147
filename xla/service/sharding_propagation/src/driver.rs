//! The propagation driver: reads the module's shardings, prepares them as
//! XLA's `ShardingPropagation::Run` does (Sharding custom-calls to copies,
//! unspecified dims, shard groups, while/conditional/call boundaries, the
//! set of user-provided shardings, unknown -> replicated), runs the
//! fix-point sweeps per aggressiveness level, then writes the changed
//! shardings back (untouched ones keep their original text).
//!
//! Invariants: user-provided shardings never change (only their
//! unspecified dims are refined); the IR is edited only after propagation
//! finished; the result does not depend on hash iteration order.

use crate::graph::{Graph, Node};
use crate::infer::forward_rule_reads_beyond_operands;
use crate::level::{may_combine_partial, BROADCAST_FORWARD_LEVEL, PASS_THROUGH_LEVEL};
use crate::options::ShardingPropagationOptions;
use crate::state::{normalize, PropagationState};
use rustc_hash::FxHashMap;
use xla_hlo_ir::sharding::{ShardGroup, SingleSharding};
use xla_hlo_ir::{
    AttrKey, AttrValue, HloInstruction, HloModule, HloSharding, InstrId, Opcode, Shape,
};
use xla_hlo_utils::merge::{find_common_sharding, merge_sharding_if_compatible};
use xla_hlo_utils::ops::partially_replicate_all_except;
use xla_hlo_utils::{InstrSharding, Sharding};

/// What a run did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PropagationStats {
    pub changed: bool,
    /// Sweeps over a computation (forward + backward), all levels.
    pub iterations: usize,
    /// Instructions whose sharding was inferred or changed.
    pub inferred: usize,
    /// Calls of the forward and backward rules (all levels).
    pub rule_calls: usize,
    /// `Sharding` custom-calls turned into copies.
    pub copies: usize,
    /// Instructions still without a sharding.
    pub unsharded: usize,
}

fn reject(instr: &HloInstruction, e: impl std::fmt::Display) -> String {
    format!("instruction %{}: {e}", instr.name)
}

/// Parses `unspecified_dims=[1,2]` from a Sharding custom-call's backend config.
fn unspecified_dims(instr: &HloInstruction) -> Vec<usize> {
    let text = match instr.attr(AttrKey::BackendConfig) {
        Some(AttrValue::Raw(t)) | Some(AttrValue::Str(t)) => t.as_str(),
        _ => return vec![],
    };
    let Some(pos) = text.find("unspecified_dims=[") else {
        return vec![];
    };
    let rest = &text[pos + "unspecified_dims=[".len()..];
    let end = rest.find(']').unwrap_or(rest.len());
    let mut v: Vec<usize> = rest[..end]
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    v.sort_unstable();
    v
}

/// XLA's name uniquer for the prefix `copy`.
struct CopyNames {
    used: std::collections::BTreeSet<i64>,
    next: i64,
}

impl CopyNames {
    fn new(module: &HloModule) -> CopyNames {
        let mut used = std::collections::BTreeSet::new();
        for c in &module.computations {
            for i in &c.instructions {
                if i.name == "copy" {
                    used.insert(0);
                } else if let Some(n) = i
                    .name
                    .strip_prefix("copy.")
                    .and_then(|s| s.parse::<i64>().ok())
                {
                    used.insert(n);
                }
            }
        }
        CopyNames { used, next: 0 }
    }
    fn next(&mut self) -> String {
        let id = if self.used.insert(0) {
            0
        } else {
            while !self.used.insert(self.next) {
                self.next += 1;
            }
            let id = self.next;
            self.next += 1;
            id
        };
        if id == 0 {
            "copy".into()
        } else {
            format!("copy.{id}")
        }
    }
}

fn flags(v: &Option<Vec<bool>>) -> (bool, Vec<bool>) {
    match v {
        Some(v) => (v.iter().any(|&b| b), v.clone()),
        None => (false, vec![]),
    }
}

/// Inserts a copy above a `while` entry root so that the while itself can
/// still be resharded (XLA does this when the output sharding is fixed);
/// the copy is named later, in XLA's naming order.
fn copy_while_root(module: &mut HloModule) -> Option<InstrId> {
    let e = module.entry;
    let comp = module.comp(e);
    let root = comp.root;
    let r = comp.instr(root);
    if r.opcode != Opcode::While
        || r.sharding.as_ref().is_some_and(|s| {
            s.leaves()
                .iter()
                .all(|l| l.kind == xla_hlo_ir::ShardingKind::Unknown)
        })
    {
        return None;
    }
    let mut copy = HloInstruction::new("copy", Opcode::Copy, r.shape.clone(), vec![root]);
    copy.sharding = r.sharding.clone();
    let comp = module.comp_mut(e);
    let id = comp.add(copy);
    comp.root = id;
    Some(id)
}

/// The ids the graph relies on are in range (the verifier checks this and
/// more; the pass may run without it).
fn check_structure(module: &HloModule) -> Result<(), String> {
    let ncomp = module.computations.len();
    if module.entry.index() >= ncomp {
        return Err("the entry computation id is out of range".into());
    }
    for c in &module.computations {
        let n = c.instructions.len();
        if c.root.index() >= n {
            return Err(format!("computation {}: root out of range", c.name));
        }
        if c.parameters.iter().any(|p| p.index() >= n) {
            return Err(format!("computation {}: parameter id out of range", c.name));
        }
        for i in &c.instructions {
            if i.operands
                .iter()
                .chain(&i.control_predecessors)
                .any(|o| o.index() >= n)
                || i.called_computations().iter().any(|cc| cc.index() >= ncomp)
            {
                return Err(format!(
                    "instruction %{}: operand or callee id out of range",
                    i.name
                ));
            }
        }
    }
    Ok(())
}

/// Runs the whole pass.
pub(crate) fn propagate(
    module: &mut HloModule,
    opts: &ShardingPropagationOptions,
) -> Result<PropagationStats, String> {
    check_structure(module)?;
    let mut stats = PropagationStats::default();
    let (allow_output, output_vec) =
        flags(&opts.allow_propagation_to_output.clone().or_else(|| {
            module
                .config
                .allow_spmd_sharding_propagation_to_output
                .clone()
        }));
    let (allow_params, params_vec) =
        flags(&opts.allow_propagation_to_parameters.clone().or_else(|| {
            module
                .config
                .allow_spmd_sharding_propagation_to_parameters
                .clone()
        }));
    let mut names = CopyNames::new(module);
    let root_copy = if allow_output {
        None
    } else {
        copy_while_root(module)
    };

    // ---- read the shardings ----
    let graph = Graph::new(module);
    let n = graph.num_nodes();
    let mut original: Vec<Option<InstrSharding>> = Vec::with_capacity(n);
    for x in 0..n as Node {
        let instr = graph.instr(x);
        original.push(match &instr.sharding {
            Some(s) => {
                let s = InstrSharding::from_ir(s, &instr.shape).map_err(|e| reject(instr, e))?;
                let leaves = instr.shape.leaves();
                for (k, leaf) in s.leaves().iter().enumerate() {
                    let rank = leaves.get(k).map(|l| l.rank()).unwrap_or(0);
                    xla_hlo_utils::sharding::check_rank(leaf, rank)
                        .map_err(|e| reject(instr, e))?;
                    if let Some(t) = leaf.tiles() {
                        if let Some(&d) = t.devices().iter().find(|&&d| d < 0) {
                            return Err(reject(instr, format!("negative device id {d}")));
                        }
                    }
                }
                Some(s)
            }
            None => None,
        });
    }
    let mut p = PropagationState {
        graph,
        shardings: original.clone(),
        write_count: 0,
        last_written: vec![0; n],
        allow_output,
        allow_params,
    };

    // ---- ProcessShardingInstruction ----
    let mut copies: Vec<(Node, String)> = Vec::new();
    let mut unspecified: FxHashMap<Node, Vec<usize>> = FxHashMap::default();
    let mut group_of: FxHashMap<Node, (bool, i64)> = FxHashMap::default();
    let mut groups: Vec<((bool, i64), Vec<Node>)> = Vec::new();
    for c in 0..p.graph.post_orders.len() {
        let order = p.graph.post_orders[c].clone();
        for &x in order.iter().rev() {
            let instr = p.graph.instr(x);
            let group = instr
                .sharding
                .as_ref()
                .and_then(|s| s.leaves().first().and_then(|l| l.shard_group));
            if p.graph.is_custom_call(x, "Sharding") {
                let Some(s) = p.shardings[x as usize].clone() else {
                    return Err(reject(instr, "a Sharding custom-call needs a sharding"));
                };
                let op0 = p
                    .graph
                    .operand(x, 0)
                    .ok_or_else(|| reject(instr, "a Sharding custom-call needs an operand"))?;
                // XLA keeps `{unknown}` constraints as custom-calls (they only mark
                // shard groups); they are replaced too so that a second run
                // sees the same instructions (idempotence).
                let replaced = opts.replace_sharding_custom_calls;
                if replaced {
                    copies.push((x, names.next()));
                }
                let spec = unspecified_dims(instr);
                if !spec.is_empty() {
                    unspecified.insert(x, spec);
                } else if p.shardings[op0 as usize].is_none() {
                    let s = normalize(p.graph.shape(op0), s);
                    p.shardings[op0 as usize] = Some(s);
                }
            }
            if let Some(gr) = group {
                let key = match gr {
                    ShardGroup::As(id) => (true, id),
                    ShardGroup::Like(id) => (false, id),
                };
                group_of.insert(x, key);
                match groups.iter_mut().find(|g| g.0 == key) {
                    Some(g) => g.1.push(x),
                    None => groups.push((key, vec![x])),
                }
            }
        }
    }
    stats.copies = copies.len();
    // The root copy is named after the Sharding custom-calls (XLA order).
    let root_copy = root_copy.map(|id| (id, names.next()));

    // ---- while / conditional / call boundaries ----
    for x in 0..n as Node {
        if matches!(
            p.graph.opcode(x),
            Opcode::While | Opcode::Conditional | Opcode::Call
        ) {
            let related = related(&p, x);
            if let Some(first) = related
                .iter()
                .find_map(|&r| p.shardings[r as usize].clone())
            {
                for &r in &related {
                    let s = normalize(p.graph.shape(r), first.clone());
                    p.shardings[r as usize] = Some(s);
                }
            }
        }
    }

    // ---- provided shardings ----
    let entry_root = p.graph.entry_root();
    let mut provided = vec![false; n];
    for x in 0..n as Node {
        if let Some(s) = &p.shardings[x as usize] {
            if x != entry_root && p.graph.opcode(x) != Opcode::Parameter && !s.is_unknown() {
                provided[x as usize] = true;
            }
        }
    }
    if !allow_output
        && p.shardings[entry_root as usize]
            .as_ref()
            .is_none_or(|s| !s.is_unknown())
    {
        provided[entry_root as usize] = true;
    }
    if !allow_params {
        let e = p.graph.module.entry;
        for k in 0..p.graph.module.comp(e).parameters.len() {
            if let Some(x) = p.graph.parameter(e, k) {
                if p.shardings[x as usize]
                    .as_ref()
                    .is_some_and(|s| !s.is_unknown())
                {
                    provided[x as usize] = true;
                }
            }
        }
    }
    let saved_root = p.shardings[entry_root as usize].clone();
    let saved_params: Vec<Option<InstrSharding>> = {
        let e = p.graph.module.entry;
        (0..p.graph.module.comp(e).parameters.len())
            .map(|k| {
                p.graph
                    .parameter(e, k)
                    .and_then(|x| p.shardings[x as usize].clone())
            })
            .collect()
    };

    // ---- unknown -> replicated ----
    for x in 0..n {
        if let Some(s) = &p.shardings[x] {
            if s.leaves().iter().any(Sharding::is_unknown) {
                let leaves: Vec<Sharding> = s
                    .leaves()
                    .iter()
                    .map(|l| {
                        if l.is_unknown() {
                            Sharding::Replicated
                        } else {
                            l.clone()
                        }
                    })
                    .collect();
                p.shardings[x] = Some(match s {
                    InstrSharding::Single(_) => InstrSharding::Single(leaves[0].clone()),
                    InstrSharding::Tuple(_) => InstrSharding::tuple(leaves),
                });
            }
        }
    }

    // ---- fix points ----
    let mut fx = FixPoint {
        provided: &provided,
        unspecified: &unspecified,
        group_of: &group_of,
        groups: &groups,
        iterations: 0,
        rule_calls: 0,
        fwd_memo: vec![(0, 0); n],
        bwd_memo: vec![(0, 0); n],
    };
    for level in PASS_THROUGH_LEVEL..=BROADCAST_FORWARD_LEVEL {
        fx.run(&mut p, level, true);
    }
    // Align shard_as groups.
    for (key, members) in &groups {
        if !key.0 {
            continue;
        }
        let mut shardings = Vec::new();
        let mut default: Option<Sharding> = None;
        for &m in members {
            if let Some(InstrSharding::Single(s)) = &p.shardings[m as usize] {
                shardings.push(s.clone());
                if default.as_ref().is_none_or(|d| d.is_replicated()) {
                    default = Some(s.clone());
                }
            }
        }
        let common = find_common_sharding(&shardings, default.as_ref()).or(default);
        if let Some(common) = common {
            for &m in members {
                if provided[m as usize] {
                    if let (Some(spec), Some(InstrSharding::Single(cur))) =
                        (unspecified.get(&m), p.shardings[m as usize].clone())
                    {
                        let partial = partially_replicate_all_except(&common, spec);
                        let mut s = cur;
                        let min = s.num_tiles() + 1;
                        merge_sharding_if_compatible(&partial, min, &mut s);
                    }
                }
                let new = normalize(p.graph.shape(m), InstrSharding::Single(common.clone()));
                if p.shardings[m as usize].as_ref() != Some(&new) {
                    p.store_normalized(m, new);
                }
            }
        }
    }
    fx.run(&mut p, BROADCAST_FORWARD_LEVEL, true);
    stats.iterations = fx.iterations;
    stats.rule_calls = fx.rule_calls;

    // ---- output / parameter permissions ----
    if allow_output {
        if let (Some(InstrSharding::Tuple(saved)), Some(InstrSharding::Tuple(cur))) =
            (&saved_root, p.shardings[entry_root as usize].clone())
        {
            if saved.len() == output_vec.len() {
                let mut cur = cur.to_vec();
                for (i, s) in saved.iter().enumerate() {
                    if !output_vec[i] && !s.is_unknown() {
                        cur[i] = s.clone();
                    }
                }
                p.shardings[entry_root as usize] = Some(InstrSharding::tuple(cur));
            }
        }
        let shape = p.graph.shape(entry_root).clone();
        if let Some(s) = p.shardings[entry_root as usize].clone() {
            p.shardings[entry_root as usize] = Some(replicate_uneven(&shape, s, |i| {
                output_vec.get(i).copied().unwrap_or(true)
            }));
        }
    }
    if allow_params {
        let e = p.graph.module.entry;
        let count = p.graph.module.comp(e).parameters.len();
        if params_vec.len() == count {
            for (k, saved) in saved_params.iter().enumerate() {
                let Some(x) = p.graph.parameter(e, k) else {
                    continue;
                };
                if !params_vec[k] {
                    p.shardings[x as usize] = saved.clone().filter(|s| !s.is_unknown());
                } else if let Some(s) = p.shardings[x as usize].clone() {
                    let shape = p.graph.shape(x).clone();
                    p.shardings[x as usize] = Some(replicate_uneven(&shape, s, |_| true));
                }
            }
        }
    }

    // ---- write back ----
    let mut updates: Vec<(Node, Option<HloSharding>)> = Vec::new();
    let mut ir_cache: FxHashMap<*const xla_hlo_utils::Tiled, SingleSharding> = FxHashMap::default();
    for (x, (now, before)) in p.shardings.iter().zip(&original).enumerate() {
        if now != before {
            updates.push((
                x as Node,
                now.as_ref().map(|s| to_ir_cached(s, &mut ir_cache)),
            ));
        }
    }
    let locate: Vec<(xla_hlo_ir::CompId, InstrId)> = (0..n as Node)
        .map(|x| (p.graph.comp_of(x), p.graph.local(x)))
        .collect();
    stats.unsharded = p.shardings.iter().filter(|s| s.is_none()).count();
    drop(p);
    stats.inferred = updates.len();
    for (x, s) in updates {
        let (c, i) = locate[x as usize];
        let instr = module.comp_mut(c).instr_mut(i);
        instr.sharding = s;
        // Shard groups are consumed by propagation.
        if let Some(HloSharding::Single(SingleSharding { shard_group, .. })) = &mut instr.sharding {
            *shard_group = None;
        }
    }
    for &(x, ref name) in &copies {
        let (c, i) = locate[x as usize];
        let instr = module.comp_mut(c).instr_mut(i);
        instr.opcode = Opcode::Copy;
        instr.name = name.clone();
        instr.attrs.clear();
        instr.operands.truncate(1);
    }
    if let Some((id, name)) = &root_copy {
        let e = module.entry;
        module.comp_mut(e).instr_mut(*id).name = name.clone();
    }
    stats.changed = stats.inferred > 0 || !copies.is_empty() || root_copy.is_some();
    Ok(stats)
}

/// IR form of a sharding; tiled leaves shared between instructions (the
/// same `Arc`) are converted once.
fn to_ir_cached(
    s: &InstrSharding,
    cache: &mut FxHashMap<*const xla_hlo_utils::Tiled, SingleSharding>,
) -> HloSharding {
    let mut leaf = |l: &Sharding| -> SingleSharding {
        match l {
            Sharding::Tiled(t) => cache
                .entry(std::sync::Arc::as_ptr(t))
                .or_insert_with(|| l.to_ir())
                .clone(),
            _ => l.to_ir(),
        }
    };
    match s {
        InstrSharding::Single(l) => HloSharding::Single(leaf(l)),
        InstrSharding::Tuple(v) => HloSharding::Tuple(v.iter().map(leaf).collect()),
    }
}

/// Replicates leaves whose tiling does not divide the shape evenly.
fn replicate_uneven(
    shape: &Shape,
    s: InstrSharding,
    allowed: impl Fn(usize) -> bool,
) -> InstrSharding {
    let leaves = shape.leaves();
    let fix = |l: &Sharding, sh: &Shape| -> Sharding {
        match l {
            Sharding::Tiled(t)
                if sh
                    .dims()
                    .iter()
                    .enumerate()
                    .any(|(i, &d)| d % t.tiles().dim(i) != 0) =>
            {
                Sharding::Replicated
            }
            _ => l.clone(),
        }
    };
    match s {
        InstrSharding::Single(l) => InstrSharding::Single(fix(&l, shape)),
        InstrSharding::Tuple(v) => InstrSharding::tuple(
            v.iter()
                .enumerate()
                .map(|(i, l)| {
                    if allowed(i) {
                        leaves
                            .get(i)
                            .map(|sh| fix(l, sh))
                            .unwrap_or_else(|| l.clone())
                    } else {
                        l.clone()
                    }
                })
                .collect(),
        ),
    }
}

/// Instructions that share a sharding across a computation boundary
/// (`GetRelatedInstructions`).
fn related(p: &PropagationState, x: Node) -> Vec<Node> {
    let g = &p.graph;
    let i = g.instr(x);
    match i.opcode {
        Opcode::While => {
            let mut v = vec![x];
            if let Some(body) = i.computation_attr(AttrKey::Body) {
                v.push(g.root_of(body));
                v.extend(g.parameter(body, 0));
            }
            if let Some(cond) = i.computation_attr(AttrKey::Condition) {
                v.extend(g.parameter(cond, 0));
            }
            v
        }
        Opcode::Conditional => {
            let mut v = vec![x];
            v.extend(i.called_computations().into_iter().map(|c| g.root_of(c)));
            v
        }
        Opcode::Call => {
            let mut v = vec![x];
            if let Some(c) = i.called_computations().first() {
                v.push(g.root_of(*c));
            }
            v
        }
        Opcode::Parameter => {
            let comp = g.comp_of(x);
            let Some(&caller) = g.caller.get(&comp) else {
                return vec![];
            };
            match g.opcode(caller) {
                Opcode::Conditional => {
                    let branches = g.instr(caller).called_computations();
                    match branches
                        .iter()
                        .position(|&c| c == comp)
                        .and_then(|b| g.operand(caller, b + 1))
                    {
                        Some(o) => vec![x, o],
                        None => vec![],
                    }
                }
                Opcode::Call => {
                    let pn = i.parameter_number.unwrap_or(0).max(0) as usize;
                    match g.operand(caller, pn) {
                        Some(o) => vec![x, o],
                        None => vec![],
                    }
                }
                _ => vec![],
            }
        }
        _ => vec![],
    }
}

struct FixPoint<'a> {
    provided: &'a [bool],
    unspecified: &'a FxHashMap<Node, Vec<usize>>,
    group_of: &'a FxHashMap<Node, (bool, i64)>,
    groups: &'a [((bool, i64), Vec<Node>)],
    iterations: usize,
    rule_calls: usize,
    /// Per node: `epoch + 1` when the forward (backward) rule last returned
    /// "no change", and the rule's level class then (0 = no memo).
    fwd_memo: Vec<(u64, u8)>,
    bwd_memo: Vec<(u64, u8)>,
}

/// Per-level "already inferred" flags (XLA's caches), plus per-computation
/// counts of nodes still to visit so clean computations are skipped.
struct Dirty {
    fwd: Vec<bool>,
    bwd: Vec<bool>,
    grp: Vec<bool>,
    /// Nodes of each computation not yet done (forward + backward + group).
    open: Vec<usize>,
    comp_of: Vec<u32>,
}

impl Dirty {
    fn new(p: &PropagationState) -> Dirty {
        let n = p.shardings.len();
        let comp_of: Vec<u32> = (0..n as Node).map(|x| p.graph.comp_index(x)).collect();
        let mut open = vec![0usize; p.graph.post_orders.len()];
        for &c in &comp_of {
            open[c as usize] += 3;
        }
        Dirty {
            fwd: vec![false; n],
            bwd: vec![false; n],
            grp: vec![false; n],
            open,
            comp_of,
        }
    }
    fn set(flags: &mut [bool], open: &mut [usize], comp: u32, x: Node, done: bool) {
        let f = &mut flags[x as usize];
        if *f != done {
            *f = done;
            if done {
                open[comp as usize] -= 1;
            } else {
                open[comp as usize] += 1;
            }
        }
    }
    fn fwd(&mut self, x: Node, done: bool) {
        let c = self.comp_of[x as usize];
        Dirty::set(&mut self.fwd, &mut self.open, c, x, done);
    }
    fn bwd(&mut self, x: Node, done: bool) {
        let c = self.comp_of[x as usize];
        Dirty::set(&mut self.bwd, &mut self.open, c, x, done);
    }
    fn grp(&mut self, x: Node, done: bool) {
        let c = self.comp_of[x as usize];
        Dirty::set(&mut self.grp, &mut self.open, c, x, done);
    }
}

/// How the forward rule of `x` depends on the level (255: does nothing).
fn fwd_class(p: &PropagationState, x: Node, level: i64) -> u8 {
    if !p.can_propagate_through(x, level) {
        return 255;
    }
    if p.graph.opcode(x) == Opcode::Broadcast {
        return if level >= 3 { 3 } else { 255 };
    }
    u8::from(level > 0)
}

/// How the backward rule of `x` depends on the level (255: does nothing).
fn bwd_class(p: &PropagationState, x: Node, level: i64) -> u8 {
    let bcast = p.graph.opcode(x) == Opcode::Broadcast;
    if level < 2 && bcast {
        return 255;
    }
    match level {
        0 => 0,
        1 => 1,
        _ if bcast || p.graph.has_broadcast_user(x) => 2,
        _ => 1,
    }
}

/// Nothing the forward rule of `x` reads changed since `memo`. Dot and
/// convolution (look-ahead through users) and parameters (read their
/// caller's operand) are always re-run.
fn fwd_fresh(p: &PropagationState, x: Node, memo: u64) -> bool {
    memo != 0
        && !forward_rule_reads_beyond_operands(p.graph.opcode(x))
        && p.last_written[x as usize] < memo
        && p.graph
            .operands(x)
            .all(|o| p.last_written[o as usize] < memo)
}

/// Nothing the backward rule of `x` reads (itself, its users and their
/// operands) changed since `memo`.
fn bwd_fresh(p: &PropagationState, x: Node, memo: u64) -> bool {
    memo != 0
        && p.last_written[x as usize] < memo
        && p.graph.users(x).iter().all(|&u| {
            p.last_written[u as usize] < memo
                && p.graph
                    .operands(u)
                    .all(|o| p.last_written[o as usize] < memo)
        })
}

impl FixPoint<'_> {
    fn members(&self, x: Node) -> Option<&[Node]> {
        let key = self.group_of.get(&x)?;
        self.groups
            .iter()
            .find(|g| &g.0 == key)
            .map(|g| g.1.as_slice())
    }

    /// `MaybeComputationPropagation`: pushes `x`'s sharding across
    /// computation boundaries; records every node changed.
    fn computation_propagation(&self, p: &mut PropagationState, x: Node, changed: &mut Vec<Node>) {
        let op = p.graph.opcode(x);
        if matches!(
            op,
            Opcode::Conditional | Opcode::While | Opcode::CustomCall | Opcode::Call
        ) {
            self.propagate_to(p, x, x, changed);
        }
        if op == Opcode::Parameter || p.graph.is_root(x) {
            if let Some(&caller) = p.graph.caller.get(&p.graph.comp_of(x)) {
                self.propagate_to(p, caller, x, changed);
                if op == Opcode::Parameter
                    && matches!(p.graph.opcode(caller), Opcode::Conditional | Opcode::Call)
                {
                    self.propagate_to(p, x, x, changed);
                }
            }
        }
    }

    fn propagate_to(
        &self,
        p: &mut PropagationState,
        search: Node,
        x: Node,
        changed: &mut Vec<Node>,
    ) {
        let rel = related(p, search);
        if !rel.contains(&x) {
            return;
        }
        let Some(s) = p.shardings[x as usize].clone() else {
            return;
        };
        for r in rel {
            if self.provided[r as usize] {
                continue;
            }
            let new = normalize(p.graph.shape(r), s.clone());
            if p.shardings[r as usize].as_ref() != Some(&new) {
                p.store_normalized(r, new);
                changed.push(r);
                self.computation_propagation(p, r, changed);
            }
        }
    }

    fn clear(&self, p: &PropagationState, d: &mut Dirty, h: Node, for_users: Option<Node>) {
        for o in p.graph.operands(h) {
            d.bwd(o, false);
        }
        for &u in p.graph.users(for_users.unwrap_or(h)) {
            d.fwd(u, false);
            for &param in p.graph.callee_params(u) {
                d.fwd(param, false);
            }
        }
        if let Some(members) = self.members(h) {
            for &m in members {
                if m != h {
                    d.grp(m, false);
                }
            }
        }
    }

    fn after_change(&self, p: &mut PropagationState, d: &mut Dirty, x: Node) {
        let mut changed = Vec::new();
        self.computation_propagation(p, x, &mut changed);
        self.clear(p, d, x, None);
        for h in changed {
            self.clear(p, d, h, None);
        }
    }

    /// Refines a provided sharding's unspecified dims from `from`.
    fn refine_unspecified(&self, p: &mut PropagationState, x: Node, from: &Sharding) -> bool {
        let Some(spec) = self.unspecified.get(&x) else {
            return false;
        };
        if !from.is_tiled() {
            return false;
        }
        let Some(InstrSharding::Single(cur)) = p.shardings[x as usize].clone() else {
            return false;
        };
        let partial = partially_replicate_all_except(from, spec);
        let mut s = cur;
        let min = s.num_tiles() + 1;
        if merge_sharding_if_compatible(&partial, min, &mut s) {
            p.store_normalized(x, InstrSharding::Single(s));
            return true;
        }
        false
    }

    /// Is `x` the operand of a manual conversion op (not supported for
    /// unspecified-dims refinement)?
    fn feeds_manual_conversion(p: &PropagationState, x: Node) -> bool {
        let users = p.graph.users(x);
        users.len() == 1 && p.graph.is_manual_conversion(users[0])
    }

    /// `RunToFixPoint` for one aggressiveness level; returns whether
    /// anything changed.
    fn run(&mut self, p: &mut PropagationState, level: i64, use_groups: bool) -> bool {
        let n = p.shardings.len();
        let mut d = Dirty::new(p);
        for x in 0..n as Node {
            if !use_groups || !self.group_of.contains_key(&x) {
                d.grp(x, true);
            }
        }
        let may_merge = may_combine_partial(level);
        let mut any = false;
        loop {
            let mut changed_last = false;
            for c in 0..p.graph.post_orders.len() {
                if d.open[c] == 0 {
                    continue;
                }
                self.iterations += 1;
                let len = p.graph.post_orders[c].len();
                if use_groups && !self.group_of.is_empty() {
                    for k in 0..len {
                        let x = p.graph.post_orders[c][k];
                        if d.grp[x as usize] || !self.group_of.contains_key(&x) {
                            continue;
                        }
                        let members = self.members(x).unwrap_or(&[]).to_vec();
                        if self.provided[x as usize] {
                            if !may_merge || !self.unspecified.contains_key(&x) {
                                continue;
                            }
                            let mut refined = false;
                            for &m in &members {
                                if m == x {
                                    continue;
                                }
                                if let Some(InstrSharding::Single(ms)) =
                                    p.shardings[m as usize].clone()
                                {
                                    refined |= self.refine_unspecified(p, x, &ms);
                                }
                            }
                            if refined {
                                self.clear(p, &mut d, x, None);
                                d.grp(x, true);
                                changed_last = true;
                            }
                            continue;
                        }
                        d.grp(x, true);
                        if p.infer_from_group(x, level, &members) {
                            any = true;
                            changed_last = true;
                            self.after_change(p, &mut d, x);
                        }
                    }
                }
                for k in 0..len {
                    let x = p.graph.post_orders[c][k];
                    if d.fwd[x as usize] {
                        continue;
                    }
                    if self.provided[x as usize] {
                        if !may_merge
                            || !self.unspecified.contains_key(&x)
                            || Self::feeds_manual_conversion(p, x)
                        {
                            continue;
                        }
                        let Some(op) = p.graph.operand(x, 0) else {
                            continue;
                        };
                        let Some(InstrSharding::Single(os)) = p.shardings[op as usize].clone()
                        else {
                            continue;
                        };
                        if self.refine_unspecified(p, x, &os) {
                            self.clear(p, &mut d, x, None);
                            d.fwd(x, true);
                            changed_last = true;
                        }
                        continue;
                    }
                    d.fwd(x, true);
                    let class = fwd_class(p, x, level);
                    let (memo, memo_class) = self.fwd_memo[x as usize];
                    if class == 255 || (memo_class == class && fwd_fresh(p, x, memo)) {
                        continue;
                    }
                    self.rule_calls += 1;
                    let changed = p.infer_from_operands(x, level);
                    if !changed {
                        self.fwd_memo[x as usize] = (p.write_count + 1, class);
                    }
                    if changed {
                        any = true;
                        changed_last = true;
                        self.after_change(p, &mut d, x);
                    }
                }
                for k in (0..len).rev() {
                    let x = p.graph.post_orders[c][k];
                    if p.graph.is_manual_conversion(x) && !d.bwd[x as usize] {
                        if let Some(o) = p.graph.operand(x, 0) {
                            d.bwd(o, false);
                        }
                    }
                    if d.bwd[x as usize] {
                        continue;
                    }
                    if self.provided[x as usize] {
                        if !may_merge
                            || !self.unspecified.contains_key(&x)
                            || Self::feeds_manual_conversion(p, x)
                        {
                            continue;
                        }
                        let users: Vec<Node> = p.graph.users(x).to_vec();
                        let mut refined = false;
                        for u in users {
                            if !p.shardings[u as usize]
                                .as_ref()
                                .and_then(|s| s.as_single())
                                .is_some_and(Sharding::is_tiled)
                            {
                                continue;
                            }
                            if let Some(InstrSharding::Single(us)) =
                                p.sharding_from_user(x, u, level)
                            {
                                refined |= self.refine_unspecified(p, x, &us);
                            }
                        }
                        if refined {
                            self.clear(p, &mut d, x, None);
                            d.bwd(x, true);
                            changed_last = true;
                        }
                        continue;
                    }
                    d.bwd(x, true);
                    let class = bwd_class(p, x, level);
                    let (memo, memo_class) = self.bwd_memo[x as usize];
                    if class == 255 || (memo_class == class && bwd_fresh(p, x, memo)) {
                        continue;
                    }
                    self.rule_calls += 1;
                    let changed = p.infer_from_users(x, level);
                    if !changed {
                        self.bwd_memo[x as usize] = (p.write_count + 1, class);
                    }
                    if changed {
                        any = true;
                        changed_last = true;
                        self.after_change(p, &mut d, x);
                    }
                }
            }
            if !changed_last {
                break;
            }
        }
        any
    }
}
