//! Running one SPMD executable on N devices with global arguments and
//! results.
//!
//! Device `d` (partition `d`, replica 0) gets, for each entry parameter, its
//! tile of the global argument under the parameter's sharding: tiled
//! shardings take the tile at the device's position in the tile assignment
//! (uneven tiles padded with zeros past the end of the array, as XLA pads
//! them), replicated ones the whole array. Each global result leaf is
//! assembled from every device's tiles under the result sharding, trimmed
//! to the global shape; a replicated leaf is device 0's value, a maximal
//! one its device's.
//!
//! Every multi-device run goes through here: `run_hlo_module --partition`
//! (plan [`LaunchPlan::for_partitioned`], checking that replicas agree),
//! `--shardings-from` ([`LaunchPlan::from_global_module`]), `--devices N`
//! ([`LaunchPlan::replicated`]), in one process ([`run_spmd`], loopback
//! devices) or across processes ([`crate::distributed`], TCP or NCCL).
//! Splitting and assembling are [`crate::literal::shard_buffer`] /
//! [`crate::literal::assemble_buffers`] on the literals' bytes, through the
//! project's one split/assemble (`xla_hlo_utils::tiling`, which the
//! interpreter's `SPMDFullToShardShape` / `SPMDShardToFullShape` use too).
//! Timeouts default to the interpreter's loopback timeout (long enough for
//! the slowest device to interpret the work between two collectives).
//!
//! Invariants: shard-then-assemble returns the input exactly for every
//! sharding and dtype (property-tested); named (mesh) shardings are
//! converted to tile assignments first; manual and unknown shardings are
//! errors for split and assemble, since they say nothing about where the
//! data lives.

use crate::backend::{DeviceCommunicator, DeviceContext, Executable};
use crate::error::{first_failure, RuntimeError};
use crate::literal::{assemble_buffers, shard_buffer, Literal};
use collectives::DeviceBuffer;
use std::time::Duration;
use xla_hlo_ir::sharding::{ShardingKind, SingleSharding};
use xla_hlo_ir::{HloModule, HloSharding, Shape};

/// How long devices wait for each other at a collective unless a plan
/// says otherwise.
pub const DEFAULT_TIMEOUT: Duration = xla_hlo_evaluator::LOOPBACK_TIMEOUT;

/// How to run an SPMD executable on global data.
#[derive(Clone, Debug)]
pub struct LaunchPlan {
    /// Devices (partitions) to run on.
    pub num_partitions: usize,
    /// Per entry parameter, its sharding (`None`: replicated).
    pub parameter_shardings: Vec<Option<HloSharding>>,
    /// The root's sharding (`None`: replicated).
    pub result_sharding: Option<HloSharding>,
    /// The root's global shape.
    pub result_shape: Shape,
    /// How long devices wait for each other at a collective.
    pub timeout: Duration,
    /// Assembling checks that every device holding a tile (or a replicated
    /// result) holds the same data; a disagreement is an error.
    pub check_replicas: bool,
    /// Devices run in consistent mode (`DeviceContext::consistent`).
    pub consistent: bool,
}

impl LaunchPlan {
    /// The plan the executable's own module implies: parameter and root
    /// shardings from its entry, `num_partitions` devices, and a global
    /// result shape of the local shape times the tile counts (exact unless
    /// the global shape was uneven; pass the global module's root shape then).
    pub fn from_module(exe: &dyn Executable) -> Result<LaunchPlan, RuntimeError> {
        let module = exe.module();
        let entry = module.entry_computation();
        let root = entry.root_instr();
        let n = module.num_partitions().max(1) as usize;
        let parameter_shardings = entry
            .parameters
            .iter()
            .map(|p| entry.instructions[p.index()].sharding.as_deref().cloned())
            .collect();
        let result_shape = global_shape(&root.shape, root.sharding.as_deref())?;
        Ok(LaunchPlan {
            num_partitions: n,
            parameter_shardings,
            result_sharding: root.sharding.as_deref().cloned(),
            result_shape,
            timeout: DEFAULT_TIMEOUT,
            check_replicas: false,
            consistent: false,
        })
    }

    /// The plan for a module our partitioner produced: parameter and root
    /// shardings from its entry (they are the global ones), the global
    /// result shape of the module before partitioning, replicas checked.
    pub fn for_partitioned(module: &HloModule, global_result_shape: Shape) -> LaunchPlan {
        let entry = module.entry_computation();
        LaunchPlan {
            num_partitions: module.num_partitions().max(1) as usize,
            parameter_shardings: entry
                .parameters
                .iter()
                .map(|p| entry.instructions[p.index()].sharding.as_deref().cloned())
                .collect(),
            result_sharding: entry.root_instr().sharding.as_deref().cloned(),
            result_shape: global_result_shape,
            timeout: DEFAULT_TIMEOUT,
            check_replicas: true,
            consistent: false,
        }
    }

    /// Every device gets the whole of every argument and the results are
    /// device 0's: a module with global semantics that needs several
    /// devices (collectives, manual regions) to run.
    pub fn replicated(module: &HloModule, num_devices: usize) -> LaunchPlan {
        let entry = module.entry_computation();
        LaunchPlan {
            num_partitions: num_devices.max(1),
            parameter_shardings: vec![None; entry.parameters.len()],
            result_sharding: None,
            result_shape: entry.root_instr().shape.clone(),
            timeout: DEFAULT_TIMEOUT,
            check_replicas: false,
            consistent: false,
        }
    }
}

impl LaunchPlan {
    /// The plan for running partitioned module `local` on `num_partitions`
    /// devices with the shardings and global result shape of the
    /// unpartitioned `global` module (e.g. a case's propagated.hlo):
    /// parameter shardings by parameter number (`local`'s own where
    /// `global` has none), the result sharding and shape of `global`'s root.
    pub fn from_global_module(
        local: &HloModule,
        global: &HloModule,
        num_partitions: usize,
    ) -> Result<LaunchPlan, RuntimeError> {
        let (l, g) = (local.entry_computation(), global.entry_computation());
        if l.parameters.len() != g.parameters.len() {
            return Err(RuntimeError::Sharding(format!(
                "the partitioned module has {} entry parameters but the global module has {}",
                l.parameters.len(),
                g.parameters.len()
            )));
        }
        let parameter_shardings = l
            .parameters
            .iter()
            .zip(&g.parameters)
            .map(|(&lp, &gp)| {
                g.instructions[gp.index()]
                    .sharding
                    .as_deref()
                    .cloned()
                    .or_else(|| l.instructions[lp.index()].sharding.as_deref().cloned())
            })
            .collect();
        let root = g.root_instr();
        Ok(LaunchPlan {
            num_partitions: num_partitions.max(1),
            parameter_shardings,
            result_sharding: root
                .sharding
                .as_deref()
                .cloned()
                .or_else(|| l.root_instr().sharding.as_deref().cloned()),
            result_shape: root.shape.clone(),
            timeout: DEFAULT_TIMEOUT,
            check_replicas: false,
            consistent: false,
        })
    }
}

/// The global shape a per-device `local` shape stands for under `sharding`
/// (each tiled dim times its tile count).
pub fn global_shape(local: &Shape, sharding: Option<&HloSharding>) -> Result<Shape, RuntimeError> {
    let Some(sharding) = sharding else {
        return Ok(local.clone());
    };
    let leaves = local.leaves();
    let mut shapes = Vec::with_capacity(leaves.len());
    for (k, leaf) in leaves.iter().enumerate() {
        let s = leaf_sharding(sharding, k, leaves.len())?;
        let tiled = tiled(&s)?;
        let dims: Vec<i64> = match &tiled {
            Some(t) => leaf
                .dims()
                .iter()
                .zip(tile_counts(t))
                .map(|(&d, t)| d * t)
                .collect(),
            None => leaf.dims().to_vec(),
        };
        let ty = leaf.element_type().ok_or_else(|| {
            RuntimeError::Sharding(format!("result leaf {k} ({leaf}) is not an array"))
        })?;
        shapes.push(Shape::array(ty, dims));
    }
    Ok(if local.is_tuple() {
        Shape::Tuple(shapes)
    } else {
        shapes.remove(0)
    })
}

/// Tiles per dimension of a tiled sharding (trailing replication dims
/// included; zipping with an array's dims drops them).
fn tile_counts(s: &SingleSharding) -> Vec<i64> {
    match &s.kind {
        ShardingKind::Tiled {
            tile_assignment, ..
        } => tile_assignment.dims().to_vec(),
        _ => Vec::new(),
    }
}

/// Leaf `k` (of `count`) of a sharding: a tuple sharding's element, or the
/// single sharding itself for every leaf.
fn leaf_sharding(s: &HloSharding, k: usize, count: usize) -> Result<SingleSharding, RuntimeError> {
    match s {
        HloSharding::Single(x) => Ok(x.clone()),
        HloSharding::Tuple(v) if v.len() == count => Ok(v[k].clone()),
        HloSharding::Tuple(v) => Err(RuntimeError::Sharding(format!(
            "tuple sharding has {} elements for a value of {count} leaves",
            v.len()
        ))),
    }
}

/// The sharding as a tile assignment (`Some`) or a whole-array placement
/// (`None`: replicated or maximal); named shardings are converted.
fn tiled(s: &SingleSharding) -> Result<Option<SingleSharding>, RuntimeError> {
    match &s.kind {
        ShardingKind::Tiled { .. } => Ok(Some(s.clone())),
        ShardingKind::Replicated | ShardingKind::Maximal(_) | ShardingKind::MaximalMesh(_) => {
            Ok(None)
        }
        ShardingKind::Named(ns) => {
            let algebraic = xla_hlo_utils::named::named_to_sharding(ns)
                .map_err(|e| RuntimeError::Sharding(format!("named sharding: {e}")))?;
            tiled(&algebraic.to_ir())
        }
        other => Err(RuntimeError::Sharding(format!(
            "a {} sharding does not say where global data lives",
            kind_name(other)
        ))),
    }
}

fn kind_name(k: &ShardingKind) -> &'static str {
    match k {
        ShardingKind::Manual => "manual",
        ShardingKind::Unknown => "unknown",
        ShardingKind::Unreduced => "unreduced",
        _ => "non-tiled",
    }
}

/// Device `device`'s part of global value `v` under `sharding`.
pub fn split_value(
    v: &Literal,
    sharding: Option<&HloSharding>,
    device: i64,
) -> Result<Literal, RuntimeError> {
    let Some(sharding) = sharding else {
        return Ok(v.clone());
    };
    let leaves = v.leaves();
    let mut parts = Vec::with_capacity(leaves.len());
    for (k, a) in leaves.iter().enumerate() {
        let s = leaf_sharding(sharding, k, leaves.len())?;
        parts.push(Literal::Array(match tiled(&s)? {
            Some(t) => shard_buffer(a, &t, device)?,
            None => (*a).clone(),
        }));
    }
    Ok(match v {
        Literal::Tuple(_) => Literal::Tuple(parts),
        _ => parts.remove(0),
    })
}

/// Global leaf `k` assembled from every device's local leaf.
fn assemble_leaf(
    shards: &[&DeviceBuffer],
    s: &SingleSharding,
    global_dims: &[i64],
    check_replicas: bool,
) -> Result<DeviceBuffer, RuntimeError> {
    match (&s.kind, tiled(s)?) {
        (_, Some(t)) => assemble_buffers(shards, &t, global_dims, check_replicas),
        (ShardingKind::Replicated, None) if check_replicas => {
            assemble_buffers(shards, s, global_dims, true)
        }
        (ShardingKind::Maximal(d) | ShardingKind::MaximalMesh(d), None) => shards
            .get(usize::try_from(*d).unwrap_or(usize::MAX))
            .map(|b| (*b).clone())
            .ok_or_else(|| RuntimeError::Sharding(format!("maximal device {d} did not run"))),
        (_, None) => shards
            .first()
            .map(|b| (*b).clone())
            .ok_or_else(|| RuntimeError::Devices("no device ran".into())),
    }
}

/// Device `device`'s arguments: every global argument split by its
/// parameter's sharding.
pub fn split_arguments(
    global_args: &[Literal],
    plan: &LaunchPlan,
    device: i64,
) -> Result<Vec<Literal>, RuntimeError> {
    if global_args.len() != plan.parameter_shardings.len() {
        return Err(RuntimeError::Arguments(format!(
            "the entry computation takes {} parameters but {} arguments were given",
            plan.parameter_shardings.len(),
            global_args.len()
        )));
    }
    global_args
        .iter()
        .zip(&plan.parameter_shardings)
        .map(|(a, s)| split_value(a, s.as_ref(), device))
        .collect()
}

/// The global results (a tuple root split into leaves) assembled from
/// every device's results (`per_device[d]` is device d's).
pub fn assemble_results(
    per_device: &[Vec<Literal>],
    plan: &LaunchPlan,
) -> Result<Vec<Literal>, RuntimeError> {
    let leaf_shapes = plan.result_shape.leaves();
    let per_device_leaves: Vec<Vec<&DeviceBuffer>> = per_device
        .iter()
        .map(|outs| outs.iter().flat_map(|v| v.leaves()).collect())
        .collect();
    let mut results = Vec::with_capacity(leaf_shapes.len());
    for (k, shape) in leaf_shapes.iter().enumerate() {
        let shards: Vec<&DeviceBuffer> = per_device_leaves
            .iter()
            .map(|leaves| {
                leaves.get(k).copied().ok_or_else(|| {
                    RuntimeError::Devices(format!(
                        "a device returned {} result leaves, the global result has {}",
                        leaves.len(),
                        leaf_shapes.len()
                    ))
                })
            })
            .collect::<Result<_, _>>()?;
        let s = match &plan.result_sharding {
            Some(s) => leaf_sharding(s, k, leaf_shapes.len())?,
            None => SingleSharding::new(ShardingKind::Replicated),
        };
        let check = plan.check_replicas && plan.result_sharding.is_some();
        results.push(Literal::Array(assemble_leaf(
            &shards,
            &s,
            shape.dims(),
            check,
        )?));
    }
    Ok(results)
}

/// The context of device `device` of `plan`'s devices (replica 0).
pub fn device_context<'a>(
    device: usize,
    plan: &LaunchPlan,
    communicator: &'a DeviceCommunicator,
) -> DeviceContext<'a> {
    DeviceContext {
        replica_id: 0,
        partition_id: device as i64,
        num_replicas: 1,
        num_partitions: plan.num_partitions.max(1) as i64,
        communicator: Some(communicator),
        consistent: plan.consistent,
    }
}

/// Runs `exe` on `plan.num_partitions` loopback devices (threads of this
/// process) with global arguments; returns the global results (a tuple
/// root split into leaves).
pub fn run_spmd(
    exe: &dyn Executable,
    global_args: &[Literal],
    plan: &LaunchPlan,
) -> Result<Vec<Literal>, RuntimeError> {
    let n = plan.num_partitions.max(1);
    // Arguments are checked before any device starts.
    split_arguments(global_args, plan, 0)?;
    let outcomes = collectives::run_world(n, plan.timeout, |device, comm| {
        let ctx = device_context(device, plan, comm as &DeviceCommunicator);
        let args = split_arguments(global_args, plan, device as i64)?;
        exe.execute(&ctx, &args)
    })
    .map_err(|e| RuntimeError::Devices(e.to_string()))?;
    let per_device = first_failure(outcomes)?;
    assemble_results(&per_device, plan)
}
