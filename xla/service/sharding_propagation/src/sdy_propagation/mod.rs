//! `sdy-propagation`: Shardy's propagation on a module that carries Shardy
//! annotations (`xla.sdy.sharding` frontend attributes), before they are
//! exported to GSPMD shardings by `shardy-import`.
//!
//! It runs on the module as XLA's pipeline leaves it before `shardy-xla`
//! (`pre_spmd`: calls inlined but a shard_map's body, memory placements
//! retargeted); a call left in place is a data-flow edge. The module is read as Shardy sees it: every array value (tuple elements
//! are values of their own; a `tuple` and `get-tuple-element` name the same
//! values) has a Shardy sharding or none (all dimensions open). Ops carry
//! factor rules (`rules`); while loops, conditionals and calls are data-flow
//! edges between their operands, parameters, roots and results; a `Sharding`
//! custom call (with_sharding_constraint) pins its result; a shard_map pins
//! the global side of its in and out shardings (its body is manual and is
//! not propagated into); a `ShardingGroup` makes its members share one
//! sharding. As Shardy's import does, a fully closed constraint is applied
//! to its operand when the operand has no sharding, and constants are only
//! targets.
//!
//! Propagation is Shardy's op-priority schedule, each stage run to a fixed
//! point with aggressive factor propagation (`factors`): (0) element-wise,
//! reshape, transpose and data-flow ops whose operands have one use, and
//! dynamic slices forward; (1) the same with any number of uses;
//! (2) pass-through factors of every op, broadcasts only backward; (3) all
//! factors, broadcasts only backward; (4) everything. User priorities
//! (`p0`, `p1`, ...) are not read: every sharding counts as `p0` (jax 0.10.2
//! emits none in its lowering).
//!
//! The result is each instruction's shardings (closed: nothing is left for
//! another propagation), handed typed to `shardy-import`
//! (`PropagatedShardings`), which turns them into `sharding={...}`; the
//! propagated in and out shardings of a partially manual shard_map are
//! written back into its boundary's attributes.
//!
//! Invariants: a module without `xla.sdy` meshes is unchanged; closed
//! dimensions never change; the pass is deterministic (program order).

mod factors;
mod rules;

use crate::shardy_import::{
    custom_call_target, find_manual_bodies, ManualBody, PropagatedShardings,
};
use factors::{propagate_step, Direction, StepInput, StepScratch};
use rules::{Rule, RuleCache};
use rustc_hash::{FxHashMap, FxHashSet};
use std::cell::RefCell;
use std::rc::Rc;
use xla_hlo_ir::attrs::{AttrKey, AttrValue};
use xla_hlo_ir::sdy::{self, FrontendAttributes, MeshRef, SdyMesh, SdySharding};
use xla_hlo_ir::{CompId, HloInstruction, HloModule, InstrId, Opcode, Shape};

const SHARDING: &str = "xla.sdy.sharding";
const IN_SHARDINGS: &str = "xla.sdy.in_shardings";
const OUT_SHARDINGS: &str = "xla.sdy.out_shardings";
const GROUP_ID: &str = "xla.sdy.sharding_group_id";
const MANUAL_AXES: &str = "xla.sdy.manual_axes";
const MANUAL_BODY_PREFIX: &str = "xla.sdy.manual_computation_body";
const FUNC_RESULT: &str = "xla.sdy.FuncResultSharding";

/// What the pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SdyPropagationStats {
    pub values: usize,
    pub ops: usize,
    /// Values with a sharding before and after.
    pub sharded_before: usize,
    pub sharded_after: usize,
    /// Sweeps over the ops, all stages together.
    pub sweeps: usize,
}

/// How an op takes part in the op-priority schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OpClass {
    Elementwise,
    ReshapeOrTranspose,
    DynamicSlice,
    Broadcast,
    DataFlow,
    /// A sharding group: its members always share one sharding.
    Group,
    Other,
}

struct Op {
    /// Shared between the ops with equal rules (`RuleCache::intern`).
    rule: Rc<Rule>,
    operands: Vec<usize>,
    results: Vec<usize>,
    class: OpClass,
    /// Whether an operand (not a scalar) has more than one use.
    multi_use: bool,
    /// The edge between a value the entry returns and its func-result
    /// sharding: stepped (both ways) only before and after each stage, as
    /// Shardy pushes func results to the returned values around each
    /// propagation, never among the other ops.
    func_result: bool,
}

/// One array value (pseudo values hold the pinned in and out shardings
/// of a manual computation).
struct Value {
    /// Its dims: `Graph::dims_arena[dims_start..dims_start + rank]`.
    dims_start: u32,
    rank: u32,
    constant: bool,
    uses: usize,
}

/// Each instruction's values, one per tuple element, stored flat: the
/// values of instruction `i` of computation `c` are
/// `values[ranges[c][i].0..][..ranges[c][i].1]`.
#[derive(Default)]
struct ValueTable {
    ranges: Vec<Vec<(u32, u32)>>,
    values: Vec<Option<usize>>,
}

impl ValueTable {
    fn new(module: &HloModule) -> ValueTable {
        ValueTable {
            ranges: module
                .computations
                .iter()
                .map(|comp| vec![(0, 0); comp.instructions.len()])
                .collect(),
            values: Vec::new(),
        }
    }

    fn get(&self, comp: CompId, id: InstrId) -> &[Option<usize>] {
        match self
            .ranges
            .get(comp.index())
            .and_then(|r| r.get(id.index()))
        {
            Some(&(start, len)) => &self.values[start as usize..][..len as usize],
            None => &[],
        }
    }

    fn set(&mut self, comp: CompId, id: InstrId, values: impl IntoIterator<Item = Option<usize>>) {
        let start = self.values.len();
        self.values.extend(values);
        self.ranges[comp.index()][id.index()] = (start as u32, (self.values.len() - start) as u32);
    }

    /// Gives instruction `id` of `comp` the values of instruction `from`
    /// of `from_comp`.
    fn alias(&mut self, comp: CompId, id: InstrId, from_comp: CompId, from: InstrId) {
        let range = self.ranges[from_comp.index()][from.index()];
        self.ranges[comp.index()][id.index()] = range;
    }
}

struct Graph {
    values: Vec<Value>,
    /// The dims of every value, back to back.
    dims_arena: Vec<i64>,
    shardings: Vec<Option<SdySharding>>,
    ops: Vec<Op>,
    rules: RuleCache,
    value_of: ValueTable,
    /// Per shard_map boundary custom call: the pseudo values holding its
    /// in or out shardings, one per value.
    pinned_of: FxHashMap<(u32, u32), Vec<Option<usize>>>,
}

/// The dims of `value` (a free function, so that a caller may hold them
/// while it updates the graph's other fields).
fn dims_in<'a>(values: &[Value], arena: &'a [i64], value: usize) -> &'a [i64] {
    let v = &values[value];
    &arena[v.dims_start as usize..][..v.rank as usize]
}

impl Graph {
    fn new_value(&mut self, dims: &[i64], constant: bool) -> usize {
        let dims_start = self.dims_arena.len() as u32;
        self.dims_arena.extend_from_slice(dims);
        self.values.push(Value {
            dims_start,
            rank: dims.len() as u32,
            constant,
            uses: 0,
        });
        self.shardings.push(None);
        self.values.len() - 1
    }

    fn dims(&self, value: usize) -> &[i64] {
        dims_in(&self.values, &self.dims_arena, value)
    }

    fn values(&self, comp: CompId, id: InstrId) -> &[Option<usize>] {
        self.value_of.get(comp, id)
    }

    fn values_owned(&self, comp: CompId, id: InstrId) -> Vec<Option<usize>> {
        self.values(comp, id).to_vec()
    }

    fn edge(&mut self, sources: Vec<usize>, targets: Vec<usize>) {
        let Some(&first) = sources.first().or(targets.first()) else {
            return;
        };
        let dims = self.dims(first);
        let all = sources.iter().chain(&targets);
        if all.clone().any(|&v| self.dims(v) != dims) {
            return;
        }
        let rule = identity_rule(dims, sources.len(), targets.len());
        let rule = self.rules.intern(rule);
        self.ops.push(Op {
            rule,
            operands: sources,
            results: targets,
            class: OpClass::DataFlow,
            multi_use: false,
            func_result: false,
        });
    }
}

impl Graph {
    /// The edge between the global side of a partially manual shard_map
    /// (`global`, holding its in or out sharding) and a value of its body
    /// (`local`): each global dim is a manual factor of `manual_sizes[d]`
    /// (its manual axes, never propagated) then the local dim, so the free
    /// axes move across and the manual ones stay outside. `into_body` says
    /// which way data flows. Dims that do not divide add no edge.
    fn manual_boundary(
        &mut self,
        global: usize,
        local: usize,
        manual_sizes: &[i64],
        into_body: bool,
    ) {
        let global_dims = self.dims(global).to_vec();
        let local_dims = self.dims(local).to_vec();
        if global_dims.len() != local_dims.len()
            || manual_sizes.len() != global_dims.len()
            || (0..global_dims.len()).any(|d| local_dims[d] * manual_sizes[d] != global_dims[d])
        {
            return;
        }
        let mut factors = Vec::new();
        let mut global_mapping = Vec::new();
        let mut local_mapping = Vec::new();
        for d in 0..global_dims.len() {
            let mut held = Vec::new();
            if manual_sizes[d] > 1 {
                held.push(factors.len());
                factors.push(rules::Factor {
                    size: manual_sizes[d],
                    pass_through: false,
                    blocked: true,
                });
            }
            held.push(factors.len());
            local_mapping.push(vec![factors.len()]);
            factors.push(rules::Factor {
                size: local_dims[d],
                pass_through: true,
                blocked: false,
            });
            global_mapping.push(held);
        }
        let (operands, results, operand_mapping, result_mapping) = if into_body {
            (vec![global], vec![local], global_mapping, local_mapping)
        } else {
            (vec![local], vec![global], local_mapping, global_mapping)
        };
        let rule = self.rules.intern(Rule {
            factors,
            operands: vec![operand_mapping],
            results: vec![result_mapping],
        });
        self.ops.push(Op {
            rule,
            operands,
            results,
            class: OpClass::DataFlow,
            multi_use: false,
            func_result: false,
        });
    }
}

/// The manual axes of the shard_map boundary `instr` when its body is
/// partially manual (propagated into), else `None`.
fn partial_manual_axes<'a>(
    instr: &HloInstruction,
    partial_bodies: &'a [ManualBody],
) -> Option<&'a [String]> {
    let attributes = frontend_attributes(instr)?;
    let axes = sdy::parse_manual_axes(&attributes.get(MANUAL_AXES)?.value).ok()?;
    partial_bodies
        .iter()
        .find(|b| b.axes == axes)
        .map(|b| b.axes.as_slice())
}

/// Per dim of `sharding`, the product of the sizes of its manual axes.
fn manual_dim_sizes(
    sharding: &SdySharding,
    manual: &[String],
    meshes: &[(String, SdyMesh)],
) -> Vec<i64> {
    let mesh = match &sharding.mesh {
        MeshRef::Inline(m) => Some(m),
        MeshRef::Named(n) => meshes.iter().find(|(name, _)| name == n).map(|(_, m)| m),
    };
    sharding
        .dims
        .iter()
        .map(|d| {
            d.axes
                .iter()
                .filter(|a| manual.contains(&a.name))
                .map(|a| match a.sub_axis {
                    Some((_, size)) => size,
                    None => mesh.and_then(|m| m.axis_size(&a.name)).unwrap_or(1),
                })
                .product()
        })
        .collect()
}

fn identity_rule(dims: &[i64], operands: usize, results: usize) -> Rule {
    let mapping: Vec<Vec<usize>> = (0..dims.len()).map(|d| vec![d]).collect();
    Rule {
        factors: dims
            .iter()
            .map(|&size| rules::Factor {
                size,
                pass_through: true,
                blocked: false,
            })
            .collect(),
        operands: vec![mapping.clone(); operands],
        results: vec![mapping; results],
    }
}

fn frontend_attributes(instr: &HloInstruction) -> Option<FrontendAttributes> {
    match instr.attr(AttrKey::FrontendAttributes) {
        Some(AttrValue::Raw(text)) if text.contains("xla.sdy.") => {
            FrontendAttributes::parse(text).ok()
        }
        _ => None,
    }
}

/// Parsed sharding attributes by key and by their instruction's raw
/// frontend-attribute text: a module repeats few distinct texts over many
/// instructions, and propagation reads each several times.
/// Shardings are read without their axes of size 1 (MaxText meshes name
/// many): such an axis splits nothing, and as an empty range of devices it
/// would look free to every factor and could end up twice in one sharding.
struct AttributeMemo<'m> {
    meshes: &'m [(String, SdyMesh)],
    parsed: RefCell<FxHashMap<&'static str, ParsedByText>>,
}

/// Raw frontend-attribute text -> the shardings of one key in it.
type ParsedByText = FxHashMap<std::sync::Arc<str>, Option<Vec<SdySharding>>>;

impl AttributeMemo<'_> {
    fn new(meshes: &[(String, SdyMesh)]) -> AttributeMemo<'_> {
        AttributeMemo {
            meshes,
            parsed: RefCell::default(),
        }
    }

    /// `s` without its axes of size 1.
    fn without_unit_axes(&self, mut s: SdySharding) -> SdySharding {
        let mesh = match &s.mesh {
            MeshRef::Inline(m) => Some(m),
            MeshRef::Named(n) => self
                .meshes
                .iter()
                .find(|(name, _)| name == n)
                .map(|(_, m)| m),
        };
        let Some(mesh) = mesh else {
            return s;
        };
        let unit = |a: &xla_hlo_ir::mesh::AxisRef| match a.sub_axis {
            Some((_, size)) => size == 1,
            None => mesh.axis_size(&a.name) == Some(1),
        };
        for d in &mut s.dims {
            d.axes.retain(|a| !unit(a));
        }
        s.replicated.retain(|a| !unit(a));
        s.unreduced.retain(|a| !unit(a));
        s
    }

    /// The shardings of attribute `key` of `instr` (`None`: absent or not
    /// parsable; `check_attributes` reports the latter).
    fn shardings(&self, instr: &HloInstruction, key: &'static str) -> Option<Vec<SdySharding>> {
        let Some(AttrValue::Raw(raw)) = instr.attr(AttrKey::FrontendAttributes) else {
            return None;
        };
        if !raw.contains("xla.sdy.") {
            return None;
        }
        if let Some(hit) = self.parsed.borrow().get(key).and_then(|m| m.get(&**raw)) {
            return hit.clone();
        }
        let parsed = frontend_attributes(instr)
            .and_then(|a| sdy::parse_shardings(&a.get(key)?.value).ok())
            .map(|v| v.into_iter().map(|s| self.without_unit_axes(s)).collect());
        self.parsed
            .borrow_mut()
            .entry(key)
            .or_default()
            .insert(raw.clone(), parsed.clone());
        parsed
    }
}

fn leaf_dims(shape: &Shape) -> Vec<Option<&[i64]>> {
    match shape {
        Shape::Tuple(elements) => elements
            .iter()
            .map(|e| (!matches!(e, Shape::Tuple(_))).then(|| e.dims()))
            .collect(),
        s => vec![Some(s.dims())],
    }
}

/// The computations propagation walks: the entry and what it reaches
/// through while, conditional and (non-manual) call.
fn flow_computations(module: &HloModule, partial_bodies: &[ManualBody]) -> Vec<CompId> {
    let mut out = vec![module.entry];
    let mut i = 0;
    while i < out.len() {
        let comp = module.comp(out[i]);
        for instr in &comp.instructions {
            let callees: Vec<CompId> = match instr.opcode {
                Opcode::While | Opcode::Conditional => instr.called_computations(),
                Opcode::Call => instr
                    .to_apply()
                    .filter(|c| {
                        !module.comp(*c).name.starts_with(MANUAL_BODY_PREFIX)
                            || partial_bodies.iter().any(|b| b.comp == *c)
                    })
                    .into_iter()
                    .collect(),
                _ => Vec::new(),
            };
            for c in callees {
                if !out.contains(&c) {
                    out.push(c);
                }
            }
        }
        i += 1;
    }
    out
}

fn build_graph(
    module: &HloModule,
    memo: &AttributeMemo<'_>,
    flow: &[CompId],
    partial_bodies: &[ManualBody],
    meshes: &[(String, SdyMesh)],
) -> Graph {
    let mut g = Graph {
        values: Vec::new(),
        dims_arena: Vec::new(),
        shardings: Vec::new(),
        ops: Vec::new(),
        rules: RuleCache::default(),
        value_of: ValueTable::new(module),
        pinned_of: FxHashMap::default(),
    };
    // At most one value per array leaf of each instruction (a large
    // module's tables are allocated once, not grown).
    let (mut leaves, mut dims, mut instructions) = (0, 0, 0);
    for &c in flow {
        for instr in &module.comp(c).instructions {
            instructions += 1;
            for leaf in leaf_dims(&instr.shape).into_iter().flatten() {
                leaves += 1;
                dims += leaf.len();
            }
        }
    }
    g.values.reserve(leaves);
    g.shardings.reserve(leaves);
    g.dims_arena.reserve(dims);
    g.value_of.values.reserve(leaves);
    g.ops.reserve(instructions);
    // A branch's parameter names the conditional's operand values (Shardy's
    // branches capture them), when the branch has one caller.
    let branch_operand = branch_operands(module, flow);
    // Values, computation by computation (operands before users).
    for &c in flow {
        let comp = module.comp(c);
        for (i, instr) in comp.instructions.iter().enumerate() {
            let id = InstrId(i as u32);
            if instr.opcode == Opcode::Parameter {
                if let Some(&(caller, operand)) = branch_operand.get(&c) {
                    if g.values(caller, operand).len() == leaf_dims(&instr.shape).len() {
                        g.value_of.alias(c, id, caller, operand);
                        continue;
                    }
                }
            }
            let values: Vec<Option<usize>> = match instr.opcode {
                Opcode::Tuple => instr
                    .operands
                    .iter()
                    .map(|o| match g.values(c, *o) {
                        [single] if !matches!(comp.instr(*o).shape, Shape::Tuple(_)) => *single,
                        _ => None,
                    })
                    .collect(),
                Opcode::GetTupleElement if !matches!(instr.shape, Shape::Tuple(_)) => {
                    let index = instr.int_attr(AttrKey::Index).unwrap_or(0) as usize;
                    vec![g.values(c, instr.operands[0]).get(index).copied().flatten()]
                }
                _ => {
                    let constant = match instr.opcode {
                        Opcode::Constant | Opcode::Iota => true,
                        op if op.is_elementwise()
                            || matches!(
                                op,
                                Opcode::Broadcast | Opcode::Reshape | Opcode::Transpose
                            ) =>
                        {
                            !instr.operands.is_empty()
                                && instr.operands.iter().all(|o| {
                                    g.values(c, *o)
                                        .iter()
                                        .all(|v| v.is_some_and(|v| g.values[v].constant))
                                })
                        }
                        _ => false,
                    };
                    leaf_dims(&instr.shape)
                        .into_iter()
                        .map(|dims| dims.map(|d| g.new_value(d, constant)))
                        .collect()
                }
            };
            g.value_of.set(c, id, values);
        }
    }
    // Uses: each operand slot, and each computation's root (returned).
    for &c in flow {
        let comp = module.comp(c);
        for instr in &comp.instructions {
            if matches!(instr.opcode, Opcode::Tuple | Opcode::GetTupleElement) {
                continue;
            }
            for o in &instr.operands {
                for &v in g.value_of.get(c, *o).iter().flatten() {
                    g.values[v].uses += 1;
                }
            }
        }
        for &v in g.value_of.get(c, comp.root).iter().flatten() {
            g.values[v].uses += 1;
        }
    }
    // Initial shardings.
    for &c in flow {
        let comp = module.comp(c);
        for (i, instr) in comp.instructions.iter().enumerate() {
            if matches!(instr.opcode, Opcode::Tuple | Opcode::GetTupleElement) {
                continue;
            }
            let Some(shardings) = memo.shardings(instr, SHARDING) else {
                continue;
            };
            let values = g.value_of.get(c, InstrId(i as u32));
            if shardings.len() != values.len() {
                continue;
            }
            for (v, s) in values.iter().zip(shardings) {
                if let Some(v) = *v {
                    if s.dims.len() == g.values[v].rank as usize {
                        g.shardings[v] = Some(s);
                    }
                }
            }
        }
    }
    // Ops, each keyed by its instruction's place in program order with
    // loop and branch bodies nested where they are called (see
    // `nested_order`): the order Shardy walks the module in.
    let order = nested_order(module, flow);
    let mut op_keys: Vec<u64> = Vec::new();
    let mut key = 0u64;
    let mut groups: Vec<(i64, Vec<usize>)> = Vec::new();
    for &c in flow {
        let comp = module.comp(c);
        for (i, instr) in comp.instructions.iter().enumerate() {
            op_keys.resize(g.ops.len(), key);
            let (before_callees, after) = order[c.index()]
                .get(i)
                .copied()
                .unwrap_or((u64::MAX, u64::MAX));
            key = after;
            let id = InstrId(i as u32);
            let results: Vec<Option<usize>> = g.values_owned(c, id);
            let operand_values = |g: &Graph, k: usize| -> Vec<Option<usize>> {
                g.values_owned(c, instr.operands[k])
            };
            match (instr.opcode, custom_call_target(instr)) {
                (Opcode::Tuple | Opcode::GetTupleElement, _) => {}
                (Opcode::While, _) => {
                    let (Some(body), Some(cond)) = (
                        instr.computation_attr(AttrKey::Body),
                        instr.computation_attr(AttrKey::Condition),
                    ) else {
                        continue;
                    };
                    let init = operand_values(&g, 0);
                    let body_root = g.values_owned(body, module.comp(body).root);
                    let body_param = module
                        .comp(body)
                        .parameters
                        .first()
                        .map(|p| g.values_owned(body, *p))
                        .unwrap_or_default();
                    let cond_param = module
                        .comp(cond)
                        .parameters
                        .first()
                        .map(|p| g.values_owned(cond, *p))
                        .unwrap_or_default();
                    for k in 0..results.len() {
                        let sources: Vec<usize> = [&init, &body_root]
                            .iter()
                            .filter_map(|l| l.get(k).copied().flatten())
                            .collect();
                        let targets: Vec<usize> = [&results, &body_param, &cond_param]
                            .iter()
                            .filter_map(|l| l.get(k).copied().flatten())
                            .collect();
                        g.edge(sources, targets);
                    }
                }
                (Opcode::Conditional, _) => {
                    let branches = instr.called_computations();
                    for (b, &branch) in branches.iter().enumerate() {
                        let bc = module.comp(branch);
                        if branch_operand.contains_key(&branch) {
                            continue;
                        }
                        if let (Some(&p), Some(_)) =
                            (bc.parameters.first(), instr.operands.get(b + 1))
                        {
                            let args = operand_values(&g, b + 1);
                            let params = g.values_owned(branch, p);
                            for (a, p) in args.iter().zip(&params) {
                                if let (Some(a), Some(p)) = (a, p) {
                                    g.edge(vec![*a], vec![*p]);
                                }
                            }
                        }
                    }
                    // A branch's parameter is the operand itself in Shardy
                    // (its regions capture values): before the branch ops.
                    op_keys.resize(g.ops.len(), before_callees);
                    for (k, result) in results.iter().enumerate() {
                        let sources: Vec<usize> = branches
                            .iter()
                            .filter_map(|&b| {
                                g.values(b, module.comp(b).root).get(k).copied().flatten()
                            })
                            .collect();
                        if let Some(r) = *result {
                            g.edge(sources, vec![r]);
                        }
                    }
                }
                (Opcode::Call, _) => {
                    let Some(callee) = instr.to_apply() else {
                        continue;
                    };
                    let cc = module.comp(callee);
                    if cc.name.starts_with(MANUAL_BODY_PREFIX)
                        && !partial_bodies.iter().any(|b| b.comp == callee)
                    {
                        continue;
                    }
                    for (k, &p) in cc.parameters.iter().enumerate() {
                        if k >= instr.operands.len() {
                            break;
                        }
                        let args = operand_values(&g, k);
                        for (a, p) in args.iter().zip(&g.values_owned(callee, p)) {
                            if let (Some(a), Some(p)) = (a, p) {
                                g.edge(vec![*a], vec![*p]);
                            }
                        }
                    }
                    op_keys.resize(g.ops.len(), before_callees);
                    for (r, s) in results.iter().zip(&g.values_owned(callee, cc.root)) {
                        if let (Some(r), Some(s)) = (r, s) {
                            g.edge(vec![*s], vec![*r]);
                        }
                    }
                }
                (_, Some("xla.sdy.GlobalToLocalShape")) => {
                    let Some(pinned) = memo.shardings(instr, IN_SHARDINGS) else {
                        continue;
                    };
                    let manual = partial_manual_axes(instr, partial_bodies);
                    let mut pseudo = Vec::new();
                    for (k, s) in pinned.into_iter().enumerate() {
                        if k >= instr.operands.len() {
                            break;
                        }
                        let mut p_value = None;
                        if let [Some(v)] = operand_values(&g, k).as_slice() {
                            let dims = g.dims(*v).to_vec();
                            let p = g.new_value(&dims, false);
                            p_value = Some(p);
                            let manual_sizes = manual.map(|m| manual_dim_sizes(&s, m, meshes));
                            g.shardings[p] = Some(s);
                            g.edge(vec![*v], vec![p]);
                            if let (Some(sizes), Some(Some(local))) = (manual_sizes, results.get(k))
                            {
                                g.manual_boundary(p, *local, &sizes, true);
                            }
                        }
                        pseudo.push(p_value);
                    }
                    if manual.is_some() {
                        g.pinned_of.insert((c.0, id.0), pseudo);
                    }
                }
                (_, Some("xla.sdy.LocalToGlobalShape")) => {
                    let Some(pinned) = memo.shardings(instr, OUT_SHARDINGS) else {
                        continue;
                    };
                    let manual = partial_manual_axes(instr, partial_bodies);
                    let mut pseudo = Vec::new();
                    for (k, (r, s)) in results.iter().zip(pinned).enumerate() {
                        let mut p_value = None;
                        if let Some(r) = *r {
                            let dims = g.dims(r).to_vec();
                            let p = g.new_value(&dims, false);
                            p_value = Some(p);
                            let manual_sizes = manual.map(|m| manual_dim_sizes(&s, m, meshes));
                            g.shardings[p] = Some(s);
                            g.edge(vec![p], vec![r]);
                            if let (Some(sizes), Some(Some(local))) =
                                (manual_sizes, operand_values(&g, 0).get(k))
                            {
                                g.manual_boundary(p, *local, &sizes, false);
                            }
                        }
                        pseudo.push(p_value);
                    }
                    if manual.is_some() {
                        g.pinned_of.insert((c.0, id.0), pseudo);
                    }
                }
                (_, Some("xla.sdy.ShardingGroup")) => {
                    let id = frontend_attributes(instr).and_then(|a| {
                        a.get(GROUP_ID)
                            .and_then(|e| sdy::parse_group_id(&e.value).ok())
                    });
                    if let (Some(id), [Some(v)]) = (id, operand_values(&g, 0).as_slice()) {
                        match groups.iter_mut().find(|(g, _)| *g == id) {
                            Some((_, members)) => members.push(*v),
                            None => groups.push((id, vec![*v])),
                        }
                    }
                }
                _ => {
                    let mut operand_ids = Vec::new();
                    for k in 0..instr.operands.len() {
                        match operand_values(&g, k).as_slice() {
                            [Some(v)]
                                if !matches!(
                                    comp.instr(instr.operands[k]).shape,
                                    Shape::Tuple(_)
                                ) =>
                            {
                                operand_ids.push(*v)
                            }
                            _ => {
                                operand_ids.clear();
                                break;
                            }
                        }
                    }
                    if operand_ids.len() != instr.operands.len()
                        || results.iter().any(|r| r.is_none())
                    {
                        continue;
                    }
                    let result_ids: Vec<usize> =
                        results.iter().map(|r| r.expect("checked")).collect();
                    let (values, arena) = (&g.values, &g.dims_arena);
                    let dims_of = |v: usize| dims_in(values, arena, v);
                    let operand_dims: Vec<&[i64]> =
                        operand_ids.iter().map(|&v| dims_of(v)).collect();
                    let result_dims: Vec<&[i64]> = result_ids.iter().map(|&v| dims_of(v)).collect();
                    let Some(rule) = g.rules.rule(instr, &operand_dims, &result_dims) else {
                        continue;
                    };
                    let class = match (instr.opcode, custom_call_target(instr)) {
                        (_, Some(FUNC_RESULT)) => OpClass::DataFlow,
                        (_, Some("Sharding")) => OpClass::Elementwise,
                        (op, _) if op.is_elementwise() => OpClass::Elementwise,
                        (Opcode::Reshape | Opcode::Transpose, _) => OpClass::ReshapeOrTranspose,
                        (Opcode::DynamicSlice | Opcode::DynamicUpdateSlice, _) => {
                            OpClass::DynamicSlice
                        }
                        (Opcode::Broadcast, _) => OpClass::Broadcast,
                        _ => OpClass::Other,
                    };
                    let multi_use = operand_ids
                        .iter()
                        .any(|&v| g.values[v].uses > 1 && g.values[v].rank > 0);
                    g.ops.push(Op {
                        rule,
                        operands: operand_ids,
                        results: result_ids,
                        class,
                        multi_use,
                        func_result: c == module.entry
                            && custom_call_target(instr) == Some(FUNC_RESULT),
                    });
                }
            }
        }
    }
    for (_, members) in groups {
        let dims = g.dims(members[0]).to_vec();
        if members.iter().any(|&m| g.dims(m) != dims.as_slice()) {
            continue;
        }
        // As Shardy's sharding-group import: the first member's initial
        // sharding (closed dims included) is every unsharded member's.
        if let Some(initial) = members.iter().find_map(|&m| g.shardings[m].clone()) {
            for &m in &members {
                if g.shardings[m].is_none() && !g.values[m].constant {
                    g.shardings[m] = Some(initial.clone());
                }
            }
        }
        let rule = g.rules.intern(identity_rule(&dims, members.len(), 0));
        g.ops.push(Op {
            rule,
            operands: members,
            results: Vec::new(),
            class: OpClass::Group,
            multi_use: false,
            func_result: false,
        });
    }
    op_keys.resize(g.ops.len(), u64::MAX);
    let mut by_key: Vec<(u64, u32)> = op_keys
        .into_iter()
        .enumerate()
        .map(|(i, key)| (key, i as u32))
        .collect();
    by_key.sort_unstable();
    let source: Vec<u32> = by_key.into_iter().map(|(_, i)| i).collect();
    permute(&mut g.ops, &source);
    g
}

/// Reorders `items` in place so that position `j` holds what was at
/// `source[j]` (`source` a permutation), one cycle at a time.
fn permute<T>(items: &mut [T], source: &[u32]) {
    let mut placed = vec![false; items.len()];
    for start in 0..items.len() {
        let mut j = start;
        while !placed[j] {
            placed[j] = true;
            let k = source[j] as usize;
            if k == start {
                break;
            }
            items.swap(j, k);
            j = k;
        }
    }
}

/// Per branch computation called by exactly one conditional (of `flow`):
/// the caller's computation and the operand the branch receives.
fn branch_operands(module: &HloModule, flow: &[CompId]) -> FxHashMap<CompId, (CompId, InstrId)> {
    let mut callers: FxHashMap<CompId, Vec<(CompId, InstrId)>> = FxHashMap::default();
    for &c in flow {
        for instr in &module.comp(c).instructions {
            let called = instr.called_computations();
            let is_branch = instr.opcode == Opcode::Conditional;
            for (b, callee) in called.into_iter().enumerate() {
                let entry = callers.entry(callee).or_default();
                match instr.operands.get(b + 1) {
                    Some(&operand) if is_branch => entry.push((c, operand)),
                    // Called some other way too: never aliased.
                    _ => entry.push((CompId(u32::MAX), InstrId(u32::MAX))),
                }
            }
        }
    }
    callers
        .into_iter()
        .filter_map(|(callee, list)| match list.as_slice() {
            [(caller, operand)] if caller.0 != u32::MAX => Some((callee, (*caller, *operand))),
            _ => None,
        })
        .collect()
}

/// Each instruction's place in program order when the computations a
/// while, conditional or call runs (those in `flow`) are placed right
/// before the instruction that runs them, as in the nested regions Shardy
/// walks: `(before its callees, after them)`, equal for an instruction
/// that calls nothing in `flow` apart from the numbering gap.
fn nested_order(module: &HloModule, flow: &[CompId]) -> Vec<Vec<(u64, u64)>> {
    let mut order: Vec<Vec<(u64, u64)>> = module
        .computations
        .iter()
        .map(|c| vec![(u64::MAX, u64::MAX); c.instructions.len()])
        .collect();
    let mut visited: Vec<CompId> = Vec::new();
    let mut next = 0u64;
    // (computation, next instruction to number)
    let mut stack: Vec<(CompId, usize)> = Vec::new();
    for &start in flow {
        if visited.contains(&start) {
            continue;
        }
        visited.push(start);
        stack.push((start, 0));
        while let Some(&mut (c, ref mut i)) = stack.last_mut() {
            let comp = module.comp(c);
            let Some(instr) = comp.instructions.get(*i) else {
                stack.pop();
                continue;
            };
            let callee = instr
                .called_computations()
                .into_iter()
                .find(|callee| flow.contains(callee) && !visited.contains(callee));
            // Numbered when first reached (before its callees).
            let slot = &mut order[c.index()][*i];
            if slot.0 == u64::MAX {
                slot.0 = next;
                next += 1;
            }
            match callee {
                Some(callee) => {
                    visited.push(callee);
                    stack.push((callee, 0));
                }
                None => {
                    order[c.index()][*i].1 = next;
                    next += 1;
                    *i += 1;
                }
            }
        }
    }
    order
}

/// Shardy's import step that puts a fully closed constraint's sharding on
/// its operand when the operand has none and no other constraint on it
/// disagrees (loop and call boundary values excluded).
fn apply_constraints(module: &HloModule, memo: &AttributeMemo<'_>, flow: &[CompId], g: &mut Graph) {
    for &c in flow {
        let comp = module.comp(c);
        let users = comp.users();
        for instr in comp.instructions.iter() {
            let constraints: Vec<(usize, SdySharding)> = match custom_call_target(instr) {
                Some("Sharding") => memo
                    .shardings(instr, SHARDING)
                    .filter(|s| s.len() == 1)
                    .map(|mut s| vec![(0, s.remove(0))])
                    .unwrap_or_default(),
                Some("xla.sdy.GlobalToLocalShape") => memo
                    .shardings(instr, IN_SHARDINGS)
                    .map(|s| s.into_iter().enumerate().collect())
                    .unwrap_or_default(),
                _ => Vec::new(),
            };
            for (k, s) in constraints {
                if s.dims.iter().any(|d| d.open) {
                    continue;
                }
                let Some(&operand) = instr.operands.get(k) else {
                    continue;
                };
                let defining = comp.instr(operand);
                if matches!(
                    defining.opcode,
                    Opcode::While | Opcode::Conditional | Opcode::Call
                ) || (defining.opcode == Opcode::Parameter && c != module.entry)
                {
                    continue;
                }
                let [Some(v)] = g.values(c, operand)[..] else {
                    continue;
                };
                if g.shardings[v].is_some() {
                    continue;
                }
                let disagrees = users[operand.index()].iter().any(|&u| {
                    let user = comp.instr(u);
                    match custom_call_target(user) {
                        Some("Sharding") => memo
                            .shardings(user, SHARDING)
                            .is_some_and(|t| t.first() != Some(&s)),
                        _ => false,
                    }
                });
                if !disagrees {
                    g.shardings[v] = Some(s);
                }
            }
        }
    }
}

/// The mesh every sharded tensor of the op names, if they agree.
fn common_mesh<'a>(g: &'a Graph, op: &Op) -> Option<&'a MeshRef> {
    let mut mesh: Option<&MeshRef> = None;
    for &v in op.operands.iter().chain(&op.results) {
        if let Some(s) = &g.shardings[v] {
            match mesh {
                None => mesh = Some(&s.mesh),
                Some(m) if *m == s.mesh => {}
                Some(_) => return None,
            }
        }
    }
    mesh
}

/// The op-priority schedule's direction for factor `factor` of `op` at
/// `stage` (stages 0..=4, each including the earlier ones).
fn direction(op: &Op, factor: usize, stage: usize) -> Direction {
    if op.class == OpClass::Group {
        return Direction::BOTH;
    }
    let by_uses = |allow_multi_use: bool| {
        if allow_multi_use || !op.multi_use {
            Direction::BOTH
        } else {
            Direction::NONE
        }
    };
    let pass_through_op = |allow_multi_use: bool| match op.class {
        OpClass::Elementwise | OpClass::ReshapeOrTranspose | OpClass::DataFlow => {
            by_uses(allow_multi_use)
        }
        OpClass::DynamicSlice => by_uses(allow_multi_use).intersection(Direction::FORWARD),
        _ => Direction::NONE,
    };
    let broadcast_backward = || {
        if op.class == OpClass::Broadcast {
            Direction::BACKWARD
        } else {
            Direction::BOTH
        }
    };
    let mut d = Direction::NONE;
    for s in 0..=stage {
        d = d.union(match s {
            0 => pass_through_op(false),
            1 => pass_through_op(true),
            2 if op.rule.factors[factor].pass_through => broadcast_backward(),
            2 => Direction::NONE,
            3 => broadcast_backward(),
            _ => Direction::BOTH,
        });
    }
    d
}

const STAGES: usize = 5;
/// Sweeps per stage before giving up on a fixed point (each sweep that
/// changes something adds axes, so this is never reached in practice).
const MAX_SWEEPS_PER_STAGE: usize = 1000;

/// Runs the stages, each as sweeps over the ops in program order to a fixed
/// point. A sweep steps only the ops one of whose values changed since
/// their last step, and a stage starts with only the ops whose factor
/// directions it widens (a step is a function of its values' shardings and
/// its directions, and every op's last step changed nothing): the same
/// result as stepping every op, in time proportional to the changes.
fn propagate(g: &mut Graph, meshes: &[(String, SdyMesh)]) -> usize {
    let mut ops_of_value: Vec<Vec<u32>> = vec![Vec::new(); g.values.len()];
    for (oi, op) in g.ops.iter().enumerate() {
        for &v in op.operands.iter().chain(&op.results) {
            ops_of_value[v].push(oi as u32);
        }
    }
    let mut sweeps = 0;
    let mut dirty = vec![false; g.ops.len()];
    let mut changed_values = Vec::new();
    let mut scratch = StepScratch::default();
    for stage in 0..STAGES {
        // At a stage's start only the ops whose directions grew can change
        // anything (every op's last step changed nothing).
        for (oi, op) in g.ops.iter().enumerate() {
            dirty[oi] |= stage == 0
                || (!op.func_result
                    && (0..op.rule.factors.len())
                        .any(|f| direction(op, f, stage) != direction(op, f, stage - 1)));
        }
        push_func_results(g, meshes, &ops_of_value, &mut dirty, &mut scratch);
        for _ in 0..MAX_SWEEPS_PER_STAGE {
            sweeps += 1;
            let mut changed = false;
            for oi in 0..g.ops.len() {
                if !dirty[oi] || g.ops[oi].func_result {
                    continue;
                }
                dirty[oi] = false;
                changed_values.clear();
                step(g, oi, stage, meshes, &mut changed_values, &mut scratch);
                for &v in &changed_values {
                    changed = true;
                    for &other in &ops_of_value[v] {
                        dirty[other as usize] = true;
                    }
                }
            }
            if !changed {
                break;
            }
        }
        push_func_results(g, meshes, &ops_of_value, &mut dirty, &mut scratch);
    }
    sweeps
}

/// Steps every func-result edge one of whose values changed since its
/// last step, in both directions (a func-result edge always steps at the
/// last stage's directions, so an edge whose values did not change would
/// change nothing), marking the ops of the values it changed.
fn push_func_results(
    g: &mut Graph,
    meshes: &[(String, SdyMesh)],
    ops_of_value: &[Vec<u32>],
    dirty: &mut [bool],
    scratch: &mut StepScratch,
) {
    let mut changed = Vec::new();
    for oi in 0..g.ops.len() {
        if !g.ops[oi].func_result || !dirty[oi] {
            continue;
        }
        dirty[oi] = false;
        changed.clear();
        step(g, oi, STAGES - 1, meshes, &mut changed, scratch);
        for &v in &changed {
            for &other in &ops_of_value[v] {
                dirty[other as usize] = true;
            }
        }
    }
}

/// Steps op `oi`, pushing the values whose sharding it changed.
fn step(
    g: &mut Graph,
    oi: usize,
    stage: usize,
    meshes: &[(String, SdyMesh)],
    changed: &mut Vec<usize>,
    scratch: &mut StepScratch,
) {
    let op = &g.ops[oi];
    let Some(mesh_ref) = common_mesh(g, op) else {
        return;
    };
    let mesh = match &mesh_ref {
        MeshRef::Inline(m) => m,
        MeshRef::Named(n) => match meshes.iter().find(|(name, _)| name == n) {
            Some((_, m)) => m,
            None => return,
        },
    };
    let within_constants = op
        .operands
        .iter()
        .chain(&op.results)
        .all(|&v| g.values[v].constant);
    // A constant value is only a target for the ops that use it, and a
    // source only inside its own constant expression (what Shardy's
    // constant splitting gives: each use a copy that takes its user's
    // sharding back down the expression).
    let tensors: Vec<(Option<&SdySharding>, bool)> = op
        .operands
        .iter()
        .chain(&op.results)
        .map(|&v| {
            (
                g.shardings[v].as_ref(),
                !g.values[v].constant || within_constants,
            )
        })
        .collect();
    let input = StepInput {
        rule: &op.rule,
        mesh,
        tensors: &tensors,
        is_elementwise: op.class == OpClass::Elementwise,
    };
    let mut targets: Vec<(usize, SdySharding)> = Vec::new();
    propagate_step(
        &input,
        mesh_ref,
        |f| direction(op, f, stage),
        &mut targets,
        scratch,
    );
    drop(tensors);
    let operand_count = op.operands.len();
    for (tensor, s) in targets {
        let v = match tensor.checked_sub(operand_count) {
            None => op.operands[tensor],
            Some(result) => op.results[result],
        };
        g.shardings[v] = Some(s);
        changed.push(v);
    }
}

/// Collects every instruction's shardings (closed), one per value, and
/// writes the propagated in and out shardings of shard_map boundaries into
/// their attributes.
fn write_back(
    module: &mut HloModule,
    memo: &AttributeMemo<'_>,
    flow: &[CompId],
    g: &Graph,
) -> PropagatedShardings {
    let mut propagated = PropagatedShardings::default();
    // XLA's export shards every value of a while loop (Shardy's data-flow
    // edges: the loop, its operand tuple, its results, and the body's and
    // condition's parameters and results), replicated when propagation
    // left it open.
    let loop_regions: FxHashSet<CompId> = flow
        .iter()
        .flat_map(|&c| module.comp(c).instructions.iter())
        .filter(|i| i.opcode == Opcode::While)
        .flat_map(|i| i.called_computations())
        .collect();
    let fallback_mesh = memo
        .meshes
        .first()
        .map(|(name, _)| MeshRef::Named(name.clone()));
    for &c in flow {
        // A tuple made for a while loop's operand is sharded as the loop
        // (XLA's export builds it from the loop's shardings).
        let loop_of_init: FxHashMap<InstrId, InstrId> = module
            .comp(c)
            .instructions
            .iter()
            .enumerate()
            .filter(|(_, i)| i.opcode == Opcode::While && i.operands.len() == 1)
            .filter(|(_, i)| module.comp(c).instr(i.operands[0]).opcode == Opcode::Tuple)
            .map(|(w, i)| (i.operands[0], InstrId(w as u32)))
            .collect();
        let in_loop_region = loop_regions.contains(&c);
        let n = module.comp(c).instructions.len();
        for i in 0..n {
            let id = InstrId(i as u32);
            let values = g.values_owned(c, id);
            let is_loop_edge = {
                let comp = module.comp(c);
                let instr = comp.instr(id);
                let reads = |opcode: Opcode| {
                    instr.operands.first().map(|&o| comp.instr(o).opcode) == Some(opcode)
                };
                instr.opcode == Opcode::While
                    || loop_of_init.contains_key(&id)
                    || (instr.opcode == Opcode::GetTupleElement && reads(Opcode::While))
                    || (in_loop_region
                        && (instr.opcode == Opcode::Parameter
                            || (instr.opcode == Opcode::GetTupleElement
                                && reads(Opcode::Parameter))
                            || (id == comp.root && instr.opcode == Opcode::Tuple)))
            };
            let instr = module.comp(c).instr(id);
            let target = custom_call_target(instr).map(str::to_string);
            match target.as_deref() {
                Some("xla.sdy.GlobalToLocalShape") => {
                    write_pinned(module, memo, c, id, g, IN_SHARDINGS);
                    continue;
                }
                Some("xla.sdy.LocalToGlobalShape") => {
                    write_pinned(module, memo, c, id, g, OUT_SHARDINGS);
                    continue;
                }
                Some("xla.sdy.ShardingGroup") => continue,
                _ => {}
            }
            let values = match loop_of_init.get(&id) {
                Some(&w) => g.values_owned(c, w),
                None => returned_values(module, c, id, g).unwrap_or(values),
            };
            let shardings: Vec<Option<&SdySharding>> = values
                .iter()
                .map(|v| v.and_then(|v| g.shardings[v].as_ref()))
                .collect();
            let meaningful = |s: &&SdySharding| {
                !(s.dims.iter().all(|d| d.open && d.axes.is_empty())
                    && s.replicated.is_empty()
                    && s.unreduced.is_empty())
                    || s.dims.is_empty()
            };
            let mesh = shardings
                .iter()
                .flatten()
                .find(|s| meaningful(s))
                .map(|s| s.mesh.clone());
            let Some(mesh) = mesh.or_else(|| fallback_mesh.clone().filter(|_| is_loop_edge)) else {
                continue;
            };
            let leaves: Vec<SdySharding> = shardings
                .iter()
                .zip(&values)
                .map(|(s, v)| {
                    let rank = v.map(|v| g.values[v].rank as usize).unwrap_or(0);
                    match s {
                        Some(s) => close(s),
                        None => SdySharding::all_open(mesh.clone(), rank),
                    }
                })
                .collect();
            propagated.set(c, id, leaves);
        }
    }
    propagated
}

/// Sets `key` among `instr`'s frontend attributes (added, or replaced).
fn set_frontend_attribute(instr: &mut HloInstruction, key: &str, value: String) {
    let mut attributes = match instr.attr(AttrKey::FrontendAttributes) {
        Some(AttrValue::Raw(raw)) => FrontendAttributes::parse(raw).unwrap_or(FrontendAttributes {
            entries: Vec::new(),
        }),
        _ => FrontendAttributes {
            entries: Vec::new(),
        },
    };
    attributes.set(key, value);
    instr.set_attr(
        AttrKey::FrontendAttributes,
        AttrValue::Raw(attributes.to_string().into()),
    );
}

/// Writes the propagated in or out shardings (`key`) of a partially manual
/// shard_map boundary: what propagation added on its free axes.
fn write_pinned(
    module: &mut HloModule,
    memo: &AttributeMemo<'_>,
    c: CompId,
    id: InstrId,
    g: &Graph,
    key: &'static str,
) {
    let Some(pinned) = g.pinned_of.get(&(c.0, id.0)) else {
        return;
    };
    let instr = module.comp(c).instr(id);
    let Some(before) = memo.shardings(instr, key) else {
        return;
    };
    let leaves: Vec<SdySharding> = before
        .iter()
        .enumerate()
        .map(|(k, old)| {
            match pinned
                .get(k)
                .copied()
                .flatten()
                .and_then(|p| g.shardings[p].as_ref())
            {
                Some(s) => close(s),
                None => old.clone(),
            }
        })
        .collect();
    set_frontend_attribute(
        module.comp_mut(c).instr_mut(id),
        key,
        sdy::print_sharding_per_value(&leaves),
    );
}

/// The values of a tuple that is not its computation's root, with each
/// func-result constraint replaced by the value it constrains: XLA exports
/// `xla.sdy.FuncResultSharding` away, so such a tuple holds the values with
/// their own shardings (the result sharding stays on the root).
fn returned_values(
    module: &HloModule,
    c: CompId,
    id: InstrId,
    g: &Graph,
) -> Option<Vec<Option<usize>>> {
    let comp = module.comp(c);
    let instr = comp.instr(id);
    if instr.opcode != Opcode::Tuple || comp.root == id {
        return None;
    }
    let mut changed = false;
    let values = instr
        .operands
        .iter()
        .map(|&o| {
            let operand = comp.instr(o);
            let o = match operand.operands.as_slice() {
                [inner] if custom_call_target(operand) == Some(FUNC_RESULT) => {
                    changed = true;
                    *inner
                }
                _ => o,
            };
            match g.values_owned(c, o).as_slice() {
                [single] if !matches!(comp.instr(o).shape, Shape::Tuple(_)) => *single,
                _ => None,
            }
        })
        .collect();
    changed.then_some(values)
}

/// The sharding with every dimension closed, except dimensions that are
/// open with no axes (those say nothing).
fn close(s: &SdySharding) -> SdySharding {
    let mut out = s.clone();
    for d in &mut out.dims {
        if !d.axes.is_empty() {
            d.open = false;
        }
        d.priority = None;
    }
    out
}

/// Every Shardy attribute propagation reads parses (the rest of the checks
/// are the verifier's and `shardy-import`'s); nothing is read leniently
/// and then overwritten.
fn check_attributes(module: &HloModule, flow: &[CompId]) -> Result<(), String> {
    for &c in flow {
        let comp = module.comp(c);
        for instr in &comp.instructions {
            let Some(AttrValue::Raw(raw)) = instr.attr(AttrKey::FrontendAttributes) else {
                continue;
            };
            if !raw.contains("xla.sdy.") {
                continue;
            }
            let at = |message: String| {
                format!("sdy-propagation: {}/{}: {message}", comp.name, instr.name)
            };
            let attributes = FrontendAttributes::parse(raw)
                .map_err(|e| at(format!("frontend_attributes {e}")))?;
            for key in [SHARDING, IN_SHARDINGS, OUT_SHARDINGS] {
                if let Some(entry) = attributes.get(key) {
                    sdy::parse_shardings(&entry.value)
                        .map_err(|e| at(format!("attribute {key}: {e} in \"{}\"", entry.value)))?;
                }
            }
        }
    }
    Ok(())
}

/// Runs Shardy propagation on a module with Shardy annotations; returns
/// what it did and the shardings it settled (for `shardy_import`). A module
/// without `xla.sdy` shardings is left alone.
pub fn propagate_module(
    module: &mut HloModule,
) -> Result<(SdyPropagationStats, PropagatedShardings), String> {
    let meshes = match module.config.frontend_attributes.as_deref() {
        Some(raw) => {
            let attributes = FrontendAttributes::parse(raw)
                .map_err(|e| format!("sdy-propagation: module frontend_attributes {e}"))?;
            match attributes.get("xla.sdy.meshes") {
                Some(entry) => sdy::parse_meshes(&entry.value).map_err(|e| {
                    format!(
                        "sdy-propagation: attribute xla.sdy.meshes: {e} in \"{}\"",
                        entry.value
                    )
                })?,
                None => Vec::new(),
            }
        }
        None => Vec::new(),
    };
    if meshes.is_empty() {
        return Ok(Default::default());
    }
    let partial_bodies: Vec<ManualBody> = find_manual_bodies(module)?
        .into_iter()
        .filter(|b| {
            let mesh = match &b.mesh {
                Some(MeshRef::Inline(m)) => Some(m),
                Some(MeshRef::Named(n)) => {
                    meshes.iter().find(|(name, _)| name == n).map(|(_, m)| m)
                }
                None => None,
            };
            mesh.is_some_and(|m| {
                m.axes
                    .iter()
                    .any(|(axis, size)| *size > 1 && !b.axes.contains(axis))
            })
        })
        .collect();
    let flow = flow_computations(module, &partial_bodies);
    check_attributes(module, &flow)?;
    let memo = AttributeMemo::new(&meshes);
    let mut g = build_graph(module, &memo, &flow, &partial_bodies, &meshes);
    apply_constraints(module, &memo, &flow, &mut g);
    let sharded_before = g.shardings.iter().filter(|s| s.is_some()).count();
    let sweeps = propagate(&mut g, &meshes);
    let propagated = write_back(module, &memo, &flow, &g);
    let stats = SdyPropagationStats {
        values: g.values.len(),
        ops: g.ops.len(),
        sharded_before,
        sharded_after: g.shardings.iter().filter(|s| s.is_some()).count(),
        sweeps,
    };
    Ok((stats, propagated))
}
