//! Shape checks: every declared shape against what its operands and
//! attributes imply.
//!
//! Where XLA can infer the shape, the declared shape must be compatible
//! (same element types and dimensions, layouts and dynamic flags ignored)
//! with `shape_inference`'s; an `Invalid` inference (operands that admit no
//! shape) is itself reported; a `NotInferable` one lists the instruction as
//! unchecked, with inference's reason. `dot` and
//! `convolution` take their element type from the declared shape
//! (`preferred_element_type`). Ops XLA cannot infer get dedicated rules, as in
//! XLA's `ShapeVerifier`:
//! - `broadcast`: operand rank = `dimensions` length, each operand dimension
//!   maps in range to an output dimension of the same size, same element type;
//! - `reshape`: same element type and element count;
//! - `convert`: same dimensions; `bitcast-convert`: dimensions adjusted by the
//!   bit-width ratio; `stochastic-convert`: same dimensions;
//! - `iota`: an array whose `iota_dimension` is in range;
//! - `constant`: the literal's shape;
//! - sugared async starts: `((operands), wrapped result, context...)`; native
//!   `all-gather-start`/`collective-permute-start`: element 1 is the result.
//!
//! Parameters, fusions and `async-start`s with `calls=` are checked elsewhere
//! (computation signatures, the entry layout). Ops XLA takes at their word
//! (`bitcast`, `custom-call`, `rng`, `infeed`, `send`/`recv`, ...) are listed
//! as unchecked, as are native starts whose shape is not a tuple and
//! gather-like starts with empty replica groups.
//!
//! Collectives whose replica groups are empty take their group size from the
//! run's configuration, which a module file need not state (a bare
//! computation dumped for a 1x8 run is valid HLO); for them only the ratio
//! between operand and result dimensions is checked.
//!
//! Invariant: runs only on instructions whose operands, form and callees are
//! sound; never panics.

use crate::{compatible, show, At, Report};
use xla_hlo_ir::shape_inference::{infer_shape_as, written_group_size, InferError};
use xla_hlo_ir::{AttrKey, Literal, Opcode, Shape};

pub(crate) fn check(at: &At, r: &mut Report) {
    let instr = at.instr();
    let ops = at.operand_shapes();
    let declared = &instr.shape;
    if let (Opcode::AsyncStart, Some(w)) = (instr.opcode, instr.async_wrapped) {
        return async_sugar(at, r, w, &ops);
    }
    match instr.opcode {
        // Checked with the computation signatures and the entry layout.
        Opcode::Parameter | Opcode::Fusion | Opcode::AsyncStart => {}
        Opcode::CustomCall => {
            operand_layout_constraints(at, r, &ops);
            at.unchecked(r, NO_RULE);
        }
        Opcode::Infeed => {
            if !matches!(declared, Shape::Tuple(elements) if !elements.is_empty()) {
                at.err(
                    r,
                    format!(
                        "infeed must have a non-empty tuple shape (data, token), got {}",
                        show(declared)
                    ),
                );
            }
            at.unchecked(r, NO_RULE);
        }
        Opcode::Bitcast
        | Opcode::Rng
        | Opcode::RngBitGenerator
        | Opcode::RngGetAndUpdateState
        | Opcode::Recv
        | Opcode::RecvDone
        | Opcode::Send
        | Opcode::SendDone
        | Opcode::DynamicReshape => at.unchecked(r, NO_RULE),
        Opcode::Constant => {
            if let Some(lit) = &instr.literal {
                let ls = literal_shape(lit);
                if !compatible(declared, &ls) {
                    at.err(
                        r,
                        format!(
                            "shape {} does not match its literal's shape {}",
                            show(declared),
                            show(&ls)
                        ),
                    );
                }
            }
        }
        Opcode::Broadcast => broadcast(at, r, &ops),
        Opcode::Reshape => {
            let (Some(o), Some(d)) = (
                array(at, r, ops.first(), "operand"),
                array(at, r, Some(&declared), "result"),
            ) else {
                return;
            };
            if o.element_type != d.element_type {
                at.err(
                    r,
                    format!(
                        "reshape changes the element type from {} to {}",
                        o.element_type, d.element_type
                    ),
                );
            }
            let count = |dims: &[i64]| dims.iter().map(|&x| x.max(0) as i128).product::<i128>();
            if count(&o.dims) != count(&d.dims) {
                at.err(
                    r,
                    format!(
                        "reshape from {} to {} changes the number of elements",
                        show(ops[0]),
                        show(declared)
                    ),
                );
            }
        }
        Opcode::Convert | Opcode::StochasticConvert => {
            let (Some(o), Some(d)) = (
                array(at, r, ops.first(), "operand"),
                array(at, r, Some(&declared), "result"),
            ) else {
                return;
            };
            if o.dims != d.dims {
                at.err(
                    r,
                    format!(
                        "{} must keep the dimensions: operand {} but shape {}",
                        instr.opcode,
                        show(ops[0]),
                        show(declared)
                    ),
                );
            }
            if instr.opcode == Opcode::StochasticConvert {
                if let Some(bits) = ops.get(1).and_then(|s| s.as_array()) {
                    if bits.dims != o.dims {
                        at.err(
                            r,
                            "stochastic-convert's random bits must have the operand's dimensions",
                        );
                    }
                }
            }
        }
        Opcode::BitcastConvert => bitcast_convert(at, r, &ops),
        Opcode::Iota => {
            let Some(d) = array(at, r, Some(&declared), "result") else {
                return;
            };
            let dim = instr.int_attr(AttrKey::IotaDimension).unwrap_or(0);
            if dim < 0 || dim as usize >= d.rank() {
                at.err(
                    r,
                    format!(
                        "iota_dimension {dim} is out of range for {}",
                        show(declared)
                    ),
                );
            }
        }
        Opcode::AllGather | Opcode::ReduceScatter if empty_groups(at) => {
            lenient_gather_scatter(at, r, &ops)
        }
        Opcode::AllGatherStart | Opcode::CollectivePermuteStart => {
            let sync = instr.opcode.sync_collective().unwrap_or(instr.opcode);
            match declared {
                Shape::Tuple(e) if e.len() >= 2 => {
                    if sync == Opcode::AllGather && empty_groups(at) {
                        at.unchecked(r, EMPTY_GROUPS);
                    } else {
                        compare(at, r, &e[1], sync, &ops, "result (shape element 1)");
                    }
                }
                _ => at.unchecked(r, NOT_A_START_TUPLE),
            }
        }
        Opcode::AllToAll if empty_groups(at) => {
            // Group size unknown: infer without the module's counts.
            match infer_shape_as(
                instr.opcode,
                None,
                &at.module.computations,
                instr,
                &ops,
                None,
            ) {
                Ok(s) => mismatch(at, r, declared, &s, "shape"),
                Err(InferError::Invalid(m)) => at.err(r, m),
                Err(InferError::NotInferable(m)) => at.unchecked(r, m),
            }
        }
        op => compare(at, r, declared, op, &ops, "shape"),
    }
}

/// Why an op XLA takes at its word is unchecked.
const NO_RULE: &str = "XLA takes the written shape and has no rule to check it";
/// Why a gather-like async start with empty replica groups is unchecked.
const EMPTY_GROUPS: &str =
    "the result depends on the group size, which empty replica groups leave to the run";
/// Why a native start whose shape is not a tuple is unchecked.
const NOT_A_START_TUPLE: &str = "the shape is not an (operands, result, ...) tuple";

fn empty_groups(at: &At) -> bool {
    matches!(written_group_size(at.instr().replica_groups()), Ok(None))
}

/// Compares `declared` with the shape inferred for `op`.
fn compare(at: &At, r: &mut Report, declared: &Shape, op: Opcode, ops: &[&Shape], what: &str) {
    let instr = at.instr();
    let preferred = match op {
        Opcode::Dot | Opcode::Convolution => declared.element_type(),
        _ => None,
    };
    match infer_shape_as(
        op,
        Some(at.module),
        &at.module.computations,
        instr,
        ops,
        preferred,
    ) {
        Ok(s) => mismatch(at, r, declared, &s, what),
        Err(InferError::Invalid(m)) => at.err(r, m),
        Err(InferError::NotInferable(m)) => at.unchecked(r, m),
    }
}

fn mismatch(at: &At, r: &mut Report, declared: &Shape, inferred: &Shape, what: &str) {
    if !compatible(declared, inferred) {
        at.err(
            r,
            format!(
                "{what} {} does not match the shape inferred from the operands, {}",
                show(declared),
                show(inferred)
            ),
        );
    }
}

fn array<'a>(
    at: &At,
    r: &mut Report,
    s: Option<&&'a Shape>,
    what: &str,
) -> Option<&'a xla_hlo_ir::ArrayShape> {
    let s = *s?;
    match s {
        Shape::Array(a) if a.element_type.is_array_type() => Some(a),
        other => {
            at.err(
                r,
                format!(
                    "{} {what} must be an array, got {}",
                    at.instr().opcode,
                    show(other)
                ),
            );
            None
        }
    }
}

fn literal_shape(l: &Literal) -> Shape {
    match l {
        Literal::Array(a) => Shape::Array(a.shape.clone()),
        Literal::Tuple(e) => Shape::Tuple(e.iter().map(literal_shape).collect()),
    }
}

fn broadcast(at: &At, r: &mut Report, ops: &[&Shape]) {
    let instr = at.instr();
    let declared = &instr.shape;
    let (Some(o), Some(d)) = (
        array(at, r, ops.first(), "operand"),
        array(at, r, Some(&declared), "result"),
    ) else {
        return;
    };
    if o.element_type != d.element_type {
        at.err(
            r,
            format!(
                "broadcast changes the element type from {} to {}",
                o.element_type, d.element_type
            ),
        );
    }
    let dims = instr.dimensions();
    if dims.len() != o.rank() {
        at.err(
            r,
            format!(
                "broadcast dimensions {dims:?} must have one entry per operand dimension ({})",
                o.rank()
            ),
        );
        return;
    }
    for (i, &od) in dims.iter().enumerate() {
        if dims[..i].contains(&od) {
            at.err(r, format!("broadcast dimensions {dims:?} repeat {od}"));
            continue;
        }
        match usize::try_from(od).ok().and_then(|u| d.dims.get(u)) {
            None => at.err(
                r,
                format!(
                    "broadcast dimension {od} is out of range for {}",
                    show(declared)
                ),
            ),
            Some(&size) if size != o.dims[i] => at.err(
                r,
                format!(
                    "broadcast maps operand dimension {i} (size {}) to output dimension {od} of size {size}",
                    o.dims[i]
                ),
            ),
            Some(_) => {}
        }
    }
}

fn bitcast_convert(at: &At, r: &mut Report, ops: &[&Shape]) {
    let declared = &at.instr().shape;
    let (Some(o), Some(d)) = (
        array(at, r, ops.first(), "operand"),
        array(at, r, Some(&declared), "result"),
    ) else {
        return;
    };
    let (ib, ob) = (o.element_type.bit_width(), d.element_type.bit_width());
    let ok = if ib == ob {
        o.dims == d.dims
    } else if ib > ob && ob > 0 && ib % ob == 0 {
        // Wider to narrower: a new minor dimension of the ratio.
        d.dims.len() == o.dims.len() + 1
            && d.dims[..o.dims.len()] == o.dims[..]
            && d.dims.last() == Some(&((ib / ob) as i64))
    } else if ob > ib && ib > 0 && ob % ib == 0 {
        o.dims.len() == d.dims.len() + 1
            && o.dims[..d.dims.len()] == d.dims[..]
            && o.dims.last() == Some(&((ob / ib) as i64))
    } else {
        false
    };
    if !ok {
        at.err(
            r,
            format!(
                "bitcast-convert from {} to {} does not preserve the bits of each element",
                show(ops[0]),
                show(declared)
            ),
        );
    }
}

/// All-gather / reduce-scatter with empty replica groups: only the ratio.
fn lenient_gather_scatter(at: &At, r: &mut Report, ops: &[&Shape]) {
    let instr = at.instr();
    let declared = &instr.shape;
    let results: Vec<&Shape> = match declared {
        Shape::Tuple(e) if ops.len() != 1 => e.iter().collect(),
        s => vec![s],
    };
    if results.len() != ops.len() {
        at.err(
            r,
            format!(
                "{} has {} operands but its shape {} has {} results",
                instr.opcode,
                ops.len(),
                show(declared),
                results.len()
            ),
        );
        return;
    }
    let dims = instr.dimensions();
    let Some(&dim) = dims.first().filter(|_| dims.len() == 1) else {
        at.err(r, format!("{} needs exactly one dimension", instr.opcode));
        return;
    };
    for (i, (o, d)) in ops.iter().zip(&results).enumerate() {
        let (Some(o), Some(d)) = (o.as_array(), d.as_array()) else {
            at.err(
                r,
                format!("{} operand {i} and its result must be arrays", instr.opcode),
            );
            continue;
        };
        let Some(k) = usize::try_from(dim).ok().filter(|&k| k < o.rank()) else {
            at.err(
                r,
                format!("{} dimension {dim} is out of range", instr.opcode),
            );
            return;
        };
        let same_elsewhere = o.rank() == d.rank()
            && o.dims
                .iter()
                .zip(&d.dims)
                .enumerate()
                .all(|(j, (a, b))| j == k || a == b);
        let (small, big) = if instr.opcode == Opcode::AllGather {
            (o.dims[k], d.dims.get(k).copied().unwrap_or(-1))
        } else {
            (d.dims.get(k).copied().unwrap_or(-1), o.dims[k])
        };
        let ratio_ok = if small == 0 {
            big == 0
        } else {
            small > 0 && big >= small && big % small == 0
        };
        if o.element_type != d.element_type || !same_elsewhere || !ratio_ok {
            at.err(
                r,
                format!(
                    "{} result {} is not operand {} scaled along dimension {dim} by a group size",
                    instr.opcode,
                    show(results[i]),
                    show(ops[i])
                ),
            );
        }
    }
}

/// Sugared async start: `((operands), wrapped result, context...)`.
fn async_sugar(at: &At, r: &mut Report, wrapped: Opcode, ops: &[&Shape]) {
    let declared = &at.instr().shape;
    let Shape::Tuple(e) = declared else {
        at.err(
            r,
            format!(
                "{}-start shape must be ((operands), result, context...), got {}",
                wrapped,
                show(declared)
            ),
        );
        return;
    };
    if e.len() < 2 {
        at.err(
            r,
            format!(
                "{}-start shape must be ((operands), result, context...), got {}",
                wrapped,
                show(declared)
            ),
        );
        return;
    }
    let operands = Shape::Tuple(ops.iter().map(|s| (*s).clone()).collect());
    if !compatible(&e[0], &operands) {
        at.err(
            r,
            format!(
                "{}-start shape element 0 is {} but the operands are {}",
                wrapped,
                show(&e[0]),
                show(&operands)
            ),
        );
    }
    let gather_like = matches!(wrapped, Opcode::AllGather | Opcode::ReduceScatter);
    if gather_like && empty_groups(at) {
        at.unchecked(r, EMPTY_GROUPS);
    } else {
        compare(at, r, &e[1], wrapped, ops, "result (shape element 1)");
    }
}

/// A custom-call's `operand_layout_constraints`: one shape per operand, each
/// compatible with the operand's (dimensions and element type; the layout is
/// what the constraint sets).
fn operand_layout_constraints(at: &At, r: &mut Report, ops: &[&Shape]) {
    let Some(xla_hlo_ir::AttrValue::Shapes(constraints)) =
        at.instr().attr(AttrKey::OperandLayoutConstraints)
    else {
        return;
    };
    if constraints.len() != ops.len() {
        at.err(
            r,
            format!(
                "operand_layout_constraints gives {} shapes for {} operands",
                constraints.len(),
                ops.len()
            ),
        );
        return;
    }
    for (i, (constraint, operand)) in constraints.iter().zip(ops).enumerate() {
        if !compatible(constraint, operand) {
            at.err(
                r,
                format!(
                    "operand_layout_constraints shape {} for operand {i} is not compatible with the operand's shape {}",
                    show(constraint),
                    show(operand)
                ),
            );
        }
    }
}
