//! The Rust half of the C++ API (`include/hlo_api.h`): a cxx bridge over the
//! HLO crates. C++ code calls it through `xla_rs::HloModule` (exceptions) or
//! the `xla_rs::Status` functions; see the header for the contract.
//!
//! Passes are run by name through one entry point, [`run_passes`], which takes
//! a comma-separated list (`"sharding-propagation,spmd-partitioning"`) and
//! builds the pipeline from [`registry`]: sharding propagation, SPMD
//! partitioning, async collective creation and latency-hiding scheduling. A
//! name that is planned but not built yet, or unknown, is an error that lists
//! the passes this build has.
//!
//! The same file is the input of the C++ code generator under both builds:
//! cargo's build.rs (cxx-build) and Bazel's `rust_cxx_bridge`
//! (tools/bazel/rust_cxx_bridge.bzl), so C++ includes it as
//! `xla/cc_api/src/lib.rs.h` in both.

use xla_hlo_ir::stats::ModuleStats;
use xla_hlo_pass::{PassError, PassRegistry};

#[cxx::bridge(namespace = "xla_rs::ffi")]
mod ffi {
    /// Module statistics (what `hlo-opt --stats` prints).
    #[derive(Debug, Clone)]
    struct Stats {
        instructions: u64,
        computations: u64,
        collectives: u64,
        collective_bytes: u64,
        /// The full statistics as one JSON object (opcode histogram too).
        json: String,
    }

    /// One pass of a `run_passes` pipeline.
    #[derive(Debug, Clone)]
    struct PassRunInfo {
        name: String,
        changed: bool,
    }

    extern "Rust" {
        type Module;
        fn parse_module(text: &str) -> Result<Box<Module>>;
        fn verify_module(module: &Module) -> Result<()>;
        fn module_name(module: &Module) -> String;
        fn module_to_text(module: &Module) -> String;
        fn module_stats(module: &Module) -> Stats;
        fn clone_module(module: &Module) -> Box<Module>;
        fn run_passes(module: &mut Module, passes: &str) -> Result<Vec<PassRunInfo>>;
        fn available_passes() -> Vec<String>;
        fn init_logging(filter: &str) -> bool;
    }
}

pub use ffi::{PassRunInfo, Stats};

/// An HLO module owned by C++ through `rust::Box`.
#[derive(Clone)]
pub struct Module(pub xla_hlo_ir::HloModule);

/// Passes of XLA's SPMD pipeline that this project has not written yet;
/// naming one gives "not available in this build yet" rather than "unknown".
pub const PLANNED_PASSES: &[&str] = &[];

/// The passes [`run_passes`] can run, by name: the project's one registry
/// (`xla_pipelines`) with its default options (the scheduler's default
/// configuration and the analytical cost model, as `hlo-opt` has them).
pub fn registry() -> PassRegistry {
    xla_pipelines::registry(&xla_pipelines::PipelineOptions::default())
}

/// Checks pass names against the registry: an error names the pass, says
/// whether it is planned or unknown, and lists the available ones.
fn check_pass_names(known: &[&str], planned: &[&str], names: &[&str]) -> Result<(), String> {
    for name in names {
        if !known.contains(name) {
            let why = if planned.contains(name) {
                "is not available in this build yet"
            } else {
                "is not a known pass"
            };
            return Err(format!(
                "pass \"{name}\" {why} (available: {})",
                known.join(", ")
            ));
        }
    }
    Ok(())
}

pub fn parse_module(text: &str) -> Result<Box<Module>, String> {
    xla_hlo_parser::parse_module(text)
        .map(|m| Box::new(Module(m)))
        .map_err(|e| format!("parse error: {e}"))
}

pub fn verify_module(module: &Module) -> Result<(), String> {
    xla_hlo_verifier::verify(&module.0).map_err(|e| format!("the module does not verify:\n{e}"))
}

pub fn module_name(module: &Module) -> String {
    module.0.name.clone()
}

pub fn module_to_text(module: &Module) -> String {
    module.0.to_text()
}

pub fn module_stats(module: &Module) -> Stats {
    let s = ModuleStats::of(&module.0);
    Stats {
        instructions: s.instructions as u64,
        computations: s.computations as u64,
        collectives: s.collectives.values().sum::<usize>() as u64,
        collective_bytes: s.collective_bytes,
        json: s.to_json().to_string(),
    }
}

pub fn clone_module(module: &Module) -> Box<Module> {
    Box::new(module.clone())
}

/// Runs the comma-separated `passes` in order (verifying after each). On
/// error the module is left as it was.
pub fn run_passes(module: &mut Module, passes: &str) -> Result<Vec<PassRunInfo>, String> {
    let reg = registry();
    let names: Vec<&str> = passes
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    let known: Vec<&str> = reg.names().into_iter().map(|(n, _)| n).collect();
    check_pass_names(&known, PLANNED_PASSES, &names)?;
    let mut pipeline = reg
        .pipeline("cc-api", &names.join(","))
        .map_err(|e: PassError| e.to_string())?;
    let mut work = module.0.clone();
    let report = pipeline.run(&mut work).map_err(|e| e.to_string())?;
    module.0 = work;
    Ok(report
        .runs
        .iter()
        .map(|r| PassRunInfo {
            name: r.name.clone(),
            changed: r.changed,
        })
        .collect())
}

pub fn available_passes() -> Vec<String> {
    registry()
        .names()
        .into_iter()
        .map(|(n, _)| n.to_string())
        .collect()
}

/// Installs a stderr logger for the Rust side's `log` messages (pass
/// timings at `info`, the scheduler's warnings at `warn`), filtered by
/// `RUST_LOG` when set and by `filter` (e.g. `"warn"`) otherwise. Returns
/// false when a logger was already installed in this process (the first
/// one stays).
pub fn init_logging(filter: &str) -> bool {
    let filter = if filter.is_empty() { "warn" } else { filter };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(filter))
        .try_init()
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "HloModule m\n\nENTRY %e (p: f32[4]) -> f32[4] {\n  %p = f32[4]{0} parameter(0)\n  ROOT %n = f32[4]{0} negate(%p)\n}\n";

    #[test]
    fn parse_print_stats() {
        let m = parse_module(TEXT).unwrap();
        verify_module(&m).unwrap();
        assert_eq!(module_name(&m), "m");
        assert!(module_to_text(&m).contains("negate"));
        let s = module_stats(&m);
        assert_eq!((s.instructions, s.computations, s.collectives), (2, 1, 0));
        assert!(s.json.contains("\"instructions\":2"));
    }

    #[test]
    fn parse_errors_have_positions() {
        let e = parse_module("HloModule m\n\nENTRY %e {\n  ROOT %x = f32[] bogus()\n}\n")
            .err()
            .unwrap();
        assert!(e.starts_with("parse error: "), "{e}");
    }

    const SHARDED: &str = "HloModule m, num_partitions=2\n\nENTRY %e (x: f32[8,16], y: f32[16,4]) -> f32[8,4] {\n  %x = f32[8,16]{1,0} parameter(0), sharding={devices=[2,1]<=[2]}\n  %y = f32[16,4]{1,0} parameter(1), sharding={replicated}\n  ROOT %d = f32[8,4]{1,0} dot(%x, %y), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n}\n";

    #[test]
    fn passes_by_name() {
        let mut m = parse_module(SHARDED).unwrap();
        let runs = run_passes(
            &mut m,
            "sharding-propagation, spmd-partitioning, latency-hiding-scheduler",
        )
        .unwrap();
        let names: Vec<&str> = runs.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "sharding-propagation",
                "spmd-partitioning",
                "latency-hiding-scheduler"
            ]
        );
        let text = module_to_text(&m);
        assert!(text.contains("f32[4,16]"), "{text}"); // per-device shapes
        verify_module(&m).unwrap();

        let before = module_to_text(&m);
        let e = run_passes(&mut m, "sharding-propagation,no-such-pass").unwrap_err();
        assert!(e.contains("\"no-such-pass\" is not a known pass"), "{e}");
        assert!(
            e.contains("available: shardy-import, sdy-propagation, sharding-propagation, complete-shardings, spmd-partitioning"),
            "{e}"
        );
        assert_eq!(module_to_text(&m), before);
        assert_eq!(available_passes().len(), 10);
    }

    #[test]
    fn planned_passes_are_named_as_such() {
        let e = check_pass_names(&["a"], &["b"], &["a", "b"]).unwrap_err();
        assert_eq!(
            e,
            "pass \"b\" is not available in this build yet (available: a)"
        );
        assert!(check_pass_names(&["a"], &["b"], &["a"]).is_ok());
    }
}
