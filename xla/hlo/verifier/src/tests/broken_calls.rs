//! Called computations whose signatures do not fit their caller: reducers,
//! while condition and body, conditional branches, call, sort comparators.

use super::*;

#[test]
fn reducer_signature() {
    let errs = errors(
        "HloModule m
bad3 {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  c = f32[] parameter(2)
  ROOT s = f32[] add(a, b)
}
badv {
  a = f32[2] parameter(0)
  b = f32[2] parameter(1)
  ROOT s = f32[2] add(a, b)
}
addi {
  a = s32[] parameter(0)
  b = s32[] parameter(1)
  ROOT s = s32[] add(a, b)
}
ENTRY e {
  p = f32[4] parameter(0)
  z = f32[] constant(0)
  r1 = f32[] reduce(p, z), dimensions={0}, to_apply=bad3
  r2 = f32[] reduce(p, z), dimensions={0}, to_apply=badv
  r3 = f32[] reduce(p, z), dimensions={0}, to_apply=addi
  ar = f32[4] all-reduce(p), to_apply=bad3
  ROOT t = (f32[], f32[], f32[], f32[4]) tuple(r1, r2, r3, ar)
}",
    );
    assert_error_in(&errs, "r1", "takes 3 parameter(s), expected 2");
    assert_error_in(&errs, "r2", "must be a scalar");
    assert_error_in(&errs, "r3", "init value 0 has element type f32");
    assert_error_in(&errs, "ar", "takes 3 parameter(s), expected 2");
}

#[test]
fn while_signature() {
    let errs = errors(
        "HloModule m
cond {
  c = s32[] parameter(0)
  ROOT r = s32[] copy(c)
}
body {
  b = s32[] parameter(0)
  ROOT f = f32[] convert(b)
}
ENTRY e {
  z = s32[] constant(0)
  ROOT w = s32[] while(z), condition=cond, body=body
}",
    );
    assert_error_in(
        &errs,
        "w",
        "condition computation %cond returns s32[] but pred[] is expected",
    );
    assert_error_in(&errs, "w", "body computation %body returns f32[]");
}

#[test]
fn conditional_and_call_signature() {
    let errs = errors(
        "HloModule m
b0 {
  p = f32[4] parameter(0)
  ROOT n = f32[4] negate(p)
}
b1 {
  p = f32[8] parameter(0)
  ROOT s = f32[4] slice(p), slice={[0:4]}
}
two {
  p = f32[4] parameter(0)
  q = f32[4] parameter(1)
  ROOT a = f32[4] add(p, q)
}
ENTRY e {
  k = s32[] parameter(0)
  x = f32[4] parameter(1)
  c = f32[4] conditional(k, x, x), branch_computations={b0, b1}
  f = f32[4] parameter(2)
  pr = f32[] constant(1)
  c2 = f32[4] conditional(pr, x, x), true_computation=b0, false_computation=b0
  cl = f32[4] call(x), to_apply=two
  ROOT t = (f32[4], f32[4], f32[4]) tuple(c, c2, cl)
}",
    );
    assert_error_in(
        &errs,
        "c",
        "branch 1 computation %b1 parameter 0 is f32[8] but is given f32[4]",
    );
    assert_error_in(&errs, "c2", "branch index must be pred[]");
    assert_error_in(&errs, "cl", "takes 2 parameter(s) but is given 1");
}

#[test]
fn sort_comparator_signature() {
    assert_error(
        "HloModule m
cmp {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT sum = f32[] add(a, b)
}
ENTRY e {
  p = f32[8] parameter(0)
  ROOT s = f32[8] sort(p), dimensions={0}, to_apply=cmp
}",
        "s",
        "returns f32[] but pred[] is expected",
    );
}
