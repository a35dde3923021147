//! Measured costs loaded from a file, overriding another model.
//!
//! Format: either a JSON object `{"instruction-name": microseconds, ...}`
//! or text lines `NAME MICROSECONDS` (separated by spaces, tabs or one
//! comma), with `#` comments and blank lines ignored.
//!
//! Lookup: an instruction's own name; for the compute stream only
//! non-async instructions are looked up (an async done's wait is the
//! transfer, not compute). For a transfer (an async start or a synchronous
//! collective) the start's name, then that name without a `-start` suffix
//! (the collective it was converted from), then the name of the
//! instruction an `async-start` wraps. Names not in the table fall back to
//! the base model.
//!
//! Invariant: a loaded table holds only finite, non-negative times.

use super::{CostModel, Op};
use crate::error::SchedulerError;
use crate::kinds::{async_role, CollectiveInfo};
use rustc_hash::FxHashMap;
use std::path::Path;
use std::sync::Arc;
use xla_hlo_ir::AttrKey;

/// Measured times by instruction name (µs).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CostTable {
    pub entries: FxHashMap<String, f64>,
}

impl CostTable {
    /// Reads a table file.
    pub fn load(path: &Path) -> Result<CostTable, SchedulerError> {
        let text = std::fs::read_to_string(path).map_err(|e| SchedulerError::CostTable {
            path: path.display().to_string(),
            line: 0,
            message: e.to_string(),
        })?;
        CostTable::parse(&text).map_err(|(line, message)| SchedulerError::CostTable {
            path: path.display().to_string(),
            line,
            message,
        })
    }

    /// Parses table text; errors carry the 1-based line (0 for JSON errors).
    pub fn parse(text: &str) -> Result<CostTable, (usize, String)> {
        let mut entries = FxHashMap::default();
        let check = |line: usize, name: &str, v: f64| -> Result<(), (usize, String)> {
            if v.is_finite() && v >= 0.0 {
                Ok(())
            } else {
                Err((
                    line,
                    format!("time for '{name}' must be a finite number >= 0, got {v}"),
                ))
            }
        };
        if text.trim_start().starts_with('{') {
            let v: serde_json::Value =
                serde_json::from_str(text).map_err(|e| (e.line(), e.to_string()))?;
            let obj = v
                .as_object()
                .ok_or((0, "the JSON table must be an object".to_string()))?;
            for (name, val) in obj {
                let t = val
                    .as_f64()
                    .ok_or((0, format!("time for '{name}' is not a number")))?;
                check(0, name, t)?;
                entries.insert(name.trim_start_matches('%').to_string(), t);
            }
            return Ok(CostTable { entries });
        }
        for (i, raw) in text.lines().enumerate() {
            let line = raw.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let mut parts = line
                .split(|c: char| c == ',' || c.is_whitespace())
                .filter(|p| !p.is_empty());
            let (Some(name), Some(value), None) = (parts.next(), parts.next(), parts.next()) else {
                return Err((i + 1, format!("expected 'NAME MICROSECONDS', got '{line}'")));
            };
            let t: f64 = value
                .parse()
                .map_err(|_| (i + 1, format!("'{value}' is not a number")))?;
            check(i + 1, name, t)?;
            entries.insert(name.trim_start_matches('%').to_string(), t);
        }
        Ok(CostTable { entries })
    }

    pub fn get(&self, name: &str) -> Option<f64> {
        self.entries.get(name).copied()
    }
}

/// A table over a base model.
pub struct TableCostModel {
    pub table: CostTable,
    pub base: Arc<dyn CostModel>,
}

impl TableCostModel {
    pub fn new(table: CostTable, base: Arc<dyn CostModel>) -> TableCostModel {
        TableCostModel { table, base }
    }
}

impl CostModel for TableCostModel {
    fn name(&self) -> String {
        format!(
            "table({} entries) over {}",
            self.table.entries.len(),
            self.base.name()
        )
    }
    fn compute_us(&self, op: Op<'_>) -> f64 {
        let Some(instr) = op.instr() else {
            return 0.0;
        };
        let is_async = async_role(op.module, op.comp, op.id).is_some()
            || crate::kinds::sync_collective_kind(instr).is_some();
        if !is_async {
            if let Some(t) = self.table.get(&instr.name) {
                return t;
            }
        }
        self.base.compute_us(op)
    }
    fn transfer_us(&self, op: Op<'_>, info: &CollectiveInfo) -> f64 {
        if let Some(instr) = op.instr() {
            let name = instr.name.as_str();
            let stripped = name.strip_suffix("-start");
            let wrapped = instr
                .computation_attr(AttrKey::Calls)
                .and_then(|c| op.module.computations.get(c.index()))
                .and_then(|c| c.instructions.get(c.root.index()))
                .map(|r| r.name.as_str());
            for key in [Some(name), stripped, wrapped].into_iter().flatten() {
                if let Some(t) = self.table.get(key) {
                    return t;
                }
            }
        }
        self.base.transfer_us(op, info)
    }
}
