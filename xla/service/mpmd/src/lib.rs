//! MPMD pipeline parallelism (JaxPP's row): a training step whose
//! gradient-accumulation loop (a `lax.scan` over microbatches) has its body
//! marked into stages is split into one program per stage and direction,
//! with the values crossing stages inferred; a schedule (GPipe, 1F1B,
//! interleaved 1F1B) orders the (stage, microbatch, direction) tasks of
//! each device; the runtime (`xla_runtime::pipeline`) executes them on
//! loopback devices with sends and receives between them.
//!
//! * [`stages`]: the microbatch loop, its carry, and a task for every body
//!   instruction (stages from `jax.named_scope("stage_K")` in op_name
//!   metadata; backward work from JAX's `transpose(...)` scopes).
//! * [`cut`]: stages without markers: scans over stacked layers cut into
//!   P marked pieces.
//! * [`split`]: per-task programs, prologue and epilogue.
//! * [`schedule`]: task tables.
//! * [`simulate`]: step time, bubble and live activations of a table.
//! * [`report`]: the per-stage report (JSON) the tools print.
//!
//! Invariants: the pass never changes what the program computes: running
//! the prologue, every task of every microbatch in any order the
//! dependencies allow, and the epilogue gives the unpipelined program's
//! results (the tests run it); stage `s` runs on device `s % devices`;
//! malformed stage markers are refused with the instruction named.

pub mod cut;
pub mod error;
pub mod report;
pub mod schedule;
pub mod simulate;
pub mod split;
pub mod stages;

pub use error::MpmdError;
pub use report::{closed_form_idle_fraction, pipeline_report, simulate_uniform};
pub use schedule::{task_table, ScheduleKind, ScheduledTask, TaskTable};
pub use simulate::{simulate, Simulation};
pub use split::{CrossValue, TaskInput, TaskOutput, TaskProgram};
pub use stages::{find_microbatch_loop, CarryKind, Direction, MicrobatchLoop, TaskKey};

use xla_hlo_ir::{HloModule, Opcode, Shape};
use xla_latency_hiding_scheduler::{simulate_module, CostModel, NUM_RESOURCES};

/// How to cut the program.
#[derive(Clone, Debug)]
pub struct PipelineOptions {
    /// Devices in the pipeline (`p`).
    pub num_devices: usize,
    /// Stages per device (`v`; more than 1 for interleaved schedules).
    pub virtual_stages: usize,
    /// The scope name that marks stages (`stage_` for `stage_0`, ...).
    pub scope_prefix: String,
    /// Cut the scans over stacked layers in the microbatch loop into
    /// stages instead of reading `stage_K` scopes ([`cut`]).
    pub cut_layer_scans: bool,
    /// Devices per stage (`t`): with more than 1, the module's shardings
    /// (over `t` partitions) are propagated first, each task program is
    /// SPMD-partitioned for the stage's `t` devices, and a value crossing
    /// stages goes tile by tile (device `i` of one group to device `i` of
    /// the next).
    pub tensor_parallel: usize,
}

impl Default for PipelineOptions {
    fn default() -> Self {
        PipelineOptions {
            num_devices: 4,
            virtual_stages: 1,
            scope_prefix: "stage_".into(),
            cut_layer_scans: false,
            tensor_parallel: 1,
        }
    }
}

/// A program split into pipeline tasks.
#[derive(Clone, Debug)]
pub struct PipelineProgram {
    pub num_devices: usize,
    pub virtual_stages: usize,
    /// Devices per stage (see [`PipelineOptions::tensor_parallel`]).
    pub tensor_parallel: usize,
    pub microbatch_loop: MicrobatchLoop,
    /// Shapes of the loop's carried elements.
    pub carry_shapes: Vec<Shape>,
    /// The entry's parameters to the loop's initial carry (a tuple).
    pub prologue: HloModule,
    /// The entry's parameters and the loop's final carry to the result.
    pub epilogue: HloModule,
    /// Task programs by chain position (F0, ..., F(S-1), B(S-1), ..., B0).
    pub tasks: Vec<TaskProgram>,
    pub values: Vec<CrossValue>,
}

/// Splits `module` for a pipeline (see the crate header).
pub fn split_pipeline(
    module: &HloModule,
    options: &PipelineOptions,
) -> Result<PipelineProgram, MpmdError> {
    if options.num_devices == 0 || options.virtual_stages == 0 || options.tensor_parallel == 0 {
        return Err(MpmdError::Options(
            "devices, virtual stages and tensor parallelism must be positive".into(),
        ));
    }
    let num_stages = options.num_devices * options.virtual_stages;
    let mut module = module.clone();
    let tensor_parallel = options.tensor_parallel;
    if tensor_parallel > 1 {
        module.config.num_partitions = Some(tensor_parallel as i64);
        run_passes(&mut module, "sharding-propagation")?;
    }
    xla_hlo_utils::inline::inline_calls(&mut module, |_, _| true);
    if options.cut_layer_scans {
        cut::cut_layer_scans(&mut module, &options.scope_prefix, num_stages)?;
    }
    let microbatch_loop = find_microbatch_loop(&module, &options.scope_prefix)?;
    stages::forward_tuple_elements(module.comp_mut(microbatch_loop.body));
    let labels = stages::label_body(&module, &microbatch_loop, &options.scope_prefix, num_stages)?;
    let body = module.comp(microbatch_loop.body);
    let (values, value_of) = split::cross_values(body, &labels);
    for value in &values {
        if !value.shape.is_array() {
            return Err(MpmdError::Unsupported(format!(
                "%{} crosses stages with the non-array shape {}",
                value.name, value.shape
            )));
        }
    }
    let mut tasks = (0..2 * num_stages)
        .map(|order| {
            split::task_program(
                &module,
                &microbatch_loop,
                &labels,
                &value_of,
                order,
                num_stages,
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    if tensor_parallel > 1 {
        for task in &mut tasks {
            task.module.config.num_partitions = Some(tensor_parallel as i64);
            run_passes(&mut task.module, "sharding-propagation,spmd-partitioning")?;
        }
    }
    let while_instr = module.entry_computation().instr(microbatch_loop.while_id);
    let carry_shapes = while_instr.shape.tuple_elements().to_vec();
    Ok(PipelineProgram {
        num_devices: options.num_devices,
        virtual_stages: options.virtual_stages,
        tensor_parallel,
        prologue: split::prologue(&module, &microbatch_loop),
        epilogue: split::epilogue(&module, &microbatch_loop),
        microbatch_loop,
        carry_shapes,
        tasks,
        values,
    })
}

/// Runs passes from the one registry on `module` (verified after each).
fn run_passes(module: &mut HloModule, passes: &str) -> Result<(), MpmdError> {
    xla_pipelines::run_passes(module, "mpmd", passes)
        .map_err(|e| MpmdError::Unsupported(format!("{passes} on {}: {e}", module.name)))
}

impl PipelineProgram {
    pub fn num_stages(&self) -> usize {
        self.num_devices * self.virtual_stages
    }

    pub fn microbatches(&self) -> usize {
        self.microbatch_loop.trip_count
    }

    /// The device that runs `stage`.
    pub fn device_of_stage(&self, stage: usize) -> usize {
        stage % self.num_devices
    }

    pub fn task(&self, key: TaskKey) -> &TaskProgram {
        &self.tasks[key.order(self.num_stages())]
    }

    /// The tasks `key` reads values from (same microbatch), plus its own
    /// stage's forward task for a backward task.
    pub fn dependencies(&self, key: TaskKey) -> Vec<TaskKey> {
        let num_stages = self.num_stages();
        let mut deps: Vec<TaskKey> = self
            .task(key)
            .inputs
            .iter()
            .filter_map(|input| match input {
                TaskInput::Value(v) => {
                    Some(TaskKey::from_order(self.values[*v].producer, num_stages))
                }
                _ => None,
            })
            .collect();
        if key.direction == Direction::Backward {
            deps.push(TaskKey {
                stage: key.stage,
                direction: Direction::Forward,
            });
        }
        deps.sort_by_key(|k| k.order(num_stages));
        deps.dedup();
        deps
    }

    /// Run time of each task (by chain position) under `model`: its
    /// program's step time in the latency-hiding scheduler's simulator
    /// (compute, loops and, in tensor-parallel stage programs, the
    /// collectives among the stage's devices).
    pub fn task_costs(&self, model: &dyn CostModel) -> Result<Vec<f64>, MpmdError> {
        self.tasks
            .iter()
            .map(|task| {
                simulate_module(&task.module, model, &[1; NUM_RESOURCES], false)
                    .map(|simulation| simulation.entry.makespan)
                    .map_err(|e| {
                        MpmdError::Unsupported(format!("simulating {}: {e}", task.module.name))
                    })
            })
            .collect()
    }

    /// Bytes of the values `key` sends to other devices per microbatch.
    pub fn sent_bytes(&self, key: TaskKey) -> u64 {
        let order = key.order(self.num_stages());
        let device = self.device_of_stage(key.stage);
        self.values
            .iter()
            .filter(|v| v.producer == order)
            .map(|v| {
                let destinations = self.destination_devices(v);
                let remote = destinations.iter().filter(|&&d| d != device).count() as u64;
                remote * v.shape.byte_size()
            })
            .sum()
    }

    /// The sharding an accumulator is kept in (its owner task's output
    /// sharding; `None` without tensor parallelism).
    pub fn accumulator_sharding(&self, j: usize) -> Option<&xla_hlo_ir::HloSharding> {
        self.tasks.iter().find_map(|task| {
            task.outputs
                .iter()
                .zip(&task.output_shardings)
                .find(|(output, _)| **output == TaskOutput::Accumulator(j))
                .and_then(|(_, sharding)| sharding.as_ref())
        })
    }

    /// The devices that read `value`, ascending, without repeats.
    pub fn destination_devices(&self, value: &CrossValue) -> Vec<usize> {
        let num_stages = self.num_stages();
        let mut devices: Vec<usize> = value
            .consumers
            .iter()
            .map(|&c| self.device_of_stage(TaskKey::from_order(c, num_stages).stage))
            .collect();
        devices.sort_unstable();
        devices.dedup();
        devices
    }

    /// Every program as HLO text: prologue, tasks in chain order, epilogue.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        out.push_str(&self.prologue.to_text());
        out.push('\n');
        for task in &self.tasks {
            out.push_str(&task.module.to_text());
            out.push('\n');
        }
        out.push_str(&self.epilogue.to_text());
        out
    }

    /// Instructions (excluding parameters and the result tuple) of each
    /// task, by chain position.
    pub fn task_sizes(&self) -> Vec<usize> {
        self.tasks
            .iter()
            .map(|t| {
                let entry = t.module.entry_computation();
                entry
                    .instructions
                    .iter()
                    .filter(|i| i.opcode != Opcode::Parameter)
                    .count()
                    .saturating_sub(1)
            })
            .collect()
    }
}
