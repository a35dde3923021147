//! Fuzz target: the parser must return Ok or Err on any bytes, never panic
//! or hang; whatever it accepts must print to text it accepts again.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(module) = xla_hlo_parser::parse_module(text) {
        let printed = module.to_text();
        let reparsed = xla_hlo_parser::parse_module(&printed);
        assert!(reparsed.is_ok(), "printed module does not parse: {:?}\n{printed}", reparsed.err());
    }
});
