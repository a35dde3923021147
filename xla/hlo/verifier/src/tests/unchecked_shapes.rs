//! Instructions whose shape the verifier cannot check are listed as
//! unchecked, with the reason, and never make a module fail: ops XLA takes at
//! their word (`custom-call`), ops shape inference has no rule for
//! (`ragged-dot`), operands with unbounded dimensions, gather-like async
//! starts with empty replica groups. Fully checked modules list none.

use super::*;
use crate::{verify_report, UncheckedShape, VerifierReport};
use xla_hlo_ir::Opcode;

fn report(text: &str) -> VerifierReport {
    verify_report(&parse(text))
}

/// The unchecked list of a module that must verify without errors.
#[track_caller]
fn unchecked(text: &str) -> Vec<UncheckedShape> {
    let r = report(text);
    assert!(r.is_valid(), "expected no errors, got:\n{r}");
    assert!(verify(&parse(text)).is_ok());
    r.unchecked
}

#[test]
fn custom_call_is_listed_not_an_error() {
    let u = unchecked(
        "HloModule m
ENTRY e {
  p = f32[4,8] parameter(0)
  cc = f32[2,2] custom-call(p), custom_call_target=\"my_kernel\"
  ROOT n = f32[2,2] negate(cc)
}",
    );
    assert_eq!(u.len(), 1, "{u:?}");
    assert_eq!(u[0].computation, "e");
    assert_eq!(u[0].instruction, "cc");
    assert_eq!(u[0].opcode, Opcode::CustomCall);
    assert!(u[0].reason.contains("no rule"), "{}", u[0].reason);
}

#[test]
fn opcode_without_an_inference_rule_is_listed() {
    let u = unchecked(
        "HloModule m
ENTRY e {
  lhs = f32[16,8] parameter(0)
  rhs = f32[2,8,4] parameter(1)
  sizes = s64[2] parameter(2)
  ROOT rd = f32[16,4] ragged-dot(lhs, rhs, sizes), lhs_contracting_dims={1}, rhs_contracting_dims={1}, lhs_ragged_dims={0}, rhs_group_dims={0}
}",
    );
    assert_eq!(u.len(), 1, "{u:?}");
    assert_eq!(u[0].opcode, Opcode::RaggedDot);
    assert_eq!(u[0].reason, "the shape must be written");
}

#[test]
fn unbounded_operands_are_listed() {
    let u = unchecked(
        "HloModule m
ENTRY e {
  p = f32[?,4] parameter(0)
  ROOT n = f32[?,4] negate(p)
}",
    );
    assert_eq!(u.len(), 1, "{u:?}");
    assert_eq!(u[0].instruction, "n");
    assert!(u[0].reason.contains("unbounded"), "{}", u[0].reason);
}

#[test]
fn gather_like_starts_with_empty_groups_are_listed() {
    let u = unchecked(
        "HloModule m
ENTRY e {
  p = f32[8] parameter(0)
  ags = (f32[8], f32[64]) all-gather-start(p), dimensions={0}
  ROOT agd = f32[64] all-gather-done(ags)
}",
    );
    let names: Vec<&str> = u.iter().map(|u| u.instruction.as_str()).collect();
    assert_eq!(names, ["ags"], "{u:?}");
    assert!(u[0].reason.contains("empty replica groups"));
}

#[test]
fn checked_modules_list_nothing() {
    let u = unchecked(&with_add(
        "ENTRY e {
  p = f32[4,8] parameter(0)
  z = f32[] constant(0)
  r = f32[4] reduce(p, z), dimensions={1}, to_apply=add
  bc = f32[4,8] broadcast(r), dimensions={0}
  ROOT sum = f32[4,8] add(p, bc)
}",
    ));
    assert!(u.is_empty(), "{u:?}");
}

#[test]
fn errors_and_unchecked_are_kept_apart() {
    let text = "HloModule m
ENTRY e {
  p = f32[4] parameter(0)
  cc = f32[4] custom-call(p), custom_call_target=\"k\"
  ROOT n = f32[5] negate(cc)
}";
    let r = report(text);
    assert_error_in(&r.errors, "n", "does not match");
    assert_eq!(r.unchecked.len(), 1);
    assert_eq!(
        r.unchecked[0].to_string(),
        "e/cc: custom-call shape not checked: XLA takes the written shape and has no rule to check it"
    );
    assert_eq!(
        r.summary(),
        "1 error(s), 1 instruction(s) with unchecked shapes"
    );
    assert_eq!(verify(&parse(text)).unwrap_err().0, r.errors);
}
