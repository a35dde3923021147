//! Shardy propagation (`sharding-propagation` on a module with `xla.sdy`
//! annotations) on small modules: what each test derives is what XLA's
//! `shardy-xla` derives for the same JAX program (checked against jax
//! 0.10.2 dumps in `testdata/shardy_cases`).

use xla_hlo_ir::HloModule;
use xla_hlo_pass::Pass;
use xla_hlo_utils::compare::equivalent;
use xla_sharding_propagation::ShardingPropagation;

const MESH_2X4: &str =
    r##"frontend_attributes={xla.sdy.meshes={mesh = #sdy.mesh<["a"=2, "b"=4]>}}"##;

fn propagate(body: &str, mesh: &str) -> HloModule {
    let text = format!("HloModule m, num_partitions=8, {mesh}\n\n{body}");
    let mut module = xla_hlo_parser::parse_module(&text).unwrap_or_else(|e| panic!("{e}"));
    assert!(ShardingPropagation::default().run(&mut module).unwrap());
    module
}

fn check(module: &HloModule, name: &str, want: Option<&str>) {
    let (comp, id) = module
        .find_instruction(name)
        .unwrap_or_else(|| panic!("no instruction {name}"));
    let instr = module.comp(comp).instr(id);
    match (want, &instr.sharding) {
        (None, None) => {}
        (Some(w), Some(g)) => assert!(
            equivalent(&xla_hlo_parser::parse_sharding(w).unwrap(), g, &instr.shape),
            "{name}: want {w}, got {g}"
        ),
        (w, g) => panic!("{name}: want {w:?}, got {g:?}"),
    }
}

/// A reshape splitting a dim sharded on ("a", "b") = 8 into 4 x 4 splits
/// axis "b" into sub-axes: dim 0 gets "a", "b":(1)2, dim 1 "b":(2)2.
#[test]
fn reshape_split_uses_sub_axes() {
    let m = propagate(
        r##"ENTRY %e (x: f32[16,8]) -> f32[4,4,8] {
  %x = f32[16,8]{1,0} parameter(0), frontend_attributes={xla.sdy.sharding="#sdy.sharding<@mesh, [{\"a\", \"b\"}, {}]>"}
  %r = f32[4,4,8]{2,1,0} reshape(%x)
  ROOT %t = f32[4,4,8]{2,1,0} tanh(%r)
}
"##,
        MESH_2X4,
    );
    check(&m, "r", Some("{devices=[4,2,1]<=[8]}"));
    check(&m, "t", Some("{devices=[4,2,1]<=[8]}"));
}

/// Operands that disagree on a dim leave the broadcast of a constant (only
/// ever a target) unsharded; the constraint's sharding lands on its operand.
#[test]
fn conflicting_operands_propagate_nothing() {
    let m = propagate(
        r##"ENTRY %e (x: f32[8,8]) -> f32[8,8] {
  %x = f32[8,8]{1,0} parameter(0), frontend_attributes={xla.sdy.sharding="#sdy.sharding<@mesh, [{\"a\"}, {\"b\"}]>"}
  %c = f32[] constant(1)
  %b = f32[8,8]{1,0} broadcast(%c), dimensions={}
  %add = f32[8,8]{1,0} add(%x, %b)
  ROOT %wsc = f32[8,8]{1,0} custom-call(%add), custom_call_target="Sharding", frontend_attributes={xla.sdy.sharding="#sdy.sharding_per_value<[<@mesh, [{\"b\"}, {\"a\"}]>]>"}
}
"##,
        MESH_2X4,
    );
    check(&m, "add", Some("{devices=[4,2]<=[2,4]T(1,0)}"));
    check(&m, "b", None);
    check(&m, "c", None);
}

/// A dot: the lhs batch-like dim and the rhs non-contracting dim reach the
/// result; the contracting dim does not, and an element-wise user follows.
#[test]
fn dot_propagates_non_contracting_factors() {
    let m = propagate(
        r##"ENTRY %e (x: f32[8,16], w: f32[16,4]) -> f32[8,4] {
  %x = f32[8,16]{1,0} parameter(0), frontend_attributes={xla.sdy.sharding="#sdy.sharding<@mesh, [{\"a\"}, {\"b\"}]>"}
  %w = f32[16,4]{1,0} parameter(1), frontend_attributes={xla.sdy.sharding="#sdy.sharding<@mesh, [{\"b\"}, {}]>"}
  %d = f32[8,4]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %t = f32[8,4]{1,0} tanh(%d)
}
"##,
        MESH_2X4,
    );
    check(
        &m,
        "d",
        Some("{devices=[2,1,4]<=[8] last_tile_dim_replicate}"),
    );
    check(
        &m,
        "t",
        Some("{devices=[2,1,4]<=[8] last_tile_dim_replicate}"),
    );
}

/// shard_alike: the members of a sharding group end with one sharding.
#[test]
fn sharding_group_members_share_a_sharding() {
    let m = propagate(
        r##"ENTRY %e (x: f32[8,8], y: f32[8,8]) -> f32[8,8] {
  %x = f32[8,8]{1,0} parameter(0), frontend_attributes={xla.sdy.sharding="#sdy.sharding<@mesh, [{\"a\"}, {}]>"}
  %y = f32[8,8]{1,0} parameter(1)
  %tx = f32[8,8]{1,0} tanh(%x)
  %ty = f32[8,8]{1,0} tanh(%y)
  %g0 = () custom-call(%tx), custom_call_target="xla.sdy.ShardingGroup", custom_call_has_side_effect=true, frontend_attributes={xla.sdy.sharding_group_id="0 : i64"}
  %g1 = () custom-call(%ty), custom_call_target="xla.sdy.ShardingGroup", custom_call_has_side_effect=true, frontend_attributes={xla.sdy.sharding_group_id="0 : i64"}
  ROOT %s = f32[8,8]{1,0} add(%tx, %ty)
}
"##,
        MESH_2X4,
    );
    check(
        &m,
        "tx",
        Some("{devices=[2,1,4]<=[8] last_tile_dim_replicate}"),
    );
    check(
        &m,
        "ty",
        Some("{devices=[2,1,4]<=[8] last_tile_dim_replicate}"),
    );
    check(
        &m,
        "y",
        Some("{devices=[2,1,4]<=[8] last_tile_dim_replicate}"),
    );
}

/// A reshape merging two dims of which only the minor is sharded ("b" on
/// the 8 of 4 x 8) cannot shard the merged dim: its axes would have to fill
/// the unsharded major factor first. Only "a" on dim 0 goes through.
#[test]
fn reshape_merge_with_only_the_minor_sharded_leaves_it_replicated() {
    let m = propagate(
        r##"ENTRY %e (x: f32[4,4,8]) -> f32[4,32] {
  %x = f32[4,4,8]{2,1,0} parameter(0), frontend_attributes={xla.sdy.sharding="#sdy.sharding<@mesh, [{\"a\"}, {}, {\"b\"}]>"}
  %r = f32[4,32]{1,0} reshape(%x)
  ROOT %t = f32[4,32]{1,0} tanh(%r)
}
"##,
        MESH_2X4,
    );
    check(
        &m,
        "r",
        Some("{devices=[2,1,4]<=[8] last_tile_dim_replicate}"),
    );
    check(
        &m,
        "t",
        Some("{devices=[2,1,4]<=[8] last_tile_dim_replicate}"),
    );
}
