//! The Rust half of the C++ API (`include/hlo_api.h`): a cxx bridge over the
//! HLO crates. C++ code calls it through `xla_rs::HloModule` (exceptions) or
//! the `xla_rs::Status` functions; see the header for the contract.
//!
//! Passes are run by name through one entry point, [`run_passes`], which takes
//! a comma-separated list (`"sharding-propagation,spmd-partitioning"`) and
//! builds the pipeline from [`registry`]. A name that is planned but not built
//! yet, or unknown, is an error that lists the passes this build has.
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
    }
}

pub use ffi::{PassRunInfo, Stats};

/// An HLO module owned by C++ through `rust::Box`.
#[derive(Clone)]
pub struct Module(pub xla_hlo_ir::HloModule);

/// Passes that XLA's SPMD pipeline has and this project is writing; naming one
/// gives "not available yet" rather than "unknown".
pub const PLANNED_PASSES: &[&str] = &[
    "spmd-partitioning",
    "async-collective-creator",
    "latency-hiding-scheduler",
];

/// The passes [`run_passes`] can run, by name.
pub fn registry() -> PassRegistry {
    let mut r = PassRegistry::new();
    r.register(
        "sharding-propagation",
        "complete user shardings to every instruction (XLA's GSPMD propagation)",
        || Box::new(xla_sharding_propagation::ShardingPropagation::default()),
    );
    r.register(
        "complete-shardings",
        "give {replicated} to instructions still unsharded in partitioned computations",
        || Box::new(xla_sharding_propagation::ShardingCompletion),
    );
    r
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
    for name in &names {
        if !known.contains(name) {
            let why = if PLANNED_PASSES.contains(name) {
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

    #[test]
    fn passes_by_name() {
        let mut m = parse_module(TEXT).unwrap();
        let runs = run_passes(&mut m, "sharding-propagation").unwrap();
        assert_eq!(runs.len(), 1);
        assert_eq!(runs[0].name, "sharding-propagation");
        let e = run_passes(&mut m, "sharding-propagation,spmd-partitioning").unwrap_err();
        assert!(
            e.contains("\"spmd-partitioning\" is not available in this build yet"),
            "{e}"
        );
        assert!(
            e.contains("available: sharding-propagation, complete-shardings"),
            "{e}"
        );
        let e = run_passes(&mut m, "no-such-pass").unwrap_err();
        assert!(e.contains("is not a known pass"), "{e}");
        assert_eq!(
            available_passes(),
            vec![
                "sharding-propagation".to_string(),
                "complete-shardings".to_string()
            ]
        );
    }
}
