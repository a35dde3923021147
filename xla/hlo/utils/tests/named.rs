//! Named (V3, Shardy-style) shardings as XLA prints them convert to the
//! same algebraic shardings as their V2 (iota) spellings, and equivalence
//! modulo representation holds across spellings.

use xla_hlo_ir::{PrimitiveType, Shape};
use xla_hlo_utils::compare::equivalent;
use xla_hlo_utils::{InstrSharding, NamedMesh, Sharding};

fn leaf(text: &str) -> Sharding {
    let s = xla_hlo_parser::parse_sharding(text).unwrap_or_else(|e| panic!("{text}: {e}"));
    match InstrSharding::from_ir(&s, &Shape::array(PrimitiveType::F32, vec![16, 16])).unwrap() {
        InstrSharding::Single(l) => l,
        t => panic!("tuple {t:?}"),
    }
}

#[test]
fn v3_matches_v2() {
    let cases = [
        (
            "{mesh['a'=2,'b'=4], [{'a'}, {'b'}]}",
            "{devices=[2,4]<=[8]}",
        ),
        (
            "{mesh['a'=2,'b'=4], [{'b'}, {'a'}]}",
            "{devices=[4,2]<=[2,4]T(1,0)}",
        ),
        (
            "{mesh['a'=2,'b'=4], [{'a'}, {}]}",
            "{devices=[2,1,4]<=[8] last_tile_dim_replicate}",
        ),
        (
            "{mesh['a'=2,'b'=4], [{}, {'b'}]}",
            "{devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}",
        ),
        (
            "{mesh['a'=2,'b'=4], [{'a', 'b'}, {}]}",
            "{devices=[8,1]<=[8]}",
        ),
        (
            "{mesh['a'=2,'b'=4], [{'b', 'a'}, {}]}",
            "{devices=[8,1]<=[2,4]T(1,0)}",
        ),
        (
            "{mesh['a'=2,'b'=4], [{'a'}, {'b':(2)2}]}",
            "{devices=[2,2,2]<=[2,2,2]T(0,2,1) last_tile_dim_replicate}",
        ),
        ("{mesh['a'=2,'b'=4], replicated}", "{replicated}"),
        ("{mesh['a'=2,'b'=4], manual}", "{manual}"),
    ];
    for (v3, v2) in cases {
        assert_eq!(leaf(v3), leaf(v2), "{v3} vs {v2}");
    }
}

#[test]
fn spellings_are_equivalent() {
    let shape = Shape::array(PrimitiveType::F32, vec![16, 16]);
    let pairs = [
        ("{devices=[2,4]<=[8]}", "{devices=[2,4]0,1,2,3,4,5,6,7}"),
        (
            "{devices=[2,1,4]<=[8] last_tile_dim_replicate}",
            "{devices=[2,1,4]3,2,1,0,7,6,5,4 last_tile_dim_replicate}",
        ),
        (
            "{devices=[1,1,8]<=[8] last_tile_dim_replicate}",
            "{replicated}",
        ),
        (
            "{devices=[2,4,1]<=[8] last_tile_dim_replicate}",
            "{devices=[2,4]<=[8]}",
        ),
    ];
    for (a, b) in pairs {
        let (x, y) = (
            xla_hlo_parser::parse_sharding(a).unwrap(),
            xla_hlo_parser::parse_sharding(b).unwrap(),
        );
        assert!(equivalent(&x, &y, &shape), "{a} vs {b}");
    }
    let x = xla_hlo_parser::parse_sharding("{devices=[2,4]<=[8]}").unwrap();
    let y = xla_hlo_parser::parse_sharding("{devices=[2,4]<=[4,2]T(1,0)}").unwrap();
    assert!(!equivalent(&x, &y, &shape));
    // Tuple vs single sharding on a tuple shape.
    let t = Shape::tuple(vec![shape.clone(), shape.clone()]);
    let single = xla_hlo_parser::parse_sharding("{devices=[8,1]<=[8]}").unwrap();
    let tuple =
        xla_hlo_parser::parse_sharding("{{devices=[8,1]<=[8]}, {devices=[8,1]<=[8]}}").unwrap();
    assert!(equivalent(&single, &tuple, &t));
}

#[test]
fn mesh_with_device_ids_round_trips() {
    let s = xla_hlo_parser::parse_sharding(
        "{mesh['x'=2,'y'=4], device_ids=([4,2]T(1,0)), [{'y'}, {'x'}]}",
    )
    .unwrap();
    let l = match InstrSharding::from_ir(&s, &Shape::array(PrimitiveType::F32, vec![16, 16]))
        .unwrap()
    {
        InstrSharding::Single(l) => l,
        t => panic!("{t:?}"),
    };
    let xla_hlo_ir::HloSharding::Single(single) = &s else {
        panic!()
    };
    let xla_hlo_ir::ShardingKind::Named(ns) = &single.kind else {
        panic!()
    };
    let mesh = NamedMesh::from_ir(&ns.mesh).unwrap();
    let spec = mesh.spec_of(&l, 2).unwrap();
    assert_eq!(mesh.sharding(&spec).unwrap(), l);
    assert_eq!(spec.dims[0][0].name, "y");
    assert_eq!(spec.dims[1][0].name, "x");
}
