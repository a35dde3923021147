//! `hlo-opt`: reads an HLO module, verifies it, and prints it (to stdout or
//! atomically to `-o FILE`) or prints its statistics as JSON (`--stats`).
//!
//! Invariants: bad input gives one clear message on stderr (file, line:column,
//! what was expected) and exit code 1, never a panic; `-o` writes through a
//! temporary file renamed into place, so a failed run leaves no partial output.

use anyhow::{Context, Result};
use clap::Parser;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use xla_hlo_ir::stats::ModuleStats;

#[derive(Parser, Debug)]
#[command(
    name = "hlo-opt",
    version,
    about = "Parse, verify, transform and print HLO modules"
)]
struct Args {
    /// The HLO text file to read.
    input: PathBuf,
    /// Write the printed module here instead of stdout.
    #[arg(short = 'o', long = "output")]
    output: Option<PathBuf>,
    /// Print statistics as one JSON object instead of the module.
    #[arg(long)]
    stats: bool,
    /// Skip the verifier (for inspecting broken modules).
    #[arg(long)]
    no_verify: bool,
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hlo-opt: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn run(args: &Args) -> Result<()> {
    let module = load_module(&args.input, !args.no_verify)?;
    let text = if args.stats {
        let mut s = ModuleStats::of(&module).to_json().to_string();
        s.push('\n');
        s
    } else {
        module.to_text()
    };
    match &args.output {
        Some(path) => write_atomically(path, text.as_bytes()),
        None => {
            let mut out = std::io::stdout().lock();
            out.write_all(text.as_bytes())
                .context("writing to stdout")?;
            out.flush().context("writing to stdout")
        }
    }
}

/// Reads, parses and (optionally) verifies a module; errors name the file.
fn load_module(path: &Path, verify: bool) -> Result<xla_hlo_ir::HloModule> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let module = xla_hlo_parser::parse_module(&text)
        .map_err(|e| anyhow::anyhow!("{}:{e}", path.display()))?;
    if verify {
        xla_hlo_verifier::verify(&module)
            .map_err(|e| anyhow::anyhow!("{}: the module does not verify:\n{e}", path.display()))?;
    }
    log::info!(
        "read {} ({} instructions)",
        path.display(),
        module.instruction_count()
    );
    Ok(module)
}

/// Writes `bytes` to a temporary file beside `path`, then renames it into place.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let file_name = path
        .file_name()
        .context("the output path has no file name")?;
    let tmp = dir.join(format!(
        ".{}.tmp{}",
        file_name.to_string_lossy(),
        std::process::id()
    ));
    let result = (|| -> Result<()> {
        let mut f = std::fs::File::create(&tmp)
            .with_context(|| format!("cannot create {}", tmp.display()))?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}
