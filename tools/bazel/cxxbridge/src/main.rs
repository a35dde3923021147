//! `cxxbridge INPUT.rs --header OUT.h --cc OUT.cc`: the C++ side of the
//! `#[cxx::bridge]` modules in INPUT.rs, as `cxxbridge-cmd` writes it, through
//! the `cxx-gen` library (the generator cxx-build uses, pinned to the same
//! release as `cxx`). Bazel's `rust_cxx_bridge` (tools/bazel/rust_cxx_bridge.bzl)
//! runs it; cargo builds use cxx-build in build.rs instead.

use std::path::PathBuf;
use std::process::ExitCode;

struct Args {
    input: PathBuf,
    header: Option<PathBuf>,
    cc: Option<PathBuf>,
}

fn parse_args() -> Result<Args, String> {
    let mut input = None;
    let (mut header, mut cc) = (None, None);
    let mut it = std::env::args_os().skip(1);
    while let Some(a) = it.next() {
        match a.to_str() {
            Some("--header") => header = it.next().map(PathBuf::from),
            Some("--cc") => cc = it.next().map(PathBuf::from),
            Some(s) if s.starts_with('-') => return Err(format!("unknown option {s}")),
            _ if input.is_none() => input = Some(PathBuf::from(a)),
            _ => return Err("more than one input file".into()),
        }
    }
    let input = input.ok_or("usage: cxxbridge INPUT.rs [--header OUT.h] [--cc OUT.cc]")?;
    Ok(Args { input, header, cc })
}

fn run() -> Result<(), String> {
    let args = parse_args()?;
    let src = std::fs::read_to_string(&args.input)
        .map_err(|e| format!("cannot read {}: {e}", args.input.display()))?;
    let tokens: proc_macro2::TokenStream = src
        .parse()
        .map_err(|e| format!("{}: {e}", args.input.display()))?;
    let code = cxx_gen::generate_header_and_cc(tokens, &cxx_gen::Opt::default())
        .map_err(|e| format!("{}: {e}", args.input.display()))?;
    for (path, bytes) in [
        (&args.header, &code.header),
        (&args.cc, &code.implementation),
    ] {
        if let Some(path) = path {
            std::fs::write(path, bytes)
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cxxbridge: {e}");
            ExitCode::from(1)
        }
    }
}
