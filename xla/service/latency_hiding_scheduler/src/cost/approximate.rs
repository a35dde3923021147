//! XLA's `ApproximateLatencyEstimator` in its own units ("cycles", one per
//! microsecond: `CyclesPerMicrosecond() == 1`).
//!
//! * Node cost: bookkeeping ops 0 (as `GpuLatencyEstimator`), loop and
//!   input fusions `kMediumCost = 1000`, output fusions and convolutions
//!   `kHighCost = 5000`, everything else `kLowCost = 1`. One deviation, for
//!   the unfused modules this project schedules: a bare `dot` (which XLA
//!   would have put in an output fusion or a cuBLAS call) costs
//!   `kHighCost` too.
//! * Latency of an async pair (any collective, copy or wrapped op):
//!   `kHighLatency = 5000`; a synchronous collective blocks for the same.
//!
//! The constants were "empirically derived to obtain an overlap of one
//! output fusion/convolution with 1 async op or 5 loop fusions with an
//! async op" (latency_hiding_scheduler.h).
//!
//! Invariant: every answer is one of the constants above.

use super::{CostModel, Op};
use crate::kinds::{is_nop, CollectiveInfo};
use xla_hlo_ir::{AttrKey, Opcode};

pub const LOW_COST: f64 = 1.0;
pub const MEDIUM_COST: f64 = 1000.0;
pub const HIGH_COST: f64 = 5000.0;
pub const HIGH_LATENCY: f64 = 5000.0;

/// The approximate model.
#[derive(Clone, Copy, Debug, Default)]
pub struct ApproximateCostModel;

impl CostModel for ApproximateCostModel {
    fn name(&self) -> String {
        "approximate".into()
    }
    fn compute_us(&self, op: Op<'_>) -> f64 {
        let Some(instr) = op.instr() else {
            return 0.0;
        };
        if is_nop(instr) || instr.opcode == Opcode::Reshape {
            return 0.0;
        }
        if crate::kinds::sync_collective_kind(instr).is_some()
            || matches!(
                instr.opcode,
                Opcode::While | Opcode::Call | Opcode::Conditional
            )
        {
            return 0.0;
        }
        match instr.opcode {
            Opcode::Fusion => match instr.ident_attr(AttrKey::FusionKind) {
                Some("kLoop") | Some("kInput") => MEDIUM_COST,
                Some("kOutput") => HIGH_COST,
                _ => LOW_COST,
            },
            Opcode::Convolution | Opcode::Dot => HIGH_COST,
            _ => LOW_COST,
        }
    }
    fn transfer_us(&self, _op: Op<'_>, _info: &CollectiveInfo) -> f64 {
        HIGH_LATENCY
    }
}
