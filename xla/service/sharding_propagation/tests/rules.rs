//! Propagation rules per opcode family on small HLO text modules: each test
//! states the user shardings and checks what propagation derives (in both
//! directions), plus the pass-level guarantees (user shardings kept,
//! Sharding custom-calls become copies, manual regions, control flow
//! boundaries, idempotence, honest `changed`).

use xla_hlo_ir::HloModule;
use xla_hlo_pass::{Pass, Pipeline};
use xla_hlo_utils::compare::equivalent;
use xla_sharding_propagation::{
    ShardingCompletion, ShardingPropagation, ShardingPropagationOptions,
};

fn propagate(text: &str) -> HloModule {
    let mut module = xla_hlo_parser::parse_module(text).unwrap_or_else(|e| panic!("{e}"));
    Pipeline::new("t")
        .add(ShardingPropagation::default())
        .with_change_check(true)
        .run(&mut module)
        .unwrap_or_else(|e| panic!("{e}"));
    // A second run is a no-op.
    let mut again = ShardingPropagation::default();
    let before = module.clone();
    assert!(
        !again.run(&mut module).unwrap(),
        "second run changed the module"
    );
    assert_eq!(before, module);
    module
}

/// Asserts `name` has a sharding equivalent to `want` (or none).
fn check(module: &HloModule, name: &str, want: Option<&str>) {
    let (comp, id) = module
        .find_instruction(name)
        .unwrap_or_else(|| panic!("no instruction {name}"));
    let instr = module.comp(comp).instr(id);
    match (want, &instr.sharding) {
        (None, None) => {}
        (Some(wanted), Some(got)) => {
            let wanted = xla_hlo_parser::parse_sharding(wanted).unwrap();
            assert!(
                equivalent(got, &wanted, &instr.shape),
                "{name}: got {got}, want {wanted}"
            );
        }
        (wanted, got) => panic!("{name}: got {got:?}, want {wanted:?}"),
    }
}

const HEADER: &str = "HloModule m, num_partitions=8\n\n";

#[test]
fn elementwise_forward_and_backward() {
    let module = propagate(&format!(
        "{HEADER}ENTRY %e (p: f32[8,4], q: f32[8,4]) -> f32[8,4] {{
  %p = f32[8,4] parameter(0), sharding={{devices=[8,1]<=[8]}}
  %q = f32[8,4] parameter(1)
  %e = f32[8,4] exponential(%q)
  %a = f32[8,4] add(%p, %e)
  ROOT %n = f32[8,4] negate(%a), sharding={{devices=[8,1]<=[8]}}
}}"
    ));
    check(&module, "a", Some("{devices=[8,1]<=[8]}"));
    check(&module, "e", Some("{devices=[8,1]<=[8]}"));
    // Parameters without a sharding stay as they are (no propagation to
    // parameters unless the module allows it).
    check(&module, "q", None);
}

#[test]
fn user_shardings_are_never_overwritten() {
    let module = propagate(&format!(
        "{HEADER}ENTRY %e (p: f32[8,8]) -> f32[8,8] {{
  %p = f32[8,8] parameter(0), sharding={{devices=[8,1]<=[8]}}
  %a = f32[8,8] abs(%p), sharding={{devices=[1,8]<=[8]}}
  ROOT %n = f32[8,8] negate(%a), sharding={{replicated}}
}}"
    ));
    check(&module, "p", Some("{devices=[8,1]<=[8]}"));
    check(&module, "a", Some("{devices=[1,8]<=[8]}"));
    check(&module, "n", Some("{replicated}"));
}

#[test]
fn broadcast_reshape_transpose() {
    let module = propagate(&format!(
        "{HEADER}ENTRY %e (p: f32[64,8], b: f32[8]) -> f32[8,8,8] {{
  %p = f32[64,8] parameter(0), sharding={{devices=[8,1]<=[8]}}
  %b = f32[8] parameter(1), sharding={{replicated}}
  %r = f32[8,8,8] reshape(%p)
  %t = f32[8,8,8] transpose(%r), dimensions={{1,0,2}}
  %bc = f32[8,8,8] broadcast(%b), dimensions={{2}}
  %s = f32[8,8,8] add(%t, %bc)
  ROOT %o = f32[8,8,8] copy(%s), sharding={{replicated}}
}}"
    ));
    // [64,8] split into [8,8,8]: dim 0 keeps the 8-way tiling.
    check(&module, "r", Some("{devices=[8,1,1]<=[8]}"));
    check(&module, "t", Some("{devices=[1,8,1]<=[8]}"));
    check(&module, "s", Some("{devices=[1,8,1]<=[8]}"));
    // Broadcasts take their users' sharding (level 2).
    check(&module, "bc", Some("{devices=[1,8,1]<=[8]}"));
}

#[test]
fn megatron_dots() {
    let module = propagate(&format!(
        "{HEADER}ENTRY %e (x: f32[16,64], w1: f32[64,256], w2: f32[256,64]) -> f32[16,64] {{
  %x = f32[16,64] parameter(0), sharding={{replicated}}
  %w1 = f32[64,256] parameter(1), sharding={{devices=[1,8]<=[8]}}
  %w2 = f32[256,64] parameter(2), sharding={{devices=[8,1]<=[8]}}
  %h = f32[16,256] dot(%x, %w1), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
  %t = f32[16,256] tanh(%h)
  %y = f32[16,64] dot(%t, %w2), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
  ROOT %r = f32[16,64] copy(%y), sharding={{replicated}}
}}"
    ));
    check(&module, "h", Some("{devices=[1,8]<=[8]}"));
    check(&module, "t", Some("{devices=[1,8]<=[8]}"));
    check(&module, "y", Some("{replicated}"));
}

#[test]
fn batched_dot_with_partial_replication() {
    let module = propagate(&format!(
        "{HEADER}ENTRY %e (a: f32[4,16,32], b: f32[4,32,8]) -> f32[4,16,8] {{
  %a = f32[4,16,32] parameter(0), sharding={{devices=[2,1,1,4]<=[8] last_tile_dim_replicate}}
  %b = f32[4,32,8] parameter(1), sharding={{devices=[2,1,4,1]<=[8] last_tile_dim_replicate}}
  %d = f32[4,16,8] dot(%a, %b), lhs_batch_dims={{0}}, rhs_batch_dims={{0}}, lhs_contracting_dims={{2}}, rhs_contracting_dims={{1}}
  ROOT %r = f32[4,16,8] copy(%d)
}}"
    ));
    // Batch from both, output feature from b: merged into [2,1,4].
    check(&module, "d", Some("{devices=[2,1,4]<=[8]}"));
}

#[test]
fn reduce_and_reduce_backward() {
    let module = propagate(&format!(
        "{HEADER}%add (a: f32[], b: f32[]) -> f32[] {{
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %sum = f32[] add(%a, %b)
}}

ENTRY %e (p: f32[16,32], q: f32[16,32]) -> f32[16] {{
  %p = f32[16,32] parameter(0), sharding={{devices=[2,4]<=[8]}}
  %z = f32[] constant(0)
  %r = f32[16] reduce(%p, %z), dimensions={{1}}, to_apply=%add
  %q = f32[16,32] parameter(1)
  %n = f32[16,32] negate(%q)
  %r2 = f32[16] reduce(%n, %z), dimensions={{1}}, to_apply=%add
  %s = f32[16] add(%r, %r2)
  ROOT %o = f32[16] copy(%s), sharding={{replicated}}
}}"
    ));
    check(
        &module,
        "r",
        Some("{devices=[2,4]<=[8] last_tile_dim_replicate}"),
    );
    check(
        &module,
        "s",
        Some("{devices=[2,4]<=[8] last_tile_dim_replicate}"),
    );
    // Backward through a reduce: the reduced dim is left untiled.
    check(
        &module,
        "n",
        Some("{devices=[2,1,4]<=[8] last_tile_dim_replicate}"),
    );
    // Reducer bodies and scalar init values get no sharding (as in XLA).
    check(&module, "z", None);
    check(&module, "a", None);
}

#[test]
fn concatenate_slice_pad_dynamic_slice() {
    let module = propagate(&format!(
        "{HEADER}ENTRY %e (p: f32[32,8], q: f32[16,8], i: s32[]) -> f32[48,4] {{
  %p = f32[32,8] parameter(0), sharding={{devices=[8,1]<=[8]}}
  %q = f32[16,8] parameter(1), sharding={{devices=[8,1]<=[8]}}
  %i = s32[] parameter(2), sharding={{replicated}}
  %c = f32[48,8] concatenate(%p, %q), dimensions={{0}}
  %z = f32[] constant(0)
  %pd = f32[48,10] pad(%c, %z), padding=0_0x1_1
  %sl = f32[48,8] slice(%pd), slice={{[0:48], [1:9]}}
  %ds = f32[48,4] dynamic-slice(%sl, %i, %i), dynamic_slice_sizes={{48,4}}
  ROOT %o = f32[48,4] copy(%ds), sharding={{devices=[8,1]<=[8]}}
}}"
    ));
    check(&module, "c", Some("{devices=[8,1]<=[8]}"));
    check(&module, "pd", Some("{devices=[8,1]<=[8]}"));
    check(&module, "sl", Some("{devices=[8,1]<=[8]}"));
    check(&module, "ds", Some("{devices=[8,1]<=[8]}"));
}

#[test]
fn sharding_custom_calls_become_copies() {
    let module = propagate(&format!(
        "{HEADER}ENTRY %e (p: f32[32,32]) -> f32[32,32] {{
  %p = f32[32,32] parameter(0), sharding={{devices=[8,1]<=[8]}}
  %a = f32[32,32] abs(%p)
  %c1 = f32[32,32] custom-call(%a), custom_call_target=\"Sharding\", sharding={{devices=[1,8]<=[8]}}
  %b = f32[32,32] negate(%c1)
  %c2 = f32[32,32] custom-call(%b), custom_call_target=\"Sharding\", sharding={{replicated}}
  ROOT %r = f32[32,32] copy(%c2), sharding={{replicated}}
}}"
    ));
    // Named as XLA names them: reverse post order gets copy, copy.1.
    check(&module, "copy.1", Some("{devices=[1,8]<=[8]}"));
    check(&module, "copy", Some("{replicated}"));
    // The operand of a constraint inherits it.
    check(&module, "a", Some("{devices=[1,8]<=[8]}"));
    check(&module, "b", Some("{replicated}"));
    assert!(module.find_instruction("c1").is_none());
}

#[test]
fn manual_regions() {
    let module = propagate(&format!(
        "{HEADER}ENTRY %e (p: f32[16,64]) -> f32[16,64] {{
  %p = f32[16,64] parameter(0), sharding={{devices=[4,2]<=[8]}}
  %s = f32[4,32] custom-call(%p), custom_call_target=\"SPMDFullToShardShape\", sharding={{manual}}
  %a = f32[4,32] exponential(%s)
  %b = f32[4,32] negate(%a)
  %f = f32[16,64] custom-call(%b), custom_call_target=\"SPMDShardToFullShape\", sharding={{devices=[4,2]<=[8]}}
  ROOT %r = f32[16,64] copy(%f), sharding={{devices=[4,2]<=[8]}}
}}"
    ));
    check(&module, "a", Some("{manual}"));
    check(&module, "b", Some("{manual}"));
    check(&module, "f", Some("{devices=[4,2]<=[8]}"));
}

#[test]
fn while_body_matches_the_loop() {
    let module = propagate(&format!(
        "{HEADER}%body (t: (s32[], f32[16,8])) -> (s32[], f32[16,8]) {{
  %t = (s32[], f32[16,8]) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %one = s32[] constant(1)
  %i2 = s32[] add(%i, %one)
  %xb = f32[16,8] get-tuple-element(%t), index=1
  %y = f32[16,8] tanh(%xb)
  ROOT %o = (s32[], f32[16,8]) tuple(%i2, %y)
}}

%cond (tc: (s32[], f32[16,8])) -> pred[] {{
  %tc = (s32[], f32[16,8]) parameter(0)
  %ic = s32[] get-tuple-element(%tc), index=0
  %n = s32[] constant(4)
  ROOT %lt = pred[] compare(%ic, %n), direction=LT
}}

ENTRY %e (x: f32[16,8]) -> f32[16,8] {{
  %x = f32[16,8] parameter(0), sharding={{devices=[8,1]<=[8]}}
  %z = s32[] constant(0)
  %init = (s32[], f32[16,8]) tuple(%z, %x)
  %w = (s32[], f32[16,8]) while(%init), condition=%cond, body=%body
  ROOT %r = f32[16,8] get-tuple-element(%w), index=1, sharding={{devices=[8,1]<=[8]}}
}}"
    ));
    let tuple = "{{replicated}, {devices=[8,1]<=[8]}}";
    check(&module, "w", Some(tuple));
    check(&module, "init", Some(tuple));
    check(&module, "y", Some("{devices=[8,1]<=[8]}"));
    check(&module, "lt", Some("{replicated}"));
}

#[test]
fn while_root_gets_a_copy_so_the_loop_can_be_resharded() {
    let module = propagate(&format!(
        "{HEADER}%body2 (t2: (s32[], f32[16,8])) -> (s32[], f32[16,8]) {{
  %t2 = (s32[], f32[16,8]) parameter(0)
  %i2 = s32[] get-tuple-element(%t2), index=0
  %x2 = f32[16,8] get-tuple-element(%t2), index=1
  %c2 = f32[16,8] custom-call(%x2), custom_call_target=\"Sharding\", sharding={{devices=[1,8]<=[8]}}
  %y2 = f32[16,8] tanh(%c2)
  ROOT %o2 = (s32[], f32[16,8]) tuple(%i2, %y2)
}}

%cond2 (tc2: (s32[], f32[16,8])) -> pred[] {{
  %tc2 = (s32[], f32[16,8]) parameter(0)
  %ic2 = s32[] get-tuple-element(%tc2), index=0
  %n2 = s32[] constant(4)
  ROOT %lt2 = pred[] compare(%ic2, %n2), direction=LT
}}

ENTRY %e (x: f32[16,8]) -> (s32[], f32[16,8]) {{
  %x = f32[16,8] parameter(0), sharding={{devices=[8,1]<=[8]}}
  %z = s32[] constant(0)
  %init = (s32[], f32[16,8]) tuple(%z, %x)
  ROOT %w = (s32[], f32[16,8]) while(%init), condition=%cond2, body=%body2, sharding={{{{replicated}}, {{replicated}}}}
}}"
    ));
    // The constraint in the body is the first copy; the root copy comes next
    // and keeps the output sharding, while the loop follows its body.
    check(&module, "copy", Some("{devices=[1,8]<=[8]}"));
    check(&module, "copy.1", Some("{{replicated}, {replicated}}"));
    let e = module.entry_computation();
    assert_eq!(e.root_instr().name, "copy.1");
    check(&module, "w", Some("{{replicated}, {replicated}}"));
}

#[test]
fn conditional_branches_follow_operands() {
    let module = propagate(&format!(
        "{HEADER}%b0 (a: f32[8,4]) -> f32[8,4] {{
  %a = f32[8,4] parameter(0)
  ROOT %n = f32[8,4] negate(%a)
}}

%b1 (a1: f32[8,4]) -> f32[8,4] {{
  %a1 = f32[8,4] parameter(0)
  ROOT %n1 = f32[8,4] exponential(%a1)
}}

ENTRY %e (k: s32[], x: f32[8,4]) -> f32[8,4] {{
  %k = s32[] parameter(0), sharding={{replicated}}
  %x = f32[8,4] parameter(1), sharding={{devices=[8,1]<=[8]}}
  %c = f32[8,4] conditional(%k, %x, %x), branch_computations={{%b0, %b1}}
  ROOT %r = f32[8,4] copy(%c), sharding={{devices=[8,1]<=[8]}}
}}"
    ));
    check(&module, "c", Some("{devices=[8,1]<=[8]}"));
    check(&module, "a", Some("{devices=[8,1]<=[8]}"));
}

#[test]
fn gather_from_sharded_indices() {
    let module = propagate(&format!(
        "{HEADER}ENTRY %e (t: f32[64,16], ids: s32[8,1]) -> f32[8,16] {{
  %t = f32[64,16] parameter(0), sharding={{replicated}}
  %ids = s32[8,1] parameter(1), sharding={{devices=[8,1]<=[8]}}
  %g = f32[8,16] gather(%t, %ids), offset_dims={{1}}, collapsed_slice_dims={{0}}, start_index_map={{0}}, index_vector_dim=1, slice_sizes={{1,16}}
  ROOT %r = f32[8,16] copy(%g)
}}"
    ));
    check(&module, "g", Some("{devices=[8,1]<=[8]}"));
}

#[test]
fn gather_with_iota_indices_is_parallel() {
    // take_along_axis: indices = concat(iota over dim 0, ids): the gather is
    // parallel along dim 0, so the operand's dim-0 tiling reaches the output.
    let module = propagate(&format!(
        "{HEADER}ENTRY %e (x: f32[8,16], ids: s32[8,4,1]) -> f32[8,4] {{
  %x = f32[8,16] parameter(0), sharding={{devices=[8,1]<=[8]}}
  %ids = s32[8,4,1] parameter(1), sharding={{replicated}}
  %io = s32[8,4,1] iota(), iota_dimension=0
  %idx = s32[8,4,2] concatenate(%io, %ids), dimensions={{2}}
  %g = f32[8,4] gather(%x, %idx), offset_dims={{}}, collapsed_slice_dims={{0,1}}, start_index_map={{0,1}}, index_vector_dim=2, slice_sizes={{1,1}}
  ROOT %r = f32[8,4] copy(%g)
}}"
    ));
    check(&module, "g", Some("{devices=[8,1]<=[8]}"));
}

#[test]
fn propagation_to_output_when_allowed() {
    let text = String::from(
        "HloModule m, allow_spmd_sharding_propagation_to_output={true}, num_partitions=8\n\n\
ENTRY %e (p: f32[8,4]) -> f32[8,4] {
  %p = f32[8,4] parameter(0), sharding={devices=[8,1]<=[8]}
  ROOT %n = f32[8,4] negate(%p)
}",
    );
    let module = propagate(&text);
    check(&module, "n", Some("{devices=[8,1]<=[8]}"));
    // Without permission the root keeps no sharding.
    let mut m2 = xla_hlo_parser::parse_module(&text).unwrap();
    let mut pass = ShardingPropagation::new(ShardingPropagationOptions {
        allow_propagation_to_output: Some(vec![false]),
        ..Default::default()
    });
    pass.run(&mut m2).unwrap();
    check(&m2, "n", None);
}

#[test]
fn completion_pass_fills_partitioned_computations() {
    let text = format!(
        "{HEADER}%add (a: f32[], b: f32[]) -> f32[] {{
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %sum = f32[] add(%a, %b)
}}

ENTRY %e (p: f32[8,4]) -> f32[] {{
  %p = f32[8,4] parameter(0), sharding={{devices=[8,1]<=[8]}}
  %z = f32[] constant(0)
  ROOT %r = f32[] reduce(%p, %z), dimensions={{0,1}}, to_apply=%add
}}"
    );
    let mut module = xla_hlo_parser::parse_module(&text).unwrap();
    let report = Pipeline::new("t")
        .add(ShardingPropagation::default())
        .add(ShardingCompletion)
        .with_change_check(true)
        .run(&mut module)
        .unwrap();
    assert!(report.runs[1].changed);
    check(&module, "z", Some("{replicated}"));
    check(&module, "r", Some("{replicated}"));
    check(&module, "p", Some("{devices=[8,1]<=[8]}"));
    // The reducer is not partitioned.
    check(&module, "sum", None);
    assert!(!ShardingCompletion.run(&mut module).unwrap());
}

#[test]
fn nothing_to_do_reports_unchanged() {
    let text = "HloModule m\n\nENTRY %e (p: f32[4]) -> f32[4] {\n  %p = f32[4] parameter(0)\n  ROOT %n = f32[4] negate(%p)\n}\n";
    let mut module = xla_hlo_parser::parse_module(text).unwrap();
    let before = module.clone();
    assert!(!ShardingPropagation::default().run(&mut module).unwrap());
    assert_eq!(module, before);
}

#[test]
fn malformed_sharding_is_an_error_not_a_panic() {
    // Device count does not match the tile dims: rejected by the pass
    // (the verifier is skipped here on purpose).
    let text = "HloModule m, num_partitions=8\n\nENTRY %e (p: f32[8]) -> f32[8] {\n  %p = f32[8] parameter(0), sharding={devices=[4]0,1,2}\n  ROOT %n = f32[8] negate(%p)\n}\n";
    if let Ok(mut module) = xla_hlo_parser::parse_module(text) {
        assert!(ShardingPropagation::default().run(&mut module).is_err());
    }
}

#[test]
fn shard_barriers_pass_one_way_and_are_removed() {
    // ShardBarrierTo: the sharded broadcast below asks nothing of `c` but
    // replication; ShardBarrierFrom: `m` is sharded by its user, `n` does
    // not see `m`'s operand sharding.
    let module = propagate(&format!(
        "{HEADER}ENTRY %e (p: f32[16], q: f32[16,8]) -> (f32[4,16], f32[16,8]) {{
  %p = f32[16] parameter(0)
  %c = f32[16] copy(%p)
  %to = f32[16] custom-call(%c), custom_call_target=\"ShardBarrierTo\", custom_call_has_side_effect=true
  %b = f32[4,16] broadcast(%to), dimensions={{1}}
  %bs = f32[4,16] copy(%b), sharding={{devices=[1,8]<=[8]}}
  %q = f32[16,8] parameter(1), sharding={{devices=[8,1]<=[8]}}
  %from = f32[16,8] custom-call(%q), custom_call_target=\"ShardBarrierFrom\", custom_call_has_side_effect=true
  %n = f32[16,8] negate(%from)
  %m = f32[16,8] copy(%n), sharding={{devices=[1,8]<=[8]}}
  ROOT %t = (f32[4,16], f32[16,8]) tuple(%bs, %m)
}}"
    ));
    check(&module, "c", Some("{replicated}"));
    check(&module, "n", Some("{devices=[1,8]<=[8]}"));
    assert!(module.find_instruction("to").is_none() && module.find_instruction("from").is_none());
    let entry = module.entry_computation();
    let broadcast = entry.instr(entry.find("b").unwrap());
    assert_eq!(entry.instr(broadcast.operands[0]).name, "c");
    let negate = entry.instr(entry.find("n").unwrap());
    assert_eq!(entry.instr(negate.operands[0]).name, "q");
}

#[test]
fn index_parallel_scatter_backward() {
    // The indices are an iota along the scattered dim, so row i of the
    // updates lands in row i of the output: the output's tiles on that dim
    // go to the updates' (and the indices') parallel dim.
    let module = propagate(&format!(
        "{HEADER}%add (x: f32[], y: f32[]) -> f32[] {{
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}}

ENTRY %e (p: f32[8,16], u: f32[8,16]) -> f32[8,16] {{
  %p = f32[8,16] parameter(0)
  %u = f32[8,16] parameter(1)
  %updates = f32[8,16] copy(%u)
  %indices = s32[8,1] iota(), iota_dimension=0
  %scatter = f32[8,16] scatter(%p, %indices, %updates), update_window_dims={{1}}, inserted_window_dims={{0}}, scatter_dims_to_operand_dims={{0}}, index_vector_dim=1, to_apply=%add, sharding={{devices=[8,1]<=[8]}}
  ROOT %r = f32[8,16] copy(%scatter)
}}"
    ));
    check(&module, "updates", Some("{devices=[8,1]<=[8]}"));
}

#[test]
fn non_spmd_mode_places_operands_on_device_subsets() {
    // is_spmd=false (XLA's per-device placement): a concatenate tiled on
    // its concatenated dim asks each operand to live on the devices its
    // rows land on (when more than one); a broadcast tiled on a new dim asks nothing; SPMD asks
    // every operand for the result's sharding.
    let text = format!(
        "{HEADER}ENTRY %e (a: f32[6,4], b: f32[2,4], p: f32[4]) -> (f32[8,4], f32[2,4]) {{
  %a = f32[6,4] parameter(0)
  %b = f32[2,4] parameter(1)
  %ca = f32[6,4] copy(%a)
  %cb = f32[2,4] copy(%b)
  %c = f32[8,4] concatenate(%ca, %cb), dimensions={{0}}, sharding={{devices=[4,1]0,1,2,3}}
  %p = f32[4] parameter(2)
  %cp = f32[4] copy(%p)
  %bc = f32[2,4] broadcast(%cp), dimensions={{1}}, sharding={{devices=[2,1]0,1}}
  ROOT %t = (f32[8,4], f32[2,4]) tuple(%c, %bc)
}}"
    );
    let run = |is_spmd: bool| {
        let mut module = xla_hlo_parser::parse_module(&text).unwrap();
        let options = ShardingPropagationOptions {
            is_spmd,
            ..Default::default()
        };
        ShardingPropagation::new(options).run(&mut module).unwrap();
        module
    };
    let placed = run(false);
    check(&placed, "ca", Some("{devices=[3,1]0,1,2}"));
    // Its rows land on device 3 alone: XLA offers a maximal sharding, which
    // propagation never takes.
    check(&placed, "cb", None);
    check(&placed, "cp", None);
    let spmd = run(true);
    check(&spmd, "ca", Some("{devices=[4,1]0,1,2,3}"));
    check(
        &spmd,
        "cp",
        Some("{devices=[2]0,1 last_tile_dim_replicate}"),
    );
}

#[test]
fn calls_are_propagated_through_when_not_inlined() {
    let text = format!(
        "{HEADER}%body (x: f32[8,4]) -> f32[8,4] {{
  %x = f32[8,4] parameter(0)
  ROOT %twice = f32[8,4] add(%x, %x)
}}

ENTRY %e (p: f32[8,4]) -> f32[8,4] {{
  %p = f32[8,4] parameter(0), sharding={{devices=[8,1]<=[8]}}
  %c = f32[8,4] call(%p), to_apply=%body
  ROOT %n = f32[8,4] negate(%c)
}}"
    );
    let mut module = xla_hlo_parser::parse_module(&text).unwrap();
    let options = ShardingPropagationOptions {
        inline_calls: false,
        ..Default::default()
    };
    ShardingPropagation::new(options).run(&mut module).unwrap();
    check(&module, "twice", Some("{devices=[8,1]<=[8]}"));
    check(&module, "c", Some("{devices=[8,1]<=[8]}"));
    // Inlined by default: the callee's add is now the entry's.
    let inlined = propagate(&text);
    assert_eq!(inlined.computations.len(), 1);
}

#[test]
fn a_single_tuple_parameter_takes_per_element_permissions() {
    // allow_spmd_sharding_propagation_to_parameters names the elements of
    // the one tuple parameter: element 0 keeps its sharding, element 1 takes
    // the propagated one.
    let module = propagate(
        "HloModule m, num_partitions=4, allow_spmd_sharding_propagation_to_parameters={false,true}

ENTRY %e (p: (f32[4], f32[4])) -> f32[4] {
  %p = (f32[4], f32[4]) parameter(0), sharding={{replicated}, {replicated}}
  %a = f32[4] get-tuple-element(%p), index=0
  %b = f32[4] get-tuple-element(%p), index=1
  ROOT %s = f32[4] add(%a, %b), sharding={devices=[4]<=[4]}
}",
    );
    check(&module, "p", Some("{{replicated}, {devices=[4]<=[4]}}"));
}

#[test]
fn outfeed_shardings_cover_its_operands() {
    // An outfeed's sharding is that of (data, token); its data operand takes
    // element 0.
    let module = propagate(&format!(
        "{HEADER}ENTRY %e (p: f32[8,4]) -> token[] {{
  %p = f32[8,4] parameter(0)
  %c = f32[8,4] copy(%p)
  %t = (f32[8,4]) tuple(%c)
  %a = token[] after-all()
  ROOT %o = token[] outfeed(%t, %a), outfeed_shape=(f32[8,4]), sharding={{{{devices=[8,1]<=[8]}}, {{maximal device=0}}}}
}}"
    ));
    check(&module, "c", Some("{devices=[8,1]<=[8]}"));
}

#[test]
fn async_ops_on_other_threads_turn_manual_whole() {
    // Propagating only the main thread, an async call on another thread is
    // not looked into: a manual operand makes the whole async op manual.
    let text = "HloModule m, num_partitions=4

%callee (x: s32[8]) -> s32[8] {
  %x = s32[8] parameter(0)
  ROOT %n = s32[8] negate(%x)
}, execution_thread=\"side\"

ENTRY %e (p: s32[8]) -> s32[8] {
  %p = s32[8] parameter(0), sharding={manual}
  %s = ((s32[8]), s32[8], u32[]) call-start(%p), async_execution_thread=\"side\", to_apply=%callee
  %d = s32[8] call-done(%s)
  ROOT %r = s32[8] copy(%d)
}";
    let mut module = xla_hlo_parser::parse_module(text).unwrap();
    let options = ShardingPropagationOptions {
        execution_threads: Some(vec!["main".into()]),
        ..Default::default()
    };
    ShardingPropagation::new(options).run(&mut module).unwrap();
    check(&module, "s", Some("{{manual}, {manual}, {manual}}"));
    check(&module, "d", Some("{manual}"));
    check(&module, "n", None);
}

#[test]
fn cse_prevention_shardings_are_decided_again() {
    // A sharding whose only metadata marks it as added for CSE prevention
    // is dropped and propagated afresh (here from the root's user sharding).
    let module = propagate(
        "HloModule m, num_partitions=4

ENTRY %e (p: f32[]) -> f32[4] {
  %p = f32[] parameter(0), sharding={replicated}
  %b = f32[4] broadcast(%p), dimensions={}, sharding={devices=[4]0,1,2,3 metadata={op_name=\"_sharding_propagation_cse_prevention\"}}
  %a = f32[4] add(%b, %b)
  ROOT %c = f32[4] copy(%a), sharding={devices=[4]3,2,1,0}
}",
    );
    check(&module, "b", Some("{devices=[4]3,2,1,0}"));
    check(&module, "a", Some("{devices=[4]3,2,1,0}"));
}

/// A bitcast-convert between element widths adds (or drops) a minor
/// dimension, so it is not elementwise: no sharding crosses it either way,
/// and an output that may be sharded keeps a sharding of its own rank.
#[test]
fn width_changing_bitcast_convert_has_no_rule() {
    let module = propagate(
        "HloModule m, num_partitions=8, allow_spmd_sharding_propagation_to_output={true,true}

ENTRY %e (p: f32[8,6], q: u8[8,6,4]) -> (u8[8,6,4], f32[8,6]) {
  %p = f32[8,6] parameter(0), sharding={devices=[8,1]<=[8]}
  %q = u8[8,6,4] parameter(1), sharding={devices=[8,1,1]<=[8]}
  %wide = u8[8,6,4] bitcast-convert(%p)
  %narrow = f32[8,6] bitcast-convert(%q)
  ROOT %t = (u8[8,6,4], f32[8,6]) tuple(%wide, %narrow)
}",
    );
    check(&module, "wide", None);
    check(&module, "narrow", None);
    // Every sharding fits its shape (the verifier checks tile ranks).
    if let Err(errors) = xla_hlo_verifier::verify(&module) {
        panic!("{errors:?}");
    }
}
