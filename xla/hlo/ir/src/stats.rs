//! Static module statistics (`hlo-opt --stats`): instruction and computation
//! counts, opcode histogram, collective counts and per-device collective bytes.
//!
//! Invariant: counts are static (an instruction inside a loop body or branch
//! counts once); async start forms count as their collective, done forms not.

use crate::module::{HloInstruction, HloModule};
use crate::opcode::Opcode;
use crate::shape::Shape;
use std::collections::BTreeMap;

/// Statistics of one module.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ModuleStats {
    pub instructions: usize,
    pub computations: usize,
    pub opcodes: BTreeMap<String, usize>,
    pub collectives: BTreeMap<String, usize>,
    pub collective_bytes: u64,
    pub collective_bytes_by_op: BTreeMap<String, u64>,
}

/// The collective an instruction performs, if it is a collective or an async
/// start of one.
pub fn collective_kind(instr: &HloInstruction) -> Option<Opcode> {
    let op = match instr.opcode {
        Opcode::AsyncStart => instr.async_wrapped?,
        Opcode::AllGatherStart | Opcode::AllReduceStart | Opcode::CollectivePermuteStart => {
            instr.opcode.sync_collective()?
        }
        op => op,
    };
    match op {
        Opcode::AllReduce
        | Opcode::AllGather
        | Opcode::ReduceScatter
        | Opcode::AllToAll
        | Opcode::RaggedAllToAll
        | Opcode::CollectivePermute
        | Opcode::CollectiveBroadcast
        | Opcode::CollectiveReduce => Some(op),
        _ => None,
    }
}

/// The shape a collective produces: the result shape itself, or for start
/// forms whose result is a `(operands, output, context...)` tuple, the output.
pub fn collective_output_shape(instr: &HloInstruction) -> &Shape {
    let is_tuple_start = matches!(
        instr.opcode,
        Opcode::AsyncStart | Opcode::AllGatherStart | Opcode::CollectivePermuteStart
    );
    match (&instr.shape, is_tuple_start) {
        (Shape::Tuple(elements), true) if elements.len() >= 2 => &elements[1],
        (shape, _) => shape,
    }
}

impl ModuleStats {
    pub fn of(module: &HloModule) -> ModuleStats {
        let mut stats = ModuleStats {
            computations: module.computations.len(),
            ..Default::default()
        };
        // Counted by opcode first, named once per distinct opcode.
        let mut opcodes: BTreeMap<(Option<Opcode>, Opcode), usize> = BTreeMap::new();
        let mut collectives: BTreeMap<Opcode, (usize, u64)> = BTreeMap::new();
        for comp in &module.computations {
            for instr in &comp.instructions {
                stats.instructions += 1;
                *opcodes
                    .entry((instr.async_wrapped, instr.opcode))
                    .or_default() += 1;
                if let Some(kind) = collective_kind(instr) {
                    let bytes = collective_output_shape(instr).byte_size();
                    let entry = collectives.entry(kind).or_default();
                    entry.0 += 1;
                    entry.1 += bytes;
                    stats.collective_bytes += bytes;
                }
            }
        }
        for ((wrapped, opcode), count) in opcodes {
            *stats
                .opcodes
                .entry(crate::printer::opcode_text_of(wrapped, opcode))
                .or_default() += count;
        }
        for (kind, (count, bytes)) in collectives {
            *stats
                .collectives
                .entry(kind.name().to_string())
                .or_default() += count;
            *stats
                .collective_bytes_by_op
                .entry(kind.name().to_string())
                .or_default() += bytes;
        }
        stats
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "instructions": self.instructions,
            "computations": self.computations,
            "opcodes": self.opcodes,
            "collectives": self.collectives,
            "collective_bytes": self.collective_bytes,
            "collective_bytes_by_op": self.collective_bytes_by_op,
        })
    }
}
