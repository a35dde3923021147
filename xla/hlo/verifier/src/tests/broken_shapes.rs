//! Declared shapes that contradict their operands or attributes
//! (elementwise, data movement, dot, convolution, gather, reduce,
//! collectives) and malformed replica groups and permute pairs.

use super::*;

#[test]
fn elementwise_shape_mismatch() {
    assert_error(
        "HloModule m
ENTRY e {
  p = f32[2,3] parameter(0)
  ROOT a = f32[3,2] add(p, p)
}",
        "a",
        "does not match the shape inferred",
    );
    assert_error(
        "HloModule m
ENTRY e {
  p = f32[2,3] parameter(0)
  q = f32[3,2] parameter(1)
  ROOT a = f32[2,3] add(p, q)
}",
        "a",
        "same dimensions",
    );
    assert_error(
        "HloModule m
ENTRY e {
  p = f32[2,3] parameter(0)
  q = bf16[2,3] parameter(1)
  ROOT a = f32[2,3] multiply(p, q)
}",
        "a",
        "same element type",
    );
    assert_error(
        "HloModule m
ENTRY e {
  p = f32[2,3] parameter(0)
  ROOT c = f32[2,3] compare(p, p), direction=EQ
}",
        "c",
        "pred[2,3]",
    );
}

#[test]
fn data_movement_errors() {
    let errs = errors(
        "HloModule m
ENTRY e {
  p = f32[4,8] parameter(0)
  t = f32[4,8] transpose(p), dimensions={1,0}
  sl = f32[3,3] slice(p), slice={[0:3], [0:9]}
  r = f32[5,7] reshape(p)
  b = f32[3,5,8] broadcast(p), dimensions={1,2}
  z = f32[] constant(0)
  pd = f32[4,8] pad(p, z), padding=1_0x0_0
  ROOT out = (f32[4,8], f32[3,3], f32[5,7], f32[3,5,8], f32[4,8]) tuple(t, sl, r, b, pd)
}",
    );
    assert_error_in(&errs, "t", "f32[8,4]");
    assert_error_in(&errs, "sl", "not within");
    assert_error_in(&errs, "r", "number of elements");
    assert_error_in(&errs, "b", "operand dimension 0 (size 4)");
    assert_error_in(&errs, "pd", "f32[5,8]");
    assert_eq!(errs.len(), 5, "{errs:?}");
}

#[test]
fn dot_errors() {
    let errs = errors(
        "HloModule m
ENTRY e {
  a = f32[4,6] parameter(0)
  b = f32[5,7] parameter(1)
  d = f32[4,7] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  x = s32[4,6] parameter(2)
  y = s32[6,7] parameter(3)
  n = s8[4,7] dot(x, y), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  w = f32[4,6,7] dot(x, y), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT t = (f32[4,7], s8[4,7], f32[4,6,7]) tuple(d, n, w)
}",
    );
    assert_error_in(&errs, "d", "contracting dimension sizes differ");
    assert_error_in(&errs, "n", "narrower");
    assert_error_in(&errs, "w", "does not match the shape inferred");
}

#[test]
fn convolution_errors() {
    let errs = errors(
        "HloModule m
ENTRY e {
  img = f32[8,32,32,3] parameter(0)
  k = f32[3,3,4,16] parameter(1)
  c1 = f32[8,32,32,16] convolution(img, k), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f
  k2 = f32[3,3,3,16] parameter(2)
  c2 = f32[8,32,32,16] convolution(img, k2), window={size=3x3 stride=2x2 pad=1_1x1_1}, dim_labels=b01f_01io->b01f
  ROOT t = (f32[8,32,32,16], f32[8,32,32,16]) tuple(c1, c2)
}",
    );
    assert_error_in(&errs, "c1", "kernel input feature");
    assert_error_in(&errs, "c2", "f32[8,16,16,16]");
}

#[test]
fn gather_and_reduce_errors() {
    let errs = errors(&with_add(
        "ENTRY e {
  table = f32[100,64] parameter(0)
  ids = s32[8,1] parameter(1)
  g = f32[8,32] gather(table, ids), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,64}
  z = f32[] constant(0)
  r = f32[64] reduce(table, z), dimensions={1}, to_apply=add
  ROOT t = (f32[8,32], f32[64]) tuple(g, r)
}",
    ));
    assert_error_in(&errs, "g", "f32[8,64]");
    assert_error_in(&errs, "r", "f32[100]");
}

#[test]
fn collective_errors() {
    let errs = errors(&with_add(
        "ENTRY e {
  p = f32[16,32] parameter(0)
  ag = f32[16,64] all-gather(p), channel_id=1, replica_groups=[2,4]<=[8], dimensions={1}, use_global_device_ids=true
  rs = f32[16,5] reduce-scatter(p), channel_id=2, replica_groups=[2,4]<=[8], dimensions={1}, use_global_device_ids=true, to_apply=add
  a2a = f32[15,32] all-to-all(p), channel_id=3, replica_groups={{0,1,2,3}}, dimensions={0}
  ROOT t = (f32[16,64], f32[16,5], f32[15,32]) tuple(ag, rs, a2a)
}",
    ));
    assert_error_in(&errs, "ag", "f32[16,128]");
    assert_error_in(&errs, "rs", "f32[16,8]");
    assert_error_in(&errs, "a2a", "f32[16,32]");
}

#[test]
fn replica_group_and_pair_errors() {
    let errs = errors(&with_add(
        "ENTRY e {
  p = f32[16] parameter(0)
  a = f32[16] all-reduce(p), replica_groups={{0,1},{1,2}}, to_apply=add
  b = f32[16] all-reduce(p), replica_groups={{0,1},{3,4}}, to_apply=add
  c = f32[32] all-gather(p), replica_groups={{0,1},{2,3,4}}, dimensions={0}
  d = f32[16] all-reduce(p), replica_groups={{0,1}}, use_global_device_ids=true, to_apply=add
  g = f32[16] collective-permute(p), channel_id=1, source_target_pairs={{0,1},{2,1}}
  h = f32[16] all-reduce(p), replica_groups=[2,3]<=[8], to_apply=add
  ROOT t = (f32[16], f32[16], f32[32], f32[16], f32[16], f32[16]) tuple(a, b, c, d, g, h)
}",
    ));
    assert_error_in(&errs, "a", "repeats id 1");
    assert_error_in(&errs, "b", "not id 2");
    assert_error_in(&errs, "c", "groups of one size");
    assert_error_in(&errs, "d", "requires a channel_id");
    assert_error_in(&errs, "g", "target 1 more than once");
    assert_error_in(&errs, "h", "do not cover");
}

#[test]
fn replica_count_must_match_cross_replica_groups() {
    assert_error(
        &format!(
            "HloModule m, replica_count=4
{ADD}
ENTRY e {{
  p = f32[16] parameter(0)
  ROOT a = f32[16] all-reduce(p), replica_groups={{{{0,1}}}}, to_apply=add
}}"
        ),
        "a",
        "replica_count=4",
    );
}
