//! Test support (pure CPU): builds a plan's generated CUDA C with the host
//! C++ compiler (`codegen::HOST_SHIM` stands in for the CUDA builtins; one
//! "thread" runs each grid-stride loop), runs it and returns the results, so
//! the kernels' syntax and semantics are checked without a GPU. Used by the
//! unit tests and tests/cuda_plan.rs.

use super::codegen::host_program;
use super::host::{array_to_bytes, bytes_to_array};
use super::plan::{Plan, Step};
use xla_hlo_evaluator::{Array, Value};

/// Compiles the plan's generated kernels with the host C++ compiler
/// (`HOST_SHIM`), runs them on `args` and returns the result leaves; `None`
/// (with a message) when there is no `c++` on this machine.
pub fn run_generated_on_host(plan: &Plan, args: &[Value]) -> Result<Option<Vec<Array>>, String> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "xla_rs_cuda_host_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    let io = |e: std::io::Error| e.to_string();
    std::fs::create_dir_all(&dir).map_err(io)?;
    std::fs::write(dir.join("prog.cc"), host_program(plan)).map_err(io)?;
    let cc = std::process::Command::new("c++")
        .args(["-std=c++17", "-O1", "-w", "-o"])
        .arg(dir.join("prog"))
        .arg(dir.join("prog.cc"))
        .output();
    let cc = match cc {
        Ok(o) => o,
        Err(e) => {
            eprintln!("skipping the host build of the generated kernels: c++: {e}");
            let _ = std::fs::remove_dir_all(&dir);
            return Ok(None);
        }
    };
    if !cc.status.success() {
        return Err(format!(
            "generated source does not compile (kept in {}):\n{}",
            dir.display(),
            String::from_utf8_lossy(&cc.stderr)
        ));
    }
    fn leaf<'v>(v: &'v Value, index: &[usize]) -> &'v Array {
        match index.split_first() {
            None => v.as_array().expect("array argument"),
            Some((i, rest)) => leaf(&v.tuple_elements().expect("tuple argument")[*i], rest),
        }
    }
    for st in &plan.steps {
        match st {
            Step::Param { out, number, index } => {
                let a = args.get(*number).ok_or("missing argument")?;
                std::fs::write(
                    dir.join(format!("b{out}.bin")),
                    array_to_bytes(leaf(a, index)).map_err(|e| e.to_string())?,
                )
                .map_err(io)?
            }
            Step::Constant { out, value } => std::fs::write(
                dir.join(format!("b{out}.bin")),
                array_to_bytes(value).map_err(|e| e.to_string())?,
            )
            .map_err(io)?,
            _ => {}
        }
    }
    let run = std::process::Command::new(dir.join("prog"))
        .arg(&dir)
        .output()
        .map_err(io)?;
    if !run.status.success() {
        return Err(format!(
            "host program failed: {}",
            String::from_utf8_lossy(&run.stderr)
        ));
    }
    let ls = plan.result.leaves();
    let mut res = Vec::new();
    for (k, b) in ls.iter().enumerate() {
        let bytes = std::fs::read(dir.join(format!("o{k}.bin"))).map_err(io)?;
        let info = &plan.buffers[*b];
        res.push(bytes_to_array(info.ty, info.dims.clone(), &bytes).map_err(|e| e.to_string())?);
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(Some(res))
}
