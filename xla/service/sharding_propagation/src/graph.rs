//! The module seen as one graph for propagation: every instruction gets a
//! global index (`Node`), with side tables for users, each computation's
//! post order (XLA's `MakeInstructionPostOrder`), which instruction calls
//! each partitioned computation (while bodies and conditions, conditional
//! branches, called computations), shape classes and the level each node
//! propagates from.
//!
//! Invariants: built once per run and read-only afterwards (the pass never
//! adds or removes instructions while propagating); users lists hold each
//! user once, in instruction order; post orders contain every instruction.

use crate::opcodes::{min_propagation_level, partitioned_callees};
use rustc_hash::FxHashMap;
use xla_hlo_ir::{AttrKey, CompId, HloInstruction, HloModule, InstrId, Opcode, Shape};

/// A global instruction index.
pub(crate) type Node = u32;

pub(crate) struct Graph<'m> {
    pub module: &'m HloModule,
    /// First node of each computation.
    offsets: Vec<u32>,
    /// For each node, its computation.
    comp_of: Vec<CompId>,
    /// Users of each node (same computation), in order.
    users: Vec<Vec<Node>>,
    /// Each computation's post order.
    pub post_orders: Vec<Vec<Node>>,
    /// Partitioned called computation -> calling node.
    pub caller: FxHashMap<CompId, Node>,
    /// Every node's instruction.
    instrs: Vec<&'m HloInstruction>,
    /// Every node's opcode (read far more often than the rest of it).
    opcodes: Vec<Opcode>,
    /// The operands of node `n` as nodes: `operand_nodes[operand_starts[n]
    /// ..operand_starts[n + 1]]`.
    operand_starts: Vec<u32>,
    operand_nodes: Vec<Node>,
    /// Custom-call kind of every node.
    custom_call_kinds: Vec<CustomCallKind>,
    /// Parameters of the computations each node calls.
    callee_params: Vec<Vec<Node>>,
    /// Whether the node's computation is called by a while/conditional/call.
    partitioned_callee: Vec<bool>,
    /// Root of each node's computation.
    roots: Vec<Node>,
    /// Shapes ignoring element types, interned: equal ids = compatible.
    shape_class: Vec<u32>,
    /// Lowest aggressiveness level at which sharding passes through the
    /// node (XLA's `CanPropagateThroughAtAggressiveLevel`).
    min_level: Vec<i64>,
    /// Some user of the node is a broadcast.
    broadcast_user: Vec<bool>,
}

/// Custom-call targets the rules distinguish.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CustomCallKind {
    None,
    Sharding,
    FullToShard,
    ShardToFull,
    /// `ShardBarrierFrom`: shardings pass backward only (from its users to
    /// its operand), never forward; removed after propagation.
    ShardBarrierFrom,
    /// `ShardBarrierTo`: shardings pass forward only; its users make it (and
    /// so its operand) replicated; removed after propagation.
    ShardBarrierTo,
    Other,
}

/// Depth-first search marks for the post order.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Visit {
    New,
    /// On the stack, its operands being visited.
    Open,
    Done,
}

fn custom_call_kind_of(instr: &HloInstruction) -> CustomCallKind {
    // Only a custom-call's attributes are read: most instructions' are
    // never touched.
    if instr.opcode != Opcode::CustomCall {
        return CustomCallKind::None;
    }
    match (instr.opcode, instr.ident_attr(AttrKey::CustomCallTarget)) {
        (Opcode::CustomCall, Some("Sharding")) => CustomCallKind::Sharding,
        (Opcode::CustomCall, Some("SPMDFullToShardShape")) => CustomCallKind::FullToShard,
        (Opcode::CustomCall, Some("SPMDShardToFullShape")) => CustomCallKind::ShardToFull,
        (Opcode::CustomCall, Some("ShardBarrierFrom")) => CustomCallKind::ShardBarrierFrom,
        (Opcode::CustomCall, Some("ShardBarrierTo")) => CustomCallKind::ShardBarrierTo,
        (Opcode::CustomCall, _) => CustomCallKind::Other,
        _ => CustomCallKind::None,
    }
}

/// The users of every node, in instruction order, each once.
fn users_of_every_node(module: &HloModule, offsets: &[u32], node_count: usize) -> Vec<Vec<Node>> {
    let mut users = vec![Vec::new(); node_count];
    for (comp_index, comp) in module.computations.iter().enumerate() {
        let offset = offsets[comp_index];
        for (i, instr) in comp.instructions.iter().enumerate() {
            let user = offset + i as u32;
            for &operand in &instr.operands {
                if operand.index() >= comp.instructions.len() {
                    continue;
                }
                let list: &mut Vec<Node> = &mut users[(offset + operand.0) as usize];
                // Users are visited in order, so a repeat is the last entry.
                if list.last() != Some(&user) {
                    list.push(user);
                }
            }
        }
    }
    users
}

/// Interned shape classes: equal ids for shapes with the same dims and
/// tuple structure.
#[derive(Default)]
struct ShapeClasses {
    ids: FxHashMap<Vec<i64>, u32>,
    key: Vec<i64>,
}

impl ShapeClasses {
    fn intern(&mut self, shape: &Shape) -> u32 {
        self.key.clear();
        shape_key(shape, &mut self.key);
        if let Some(&id) = self.ids.get(&self.key) {
            return id;
        }
        let id = self.ids.len() as u32;
        self.ids.insert(self.key.clone(), id);
        id
    }
}

impl<'m> Graph<'m> {
    pub fn new(module: &'m HloModule) -> Graph<'m> {
        let mut offsets = Vec::with_capacity(module.computations.len());
        let mut comp_of = Vec::new();
        let mut node_count = 0u32;
        for (comp_index, comp) in module.computations.iter().enumerate() {
            offsets.push(node_count);
            node_count += comp.instructions.len() as u32;
            comp_of.extend(std::iter::repeat_n(
                CompId(comp_index as u32),
                comp.instructions.len(),
            ));
        }
        let node_count = node_count as usize;
        let users = users_of_every_node(module, &offsets, node_count);
        // One pass over the instructions for everything read from them.
        let mut instrs: Vec<&'m HloInstruction> = Vec::with_capacity(node_count);
        let mut custom_call_kinds = Vec::with_capacity(node_count);
        let mut min_level = Vec::with_capacity(node_count);
        let mut opcodes = Vec::with_capacity(node_count);
        let mut shape_class = Vec::with_capacity(node_count);
        let mut classes = ShapeClasses::default();
        let mut operand_starts = Vec::with_capacity(node_count + 1);
        let mut operand_nodes = Vec::with_capacity(node_count * 2);
        for (comp, &offset) in module.computations.iter().zip(&offsets) {
            for instr in &comp.instructions {
                let kind = custom_call_kind_of(instr);
                instrs.push(instr);
                custom_call_kinds.push(kind);
                min_level.push(min_propagation_level(
                    instr.opcode,
                    kind == CustomCallKind::Sharding,
                ));
                opcodes.push(instr.opcode);
                shape_class.push(classes.intern(&instr.shape));
                operand_starts.push(operand_nodes.len() as u32);
                operand_nodes.extend(instr.operands.iter().map(|operand| offset + operand.0));
            }
        }
        let broadcast_user = users
            .iter()
            .map(|list| {
                list.iter()
                    .any(|&user| opcodes[user as usize] == Opcode::Broadcast)
            })
            .collect();
        operand_starts.push(operand_nodes.len() as u32);
        let mut graph = Graph {
            module,
            offsets,
            comp_of,
            users,
            post_orders: Vec::new(),
            caller: FxHashMap::default(),
            instrs,
            opcodes,
            operand_starts,
            operand_nodes,
            custom_call_kinds,
            callee_params: vec![Vec::new(); node_count],
            partitioned_callee: vec![false; node_count],
            roots: Vec::with_capacity(node_count),
            shape_class,
            min_level,
            broadcast_user,
        };
        graph.post_orders = (0..module.computations.len())
            .map(|comp| graph.post_order(CompId(comp as u32)))
            .collect();
        graph.find_callers();
        graph.find_roots_and_callee_params();
        graph
    }

    /// Maps each partitioned callee to the instruction calling it (the
    /// last one, if several do).
    fn find_callers(&mut self) {
        for (comp_index, comp) in self.module.computations.iter().enumerate() {
            for (i, instr) in comp.instructions.iter().enumerate() {
                let node = self.offsets[comp_index] + i as u32;
                for callee in partitioned_callees(instr) {
                    self.caller.insert(callee, node);
                }
            }
        }
    }

    /// Each node's computation root, whether its computation is a
    /// partitioned callee, and the parameters of the computations it calls.
    fn find_roots_and_callee_params(&mut self) {
        let module = self.module;
        for node in 0..self.num_nodes() {
            let comp = self.comp_of[node];
            self.partitioned_callee[node] = self.caller.contains_key(&comp);
            let root = self.offsets[comp.index()] + module.comp(comp).root.0;
            self.roots.push(root);
            let instr = self.instrs[node];
            let calls_any = instr.attrs.iter().any(|attr| {
                matches!(
                    attr.value,
                    xla_hlo_ir::AttrValue::Computation(_) | xla_hlo_ir::AttrValue::Computations(_)
                )
            });
            if !calls_any {
                continue;
            }
            let called = instr.called_computations();
            if !called.is_empty() {
                let mut params = Vec::new();
                for callee in called {
                    let callee_comp = module.comp(callee);
                    params.extend(
                        callee_comp
                            .parameters
                            .iter()
                            .filter(|p| p.index() < callee_comp.instructions.len())
                            .map(|p| self.offsets[callee.index()] + p.0),
                    );
                }
                self.callee_params[node] = params;
            }
        }
    }

    /// XLA's post order: DFS from each instruction without users (in
    /// instruction order), operands first-to-last, control predecessors first.
    fn post_order(&self, comp_id: CompId) -> Vec<Node> {
        let comp = self.module.comp(comp_id);
        let count = comp.instructions.len();
        let offset = self.offsets[comp_id.index()];
        let mut visit = vec![Visit::New; count];
        let mut order = Vec::with_capacity(count);
        let mut stack: Vec<usize> = Vec::new();
        for start in 0..count {
            if !self.users[offset as usize + start].is_empty() || visit[start] == Visit::Done {
                continue;
            }
            stack.push(start);
            while let Some(&current) = stack.last() {
                match visit[current] {
                    Visit::New => {
                        visit[current] = Visit::Open;
                        let instr = &comp.instructions[current];
                        for operand in instr.operands.iter().rev() {
                            if operand.index() < count && visit[operand.index()] != Visit::Done {
                                stack.push(operand.index());
                            }
                        }
                        for predecessor in &instr.control_predecessors {
                            if predecessor.index() < count
                                && visit[predecessor.index()] != Visit::Done
                            {
                                stack.push(predecessor.index());
                            }
                        }
                    }
                    Visit::Open => {
                        stack.pop();
                        visit[current] = Visit::Done;
                        order.push(offset + current as u32);
                    }
                    Visit::Done => {
                        stack.pop();
                    }
                }
            }
        }
        // Anything unreachable (cycles through control edges) in arena order.
        for (i, mark) in visit.iter().enumerate() {
            if *mark != Visit::Done {
                order.push(offset + i as u32);
            }
        }
        order
    }

    pub fn num_nodes(&self) -> usize {
        self.comp_of.len()
    }
    pub fn node(&self, comp: CompId, id: InstrId) -> Node {
        self.offsets[comp.index()] + id.0
    }
    pub fn comp_of(&self, node: Node) -> CompId {
        self.comp_of[node as usize]
    }
    pub fn local(&self, node: Node) -> InstrId {
        InstrId(node - self.offsets[self.comp_of(node).index()])
    }
    pub fn instr(&self, node: Node) -> &'m HloInstruction {
        self.instrs[node as usize]
    }
    /// Same dims (and tuple structure) ignoring element types and layouts.
    pub fn compatible_shapes(&self, a: Node, b: Node) -> bool {
        self.shape_class[a as usize] == self.shape_class[b as usize]
    }
    pub fn min_level(&self, node: Node) -> i64 {
        self.min_level[node as usize]
    }
    pub fn has_broadcast_user(&self, node: Node) -> bool {
        self.broadcast_user[node as usize]
    }
    pub fn comp_index(&self, node: Node) -> u32 {
        self.comp_of[node as usize].0
    }
    pub fn custom_call_kind(&self, node: Node) -> CustomCallKind {
        self.custom_call_kinds[node as usize]
    }
    /// Parameters of the computations `node` calls.
    pub fn callee_params(&self, node: Node) -> &[Node] {
        &self.callee_params[node as usize]
    }
    pub fn shape(&self, node: Node) -> &'m Shape {
        &self.instr(node).shape
    }
    pub fn opcode(&self, node: Node) -> Opcode {
        self.opcodes[node as usize]
    }
    /// The node's operands as nodes, in operand order.
    pub fn operand_nodes(&self, node: Node) -> &[Node] {
        let start = self.operand_starts[node as usize] as usize;
        let end = self.operand_starts[node as usize + 1] as usize;
        &self.operand_nodes[start..end]
    }
    pub fn operands(&self, node: Node) -> impl Iterator<Item = Node> + '_ {
        self.operand_nodes(node).iter().copied()
    }
    pub fn operand(&self, node: Node, index: usize) -> Option<Node> {
        self.operand_nodes(node).get(index).copied()
    }
    pub fn operand_count(&self, node: Node) -> usize {
        self.operand_nodes(node).len()
    }
    /// Index of the first operand of `user` that is `operand`.
    pub fn operand_index(&self, user: Node, operand: Node) -> Option<usize> {
        self.operands(user).position(|o| o == operand)
    }
    pub fn users(&self, node: Node) -> &[Node] {
        &self.users[node as usize]
    }
    pub fn root_of(&self, comp: CompId) -> Node {
        self.node(comp, self.module.comp(comp).root)
    }
    pub fn is_root(&self, node: Node) -> bool {
        self.roots[node as usize] == node
    }
    pub fn entry_root(&self) -> Node {
        self.root_of(self.module.entry)
    }
    pub fn parameter(&self, comp: CompId, number: usize) -> Option<Node> {
        self.module
            .comp(comp)
            .parameters
            .get(number)
            .map(|&parameter| self.node(comp, parameter))
    }
    /// Users that are not the computation's root.
    pub fn non_root_users(&self, node: Node) -> usize {
        let root = self.roots[node as usize];
        self.users(node)
            .iter()
            .filter(|&&user| user != root)
            .count()
    }
    pub fn is_custom_call(&self, node: Node, target: &str) -> bool {
        let instr = self.instr(node);
        instr.opcode == Opcode::CustomCall
            && instr.ident_attr(AttrKey::CustomCallTarget) == Some(target)
    }
    pub fn is_manual_conversion(&self, node: Node) -> bool {
        matches!(
            self.custom_call_kinds[node as usize],
            CustomCallKind::FullToShard | CustomCallKind::ShardToFull
        )
    }
    pub fn custom_call_target(&self, node: Node) -> Option<&'m str> {
        let instr = self.instr(node);
        (instr.opcode == Opcode::CustomCall)
            .then(|| instr.ident_attr(AttrKey::CustomCallTarget))
            .flatten()
    }
    /// The argument a parameter of a conditional branch or called
    /// computation receives from its caller (`None` for while parameters
    /// and computations no while/conditional/call partitions).
    pub fn caller_argument(&self, parameter: Node) -> Option<Node> {
        let comp = self.comp_of(parameter);
        let &caller = self.caller.get(&comp)?;
        match self.opcode(caller) {
            Opcode::Conditional => {
                let branches = self.instr(caller).called_computations();
                let branch = branches.iter().position(|&c| c == comp)?;
                self.operand(caller, branch + 1)
            }
            Opcode::Call => {
                let number = self.instr(parameter).parameter_number.unwrap_or(0).max(0) as usize;
                self.operand(caller, number)
            }
            _ => None,
        }
    }
    /// The computation `node` belongs to is called by a while, conditional or call.
    pub fn in_partitioned_callee(&self, node: Node) -> bool {
        self.partitioned_callee[node as usize]
    }
}

/// Markers in a shape key, distinct from every dim size (sizes are never
/// negative).
const TUPLE_MARKER: i64 = -1;
const ARRAY_MARKER: i64 = -2;
const TOKEN_MARKER: i64 = -3;

/// A key equal for shapes with the same dims and tuple structure
/// (element types and layouts ignored; tokens distinct).
fn shape_key(shape: &Shape, key: &mut Vec<i64>) {
    match shape {
        Shape::Tuple(elements) => {
            key.push(TUPLE_MARKER);
            key.push(elements.len() as i64);
            for element in elements {
                shape_key(element, key);
            }
        }
        _ if shape.is_token() => key.push(TOKEN_MARKER),
        _ => {
            key.push(ARRAY_MARKER);
            key.push(shape.rank() as i64);
            key.extend_from_slice(shape.dims());
        }
    }
}
