//! Shardy-style sharding rules for HLO instructions: each op's dimensions
//! as factors shared between its operands and results (a factor is one
//! index space of the computation: a dot's batch, lhs, rhs and contracting
//! dims are four factors). A dimension may hold several factors, major to
//! minor (a reshape that merges or splits dimensions), and a factor may
//! appear in only some tensors (a contracting dim is in both operands and
//! not in the result).
//!
//! Factors are pass-through (the same index on every tensor holding it) or
//! not (reduction, permutation or need-replication factors, which Shardy
//! propagates later than pass-through ones); a blocked factor is never
//! propagated along.
//!
//! Invariants: every factor index in a tensor mapping is below
//! `factors.len()`; a tensor mapping has one entry per dimension of its
//! tensor; an op with no rule (`None`) is not propagated through.

use rustc_hash::{FxHashMap, FxHashSet};
use std::rc::Rc;
use xla_hlo_ir::{AttrKey, HloInstruction, Opcode};

/// One factor of a rule.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Factor {
    pub size: i64,
    pub pass_through: bool,
    pub blocked: bool,
}

/// Per dimension of one tensor, its factors major to minor.
pub(crate) type TensorMapping = Vec<Vec<usize>>;

/// An op's sharding rule.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct Rule {
    pub factors: Vec<Factor>,
    pub operands: Vec<TensorMapping>,
    pub results: Vec<TensorMapping>,
}

/// The rules of a module's ops, each distinct rule stored once (a model
/// repeats its layers), and a memo of `rule_of` for the opcodes whose rule
/// is a function of the tensors' dims and the `dimensions` attribute alone.
#[derive(Default)]
pub(crate) struct RuleCache {
    interned: FxHashSet<Rc<Rule>>,
    /// Key (`memo_key`) -> the rule (`None`: the op has none).
    by_key: FxHashMap<Vec<i64>, Option<Rc<Rule>>>,
    /// The key being looked up (reused, so that a hit allocates nothing).
    key: Vec<i64>,
}

impl RuleCache {
    /// The shared copy of `rule`.
    pub fn intern(&mut self, rule: Rule) -> Rc<Rule> {
        if let Some(shared) = self.interned.get(&rule) {
            return shared.clone();
        }
        let shared = Rc::new(rule);
        self.interned.insert(shared.clone());
        shared
    }

    /// `rule_of(instr, operands, results)`, shared.
    pub fn rule(
        &mut self,
        instr: &HloInstruction,
        operands: &[&[i64]],
        results: &[&[i64]],
    ) -> Option<Rc<Rule>> {
        let mut key = std::mem::take(&mut self.key);
        let memoizable = memo_key(instr, operands, results, &mut key);
        if memoizable {
            if let Some(hit) = self.by_key.get(key.as_slice()) {
                let hit = hit.clone();
                self.key = key;
                return hit;
            }
        }
        let rule = rule_of(instr, operands, results).map(|r| self.intern(r));
        if memoizable {
            self.by_key.insert(key.clone(), rule.clone());
        }
        self.key = key;
        rule
    }
}

/// Writes into `key` what `rule_of` reads of `instr` and its tensors when
/// that is the opcode, the dims and the `dimensions` attribute only (then
/// returns true; false for the other opcodes).
fn memo_key(
    instr: &HloInstruction,
    operands: &[&[i64]],
    results: &[&[i64]],
    key: &mut Vec<i64>,
) -> bool {
    let op = instr.opcode;
    let memoizable = op.is_elementwise()
        || matches!(
            op,
            Opcode::AllReduce
                | Opcode::CollectivePermute
                | Opcode::OptimizationBarrier
                | Opcode::Broadcast
                | Opcode::Transpose
                | Opcode::Reshape
                | Opcode::Reduce
                | Opcode::Slice
                | Opcode::Pad
                | Opcode::DynamicSlice
                | Opcode::DynamicUpdateSlice
                | Opcode::Concatenate
                | Opcode::Reverse
                | Opcode::Sort
        );
    if !memoizable {
        return false;
    }
    key.clear();
    key.push(op as i64);
    for list in [operands, results] {
        key.push(list.len() as i64);
        for dims in list {
            key.push(dims.len() as i64);
            key.extend_from_slice(dims);
        }
    }
    let attribute = instr.dimensions();
    key.push(attribute.len() as i64);
    key.extend_from_slice(attribute);
    true
}

/// Which kind of factor to add.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    PassThrough,
    Other,
    Blocked,
}

/// Builds a rule for tensors of the given ranks.
struct Builder {
    rule: Rule,
}

impl Builder {
    fn new(operand_ranks: &[usize], result_ranks: &[usize]) -> Builder {
        Builder {
            rule: Rule {
                factors: Vec::new(),
                operands: operand_ranks.iter().map(|&r| vec![Vec::new(); r]).collect(),
                results: result_ranks.iter().map(|&r| vec![Vec::new(); r]).collect(),
            },
        }
    }

    /// Adds a factor of `size` held by dimension `operand_dims[i]` of operand
    /// `i` and `result_dims[j]` of result `j` (`None`: not held).
    fn add(
        &mut self,
        operand_dims: &[Option<usize>],
        result_dims: &[Option<usize>],
        size: i64,
        kind: Kind,
    ) {
        let index = self.rule.factors.len();
        self.rule.factors.push(Factor {
            size,
            pass_through: kind == Kind::PassThrough,
            blocked: kind == Kind::Blocked,
        });
        for (mapping, dim) in self.rule.operands.iter_mut().zip(operand_dims) {
            if let Some(d) = *dim {
                mapping[d].push(index);
            }
        }
        for (mapping, dim) in self.rule.results.iter_mut().zip(result_dims) {
            if let Some(d) = *dim {
                mapping[d].push(index);
            }
        }
    }

    fn build(self) -> Rule {
        self.rule
    }
}

/// The rule of `instr` given its operand shapes (dims) and result value
/// shapes (one per value: a tuple-shaped op has one per element), or
/// `None` when Shardy has none (or the op is not one propagation crosses).
pub(crate) fn rule_of(
    instr: &HloInstruction,
    operands: &[&[i64]],
    results: &[&[i64]],
) -> Option<Rule> {
    let operand_ranks: Vec<usize> = operands.iter().map(|d| d.len()).collect();
    let result_ranks: Vec<usize> = results.iter().map(|d| d.len()).collect();
    let mut b = Builder::new(&operand_ranks, &result_ranks);
    let out = *results.first()?;
    let none_operands = vec![None; operands.len()];
    let none_results = vec![None; results.len()];
    // Every tensor of `out`'s rank holds dim d; scalars hold nothing.
    let pointwise = |b: &mut Builder, kind_of: &dyn Fn(usize) -> Kind| {
        for (d, &size) in out.iter().enumerate() {
            let od: Vec<Option<usize>> = operands
                .iter()
                .map(|o| (o.len() == out.len()).then_some(d))
                .collect();
            let rd: Vec<Option<usize>> = results
                .iter()
                .map(|r| (r.len() == out.len()).then_some(d))
                .collect();
            b.add(&od, &rd, size, kind_of(d));
        }
    };
    match instr.opcode {
        op if op.is_elementwise() => {
            if op == Opcode::BitcastConvert && operands.first().map(|o| o.len()) != Some(out.len())
            {
                return None;
            }
            pointwise(&mut b, &|_| Kind::PassThrough);
        }
        Opcode::AllReduce | Opcode::CollectivePermute | Opcode::OptimizationBarrier => {
            pointwise(&mut b, &|_| Kind::PassThrough)
        }
        Opcode::CustomCall => {
            // Only the identity-like custom calls of a Shardy module.
            match instr.ident_attr(AttrKey::CustomCallTarget) {
                Some("Sharding")
                | Some("xla.sdy.FuncResultSharding")
                | Some("MoveToHost")
                | Some("MoveToDevice")
                | Some("PinToDevice")
                | Some("PinToDeviceSram") => pointwise(&mut b, &|_| Kind::PassThrough),
                _ => return None,
            }
        }
        Opcode::Broadcast => {
            let input = operands.first()?;
            let dims = instr.dimensions();
            for (out_dim, &out_size) in out.iter().enumerate() {
                let mut in_dim = dims.iter().position(|&d| d as usize == out_dim);
                if let Some(i) = in_dim {
                    if input[i] == 1 && out_size != 1 {
                        b.add(&[Some(i)], &[None], 1, Kind::PassThrough);
                        in_dim = None;
                    }
                }
                b.add(&[in_dim], &[Some(out_dim)], out_size, Kind::PassThrough);
            }
        }
        Opcode::Transpose => {
            let input = operands.first()?;
            for (out_dim, &in_dim) in instr.dimensions().iter().enumerate() {
                let in_dim = in_dim as usize;
                b.add(
                    &[Some(in_dim)],
                    &[Some(out_dim)],
                    input[in_dim],
                    Kind::PassThrough,
                );
            }
        }
        Opcode::Reshape => reshape_factors(&mut b, operands.first()?, out),
        Opcode::Dot => {
            let dn = instr.dot_dimension_numbers();
            let (lhs, rhs) = (operands.first()?, operands.get(1)?);
            let mut out_dim = 0usize;
            for (&l, &r) in dn.lhs_batch.iter().zip(&dn.rhs_batch) {
                b.add(
                    &[Some(l as usize), Some(r as usize)],
                    &[Some(out_dim)],
                    lhs[l as usize],
                    Kind::PassThrough,
                );
                out_dim += 1;
            }
            for l in 0..lhs.len() as i64 {
                if !dn.lhs_batch.contains(&l) && !dn.lhs_contracting.contains(&l) {
                    b.add(
                        &[Some(l as usize), None],
                        &[Some(out_dim)],
                        lhs[l as usize],
                        Kind::PassThrough,
                    );
                    out_dim += 1;
                }
            }
            for r in 0..rhs.len() as i64 {
                if !dn.rhs_batch.contains(&r) && !dn.rhs_contracting.contains(&r) {
                    b.add(
                        &[None, Some(r as usize)],
                        &[Some(out_dim)],
                        rhs[r as usize],
                        Kind::PassThrough,
                    );
                    out_dim += 1;
                }
            }
            for (&l, &r) in dn.lhs_contracting.iter().zip(&dn.rhs_contracting) {
                b.add(
                    &[Some(l as usize), Some(r as usize)],
                    &[None],
                    lhs[l as usize],
                    Kind::Other,
                );
            }
        }
        Opcode::Reduce => {
            // Operands: n inputs then n scalar inits; one result per input.
            let inputs = operands.len() / 2;
            let input = operands.first()?;
            let reduced = instr.dimensions();
            let mut out_dim = 0usize;
            for (d, &size) in input.iter().enumerate() {
                let mut od = none_operands.clone();
                od[..inputs].iter_mut().for_each(|x| *x = Some(d));
                if reduced.contains(&(d as i64)) {
                    b.add(&od, &none_results, size, Kind::Other);
                } else {
                    let rd = vec![Some(out_dim); results.len()];
                    b.add(&od, &rd, size, Kind::PassThrough);
                    out_dim += 1;
                }
            }
        }
        Opcode::Slice | Opcode::Pad | Opcode::DynamicSlice => {
            let input = operands.first()?;
            let mismatch = if instr.opcode == Opcode::DynamicSlice {
                Kind::Blocked
            } else {
                Kind::Other
            };
            for (d, &size) in out.iter().enumerate() {
                let mut od = none_operands.clone();
                od[0] = Some(d);
                let kind = if input[d] == size {
                    Kind::PassThrough
                } else {
                    mismatch
                };
                b.add(&od, &[Some(d)], input[d].max(size), kind);
            }
        }
        Opcode::DynamicUpdateSlice => {
            let (input, update) = (operands.first()?, operands.get(1)?);
            for (d, &size) in input.iter().enumerate() {
                let mut od = none_operands.clone();
                od[0] = Some(d);
                if update[d] == size {
                    od[1] = Some(d);
                    b.add(&od, &[Some(d)], size, Kind::PassThrough);
                } else {
                    b.add(&od, &[Some(d)], size, Kind::PassThrough);
                    let mut ud = none_operands.clone();
                    ud[1] = Some(d);
                    b.add(&ud, &none_results, update[d], Kind::Other);
                }
            }
        }
        Opcode::Concatenate => {
            let dim = *instr.dimensions().first()? as usize;
            pointwise(&mut b, &|d| {
                if d == dim {
                    Kind::Other
                } else {
                    Kind::PassThrough
                }
            });
        }
        Opcode::Reverse => {
            let dims = instr.dimensions().to_vec();
            pointwise(&mut b, &|d| {
                if dims.contains(&(d as i64)) {
                    Kind::Other
                } else {
                    Kind::PassThrough
                }
            });
        }
        Opcode::Sort => {
            let dim = *instr.dimensions().first()? as usize;
            let only_sort_dim = out.iter().enumerate().all(|(d, &s)| d == dim || s == 1);
            pointwise(&mut b, &|d| {
                if d != dim {
                    Kind::PassThrough
                } else if only_sort_dim {
                    Kind::Blocked
                } else {
                    Kind::Other
                }
            });
        }
        Opcode::ReduceWindow => {
            let window = instr.window()?;
            let dims = window.dims.clone();
            pointwise(&mut b, &|d| match dims.get(d) {
                Some(w)
                    if w.size == 1
                        && w.stride == 1
                        && w.padding_low == 0
                        && w.padding_high == 0
                        && w.lhs_dilation == 1
                        && w.rhs_dilation == 1 =>
                {
                    Kind::PassThrough
                }
                _ => Kind::Other,
            });
        }
        Opcode::Gather => gather_factors(&mut b, instr, operands, out)?,
        Opcode::Scatter => scatter_factors(&mut b, instr, operands, results)?,
        Opcode::Convolution => convolution_factors(&mut b, instr, operands, out)?,
        _ => return None,
    }
    Some(b.build())
}

/// Reshape factors: walking both shapes major to minor, each run of equal
/// element counts becomes shared factors (their gcd), and a dimension that
/// only one side splits gets its own factor; size-1 dims get size-1 factors.
fn reshape_factors(b: &mut Builder, input: &[i64], out: &[i64]) {
    if input.iter().product::<i64>() == 0 {
        return;
    }
    let (mut in_dim, mut out_dim) = (0usize, 0usize);
    let (mut in_dims_product, mut out_dims_product) = (1i64, 1i64);
    let (mut in_factors_product, mut out_factors_product) = (1i64, 1i64);
    while in_dim < input.len() || out_dim < out.len() {
        if in_dim < input.len() && input[in_dim] == 1 {
            b.add(&[Some(in_dim)], &[None], 1, Kind::PassThrough);
            in_dim += 1;
            continue;
        }
        if out_dim < out.len() && out[out_dim] == 1 {
            b.add(&[None], &[Some(out_dim)], 1, Kind::PassThrough);
            out_dim += 1;
            continue;
        }
        if in_dim < input.len() && in_dims_product == in_factors_product {
            in_dims_product *= input[in_dim];
        }
        if out_dim < out.len() && out_dims_product == out_factors_product {
            out_dims_product *= out[out_dim];
        }
        let next_in = in_dims_product / in_factors_product;
        let next_out = out_dims_product / out_factors_product;
        let gcd = gcd(next_in, next_out);
        let diverged = |next: i64, smaller: i64, larger: i64| {
            if larger % smaller == 0 && next % (larger / smaller) == 0 {
                larger / smaller
            } else if next > gcd {
                next / gcd
            } else {
                next
            }
        };
        if in_factors_product == out_factors_product {
            if gcd > 1 {
                b.add(&[Some(in_dim)], &[Some(out_dim)], gcd, Kind::PassThrough);
                in_factors_product *= gcd;
                out_factors_product *= gcd;
            } else {
                if next_in <= 1 || next_out <= 1 {
                    return;
                }
                b.add(&[Some(in_dim)], &[None], next_in, Kind::PassThrough);
                in_factors_product *= next_in;
                b.add(&[None], &[Some(out_dim)], next_out, Kind::PassThrough);
                out_factors_product *= next_out;
            }
        } else if in_factors_product < out_factors_product {
            let f = diverged(next_in, in_factors_product, out_factors_product);
            b.add(&[Some(in_dim)], &[None], f, Kind::PassThrough);
            in_factors_product *= f;
        } else {
            let f = diverged(next_out, out_factors_product, in_factors_product);
            b.add(&[None], &[Some(out_dim)], f, Kind::PassThrough);
            out_factors_product *= f;
        }
        if in_dim < input.len() && in_dims_product == in_factors_product {
            in_dim += 1;
        }
        if out_dim < out.len() && out_dims_product == out_factors_product {
            out_dim += 1;
        }
    }
}

pub(crate) fn gcd(a: i64, b: i64) -> i64 {
    if b == 0 {
        a.abs()
    } else {
        gcd(b, a % b)
    }
}

/// The index dims of a gather/scatter indices tensor (all but the index
/// vector dim), in order.
fn index_batch_dims(indices_rank: usize, index_vector_dim: i64) -> Vec<usize> {
    (0..indices_rank)
        .filter(|&d| d as i64 != index_vector_dim)
        .collect()
}

/// Gather: operand dims taken whole are shared with the output's offset
/// dims; indices batch dims with the output's batch dims; explicit batching
/// dims with both; the other operand dims need replication.
fn gather_factors(
    b: &mut Builder,
    instr: &HloInstruction,
    operands: &[&[i64]],
    out: &[i64],
) -> Option<()> {
    let dn = instr.gather_dimension_numbers();
    let (input, indices) = (operands.first()?, operands.get(1)?);
    let slice_sizes = instr.ints_attr(AttrKey::SliceSizes)?.to_vec();
    let batch_out_dims: Vec<usize> = (0..out.len())
        .filter(|d| !dn.offset_dims.contains(&(*d as i64)))
        .collect();
    let index_dims = index_batch_dims(indices.len(), dn.index_vector_dim);
    let mut out_used = vec![false; out.len()];
    for (&index_dim, &out_dim) in index_dims.iter().zip(&batch_out_dims) {
        let batching = dn
            .start_indices_batching_dims
            .iter()
            .position(|&d| d as usize == index_dim)
            .map(|k| dn.operand_batching_dims[k] as usize);
        b.add(
            &[batching, Some(index_dim)],
            &[Some(out_dim)],
            out[out_dim],
            Kind::PassThrough,
        );
        out_used[out_dim] = true;
    }
    let mut offset = 0usize;
    for d in 0..input.len() {
        let di = d as i64;
        if dn.collapsed_slice_dims.contains(&di) || dn.operand_batching_dims.contains(&di) {
            if dn.collapsed_slice_dims.contains(&di) {
                b.add(&[Some(d), None], &[None], input[d], Kind::Other);
            }
            continue;
        }
        let out_dim = dn.offset_dims.get(offset).map(|&o| o as usize);
        offset += 1;
        match out_dim {
            Some(o)
                if slice_sizes.get(d) == Some(&input[d]) && !dn.start_index_map.contains(&di) =>
            {
                b.add(&[Some(d), None], &[Some(o)], input[d], Kind::PassThrough);
                out_used[o] = true;
            }
            _ => b.add(&[Some(d), None], &[None], input[d], Kind::Other),
        }
    }
    for (o, used) in out_used.iter().enumerate() {
        if !used {
            b.add(&[None, None], &[Some(o)], out[o], Kind::Other);
        }
    }
    Some(())
}

/// Scatter (operands: inputs, indices, updates; results: one per input):
/// input dims whose window is whole are shared with the updates' window
/// dims and the results; indices batch dims with the updates' scatter dims
/// (not in the result, like a reduction); other input dims need
/// replication.
fn scatter_factors(
    b: &mut Builder,
    instr: &HloInstruction,
    operands: &[&[i64]],
    results: &[&[i64]],
) -> Option<()> {
    let dn = instr.scatter_dimension_numbers();
    let n = results.len();
    let input = operands.first()?;
    let indices = operands.get(n)?;
    let update = operands.get(n + 1)?;
    let scatter_update_dims: Vec<usize> = (0..update.len())
        .filter(|d| !dn.update_window_dims.contains(&(*d as i64)))
        .collect();
    let index_dims = index_batch_dims(indices.len(), dn.index_vector_dim);
    let tensor_dims =
        |input_dim: Option<usize>, index_dim: Option<usize>, update_dim: Option<usize>| {
            let mut od = vec![None; operands.len()];
            od[..n].iter_mut().for_each(|x| *x = input_dim);
            od[n] = index_dim;
            od[n + 1..].iter_mut().for_each(|x| *x = update_dim);
            od
        };
    for (&index_dim, &update_dim) in index_dims.iter().zip(&scatter_update_dims) {
        let batching = dn
            .scatter_indices_batching_dims
            .iter()
            .position(|&d| d as usize == index_dim)
            .map(|k| dn.input_batching_dims[k] as usize);
        let od = tensor_dims(batching, Some(index_dim), Some(update_dim));
        let rd = vec![batching; n];
        let kind = if batching.is_some() {
            Kind::PassThrough
        } else {
            Kind::Other
        };
        b.add(&od, &rd, update[update_dim], kind);
    }
    let mut window = 0usize;
    for d in 0..input.len() {
        let di = d as i64;
        if dn.input_batching_dims.contains(&di) {
            continue;
        }
        if dn.inserted_window_dims.contains(&di) {
            b.add(
                &tensor_dims(Some(d), None, None),
                &vec![Some(d); n],
                input[d],
                Kind::Other,
            );
            continue;
        }
        let update_dim = dn.update_window_dims.get(window).map(|&u| u as usize);
        window += 1;
        match update_dim {
            Some(u) if update[u] == input[d] && !dn.scatter_dims_to_operand_dims.contains(&di) => {
                b.add(
                    &tensor_dims(Some(d), None, Some(u)),
                    &vec![Some(d); n],
                    input[d],
                    Kind::PassThrough,
                );
            }
            Some(u) => {
                b.add(
                    &tensor_dims(Some(d), None, None),
                    &vec![Some(d); n],
                    input[d],
                    Kind::Other,
                );
                b.add(
                    &tensor_dims(None, None, Some(u)),
                    &vec![None; n],
                    update[u],
                    Kind::Other,
                );
            }
            None => b.add(
                &tensor_dims(Some(d), None, None),
                &vec![Some(d); n],
                input[d],
                Kind::Other,
            ),
        }
    }
    Some(())
}

/// Convolution: batch (lhs, output), input feature (lhs, rhs: contracted),
/// output feature (rhs, output), and per spatial dim a windows factor
/// (lhs, output) and a window-size factor (rhs, contracted).
fn convolution_factors(
    b: &mut Builder,
    instr: &HloInstruction,
    operands: &[&[i64]],
    out: &[i64],
) -> Option<()> {
    let dn = instr.conv_dimension_numbers()?;
    let (lhs, rhs) = (operands.first()?, operands.get(1)?);
    let feature_groups = instr.int_attr(AttrKey::FeatureGroupCount).unwrap_or(1);
    let batch_groups = instr.int_attr(AttrKey::BatchGroupCount).unwrap_or(1);
    if feature_groups != 1 || batch_groups != 1 {
        return None;
    }
    let (ib, ifeat, ob, ofeat) = (
        dn.input_batch as usize,
        dn.input_feature as usize,
        dn.output_batch as usize,
        dn.output_feature as usize,
    );
    let (kin, kout) = (
        dn.kernel_input_feature as usize,
        dn.kernel_output_feature as usize,
    );
    b.add(&[Some(ib), None], &[Some(ob)], lhs[ib], Kind::PassThrough);
    b.add(&[Some(ifeat), Some(kin)], &[None], lhs[ifeat], Kind::Other);
    b.add(
        &[None, Some(kout)],
        &[Some(ofeat)],
        rhs[kout],
        Kind::PassThrough,
    );
    for ((&ls, &ks), &os) in dn
        .input_spatial
        .iter()
        .zip(&dn.kernel_spatial)
        .zip(&dn.output_spatial)
    {
        let (ls, ks, os) = (ls as usize, ks as usize, os as usize);
        b.add(&[Some(ls), None], &[Some(os)], out[os], Kind::Other);
        b.add(&[None, Some(ks)], &[None], rhs[ks], Kind::Other);
    }
    Some(())
}
