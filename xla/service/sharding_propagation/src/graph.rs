//! The module seen as one graph for propagation: every instruction gets a
//! global index (`Node`), with side tables for users, each computation's
//! post order (XLA's `MakeInstructionPostOrder`), which instruction calls
//! each partitioned computation (while bodies and conditions, conditional
//! branches, called computations), and opcode predicates.
//!
//! Invariants: built once per run and read-only afterwards (the pass never
//! adds or removes instructions while propagating); users lists hold each
//! user once, in instruction order; post orders contain every instruction.

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
                    if !list.contains(&me) {
                        list.push(me);
                    }
                }
            }
        }
        let mut g = Graph {
            module,
            offsets,
            comp_of,
            users,
            post_orders: Vec::new(),
            caller: FxHashMap::default(),
        };
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
        let c = self.comp_of(n);
        self.module.comp(c).instr(self.local(n))
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
        self.root_of(self.comp_of(n)) == n
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
        let root = self.root_of(self.comp_of(n));
        self.users(n).iter().filter(|&&u| u != root).count()
    }
    pub fn is_custom_call(&self, n: Node, target: &str) -> bool {
        let i = self.instr(n);
        i.opcode == Opcode::CustomCall && i.ident_attr(AttrKey::CustomCallTarget) == Some(target)
    }
    pub fn custom_call_target(&self, n: Node) -> Option<&'m str> {
        let i = self.instr(n);
        (i.opcode == Opcode::CustomCall)
            .then(|| i.ident_attr(AttrKey::CustomCallTarget))
            .flatten()
    }
    /// The computation `n` belongs to is called by a while, conditional or call.
    pub fn in_partitioned_callee(&self, n: Node) -> bool {
        self.caller.contains_key(&self.comp_of(n))
    }
}

/// XLA's `IsElementwise` for the opcodes propagation cares about.
pub(crate) fn is_elementwise(op: Opcode) -> bool {
    op.is_elementwise() || matches!(op, Opcode::Map | Opcode::Rng)
}

/// XLA's `HasSideEffect` (approximation sufficient for propagation).
pub(crate) fn has_side_effect(i: &HloInstruction) -> bool {
    match i.opcode {
        Opcode::Send
        | Opcode::SendDone
        | Opcode::Recv
        | Opcode::RecvDone
        | Opcode::Infeed
        | Opcode::Outfeed
        | Opcode::Rng
        | Opcode::RngGetAndUpdateState
        | Opcode::AfterAll
        | Opcode::AddDependency => true,
        Opcode::CustomCall => i
            .bool_attr(AttrKey::CustomCallHasSideEffect)
            .unwrap_or(false),
        _ => false,
    }
}

/// Same dims (ignoring element types and layouts), recursively for tuples.
pub(crate) fn compatible_ignoring_element_type(a: &Shape, b: &Shape) -> bool {
    match (a, b) {
        (Shape::Tuple(x), Shape::Tuple(y)) => {
            x.len() == y.len()
                && x.iter()
                    .zip(y)
                    .all(|(p, q)| compatible_ignoring_element_type(p, q))
        }
        (Shape::Tuple(_), _) | (_, Shape::Tuple(_)) => false,
        _ => a.dims() == b.dims() && a.is_token() == b.is_token(),
    }
}
