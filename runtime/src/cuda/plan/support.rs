//! Which instructions the CUDA backend runs: element types, opcodes, the
//! sharding-annotation custom-call, and `check_supported`, which names
//! every unsupported entry instruction at once.
//!
//! Invariant: `plan_module` plans every entry instruction these checks
//! accept, or fails naming it (some attribute combinations, such as
//! TOTALORDER compares or integer dots, are rejected only there).

use xla_hlo_ir::{AttrKey, HloModule, Opcode, PrimitiveType};

/// Element types the CUDA backend handles (storage and arithmetic).
pub fn supported_type(ty: PrimitiveType) -> bool {
    use PrimitiveType as T;
    matches!(
        ty,
        T::Pred | T::S32 | T::S64 | T::U8 | T::U32 | T::F32 | T::F64 | T::Bf16
    )
}

/// Opcodes the CUDA backend plans (everything else is a compile error).
pub fn supported_opcode(op: Opcode) -> bool {
    use Opcode as O;
    matches!(
        op,
        O::Parameter
            | O::Constant
            | O::Tuple
            | O::GetTupleElement
            | O::Add
            | O::Subtract
            | O::Multiply
            | O::Divide
            | O::Maximum
            | O::Minimum
            | O::Negate
            | O::Exp
            | O::Log
            | O::Tanh
            | O::Rsqrt
            | O::Sqrt
            | O::Abs
            | O::Select
            | O::Compare
            | O::Convert
            | O::Copy
            | O::Broadcast
            | O::Reshape
            | O::Transpose
            | O::Slice
            | O::Iota
            | O::Reduce
            | O::Dot
            | O::Sin
            | O::Cos
            | O::Floor
            | O::Ceil
            | O::Sign
            | O::Log1p
            | O::Expm1
            | O::Not
            | O::IsFinite
            | O::Power
            | O::Remainder
            | O::And
            | O::Or
            | O::Xor
            | O::Clamp
            | O::Concatenate
            | O::Pad
            | O::Reverse
            | O::DynamicSlice
            | O::DynamicUpdateSlice
    )
}

/// `custom-call(x), custom_call_target="Sharding"` (a sharding annotation:
/// the identity on one device).
pub fn is_sharding_annotation(ins: &xla_hlo_ir::HloInstruction) -> bool {
    ins.opcode == Opcode::CustomCall
        && ins.operands.len() == 1
        && ins.ident_attr(AttrKey::CustomCallTarget) == Some("Sharding")
}

/// Whether the backend runs this instruction (its opcode, or a supported
/// custom-call).
pub fn supported_instruction(ins: &xla_hlo_ir::HloInstruction) -> bool {
    supported_opcode(ins.opcode) || is_sharding_annotation(ins)
}

/// Lists every entry instruction the backend cannot run (opcode or element
/// type), grouped by opcode with instruction names. `Ok` when all can.
pub fn check_supported(module: &HloModule) -> Result<(), String> {
    let comp = module.entry_computation();
    let mut by_op: Vec<(String, Vec<String>)> = Vec::new();
    let mut push = |key: String, name: &str| match by_op.iter_mut().find(|(k, _)| *k == key) {
        Some((_, v)) => v.push(name.to_string()),
        None => by_op.push((key, vec![name.to_string()])),
    };
    for ins in &comp.instructions {
        if !supported_instruction(ins) {
            push(ins.opcode.name().to_string(), &ins.name);
            continue;
        }
        for leaf in ins.shape.leaves() {
            if let Some(t) = leaf.element_type() {
                if !supported_type(t) {
                    push(format!("element type {}", t.name()), &ins.name);
                }
            } else if leaf.is_token() {
                push("token".to_string(), &ins.name);
            }
        }
    }
    if by_op.is_empty() {
        return Ok(());
    }
    let parts: Vec<String> = by_op
        .iter()
        .map(|(k, v)| format!("{k} ({})", v.join(", ")))
        .collect();
    Err(format!(
        "not supported by the CUDA backend yet: {}",
        parts.join("; ")
    ))
}
