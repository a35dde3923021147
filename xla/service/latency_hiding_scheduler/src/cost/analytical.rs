//! Analytical cost model for NVLink / NVSwitch GPU nodes.
//!
//! Compute is a roofline: `max(flops / peak(dtype), bytes / hbm_bandwidth)`
//! plus a kernel overhead for kernel-sized ops (dots, convolutions, fusions,
//! reductions, custom calls, gathers, scatters, sorts); elementwise and data
//! movement ops pay only their bytes (XLA would fuse them), reshapes and
//! bookkeeping ops are free.
//!
//! Collectives follow the alpha-beta model of Thakur, Rabenseifner and
//! Gropp with nccl-tests' bus-bandwidth factors: for `n` participants and a
//! buffer of `S` bytes
//! * all-reduce, ring: `launch + 2(n-1)·α + S·2(n-1)/n / B_ring`;
//!   tree / NVLS: `launch + 2·log2(n)·α + S·2(n-1)/n / B_nvls`;
//!   `Auto` takes the faster of the two (as NCCL's tuner does);
//! * all-gather (S = output), reduce-scatter (S = input), all-to-all:
//!   `launch + (n-1)·α + S·(n-1)/n / B_ring`;
//! * collective-permute: `launch + α + S / B_ring`; collective-broadcast:
//!   `launch + log2(n)·α + S / B_ring`.
//!
//! Groups that span several nodes (device id / `gpus_per_node`) use the
//! inter-node bandwidth `nic_gbps` per participating GPU of a node (rails
//! run in parallel, capped by NVLink) and the inter-node step latency.
//!
//! Defaults (see `GpuSpec::h100_sxm`, `GpuSpec::h200_sxm`), from
//! `../shared/reference/seed-systems.md` §9 and `gpu-device.md`:
//! * NVLink4 ring bus bandwidth 370 GB/s (450 GB/s line rate less ~20 %
//!   protocol overhead; nccl-tests `NCCL_ALGO=RING`); all-reduce NVLS bus
//!   bandwidth 480 GB/s on H100, 475 GB/s measured on H200
//!   (NVIDIA/nccl-tests#212, #272). 1 GiB all-reduce on 8×H200 therefore
//!   costs 3.96 ms (NVLS) or 5.1 ms (ring), the worked figures of §9.1.
//! * Small messages: 4 µs launch plus 0.6 µs per ring step (≈12 µs for an
//!   8-GPU ring all-reduce of a few bytes, ≈8 µs with NVLS, in line with
//!   the 5.4 µs NVLS kernels and ~10 µs NCCL latencies quoted in §9.1).
//! * Compute: 989 TFLOP/s dense BF16 and 4.8 TB/s HBM3e (H200) or
//!   3.35 TB/s HBM3 (H100) nominal, derated to what was measured on the
//!   H200 here (787 TFLOP/s cuBLAS bf16 GEMM = 0.80 of peak; 4269 GB/s
//!   device copy = 0.89 of peak). TF32 runs at half the BF16 rate, FP8 at
//!   twice, FP32/FP64 vector math at 67 TFLOP/s.
//!
//! Invariant: every figure is finite and non-negative for any input.

use super::{sane, CostModel, Op};
use crate::kinds::{is_nop, CollectiveInfo, ResourceKind};
use xla_hlo_ir::{
    AttrKey, HloComputation, HloInstruction, HloModule, Opcode, PrimitiveType, Shape,
};

/// How all-reduces are modelled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllReduceAlgorithm {
    Ring,
    /// Tree / NVLS (in-switch reduction): log-depth latency, NVLS bandwidth.
    Tree,
    /// The faster of ring and tree for each message (NCCL's tuner).
    Auto,
}

/// Hardware figures of one GPU node type.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuSpec {
    pub name: String,
    /// Dense BF16/FP16 tensor-core peak, TFLOP/s (nominal).
    pub bf16_tflops: f64,
    /// Dense TF32 tensor-core peak (f32 dots), TFLOP/s.
    pub tf32_tflops: f64,
    /// Dense FP8 / INT8 tensor-core peak, TFLOP/s.
    pub fp8_tflops: f64,
    /// Vector FP32 (and FP64 tensor) peak, TFLOP/s.
    pub fp32_tflops: f64,
    /// Achievable fraction of the tensor-core peaks.
    pub matmul_efficiency: f64,
    /// HBM bandwidth, GB/s (nominal).
    pub hbm_gbps: f64,
    /// Achievable fraction of the HBM bandwidth.
    pub memory_efficiency: f64,
    /// Launch overhead of a kernel-sized op, µs.
    pub kernel_overhead_us: f64,
    /// GPUs behind one NVSwitch (one node).
    pub gpus_per_node: i64,
    /// NVLink ring bus bandwidth, GB/s.
    pub nvlink_busbw_gbps: f64,
    /// All-reduce bus bandwidth with NVLS / tree, GB/s.
    pub nvls_busbw_gbps: f64,
    /// Latency of one ring or tree step over NVLink, µs.
    pub nvlink_alpha_us: f64,
    /// Fixed launch cost of a collective, µs.
    pub collective_launch_us: f64,
    /// Inter-node bandwidth per GPU (one NIC per GPU), GB/s.
    pub nic_gbps: f64,
    /// Latency of one step that crosses nodes, µs.
    pub inter_node_alpha_us: f64,
    pub all_reduce_algorithm: AllReduceAlgorithm,
}

impl GpuSpec {
    /// 8× H100 SXM (80 GB HBM3) on NVLink4 / NVSwitch, 400 Gb/s NIC per GPU.
    pub fn h100_sxm() -> GpuSpec {
        GpuSpec {
            name: "H100-SXM".into(),
            bf16_tflops: 989.0,
            tf32_tflops: 494.5,
            fp8_tflops: 1979.0,
            fp32_tflops: 67.0,
            matmul_efficiency: 0.80,
            hbm_gbps: 3350.0,
            memory_efficiency: 0.89,
            kernel_overhead_us: 2.0,
            gpus_per_node: 8,
            nvlink_busbw_gbps: 370.0,
            nvls_busbw_gbps: 480.0,
            nvlink_alpha_us: 0.6,
            collective_launch_us: 4.0,
            nic_gbps: 45.0,
            inter_node_alpha_us: 8.0,
            all_reduce_algorithm: AllReduceAlgorithm::Auto,
        }
    }

    /// 8× H200 SXM (141 GB HBM3e at 4.8 TB/s): H100 compute and NVLink,
    /// the all-reduce NVLS figure measured on H200 (475 GB/s).
    pub fn h200_sxm() -> GpuSpec {
        GpuSpec {
            name: "H200-SXM".into(),
            hbm_gbps: 4800.0,
            nvls_busbw_gbps: 475.0,
            ..GpuSpec::h100_sxm()
        }
    }

    /// `h100` / `h200` (case-insensitive, `-sxm` optional).
    pub fn by_name(name: &str) -> Option<GpuSpec> {
        match name.to_ascii_lowercase().trim_end_matches("-sxm") {
            "h100" => Some(GpuSpec::h100_sxm()),
            "h200" => Some(GpuSpec::h200_sxm()),
            _ => None,
        }
    }

    fn peak_tflops(&self, ty: Option<PrimitiveType>, tensor_op: bool) -> f64 {
        use PrimitiveType as P;
        if !tensor_op {
            return self.fp32_tflops;
        }
        let peak = match ty {
            Some(P::Bf16 | P::F16) => self.bf16_tflops,
            Some(P::F32 | P::C64) => self.tf32_tflops,
            Some(P::S8 | P::U8 | P::S4 | P::U4) => self.fp8_tflops,
            Some(t) if t.is_float() && t.bit_width() <= 8 => self.fp8_tflops,
            _ => return self.fp32_tflops,
        };
        peak * self.matmul_efficiency
    }

    fn hbm_bytes_per_us(&self) -> f64 {
        self.hbm_gbps * self.memory_efficiency * 1e3
    }
}

/// The analytical model.
#[derive(Clone, Debug)]
pub struct AnalyticalCostModel {
    pub spec: GpuSpec,
}

impl AnalyticalCostModel {
    pub fn new(spec: GpuSpec) -> AnalyticalCostModel {
        AnalyticalCostModel { spec }
    }

    /// Nodes a group spans and participating GPUs per node.
    fn topology(&self, info: &CollectiveInfo) -> (i64, i64) {
        let per = self.spec.gpus_per_node.max(1);
        let n = info.group_size.max(1);
        let nodes = match &info.first_group {
            Some(g) if !g.is_empty() => {
                let mut ids: Vec<i64> = g.iter().map(|d| d.div_euclid(per)).collect();
                ids.sort_unstable();
                ids.dedup();
                ids.len() as i64
            }
            _ => (n + per - 1) / per,
        }
        .max(1);
        (nodes, (n + nodes - 1) / nodes)
    }

    /// (alpha per step µs, ring bus bandwidth bytes/µs, all-reduce tree bus bandwidth bytes/µs).
    fn links(&self, info: &CollectiveInfo) -> (f64, f64, f64) {
        let s = &self.spec;
        let (nodes, per_node) = self.topology(info);
        if nodes <= 1 {
            (
                s.nvlink_alpha_us,
                s.nvlink_busbw_gbps * 1e3,
                s.nvls_busbw_gbps * 1e3,
            )
        } else {
            let bw = (s.nic_gbps * per_node as f64).min(s.nvlink_busbw_gbps) * 1e3;
            (s.inter_node_alpha_us, bw, bw)
        }
    }

    /// Collective time from its description (µs).
    pub fn collective_us(&self, info: &CollectiveInfo) -> f64 {
        let s = &self.spec;
        let n = info.group_size.max(1) as f64;
        let bytes = info.message_bytes() as f64;
        if info.kind == ResourceKind::Copy {
            // A device copy: read and write.
            return s.collective_launch_us + 2.0 * bytes / s.hbm_bytes_per_us();
        }
        if n <= 1.0 && info.kind != ResourceKind::CollectivePermute {
            return s.collective_launch_us;
        }
        let (alpha, ring_bw, tree_bw) = self.links(info);
        let log2n = n.log2().ceil().max(1.0);
        let t = match info.kind {
            ResourceKind::AllReduce => {
                let factor = 2.0 * (n - 1.0) / n;
                let ring = 2.0 * (n - 1.0) * alpha + bytes * factor / ring_bw;
                let tree = 2.0 * log2n * alpha + bytes * factor / tree_bw;
                match s.all_reduce_algorithm {
                    AllReduceAlgorithm::Ring => ring,
                    AllReduceAlgorithm::Tree => tree,
                    AllReduceAlgorithm::Auto => ring.min(tree),
                }
            }
            ResourceKind::AllGather
            | ResourceKind::ReduceScatter
            | ResourceKind::AllToAll
            | ResourceKind::RaggedAllToAll => (n - 1.0) * alpha + bytes * (n - 1.0) / n / ring_bw,
            ResourceKind::CollectivePermute | ResourceKind::SendRecv => alpha + bytes / ring_bw,
            ResourceKind::CollectiveBroadcast => log2n * alpha + bytes / ring_bw,
            ResourceKind::Copy | ResourceKind::AsyncCompute => 0.0,
        };
        s.collective_launch_us + t
    }

    /// Roofline time of one instruction on the compute stream (µs).
    pub fn roofline_us(
        &self,
        module: &HloModule,
        comp: &HloComputation,
        instr: &HloInstruction,
    ) -> f64 {
        if is_nop(instr) || instr.opcode == Opcode::Reshape {
            return 0.0;
        }
        if is_control_or_async(instr.opcode) {
            return 0.0;
        }
        let flops = flops(module, comp, instr, 0);
        let bytes = bytes_accessed(comp, instr) as f64;
        let tensor = is_tensor_op(module, instr);
        let ty = dot_type(comp, instr);
        let peak = self.spec.peak_tflops(ty, tensor) * 1e6; // flop per µs
        let t = (flops / peak).max(bytes / self.spec.hbm_bytes_per_us());
        let overhead = if is_kernel_sized(instr.opcode) {
            self.spec.kernel_overhead_us
        } else {
            0.0
        };
        t + overhead
    }
}

impl CostModel for AnalyticalCostModel {
    fn name(&self) -> String {
        format!("analytical({})", self.spec.name)
    }
    fn compute_us(&self, op: Op<'_>) -> f64 {
        match op.instr() {
            Some(i) => sane(self.roofline_us(op.module, op.comp, i)),
            None => 0.0,
        }
    }
    fn transfer_us(&self, op: Op<'_>, info: &CollectiveInfo) -> f64 {
        if info.kind == ResourceKind::AsyncCompute {
            // An async wrapped computation: the roofline of its root.
            if let Some(c) = op.instr().and_then(|i| i.computation_attr(AttrKey::Calls)) {
                if let Some(callee) = op.module.computations.get(c.index()) {
                    let t: f64 = callee
                        .instructions
                        .iter()
                        .map(|i| self.roofline_us(op.module, callee, i))
                        .sum();
                    return sane(t);
                }
            }
            return 0.0;
        }
        sane(self.collective_us(info))
    }
}

fn is_control_or_async(op: Opcode) -> bool {
    matches!(
        op,
        Opcode::While
            | Opcode::Call
            | Opcode::Conditional
            | Opcode::AsyncStart
            | Opcode::AsyncUpdate
            | Opcode::AsyncDone
            | Opcode::AllReduceStart
            | Opcode::AllReduceDone
            | Opcode::AllGatherStart
            | Opcode::AllGatherDone
            | Opcode::CollectivePermuteStart
            | Opcode::CollectivePermuteDone
            | Opcode::CopyStart
            | Opcode::CopyDone
            | Opcode::Send
            | Opcode::SendDone
            | Opcode::Recv
            | Opcode::RecvDone
            | Opcode::AllReduce
            | Opcode::AllGather
            | Opcode::ReduceScatter
            | Opcode::AllToAll
            | Opcode::CollectivePermute
            | Opcode::CollectiveBroadcast
            | Opcode::RaggedAllToAll
            | Opcode::CollectiveReduce
    )
}

fn is_kernel_sized(op: Opcode) -> bool {
    matches!(
        op,
        Opcode::Fusion
            | Opcode::Dot
            | Opcode::RaggedDot
            | Opcode::ScaledDot
            | Opcode::Convolution
            | Opcode::CustomCall
            | Opcode::Reduce
            | Opcode::ReduceWindow
            | Opcode::SelectAndScatter
            | Opcode::Sort
            | Opcode::Scatter
            | Opcode::Gather
            | Opcode::Fft
            | Opcode::TriangularSolve
            | Opcode::Cholesky
            | Opcode::TopK
            | Opcode::Scan
            | Opcode::RngBitGenerator
            | Opcode::Rng
    )
}

fn elements(shape: &Shape) -> f64 {
    shape
        .leaves()
        .iter()
        .filter_map(|s| s.as_array())
        .map(|a| a.element_count().max(0) as f64)
        .sum()
}

fn operand<'a>(
    comp: &'a HloComputation,
    instr: &HloInstruction,
    i: usize,
) -> Option<&'a HloInstruction> {
    instr
        .operands
        .get(i)
        .and_then(|o| comp.instructions.get(o.index()))
}

fn is_tensor_op(module: &HloModule, instr: &HloInstruction) -> bool {
    match instr.opcode {
        Opcode::Dot | Opcode::Convolution | Opcode::RaggedDot | Opcode::ScaledDot => true,
        Opcode::Fusion => instr
            .computation_attr(AttrKey::Calls)
            .and_then(|c| module.computations.get(c.index()))
            .is_some_and(|c| {
                c.instructions
                    .iter()
                    .any(|i| matches!(i.opcode, Opcode::Dot | Opcode::Convolution))
            }),
        Opcode::CustomCall => instr
            .ident_attr(AttrKey::CustomCallTarget)
            .is_some_and(|t| t.contains("gemm") || t.contains("matmul") || t.contains("conv")),
        _ => false,
    }
}

/// The element type that decides the tensor-core rate.
fn dot_type(comp: &HloComputation, instr: &HloInstruction) -> Option<PrimitiveType> {
    operand(comp, instr, 0)
        .and_then(|o| o.shape.element_type())
        .or_else(|| instr.shape.element_type())
}

/// Floating-point operations of one instruction (fusions: of their body).
pub fn flops(
    module: &HloModule,
    comp: &HloComputation,
    instr: &HloInstruction,
    depth: usize,
) -> f64 {
    let out = elements(&instr.shape);
    match instr.opcode {
        Opcode::Dot | Opcode::ScaledDot | Opcode::RaggedDot => {
            let contracting: f64 = match operand(comp, instr, 0) {
                Some(lhs) => instr
                    .ints_attr(AttrKey::LhsContractingDims)
                    .unwrap_or(&[])
                    .iter()
                    .filter_map(|&d| lhs.shape.dims().get(usize::try_from(d).ok()?).copied())
                    .map(|d| d.max(0) as f64)
                    .product(),
                None => 1.0,
            };
            2.0 * out * contracting
        }
        Opcode::Convolution => {
            let kernel = operand(comp, instr, 1);
            let per_output = match (kernel, instr.conv_dimension_numbers()) {
                (Some(k), Some(dn)) => {
                    let dims = k.shape.dims();
                    let get = |d: i64| -> f64 {
                        usize::try_from(d)
                            .ok()
                            .and_then(|d| dims.get(d))
                            .map_or(1.0, |&v| v.max(0) as f64)
                    };
                    let spatial: f64 = dn.kernel_spatial.iter().map(|&d| get(d)).product();
                    spatial * get(dn.kernel_input_feature)
                }
                _ => 1.0,
            };
            2.0 * out * per_output
        }
        Opcode::Reduce => instr
            .operands
            .iter()
            .filter_map(|o| comp.instructions.get(o.index()))
            .map(|o| elements(&o.shape))
            .sum::<f64>()
            .max(out),
        Opcode::ReduceWindow => {
            let window: f64 = instr
                .window()
                .map(|w| w.dims.iter().map(|d| d.size.max(1) as f64).product())
                .unwrap_or(1.0);
            out * window
        }
        Opcode::Fusion if depth < 8 => instr
            .computation_attr(AttrKey::Calls)
            .and_then(|c| module.computations.get(c.index()))
            .map(|c| {
                c.instructions
                    .iter()
                    .map(|i| flops(module, c, i, depth + 1))
                    .sum()
            })
            .unwrap_or(0.0),
        op if op.is_elementwise() => out,
        _ => 0.0,
    }
}

/// Bytes read and written by one instruction.
pub fn bytes_accessed(comp: &HloComputation, instr: &HloInstruction) -> u64 {
    let out = instr.shape.byte_size();
    let op_bytes = |i: usize| operand(comp, instr, i).map_or(0, |o| o.shape.byte_size());
    let all_operands: u64 = (0..instr.operands.len()).map(op_bytes).sum();
    match instr.opcode {
        Opcode::Slice | Opcode::DynamicSlice => 2 * out,
        Opcode::DynamicUpdateSlice => 2 * op_bytes(1),
        Opcode::Gather => 2 * out + op_bytes(1),
        Opcode::Scatter => {
            let n = instr.operands.len();
            let updates: u64 = (n / 2 + 1..n).map(op_bytes).sum();
            2 * updates + op_bytes(n / 2)
        }
        Opcode::Broadcast | Opcode::Iota => out + all_operands.min(out),
        Opcode::Concatenate => 2 * out,
        _ => out + all_operands,
    }
}
