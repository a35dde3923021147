//! Parse errors with 1-based line:column, the offending source line and a caret.
//!
//! Invariant: building an error never panics, whatever the offset (it is
//! clamped to the input and moved back to a character boundary).

use std::fmt;

/// A parse failure at a position in the input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    pub line: usize,
    pub column: usize,
    pub message: String,
    /// The source line the error is on (without its newline).
    pub source_line: String,
}

impl ParseError {
    pub fn new(src: &str, pos: usize, message: String) -> ParseError {
        let mut pos = pos.min(src.len());
        while !src.is_char_boundary(pos) {
            pos -= 1;
        }
        let line_start = src[..pos].rfind('\n').map(|i| i + 1).unwrap_or(0);
        let line_end = src[pos..].find('\n').map(|i| pos + i).unwrap_or(src.len());
        let line = src[..line_start].bytes().filter(|&b| b == b'\n').count() + 1;
        let column = src[line_start..pos].chars().count() + 1;
        ParseError {
            line,
            column,
            message,
            source_line: src[line_start..line_end].to_string(),
        }
    }
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.line, self.column, self.message)?;
        // Long lines (a 40k-character tuple) are cut around the column.
        let chars: Vec<char> = self.source_line.chars().collect();
        let from = self.column.saturating_sub(60);
        let to = (self.column + 60).min(chars.len());
        if from < to || chars.is_empty() {
            let snippet: String = chars[from.min(chars.len())..to].iter().collect();
            let caret =
                " ".repeat(self.column.saturating_sub(1) - from.min(self.column.saturating_sub(1)));
            write!(f, "\n  {snippet}\n  {caret}^")?;
        }
        Ok(())
    }
}

impl std::error::Error for ParseError {}
