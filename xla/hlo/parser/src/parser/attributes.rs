//! One `key=value` attribute of an instruction: `sharding=`,
//! `control-predecessors=`, and every key of `xla_hlo_ir::attrs` read by the
//! value syntax its table entry names (ints, lists, computations, slices,
//! paddings, windows, dim labels, replica groups, shapes, raw text).
//!
//! Invariants: a key appears at most once per instruction; computation
//! names are recorded as pending (see `names`) and resolved later; unknown
//! keys keep their raw text, so they print back unchanged.

use super::names::{ComputationState, PendingComp, RefSlot};
use super::state::Parser;
use super::values::parse_f64;
use crate::cursor::PResult;
use xla_hlo_ir::attrs::{
    AttrKey, AttrValue, Attribute, ConvDimensionNumbers, PaddingDim, SliceDim, ValueKind, Window,
    WindowDim,
};
use xla_hlo_ir::module::{CompId, HloInstruction};

impl<'a> Parser<'a> {
    pub(super) fn attribute(
        &mut self,
        instr: &mut HloInstruction,
        state: &mut ComputationState<'a>,
        comp_id: CompId,
        pending_comps: &mut Vec<PendingComp<'a>>,
    ) -> PResult<()> {
        self.c.skip_ws();
        let key_pos = self.c.pos;
        let key_text = self.c.ident()?;
        self.c.expect(b'=')?;
        match key_text {
            "sharding" => {
                if instr.sharding.is_some() {
                    return Err(self.err(key_pos, "duplicate attribute 'sharding'"));
                }
                instr.sharding = Some(std::sync::Arc::new(self.sharding()?));
                return Ok(());
            }
            "control-predecessors" => {
                self.c.expect(b'{')?;
                while !self.c.eat(b'}') {
                    if !instr.control_predecessors.is_empty() {
                        self.c.expect(b',')?;
                    }
                    self.c.skip_ws();
                    let pos = self.c.pos;
                    let name = self.c.ident()?;
                    let slot = RefSlot::ControlPredecessor(instr.control_predecessors.len());
                    let id = self.reference(state, name, pos, slot);
                    instr.control_predecessors.push(id);
                }
                return Ok(());
            }
            _ => {}
        }
        let key = AttrKey::from_name(key_text);
        let duplicate = if key == AttrKey::Unknown {
            instr
                .attrs
                .iter()
                .any(|a| matches!(&a.value, AttrValue::Unknown { name, .. } if name == key_text))
        } else {
            instr.has_attr(key)
        };
        if duplicate {
            return Err(self.err(key_pos, format!("duplicate attribute '{key_text}'")));
        }
        let mut comp_ref = |name: &'a str, pos: usize, index: usize| {
            pending_comps.push(PendingComp {
                comp: comp_id.index(),
                instr: state.comp.instructions.len(),
                attr: key,
                index,
                name,
                pos,
            });
            CompId(u32::MAX)
        };
        self.c.skip_ws();
        let value_pos = self.c.pos;
        let value = match key.kind() {
            ValueKind::Int => AttrValue::Int(self.c.int()?),
            ValueKind::Float => {
                let pos = self.c.pos;
                let text = self.c.number_text()?;
                AttrValue::Float(parse_f64(text).ok_or_else(|| self.err(pos, "malformed number"))?)
            }
            ValueKind::Bool => AttrValue::Bool(self.bool_value()?),
            ValueKind::Ident => AttrValue::Ident(self.c.word()?.to_string()),
            ValueKind::Str => AttrValue::Str(self.c.string()?),
            ValueKind::Ints => AttrValue::Ints(self.int_list(b'{', b'}')?),
            ValueKind::IntLists => AttrValue::IntLists(self.int_lists()?),
            ValueKind::IntsOrLists => {
                let save = self.c.pos;
                self.c.expect(b'{')?;
                let nested = self.c.peek() == Some(b'{');
                self.c.pos = save;
                if nested {
                    AttrValue::IntLists(self.int_lists()?)
                } else {
                    AttrValue::Ints(self.int_list(b'{', b'}')?)
                }
            }
            ValueKind::Bools => AttrValue::Bools(self.bools_value()?),
            ValueKind::Idents => {
                self.c.expect(b'{')?;
                let mut out = Vec::new();
                while !self.c.eat(b'}') {
                    if !out.is_empty() {
                        self.c.expect(b',')?;
                    }
                    out.push(self.c.word()?.to_string());
                }
                AttrValue::Idents(out)
            }
            ValueKind::Computation => {
                self.c.skip_ws();
                let pos = self.c.pos;
                let name = self.c.ident()?;
                AttrValue::Computation(comp_ref(name, pos, 0))
            }
            ValueKind::Computations => {
                self.c.expect(b'{')?;
                let mut out = Vec::new();
                while !self.c.eat(b'}') {
                    if !out.is_empty() {
                        self.c.expect(b',')?;
                    }
                    self.c.skip_ws();
                    let pos = self.c.pos;
                    let name = self.c.ident()?;
                    out.push(comp_ref(name, pos, out.len()));
                }
                AttrValue::Computations(out)
            }
            ValueKind::Slice => AttrValue::Slice(self.slice_value()?),
            ValueKind::Padding => AttrValue::Padding(self.padding_value()?),
            ValueKind::Window => AttrValue::Window(Box::new(self.window_value()?)),
            ValueKind::DimLabels => AttrValue::DimLabels(Box::new(self.dim_labels()?)),
            ValueKind::ReplicaGroups => AttrValue::ReplicaGroups(Box::new(self.replica_groups()?)),
            ValueKind::Shapes => {
                self.c.expect(b'{')?;
                let mut out = Vec::new();
                while !self.c.eat(b'}') {
                    if !out.is_empty() {
                        self.c.expect(b',')?;
                    }
                    out.push(self.shape()?);
                }
                AttrValue::Shapes(out)
            }
            ValueKind::Shape => AttrValue::Shape(Box::new(self.shape()?)),
            ValueKind::Raw if key == AttrKey::Unknown => AttrValue::Unknown {
                name: key_text.to_string(),
                text: self.c.raw_value()?.to_string(),
            },
            ValueKind::Raw if key == AttrKey::Literal => {
                // custom-call's `literal=SHAPE VALUE` (spaces and commas inside),
                // checked as a literal and kept as written.
                self.c.skip_ws();
                let start = self.c.pos;
                self.shaped_literal()?;
                AttrValue::Raw(self.c.src[start..self.c.pos].into())
            }
            ValueKind::Raw => AttrValue::Raw(self.c.raw_value()?.into()),
        };
        check_value(key, &value).map_err(|m| self.err(value_pos, m))?;
        instr.attrs.push(Attribute { key, value });
        Ok(())
    }

    /// `SHAPE VALUE`, or a tuple of those in parentheses (XLA's literal
    /// with its shape, as custom-call's `literal=` writes it).
    fn shaped_literal(&mut self) -> PResult<()> {
        self.enter()?;
        let r = if self.c.eat(b'(') {
            let mut first = true;
            loop {
                if self.c.eat(b')') {
                    break Ok(());
                }
                if !first {
                    self.c.expect(b',')?;
                }
                first = false;
                self.shaped_literal()?;
            }
        } else {
            let shape = self.shape()?;
            self.literal(&shape).map(|_| ())
        };
        self.leave();
        r
    }

    fn slice_value(&mut self) -> PResult<Vec<SliceDim>> {
        self.c.expect(b'{')?;
        let mut out = Vec::new();
        while !self.c.eat(b'}') {
            if !out.is_empty() {
                self.c.expect(b',')?;
            }
            let parts = {
                self.c.expect(b'[')?;
                let mut parts = vec![self.c.int()?];
                while self.c.eat(b':') {
                    parts.push(self.c.int()?);
                }
                self.c.expect(b']')?;
                parts
            };
            let dim = match parts[..] {
                [start, limit] => SliceDim {
                    start,
                    limit,
                    stride: 1,
                },
                [start, limit, stride] => SliceDim {
                    start,
                    limit,
                    stride,
                },
                _ => return Err(self.c.expected("[start:limit] or [start:limit:stride]")),
            };
            out.push(dim);
        }
        Ok(out)
    }

    /// `lo_hi(_interior)?` joined by `x`.
    fn padding_value(&mut self) -> PResult<Vec<PaddingDim>> {
        let mut out = Vec::new();
        self.c.skip_ws();
        if !self
            .c
            .peek_raw()
            .is_some_and(|b| b.is_ascii_digit() || b == b'-')
        {
            return Ok(out);
        }
        loop {
            let low = self.c.int()?;
            self.expect_raw(b'_')?;
            let high = self.c.int()?;
            let interior = if self.c.peek_raw() == Some(b'_') {
                self.c.pos += 1;
                self.c.int()?
            } else {
                0
            };
            out.push(PaddingDim {
                low,
                high,
                interior,
            });
            if self.c.peek_raw() == Some(b'x') {
                self.c.pos += 1;
            } else {
                break;
            }
        }
        Ok(out)
    }

    /// `AxBxC` (no spaces).
    fn x_list(&mut self) -> PResult<Vec<i64>> {
        let mut out = vec![self.c.int()?];
        while self.c.peek_raw() == Some(b'x') {
            self.c.pos += 1;
            out.push(self.c.int()?);
        }
        Ok(out)
    }

    fn window_value(&mut self) -> PResult<Window> {
        self.c.expect(b'{')?;
        let mut sizes: Option<Vec<i64>> = None;
        // (key, its byte offset for errors, one (a, b) pair per window dim)
        type Field<'s> = (&'s str, usize, Vec<(i64, i64)>);
        let mut fields: Vec<Field<'a>> = Vec::new();
        while !self.c.eat(b'}') {
            let pos = self.c.pos;
            let key = self.c.ident()?;
            self.c.expect(b'=')?;
            match key {
                "size" => sizes = Some(self.x_list()?),
                "stride" | "lhs_dilate" | "rhs_dilate" | "rhs_reversal" => {
                    let v = self.x_list()?.into_iter().map(|v| (v, 0)).collect();
                    fields.push((key, pos, v));
                }
                "pad" => {
                    let pads = self.padding_value()?;
                    if pads.iter().any(|p| p.interior != 0) {
                        return Err(self.err(pos, "window padding has no interior part"));
                    }
                    fields.push((key, pos, pads.iter().map(|p| (p.low, p.high)).collect()));
                }
                other => return Err(self.err(pos, format!("unknown window field '{other}'"))),
            }
        }
        let n = sizes
            .as_ref()
            .map(Vec::len)
            .or_else(|| fields.first().map(|f| f.2.len()))
            .unwrap_or(0);
        let mut dims = vec![WindowDim::default(); n];
        if let Some(s) = sizes {
            for (d, v) in dims.iter_mut().zip(s) {
                d.size = v;
            }
        }
        for (key, pos, values) in fields {
            if values.len() != n {
                return Err(self.err(
                    pos,
                    format!(
                        "window field '{key}' has {} dimensions, expected {n}",
                        values.len()
                    ),
                ));
            }
            for (d, (a, b)) in dims.iter_mut().zip(values) {
                match key {
                    "stride" => d.stride = a,
                    "lhs_dilate" => d.lhs_dilation = a,
                    "rhs_dilate" => d.rhs_dilation = a,
                    "rhs_reversal" => d.reversal = a != 0,
                    _ => {
                        d.padding_low = a;
                        d.padding_high = b;
                    }
                }
            }
        }
        Ok(Window { dims })
    }

    fn dim_labels(&mut self) -> PResult<ConvDimensionNumbers> {
        self.c.skip_ws();
        let pos = self.c.pos;
        let start = self.c.pos;
        while self.c.peek_raw().is_some_and(|b| {
            b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'>' || b == b'?'
        }) {
            self.c.pos += 1;
        }
        let text = &self.c.src[start..self.c.pos];
        let bad = |p: &Self| {
            p.err(
                pos,
                format!("malformed dim_labels '{text}', expected e.g. b01f_01io->b01f"),
            )
        };
        let (lhs_rhs, out) = text.split_once("->").ok_or_else(|| bad(self))?;
        let (lhs, rhs) = lhs_rhs.split_once('_').ok_or_else(|| bad(self))?;
        let spatial = |labels: &str, a: char, b: char| -> Option<(i64, i64, Vec<i64>)> {
            let mut first = None;
            let mut second = None;
            let mut spatial: Vec<(u32, i64)> = Vec::new();
            for (i, ch) in labels.chars().enumerate() {
                match ch {
                    c if c == a => first = Some(i as i64),
                    c if c == b => second = Some(i as i64),
                    c if c.is_ascii_digit() => spatial.push((c.to_digit(10)?, i as i64)),
                    // A dimension the convolution does not use.
                    '?' => {}
                    _ => return None,
                }
            }
            spatial.sort();
            if spatial.iter().enumerate().any(|(i, s)| s.0 != i as u32) {
                return None;
            }
            Some((first?, second?, spatial.into_iter().map(|s| s.1).collect()))
        };
        let (ib, ifeat, isp) = spatial(lhs, 'b', 'f').ok_or_else(|| bad(self))?;
        let (ki, ko, ksp) = spatial(rhs, 'i', 'o').ok_or_else(|| bad(self))?;
        let (ob, of, osp) = spatial(out, 'b', 'f').ok_or_else(|| bad(self))?;
        if isp.len() != ksp.len() || isp.len() != osp.len() {
            return Err(bad(self));
        }
        Ok(ConvDimensionNumbers {
            input_batch: ib,
            input_feature: ifeat,
            input_spatial: isp,
            kernel_input_feature: ki,
            kernel_output_feature: ko,
            kernel_spatial: ksp,
            output_batch: ob,
            output_feature: of,
            output_spatial: osp,
        })
    }
}

/// Custom-call API versions XLA's parser takes (`API_VERSION_UNSPECIFIED`
/// is refused).
const API_VERSIONS: [&str; 4] = [
    "API_VERSION_ORIGINAL",
    "API_VERSION_STATUS_RETURNING",
    "API_VERSION_STATUS_RETURNING_UNIFIED",
    "API_VERSION_TYPED_FFI",
];

/// Checks the values whose spelling XLA's parser restricts beyond their
/// kind: the custom-call `api_version` and `result_accuracy`.
fn check_value(key: AttrKey, value: &AttrValue) -> Result<(), String> {
    match (key, value) {
        (AttrKey::ApiVersion, AttrValue::Ident(v)) if !API_VERSIONS.contains(&v.as_str()) => {
            Err(format!(
                "unknown custom-call api_version {v}, expected one of {}",
                API_VERSIONS.join(", ")
            ))
        }
        (AttrKey::ResultAccuracy, AttrValue::Raw(text)) => check_result_accuracy(text),
        _ => Ok(()),
    }
}

/// `{mode=default|highest}` or `{tolerance={atol=X,rtol=Y,ulps=Z}}` (each
/// tolerance optional).
fn check_result_accuracy(text: &str) -> Result<(), String> {
    let inner = text
        .strip_prefix('{')
        .and_then(|t| t.strip_suffix('}'))
        .ok_or_else(|| {
            format!("result_accuracy {text}: expected {{mode=...}} or {{tolerance={{...}}}}")
        })?;
    let Some((name, rest)) = inner.split_once('=') else {
        return Err(format!(
            "result_accuracy {text}: expected an attribute name (mode or tolerance)"
        ));
    };
    match name.trim() {
        "mode" => match rest.trim() {
            "default" | "highest" => Ok(()),
            other => Err(format!(
                "unknown result_accuracy mode '{other}', expected default or highest"
            )),
        },
        "tolerance" => {
            let list = rest
                .trim()
                .strip_prefix('{')
                .and_then(|t| t.strip_suffix('}'))
                .ok_or_else(|| {
                    format!(
                        "result_accuracy tolerance {rest}: expected {{atol=...,rtol=...,ulps=...}}"
                    )
                })?;
            for item in list.split(',').filter(|i| !i.trim().is_empty()) {
                let (k, v) = item.split_once('=').unwrap_or((item, ""));
                if !matches!(k.trim(), "atol" | "rtol" | "ulps") {
                    return Err(format!(
                        "invalid result_accuracy tolerance '{}', expected atol, rtol or ulps",
                        k.trim()
                    ));
                }
                if parse_f64(v.trim()).is_none() {
                    return Err(format!(
                        "result_accuracy tolerance {}: '{}' is not a number",
                        k.trim(),
                        v.trim()
                    ));
                }
            }
            Ok(())
        }
        other => Err(format!(
            "invalid result_accuracy attribute name '{other}', expected mode or tolerance"
        )),
    }
}
