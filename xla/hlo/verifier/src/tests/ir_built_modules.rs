//! Modules built through the IR API, which the text format cannot express
//! (dangling ids, duplicate computation names, call cycles), and the
//! error's display format.

use super::*;
use xla_hlo_ir::{
    AttrKey, AttrValue, CompId, HloComputation, HloInstruction, HloModule, InstrId, Opcode,
    PrimitiveType, Shape,
};

fn tiny_module() -> HloModule {
    let mut c = HloComputation::new("e");
    let mut p = HloInstruction::new(
        "p",
        Opcode::Parameter,
        Shape::array(PrimitiveType::F32, vec![2]),
        vec![],
    );
    p.parameter_number = Some(0);
    let p = c.add(p);
    c.root = c.add(HloInstruction::new(
        "n",
        Opcode::Negate,
        Shape::array(PrimitiveType::F32, vec![2]),
        vec![p],
    ));
    HloModule {
        name: "m".into(),
        config: Default::default(),
        stack_frame_index: None,
        computations: vec![c],
        entry: CompId(0),
    }
}

#[test]
fn ir_module_is_valid() {
    assert!(verify(&tiny_module()).is_ok());
}

#[test]
fn dangling_ids() {
    let mut m = tiny_module();
    m.computations[0].instructions[1].operands = vec![InstrId(7)];
    m.computations[0].instructions[1].control_predecessors = vec![InstrId(1)];
    let errs = verify(&m).unwrap_err().0;
    assert_error_in(&errs, "n", "refers to i7, which does not exist");
    assert_error_in(&errs, "n", "control predecessor is the instruction itself");

    let mut m = tiny_module();
    m.entry = CompId(3);
    m.computations[0].root = InstrId(9);
    let errs = verify(&m).unwrap_err().0;
    assert!(errs
        .iter()
        .any(|e| e.computation == "<module>" && e.message.contains("entry")));
    assert_error_in(&errs, "", "root i9 does not exist");
}

#[test]
fn duplicate_computation_names_and_cycles() {
    let mut m = tiny_module();
    let mut f = HloComputation::new("e");
    let mut q = HloInstruction::new(
        "q",
        Opcode::Parameter,
        Shape::array(PrimitiveType::F32, vec![2]),
        vec![],
    );
    q.parameter_number = Some(0);
    let q = f.add(q);
    let mut call = HloInstruction::new(
        "cl",
        Opcode::Call,
        Shape::array(PrimitiveType::F32, vec![2]),
        vec![q],
    );
    call.set_attr(AttrKey::ToApply, AttrValue::Computation(CompId(1)));
    f.root = f.add(call);
    m.computations.push(f);
    let errs = verify(&m).unwrap_err().0;
    assert_error_in(&errs, "", "computation name is not unique");
    assert_error_in(&errs, "", "call graph has a cycle");

    let mut m = tiny_module();
    let ins = &mut m.computations[0].instructions[1];
    ins.opcode = Opcode::Map;
    ins.set_attr(AttrKey::ToApply, AttrValue::Computation(CompId(5)));
    let errs = verify(&m).unwrap_err().0;
    assert_error_in(&errs, "n", "called computation c5 does not exist");
}

#[test]
fn display_format() {
    let e = VerifierError {
        computation: "main".into(),
        instruction: Some("add.1".into()),
        message: "bad".into(),
    };
    assert_eq!(e.to_string(), "main/add.1: bad");
    let e = VerifierError {
        computation: "main".into(),
        instruction: None,
        message: "bad".into(),
    };
    assert_eq!(e.to_string(), "main: bad");
}
