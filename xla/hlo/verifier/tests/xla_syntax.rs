//! What XLA's own parser accepts and refuses, class by class, pinned on the
//! project's own small modules (the classes found by running XLA's parser
//! unit tests through `tools/xla_conformance/parser_suite.py`): each
//! accepted form parses, verifies and prints text that parses back equal;
//! each refused form is a located error saying what is wrong.

use xla_hlo_ir::{HloModule, Opcode};
use xla_hlo_parser::parse_module;

/// Parses and verifies; print(parse(text)) parses back to an equal module.
fn accepted(text: &str) -> HloModule {
    let m = parse_module(text).unwrap_or_else(|e| panic!("parse failed: {e}\n{text}"));
    if let Err(e) = xla_hlo_verifier::verify(&m) {
        panic!("verify failed: {e}\n{text}");
    }
    let printed = m.to_text();
    let again = parse_module(&printed).unwrap_or_else(|e| panic!("reparse failed: {e}\n{printed}"));
    assert_eq!(m, again, "parse(print(m)) != m:\n{printed}");
    m
}

/// Refused at `line:column` with a message containing `says`.
fn refused(text: &str, (line, column): (usize, usize), says: &str) {
    let err = parse_module(text).expect_err(text);
    assert!(err.message.contains(says), "expected '{says}', got: {err}");
    assert_eq!((err.line, err.column), (line, column), "position of: {err}");
}

fn constant(shape_and_value: &str) -> String {
    format!("HloModule m\nENTRY e {{\n  ROOT c = {shape_and_value}\n}}\n")
}

#[test]
fn literal_values_out_of_their_types_range_are_refused() {
    for (text, says) in [
        ("f16[] constant(65520)", "out of range for f16"),
        ("bf16[] constant(-1e39)", "out of range for bf16"),
        ("f32[2] constant({1, 3.5e38})", "out of range for f32"),
        ("f8e4m3fn[] constant(500)", "out of range for f8e4m3fn"),
        ("f64[] constant(2e308)", "out of range for double"),
        ("c64[] constant((1, 1e39))", "imaginary part"),
        ("c64[] constant((-1e39, 1))", "real part"),
        ("u8[] constant(-1)", "out of range for u8"),
        ("u32[] constant(4294967296)", "out of range for u32"),
        (
            "bf16[] constant(nan(0x100))",
            "NaN payload 0x100 is out of range for bf16",
        ),
        (
            "f8e5m2fnuz[] constant(nan(0x1))",
            "does not support payloads",
        ),
        ("f32[] constant(nan(0x0))", "malformed NaN payload"),
    ] {
        let err = parse_module(&constant(text)).expect_err(text);
        assert!(
            err.message.contains(says),
            "{text}: expected '{says}', got: {err}"
        );
        assert_eq!(err.line, 3, "{text}: {err}");
    }
}

#[test]
fn literal_values_that_round_into_range_are_accepted() {
    // 65519 rounds to f16's largest finite value; inf and NaN are not range checked;
    // a negative u64 wraps as XLA stores an s64 into it.
    let m = accepted(&constant("f16[3] constant({65519, inf, -nan})"));
    assert_eq!(m.entry_computation().root_instr().opcode, Opcode::Constant);
    accepted(&constant("f8e4m3fn[2] constant({448, nan})"));
    accepted(&constant("f16[] constant(nan(0x3ff))"));
    accepted(&constant("f64[] constant(1.7976931348623157e308)"));
    let m = accepted(&constant("u64[] constant(-1)"));
    assert!(m.to_text().contains("constant(18446744073709551615)"));
}

#[test]
fn nested_operand_instructions_are_flattened() {
    let m = accepted(
        "HloModule m\nENTRY e {\n  ROOT r = add(f32[4] parameter(0), multiply(f32[4] parameter(1), f32[4] parameter(2)))\n}\n",
    );
    let entry = m.entry_computation();
    assert_eq!(entry.instructions.len(), 5, "{}", m.to_text());
    assert_eq!(entry.parameters.len(), 3);
    assert_eq!(entry.root_instr().opcode, Opcode::Add);
    // Named and nested operands mix; a nested instruction takes no attributes,
    // so the comma after it separates operands.
    let m = accepted(
        "HloModule m\nENTRY e {\n  p = f32[4] parameter(0)\n  ROOT t = (f32[4], f32[4]) tuple(p, f32[4] negate(p)), sharding={{replicated}, {replicated}}\n}\n",
    );
    assert_eq!(m.entry_computation().instructions.len(), 3);
}

#[test]
fn a_declared_operand_shape_must_match_the_operand() {
    refused(
        "HloModule m\nENTRY e {\n  p = f32[2,2] parameter(0)\n  ROOT a = f32[2,2] add(f32[2,2] p, f32[2,5] p)\n}\n",
        (4, 37),
        "not compatible with the shape of 'p'",
    );
    // Layouts do not take part in the comparison.
    accepted("HloModule m\nENTRY e {\n  p = f32[2,2]{1,0} parameter(0)\n  ROOT n = f32[2,2]{1,0} negate(f32[2,2]{0,1} p)\n}\n");
}

#[test]
fn a_signature_must_match_the_root() {
    refused(
        "HloModule m\nENTRY e () -> f32[2] {\n  ROOT c = f32[3] constant({1, 2, 3})\n}\n",
        (2, 15),
        "declared to return f32[2], not compatible with its root 'c'",
    );
}

#[test]
fn header_with_a_trailing_colon() {
    let m = accepted("HloModule old_style:\nENTRY e {\n  ROOT p = f32[2] parameter(0)\n}\n");
    assert_eq!(m.name, "old_style");
}

#[test]
fn custom_call_literal_attribute() {
    let m = accepted(
        "HloModule m\nENTRY e {\n  ROOT c = f32[2] custom-call(), custom_call_target=\"t\", literal=s32[3]{0} {1, 2, 3}\n}\n",
    );
    assert!(
        m.to_text().contains("literal=s32[3]{0} {1, 2, 3}"),
        "{}",
        m.to_text()
    );
    refused(
        "HloModule m\nENTRY e {\n  ROOT c = f32[2] custom-call(), custom_call_target=\"t\", literal=u8[1]{0} {300}\n}\n",
        (3, 76),
        "out of range for u8",
    );
}

#[test]
fn unused_convolution_dimensions_are_question_marks() {
    let m = accepted(
        "HloModule m\nENTRY e {\n  ROOT c = f32[4] custom-call(), custom_call_target=\"t\", window={size=2x2}, dim_labels=?b01f_0?1io->b01?f\n}\n",
    );
    // As XLA prints them: a trailing `?` is not kept.
    assert!(
        m.to_text().contains("dim_labels=?b01f_0?1io->b01?f"),
        "{}",
        m.to_text()
    );
}

#[test]
fn layout_items_in_xlas_order_only() {
    let m = accepted(
        "HloModule m\nENTRY e {\n  ROOT p = f32[16,128]{1,0:D(D,C+)T(8,128)L(2)#(u32)*(u32)E(32)S(1)SC(0:1)M(4)} parameter(0)\n}\n",
    );
    // Dimension level types are checked, then dropped (dense layouts only).
    // As in XLA, a layout may follow its shape after a space, so a literal
    // after a shape without a layout (`literal=u8[1] {3}`) reads as one.
    assert!(
        m.to_text()
            .contains("{1,0:T(8,128)L(2)#(u32)*(u32)E(32)S(1)SC(0:1)M(4)}"),
        "{}",
        m.to_text()
    );
    refused(
        "HloModule m\nENTRY e {\n  ROOT p = f32[16,128]{1,0:E(32)T(8,128)} parameter(0)\n}\n",
        (3, 33),
        "in the order D T L # * E S SC P M",
    );
    refused(
        "HloModule m\nENTRY e {\n  ROOT p = f32[4,4]{1,0:D(D,X)} parameter(0)\n}\n",
        (3, 29),
        "a dimension level type",
    );
    refused(
        "HloModule m\nENTRY e {\n  ROOT p = f32[4,4]{1,0:D(D,C)P(s32[4])} parameter(0)\n}\n",
        (3, 31),
        "physical shape",
    );
}

#[test]
fn in_place_collective_permute_repeats_a_source_once_per_slice() {
    let text = "HloModule m, replica_count=2
ENTRY e {
  input = f32[4,8] parameter(0)
  output = f32[4,8] parameter(1)
  zero = s32[] constant(0)
  one = s32[] constant(1)
  at0 = (s32[], s32[]) tuple(zero, zero)
  at1 = (s32[], s32[]) tuple(one, zero)
  offsets = ((s32[], s32[]), (s32[], s32[])) tuple(at0, at1)
  ROOT cp = f32[4,8] collective-permute(input, output, offsets, offsets), source_target_pairs={{0,1},{1,0},{0,1},{1,0}}, slice_sizes={{1,8},{1,8}}
}
";
    accepted(text);
    let three = text.replace(
        "{{0,1},{1,0},{0,1},{1,0}}",
        "{{0,1},{1,0},{0,1},{1,0},{0,1}}",
    );
    let m = parse_module(&three).unwrap();
    let err = xla_hlo_verifier::verify(&m).expect_err("a third use of source 0");
    assert!(
        err.to_string().contains("uses source 0 more than 2 times"),
        "{err}"
    );
}

#[test]
fn after_all_takes_any_operands() {
    // XLA's verifier checks only that the result is a token.
    accepted(
        "HloModule m\nENTRY e {\n  p = f32[] parameter(0)\n  t = token[] after-all(p)\n  ROOT d = f32[] add-dependency(p, t)\n}\n",
    );
}

/// Parses; the verifier refuses with a message containing `says`.
fn refused_by_verifier(text: &str, says: &str) {
    let m = parse_module(text).unwrap_or_else(|e| panic!("parse failed: {e}\n{text}"));
    let err = xla_hlo_verifier::verify(&m).expect_err(text);
    assert!(
        err.to_string().contains(says),
        "expected '{says}', got: {err}"
    );
}

#[test]
fn custom_call_attribute_values() {
    let call = |attrs: &str| {
        format!(
            "HloModule m\nENTRY e {{\n  p = f32[4,2]{{1,0}} parameter(0)\n  ROOT c = f32[4] custom-call(p), custom_call_target=\"t\"{attrs}\n}}\n"
        )
    };
    accepted(&call(", api_version=API_VERSION_TYPED_FFI"));
    refused(
        &call(", api_version=API_VERSION_UNSPECIFIED"),
        (4, 71),
        "unknown custom-call api_version",
    );
    accepted(&call(", operand_layout_constraints={f32[4,2]{0,1}}"));
    refused_by_verifier(
        &call(", operand_layout_constraints={f32[4,2]{0,1}, f32[4]{0}}"),
        "gives 2 shapes for 1 operands",
    );
    refused_by_verifier(
        &call(", operand_layout_constraints={f32[2,4]{0,1}}"),
        "for operand 0 is not compatible",
    );
    let m = accepted(&call(", literal=(s32[2]{0} {1, 2}, (pred[] true))"));
    assert!(
        m.to_text()
            .contains("literal=(s32[2]{0} {1, 2}, (pred[] true))"),
        "{}",
        m.to_text()
    );
}

#[test]
fn result_accuracy_spellings() {
    let exp = |accuracy: &str| {
        format!("HloModule m\nENTRY e {{\n  p = f32[] parameter(0)\n  ROOT x = f32[] exponential(p), result_accuracy={accuracy}\n}}\n")
    };
    accepted(&exp("{mode=highest}"));
    accepted(&exp("{tolerance={atol=1e-5,rtol=0.01,ulps=2}}"));
    refused(
        &exp("{mode=high}"),
        (4, 50),
        "unknown result_accuracy mode 'high'",
    );
    refused(&exp("{0.5}"), (4, 50), "expected an attribute name");
    refused(
        &exp("{foo=1}"),
        (4, 50),
        "invalid result_accuracy attribute name 'foo'",
    );
    refused(
        &exp("{tolerance={bits=3}}"),
        (4, 50),
        "invalid result_accuracy tolerance 'bits'",
    );
}

#[test]
fn infeed_shape_is_a_tuple() {
    refused_by_verifier(
        "HloModule m\nENTRY e {\n  t = token[] after-all()\n  ROOT i = pred[] infeed(t)\n}\n",
        "infeed must have a non-empty tuple shape",
    );
    accepted("HloModule m\nENTRY e {\n  t = token[] after-all()\n  ROOT i = (f32[2], token[]) infeed(t)\n}\n");
}

#[test]
fn conditional_attributes_follow_the_index_type() {
    let cond = |index: &str, attrs: &str| {
        format!(
            "HloModule m\nb0 {{\n  ROOT p = f32[] parameter(0)\n}}\nb1 {{\n  q = f32[] parameter(0)\n  ROOT n = f32[] negate(q)\n}}\nENTRY e {{\n  i = {index}[] parameter(0)\n  x = f32[] parameter(1)\n  ROOT c = f32[] conditional(i, x, x), {attrs}\n}}\n"
        )
    };
    accepted(&cond("pred", "true_computation=b0, false_computation=b1"));
    accepted(&cond("s32", "branch_computations={b0, b1}"));
    refused_by_verifier(
        &cond("pred", "branch_computations={b0, b1}"),
        "not branch_computations",
    );
    refused_by_verifier(
        &cond("s32", "true_computation=b0, false_computation=b1"),
        "takes branch_computations",
    );
}

#[test]
fn async_updates_and_dones_continue_their_start() {
    let chain = |update: &str, done: &str| {
        format!(
            "HloModule m\nwrapped {{\n  a = f32[4] parameter(0)\n  ROOT c = f32[8] custom-call(a), custom_call_target=\"t\"\n}}\nother {{\n  a = f32[4] parameter(0)\n  ROOT c = f32[8] custom-call(a), custom_call_target=\"u\"\n}}\nENTRY e {{\n  p = f32[4] parameter(0)\n  s = ((f32[4]), f32[8], s32[]) async-start(p), calls=wrapped, async_execution_thread=\"side\"\n  u = ((f32[4]), f32[8], s32[]) async-update(s){update}\n  ROOT d = f32[8] async-done(u){done}\n}}\n"
        )
    };
    // Update and done inherit what they do not write.
    accepted(&chain("", ""));
    accepted(&chain(
        ", calls=wrapped",
        ", async_execution_thread=\"side\"",
    ));
    refused_by_verifier(
        &chain(", calls=other", ""),
        "wrapped computation is %wrapped at 's' but %other",
    );
    refused_by_verifier(
        &chain("", ", async_execution_thread=\"main\""),
        "async_execution_thread is \"side\"",
    );
    let sugar = "HloModule m\nENTRY e {\n  p = f32[4] parameter(0)\n  s = ((f32[4]), f32[8], s32[]) custom-call-start(p), custom_call_target=\"t\"\n  u = ((f32[4]), f32[8], s32[]) add-update(s)\n  ROOT d = f32[8] custom-call-done(u)\n}\n";
    refused_by_verifier(sugar, "wrapped opcode is custom-call at 's' but add");
    let twice = "HloModule m\nwrapped {\n  a = f32[4] parameter(0)\n  ROOT c = f32[8] custom-call(a), custom_call_target=\"t\"\n}\nENTRY e {\n  p = f32[4] parameter(0)\n  s0 = ((f32[4]), f32[8], s32[]) async-start(p), calls=wrapped\n  d0 = f32[8] async-done(s0)\n  s1 = ((f32[4]), f32[8], s32[]) async-start(p), calls=wrapped\n  d1 = f32[8] async-done(s1)\n  ROOT t = (f32[8], f32[8]) tuple(d0, d1)\n}\n";
    refused_by_verifier(twice, "wrapped by more than one async-start");
}
