//! Windowed einsum (collective matmul) on a partitioned module: a dot
//! fed by an all-gather, or feeding a reduce-scatter, along one of its
//! non-contracting dimensions becomes a loop over windows of that
//! dimension, each window's dot overlapping the collective-permute that
//! moves the next window (or the running sum) around the group's ring
//! (XLA's windowed einsum loops). A schedule of the unrolled program
//! cannot hide such a collective when the dot is its only user or
//! operand; the loop can.
//!
//! All-gather then dot, for a group of `n` devices where device `k` holds
//! window `k` of `x` (what the all-gather concatenates in group order):
//!   - step `i` (0 <= i < n) on device `k` holds window `(k + i) % n`,
//!     multiplies it and writes the partial result at that window's offset
//!     of the output dimension the gathered dimension maps to;
//!   - between steps each device passes its window to its predecessor in
//!     the group (`k -> k - 1`);
//!   - the last step runs after the loop (peeled), so no window is sent
//!     that nobody multiplies.
//!
//! Dot then reduce-scatter (device `k` must end with the sum over the
//! group of block `k` of the scattered dimension):
//!   - step `i` on device `k` computes the dot of block `(k + 1 + i) % n`
//!     of the operand the scattered dimension comes from and adds it to
//!     the running sum its successor built in step `i - 1`; after `n`
//!     steps the sum is block `k`'s;
//!   - the first step runs before the loop (peeled), and each iteration
//!     starts by passing the running sum to the predecessor, so the permute
//!     overlaps the iteration's dot, which does not need it.
//!
//! Either way the `n - 1` permutes move exactly what the collective moved.
//!
//! Bidirectional loops (`bidirectional`, groups of at least 5) send
//! windows both ways around the ring, so a loop takes about half as many
//! iterations, each with two dots and two permutes that run concurrently.
//! With `F = ceil((n - 1) / 2)` windows coming one way and
//! `B = floor((n - 1) / 2)` the other:
//!   - all-gather: device `k` multiplies its own window before the loop
//!     and sends it both ways; iteration `j` (1 <= j < B) multiplies the
//!     windows `k + j` and `k - j` it holds while passing them on (to
//!     `k - 1` and `k + 1`); step `B` is peeled, and for even `n` the last
//!     window `k + F` arrives by one more permute after it;
//!   - reduce-scatter: two running sums travel the two ways, one through
//!     the `F` devices after `k` (toward `k - 1`), one through the `B`
//!     before it (toward `k + 1`); the first step of each is peeled (both
//!     first steps of the longer one for even `n`), each iteration passes
//!     both sums on and adds its two blocks, and after the loop device
//!     `k` adds both received sums to its own block's dot.
//!
//! Again `F + B = n - 1` windows or sums move, as many bytes as the
//! collective; on a node whose GPUs share one switch the two ways share
//! each GPU's links, so the gain is fewer steps, not more bandwidth.
//!
//! An all-gather along a contracting dimension (FSDP-style weights) is
//! left alone: every device of the group would hold the whole output but
//! sum the window products in its own ring order, so replicas of one value
//! would differ in their last bits.
//!
//! Only computations that run as programs of their own are rewritten (the
//! entry and what its loops, conditionals and calls reach), never fusions,
//! reducers or async bodies.
//!
//! Invariants: after an all-gather rewrite every output element is the
//! same dot product over the same contracting elements, so results are
//! bitwise equal to the unwindowed program where a dot's sum does not
//! depend on its shape (the interpreter's consistent mode; a GEMM library
//! may round a window's dot differently); a reduce-scatter rewrite sums
//! the group's partial results in ring order instead of group order
//! (equal up to floating-point reassociation). A pair is rewritten only
//! when the collective and the dot have no other user, the reduce-scatter
//! sums with `add`, the module has one replica, the groups are partition
//! ids of equal size `n` with `2 <= n <= max_iterations`, and the
//! collective's operand or result reaches the threshold; otherwise the
//! module is left as it is.

use crate::builder::Builder;
use crate::consistent::binary_reducer;
use crate::context::ModuleContext;
use std::sync::Arc;
use xla_hlo_ir::attrs::{AttrValue, Attribute};
use xla_hlo_ir::collective_groups::{group_mode, GroupMode};
use xla_hlo_ir::{
    AttrKey, CompId, HloComputation, HloInstruction, HloModule, InstrId, Opcode, PrimitiveType,
    Shape,
};

/// When dots are windowed (XLA's `xla_gpu_threshold_for_windowed_einsum_mib`
/// and `SpmdPartitionerOptions::max_windowed_einsum_iteration`).
#[derive(Clone, Debug, PartialEq)]
pub struct WindowedEinsumOptions {
    /// Window a pair when its collective's full-size array (the
    /// all-gather's result, or the dot result a reduce-scatter scatters)
    /// has at least this many MiB; `None`: never; `Some(0.0)`: wherever
    /// legal.
    pub threshold_mib: Option<f64>,
    /// Largest group (loop trip count) to window over.
    pub max_iterations: i64,
    /// Send windows both ways around the ring (groups of 5 or more; smaller
    /// groups get unidirectional loops).
    pub bidirectional: bool,
}

impl Default for WindowedEinsumOptions {
    fn default() -> Self {
        WindowedEinsumOptions {
            threshold_mib: None,
            max_iterations: 32,
            bidirectional: false,
        }
    }
}

/// What the rewrite did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WindowedEinsumStats {
    /// All-gather-then-dot pairs turned into loops.
    pub all_gather_loops: usize,
    /// Dot-then-reduce-scatter pairs turned into loops.
    pub reduce_scatter_loops: usize,
    /// Every loop made, in the order made.
    pub loops: Vec<WindowedLoop>,
}

/// One pair turned into a loop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WindowedLoop {
    /// The computation (index before the pass) and the dot and collective
    /// (ids in that computation before the pass).
    pub computation: usize,
    pub dot: InstrId,
    pub collective: InstrId,
    /// The loop body's name after the pass, and its trip count.
    pub body: String,
    pub trip_count: i64,
    /// The loop sends both ways around the ring.
    pub bidirectional: bool,
}

/// Which collective the loop replaces.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Form {
    /// The dot's operand `side` is an all-gather (removed).
    AllGather { all_gather: InstrId },
    /// The dot's only user is a reduce-scatter (replaced by the loop);
    /// the scattered dimension is `operand_dim` of operand `side`.
    ReduceScatter {
        reduce_scatter: InstrId,
        operand_dim: usize,
    },
}

/// A dot with an all-gather or reduce-scatter that can be windowed.
struct Candidate {
    form: Form,
    dot: InstrId,
    /// The dot operand the windows are taken from (0: lhs, 1: rhs).
    side: usize,
    /// The dot output dimension the windows tile.
    output_dim: usize,
    /// Group size (trip count) and window size along that dimension.
    group_size: i64,
    window: i64,
    /// Each partition's position in its group.
    positions: Arc<[i64]>,
    /// `(source, target)`: each device sends to its group predecessor.
    pairs: Vec<(i64, i64)>,
    /// Each device to its group successor (the other way round the ring).
    backward_pairs: Vec<(i64, i64)>,
    /// Windows travel both ways (see the module doc).
    bidirectional: bool,
}

impl Candidate {
    /// Windows (or sums) arriving from the successors' side (`F`) and from
    /// the predecessors' side (`B`) in a bidirectional loop.
    fn forward_backward(&self) -> (i64, i64) {
        let others = self.group_size - 1;
        ((others + 1) / 2, others / 2)
    }

    /// Iterations of the loop.
    fn trip_count(&self) -> i64 {
        if self.bidirectional {
            self.forward_backward().1 - 1
        } else {
            self.group_size - 1
        }
    }

    /// The instruction whose uses the loop's result takes over.
    fn replaced(&self) -> InstrId {
        match self.form {
            Form::AllGather { .. } => self.dot,
            Form::ReduceScatter { reduce_scatter, .. } => reduce_scatter,
        }
    }
    /// The instruction dropped from the computation.
    fn dropped(&self) -> InstrId {
        match self.form {
            Form::AllGather { all_gather } => all_gather,
            Form::ReduceScatter { .. } => self.dot,
        }
    }
}

/// Windows every eligible all-gather-then-dot and dot-then-reduce-scatter
/// of the module.
pub fn windowed_einsum(
    module: &mut HloModule,
    options: &WindowedEinsumOptions,
) -> WindowedEinsumStats {
    windowed_einsum_where(module, options, |_, _| true)
}

/// Windows the eligible pairs whose dot `keep(computation index, dot id)`
/// accepts (ids as in the module before the pass).
pub fn windowed_einsum_where(
    module: &mut HloModule,
    options: &WindowedEinsumOptions,
    keep: impl Fn(usize, InstrId) -> bool,
) -> WindowedEinsumStats {
    let mut stats = WindowedEinsumStats::default();
    let Some(threshold_mib) = options.threshold_mib else {
        return stats;
    };
    if module.replica_count() != 1 {
        return stats;
    }
    let num_partitions = module.num_partitions().max(1);
    let limits = Limits {
        num_partitions,
        threshold_bytes: threshold_mib * 1024.0 * 1024.0,
        max_iterations: options.max_iterations,
        bidirectional: options.bidirectional,
    };
    let mut ctx = ModuleContext::new(module, num_partitions);
    let sequential = sequential_computations(module);
    for comp_index in 0..module.computations.len() {
        if !sequential[comp_index] {
            continue;
        }
        let mut candidates = find_candidates(module, comp_index, &limits);
        candidates.retain(|c| keep(comp_index, c.dot));
        if candidates.is_empty() {
            continue;
        }
        let mut loops = Vec::with_capacity(candidates.len());
        for candidate in &candidates {
            let comp = &module.computations[comp_index];
            let (body, condition) = loop_computations(&mut ctx, comp, candidate);
            stats.loops.push(WindowedLoop {
                computation: comp_index,
                dot: candidate.dot,
                collective: match candidate.form {
                    Form::AllGather { all_gather } => all_gather,
                    Form::ReduceScatter { reduce_scatter, .. } => reduce_scatter,
                },
                body: body.name.clone(),
                trip_count: candidate.trip_count(),
                bidirectional: candidate.bidirectional,
            });
            let body_id = CompId(module.computations.len() as u32);
            module.computations.push(body);
            let condition_id = CompId(module.computations.len() as u32);
            module.computations.push(condition);
            loops.push((body_id, condition_id));
            match candidate.form {
                Form::AllGather { .. } => stats.all_gather_loops += 1,
                Form::ReduceScatter { .. } => stats.reduce_scatter_loops += 1,
            }
        }
        let old = std::mem::replace(
            &mut module.computations[comp_index],
            HloComputation::new(""),
        );
        module.computations[comp_index] = rewrite(&mut ctx, old, &candidates, &loops);
    }
    if stats != WindowedEinsumStats::default() {
        // The loops' computations were appended; callees print first.
        crate::order_callees_first(module);
    }
    stats
}

/// What a pair must satisfy beside its shape.
struct Limits {
    num_partitions: i64,
    threshold_bytes: f64,
    max_iterations: i64,
    bidirectional: bool,
}

/// Smallest group a bidirectional loop is made for (a loop of at least
/// one iteration); smaller groups get unidirectional loops.
const MIN_BIDIRECTIONAL_GROUP: i64 = 5;

/// Which computations run as programs of their own (the entry, and the
/// bodies, conditions, branches and call targets they reach), as opposed
/// to fusions, reducers, comparators and async bodies, where a loop or a
/// collective may not go.
pub(crate) fn sequential_computations(module: &HloModule) -> Vec<bool> {
    let mut sequential = vec![false; module.computations.len()];
    let mut stack = vec![module.entry];
    while let Some(comp) = stack.pop() {
        let Some(slot) = sequential.get_mut(comp.index()) else {
            continue;
        };
        if std::mem::replace(slot, true) {
            continue;
        }
        for instr in &module.comp(comp).instructions {
            if matches!(
                instr.opcode,
                Opcode::While | Opcode::Call | Opcode::Conditional
            ) {
                stack.extend(instr.called_computation_ids());
            }
        }
    }
    sequential
}

/// The one dimension of a collective's `dimensions={d}`.
pub(crate) fn single_dimension(collective: &HloInstruction) -> Option<usize> {
    match collective.ints_attr(AttrKey::Dimensions)? {
        &[d] => usize::try_from(d).ok(),
        _ => None,
    }
}

/// Who uses each instruction of a computation, and which instructions
/// carry control edges (either way).
pub(crate) struct Uses {
    pub users: Vec<Vec<InstrId>>,
    pub control: Vec<bool>,
}

impl Uses {
    pub(crate) fn of(comp: &HloComputation) -> Uses {
        let mut users: Vec<Vec<InstrId>> = vec![Vec::new(); comp.instructions.len()];
        let mut control = vec![false; comp.instructions.len()];
        for (index, instr) in comp.instructions.iter().enumerate() {
            for operand in &instr.operands {
                users[operand.index()].push(InstrId(index as u32));
            }
            for predecessor in &instr.control_predecessors {
                control[predecessor.index()] = true;
            }
            if !instr.control_predecessors.is_empty() {
                control[index] = true;
            }
        }
        Uses { users, control }
    }

    /// The one user of `id`, when it has exactly one, is not the root and
    /// has no control edges.
    pub(crate) fn only_user(&self, comp: &HloComputation, id: InstrId) -> Option<InstrId> {
        match self.users[id.index()].as_slice() {
            [user] if id != comp.root && !self.control[id.index()] => Some(*user),
            _ => None,
        }
    }
}

/// The dots of computation `comp_index` that can be windowed, at most one
/// form per dot.
fn find_candidates(module: &HloModule, comp_index: usize, limits: &Limits) -> Vec<Candidate> {
    let comp = &module.computations[comp_index];
    let uses = Uses::of(comp);
    let only_user = |id: InstrId| uses.only_user(comp, id);
    let mut candidates = Vec::new();
    for (index, dot) in comp.instructions.iter().enumerate() {
        let dot_id = InstrId(index as u32);
        if dot.opcode != Opcode::Dot || dot.operands.len() != 2 || uses.control[index] {
            continue;
        }
        let gathered = (0..2).find_map(|side| {
            let all_gather = dot.operands[side];
            (dot.operands[1 - side] != all_gather && only_user(all_gather) == Some(dot_id))
                .then(|| all_gather_candidate(comp, dot_id, all_gather, side, limits))
                .flatten()
        });
        if let Some(candidate) = gathered {
            candidates.push(candidate);
            continue;
        }
        if let Some(reduce_scatter) = only_user(dot_id) {
            if let Some(candidate) =
                reduce_scatter_candidate(module, comp, dot_id, reduce_scatter, limits)
            {
                candidates.push(candidate);
            }
        }
    }
    candidates
}

/// Operand `side`'s free (non-contracting, non-batch) dimensions and the
/// dot output dimension of the first of them: batch dimensions come
/// first, then the lhs's free dimensions, then the rhs's, each in order.
pub(crate) fn output_dim_of(
    comp: &HloComputation,
    dot: &HloInstruction,
    side: usize,
    dim: usize,
) -> Option<usize> {
    let free = |operand: usize, contracting: AttrKey, batch: AttrKey| -> Vec<usize> {
        let rank = comp.instr(dot.operands[operand]).shape.rank();
        let contracting = dot.ints_attr(contracting).unwrap_or(&[]);
        let batch = dot.ints_attr(batch).unwrap_or(&[]);
        (0..rank)
            .filter(|&d| !contracting.contains(&(d as i64)) && !batch.contains(&(d as i64)))
            .collect()
    };
    let batch_count = dot.ints_attr(AttrKey::LhsBatchDims).unwrap_or(&[]).len();
    let lhs_free = free(0, AttrKey::LhsContractingDims, AttrKey::LhsBatchDims);
    let rhs_free = free(1, AttrKey::RhsContractingDims, AttrKey::RhsBatchDims);
    let (list, base) = if side == 0 {
        (&lhs_free, batch_count)
    } else {
        (&rhs_free, batch_count + lhs_free.len())
    };
    let at = list.iter().position(|&d| d == dim)?;
    let output_dim = base + at;
    (output_dim < dot.shape.rank()).then_some(output_dim)
}

/// The inverse of [`output_dim_of`]: the operand and its dimension that
/// dot output dimension `output_dim` comes from (`None` for a batch one).
pub(crate) fn operand_dim_of(
    comp: &HloComputation,
    dot: &HloInstruction,
    output_dim: usize,
) -> Option<(usize, usize)> {
    (0..2).find_map(|side| {
        let rank = comp.instr(dot.operands[side]).shape.rank();
        (0..rank)
            .find(|&dim| output_dim_of(comp, dot, side, dim) == Some(output_dim))
            .map(|dim| (side, dim))
    })
}

/// A collective's group ring: its size, each partition's position, and
/// the pairs of each device to its predecessor (`forward`) and to its
/// successor (`backward`).
struct Ring {
    group_size: i64,
    positions: Arc<[i64]>,
    forward: Vec<(i64, i64)>,
    backward: Vec<(i64, i64)>,
}

/// The ring of a collective over partition ids in groups of equal size
/// within the limits.
fn ring(collective: &HloInstruction, limits: &Limits) -> Option<Ring> {
    if !matches!(
        group_mode(collective, collective.opcode),
        Ok(GroupMode::FlattenedId | GroupMode::CrossPartition)
    ) {
        return None;
    }
    let groups = match collective.attr(AttrKey::ReplicaGroups) {
        Some(AttrValue::ReplicaGroups(list)) => list.groups()?,
        None => Vec::new(),
        Some(_) => return None,
    };
    let groups = if groups.is_empty() {
        vec![(0..limits.num_partitions).collect::<Vec<i64>>()]
    } else {
        groups
    };
    let group_size = groups[0].len() as i64;
    if group_size < 2 || group_size > limits.max_iterations {
        return None;
    }
    let mut positions = vec![-1i64; limits.num_partitions as usize];
    let mut forward = Vec::new();
    let mut backward = Vec::new();
    for group in &groups {
        if group.len() as i64 != group_size {
            return None;
        }
        for (k, &device) in group.iter().enumerate() {
            let slot = positions.get_mut(usize::try_from(device).ok()?)?;
            if *slot != -1 {
                return None;
            }
            *slot = k as i64;
            forward.push((device, group[(k + group.len() - 1) % group.len()]));
            backward.push((device, group[(k + 1) % group.len()]));
        }
    }
    if positions.contains(&-1) {
        return None;
    }
    Some(Ring {
        group_size,
        positions: positions.into(),
        forward,
        backward,
    })
}

impl Ring {
    fn candidate(
        self,
        form: Form,
        dot: InstrId,
        side: usize,
        output_dim: usize,
        window: i64,
        limits: &Limits,
    ) -> Candidate {
        Candidate {
            form,
            dot,
            side,
            output_dim,
            group_size: self.group_size,
            window,
            positions: self.positions,
            pairs: self.forward,
            backward_pairs: self.backward,
            bidirectional: limits.bidirectional && self.group_size >= MIN_BIDIRECTIONAL_GROUP,
        }
    }
}

fn all_gather_candidate(
    comp: &HloComputation,
    dot_id: InstrId,
    all_gather: InstrId,
    side: usize,
    limits: &Limits,
) -> Option<Candidate> {
    let dot = comp.instr(dot_id);
    let ag = comp.instr(all_gather);
    if ag.opcode != Opcode::AllGather || ag.operands.len() != 1 {
        return None;
    }
    let gathered = single_dimension(ag)?;
    let output_dim = output_dim_of(comp, dot, side, gathered)?;
    if (ag.shape.byte_size() as f64) < limits.threshold_bytes {
        return None;
    }
    let ring = ring(ag, limits)?;
    let window = *comp.instr(ag.operands[0]).shape.dims().get(gathered)?;
    if ag.shape.dims().get(gathered) != Some(&(window * ring.group_size)) {
        return None;
    }
    Some(ring.candidate(
        Form::AllGather { all_gather },
        dot_id,
        side,
        output_dim,
        window,
        limits,
    ))
}

fn reduce_scatter_candidate(
    module: &HloModule,
    comp: &HloComputation,
    dot_id: InstrId,
    reduce_scatter: InstrId,
    limits: &Limits,
) -> Option<Candidate> {
    let dot = comp.instr(dot_id);
    let rs = comp.instr(reduce_scatter);
    if rs.opcode != Opcode::ReduceScatter
        || rs.operands.len() != 1
        || binary_reducer(module, rs.to_apply()) != Some(Opcode::Add)
        || rs.shape.element_type() != dot.shape.element_type()
    {
        return None;
    }
    let output_dim = single_dimension(rs)?;
    let (side, operand_dim) = operand_dim_of(comp, dot, output_dim)?;
    if (dot.shape.byte_size() as f64) < limits.threshold_bytes {
        return None;
    }
    let ring = ring(rs, limits)?;
    let window = *rs.shape.dims().get(output_dim)?;
    if dot.shape.dims().get(output_dim) != Some(&(window * ring.group_size)) {
        return None;
    }
    Some(ring.candidate(
        Form::ReduceScatter {
            reduce_scatter,
            operand_dim,
        },
        dot_id,
        side,
        output_dim,
        window,
        limits,
    ))
}

/// The dot of one window: the original dot's attributes on the window's
/// shapes.
fn window_dot(
    b: &mut Builder<'_>,
    dot: &HloInstruction,
    candidate: &Candidate,
    window: InstrId,
    other: InstrId,
) -> InstrId {
    let mut dims = dot.shape.dims().to_vec();
    dims[candidate.output_dim] = candidate.window;
    let shape = crate::shapes::with_dims(&dot.shape, &dims);
    let operands = if candidate.side == 0 {
        vec![window, other]
    } else {
        vec![other, window]
    };
    let attrs: Vec<(AttrKey, AttrValue)> = dot
        .attrs
        .iter()
        .map(|Attribute { key, value }| (*key, value.clone()))
        .collect();
    b.add(&dot.name, Opcode::Dot, shape, operands, attrs)
}

/// The start of window `(position + shift) % n` along a dimension, and
/// zero for the others, as dynamic-slice/update-slice start operands.
fn window_starts(
    b: &mut Builder<'_>,
    candidate: &Candidate,
    shift: InstrId,
    rank: usize,
    dim: usize,
) -> Vec<InstrId> {
    let position = b.table(&candidate.positions);
    let n = b.scalar(PrimitiveType::S32, candidate.group_size);
    let shifted = b.binary(Opcode::Add, position, shift);
    let block = b.binary(Opcode::Remainder, shifted, n);
    let window = b.scalar(PrimitiveType::S32, candidate.window);
    let offset = b.binary(Opcode::Multiply, block, window);
    let zero = b.scalar(PrimitiveType::S32, 0);
    (0..rank)
        .map(|d| if d == dim { offset } else { zero })
        .collect()
}

/// One step: for an all-gather, the dot of the window held, written into
/// `output` at window `(position + step) % n`; for a reduce-scatter, the
/// dot of block `(position + 1 + step) % n` of the windowed operand added
/// to the running sum `output` (the dot alone when there is none yet).
fn step(
    b: &mut Builder<'_>,
    dot: &HloInstruction,
    candidate: &Candidate,
    operands: [InstrId; 2],
    output: Option<InstrId>,
    step: InstrId,
) -> InstrId {
    match candidate.form {
        Form::AllGather { .. } => {
            let output = output.expect("an all-gather step writes into an output");
            gathered_window(b, dot, candidate, operands, output, step)
        }
        Form::ReduceScatter { .. } => {
            let one = b.scalar(PrimitiveType::S32, 1);
            let shift = b.binary(Opcode::Add, step, one);
            scattered_block(b, dot, candidate, operands, output, shift)
        }
    }
}

/// The dot of the window held (`operands[0]`) written into `output` at
/// window `(position + shift) % n` of the output dimension.
fn gathered_window(
    b: &mut Builder<'_>,
    dot: &HloInstruction,
    candidate: &Candidate,
    [windowed, other]: [InstrId; 2],
    output: InstrId,
    shift: InstrId,
) -> InstrId {
    let partial = window_dot(b, dot, candidate, windowed, other);
    let rank = b.shape(output).rank();
    let mut update = vec![output, partial];
    update.extend(window_starts(
        b,
        candidate,
        shift,
        rank,
        candidate.output_dim,
    ));
    let shape = b.shape(output).clone();
    b.add(
        "dynamic-update-slice",
        Opcode::DynamicUpdateSlice,
        shape,
        update,
        vec![],
    )
}

/// The dot of block `(position + shift) % n` of the windowed operand
/// (`operands[0]`), added to `sum` (the dot alone when `None`).
fn scattered_block(
    b: &mut Builder<'_>,
    dot: &HloInstruction,
    candidate: &Candidate,
    [windowed, other]: [InstrId; 2],
    sum: Option<InstrId>,
    shift: InstrId,
) -> InstrId {
    let operand_dim = match candidate.form {
        Form::ReduceScatter { operand_dim, .. } => operand_dim,
        Form::AllGather { .. } => candidate.output_dim,
    };
    let rank = b.shape(windowed).rank();
    let starts = window_starts(b, candidate, shift, rank, operand_dim);
    let mut sizes = b.dims(windowed);
    sizes[operand_dim] = candidate.window;
    let block = b.dynamic_slice(windowed, starts, &sizes);
    let partial = window_dot(b, dot, candidate, block, other);
    match sum {
        Some(sum) => b.binary(Opcode::Add, sum, partial),
        None => partial,
    }
}

/// The loop state: (step, windowed operand, other operand, output or
/// running sum).
fn state_shape(comp: &HloComputation, candidate: &Candidate) -> Shape {
    let dot = comp.instr(candidate.dot);
    let other = comp.instr(dot.operands[1 - candidate.side]);
    let (windowed, output) = match candidate.form {
        Form::AllGather { all_gather } => (
            comp.instr(comp.instr(all_gather).operands[0]),
            dot.shape.clone(),
        ),
        Form::ReduceScatter { reduce_scatter, .. } => (
            comp.instr(dot.operands[candidate.side]),
            comp.instr(reduce_scatter).shape.clone(),
        ),
    };
    Shape::tuple(vec![
        Shape::scalar(PrimitiveType::S32),
        windowed.shape.clone(),
        other.shape.clone(),
        output,
    ])
}

/// The loop's body and condition for `candidate` of `comp`.
fn loop_computations(
    ctx: &mut ModuleContext,
    comp: &HloComputation,
    candidate: &Candidate,
) -> (HloComputation, HloComputation) {
    if candidate.bidirectional {
        return bidirectional_loop_computations(ctx, comp, candidate);
    }
    let dot = comp.instr(candidate.dot);
    let state = state_shape(comp, candidate);
    let body_name = ctx.fresh("windowed_einsum_body");
    let mut b = Builder::new(ctx, &body_name, 24);
    let param = parameter(&mut b, &state);
    let [index, windowed, other, output] = [0, 1, 2, 3].map(|k| element(&mut b, param, &state, k));
    let (windowed, updated) = match candidate.form {
        Form::AllGather { .. } => {
            let updated = step(
                &mut b,
                dot,
                candidate,
                [windowed, other],
                Some(output),
                index,
            );
            (b.collective_permute(windowed, &candidate.pairs), updated)
        }
        Form::ReduceScatter { .. } => {
            let received = b.collective_permute(output, &candidate.pairs);
            let updated = step(
                &mut b,
                dot,
                candidate,
                [windowed, other],
                Some(received),
                index,
            );
            (windowed, updated)
        }
    };
    let one = b.scalar(PrimitiveType::S32, 1);
    let next = b.binary(Opcode::Add, index, one);
    let root = b.add(
        "tuple",
        Opcode::Tuple,
        state.clone(),
        vec![next, windowed, other, updated],
        vec![],
    );
    b.comp.root = root;
    let body = std::mem::replace(&mut b.comp, HloComputation::new(""));

    // Steps 0..n-1 run in the loop for an all-gather, 1..n for a
    // reduce-scatter (the other step is peeled).
    let end = match candidate.form {
        Form::AllGather { .. } => candidate.group_size - 1,
        Form::ReduceScatter { .. } => candidate.group_size,
    };
    (body, loop_condition(ctx, &state, end))
}

/// The state of a bidirectional loop: (step, window from the successors'
/// side, window from the predecessors' side, other operand, output) for
/// an all-gather; (step, windowed operand, other operand, sum travelling
/// toward predecessors, sum travelling toward successors) for a
/// reduce-scatter.
fn bidirectional_state_shape(windowed: &Shape, other: &Shape, output: &Shape, form: Form) -> Shape {
    let step = Shape::scalar(PrimitiveType::S32);
    match form {
        Form::AllGather { .. } => Shape::tuple(vec![
            step,
            windowed.clone(),
            windowed.clone(),
            other.clone(),
            output.clone(),
        ]),
        Form::ReduceScatter { .. } => Shape::tuple(vec![
            step,
            windowed.clone(),
            other.clone(),
            output.clone(),
            output.clone(),
        ]),
    }
}

/// Body and condition of a bidirectional loop (steps `1..B`).
fn bidirectional_loop_computations(
    ctx: &mut ModuleContext,
    comp: &HloComputation,
    candidate: &Candidate,
) -> (HloComputation, HloComputation) {
    let dot = comp.instr(candidate.dot);
    let unidirectional = state_shape(comp, candidate);
    let parts = unidirectional.tuple_elements();
    let state = bidirectional_state_shape(&parts[1], &parts[2], &parts[3], candidate.form);
    let (forward, backward) = candidate.forward_backward();
    let n = candidate.group_size;
    let body_name = ctx.fresh("windowed_einsum_body");
    let mut b = Builder::new(ctx, &body_name, 48);
    let param = parameter(&mut b, &state);
    let [index, first, second, third, fourth] =
        [0, 1, 2, 3, 4].map(|k| element(&mut b, param, &state, k));
    let elements = match candidate.form {
        Form::AllGather { .. } => {
            // Windows `k + j` and `k - j` are multiplied while passed on.
            let (ahead, behind, other, output) = (first, second, third, fourth);
            let output = gathered_window(&mut b, dot, candidate, [ahead, other], output, index);
            let group = b.scalar(PrimitiveType::S32, n);
            let back = b.binary(Opcode::Subtract, group, index);
            let output = gathered_window(&mut b, dot, candidate, [behind, other], output, back);
            let ahead = b.collective_permute(ahead, &candidate.pairs);
            let behind = b.collective_permute(behind, &candidate.backward_pairs);
            vec![ahead, behind, other, output]
        }
        Form::ReduceScatter { .. } => {
            let (windowed, other, toward_predecessors, toward_successors) =
                (first, second, third, fourth);
            let received_ahead = b.collective_permute(toward_predecessors, &candidate.pairs);
            let received_behind =
                b.collective_permute(toward_successors, &candidate.backward_pairs);
            // Step `j` of the chain through the successors adds block
            // `k - F + D + j`; of the other chain, block `k + B - j`.
            let base = b.scalar(PrimitiveType::S32, n - forward + (forward - backward));
            let ahead_shift = b.binary(Opcode::Add, base, index);
            let backward_base = b.scalar(PrimitiveType::S32, backward);
            let behind_shift = b.binary(Opcode::Subtract, backward_base, index);
            let ahead = scattered_block(
                &mut b,
                dot,
                candidate,
                [windowed, other],
                Some(received_ahead),
                ahead_shift,
            );
            let behind = scattered_block(
                &mut b,
                dot,
                candidate,
                [windowed, other],
                Some(received_behind),
                behind_shift,
            );
            vec![windowed, other, ahead, behind]
        }
    };
    let one = b.scalar(PrimitiveType::S32, 1);
    let next = b.binary(Opcode::Add, index, one);
    let mut operands = vec![next];
    operands.extend(elements);
    let root = b.add("tuple", Opcode::Tuple, state.clone(), operands, vec![]);
    b.comp.root = root;
    let body = std::mem::replace(&mut b.comp, HloComputation::new(""));

    (body, loop_condition(ctx, &state, backward))
}

/// A bidirectional pair in the rewritten computation: the peeled steps
/// around the loop `(body, condition)`; returns the value that replaces
/// the dot (all-gather) or the reduce-scatter.
fn bidirectional_pair(
    b: &mut Builder<'_>,
    dot: &HloInstruction,
    candidate: &Candidate,
    windowed: InstrId,
    other: InstrId,
    loop_ids: (CompId, CompId),
) -> InstrId {
    let (forward, backward) = candidate.forward_backward();
    let n = candidate.group_size;
    let windowed_shape = b.shape(windowed).clone();
    let other_shape = b.shape(other).clone();
    let shift = |b: &mut Builder<'_>, v: i64| b.scalar(PrimitiveType::S32, v.rem_euclid(n));
    match candidate.form {
        Form::AllGather { .. } => {
            let output_shape = dot.shape.clone();
            let ty = output_shape.element_type().unwrap_or(PrimitiveType::F32);
            let zero = b.scalar(ty, 0);
            let output = b.broadcast(zero, output_shape.dims(), &[]);
            let own = shift(b, 0);
            let output = gathered_window(b, dot, candidate, [windowed, other], output, own);
            let ahead = b.collective_permute(windowed, &candidate.pairs);
            let behind = b.collective_permute(windowed, &candidate.backward_pairs);
            let state = bidirectional_state_shape(
                &windowed_shape,
                &other_shape,
                &output_shape,
                candidate.form,
            );
            let looped = start_loop(b, &state, 1, &[ahead, behind, other, output], loop_ids);
            let ahead = element(b, looped, &state, 1);
            let behind = element(b, looped, &state, 2);
            let output = element(b, looped, &state, 4);
            let at = shift(b, backward);
            let output = gathered_window(b, dot, candidate, [ahead, other], output, at);
            let at = shift(b, -backward);
            let mut output = gathered_window(b, dot, candidate, [behind, other], output, at);
            if forward > backward {
                let last = b.collective_permute(ahead, &candidate.pairs);
                let at = shift(b, forward);
                output = gathered_window(b, dot, candidate, [last, other], output, at);
            }
            output
        }
        Form::ReduceScatter { .. } => {
            let at = shift(b, -forward);
            let mut ahead = scattered_block(b, dot, candidate, [windowed, other], None, at);
            let output_shape = b.shape(ahead).clone();
            if forward > backward {
                let received = b.collective_permute(ahead, &candidate.pairs);
                let at = shift(b, 1 - forward);
                ahead = scattered_block(b, dot, candidate, [windowed, other], Some(received), at);
            }
            let at = shift(b, backward);
            let behind = scattered_block(b, dot, candidate, [windowed, other], None, at);
            let state = bidirectional_state_shape(
                &windowed_shape,
                &other_shape,
                &output_shape,
                candidate.form,
            );
            let looped = start_loop(b, &state, 1, &[windowed, other, ahead, behind], loop_ids);
            let ahead = element(b, looped, &state, 3);
            let behind = element(b, looped, &state, 4);
            let received_ahead = b.collective_permute(ahead, &candidate.pairs);
            let received_behind = b.collective_permute(behind, &candidate.backward_pairs);
            let own = shift(b, 0);
            let sum = scattered_block(
                b,
                dot,
                candidate,
                [windowed, other],
                Some(received_ahead),
                own,
            );
            b.binary(Opcode::Add, sum, received_behind)
        }
    }
}

/// The loop over `state` from the given first step and other state
/// elements: its initial tuple and the while instruction.
fn start_loop(
    b: &mut Builder<'_>,
    state: &Shape,
    first_step: i64,
    elements: &[InstrId],
    (body, condition): (CompId, CompId),
) -> InstrId {
    let first = b.scalar(PrimitiveType::S32, first_step);
    let mut operands = vec![first];
    operands.extend_from_slice(elements);
    let init = b.add("tuple", Opcode::Tuple, state.clone(), operands, vec![]);
    b.add(
        "windowed_einsum",
        Opcode::While,
        state.clone(),
        vec![init],
        vec![
            (AttrKey::Condition, AttrValue::Computation(condition)),
            (AttrKey::Body, AttrValue::Computation(body)),
        ],
    )
}

/// A loop condition over `state`: its step (element 0) below `end`.
fn loop_condition(ctx: &mut ModuleContext, state: &Shape, end: i64) -> HloComputation {
    let condition_name = ctx.fresh("windowed_einsum_condition");
    let mut c = Builder::new(ctx, &condition_name, 4);
    let param = parameter(&mut c, state);
    let index = element(&mut c, param, state, 0);
    let end = c.scalar(PrimitiveType::S32, end);
    c.comp.root = c.compare(index, end, "LT");
    std::mem::replace(&mut c.comp, HloComputation::new(""))
}

fn parameter(b: &mut Builder<'_>, shape: &Shape) -> InstrId {
    let name = b.ctx.fresh("param");
    let mut p = HloInstruction::new(name, Opcode::Parameter, shape.clone(), vec![]);
    p.parameter_number = Some(0);
    b.push(p)
}

fn element(b: &mut Builder<'_>, tuple: InstrId, shape: &Shape, k: usize) -> InstrId {
    b.add(
        "get-tuple-element",
        Opcode::GetTupleElement,
        shape.tuple_elements()[k].clone(),
        vec![tuple],
        vec![(AttrKey::Index, AttrValue::Int(k as i64))],
    )
}

/// `old` with each candidate's pair replaced by its loop (`loops`: body
/// and condition per candidate) and the peeled last step.
fn rewrite(
    ctx: &mut ModuleContext,
    old: HloComputation,
    candidates: &[Candidate],
    loops: &[(CompId, CompId)],
) -> HloComputation {
    let mut b = Builder::new(
        ctx,
        &old.name,
        old.instructions.len() + 24 * candidates.len(),
    );
    b.comp.execution_thread = old.execution_thread.clone();
    let dots: Vec<HloInstruction> = candidates
        .iter()
        .map(|c| old.instr(c.dot).clone())
        .collect();
    // The instruction the windows come from, in `old`.
    let windowed_sources: Vec<InstrId> = candidates
        .iter()
        .map(|c| match c.form {
            Form::AllGather { all_gather } => old.instr(all_gather).operands[0],
            Form::ReduceScatter { .. } => old.instr(c.dot).operands[c.side],
        })
        .collect();
    let replaced_sharding: Vec<_> = candidates
        .iter()
        .map(|c| old.instr(c.replaced()).sharding.clone())
        .collect();
    let mut map: Vec<InstrId> = Vec::with_capacity(old.instructions.len());
    for (index, mut instr) in old.instructions.into_iter().enumerate() {
        let id = InstrId(index as u32);
        if candidates.iter().any(|c| c.dropped() == id) {
            map.push(InstrId(u32::MAX));
            continue;
        }
        if let Some(k) = candidates.iter().position(|c| c.replaced() == id) {
            let candidate = &candidates[k];
            let dot = &dots[k];
            let windowed = map[windowed_sources[k].index()];
            let other = map[dot.operands[1 - candidate.side].index()];
            if candidate.bidirectional {
                let result = bidirectional_pair(&mut b, dot, candidate, windowed, other, loops[k]);
                b.comp.instr_mut(result).sharding = replaced_sharding[k].clone();
                map.push(result);
                continue;
            }
            let output_shape = match candidate.form {
                Form::AllGather { .. } => dot.shape.clone(),
                Form::ReduceScatter { .. } => instr.shape.clone(),
            };
            let (first, output) = match candidate.form {
                Form::AllGather { .. } => {
                    let ty = output_shape.element_type().unwrap_or(PrimitiveType::F32);
                    let zero = b.scalar(ty, 0);
                    (0, b.broadcast(zero, output_shape.dims(), &[]))
                }
                Form::ReduceScatter { .. } => {
                    let zero = b.scalar(PrimitiveType::S32, 0);
                    (
                        1,
                        step(&mut b, dot, candidate, [windowed, other], None, zero),
                    )
                }
            };
            let state = Shape::tuple(vec![
                Shape::scalar(PrimitiveType::S32),
                b.shape(windowed).clone(),
                b.shape(other).clone(),
                output_shape,
            ]);
            let looped = start_loop(&mut b, &state, first, &[windowed, other, output], loops[k]);
            let output = element(&mut b, looped, &state, 3);
            let result = match candidate.form {
                Form::AllGather { .. } => {
                    let window = element(&mut b, looped, &state, 1);
                    let last = b.scalar(PrimitiveType::S32, candidate.group_size - 1);
                    step(&mut b, dot, candidate, [window, other], Some(output), last)
                }
                Form::ReduceScatter { .. } => output,
            };
            // The entry root keeps its global sharding for the launcher.
            b.comp.instr_mut(result).sharding = replaced_sharding[k].clone();
            map.push(result);
            continue;
        }
        for operand in instr
            .operands
            .iter_mut()
            .chain(instr.control_predecessors.iter_mut())
        {
            *operand = map[operand.index()];
        }
        map.push(b.push(instr));
    }
    b.comp.root = map[old.root.index()];
    std::mem::replace(&mut b.comp, HloComputation::new(""))
}

#[cfg(test)]
mod tests {
    use super::sequential_computations;

    #[test]
    fn loop_bodies_are_programs_reducers_and_fusions_are_not() {
        let module = xla_hlo_parser::parse_module(
            "HloModule m

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%fused (p: f32[4]) -> f32[4] {
  %p = f32[4] parameter(0)
  ROOT %n = f32[4] negate(%p)
}

%body (t: (s32[], f32[4])) -> (s32[], f32[4]) {
  %t = (s32[], f32[4]) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %x = f32[4] get-tuple-element(%t), index=1
  %f = f32[4] fusion(%x), kind=kLoop, calls=%fused
  ROOT %r = (s32[], f32[4]) tuple(%i, %f)
}

%cond (t: (s32[], f32[4])) -> pred[] {
  %t = (s32[], f32[4]) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %z = s32[] constant(3)
  ROOT %lt = pred[] compare(%i, %z), direction=LT
}

ENTRY %e (x: f32[4]) -> f32[] {
  %x = f32[4] parameter(0)
  %zero = s32[] constant(0)
  %init = (s32[], f32[4]) tuple(%zero, %x)
  %w = (s32[], f32[4]) while(%init), condition=%cond, body=%body
  %y = f32[4] get-tuple-element(%w), index=1
  %c = f32[] constant(0)
  ROOT %sum = f32[] reduce(%y, %c), dimensions={0}, to_apply=%add
}
",
        )
        .unwrap();
        let sequential = sequential_computations(&module);
        let named = |name: &str| {
            let index = module
                .computations
                .iter()
                .position(|c| c.name == name)
                .unwrap();
            sequential[index]
        };
        assert!(named("e") && named("body") && named("cond"));
        assert!(!named("add") && !named("fused"));
    }
}
