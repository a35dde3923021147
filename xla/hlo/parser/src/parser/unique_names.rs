//! Module-wide unique instruction names, as XLA's parser makes them.
//!
//! HLO text scopes instruction names per computation (`a` may name a
//! parameter of a reducer and of the entry), but an `HloModule` holds each
//! instruction name once. XLA renames the clashes when it parses; this does
//! the same, so that a module XLA accepts is accepted here under the names
//! XLA gives it.
//!
//! Rule: a name splits into a root and a numeric id (`add.12` is root `add`,
//! id 12; a name without a `.N` suffix has id 0). Walking the computations
//! and their instructions in text order, the first instruction to claim a
//! (root, id) pair keeps its name; every later one gets the smallest id of
//! its root that nobody claims, written `root.N` (or `root` alone for id 0
//! when the original had no suffix).
//!
//! Invariants: names that were already unique across the module are left
//! unchanged; afterwards no two instructions of the module share a name.
//! Operands are indices, so renaming never changes what refers to what.

use rustc_hash::{FxHashMap, FxHashSet};
use xla_hlo_ir::module::HloComputation;

/// A name's root and numeric id, and whether the id was written.
fn split_name(name: &str) -> (&str, u64, bool) {
    if let Some(dot) = name.rfind('.') {
        let suffix = &name[dot + 1..];
        if dot > 0 && !suffix.is_empty() && suffix.bytes().all(|b| b.is_ascii_digit()) {
            if let Ok(id) = suffix.parse::<u64>() {
                return (&name[..dot], id, true);
            }
        }
    }
    (name, 0, false)
}

/// Renames every instruction whose (root, id) an earlier instruction of the
/// module already claimed.
pub(super) fn make_instruction_names_unique(computations: &mut [HloComputation]) {
    let mut claimed: FxHashMap<String, FxHashSet<u64>> = FxHashMap::default();
    let mut clashes: Vec<(usize, usize)> = Vec::new();
    for (ci, comp) in computations.iter().enumerate() {
        for (ii, instr) in comp.instructions.iter().enumerate() {
            let (root, id, _) = split_name(&instr.name);
            if !claimed.entry(root.to_string()).or_default().insert(id) {
                clashes.push((ci, ii));
            }
        }
    }
    if clashes.is_empty() {
        return;
    }
    let mut next_free: FxHashMap<String, u64> = FxHashMap::default();
    for (ci, ii) in clashes {
        let name = &computations[ci].instructions[ii].name;
        let (root, _, had_suffix) = split_name(name);
        let root = root.to_string();
        let used = claimed
            .get_mut(&root)
            .expect("every root was claimed above");
        let next = next_free.entry(root.clone()).or_insert(0);
        while used.contains(next) {
            *next += 1;
        }
        let id = *next;
        used.insert(id);
        let renamed = if id == 0 && !had_suffix {
            root
        } else {
            format!("{root}.{id}")
        };
        computations[ci].instructions[ii].name = renamed;
    }
}

#[cfg(test)]
mod tests {
    use crate::parse_module;

    fn names(text: &str) -> Vec<Vec<String>> {
        let m = parse_module(text).unwrap();
        m.computations
            .iter()
            .map(|c| c.instructions.iter().map(|i| i.name.clone()).collect())
            .collect()
    }

    #[test]
    fn clashes_across_computations_get_the_next_free_suffix() {
        // The same renaming XLA's parser (jaxlib 0.10.2) prints for this text.
        let text = "HloModule m\n\
            add {\n  a.1 = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT s = f32[] add(a.1, b)\n}\n\
            ENTRY e {\n  a = f32[4] parameter(0)\n  a.1 = f32[] constant(0)\n  a.2 = f32[] constant(0)\n  \
            ROOT s = f32[] reduce(a, a.1), dimensions={0}, to_apply=add\n}\n";
        assert_eq!(
            names(text),
            vec![vec!["a.1", "b", "s"], vec!["a", "a.3", "a.2", "s.1"],]
        );
    }

    #[test]
    fn unique_names_stay_and_equal_ids_clash() {
        let text =
            "HloModule m\nENTRY e {\n  x.0 = f32[] parameter(0)\n  x = f32[] parameter(1)\n  \
            ROOT y = f32[] add(x.0, x)\n}\n";
        // `x.0` and `x` share root and id 0, so the second is renamed (as XLA does).
        assert_eq!(names(text), vec![vec!["x.0", "x.1", "y"]]);
        let text =
            "HloModule m\nENTRY e {\n  p = f32[] parameter(0)\n  ROOT q.7 = f32[] negate(p)\n}\n";
        assert_eq!(names(text), vec![vec!["p", "q.7"]]);
    }
}
