//! The interpreter's memory budget: before an instruction's result is
//! allocated, its bytes are computed from its shape (checked arithmetic) and
//! compared with a limit, so an instruction too large for the machine is an
//! error naming it, its shape, the bytes it needs and the limit, instead of
//! an allocation failure that aborts the process.
//!
//! Invariants: the check is per instruction result and per device (each
//! loopback device checks its own results against the same limit); results
//! that only forward buffers already counted (parameters, tuples and their
//! elements, calls, loops, branches) are not counted again; a shape whose
//! size overflows 64 bits is always over the limit.

use crate::EvalError;
use xla_hlo_ir::units::format_bytes;
use xla_hlo_ir::{HloInstruction, Opcode};

/// Bytes the machine can still give this process, from `MemAvailable` in
/// `/proc/meminfo`; `None` where that cannot be read (then no limit applies
/// unless one is given).
pub fn available_memory_bytes() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line
        .trim_start_matches("MemAvailable:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}

/// Whether `opcode`'s result only forwards buffers that something else
/// already allocated (and checked).
fn forwards_buffers(opcode: Opcode) -> bool {
    matches!(
        opcode,
        Opcode::Parameter
            | Opcode::Tuple
            | Opcode::GetTupleElement
            | Opcode::Call
            | Opcode::While
            | Opcode::Conditional
            | Opcode::OptimizationBarrier
            | Opcode::AddDependency
            | Opcode::Domain
            | Opcode::AfterAll
    )
}

/// Bytes `instr`'s result allocates: 0 for results that only forward
/// buffers, `None` when the size overflows 64 bits.
pub fn result_bytes(instr: &HloInstruction) -> Option<u64> {
    if forwards_buffers(instr.opcode) {
        Some(0)
    } else {
        instr.shape.checked_byte_size()
    }
}

/// Refuses `instr` when its result, of `bytes` (from [`result_bytes`]),
/// would take more than `limit` bytes.
pub fn check_result_bytes(
    instr: &HloInstruction,
    bytes: Option<u64>,
    limit: u64,
) -> Result<(), EvalError> {
    match bytes {
        _ if limit == u64::MAX => Ok(()),
        Some(b) if b <= limit => Ok(()),
        needed => Err(EvalError::OutOfMemory {
            what: format!("instruction %{}", instr.name),
            shape: instr.shape.without_layout().to_string(),
            needed,
            limit,
        }),
    }
}

/// Refuses `instr` when its result would take more than `limit` bytes.
pub fn check_result(instr: &HloInstruction, limit: u64) -> Result<(), EvalError> {
    check_result_bytes(instr, result_bytes(instr), limit)
}

/// The message of [`EvalError::OutOfMemory`].
pub(crate) fn out_of_memory_message(
    what: &str,
    shape: &str,
    needed: Option<u64>,
    limit: u64,
) -> String {
    let needed = match needed {
        Some(bytes) => format!("{} ({bytes} bytes)", format_bytes(bytes)),
        None => "more than 2^64 bytes".to_string(),
    };
    format!(
        "{what}: {shape} needs {needed}, the memory limit is {} ({limit} bytes)",
        format_bytes(limit)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use xla_hlo_ir::{PrimitiveType, Shape};

    #[test]
    fn refuses_results_over_the_limit() {
        let shape = Shape::array(PrimitiveType::F32, vec![1024, 1024]);
        let add = HloInstruction::new("sum", Opcode::Add, shape.clone(), vec![]);
        assert!(check_result(&add, 4 << 20).is_ok());
        let e = check_result(&add, 1 << 20).unwrap_err().to_string();
        assert_eq!(
            e,
            "instruction %sum: f32[1024,1024] needs 4.0 MiB (4194304 bytes), the memory limit is 1.0 MiB (1048576 bytes)"
        );
        let param = HloInstruction::new("p", Opcode::Parameter, shape, vec![]);
        assert!(check_result(&param, 1).is_ok());
        let huge = Shape::array(PrimitiveType::F64, vec![1 << 40, 1 << 40]);
        let e = check_result(
            &HloInstruction::new("b", Opcode::Broadcast, huge, vec![]),
            1 << 30,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("needs more than 2^64 bytes"), "{e}");
    }

    #[test]
    fn reads_available_memory_on_linux() {
        if std::path::Path::new("/proc/meminfo").exists() {
            assert!(available_memory_bytes().is_some_and(|b| b > 0));
        }
    }
}
