//! Unit tests: small hand-written modules. Valid ones must verify cleanly;
//! each broken one must report the expected error on the expected
//! instruction. Modules the text format cannot express (dangling ids,
//! duplicate computation names, cycles) are built through the IR API.
//!
//! This module holds the helpers the topic modules share: parsing, error
//! collection and the assertions.

mod broken_calls;
mod broken_shapes;
mod broken_sharding_and_header;
mod broken_structure_and_form;
mod ir_built_modules;
mod robustness;
mod unchecked_shapes;
mod valid_modules;

use crate::{verify, VerifierError};
use xla_hlo_ir::HloModule;

fn parse(text: &str) -> HloModule {
    xla_hlo_parser::parse_module(text).unwrap_or_else(|e| panic!("test module does not parse: {e}"))
}

fn errors(text: &str) -> Vec<VerifierError> {
    match verify(&parse(text)) {
        Ok(()) => Vec::new(),
        Err(e) => e.0,
    }
}

#[track_caller]
fn assert_ok(text: &str) {
    let errs = errors(text);
    assert!(
        errs.is_empty(),
        "expected no errors, got:\n{}",
        errs.iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// Asserts an error on instruction `instr` (or on the computation when
/// `instr` is empty) whose message contains `needle`.
#[track_caller]
fn assert_error_in(errs: &[VerifierError], instr: &str, needle: &str) {
    let hit = errs.iter().any(|e| {
        let on = if instr.is_empty() {
            e.instruction.is_none()
        } else {
            e.instruction.as_deref() == Some(instr)
        };
        on && e.message.contains(needle)
    });
    assert!(
        hit,
        "expected an error on '{instr}' containing '{needle}', got:\n{}",
        errs.iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[track_caller]
fn assert_error(text: &str, instr: &str, needle: &str) {
    assert_error_in(&errors(text), instr, needle);
}

const ADD: &str = "
add {
  add_lhs = f32[] parameter(0)
  add_rhs = f32[] parameter(1)
  ROOT add_sum = f32[] add(add_lhs, add_rhs)
}
";

fn with_add(body: &str) -> String {
    format!("HloModule m\n{ADD}\n{body}")
}
