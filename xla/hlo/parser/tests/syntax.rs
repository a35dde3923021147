//! Syntax coverage: every form the HLO grammar allows (shapes, layouts,
//! literals, shardings, replica groups, attributes, async sugar, header
//! attributes) parses to the expected values and round-trips; malformed
//! input gives errors with the right line:column.

use xla_hlo_ir::attrs::{AttrKey, AttrValue};
use xla_hlo_ir::sharding::{HloSharding, ShardGroup, ShardingKind, SubgroupType, TileAssignment};
use xla_hlo_ir::{CollectiveDeviceList, HloModule, Literal, Opcode, PrimitiveType, Shape};
use xla_hlo_parser::{parse_module, parse_replica_groups, parse_shape, parse_sharding};

/// Parses, checks that print/parse gives an equal module and a fixed point, returns the module.
fn round_trip(text: &str) -> HloModule {
    let m = parse_module(text).unwrap_or_else(|e| panic!("parse failed: {e}\n{text}"));
    let printed = m.to_text();
    let again = parse_module(&printed).unwrap_or_else(|e| panic!("reparse failed: {e}\n{printed}"));
    assert_eq!(m, again, "parse(print(m)) != m:\n{printed}");
    assert_eq!(again.to_text(), printed);
    m
}

fn entry_root(m: &HloModule) -> &xla_hlo_ir::HloInstruction {
    m.entry_computation().root_instr()
}

#[test]
fn shapes_and_layouts() {
    for text in [
        "f32[2,4]{1,0}",
        "f32[8,4,1]{1,2,0:T(1,128)}",
        "f32[8,128]{1,0:T(8,128)(2,1)}",
        "u32[]{:S(2)}",
        "s4[4,16]{1,0:E(4)}",
        "s32[<=32,20]",
        "f32[?,784]",
        "(f32[], (f32[2,4]{1,0}))",
        "token[]",
        "()",
        "b(f32[4])",
        "f8e4m3fn[3]",
        "f4e2m1fn[2]{0}",
        "c128[1]",
    ] {
        let s = parse_shape(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(s.to_string(), text, "shape did not print back");
    }
    let s = parse_shape("s32[<=32,20]").unwrap();
    assert!(s.as_array().unwrap().is_dynamic_dim(0));
    assert!(!s.as_array().unwrap().is_dynamic_dim(1));
}

#[test]
fn literals_of_every_kind() {
    let m = round_trip(
        r#"HloModule lits
ENTRY e {
  a = f32[5] constant({nan, 7, -nan, inf, -inf})
  b = c64[2] constant({(1, 2), (-inf, nan)})
  c = pred[2,3] constant({ { true, false, true }, { false, true, false } })
  d = s8[3] constant({-128, 0, 127})
  e = u64[1] constant({18446744073709551615})
  f = bf16[2] constant({1.5, -0.25})
  g = f32[2] constant({nan(0x1), 1e-05})
  h = (f32[], s32[2]) constant((1, {2, 3}))
  i = f8e4m3fn[2] constant({448, -0.5})
  j = f32[0] constant({})
  k = f16[] constant(65504)
  ROOT t = (f32[5], c64[2]) tuple(a, b)
}
"#,
    );
    let comp = m.entry_computation();
    let lit = |name: &str| {
        comp.instr(comp.find(name).unwrap())
            .literal
            .as_deref()
            .unwrap()
            .clone()
    };
    let Literal::Array(a) = lit("a") else {
        panic!()
    };
    assert!(
        a.get_f64(0).is_nan() && a.get_f64(3) == f64::INFINITY && a.get_f64(4) == f64::NEG_INFINITY
    );
    let Literal::Array(g) = lit("g") else {
        panic!()
    };
    assert_eq!(g.bits(0), 0x7f80_0001, "NaN payload is kept");
    let Literal::Array(e) = lit("e") else {
        panic!()
    };
    assert_eq!(e.get_i128(0), u64::MAX as i128);
    let Literal::Array(i) = lit("i") else {
        panic!()
    };
    assert_eq!(i.get_f64(0), 448.0);
    assert!(matches!(lit("h"), Literal::Tuple(ref v) if v.len() == 2));
}

#[test]
fn literal_out_of_range_is_an_error() {
    let err = parse_module("ENTRY e {\n  ROOT c = s8[] constant(300)\n}\n").unwrap_err();
    assert_eq!((err.line, err.column), (2, 26));
    assert!(err.message.contains("out of range"), "{err}");
}

#[test]
fn shardings_in_every_form() {
    for text in [
        "{replicated}",
        "{maximal device=1}",
        "{manual}",
        "{unknown shard_as 0}",
        "{unknown shard_like 1}",
        "{devices=[2,1]0,1}",
        "{devices=[2,2]<=[4]}",
        "{devices=[2,1,1,4]<=[4,2]T(1,0)}",
        "{devices=[2,2]0,1,2,3 last_tile_dim_replicate}",
        "{devices=[1,2,2]<=[4] last_tile_dims={manual}}",
        "{devices=[2,2,2,2]<=[16] last_tile_dims={manual, replicated}}",
        "{{manual}, {maximal device=0}, {replicated}}",
        "{}",
        "{replicated metadata={op_name=\"a\"}}",
        "{mesh['a'=2,'b'=4], [{'a'}, {'b':(2)2}]}",
        "{mesh['x'=2], [{}, {}], unreduced=max{'x'}}",
        "{mesh['a'=2,'b'=4], replicated}",
        "{mesh['a'=2,'b'=4], manual}",
        "{maximal_mesh[device_id=5]}",
        "{mesh['a'=2,'b'=4], [{'a'}?, {}]}",
    ] {
        let s = parse_sharding(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(s.to_string(), text, "sharding did not print back");
    }
    let s = parse_sharding("{devices=[2,1,4]<=[8] last_tile_dim_replicate}").unwrap();
    let HloSharding::Single(single) = s else {
        panic!()
    };
    let ShardingKind::Tiled {
        tile_assignment,
        replicate_on_last_tile_dim,
        ..
    } = single.kind
    else {
        panic!()
    };
    assert!(replicate_on_last_tile_dim);
    assert_eq!(tile_assignment.devices(), (0..8).collect::<Vec<_>>());
    let s = parse_sharding("{devices=[1,2,2]<=[4] last_tile_dims={manual} shard_as 3}").unwrap();
    let HloSharding::Single(single) = s else {
        panic!()
    };
    assert_eq!(single.shard_group, Some(ShardGroup::As(3)));
    assert!(
        matches!(single.kind, ShardingKind::Tiled { ref last_tile_dims, .. } if last_tile_dims == &[SubgroupType::Manual])
    );
    let t = TileAssignment::Iota {
        dims: vec![4, 2],
        reshape_dims: vec![2, 4],
        perm: vec![1, 0],
    };
    assert_eq!(t.devices(), vec![0, 4, 1, 5, 2, 6, 3, 7]);
}

#[test]
fn replica_groups_in_all_three_forms() {
    for (text, groups) in [
        ("{{0,1},{2,3}}", vec![vec![0, 1], vec![2, 3]]),
        ("[2,4]<=[8]", vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]]),
        ("[2,4]<=[4,2]T(1,0)", vec![vec![0, 2, 4, 6], vec![1, 3, 5, 7]]),
        ("mesh['axis_0'=2,'axis_1'=4] {'axis_1'}", vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]]),
        (
            "mesh['axis_0'=4,'axis_1'=2,'axis_2'=1,'axis_3'=1], device_ids=([2,4]T(1,0)) {'axis_0'}",
            vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]],
        ),
        ("mesh['x'=2,'y'=2, device_ids=(0,2,1,3)] {'x'}", vec![vec![0, 1], vec![2, 3]]),
    ] {
        let g = parse_replica_groups(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(g.to_string(), text);
        assert_eq!(g.groups().unwrap(), groups, "{text}");
    }
    assert!(
        matches!(parse_replica_groups("{}").unwrap(), CollectiveDeviceList::Explicit(v) if v.is_empty())
    );
}

#[test]
fn attributes_are_typed() {
    let m = round_trip(
        r#"HloModule attrs, is_scheduled=true, entry_computation_layout={(f32[4,6]{1,0}, f32[6,8]{1,0})->f32[4,8]{1,0}}, replica_count=2, num_partitions=4, input_output_alias={ {0}: (0, {}, may-alias) }, buffer_donor={ (1, {}) }, frontend_attributes={xla.sdy.meshes="x"}

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}

ENTRY %main (a: f32[4,6], b: f32[6,8]) -> f32[4,8] {
  %a = f32[4,6]{1,0} parameter(0), sharding={devices=[2,1,2]<=[4] last_tile_dim_replicate}
  %b = f32[6,8]{1,0} parameter(1)
  %dot = f32[4,8]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}, operand_precision={default,high}
  %ar = f32[4,8]{1,0} all-reduce(%dot), channel_id=1, replica_groups=[2,2]<=[4], use_global_device_ids=true, to_apply=%add
  %sl = f32[2,4]{1,0} slice(%ar), slice={[0:4:2], [0:4]}
  %pd = f32[4,9]{1,0} pad(%ar, %zero), padding=0_0_0x0_1
  %zero = f32[] constant(0)
  %rw = f32[4,8]{1,0} reduce-window(%ar, %zero), window={size=1x3 stride=1x1 pad=0_0x1_1}, to_apply=%add
  %cmp = pred[4,8]{1,0} compare(%ar, %ar), direction=LT, type=TOTALORDER
  %cc = f32[4,8]{1,0} custom-call(%ar), custom_call_target="Sharding", sharding={replicated}, backend_config="unspecified_dims=[1]"
  %rs-start = ((f32[4,8]{1,0}), f32[2,8]{1,0}) reduce-scatter-start(%ar), replica_groups={{0,1},{2,3}}, dimensions={0}, to_apply=%add
  %rs-done = f32[2,8]{1,0} reduce-scatter-done(%rs-start)
  ROOT %out = f32[4,8]{1,0} copy(%cc), control-predecessors={%rs-done}, metadata={op_name="x" source_line=3}, some_future_attr={a=1}
}
"#,
    );
    assert!(m.config.is_scheduled);
    assert_eq!(m.config.num_partitions, Some(4));
    let comp = m.entry_computation();
    let get = |n: &str| comp.instr(comp.find(n).unwrap());
    let dot = get("dot");
    assert_eq!(dot.dot_dimension_numbers().lhs_contracting, vec![1]);
    let ar = get("ar");
    assert_eq!(ar.channel_id(), Some(1));
    assert_eq!(ar.to_apply(), m.find_computation("add"));
    assert_eq!(get("sl").slice_dims().unwrap()[0].stride, 2);
    assert_eq!(get("pd").padding().unwrap()[1].high, 1);
    assert_eq!(get("rw").window().unwrap().dims[1].padding_low, 1);
    assert_eq!(get("cmp").ident_attr(AttrKey::Direction), Some("LT"));
    let rs = get("rs-start");
    assert_eq!(
        (rs.opcode, rs.async_wrapped),
        (Opcode::AsyncStart, Some(Opcode::ReduceScatter))
    );
    let out = get("out");
    assert_eq!(
        out.control_predecessors,
        vec![comp.find("rs-done").unwrap()]
    );
    assert!(out.attrs.iter().any(
        |a| matches!(&a.value, AttrValue::Unknown { name, .. } if name == "some_future_attr")
    ));
    // forward reference: %pd uses %zero before its definition
    assert_eq!(get("pd").operands[1], comp.find("zero").unwrap());
}

#[test]
fn convolution_and_control_flow() {
    round_trip(
        r#"HloModule cf
%cond (p: (s32[], f32[2])) -> pred[] {
  %p = (s32[], f32[2]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant(4)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}
%body (p: (s32[], f32[2])) -> (s32[], f32[2]) {
  %p = (s32[], f32[2]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %v = f32[2] get-tuple-element(%p), index=1
  %one = s32[] constant(1)
  %i2 = s32[] add(%i, %one)
  ROOT %t = (s32[], f32[2]) tuple(%i2, %v)
}
%neg (x: f32[2]) -> f32[2] {
  %x = f32[2] parameter(0)
  ROOT %n = f32[2] negate(%x)
}
ENTRY %e (img: f32[1,8,8,3], k: f32[3,3,3,4], w: (s32[], f32[2]), b: s32[]) -> f32[1,8,8,4] {
  %img = f32[1,8,8,3] parameter(0)
  %k = f32[3,3,3,4] parameter(1)
  %w = (s32[], f32[2]) parameter(2)
  %b = s32[] parameter(3)
  %loop = (s32[], f32[2]) while(%w), condition=%cond, body=%body
  %v = f32[2] get-tuple-element(%loop), index=1
  %c = f32[2] conditional(%b, %v, %v), branch_computations={%neg, %neg}
  ROOT %conv = f32[1,8,8,4] convolution(%img, %k), window={size=3x3 pad=1_1x1_1 rhs_reversal=0x1}, dim_labels=b01f_01io->b01f, feature_group_count=1
}
"#,
    );
}

#[test]
fn shapes_can_be_omitted_where_xla_infers_them() {
    let m =
        round_trip("HloModule s\nENTRY e {\n  a = f32[3] parameter(0)\n  ROOT b = add(a, a)\n}\n");
    assert_eq!(
        entry_root(&m).shape,
        Shape::array(PrimitiveType::F32, vec![3])
    );
}

#[test]
fn module_without_header_and_with_comments() {
    let m = round_trip(
        "// a comment\ne {\n  a = u4[1024,512]{1,0:E(4)} parameter(0) /* inline */\n  b = u4[1024,4096]{1,0:E(4)} all-gather(a), dimensions={1}\n}\n",
    );
    assert_eq!(m.name, "module");
    assert_eq!(entry_root(&m).opcode, Opcode::AllGather);
}

#[test]
fn errors_point_at_the_problem() {
    let cases: &[(&str, (usize, usize), &str)] = &[
        ("HloModule m\nENTRY e {\n  a = f32[2] parameter(0)\n  ROOT b = f32[2] frobnicate(a)\n}\n", (4, 19), "unknown opcode 'frobnicate'"),
        ("HloModule m\nENTRY e {\n  a = f32[2] parameter(0)\n  ROOT b = f32[2] add(a, c)\n}\n", (4, 26), "instruction 'c' is not defined"),
        ("HloModule m\nENTRY e {\n  a = f32[2 parameter(0)\n}\n", (3, 13), "expected ','"),
        ("HloModule m\nENTRY e {\n  a = f32[2] parameter(0), sharding={devices=[2]0,1 bogus}\n}\n", (3, 53), "unexpected 'bogus' in sharding"),
        ("HloModule m\nENTRY e {\n  a = f32[2] parameter(0)\n  b = f32[2] add(a, a), to_apply=%nowhere\n}\n", (4, 34), "computation 'nowhere' is not defined"),
        ("HloModule m\nENTRY e {\n  a = f32[2] parameter(0)\n", (4, 1), "closing the computation"),
        ("", (1, 1), "expected a computation"),
        ("HloModule m\nENTRY e {\n  a = f32[2] parameter(0), dimensions={1}, dimensions={1}\n}\n", (3, 44), "duplicate attribute"),
    ];
    for (text, (line, col), msg) in cases {
        let err = parse_module(text).expect_err(text);
        assert!(err.message.contains(msg), "expected '{msg}', got: {err}");
        assert_eq!((err.line, err.column), (*line, *col), "position of: {err}");
        // Display shows the line and a caret.
        assert!(err.to_string().contains('^'));
    }
}

#[test]
fn hostile_input_never_panics() {
    let seeds = [
        "HloModule m\nENTRY e {\n  a = f32[2] parameter(0)\n  ROOT b = f32[2] add(a, a), sharding={devices=[2,1]<=[2]T(1,0)}\n}\n",
        "ENTRY e { a = (((((f32[]))))) parameter(0) }",
        "ENTRY e { c = f32[99999999999,99999999999] constant({...}) }",
        "ENTRY e { c = f32[3] constant({1,2}) }",
        "ENTRY e { a = f32[] parameter(0), backend_config=\"unterminated }",
        "ENTRY e { a = f32[] parameter(0) /* unterminated",
        "HloModule m, entry_computation_layout={(f32[]->f32[]}",
    ];
    for seed in seeds {
        for cut in 0..seed.len() {
            if seed.is_char_boundary(cut) {
                let _ = parse_module(&seed[..cut]);
            }
        }
        let deep = "(".repeat(10_000) + "f32[]" + &")".repeat(10_000);
        assert!(parse_shape(&deep).is_err(), "nesting depth is bounded");
    }
}

#[test]
fn shapeless_calls_see_their_computations() {
    let m = round_trip(
        "HloModule c\n%neg (x: f32[2]) -> f32[2] {\n  %x = f32[2] parameter(0)\n  ROOT %n = f32[2] negate(%x)\n}\nENTRY %e {\n  %a = f32[2] parameter(0)\n  %c = call(%a), to_apply=%neg\n  ROOT %w = f32[2] copy(%c)\n}\n",
    );
    let comp = m.entry_computation();
    assert_eq!(
        comp.instr(comp.find("c").unwrap()).shape,
        Shape::array(PrimitiveType::F32, vec![2])
    );
}
