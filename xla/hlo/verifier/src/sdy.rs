//! Shardy annotations (`xla.sdy.*` frontend attributes of a default JAX
//! lowering): every one parses, and each sharding keeps Shardy's
//! invariants: it names a mesh of the module's `xla.sdy.meshes` (or an
//! inline one), every axis is an axis of that mesh and used once, sub-axes
//! fit their axis and do not overlap, it has one dimension entry per
//! dimension of its value, and there is one sharding per value (per operand
//! for `xla.sdy.in_shardings`, per result for `xla.sdy.out_shardings`).
//!
//! Every message names the attribute and the byte offset inside its value
//! where the problem is, and quotes the value.

use crate::{At, Report};
use xla_hlo_ir::attrs::{AttrKey, AttrValue};
use xla_hlo_ir::sdy::{self, FrontendAttributes, MeshRef, SdyMesh, SdySharding};
use xla_hlo_ir::{HloModule, Shape};

const MESHES: &str = "xla.sdy.meshes";

/// The module's meshes; a malformed table is reported (and read as empty).
pub(crate) fn module_meshes(module: &HloModule, r: &mut Report) -> Vec<(String, SdyMesh)> {
    let Some(raw) = module.config.frontend_attributes.as_deref() else {
        return Vec::new();
    };
    if !raw.contains("xla.sdy.") {
        return Vec::new();
    }
    let attributes = match FrontendAttributes::parse(raw) {
        Ok(a) => a,
        Err(e) => {
            r.comp("<module>", format!("frontend_attributes {e}"));
            return Vec::new();
        }
    };
    let Some(entry) = attributes.get(MESHES) else {
        return Vec::new();
    };
    match sdy::parse_meshes(&entry.value) {
        Ok(m) => m,
        Err(e) => {
            r.comp(
                "<module>",
                format!("frontend attribute {MESHES}: {e} in \"{}\"", entry.value),
            );
            Vec::new()
        }
    }
}

fn value_ranks(shape: &Shape) -> Vec<usize> {
    match shape {
        Shape::Tuple(elements) => elements.iter().map(|e| e.rank()).collect(),
        s => vec![s.rank()],
    }
}

/// Checks the instruction's `xla.sdy.*` frontend attributes.
pub(crate) fn check(at: &At, meshes: &[(String, SdyMesh)], r: &mut Report) {
    let instr = at.instr();
    let Some(AttrValue::Raw(raw)) = instr.attr(AttrKey::FrontendAttributes) else {
        return;
    };
    if !raw.contains("xla.sdy.") {
        return;
    }
    let attributes = match FrontendAttributes::parse(raw) {
        Ok(a) => a,
        Err(e) => return at.err(r, format!("frontend_attributes {e}")),
    };
    for entry in attributes
        .entries
        .iter()
        .filter(|e| e.key.starts_with("xla.sdy."))
    {
        let key = entry.key.as_str();
        let value = entry.value.as_str();
        let fail = |r: &mut Report, offset: usize, message: String| {
            at.err(
                r,
                format!("frontend attribute {key}: at offset {offset}: {message} in \"{value}\""),
            )
        };
        let (shardings, ranks): (Vec<SdySharding>, Vec<usize>) = match key {
            "xla.sdy.sharding" => match sdy::parse_shardings(value) {
                Ok(s) => (s, value_ranks(&instr.shape)),
                Err(e) => return fail(r, e.offset, e.message),
            },
            "xla.sdy.in_shardings" => match sdy::parse_sharding_per_value(value) {
                Ok(s) => {
                    let ranks = instr
                        .operands
                        .iter()
                        .filter_map(|o| at.comp.instructions.get(o.index()))
                        .map(|o| o.shape.rank())
                        .collect();
                    (s, ranks)
                }
                Err(e) => return fail(r, e.offset, e.message),
            },
            "xla.sdy.out_shardings" => match sdy::parse_sharding_per_value(value) {
                Ok(s) => (s, value_ranks(&instr.shape)),
                Err(e) => return fail(r, e.offset, e.message),
            },
            "xla.sdy.manual_axes" => {
                if let Err(e) = sdy::parse_manual_axes(value) {
                    fail(r, e.offset, e.message);
                }
                continue;
            }
            "xla.sdy.sharding_group_id" => {
                if let Err(e) = sdy::parse_group_id(value) {
                    fail(r, e.offset, e.message);
                }
                continue;
            }
            _ => continue,
        };
        if shardings.len() != ranks.len() {
            fail(
                r,
                0,
                format!("{} shardings for {} values", shardings.len(), ranks.len()),
            );
            continue;
        }
        for (s, &rank) in shardings.iter().zip(&ranks) {
            let mesh = match &s.mesh {
                MeshRef::Inline(m) => m,
                MeshRef::Named(name) => match meshes.iter().find(|(n, _)| n == name) {
                    Some((_, m)) => m,
                    None => {
                        let known: Vec<&str> = meshes.iter().map(|(n, _)| n.as_str()).collect();
                        let offset = value.find(&format!("@{name}")).unwrap_or(0);
                        fail(
                            r,
                            offset,
                            format!(
                                "mesh '@{name}' is not defined (the module's {MESHES} has [{}])",
                                known.join(", ")
                            ),
                        );
                        continue;
                    }
                },
            };
            if let Err(e) = s.check_axes(mesh) {
                let offset = sdy::axis_offset(value, &e.axis, e.occurrence).unwrap_or(0);
                fail(r, offset, e.message);
            } else if s.dims.len() != rank {
                fail(
                    r,
                    0,
                    format!(
                        "the sharding has {} dimensions but the value has rank {rank}",
                        s.dims.len()
                    ),
                );
            }
        }
    }
}
