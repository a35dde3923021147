//! Shardy (`xla.sdy.*`) annotations as JAX's default lowering writes them
//! into HLO: typed forms, their parser and their printer.
//!
//! The HLO text carries them as frontend attributes: the module's
//! `xla.sdy.meshes={mesh = #sdy.mesh<["x"=2, "y"=4]>}`, an instruction's
//! `xla.sdy.sharding="#sdy.sharding<@mesh, [{\"x\"}, {}]>"` (or
//! `#sdy.sharding_per_value<[...]>`), `xla.sdy.in_shardings`,
//! `xla.sdy.out_shardings`, `xla.sdy.manual_axes="#sdy<manual_axes{...}>"` and
//! `xla.sdy.sharding_group_id="0 : i64"`. [`FrontendAttributes`] splits the
//! `{key=value,...}` text (unquoting values); the `parse_*` functions read
//! one value; `Display` prints each form back in the same syntax.
//!
//! Grammar of a tensor sharding (Shardy's attribute syntax):
//! `<@mesh_name | mesh<...>, [dim, ...]` then optional `, replicated={axes}`
//! and `, unreduced={axes}`, then `>`; a dim is `{axis, ...}` with an
//! optional trailing `?` (open: propagation may shard it further) and an
//! optional priority suffix `pN`; an axis is `"name"` or the sub-axis
//! `"name":(pre_size)size`.
//!
//! Invariants: parsing never panics; an error carries the byte offset inside
//! the value where it was found; `parse(print(x)) == x` for every form.

use crate::mesh::AxisRef;
use std::fmt;

/// A problem in one `xla.sdy` value: what was expected, and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SdyError {
    /// Byte offset inside the attribute value.
    pub offset: usize,
    pub message: String,
}

impl fmt::Display for SdyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "at offset {}: {}", self.offset, self.message)
    }
}

/// A Shardy mesh: named axes with sizes, and the device order when it is not
/// `0..n` (a maximal mesh has no axes and one device id).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SdyMesh {
    pub axes: Vec<(String, i64)>,
    pub device_ids: Option<Vec<i64>>,
}

impl SdyMesh {
    /// The number of devices the axes span (1 for an empty or maximal mesh).
    pub fn num_devices(&self) -> i64 {
        self.axes
            .iter()
            .fold(1i64, |n, a| n.saturating_mul(a.1.max(0)))
    }

    pub fn axis_size(&self, name: &str) -> Option<i64> {
        self.axes.iter().find(|a| a.0 == name).map(|a| a.1)
    }
}

/// Which mesh a sharding refers to.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum MeshRef {
    /// `@mesh`: a mesh of the module's `xla.sdy.meshes`.
    Named(String),
    /// `mesh<[...]>` written inline.
    Inline(SdyMesh),
}

/// One dimension of a Shardy sharding.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SdyDim {
    /// Major to minor.
    pub axes: Vec<AxisRef>,
    /// `?`: propagation may shard the dimension further.
    pub open: bool,
    /// `pN`: the user priority (0 is the highest).
    pub priority: Option<i64>,
}

/// A Shardy tensor sharding.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SdySharding {
    pub mesh: MeshRef,
    pub dims: Vec<SdyDim>,
    pub replicated: Vec<AxisRef>,
    pub unreduced: Vec<AxisRef>,
}

/// A module's or instruction's `frontend_attributes={...}`, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrontendAttributes {
    pub entries: Vec<FrontendAttribute>,
}

/// One `key=value` of a frontend-attribute list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrontendAttribute {
    pub key: String,
    /// Unquoted and unescaped.
    pub value: String,
    /// Whether the text wrote the value as a `{...}` group rather than a
    /// quoted string (XLA prints the module's `xla.sdy.meshes` that way).
    pub braced: bool,
    /// Byte offset of the value inside the `{...}` text (after the quote).
    pub value_offset: usize,
}

impl FrontendAttributes {
    /// Splits `{key="value",key2={...}}`.
    pub fn parse(raw: &str) -> Result<FrontendAttributes, SdyError> {
        let mut c = Cursor::new(raw);
        c.expect("{")?;
        let mut entries = Vec::new();
        c.skip_ws();
        if c.eat("}") {
            return c.finish(FrontendAttributes { entries });
        }
        loop {
            c.skip_ws();
            let start = c.pos;
            while c
                .peek()
                .is_some_and(|b| !b"=,}".contains(&b) && !b.is_ascii_whitespace())
            {
                c.pos += 1;
            }
            if c.pos == start {
                return Err(c.error("an attribute name"));
            }
            let key = raw[start..c.pos].to_string();
            c.skip_ws();
            c.expect("=")?;
            c.skip_ws();
            let (value, braced, value_offset) = match c.peek() {
                Some(b'"') => {
                    let offset = c.pos + 1;
                    (c.quoted_string()?, false, offset)
                }
                Some(b'{') => {
                    let offset = c.pos + 1;
                    let group = c.balanced_group()?;
                    (group[1..group.len() - 1].to_string(), true, offset)
                }
                _ => {
                    let offset = c.pos;
                    let s = c.pos;
                    while c.peek().is_some_and(|b| b != b',' && b != b'}') {
                        c.pos += 1;
                    }
                    (raw[s..c.pos].trim().to_string(), false, offset)
                }
            };
            entries.push(FrontendAttribute {
                key,
                value,
                braced,
                value_offset,
            });
            c.skip_ws();
            if c.eat(",") {
                continue;
            }
            c.expect("}")?;
            return c.finish(FrontendAttributes { entries });
        }
    }

    pub fn get(&self, key: &str) -> Option<&FrontendAttribute> {
        self.entries.iter().find(|e| e.key == key)
    }

    /// Sets `key` to the quoted `value`, replacing an entry of that key.
    pub fn set(&mut self, key: &str, value: String) {
        let entry = FrontendAttribute {
            key: key.to_string(),
            value,
            braced: false,
            value_offset: 0,
        };
        match self.entries.iter_mut().find(|e| e.key == key) {
            Some(e) => *e = entry,
            None => self.entries.push(entry),
        }
    }

    /// Removes every entry whose key starts with `prefix`.
    pub fn remove_prefixed(&mut self, prefix: &str) {
        self.entries.retain(|e| !e.key.starts_with(prefix));
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

impl fmt::Display for FrontendAttributes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("{")?;
        for (i, e) in self.entries.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            if e.braced {
                write!(f, "{}={{{}}}", e.key, e.value)?;
            } else {
                write!(f, "{}=\"", e.key)?;
                for ch in e.value.chars() {
                    match ch {
                        '"' => f.write_str("\\\"")?,
                        '\\' => f.write_str("\\\\")?,
                        '\n' => f.write_str("\\n")?,
                        _ => write!(f, "{ch}")?,
                    }
                }
                f.write_str("\"")?;
            }
        }
        f.write_str("}")
    }
}

/// Parses a module's `xla.sdy.meshes` value: `name = #sdy.mesh<...>, ...`.
pub fn parse_meshes(value: &str) -> Result<Vec<(String, SdyMesh)>, SdyError> {
    let mut c = Cursor::new(value);
    let mut meshes = Vec::new();
    c.skip_ws();
    if c.at_end() {
        return Ok(meshes);
    }
    loop {
        c.skip_ws();
        let name = c.identifier("a mesh name")?;
        c.skip_ws();
        c.expect("=")?;
        c.skip_ws();
        c.expect("#sdy.mesh")?;
        let mesh = c.mesh_body()?;
        if meshes.iter().any(|(n, _): &(String, SdyMesh)| *n == name) {
            return Err(c.error_msg(format!("mesh '{name}' is defined twice")));
        }
        meshes.push((name, mesh));
        c.skip_ws();
        if c.eat(",") {
            continue;
        }
        return c.finish(meshes);
    }
}

/// Parses `#sdy.sharding<...>`.
pub fn parse_sharding(value: &str) -> Result<SdySharding, SdyError> {
    let mut c = Cursor::new(value);
    c.skip_ws();
    c.expect("#sdy.sharding")?;
    let s = c.sharding_body()?;
    c.finish(s)
}

/// Parses `#sdy.sharding_per_value<[<...>, ...]>`, one sharding per result.
pub fn parse_sharding_per_value(value: &str) -> Result<Vec<SdySharding>, SdyError> {
    let mut c = Cursor::new(value);
    c.skip_ws();
    c.expect("#sdy.sharding_per_value<")?;
    c.skip_ws();
    c.expect("[")?;
    let out = c.list("]", |c| c.sharding_body())?;
    c.skip_ws();
    c.expect(">")?;
    c.finish(out)
}

/// Parses either form: a single sharding becomes a list of one.
pub fn parse_shardings(value: &str) -> Result<Vec<SdySharding>, SdyError> {
    if value.trim_start().starts_with("#sdy.sharding_per_value") {
        parse_sharding_per_value(value)
    } else {
        parse_sharding(value).map(|s| vec![s])
    }
}

/// Parses `#sdy<manual_axes{"x", "y"}>`.
pub fn parse_manual_axes(value: &str) -> Result<Vec<String>, SdyError> {
    let mut c = Cursor::new(value);
    c.skip_ws();
    c.expect("#sdy<manual_axes{")?;
    let axes = c.list("}", |c| c.quoted_string())?;
    c.expect(">")?;
    c.finish(axes)
}

/// Parses a sharding-group id, `0 : i64`.
pub fn parse_group_id(value: &str) -> Result<i64, SdyError> {
    let mut c = Cursor::new(value);
    c.skip_ws();
    let id = c.integer()?;
    c.skip_ws();
    if c.eat(":") {
        c.skip_ws();
        c.identifier("an integer type")?;
    }
    c.finish(id)
}

/// Writes a manual-axes value back.
pub fn print_manual_axes(axes: &[String]) -> String {
    let list: Vec<String> = axes.iter().map(|a| format!("\"{a}\"")).collect();
    format!("#sdy<manual_axes{{{}}}>", list.join(", "))
}

/// Writes a sharding-per-value value back.
pub fn print_sharding_per_value(shardings: &[SdySharding]) -> String {
    let list: Vec<String> = shardings.iter().map(|s| s.body()).collect();
    format!("#sdy.sharding_per_value<[{}]>", list.join(", "))
}

/// Writes the module's meshes back (`name = #sdy.mesh<...>, ...`).
pub fn print_meshes(meshes: &[(String, SdyMesh)]) -> String {
    let list: Vec<String> = meshes
        .iter()
        .map(|(n, m)| format!("{n} = #sdy.mesh{m}"))
        .collect();
    list.join(", ")
}

impl fmt::Display for SdyMesh {
    /// The `<[...], device_ids=[...]>` part (after `#sdy.mesh` or `mesh`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let axes: Vec<String> = self
            .axes
            .iter()
            .map(|(n, s)| format!("\"{n}\"={s}"))
            .collect();
        write!(f, "<[{}]", axes.join(", "))?;
        if let Some(ids) = &self.device_ids {
            let ids: Vec<String> = ids.iter().map(|d| d.to_string()).collect();
            write!(f, ", device_ids=[{}]", ids.join(", "))?;
        }
        f.write_str(">")
    }
}

fn print_axis(a: &AxisRef) -> String {
    match a.sub_axis {
        None => format!("\"{}\"", a.name),
        Some((pre, size)) => format!("\"{}\":({pre}){size}", a.name),
    }
}

fn print_axes(axes: &[AxisRef]) -> String {
    axes.iter().map(print_axis).collect::<Vec<_>>().join(", ")
}

impl SdySharding {
    /// A sharding on `mesh` of `rank` open dimensions with no axes (says
    /// nothing; propagation may shard every dimension).
    pub fn all_open(mesh: MeshRef, rank: usize) -> SdySharding {
        SdySharding {
            mesh,
            dims: vec![
                SdyDim {
                    axes: Vec::new(),
                    open: true,
                    priority: None,
                };
                rank
            ],
            replicated: Vec::new(),
            unreduced: Vec::new(),
        }
    }

    /// The `<mesh, [dims], ...>` part shared by both spellings.
    fn body(&self) -> String {
        let mesh = match &self.mesh {
            MeshRef::Named(n) => format!("@{n}"),
            MeshRef::Inline(m) => format!("mesh{m}"),
        };
        let dims: Vec<String> = self
            .dims
            .iter()
            .map(|d| {
                let mut s = format!("{{{}", print_axes(&d.axes));
                if d.open {
                    s.push_str(if d.axes.is_empty() { "?" } else { ", ?" });
                }
                s.push('}');
                if let Some(p) = d.priority {
                    s.push_str(&format!("p{p}"));
                }
                s
            })
            .collect();
        let mut out = format!("<{mesh}, [{}]", dims.join(", "));
        if !self.replicated.is_empty() {
            out.push_str(&format!(
                ", replicated={{{}}}",
                print_axes(&self.replicated)
            ));
        }
        if !self.unreduced.is_empty() {
            out.push_str(&format!(", unreduced={{{}}}", print_axes(&self.unreduced)));
        }
        out.push('>');
        out
    }

    /// Every axis the sharding names (dims, replicated, unreduced).
    pub fn all_axes(&self) -> impl Iterator<Item = &AxisRef> {
        self.dims
            .iter()
            .flat_map(|d| d.axes.iter())
            .chain(self.replicated.iter())
            .chain(self.unreduced.iter())
    }
    /// Shardy's invariants against the mesh the sharding names: every axis
    /// is an axis of `mesh`, a sub-axis `(pre)k` fits its axis, and no axis
    /// is used twice (overlapping sub-axes count as the same). The error
    /// names the offending axis reference and the `n`-th time (from 0) it
    /// is written in the sharding, for locating it in the text.
    pub fn check_axes(&self, mesh: &SdyMesh) -> Result<(), AxisError> {
        let mut used: Vec<&AxisRef> = Vec::new();
        for a in self.all_axes() {
            let occurrence = used.iter().filter(|u| u.name == a.name).count();
            let fail = |message: String| AxisError {
                axis: a.name.clone(),
                occurrence,
                message,
            };
            let Some(size) = mesh.axis_size(&a.name) else {
                return Err(fail(format!(
                    "axis '{}' is not an axis of the mesh",
                    a.name
                )));
            };
            if let Some((pre, k)) = a.sub_axis {
                if pre < 1 || k < 2 || size % (pre * k) != 0 {
                    return Err(fail(format!(
                        "sub-axis '{}':({pre}){k} does not fit the axis of size {size}",
                        a.name
                    )));
                }
            }
            if used.iter().any(|u| {
                u.name == a.name
                    && match (u.sub_axis, a.sub_axis) {
                        (Some((p1, k1)), Some((p2, k2))) => p1 < p2 * k2 && p2 < p1 * k1,
                        _ => true,
                    }
            }) {
                return Err(fail(format!("axis '{}' is used more than once", a.name)));
            }
            used.push(a);
        }
        Ok(())
    }
}

/// A sharding that breaks one of Shardy's axis invariants.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AxisError {
    pub axis: String,
    /// How many earlier references to the same axis name the sharding has.
    pub occurrence: usize,
    pub message: String,
}

/// The byte offset in `text` of the `occurrence`-th quoted reference to
/// `axis` (`"axis"`), if there is one.
pub fn axis_offset(text: &str, axis: &str, occurrence: usize) -> Option<usize> {
    let needle = format!("\"{axis}\"");
    text.match_indices(&needle).nth(occurrence).map(|(i, _)| i)
}

impl fmt::Display for SdySharding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#sdy.sharding{}", self.body())
    }
}

/// A byte cursor over one value, with errors at its position.
struct Cursor<'a> {
    text: &'a str,
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn new(text: &'a str) -> Self {
        Cursor { text, pos: 0 }
    }

    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.pos).copied()
    }

    fn at_end(&self) -> bool {
        self.pos >= self.text.len()
    }

    fn skip_ws(&mut self) {
        while self.peek().is_some_and(|b| b.is_ascii_whitespace()) {
            self.pos += 1;
        }
    }

    fn eat(&mut self, token: &str) -> bool {
        if self.text[self.pos..].starts_with(token) {
            self.pos += token.len();
            true
        } else {
            false
        }
    }

    fn error(&self, expected: &str) -> SdyError {
        let found = match self.text[self.pos..].chars().next() {
            None => "the end of the value".to_string(),
            Some(ch) => format!("'{ch}'"),
        };
        SdyError {
            offset: self.pos,
            message: format!("expected {expected}, found {found}"),
        }
    }

    fn error_msg(&self, message: String) -> SdyError {
        SdyError {
            offset: self.pos,
            message,
        }
    }

    fn expect(&mut self, token: &str) -> Result<(), SdyError> {
        if self.eat(token) {
            Ok(())
        } else {
            Err(self.error(&format!("'{token}'")))
        }
    }

    fn finish<T>(&mut self, value: T) -> Result<T, SdyError> {
        self.skip_ws();
        if self.at_end() {
            Ok(value)
        } else {
            Err(self.error("the end of the value"))
        }
    }

    /// Comma-separated items up to `close` (already past the opening
    /// token); an empty list is just `close`.
    fn list<T>(
        &mut self,
        close: &str,
        mut item: impl FnMut(&mut Self) -> Result<T, SdyError>,
    ) -> Result<Vec<T>, SdyError> {
        let mut items = Vec::new();
        self.skip_ws();
        if self.eat(close) {
            return Ok(items);
        }
        loop {
            self.skip_ws();
            items.push(item(self)?);
            self.skip_ws();
            if !self.eat(",") {
                self.expect(close)?;
                return Ok(items);
            }
        }
    }

    fn identifier(&mut self, what: &str) -> Result<String, SdyError> {
        let start = self.pos;
        while self
            .peek()
            .is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.' || b == b'-')
        {
            self.pos += 1;
        }
        if self.pos == start {
            return Err(self.error(what));
        }
        Ok(self.text[start..self.pos].to_string())
    }

    fn integer(&mut self) -> Result<i64, SdyError> {
        let start = self.pos;
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        while self.peek().is_some_and(|b| b.is_ascii_digit()) {
            self.pos += 1;
        }
        self.text[start..self.pos].parse::<i64>().map_err(|_| {
            self.pos = start;
            self.error("an integer")
        })
    }

    /// `"..."` with `\"` and `\\` escapes; returns the unescaped text.
    fn quoted_string(&mut self) -> Result<String, SdyError> {
        self.expect("\"")?;
        let mut out = String::new();
        loop {
            let rest = &self.text[self.pos..];
            let mut chars = rest.chars();
            match chars.next() {
                None => return Err(self.error("a closing '\"'")),
                Some('"') => {
                    self.pos += 1;
                    return Ok(out);
                }
                Some('\\') => match chars.next() {
                    Some(e @ ('"' | '\\')) => {
                        out.push(e);
                        self.pos += 2;
                    }
                    Some('n') => {
                        out.push('\n');
                        self.pos += 2;
                    }
                    _ => return Err(self.error("an escape (\\\" \\\\ \\n)")),
                },
                Some(ch) => {
                    out.push(ch);
                    self.pos += ch.len_utf8();
                }
            }
        }
    }

    /// A `{...}` group with nested braces and quoted strings; returns it
    /// with its braces.
    fn balanced_group(&mut self) -> Result<&'a str, SdyError> {
        let start = self.pos;
        let mut depth = 0usize;
        let bytes = self.text.as_bytes();
        while self.pos < bytes.len() {
            match bytes[self.pos] {
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        self.pos += 1;
                        return Ok(&self.text[start..self.pos]);
                    }
                }
                b'"' => {
                    self.quoted_string()?;
                    continue;
                }
                _ => {}
            }
            self.pos += 1;
        }
        self.pos = start;
        Err(self.error("a '{...}' group closed by '}'"))
    }

    /// `<["x"=2, ...], device_ids=[...]>`.
    fn mesh_body(&mut self) -> Result<SdyMesh, SdyError> {
        self.expect("<")?;
        self.skip_ws();
        self.expect("[")?;
        let axes: Vec<(String, i64, usize)> = self.list("]", |c| {
            let at = c.pos;
            let name = c.quoted_string()?;
            c.skip_ws();
            c.expect("=")?;
            c.skip_ws();
            let size = c.integer()?;
            if size < 1 {
                return Err(SdyError {
                    offset: at,
                    message: format!("mesh axis '{name}' has size {size}; sizes are positive"),
                });
            }
            Ok((name, size, at))
        })?;
        for (i, (name, _, at)) in axes.iter().enumerate() {
            if axes[..i].iter().any(|a| a.0 == *name) {
                return Err(SdyError {
                    offset: *at,
                    message: format!("mesh axis '{name}' is named twice"),
                });
            }
        }
        let axes: Vec<(String, i64)> = axes.into_iter().map(|(n, s, _)| (n, s)).collect();
        self.skip_ws();
        let mut device_ids = None;
        if self.eat(",") {
            self.skip_ws();
            self.expect("device_ids")?;
            self.skip_ws();
            self.expect("=")?;
            self.skip_ws();
            self.expect("[")?;
            device_ids = Some(self.list("]", |c| c.integer())?);
            self.skip_ws();
        }
        self.expect(">")?;
        Ok(SdyMesh { axes, device_ids })
    }

    fn axis_ref(&mut self) -> Result<AxisRef, SdyError> {
        let name = self.quoted_string()?;
        let mut sub_axis = None;
        if self.eat(":") {
            self.expect("(")?;
            let pre = self.integer()?;
            self.expect(")")?;
            let size = self.integer()?;
            sub_axis = Some((pre, size));
        }
        Ok(AxisRef { name, sub_axis })
    }

    fn axis_list(&mut self) -> Result<Vec<AxisRef>, SdyError> {
        self.expect("{")?;
        self.list("}", |c| c.axis_ref())
    }

    fn dim(&mut self) -> Result<SdyDim, SdyError> {
        self.expect("{")?;
        let mut axes = Vec::new();
        let mut open = false;
        self.skip_ws();
        if self.eat("?") {
            open = true;
            self.skip_ws();
            self.expect("}")?;
        } else if !self.eat("}") {
            loop {
                self.skip_ws();
                if self.eat("?") {
                    open = true;
                    self.skip_ws();
                    self.expect("}")?;
                    break;
                }
                axes.push(self.axis_ref()?);
                self.skip_ws();
                if self.eat(",") {
                    continue;
                }
                self.expect("}")?;
                break;
            }
        }
        let mut priority = None;
        if self.eat("p") {
            priority = Some(self.integer()?);
        }
        Ok(SdyDim {
            axes,
            open,
            priority,
        })
    }

    /// `<@mesh | mesh<...>, [dims], replicated={...}, unreduced={...}>`.
    fn sharding_body(&mut self) -> Result<SdySharding, SdyError> {
        self.expect("<")?;
        self.skip_ws();
        let mesh = if self.eat("@") {
            MeshRef::Named(self.identifier("a mesh name")?)
        } else if self.eat("mesh") {
            MeshRef::Inline(self.mesh_body()?)
        } else {
            return Err(self.error("'@mesh_name' or an inline 'mesh<...>'"));
        };
        self.skip_ws();
        self.expect(",")?;
        self.skip_ws();
        self.expect("[")?;
        let dims = self.list("]", |c| c.dim())?;
        let mut replicated = Vec::new();
        let mut unreduced = Vec::new();
        loop {
            self.skip_ws();
            if !self.eat(",") {
                break;
            }
            self.skip_ws();
            if self.eat("replicated") {
                self.skip_ws();
                self.expect("=")?;
                self.skip_ws();
                replicated = self.axis_list()?;
            } else if self.eat("unreduced") {
                self.skip_ws();
                self.expect("=")?;
                self.skip_ws();
                unreduced = self.axis_list()?;
            } else {
                return Err(self.error("'replicated=' or 'unreduced='"));
            }
        }
        self.expect(">")?;
        Ok(SdySharding {
            mesh,
            dims,
            replicated,
            unreduced,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frontend_attributes_split_and_print_back() {
        let raw = r##"{xla.sdy.in_shardings="#sdy.sharding_per_value<[<@mesh, [{\"x\", ?}, {?}]>]>",xla.sdy.manual_axes="#sdy<manual_axes{\"x\"}>"}"##;
        let fa = FrontendAttributes::parse(raw).unwrap();
        assert_eq!(fa.entries.len(), 2);
        assert_eq!(
            fa.get("xla.sdy.manual_axes").unwrap().value,
            "#sdy<manual_axes{\"x\"}>"
        );
        assert_eq!(fa.to_string(), raw);
        let module = r##"{xla.sdy.meshes={mesh = #sdy.mesh<["x"=2, "y"=4]>}}"##;
        let fa = FrontendAttributes::parse(module).unwrap();
        assert!(fa.entries[0].braced);
        assert_eq!(fa.to_string(), module);
    }

    #[test]
    fn shardings_round_trip() {
        for text in [
            "#sdy.sharding<@mesh, [{\"x\"}, {}]>",
            "#sdy.sharding<@mesh, [{\"x\", ?}, {?}]>",
            "#sdy.sharding<@mesh, [{\"x\":(1)2, \"y\"}p1, {}p0], replicated={\"z\"}>",
            "#sdy.sharding<@mesh, [{}], unreduced={\"y\"}>",
            "#sdy.sharding<mesh<[\"a\"=4], device_ids=[3, 2, 1, 0]>, [{\"a\"}]>",
            "#sdy.sharding<@maximal_mesh_0, []>",
        ] {
            let s = parse_sharding(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(s.to_string(), text);
        }
        let pv = "#sdy.sharding_per_value<[<@mesh, [{\"x\"}]>, <@mesh, []>]>";
        assert_eq!(
            print_sharding_per_value(&parse_sharding_per_value(pv).unwrap()),
            pv
        );
        let meshes =
            "mesh = #sdy.mesh<[\"x\"=2, \"y\"=4]>, maximal_mesh_0 = #sdy.mesh<[], device_ids=[3]>";
        assert_eq!(print_meshes(&parse_meshes(meshes).unwrap()), meshes);
        assert_eq!(
            parse_manual_axes("#sdy<manual_axes{\"x\", \"y\"}>").unwrap(),
            vec!["x", "y"]
        );
        assert_eq!(parse_group_id("3 : i64").unwrap(), 3);
    }

    #[test]
    fn errors_say_where_and_what() {
        let e = parse_sharding("#sdy.sharding<@mesh, [{\"x\"}, {]>").unwrap_err();
        assert_eq!(e.offset, 30);
        assert!(e.message.contains("expected"), "{e}");
        let e = parse_meshes("mesh = #sdy.mesh<[\"x\"=2, \"x\"=4]>").unwrap_err();
        assert!(e.message.contains("named twice"), "{e}");
        assert!(FrontendAttributes::parse("{a=\"x\"").is_err());
        assert!(parse_sharding("#sdy.sharding<@mesh, [{\"x\":(1}]>").is_err());
    }
}
