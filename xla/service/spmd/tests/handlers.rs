//! Every handler checked by execution: a small module is run globally on
//! one device and partitioned on N loopback devices (inputs split, outputs
//! assembled, replicas required to agree); results must be equal (exactly
//! for integers and for float ops whose order is unchanged).

mod common;
use common::check;

const ADD: &str = "%add (x: f32[], y: f32[]) -> f32[] {\n  %x = f32[] parameter(0)\n  %y = f32[] parameter(1)\n  ROOT %s = f32[] add(%x, %y)\n}\n\n";
const MAX: &str = "%max (mx: f32[], my: f32[]) -> f32[] {\n  %mx = f32[] parameter(0)\n  %my = f32[] parameter(1)\n  ROOT %ms = f32[] maximum(%mx, %my)\n}\n\n";

fn module(body: &str, comps: &str, n: i64) -> String {
    format!("HloModule t, num_partitions={n}\n\n{comps}{body}")
}

#[test]
fn elementwise_with_mixed_shardings() {
    let m = module(
        "ENTRY %e (a: f32[16,12], b: f32[16,12]) -> f32[16,12] {\n  %a = f32[16,12] parameter(0), sharding={devices=[4,2]<=[8]}\n  %b = f32[16,12] parameter(1), sharding={devices=[2,4]<=[8]}\n  %m = f32[16,12] multiply(%a, %b), sharding={devices=[8,1]<=[8]}\n  ROOT %n = f32[16,12] negate(%m), sharding={devices=[1,4,2]<=[8] last_tile_dim_replicate}\n}\n",
        "",
        8,
    );
    check(&m, 8, false, 0.0, 1);
}

#[test]
fn dot_contracting_sharded_reduce_scatter() {
    let m = module(
        "ENTRY %e (a: f32[32,64], b: f32[64,48]) -> f32[32,48] {\n  %a = f32[32,64] parameter(0), sharding={devices=[1,8]<=[8]}\n  %b = f32[64,48] parameter(1), sharding={devices=[8,1]<=[8]}\n  ROOT %d = f32[32,48] dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={devices=[8,1]<=[8]}\n}\n",
        "",
        8,
    );
    let (s, _) = check(&m, 8, false, 1e-5, 2);
    assert_eq!(s.collectives.get("reduce-scatter"), Some(&1), "{s:?}");
    assert_eq!(s.collective_bytes, 4 * 48 * 4);
}

#[test]
fn dot_batch_and_mixed_2d_mesh() {
    let m = module(
        "ENTRY %e (a: f32[4,8,16], b: f32[4,16,12]) -> f32[4,8,12] {\n  %a = f32[4,8,16] parameter(0), sharding={devices=[2,1,4]<=[8]}\n  %b = f32[4,16,12] parameter(1), sharding={devices=[2,4,1]<=[8]}\n  ROOT %d = f32[4,8,12] dot(%a, %b), lhs_batch_dims={0}, rhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_contracting_dims={1}, sharding={devices=[2,1,1,4]<=[8] last_tile_dim_replicate}\n}\n",
        "",
        8,
    );
    let (s, _) = check(&m, 8, false, 1e-5, 3);
    assert_eq!(s.collectives.get("all-reduce"), Some(&1), "{s:?}");
}

#[test]
fn dot_uneven_contracting_dim_is_masked() {
    let m = module(
        "ENTRY %e (a: f32[6,10], b: f32[10,5]) -> f32[6,5] {\n  %a = f32[6,10] parameter(0), sharding={devices=[1,4]<=[4]}\n  %b = f32[10,5] parameter(1), sharding={devices=[4,1]<=[4]}\n  ROOT %d = f32[6,5] dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={replicated}\n}\n",
        "",
        4,
    );
    check(&m, 4, false, 1e-5, 4);
}

#[test]
fn dot_on_3d_mesh() {
    let m = module(
        "ENTRY %e (a: f32[8,16], b: f32[16,8]) -> f32[8,8] {\n  %a = f32[8,16] parameter(0), sharding={devices=[2,2,2]<=[8] last_tile_dim_replicate}\n  %b = f32[16,8] parameter(1), sharding={devices=[2,2,2]<=[2,2,2]T(1,0,2) last_tile_dim_replicate}\n  ROOT %d = f32[8,8] dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={devices=[2,2,2]<=[8] last_tile_dim_replicate}\n}\n",
        "",
        8,
    );
    check(&m, 8, false, 1e-5, 5);
}

#[test]
fn reduce_uneven_and_variadic() {
    let comps = format!(
        "{ADD}%argmax (a: f32[], ai: s32[], b: f32[], bi: s32[]) -> (f32[], s32[]) {{\n  %ga = f32[] parameter(0)\n  %gai = s32[] parameter(1)\n  %gb = f32[] parameter(2)\n  %gbi = s32[] parameter(3)\n  %ggt = pred[] compare(%ga, %gb), direction=GT\n  %geq = pred[] compare(%ga, %gb), direction=EQ\n  %glt = pred[] compare(%gai, %gbi), direction=LT\n  %gtie = pred[] and(%geq, %glt)\n  %gtake = pred[] or(%ggt, %gtie)\n  %gv = f32[] select(%gtake, %ga, %gb)\n  %gi = s32[] select(%gtake, %gai, %gbi)\n  ROOT %gt = (f32[], s32[]) tuple(%gv, %gi)\n}}\n\n"
    );
    let m = module(
        "ENTRY %e (a: f32[30,12]) -> (f32[12], f32[30], s32[12]) {\n  %a = f32[30,12] parameter(0), sharding={devices=[8,1]<=[8]}\n  %z = f32[] constant(0)\n  %r = f32[12] reduce(%a, %z), dimensions={0}, to_apply=%add, sharding={replicated}\n  %r2 = f32[30] reduce(%a, %z), dimensions={1}, to_apply=%add, sharding={devices=[8]<=[8]}\n  %io = s32[30,12] iota(), iota_dimension=0, sharding={devices=[8,1]<=[8]}\n  %mi = f32[] constant(-inf)\n  %zi = s32[] constant(0)\n  %am = (f32[12], s32[12]) reduce(%a, %io, %mi, %zi), dimensions={0}, to_apply=%argmax, sharding={{replicated}, {replicated}}\n  %ai = s32[12] get-tuple-element(%am), index=1, sharding={replicated}\n  ROOT %t = (f32[12], f32[30], s32[12]) tuple(%r, %r2, %ai), sharding={{replicated}, {devices=[8]<=[8]}, {replicated}}\n}\n",
        &comps,
        8,
    );
    check(&m, 8, false, 1e-5, 6);
}

#[test]
fn broadcast_transpose_reshape() {
    let m = module(
        "ENTRY %e (a: f32[8,6], b: f32[4,8,16]) -> (f32[8,5,6], f32[6,8], f32[32,16], f32[4,2,4,16]) {\n  %a = f32[8,6] parameter(0), sharding={devices=[4,2]<=[8]}\n  %bc = f32[8,5,6] broadcast(%a), dimensions={0,2}, sharding={devices=[2,2,2]<=[8]}\n  %t = f32[6,8] transpose(%a), dimensions={1,0}, sharding={devices=[8,1]<=[8]}\n  %b = f32[4,8,16] parameter(1), sharding={devices=[1,8,1]<=[8]}\n  %r = f32[32,16] reshape(%b), sharding={devices=[8,1]<=[8]}\n  %r2 = f32[4,2,4,16] reshape(%b), sharding={devices=[1,2,4,1]<=[8]}\n  ROOT %o = (f32[8,5,6], f32[6,8], f32[32,16], f32[4,2,4,16]) tuple(%bc, %t, %r, %r2), sharding={{devices=[2,2,2]<=[8]}, {devices=[8,1]<=[8]}, {devices=[8,1]<=[8]}, {devices=[1,2,4,1]<=[8]}}\n}\n",
        "",
        8,
    );
    check(&m, 8, false, 0.0, 7);
}

#[test]
fn slice_pad_halo_exchange() {
    let m = module(
        "ENTRY %e (a: f32[64,8]) -> (f32[72,8], f32[56,8], f32[32,8], f32[127,8], f32[30,8]) {\n  %a = f32[64,8] parameter(0), sharding={devices=[8,1]<=[8]}\n  %c = f32[] constant(-1)\n  %p = f32[72,8] pad(%a, %c), padding=3_5x0_0, sharding={devices=[8,1]<=[8]}\n  %s = f32[56,8] slice(%a), slice={[5:61], [0:8]}, sharding={devices=[8,1]<=[8]}\n  %s2 = f32[32,8] slice(%a), slice={[1:64:2], [0:8]}, sharding={devices=[8,1]<=[8]}\n  %p2 = f32[127,8] pad(%a, %c), padding=0_0_1x0_0, sharding={devices=[8,1]<=[8]}\n  %s3 = f32[30,8] slice(%a), slice={[3:63:2], [0:8]}, sharding={devices=[8,1]<=[8]}\n  ROOT %o = (f32[72,8], f32[56,8], f32[32,8], f32[127,8], f32[30,8]) tuple(%p, %s, %s2, %p2, %s3), sharding={{devices=[8,1]<=[8]}, {devices=[8,1]<=[8]}, {devices=[8,1]<=[8]}, {devices=[8,1]<=[8]}, {devices=[8,1]<=[8]}}\n}\n",
        "",
        8,
    );
    check(&m, 8, false, 0.0, 8);
}

#[test]
fn reduce_window_halo_and_gather() {
    let comps = format!("{ADD}{MAX}");
    let m = module(
        "ENTRY %e (a: f32[4,64]) -> (f32[4,64], f32[4,64], f32[4,31]) {\n  %a = f32[4,64] parameter(0), sharding={devices=[1,8]<=[8]}\n  %z = f32[] constant(0)\n  %cs = f32[4,64] reduce-window(%a, %z), window={size=1x64 pad=0_0x63_0}, to_apply=%add, sharding={devices=[1,8]<=[8]}\n  %mi = f32[] constant(-inf)\n  %rmx = f32[4,64] reduce-window(%a, %mi), window={size=1x3 pad=0_0x1_1}, to_apply=%max, sharding={devices=[1,8]<=[8]}\n  %ws = f32[4,31] reduce-window(%a, %z), window={size=1x4 stride=1x2}, to_apply=%add, sharding={devices=[1,8]<=[8]}\n  ROOT %o = (f32[4,64], f32[4,64], f32[4,31]) tuple(%cs, %rmx, %ws), sharding={{devices=[1,8]<=[8]}, {devices=[1,8]<=[8]}, {replicated}}\n}\n",
        &comps,
        8,
    );
    check(&m, 8, false, 1e-5, 9);
}

#[test]
fn convolution_spatial_and_batch() {
    let m = module(
        "ENTRY %e (x: f32[2,16,8,3], k: f32[3,3,3,4]) -> (f32[2,16,8,4], f32[2,8,4,4]) {\n  %x = f32[2,16,8,3] parameter(0), sharding={devices=[1,4,1,1]<=[4]}\n  %k = f32[3,3,3,4] parameter(1), sharding={replicated}\n  %c = f32[2,16,8,4] convolution(%x, %k), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f, sharding={devices=[1,4,1,1]<=[4]}\n  %c2 = f32[2,8,4,4] convolution(%x, %k), window={size=3x3 stride=2x2 pad=1_1x1_1}, dim_labels=b01f_01io->b01f, sharding={devices=[2,2,1,1]<=[4]}\n  ROOT %o = (f32[2,16,8,4], f32[2,8,4,4]) tuple(%c, %c2), sharding={{devices=[1,4,1,1]<=[4]}, {devices=[2,2,1,1]<=[4]}}\n}\n",
        "",
        4,
    );
    let (s, _) = check(&m, 4, false, 1e-4, 10);
    assert!(!s.collectives.contains_key("all-gather"), "{s:?}");
}

#[test]
fn concatenate_and_dynamic_slices() {
    let m = module(
        "ENTRY %e (a: f32[32,8], b: f32[16,8], i: s32[], u: f32[8,8]) -> (f32[48,8], f32[8,8], f32[32,8], f32[32,4]) {\n  %a = f32[32,8] parameter(0), sharding={devices=[8,1]<=[8]}\n  %b = f32[16,8] parameter(1), sharding={devices=[8,1]<=[8]}\n  %c = f32[48,8] concatenate(%a, %b), dimensions={0}, sharding={devices=[8,1]<=[8]}\n  %i = s32[] parameter(2), sharding={replicated}\n  %z = s32[] constant(0)\n  %ds = f32[8,8] dynamic-slice(%a, %i, %z), dynamic_slice_sizes={8,8}, sharding={replicated}\n  %u = f32[8,8] parameter(3), sharding={replicated}\n  %dus = f32[32,8] dynamic-update-slice(%a, %u, %i, %z), sharding={devices=[8,1]<=[8]}\n  %ds2 = f32[32,4] dynamic-slice(%a, %z, %i), dynamic_slice_sizes={32,4}, sharding={devices=[8,1]<=[8]}\n  ROOT %o = (f32[48,8], f32[8,8], f32[32,8], f32[32,4]) tuple(%c, %ds, %dus, %ds2), sharding={{devices=[8,1]<=[8]}, {replicated}, {devices=[8,1]<=[8]}, {devices=[8,1]<=[8]}}\n}\n",
        "",
        8,
    );
    check(&m, 8, false, 0.0, 11);
}

#[test]
fn sort_iota_reverse() {
    let comps = "%lt (la: f32[], lb: f32[], lc: s32[], ld: s32[]) -> pred[] {\n  %la = f32[] parameter(0)\n  %lb = f32[] parameter(1)\n  %lc = s32[] parameter(2)\n  %ld = s32[] parameter(3)\n  ROOT %lr = pred[] compare(%la, %lb), direction=LT\n}\n\n";
    let m = module(
        "ENTRY %e (a: f32[16,32]) -> (f32[16,32], s32[16,32], f32[16,32]) {\n  %a = f32[16,32] parameter(0), sharding={devices=[8,1]<=[8]}\n  %io = s32[16,32] iota(), iota_dimension=1, sharding={devices=[2,4]<=[8]}\n  %s = (f32[16,32], s32[16,32]) sort(%a, %io), dimensions={1}, is_stable=true, to_apply=%lt, sharding={{devices=[1,8]<=[8]}, {devices=[1,8]<=[8]}}\n  %v = f32[16,32] get-tuple-element(%s), index=0, sharding={devices=[1,8]<=[8]}\n  %i = s32[16,32] get-tuple-element(%s), index=1, sharding={devices=[8,1]<=[8]}\n  %r = f32[16,32] reverse(%a), dimensions={0,1}, sharding={devices=[4,2]<=[8]}\n  ROOT %o = (f32[16,32], s32[16,32], f32[16,32]) tuple(%v, %i, %r), sharding={{devices=[1,8]<=[8]}, {devices=[8,1]<=[8]}, {devices=[4,2]<=[8]}}\n}\n",
        comps,
        8,
    );
    check(&m, 8, false, 0.0, 12);
}

#[test]
fn gather_vocab_sharded_and_batch_sharded() {
    let m = module(
        "ENTRY %e (t: f32[64,16], ids: s32[4,6]) -> (f32[4,6,16], f32[4,6,16]) {\n  %t = f32[64,16] parameter(0), sharding={devices=[8,1]<=[8]}\n  %ids = s32[4,6] parameter(1), sharding={replicated}\n  %r = s32[4,6,1] reshape(%ids), sharding={replicated}\n  %g = f32[4,6,16] gather(%t, %r), offset_dims={2}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=2, slice_sizes={1,16}, sharding={replicated}\n  %g2 = f32[4,6,16] gather(%t, %r), offset_dims={2}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=2, slice_sizes={1,16}, sharding={devices=[4,1,1,2]<=[8] last_tile_dim_replicate}\n  ROOT %o = (f32[4,6,16], f32[4,6,16]) tuple(%g, %g2), sharding={{replicated}, {devices=[4,1,1,2]<=[8] last_tile_dim_replicate}}\n}\n",
        "",
        8,
    );
    check(&m, 8, false, 0.0, 13);
}

#[test]
fn while_and_conditional() {
    let comps = "%cond (cs: (s32[], f32[16,8])) -> pred[] {\n  %cs = (s32[], f32[16,8]) parameter(0)\n  %ci = s32[] get-tuple-element(%cs), index=0\n  %cn = s32[] constant(3)\n  ROOT %cc = pred[] compare(%ci, %cn), direction=LT\n}\n\n%body (ws: (s32[], f32[16,8])) -> (s32[], f32[16,8]) {\n  %ws = (s32[], f32[16,8]) parameter(0)\n  %wi = s32[] get-tuple-element(%ws), index=0\n  %wx = f32[16,8] get-tuple-element(%ws), index=1\n  %wone = s32[] constant(1)\n  %wj = s32[] add(%wi, %wone)\n  %wy = f32[16,8] add(%wx, %wx)\n  ROOT %wt = (s32[], f32[16,8]) tuple(%wj, %wy)\n}\n\n%br0 (px: f32[16,8]) -> f32[16,8] {\n  %px = f32[16,8] parameter(0)\n  ROOT %pn = f32[16,8] negate(%px)\n}\n\n%br1 (qx: f32[16,8]) -> f32[16,8] {\n  %qx = f32[16,8] parameter(0)\n  ROOT %qn = f32[16,8] exponential(%qx)\n}\n\n";
    let m = module(
        "ENTRY %e (a: f32[16,8], k: s32[]) -> (f32[16,8], f32[16,8]) {\n  %a = f32[16,8] parameter(0), sharding={devices=[8,1]<=[8]}\n  %z = s32[] constant(0)\n  %t = (s32[], f32[16,8]) tuple(%z, %a)\n  %w = (s32[], f32[16,8]) while(%t), condition=%cond, body=%body\n  %r = f32[16,8] get-tuple-element(%w), index=1\n  %k = s32[] parameter(1), sharding={replicated}\n  %c = f32[16,8] conditional(%k, %a, %a), branch_computations={%br0, %br1}\n  ROOT %o = (f32[16,8], f32[16,8]) tuple(%r, %c), sharding={{devices=[8,1]<=[8]}, {devices=[4,2]<=[8]}}\n}\n",
        comps,
        8,
    );
    check(&m, 8, true, 1e-5, 14);
}

#[test]
fn manual_region_round_trip() {
    let comps = ADD;
    let m = module(
        "ENTRY %e (a: f32[16,8]) -> f32[16,8] {\n  %a = f32[16,8] parameter(0), sharding={devices=[4,2]<=[8]}\n  %c = f32[16,8] copy(%a), sharding={devices=[4,2]<=[8]}\n  %f = f32[4,4] custom-call(%c), custom_call_target=\"SPMDFullToShardShape\", sharding={manual}\n  %ar = f32[4,4] all-reduce(%f), channel_id=1, replica_groups={{0,1},{2,3},{4,5},{6,7}}, use_global_device_ids=true, to_apply=%add, sharding={manual}\n  ROOT %o = f32[16,8] custom-call(%ar), custom_call_target=\"SPMDShardToFullShape\", sharding={devices=[4,2]<=[8]}\n}\n",
        comps,
        8,
    );
    // The global module's manual region needs 8 devices: its reference
    // result comes from the interpreter's own SPMD semantics.
    let global = common::parse(&m);
    let mut part = global.clone();
    xla_spmd_partitioner::partition_module(
        &mut part,
        &xla_spmd_partitioner::SpmdOptions {
            num_partitions: Some(8),
            ..Default::default()
        },
    )
    .unwrap();
    xla_hlo_verifier::verify(&part).unwrap();
    let mut rng = common::Rng(99);
    let shape = global.entry_computation().root_instr().shape.clone();
    let x = common::random_value(&shape, &mut rng);
    let want = xla_hlo_evaluator::evaluate_spmd(&global, std::slice::from_ref(&x), 8).unwrap();
    let got = common::run_partitioned(&part, &[x], &shape, 8).unwrap();
    common::compare(&got, &want[0][0], 0.0, &part);
}

#[test]
fn uneven_everything_replicated_round_trip() {
    let m = module(
        "ENTRY %e (a: f32[7,5], b: s32[7,5]) -> (f32[7,5], s32[5,7]) {\n  %a = f32[7,5] parameter(0), sharding={devices=[4,2]<=[8]}\n  %b = s32[7,5] parameter(1), sharding={devices=[2,4]<=[8]}\n  %x = f32[7,5] abs(%a), sharding={devices=[2,2,2]<=[8] last_tile_dim_replicate}\n  %t = s32[5,7] transpose(%b), dimensions={1,0}, sharding={devices=[8,1]<=[8]}\n  ROOT %o = (f32[7,5], s32[5,7]) tuple(%x, %t), sharding={{devices=[1,8]<=[8]}, {devices=[2,2,2]<=[8] last_tile_dim_replicate}}\n}\n",
        "",
        8,
    );
    check(&m, 8, false, 0.0, 15);
}

#[test]
fn reduce_emits_reduce_scatter_for_sharded_result() {
    let m = module(
        "ENTRY %e (a: f32[16,64]) -> f32[16] {\n  %a = f32[16,64] parameter(0), sharding={devices=[1,8]<=[8]}\n  %z = f32[] constant(0)\n  ROOT %r = f32[16] reduce(%a, %z), dimensions={1}, to_apply=%add, sharding={devices=[8]<=[8]}\n}\n",
        ADD,
        8,
    );
    let (s, _) = check(&m, 8, false, 1e-5, 16);
    assert_eq!(s.collectives.get("reduce-scatter"), Some(&1), "{s:?}");
    assert_eq!(s.collective_bytes, 2 * 4);
}

#[test]
fn scatter_into_sharded_rows_and_columns() {
    let m = module(
        "ENTRY %e (t: f32[60,16], ids: s32[10,1], u: f32[10,16]) -> (f32[60,16], f32[60,16]) {\n  %t = f32[60,16] parameter(0), sharding={devices=[8,1]<=[8]}\n  %ids = s32[10,1] parameter(1), sharding={replicated}\n  %u = f32[10,16] parameter(2), sharding={replicated}\n  %sc = f32[60,16] scatter(%t, %ids, %u), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=%add, sharding={devices=[8,1]<=[8]}\n  %s2 = f32[60,16] scatter(%t, %ids, %u), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=%add, sharding={devices=[1,8]<=[8]}\n  ROOT %o = (f32[60,16], f32[60,16]) tuple(%sc, %s2), sharding={{devices=[8,1]<=[8]}, {devices=[1,8]<=[8]}}\n}\n",
        ADD,
        8,
    );
    // Indices in range and out of range (skipped) alike.
    let (s, _) = check(&m, 8, false, 0.0, 17);
    assert_eq!(s.handlers.get("scatter:scatter"), Some(&2), "{s:?}");
}

#[test]
fn scatter_add_of_sharded_updates_all_reduces() {
    // Replicated operand, updates and indices sharded on the scatter batch
    // dims: local scatters into identity buffers, then an all-reduce (fewer
    // bytes than gathering the updates). Float add and max, int add, a
    // partially replicated 2-D batch, sharded and replicated results.
    const IADD: &str = "%iadd (ix: s32[], iy: s32[]) -> s32[] {\n  %ix = s32[] parameter(0)\n  %iy = s32[] parameter(1)\n  ROOT %is = s32[] add(%ix, %iy)\n}\n\n";
    let comps = format!("{ADD}{MAX}{IADD}");
    let m = module(
        "ENTRY %e (t: f32[60,16], ids: s32[1024,1], u: f32[1024,16], ti: s32[60,16], ids2: s32[8,8,1], u2: s32[8,8,16]) -> (f32[60,16], f32[60,16], s32[60,16]) {\n  %t = f32[60,16] parameter(0), sharding={replicated}\n  %ids = s32[1024,1] parameter(1), sharding={devices=[8,1]<=[8]}\n  %u = f32[1024,16] parameter(2), sharding={devices=[8,1]<=[8]}\n  %ti = s32[60,16] parameter(3), sharding={replicated}\n  %ids2 = s32[8,8,1] parameter(4), sharding={devices=[4,1,1,2]<=[8] last_tile_dim_replicate}\n  %u2 = s32[8,8,16] parameter(5), sharding={devices=[4,1,1,2]<=[8] last_tile_dim_replicate}\n  %sa = f32[60,16] scatter(%t, %ids, %u), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=%add, sharding={replicated}\n  %sm = f32[60,16] scatter(%t, %ids, %u), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=%max, sharding={devices=[1,8]<=[8]}\n  %si = s32[60,16] scatter(%ti, %ids2, %u2), update_window_dims={2}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=2, to_apply=%iadd, sharding={replicated}\n  ROOT %o = (f32[60,16], f32[60,16], s32[60,16]) tuple(%sa, %sm, %si), sharding={{replicated}, {devices=[1,8]<=[8]}, {replicated}}\n}\n",
        &comps,
        8,
    );
    for seed in [3, 29, 71] {
        let (s, _) = check(&m, 8, false, 1e-5, seed);
        assert_eq!(
            s.handlers.get("scatter:scatter_all_reduce"),
            Some(&3),
            "{s:?}"
        );
        assert_eq!(s.collectives.get("all-reduce"), Some(&3), "{s:?}");
        assert_eq!(s.collective_bytes, 3 * 60 * 16 * 4, "{s:?}");
    }
}

#[test]
fn depthwise_convolution_batch_and_spatial_sharded() {
    let m = module(
        "ENTRY %e (x: f32[4,16,8,6], k: f32[3,3,1,6]) -> f32[4,16,8,6] {\n  %x = f32[4,16,8,6] parameter(0), sharding={devices=[2,4,1,1]<=[8]}\n  %k = f32[3,3,1,6] parameter(1), sharding={replicated}\n  ROOT %c = f32[4,16,8,6] convolution(%x, %k), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f, feature_group_count=6, sharding={devices=[2,4,1,1]<=[8]}\n}\n",
        "",
        8,
    );
    let (s, _) = check(&m, 8, false, 1e-4, 18);
    assert!(!s.collectives.contains_key("all-gather"), "{s:?}");
}

#[test]
fn pass_reports_changes_honestly() {
    use xla_hlo_pass::{Pass, Pipeline};
    let texts = [
        // Sharded: changes.
        module(
            "ENTRY %e (a: f32[16,8]) -> f32[16,8] {\n  %a = f32[16,8] parameter(0), sharding={devices=[8,1]<=[8]}\n  ROOT %n = f32[16,8] negate(%a), sharding={devices=[1,8]<=[8]}\n}\n",
            "",
            8,
        ),
        // One partition, shardings on the signature only: nothing to do.
        module(
            "ENTRY %e (a: f32[16,8]) -> f32[16,8] {\n  %a = f32[16,8] parameter(0), sharding={replicated}\n  ROOT %n = f32[16,8] negate(%a), sharding={replicated}\n}\n",
            "",
            1,
        ),
        // No root sharding: one is added.
        module(
            "ENTRY %e (a: f32[16,8]) -> f32[16,8] {\n  %a = f32[16,8] parameter(0)\n  ROOT %n = f32[16,8] negate(%a)\n}\n",
            "",
            1,
        ),
    ];
    for (k, t) in texts.iter().enumerate() {
        let mut m = common::parse(t);
        let mut p = Pipeline::new("t")
            .add(xla_spmd_partitioner::SpmdPartitioner::default())
            .with_change_check(true);
        let r = p.run(&mut m).unwrap_or_else(|e| panic!("case {k}: {e}"));
        assert_eq!(r.changed(), k != 1, "case {k}");
        let _ = xla_spmd_partitioner::SpmdPartitioner::default().name();
    }
}

#[test]
fn multi_hop_windows_use_collective_permutes() {
    let m = module(
        "ENTRY %e (a: f32[64,8]) -> (f32[16,8], f32[64,8]) {\n  %a = f32[64,8] parameter(0), sharding={devices=[8,1]<=[8]}\n  %sl = f32[16,8] slice(%a), slice={[0:16], [0:8]}, sharding={devices=[8,1]<=[8]}\n  %z = f32[] constant(0)\n  %cs = f32[64,8] reduce-window(%a, %z), window={size=64x1 pad=63_0x0_0}, to_apply=%add, sharding={devices=[8,1]<=[8]}\n  ROOT %o = (f32[16,8], f32[64,8]) tuple(%sl, %cs), sharding={{devices=[8,1]<=[8]}, {devices=[8,1]<=[8]}}\n}\n",
        ADD,
        8,
    );
    let (s, _) = check(&m, 8, false, 1e-4, 19);
    assert!(!s.collectives.contains_key("all-gather"), "{s:?}");
}

/// topk over a sharded last dim (moved to the batch dim by an all-to-all or
/// replicated, whichever moves fewer bytes) and over a batch-sharded
/// operand (no communication): no fallback, results equal the global run.
#[test]
fn topk_on_sharded_last_dim_and_batch() {
    let m = module(
        "ENTRY %e (a: f32[16,40], b: f32[8,20]) -> (f32[16,3], s32[16,3], f32[8,5], s32[8,5]) {\n  %a = f32[16,40] parameter(0), sharding={devices=[2,4]<=[8]}\n  %t = (f32[16,3], s32[16,3]) topk(%a), k=3, largest=true, sharding={{devices=[8,1]<=[8]}, {devices=[8,1]<=[8]}}\n  %tv = f32[16,3] get-tuple-element(%t), index=0, sharding={devices=[8,1]<=[8]}\n  %ti = s32[16,3] get-tuple-element(%t), index=1, sharding={devices=[8,1]<=[8]}\n  %b = f32[8,20] parameter(1), sharding={devices=[8,1]<=[8]}\n  %u = (f32[8,5], s32[8,5]) topk(%b), k=5, largest=false, sharding={{devices=[8,1]<=[8]}, {devices=[8,1]<=[8]}}\n  %uv = f32[8,5] get-tuple-element(%u), index=0, sharding={devices=[8,1]<=[8]}\n  %ui = s32[8,5] get-tuple-element(%u), index=1, sharding={devices=[8,1]<=[8]}\n  ROOT %o = (f32[16,3], s32[16,3], f32[8,5], s32[8,5]) tuple(%tv, %ti, %uv, %ui), sharding={{devices=[8,1]<=[8]}, {devices=[8,1]<=[8]}, {devices=[8,1]<=[8]}, {devices=[8,1]<=[8]}}\n}\n",
        "",
        8,
    );
    let (summary, _) = check(&m, 8, false, 0.0, 21);
    assert_eq!(
        summary.handlers.get("topk:topk"),
        Some(&2),
        "{:?}",
        summary.handlers
    );
    assert!(
        !summary.handlers.keys().any(|k| k.ends_with(":fallback")),
        "{:?}",
        summary.handlers
    );
}

/// Depthwise (feature_group_count = channels) and 2-channels-per-group
/// convolutions with the channel dim sharded 4-way and the batch 2-way:
/// each device convolves its own groups, with no communication.
#[test]
fn grouped_convolution_on_sharded_features() {
    let m = module(
        "ENTRY %e (x: f32[4,6,6,8], k: f32[3,3,1,8], y: f32[2,5,5,8], w: f32[3,3,2,8]) -> (f32[4,6,6,8], f32[2,5,5,8]) {\n  %x = f32[4,6,6,8] parameter(0), sharding={devices=[2,1,1,4]<=[8]}\n  %k = f32[3,3,1,8] parameter(1), sharding={devices=[1,1,1,4,2]<=[8] last_tile_dim_replicate}\n  %c = f32[4,6,6,8] convolution(%x, %k), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f, feature_group_count=8, sharding={devices=[2,1,1,4]<=[8]}\n  %y = f32[2,5,5,8] parameter(2), sharding={devices=[1,1,1,8]<=[8]}\n  %w = f32[3,3,2,8] parameter(3), sharding={replicated}\n  %d = f32[2,5,5,8] convolution(%y, %w), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f, feature_group_count=4, sharding={devices=[2,1,1,4]<=[8]}\n  ROOT %o = (f32[4,6,6,8], f32[2,5,5,8]) tuple(%c, %d), sharding={{devices=[2,1,1,4]<=[8]}, {devices=[2,1,1,4]<=[8]}}\n}\n",
        "",
        8,
    );
    let (summary, part) = check(&m, 8, false, 1e-5, 22);
    assert_eq!(
        summary
            .handlers
            .get("convolution:convolution-grouped-features"),
        Some(&2),
        "{:?}",
        summary.handlers
    );
    // %c needs no communication at all (operands already aligned).
    let text = part.to_text();
    assert!(
        summary.collective_bytes < 2 * 5 * 5 * 8 * 4,
        "{} bytes\n{text}",
        summary.collective_bytes
    );
}

/// A slice that shrinks a sharded dim (16 -> 5 over 8 tiles: three output
/// tiles are padding) fetches only what the valid tiles need, one
/// collective-permute per distinct row range; a reshard from a partially
/// replicated tiling slices before it permutes. Both checked by execution
/// and by bytes (XLA's partitioner moves 36 and 64 bytes here).
#[test]
fn shrinking_slice_and_sliced_permute_move_little() {
    let m = module(
        "ENTRY %e (a: f32[3,16], x: f32[8,16]) -> (f32[3,5], f32[8,16]) {\n  %a = f32[3,16] parameter(0), sharding={devices=[1,8]<=[8]}\n  %s = f32[3,5] slice(%a), slice={[0:3], [0:5]}, sharding={devices=[1,8]<=[8]}\n  %x = f32[8,16] parameter(1), sharding={devices=[2,1,4]<=[8] last_tile_dim_replicate}\n  %y = f32[8,16] copy(%x), sharding={devices=[4,2]<=[2,4]T(1,0)}\n  ROOT %o = (f32[3,5], f32[8,16]) tuple(%s, %y), sharding={{devices=[1,8]<=[8]}, {devices=[4,2]<=[2,4]T(1,0)}}\n}\n",
        "",
        8,
    );
    let (summary, part) = check(&m, 8, false, 0.0, 23);
    let permute_bytes = summary
        .collective_bytes_by_op
        .get("collective-permute")
        .copied()
        .unwrap_or(0);
    // Slice: two ranges of one row x 3 columns; reshard: one [2,8] tile.
    assert!(permute_bytes > 0, "{:?}", summary.collective_bytes_by_op);
    assert!(
        permute_bytes <= 2 * 12 + 64,
        "{permute_bytes} bytes\n{}",
        part.to_text()
    );
}

/// A reshape splitting a sharded dim whose tiles do not line up with the
/// split (48 rows, 8 tiles -> [6,8] sharded on the 8) gathers only within
/// groups of 4, then slices and all-to-alls (XLA: 576 bytes); a reshard
/// from a partially replicated row tiling to another row tiling permutes
/// the small source tiles before gathering (XLA: 224 bytes with the
/// column gather). Checked by execution and bytes.
#[test]
fn reshape_partial_gather_and_permute_before_gather() {
    let m = module(
        "ENTRY %e (x: f32[48,4], y: f32[8,4]) -> (f32[6,8,4], f32[8,4]) {\n  %x = f32[48,4] parameter(0), sharding={devices=[8,1]<=[8]}\n  %r = f32[6,8,4] reshape(%x), sharding={devices=[1,8,1]<=[8]}\n  %y = f32[8,4] parameter(1), sharding={devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}\n  %z = f32[8,4] copy(%y), sharding={devices=[2,1,4]<=[8] last_tile_dim_replicate}\n  ROOT %o = (f32[6,8,4], f32[8,4]) tuple(%r, %z), sharding={{devices=[1,8,1]<=[8]}, {devices=[2,1,4]<=[8] last_tile_dim_replicate}}\n}\n",
        "",
        8,
    );
    let (summary, part) = check(&m, 8, false, 0.0, 24);
    // Reshape: gather 24x4 (384) + all-to-all 3x2x4 (96) + permute 6x4 (96);
    // reshard: permute 2x4 (32) + gather 4x4 (64).
    assert!(
        summary.collective_bytes <= 576 + 96,
        "{} bytes {:?}\n{}",
        summary.collective_bytes,
        summary.collective_bytes_by_op,
        part.to_text()
    );
}

/// A batched scatter (input_batching_dims, as the gradient of
/// take_along_axis) with the batch dim sharded on one axis and the
/// scattered dim on another: each device scatters its own batch rows into
/// its vocab tile with shifted indices, no communication.
#[test]
fn batched_scatter_keeps_batch_and_vocab_tiles() {
    let comps = "%sum (sa: f32[], sb: f32[]) -> f32[] {\n  %sa = f32[] parameter(0)\n  %sb = f32[] parameter(1)\n  ROOT %ss = f32[] add(%sa, %sb)\n}\n\n";
    let m = module(
        "ENTRY %e (z: f32[8,64], i: s32[8,1,1], u: f32[8,1]) -> f32[8,64] {\n  %z = f32[8,64] parameter(0), sharding={devices=[2,4]<=[8]}\n  %i = s32[8,1,1] parameter(1), sharding={devices=[2,1,1,4]<=[8] last_tile_dim_replicate}\n  %u = f32[8,1] parameter(2), sharding={devices=[2,1,4]<=[8] last_tile_dim_replicate}\n  ROOT %s = f32[8,64] scatter(%z, %i, %u), update_window_dims={}, inserted_window_dims={1}, scatter_dims_to_operand_dims={1}, input_batching_dims={0}, scatter_indices_batching_dims={0}, index_vector_dim=2, to_apply=%sum, sharding={devices=[2,4]<=[8]}\n}\n",
        comps,
        8,
    );
    let (summary, part) = check(&m, 8, false, 1e-6, 25);
    assert_eq!(summary.collective_bytes, 0, "{}", part.to_text());
    assert_eq!(
        summary.handlers.get("scatter:scatter"),
        Some(&1),
        "{:?}",
        summary.handlers
    );
}

/// Reshapes of unevenly tiled dims stay local where the padded shards
/// reshape exactly: the `keepdims` reshapes of softmax/layernorm (a
/// size-1 dim inserted, then dropped), a split whose minor factor divides
/// the tile (6 heads over 4 -> 3 groups of 2) and the merge back.
#[test]
fn uneven_reshapes_stay_local() {
    let m = module(
        "ENTRY %e (a: f32[3,21], b: f32[2,6,4]) -> (f32[3,21], f32[2,6,4]) {\n  %a = f32[3,21] parameter(0), sharding={devices=[1,8]<=[8]}\n  %k = f32[3,21,1] reshape(%a), sharding={devices=[1,8,1]<=[8]}\n  %n = f32[3,21,1] negate(%k), sharding={devices=[1,8,1]<=[8]}\n  %r = f32[3,21] reshape(%n), sharding={devices=[1,8]<=[8]}\n  %b = f32[2,6,4] parameter(1), sharding={devices=[1,4,1,2]<=[8] last_tile_dim_replicate}\n  %s = f32[2,3,2,4] reshape(%b), sharding={devices=[1,4,1,1,2]<=[8] last_tile_dim_replicate}\n  %t = f32[2,3,2,4] exponential(%s), sharding={devices=[1,4,1,1,2]<=[8] last_tile_dim_replicate}\n  %u = f32[2,6,4] reshape(%t), sharding={devices=[1,4,1,2]<=[8] last_tile_dim_replicate}\n  ROOT %o = (f32[3,21], f32[2,6,4]) tuple(%r, %u), sharding={{devices=[1,8]<=[8]}, {devices=[1,4,1,2]<=[8] last_tile_dim_replicate}}\n}\n",
        "",
        8,
    );
    let (s, _) = check(&m, 8, false, 1e-6, 21);
    assert_eq!(s.collective_bytes, 0, "{s:?}");
}

/// select-and-scatter (max-pool gradient) with batch and spatial dims
/// tiled, 2x2 windows of stride 2 inside the tiles: local, no collectives.
#[test]
fn select_and_scatter_with_aligned_windows_is_local() {
    let comps = format!(
        "{ADD}%ge (gx: f32[], gy: f32[]) -> pred[] {{\n  %gx = f32[] parameter(0)\n  %gy = f32[] parameter(1)\n  ROOT %gc = pred[] compare(%gx, %gy), direction=GE\n}}\n\n"
    );
    let m = module(
        "ENTRY %e (px: f32[4,8,8,2], pg: f32[4,4,4,2]) -> f32[4,8,8,2] {\n  %px = f32[4,8,8,2] parameter(0), sharding={devices=[2,2,2,1]<=[8]}\n  %pg = f32[4,4,4,2] parameter(1), sharding={devices=[2,2,2,1]<=[8]}\n  %z = f32[] constant(0)\n  ROOT %sas = f32[4,8,8,2] select-and-scatter(%px, %pg, %z), window={size=1x2x2x1 stride=1x2x2x1}, select=%ge, scatter=%add, sharding={devices=[2,2,2,1]<=[8]}\n}\n",
        &comps,
        8,
    );
    let (s, _) = check(&m, 8, false, 1e-6, 22);
    assert_eq!(s.collective_bytes, 0, "{s:?}");
    // Overlapping windows (3x3, stride 2) across tiles still run correctly
    // (by the fallback).
    let m = module(
        "ENTRY %e (px: f32[2,9,9,2], pg: f32[2,4,4,2]) -> f32[2,9,9,2] {\n  %px = f32[2,9,9,2] parameter(0), sharding={devices=[2,2,2,1]<=[8]}\n  %pg = f32[2,4,4,2] parameter(1), sharding={devices=[2,2,2,1]<=[8]}\n  %z = f32[] constant(0)\n  ROOT %sas = f32[2,9,9,2] select-and-scatter(%px, %pg, %z), window={size=1x3x3x1 stride=1x2x2x1}, select=%ge, scatter=%add, sharding={devices=[2,2,2,1]<=[8]}\n}\n",
        &comps,
        8,
    );
    check(&m, 8, false, 1e-6, 23);
}

/// A transposed convolution (base dilation 2) with the width sharded:
/// a one-row halo from the left neighbour and a local convolution with
/// adjusted padding, as XLA does (one collective-permute of 1x5x1x3 f32).
/// When the tiles would start at different phases of the dilated input
/// (odd output tiles), the width is gathered instead; both run correctly.
#[test]
fn base_dilated_convolution_exchanges_real_rows() {
    let m = module(
        "ENTRY %e (x: f32[2,5,8,3], k: f32[3,3,3,4]) -> f32[2,10,16,4] {\n  %x = f32[2,5,8,3] parameter(0), sharding={devices=[2,1,4,1]<=[8]}\n  %k = f32[3,3,3,4] parameter(1), sharding={replicated}\n  ROOT %c = f32[2,10,16,4] convolution(%x, %k), window={size=3x3 pad=2_1x2_1 lhs_dilate=2x2}, dim_labels=b01f_01io->b01f, sharding={devices=[2,1,4,1]<=[8]}\n}\n",
        "",
        8,
    );
    let (s, _) = check(&m, 8, false, 1e-5, 24);
    assert_eq!(s.collective_bytes, 60, "{s:?}");
    let m = module(
        "ENTRY %e (x: f32[1,4,6,2], k: f32[3,3,2,2]) -> f32[1,8,12,2] {\n  %x = f32[1,4,6,2] parameter(0), sharding={devices=[1,1,4,1,2]<=[8] last_tile_dim_replicate}\n  %k = f32[3,3,2,2] parameter(1), sharding={replicated}\n  ROOT %c = f32[1,8,12,2] convolution(%x, %k), window={size=3x3 pad=2_1x2_1 lhs_dilate=2x2}, dim_labels=b01f_01io->b01f, sharding={devices=[1,1,4,1,2]<=[8] last_tile_dim_replicate}\n}\n",
        "",
        8,
    );
    check(&m, 8, false, 1e-5, 25);
}

/// Merging an unevenly tiled dim with a whole minor dim whose merged tiles
/// differ from the output's (`[6,10]` over 4 -> `[60]`: 20 local elements,
/// tiles of 15) realigns with collective-permutes, not a gather.
#[test]
fn uneven_merge_realigns_with_permutes() {
    let m = module(
        "ENTRY %e (a: f32[6,10]) -> f32[60] {\n  %a = f32[6,10] parameter(0), sharding={devices=[4,1,2]<=[8] last_tile_dim_replicate}\n  ROOT %r = f32[60] reshape(%a), sharding={devices=[4,2]<=[8] last_tile_dim_replicate}\n}\n",
        "",
        8,
    );
    let (s, _) = check(&m, 8, false, 0.0, 26);
    assert_eq!(s.collectives.get("all-gather"), None, "{s:?}");
    assert!(s.collectives.contains_key("collective-permute"), "{s:?}");
}

/// Reverse and rotate (`jnp.flip`, `jnp.roll`) along a dim of 18 over 4
/// tiles (padded to 20): the mirrored tiles shifted back by the padding,
/// and a rotation by two window exchanges, both without gathering.
#[test]
fn uneven_reverse_and_rotation_use_permutes() {
    let m = module(
        "ENTRY %e (x: f32[18,6]) -> (f32[18,6], f32[18,6]) {\n  %x = f32[18,6] parameter(0), sharding={devices=[4,2]<=[8]}\n  %r = f32[18,6] reverse(%x), dimensions={0}, sharding={devices=[4,2]<=[8]}\n  %s0 = f32[5,6] slice(%x), slice={[13:18], [0:6]}, sharding={devices=[4,2]<=[8]}\n  %s1 = f32[13,6] slice(%x), slice={[0:13], [0:6]}, sharding={devices=[4,2]<=[8]}\n  %c = f32[18,6] concatenate(%s0, %s1), dimensions={0}, sharding={devices=[4,2]<=[8]}\n  ROOT %t = (f32[18,6], f32[18,6]) tuple(%r, %c), sharding={{devices=[4,2]<=[8]}, {devices=[4,2]<=[8]}}\n}\n",
        "",
        8,
    );
    let (s, _) = check(&m, 8, false, 0.0, 27);
    assert_eq!(s.collectives.get("all-gather"), None, "{s:?}");
}

/// A depthwise convolution (vmap of `jnp.convolve`) with channels and
/// width both sharded: each device convolves its channel groups over its
/// width tile with a halo from its neighbours: XLA sends two permutes
/// (32 bytes); the halos go opposite ways between two tiles, so one
/// permute carries both (16).
#[test]
fn depthwise_convolution_with_sharded_channels_and_width() {
    let m = module(
        "ENTRY %e (x: f32[1,8,20], k: f32[8,1,5]) -> f32[1,8,20] {\n  %x = f32[1,8,20] parameter(0), sharding={devices=[1,4,2]<=[8]}\n  %k = f32[8,1,5] parameter(1), sharding={devices=[4,1,1,2]<=[8] last_tile_dim_replicate}\n  ROOT %c = f32[1,8,20] convolution(%x, %k), window={size=5 pad=2_2}, dim_labels=bf0_oi0->bf0, feature_group_count=8, sharding={devices=[1,4,2]<=[8]}\n}\n",
        "",
        8,
    );
    let (s, _) = check(&m, 8, false, 1e-5, 28);
    assert_eq!(s.collectives.get("all-gather"), None, "{s:?}");
    assert_eq!(s.collective_bytes, 16, "{s:?}");
}

/// Interior padding whose output tiles start at different phases of the
/// interleaved input (negative low padding, interior 1, 24 rows over 8
/// tiles of 3): each tile pads its exchanged inputs locally and slices its
/// window at its own offset, instead of falling back to replication.
#[test]
fn interior_pad_with_per_tile_phases() {
    let m = module(
        "ENTRY %e (x: f32[12,4]) -> f32[24,5] {\n  %x = f32[12,4] parameter(0), sharding={devices=[8,1]<=[8]}\n  %z = f32[] constant(0)\n  ROOT %p = f32[24,5] pad(%x, %z), padding=-2_3_1x1_0_0, sharding={devices=[8,1]<=[8]}\n}\n",
        "",
        8,
    );
    let (s, _) = check(&m, 8, false, 0.0, 29);
    assert_eq!(s.collectives.get("all-gather"), None, "{s:?}");
}

/// A KV-cache write: one time step at a runtime position into a cache
/// whose time dim is sharded 8-way. Each device updates its own tile when
/// the position falls in it; nothing moves (positions inside and outside
/// the range, which XLA clamps).
#[test]
fn dynamic_update_of_one_row_into_a_sharded_dim_is_local() {
    for pos in [-3, 0, 5, 17, 23, 40] {
        let m = module(
            &format!("ENTRY %e (c: f32[2,24,4], u: f32[2,1,4]) -> f32[2,24,4] {{\n  %c = f32[2,24,4] parameter(0), sharding={{devices=[1,8,1]<=[8]}}\n  %u = f32[2,1,4] parameter(1), sharding={{replicated}}\n  %pos = s32[] constant({pos})\n  %z = s32[] constant(0)\n  ROOT %d = f32[2,24,4] dynamic-update-slice(%c, %u, %z, %pos, %z), sharding={{devices=[1,8,1]<=[8]}}\n}}\n"),
            "",
            8,
        );
        let (s, _) = check(&m, 8, false, 0.0, 30);
        assert_eq!(s.collective_bytes, 0, "{s:?}");
    }
}

/// A slice whose tiles are its operand's own tiles reuses the operand's
/// local buffer for a smaller global array; resharding the slice must not
/// pick up the operand's cached layouts (a rotation of a partially
/// replicated operand, whose `[0:11]` slice of 12 columns over 4 tiles
/// is the operand's own 3-column tiles).
#[test]
fn reshard_cache_tells_a_slice_from_its_operand() {
    let m = module(
        "ENTRY %e (x: f32[8,12]) -> f32[8,12] {\n  %x = f32[8,12] parameter(0), sharding={devices=[2,1,4]<=[8] last_tile_dim_replicate}\n  %s0 = f32[8,1] slice(%x), slice={[0:8], [11:12]}, sharding={devices=[2,4]<=[8]}\n  %s1 = f32[8,11] slice(%x), slice={[0:8], [0:11]}, sharding={devices=[2,4]<=[8]}\n  ROOT %c = f32[8,12] concatenate(%s0, %s1), dimensions={1}, sharding={devices=[2,4]<=[8]}\n}\n",
        "",
        8,
    );
    check(&m, 8, false, 0.0, 33);
}

/// Replicating a dim that is mostly padding (one or two rows over four
/// tiles) sums the placed rows with an all-reduce instead of gathering the
/// padded tiles; a broadcast scalar is rebuilt in the new layout.
#[test]
fn mostly_padding_dims_are_summed_and_splats_rebuilt() {
    let m = module(
        "ENTRY %e (x: f32[4,16]) -> (f32[4,1], f32[4,2], f32[13,7]) {\n  %x = f32[4,16] parameter(0), sharding={devices=[2,4]<=[8]}\n  %a = f32[4,1] slice(%x), slice={[0:4], [0:1]}, sharding={devices=[2,4]<=[8]}\n  %b = f32[4,2] slice(%x), slice={[0:4], [13:15]}, sharding={devices=[2,4]<=[8]}\n  %z = f32[] constant(0)\n  %c = f32[13,7] broadcast(%z), dimensions={}, sharding={devices=[1,8]<=[8]}\n  ROOT %t = (f32[4,1], f32[4,2], f32[13,7]) tuple(%a, %b, %c), sharding={{devices=[2,1,4]<=[8] last_tile_dim_replicate}, {devices=[2,1,4]<=[8] last_tile_dim_replicate}, {devices=[8,1]<=[8]}}\n}\n",
        "",
        8,
    );
    let (s, _) = check(&m, 8, false, 0.0, 34);
    assert_eq!(s.collectives.get("all-gather"), None, "{s:?}");
    assert_eq!(s.collectives.get("all-to-all"), None, "{s:?}");
}

/// Unreduced shardings defer the reduction: two dots unreduced over the
/// devices their contracted dim is split on stay partial sums through an
/// add and are all-reduced once, where the value leaves its unreduced
/// layout (one all-reduce of the result instead of one per dot).
#[test]
fn unreduced_partial_sums_are_reduced_once_where_needed() {
    let m = module(
        "ENTRY %e (a: f32[8,16], b: f32[16,8], c: f32[8,16], d: f32[16,8]) -> f32[8,8] {\n  %a = f32[8,16] parameter(0), sharding={devices=[2,4]<=[8]}\n  %b = f32[16,8] parameter(1), sharding={devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}\n  %c = f32[8,16] parameter(2), sharding={devices=[2,4]<=[8]}\n  %d = f32[16,8] parameter(3), sharding={devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}\n  %ab = f32[8,8] dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={devices=[2,1,4]<=[8] last_tile_dims={unreduced}}\n  %cd = f32[8,8] dot(%c, %d), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={devices=[2,1,4]<=[8] last_tile_dims={unreduced}}\n  %s = f32[8,8] add(%ab, %cd), sharding={devices=[2,1,4]<=[8] last_tile_dims={unreduced}}\n  %n = f32[8,8] negate(%s), sharding={devices=[2,1,4]<=[8] last_tile_dims={unreduced}}\n  ROOT %r = f32[8,8] copy(%n), sharding={devices=[2,1,4]<=[8] last_tile_dim_replicate}\n}\n",
        "",
        8,
    );
    let (s, _) = check(&m, 8, false, 1e-5, 35);
    assert_eq!(s.collectives.get("all-reduce"), Some(&1), "{s:?}");
    assert_eq!(s.collective_bytes, 4 * 8 * 4);
}

/// A partial value used by a non-linear op, or by an op whose sharding is
/// not unreduced, is summed first; an unreduced root is summed too.
#[test]
fn unreduced_values_are_summed_before_nonlinear_uses_and_at_the_root() {
    let m = module(
        "ENTRY %e (a: f32[8,16], b: f32[16,8]) -> (f32[8,8], f32[8,8]) {\n  %a = f32[8,16] parameter(0), sharding={devices=[2,4]<=[8]}\n  %b = f32[16,8] parameter(1), sharding={devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}\n  %ab = f32[8,8] dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={devices=[2,1,4]<=[8] last_tile_dims={unreduced}}\n  %t = f32[8,8] tanh(%ab), sharding={devices=[2,1,4]<=[8] last_tile_dims={unreduced}}\n  %m = f32[8,8] multiply(%ab, %t), sharding={devices=[2,4]<=[8]}\n  ROOT %r = (f32[8,8], f32[8,8]) tuple(%m, %ab), sharding={{devices=[2,4]<=[8]}, {devices=[2,1,4]<=[8] last_tile_dims={unreduced}}}\n}\n",
        "",
        8,
    );
    let (s, _) = check(&m, 8, false, 1e-5, 36);
    assert_eq!(s.collectives.get("all-reduce"), Some(&1), "{s:?}");
}

/// A full value whose sharding says unreduced enters a manual region as
/// partial sums (the value on one device of each group, zeros on the
/// others), so the region's own all-reduce gives the value back.
#[test]
fn full_value_enters_a_manual_region_as_partial_sums() {
    let text = module(
        "ENTRY %e (x: f32[8,8]) -> f32[8,8] {\n  %x = f32[8,8] parameter(0), sharding={devices=[2,1,4]<=[8] last_tile_dim_replicate}\n  %u = f32[8,8] copy(%x), sharding={devices=[2,1,4]<=[8] last_tile_dims={unreduced}}\n  %l = f32[4,8] custom-call(%u), custom_call_target=\"SPMDFullToShardShape\", sharding={manual}\n  %s = f32[4,8] all-reduce(%l), channel_id=1, replica_groups={{0,1,2,3},{4,5,6,7}}, use_global_device_ids=true, to_apply=%add, sharding={manual}\n  ROOT %f = f32[8,8] custom-call(%s), custom_call_target=\"SPMDShardToFullShape\", sharding={devices=[2,1,4]<=[8] last_tile_dim_replicate}\n}\n",
        ADD,
        8,
    );
    let mut m = common::parse(&text);
    xla_spmd_partitioner::partition_module(
        &mut m,
        &xla_spmd_partitioner::SpmdOptions {
            num_partitions: Some(8),
            ..Default::default()
        },
    )
    .unwrap();
    let mut rng = common::Rng(37);
    let shape = xla_hlo_ir::Shape::array(xla_hlo_ir::PrimitiveType::F32, vec![8, 8]);
    let x = common::random_value(&shape, &mut rng);
    let got = common::run_partitioned(&m, std::slice::from_ref(&x), &shape, 8)
        .unwrap_or_else(|e| panic!("{e}\n{}", m.to_text()));
    common::compare(&got, &x, 0.0, &m);
}

#[test]
fn variadic_scatter_is_partitioned_like_a_single_one() {
    // Two operands scattered together (a pair reducer), sharded on a window
    // dim the updates cover whole: each device scatters its own columns, as
    // for one operand; no replication.
    const ADD2: &str = "%add2 (a0: f32[], a1: f32[], b0: f32[], b1: f32[]) -> (f32[], f32[]) {\n  %a0 = f32[] parameter(0)\n  %a1 = f32[] parameter(1)\n  %b0 = f32[] parameter(2)\n  %b1 = f32[] parameter(3)\n  %s0 = f32[] add(%a0, %b0)\n  %s1 = f32[] add(%a1, %b1)\n  ROOT %t = (f32[], f32[]) tuple(%s0, %s1)\n}\n\n";
    let m = module(
        "ENTRY %e (t0: f32[60,16], t1: f32[60,16], ids: s32[10,1], u0: f32[10,16], u1: f32[10,16]) -> (f32[60,16], f32[60,16]) {\n  %t0 = f32[60,16] parameter(0), sharding={devices=[1,8]<=[8]}\n  %t1 = f32[60,16] parameter(1), sharding={devices=[1,8]<=[8]}\n  %ids = s32[10,1] parameter(2), sharding={replicated}\n  %u0 = f32[10,16] parameter(3), sharding={devices=[1,8]<=[8]}\n  %u1 = f32[10,16] parameter(4), sharding={devices=[1,8]<=[8]}\n  ROOT %sc = (f32[60,16], f32[60,16]) scatter(%t0, %t1, %ids, %u0, %u1), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=%add2, sharding={{devices=[1,8]<=[8]}, {devices=[1,8]<=[8]}}\n}\n",
        ADD2,
        8,
    );
    let (s, _) = check(&m, 8, false, 1e-5, 23);
    assert_eq!(s.handlers.get("scatter:scatter"), Some(&1), "{s:?}");
    assert!(
        !s.handlers.keys().any(|h| h.ends_with(":fallback")),
        "{s:?}"
    );
    assert_eq!(s.collective_bytes, 0, "{s:?}");
}

#[test]
fn outfeed_sharded_on_its_data_partitions() {
    // An outfeed's sharding is its data's (a tuple here); propagation and
    // partitioning read it so, and the token result is replicated. (Not
    // executed: the interpreter has no host transfers.)
    let text = module(
        "ENTRY %e (d: (f32[16,2], f32[2])) -> token[] {\n  %t = token[] after-all()\n  %d = (f32[16,2], f32[2]) parameter(0), sharding={{devices=[2,1]0,1}, {devices=[2]0,1}}\n  ROOT %o = token[] outfeed(%d, %t), outfeed_shape=(f32[16,2], f32[2]), sharding={{devices=[2,1]0,1}, {devices=[2]0,1}}\n}\n",
        "",
        2,
    );
    let mut m = xla_hlo_parser::parse_module(&text).unwrap();
    xla_hlo_pass::Pass::run(
        &mut xla_sharding_propagation::ShardingPropagation::default(),
        &mut m,
    )
    .unwrap();
    let options = xla_spmd_partitioner::SpmdOptions {
        num_partitions: Some(2),
        ..Default::default()
    };
    xla_spmd_partitioner::partition_module(&mut m, &options).unwrap();
    xla_hlo_verifier::verify(&m).unwrap();
    let root = m.entry_computation().root_instr();
    assert_eq!(root.opcode, xla_hlo_ir::Opcode::Outfeed);
}

/// Tiles that need rows from a neighbour get only those rows, not the
/// neighbour hull: a slice to the first 3 of 256 rows over 4 tiles (tile
/// 1 and 2 of the output hold one row each, from input tile 0) moves two
/// rows; a pad to double size over 8 tiles (output tile i reads input
/// tiles 2i and 2i+1) is one permute per source position.
#[test]
fn small_windows_move_only_their_rows() {
    let m = module(
        "ENTRY %e (a: f32[256,2], b: f32[8,3]) -> (f32[3,2], f32[16,3]) {\n  %a = f32[256,2] parameter(0), sharding={devices=[8,1]<=[8]}\n  %s = f32[3,2] slice(%a), slice={[0:3], [0:2]}, sharding={devices=[8,1]<=[8]}\n  %b = f32[8,3] parameter(1), sharding={devices=[8,1]<=[8]}\n  %z = f32[] constant(-1)\n  %p = f32[16,3] pad(%b, %z), padding=0_8x0_0, sharding={devices=[8,1]<=[8]}\n  ROOT %o = (f32[3,2], f32[16,3]) tuple(%s, %p), sharding={{devices=[8,1]<=[8]}, {devices=[8,1]<=[8]}}\n}\n",
        "",
        8,
    );
    let (summary, part) = check(&m, 8, false, 0.0, 29);
    // Slice: two permutes of a [1,2] row; pad: two of a [1,3] row.
    assert!(
        summary.collective_bytes <= 2 * 8 + 2 * 12,
        "{} bytes\n{}",
        summary.collective_bytes,
        part.to_text()
    );
}

/// A pad whose result is sliced (through copies) is partitioned as one
/// pad with the slice folded into its edge padding: one halo exchange.
#[test]
fn pad_then_slice_is_one_exchange() {
    let m = module(
        "ENTRY %e (x: f32[8,3]) -> f32[8,3] {\n  %x = f32[8,3] parameter(0), sharding={devices=[8,1]<=[8]}\n  %v = f32[] constant(5)\n  %p = f32[11,3] pad(%x, %v), padding=2_1x0_0, sharding={devices=[8,1]<=[8]}\n  %c = f32[11,3] copy(%p), sharding={devices=[8,1]<=[8]}\n  ROOT %s = f32[8,3] slice(%c), slice={[0:8], [0:3]}, sharding={devices=[8,1]<=[8]}\n}\n",
        "",
        8,
    );
    let (summary, part) = check(&m, 8, false, 0.0, 31);
    // Output tile i is input rows [i-2, i-1): a one-row permute.
    assert_eq!(summary.collective_bytes, 12, "{}", part.to_text());
}

/// Gather and scatter whose index component is an iota along an indices
/// dim (index-parallel, as in `take_along_axis`) tile that dim with the
/// operand dim it addresses: no communication when both are tiled alike.
#[test]
fn index_parallel_gather_and_scatter_stay_local() {
    let m = module(
        "ENTRY %e (t: f32[8,6], col: s32[8,1], u: f32[8]) -> (f32[8], f32[8,6]) {\n  %t = f32[8,6] parameter(0), sharding={devices=[8,1]<=[8]}\n  %col = s32[8,1] parameter(1), sharding={devices=[8,1]<=[8]}\n  %row = s32[8,1] iota(), iota_dimension=0, sharding={devices=[8,1]<=[8]}\n  %ids = s32[8,2] concatenate(%row, %col), dimensions={1}, sharding={devices=[8,1]<=[8]}\n  %g = f32[8] gather(%t, %ids), offset_dims={}, collapsed_slice_dims={0,1}, start_index_map={0,1}, index_vector_dim=1, slice_sizes={1,1}, sharding={devices=[8]<=[8]}\n  %u = f32[8] parameter(2), sharding={devices=[8]<=[8]}\n  %s = f32[8,6] scatter(%t, %ids, %u), update_window_dims={}, inserted_window_dims={0,1}, scatter_dims_to_operand_dims={0,1}, index_vector_dim=1, to_apply=%add, sharding={devices=[8,1]<=[8]}\n  ROOT %o = (f32[8], f32[8,6]) tuple(%g, %s), sharding={{devices=[8]<=[8]}, {devices=[8,1]<=[8]}}\n}\n",
        ADD,
        8,
    );
    let (summary, part) = check(&m, 8, false, 1e-6, 37);
    assert_eq!(summary.collective_bytes, 0, "{}", part.to_text());
}

/// A `TopK` custom-call sharded on its last dim: a local top-k per tile,
/// the candidates gathered and merged by a sort (values and indices, or
/// the values alone when the indices are never read); values and global
/// indices match the unpartitioned run, ties included (integral values
/// repeat often).
#[test]
fn topk_custom_call_merges_local_candidates() {
    const GT: &str = "%gt (a: f32[], b: f32[], i: s32[], j: s32[]) -> pred[] {\n  %a = f32[] parameter(0)\n  %b = f32[] parameter(1)\n  %i = s32[] parameter(2)\n  %j = s32[] parameter(3)\n  ROOT %c = pred[] compare(%a, %b), direction=GT\n}\n\n";
    let m = module(
        "ENTRY %e (x: f32[4,64], y: f32[4,64]) -> (f32[4,3], s32[4,3], f32[4,5]) {\n  %x = f32[4,64] parameter(0), sharding={devices=[1,8]<=[8]}\n  %r = f32[4,64] round-nearest-even(%x), sharding={devices=[1,8]<=[8]}\n  %xr = f32[4,64] copy(%r), sharding={devices=[1,8]<=[8]}\n  %t = (f32[4,3], s32[4,3]) custom-call(%xr), custom_call_target=\"TopK\", called_computations={%gt}, sharding={{devices=[1,8]<=[8]}, {devices=[1,8]<=[8]}}\n  %v = f32[4,3] get-tuple-element(%t), index=0, sharding={replicated}\n  %i = s32[4,3] get-tuple-element(%t), index=1, sharding={replicated}\n  %y = f32[4,64] parameter(1), sharding={devices=[2,4]<=[8]}\n  %u = (f32[4,5], s32[4,5]) custom-call(%y), custom_call_target=\"TopK\", sharding={{devices=[2,4]<=[8]}, {devices=[2,4]<=[8]}}\n  %w = f32[4,5] get-tuple-element(%u), index=0, sharding={replicated}\n  ROOT %o = (f32[4,3], s32[4,3], f32[4,5]) tuple(%v, %i, %w), sharding={{replicated}, {replicated}, {replicated}}\n}\n",
        GT,
        8,
    );
    let (summary, part) = check(&m, 8, false, 0.0, 41);
    assert_eq!(
        summary.handlers.get("custom-call:topk-merge"),
        Some(&2),
        "{summary:?}"
    );
    // Candidates only: [4, 8 x 3] values and indices (768 bytes), [2, 4 x
    // 5] values (160), then the [4,5] result gathered over the row tiles
    // (at most 128): below gathering the two operands (2048).
    assert!(
        summary.collective_bytes <= 768 + 160 + 128,
        "{} bytes\n{}",
        summary.collective_bytes,
        part.to_text()
    );
}

/// A reshard that changes only the tile count of one dim (2 tiles of 3
/// rows, replicated twice -> 4 tiles of 2) moves just the rows that cross
/// a tile boundary: one collective-permute of a row, not a gather.
#[test]
fn retile_of_one_dim_permutes_boundary_rows() {
    let m = module(
        "ENTRY %e (x: f32[6,3]) -> f32[6,3] {\n  %x = f32[6,3] parameter(0), sharding={devices=[2,1,2]<=[4] last_tile_dim_replicate}\n  ROOT %c = f32[6,3] copy(%x), sharding={devices=[4,1]<=[4]}\n}\n",
        "",
        4,
    );
    let (summary, part) = check(&m, 4, false, 0.0, 43);
    assert_eq!(summary.collective_bytes, 12, "{}", part.to_text());
}

/// A reshape merging an unevenly tiled dim with its minor dim and splitting
/// the product again (`[7,10] -> [14,5]` over 2 tiles: local rows of 40
/// elements make 8 output rows where the output tiles hold 7) is a local
/// reshape and a permute of the misplaced row.
#[test]
fn reshape_merge_then_split_retiles_locally() {
    let m = module(
        "ENTRY %e (x: s32[3,7,10]) -> s32[3,14,5] {\n  %x = s32[3,7,10] parameter(0), sharding={devices=[1,2,1]<=[2]}\n  ROOT %r = s32[3,14,5] reshape(%x), sharding={devices=[1,2,1]<=[2]}\n}\n",
        "",
        2,
    );
    let (summary, part) = check(&m, 2, false, 0.0, 47);
    // One [3,1,5] row.
    assert_eq!(summary.collective_bytes, 60, "{}", part.to_text());
}

/// select-and-scatter with non-overlapping windows whose stride blocks
/// line up with uneven tiles (14 rows over 4 tiles of 4, windows of 2
/// rows, 2 rows of high padding; and windows smaller than their stride)
/// is local: the padding rows are masked so they are never selected.
#[test]
fn select_and_scatter_with_padding_and_gaps_is_local() {
    const GE: &str = "%ge (a: f32[], b: f32[]) -> pred[] {\n  %a = f32[] parameter(0)\n  %b = f32[] parameter(1)\n  ROOT %c = pred[] compare(%a, %b), direction=GE\n}\n\n";
    let m = module(
        "ENTRY %e (x: f32[14,6], s: f32[8,6], y: f32[16,6], t: f32[4,6]) -> (f32[14,6], f32[16,6]) {\n  %x = f32[14,6] parameter(0), sharding={devices=[4,1]<=[4]}\n  %s = f32[8,6] parameter(1), sharding={devices=[4,1]<=[4]}\n  %z = f32[] constant(0)\n  %r = f32[14,6] select-and-scatter(%x, %s, %z), window={size=2x1 stride=2x1 pad=0_2x0_0}, select=%ge, scatter=%add, sharding={devices=[4,1]<=[4]}\n  %y = f32[16,6] parameter(2), sharding={devices=[4,1]<=[4]}\n  %t = f32[4,6] parameter(3), sharding={devices=[4,1]<=[4]}\n  %q = f32[16,6] select-and-scatter(%y, %t, %z), window={size=1x1 stride=4x1}, select=%ge, scatter=%add, sharding={devices=[4,1]<=[4]}\n  ROOT %o = (f32[14,6], f32[16,6]) tuple(%r, %q), sharding={{devices=[4,1]<=[4]}, {devices=[4,1]<=[4]}}\n}\n",
        &format!("{ADD}{GE}"),
        4,
    );
    let (summary, part) = check(&m, 4, false, 0.0, 53);
    assert_eq!(
        summary
            .handlers
            .get("select-and-scatter:select-and-scatter"),
        Some(&2),
        "{summary:?}"
    );
    assert_eq!(summary.collective_bytes, 0, "{}", part.to_text());
}

/// A pad with wrap (`concatenate(neg(x[14:16]), x, exp(x[0:1]))`, as
/// `jnp.pad(mode="wrap")` lowers with modifiers on the edges) and a roll
/// of an unevenly tiled dim are assembled piece by piece: only the edge
/// rows move.
#[test]
fn wrap_pad_and_uneven_roll_move_edge_rows() {
    let m = module(
        "ENTRY %e (x: f32[16,4], y: f32[6,3]) -> (f32[19,4], f32[6,3]) {\n  %x = f32[16,4] parameter(0), sharding={devices=[4,1]<=[4]}\n  %l = f32[2,4] slice(%x), slice={[14:16], [0:4]}, sharding={devices=[4,1]<=[4]}\n  %nl = f32[2,4] negate(%l), sharding={devices=[4,1]<=[4]}\n  %r = f32[1,4] slice(%x), slice={[0:1], [0:4]}, sharding={devices=[4,1]<=[4]}\n  %er = f32[1,4] exponential(%r), sharding={devices=[4,1]<=[4]}\n  %w = f32[19,4] concatenate(%nl, %x, %er), dimensions={0}, sharding={devices=[4,1]<=[4]}\n  %y = f32[6,3] parameter(1), sharding={devices=[4,1]<=[4]}\n  %a = f32[2,3] slice(%y), slice={[4:6], [0:3]}, sharding={devices=[4,1]<=[4]}\n  %b = f32[4,3] slice(%y), slice={[0:4], [0:3]}, sharding={devices=[4,1]<=[4]}\n  %roll = f32[6,3] concatenate(%a, %b), dimensions={0}, sharding={devices=[4,1]<=[4]}\n  ROOT %o = (f32[19,4], f32[6,3]) tuple(%w, %roll), sharding={{devices=[4,1]<=[4]}, {devices=[4,1]<=[4]}}\n}\n",
        "",
        4,
    );
    let (summary, part) = check(&m, 4, false, 1e-6, 59);
    assert_eq!(
        summary.handlers.get("concatenate:concatenate:wrap"),
        Some(&2),
        "{summary:?}"
    );
    // Far below gathering either operand (256 and 72 bytes a device).
    assert!(
        summary.collective_bytes < 256,
        "{}\n{}",
        summary.collective_bytes,
        part.to_text()
    );
}

/// A batch-grouped convolution (the kernel gradient of a depthwise
/// convolution: `batch_group_count` = channels) with the grouped batch,
/// the kernel's output features and the output features sharded alike is
/// local: each device convolves its own groups. The operands arriving
/// sharded on the grouped dims only (not on the output's layout) are used
/// as they are.
#[test]
fn batch_grouped_convolution_is_local() {
    let m = module(
        "ENTRY %e (x: f32[6,10,8], k: f32[6,10,8]) -> (f32[3,1,8], f32[3,1,8]) {\n  %x = f32[6,10,8] parameter(0), sharding={devices=[1,1,4]<=[4]}\n  %k = f32[6,10,8] parameter(1), sharding={devices=[1,1,4]<=[4]}\n  %c = f32[3,1,8] convolution(%x, %k), window={size=10 pad=1_1}, dim_labels=f0b_i0o->0bf, batch_group_count=8, sharding={devices=[1,1,4]<=[4]}\n  %d = f32[3,1,8] convolution(%x, %k), window={size=10 pad=1_1}, dim_labels=f0b_i0o->0bf, batch_group_count=8, sharding={replicated}\n  ROOT %o = (f32[3,1,8], f32[3,1,8]) tuple(%c, %d), sharding={{devices=[1,1,4]<=[4]}, {replicated}}\n}\n",
        "",
        4,
    );
    let (summary, part) = check(&m, 4, false, 1e-5, 61);
    assert_eq!(
        summary
            .handlers
            .get("convolution:convolution-grouped-batch"),
        Some(&2),
        "{summary:?}"
    );
    // Only the replicated result is gathered: [3,1,8] f32.
    assert_eq!(summary.collective_bytes, 96, "{}", part.to_text());
}

/// A dynamic-update-slice of a multi-row window into a tiled dim: the
/// small update is gathered and each device writes the part over its
/// tile, for a window inside one tile, across a tile boundary, clamped at
/// the end (start 60 of 64 rows for 5 rows) and at a runtime start.
#[test]
fn dynamic_update_window_into_tiled_dim() {
    let m = module(
        "ENTRY %e (x: f32[64,3], u: f32[5,3], i: s32[]) -> (f32[64,3], f32[64,3], f32[64,3], f32[64,3]) {\n  %x = f32[64,3] parameter(0), sharding={devices=[4,1]<=[4]}\n  %u = f32[5,3] parameter(1), sharding={replicated}\n  %i = s32[] parameter(2), sharding={replicated}\n  %z = s32[] constant(0)\n  %c1 = s32[] constant(2)\n  %c2 = s32[] constant(14)\n  %c3 = s32[] constant(60)\n  %a = f32[64,3] dynamic-update-slice(%x, %u, %c1, %z), sharding={devices=[4,1]<=[4]}\n  %b = f32[64,3] dynamic-update-slice(%x, %u, %c2, %z), sharding={devices=[4,1]<=[4]}\n  %c = f32[64,3] dynamic-update-slice(%x, %u, %c3, %z), sharding={devices=[4,1]<=[4]}\n  %d = f32[64,3] dynamic-update-slice(%x, %u, %i, %z), sharding={devices=[4,1]<=[4]}\n  ROOT %o = (f32[64,3], f32[64,3], f32[64,3], f32[64,3]) tuple(%a, %b, %c, %d), sharding={{devices=[4,1]<=[4]}, {devices=[4,1]<=[4]}, {devices=[4,1]<=[4]}, {devices=[4,1]<=[4]}}\n}\n",
        "",
        4,
    );
    let (summary, part) = check(&m, 4, false, 0.0, 67);
    assert_eq!(
        summary
            .handlers
            .get("dynamic-update-slice:dynamic-update-slice:window"),
        Some(&4),
        "{summary:?}"
    );
    assert_eq!(summary.collective_bytes, 0, "{}", part.to_text());
}

/// A reduce-window with base dilation on a tiled dim (the gradient of a
/// strided pooling): each tile fetches the input rows its dilated window
/// covers, dilates them locally and reduces at its own phase (tiles of 5
/// outputs over a dilation of 3 start at different phases).
#[test]
fn reduce_window_with_base_dilation_on_tiled_dim() {
    let m = module(
        "ENTRY %e (x: f32[2,7,3]) -> f32[2,21,3] {\n  %x = f32[2,7,3] parameter(0), sharding={devices=[1,4,1]<=[4]}\n  %z = f32[] constant(0)\n  ROOT %r = f32[2,21,3] reduce-window(%x, %z), window={size=1x4x1 pad=0_0x3_2x0_0 lhs_dilate=1x3x1}, to_apply=%add, sharding={devices=[1,4,1]<=[4]}\n}\n",
        ADD,
        4,
    );
    let (summary, part) = check(&m, 4, false, 1e-6, 71);
    assert_eq!(
        summary.handlers.get("reduce-window:reduce-window"),
        Some(&1),
        "{summary:?}"
    );
    assert!(
        !summary.collectives.contains_key("all-gather"),
        "{}",
        part.to_text()
    );
}

/// A reshard moving two dims' tiles to two other dims (`[2,2,1,1]` ->
/// `[1,1,2,2]`) is one all-to-all over all four devices, moving one local
/// tile, not two all-to-alls in turn.
#[test]
fn two_dim_moves_in_one_all_to_all() {
    let m = module(
        "ENTRY %e (x: f32[8,8,4,4]) -> f32[8,8,4,4] {\n  %x = f32[8,8,4,4] parameter(0), sharding={devices=[2,2,1,1]<=[4]}\n  ROOT %c = f32[8,8,4,4] copy(%x), sharding={devices=[1,1,2,2]<=[4]}\n}\n",
        "",
        4,
    );
    let (summary, part) = check(&m, 4, false, 0.0, 73);
    assert_eq!(
        summary.collectives.get("all-to-all"),
        Some(&1),
        "{}",
        part.to_text()
    );
    // One [4,4,4,4] f32 tile.
    assert_eq!(summary.collective_bytes, 1024, "{}", part.to_text());
}

/// A convolution whose window covers a whole spatial dim (an einsum
/// written as a convolution: the window dim is contracted) with that dim
/// sharded, next to a pointwise spatial dim that is sharded too: each
/// device convolves its part of the window over its part of the pointwise
/// dim, then the partial sums are reduced, with no gather of the input.
#[test]
fn window_sharded_convolution_with_pointwise_spatial_dim() {
    let m = module(
        "ENTRY %e (x: f32[8,4,2,6], k: f32[2,6,10,1]) -> f32[8,4,10,1] {\n  %x = f32[8,4,2,6] parameter(0), sharding={devices=[2,1,2,1]<=[4]}\n  %k = f32[2,6,10,1] parameter(1), sharding={devices=[2,1,1,1,2]<=[4] last_tile_dim_replicate}\n  ROOT %c = f32[8,4,10,1] convolution(%x, %k), window={size=1x2}, dim_labels=0b1f_1io0->0bf1, sharding={devices=[2,1,2,1]<=[4]}\n}\n",
        "",
        4,
    );
    let (summary, part) = check(&m, 4, false, 1e-5, 79);
    assert_eq!(
        summary
            .handlers
            .get("convolution:convolution-window-sharded"),
        Some(&1),
        "{summary:?}"
    );
    assert!(
        !summary.collectives.contains_key("all-gather"),
        "{}",
        part.to_text()
    );
}

/// A convolution with a reversed window (the input gradient of a strided,
/// base-dilated convolution) and its output spatial dim tiled takes the
/// halo exchange an unreversed window would: reversal flips the kernel,
/// not the input rows read.
#[test]
fn reversed_window_convolution_exchanges_halos() {
    let m = module(
        "ENTRY %e (x: f32[2,9,3], k: f32[3,3,4]) -> f32[2,9,4] {\n  %x = f32[2,9,3] parameter(0), sharding={devices=[1,4,1]<=[4]}\n  %k = f32[3,3,4] parameter(1), sharding={replicated}\n  ROOT %c = f32[2,9,4] convolution(%x, %k), window={size=3 pad=1_1 rhs_reversal=1}, dim_labels=b0f_0io->b0f, sharding={devices=[1,4,1]<=[4]}\n}\n",
        "",
        4,
    );
    let (summary, part) = check(&m, 4, false, 1e-5, 83);
    assert_eq!(
        summary.handlers.get("convolution:convolution-halo"),
        Some(&1),
        "{summary:?}"
    );
    assert!(
        !summary.collectives.contains_key("all-gather"),
        "{}",
        part.to_text()
    );
}

/// Bitcast-converts between element types of different widths (the
/// narrow side has a minor dim of the width ratio) stay tiled on the
/// shared dims: no replication, exact bits.
#[test]
fn bitcast_convert_across_widths_stays_tiled() {
    let m = module(
        "ENTRY %e (x: s64[6,3]) -> (s32[6,3,2], s64[6,3]) {\n  %x = s64[6,3] parameter(0), sharding={devices=[4,1]<=[4]}\n  %n = s32[6,3,2] bitcast-convert(%x), sharding={devices=[4,1,1]<=[4]}\n  %w = s64[6,3] bitcast-convert(%n), sharding={devices=[2,2]<=[4]}\n  ROOT %o = (s32[6,3,2], s64[6,3]) tuple(%n, %w), sharding={{devices=[4,1,1]<=[4]}, {devices=[2,2]<=[4]}}\n}\n",
        "",
        4,
    );
    let (summary, part) = check(&m, 4, false, 0.0, 89);
    assert_eq!(
        summary.handlers.get("bitcast-convert:bitcast-convert"),
        Some(&2),
        "{summary:?}"
    );
    assert!(
        !summary.handlers.keys().any(|h| h.ends_with(":fallback")),
        "{}",
        part.to_text()
    );
}

/// A cross-replica all-reduce (no channel) on a tiled value runs on the
/// local tiles: each partition reduces with its replica counterparts, so
/// nothing is gathered.
#[test]
fn cross_replica_all_reduce_stays_tiled() {
    let m = module(
        "ENTRY %e (x: f32[6,3]) -> f32[6,3] {\n  %x = f32[6,3] parameter(0), sharding={devices=[2,1]<=[2]}\n  ROOT %r = f32[6,3] all-reduce(%x), replica_groups={}, to_apply=%add, sharding={devices=[2,1]<=[2]}\n}\n",
        ADD,
        2,
    );
    let (summary, part) = check(&m, 2, false, 0.0, 97);
    assert!(
        !summary.collectives.contains_key("all-gather"),
        "{}",
        part.to_text()
    );
    // The all-reduce of a [3,3] tile.
    assert_eq!(summary.collective_bytes, 36, "{}", part.to_text());
}

/// Cholesky and triangular-solve keep their batch tiles (uneven here) and
/// the solve keeps `b`'s free dim tiled: only the matrix dims are gathered.
/// The factored matrices are `x x^T + 6 I`, so positive definite.
#[test]
fn cholesky_and_triangular_solve_keep_batch_tiles() {
    let m = module(
        "ENTRY %e (x: f32[6,5,5], b: f32[6,5,8]) -> (f32[6,5,5], f32[6,5,8], f32[6,8,5]) {\n  %x = f32[6,5,5] parameter(0), sharding={devices=[4,1,1]<=[4]}\n  %b = f32[6,5,8] parameter(1), sharding={devices=[2,2,1]<=[4]}\n  %g = f32[6,5,5] dot(%x, %x), lhs_batch_dims={0}, rhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_contracting_dims={2}, sharding={devices=[4,1,1]<=[4]}\n  %r = s32[6,5,5] iota(), iota_dimension=1, sharding={devices=[4,1,1]<=[4]}\n  %c = s32[6,5,5] iota(), iota_dimension=2, sharding={devices=[4,1,1]<=[4]}\n  %eye = pred[6,5,5] compare(%r, %c), direction=EQ, sharding={devices=[4,1,1]<=[4]}\n  %six = f32[] constant(6)\n  %sixes = f32[6,5,5] broadcast(%six), dimensions={}, sharding={devices=[4,1,1]<=[4]}\n  %zero = f32[] constant(0)\n  %zeros = f32[6,5,5] broadcast(%zero), dimensions={}, sharding={devices=[4,1,1]<=[4]}\n  %d = f32[6,5,5] select(%eye, %sixes, %zeros), sharding={devices=[4,1,1]<=[4]}\n  %a = f32[6,5,5] add(%g, %d), sharding={devices=[4,1,1]<=[4]}\n  %l = f32[6,5,5] cholesky(%a), lower=true, sharding={devices=[2,2,1]<=[4]}\n  %s = f32[6,5,8] triangular-solve(%l, %b), left_side=true, lower=true, unit_diagonal=false, transpose_a=NO_TRANSPOSE, sharding={devices=[2,1,2]<=[4]}\n  %bt = f32[6,8,5] transpose(%b), dimensions={0,2,1}, sharding={devices=[2,2,1]<=[4]}\n  %u = f32[6,5,5] cholesky(%a), lower=false, sharding={devices=[4,1,1]<=[4]}\n  %t = f32[6,8,5] triangular-solve(%u, %bt), left_side=false, lower=false, unit_diagonal=false, transpose_a=TRANSPOSE, sharding={devices=[2,2,1]<=[4]}\n  ROOT %o = (f32[6,5,5], f32[6,5,8], f32[6,8,5]) tuple(%l, %s, %t), sharding={{devices=[2,2,1]<=[4]}, {devices=[2,1,2]<=[4]}, {devices=[2,2,1]<=[4]}}\n}\n",
        "",
        4,
    );
    let (summary, part) = check(&m, 4, false, 1e-4, 101);
    assert_eq!(
        summary.handlers.get("cholesky:cholesky"),
        Some(&2),
        "{summary:?}"
    );
    assert_eq!(
        summary.handlers.get("triangular-solve:triangular-solve"),
        Some(&2),
        "{summary:?}"
    );
    assert!(
        !summary.handlers.keys().any(|h| h.ends_with(":fallback")),
        "{}",
        part.to_text()
    );
}

/// Gather indices built from an iota that the loop passes through
/// unchanged (and that a branch receives) are index-parallel: the gathers
/// stay on each device's rows with no communication. The root `while` is
/// copied by propagation's rule into a tuple copy, which stays tiled.
#[test]
fn iota_indices_traced_through_loop_and_branch_parameters() {
    let comps = "%cond (cp: (f32[8,4,2], s32[1,8,4], s32[])) -> pred[] {\n  %cp = (f32[8,4,2], s32[1,8,4], s32[]) parameter(0), sharding={{devices=[8,1,1]<=[8]}, {devices=[1,8,1]<=[8]}, {replicated}}\n  %ci = s32[] get-tuple-element(%cp), index=2, sharding={replicated}\n  %three = s32[] constant(3), sharding={replicated}\n  ROOT %lt = pred[] compare(%ci, %three), direction=LT, sharding={replicated}\n}\n\n%body (bp: (f32[8,4,2], s32[1,8,4], s32[])) -> (f32[8,4,2], s32[1,8,4], s32[]) {\n  %bp = (f32[8,4,2], s32[1,8,4], s32[]) parameter(0), sharding={{devices=[8,1,1]<=[8]}, {devices=[1,8,1]<=[8]}, {replicated}}\n  %x = f32[8,4,2] get-tuple-element(%bp), index=0, sharding={devices=[8,1,1]<=[8]}\n  %rows = s32[1,8,4] get-tuple-element(%bp), index=1, sharding={devices=[1,8,1]<=[8]}\n  %cols = s32[1,8,4] iota(), iota_dimension=2, sharding={devices=[1,8,1]<=[8]}\n  %ix = s32[2,8,4] concatenate(%rows, %cols), dimensions={0}, sharding={devices=[1,8,1]<=[8]}\n  %g = f32[8,4,2] gather(%x, %ix), offset_dims={2}, collapsed_slice_dims={0,1}, start_index_map={0,1}, index_vector_dim=0, slice_sizes={1,1,2}, sharding={devices=[8,1,1]<=[8]}\n  %one = f32[] constant(1), sharding={replicated}\n  %ones = f32[8,4,2] broadcast(%one), dimensions={}, sharding={devices=[8,1,1]<=[8]}\n  %y = f32[8,4,2] add(%g, %ones), sharding={devices=[8,1,1]<=[8]}\n  %bi = s32[] get-tuple-element(%bp), index=2, sharding={replicated}\n  %inc = s32[] constant(1), sharding={replicated}\n  %next = s32[] add(%bi, %inc), sharding={replicated}\n  ROOT %bt = (f32[8,4,2], s32[1,8,4], s32[]) tuple(%y, %rows, %next), sharding={{devices=[8,1,1]<=[8]}, {devices=[1,8,1]<=[8]}, {replicated}}\n}\n\n%branch (rp: (f32[8,4,2], s32[1,8,4])) -> f32[8,4,2] {\n  %rp = (f32[8,4,2], s32[1,8,4]) parameter(0), sharding={{devices=[8,1,1]<=[8]}, {devices=[1,8,1]<=[8]}}\n  %rx = f32[8,4,2] get-tuple-element(%rp), index=0, sharding={devices=[8,1,1]<=[8]}\n  %rrows = s32[1,8,4] get-tuple-element(%rp), index=1, sharding={devices=[1,8,1]<=[8]}\n  %rcols = s32[1,8,4] iota(), iota_dimension=2, sharding={devices=[1,8,1]<=[8]}\n  %rix = s32[2,8,4] concatenate(%rrows, %rcols), dimensions={0}, sharding={devices=[1,8,1]<=[8]}\n  ROOT %rg = f32[8,4,2] gather(%rx, %rix), offset_dims={2}, collapsed_slice_dims={0,1}, start_index_map={0,1}, index_vector_dim=0, slice_sizes={1,1,2}, sharding={devices=[8,1,1]<=[8]}\n}\n\n%other (op: (f32[8,4,2], s32[1,8,4])) -> f32[8,4,2] {\n  %op = (f32[8,4,2], s32[1,8,4]) parameter(0), sharding={{devices=[8,1,1]<=[8]}, {devices=[1,8,1]<=[8]}}\n  ROOT %ox = f32[8,4,2] get-tuple-element(%op), index=0, sharding={devices=[8,1,1]<=[8]}\n}\n\n";
    let m = module(
        "ENTRY %e (x: f32[8,4,2], pick: pred[]) -> ((f32[8,4,2], s32[1,8,4], s32[]), f32[8,4,2]) {\n  %x = f32[8,4,2] parameter(0), sharding={devices=[8,1,1]<=[8]}\n  %pick = pred[] parameter(1), sharding={replicated}\n  %rows = s32[1,8,4] iota(), iota_dimension=1, sharding={devices=[1,8,1]<=[8]}\n  %zero = s32[] constant(0), sharding={replicated}\n  %init = (f32[8,4,2], s32[1,8,4], s32[]) tuple(%x, %rows, %zero), sharding={{devices=[8,1,1]<=[8]}, {devices=[1,8,1]<=[8]}, {replicated}}\n  %w = (f32[8,4,2], s32[1,8,4], s32[]) while(%init), condition=%cond, body=%body, sharding={{devices=[8,1,1]<=[8]}, {devices=[1,8,1]<=[8]}, {replicated}}\n  %wc = (f32[8,4,2], s32[1,8,4], s32[]) copy(%w), sharding={{devices=[8,1,1]<=[8]}, {devices=[1,8,1]<=[8]}, {replicated}}\n  %arg = (f32[8,4,2], s32[1,8,4]) tuple(%x, %rows), sharding={{devices=[8,1,1]<=[8]}, {devices=[1,8,1]<=[8]}}\n  %c = f32[8,4,2] conditional(%pick, %arg, %arg), true_computation=%branch, false_computation=%other, sharding={devices=[8,1,1]<=[8]}\n  ROOT %o = ((f32[8,4,2], s32[1,8,4], s32[]), f32[8,4,2]) tuple(%wc, %c), sharding={{devices=[8,1,1]<=[8]}, {devices=[1,8,1]<=[8]}, {replicated}, {devices=[8,1,1]<=[8]}}\n}\n",
        comps,
        8,
    );
    let (summary, part) = check(&m, 8, false, 0.0, 103);
    assert_eq!(summary.collective_bytes, 0, "{}", part.to_text());
    assert!(
        !summary.handlers.keys().any(|h| h.ends_with(":fallback")),
        "{summary:?}"
    );
}

/// A convolution without spatial dims (a dot written as one, no `window`
/// attribute) is partitioned as an einsum rather than replicated.
#[test]
fn convolution_without_spatial_dims_is_an_einsum() {
    let m = module(
        "ENTRY %e (a: f32[16,8], b: f32[8,12]) -> f32[16,12] {\n  %a = f32[16,8] parameter(0), sharding={devices=[1,2]<=[2]}\n  %b = f32[8,12] parameter(1), sharding={devices=[2,1]<=[2]}\n  ROOT %c = f32[16,12] convolution(%a, %b), dim_labels=bf_io->bf, sharding={devices=[1,2]<=[2]}\n}\n",
        "",
        2,
    );
    let (summary, part) = check(&m, 2, false, 1e-5, 107);
    assert!(
        !summary.handlers.keys().any(|h| h.ends_with(":fallback")),
        "{summary:?}\n{}",
        part.to_text()
    );
    assert!(!part.to_text().contains("window={}"), "{}", part.to_text());
}

/// A value whose own sharding is replicated but whose only user slices a
/// corner of it: the all-gather to its sharding is never used (the slice
/// reads the tiled source and only the corner moves), so it is dead code.
#[test]
fn unused_reshard_to_an_instruction_sharding_is_not_paid_for() {
    let m = module(
        "ENTRY %e (a: f32[8,256]) -> f32[8,2] {\n  %a = f32[8,256] parameter(0), sharding={devices=[1,4]<=[4]}\n  %t = (f32[8,256]) tuple(%a), sharding={{devices=[1,4]<=[4]}}\n  %n = f32[8,256] get-tuple-element(%t), index=0, sharding={replicated}\n  %s = f32[8,2] slice(%n), slice={[0:8], [0:2]}, sharding={devices=[1,4]<=[4]}\n  ROOT %r = f32[8,2] copy(%s), sharding={replicated}\n}\n",
        "",
        4,
    );
    let (summary, part) = check(&m, 4, false, 0.0, 109);
    // The 8x2 corner moves (a permute and an all-reduce of it), not the
    // 8x256 array (8 KiB).
    assert!(
        summary.collective_bytes <= 128,
        "{summary:?}\n{}",
        part.to_text()
    );
}

/// A scatter-add whose operand is split on the row dim the indices address
/// and whose updates are split on their scatter dim over the other mesh
/// axis: each device scatters its updates into its own rows (indices
/// shifted, the rest skipped) and only the row tile is all-reduced over
/// the update shards. Indices are 0..=8, so 8 (out of bounds) is skipped.
#[test]
fn scatter_add_into_row_tiles_reduces_only_the_tile() {
    let m = module(
        "ENTRY %e (x: f32[8,6], r: s32[4,5,1], u: f32[4,5,6]) -> f32[8,6] {\n  %x = f32[8,6] parameter(0), sharding={devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}\n  %r = s32[4,5,1] parameter(1), sharding={devices=[2,1,1,4]<=[8] last_tile_dim_replicate}\n  %a = s32[4,5,1] abs(%r), sharding={devices=[2,1,1,4]<=[8] last_tile_dim_replicate}\n  %nine = s32[] constant(9)\n  %nines = s32[4,5,1] broadcast(%nine), dimensions={}, sharding={devices=[2,1,1,4]<=[8] last_tile_dim_replicate}\n  %i = s32[4,5,1] remainder(%a, %nines), sharding={devices=[2,1,1,4]<=[8] last_tile_dim_replicate}\n  %u = f32[4,5,6] parameter(2), sharding={devices=[2,1,1,4]<=[8] last_tile_dim_replicate}\n  ROOT %s = f32[8,6] scatter(%x, %i, %u), update_window_dims={2}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=2, to_apply=%add, sharding={devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}\n}\n",
        ADD,
        8,
    );
    let (summary, part) = check(&m, 8, false, 1e-5, 113);
    // The all-reduce of one [2,6] f32 tile.
    assert_eq!(
        summary.collective_bytes,
        48,
        "{summary:?}\n{}",
        part.to_text()
    );
}

/// A reversed convolution window tiled like its input (the kernel gradient
/// form): each device convolves its kernel rows, reversed, with the input
/// rows they meet (uneven kernel tiles, a window wider than the output),
/// and the partial outputs are all-reduced.
#[test]
fn reversed_window_sharded_convolution_sums_partial_outputs() {
    let m = module(
        "ENTRY %e (x: f32[6,8,4], k: f32[5,8,3]) -> f32[2,4,3] {\n  %x = f32[6,8,4] parameter(0), sharding={devices=[2,1,1]<=[2]}\n  %k = f32[5,8,3] parameter(1), sharding={devices=[2,1,1]<=[2]}\n  ROOT %c = f32[2,4,3] convolution(%x, %k), window={size=5 rhs_reversal=1}, dim_labels=0fb_0io->0bf, sharding={replicated}\n}\n",
        "",
        2,
    );
    let (summary, part) = check(&m, 2, false, 1e-4, 127);
    assert_eq!(
        summary
            .handlers
            .get("convolution:convolution-window-sharded"),
        Some(&1),
        "{summary:?}\n{}",
        part.to_text()
    );
}

/// Small arrays computed from constants and iotas only are computed
/// replicated and sliced to their shardings, so nothing moves when a user
/// needs another layout (XLA folds them to constants).
#[test]
fn constant_derived_values_move_nothing() {
    let m = module(
        "ENTRY %e (x: f32[8]) -> (f32[], f32[8]) {\n  %x = f32[8] parameter(0), sharding={devices=[8]<=[8]}\n  %c = f32[1,8] constant({{0,1,2,3,4,5,6,7}}), sharding={devices=[1,8]<=[8]}\n  %i = f32[1,8] iota(), iota_dimension=1, sharding={devices=[1,8]<=[8]}\n  %m = f32[1,8] multiply(%c, %i), sharding={devices=[1,8]<=[8]}\n  %s = f32[1,1] slice(%m), slice={[0:1], [3:4]}, sharding={devices=[1,8]<=[8]}\n  %r = f32[] reshape(%s), sharding={replicated}\n  %rb = f32[8] reshape(%m), sharding={devices=[2,4]<=[8] last_tile_dim_replicate}\n  %y = f32[8] add(%x, %rb), sharding={devices=[8]<=[8]}\n  ROOT %t = (f32[], f32[8]) tuple(%r, %y), sharding={{replicated}, {devices=[8]<=[8]}}\n}\n",
        "",
        8,
    );
    let (summary, part) = check(&m, 8, false, 0.0, 131);
    assert_eq!(
        summary.collective_bytes,
        0,
        "{summary:?}\n{}",
        part.to_text()
    );
}

/// An array whose tiled dims are mostly padding on both dims is made whole
/// by one all-reduce of the element placed at its global position, not by
/// one step per dim.
#[test]
fn padding_dims_are_summed_whole_in_one_all_reduce() {
    let m = module(
        "ENTRY %e (x: f32[1,1]) -> f32[1,1] {\n  %x = f32[1,1] parameter(0), sharding={devices=[2,2]<=[4]}\n  ROOT %c = f32[1,1] copy(%x), sharding={replicated}\n}\n",
        "",
        4,
    );
    let (summary, part) = check(&m, 4, false, 0.0, 137);
    assert_eq!(
        summary.collective_bytes,
        4,
        "{summary:?}\n{}",
        part.to_text()
    );
    assert_eq!(
        summary.collectives.get("all-reduce"),
        Some(&1),
        "{summary:?}"
    );
}

/// A manual element of a tuple parameter is read by a manual
/// get-tuple-element, and an outfeed of a manual tuple stays manual: both
/// partition with no communication (they used to be refused as reshards
/// between tiled and manual values).
#[test]
fn manual_tuple_elements_and_outfeeds_partition() {
    let m = module(
        "ENTRY %e (p: (f32[8,2], f32[4,2])) -> ((f32[4,2]), token[]) {\n  %p = (f32[8,2], f32[4,2]) parameter(0), sharding={{devices=[2,1]0,1}, {manual}}\n  %p0 = f32[8,2] get-tuple-element(%p), index=0, sharding={devices=[2,1]0,1}\n  %p1 = f32[4,2] get-tuple-element(%p), index=1, sharding={manual}\n  %s = f32[4,2] custom-call(%p0), custom_call_target=\"SPMDFullToShardShape\", sharding={manual}\n  %a = f32[4,2] add(%s, %p1), sharding={manual}\n  %t = (f32[4,2]) tuple(%a), sharding={{manual}}\n  %tok = token[] after-all()\n  %o = token[] outfeed(%t, %tok), outfeed_shape=(f32[4,2]), sharding={{manual}, {manual}}\n  ROOT %r = ((f32[4,2]), token[]) tuple(%t, %o), sharding={{manual}, {manual}}\n}\n",
        "",
        2,
    );
    let mut part = common::parse(&m);
    let summary = xla_spmd_partitioner::partition_module(
        &mut part,
        &xla_spmd_partitioner::SpmdOptions {
            num_partitions: Some(2),
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("partitioning failed: {e}"));
    xla_hlo_verifier::verify(&part).unwrap();
    assert_eq!(summary.collective_bytes, 0, "{}", part.to_text());
}

/// Replicating an array whose first dim is mostly padding over its tiles
/// gathers the whole second dim first, then sums the first dim's rows in
/// one all-reduce: 8 + 24 bytes, not a sum per column tile then a gather.
#[test]
fn other_dims_gathered_before_summing_padding_dims() {
    let m = module(
        "ENTRY %e (x: f32[3,2]) -> f32[3,2] {\n  %x = f32[3,2] parameter(0), sharding={devices=[8,2]<=[16]}\n  ROOT %c = f32[3,2] copy(%x), sharding={replicated}\n}\n",
        "",
        16,
    );
    let (summary, part) = check(&m, 16, false, 0.0, 139);
    assert_eq!(
        summary.collective_bytes,
        32,
        "{summary:?}\n{}",
        part.to_text()
    );
}

/// An index-parallel scatter takes the updates' tiling as a candidate: the
/// partially replicated operand is sliced to it locally, each device
/// scatters its own rows, and only the result is gathered.
#[test]
fn index_parallel_scatter_follows_the_updates_tiling() {
    let comps = "%sadd (a: s32[], b: s32[]) -> s32[] {\n  %a = s32[] parameter(0)\n  %b = s32[] parameter(1)\n  ROOT %s = s32[] add(%a, %b)\n}\n\n";
    let m = module(
        "ENTRY %e (x: s32[8,2], u: s32[8,2]) -> s32[8,2] {\n  %x = s32[8,2] parameter(0), sharding={devices=[2,1,4]<=[8] last_tile_dim_replicate}\n  %i = s32[8,1] iota(), iota_dimension=0, sharding={devices=[8,1]<=[8]}\n  %u = s32[8,2] parameter(1), sharding={devices=[8,1]<=[8]}\n  ROOT %s = s32[8,2] scatter(%x, %i, %u), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=%sadd, sharding={replicated}\n}\n",
        comps,
        8,
    );
    let (summary, part) = check(&m, 8, false, 0.0, 149);
    // The all-gather of the [8,2] s32 result.
    assert_eq!(
        summary.collective_bytes,
        64,
        "{summary:?}\n{}",
        part.to_text()
    );
}

/// A scatter-min with explicit batch dims: the updates stay tiled on the
/// batch dim and on their scatter dim; each device scatters into its batch
/// rows of an identity buffer and the rows are reduced over the scatter
/// dim's tiles only, instead of gathering the updates.
#[test]
fn batched_scatter_reduces_within_batch_tiles() {
    let comps = "%fmin (a: f32[], b: f32[]) -> f32[] {\n  %a = f32[] parameter(0)\n  %b = f32[] parameter(1)\n  ROOT %m = f32[] minimum(%a, %b)\n}\n\n";
    let m = module(
        "ENTRY %e (x: f32[2,7,4], r: s32[2,8,1], u: f32[2,8,4]) -> f32[2,7,4] {\n  %x = f32[2,7,4] parameter(0), sharding={devices=[2,1,1,4]<=[8] last_tile_dim_replicate}\n  %r = s32[2,8,1] parameter(1), sharding={devices=[2,4,1]<=[8]}\n  %a = s32[2,8,1] abs(%r), sharding={devices=[2,4,1]<=[8]}\n  %seven = s32[] constant(7)\n  %sevens = s32[2,8,1] broadcast(%seven), dimensions={}, sharding={devices=[2,4,1]<=[8]}\n  %i = s32[2,8,1] remainder(%a, %sevens), sharding={devices=[2,4,1]<=[8]}\n  %u = f32[2,8,4] parameter(2), sharding={devices=[2,4,1]<=[8]}\n  ROOT %s = f32[2,7,4] scatter(%x, %i, %u), update_window_dims={2}, inserted_window_dims={1}, scatter_dims_to_operand_dims={1}, input_batching_dims={0}, scatter_indices_batching_dims={0}, index_vector_dim=2, to_apply=%fmin, sharding={devices=[2,1,1,4]<=[8] last_tile_dim_replicate}\n}\n",
        comps,
        8,
    );
    let (summary, part) = check(&m, 8, false, 0.0, 151);
    // One all-reduce of a [1,7,4] f32 batch tile.
    assert_eq!(
        summary.collective_bytes,
        112,
        "{summary:?}\n{}",
        part.to_text()
    );
}

/// Values constant along broadcast dims (a broadcast, an elementwise op of
/// broadcasts, a transpose and a reshape of one) move nothing between
/// layouts whose devices differ only in those dims: any tile there holds
/// the same data.
#[test]
fn layouts_differing_only_in_broadcast_dims_move_nothing() {
    let m = module(
        "ENTRY %e (a: f32[2,3], b: f32[2,3,4]) -> (f32[4,2,4,3,4], f32[2,4,2,6,4], f32[2,3,4,4,4]) {\n  %a = f32[2,3] parameter(0), sharding={replicated}\n  %b = f32[2,3,4] parameter(1), sharding={replicated}\n  %ba = f32[4,2,4,3,4] broadcast(%a), dimensions={1,3}, sharding={devices=[2,1,2,1,2]<=[8]}\n  %bb = f32[4,2,4,3,4] broadcast(%b), dimensions={1,3,4}, sharding={devices=[2,1,2,1,2]<=[8]}\n  %s = f32[4,2,4,3,4] add(%ba, %bb), sharding={devices=[2,1,2,1,2]<=[8]}\n  %r = f32[2,4,2,6,4] reshape(%ba), sharding={devices=[2,1,2,1,2]<=[8]}\n  %t = f32[2,3,4,4,4] transpose(%ba), dimensions={1,3,0,2,4}, sharding={devices=[1,1,2,2,2]<=[8]}\n  %cs = f32[4,2,4,3,4] copy(%s), sharding={devices=[2,1,2,1,2]6,7,2,3,4,5,0,1}\n  %cr = f32[2,4,2,6,4] copy(%r), sharding={devices=[2,1,2,1,2]6,7,4,5,2,3,0,1}\n  %ct = f32[2,3,4,4,4] copy(%t), sharding={devices=[1,1,2,2,2]6,7,4,5,2,3,0,1}\n  ROOT %o = (f32[4,2,4,3,4], f32[2,4,2,6,4], f32[2,3,4,4,4]) tuple(%cs, %cr, %ct), sharding={{devices=[2,1,2,1,2]6,7,2,3,4,5,0,1}, {devices=[2,1,2,1,2]6,7,4,5,2,3,0,1}, {devices=[1,1,2,2,2]6,7,4,5,2,3,0,1}}\n}\n",
        "",
        8,
    );
    let (summary, part) = check(&m, 8, false, 0.0, 157);
    assert_eq!(
        summary.collective_bytes,
        0,
        "{summary:?}\n{}",
        part.to_text()
    );
}

/// Two tiled dims moving to two other dims, every device keeping its
/// coordinates: one all-to-all over all 8 devices moves one local tile
/// (XLA's all-to-all with several source and target dims), instead of
/// several minor-factor all-to-alls and a permute.
#[test]
fn two_dims_move_in_one_all_to_all() {
    let m = module(
        "ENTRY %e (p: s32[4,8,4,8]) -> s32[4,8,4,8] {\n  %p = s32[4,8,4,8] parameter(0), sharding={devices=[1,4,2,1]<=[8]}\n  ROOT %c = s32[4,8,4,8] copy(%p), sharding={devices=[2,1,1,4]<=[4,2]T(1,0)}\n}\n",
        "",
        8,
    );
    let (summary, part) = check(&m, 8, false, 0.0, 158);
    // One all-to-all of the [4,2,2,8] s32 tile.
    assert_eq!(
        summary.collective_bytes,
        512,
        "{summary:?}\n{}",
        part.to_text()
    );
    assert_eq!(
        summary.collectives.get("all-to-all"),
        Some(&1),
        "{summary:?}"
    );
}

/// fft keeps its batch tiles and makes only the transform dims whole: an
/// RFFT whose transform dim is tiled gathers just that dim (within each
/// batch tile), and the IRFFT back runs on the batch tiles alone.
#[test]
fn fft_keeps_batch_tiles() {
    let m = module(
        "ENTRY %e (x: f32[8,6]) -> (c64[8,4], f32[8,6]) {\n  %x = f32[8,6] parameter(0), sharding={devices=[4,2]<=[8]}\n  %f = c64[8,4] fft(%x), fft_type=RFFT, fft_length={6}, sharding={devices=[4,2]<=[8]}\n  %i = f32[8,6] fft(%f), fft_type=IRFFT, fft_length={6}, sharding={devices=[8,1]<=[8]}\n  ROOT %t = (c64[8,4], f32[8,6]) tuple(%f, %i), sharding={{devices=[4,2]<=[8]}, {devices=[8,1]<=[8]}}\n}\n",
        "",
        8,
    );
    let (summary, part) = check(&m, 8, false, 1e-5, 159);
    assert!(
        !summary.handlers.contains_key("fft:fallback"),
        "{summary:?}"
    );
    // The RFFT's all-gather of the transform dim ([2,3] f32 tiles into
    // [2,6]) only: the IRFFT reads the RFFT's result in the layout it was
    // computed in (batch tiles of 2 rows, transform dim whole), from which
    // its [8,1] rows are local slices.
    assert_eq!(
        summary.collective_bytes,
        48,
        "{summary:?}\n{}",
        part.to_text()
    );
}

/// A transposed mesh on uneven dims (5x5 in 4x2 tiles, transposed to 2x4
/// and back): each device receives its tile's pieces from their holders
/// in collective-permutes (several dims redistributed at once) instead of
/// gathering the whole array.
#[test]
fn uneven_transposed_tiles_are_redistributed_piecewise() {
    let m = module(
        "ENTRY %e (x: f32[5,5]) -> f32[5,5] {\n  %x = f32[5,5] parameter(0), sharding={devices=[4,2]<=[8]}\n  %a = f32[5,5] add(%x, %x), sharding={devices=[4,2]<=[8]}\n  %t = f32[5,5] transpose(%a), dimensions={1,0}, sharding={devices=[2,4]<=[4,2]T(1,0)}\n  ROOT %s = f32[5,5] add(%a, %t), sharding={devices=[4,2]<=[8]}\n}\n",
        "",
        8,
    );
    let (summary, part) = check(&m, 8, false, 0.0, 160);
    // Pieces of 2x2, 2x1, 1x2 and 1x1 elements; the first two in two
    // rounds each (a source holds the pieces of two receivers): 15 f32.
    assert_eq!(
        summary.collective_bytes,
        60,
        "{summary:?}\n{}",
        part.to_text()
    );
    assert_eq!(summary.collectives.get("all-gather"), None, "{summary:?}");
}

/// `rng-bit-generator` with a tiled result: every device generates its
/// tile of the global stream, bit-equal to the unpartitioned program, with
/// no collective, for each algorithm, element width, state length and
/// tiling (rows, columns, both, uneven, partially replicated).
#[test]
fn rng_bit_generator_tiles_are_the_global_stream() {
    let cases: [(&str, i64, &str); 6] = [
        ("[16,8]", 2, "{devices=[2,1]<=[2]}"),
        ("[8,12]", 4, "{devices=[1,4]<=[4]}"),
        ("[8,16]", 8, "{devices=[2,4]<=[8]}"),
        ("[10,6]", 4, "{devices=[4,1]<=[4]}"),
        ("[7,9]", 8, "{devices=[2,4]<=[8]}"),
        (
            "[5,3,6]",
            8,
            "{devices=[2,1,2,2]<=[8] last_tile_dim_replicate}",
        ),
    ];
    let mut seed = 200;
    for algorithm in ["rng_default", "rng_philox", "rng_three_fry"] {
        for ty in ["u32", "f32", "u64", "f64", "bf16", "u8", "s16"] {
            for state_len in [2, 3] {
                for (dims, n, sharding) in cases {
                    // Floats come back as their bits: random bits make NaNs,
                    // which no equality test would pass.
                    let bits_ty = match ty {
                        "f32" => "u32",
                        "f64" => "u64",
                        "bf16" | "s16" => "u16",
                        other => other,
                    };
                    let m = module(
                        &format!(
                            "ENTRY %e (s: u64[{state_len}]) -> (u64[{state_len}], {bits_ty}{dims}) {{\n  %s = u64[{state_len}] parameter(0), sharding={{replicated}}\n  %r = (u64[{state_len}], {ty}{dims}) rng-bit-generator(%s), algorithm={algorithm}, sharding={{{{replicated}}, {sharding}}}\n  %state = u64[{state_len}] get-tuple-element(%r), index=0, sharding={{replicated}}\n  %values = {ty}{dims} get-tuple-element(%r), index=1, sharding={sharding}\n  %bits = {bits_ty}{dims} bitcast-convert(%values), sharding={sharding}\n  ROOT %t = (u64[{state_len}], {bits_ty}{dims}) tuple(%state, %bits), sharding={{{{replicated}}, {sharding}}}\n}}\n"
                        ),
                        "",
                        n,
                    );
                    seed += 1;
                    eprintln!(
                        "case: {algorithm} {ty}{dims} state u64[{state_len}] on {n}: {sharding}"
                    );
                    let (summary, part) = check(&m, n, false, 0.0, seed);
                    assert_eq!(
                        summary.handlers.get("rng-bit-generator:global-stream-tile"),
                        Some(&1),
                        "{summary:?}\n{m}"
                    );
                    assert_eq!(summary.collective_bytes, 0, "{}", part.to_text());
                }
            }
        }
    }
}

/// A Philox counter whose low word wraps inside the array carries into
/// the high word on the devices past the wrap, as in the global stream.
#[test]
fn rng_bit_generator_counter_carries_across_tiles() {
    let m = module(
        "ENTRY %e () -> (u64[3], u32[16,4]) {\n  %s = u64[3] constant({12345, 18446744073709551613, 41}), sharding={replicated}\n  ROOT %r = (u64[3], u32[16,4]) rng-bit-generator(%s), algorithm=rng_philox, sharding={{replicated}, {devices=[8,1]<=[8]}}\n}\n",
        "",
        8,
    );
    let (summary, _) = check(&m, 8, false, 0.0, 300);
    assert_eq!(summary.collective_bytes, 0);
}
