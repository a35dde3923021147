//! Dimension bookkeeping for the ops whose operands and result do not line
//! up dim by dim: dot and convolution (as XLA's `DotConvolutionDimsInfo`:
//! batch, contracting, lhs/rhs non-contracting and true spatial dims), and
//! gather/scatter (passthrough, index and parallel dims).
//!
//! Invariant: every dim index returned is within its operand's rank, or -1
//! where XLA uses -1 for "no such dim".

use crate::graph::{Graph, Node};
use xla_hlo_ir::{attrs::WindowDim, AttrKey, Opcode};

/// One dimension correspondence: `(lhs, rhs, output)` dims, -1 when absent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DimNums {
    pub lhs: i64,
    pub rhs: i64,
    pub output: i64,
}

#[derive(Clone, Debug, Default)]
pub(crate) struct DotDims {
    pub batch: Vec<DimNums>,
    pub contracting: Vec<DimNums>,
    pub lhs_non_contracting: Vec<DimNums>,
    pub rhs_non_contracting: Vec<DimNums>,
    pub conv_spatial: Vec<DimNums>,
}

fn d(lhs: i64, rhs: i64, output: i64) -> DimNums {
    DimNums { lhs, rhs, output }
}

/// `ParseDotGeneralFromDot`.
pub(crate) fn dot_dims(g: &Graph, dot: Node) -> DotDims {
    let i = g.instr(dot);
    let dn = i.dot_dimension_numbers();
    let lhs_rank = g.operand(dot, 0).map(|o| g.shape(o).rank()).unwrap_or(0) as i64;
    let rhs_rank = g.operand(dot, 1).map(|o| g.shape(o).rank()).unwrap_or(0) as i64;
    let mut out = DotDims::default();
    for (k, (&l, &r)) in dn.lhs_batch.iter().zip(&dn.rhs_batch).enumerate() {
        out.batch.push(d(l, r, k as i64));
    }
    for (&l, &r) in dn.lhs_contracting.iter().zip(&dn.rhs_contracting) {
        out.contracting.push(d(l, r, -1));
    }
    let nb = dn.lhs_batch.len() as i64;
    for l in 0..lhs_rank {
        if !dn.lhs_batch.contains(&l) && !dn.lhs_contracting.contains(&l) {
            let o = nb + out.lhs_non_contracting.len() as i64;
            out.lhs_non_contracting.push(d(l, -1, o));
        }
    }
    let nl = out.lhs_non_contracting.len() as i64;
    for r in 0..rhs_rank {
        if !dn.rhs_batch.contains(&r) && !dn.rhs_contracting.contains(&r) {
            let o = nb + nl + out.rhs_non_contracting.len() as i64;
            out.rhs_non_contracting.push(d(-1, r, o));
        }
    }
    out
}

fn spatial_is_parallel(wd: &WindowDim, lhs_size: i64) -> bool {
    if lhs_size == wd.size
        && lhs_size == wd.lhs_dilation
        && ((1.max(lhs_size - 1) == wd.stride && wd.rhs_dilation == 1)
            || (1.max(lhs_size - 1) == wd.rhs_dilation && wd.stride == 1))
        && wd.padding_high == 0
        && wd.padding_low == 0
        && !wd.reversal
    {
        return true;
    }
    wd.size == lhs_size
        && wd.padding_high == lhs_size - 1
        && wd.padding_low == lhs_size - 1
        && wd.reversal
        && wd.rhs_dilation == 1
        && wd.stride == lhs_size
        && wd.lhs_dilation == lhs_size - 1
}

/// `ParseConvolutionDimsInfo`.
pub(crate) fn conv_dims(g: &Graph, conv: Node) -> Option<DotDims> {
    let i = g.instr(conv);
    let cd = i.conv_dimension_numbers()?;
    let lhs = g.shape(g.operand(conv, 0)?);
    let rhs = g.shape(g.operand(conv, 1)?);
    let mut out = DotDims::default();
    out.lhs_non_contracting
        .push(d(cd.input_batch, -1, cd.output_batch));
    out.rhs_non_contracting
        .push(d(-1, cd.kernel_output_feature, cd.output_feature));
    out.contracting
        .push(d(cd.input_feature, cd.kernel_input_feature, -1));
    let window = i.window();
    for k in 0..cd.input_spatial.len() {
        let l = cd.input_spatial[k];
        let r = *cd.kernel_spatial.get(k)?;
        let o = *cd.output_spatial.get(k)?;
        let lhs_size = *lhs.dims().get(l as usize)?;
        let rhs_size = *rhs.dims().get(r as usize)?;
        let wd = window
            .and_then(|w| w.dims.get(k))
            .copied()
            .unwrap_or_default();
        let dn = d(l, r, o);
        if spatial_is_parallel(&wd, lhs_size) {
            out.batch.push(dn);
        } else if lhs_size == wd.size
            && wd.lhs_dilation == 1
            && wd.rhs_dilation == 1
            && wd.padding_high == 0
            && wd.padding_low == 0
            && !wd.reversal
        {
            out.contracting.push(dn);
        } else if wd.stride == 1 && wd.rhs_dilation == 1 && wd.lhs_dilation == 1 {
            if rhs_size == 1
                && wd.size == 1
                && wd.padding_high == 0
                && wd.padding_low == 0
                && !wd.reversal
            {
                out.lhs_non_contracting.push(dn);
            } else if lhs_size == 1
                && wd.size == rhs_size
                && wd.padding_high == rhs_size - 1
                && wd.padding_low == rhs_size - 1
                && wd.reversal
            {
                out.rhs_non_contracting.push(dn);
            } else {
                out.conv_spatial.push(dn);
            }
        } else {
            out.conv_spatial.push(dn);
        }
    }
    Some(out)
}

/// `IsConvolutionKernelSmall`.
pub(crate) fn conv_kernel_small(g: &Graph, conv: Node) -> bool {
    let i = g.instr(conv);
    let (Some(cd), Some(rhs)) = (i.conv_dimension_numbers(), g.operand(conv, 1)) else {
        return false;
    };
    let rhs = g.shape(rhs).dims();
    let out = i.shape.dims();
    let (mut kp, mut op) = (1i64, 1i64);
    for k in 0..cd.input_spatial.len() {
        let kd = cd
            .kernel_spatial
            .get(k)
            .and_then(|&x| rhs.get(x as usize))
            .copied()
            .unwrap_or(1);
        let od = cd
            .output_spatial
            .get(k)
            .and_then(|&x| out.get(x as usize))
            .copied()
            .unwrap_or(1);
        kp *= kd;
        op *= od;
        if kd >= od && (k < 2 || kd > 3 || kp >= op) {
            return false;
        }
    }
    true
}

/// Corresponding dims of two arrays (`GatherScatterDims`).
#[derive(Clone, Debug, Default)]
pub(crate) struct GsDims {
    pub operand: Vec<usize>,
    pub indices: Vec<usize>,
    pub output: Vec<usize>,
}

/// `FillOutputDimsWithIndicesDims`.
pub(crate) fn fill_output_dims(dims: &mut GsDims, index_vector_dim: i64, offset_dims: &[i64]) {
    let Some(&max) = dims.indices.iter().max() else {
        return;
    };
    let mut map = rustc_hash::FxHashMap::default();
    let (mut idx, mut out) = (0usize, 0usize);
    while idx <= max {
        if idx as i64 == index_vector_dim {
            idx += 1;
        }
        while offset_dims.contains(&(out as i64)) {
            out += 1;
        }
        map.insert(idx, out);
        idx += 1;
        out += 1;
    }
    dims.output = dims
        .indices
        .iter()
        .map(|i| map.get(i).copied().unwrap_or(0))
        .collect();
}

/// `GetGatherConnectedDimsAcrossIndicesAndOutput`.
pub(crate) fn connected_index_dims(
    indices_rank: usize,
    index_vector_dim: i64,
    output_rank: usize,
    offset_dims: &[i64],
) -> (Vec<usize>, Vec<usize>) {
    let (mut ind, mut out) = (Vec::new(), Vec::new());
    let mut idx = 0usize;
    for o in 0..output_rank {
        if offset_dims.contains(&(o as i64)) {
            continue;
        }
        if idx as i64 == index_vector_dim {
            idx += 1;
        }
        if idx >= indices_rank {
            break;
        }
        ind.push(idx);
        out.push(o);
        idx += 1;
    }
    (ind, out)
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
    let (mut op, mut out) = (Vec::new(), Vec::new());
    let mut skipped = 0usize;
    for (i, &size) in operand_dims.iter().enumerate() {
        if collapsed.contains(&(i as i64)) || batching.contains(&(i as i64)) {
            skipped += 1;
            continue;
        }
        if slice_sizes.get(i) != Some(&size) {
            continue;
        }
        if let Some(&o) = offset_dims.get(i - skipped) {
            op.push(i);
            out.push(o as usize);
        }
    }
    (op, out)
}

/// The iota dimension `n` counts along, if it is an iota: an `iota`, a
/// broadcast of one, an s32 constant equal to its indices along a dim, or a
/// loop/branch parameter element passed through from one
/// (`GetDimensionForIota`).
pub(crate) fn iota_dim(g: &Graph, n: Node) -> Option<usize> {
    iota_dim_depth(g, n, 0)
}

fn iota_dim_depth(g: &Graph, n: Node, depth: usize) -> Option<usize> {
    if depth > 16 {
        return None;
    }
    let i = g.instr(n);
    match i.opcode {
        Opcode::Iota => i.int_attr(AttrKey::IotaDimension).map(|d| d as usize),
        _ if i.shape.element_type() != Some(xla_hlo_ir::PrimitiveType::S32) => None,
        Opcode::Constant => {
            let xla_hlo_ir::Literal::Array(lit) = i.literal.as_deref()? else {
                return None;
            };
            if lit.elided {
                return None;
            }
            let dims = i.shape.dims();
            let strides = {
                let mut s = vec![1i64; dims.len()];
                for d in (0..dims.len().saturating_sub(1)).rev() {
                    s[d] = s[d + 1] * dims[d + 1];
                }
                s
            };
            let count = lit.len();
            (0..dims.len()).find(|&d| {
                dims[d] > 1
                    && (0..count)
                        .all(|e| lit.get_i128(e) == ((e as i64 / strides[d]) % dims[d]) as i128)
            })
        }
        Opcode::Broadcast => {
            let od = iota_dim_depth(g, g.operand(n, 0)?, depth + 1)?;
            i.dimensions().get(od).map(|&d| d as usize)
        }
        Opcode::GetTupleElement => {
            let param = g.operand(n, 0)?;
            if g.opcode(param) != Opcode::Parameter {
                return None;
            }
            let comp = g.comp_of(n);
            let &caller = g.caller.get(&comp)?;
            let index = i.int_attr(AttrKey::Index)?.max(0) as usize;
            match g.opcode(caller) {
                Opcode::While => {
                    let init = g.operand(caller, 0)?;
                    let root = g.root_of(comp);
                    if g.opcode(init) != Opcode::Tuple
                        || g.opcode(root) != Opcode::Tuple
                        || g.operand(root, index) != Some(n)
                    {
                        return None;
                    }
                    iota_dim_depth(g, g.operand(init, index)?, depth + 1)
                }
                Opcode::Conditional => {
                    let branches = g.instr(caller).called_computations();
                    let b = branches.iter().position(|&c| c == comp)?;
                    let arg = g.operand(caller, b + 1)?;
                    if g.opcode(arg) != Opcode::Tuple {
                        return None;
                    }
                    iota_dim_depth(g, g.operand(arg, index)?, depth + 1)
                }
                _ => None,
            }
        }
        _ => None,
    }
}

/// `GetGatherScatterBatchParallelDims`: index dims that count with an iota
/// along an operand dim of slice size 1.
#[allow(clippy::too_many_arguments)]
pub(crate) fn batch_parallel_dims(
    g: &Graph,
    operand: Node,
    indices: Node,
    slice_sizes: &[i64],
    index_vector_dim: i64,
    index_map: &[i64],
    indices_batching: &[i64],
    offset_dims: &[i64],
) -> Option<GsDims> {
    let mut parallel_in: Vec<i64> = vec![-1; index_map.len()];
    let mut ind = indices;
    while g.opcode(ind) == Opcode::Copy {
        ind = g.operand(ind, 0)?;
    }
    let ind = if g.opcode(ind) == Opcode::Concatenate {
        ind
    } else {
        indices
    };
    let ind_instr = g.instr(ind);
    if ind_instr.opcode == Opcode::Concatenate
        && ind_instr.dimensions().first() == Some(&index_vector_dim)
    {
        let mut k = 0usize;
        for op in g.operands(ind).collect::<Vec<_>>() {
            let dims = g.shape(op).dims();
            let count = if (dims.len() as i64) > index_vector_dim {
                dims[index_vector_dim as usize] as usize
            } else {
                1
            };
            if let Some(d) = iota_dim(g, op) {
                if d as i64 != index_vector_dim {
                    for j in 0..count {
                        if let Some(slot) = parallel_in.get_mut(k + j) {
                            *slot = d as i64;
                        }
                    }
                }
            }
            k += count;
        }
    } else if let Some(d) = iota_dim(g, ind) {
        if d as i64 != index_vector_dim {
            let dims = g.shape(ind).dims();
            let count = if (dims.len() as i64) > index_vector_dim {
                dims[index_vector_dim as usize] as usize
            } else {
                1
            };
            parallel_in = vec![d as i64; count];
        }
    }
    let mut out = GsDims::default();
    let op_dims = g.shape(operand).dims();
    let ind_dims = g.shape(ind).dims();
    for (i, &pd) in parallel_in.iter().enumerate() {
        if pd < 0 {
            continue;
        }
        let od = *index_map.get(i)? as usize;
        if out.indices.contains(&(pd as usize)) {
            return None;
        }
        if slice_sizes.get(od) == Some(&1) && !indices_batching.contains(&pd) {
            if op_dims.get(od) != ind_dims.get(pd as usize) {
                return None;
            }
            out.indices.push(pd as usize);
            out.operand.push(od);
        }
    }
    if out.indices.is_empty() {
        return None;
    }
    fill_output_dims(&mut out, index_vector_dim, offset_dims);
    Some(out)
}
