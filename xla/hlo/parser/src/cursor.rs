//! A byte cursor over HLO text: whitespace and comment skipping, identifiers,
//! numbers, strings and balanced raw spans, with errors that carry the byte
//! offset (turned into line:column by `ParseError`).
//!
//! Invariants: every method either advances past what it read or leaves the
//! position unchanged and returns an error; no method loops without
//! consuming input, so parsing always terminates; nothing panics on any bytes.

use crate::error::ParseError;

pub struct Cursor<'a> {
    pub src: &'a str,
    bytes: &'a [u8],
    pub pos: usize,
}

pub type PResult<T> = Result<T, ParseError>;

pub fn is_ident_start(b: u8) -> bool {
    b.is_ascii_alphabetic() || b == b'_'
}

pub fn is_ident_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'.' || b == b'-'
}

impl<'a> Cursor<'a> {
    pub fn new(src: &'a str) -> Cursor<'a> {
        Cursor {
            src,
            bytes: src.as_bytes(),
            pos: 0,
        }
    }

    pub fn error_at(&self, pos: usize, message: impl Into<String>) -> ParseError {
        ParseError::new(self.src, pos, message.into())
    }

    /// An error at the current position naming what was expected and what was found.
    pub fn expected(&self, what: &str) -> ParseError {
        let found = self.describe_here();
        self.error_at(self.pos, format!("expected {what}, found {found}"))
    }

    fn describe_here(&self) -> String {
        if self.pos >= self.bytes.len() {
            return "end of input".to_string();
        }
        let rest = &self.src[self.pos..];
        let end = rest
            .char_indices()
            .find(|&(i, c)| i > 0 && (c.is_whitespace() || ",(){}[]=".contains(c)))
            .map(|(i, _)| i)
            .unwrap_or(rest.len())
            .min(40);
        let mut end = end.max(1);
        while !rest.is_char_boundary(end) {
            end += 1;
        }
        format!("'{}'", &rest[..end])
    }

    pub fn at_end(&self) -> bool {
        self.pos >= self.bytes.len()
    }

    /// Skips whitespace, `/* ... */` and `// ...` comments.
    pub fn skip_ws(&mut self) {
        match self.bytes.get(self.pos) {
            Some(b) if !b.is_ascii_whitespace() && *b != b'/' => return,
            None => return,
            _ => {}
        }
        loop {
            while self.pos < self.bytes.len() && self.bytes[self.pos].is_ascii_whitespace() {
                self.pos += 1;
            }
            if self.bytes[self.pos..].starts_with(b"/*") {
                let body = &self.bytes[self.pos + 2..];
                match body.windows(2).position(|w| w == b"*/") {
                    Some(end) => self.pos += 2 + end + 2,
                    None => self.pos = self.bytes.len(),
                }
            } else if self.bytes[self.pos..].starts_with(b"//") {
                match self.src[self.pos..].find('\n') {
                    Some(end) => self.pos += end + 1,
                    None => self.pos = self.bytes.len(),
                }
            } else {
                return;
            }
        }
    }

    /// The next non-space byte, without consuming it.
    pub fn peek(&mut self) -> Option<u8> {
        self.skip_ws();
        self.bytes.get(self.pos).copied()
    }

    /// The byte at the current position (no skipping).
    pub fn peek_raw(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }

    /// Consumes `b` (after whitespace) if it is next.
    pub fn eat(&mut self, b: u8) -> bool {
        if self.peek() == Some(b) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    pub fn expect(&mut self, b: u8) -> PResult<()> {
        if self.eat(b) {
            Ok(())
        } else {
            Err(self.expected(&format!("'{}'", b as char)))
        }
    }

    /// Consumes `s` (after whitespace) if the input continues with it.
    pub fn eat_str(&mut self, s: &str) -> bool {
        self.skip_ws();
        if self.bytes[self.pos..].starts_with(s.as_bytes()) {
            self.pos += s.len();
            true
        } else {
            false
        }
    }

    /// Consumes the keyword `kw` if it is next as a whole identifier.
    pub fn eat_keyword(&mut self, kw: &str) -> bool {
        self.skip_ws();
        let rest = &self.bytes[self.pos..];
        if rest.starts_with(kw.as_bytes()) && !rest.get(kw.len()).is_some_and(|&b| is_ident_char(b))
        {
            self.pos += kw.len();
            true
        } else {
            false
        }
    }

    /// True if the next identifier (after whitespace) is exactly `kw`.
    pub fn at_keyword(&mut self, kw: &str) -> bool {
        let save = self.pos;
        let found = self.eat_keyword(kw);
        self.pos = save;
        found
    }

    /// Reads an identifier `[A-Za-z_][A-Za-z0-9_.-]*`, with an optional leading `%`.
    pub fn ident(&mut self) -> PResult<&'a str> {
        self.skip_ws();
        let mut p = self.pos;
        if self.bytes.get(p) == Some(&b'%') {
            p += 1;
        }
        let name_start = p;
        if !self.bytes.get(p).is_some_and(|&b| is_ident_start(b)) {
            return Err(self.expected("a name"));
        }
        while self.bytes.get(p).is_some_and(|&b| is_ident_char(b)) {
            p += 1;
        }
        self.pos = p;
        Ok(&self.src[name_start..p])
    }

    /// Reads a bare word made of identifier characters (may start with a digit).
    pub fn word(&mut self) -> PResult<&'a str> {
        self.skip_ws();
        let start = self.pos;
        let mut p = start;
        while self.bytes.get(p).is_some_and(|&b| is_ident_char(b)) {
            p += 1;
        }
        if p == start {
            return Err(self.expected("a word"));
        }
        self.pos = p;
        Ok(&self.src[start..p])
    }

    /// Reads a signed decimal integer.
    pub fn int(&mut self) -> PResult<i64> {
        self.skip_ws();
        let start = self.pos;
        let mut p = start;
        if matches!(self.bytes.get(p), Some(b'-') | Some(b'+')) {
            p += 1;
        }
        let digits = p;
        while self.bytes.get(p).is_some_and(u8::is_ascii_digit) {
            p += 1;
        }
        if p == digits {
            return Err(self.expected("an integer"));
        }
        let text = &self.src[start..p];
        match text.parse::<i64>() {
            Ok(v) => {
                self.pos = p;
                Ok(v)
            }
            Err(_) => Err(self.error_at(start, format!("integer '{text}' is out of range"))),
        }
    }

    /// Reads a number token (integer or decimal, `inf`, `-inf`, `nan`,
    /// `-nan`, `nan(0x...)`) and returns its text.
    pub fn number_text(&mut self) -> PResult<&'a str> {
        self.skip_ws();
        let start = self.pos;
        let mut p = start;
        if matches!(self.bytes.get(p), Some(b'-') | Some(b'+')) {
            p += 1;
        }
        let rest = &self.bytes[p..];
        if rest.starts_with(b"inf") {
            p += 3;
        } else if rest.starts_with(b"nan") {
            p += 3;
            if self.bytes.get(p) == Some(&b'(') {
                match self.src[p..].find(')') {
                    Some(end) if end < 40 => p += end + 1,
                    _ => return Err(self.error_at(p, "unterminated NaN payload")),
                }
            }
        } else {
            let digits = p;
            while let Some(&b) = self.bytes.get(p) {
                let exponent_sign =
                    (b == b'-' || b == b'+') && matches!(self.bytes.get(p - 1), Some(b'e' | b'E'));
                if b.is_ascii_digit() || b == b'.' || b == b'e' || b == b'E' || exponent_sign {
                    p += 1;
                } else {
                    break;
                }
            }
            if p == digits {
                return Err(self.expected("a number"));
            }
        }
        if self
            .bytes
            .get(p)
            .is_some_and(|&b| is_ident_char(b) && b != b'-' && b != b'.')
        {
            return Err(self.error_at(start, "malformed number"));
        }
        self.pos = p;
        Ok(&self.src[start..p])
    }

    /// Skips a quoted string starting at the current position (no unescaping).
    pub fn skip_string(&mut self) -> PResult<()> {
        let start = self.pos;
        let Some(&quote) = self.bytes.get(self.pos) else {
            return Err(self.expected("a quoted string"));
        };
        let mut p = self.pos + 1;
        while let Some(&b) = self.bytes.get(p) {
            if b == quote {
                self.pos = p + 1;
                return Ok(());
            }
            p += if b == b'\\' { 2 } else { 1 };
        }
        Err(self.error_at(start, "unterminated string"))
    }

    /// Reads a quoted string (`"..."` or `'...'`) and returns its unescaped contents.
    pub fn string(&mut self) -> PResult<String> {
        self.skip_ws();
        let start = self.pos;
        let quote = match self.bytes.get(self.pos) {
            Some(&q @ (b'"' | b'\'')) => q,
            _ => return Err(self.expected("a quoted string")),
        };
        // Fast path: no escapes before the closing quote.
        if let Some(len) = self.bytes[start + 1..]
            .iter()
            .position(|&b| b == quote || b == b'\\')
        {
            if self.bytes[start + 1 + len] == quote {
                self.pos = start + 1 + len + 1;
                return Ok(self.src[start + 1..start + 1 + len].to_string());
            }
        }
        let mut out = String::new();
        let mut p = self.pos + 1;
        loop {
            let Some(&b) = self.bytes.get(p) else {
                return Err(self.error_at(start, "unterminated string"));
            };
            if b == quote {
                p += 1;
                break;
            }
            if b == b'\\' {
                let Some(&e) = self.bytes.get(p + 1) else {
                    return Err(self.error_at(start, "unterminated string"));
                };
                p += 2;
                match e {
                    b'n' => out.push('\n'),
                    b't' => out.push('\t'),
                    b'r' => out.push('\r'),
                    b'0'..=b'7' => {
                        let mut v = (e - b'0') as u32;
                        for _ in 0..2 {
                            match self.bytes.get(p) {
                                Some(&d @ b'0'..=b'7') => {
                                    v = v * 8 + (d - b'0') as u32;
                                    p += 1;
                                }
                                _ => break,
                            }
                        }
                        out.push(char::from_u32(v).unwrap_or('\u{fffd}'));
                    }
                    b'x' => {
                        let mut v = 0u32;
                        let mut n = 0;
                        while let Some(d) =
                            self.bytes.get(p).and_then(|&d| (d as char).to_digit(16))
                        {
                            v = v * 16 + d;
                            p += 1;
                            n += 1;
                            if n == 2 {
                                break;
                            }
                        }
                        out.push(char::from_u32(v).unwrap_or('\u{fffd}'));
                    }
                    other => {
                        // `\"`, `\'`, `\\` and any other escaped character stand for themselves.
                        let ch_len = utf8_len(other);
                        let end = (p - 1 + ch_len).min(self.bytes.len());
                        out.push_str(self.src.get(p - 1..end).unwrap_or(""));
                        p = end;
                    }
                }
                continue;
            }
            let ch_len = utf8_len(b);
            let end = (p + ch_len).min(self.bytes.len());
            out.push_str(self.src.get(p..end).unwrap_or(""));
            p = end;
        }
        self.pos = p;
        Ok(out)
    }

    /// Reads a balanced span starting at `open` (`{`, `(` or `[`) and returns
    /// its text including the delimiters. Quoted strings inside are skipped.
    pub fn balanced(&mut self) -> PResult<&'a str> {
        self.skip_ws();
        let start = self.pos;
        let mut depth = 0usize;
        let mut p = self.pos;
        while let Some(&b) = self.bytes.get(p) {
            match b {
                b'{' | b'(' | b'[' => depth += 1,
                b'}' | b')' | b']' => {
                    if depth == 0 {
                        return Err(self.error_at(p, "unbalanced closing bracket"));
                    }
                    depth -= 1;
                    if depth == 0 {
                        self.pos = p + 1;
                        return Ok(&self.src[start..p + 1]);
                    }
                }
                b'"' => {
                    self.pos = p;
                    self.skip_string()?;
                    p = self.pos;
                    continue;
                }
                _ => {}
            }
            if depth == 0 {
                return Err(self.expected("'{', '(' or '['"));
            }
            p += 1;
        }
        Err(self.error_at(start, "unterminated bracket"))
    }

    /// Reads a raw attribute value: a balanced block, a quoted string (kept
    /// with its quotes), or bare text up to the next top-level comma or line end.
    pub fn raw_value(&mut self) -> PResult<&'a str> {
        match self.peek() {
            Some(b'{') | Some(b'(') | Some(b'[') => self.balanced(),
            Some(b'"') | Some(b'\'') => {
                let start = self.pos;
                self.skip_string()?;
                Ok(&self.src[start..self.pos])
            }
            _ => {
                let start = self.pos;
                let mut p = start;
                while let Some(&b) = self.bytes.get(p) {
                    if b == b',' || b == b'\n' || b == b'}' {
                        break;
                    }
                    p += 1;
                }
                let text = self.src[start..p].trim_end();
                if text.is_empty() {
                    return Err(self.expected("an attribute value"));
                }
                self.pos = start + text.len();
                Ok(text)
            }
        }
    }
}

fn utf8_len(first: u8) -> usize {
    match first {
        0..=0x7f => 1,
        0xc0..=0xdf => 2,
        0xe0..=0xef => 3,
        0xf0..=0xf7 => 4,
        _ => 1,
    }
}
