//! The HLO pass framework: a `Pass` trait, a `Pipeline` that runs passes in
//! order (verifying the module between passes, timing them, optionally
//! dumping the module after each one and checking that every pass reports
//! `changed` honestly), a `FixedPoint` wrapper, and a `PassRegistry` that
//! maps the stable kebab-case pass names used on command lines
//! (`hlo-opt --passes=a,b,c`) to constructors.
//!
//! Invariants:
//! - `Pass::run` returns `Ok(false)` only when it left the module unchanged
//!   (the pipeline's change check compares the module before and after and
//!   reports a `PassError::DishonestChange` otherwise);
//! - with verification on, no pass ever sees a module that does not verify:
//!   the input is verified first, then the output of each pass;
//! - dumps are named `NN.<pass>.hlo` (NN = 1-based position in the
//!   pipeline) and written before the next pass runs.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use thiserror::Error;
use xla_hlo_ir::HloModule;
use xla_hlo_verifier::VerifierErrors;

/// Why a pass or a pipeline failed.
#[derive(Debug, Error)]
pub enum PassError {
    /// The pass itself reports an error (bad input it cannot handle).
    #[error("pass '{pass}' failed: {message}")]
    Failed { pass: String, message: String },
    /// The module does not verify after `pass` (or before the first pass).
    #[error("the module does not verify {stage}:\n{errors}")]
    Verifier {
        stage: String,
        errors: VerifierErrors,
    },
    /// The pass's `changed` result disagrees with what it did.
    #[error("pass '{pass}' returned changed={reported}, but it {actual} the module")]
    DishonestChange {
        pass: String,
        reported: bool,
        actual: &'static str,
    },
    /// No pass of that name is registered.
    #[error("unknown pass '{name}' (known passes: {known})")]
    UnknownPass { name: String, known: String },
    /// Writing a dump failed.
    #[error("cannot write {}: {source}", path.display())]
    Dump {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A transformation of a module.
pub trait Pass {
    /// Stable kebab-case name (`sharding-propagation`).
    fn name(&self) -> &str;
    /// Runs the pass; `Ok(true)` if and only if the module changed.
    fn run(&mut self, module: &mut HloModule) -> Result<bool, PassError>;
}

impl<P: Pass + ?Sized> Pass for Box<P> {
    fn name(&self) -> &str {
        (**self).name()
    }
    fn run(&mut self, module: &mut HloModule) -> Result<bool, PassError> {
        (**self).run(module)
    }
}

/// Runs a pass until it reports no change (at most `max_iterations` runs).
pub struct FixedPoint<P> {
    inner: P,
    name: String,
    max_iterations: usize,
}

impl<P: Pass> FixedPoint<P> {
    pub fn new(inner: P, max_iterations: usize) -> FixedPoint<P> {
        let name = format!("{}-fixed-point", inner.name());
        FixedPoint {
            inner,
            name,
            max_iterations: max_iterations.max(1),
        }
    }
}

impl<P: Pass> Pass for FixedPoint<P> {
    fn name(&self) -> &str {
        &self.name
    }
    fn run(&mut self, module: &mut HloModule) -> Result<bool, PassError> {
        let mut any = false;
        for _ in 0..self.max_iterations {
            if !self.inner.run(module)? {
                break;
            }
            any = true;
        }
        Ok(any)
    }
}

/// One pass's run in a pipeline.
#[derive(Clone, Debug, PartialEq)]
pub struct PassRun {
    pub name: String,
    pub changed: bool,
    pub duration: Duration,
    /// The dump written after the pass, if any.
    pub dump: Option<PathBuf>,
}

/// What a pipeline run did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PipelineReport {
    pub runs: Vec<PassRun>,
}

impl PipelineReport {
    /// Some pass changed the module.
    pub fn changed(&self) -> bool {
        self.runs.iter().any(|r| r.changed)
    }
}

impl fmt::Display for PipelineReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for r in &self.runs {
            writeln!(
                f,
                "{:<32} {:>10.3} ms  {}",
                r.name,
                r.duration.as_secs_f64() * 1e3,
                if r.changed { "changed" } else { "unchanged" }
            )?;
        }
        Ok(())
    }
}

/// Passes run in order, with verification, change checks and dumps.
pub struct Pipeline {
    name: String,
    passes: Vec<Box<dyn Pass>>,
    verify: bool,
    check_changed: bool,
    dump_dir: Option<PathBuf>,
}

impl Pipeline {
    /// An empty pipeline that verifies between passes.
    pub fn new(name: impl Into<String>) -> Pipeline {
        Pipeline {
            name: name.into(),
            passes: Vec::new(),
            verify: true,
            check_changed: false,
            dump_dir: None,
        }
    }
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Appends a pass.
    #[allow(clippy::should_implement_trait)]
    pub fn add(mut self, pass: impl Pass + 'static) -> Pipeline {
        self.passes.push(Box::new(pass));
        self
    }
    /// Appends a boxed pass.
    pub fn add_boxed(&mut self, pass: Box<dyn Pass>) -> &mut Pipeline {
        self.passes.push(pass);
        self
    }
    /// Verify the input and the output of every pass (on by default).
    pub fn with_verifier(mut self, on: bool) -> Pipeline {
        self.verify = on;
        self
    }
    /// Compare the module before and after each pass against its `changed`
    /// result (costs a copy of the module per pass; off by default).
    pub fn with_change_check(mut self, on: bool) -> Pipeline {
        self.check_changed = on;
        self
    }
    /// Write the module to `dir/NN.<pass>.hlo` after each pass.
    pub fn dump_after_each(mut self, dir: impl Into<PathBuf>) -> Pipeline {
        self.dump_dir = Some(dir.into());
        self
    }
    /// Names of the passes in order.
    pub fn pass_names(&self) -> Vec<String> {
        self.passes.iter().map(|p| p.name().to_string()).collect()
    }

    fn verify(module: &HloModule, stage: impl Into<String>) -> Result<(), PassError> {
        xla_hlo_verifier::verify(module).map_err(|errors| PassError::Verifier {
            stage: stage.into(),
            errors,
        })
    }

    /// Runs every pass in order.
    pub fn run(&mut self, module: &mut HloModule) -> Result<PipelineReport, PassError> {
        if self.verify {
            Self::verify(module, format!("before pipeline '{}'", self.name))?;
        }
        if let Some(dir) = &self.dump_dir {
            std::fs::create_dir_all(dir).map_err(|source| PassError::Dump {
                path: dir.clone(),
                source,
            })?;
        }
        let mut report = PipelineReport::default();
        for (i, pass) in self.passes.iter_mut().enumerate() {
            let name = pass.name().to_string();
            let before = self.check_changed.then(|| module.clone());
            let start = Instant::now();
            let changed = pass.run(module)?;
            let duration = start.elapsed();
            log::info!(
                "pass {name}: {:.3} ms, changed={changed}",
                duration.as_secs_f64() * 1e3
            );
            if let Some(before) = before {
                let actually = &before != module;
                if actually != changed {
                    return Err(PassError::DishonestChange {
                        pass: name,
                        reported: changed,
                        actual: if actually {
                            "changed"
                        } else {
                            "did not change"
                        },
                    });
                }
            }
            if self.verify {
                Self::verify(module, format!("after pass '{name}'"))?;
            }
            let dump = match &self.dump_dir {
                Some(dir) => Some(write_dump(dir, i + 1, &name, module)?),
                None => None,
            };
            report.runs.push(PassRun {
                name,
                changed,
                duration,
                dump,
            });
        }
        Ok(report)
    }
}

fn write_dump(
    dir: &Path,
    index: usize,
    pass: &str,
    module: &HloModule,
) -> Result<PathBuf, PassError> {
    let safe: String = pass
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let path = dir.join(format!("{index:02}.{safe}.hlo"));
    std::fs::write(&path, module.to_text()).map_err(|source| PassError::Dump {
        path: path.clone(),
        source,
    })?;
    Ok(path)
}

type Factory = Box<dyn Fn() -> Box<dyn Pass>>;

/// Pass constructors by name, for command lines.
#[derive(Default)]
pub struct PassRegistry {
    entries: Vec<(String, String, Factory)>,
}

impl PassRegistry {
    pub fn new() -> PassRegistry {
        PassRegistry::default()
    }
    /// Registers `name` (with a one-line description).
    pub fn register(
        &mut self,
        name: impl Into<String>,
        description: impl Into<String>,
        factory: impl Fn() -> Box<dyn Pass> + 'static,
    ) -> &mut PassRegistry {
        self.entries
            .push((name.into(), description.into(), Box::new(factory)));
        self
    }
    /// Registered names with their descriptions, in registration order.
    pub fn names(&self) -> Vec<(&str, &str)> {
        self.entries
            .iter()
            .map(|e| (e.0.as_str(), e.1.as_str()))
            .collect()
    }
    /// A new instance of the pass called `name`.
    pub fn create(&self, name: &str) -> Result<Box<dyn Pass>, PassError> {
        self.entries
            .iter()
            .find(|e| e.0 == name)
            .map(|e| (e.2)())
            .ok_or_else(|| PassError::UnknownPass {
                name: name.to_string(),
                known: self
                    .entries
                    .iter()
                    .map(|e| e.0.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }
    /// A pipeline of the comma-separated `list` (empty items are skipped).
    pub fn pipeline(&self, name: &str, list: &str) -> Result<Pipeline, PassError> {
        let mut p = Pipeline::new(name);
        for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            p.add_boxed(self.create(item)?);
        }
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MODULE: &str = "HloModule m\n\nENTRY %e (p: f32[4]) -> f32[4] {\n  %p = f32[4]{0} parameter(0)\n  ROOT %n = f32[4]{0} negate(%p)\n}\n";

    /// Renames the root; claims `changed` as configured.
    struct Rename {
        honest: bool,
    }
    impl Pass for Rename {
        fn name(&self) -> &str {
            "rename"
        }
        fn run(&mut self, m: &mut HloModule) -> Result<bool, PassError> {
            let e = m.entry;
            let root = m.comp(e).root;
            let i = m.comp_mut(e).instr_mut(root);
            if i.name == "renamed" {
                return Ok(false);
            }
            i.name = "renamed".into();
            Ok(self.honest)
        }
    }

    struct Nop;
    impl Pass for Nop {
        fn name(&self) -> &str {
            "nop"
        }
        fn run(&mut self, _: &mut HloModule) -> Result<bool, PassError> {
            Ok(false)
        }
    }

    fn module() -> HloModule {
        xla_hlo_parser::parse_module(MODULE).unwrap()
    }

    #[test]
    fn pipeline_runs_verifies_and_dumps() {
        let dir = std::env::temp_dir().join(format!("xla_pass_test_{}", std::process::id()));
        let mut p = Pipeline::new("t")
            .add(Nop)
            .add(Rename { honest: true })
            .with_change_check(true)
            .dump_after_each(&dir);
        let mut m = module();
        let report = p.run(&mut m).unwrap();
        assert_eq!(report.runs.len(), 2);
        assert!(!report.runs[0].changed);
        assert!(report.changed());
        let dumped = std::fs::read_to_string(dir.join("02.rename.hlo")).unwrap();
        assert!(dumped.contains("%renamed"));
        assert!(dir.join("01.nop.hlo").is_file());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn dishonest_change_is_caught() {
        let mut p = Pipeline::new("t")
            .add(Rename { honest: false })
            .with_change_check(true);
        let err = p.run(&mut module()).unwrap_err();
        assert!(matches!(err, PassError::DishonestChange { .. }), "{err}");
    }

    #[test]
    fn registry_builds_pipelines() {
        let mut r = PassRegistry::new();
        r.register("nop", "does nothing", || Box::new(Nop));
        let mut p = r.pipeline("cli", "nop, nop").unwrap();
        assert_eq!(p.pass_names(), vec!["nop", "nop"]);
        assert!(!p.run(&mut module()).unwrap().changed());
        assert!(matches!(
            r.pipeline("cli", "nop,bogus"),
            Err(PassError::UnknownPass { .. })
        ));
        let mut fp = FixedPoint::new(Rename { honest: true }, 5);
        assert!(fp.run(&mut module()).unwrap());
    }
}
