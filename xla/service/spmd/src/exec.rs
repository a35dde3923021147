//! Running a partitioned module: split global arrays into per-device
//! arrays by a sharding (padded tiles, zeros in the padding), run the module
//! on `N` loopback devices (one thread each, collectives through the
//! `collectives` crate's loopback world), and assemble global outputs from the devices'
//! tiles by the root's sharding.
//!
//! Invariants: `assemble(split(x)) == x` exactly for every sharding and
//! dtype; with `strict`, assembling checks that every replica of a tile
//! holds the same valid data (a partitioner bug otherwise) and reports the
//! first disagreement.

use crate::error::SpmdError;
use crate::grid::{local_dims, tile_size, Grid};
use crate::value::{sharding_from_ir, ValueSharding};
use xla_hlo_evaluator::{evaluate, evaluate_on_devices, Array, EvalContext, Value};
use xla_hlo_ir::attrs::SliceDim;
use xla_hlo_ir::{HloModule, Shape};

fn eval_err(e: impl std::fmt::Display) -> SpmdError {
    SpmdError::Eval(e.to_string())
}

/// Device `d`'s padded tile of `a` under grid `g`.
pub fn split_array(a: &Array, g: &Grid, d: i64) -> Result<Array, SpmdError> {
    let r = a.rank();
    let ld = local_dims(&a.dims, g);
    let mut sd = Vec::with_capacity(r);
    let mut full = true;
    for k in 0..r {
        let ts = tile_size(a.dims[k], g.tiles(k));
        let off = (g.coord(d, k) * ts).min(a.dims[k]);
        let lim = (off + ts).min(a.dims[k]);
        full &= lim - off == ld[k];
        sd.push(SliceDim {
            start: off,
            limit: lim,
            stride: 1,
        });
    }
    let part = xla_hlo_evaluator::data::slice(a, &sd).map_err(eval_err)?;
    if full {
        return Ok(part);
    }
    let zero = Array::zeros(a.ty, ld).map_err(eval_err)?;
    xla_hlo_evaluator::data::dynamic_update_slice(&zero, &part, &vec![0; r]).map_err(eval_err)
}

/// Splits a global value into device `d`'s local value under `vs`.
pub fn split_value(v: &Value, vs: &ValueSharding, d: i64) -> Result<Value, SpmdError> {
    match (v, vs) {
        (Value::Tuple(e), ValueSharding::Tuple(s)) if e.len() == s.len() => Ok(Value::Tuple(
            e.iter()
                .zip(s)
                .map(|(x, y)| split_value(x, y, d))
                .collect::<Result<_, _>>()?,
        )),
        (Value::Array(a), ValueSharding::Grid(g)) if g.rank() == a.rank() => {
            Ok(Value::Array(split_array(a, g, d)?))
        }
        (v, _) => Ok(v.clone()),
    }
}

/// Assembles a global array of `dims` from every device's tile.
pub fn assemble_array(
    locals: &[&Array],
    g: &Grid,
    dims: &[i64],
    strict: bool,
) -> Result<Array, SpmdError> {
    let first = locals
        .first()
        .ok_or_else(|| SpmdError::Eval("no device outputs".into()))?;
    let r = dims.len();
    let mut full = Array::zeros(first.ty, dims.to_vec()).map_err(eval_err)?;
    let reps = g.repl() as usize;
    for group in g.devs().chunks(reps) {
        let d0 = group[0];
        let mut off = Vec::with_capacity(r);
        let mut sd = Vec::with_capacity(r);
        let mut empty = false;
        for k in 0..r {
            let ts = tile_size(dims[k], g.tiles(k));
            let o = (g.coord(d0, k) * ts).min(dims[k]);
            let valid = (dims[k] - o).clamp(0, ts);
            empty |= valid == 0;
            off.push(o);
            sd.push(SliceDim {
                start: 0,
                limit: valid,
                stride: 1,
            });
        }
        if empty {
            continue;
        }
        let tile = locals
            .get(d0 as usize)
            .ok_or_else(|| SpmdError::Eval(format!("no output from device {d0}")))?;
        if tile.rank() != r {
            return Err(SpmdError::Eval(format!(
                "device {d0} returned rank {} for a rank-{r} output",
                tile.rank()
            )));
        }
        let part = xla_hlo_evaluator::data::slice(tile, &sd).map_err(eval_err)?;
        if strict {
            for &d in &group[1..] {
                let other = locals
                    .get(d as usize)
                    .ok_or_else(|| SpmdError::Eval(format!("no output from device {d}")))?;
                let op = xla_hlo_evaluator::data::slice(other, &sd).map_err(eval_err)?;
                if op != part {
                    return Err(SpmdError::Eval(format!(
                        "replicas {d0} and {d} of one tile disagree"
                    )));
                }
            }
        }
        full =
            xla_hlo_evaluator::data::dynamic_update_slice(&full, &part, &off).map_err(eval_err)?;
    }
    Ok(full)
}

/// Assembles a global value of `shape` from every device's value under `vs`.
pub fn assemble_value(
    locals: &[&Value],
    vs: &ValueSharding,
    shape: &Shape,
    strict: bool,
) -> Result<Value, SpmdError> {
    match (shape, vs) {
        (Shape::Tuple(es), ValueSharding::Tuple(s)) if es.len() == s.len() => {
            let mut out = Vec::new();
            for (k, (sh, v)) in es.iter().zip(s).enumerate() {
                let parts: Vec<&Value> = locals
                    .iter()
                    .map(|l| {
                        l.tuple_elements()
                            .and_then(|e| e.get(k))
                            .ok_or_else(|| SpmdError::Eval("device output is not a tuple".into()))
                    })
                    .collect::<Result<_, _>>()?;
                out.push(assemble_value(&parts, v, sh, strict)?);
            }
            Ok(Value::Tuple(out))
        }
        (sh, ValueSharding::Grid(g)) if sh.is_array() => {
            let arrays: Vec<&Array> = locals
                .iter()
                .map(|l| {
                    l.as_array()
                        .ok_or_else(|| SpmdError::Eval("device output is not an array".into()))
                })
                .collect::<Result<_, _>>()?;
            Ok(Value::Array(assemble_array(&arrays, g, sh.dims(), strict)?))
        }
        _ => locals
            .first()
            .map(|v| (*v).clone())
            .ok_or_else(|| SpmdError::Eval("no device outputs".into())),
    }
}

/// Runs a module on `n` loopback devices with per-device arguments;
/// returns each device's result.
pub fn run_devices(
    module: &HloModule,
    args: &[Vec<Value>],
    n: i64,
) -> Result<Vec<Value>, SpmdError> {
    let args_of = |p: i64| {
        args.get(p as usize).cloned().ok_or_else(|| {
            xla_hlo_evaluator::EvalError::invalid(format!("no arguments for device {p}"))
        })
    };
    let outs = evaluate_on_devices(module, n, &args_of).map_err(eval_err)?;
    let tuple_root = module.entry_computation().root_instr().shape.is_tuple();
    Ok(outs
        .into_iter()
        .map(|mut o| {
            if o.len() == 1 && !tuple_root {
                o.remove(0)
            } else {
                Value::Tuple(o)
            }
        })
        .collect())
}

/// Runs a partitioned module (entry parameters and root carry their global
/// shardings) on global arguments; returns the global result, of
/// `out_shape` (the unpartitioned module's result shape).
pub fn run_partitioned(
    module: &HloModule,
    global_args: &[Value],
    out_shape: &Shape,
    n: i64,
    strict: bool,
) -> Result<Value, SpmdError> {
    let e = module.entry_computation();
    let mut param_vs = Vec::new();
    let mut global_shapes = Vec::new();
    for (k, &pid) in e.parameters.iter().enumerate() {
        let instr = e.instr(pid);
        let arg = global_args
            .get(k)
            .ok_or_else(|| SpmdError::Eval(format!("missing argument {k}")))?;
        let shape = value_shape(arg);
        param_vs.push(sharding_from_ir(instr.sharding.as_deref(), &shape, n)?);
        global_shapes.push(shape);
    }
    let mut per_device = Vec::with_capacity(n as usize);
    for d in 0..n {
        let mut a = Vec::with_capacity(global_args.len());
        for (k, v) in global_args.iter().enumerate() {
            a.push(split_value(v, &param_vs[k], d)?);
        }
        per_device.push(a);
    }
    let outs = run_devices(module, &per_device, n)?;
    let root = e.root_instr();
    let root_vs = sharding_from_ir(root.sharding.as_deref(), out_shape, n)?;
    let refs: Vec<&Value> = outs.iter().collect();
    assemble_value(&refs, &root_vs, out_shape, strict)
}

fn value_shape(v: &Value) -> Shape {
    match v {
        Value::Array(a) => a.shape(),
        Value::Tuple(e) => Shape::Tuple(e.iter().map(value_shape).collect()),
        #[allow(unreachable_patterns)]
        _ => Shape::token(),
    }
}

/// Runs the global (unpartitioned) module on one device.
pub fn run_global(module: &HloModule, args: &[Value]) -> Result<Value, SpmdError> {
    let ctx = EvalContext {
        num_partitions: Some(1),
        num_replicas: Some(1),
        ..EvalContext::default()
    };
    let outs = evaluate(module, args, &ctx).map_err(eval_err)?;
    if !module.entry_computation().root_instr().shape.is_tuple() && outs.len() == 1 {
        return Ok(outs.into_iter().next().unwrap_or(Value::Tuple(vec![])));
    }
    Ok(Value::Tuple(outs))
}
