//! Module-header checks against the entry computation.
//!
//! - `entry_computation_layout`: as many parameters as the entry computation,
//!   each compatible (layouts ignored) with its parameter instruction, and a
//!   result compatible with the entry root.
//! - `input_output_alias`: parameter numbers in range, parameter and output
//!   tuple indices naming existing subshapes, each output aliased once.
//! - `buffer_donor`: parameter numbers in range and existing subshapes.
//!
//! Invariant: runs after the structural phase and only on a sound entry.

use crate::structure::Status;
use crate::{compatible, param_shapes, root_shape, show, Report};
use xla_hlo_ir::HloModule;

pub(crate) fn check(module: &HloModule, status: &Status, r: &mut Report) {
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
