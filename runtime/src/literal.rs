//! Host literals: the values that cross the runtime's interface (arguments
//! and results of [`crate::Executable::execute`], the launcher's global
//! inputs and outputs). An array is a `collectives::DeviceBuffer`: element
//! type, dims and shared row-major little-endian bytes, the form that
//! device copies, collectives and `.npy` files take. Backends convert to
//! their own representation (the interpreter's typed arrays, CUDA device
//! memory) behind the interface.
//!
//! Splitting a global literal into a device's tile and assembling tiles
//! back work on the bytes (elements as `[u8; N]`) through the project's one
//! split/assemble, `xla_hlo_utils::tiling`.
//!
//! Invariants: cloning shares the bytes (no copy); a literal's leaves are
//! its arrays in tuple order (tokens hold no data and are skipped).

use crate::error::RuntimeError;
use collectives::DeviceBuffer;
use xla_hlo_ir::sharding::SingleSharding;
use xla_hlo_ir::{PrimitiveType, Shape};
use xla_hlo_utils::tiling::{self, Shard};

/// A host value: a dense array, a tuple of values, or a token.
#[derive(Clone, Debug, PartialEq)]
pub enum Literal {
    Array(DeviceBuffer),
    Tuple(Vec<Literal>),
    Token,
}

impl Literal {
    /// A literal holding a copy of typed values.
    pub fn from_slice<T: collectives::buffer::Element>(
        dims: Vec<i64>,
        values: &[T],
    ) -> Result<Literal, RuntimeError> {
        DeviceBuffer::from_slice(dims, values)
            .map(Literal::Array)
            .map_err(|e| RuntimeError::Arguments(e.to_string()))
    }

    pub fn as_array(&self) -> Option<&DeviceBuffer> {
        match self {
            Literal::Array(a) => Some(a),
            _ => None,
        }
    }

    /// The arrays of the literal, depth first in tuple order.
    pub fn leaves(&self) -> Vec<&DeviceBuffer> {
        fn walk<'a>(l: &'a Literal, out: &mut Vec<&'a DeviceBuffer>) {
            match l {
                Literal::Array(a) => out.push(a),
                Literal::Tuple(e) => e.iter().for_each(|x| walk(x, out)),
                Literal::Token => {}
            }
        }
        let mut out = Vec::new();
        walk(self, &mut out);
        out
    }

    /// The literal's shape.
    pub fn shape(&self) -> Shape {
        match self {
            Literal::Array(a) => Shape::array(a.dtype(), a.dims().to_vec()),
            Literal::Tuple(e) => Shape::Tuple(e.iter().map(Literal::shape).collect()),
            Literal::Token => Shape::array(PrimitiveType::Token, Vec::new()),
        }
    }
}

fn tiling_err(e: xla_hlo_utils::ShardingError) -> RuntimeError {
    RuntimeError::Sharding(e.to_string())
}

/// `bytes` as elements of `N` bytes (one copy).
fn elements<const N: usize>(bytes: &[u8]) -> Result<Vec<[u8; N]>, RuntimeError> {
    if bytes.len() % N != 0 {
        return Err(RuntimeError::Sharding(format!(
            "{} bytes are not a whole number of {N}-byte elements",
            bytes.len()
        )));
    }
    Ok(bytes
        .chunks_exact(N)
        .map(|chunk| {
            let mut element = [0u8; N];
            element.copy_from_slice(chunk);
            element
        })
        .collect())
}

/// A device's tile: its dims and bytes (`None`: the whole array).
type TileBytes = Option<(Vec<i64>, Vec<u8>)>;

/// Device `device`'s tile of `full` under tiled sharding `s` (padded with
/// zeros past the end of the array); the whole array shares `full`'s bytes.
pub fn shard_buffer(
    full: &DeviceBuffer,
    s: &SingleSharding,
    device: i64,
) -> Result<DeviceBuffer, RuntimeError> {
    fn typed<const N: usize>(
        full: &DeviceBuffer,
        s: &SingleSharding,
        device: i64,
    ) -> Result<TileBytes, RuntimeError>
    where
        [u8; N]: Default,
    {
        Ok(
            match tiling::shard(&elements::<N>(full.bytes())?, full.dims(), s, device)
                .map_err(tiling_err)?
            {
                Shard::Whole => None,
                Shard::Tile { dims, elements } => Some((dims, elements.into_flattened())),
            },
        )
    }
    let tile = match full.element_size() {
        1 => typed::<1>(full, s, device)?,
        2 => typed::<2>(full, s, device)?,
        4 => typed::<4>(full, s, device)?,
        8 => typed::<8>(full, s, device)?,
        16 => typed::<16>(full, s, device)?,
        other => return Err(unsupported_size(full, other)),
    };
    match tile {
        None => Ok(full.clone()),
        Some((dims, bytes)) => DeviceBuffer::from_bytes(full.dtype(), dims, &bytes)
            .map_err(|e| RuntimeError::Sharding(e.to_string())),
    }
}

/// The global array of `global_dims` assembled from every device's tile
/// (`shards[d]` is device d's) under `s`; see `xla_hlo_utils::tiling::assemble`
/// for `check_replicas`.
pub fn assemble_buffers(
    shards: &[&DeviceBuffer],
    s: &SingleSharding,
    global_dims: &[i64],
    check_replicas: bool,
) -> Result<DeviceBuffer, RuntimeError> {
    fn typed<const N: usize>(
        shards: &[&DeviceBuffer],
        s: &SingleSharding,
        global_dims: &[i64],
        check_replicas: bool,
    ) -> Result<Vec<u8>, RuntimeError>
    where
        [u8; N]: Default,
    {
        let owned = shards
            .iter()
            .map(|b| elements::<N>(b.bytes()))
            .collect::<Result<Vec<_>, _>>()?;
        let slices: Vec<&[[u8; N]]> = owned.iter().map(Vec::as_slice).collect();
        let dims = shards.first().map(|b| b.dims()).unwrap_or(&[]);
        Ok(
            tiling::assemble(&slices, dims, s, global_dims, check_replicas)
                .map_err(tiling_err)?
                .into_flattened(),
        )
    }
    let first = shards
        .first()
        .ok_or_else(|| RuntimeError::Devices("no device ran".into()))?;
    let tiled = matches!(s.kind, xla_hlo_ir::sharding::ShardingKind::Tiled { .. });
    if !tiled && !check_replicas {
        return Ok((*first).clone());
    }
    if let Some(other) = shards.iter().find(|b| !b.same_shape(first)) {
        return Err(RuntimeError::Devices(format!(
            "devices returned {} and {} for one result",
            first.shape_string(),
            other.shape_string()
        )));
    }
    let bytes = match first.element_size() {
        1 => typed::<1>(shards, s, global_dims, check_replicas)?,
        2 => typed::<2>(shards, s, global_dims, check_replicas)?,
        4 => typed::<4>(shards, s, global_dims, check_replicas)?,
        8 => typed::<8>(shards, s, global_dims, check_replicas)?,
        16 => typed::<16>(shards, s, global_dims, check_replicas)?,
        other => return Err(unsupported_size(first, other)),
    };
    if !tiled {
        return Ok((*first).clone());
    }
    DeviceBuffer::from_bytes(first.dtype(), global_dims.to_vec(), &bytes)
        .map_err(|e| RuntimeError::Sharding(e.to_string()))
}

fn unsupported_size(b: &DeviceBuffer, size: usize) -> RuntimeError {
    RuntimeError::Sharding(format!(
        "{}: elements of {size} bytes cannot be split or assembled",
        b.shape_string()
    ))
}
