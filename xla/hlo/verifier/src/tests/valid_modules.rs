//! Valid modules, one per op family (elementwise ops and layouts, data
//! movement, reductions, dot and convolution, gather and scatter, control
//! flow, collectives and shardings, async forms): each must verify with no
//! error.

use super::*;

#[test]
fn valid_elementwise_and_layout() {
    assert_ok(
        "HloModule m, entry_computation_layout={(f32[2,3]{1,0}, f32[2,3]{0,1})->(f32[2,3]{1,0}, pred[2,3]{1,0})}
ENTRY e {
  p0 = f32[2,3]{1,0} parameter(0)
  p1 = f32[2,3]{0,1} parameter(1)
  a = f32[2,3]{1,0} add(p0, p1)
  c = pred[2,3]{1,0} compare(a, p1), direction=GT
  s = f32[2,3] select(c, a, p0)
  n = f32[2,3] negate(s)
  z = c64[2,3] complex(n, a)
  r = f32[2,3] real(z)
  ab = f32[2,3] abs(z)
  m = f32[2,3] maximum(r, ab)
  fi = pred[2,3] is-finite(m)
  cv = s32[2,3] convert(m)
  bc = u32[2,3] bitcast-convert(cv)
  sh = u32[2,3] shift-left(bc, bc)
  lo = f32[] constant(0)
  hi = f32[] constant(1)
  cl = f32[2,3] clamp(lo, m, hi)
  ROOT t = (f32[2,3]{1,0}, pred[2,3]{1,0}) tuple(cl, fi)
}",
    );
}

#[test]
fn valid_data_movement() {
    assert_ok(
        "HloModule m
ENTRY e {
  p = f32[4,8] parameter(0)
  i = s32[] parameter(1)
  t = f32[8,4] transpose(p), dimensions={1,0}
  rv = f32[8,4] reverse(t), dimensions={0}
  sl = f32[3,2] slice(rv), slice={[1:4], [0:4:2]}
  ds = f32[2,4] dynamic-slice(p, i, i), dynamic_slice_sizes={2,4}
  dus = f32[4,8] dynamic-update-slice(p, ds, i, i)
  zero = f32[] constant(0)
  pd = f32[7,15] pad(dus, zero), padding=1_2x0_0_1
  cc = f32[4,16] concatenate(p, dus), dimensions={1}
  r = f32[32,2] reshape(cc)
  b = f32[3,4,8] broadcast(p), dimensions={1,2}
  bs = f32[5] broadcast(zero), dimensions={}
  io = s32[4,8] iota(), iota_dimension=1
  k = s64[2] constant({1, 2})
  wide = f32[2,2] bitcast-convert(k)
  ROOT out = (f32[7,15], f32[32,2], f32[3,4,8], f32[5], s32[4,8], f32[3,2]) tuple(pd, r, b, bs, io, sl)
}",
    );
}

#[test]
fn valid_reductions() {
    assert_ok(&format!(
        "HloModule m
{ADD}
argmax {{
  v0 = f32[] parameter(0)
  i0 = s32[] parameter(1)
  v1 = f32[] parameter(2)
  i1 = s32[] parameter(3)
  gt = pred[] compare(v0, v1), direction=GT
  v = f32[] select(gt, v0, v1)
  i = s32[] select(gt, i0, i1)
  ROOT vi = (f32[], s32[]) tuple(v, i)
}}
less {{
  la = f32[] parameter(0)
  lb = f32[] parameter(1)
  lc = s32[] parameter(2)
  ld = s32[] parameter(3)
  ROOT lt = pred[] compare(la, lb), direction=LT
}}
ge {{
  ga = f32[] parameter(0)
  gb = f32[] parameter(1)
  ROOT g = pred[] compare(ga, gb), direction=GE
}}
ENTRY e {{
  p = f32[8,16] parameter(0)
  zero = f32[] constant(0)
  r = f32[16] reduce(p, zero), dimensions={{0}}, to_apply=add
  io = s32[8,16] iota(), iota_dimension=0
  mz = s32[] constant(0)
  am = (f32[16], s32[16]) reduce(p, io, zero, mz), dimensions={{0}}, to_apply=argmax
  rw = f32[8,16] reduce-window(p, zero), window={{size=1x64 pad=0_0x63_0}}, to_apply=add
  rw2 = f32[4,8] reduce-window(p, zero), window={{size=2x4 stride=2x2 pad=0_0x1_1}}, to_apply=add
  srt = (f32[8,16], s32[8,16]) sort(p, io), dimensions={{1}}, to_apply=less
  src = f32[4,8] parameter(1)
  sas = f32[8,16] select-and-scatter(p, src, zero), window={{size=2x2 stride=2x2}}, select=ge, scatter=add
  mp = f32[8,16] map(p, p), to_apply=add
  ROOT t = (f32[16], (f32[16], s32[16]), f32[8,16], f32[4,8], (f32[8,16], s32[8,16]), f32[8,16], f32[8,16]) tuple(r, am, rw, rw2, srt, sas, mp)
}}"
    ));
}

#[test]
fn valid_dot_and_convolution() {
    assert_ok(
        "HloModule m
ENTRY e {
  a = bf16[4,5,6] parameter(0)
  b = bf16[4,6,7] parameter(1)
  d = f32[4,5,7] dot(a, b), lhs_batch_dims={0}, rhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_contracting_dims={1}
  d2 = bf16[4,5,7] dot(a, b), lhs_batch_dims={0}, rhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_contracting_dims={1}
  x = s8[3,4] parameter(2)
  y = s8[4,2] parameter(3)
  di = s32[3,2] dot(x, y), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  o = f32[4,6,7,4,5,6] dot(b, a), lhs_contracting_dims={}, rhs_contracting_dims={}
  img = f32[8,32,32,3] parameter(4)
  k = f32[3,3,3,16] parameter(5)
  cv = f32[8,16,16,16] convolution(img, k), window={size=3x3 stride=2x2 pad=1_1x1_1}, dim_labels=b01f_01io->b01f
  dw = f32[3,3,4,8] parameter(6)
  g = f32[8,32,32,8] parameter(7)
  gc = f32[8,32,32,8] convolution(g, dw), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f, feature_group_count=2
  ROOT t = (f32[4,5,7], bf16[4,5,7], s32[3,2], f32[4,6,7,4,5,6], f32[8,16,16,16], f32[8,32,32,8]) tuple(d, d2, di, o, cv, gc)
}",
    );
}

#[test]
fn valid_gather_scatter() {
    assert_ok(&with_add(
        "ENTRY e {
  table = f32[100,64] parameter(0)
  ids = s32[8,1] parameter(1)
  g = f32[8,64] gather(table, ids), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,64}
  ids2 = s32[8] parameter(2)
  g2 = f32[8,64] gather(table, ids2), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,64}
  upd = f32[8,64] parameter(3)
  sc = f32[100,64] scatter(table, ids, upd), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=add
  ROOT t = (f32[8,64], f32[8,64], f32[100,64]) tuple(g, g2, sc)
}",
    ));
}

#[test]
fn valid_control_flow() {
    assert_ok(
        "HloModule m
cond {
  c = (s32[], f32[4]) parameter(0)
  ci = s32[] get-tuple-element(c), index=0
  n = s32[] constant(10)
  ROOT lt = pred[] compare(ci, n), direction=LT
}
body {
  b = (s32[], f32[4]) parameter(0)
  bi = s32[] get-tuple-element(b), index=0
  bx = f32[4] get-tuple-element(b), index=1
  one = s32[] constant(1)
  i2 = s32[] add(bi, one)
  x2 = f32[4] exponential(bx)
  ROOT bt = (s32[], f32[4]) tuple(i2, x2)
}
neg {
  np = f32[4] parameter(0)
  ROOT nn = f32[4] negate(np)
}
ident {
  ip = f32[4] parameter(0)
  ROOT ic = f32[4] copy(ip)
}
fl {
  fp = f32[4] parameter(0)
  ROOT ff = f32[4] floor(fp)
}
sq {
  sp = f32[4] parameter(0)
  sq2 = f32[4] parameter(1)
  ROOT sm = f32[4] multiply(sp, sq2)
}
ENTRY e {
  x = f32[4] parameter(0)
  k = s32[] parameter(1)
  z = s32[] constant(0)
  init = (s32[], f32[4]) tuple(z, x)
  w = (s32[], f32[4]) while(init), condition=cond, body=body
  y = f32[4] get-tuple-element(w), index=1
  c3 = f32[4] conditional(k, y, y, y), branch_computations={neg, ident, fl}
  pr = pred[] constant(true)
  c2 = f32[4] conditional(pr, c3, y), true_computation=neg, false_computation=fl
  cl = f32[4] call(c2, y), to_apply=sq
  both = (f32[4], (s32[], f32[4])) tuple(cl, w)
  cp = (f32[4], (s32[], f32[4])) copy(both)
  ROOT r = (f32[4], (s32[], f32[4])) opt-barrier(cp)
}",
    );
}

#[test]
fn valid_collectives_and_shardings() {
    assert_ok(&format!(
        "HloModule m, num_partitions=8
{ADD}
ENTRY e {{
  p = f32[16,32] parameter(0), sharding={{devices=[8,1]<=[8]}}
  ar = f32[16,32] all-reduce(p), channel_id=1, replica_groups=[2,4]<=[8], use_global_device_ids=true, to_apply=add
  ag = f32[16,128] all-gather(ar), channel_id=2, replica_groups=[2,4]<=[4,2]T(1,0), dimensions={{1}}, use_global_device_ids=true
  rs = f32[16,32] reduce-scatter(ag), channel_id=3, replica_groups={{{{0,1,2,3}},{{4,5,6,7}}}}, dimensions={{1}}, use_global_device_ids=true, to_apply=add
  a2a = f32[16,32] all-to-all(rs), channel_id=4, replica_groups={{{{0,1}},{{2,3}},{{4,5}},{{6,7}}}}, dimensions={{0}}
  cp = f32[16,32] collective-permute(a2a), channel_id=5, source_target_pairs={{{{0,1}},{{1,0}}}}
  mg = f32[32,32] all-gather(cp), channel_id=6, replica_groups=mesh['x'=2,'y'=4] {{'x'}}, dimensions={{0}}, use_global_device_ids=true, sharding={{devices=[2,1,4]<=[8] last_tile_dim_replicate}}
  pid = u32[] partition-id()
  rid = u32[] replica-id()
  ROOT t = (f32[32,32], u32[], u32[]) tuple(mg, pid, rid), sharding={{{{devices=[2,2,2]0,1,2,3,4,5,6,7 last_tile_dims={{manual}}}}, {{replicated}}, {{maximal device=3}}}}
}}"
    ));
}

#[test]
fn valid_async_sugar_and_native_async() {
    assert_ok(&with_add(
        "ENTRY e {
  p = f32[8] parameter(0)
  rs-start = ((f32[8]), f32[2]) reduce-scatter-start(p), replica_groups={{0,1,2,3}}, dimensions={0}, to_apply=add
  rs-done = f32[2] reduce-scatter-done(rs-start)
  ars = f32[8] all-reduce-start(p), replica_groups={{0,1}}, to_apply=add
  ard = f32[8] all-reduce-done(ars)
  ags = (f32[8], f32[16]) all-gather-start(ard), replica_groups={{0,1}}, dimensions={0}
  agd = f32[16] all-gather-done(ags)
  ROOT t = (f32[2], f32[16]) tuple(rs-done, agd)
}",
    ));
}

#[test]
fn valid_without_header_counts() {
    // Empty replica groups take their size from the run's configuration.
    assert_ok(
        "HloModule m
ENTRY e {
  a = u4[1024,512]{1,0:E(4)} parameter(0)
  ROOT b = u4[1024,4096]{1,0:E(4)} all-gather(a), dimensions={1}
}",
    );
}
