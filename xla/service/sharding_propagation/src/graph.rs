//! The module seen as one graph for propagation: every instruction gets a
//! global index (`Node`), with side tables for users, each computation's
//! post order (XLA's `MakeInstructionPostOrder`), which instruction calls
//! each partitioned computation (while bodies and conditions, conditional
//! branches, called computations), and opcode predicates.
//!
//! Invariants: built once per run and read-only afterwards (the pass never
//! adds or removes instructions while propagating); users lists hold each
//! user once, in instruction order; post orders contain every instruction.

use crate::opcodes::min_propagation_level;
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
    /// Custom-call kind of every node.
    cc: Vec<CustomCallKind>,
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
    Other,
}

impl<'m> Graph<'m> {
    pub fn new(module: &'m HloModule) -> Graph<'m> {
        let mut offsets = Vec::with_capacity(module.computations.len());
        let mut comp_of = Vec::new();
        let mut total = 0u32;
        for (ci, c) in module.computations.iter().enumerate() {
            offsets.push(total);
            total += c.instructions.len() as u32;
            comp_of.extend(std::iter::repeat_n(CompId(ci as u32), c.instructions.len()));
        }
        let mut users = vec![Vec::new(); total as usize];
        for (ci, c) in module.computations.iter().enumerate() {
            let off = offsets[ci];
            for (i, instr) in c.instructions.iter().enumerate() {
                let me = off + i as u32;
                for &op in &instr.operands {
                    if op.index() >= c.instructions.len() {
                        continue;
                    }
                    let list: &mut Vec<Node> = &mut users[(off + op.0) as usize];
                    // Users are visited in order, so a repeat is the last entry.
                    if list.last() != Some(&me) {
                        list.push(me);
                    }
                }
            }
        }
        let mut instrs = Vec::with_capacity(total as usize);
        let mut cc = Vec::with_capacity(total as usize);
        for c in &module.computations {
            for i in &c.instructions {
                instrs.push(i);
                cc.push(match (i.opcode, i.ident_attr(AttrKey::CustomCallTarget)) {
                    (Opcode::CustomCall, Some("Sharding")) => CustomCallKind::Sharding,
                    (Opcode::CustomCall, Some("SPMDFullToShardShape")) => {
                        CustomCallKind::FullToShard
                    }
                    (Opcode::CustomCall, Some("SPMDShardToFullShape")) => {
                        CustomCallKind::ShardToFull
                    }
                    (Opcode::CustomCall, _) => CustomCallKind::Other,
                    _ => CustomCallKind::None,
                });
            }
        }
        let mut g = Graph {
            module,
            offsets,
            comp_of,
            users,
            post_orders: Vec::new(),
            caller: FxHashMap::default(),
            instrs,
            cc,
            callee_params: vec![Vec::new(); total as usize],
            partitioned_callee: vec![false; total as usize],
            roots: Vec::with_capacity(total as usize),
            shape_class: Vec::with_capacity(total as usize),
            min_level: Vec::with_capacity(total as usize),
            broadcast_user: Vec::with_capacity(total as usize),
        };
        for x in 0..total as usize {
            g.min_level.push(min_propagation_level(
                g.instrs[x].opcode,
                g.cc[x] == CustomCallKind::Sharding,
            ));
            let bu = g.users[x]
                .iter()
                .any(|&u| g.instrs[u as usize].opcode == Opcode::Broadcast);
            g.broadcast_user.push(bu);
        }
        let mut classes: FxHashMap<Vec<i64>, u32> = FxHashMap::default();
        let mut key = Vec::new();
        for x in 0..total as usize {
            key.clear();
            shape_key(&g.instrs[x].shape, &mut key);
            let id = match classes.get(&key) {
                Some(&id) => id,
                None => {
                    let id = classes.len() as u32;
                    classes.insert(key.clone(), id);
                    id
                }
            };
            g.shape_class.push(id);
        }
        g.post_orders = (0..module.computations.len())
            .map(|c| g.post_order(CompId(c as u32)))
            .collect();
        for ci in 0..module.computations.len() {
            let comp = &module.computations[ci];
            for (i, instr) in comp.instructions.iter().enumerate() {
                let node = g.offsets[ci] + i as u32;
                match instr.opcode {
                    Opcode::While => {
                        for key in [AttrKey::Body, AttrKey::Condition] {
                            if let Some(c) = instr.computation_attr(key) {
                                g.caller.insert(c, node);
                            }
                        }
                    }
                    Opcode::Conditional | Opcode::Call => {
                        for c in instr.called_computations() {
                            g.caller.insert(c, node);
                        }
                    }
                    _ => {}
                }
            }
        }
        for x in 0..total {
            let c = g.comp_of[x as usize];
            g.partitioned_callee[x as usize] = g.caller.contains_key(&c);
            let root = g.offsets[c.index()] + module.comp(c).root.0;
            g.roots.push(root);
            let instr = g.instrs[x as usize];
            let calls_any = instr.attrs.iter().any(|a| {
                matches!(
                    a.value,
                    xla_hlo_ir::AttrValue::Computation(_) | xla_hlo_ir::AttrValue::Computations(_)
                )
            });
            if !calls_any {
                continue;
            }
            let called = instr.called_computations();
            if !called.is_empty() {
                let mut params = Vec::new();
                for cc in called {
                    let comp = module.comp(cc);
                    params.extend(
                        comp.parameters
                            .iter()
                            .filter(|p| p.index() < comp.instructions.len())
                            .map(|p| g.offsets[cc.index()] + p.0),
                    );
                }
                g.callee_params[x as usize] = params;
            }
        }
        g
    }

    /// XLA's post order: DFS from each instruction without users (in
    /// instruction order), operands first-to-last, control predecessors first.
    fn post_order(&self, c: CompId) -> Vec<Node> {
        let comp = self.module.comp(c);
        let n = comp.instructions.len();
        let off = self.offsets[c.index()];
        let mut state = vec![0u8; n]; // 0 new, 1 visiting, 2 visited
        let mut out = Vec::with_capacity(n);
        let mut stack: Vec<usize> = Vec::new();
        for start in 0..n {
            if !self.users[off as usize + start].is_empty() || state[start] == 2 {
                continue;
            }
            stack.push(start);
            while let Some(&cur) = stack.last() {
                match state[cur] {
                    0 => {
                        state[cur] = 1;
                        let instr = &comp.instructions[cur];
                        for op in instr.operands.iter().rev() {
                            if op.index() < n && state[op.index()] != 2 {
                                stack.push(op.index());
                            }
                        }
                        for p in &instr.control_predecessors {
                            if p.index() < n && state[p.index()] != 2 {
                                stack.push(p.index());
                            }
                        }
                    }
                    1 => {
                        stack.pop();
                        state[cur] = 2;
                        out.push(off + cur as u32);
                    }
                    _ => {
                        stack.pop();
                    }
                }
            }
        }
        // Anything unreachable (cycles through control edges) in arena order.
        for (i, s) in state.iter().enumerate() {
            if *s != 2 {
                out.push(off + i as u32);
            }
        }
        out
    }

    pub fn num_nodes(&self) -> usize {
        self.comp_of.len()
    }
    pub fn node(&self, c: CompId, i: InstrId) -> Node {
        self.offsets[c.index()] + i.0
    }
    pub fn comp_of(&self, n: Node) -> CompId {
        self.comp_of[n as usize]
    }
    pub fn local(&self, n: Node) -> InstrId {
        InstrId(n - self.offsets[self.comp_of(n).index()])
    }
    pub fn instr(&self, n: Node) -> &'m HloInstruction {
        self.instrs[n as usize]
    }
    /// Same dims (and tuple structure) ignoring element types and layouts.
    pub fn compatible_shapes(&self, a: Node, b: Node) -> bool {
        self.shape_class[a as usize] == self.shape_class[b as usize]
    }
    pub fn min_level(&self, n: Node) -> i64 {
        self.min_level[n as usize]
    }
    pub fn has_broadcast_user(&self, n: Node) -> bool {
        self.broadcast_user[n as usize]
    }
    pub fn comp_index(&self, n: Node) -> u32 {
        self.comp_of[n as usize].0
    }
    pub fn custom_call_kind(&self, n: Node) -> CustomCallKind {
        self.cc[n as usize]
    }
    /// Parameters of the computations `n` calls.
    pub fn callee_params(&self, n: Node) -> &[Node] {
        &self.callee_params[n as usize]
    }
    pub fn shape(&self, n: Node) -> &'m Shape {
        &self.instr(n).shape
    }
    pub fn opcode(&self, n: Node) -> Opcode {
        self.instr(n).opcode
    }
    pub fn operands(&self, n: Node) -> impl Iterator<Item = Node> + '_ {
        let c = self.comp_of(n);
        let off = self.offsets[c.index()];
        self.instr(n).operands.iter().map(move |o| off + o.0)
    }
    pub fn operand(&self, n: Node, i: usize) -> Option<Node> {
        let c = self.comp_of(n);
        self.instr(n)
            .operands
            .get(i)
            .map(|o| self.offsets[c.index()] + o.0)
    }
    pub fn operand_count(&self, n: Node) -> usize {
        self.instr(n).operands.len()
    }
    /// Index of the first operand of `user` that is `n`.
    pub fn operand_index(&self, user: Node, n: Node) -> Option<usize> {
        self.operands(user).position(|o| o == n)
    }
    pub fn users(&self, n: Node) -> &[Node] {
        &self.users[n as usize]
    }
    pub fn root_of(&self, c: CompId) -> Node {
        self.node(c, self.module.comp(c).root)
    }
    pub fn is_root(&self, n: Node) -> bool {
        self.roots[n as usize] == n
    }
    pub fn entry_root(&self) -> Node {
        self.root_of(self.module.entry)
    }
    pub fn parameter(&self, c: CompId, i: usize) -> Option<Node> {
        self.module
            .comp(c)
            .parameters
            .get(i)
            .map(|p| self.node(c, *p))
    }
    /// Users that are not the computation's root.
    pub fn non_root_users(&self, n: Node) -> usize {
        let root = self.roots[n as usize];
        self.users(n).iter().filter(|&&u| u != root).count()
    }
    pub fn is_custom_call(&self, n: Node, target: &str) -> bool {
        let i = self.instr(n);
        i.opcode == Opcode::CustomCall && i.ident_attr(AttrKey::CustomCallTarget) == Some(target)
    }
    pub fn is_manual_conversion(&self, n: Node) -> bool {
        matches!(
            self.cc[n as usize],
            CustomCallKind::FullToShard | CustomCallKind::ShardToFull
        )
    }
    pub fn custom_call_target(&self, n: Node) -> Option<&'m str> {
        let i = self.instr(n);
        (i.opcode == Opcode::CustomCall)
            .then(|| i.ident_attr(AttrKey::CustomCallTarget))
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
    /// The computation `n` belongs to is called by a while, conditional or call.
    pub fn in_partitioned_callee(&self, n: Node) -> bool {
        self.partitioned_callee[n as usize]
    }
}

/// A key equal for shapes with the same dims and tuple structure
/// (element types and layouts ignored; tokens distinct).
fn shape_key(s: &Shape, out: &mut Vec<i64>) {
    match s {
        Shape::Tuple(e) => {
            out.push(-1);
            out.push(e.len() as i64);
            for x in e {
                shape_key(x, out);
            }
        }
        _ if s.is_token() => out.push(-3),
        _ => {
            out.push(-2);
            out.push(s.rank() as i64);
            out.extend_from_slice(s.dims());
        }
    }
}
