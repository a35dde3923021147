//! All-reduce promotion (XLA's `AllReducePromotion`): every all-reduce and
//! reduce-scatter of element type `from` becomes one of type `to`, with
//! its operand converted up, a copy of its reducer computing in `to`, and
//! its result converted back. XLA's CPU compiler does this for bf16 (to
//! f32), so a CPU run sums the devices' partial sums in f32 and rounds
//! once; XLA's GPU compiler does it for 16-bit integers only.
//!
//! A dot of type `from` whose only use is such a collective yields `to`
//! instead of being converted up: XLA's CPU compiler computes a bf16 dot in
//! f32 and rounds it to bf16, and with excess precision allowed (its
//! default) removes that rounding when the value is converted straight
//! back (`SimplifyFPConversions`), so the collective sums the unrounded
//! partial products.
//!
//! Only synchronous collectives are promoted, single-operand ones with an
//! array result and variadic ones (a combined collective: a tuple of
//! arrays, each element promoted as a collective of its own would be), and only when their reducer holds nothing but parameters and
//! elementwise ops (a constant would need its literal converted); the
//! others are left as they are.
//!
//! Invariants: the module computes the same values up to the rounding of
//! the intermediate sums; instruction order stays definition before use;
//! computations stay callees first; new instructions and computations get
//! names no other has; a reducer shared by several collectives is copied
//! once per module.

use rustc_hash::{FxHashMap, FxHashSet};
use xla_hlo_ir::attrs::AttrValue;
use xla_hlo_ir::{
    AttrKey, CompId, HloComputation, HloInstruction, HloModule, InstrId, Opcode, PrimitiveType,
    Shape,
};

/// Promotes every eligible all-reduce and reduce-scatter of `from` to
/// `to` (see the module doc); returns how many were promoted.
pub fn promote_all_reduces(
    module: &mut HloModule,
    from: PrimitiveType,
    to: PrimitiveType,
) -> usize {
    let mut names: FxHashSet<String> = module
        .computations
        .iter()
        .flat_map(|c| c.instructions.iter().map(|i| i.name.clone()))
        .collect();
    let mut computation_names: FxHashSet<String> =
        module.computations.iter().map(|c| c.name.clone()).collect();
    // Reducer -> its promoted copy.
    let mut promoted: FxHashMap<CompId, CompId> = FxHashMap::default();
    let mut count = 0;
    for index in 0..module.computations.len() {
        // Each eligible collective and its reducer.
        let eligible: FxHashMap<InstrId, CompId> = module.computations[index]
            .ids()
            .filter_map(|id| {
                let instr = module.computations[index].instr(id);
                let reducer = instr.to_apply()?;
                (matches!(instr.opcode, Opcode::AllReduce | Opcode::ReduceScatter)
                    && result_shapes(instr).len() == instr.operands.len()
                    && result_shapes(instr)
                        .iter()
                        .all(|s| s.is_array() && s.element_type() == Some(from))
                    && promotable_reducer(module, reducer, from))
                .then_some((id, reducer))
            })
            .collect();
        if eligible.is_empty() {
            continue;
        }
        for &reducer in eligible.values() {
            if let std::collections::hash_map::Entry::Vacant(slot) = promoted.entry(reducer) {
                let copy = promoted_reducer(
                    module.comp(reducer),
                    from,
                    to,
                    &mut names,
                    &mut computation_names,
                );
                slot.insert(CompId(module.computations.len() as u32));
                module.computations.push(copy);
            }
        }
        let old = std::mem::replace(&mut module.computations[index], HloComputation::new(""));
        // Dots of `from` whose only use is an eligible collective (ids in
        // `old`; `widened_dots` holds their ids in `new`).
        let mut uses = vec![0usize; old.instructions.len()];
        for instr in &old.instructions {
            for operand in &instr.operands {
                uses[operand.index()] += 1;
            }
        }
        let widen: FxHashSet<InstrId> = eligible
            .keys()
            .flat_map(|&id| old.instr(id).operands.iter().copied())
            .filter(|&operand| {
                let dot = old.instr(operand);
                dot.opcode == Opcode::Dot
                    && dot.shape.element_type() == Some(from)
                    && uses[operand.index()] == 1
                    && operand != old.root
                    && dot.control_predecessors.is_empty()
            })
            .collect();
        let mut widened_dots: FxHashSet<InstrId> = FxHashSet::default();
        let mut new = HloComputation::new(old.name.clone());
        new.execution_thread = old.execution_thread.clone();
        let mut map: Vec<InstrId> = Vec::with_capacity(old.instructions.len());
        for (position, mut instr) in old.instructions.into_iter().enumerate() {
            for operand in instr
                .operands
                .iter_mut()
                .chain(instr.control_predecessors.iter_mut())
            {
                *operand = map[operand.index()];
            }
            let Some(reducer) = eligible.get(&InstrId(position as u32)) else {
                let added = new.add(instr);
                if widen.contains(&InstrId(position as u32)) {
                    widened_dots.insert(added);
                }
                map.push(added);
                continue;
            };
            let mut ups = Vec::with_capacity(instr.operands.len());
            for &operand in &instr.operands {
                let operand_shape = new.instr(operand).shape.with_element_type(to);
                ups.push(if widened_dots.contains(&operand) {
                    // The dot's only use: it yields `to` itself, unrounded.
                    new.instr_mut(operand).shape = operand_shape;
                    operand
                } else {
                    let up = HloInstruction::new(
                        unique(&mut names, "convert"),
                        Opcode::Convert,
                        operand_shape,
                        vec![operand],
                    );
                    new.add(up)
                });
            }
            let original_shape = instr.shape.clone();
            let name = instr.name.clone();
            instr.name = unique(&mut names, &format!("{name}.promoted"));
            instr.shape = if original_shape.is_tuple() {
                Shape::tuple(
                    original_shape
                        .tuple_elements()
                        .iter()
                        .map(|s| s.with_element_type(to))
                        .collect(),
                )
            } else {
                original_shape.with_element_type(to)
            };
            instr.operands = ups;
            instr.set_attr(AttrKey::ToApply, AttrValue::Computation(promoted[reducer]));
            let sharding = instr.sharding.take();
            let reduced = new.add(instr);
            // The converted result keeps the collective's name, so what
            // refers to it by name (a schedule, a trace) still finds it;
            // a variadic one's elements are converted one by one.
            let mut down = if original_shape.is_tuple() {
                let elements: Vec<InstrId> = original_shape
                    .tuple_elements()
                    .iter()
                    .enumerate()
                    .map(|(index, element_shape)| {
                        let mut element = HloInstruction::new(
                            unique(&mut names, "get-tuple-element"),
                            Opcode::GetTupleElement,
                            element_shape.with_element_type(to),
                            vec![reduced],
                        );
                        element.set_attr(AttrKey::Index, AttrValue::Int(index as i64));
                        let element = new.add(element);
                        let convert = HloInstruction::new(
                            unique(&mut names, "convert"),
                            Opcode::Convert,
                            element_shape.clone(),
                            vec![element],
                        );
                        new.add(convert)
                    })
                    .collect();
                HloInstruction::new(name, Opcode::Tuple, original_shape, elements)
            } else {
                HloInstruction::new(name, Opcode::Convert, original_shape, vec![reduced])
            };
            down.sharding = sharding;
            map.push(new.add(down));
        }
        new.root = map[old.root.index()];
        module.computations[index] = new;
        count += eligible.len();
    }
    if count > 0 {
        // The reducers' copies were appended; callees print first.
        crate::inline::order_callees_first(module);
    }
    count
}

/// The shapes of a collective's results: its array, or its tuple's
/// elements.
fn result_shapes(instr: &HloInstruction) -> Vec<&Shape> {
    if instr.shape.is_tuple() {
        instr.shape.tuple_elements().iter().collect()
    } else {
        vec![&instr.shape]
    }
}

/// Whether `reducer` holds only parameters and elementwise ops, all of
/// element type `from` (or predicates).
fn promotable_reducer(module: &HloModule, reducer: CompId, from: PrimitiveType) -> bool {
    let Some(comp) = module.computations.get(reducer.index()) else {
        return false;
    };
    comp.instructions.iter().all(|i| {
        let kind_ok = i.opcode == Opcode::Parameter || i.opcode.is_elementwise();
        let type_ok = matches!(
            i.shape.element_type(),
            Some(t) if t == from || t == PrimitiveType::Pred
        );
        kind_ok && type_ok && i.shape.rank() == 0
    })
}

/// A copy of `reducer` computing in `to` wherever it computed in `from`.
fn promoted_reducer(
    reducer: &HloComputation,
    from: PrimitiveType,
    to: PrimitiveType,
    names: &mut FxHashSet<String>,
    computation_names: &mut FxHashSet<String>,
) -> HloComputation {
    let mut copy = reducer.clone();
    copy.name = unique(computation_names, &format!("{}_promoted", reducer.name));
    for instr in &mut copy.instructions {
        instr.name = unique(names, &instr.name);
        if instr.shape.element_type() == Some(from) {
            instr.shape = instr.shape.with_element_type(to);
        }
    }
    copy
}

/// `base` when free, else `base.N` with the smallest free N; taken.
fn unique(names: &mut FxHashSet<String>, base: &str) -> String {
    if names.insert(base.to_string()) {
        return base.to_string();
    }
    (1..)
        .map(|n| format!("{base}.{n}"))
        .find(|candidate| names.insert(candidate.clone()))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A module of two partitions with the bf16 reducer `%add`, then `rest`.
    fn with_bf16_add(rest: &str) -> String {
        format!(
            "HloModule m, num_partitions=2

%add (x: bf16[], y: bf16[]) -> bf16[] {{
  %x = bf16[] parameter(0)
  %y = bf16[] parameter(1)
  ROOT %s = bf16[] add(%x, %y)
}}
{rest}"
        )
    }

    fn module(text: &str) -> HloModule {
        xla_hlo_parser::parse_module(text).unwrap()
    }

    #[test]
    fn a_bf16_all_reduce_sums_in_f32() {
        let mut m = module(&with_bf16_add(
            "
%add32 (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}

ENTRY %e (p: bf16[4], q: f32[4]) -> (bf16[4], f32[4]) {
  %p = bf16[4] parameter(0)
  %q = f32[4] parameter(1)
  %ar = bf16[4] all-reduce(%p), replica_groups={}, to_apply=%add
  %n = bf16[4] negate(%ar)
  %other = f32[4] all-reduce(%q), replica_groups={}, to_apply=%add32
  ROOT %t = (bf16[4], f32[4]) tuple(%n, %other)
}
",
        ));
        assert_eq!(
            promote_all_reduces(&mut m, PrimitiveType::Bf16, PrimitiveType::F32),
            1
        );
        let text = m.to_text();
        for line in [
            "%convert = f32[4] convert(%p)",
            "%ar.promoted = f32[4] all-reduce(%convert), replica_groups={}, to_apply=%add_promoted",
            "%ar = bf16[4] convert(%ar.promoted)",
            "%n = bf16[4] negate(%ar)",
            "%other = f32[4] all-reduce(%q), replica_groups={}, to_apply=%add32",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
        // The printed module reads back: names unique, callees first.
        assert_eq!(module(&text).to_text(), text);
        assert!(text.find("%add_promoted (").unwrap() < text.find("ENTRY").unwrap());
        let reducer = m
            .computations
            .iter()
            .find(|c| c.name == "add_promoted")
            .unwrap();
        assert!(reducer
            .instructions
            .iter()
            .all(|i| i.shape.element_type() == Some(PrimitiveType::F32)));
    }

    #[test]
    fn a_bf16_dot_feeding_only_the_all_reduce_yields_f32() {
        let mut m = module(&with_bf16_add(
            "
ENTRY %e (a: bf16[4,8], b: bf16[8,4]) -> (bf16[4,4], bf16[4,4], bf16[4,4]) {
  %a = bf16[4,8] parameter(0)
  %b = bf16[8,4] parameter(1)
  %d = bf16[4,4] dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %ar = bf16[4,4] all-reduce(%d), replica_groups={}, to_apply=%add
  %kept = bf16[4,4] dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %ar2 = bf16[4,4] all-reduce(%kept), replica_groups={}, to_apply=%add
  ROOT %t = (bf16[4,4], bf16[4,4], bf16[4,4]) tuple(%ar, %ar2, %kept)
}
",
        ));
        assert_eq!(
            promote_all_reduces(&mut m, PrimitiveType::Bf16, PrimitiveType::F32),
            2
        );
        let text = m.to_text();
        for line in [
            // Used only by its all-reduce: computed in f32, never rounded.
            "%d = f32[4,4] dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}",
            "%ar.promoted = f32[4,4] all-reduce(%d), replica_groups={}, to_apply=%add_promoted",
            // Also used elsewhere: stays bf16 and is converted up.
            "%kept = bf16[4,4] dot(%a, %b)",
            "%convert = f32[4,4] convert(%kept)",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
    }

    /// A combined (variadic) all-reduce: each element is promoted as the
    /// collective it replaced would be, its dot widened, and the tuple is
    /// rebuilt from the converted elements under the collective's name.
    #[test]
    fn a_variadic_bf16_all_reduce_sums_each_element_in_f32() {
        let mut m = module(&with_bf16_add(
            "
ENTRY %e (a: bf16[4,8], b: bf16[8,4], p: bf16[4]) -> (bf16[4,4], bf16[4]) {
  %a = bf16[4,8] parameter(0)
  %b = bf16[8,4] parameter(1)
  %p = bf16[4] parameter(2)
  %d = bf16[4,4] dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %ar = (bf16[4,4], bf16[4]) all-reduce(%d, %p), replica_groups={}, to_apply=%add
  %first = bf16[4,4] get-tuple-element(%ar), index=0
  %second = bf16[4] get-tuple-element(%ar), index=1
  ROOT %t = (bf16[4,4], bf16[4]) tuple(%first, %second)
}
",
        ));
        assert_eq!(
            promote_all_reduces(&mut m, PrimitiveType::Bf16, PrimitiveType::F32),
            1
        );
        let text = m.to_text();
        for line in [
            "%d = f32[4,4] dot(%a, %b)",
            "%convert = f32[4] convert(%p)",
            "%ar.promoted = (f32[4,4], f32[4]) all-reduce(%d, %convert), replica_groups={}, to_apply=%add_promoted",
            "%ar = (bf16[4,4], bf16[4]) tuple(",
            "%first = bf16[4,4] get-tuple-element(%ar), index=0",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
        assert_eq!(module(&text).to_text(), text);
    }

    #[test]
    fn a_reducer_with_a_constant_is_left_alone() {
        let mut m = module(
            "HloModule m, num_partitions=2

%odd (x: bf16[], y: bf16[]) -> bf16[] {
  %x = bf16[] parameter(0)
  %y = bf16[] parameter(1)
  %c = bf16[] constant(1)
  %s = bf16[] add(%x, %y)
  ROOT %r = bf16[] add(%s, %c)
}

ENTRY %e (p: bf16[4]) -> bf16[4] {
  %p = bf16[4] parameter(0)
  ROOT %ar = bf16[4] all-reduce(%p), replica_groups={}, to_apply=%odd
}
",
        );
        let before = m.clone();
        assert_eq!(
            promote_all_reduces(&mut m, PrimitiveType::Bf16, PrimitiveType::F32),
            0
        );
        assert_eq!(m, before);
    }
}
