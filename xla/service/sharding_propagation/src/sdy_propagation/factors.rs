//! One propagation step through one op, as Shardy's aggressive factor
//! propagation does it: project every tensor's sharding onto the op's
//! factors, find per factor the axes all tensors agree on (the longest
//! common prefix; a tensor whose axes extend it lets it grow unless the
//! direction forbids), order the factors by their source (the largest
//! tensor already sharded that way first), and give each tensor the new
//! axes of each factor it holds where its dimension is open, the axes are
//! not used by another of its factors, and the size divides the factor
//! (the minor-most factor of a dimension may be padded).
//!
//! Where only part of an axis fits a factor (a reshape splitting a dim
//! sharded on `"x"=4` into 2 x 4), the axis is split into sub-axes
//! (`"x":(1)2` and `"x":(2)2`), and consecutive sub-axes are merged back
//! when a dimension is rebuilt.
//!
//! Invariants: closed dimensions never change; a tensor's axes only grow
//! (the old axes stay a prefix); no axis is used twice in one tensor.

use super::rules::{gcd, Rule};
use xla_hlo_ir::mesh::AxisRef;
use xla_hlo_ir::sdy::{SdyDim, SdyMesh, SdySharding};

/// Which way along a factor propagation may go (bit flags).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Direction(u8);

impl Direction {
    pub const NONE: Direction = Direction(0);
    pub const FORWARD: Direction = Direction(1);
    pub const BACKWARD: Direction = Direction(2);
    pub const BOTH: Direction = Direction(3);

    pub fn union(self, other: Direction) -> Direction {
        Direction(self.0 | other.0)
    }
    pub fn intersection(self, other: Direction) -> Direction {
        Direction(self.0 & other.0)
    }
}

/// An axis or sub-axis of the step's mesh, by the axis's index in
/// `MeshAxes`: it covers the axis's devices `pre .. pre * size` (the whole
/// axis when `pre == 1` and `size` is the axis's size). Copy, so a step
/// moves axes around without allocating.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Axis {
    index: usize,
    pre: i64,
    size: i64,
}

/// The axes a step's shardings name: the mesh's, then any name the mesh
/// lacks (`extra`, size 1; the export reports such a name as an error).
struct MeshAxes<'a> {
    mesh: &'a SdyMesh,
    extra: Vec<&'a str>,
}

impl<'a> MeshAxes<'a> {
    fn new(mesh: &'a SdyMesh) -> Self {
        MeshAxes {
            mesh,
            extra: Vec::new(),
        }
    }

    fn name(&self, index: usize) -> &'a str {
        match self.mesh.axes.get(index) {
            Some((name, _)) => name,
            None => self.extra[index - self.mesh.axes.len()],
        }
    }

    fn size(&self, index: usize) -> i64 {
        self.mesh.axes.get(index).map_or(1, |(_, size)| *size)
    }

    fn axis(&mut self, axis: &'a AxisRef) -> Axis {
        let known = self.mesh.axes.len();
        let index = match self.mesh.axes.iter().position(|(n, _)| *n == axis.name) {
            Some(i) => i,
            None => match self.extra.iter().position(|n| *n == axis.name) {
                Some(j) => known + j,
                None => {
                    self.extra.push(&axis.name);
                    known + self.extra.len() - 1
                }
            },
        };
        let (pre, size) = axis.sub_axis.unwrap_or((1, self.size(index)));
        Axis { index, pre, size }
    }

    fn to_ref(&self, axis: Axis) -> AxisRef {
        let whole = axis.pre == 1 && axis.size == self.size(axis.index);
        AxisRef {
            name: self.name(axis.index).to_string(),
            sub_axis: (!whole).then_some((axis.pre, axis.size)),
        }
    }
}

/// One tensor's sharding along one factor.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct FactorSharding {
    axes: Vec<Axis>,
    closed: bool,
    /// Axes of the dimension that do not fit this (or an earlier) factor.
    overflow: Vec<Axis>,
    minor_most: bool,
    /// A more major factor of the same dimension is not fully sharded, so
    /// this one cannot be (a dimension's axes fill its factors major first).
    after_partial_major: bool,
}

/// One tensor seen through the op's factors.
#[derive(Clone, Debug, Default)]
struct TensorFactors {
    /// Indexed by factor; `None` where the tensor does not hold the factor.
    factors: Vec<Option<FactorSharding>>,
    replicated: Vec<Axis>,
    unreduced: Vec<Axis>,
    /// Whether the tensor's sharding may be a source (constants are only
    /// targets, as after Shardy's constant splitting).
    is_source: bool,
}

/// The op's tensors, each with its sharding and whether it may be a
/// source: operands (as many as the rule has), then results.
pub(crate) struct StepInput<'a> {
    pub rule: &'a Rule,
    pub mesh: &'a SdyMesh,
    pub tensors: &'a [(Option<&'a SdySharding>, bool)],
    pub is_elementwise: bool,
}

/// Buffers a step fills and the next step reuses (most steps change
/// nothing; their cost is projecting the tensors).
#[derive(Default)]
pub(crate) struct StepScratch {
    operands: Vec<TensorFactors>,
    results: Vec<TensorFactors>,
    axes_per_factor: Vec<Vec<Axis>>,
}

/// `tensors` with exactly `count` entries (their contents are rewritten).
fn reuse(tensors: &mut Vec<TensorFactors>, count: usize) {
    tensors.truncate(count);
    tensors.resize_with(count, TensorFactors::default);
}

/// Splits `axis` into its major part of `size` and the rest.
fn split_axis(axis: Axis, size: i64) -> (Axis, Axis) {
    (
        Axis {
            index: axis.index,
            pre: axis.pre,
            size,
        },
        Axis {
            index: axis.index,
            pre: axis.pre * size,
            size: axis.size / size,
        },
    )
}

fn overlaps(a: Axis, b: Axis) -> bool {
    a.index == b.index && a.pre < b.pre * b.size && b.pre < a.pre * a.size
}

/// Merges consecutive sub-axes of one axis (`"x":(1)2, "x":(2)2` is `"x"`).
fn merge_sub_axes(axes: Vec<Axis>) -> Vec<Axis> {
    let mut out: Vec<Axis> = Vec::with_capacity(axes.len());
    for a in axes {
        if let Some(last) = out.last_mut() {
            if last.index == a.index && a.pre == last.pre * last.size {
                last.size *= a.size;
                continue;
            }
        }
        out.push(a);
    }
    out
}

/// Writes into `out` the tensor's sharding seen through its factors.
fn project<'a>(
    out: &mut TensorFactors,
    mapping: &[Vec<usize>],
    sharding: Option<&'a SdySharding>,
    rule: &Rule,
    axes_table: &mut MeshAxes<'a>,
    is_source: bool,
) {
    let factors = &mut out.factors;
    factors.clear();
    factors.resize(rule.factors.len(), None);
    for (d, dim_factors) in mapping.iter().enumerate() {
        let dim = sharding.and_then(|s| s.dims.get(d));
        let closed = dim.is_some_and(|d| !d.open);
        let axes: &[AxisRef] = dim.map(|d| d.axes.as_slice()).unwrap_or(&[]);
        for (k, &f) in dim_factors.iter().enumerate() {
            factors[f] = Some(FactorSharding {
                axes: Vec::new(),
                closed,
                overflow: Vec::new(),
                minor_most: k + 1 == dim_factors.len(),
                after_partial_major: false,
            });
        }
        let mut k = 0usize;
        let mut remaining = dim_factors
            .first()
            .map(|&f| rule.factors[f].size)
            .unwrap_or(1);
        let mut pending = axes.iter();
        // The minor part of an axis split across two factors, taken next.
        let mut carried: Option<Axis> = None;
        loop {
            let axis = match carried.take() {
                Some(a) => a,
                None => match pending.next() {
                    Some(a) => axes_table.axis(a),
                    None => break,
                },
            };
            let size = axis.size;
            while k + 1 < dim_factors.len() && remaining == 1 {
                k += 1;
                remaining = rule.factors[dim_factors[k]].size;
            }
            let Some(&f) = dim_factors.get(k) else {
                break;
            };
            let slot = factors[f].as_mut().expect("set above");
            let g = gcd(remaining, size);
            if remaining % size == 0 {
                slot.axes.push(axis);
                remaining /= size;
            } else if k + 1 == dim_factors.len() {
                slot.axes.push(axis);
                remaining = 1;
            } else if g > 1 {
                let (major, minor) = split_axis(axis, g);
                slot.axes.push(major);
                remaining = 1;
                carried = Some(minor);
            } else {
                slot.overflow.push(axis);
                for a in pending.by_ref() {
                    let a = axes_table.axis(a);
                    slot.overflow.push(a);
                }
                break;
            }
        }
        let mut partial = false;
        for &f in dim_factors {
            let slot = factors[f].as_mut().expect("set above");
            slot.after_partial_major = partial;
            let sharded: i64 = slot.axes.iter().map(|a| a.size).product();
            partial |= sharded < rule.factors[f].size;
        }
    }
    out.replicated.clear();
    out.unreduced.clear();
    if let Some(s) = sharding {
        out.replicated
            .extend(s.replicated.iter().map(|a| axes_table.axis(a)));
        out.unreduced
            .extend(s.unreduced.iter().map(|a| axes_table.axis(a)));
    }
    out.is_source = is_source;
}

/// The common prefix of `axes` and `new`, and whether the result may still
/// grow (Shardy's compatible major axes, without sub-axes).
fn compatible(axes: &mut Vec<Axis>, new: &[Axis], can_expand: bool) -> bool {
    let common = axes.iter().zip(new).take_while(|(a, b)| a == b).count();
    if common < axes.len().min(new.len()) {
        axes.truncate(common);
        return false;
    }
    if new.len() > axes.len() && can_expand {
        axes.clear();
        axes.extend_from_slice(new);
    }
    can_expand
}

/// Writes into `axes` the axes the tensors agree on for `factor`.
fn compatible_major_axes(
    operands: &[TensorFactors],
    results: &[TensorFactors],
    factor: usize,
    direction: Direction,
    axes: &mut Vec<Axis>,
) {
    axes.clear();
    if direction == Direction::NONE {
        return;
    }
    let (first, second) = if direction == Direction::BACKWARD {
        (results, operands)
    } else {
        (operands, results)
    };
    let mut can_expand = true;
    let fold = |tensors: &[TensorFactors], axes: &mut Vec<Axis>, can_expand: &mut bool| {
        for t in tensors.iter().filter(|t| t.is_source) {
            if let Some(fs) = &t.factors[factor] {
                *can_expand = compatible(axes, &fs.axes, *can_expand);
            }
        }
    };
    fold(first, axes, &mut can_expand);
    if direction != Direction::BOTH {
        can_expand = false;
    }
    fold(second, axes, &mut can_expand);
}

/// Keeps the longest prefix of `axes` that `accept` takes whole; the first
/// axis it replaces (or refuses) ends the list.
fn truncate(axes: &mut Vec<Axis>, mut accept: impl FnMut(Axis, i64) -> Option<Axis>) {
    let mut previous = 1i64;
    for i in 0..axes.len() {
        match accept(axes[i], previous) {
            None => {
                axes.truncate(i);
                return;
            }
            Some(a) if a != axes[i] => {
                axes[i] = a;
                axes.truncate(i + 1);
                return;
            }
            Some(a) => previous *= a.size,
        }
    }
}

/// `axis` if this tensor's factor can take it after `previous` (the size of
/// the axes before it), else what of the factor's current axes it keeps.
fn fits_within_factor(
    axis: Axis,
    tensor: &TensorFactors,
    fs: &FactorSharding,
    previous: i64,
    factor_size: i64,
) -> Option<Axis> {
    if tensor
        .replicated
        .iter()
        .chain(&tensor.unreduced)
        .any(|&r| overlaps(r, axis))
    {
        return None;
    }
    if fs.axes.contains(&axis) {
        return Some(axis);
    }
    if !fs.closed && fs.overflow.is_empty() {
        if fs.minor_most {
            return Some(axis);
        }
        if factor_size % previous == 0 {
            let g = gcd(factor_size / previous, axis.size);
            if g == axis.size {
                return Some(axis);
            }
            if g > 1 {
                return Some(split_axis(axis, g).0);
            }
        }
    }
    None
}

fn free_across_factors(axis: Axis, tensor: &TensorFactors, factor: usize) -> Option<Axis> {
    let used = tensor
        .factors
        .iter()
        .enumerate()
        .filter(|(f, _)| *f != factor)
        .filter_map(|(_, fs)| fs.as_ref())
        .any(|fs| {
            fs.axes
                .iter()
                .chain(&fs.overflow)
                .any(|&a| overlaps(a, axis))
        });
    (!used).then_some(axis)
}

fn is_strict_prefix(prefix: &[Axis], axes: &[Axis]) -> bool {
    prefix.len() < axes.len() && axes.starts_with(prefix)
}

/// One step through the op; `direction(f)` says where factor `f` may go.
/// Pushes onto `changed` each tensor whose sharding changed (its index in
/// `input.tensors`) with its new sharding.
pub(crate) fn propagate_step(
    input: &StepInput<'_>,
    mesh_ref: &xla_hlo_ir::sdy::MeshRef,
    direction: impl Fn(usize) -> Direction,
    changed: &mut Vec<(usize, SdySharding)>,
    scratch: &mut StepScratch,
) {
    let rule = input.rule;
    let (operand_inputs, result_inputs) = input.tensors.split_at(rule.operands.len());
    let mut axes_table = MeshAxes::new(input.mesh);
    let StepScratch {
        operands,
        results,
        axes_per_factor,
    } = scratch;
    reuse(operands, rule.operands.len());
    for ((out, m), &(s, src)) in operands.iter_mut().zip(&rule.operands).zip(operand_inputs) {
        project(out, m, s, rule, &mut axes_table, src);
    }
    reuse(results, rule.results.len());
    for ((out, m), &(s, src)) in results.iter_mut().zip(&rule.results).zip(result_inputs) {
        project(out, m, s, rule, &mut axes_table, src);
    }
    axes_per_factor.resize_with(rule.factors.len().max(axes_per_factor.len()), Vec::new);
    let axes_per_factor = &mut axes_per_factor[..rule.factors.len()];
    for (f, axes) in axes_per_factor.iter_mut().enumerate() {
        let dir = if rule.factors[f].blocked {
            Direction::NONE
        } else {
            direction(f)
        };
        compatible_major_axes(operands, results, f, dir, axes);
    }
    let axes_per_factor = &*axes_per_factor;
    if axes_per_factor.iter().all(|a| a.is_empty()) {
        return;
    }
    // The source of each factor: the largest tensor whose axes extend the
    // agreed ones.
    let mut source: Vec<(i64, usize)> = vec![(-1, usize::MAX); rule.factors.len()];
    for (ti, t) in operands.iter().chain(results.iter()).enumerate() {
        let size: i64 = t
            .factors
            .iter()
            .enumerate()
            .filter(|(_, fs)| fs.is_some())
            .map(|(f, _)| rule.factors[f].size)
            .product();
        for (f, fs) in t.factors.iter().enumerate() {
            let Some(fs) = fs else { continue };
            if !axes_per_factor[f].is_empty()
                && fs.axes.starts_with(&axes_per_factor[f])
                && size > source[f].0
            {
                source[f] = (size, ti);
            }
        }
    }
    let total = |axes: &[Axis]| axes.iter().map(|a| a.size).product::<i64>();
    let mut order: Vec<usize> = (0..rule.factors.len()).collect();
    order.sort_by_key(|&f| {
        let sharded = if input.is_elementwise {
            total(&axes_per_factor[f])
        } else {
            0
        };
        (-source[f].0, -sharded, source[f].1, f)
    });
    let update =
        |tensor: &mut TensorFactors, f: usize, results: Option<&[TensorFactors]>| -> bool {
            let Some(fs) = &tensor.factors[f] else {
                return false;
            };
            if fs.after_partial_major {
                return false;
            }
            let mut new = axes_per_factor[f].clone();
            let size = rule.factors[f].size;
            truncate(&mut new, |a, prev| {
                fits_within_factor(a, tensor, fs, prev, size)
            });
            if !is_strict_prefix(&fs.axes, &new) {
                return false;
            }
            truncate(&mut new, |a, _| free_across_factors(a, tensor, f));
            if let Some(results) = results {
                for r in results {
                    if let Some(rf) = &r.factors[f] {
                        if is_strict_prefix(&rf.axes, &new) {
                            new.clone_from(&rf.axes);
                        }
                    }
                }
            }
            if !is_strict_prefix(&fs.axes, &new) {
                return false;
            }
            tensor.factors[f].as_mut().expect("checked").axes = new;
            true
        };
    let mut result_changed = vec![false; results.len()];
    for (ti, t) in results.iter_mut().enumerate() {
        for &f in &order {
            if !axes_per_factor[f].is_empty() {
                result_changed[ti] |= update(t, f, None);
            }
        }
    }
    let mut operand_changed = vec![false; operands.len()];
    for (ti, t) in operands.iter_mut().enumerate() {
        for &f in &order {
            if !axes_per_factor[f].is_empty() {
                let rs = input.is_elementwise.then_some(results.as_slice());
                operand_changed[ti] |= update(t, f, rs);
            }
        }
    }
    for (ti, t) in operands.iter().enumerate() {
        if operand_changed[ti] {
            changed.push((
                ti,
                unproject(
                    &rule.operands[ti],
                    t,
                    operand_inputs[ti].0,
                    &axes_table,
                    mesh_ref,
                ),
            ));
        }
    }
    for (ti, t) in results.iter().enumerate() {
        if result_changed[ti] {
            changed.push((
                operands.len() + ti,
                unproject(
                    &rule.results[ti],
                    t,
                    result_inputs[ti].0,
                    &axes_table,
                    mesh_ref,
                ),
            ));
        }
    }
}

/// The tensor sharding of the updated factors (dims keep their open/closed
/// state; a tensor without a sharding starts all open).
fn unproject(
    mapping: &[Vec<usize>],
    tensor: &TensorFactors,
    old: Option<&SdySharding>,
    axes_table: &MeshAxes<'_>,
    mesh_ref: &xla_hlo_ir::sdy::MeshRef,
) -> SdySharding {
    let dims = mapping
        .iter()
        .enumerate()
        .map(|(d, factors)| {
            let old_dim = old.and_then(|s| s.dims.get(d));
            let mut axes = Vec::new();
            let mut overflow = Vec::new();
            for &f in factors {
                if let Some(fs) = &tensor.factors[f] {
                    axes.extend_from_slice(&fs.axes);
                    overflow.extend_from_slice(&fs.overflow);
                }
            }
            axes.extend(overflow);
            SdyDim {
                axes: merge_sub_axes(axes)
                    .into_iter()
                    .map(|a| axes_table.to_ref(a))
                    .collect(),
                open: old_dim.is_none_or(|d| d.open),
                priority: old_dim.and_then(|d| d.priority),
            }
        })
        .collect();
    SdySharding {
        mesh: old
            .map(|s| s.mesh.clone())
            .unwrap_or_else(|| mesh_ref.clone()),
        dims,
        replicated: old.map(|s| s.replicated.clone()).unwrap_or_default(),
        unreduced: old.map(|s| s.unreduced.clone()).unwrap_or_default(),
    }
}
