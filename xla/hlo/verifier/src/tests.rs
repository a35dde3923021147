//! Unit tests: small hand-written modules. Valid ones must verify cleanly;
//! each broken one must report the expected error on the expected
//! instruction. Modules the text format cannot express (dangling ids,
//! duplicate computation names, cycles) are built through the IR API.

use crate::{verify, VerifierError};
use xla_hlo_ir::{
    AttrKey, AttrValue, CompId, HloComputation, HloInstruction, HloModule, InstrId, Opcode,
    PrimitiveType, Shape,
};

fn parse(text: &str) -> HloModule {
    xla_hlo_parser::parse_module(text).unwrap_or_else(|e| panic!("test module does not parse: {e}"))
}

fn errors(text: &str) -> Vec<VerifierError> {
    match verify(&parse(text)) {
        Ok(()) => Vec::new(),
        Err(e) => e.0,
    }
}

#[track_caller]
fn assert_ok(text: &str) {
    let errs = errors(text);
    assert!(
        errs.is_empty(),
        "expected no errors, got:\n{}",
        errs.iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// Asserts an error on instruction `instr` (or on the computation when
/// `instr` is empty) whose message contains `needle`.
#[track_caller]
fn assert_error_in(errs: &[VerifierError], instr: &str, needle: &str) {
    let hit = errs.iter().any(|e| {
        let on = if instr.is_empty() {
            e.instruction.is_none()
        } else {
            e.instruction.as_deref() == Some(instr)
        };
        on && e.message.contains(needle)
    });
    assert!(
        hit,
        "expected an error on '{instr}' containing '{needle}', got:\n{}",
        errs.iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[track_caller]
fn assert_error(text: &str, instr: &str, needle: &str) {
    assert_error_in(&errors(text), instr, needle);
}

const ADD: &str = "
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
";

fn with_add(body: &str) -> String {
    format!("HloModule m\n{ADD}\n{body}")
}

// ---------------------------------------------------------------- valid

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

// ---------------------------------------------------------------- broken: structure

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
    assert_error(
        "HloModule m
f {
  p = f32[2] parameter(0)
  ROOT x = f32[2] negate(p)
}
ENTRY e {
  q = f32[2] parameter(0)
  ROOT x = f32[2] call(q), to_apply=f
}",
        "x",
        "not unique",
    );
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

// ---------------------------------------------------------------- broken: shapes

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

// ---------------------------------------------------------------- broken: called computations

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
  ROOT s = f32[] add(a, b)
}
ENTRY e {
  p = f32[8] parameter(0)
  ROOT s = f32[8] sort(p), dimensions={0}, to_apply=cmp
}",
        "s",
        "returns f32[] but pred[] is expected",
    );
}

// ---------------------------------------------------------------- broken: shardings and header

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

// ---------------------------------------------------------------- IR-built modules

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

/// Corrupts every id and attribute of a valid module in turn: the verifier
/// must never panic and must flag each dangling id.
#[test]
fn never_panics_on_corruption() {
    let base = parse(&with_add(
        "ENTRY e {
  p = f32[4,8] parameter(0), sharding={devices=[2,2]<=[4]}
  z = f32[] constant(0)
  r = f32[4] reduce(p, z), dimensions={1}, to_apply=add
  ag = f32[4,16] all-gather(p), replica_groups=[2,2]<=[2,2]T(1,0), dimensions={1}
  ids = s32[2,1] parameter(1)
  g = f32[2,8] gather(p, ids), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,8}
  ROOT t = (f32[4], f32[4,16]) tuple(r, ag)
}",
    ));
    let garbage = [
        AttrValue::Int(-5),
        AttrValue::Int(i64::MAX),
        AttrValue::Ints(vec![i64::MIN, 99, -1]),
        AttrValue::Computation(CompId(1000)),
        AttrValue::Computations(vec![CompId(1000), CompId(0)]),
        AttrValue::Ident("x".into()),
    ];
    for ci in 0..base.computations.len() {
        for ii in 0..base.computations[ci].instructions.len() {
            let keys: Vec<AttrKey> = base.computations[ci].instructions[ii]
                .attrs
                .iter()
                .map(|a| a.key)
                .collect();
            for key in keys {
                for g in &garbage {
                    let mut m = base.clone();
                    m.computations[ci].instructions[ii].set_attr(key, g.clone());
                    let _ = verify(&m);
                }
            }
            for bad in [InstrId(ii as u32), InstrId(u32::MAX)] {
                let mut m = base.clone();
                m.computations[ci].instructions[ii].operands.push(bad);
                assert!(verify(&m).is_err());
            }
            for &op in Opcode::ALL {
                let mut m = base.clone();
                m.computations[ci].instructions[ii].opcode = op;
                let _ = verify(&m);
            }
        }
    }
}

/// Random mutations (xorshift-driven, reproducible) of a module exercising
/// many opcodes: ids, opcodes, shapes, attributes and shardings. The
/// verifier must never panic, whatever it is given.
#[test]
fn never_panics_on_random_mutations() {
    use xla_hlo_ir::sharding::{HloSharding, ShardingKind, SingleSharding, TileAssignment};
    let base = parse(&with_add(
        "ENTRY e {
  p = f32[4,8] parameter(0), sharding={devices=[2,2]<=[4]}
  q = s32[2,1] parameter(1)
  z = f32[] constant(0)
  r = f32[4] reduce(p, z), dimensions={1}, to_apply=add
  ag = f32[4,16] all-gather(p), replica_groups=[2,2]<=[2,2]T(1,0), dimensions={1}
  g = f32[2,8] gather(p, q), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,8}
  c = f32[4,4] convolution(p, p), dim_labels=bf_oi->bf
  d = f32[4,4] dot(p, p), lhs_contracting_dims={1}, rhs_contracting_dims={1}
  rw = f32[2,4] reduce-window(p, z), window={size=2x2 stride=2x2}, to_apply=add
  pd = f32[6,8] pad(p, z), padding=1_1x0_0
  ROOT t = (f32[4], f32[4,16], f32[2,8], f32[4,4], f32[4,4], f32[2,4], f32[6,8]) tuple(r, ag, g, c, d, rw, pd)
}",
    ));
    assert!(verify(&base).is_ok(), "{:?}", verify(&base));
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let pool_vals = [
        AttrValue::Int(-1),
        AttrValue::Int(3),
        AttrValue::Int(i64::MAX),
        AttrValue::Ints(vec![]),
        AttrValue::Ints(vec![0, 0]),
        AttrValue::Ints(vec![1, 0, i64::MIN]),
        AttrValue::IntLists(vec![vec![0, 1], vec![1]]),
        AttrValue::Computation(CompId(0)),
        AttrValue::Computation(CompId(77)),
        AttrValue::Computations(vec![]),
    ];
    let keys = [
        AttrKey::Dimensions,
        AttrKey::ToApply,
        AttrKey::Index,
        AttrKey::SliceSizes,
        AttrKey::OffsetDims,
        AttrKey::IndexVectorDim,
        AttrKey::FeatureGroupCount,
        AttrKey::BatchGroupCount,
        AttrKey::LhsContractingDims,
        AttrKey::SourceTargetPairs,
        AttrKey::BranchComputations,
        AttrKey::K,
    ];
    let dims_pool: [&[i64]; 6] = [&[], &[0], &[-3, 2], &[i64::MAX, 2], &[4, 8], &[1, 1, 1, 1]];
    for _ in 0..3000 {
        let mut m = base.clone();
        for _ in 0..(1 + next() % 3) {
            let ci = (next() as usize) % m.computations.len();
            let n = m.computations[ci].instructions.len();
            let ii = (next() as usize) % n;
            let ins = &mut m.computations[ci].instructions[ii];
            match next() % 7 {
                0 => ins.opcode = Opcode::ALL[(next() as usize) % Opcode::ALL.len()],
                1 => {
                    let k = (next() % 4) as usize;
                    ins.operands = (0..k)
                        .map(|_| InstrId((next() % (n as u64 + 2)) as u32))
                        .collect();
                }
                2 => {
                    let d = dims_pool[(next() as usize) % dims_pool.len()];
                    ins.shape = Shape::array(
                        PrimitiveType::ALL[(next() as usize) % PrimitiveType::ALL.len()],
                        d.to_vec(),
                    );
                }
                3 => {
                    let k = keys[(next() as usize) % keys.len()];
                    ins.set_attr(k, pool_vals[(next() as usize) % pool_vals.len()].clone());
                }
                4 => {
                    let d = dims_pool[(next() as usize) % dims_pool.len()].to_vec();
                    let r = dims_pool[(next() as usize) % dims_pool.len()].to_vec();
                    let perm = dims_pool[(next() as usize) % dims_pool.len()].to_vec();
                    ins.sharding = Some(HloSharding::Single(SingleSharding::new(
                        ShardingKind::Tiled {
                            tile_assignment: TileAssignment::Iota {
                                dims: d,
                                reshape_dims: r,
                                perm,
                            },
                            replicate_on_last_tile_dim: next() % 2 == 0,
                            last_tile_dims: vec![],
                        },
                    )));
                }
                5 => ins.shape = Shape::tuple(vec![ins.shape.clone()]),
                _ => ins.parameter_number = Some((next() % 5) as i64 - 1),
            }
        }
        let _ = verify(&m);
    }
}
