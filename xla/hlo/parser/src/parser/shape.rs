//! Shapes: arrays (`f32[2,<=3,?]`), tuples, buffers (`b(...)`) and layouts
//! (`{1,0:T(8,128)E(4)S(1)}`).
//!
//! Invariants: nesting goes through `enter`/`leave`, so deep tuples are an
//! error, not a stack overflow; a `{` after an array shape is read as a
//! layout only when an integer or `:` follows it.

use super::state::Parser;
use crate::cursor::PResult;
use xla_hlo_ir::shape::{ArrayShape, Layout, Shape, UNBOUNDED};
use xla_hlo_ir::PrimitiveType;

impl<'a> Parser<'a> {
    pub(super) fn shape(&mut self) -> PResult<Shape> {
        self.enter()?;
        let r = self.shape_inner();
        self.leave();
        r
    }

    fn shape_inner(&mut self) -> PResult<Shape> {
        if self.c.eat(b'(') {
            let mut elements = Vec::new();
            while !self.c.eat(b')') {
                if !elements.is_empty() {
                    self.c.expect(b',')?;
                }
                elements.push(self.shape()?);
            }
            return Ok(Shape::Tuple(elements));
        }
        self.c.skip_ws();
        let pos = self.c.pos;
        let word = self.c.ident().map_err(|_| self.c.expected("a shape"))?;
        if word == "b" && self.c.peek_raw() == Some(b'(') {
            self.c.pos += 1;
            let inner = self.shape()?;
            self.c.expect(b')')?;
            return Ok(Shape::Buffer(Box::new(inner)));
        }
        let element_type = PrimitiveType::from_name(word).ok_or_else(|| {
            self.err(
                pos,
                format!("expected a shape, found unknown element type '{word}'"),
            )
        })?;
        self.expect_raw(b'[')?;
        let mut dims = Vec::new();
        let mut dynamic = Vec::new();
        while !self.c.eat(b']') {
            if !dims.is_empty() {
                self.c.expect(b',')?;
            }
            if self.c.eat(b'?') {
                dims.push(UNBOUNDED);
                dynamic.push(true);
            } else if self.c.eat_str("<=") {
                let d = self.c.int()?;
                dims.push(d);
                dynamic.push(true);
            } else {
                let dpos = self.c.pos;
                let d = self.c.int()?;
                if d < 0 {
                    return Err(self.err(dpos, format!("negative dimension size {d}")));
                }
                dims.push(d);
                dynamic.push(false);
            }
        }
        if !dynamic.iter().any(|&d| d) {
            dynamic.clear();
        }
        let mut shape = ArrayShape {
            element_type,
            dims,
            dynamic,
            layout: None,
        };
        // A '{' is a layout only when followed by an integer or ':'.
        if self.c.peek_raw() == Some(b'{') || self.c.peek() == Some(b'{') {
            let save = self.c.pos;
            self.c.eat(b'{');
            let next = self.c.peek();
            self.c.pos = save;
            if next.is_some_and(|b| b.is_ascii_digit() || b == b':') {
                let layout = self.layout()?;
                // `{:}` says nothing; keep it as "no layout" so it prints back parseably.
                if !layout.minor_to_major.is_empty() || !layout.is_plain() {
                    shape.layout = Some(layout);
                }
            }
        }
        Ok(Shape::Array(shape))
    }

    fn layout(&mut self) -> PResult<Layout> {
        self.c.expect(b'{')?;
        let mut layout = Layout::default();
        while self.c.peek().is_some_and(|b| b.is_ascii_digit()) {
            layout.minor_to_major.push(self.c.int()?);
            if !self.c.eat(b',') {
                break;
            }
        }
        if self.c.eat(b':') {
            // XLA's order, each item at most once: D T L # * E S SC P M.
            self.c.skip_ws();
            if self.at_layout_item("D") {
                // Dimension level types: checked, then dropped, as XLA's
                // parser does (it keeps dense layouts only).
                self.c.pos += 1;
                self.dim_level_types()?;
            }
            if self.at_layout_item("T") {
                self.c.pos += 1;
                while self.c.peek_raw() == Some(b'(') {
                    let tile = self.tile()?;
                    layout.push_tile(tile);
                }
            }
            for item in ["L", "#", "*"] {
                if self.at_layout_item(item) {
                    self.raw_layout_item(&mut layout)?;
                }
            }
            if self.at_layout_item("E") {
                self.c.pos += 1;
                self.c.expect(b'(')?;
                layout.set_element_size_in_bits(self.c.int()?);
                self.c.expect(b')')?;
            }
            if self.at_layout_item("S") {
                self.c.pos += 1;
                self.c.expect(b'(')?;
                layout.set_memory_space(self.c.int()?);
                self.c.expect(b')')?;
            }
            if self.at_layout_item("SC") {
                self.raw_layout_item(&mut layout)?;
            }
            if self.at_layout_item("P") {
                return Err(self.err(
                    self.c.pos,
                    "a physical shape P(...) belongs to a sparse layout, and dimension level types are not kept (as in XLA): this layout is dense",
                ));
            }
            if self.at_layout_item("M") {
                self.raw_layout_item(&mut layout)?;
            }
            self.c.skip_ws();
            if self.c.peek_raw() != Some(b'}') {
                return Err(self.c.expected(
                    "'}' ending the layout (its items go in the order D T L # * E S SC P M, each once)",
                ));
            }
        }
        self.c.expect(b'}')?;
        Ok(layout)
    }

    /// The input continues with layout item `name` followed by `(`.
    fn at_layout_item(&mut self, name: &str) -> bool {
        self.c.skip_ws();
        let rest = &self.c.src.as_bytes()[self.c.pos..];
        rest.starts_with(name.as_bytes()) && rest.get(name.len()) == Some(&b'(')
    }

    /// A layout item kept as written (`L(...)`, `#(...)`, `*(...)`, `SC(...)`, `M(...)`).
    fn raw_layout_item(&mut self, layout: &mut Layout) -> PResult<()> {
        let start = self.c.pos;
        while self.c.peek_raw() != Some(b'(') {
            self.c.pos += 1;
        }
        self.c.balanced()?;
        layout.push_other_item(self.c.src[start..self.c.pos].to_string());
        Ok(())
    }

    /// `(D, C+, S~, H, ...)`: dense, compressed, singleton or loose-compressed,
    /// each optionally not unique (`+`) and then not ordered (`~`).
    fn dim_level_types(&mut self) -> PResult<()> {
        self.c.expect(b'(')?;
        let mut first = true;
        while !self.c.eat(b')') {
            if !first {
                self.c.expect(b',')?;
            }
            first = false;
            self.c.skip_ws();
            match self.c.peek_raw() {
                Some(b'D' | b'C' | b'S' | b'H') => self.c.pos += 1,
                _ => return Err(self.c.expected("a dimension level type (D, C, S or H)")),
            }
            self.c.eat(b'+');
            self.c.eat(b'~');
        }
        Ok(())
    }

    fn tile(&mut self) -> PResult<Vec<i64>> {
        self.c.expect(b'(')?;
        let mut out = Vec::new();
        while !self.c.eat(b')') {
            if !out.is_empty() {
                self.c.expect(b',')?;
            }
            if self.c.eat(b'*') {
                out.push(i64::MIN);
            } else {
                out.push(self.c.int()?);
            }
        }
        Ok(out)
    }
}
