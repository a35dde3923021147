//! Dimension bookkeeping for the ops whose operands and result do not line
//! up dim by dim: dot and convolution (as XLA's `DotConvolutionDimsInfo`:
//! batch, contracting, lhs/rhs non-contracting and true spatial dims), and
//! gather/scatter (passthrough, index and parallel dims).
//!
//! Invariant: every dim index returned is within its operand's rank, or
//! `NO_DIM` where XLA uses -1 for "no such dim".

use crate::graph::{Graph, Node};
use xla_hlo_ir::{attrs::WindowDim, AttrKey, Opcode};

/// Marks a dim an operand or the output does not have.
pub(crate) const NO_DIM: i64 = -1;

/// One dim seen from both operands and the output of a dot or
/// convolution (XLA's `DimNums`): its index in each, `NO_DIM` when absent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DimCorrespondence {
    pub lhs: i64,
    pub rhs: i64,
    pub output: i64,
}

impl DimCorrespondence {
    /// The dim in operand `operand_index` (0: lhs, 1: rhs).
    pub fn operand_dim(&self, operand_index: usize) -> i64 {
        if operand_index == 0 {
            self.lhs
        } else {
            self.rhs
        }
    }
}

/// A dot's or convolution's dims by role (`DotConvolutionDimsInfo`).
#[derive(Clone, Debug, Default)]
pub(crate) struct DotDims {
    pub batch: Vec<DimCorrespondence>,
    pub contracting: Vec<DimCorrespondence>,
    pub lhs_non_contracting: Vec<DimCorrespondence>,
    pub rhs_non_contracting: Vec<DimCorrespondence>,
    /// Convolution spatial dims that are neither batch-, contracting- nor
    /// non-contracting-like.
    pub conv_spatial: Vec<DimCorrespondence>,
}

impl DotDims {
    /// The non-contracting dims of operand `operand_index` (0: lhs, 1: rhs).
    pub fn non_contracting(&self, operand_index: usize) -> &[DimCorrespondence] {
        if operand_index == 0 {
            &self.lhs_non_contracting
        } else {
            &self.rhs_non_contracting
        }
    }
}

fn correspondence(lhs: i64, rhs: i64, output: i64) -> DimCorrespondence {
    DimCorrespondence { lhs, rhs, output }
}

/// `ParseDotGeneralFromDot`.
pub(crate) fn dot_dims(graph: &Graph, dot: Node) -> DotDims {
    let dim_numbers = graph.instr(dot).dot_dimension_numbers();
    let operand_rank = |index: usize| {
        graph
            .operand(dot, index)
            .map(|operand| graph.shape(operand).rank())
            .unwrap_or(0) as i64
    };
    let (lhs_rank, rhs_rank) = (operand_rank(0), operand_rank(1));
    let mut dims = DotDims::default();
    for (k, (&lhs, &rhs)) in dim_numbers
        .lhs_batch
        .iter()
        .zip(&dim_numbers.rhs_batch)
        .enumerate()
    {
        dims.batch.push(correspondence(lhs, rhs, k as i64));
    }
    for (&lhs, &rhs) in dim_numbers
        .lhs_contracting
        .iter()
        .zip(&dim_numbers.rhs_contracting)
    {
        dims.contracting.push(correspondence(lhs, rhs, NO_DIM));
    }
    // Output dims: batch, then lhs non-contracting, then rhs non-contracting.
    let batch_count = dim_numbers.lhs_batch.len() as i64;
    for lhs in 0..lhs_rank {
        if !dim_numbers.lhs_batch.contains(&lhs) && !dim_numbers.lhs_contracting.contains(&lhs) {
            let output = batch_count + dims.lhs_non_contracting.len() as i64;
            dims.lhs_non_contracting
                .push(correspondence(lhs, NO_DIM, output));
        }
    }
    let lhs_free_count = dims.lhs_non_contracting.len() as i64;
    for rhs in 0..rhs_rank {
        if !dim_numbers.rhs_batch.contains(&rhs) && !dim_numbers.rhs_contracting.contains(&rhs) {
            let output = batch_count + lhs_free_count + dims.rhs_non_contracting.len() as i64;
            dims.rhs_non_contracting
                .push(correspondence(NO_DIM, rhs, output));
        }
    }
    dims
}

/// A convolution spatial dim whose window covers the whole input once per
/// output element, i.e. one that behaves as a batch dim.
fn spatial_is_parallel(window: &WindowDim, lhs_size: i64) -> bool {
    if lhs_size == window.size
        && lhs_size == window.lhs_dilation
        && ((1.max(lhs_size - 1) == window.stride && window.rhs_dilation == 1)
            || (1.max(lhs_size - 1) == window.rhs_dilation && window.stride == 1))
        && window.padding_high == 0
        && window.padding_low == 0
        && !window.reversal
    {
        return true;
    }
    window.size == lhs_size
        && window.padding_high == lhs_size - 1
        && window.padding_low == lhs_size - 1
        && window.reversal
        && window.rhs_dilation == 1
        && window.stride == lhs_size
        && window.lhs_dilation == lhs_size - 1
}

/// `ParseConvolutionDimsInfo`.
pub(crate) fn conv_dims(graph: &Graph, conv: Node) -> Option<DotDims> {
    let instr = graph.instr(conv);
    let conv_numbers = instr.conv_dimension_numbers()?;
    let lhs = graph.shape(graph.operand(conv, 0)?);
    let rhs = graph.shape(graph.operand(conv, 1)?);
    let mut dims = DotDims::default();
    dims.lhs_non_contracting.push(correspondence(
        conv_numbers.input_batch,
        NO_DIM,
        conv_numbers.output_batch,
    ));
    dims.rhs_non_contracting.push(correspondence(
        NO_DIM,
        conv_numbers.kernel_output_feature,
        conv_numbers.output_feature,
    ));
    dims.contracting.push(correspondence(
        conv_numbers.input_feature,
        conv_numbers.kernel_input_feature,
        NO_DIM,
    ));
    let window = instr.window();
    for k in 0..conv_numbers.input_spatial.len() {
        let lhs_dim = conv_numbers.input_spatial[k];
        let rhs_dim = *conv_numbers.kernel_spatial.get(k)?;
        let output_dim = *conv_numbers.output_spatial.get(k)?;
        let lhs_size = *lhs.dims().get(lhs_dim as usize)?;
        let rhs_size = *rhs.dims().get(rhs_dim as usize)?;
        let window_dim = window
            .and_then(|window| window.dims.get(k))
            .copied()
            .unwrap_or_default();
        let dim = correspondence(lhs_dim, rhs_dim, output_dim);
        if spatial_is_parallel(&window_dim, lhs_size) {
            dims.batch.push(dim);
        } else if lhs_size == window_dim.size
            && window_dim.lhs_dilation == 1
            && window_dim.rhs_dilation == 1
            && window_dim.padding_high == 0
            && window_dim.padding_low == 0
            && !window_dim.reversal
        {
            dims.contracting.push(dim);
        } else if window_dim.stride == 1
            && window_dim.rhs_dilation == 1
            && window_dim.lhs_dilation == 1
        {
            if rhs_size == 1
                && window_dim.size == 1
                && window_dim.padding_high == 0
                && window_dim.padding_low == 0
                && !window_dim.reversal
            {
                dims.lhs_non_contracting.push(dim);
            } else if lhs_size == 1
                && window_dim.size == rhs_size
                && window_dim.padding_high == rhs_size - 1
                && window_dim.padding_low == rhs_size - 1
                && window_dim.reversal
            {
                dims.rhs_non_contracting.push(dim);
            } else {
                dims.conv_spatial.push(dim);
            }
        } else {
            dims.conv_spatial.push(dim);
        }
    }
    Some(dims)
}

/// `IsConvolutionKernelSmall`: every spatial dim's kernel is smaller than
/// its output (beyond the first two dims, small enough in total).
pub(crate) fn conv_kernel_small(graph: &Graph, conv: Node) -> bool {
    let instr = graph.instr(conv);
    let (Some(conv_numbers), Some(rhs)) = (instr.conv_dimension_numbers(), graph.operand(conv, 1))
    else {
        return false;
    };
    let kernel_dims = graph.shape(rhs).dims();
    let output_dims = instr.shape.dims();
    let (mut kernel_product, mut output_product) = (1i64, 1i64);
    for k in 0..conv_numbers.input_spatial.len() {
        let kernel_size = conv_numbers
            .kernel_spatial
            .get(k)
            .and_then(|&dim| kernel_dims.get(dim as usize))
            .copied()
            .unwrap_or(1);
        let output_size = conv_numbers
            .output_spatial
            .get(k)
            .and_then(|&dim| output_dims.get(dim as usize))
            .copied()
            .unwrap_or(1);
        kernel_product *= kernel_size;
        output_product *= output_size;
        if kernel_size >= output_size
            && (k < 2 || kernel_size > 3 || kernel_product >= output_product)
        {
            return false;
        }
    }
    true
}

/// Corresponding dims of a gather's or scatter's operand, indices and
/// output (or updates) (`GatherScatterDims`).
#[derive(Clone, Debug, Default)]
pub(crate) struct GatherScatterDims {
    pub operand: Vec<usize>,
    pub indices: Vec<usize>,
    pub output: Vec<usize>,
}

/// `FillOutputDimsWithIndicesDims`: the output dims the index dims land on
/// (skipping the index vector dim and the offset dims).
pub(crate) fn fill_output_dims(
    dims: &mut GatherScatterDims,
    index_vector_dim: i64,
    offset_dims: &[i64],
) {
    let Some(&max) = dims.indices.iter().max() else {
        return;
    };
    let mut index_to_output = rustc_hash::FxHashMap::default();
    let (mut index_dim, mut output_dim) = (0usize, 0usize);
    while index_dim <= max {
        if index_dim as i64 == index_vector_dim {
            index_dim += 1;
        }
        while offset_dims.contains(&(output_dim as i64)) {
            output_dim += 1;
        }
        index_to_output.insert(index_dim, output_dim);
        index_dim += 1;
        output_dim += 1;
    }
    dims.output = dims
        .indices
        .iter()
        .map(|dim| index_to_output.get(dim).copied().unwrap_or(0))
        .collect();
}

/// `GetGatherConnectedDimsAcrossIndicesAndOutput`: the index dims and the
/// output batch dims they become, in order.
pub(crate) fn connected_index_dims(
    indices_rank: usize,
    index_vector_dim: i64,
    output_rank: usize,
    offset_dims: &[i64],
) -> (Vec<usize>, Vec<usize>) {
    let (mut index_dims, mut output_dims) = (Vec::new(), Vec::new());
    let mut index_dim = 0usize;
    for output_dim in 0..output_rank {
        if offset_dims.contains(&(output_dim as i64)) {
            continue;
        }
        if index_dim as i64 == index_vector_dim {
            index_dim += 1;
        }
        if index_dim >= indices_rank {
            break;
        }
        index_dims.push(index_dim);
        output_dims.push(output_dim);
        index_dim += 1;
    }
    (index_dims, output_dims)
}

/// `GetGatherScatterOperandPassthroughDims`: operand dims kept whole, with
/// the output (or update) dims they land on.
pub(crate) fn passthrough_dims(
    operand_dims: &[i64],
    collapsed: &[i64],
    batching: &[i64],
    offset_dims: &[i64],
    slice_sizes: &[i64],
) -> (Vec<usize>, Vec<usize>) {
    let (mut kept_operand_dims, mut output_dims) = (Vec::new(), Vec::new());
    let mut skipped = 0usize;
    for (dim, &size) in operand_dims.iter().enumerate() {
        if collapsed.contains(&(dim as i64)) || batching.contains(&(dim as i64)) {
            skipped += 1;
            continue;
        }
        if slice_sizes.get(dim) != Some(&size) {
            continue;
        }
        if let Some(&output_dim) = offset_dims.get(dim - skipped) {
            kept_operand_dims.push(dim);
            output_dims.push(output_dim as usize);
        }
    }
    (kept_operand_dims, output_dims)
}

/// How far `iota_dim` follows broadcasts and loop/branch parameters.
const MAX_IOTA_TRACE_DEPTH: usize = 16;

/// The iota dimension `node` counts along, if it is an iota: an `iota`, a
/// broadcast of one, an s32 constant equal to its indices along a dim, or a
/// loop/branch parameter element passed through from one
/// (`GetDimensionForIota`).
pub(crate) fn iota_dim(graph: &Graph, node: Node) -> Option<usize> {
    iota_dim_at_depth(graph, node, 0)
}

fn iota_dim_at_depth(graph: &Graph, node: Node, depth: usize) -> Option<usize> {
    if depth > MAX_IOTA_TRACE_DEPTH {
        return None;
    }
    let instr = graph.instr(node);
    match instr.opcode {
        Opcode::Iota => instr
            .int_attr(AttrKey::IotaDimension)
            .map(|dim| dim as usize),
        _ if instr.shape.element_type() != Some(xla_hlo_ir::PrimitiveType::S32) => None,
        Opcode::Constant => iota_dim_of_constant(instr),
        Opcode::Broadcast => {
            let operand_dim = iota_dim_at_depth(graph, graph.operand(node, 0)?, depth + 1)?;
            instr.dimensions().get(operand_dim).map(|&dim| dim as usize)
        }
        Opcode::GetTupleElement => {
            let parameter = graph.operand(node, 0)?;
            if graph.opcode(parameter) != Opcode::Parameter {
                return None;
            }
            let comp = graph.comp_of(node);
            let &caller = graph.caller.get(&comp)?;
            let index = instr.int_attr(AttrKey::Index)?.max(0) as usize;
            match graph.opcode(caller) {
                // The loop passes the element through unchanged.
                Opcode::While => {
                    let init = graph.operand(caller, 0)?;
                    let root = graph.root_of(comp);
                    if graph.opcode(init) != Opcode::Tuple
                        || graph.opcode(root) != Opcode::Tuple
                        || graph.operand(root, index) != Some(node)
                    {
                        return None;
                    }
                    iota_dim_at_depth(graph, graph.operand(init, index)?, depth + 1)
                }
                Opcode::Conditional => {
                    let branches = graph.instr(caller).called_computations();
                    let branch = branches.iter().position(|&c| c == comp)?;
                    let argument = graph.operand(caller, branch + 1)?;
                    if graph.opcode(argument) != Opcode::Tuple {
                        return None;
                    }
                    iota_dim_at_depth(graph, graph.operand(argument, index)?, depth + 1)
                }
                _ => None,
            }
        }
        _ => None,
    }
}

/// The dim (of size > 1) along which an s32 constant equals its index.
fn iota_dim_of_constant(instr: &xla_hlo_ir::HloInstruction) -> Option<usize> {
    let xla_hlo_ir::Literal::Array(literal) = instr.literal.as_deref()? else {
        return None;
    };
    if literal.elided {
        return None;
    }
    let dims = instr.shape.dims();
    let strides = {
        let mut strides = vec![1i64; dims.len()];
        for dim in (0..dims.len().saturating_sub(1)).rev() {
            strides[dim] = strides[dim + 1] * dims[dim + 1];
        }
        strides
    };
    let count = literal.len();
    (0..dims.len()).find(|&dim| {
        dims[dim] > 1
            && (0..count).all(|element| {
                literal.get_i128(element) == ((element as i64 / strides[dim]) % dims[dim]) as i128
            })
    })
}

/// The size of `dims` along the index vector dim (1 when the indices have
/// no such dim).
fn index_vector_size(dims: &[i64], index_vector_dim: i64) -> usize {
    if (dims.len() as i64) > index_vector_dim {
        dims[index_vector_dim as usize] as usize
    } else {
        1
    }
}

/// `GetGatherScatterBatchParallelDims`: index dims that count with an iota
/// along an operand dim of slice size 1.
#[allow(clippy::too_many_arguments)]
pub(crate) fn batch_parallel_dims(
    graph: &Graph,
    operand: Node,
    indices: Node,
    slice_sizes: &[i64],
    index_vector_dim: i64,
    index_map: &[i64],
    indices_batching: &[i64],
    offset_dims: &[i64],
) -> Option<GatherScatterDims> {
    // For each index vector component, the indices dim its iota counts
    // along (NO_DIM when it is no iota).
    let mut iota_dims: Vec<i64> = vec![NO_DIM; index_map.len()];
    let mut source = indices;
    while graph.opcode(source) == Opcode::Copy {
        source = graph.operand(source, 0)?;
    }
    let source = if graph.opcode(source) == Opcode::Concatenate {
        source
    } else {
        indices
    };
    let source_instr = graph.instr(source);
    if source_instr.opcode == Opcode::Concatenate
        && source_instr.dimensions().first() == Some(&index_vector_dim)
    {
        let mut component = 0usize;
        for part in graph.operands(source).collect::<Vec<_>>() {
            let count = index_vector_size(graph.shape(part).dims(), index_vector_dim);
            if let Some(dim) = iota_dim(graph, part) {
                if dim as i64 != index_vector_dim {
                    for j in 0..count {
                        if let Some(slot) = iota_dims.get_mut(component + j) {
                            *slot = dim as i64;
                        }
                    }
                }
            }
            component += count;
        }
    } else if let Some(dim) = iota_dim(graph, source) {
        if dim as i64 != index_vector_dim {
            let count = index_vector_size(graph.shape(source).dims(), index_vector_dim);
            iota_dims = vec![dim as i64; count];
        }
    }
    let mut parallel = GatherScatterDims::default();
    let operand_dims = graph.shape(operand).dims();
    let source_dims = graph.shape(source).dims();
    for (component, &indices_dim) in iota_dims.iter().enumerate() {
        if indices_dim < 0 {
            continue;
        }
        let operand_dim = *index_map.get(component)? as usize;
        if parallel.indices.contains(&(indices_dim as usize)) {
            return None;
        }
        if slice_sizes.get(operand_dim) == Some(&1) && !indices_batching.contains(&indices_dim) {
            if operand_dims.get(operand_dim) != source_dims.get(indices_dim as usize) {
                return None;
            }
            parallel.indices.push(indices_dim as usize);
            parallel.operand.push(operand_dim);
        }
    }
    if parallel.indices.is_empty() {
        return None;
    }
    fill_output_dims(&mut parallel, index_vector_dim, offset_dims);
    Some(parallel)
}
