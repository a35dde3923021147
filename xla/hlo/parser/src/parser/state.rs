//! The parser's state: the byte cursor, the nesting depth of shapes and
//! literals, and the computations read so far (which shape inference of
//! later instructions consults); plus the helpers every part uses.
//!
//! Invariants: `enter` fails past `MAX_DEPTH` nested levels, so recursion is
//! bounded whatever the input; every `enter` that succeeds is paired with a
//! `leave`. Every error is made at a byte offset of the text.

use crate::cursor::{Cursor, PResult};
use crate::error::ParseError;
use rustc_hash::FxHashMap;
use xla_hlo_ir::module::{CompId, HloComputation};

pub(super) struct Parser<'a> {
    pub(super) c: Cursor<'a>,
    /// Nesting depth of shapes/literals, bounded to keep recursion finite.
    pub(super) depth: usize,
    /// Computations read so far, and their names (for shape inference of
    /// instructions that call them).
    pub(super) computations: Vec<HloComputation>,
    pub(super) comp_names: FxHashMap<&'a str, CompId>,
}

const MAX_DEPTH: usize = 256;

impl<'a> Parser<'a> {
    pub(super) fn new(text: &'a str) -> Parser<'a> {
        Parser {
            c: Cursor::new(text),
            depth: 0,
            computations: Vec::new(),
            comp_names: FxHashMap::default(),
        }
    }

    pub(super) fn err(&self, pos: usize, msg: impl Into<String>) -> ParseError {
        self.c.error_at(pos, msg)
    }

    pub(super) fn expect_end(&mut self) -> PResult<()> {
        self.c.skip_ws();
        if self.c.at_end() {
            Ok(())
        } else {
            Err(self.c.expected("end of input"))
        }
    }

    pub(super) fn enter(&mut self) -> PResult<()> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(self.err(self.c.pos, "nesting is too deep"));
        }
        Ok(())
    }

    pub(super) fn leave(&mut self) {
        self.depth -= 1;
    }
}
