//! Broken structure and per-instruction form: uses before definitions,
//! duplicate names, parameter numbering, operand counts and missing required
//! attributes, each reported on the offending instruction.

use super::*;
use xla_hlo_ir::AttrKey;

#[test]
fn use_before_definition() {
    assert_error(
        "HloModule m
ENTRY e {
  p = f32[2] parameter(0)
  a = f32[2] add(p, b)
  b = f32[2] negate(p)
  ROOT r = f32[2] copy(a)
}",
        "a",
        "used before it is defined",
    );
}

#[test]
fn duplicate_instruction_names_across_computations() {
    // The parser renames clashes as XLA does, so the clash is made through
    // the IR: a module built by a pass may hold one.
    let mut module = parse(
        "HloModule m
f {
  p = f32[2] parameter(0)
  ROOT x = f32[2] negate(p)
}
ENTRY e {
  q = f32[2] parameter(0)
  ROOT y = f32[2] call(q), to_apply=f
}",
    );
    let entry = module.entry.index();
    let root = module.computations[entry].instructions.len() - 1;
    module.computations[entry].instructions[root].name = "x".to_string();
    let errs = match crate::verify(&module) {
        Ok(()) => Vec::new(),
        Err(e) => e.0,
    };
    assert_error_in(&errs, "x", "not unique");
}

#[test]
fn parameter_numbering() {
    // The parser refuses a gap in the numbering; make one after parsing.
    let mut m = parse(
        "HloModule m
ENTRY e {
  p0 = f32[2] parameter(0)
  p1 = f32[2] parameter(1)
  ROOT r = f32[2] add(p0, p1)
}",
    );
    let e = m.entry.index();
    m.computations[e].instructions[1].parameter_number = Some(2);
    let errs = verify(&m).unwrap_err().0;
    assert_error_in(&errs, "p1", "parameter number 2 is out of range");
}

#[test]
fn duplicate_parameter_number() {
    let text = "HloModule m
ENTRY e {
  p0 = f32[2] parameter(0)
  q0 = f32[2] parameter(0)
  ROOT r = f32[2] add(p0, q0)
}";
    match xla_hlo_parser::parse_module(text) {
        // The parser may already refuse it; if not, the verifier must.
        Err(_) => {}
        Ok(m) => {
            let errs = verify(&m).unwrap_err().0;
            assert_error_in(&errs, "q0", "also used by p0");
        }
    }
}

#[test]
fn operand_count() {
    let text = "HloModule m
ENTRY e {
  p = f32[2] parameter(0)
  ROOT r = f32[2] negate(p, p)
}";
    if let Ok(m) = xla_hlo_parser::parse_module(text) {
        let errs = verify(&m).unwrap_err().0;
        assert_error_in(&errs, "r", "takes 1 operand(s), but has 2");
    }
    assert_error(
        &with_add(
            "ENTRY e {
  p = f32[2] parameter(0)
  z = f32[] constant(0)
  ROOT r = f32[] reduce(p, z, z), dimensions={0}, to_apply=add
}",
        ),
        "r",
        "even number",
    );
}

#[test]
fn missing_required_attributes() {
    // Written without the attributes, the parser may refuse the text; remove
    // them from a parsed module instead.
    let mut m = parse(&with_add(
        "ENTRY e {
  p = f32[2] parameter(0)
  c = pred[2] compare(p, p), direction=EQ
  z = f32[] constant(0)
  r = f32[] reduce(p, z), dimensions={0}, to_apply=add
  sl = f32[1] slice(p), slice={[0:1]}
  ROOT t = (pred[2], f32[], f32[1]) tuple(c, r, sl)
}",
    ));
    let e = m.entry.index();
    for ins in &mut m.computations[e].instructions {
        ins.remove_attr(AttrKey::Direction);
        ins.remove_attr(AttrKey::ToApply);
        ins.remove_attr(AttrKey::Slice);
    }
    let errs = verify(&m).unwrap_err().0;
    assert_error_in(&errs, "c", "compare requires attribute(s): direction");
    assert_error_in(&errs, "r", "reduce requires attribute(s): to_apply");
    assert_error_in(&errs, "sl", "slice requires attribute(s): slice");
    assert_eq!(errs.len(), 3, "{errs:?}");
}
