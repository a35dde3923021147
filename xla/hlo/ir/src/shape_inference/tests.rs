//! Unit tests of shape inference: one or two cases per op family, the
//! window arithmetic, and a sweep of every opcode over malformed operands
//! and attributes that must not panic.

use super::*;
use crate::attrs::{AttrValue, PaddingDim, SliceDim, WindowDim};
use crate::primitive_type::PrimitiveType::*;
use crate::replica_groups::CollectiveDeviceList;

fn instr(op: Opcode) -> HloInstruction {
    HloInstruction::new("x", op, Shape::tuple(vec![]), vec![])
}
fn f32s(dims: &[i64]) -> Shape {
    Shape::array(F32, dims.to_vec())
}
fn infer1(i: &HloInstruction, ops: &[&Shape]) -> Result<Shape, String> {
    infer_shape(None, &[], i, ops)
}

#[test]
fn elementwise() {
    let a = f32s(&[2, 3]);
    assert_eq!(infer1(&instr(Opcode::Add), &[&a, &a]).unwrap(), a);
    let c = infer1(&instr(Opcode::Compare), &[&a, &a]).unwrap();
    assert_eq!(c, Shape::array(Pred, vec![2, 3]));
    let b = f32s(&[3, 2]);
    assert!(infer1(&instr(Opcode::Add), &[&a, &b]).is_err());
    let z = infer1(&instr(Opcode::Complex), &[&a, &a]).unwrap();
    assert_eq!(z, Shape::array(C64, vec![2, 3]));
    assert_eq!(infer1(&instr(Opcode::Abs), &[&z]).unwrap(), a);
    assert_eq!(infer1(&instr(Opcode::Real), &[&z]).unwrap(), a);
    assert_eq!(
        infer1(&instr(Opcode::IsFinite), &[&a]).unwrap(),
        Shape::array(Pred, vec![2, 3])
    );
    assert!(infer1(&instr(Opcode::Convert), &[&a]).is_err());
    let p = Shape::array(Pred, vec![2, 3]);
    assert_eq!(infer1(&instr(Opcode::Select), &[&p, &a, &a]).unwrap(), a);
}

#[test]
fn dot_general() {
    let mut d = instr(Opcode::Dot);
    d.set_attr(AttrKey::LhsBatchDims, AttrValue::Ints(vec![0]));
    d.set_attr(AttrKey::RhsBatchDims, AttrValue::Ints(vec![0]));
    d.set_attr(AttrKey::LhsContractingDims, AttrValue::Ints(vec![2]));
    d.set_attr(AttrKey::RhsContractingDims, AttrValue::Ints(vec![1]));
    let l = Shape::array(Bf16, vec![4, 5, 6]);
    let r = Shape::array(Bf16, vec![4, 6, 7]);
    assert_eq!(
        infer1(&d, &[&l, &r]).unwrap(),
        Shape::array(Bf16, vec![4, 5, 7])
    );
    let s = infer_shape_detailed(None, &[], &d, &[&l, &r], Some(F32)).unwrap();
    assert_eq!(s, Shape::array(F32, vec![4, 5, 7]));
    let bad = Shape::array(Bf16, vec![4, 7, 7]);
    assert!(infer1(&d, &[&l, &bad]).is_err());
}

#[test]
fn slice_pad_concat() {
    let mut s = instr(Opcode::Slice);
    s.set_attr(
        AttrKey::Slice,
        AttrValue::Slice(vec![
            SliceDim {
                start: 0,
                limit: 3,
                stride: 1,
            },
            SliceDim {
                start: 1,
                limit: 8,
                stride: 2,
            },
        ]),
    );
    let a = f32s(&[4, 8]);
    assert_eq!(infer1(&s, &[&a]).unwrap(), f32s(&[3, 4]));
    let mut p = instr(Opcode::Pad);
    p.set_attr(
        AttrKey::Padding,
        AttrValue::Padding(vec![
            PaddingDim {
                low: 1,
                high: 2,
                interior: 0,
            },
            PaddingDim {
                low: 0,
                high: 0,
                interior: 1,
            },
        ]),
    );
    let z = f32s(&[]);
    assert_eq!(infer1(&p, &[&a, &z]).unwrap(), f32s(&[7, 15]));
    let mut c = instr(Opcode::Concatenate);
    c.set_attr(AttrKey::Dimensions, AttrValue::Ints(vec![1]));
    assert_eq!(infer1(&c, &[&a, &a]).unwrap(), f32s(&[4, 16]));
}

#[test]
fn windows() {
    let w = WindowDim {
        size: 3,
        stride: 2,
        padding_low: 1,
        padding_high: 1,
        ..WindowDim::default()
    };
    assert_eq!(window_output_size(8, &w).unwrap(), 4);
    let w = WindowDim {
        size: 64,
        padding_low: 63,
        ..WindowDim::default()
    };
    assert_eq!(window_output_size(64, &w).unwrap(), 64);
    let bad = WindowDim {
        size: 0,
        ..WindowDim::default()
    };
    assert!(window_output_size(8, &bad).is_err());
}

#[test]
fn broadcast_follows_xla_parser() {
    let mut b = instr(Opcode::Broadcast);
    b.set_attr(AttrKey::Dimensions, AttrValue::Ints(vec![2, 3]));
    assert_eq!(infer1(&b, &[&f32s(&[5])]).unwrap(), f32s(&[2, 3, 5]));
}

#[test]
fn all_gather_group_size() {
    let mut g = instr(Opcode::AllGather);
    g.set_attr(AttrKey::Dimensions, AttrValue::Ints(vec![1]));
    g.set_attr(
        AttrKey::ReplicaGroups,
        AttrValue::ReplicaGroups(Box::new(CollectiveDeviceList::Iota {
            num_groups: 2,
            group_size: 4,
            reshape_dims: vec![8],
            perm: vec![],
        })),
    );
    g.set_attr(AttrKey::ChannelId, AttrValue::Int(1));
    g.set_attr(AttrKey::UseGlobalDeviceIds, AttrValue::Bool(true));
    assert_eq!(infer1(&g, &[&f32s(&[2, 3])]).unwrap(), f32s(&[2, 12]));
}

#[test]
fn never_panics_on_garbage() {
    let a = f32s(&[2, 3]);
    let t = Shape::tuple(vec![a.clone()]);
    for &op in Opcode::ALL {
        let mut i = instr(op);
        i.set_attr(AttrKey::Dimensions, AttrValue::Ints(vec![7, -1]));
        i.set_attr(AttrKey::Index, AttrValue::Int(9));
        i.set_attr(AttrKey::ToApply, AttrValue::Computation(CompId(99)));
        i.set_attr(AttrKey::FftLength, AttrValue::Ints(vec![i64::MAX]));
        i.set_attr(AttrKey::FftType, AttrValue::Ident("IRFFT".into()));
        for ops in [
            vec![],
            vec![&a],
            vec![&a, &t],
            vec![&t, &t, &a],
            vec![&a, &a, &a, &a],
        ] {
            let _ = infer1(&i, &ops);
        }
    }
}
