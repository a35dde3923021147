//! Running a pipelined program (`xla_mpmd::PipelineProgram`) by a task table
//! on loopback devices: the prologue computes the loop's initial carry on
//! the host; each stage device of the table (a group of `tensor_parallel`
//! devices, sharing a loopback world for the collectives of its partitioned
//! programs) then runs its tasks in order, each task program on its
//! microbatch's inputs, its accumulators and the values other tasks
//! produced (host values split to each device's tile), sending each value
//! it produces once to every other group that reads it, device `i` to
//! device `i` (`Communicator::send`, tag = value and microbatch), and
//! keeping it for readers in its own group; a received or kept value is
//! freed as soon as its last reader has run; the epilogue turns the final
//! carry (accumulators assembled from their tiles) into the program's
//! results.
//!
//! Invariants: every (stage, microbatch, direction) of the table runs once
//! on each device of group `stage % devices`; results equal the unpipelined program's up
//! to the order of floating-point sums the program itself fixes (each task
//! runs the same instructions on the same values); a device that fails
//! makes the others fail at their next receive instead of waiting out the
//! timeout.

use crate::backend::{Backend, DeviceCommunicator, DeviceContext, Executable};
use crate::error::{first_failure, RuntimeError};
use crate::literal::{assemble_buffers, shard_buffer, Literal};
use collectives::{Communicator, DeviceBuffer, LoopbackCommunicator, LoopbackWorld};
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;
use xla_hlo_ir::{HloSharding, PrimitiveType, Shape};
use xla_mpmd::{
    CarryKind, PipelineProgram, ScheduledTask, TaskInput, TaskKey, TaskOutput, TaskTable,
};

/// What one device did.
#[derive(Clone, Debug, Default)]
pub struct DeviceReport {
    /// Its tasks in the order they ran.
    pub executed: Vec<ScheduledTask>,
    /// Values sent to and received from other devices.
    pub sends: usize,
    pub receives: usize,
    /// Most values (and their bytes) held at once for later readers.
    pub peak_live_values: usize,
    pub peak_live_bytes: u64,
}

/// A pipelined run's results and what each device did.
#[derive(Clone, Debug)]
pub struct PipelineRun {
    pub outputs: Vec<Literal>,
    pub devices: Vec<DeviceReport>,
}

fn execute_error(message: String) -> RuntimeError {
    RuntimeError::Execute {
        backend: "cpu",
        message,
        peer_failed: false,
    }
}

fn transfer_error(message: String) -> RuntimeError {
    RuntimeError::Execute {
        backend: "cpu",
        message,
        peer_failed: true,
    }
}

/// The counter's value as a scalar of its type.
fn counter_literal(shape: &Shape, value: i64) -> Result<Literal, RuntimeError> {
    let ty = shape.element_type().unwrap_or(PrimitiveType::S32);
    let bytes: Vec<u8> = match ty {
        PrimitiveType::S32 => (value as i32).to_le_bytes().to_vec(),
        PrimitiveType::U32 => (value as u32).to_le_bytes().to_vec(),
        PrimitiveType::S64 => value.to_le_bytes().to_vec(),
        PrimitiveType::U64 => (value as u64).to_le_bytes().to_vec(),
        other => {
            return Err(RuntimeError::Arguments(format!(
                "the loop counter has type {other:?}; expected s32, u32, s64 or u64"
            )))
        }
    };
    DeviceBuffer::from_bytes(ty, vec![], &bytes)
        .map(Literal::Array)
        .map_err(|e| RuntimeError::Arguments(e.to_string()))
}

fn run_single(exe: &dyn Executable, args: &[Literal]) -> Result<Vec<Literal>, RuntimeError> {
    exe.execute(&DeviceContext::single(), args)
}

/// Receives value `v` of microbatch `mb` (this device's tile of it, as
/// parameter `param` of task `key` takes it) from the device at the same
/// place in the producer's group.
fn receive(
    program: &PipelineProgram,
    comm: &Mutex<LoopbackCommunicator>,
    place: Place,
    key: TaskKey,
    (v, param): (usize, usize),
    mb: usize,
) -> Result<Literal, RuntimeError> {
    let value = &program.values[v];
    let producer = TaskKey::from_order(value.producer, program.num_stages());
    let source = place.device_in(program.device_of_stage(producer.stage));
    let entry = program.task(key).module.entry_computation();
    let shape = entry
        .parameters
        .get(param)
        .map(|&p| &entry.instr(p).shape)
        .unwrap_or(&value.shape);
    let Shape::Array(array) = shape else {
        return Err(execute_error(format!(
            "%{} has the non-array shape {shape}",
            value.name
        )));
    };
    let buffer = comm
        .lock()
        .map_err(|_| transfer_error("communicator lock poisoned".into()))?
        .recv(
            source,
            message_tag(program, v, mb),
            array.element_type,
            &array.dims,
        )
        .map_err(|e| {
            transfer_error(format!(
                "{key} microbatch {mb} receiving %{} from device {source}: {e}",
                value.name
            ))
        })?;
    Ok(Literal::Array(buffer))
}

/// Where a device sits: its stage device (group) and its index in the
/// group's `tensor_parallel` devices.
#[derive(Clone, Copy)]
struct Place {
    group: usize,
    local: usize,
    tensor_parallel: usize,
}

impl Place {
    /// The device at this place in `group`.
    fn device_in(self, group: usize) -> usize {
        group * self.tensor_parallel + self.local
    }
}

/// This device's tile of a host value under `sharding` (the whole value
/// without one).
fn local_tile(
    value: &Literal,
    sharding: Option<&HloSharding>,
    place: Place,
) -> Result<Literal, RuntimeError> {
    match (sharding, value) {
        (Some(HloSharding::Single(leaf)), Literal::Array(buffer)) if place.tensor_parallel > 1 => {
            Ok(Literal::Array(shard_buffer(
                buffer,
                leaf,
                place.local as i64,
            )?))
        }
        _ => Ok(value.clone()),
    }
}

/// The channel of value `v` of microbatch `mb`: one per message, so
/// arrival order never matters.
fn message_tag(program: &PipelineProgram, v: usize, mb: usize) -> u64 {
    (v * program.microbatches() + mb) as u64
}

/// Device `device`'s part of the run: its tasks in table order; returns
/// its accumulators' final values and what it did.
fn run_device(
    program: &PipelineProgram,
    table: &TaskTable,
    tasks: &[Box<dyn Executable>],
    init: &[Literal],
    place: Place,
    comm: &Mutex<LoopbackCommunicator>,
    group_comm: &Mutex<LoopbackCommunicator>,
) -> Result<(HashMap<usize, Literal>, DeviceReport), RuntimeError> {
    let num_stages = program.num_stages();
    let loop_info = &program.microbatch_loop;
    let device = place.group;
    let context = DeviceContext {
        replica_id: 0,
        partition_id: place.local as i64,
        num_replicas: 1,
        num_partitions: place.tensor_parallel as i64,
        communicator: (place.tensor_parallel > 1).then_some(group_comm as &DeviceCommunicator),
        consistent: false,
    };
    let mut report = DeviceReport::default();
    // This device's accumulators (its tiles of them), by carry element.
    let mut accumulators: HashMap<usize, Literal> = HashMap::new();
    for task in &program.tasks {
        if program.device_of_stage(task.key.stage) != device {
            continue;
        }
        for (output, sharding) in task.outputs.iter().zip(&task.output_shardings) {
            if let TaskOutput::Accumulator(j) = output {
                accumulators.insert(*j, local_tile(&init[*j], sharding.as_ref(), place)?);
            }
        }
    }
    // Values kept for readers on this device: (value, microbatch) ->
    // (literal, readers left).
    let mut kept: HashMap<(usize, usize), (Literal, usize)> = HashMap::new();
    let readers_here = |value: usize| {
        program.values[value]
            .consumers
            .iter()
            .filter(|&&c| {
                program.device_of_stage(TaskKey::from_order(c, num_stages).stage) == device
            })
            .count()
    };
    for scheduled in &table.devices[device] {
        let key = TaskKey {
            stage: scheduled.stage,
            direction: scheduled.direction,
        };
        let order = key.order(num_stages);
        let task = &program.tasks[order];
        let mb = scheduled.microbatch;
        let mut task_args = Vec::with_capacity(task.inputs.len());
        for (param, input) in task.inputs.iter().enumerate() {
            let arg = match *input {
                TaskInput::LoopInput(j) if loop_info.carry.get(j) == Some(&CarryKind::Counter) => {
                    counter_literal(
                        &program.carry_shapes[j],
                        loop_info.counter_start + mb as i64,
                    )?
                }
                TaskInput::LoopInput(j) => {
                    let value = init.get(j).ok_or_else(|| {
                        execute_error(format!(
                            "{key} reads carry element {j}, which does not exist"
                        ))
                    })?;
                    local_tile(value, task.input_shardings[param].as_ref(), place)?
                }
                TaskInput::Accumulator(j) => accumulators.get(&j).cloned().ok_or_else(|| {
                    execute_error(format!(
                        "{key} reads accumulator {j}, kept on another device"
                    ))
                })?,
                TaskInput::Value(v) => match kept.entry((v, mb)) {
                    Entry::Occupied(entry) => entry.get().0.clone(),
                    Entry::Vacant(entry) => {
                        let received = receive(program, comm, place, key, (v, param), mb)?;
                        report.receives += 1;
                        entry.insert((received, readers_here(v))).0.clone()
                    }
                },
            };
            task_args.push(arg);
        }
        let outputs = tasks[order]
            .execute(&context, &task_args)
            .map_err(|e| execute_error(format!("{key} microbatch {mb}: {e}")))?;
        if outputs.len() != task.outputs.len() {
            return Err(execute_error(format!(
                "{key} returned {} values, expected {}",
                outputs.len(),
                task.outputs.len()
            )));
        }
        for (output, literal) in task.outputs.iter().zip(outputs) {
            match *output {
                TaskOutput::Accumulator(j) => {
                    accumulators.insert(j, literal);
                }
                TaskOutput::Value(v) => {
                    let value = &program.values[v];
                    for destination in program.destination_devices(value) {
                        if destination == device {
                            kept.insert((v, mb), (literal.clone(), readers_here(v)));
                            continue;
                        }
                        let buffer = literal.as_array().ok_or_else(|| {
                            execute_error(format!("%{} is not an array", value.name))
                        })?;
                        let destination = place.device_in(destination);
                        comm.lock()
                            .map_err(|_| transfer_error("communicator lock poisoned".into()))?
                            .send(destination, message_tag(program, v, mb), buffer)
                            .map_err(|e| {
                                transfer_error(format!(
                                    "{key} microbatch {mb} sending %{} to device {destination}: {e}",
                                    value.name
                                ))
                            })?;
                        report.sends += 1;
                    }
                }
            }
        }
        // Values whose last reader on this device has run are freed.
        for input in &task.inputs {
            if let TaskInput::Value(v) = *input {
                if let Some(entry) = kept.get_mut(&(v, mb)) {
                    entry.1 = entry.1.saturating_sub(1);
                    if entry.1 == 0 {
                        kept.remove(&(v, mb));
                    }
                }
            }
        }
        let live_bytes: u64 = kept
            .values()
            .map(|(l, _)| {
                l.leaves()
                    .iter()
                    .map(|b| b.bytes().len() as u64)
                    .sum::<u64>()
            })
            .sum();
        report.peak_live_values = report.peak_live_values.max(kept.len());
        report.peak_live_bytes = report.peak_live_bytes.max(live_bytes);
        report.executed.push(*scheduled);
    }
    comm.lock()
        .map_err(|_| transfer_error("communicator lock poisoned".into()))?
        .wait_sends()
        .map_err(|e| transfer_error(format!("waiting for sends: {e}")))?;
    Ok((accumulators, report))
}

/// Runs `program` by `table` on `table.num_devices` loopback devices.
pub fn run_pipeline(
    program: &PipelineProgram,
    table: &TaskTable,
    backend: &dyn Backend,
    args: &[Literal],
    timeout: Duration,
) -> Result<PipelineRun, RuntimeError> {
    if table.num_devices != program.num_devices || table.virtual_stages != program.virtual_stages {
        return Err(RuntimeError::Devices(format!(
            "the task table is for {} devices x {} virtual stages, the program for {} x {}",
            table.num_devices, table.virtual_stages, program.num_devices, program.virtual_stages
        )));
    }
    if table.microbatches != program.microbatches() {
        return Err(RuntimeError::Devices(format!(
            "the task table has {} microbatches, the program's loop runs {}",
            table.microbatches,
            program.microbatches()
        )));
    }
    let prologue = backend.compile(&program.prologue)?;
    let epilogue = backend.compile(&program.epilogue)?;
    let tasks: Vec<Box<dyn Executable>> = program
        .tasks
        .iter()
        .map(|t| backend.compile(&t.module))
        .collect::<Result<_, _>>()?;
    let mut init = run_single(prologue.as_ref(), args)?;
    if init.len() == 1 && program.carry_shapes.len() != 1 {
        if let Literal::Tuple(elements) = init.remove(0) {
            init = elements;
        }
    }
    if init.len() != program.carry_shapes.len() {
        return Err(execute_error(format!(
            "the prologue returned {} values for a carry of {}",
            init.len(),
            program.carry_shapes.len()
        )));
    }
    let loop_info = &program.microbatch_loop;
    let t = program.tensor_parallel.max(1);
    // Each stage's devices share a world for the collectives of its
    // partitioned programs; all devices share one for sends and receives.
    let groups: Vec<LoopbackWorld> = (0..program.num_devices)
        .map(|_| LoopbackWorld::new(t, timeout))
        .collect::<Result<_, _>>()
        .map_err(|e| RuntimeError::Devices(e.to_string()))?;
    let mut group_comms: Vec<Mutex<LoopbackCommunicator>> = Vec::new();
    for world in &groups {
        let comms = world
            .communicators()
            .map_err(|e| RuntimeError::Devices(e.to_string()))?;
        group_comms.extend(comms.into_iter().map(Mutex::new));
    }
    let outcomes = collectives::run_world(program.num_devices * t, timeout, |device, comm| {
        let place = Place {
            group: device / t,
            local: device % t,
            tensor_parallel: t,
        };
        run_device(
            program,
            table,
            &tasks,
            &init,
            place,
            comm,
            &group_comms[device],
        )
    })
    .map_err(|e| RuntimeError::Devices(e.to_string()))?;
    let per_device = first_failure(outcomes)?;
    let mut carry = init.clone();
    carry[loop_info.counter] = counter_literal(
        &program.carry_shapes[loop_info.counter],
        loop_info.counter_start + program.microbatches() as i64,
    )?;
    let mut devices = Vec::with_capacity(per_device.len());
    let mut tiles: HashMap<usize, Vec<Literal>> = HashMap::new();
    for (accumulators, report) in per_device {
        for (j, value) in accumulators {
            tiles.entry(j).or_default().push(value);
        }
        devices.push(report);
    }
    for (j, mut parts) in tiles {
        carry[j] = match program.accumulator_sharding(j) {
            Some(HloSharding::Single(leaf)) if t > 1 => {
                let buffers: Vec<&DeviceBuffer> =
                    parts.iter().filter_map(Literal::as_array).collect();
                let dims = match &program.carry_shapes[j] {
                    Shape::Array(a) => a.dims.clone(),
                    other => {
                        return Err(execute_error(format!(
                            "accumulator {j} has the non-array shape {other}"
                        )))
                    }
                };
                Literal::Array(assemble_buffers(&buffers, leaf, &dims, false)?)
            }
            _ => parts.swap_remove(0),
        };
    }
    let mut epilogue_args = args.to_vec();
    epilogue_args.push(Literal::Tuple(carry));
    let outputs = run_single(epilogue.as_ref(), &epilogue_args)?;
    Ok(PipelineRun { outputs, devices })
}
