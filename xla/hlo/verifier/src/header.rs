//! Module-header checks against the entry computation.
//!
//! - `entry_computation_layout`: as many parameters as the entry computation,
//!   each compatible (layouts ignored) with its parameter instruction, and a
//!   result compatible with the entry root.
//! - `input_output_alias`: parameter numbers in range, parameter and output
//!   tuple indices naming existing subshapes, each output aliased once.
//! - `buffer_donor`: parameter numbers in range and existing subshapes.
//! - `num_partitions`, `replica_count` and their product within
//!   [`MAX_DEVICES`].
//!
//! Invariant: runs after the structural phase and only on a sound entry.

use crate::structure::Status;
use crate::{compatible, param_shapes, root_shape, show, Report};
use xla_hlo_ir::HloModule;

/// The most devices (`num_partitions` x `replica_count`, and the devices of
/// any sharding, mesh or replica group) a module may name. Later code
/// allocates per device (communicators, device tables), so the verifier
/// bounds the count: 65,536 is above every multi-node system XLA targets
/// today (a 64x8 GPU cluster is 512 devices, a TPU v5p pod 8,960 chips).
pub const MAX_DEVICES: i64 = 1 << 16;

/// `num_partitions` and `replica_count` each in `1..=MAX_DEVICES`, and their
/// product too.
fn check_device_counts(module: &HloModule, r: &mut Report) {
    let config = &module.config;
    for (key, value) in [
        ("num_partitions", config.num_partitions),
        ("replica_count", config.replica_count),
    ] {
        if let Some(v) = value {
            if !(1..=MAX_DEVICES).contains(&v) {
                r.comp(
                    "<module>",
                    format!("{key}={v} is out of range (1 to {MAX_DEVICES} devices)"),
                );
            }
        }
    }
    let partitions = config.num_partitions.unwrap_or(1);
    let replicas = config.replica_count.unwrap_or(1);
    if (1..=MAX_DEVICES).contains(&partitions)
        && (1..=MAX_DEVICES).contains(&replicas)
        && partitions * replicas > MAX_DEVICES
    {
        r.comp(
            "<module>",
            format!(
                "num_partitions={partitions} x replica_count={replicas} is more than {MAX_DEVICES} devices"
            ),
        );
    }
}

pub(crate) fn check(module: &HloModule, status: &Status, r: &mut Report) {
    check_device_counts(module, r);
    if !status.entry_ok || !status.callee_ok(module.entry) {
        return;
    }
    let Some(entry) = module.computations.get(module.entry.index()) else {
        return;
    };
    let (Some(params), Some(root)) = (param_shapes(entry), root_shape(entry)) else {
        return;
    };
    let name = &entry.name;
    if let Some(layout) = &module.config.entry_computation_layout {
        if layout.parameters.len() != params.len() {
            r.comp(
                name,
                format!(
                    "entry_computation_layout has {} parameters but the entry computation has {}",
                    layout.parameters.len(),
                    params.len()
                ),
            );
        } else {
            for (i, (l, p)) in layout.parameters.iter().zip(&params).enumerate() {
                if !compatible(l, p) {
                    r.comp(
                        name,
                        format!(
                            "entry_computation_layout parameter {i} is {} but parameter {i} is {}",
                            show(l),
                            show(p)
                        ),
                    );
                }
            }
        }
        if !compatible(&layout.result, root) {
            r.comp(
                name,
                format!(
                    "entry_computation_layout result is {} but the entry root is {}",
                    show(&layout.result),
                    show(root)
                ),
            );
        }
    }
    let param = |n: i64| usize::try_from(n).ok().and_then(|u| params.get(u).copied());
    if let Some(aliases) = &module.config.input_output_alias {
        let mut outputs: Vec<&[i64]> = Vec::new();
        for a in aliases {
            let Some(p) = param(a.parameter_number) else {
                r.comp(
                    name,
                    format!(
                        "input_output_alias names parameter {}, which does not exist",
                        a.parameter_number
                    ),
                );
                continue;
            };
            if p.subshape(&a.parameter_index).is_none() {
                r.comp(
                    name,
                    format!(
                        "input_output_alias parameter index {:?} does not exist in parameter {} ({})",
                        a.parameter_index,
                        a.parameter_number,
                        show(p)
                    ),
                );
            }
            if root.subshape(&a.output_index).is_none() {
                r.comp(
                    name,
                    format!(
                        "input_output_alias output index {:?} does not exist in the result {}",
                        a.output_index,
                        show(root)
                    ),
                );
            }
            if outputs.contains(&a.output_index.as_slice()) {
                r.comp(
                    name,
                    format!(
                        "input_output_alias output index {:?} is aliased twice",
                        a.output_index
                    ),
                );
            }
            outputs.push(&a.output_index);
        }
    }
    if let Some(donors) = &module.config.buffer_donor {
        for d in donors {
            match param(d.parameter_number) {
                None => r.comp(
                    name,
                    format!(
                        "buffer_donor names parameter {}, which does not exist",
                        d.parameter_number
                    ),
                ),
                Some(p) if p.subshape(&d.parameter_index).is_none() => r.comp(
                    name,
                    format!(
                        "buffer_donor index {:?} does not exist in parameter {} ({})",
                        d.parameter_index,
                        d.parameter_number,
                        show(p)
                    ),
                ),
                Some(_) => {}
            }
        }
    }
}
