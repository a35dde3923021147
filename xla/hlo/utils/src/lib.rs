//! Sharding algebra over `HloSharding` and named meshes.
//!
//! - [`sharding`]: `Sharding` (one array) and `InstrSharding` (an
//!   instruction, tuples included), canonical forms of the IR's shardings;
//!   `==` is equality modulo representation.
//! - [`tile`]: tile arrays (explicit device arrays) and iota recovery.
//! - [`ops`]: transpose, reshape (split/merge of sharded dims), reverse,
//!   broadcast, reduce, partial replication, dim mappings.
//! - [`merge`]: "more specific", sub-tiling, merging partial shardings, the
//!   improvement rule used by propagation.
//! - [`layout`]: `TiledLayout`, per-device tile shapes, offsets and groups.
//! - [`tiling`]: the tile a device holds, and splitting/assembling arrays
//!   by a sharding (the project's one split/assemble).
//! - [`named`]: JAX/Shardy-style named meshes and partition specs.
//! - [`compare`]: comparing two modules' shardings instruction by instruction.
//! - [`reduction_order`]: the consistent reduction order (a pairwise tree)
//!   and which splits across devices reproduce it.
//! - [`promote`]: all-reduce promotion (bf16 all-reduces summed in f32, as
//!   XLA's CPU compiler does).
//!
//! Invariants: the crate depends only on the IR; nothing panics on malformed
//! input (errors are `ShardingError`); every `Sharding` value is canonical,
//! so structural equality is semantic equality.

pub mod compare;
pub mod error;
pub mod inline;
pub mod layout;
pub mod merge;
pub mod named;
pub mod ops;
pub mod promote;
pub mod reduction_order;
pub mod sharding;
pub mod tile;
pub mod tiling;

pub use error::ShardingError;
pub use layout::TiledLayout;
pub use named::{NamedMesh, PartitionSpec};
pub use sharding::{InstrSharding, Sharding, Tiled};
pub use tile::TileArray;
