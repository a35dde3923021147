//! Analytical cost model for NVLink / NVSwitch GPU nodes.
//!
//! Compute is a roofline: `max(flops / peak(dtype), bytes / hbm_bandwidth)`
//! plus a kernel overhead for kernel-sized ops (dots, convolutions, fusions,
//! reductions, custom calls, gathers, scatters, sorts); elementwise and data
//! movement ops pay only their bytes (XLA would fuse them), reshapes,
//! broadcasts, iotas and bookkeeping ops are free. Each opcode's treatment
//! (stream use, counted work, memory traffic, tensor-core use, role in
//! fusion) is one entry of `profile`, which lists every opcode.
//!
//! Bytes are counted as XLA's GPU fusion would leave them, estimated from
//! producer–consumer pairs (`fused_bytes_accessed`): the result of a
//! loop-fusible op (elementwise, convert, slice, concatenate, pad,
//! transpose) whose users all fuse it (loop-fusible ops and reductions,
//! looking through reshapes and broadcasts) stays in registers: it is not
//! written, and its consumers do not read it; a broadcast operand costs its
//! source. Dots, collectives, custom calls and the other kernels read and
//! write every operand and result. Multi-output fusion and the kernel count
//! of the fusions are not modelled (loop fusions pay no launch).
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
//! run in parallel, capped by NVLink). Their latency splits the steps as
//! NCCL's tuning model does (`ncclTopoTuneModel`): of a ring's `2(n-1)`
//! all-reduce steps (`n-1` for the others) `2(nodes-1)` (`nodes-1`) cross
//! nodes at the inter-node step latency and the rest stay on NVLink; a tree
//! all-reduce chains the GPUs of each node (`per_node - 1` NVLink steps)
//! and spans the nodes in `log2(nodes)` inter-node steps, each way.
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
    AttrKey, HloComputation, HloInstruction, HloModule, InstrId, Opcode, PrimitiveType, Shape,
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

    /// Link figures of a group: (ring bus bandwidth bytes/µs, all-reduce
    /// tree bus bandwidth bytes/µs).
    fn bandwidths(&self, nodes: i64, per_node: i64) -> (f64, f64) {
        let s = &self.spec;
        if nodes <= 1 {
            (s.nvlink_busbw_gbps * 1e3, s.nvls_busbw_gbps * 1e3)
        } else {
            let bw = (s.nic_gbps * per_node as f64).min(s.nvlink_busbw_gbps) * 1e3;
            (bw, bw)
        }
    }

    /// Latency of `steps` ring steps of which `inter_steps` cross nodes (µs).
    fn steps_us(&self, steps: f64, inter_steps: f64) -> f64 {
        let inter = inter_steps.min(steps).max(0.0);
        (steps - inter) * self.spec.nvlink_alpha_us + inter * self.spec.inter_node_alpha_us
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
        let (nodes, per_node) = self.topology(info);
        let (ring_bw, tree_bw) = self.bandwidths(nodes, per_node);
        // Steps that cross nodes in a ring of `n` over `nodes` nodes.
        let crossings = (nodes - 1) as f64;
        let t = match info.kind {
            ResourceKind::AllReduce => {
                let factor = 2.0 * (n - 1.0) / n;
                let ring =
                    self.steps_us(2.0 * (n - 1.0), 2.0 * crossings) + bytes * factor / ring_bw;
                let tree_latency = if nodes <= 1 {
                    2.0 * n.log2().ceil().max(1.0) * s.nvlink_alpha_us
                } else {
                    2.0 * ((per_node - 1) as f64 * s.nvlink_alpha_us
                        + (nodes as f64).log2().ceil() * s.inter_node_alpha_us)
                };
                let tree = tree_latency + bytes * factor / tree_bw;
                match s.all_reduce_algorithm {
                    AllReduceAlgorithm::Ring => ring,
                    AllReduceAlgorithm::Tree => tree,
                    AllReduceAlgorithm::Auto => ring.min(tree),
                }
            }
            ResourceKind::AllGather
            | ResourceKind::ReduceScatter
            | ResourceKind::AllToAll
            | ResourceKind::RaggedAllToAll => {
                self.steps_us(n - 1.0, crossings) + bytes * (n - 1.0) / n / ring_bw
            }
            ResourceKind::CollectivePermute | ResourceKind::SendRecv => {
                self.steps_us(1.0, crossings) + bytes / ring_bw
            }
            ResourceKind::CollectiveBroadcast => {
                self.steps_us((per_node.max(1) as f64).log2().ceil(), 0.0)
                    + self.steps_us((nodes as f64).log2().ceil(), (nodes as f64).log2().ceil())
                    + bytes / ring_bw
            }
            ResourceKind::Copy | ResourceKind::AsyncCompute => 0.0,
        };
        s.collective_launch_us + t
    }

    /// Roofline time of instruction `id` of `comp` on the compute stream
    /// (µs), with memory traffic as XLA's fusion would leave it (see
    /// [`fused_bytes_accessed`]); `users` is `comp.users()`.
    pub fn roofline_us(
        &self,
        module: &HloModule,
        comp: &HloComputation,
        users: &[Vec<InstrId>],
        id: InstrId,
    ) -> f64 {
        let Some(instr) = comp.instructions.get(id.index()) else {
            return 0.0;
        };
        if is_nop(instr) {
            return 0.0;
        }
        let overhead = match profile(instr.opcode).stream {
            StreamUse::Free => return 0.0,
            StreamUse::Kernel => self.spec.kernel_overhead_us,
            // No launch is charged even for the root of a loop fusion: XLA
            // merges sibling roots into multi-output fusions, and the model
            // does not guess how many kernels remain.
            StreamUse::Fused => 0.0,
        };
        let flops = flops(module, comp, instr, 0);
        let bytes = fused_bytes_accessed(comp, users, id) as f64;
        let tensor = is_tensor_op(module, instr);
        let ty = dot_type(comp, instr);
        let peak = self.spec.peak_tflops(ty, tensor) * 1e6; // flop per µs
        let t = (flops / peak).max(bytes / self.spec.hbm_bytes_per_us());
        t + overhead
    }
}

impl CostModel for AnalyticalCostModel {
    fn name(&self) -> String {
        format!("analytical({})", self.spec.name)
    }
    fn compute_us(&self, op: Op<'_>) -> f64 {
        let t = match op.users {
            Some(users) => self.roofline_us(op.module, op.comp, users, op.id),
            None => self.roofline_us(op.module, op.comp, &op.comp.users(), op.id),
        };
        sane(t)
    }
    fn transfer_us(&self, op: Op<'_>, info: &CollectiveInfo) -> f64 {
        if info.kind == ResourceKind::AsyncCompute {
            // An async wrapped computation: the roofline of its root.
            if let Some(c) = op.instr().and_then(|i| i.computation_attr(AttrKey::Calls)) {
                if let Some(callee) = op.module.computations.get(c.index()) {
                    let users = callee.users();
                    let t: f64 = (0..callee.instructions.len())
                        .map(|i| self.roofline_us(op.module, callee, &users, InstrId(i as u32)))
                        .sum();
                    return sane(t);
                }
            }
            return 0.0;
        }
        sane(self.collective_us(info))
    }
}

/// How an instruction occupies the compute stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StreamUse {
    /// Not at all: control flow (its callees are costed on their own),
    /// collectives and async halves (their time is the transfer), reshapes,
    /// broadcasts and iotas (XLA fuses them into every consumer, which
    /// generates their elements instead of reading them).
    Free,
    /// A kernel of its own: the roofline plus the kernel overhead.
    Kernel,
    /// Work XLA would fuse into a neighbouring kernel: the roofline only.
    Fused,
}

/// The floating-point work [`flops`] counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Work {
    None,
    /// One operation per output element (elementwise ops).
    PerOutputElement,
    /// 2 x output elements x contracted size.
    Dot,
    /// 2 x output elements x kernel window x input features.
    Convolution,
    /// One operation per input element (at least one per output element).
    Reduce,
    /// Output elements x window size.
    ReduceWindow,
    /// The work of the fused computation.
    FusionBody,
}

/// The memory traffic [`bytes_accessed`] counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Traffic {
    /// The output written and every operand read.
    OutputAndOperands,
    /// The output read and written (slices, concatenations).
    OutputTwice,
    /// The update (operand 1) read and written in place.
    UpdateTwice,
    /// The gathered output twice and the indices.
    Gather,
    /// The updates twice and the indices.
    Scatter,
}

/// When an instruction runs at the tensor-core rate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TensorUse {
    Never,
    Always,
    /// Fusions whose body holds a dot or convolution.
    WhenFusingADot,
    /// Custom calls whose target names a GEMM or convolution.
    WhenAGemmTarget,
}

/// What XLA's GPU fusion does with an opcode, as the model estimates it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FusionRole {
    /// Loop fusion (elementwise ops, converts, slices, concatenations,
    /// pads, transposes): fused into its consumers when they all fuse, and
    /// reads the values of fused producers from registers.
    Loop,
    /// A reduction: reads fused producers from registers (input fusion),
    /// but writes its result to memory.
    Hero,
    /// Reshapes, bitcasts, broadcasts and iotas: generated inside whichever
    /// kernel reads them; looked through when deciding what fuses.
    Transparent,
    /// Reads and writes memory itself.
    Unfused,
}

/// The analytical model's view of one opcode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Profile {
    stream: StreamUse,
    work: Work,
    traffic: Traffic,
    tensor: TensorUse,
    fusion: FusionRole,
}

impl Profile {
    const fn new(stream: StreamUse, work: Work, traffic: Traffic, tensor: TensorUse) -> Profile {
        Profile {
            stream,
            work,
            traffic,
            tensor,
            fusion: FusionRole::Unfused,
        }
    }
    const fn fused_as(self, fusion: FusionRole) -> Profile {
        Profile { fusion, ..self }
    }
    /// Plain kernels and fused ops: no counted work, output and operands moved.
    const fn plain(stream: StreamUse) -> Profile {
        Profile::new(
            stream,
            Work::None,
            Traffic::OutputAndOperands,
            TensorUse::Never,
        )
    }
}

/// Every opcode's profile: the one place the model decides about an
/// opcode, listing each explicitly so that a new one must be placed.
fn profile(op: Opcode) -> Profile {
    use FusionRole::{Hero, Loop, Transparent};
    use Opcode as O;
    use StreamUse::{Free, Fused, Kernel};
    match op {
        // Control flow, collectives, async halves, reshapes.
        O::While
        | O::Call
        | O::Conditional
        | O::AsyncStart
        | O::AsyncUpdate
        | O::AsyncDone
        | O::AllReduceStart
        | O::AllReduceDone
        | O::AllGatherStart
        | O::AllGatherDone
        | O::CollectivePermuteStart
        | O::CollectivePermuteDone
        | O::CopyStart
        | O::CopyDone
        | O::Send
        | O::SendDone
        | O::Recv
        | O::RecvDone
        | O::AllReduce
        | O::AllGather
        | O::ReduceScatter
        | O::AllToAll
        | O::CollectivePermute
        | O::CollectiveBroadcast
        | O::RaggedAllToAll
        | O::CollectiveReduce => Profile::plain(Free),
        O::Reshape | O::Broadcast | O::Iota => Profile::plain(Free).fused_as(Transparent),
        O::Bitcast => Profile::plain(Fused).fused_as(Transparent),

        // Kernels.
        O::Dot | O::RaggedDot | O::ScaledDot => Profile::new(
            Kernel,
            Work::Dot,
            Traffic::OutputAndOperands,
            TensorUse::Always,
        ),
        O::Convolution => Profile::new(
            Kernel,
            Work::Convolution,
            Traffic::OutputAndOperands,
            TensorUse::Always,
        ),
        O::Fusion => Profile::new(
            Kernel,
            Work::FusionBody,
            Traffic::OutputAndOperands,
            TensorUse::WhenFusingADot,
        ),
        O::CustomCall => Profile::new(
            Kernel,
            Work::None,
            Traffic::OutputAndOperands,
            TensorUse::WhenAGemmTarget,
        ),
        O::Reduce => Profile::new(
            Kernel,
            Work::Reduce,
            Traffic::OutputAndOperands,
            TensorUse::Never,
        )
        .fused_as(Hero),
        O::ReduceWindow => Profile::new(
            Kernel,
            Work::ReduceWindow,
            Traffic::OutputAndOperands,
            TensorUse::Never,
        )
        .fused_as(Hero),
        O::Gather => Profile::new(Kernel, Work::None, Traffic::Gather, TensorUse::Never),
        O::Scatter => Profile::new(Kernel, Work::None, Traffic::Scatter, TensorUse::Never),
        O::SelectAndScatter
        | O::Sort
        | O::Fft
        | O::TriangularSolve
        | O::Cholesky
        | O::TopK
        | O::Scan
        | O::RngBitGenerator
        | O::Rng => Profile::plain(Kernel),

        // Elementwise ops: one operation per output element.
        O::Abs
        | O::Acos
        | O::Acosh
        | O::Asin
        | O::Asinh
        | O::Atan
        | O::Atanh
        | O::BitcastConvert
        | O::Cbrt
        | O::Ceil
        | O::Convert
        | O::Copy
        | O::Cos
        | O::Cosh
        | O::Clz
        | O::Erf
        | O::Exp
        | O::Expm1
        | O::Floor
        | O::Imag
        | O::IsFinite
        | O::Log
        | O::Log1p
        | O::Logistic
        | O::Negate
        | O::Not
        | O::PopulationCount
        | O::Real
        | O::ReducePrecision
        | O::RoundNearestAfz
        | O::RoundNearestEven
        | O::Rsqrt
        | O::Sign
        | O::Sin
        | O::Sinh
        | O::Sqrt
        | O::Tan
        | O::Tanh
        | O::Add
        | O::And
        | O::Atan2
        | O::Compare
        | O::Complex
        | O::Divide
        | O::Maximum
        | O::Minimum
        | O::Mulhi
        | O::Multiply
        | O::Or
        | O::Power
        | O::Remainder
        | O::ShiftLeft
        | O::ShiftRightArithmetic
        | O::ShiftRightLogical
        | O::StochasticConvert
        | O::Subtract
        | O::Xor
        | O::Clamp
        | O::Select => Profile::new(
            Fused,
            Work::PerOutputElement,
            Traffic::OutputAndOperands,
            TensorUse::Never,
        )
        .fused_as(Loop),

        // Data movement with its own traffic.
        O::Slice | O::DynamicSlice | O::Concatenate => {
            Profile::new(Fused, Work::None, Traffic::OutputTwice, TensorUse::Never).fused_as(Loop)
        }
        O::Pad | O::Reverse | O::Transpose => Profile::plain(Fused).fused_as(Loop),
        O::DynamicUpdateSlice => {
            Profile::new(Fused, Work::None, Traffic::UpdateTwice, TensorUse::Never)
        }

        // No counted work: output and operands moved.
        O::AddDependency
        | O::AfterAll
        | O::BatchNormGrad
        | O::BatchNormInference
        | O::BatchNormTraining
        | O::Constant
        | O::Domain
        | O::DynamicReshape
        | O::GetDimensionSize
        | O::GetTupleElement
        | O::Infeed
        | O::Map
        | O::OptimizationBarrier
        | O::Outfeed
        | O::Parameter
        | O::PartitionId
        | O::ReplicaId
        | O::RngGetAndUpdateState
        | O::SetDimensionSize
        | O::Shuffle
        | O::Tuple => Profile::plain(Fused),
    }
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
    match profile(instr.opcode).tensor {
        TensorUse::Always => true,
        TensorUse::WhenFusingADot => instr
            .computation_attr(AttrKey::Calls)
            .and_then(|c| module.computations.get(c.index()))
            .is_some_and(|c| {
                c.instructions
                    .iter()
                    .any(|i| matches!(i.opcode, Opcode::Dot | Opcode::Convolution))
            }),
        TensorUse::WhenAGemmTarget => instr
            .ident_attr(AttrKey::CustomCallTarget)
            .is_some_and(|t| t.contains("gemm") || t.contains("matmul") || t.contains("conv")),
        TensorUse::Never => false,
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
    match profile(instr.opcode).work {
        Work::Dot => {
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
        Work::Convolution => {
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
        Work::Reduce => instr
            .operands
            .iter()
            .filter_map(|o| comp.instructions.get(o.index()))
            .map(|o| elements(&o.shape))
            .sum::<f64>()
            .max(out),
        Work::ReduceWindow => {
            let window: f64 = instr
                .window()
                .map(|w| w.dims.iter().map(|d| d.size.max(1) as f64).product())
                .unwrap_or(1.0);
            out * window
        }
        Work::FusionBody if depth < 8 => instr
            .computation_attr(AttrKey::Calls)
            .and_then(|c| module.computations.get(c.index()))
            .map(|c| {
                c.instructions
                    .iter()
                    .map(|i| flops(module, c, i, depth + 1))
                    .sum()
            })
            .unwrap_or(0.0),
        Work::PerOutputElement => out,
        Work::FusionBody | Work::None => 0.0,
    }
}

/// Bytes read and written by one instruction.
pub fn bytes_accessed(comp: &HloComputation, instr: &HloInstruction) -> u64 {
    let out = instr.shape.byte_size();
    let op_bytes = |i: usize| operand(comp, instr, i).map_or(0, |o| o.shape.byte_size());
    let all_operands: u64 = (0..instr.operands.len()).map(op_bytes).sum();
    match profile(instr.opcode).traffic {
        Traffic::OutputTwice => 2 * out,
        Traffic::UpdateTwice => 2 * op_bytes(1),
        Traffic::Gather => 2 * out + op_bytes(1),
        Traffic::Scatter => {
            let n = instr.operands.len();
            let updates: u64 = (n / 2 + 1..n).map(op_bytes).sum();
            2 * updates + op_bytes(n / 2)
        }
        Traffic::OutputAndOperands => out + all_operands,
    }
}

/// Most instructions a fusion question looks at before answering "not
/// fused" (keeps pathological fan-outs linear).
const FUSION_WALK_LIMIT: usize = 64;

fn fusion_role(comp: &HloComputation, id: InstrId) -> FusionRole {
    comp.instructions
        .get(id.index())
        .map_or(FusionRole::Unfused, |i| profile(i.opcode).fusion)
}

/// Whether the result of `id` never reaches memory: it is a loop-fusible
/// op, not the root, and every user (looking through reshapes, bitcasts and
/// broadcasts) fuses it, so XLA computes it inside its consumers' kernels.
fn stays_in_registers(comp: &HloComputation, users: &[Vec<InstrId>], id: InstrId) -> bool {
    if fusion_role(comp, id) != FusionRole::Loop || comp.root == id {
        return false;
    }
    let mut pending: Vec<InstrId> = users.get(id.index()).cloned().unwrap_or_default();
    let mut seen = 0;
    while let Some(user) = pending.pop() {
        seen += 1;
        if seen > FUSION_WALK_LIMIT {
            return false;
        }
        match fusion_role(comp, user) {
            FusionRole::Loop | FusionRole::Hero => {}
            FusionRole::Transparent if comp.root != user => {
                pending.extend(users.get(user.index()).into_iter().flatten().copied());
            }
            FusionRole::Transparent | FusionRole::Unfused => return false,
        }
    }
    true
}

/// Bytes a fused consumer reads for its operand `id`: nothing for a value
/// in registers or an iota, a reshape's or broadcast's source (a broadcast
/// reads its smaller source once), else the whole value.
fn fused_read_bytes(comp: &HloComputation, users: &[Vec<InstrId>], id: InstrId) -> u64 {
    let mut at = id;
    for _ in 0..FUSION_WALK_LIMIT {
        let Some(instr) = comp.instructions.get(at.index()) else {
            return 0;
        };
        match profile(instr.opcode).fusion {
            FusionRole::Transparent => match instr.operands.first() {
                Some(&source) => at = source,
                None => return 0,
            },
            FusionRole::Loop if stays_in_registers(comp, users, at) => return 0,
            _ => return instr.shape.byte_size(),
        }
    }
    comp.instructions
        .get(id.index())
        .map_or(0, |i| i.shape.byte_size())
}

/// Bytes instruction `id` reads and writes once XLA's fusion has run, as
/// estimated from producer–consumer pairs: a loop-fusible result that
/// stays in registers is not written, and fused consumers (loop-fusible
/// ops and reductions) do not read it. Other instructions move what
/// [`bytes_accessed`] says.
pub fn fused_bytes_accessed(comp: &HloComputation, users: &[Vec<InstrId>], id: InstrId) -> u64 {
    let Some(instr) = comp.instructions.get(id.index()) else {
        return 0;
    };
    let profile = profile(instr.opcode);
    let reads_fused = matches!(profile.fusion, FusionRole::Loop | FusionRole::Hero);
    if !reads_fused {
        return bytes_accessed(comp, instr);
    }
    let write = if stays_in_registers(comp, users, id) {
        0
    } else {
        instr.shape.byte_size()
    };
    // A kernel reads an operand it names twice only once.
    let mut operands = instr.operands.clone();
    operands.sort_unstable();
    operands.dedup();
    let reads: u64 = operands
        .iter()
        .map(|&o| fused_read_bytes(comp, users, o))
        .sum();
    match profile.traffic {
        // A slice reads only what it keeps.
        Traffic::OutputTwice => write + reads.min(instr.shape.byte_size()),
        _ => write + reads,
    }
}
