//! What XLA's GPU pipeline does to a module before its sharding
//! propagation (`RunPreSPMDPartitionerPasses`, then the start of the
//! `spmd-partitioner` pipeline), for the part that changes what
//! propagation sees:
//! - `ConvertMemoryPlacementToInternalAnnotations`: an
//!   `annotate_device_placement` custom call (JAX's `device_put` to a
//!   memory kind) becomes `MoveToHost` (`_xla_buffer_placement` is
//!   `pinned_host` or `unpinned_host`), `MoveToDevice` (`device`),
//!   `PinToDevice` (`pinned_device`) or `PinToDeviceSram` (`device_sram`),
//!   which propagation and the partitioner pass shardings through;
//! - `CallInliner`: every `call` is inlined but a shard_map body (Shardy's
//!   `xla.sdy.manual_computation_body*`), one marked `inlineable="false"`
//!   and one with a sharding of its own, so each call site is propagated on
//!   its own.
//!
//! Invariants: only those two rewrites; names stay module-wide unique and
//! definitions come before uses (`xla_hlo_utils::inline`).

use xla_hlo_ir::attrs::{AttrKey, AttrValue};
use xla_hlo_ir::sdy::FrontendAttributes;
use xla_hlo_ir::{HloInstruction, HloModule, Opcode};

const DEVICE_PLACEMENT: &str = "annotate_device_placement";
const BUFFER_PLACEMENT: &str = "_xla_buffer_placement";
const MANUAL_BODY_PREFIX: &str = "xla.sdy.manual_computation_body";

/// What `run` changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PreSpmdStats {
    pub memory_annotations: usize,
    pub inlined_calls: usize,
}

/// Runs both rewrites on `module` (the call inliner only when `inline`).
pub fn run(module: &mut HloModule, inline: bool) -> PreSpmdStats {
    let memory_annotations = convert_memory_placements(module);
    let inlined_calls = if inline {
        xla_hlo_utils::inline::inline_calls(module, |m, call| {
            call.sharding.is_none()
                && !marked_not_inlineable(call)
                && call
                    .to_apply()
                    .is_some_and(|c| !m.comp(c).name.starts_with(MANUAL_BODY_PREFIX))
        })
    } else {
        0
    };
    PreSpmdStats {
        memory_annotations,
        inlined_calls,
    }
}

fn frontend_attributes(instr: &HloInstruction) -> Option<FrontendAttributes> {
    match instr.attr(AttrKey::FrontendAttributes) {
        Some(AttrValue::Raw(raw)) => FrontendAttributes::parse(raw).ok(),
        _ => None,
    }
}

/// Whether `instr` carries the frontend attribute `inlineable="false"`.
fn marked_not_inlineable(instr: &HloInstruction) -> bool {
    frontend_attributes(instr)
        .is_some_and(|a| a.get("inlineable").is_some_and(|e| e.value == "false"))
}

/// The internal target of a memory placement, as XLA names it.
fn internal_target(placement: &str) -> Option<&'static str> {
    match placement {
        "pinned_host" | "unpinned_host" => Some("MoveToHost"),
        "device" => Some("MoveToDevice"),
        "pinned_device" => Some("PinToDevice"),
        "device_sram" => Some("PinToDeviceSram"),
        _ => None,
    }
}

/// Retargets every `annotate_device_placement` whose placement is known;
/// returns how many.
fn convert_memory_placements(module: &mut HloModule) -> usize {
    let mut count = 0;
    for comp in &mut module.computations {
        for instr in &mut comp.instructions {
            if instr.opcode != Opcode::CustomCall
                || instr.ident_attr(AttrKey::CustomCallTarget) != Some(DEVICE_PLACEMENT)
            {
                continue;
            }
            let target = frontend_attributes(instr).and_then(|a| {
                a.get(BUFFER_PLACEMENT)
                    .and_then(|e| internal_target(&e.value))
            });
            if let Some(target) = target {
                instr.set_attr(AttrKey::CustomCallTarget, AttrValue::Str(target.into()));
                count += 1;
            }
        }
    }
    count
}

#[cfg(test)]
mod tests {
    use super::*;

    const MODULE: &str = r#"HloModule m, num_partitions=4

double {
  x = f32[8] parameter(0)
  ROOT y = f32[8] add(x, x)
}

ENTRY main {
  p = f32[8] parameter(0), sharding={devices=[4]<=[4]}
  host = f32[8] custom-call(p), custom_call_target="annotate_device_placement", custom_call_has_side_effect=true, frontend_attributes={_xla_buffer_placement="pinned_host"}
  back = f32[8] custom-call(host), custom_call_target="annotate_device_placement", custom_call_has_side_effect=true, frontend_attributes={_xla_buffer_placement="device"}
  kept = f32[8] call(back), to_apply=double, frontend_attributes={inlineable="false"}
  ROOT twice = f32[8] call(kept), to_apply=double
}
"#;

    #[test]
    fn placements_become_internal_targets_and_calls_are_inlined() {
        let mut module = xla_hlo_parser::parse_module(MODULE).unwrap();
        let stats = run(&mut module, true);
        assert_eq!(
            stats,
            PreSpmdStats {
                memory_annotations: 2,
                inlined_calls: 1
            }
        );
        let text = module.to_text();
        assert!(text.contains("custom_call_target=\"MoveToHost\""), "{text}");
        assert!(
            text.contains("custom_call_target=\"MoveToDevice\""),
            "{text}"
        );
        assert!(!text.contains("annotate_device_placement"), "{text}");
        assert_eq!(text.matches(" call(").count(), 1, "{text}");
        assert!(text.contains("inlineable=\"false\""), "{text}");
    }
}
