//! The MPMD split: one program per task (stage and direction), taking the
//! microbatch's inputs, the task's accumulators and the values other tasks
//! send it, and returning its updated accumulators and the values it sends;
//! plus the prologue (the entry up to the loop: the initial carry) and the
//! epilogue (the entry after the loop, given the final carry).
//!
//! Invariants: every body instruction is in exactly one task program, or
//! recomputed (free) in each task that needs it; a value crossing tasks is
//! an output of its producer and an input of each consumer, once per
//! microbatch; each program is a module of its own that the verifier
//! accepts (checked by the tests) and that prints as HLO text.

use crate::error::MpmdError;
use crate::stages::{BodyLabels, CarryKind, Label, MicrobatchLoop, TaskKey};
use std::collections::BTreeSet;
use std::sync::Arc;
use xla_hlo_ir::attrs::AttrKey;
use xla_hlo_ir::{HloComputation, HloInstruction, HloModule, HloSharding, InstrId, Opcode, Shape};
use xla_hlo_utils::inline::remove_uncalled_computations;
use xla_spmd_partitioner::partition::dce;

/// A value computed by one task and read by others (an activation going
/// forward, a gradient going backward, or an activation kept for the
/// backward pass).
#[derive(Clone, Debug)]
pub struct CrossValue {
    /// The producing instruction's name in the loop body.
    pub name: String,
    pub shape: Shape,
    /// Chain position of the producer.
    pub producer: usize,
    /// Chain positions of the consumers, ascending.
    pub consumers: Vec<usize>,
}

/// What one parameter of a task program is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskInput {
    /// Carried element `j` read as is: the counter (this microbatch's
    /// index) or a loop invariant.
    LoopInput(usize),
    /// Accumulator `j`'s value before this microbatch.
    Accumulator(usize),
    /// A value another task produced for this microbatch.
    Value(usize),
}

/// What one element of a task program's result tuple is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskOutput {
    /// Accumulator `j` after this microbatch.
    Accumulator(usize),
    /// A value other tasks read.
    Value(usize),
}

/// One task's program.
#[derive(Clone, Debug)]
pub struct TaskProgram {
    pub key: TaskKey,
    pub module: HloModule,
    pub inputs: Vec<TaskInput>,
    pub outputs: Vec<TaskOutput>,
    /// With tensor parallelism: each input's and output's sharding over
    /// the stage's device group (the module is then partitioned: its
    /// parameters and results are the devices' tiles under these).
    pub input_shardings: Vec<Option<HloSharding>>,
    pub output_shardings: Vec<Option<HloSharding>>,
}

/// The cross-task values of a labelled body.
pub(crate) fn cross_values(
    body: &HloComputation,
    labels: &BodyLabels,
) -> (Vec<CrossValue>, Vec<Option<usize>>) {
    let users = body.users();
    let mut values = Vec::new();
    let mut value_of = vec![None; body.instructions.len()];
    for (i, instr) in body.instructions.iter().enumerate() {
        let Label::Task(producer) = labels.labels[i] else {
            continue;
        };
        let consumers: BTreeSet<usize> = users[i]
            .iter()
            .filter_map(|u| match labels.labels[u.index()] {
                Label::Task(t) if t != producer => Some(t),
                _ => None,
            })
            .collect();
        if consumers.is_empty() {
            continue;
        }
        value_of[i] = Some(values.len());
        values.push(CrossValue {
            name: instr.name.clone(),
            shape: instr.shape.clone(),
            producer,
            consumers: consumers.into_iter().collect(),
        });
    }
    (values, value_of)
}

/// A module whose entry is `entry`, with the computations of `base` it
/// calls, and no entry-specific configuration.
fn module_with_entry(base: &HloModule, name: String, entry: HloComputation) -> HloModule {
    let mut module = base.clone();
    module.name = name;
    module.computations.push(entry);
    module.entry = xla_hlo_ir::CompId(module.computations.len() as u32 - 1);
    module_config_without_entry_layout(&mut module);
    module.config.is_scheduled = false;
    remove_uncalled_computations(&mut module);
    module
}

/// The program of task `order`.
pub(crate) fn task_program(
    module: &HloModule,
    microbatch_loop: &MicrobatchLoop,
    labels: &BodyLabels,
    value_of: &[Option<usize>],
    order: usize,
    num_stages: usize,
) -> Result<TaskProgram, MpmdError> {
    let body = module.comp(microbatch_loop.body);
    let n = body.instructions.len();
    let key = TaskKey::from_order(order, num_stages);
    // The task's instructions and the free ones they read.
    let mut included = vec![false; n];
    let mut stack: Vec<usize> = (0..n)
        .filter(|&i| labels.labels[i] == Label::Task(order))
        .collect();
    while let Some(i) = stack.pop() {
        if included[i] {
            continue;
        }
        included[i] = true;
        for o in &body.instructions[i].operands {
            if labels.labels[o.index()] == Label::Free && !included[o.index()] {
                stack.push(o.index());
            }
        }
    }
    let users = body.users();
    let mut computation = HloComputation::new(format!(
        "{}.{}{}",
        body.name,
        key.direction.letter(),
        key.stage
    ));
    let mut new_id = vec![None::<InstrId>; n];
    let mut inputs = Vec::new();
    let mut input_shardings = Vec::new();
    // A carried element's sharding (when the module has been propagated):
    // what the accumulators keep between microbatches.
    let carry_shardings = body
        .parameters
        .first()
        .and_then(|&p| body.instr(p).sharding.clone());
    let carry_sharding = |j: usize| -> Option<HloSharding> {
        match carry_shardings.as_deref()? {
            HloSharding::Single(all) => Some(HloSharding::Single(all.clone())),
            HloSharding::Tuple(leaves) => leaves.get(j).cloned().map(HloSharding::Single),
        }
    };
    // Parameters: every operand of an included instruction that is not
    // included, in instruction order.
    for i in 0..n {
        if !included[i] {
            continue;
        }
        for o in &body.instructions[i].operands {
            let o = o.index();
            if included[o] || new_id[o].is_some() {
                continue;
            }
            let source = &body.instructions[o];
            let input = match labels.labels[o] {
                Label::LoopInput => TaskInput::LoopInput(
                    source
                        .int_attr(AttrKey::Index)
                        .and_then(|k| usize::try_from(k).ok())
                        .unwrap_or(usize::MAX),
                ),
                Label::AccumulatorRead(j) => TaskInput::Accumulator(j),
                Label::Task(_) => TaskInput::Value(value_of[o].ok_or_else(|| {
                    MpmdError::Unsupported(format!(
                        "%{} crosses tasks without a transfer",
                        source.name
                    ))
                })?),
                other => {
                    return Err(MpmdError::Unsupported(format!(
                        "%{} ({other:?}) cannot be an input of {key}",
                        source.name
                    )))
                }
            };
            let mut parameter = HloInstruction::new(
                source.name.clone(),
                Opcode::Parameter,
                source.shape.clone(),
                vec![],
            );
            parameter.parameter_number = Some(inputs.len() as i64);
            let sharding = match input {
                TaskInput::LoopInput(j) | TaskInput::Accumulator(j) => carry_sharding(j),
                TaskInput::Value(_) => source.sharding.as_deref().cloned(),
            };
            parameter.sharding = sharding.clone().map(Arc::new);
            new_id[o] = Some(computation.add(parameter));
            inputs.push(input);
            input_shardings.push(sharding);
        }
    }
    for i in 0..n {
        if !included[i] {
            continue;
        }
        let mut copy = body.instructions[i].clone();
        copy.operands = copy
            .operands
            .iter()
            .map(|o| new_id[o.index()].expect("operands are added first"))
            .collect();
        copy.control_predecessors.clear();
        new_id[i] = Some(computation.add(copy));
    }
    // Outputs: the task's accumulators, then the values others read.
    let root = body.root_instr();
    let mut outputs = Vec::new();
    let mut output_ids = Vec::new();
    let mut output_shardings: Vec<Option<HloSharding>> = Vec::new();
    for (j, kind) in microbatch_loop.carry.iter().enumerate() {
        if *kind == CarryKind::Accumulator && labels.owners[j] == Some(order) {
            outputs.push(TaskOutput::Accumulator(j));
            output_ids.push(new_id[root.operands[j].index()].expect("owned updates are included"));
            output_shardings.push(carry_sharding(j));
        }
    }
    for i in 0..n {
        if labels.labels[i] != Label::Task(order) {
            continue;
        }
        if let Some(value) = value_of[i] {
            debug_assert!(users[i]
                .iter()
                .any(|u| labels.labels[u.index()] != Label::Task(order)));
            outputs.push(TaskOutput::Value(value));
            output_ids.push(new_id[i].expect("included"));
            output_shardings.push(body.instructions[i].sharding.as_deref().cloned());
        }
    }
    let shapes = output_ids
        .iter()
        .map(|id| computation.instr(*id).shape.clone())
        .collect();
    let root_name = format!("{}.outputs", computation.name);
    let mut root_tuple =
        HloInstruction::new(root_name, Opcode::Tuple, Shape::tuple(shapes), output_ids);
    if output_shardings.iter().any(Option::is_some) {
        let leaves = output_shardings
            .iter()
            .map(|s| match s {
                Some(HloSharding::Single(leaf)) => leaf.clone(),
                _ => HloSharding::replicated().leaves()[0].clone(),
            })
            .collect();
        root_tuple.sharding = Some(Arc::new(HloSharding::Tuple(leaves)));
    }
    computation.root = computation.add(root_tuple);
    let name = format!("{}_{}{}", module.name, key.direction.letter(), key.stage);
    Ok(TaskProgram {
        key,
        module: module_with_entry(module, name, computation),
        inputs,
        outputs,
        input_shardings,
        output_shardings,
    })
}

/// The entry up to the loop: its result is the loop's initial carry.
pub(crate) fn prologue(module: &HloModule, microbatch_loop: &MicrobatchLoop) -> HloModule {
    let mut prologue = module.clone();
    prologue.name = format!("{}_prologue", module.name);
    let entry = prologue.comp_mut(prologue.entry);
    entry.root = entry.instr(microbatch_loop.while_id).operands[0];
    dce(prologue.comp_mut(prologue.entry));
    module_config_without_entry_layout(&mut prologue);
    remove_uncalled_computations(&mut prologue);
    prologue
}

/// The entry after the loop: the loop's result becomes one more parameter
/// (after the entry's own).
pub(crate) fn epilogue(module: &HloModule, microbatch_loop: &MicrobatchLoop) -> HloModule {
    let mut epilogue = module.clone();
    epilogue.name = format!("{}_epilogue", module.name);
    let entry = epilogue.comp_mut(epilogue.entry);
    // The loop instruction itself becomes the parameter, so every use still
    // follows its definition.
    let number = entry.parameters.len();
    let while_instr = entry.instr_mut(microbatch_loop.while_id);
    let mut carry = HloInstruction::new(
        while_instr.name.clone(),
        Opcode::Parameter,
        while_instr.shape.clone(),
        vec![],
    );
    carry.parameter_number = Some(number as i64);
    carry.attrs = while_instr
        .attrs
        .iter()
        .filter(|a| a.key == AttrKey::Metadata)
        .cloned()
        .collect();
    *while_instr = carry;
    entry.parameters.push(microbatch_loop.while_id);
    dce(epilogue.comp_mut(epilogue.entry));
    module_config_without_entry_layout(&mut epilogue);
    remove_uncalled_computations(&mut epilogue);
    epilogue
}

fn module_config_without_entry_layout(module: &mut HloModule) {
    module.config.entry_computation_layout = None;
    module.config.input_output_alias = None;
    module.config.buffer_donor = None;
    module.config.allow_spmd_sharding_propagation_to_parameters = None;
    module.config.allow_spmd_sharding_propagation_to_output = None;
}
