//! The CUDA backend on XLA's benchmark modules (../shared/xla-hlo and
//! ../shared/xla-hlo-more, when present: Llama 3.1, MaxText, DeepSeek,
//! Mixtral), Shardy annotations imported first as run_hlo_module does: each
//! plans and its generated source builds with the host C++ compiler, or the
//! compile error names every instruction the backend cannot run
//! (TransformerEngine's fused-attention custom-calls, jax's
//! custom_partitioning calls, whose meaning is a Python callback, and u4).
//! The MaxText 1n1g train step must plan. Prints the kernel count and planning and
//! build times per module. Skips with a message where ../shared is absent.

use std::time::Instant;
use xla_pipelines::shardy_import;
use xla_runtime::cuda::hostexec::HostKernels;
use xla_runtime::cuda::prepare;

#[test]
fn benchmark_modules_plan_and_their_kernels_compile() {
    let mut files = Vec::new();
    for dir in ["xla-hlo", "xla-hlo-more"] {
        let Some(d) = xla_test_paths::shared_path(dir) else {
            eprintln!("skipping ../shared/{dir}: not present");
            continue;
        };
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        files.extend(
            entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "hlo")),
        );
    }
    files.sort();
    let mut failures = Vec::new();
    for f in &files {
        let name = f.file_name().unwrap().to_string_lossy().to_string();
        let text = std::fs::read_to_string(f).unwrap();
        let mut m = match xla_hlo_parser::parse_module(&text) {
            Ok(m) => m,
            Err(e) => {
                failures.push(format!("{name}: parse: {e}"));
                continue;
            }
        };
        if shardy_import::has_shardy_annotations(&m) {
            if let Err(e) = shardy_import::import(&mut m) {
                failures.push(format!("{name}: Shardy import: {e}"));
                continue;
            }
        }
        let t = Instant::now();
        match prepare(&m) {
            Ok((plan, _)) => {
                let planned = t.elapsed().as_secs_f64() * 1e3;
                let t = Instant::now();
                let built = HostKernels::build(&plan);
                eprintln!(
                    "{name:64} {} kernels, planned in {planned:.1} ms, host build {:.1} s{}",
                    plan.kernels().count(),
                    t.elapsed().as_secs_f64(),
                    built
                        .as_ref()
                        .err()
                        .map(|e| format!(": {e}"))
                        .unwrap_or_default()
                );
                if let Err(e) = built {
                    failures.push(format!("{name}: host build: {e}"));
                }
            }
            Err(e) => {
                eprintln!("{name:64} {e}");
                let named = e.to_string().contains("not supported by the CUDA backend");
                if !named || name.contains("maxtext_1n1g") {
                    failures.push(format!("{name}: {e}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
