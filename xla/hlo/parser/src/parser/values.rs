//! Small value syntaxes shared by every part of the parser: `true`/`false`
//! (alone or as a `{...}` list), integer lists with any delimiters, a byte
//! that must follow without whitespace, and float numbers with `inf`/`nan`.
//!
//! Invariants: as the cursor's: each method consumes what it reads or
//! returns an error at the offending position.

use super::state::Parser;
use crate::cursor::PResult;

impl<'a> Parser<'a> {
    pub(super) fn bool_value(&mut self) -> PResult<bool> {
        let pos = self.c.pos;
        match self.c.word()? {
            "true" => Ok(true),
            "false" => Ok(false),
            other => Err(self.err(pos, format!("expected true or false, found '{other}'"))),
        }
    }

    pub(super) fn bools_value(&mut self) -> PResult<Vec<bool>> {
        if self.c.peek() != Some(b'{') {
            return Ok(vec![self.bool_value()?]);
        }
        self.c.expect(b'{')?;
        let mut out = Vec::new();
        while !self.c.eat(b'}') {
            if !out.is_empty() {
                self.c.expect(b',')?;
            }
            out.push(self.bool_value()?);
        }
        Ok(out)
    }

    /// `{1,2,3}` (or with other delimiters), possibly empty.
    pub(super) fn int_list(&mut self, open: u8, close: u8) -> PResult<Vec<i64>> {
        self.c.expect(open)?;
        let mut out = Vec::new();
        while !self.c.eat(close) {
            if !out.is_empty() {
                self.c.expect(b',')?;
            }
            out.push(self.c.int()?);
        }
        Ok(out)
    }

    pub(super) fn int_lists(&mut self) -> PResult<Vec<Vec<i64>>> {
        self.c.expect(b'{')?;
        let mut out = Vec::new();
        while !self.c.eat(b'}') {
            if !out.is_empty() {
                self.c.expect(b',')?;
            }
            out.push(self.int_list(b'{', b'}')?);
        }
        Ok(out)
    }

    pub(super) fn expect_raw(&mut self, b: u8) -> PResult<()> {
        if self.c.peek_raw() == Some(b) {
            self.c.pos += 1;
            Ok(())
        } else {
            Err(self.c.expected(&format!("'{}'", b as char)))
        }
    }
}

/// Parses a decimal, `inf`, `-inf`, `nan` or `-nan` as f64.
pub(super) fn parse_f64(text: &str) -> Option<f64> {
    let (neg, body) = match text.strip_prefix('-') {
        Some(b) => (true, b),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    let v = match body {
        "inf" => f64::INFINITY,
        "nan" => f64::NAN,
        _ if body.starts_with("nan(") => f64::NAN,
        _ => body.parse::<f64>().ok()?,
    };
    Some(if neg { -v } else { v })
}
