//! Which stage computes what: the microbatch loop (a counted while loop in
//! the entry computation, JAX's `lax.scan` over microbatches), its carry
//! (counter, loop invariants, accumulators) and a task label for every
//! instruction of its body.
//!
//! A task is one stage's forward or backward work on one microbatch.
//! Stages come from scopes: an instruction whose `metadata={op_name=...}`
//! names a `stage_K` scope (JAX's `jax.named_scope("stage_K")`) belongs to
//! scope K; scopes are grouped contiguously into the pipeline's stages.
//! An op_name under `transpose(...)` (JAX's autodiff transposition) is
//! backward work, anything else forward work.
//!
//! Unmarked instructions are labelled from their neighbours: one that reads
//! nothing but loop inputs and constants is free (every task that needs it
//! recomputes it, e.g. slicing its microbatch out of the stacked inputs);
//! otherwise it takes the latest task among its operands (so the loss
//! follows the last stage's forward work and an accumulation follows the
//! gradient it adds), and failing that the earliest among its users.
//!
//! Invariants: tasks are ordered F0 < F1 < ... < F(S-1) < B(S-1) < ... < B0,
//! and every labelled instruction reads only values of its own or earlier
//! tasks (checked; a value flowing backwards is an error naming both
//! instructions); each accumulator is read and updated by one task.

use crate::error::MpmdError;
use xla_hlo_ir::attrs::AttrKey;
use xla_hlo_ir::literal::Literal;
use xla_hlo_ir::{CompId, HloComputation, HloInstruction, HloModule, InstrId, Opcode};

/// Forward or backward work of a stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Direction {
    Forward,
    Backward,
}

impl Direction {
    pub fn letter(self) -> char {
        match self {
            Direction::Forward => 'F',
            Direction::Backward => 'B',
        }
    }
}

/// One stage's forward or backward work (for every microbatch).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TaskKey {
    pub stage: usize,
    pub direction: Direction,
}

impl TaskKey {
    /// Position in the chain F0 < ... < F(S-1) < B(S-1) < ... < B0.
    pub fn order(self, num_stages: usize) -> usize {
        match self.direction {
            Direction::Forward => self.stage,
            Direction::Backward => 2 * num_stages - 1 - self.stage,
        }
    }

    /// The task at `order` in the chain of `num_stages` stages.
    pub fn from_order(order: usize, num_stages: usize) -> TaskKey {
        if order < num_stages {
            TaskKey {
                stage: order,
                direction: Direction::Forward,
            }
        } else {
            TaskKey {
                stage: 2 * num_stages - 1 - order,
                direction: Direction::Backward,
            }
        }
    }
}

impl std::fmt::Display for TaskKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let direction = match self.direction {
            Direction::Forward => "forward",
            Direction::Backward => "backward",
        };
        write!(f, "stage {} {direction}", self.stage)
    }
}

/// What one element of the loop's carried tuple is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CarryKind {
    /// The microbatch counter (`i` of the scan).
    Counter,
    /// Passed through unchanged (weights, the stacked microbatches).
    Invariant,
    /// Updated every iteration by one task (loss and gradient sums).
    Accumulator,
}

/// The loop that gets pipelined.
#[derive(Clone, Debug)]
pub struct MicrobatchLoop {
    pub while_id: InstrId,
    pub body: CompId,
    pub condition: CompId,
    pub carry: Vec<CarryKind>,
    /// Element index of the counter in the carry.
    pub counter: usize,
    /// The counter's value in the first iteration.
    pub counter_start: i64,
    pub trip_count: usize,
}

/// A body instruction's role.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Label {
    /// The body's parameter.
    CarryParameter,
    /// `get-tuple-element` of the counter or of a loop invariant.
    LoopInput,
    /// `get-tuple-element` of accumulator `j`: an input of its owner task.
    AccumulatorRead(usize),
    /// Recomputed by every task that needs it (reads only loop inputs).
    Free,
    /// Computed by the task at this chain position.
    Task(usize),
    /// The body's root tuple (the next iteration's carry).
    Root,
}

/// The scope index an op_name names (`.../stage_K/...`, innermost wins)
/// and whether it is backward work.
pub(crate) fn scope_of(op_name: &str, prefix: &str) -> Option<(usize, Direction)> {
    let mut found = None;
    let mut rest = op_name;
    let mut offset = 0;
    while let Some(at) = rest.find(prefix) {
        let start = offset + at;
        let boundary =
            start == 0 || matches!(op_name.as_bytes()[start - 1], b'/' | b'(' | b';' | b' ');
        let digits: String = op_name[start + prefix.len()..]
            .chars()
            .take_while(|c| c.is_ascii_digit())
            .collect();
        if boundary && !digits.is_empty() {
            if let Ok(k) = digits.parse::<usize>() {
                found = Some(k);
            }
        }
        offset = start + prefix.len();
        rest = &op_name[offset..];
    }
    let direction = if op_name.contains("transpose(") {
        Direction::Backward
    } else {
        Direction::Forward
    };
    found.map(|k| (k, direction))
}

pub(crate) fn scalar_int(instr: &HloInstruction) -> Option<i128> {
    if instr.opcode != Opcode::Constant {
        return None;
    }
    match instr.literal.as_deref()? {
        Literal::Array(array) if array.len() == 1 && !array.elided => Some(array.get_i128(0)),
        _ => None,
    }
}

fn tuple_index(instr: &HloInstruction) -> Option<usize> {
    (instr.opcode == Opcode::GetTupleElement)
        .then(|| instr.int_attr(AttrKey::Index))
        .flatten()
        .and_then(|k| usize::try_from(k).ok())
}

/// `get-tuple-element(parameter(0)), index=k` of `comp`: `Some(k)`.
pub(crate) fn carry_read(comp: &HloComputation, id: InstrId) -> Option<usize> {
    let instr = comp.instructions.get(id.index())?;
    let index = tuple_index(instr)?;
    let operand = comp.instructions.get(instr.operands.first()?.index())?;
    (operand.opcode == Opcode::Parameter && operand.parameter_number == Some(0)).then_some(index)
}

fn has_stage_marker(comp: &HloComputation, prefix: &str) -> bool {
    comp.instructions
        .iter()
        .any(|i| i.op_name().and_then(|n| scope_of(n, prefix)).is_some())
}

/// Finds the microbatch loop: the entry's while loop whose body holds
/// stage-marked instructions, with a counter compared against a constant.
pub fn find_microbatch_loop(module: &HloModule, prefix: &str) -> Result<MicrobatchLoop, MpmdError> {
    let entry = module.entry_computation();
    let candidates: Vec<InstrId> = entry
        .ids()
        .filter(|&id| {
            let instr = entry.instr(id);
            instr.opcode == Opcode::While
                && instr
                    .computation_attr(AttrKey::Body)
                    .is_some_and(|body| has_stage_marker(module.comp(body), prefix))
        })
        .collect();
    let while_id = match candidates.as_slice() {
        [] => {
            return Err(MpmdError::Loop(format!(
                "no while loop of the entry computation %{} has instructions under a `{prefix}N` scope (mark stages with jax.named_scope(\"{prefix}0\"), ...)",
                entry.name
            )))
        }
        [one] => *one,
        [first, second, ..] => {
            return Err(MpmdError::Loop(format!(
                "two while loops have stage-marked bodies (%{} and %{}); pipeline one loop per program",
                entry.instr(*first).name,
                entry.instr(*second).name
            )))
        }
    };
    let instr = entry.instr(while_id);
    let body_id = instr
        .computation_attr(AttrKey::Body)
        .expect("checked above");
    let condition_id = instr
        .computation_attr(AttrKey::Condition)
        .ok_or_else(|| MpmdError::Loop(format!("%{} has no condition", instr.name)))?;
    let body = module.comp(body_id);
    let condition = module.comp(condition_id);
    let carry_len = instr.shape.tuple_elements().len();
    let root = body.root_instr();
    if root.opcode != Opcode::Tuple || root.operands.len() != carry_len || carry_len == 0 {
        return Err(MpmdError::Unsupported(format!(
            "the root %{} of loop body %{} is not a tuple of the {carry_len} carried values",
            root.name, body.name
        )));
    }
    // The condition: compare(gte(param, c), constant(limit)), direction=LT.
    let cond_root = condition.root_instr();
    let counter_and_limit = (cond_root.opcode == Opcode::Compare
        && cond_root.ident_attr(AttrKey::Direction) == Some("LT")
        && cond_root.operands.len() == 2)
        .then(|| {
            let counter = carry_read(condition, cond_root.operands[0])?;
            let limit = scalar_int(condition.instr(cond_root.operands[1]))?;
            Some((counter, limit))
        })
        .flatten();
    let Some((counter, limit)) = counter_and_limit else {
        return Err(MpmdError::Loop(format!(
            "the condition %{} of %{} is not `counter < constant` (a scan over microbatches)",
            cond_root.name, instr.name
        )));
    };
    let mut carry = Vec::with_capacity(carry_len);
    for (j, &operand) in root.operands.iter().enumerate() {
        let kind = if carry_read(body, operand) == Some(j) {
            CarryKind::Invariant
        } else if j == counter {
            let update = body.instr(operand);
            let increments = update.opcode == Opcode::Add
                && update.operands.len() == 2
                && ((carry_read(body, update.operands[0]) == Some(j)
                    && scalar_int(body.instr(update.operands[1])) == Some(1))
                    || (carry_read(body, update.operands[1]) == Some(j)
                        && scalar_int(body.instr(update.operands[0])) == Some(1)));
            if !increments {
                return Err(MpmdError::Loop(format!(
                    "the counter (element {j}) of %{} is updated by %{}, not by adding 1",
                    instr.name, update.name
                )));
            }
            CarryKind::Counter
        } else {
            CarryKind::Accumulator
        };
        carry.push(kind);
    }
    let init = entry.instr(
        *instr
            .operands
            .first()
            .ok_or_else(|| MpmdError::Loop(format!("%{} has no operand", instr.name)))?,
    );
    let start = (init.opcode == Opcode::Tuple)
        .then(|| {
            init.operands
                .get(counter)
                .map(|&id| scalar_int(entry.instr(id)))
        })
        .flatten()
        .flatten();
    let Some(start) = start else {
        return Err(MpmdError::Loop(format!(
            "the counter's initial value in %{} is not a constant",
            init.name
        )));
    };
    let trip_count = usize::try_from(limit - start).unwrap_or(0);
    if trip_count == 0 {
        return Err(MpmdError::Loop(format!(
            "%{} runs no iteration ({start}..{limit})",
            instr.name
        )));
    }
    Ok(MicrobatchLoop {
        while_id,
        body: body_id,
        condition: condition_id,
        carry,
        counter,
        counter_start: start as i64,
        trip_count,
    })
}

/// A label not decided yet (from operands), to be taken from users.
const UNDECIDED: usize = usize::MAX;

/// Every body instruction's label, and each accumulator's owner task
/// (chain position), for `num_stages` stages.
pub(crate) struct BodyLabels {
    pub labels: Vec<Label>,
    pub owners: Vec<Option<usize>>,
}

/// Labels the loop body (see the module header).
pub(crate) fn label_body(
    module: &HloModule,
    microbatch_loop: &MicrobatchLoop,
    prefix: &str,
    num_stages: usize,
) -> Result<BodyLabels, MpmdError> {
    let body = module.comp(microbatch_loop.body);
    let n = body.instructions.len();
    let order = topological_order(body)?;
    // Scopes, grouped into stages.
    let scopes: Vec<Option<(usize, Direction)>> = body
        .instructions
        .iter()
        .map(|i| i.op_name().and_then(|name| scope_of(name, prefix)))
        .collect();
    let scope_count = scopes
        .iter()
        .flatten()
        .map(|(k, _)| k + 1)
        .max()
        .unwrap_or(0);
    if scope_count < num_stages {
        return Err(MpmdError::Options(format!(
            "{num_stages} stages asked for, but loop body %{} has only {scope_count} `{prefix}N` scopes",
            body.name
        )));
    }
    if scope_count % num_stages != 0 {
        return Err(MpmdError::Options(format!(
            "{scope_count} `{prefix}N` scopes in %{} cannot be grouped evenly into {num_stages} stages",
            body.name
        )));
    }
    for k in 0..scope_count {
        if !scopes.iter().flatten().any(|&(scope, _)| scope == k) {
            return Err(MpmdError::Stages(format!(
                "scope `{prefix}{k}` has no instruction in %{} (scopes must be numbered 0..{} without gaps)",
                body.name,
                scope_count - 1
            )));
        }
    }
    let per_stage = scope_count / num_stages;
    let explicit = |i: usize| {
        scopes[i].map(|(k, direction)| {
            TaskKey {
                stage: k / per_stage,
                direction,
            }
            .order(num_stages)
        })
    };
    let carry = &microbatch_loop.carry;
    let mut labels = vec![Label::Free; n];
    for &i in &order {
        let instr = &body.instructions[i];
        labels[i] = if instr.opcode == Opcode::Parameter {
            Label::CarryParameter
        } else if let Some(j) = carry_read(body, InstrId(i as u32)) {
            match carry.get(j) {
                Some(CarryKind::Accumulator) => Label::AccumulatorRead(j),
                Some(_) => Label::LoopInput,
                None => {
                    return Err(MpmdError::Unsupported(format!(
                        "%{} reads element {j} of a {}-element carry",
                        instr.name,
                        carry.len()
                    )))
                }
            }
        } else {
            let operand_labels: Vec<Label> =
                instr.operands.iter().map(|o| labels[o.index()]).collect();
            if operand_labels.contains(&Label::CarryParameter) {
                return Err(MpmdError::Unsupported(format!(
                    "%{} uses the loop's whole carried tuple; only its elements can be split among stages",
                    instr.name
                )));
            }
            let latest = operand_labels
                .iter()
                .filter_map(|l| match l {
                    Label::Task(t) if *t != UNDECIDED => Some(*t),
                    _ => None,
                })
                .max();
            let only_inputs = operand_labels
                .iter()
                .all(|l| matches!(l, Label::Free | Label::LoopInput));
            if i == body.root.index() {
                Label::Root
            } else if let Some(t) = explicit(i) {
                Label::Task(t)
            } else if only_inputs {
                Label::Free
            } else if let Some(t) = latest {
                Label::Task(t)
            } else {
                // Decided from its users below.
                Label::Task(UNDECIDED)
            }
        };
    }
    // Unknown instructions take the earliest task among their users.
    let users = body.users();
    for &i in order.iter().rev() {
        if labels[i] != Label::Task(UNDECIDED) {
            continue;
        }
        let earliest = users[i]
            .iter()
            .filter(|u| u.index() != body.root.index())
            .filter_map(|u| match labels[u.index()] {
                Label::Task(t) if t != UNDECIDED => Some(t),
                _ => None,
            })
            .min();
        match earliest {
            Some(t) => labels[i] = Label::Task(t),
            None => {
                return Err(MpmdError::Stages(format!(
                    "no stage computes %{} in %{}: it reads no stage's value and no stage reads it",
                    body.instructions[i].name, body.name
                )))
            }
        }
    }
    // Owners of the accumulators: the task computing each one's update.
    let root = body.root_instr();
    let mut owners = vec![None; carry.len()];
    for (j, kind) in carry.iter().enumerate() {
        if *kind != CarryKind::Accumulator {
            continue;
        }
        let update = root.operands[j];
        match labels[update.index()] {
            Label::Task(t) => owners[j] = Some(t),
            _ => {
                return Err(MpmdError::Unsupported(format!(
                    "carried element {j} is updated by %{}, which no stage computes",
                    body.instr(update).name
                )))
            }
        }
    }
    // Accumulator reads go to their owner; nothing else may read them.
    for i in 0..n {
        if let Label::AccumulatorRead(j) = labels[i] {
            let owner = owners[j].expect("accumulators have owners");
            for user in &users[i] {
                if user.index() == body.root.index() {
                    continue;
                }
                if labels[user.index()] != Label::Task(owner) {
                    return Err(MpmdError::Unsupported(format!(
                        "accumulator %{} is updated by {} but read by %{} ({})",
                        body.instructions[i].name,
                        TaskKey::from_order(owner, num_stages),
                        body.instr(*user).name,
                        describe(labels[user.index()], num_stages)
                    )));
                }
            }
        }
    }
    // The chain: no value flows to an earlier task.
    for i in 0..n {
        let Label::Task(t) = labels[i] else { continue };
        for operand in &body.instructions[i].operands {
            if let Label::Task(source) = labels[operand.index()] {
                if source > t {
                    return Err(MpmdError::Stages(format!(
                        "stage markers do not cut %{} into a chain: %{} ({}) uses %{} ({}), a value flowing backwards",
                        body.name,
                        body.instructions[i].name,
                        TaskKey::from_order(t, num_stages),
                        body.instr(*operand).name,
                        TaskKey::from_order(source, num_stages)
                    )));
                }
            }
        }
    }
    for stage in 0..num_stages {
        let forward = TaskKey {
            stage,
            direction: Direction::Forward,
        }
        .order(num_stages);
        if !labels.contains(&Label::Task(forward)) {
            return Err(MpmdError::Stages(format!(
                "stage {stage} has no forward work in %{} (its scopes hold only constants and loop inputs)",
                body.name
            )));
        }
    }
    Ok(BodyLabels { labels, owners })
}

fn describe(label: Label, num_stages: usize) -> String {
    match label {
        Label::Task(t) => TaskKey::from_order(t, num_stages).to_string(),
        Label::Free => "recomputed by every stage".into(),
        other => format!("{other:?}"),
    }
}

/// Reads elements of tuples built in the body straight from the tuple's
/// operands (what an inlined call's result tuple leaves behind), then drops
/// what nothing reads any more, so no tuple bundles values of different
/// stages.
pub(crate) fn forward_tuple_elements(comp: &mut HloComputation) {
    let n = comp.instructions.len();
    for i in 0..n {
        let instr = &comp.instructions[i];
        let Some(k) = tuple_index(instr) else {
            continue;
        };
        let Some(&tuple) = instr.operands.first() else {
            continue;
        };
        let source = &comp.instructions[tuple.index()];
        if source.opcode != Opcode::Tuple {
            continue;
        }
        if let Some(&element) = source.operands.get(k) {
            comp.replace_uses(InstrId(i as u32), element);
        }
    }
    xla_spmd_partitioner::partition::dce(comp);
}

/// The body's instructions in an order where operands come first.
fn topological_order(comp: &HloComputation) -> Result<Vec<usize>, MpmdError> {
    let n = comp.instructions.len();
    let mut state = vec![0u8; n];
    let mut order = Vec::with_capacity(n);
    for start in 0..n {
        if state[start] != 0 {
            continue;
        }
        let mut stack = vec![(start, 0usize)];
        state[start] = 1;
        while let Some((node, next)) = stack.pop() {
            let operands = &comp.instructions[node].operands;
            if next < operands.len() {
                stack.push((node, next + 1));
                let o = operands[next].index();
                if o >= n {
                    return Err(MpmdError::Unsupported(format!(
                        "%{} has an operand outside its computation",
                        comp.instructions[node].name
                    )));
                }
                match state[o] {
                    0 => {
                        state[o] = 1;
                        stack.push((o, 0));
                    }
                    1 => {
                        return Err(MpmdError::Unsupported(format!(
                            "%{} is part of a cycle",
                            comp.instructions[o].name
                        )))
                    }
                    _ => {}
                }
            } else {
                state[node] = 2;
                order.push(node);
            }
        }
    }
    Ok(order)
}
