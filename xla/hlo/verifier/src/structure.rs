//! Structural checks: ids, names, parameters and the call graph.
//!
//! Decides, per instruction, whether its operands can be looked at
//! (`operands_ok`) and whether its called computations exist (`calls_ok`),
//! and per computation whether it can be used as a callee (root and
//! parameter table sound). Later phases consult these flags so that one
//! broken id gives one error, not a cascade.
//!
//! Use before definition: XLA's parser resolves operand and
//! control-predecessor names only against instructions already read in the
//! same computation (`FindInstruction` on the scoped name table), so a
//! reference to a later instruction is not valid HLO text; here every
//! reference must point strictly earlier in the arena.

use crate::Report;
use std::collections::HashMap;
use xla_hlo_ir::call_graph::CallGraph;
use xla_hlo_ir::{CompId, HloModule, Opcode};

pub(crate) struct CompStatus {
    pub operands_ok: Vec<bool>,
    pub calls_ok: Vec<bool>,
    pub root_ok: bool,
    pub params_ok: bool,
}

pub(crate) struct Status {
    pub comps: Vec<CompStatus>,
    pub entry_ok: bool,
}

impl Status {
    /// True when computation `id` exists with a sound root and parameter table.
    pub fn callee_ok(&self, id: CompId) -> bool {
        self.comps
            .get(id.index())
            .is_some_and(|c| c.root_ok && c.params_ok)
    }
}

pub(crate) fn check(module: &HloModule, r: &mut Report) -> Status {
    let n_comps = module.computations.len();
    let entry_ok = module.entry.index() < n_comps;
    if !entry_ok {
        r.comp(
            "<module>",
            format!(
                "entry computation {} does not exist (the module has {n_comps} computations)",
                module.entry
            ),
        );
    }

    let mut comp_names: HashMap<&str, usize> = HashMap::new();
    for (ci, c) in module.computations.iter().enumerate() {
        if comp_names.insert(c.name.as_str(), ci).is_some() {
            r.comp(&c.name, "computation name is not unique in the module");
        }
    }

    let mut instr_names: HashMap<&str, usize> = HashMap::new();
    for (ci, c) in module.computations.iter().enumerate() {
        for instr in &c.instructions {
            if let Some(prev) = instr_names.insert(instr.name.as_str(), ci) {
                let where_ = module
                    .computations
                    .get(prev)
                    .map(|p| p.name.as_str())
                    .unwrap_or("?");
                r.instr(
                    &c.name,
                    &instr.name,
                    format!("instruction name is not unique in the module (also used in computation {where_})"),
                );
            }
        }
    }

    let mut comps = Vec::with_capacity(n_comps);
    for c in &module.computations {
        let n = c.instructions.len();
        let mut st = CompStatus {
            operands_ok: vec![true; n],
            calls_ok: vec![true; n],
            root_ok: true,
            params_ok: true,
        };
        if n == 0 {
            r.comp(&c.name, "computation has no instructions");
            st.root_ok = false;
        } else if c.root.index() >= n {
            r.comp(
                &c.name,
                format!("root {} does not exist ({n} instructions)", c.root),
            );
            st.root_ok = false;
        }

        // Parameters.
        let params: Vec<(usize, Option<i64>)> = c
            .instructions
            .iter()
            .enumerate()
            .filter(|(_, i)| i.opcode == Opcode::Parameter)
            .map(|(k, i)| (k, i.parameter_number))
            .collect();
        let count = params.len();
        let mut seen: Vec<Option<usize>> = vec![None; count];
        for &(k, num) in &params {
            let name = &c.instructions[k].name;
            match num {
                None => {
                    r.instr(&c.name, name, "parameter has no parameter number");
                    st.params_ok = false;
                }
                Some(p) => match usize::try_from(p).ok().filter(|&u| u < count) {
                    None => {
                        r.instr(
                            &c.name,
                            name,
                            format!("parameter number {p} is out of range: the computation has {count} parameters, numbered 0..{count}"),
                        );
                        st.params_ok = false;
                    }
                    Some(u) => {
                        if let Some(prev) = seen[u] {
                            r.instr(
                                &c.name,
                                name,
                                format!(
                                    "parameter number {p} is also used by {}",
                                    c.instructions[prev].name
                                ),
                            );
                            st.params_ok = false;
                        } else {
                            seen[u] = Some(k);
                        }
                    }
                },
            }
        }
        if st.params_ok {
            let table_ok = c.parameters.len() == count
                && c.parameters
                    .iter()
                    .enumerate()
                    .all(|(p, id)| seen.get(p).copied().flatten() == Some(id.index()));
            if !table_ok {
                r.comp(
                    &c.name,
                    "the computation's parameter table does not list its parameter instructions by number",
                );
                st.params_ok = false;
            }
        }

        // Operands and control predecessors.
        for (k, instr) in c.instructions.iter().enumerate() {
            let refs = instr
                .operands
                .iter()
                .enumerate()
                .map(|(j, id)| (format!("operand {j}"), *id))
                .chain(
                    instr
                        .control_predecessors
                        .iter()
                        .map(|id| ("control predecessor".to_string(), *id)),
                );
            for (what, id) in refs {
                let i = id.index();
                if i >= n {
                    r.instr(
                        &c.name,
                        &instr.name,
                        format!("{what} refers to {id}, which does not exist ({n} instructions)"),
                    );
                    st.operands_ok[k] = false;
                } else if i == k {
                    r.instr(
                        &c.name,
                        &instr.name,
                        format!("{what} is the instruction itself"),
                    );
                    st.operands_ok[k] = false;
                } else if i > k {
                    r.instr(
                        &c.name,
                        &instr.name,
                        format!(
                            "{what} %{} is used before it is defined",
                            c.instructions[i].name
                        ),
                    );
                    st.operands_ok[k] = false;
                }
            }
            for callee in instr.called_computations() {
                if callee.index() >= n_comps {
                    r.instr(
                        &c.name,
                        &instr.name,
                        format!("called computation {callee} does not exist"),
                    );
                    st.calls_ok[k] = false;
                }
            }
        }
        comps.push(st);
    }

    check_call_graph(module, r);
    Status { comps, entry_ok }
}

/// Reports computations that call themselves, directly or not.
fn check_call_graph(module: &HloModule, r: &mut Report) {
    for (caller, callee) in CallGraph::new(module).back_edges() {
        r.comp(
            &module.computations[caller.index()].name,
            format!(
                "the call graph has a cycle: it calls {}, which is already being called",
                module.computations[callee.index()].name
            ),
        );
    }
}
