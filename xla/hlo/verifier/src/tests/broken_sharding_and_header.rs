//! Malformed shardings, entry layouts that contradict the entry
//! computation, and a module with several problems reported all at once.

use super::*;

#[test]
fn sharding_errors() {
    let errs = errors(
        "HloModule m, num_partitions=4
ENTRY e {
  a = f32[8,8] parameter(0), sharding={devices=[2,2]0,1,2}
  b = f32[8,8] parameter(1), sharding={devices=[2,2]0,1,2,7}
  c = f32[8,8] parameter(2), sharding={devices=[2,2]0,1,1,3}
  d = f32[8,8] parameter(3), sharding={devices=[4]<=[4]}
  e2 = f32[8,8] parameter(4), sharding={maximal device=9}
  f = f32[8,8] parameter(5), sharding={devices=[2,1,2]<=[2,2]T(1,0) last_tile_dim_replicate}
  ROOT t = (f32[8,8], f32[8,8]) tuple(a, b), sharding={{replicated}, {replicated}, {replicated}}
}",
    );
    assert_error_in(&errs, "a", "needs 4 devices but lists 3");
    assert_error_in(&errs, "b", "device 7 is out of range for 4 partitions");
    assert_error_in(&errs, "c", "device 1 appears more than once");
    assert_error_in(&errs, "d", "rank 1 but the shape f32[8,8] needs 2");
    assert_error_in(&errs, "e2", "device 9 is out of range");
    assert_error_in(&errs, "t", "3 elements but the shape");
    assert!(
        !errs.iter().any(|e| e.instruction.as_deref() == Some("f")),
        "{errs:?}"
    );
}

#[test]
fn entry_layout_mismatch() {
    let errs = errors(
        "HloModule m, entry_computation_layout={(f32[2]{0}, f32[3]{0})->f32[3]{0}}
ENTRY e {
  p = f32[2] parameter(0)
  ROOT r = f32[2] negate(p)
}",
    );
    assert_error_in(&errs, "", "entry_computation_layout has 2 parameters");
    assert_error_in(&errs, "", "result is f32[3]");
}

#[test]
fn reports_all_errors_at_once() {
    let errs = errors(
        "HloModule m
ENTRY e {
  p = f32[2,3] parameter(0)
  a = f32[3,3] add(p, p)
  b = f32[2,3] negate(p), sharding={devices=[2,2,2]<=[8]}
  ROOT c = pred[3] compare(p, p), direction=EQ
}",
    );
    assert_error_in(&errs, "a", "does not match");
    assert_error_in(
        &errs,
        "b",
        "tile assignment has rank 3 but the shape f32[2,3] needs 2",
    );
    assert_error_in(&errs, "c", "pred[2,3]");
    assert_eq!(errs.len(), 3, "{errs:?}");
}
