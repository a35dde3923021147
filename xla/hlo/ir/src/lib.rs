//! The HLO intermediate representation: element types, shapes, layouts,
//! literals, shardings, replica groups, the closed opcode table, typed
//! attributes, and the module/computation/instruction arenas with a printer
//! that writes the text XLA reads.
//!
//! Invariants: this crate depends on no other project crate (everything else
//! depends on it); nothing in it panics on malformed input: malformed
//! modules are the verifier's business.

pub mod attrs;
pub mod call_graph;
pub mod collective_groups;
pub mod float;
pub mod literal;
pub mod mesh;
pub mod module;
pub mod opcode;
pub mod primitive_type;
pub mod printer;
pub mod replica_groups;
pub mod sdy;
pub mod shape;
pub mod shape_inference;
pub mod sharding;
pub mod stats;
pub mod units;

pub use attrs::{AttrKey, AttrValue, Attribute, ValueKind};
pub use literal::{ArrayLiteral, Literal};
pub use module::{
    AliasEntry, BufferDonor, CompId, ComputationLayout, HloComputation, HloInstruction, HloModule,
    InstrId, ModuleConfig,
};
pub use opcode::{Arity, Category, Opcode};
pub use primitive_type::{PrimitiveType, TypeClass};
pub use replica_groups::CollectiveDeviceList;
pub use shape::{ArrayShape, Layout, Shape};
pub use sharding::{HloSharding, ShardingKind, SingleSharding, TileAssignment};
