//! Computation boundaries: the instructions that must share one sharding
//! across a while, conditional or call (XLA's `GetRelatedInstructions`): a
//! while with its body's root and parameter and its condition's parameter,
//! a conditional with its branches' roots, a call with its callee's root,
//! and a branch's or callee's parameter with the argument it receives.
//!
//! Invariant: every list starts with the node asked about, or is empty.

use crate::graph::{Graph, Node};
use xla_hlo_ir::{AttrKey, Opcode};

/// The instructions that share `node`'s sharding across a computation
/// boundary, `node` first; empty when there are none.
pub(crate) fn shared_across_boundary(graph: &Graph, node: Node) -> Vec<Node> {
    let instr = graph.instr(node);
    match instr.opcode {
        Opcode::While => {
            let mut shared = vec![node];
            if let Some(body) = instr.computation_attr(AttrKey::Body) {
                shared.push(graph.root_of(body));
                shared.extend(graph.parameter(body, 0));
            }
            if let Some(condition) = instr.computation_attr(AttrKey::Condition) {
                shared.extend(graph.parameter(condition, 0));
            }
            shared
        }
        Opcode::Conditional => {
            let mut shared = vec![node];
            shared.extend(
                instr
                    .called_computations()
                    .into_iter()
                    .map(|branch| graph.root_of(branch)),
            );
            shared
        }
        Opcode::Call => {
            let mut shared = vec![node];
            if let Some(&callee) = instr.called_computations().first() {
                shared.push(graph.root_of(callee));
            }
            shared
        }
        Opcode::Parameter => match graph.caller_argument(node) {
            Some(argument) => vec![node, argument],
            None => vec![],
        },
        _ => vec![],
    }
}
