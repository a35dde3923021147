//! Cost models behind one trait: how long an instruction occupies the
//! compute stream, and how long an asynchronous operation (a collective,
//! an async copy or wrapped computation) takes between its start and the
//! moment its done can return.
//!
//! Three models: `ApproximateCostModel` (XLA's `ApproximateLatencyEstimator`
//! units), `AnalyticalCostModel` (alpha-beta collectives over NVLink /
//! NVSwitch and a FLOP/byte roofline for compute, with H100 / H200
//! defaults) and `TableCostModel` (measured times per instruction name from
//! a file, overriding another model).
//!
//! Invariants: every model returns finite, non-negative microseconds for
//! any instruction of any module (malformed ones included); the cost of the
//! computations an instruction calls (while bodies, branches, callees) is
//! not part of `compute_us`: the simulator and the scheduler add it.

mod analytical;
mod approximate;
mod table;

pub use analytical::{AllReduceAlgorithm, AnalyticalCostModel, GpuSpec};
pub use approximate::ApproximateCostModel;
pub use table::{CostTable, TableCostModel};

use crate::error::SchedulerError;
use crate::kinds::CollectiveInfo;
use std::sync::Arc;
use xla_hlo_ir::{HloComputation, HloInstruction, HloModule, InstrId};

/// One instruction, with the module and computation it lives in, and
/// (when the caller has it) the computation's users table
/// (`HloComputation::users`), which models that look at an instruction's
/// users (the analytical model's fusion estimate) would otherwise rebuild
/// for each question.
#[derive(Clone, Copy)]
pub struct Op<'a> {
    pub module: &'a HloModule,
    pub comp: &'a HloComputation,
    pub id: InstrId,
    pub users: Option<&'a [Vec<InstrId>]>,
}

impl<'a> Op<'a> {
    pub fn new(module: &'a HloModule, comp: &'a HloComputation, id: InstrId) -> Op<'a> {
        Op {
            module,
            comp,
            id,
            users: None,
        }
    }
    /// `new` with `comp.users()` already built (it must be that table).
    pub fn with_users(
        module: &'a HloModule,
        comp: &'a HloComputation,
        id: InstrId,
        users: &'a [Vec<InstrId>],
    ) -> Op<'a> {
        Op {
            module,
            comp,
            id,
            users: Some(users),
        }
    }
    /// The instruction (`None` for a dangling id).
    pub fn instr(&self) -> Option<&'a HloInstruction> {
        self.comp.instructions.get(self.id.index())
    }
    /// The shapes of the operands that exist.
    pub fn operand_instrs(&self) -> impl Iterator<Item = &'a HloInstruction> + 'a {
        let comp = self.comp;
        self.instr()
            .into_iter()
            .flat_map(|i| i.operands.iter())
            .filter_map(move |o| comp.instructions.get(o.index()))
    }
}

/// A cost model: times in microseconds.
pub trait CostModel: Send + Sync {
    /// A short description (`analytical(H100-SXM)`).
    fn name(&self) -> String;
    /// Time the instruction occupies the compute stream, excluding the
    /// computations it calls. Synchronous collectives return 0 here: their
    /// time is `transfer_us`.
    fn compute_us(&self, op: Op<'_>) -> f64;
    /// Duration of an asynchronous operation or synchronous collective
    /// described by `info` (for async pairs, the start's operation).
    fn transfer_us(&self, op: Op<'_>, info: &CollectiveInfo) -> f64;
}

/// Clamps a model's answer to a finite, non-negative number.
pub(crate) fn sane(us: f64) -> f64 {
    if us.is_finite() && us > 0.0 {
        us
    } else {
        0.0
    }
}

/// Builds a cost model from its command-line spelling:
/// `approximate`, `analytical` (H100 defaults), `analytical:h100`,
/// `analytical:h200`, or `table:PATH` (a measured table over the
/// analytical H100 model; `table:PATH@h200` uses the H200 model as base).
pub fn cost_model_from_spec(spec: &str) -> Result<Arc<dyn CostModel>, SchedulerError> {
    let spec = spec.trim();
    if let Some(rest) = spec.strip_prefix("table:") {
        let (path, base) = match rest.rsplit_once('@') {
            Some((p, b)) if !p.is_empty() && GpuSpec::by_name(b).is_some() => (p, b),
            _ => (rest, "h100"),
        };
        if path.is_empty() {
            return Err(SchedulerError::BadCostModel(spec.to_string()));
        }
        let base: Arc<dyn CostModel> = Arc::new(AnalyticalCostModel::new(
            GpuSpec::by_name(base).unwrap_or_else(GpuSpec::h100_sxm),
        ));
        let table = CostTable::load(std::path::Path::new(path))?;
        return Ok(Arc::new(TableCostModel::new(table, base)));
    }
    match spec {
        "approximate" => Ok(Arc::new(ApproximateCostModel)),
        "analytical" => Ok(Arc::new(AnalyticalCostModel::new(GpuSpec::h100_sxm()))),
        _ => match spec.strip_prefix("analytical:").and_then(GpuSpec::by_name) {
            Some(g) => Ok(Arc::new(AnalyticalCostModel::new(g))),
            None => Err(SchedulerError::BadCostModel(spec.to_string())),
        },
    }
}
