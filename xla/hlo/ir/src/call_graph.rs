//! The call graph of a module: which computations each computation calls
//! (through any instruction attribute that names computations), walked
//! depth first to order computations callees-first and to find cycles.
//!
//! Invariants: edges are per computation, sorted and without duplicates;
//! edges to computations that do not exist are dropped (the verifier reports
//! them), so nothing here panics on a malformed module. The walk is
//! iterative (no recursion depth limit), visits callees in ascending id
//! order, and reaches every computation at most once.

use crate::{CompId, HloModule};

/// Callee lists of every computation of a module, indexed by `CompId`.
#[derive(Clone, Debug, Default)]
pub struct CallGraph {
    callees: Vec<Vec<CompId>>,
}

impl CallGraph {
    /// The call graph of `module`.
    pub fn new(module: &HloModule) -> CallGraph {
        let count = module.computations.len();
        let callees = module
            .computations
            .iter()
            .map(|comp| {
                let mut out: Vec<CompId> = comp
                    .instructions
                    .iter()
                    .flat_map(|instr| instr.called_computations())
                    .filter(|callee| callee.index() < count)
                    .collect();
                out.sort_unstable();
                out.dedup();
                out
            })
            .collect();
        CallGraph { callees }
    }

    /// Number of computations.
    pub fn len(&self) -> usize {
        self.callees.len()
    }

    /// Whether the module has no computation.
    pub fn is_empty(&self) -> bool {
        self.callees.is_empty()
    }

    /// The computations `comp` calls (ascending, no duplicates; empty for an
    /// id out of range).
    pub fn callees(&self, comp: CompId) -> &[CompId] {
        self.callees.get(comp.index()).map_or(&[], Vec::as_slice)
    }

    /// Depth-first post-order from each root in turn: every computation
    /// reachable from the roots, each callee before its callers (when the
    /// graph is acyclic). Roots already reached, or out of range, are
    /// skipped, so a root list may repeat computations.
    pub fn post_order(&self, roots: impl IntoIterator<Item = CompId>) -> Vec<CompId> {
        self.walk(roots, |_, _| {})
    }

    /// Every call edge `(caller, callee)` that closes a cycle (the callee is
    /// still being walked when the caller calls it), in the order a walk
    /// from every computation in id order meets them. Empty when the call
    /// graph is acyclic.
    pub fn back_edges(&self) -> Vec<(CompId, CompId)> {
        let mut found = Vec::new();
        self.walk(self.all(), |caller, callee| found.push((caller, callee)));
        found
    }

    /// Every computation id, ascending.
    pub fn all(&self) -> impl Iterator<Item = CompId> {
        (0..self.callees.len() as u32).map(CompId)
    }

    /// The shared iterative walk: returns the post-order and calls
    /// `on_back_edge` for every edge into a computation still on the stack.
    fn walk(
        &self,
        roots: impl IntoIterator<Item = CompId>,
        mut on_back_edge: impl FnMut(CompId, CompId),
    ) -> Vec<CompId> {
        #[derive(Clone, Copy, PartialEq)]
        enum State {
            Unvisited,
            OnStack,
            Done,
        }
        let count = self.callees.len();
        let mut state = vec![State::Unvisited; count];
        let mut order = Vec::with_capacity(count);
        for root in roots {
            if root.index() >= count || state[root.index()] != State::Unvisited {
                continue;
            }
            // (computation, index of its next callee to look at)
            let mut stack: Vec<(CompId, usize)> = vec![(root, 0)];
            state[root.index()] = State::OnStack;
            while let Some(&mut (comp, ref mut next)) = stack.last_mut() {
                if let Some(&callee) = self.callees[comp.index()].get(*next) {
                    *next += 1;
                    match state[callee.index()] {
                        State::Unvisited => {
                            state[callee.index()] = State::OnStack;
                            stack.push((callee, 0));
                        }
                        State::OnStack => on_back_edge(comp, callee),
                        State::Done => {}
                    }
                } else {
                    state[comp.index()] = State::Done;
                    order.push(comp);
                    stack.pop();
                }
            }
        }
        order
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{HloComputation, HloInstruction, Opcode, Shape};

    /// A module whose computation `c` calls the computations `calls[c]`.
    fn module(calls: &[&[u32]]) -> HloModule {
        let computations = calls
            .iter()
            .enumerate()
            .map(|(c, callees)| {
                let mut comp = HloComputation::new(format!("c{c}"));
                for &callee in callees.iter() {
                    let mut instr = HloInstruction::new(
                        format!("call{c}_{callee}"),
                        Opcode::Call,
                        Shape::Tuple(vec![]),
                        vec![],
                    );
                    instr.attrs.push(crate::Attribute {
                        key: crate::AttrKey::ToApply,
                        value: crate::AttrValue::Computation(CompId(callee)),
                    });
                    comp.add(instr);
                }
                comp
            })
            .collect();
        HloModule {
            name: "m".into(),
            config: Default::default(),
            stack_frame_index: None,
            computations,
            entry: CompId(0),
        }
    }

    fn ids(v: &[CompId]) -> Vec<u32> {
        v.iter().map(|c| c.0).collect()
    }

    #[test]
    fn post_order_puts_callees_first() {
        // 0 calls 2 and 1; 1 calls 2; 3 is not reachable from 0.
        let g = CallGraph::new(&module(&[&[2, 1, 2], &[2], &[], &[]]));
        assert_eq!(ids(g.callees(CompId(0))), vec![1, 2]);
        assert_eq!(ids(&g.post_order([CompId(0)])), vec![2, 1, 0]);
        assert_eq!(ids(&g.post_order(g.all())), vec![2, 1, 0, 3]);
        assert_eq!(
            ids(&g.post_order([CompId(3), CompId(0), CompId(3)])),
            vec![3, 2, 1, 0]
        );
        assert!(g.back_edges().is_empty());
    }

    #[test]
    fn cycles_and_dangling_edges() {
        // 0 -> 1 -> 0 (cycle), 2 -> 2 (self call), 1 -> 9 (no such computation).
        let g = CallGraph::new(&module(&[&[1], &[0, 9], &[2]]));
        assert_eq!(ids(g.callees(CompId(1))), vec![0]);
        assert!(g.callees(CompId(7)).is_empty());
        let edges: Vec<(u32, u32)> = g.back_edges().iter().map(|(a, b)| (a.0, b.0)).collect();
        assert_eq!(edges, vec![(1, 0), (2, 2)]);
        // Every computation still appears once.
        assert_eq!(ids(&g.post_order(g.all())), vec![1, 0, 2]);
    }
}
