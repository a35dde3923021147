//! Shapes and layouts: arrays (with dynamic dimensions and optional layouts),
//! tuples and buffer shapes, printed exactly as XLA prints them.
//!
//! Invariants: `dynamic` is either empty (all dims static) or has one entry per
//! dimension; an unbounded dynamic dimension (`?`) has size `UNBOUNDED`.

use crate::primitive_type::PrimitiveType;
use std::fmt;

/// Size recorded for an unbounded dynamic dimension (`?`).
pub const UNBOUNDED: i64 = i64::MIN;

/// One tile of a tiled layout: `T(8,128)`; `*` dimensions are stored as `i64::MIN`.
pub type Tile = Vec<i64>;

/// A layout: `{1,0:T(8,128)E(4)S(1)}`.
///
/// Invariant: `extras` is `None` or holds at least one item, so equal
/// layouts compare equal whichever way they were built.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Layout {
    pub minor_to_major: Vec<i64>,
    /// Everything beyond the dimension order, boxed: most layouts have none,
    /// and a shape is part of every instruction.
    extras: Option<Box<LayoutExtras>>,
}

/// The items of a layout after its dimension order.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
struct LayoutExtras {
    tiles: Vec<Tile>,
    element_size_in_bits: Option<i64>,
    memory_space: Option<i64>,
    /// Other layout items (`D(...)`, `L(n)`, `#(...)`, `*(...)`, `SC(...)`, `P(...)`,
    /// `M(n)`), each kept verbatim (e.g. `"L(2)"`), in the order read.
    other: Vec<String>,
}

impl Layout {
    /// The default (major-to-minor = 0..rank) layout of a rank-`rank` array.
    pub fn default_for_rank(rank: usize) -> Layout {
        Layout {
            minor_to_major: (0..rank as i64).rev().collect(),
            extras: None,
        }
    }
    /// Only a dimension order.
    pub fn is_plain(&self) -> bool {
        self.extras.is_none()
    }
    /// The tiles (`T(8,128)(2,1)`), outermost first.
    pub fn tiles(&self) -> &[Tile] {
        self.extras.as_deref().map_or(&[], |e| &e.tiles)
    }
    /// `E(bits)`.
    pub fn element_size_in_bits(&self) -> Option<i64> {
        self.extras.as_deref().and_then(|e| e.element_size_in_bits)
    }
    /// `S(space)`.
    pub fn memory_space(&self) -> Option<i64> {
        self.extras.as_deref().and_then(|e| e.memory_space)
    }
    /// The other items, verbatim, in the order read.
    pub fn other_items(&self) -> &[String] {
        self.extras.as_deref().map_or(&[], |e| &e.other)
    }
    pub fn push_tile(&mut self, tile: Tile) {
        self.extras_mut().tiles.push(tile);
    }
    pub fn set_element_size_in_bits(&mut self, bits: i64) {
        self.extras_mut().element_size_in_bits = Some(bits);
    }
    pub fn set_memory_space(&mut self, space: i64) {
        self.extras_mut().memory_space = Some(space);
    }
    /// Appends an item kept verbatim (e.g. `"L(2)"`).
    pub fn push_other_item(&mut self, item: String) {
        self.extras_mut().other.push(item);
    }
    /// The extras, created for an item about to be set.
    fn extras_mut(&mut self) -> &mut LayoutExtras {
        self.extras.get_or_insert_with(Default::default)
    }
}

/// An array shape: element type, dimensions, dynamic flags and optional layout.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ArrayShape {
    pub element_type: PrimitiveType,
    pub dims: Vec<i64>,
    /// Empty when every dimension is static; otherwise one flag per dimension.
    pub dynamic: Vec<bool>,
    pub layout: Option<Layout>,
}

impl ArrayShape {
    pub fn new(element_type: PrimitiveType, dims: Vec<i64>) -> ArrayShape {
        ArrayShape {
            element_type,
            dims,
            dynamic: Vec::new(),
            layout: None,
        }
    }
    pub fn rank(&self) -> usize {
        self.dims.len()
    }
    /// The same element type, dynamic flags and layout over `dims` (of the
    /// same rank); built field by field, so the old dims are not copied.
    pub fn with_dims(&self, dims: Vec<i64>) -> ArrayShape {
        ArrayShape {
            element_type: self.element_type,
            dims,
            dynamic: self.dynamic.clone(),
            layout: self.layout.clone(),
        }
    }
    /// A copy without the layout (the layout is not copied first).
    pub fn without_layout(&self) -> ArrayShape {
        ArrayShape {
            element_type: self.element_type,
            dims: self.dims.clone(),
            dynamic: self.dynamic.clone(),
            layout: None,
        }
    }
    pub fn is_dynamic_dim(&self, d: usize) -> bool {
        self.dynamic.get(d).copied().unwrap_or(false)
    }
    /// Number of elements like [`ArrayShape::element_count`], or `None` when
    /// a dimension is negative (other than unbounded) or the product does
    /// not fit in 63 bits.
    pub fn checked_element_count(&self) -> Option<i64> {
        self.dims.iter().try_fold(1i64, |count, &d| match d {
            UNBOUNDED => Some(0),
            d if d < 0 => None,
            d => count.checked_mul(d),
        })
    }
    /// Number of elements (dynamic dimensions count at their bound; unbounded counts 0).
    pub fn element_count(&self) -> i64 {
        self.dims
            .iter()
            .map(|&d| if d == UNBOUNDED { 0 } else { d })
            .product()
    }
}

/// An HLO shape.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Shape {
    Array(ArrayShape),
    Tuple(Vec<Shape>),
    /// `b(f32[4])`: a buffer shape wrapping an array shape.
    Buffer(Box<Shape>),
}

impl Shape {
    pub fn array(element_type: PrimitiveType, dims: impl Into<Vec<i64>>) -> Shape {
        Shape::Array(ArrayShape::new(element_type, dims.into()))
    }
    pub fn scalar(element_type: PrimitiveType) -> Shape {
        Shape::array(element_type, Vec::new())
    }
    pub fn token() -> Shape {
        Shape::scalar(PrimitiveType::Token)
    }
    pub fn tuple(elements: Vec<Shape>) -> Shape {
        Shape::Tuple(elements)
    }
    pub fn as_array(&self) -> Option<&ArrayShape> {
        match self {
            Shape::Array(a) => Some(a),
            _ => None,
        }
    }
    pub fn as_array_mut(&mut self) -> Option<&mut ArrayShape> {
        match self {
            Shape::Array(a) => Some(a),
            _ => None,
        }
    }
    pub fn is_tuple(&self) -> bool {
        matches!(self, Shape::Tuple(_))
    }
    pub fn is_array(&self) -> bool {
        matches!(self, Shape::Array(a) if a.element_type.is_array_type())
    }
    pub fn is_token(&self) -> bool {
        matches!(self, Shape::Array(a) if a.element_type == PrimitiveType::Token)
    }
    pub fn tuple_elements(&self) -> &[Shape] {
        match self {
            Shape::Tuple(e) => e,
            _ => &[],
        }
    }
    /// The element type of an array shape; `None` for tuples and buffers.
    pub fn element_type(&self) -> Option<PrimitiveType> {
        self.as_array().map(|a| a.element_type)
    }
    /// Dimensions of an array shape; empty for tuples.
    pub fn dims(&self) -> &[i64] {
        match self {
            Shape::Array(a) => &a.dims,
            Shape::Buffer(b) => b.dims(),
            Shape::Tuple(_) => &[],
        }
    }
    pub fn rank(&self) -> usize {
        self.dims().len()
    }
    /// The subshape at a tuple index path (`{}` is the shape itself).
    pub fn subshape(&self, index: &[i64]) -> Option<&Shape> {
        let mut s = self;
        for &i in index {
            s = s.tuple_elements().get(usize::try_from(i).ok()?)?;
        }
        Some(s)
    }
    /// Leaf (non-tuple) subshapes in depth-first order.
    pub fn leaves(&self) -> Vec<&Shape> {
        let mut out = Vec::new();
        fn walk<'a>(s: &'a Shape, out: &mut Vec<&'a Shape>) {
            match s {
                Shape::Tuple(e) => e.iter().for_each(|x| walk(x, out)),
                _ => out.push(s),
            }
        }
        walk(self, &mut out);
        out
    }
    /// Bytes of a dense buffer of this shape (tuples: the sum of their leaves;
    /// sub-byte types take a byte each unless the layout packs them with `E(bits)`).
    pub fn byte_size(&self) -> u64 {
        match self {
            Shape::Array(a) => {
                let element_bits = a
                    .layout
                    .as_ref()
                    .and_then(|l| l.element_size_in_bits())
                    .filter(|&b| b > 0)
                    .map(|b| b as u64)
                    .unwrap_or(a.element_type.byte_width() as u64 * 8);
                (element_bits * a.element_count().max(0) as u64).div_ceil(8)
            }
            Shape::Tuple(e) => e.iter().map(Shape::byte_size).sum(),
            Shape::Buffer(b) => b.byte_size(),
        }
    }
    /// [`Shape::byte_size`] with checked arithmetic: `None` when a dimension
    /// is negative or the size does not fit in a `u64`.
    pub fn checked_byte_size(&self) -> Option<u64> {
        match self {
            Shape::Array(a) => {
                let element_bits = a
                    .layout
                    .as_ref()
                    .and_then(|l| l.element_size_in_bits())
                    .filter(|&b| b > 0)
                    .map(|b| b as u64)
                    .unwrap_or(a.element_type.byte_width() as u64 * 8);
                let count = u64::try_from(a.checked_element_count()?).ok()?;
                Some(element_bits.checked_mul(count)?.div_ceil(8))
            }
            Shape::Tuple(e) => e
                .iter()
                .try_fold(0u64, |sum, leaf| sum.checked_add(leaf.checked_byte_size()?)),
            Shape::Buffer(b) => b.checked_byte_size(),
        }
    }
    /// Same shape ignoring layouts (XLA's `Shape::Equal().IgnoreLayout()`).
    pub fn compatible(&self, other: &Shape) -> bool {
        match (self, other) {
            (Shape::Array(a), Shape::Array(b)) => {
                a.element_type == b.element_type && a.dims == b.dims && dynamic_eq(a, b)
            }
            (Shape::Tuple(a), Shape::Tuple(b)) => {
                a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.compatible(y))
            }
            (Shape::Buffer(a), Shape::Buffer(b)) => a.compatible(b),
            _ => false,
        }
    }
    /// Same dimensions ignoring element type and layout.
    pub fn same_dimensions(&self, other: &Shape) -> bool {
        self.dims() == other.dims() && !self.is_tuple() && !other.is_tuple()
    }
    /// A copy without layouts anywhere (as entry signatures print shapes).
    pub fn without_layout(&self) -> Shape {
        match self {
            Shape::Array(a) => Shape::Array(a.without_layout()),
            Shape::Tuple(e) => Shape::Tuple(e.iter().map(Shape::without_layout).collect()),
            Shape::Buffer(b) => Shape::Buffer(Box::new(b.without_layout())),
        }
    }
    /// Returns a copy with element type replaced (arrays only).
    pub fn with_element_type(&self, ty: PrimitiveType) -> Shape {
        match self {
            Shape::Array(a) => Shape::Array(ArrayShape {
                element_type: ty,
                ..a.clone()
            }),
            other => other.clone(),
        }
    }
}

fn dynamic_eq(a: &ArrayShape, b: &ArrayShape) -> bool {
    (0..a.rank()).all(|d| a.is_dynamic_dim(d) == b.is_dynamic_dim(d))
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("{")?;
        write_joined(f, &self.minor_to_major, ",")?;
        if !self.is_plain() {
            f.write_str(":")?;
            if !self.tiles().is_empty() {
                f.write_str("T")?;
            }
            for tile in self.tiles() {
                f.write_str("(")?;
                for (i, &d) in tile.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    if d == i64::MIN {
                        f.write_str("*")?;
                    } else {
                        write!(f, "{d}")?;
                    }
                }
                f.write_str(")")?;
            }
            // XLA's order: T, then L # *, then E, S, then SC M.
            let after_memory_space = |item: &str| item.starts_with("SC") || item.starts_with('M');
            for item in self.other_items().iter().filter(|i| !after_memory_space(i)) {
                f.write_str(item)?;
            }
            if let Some(bits) = self.element_size_in_bits() {
                write!(f, "E({bits})")?;
            }
            if let Some(space) = self.memory_space() {
                write!(f, "S({space})")?;
            }
            for item in self.other_items().iter().filter(|i| after_memory_space(i)) {
                f.write_str(item)?;
            }
        }
        f.write_str("}")
    }
}

pub(crate) fn write_joined<T: fmt::Display>(
    f: &mut fmt::Formatter<'_>,
    items: &[T],
    sep: &str,
) -> fmt::Result {
    for (i, x) in items.iter().enumerate() {
        if i > 0 {
            f.write_str(sep)?;
        }
        write!(f, "{x}")?;
    }
    Ok(())
}

impl fmt::Display for ArrayShape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[", self.element_type)?;
        for (i, &d) in self.dims.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            if d == UNBOUNDED {
                f.write_str("?")?;
            } else if self.is_dynamic_dim(i) {
                write!(f, "<={d}")?;
            } else {
                write!(f, "{d}")?;
            }
        }
        f.write_str("]")?;
        if let Some(layout) = &self.layout {
            write!(f, "{layout}")?;
        }
        Ok(())
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Shape::Array(a) => write!(f, "{a}"),
            Shape::Tuple(elements) => {
                f.write_str("(")?;
                for (i, e) in elements.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                        if i % 5 == 0 {
                            write!(f, "/*index={i}*/")?;
                        }
                    }
                    write!(f, "{e}")?;
                }
                f.write_str(")")
            }
            Shape::Buffer(inner) => write!(f, "b({inner})"),
        }
    }
}
