//! Reading a module file for a tool: read, parse, verify, with every error
//! naming the file (and, for verifier errors, `file:line:col` of each
//! instruction concerned).
//!
//! Invariants: a module returned with `verify` set satisfies [`crate::verify`];
//! the error text is complete, one problem a line, ready to print.

use crate::verify;
use std::path::Path;
use xla_hlo_ir::HloModule;

/// Reads and parses the module in `path`, and verifies it when `verify_it`.
pub fn load_module_file(path: &Path, verify_it: bool) -> Result<HloModule, String> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {file}: {e}"))?;
    let module = xla_hlo_parser::parse_module(&text).map_err(|e| format!("{file}:{e}"))?;
    if verify_it {
        verify(&module).map_err(|errors| {
            let lines = xla_hlo_parser::locate::located_lines(
                &file,
                &text,
                errors.iter().map(|e| {
                    (
                        e.computation.as_str(),
                        e.instruction.as_deref(),
                        e.to_string(),
                    )
                }),
            );
            format!("{file}: the module does not verify:\n{lines}")
        })?;
    }
    Ok(module)
}
