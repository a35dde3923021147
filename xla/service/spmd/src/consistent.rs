//! Consistent mode (`SpmdOptions::consistent`): the partitioned program,
//! run in consistent mode, gives the bits the single-device interpreter
//! gives in consistent mode (`xla_hlo_utils::reduction_order`).
//!
//! Only reductions can tell the two apart. A reduction split across devices
//! (reduce, dot, convolution: local partial results, then an all-reduce or
//! a reduce-scatter, which combine in group order by the same tree) stays
//! split only when the split is exact:
//! - the reduction is order-insensitive (integers, pred, maximum, minimum,
//!   and, or), or
//! - each device's part is a subtree of the reduction order
//!   (`tiles_are_subtrees` over the reduced dims in the order's order, the
//!   collective's groups listing devices in that tile order), and the
//!   partial results keep the accumulation type (f32, f64, complex; a dot
//!   or convolution rounding partial sums to bf16 or f16 would not).
//!
//! Otherwise the handler takes an exact layout instead: the reduced dims
//! replicated first (their data gathered), every device reducing them
//! whole, or, for a reduce, the split moved onto the major reduced dim (an
//! all-to-all of the operand) where that split is exact; the cheaper wins.
//! Instructions whose default layout was ruled out this way are counted as
//! `<opcode>:consistent-relayout` in the summary's handler counts and
//! logged (`RUST_LOG=info`). A dot with a bf16 or f16 result may instead
//! keep its split with f32 partial results, all-reduced in f32 and rounded
//! once (`dot:consistent-f32-partial-sums`), where that costs less. Partial sums of unreduced shardings and
//! scatters summed across devices are not used for order-sensitive types.

use xla_hlo_ir::{CompId, HloModule, Opcode, PrimitiveType};
use xla_hlo_utils::reduction_order::tiles_are_subtrees;

/// The handler note of an instruction whose default layout consistent mode
/// ruled out.
pub const RELAYOUT_NOTE: &str = "consistent-relayout";

/// The handler note of a dot with a narrow float result whose split
/// contraction keeps f32 partial sums (all-reduced in f32, rounded once).
pub const F32_PARTIAL_SUMS_NOTE: &str = "consistent-f32-partial-sums";

/// Whether sums of this type depend on their order.
pub fn order_sensitive(ty: PrimitiveType) -> bool {
    ty.is_float() || ty.is_complex()
}

/// Whether partial dot or convolution results of this type hold the
/// accumulation type exactly (a narrower float rounds them).
pub fn holds_accumulation(ty: PrimitiveType) -> bool {
    !ty.is_float() || matches!(ty, PrimitiveType::F32 | PrimitiveType::F64)
}

/// Whether reducing with computation `comp` over elements of type `ty` in
/// any grouping gives the same bits (max, min, and, or; integer and pred
/// arithmetic).
pub fn reducer_is_order_free(module: &HloModule, comp: Option<CompId>, ty: PrimitiveType) -> bool {
    match binary_reducer(module, comp) {
        Some(Opcode::Maximum | Opcode::Minimum | Opcode::And | Opcode::Or) => true,
        Some(Opcode::Add | Opcode::Multiply | Opcode::Xor) => !order_sensitive(ty),
        _ => false,
    }
}

/// The opcode of a reducer computation `comp` whose root applies it to its
/// two parameters (`add(x, y)`), if it is one.
pub fn binary_reducer(module: &HloModule, comp: Option<CompId>) -> Option<Opcode> {
    let c = comp.and_then(|c| module.computations.get(c.index()))?;
    let root = c.instructions.get(c.root.index())?;
    let binary_of_params = c.parameters.len() == 2
        && root.operands.len() == 2
        && root.operands[0] != root.operands[1]
        && root
            .operands
            .iter()
            .all(|&o| c.instr(o).opcode == Opcode::Parameter);
    binary_of_params.then_some(root.opcode)
}

/// Whether splitting reduced dims of `sizes` (in the reduction order's
/// order) into `tiles` reproduces the single-device order.
pub fn split_is_exact(sizes: &[i64], tiles: &[i64]) -> bool {
    tiles_are_subtrees(sizes, tiles)
}
