//! The closed set of HLO opcodes, generated from one table: enum variant, the
//! text name the parser and printer use, operand arity and category.
//!
//! Invariant: every opcode XLA's `HLO_OPCODE_LIST` defines (plus the newer
//! `atan`, `collective-reduce`, `shuffle`) appears exactly once here; every
//! other layer matches on `Opcode` exhaustively.

/// Number of operands an opcode takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arity {
    Fixed(usize),
    Variadic,
}

/// Broad families, used by shape inference, the interpreter and the partitioner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Category {
    ElementwiseUnary,
    ElementwiseBinary,
    ElementwiseTernary,
    Reduction,
    LinearAlgebra,
    DataMovement,
    Tuple,
    Value,
    ControlFlow,
    SideEffect,
    Collective,
    CollectiveStart,
    CollectiveDone,
    Async,
}

macro_rules! opcodes {
    ($( $variant:ident, $name:literal, $arity:expr, $cat:ident; )*) => {
        /// An HLO opcode.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Opcode { $($variant),* }

        impl Opcode {
            /// Every opcode, in table order.
            pub const ALL: &'static [Opcode] = &[$(Opcode::$variant),*];

            /// The HLO text spelling (`get-tuple-element`).
            pub fn name(self) -> &'static str {
                match self { $(Opcode::$variant => $name),* }
            }

            /// Looks up an opcode by its text spelling.
            pub fn from_name(name: &str) -> Option<Opcode> {
                match name { $($name => Some(Opcode::$variant),)* _ => None }
            }

            /// Operand count the opcode requires.
            pub fn arity(self) -> Arity {
                match self { $(Opcode::$variant => $arity),* }
            }

            pub fn category(self) -> Category {
                match self { $(Opcode::$variant => Category::$cat),* }
            }
        }
    };
}

use Arity::{Fixed, Variadic};

opcodes! {
    Abs, "abs", Fixed(1), ElementwiseUnary;
    Acos, "acos", Fixed(1), ElementwiseUnary;
    Acosh, "acosh", Fixed(1), ElementwiseUnary;
    Add, "add", Fixed(2), ElementwiseBinary;
    AddDependency, "add-dependency", Fixed(2), SideEffect;
    AfterAll, "after-all", Variadic, SideEffect;
    AllGather, "all-gather", Variadic, Collective;
    AllGatherDone, "all-gather-done", Fixed(1), CollectiveDone;
    AllGatherStart, "all-gather-start", Variadic, CollectiveStart;
    AllReduce, "all-reduce", Variadic, Collective;
    AllReduceDone, "all-reduce-done", Fixed(1), CollectiveDone;
    AllReduceStart, "all-reduce-start", Variadic, CollectiveStart;
    AllToAll, "all-to-all", Variadic, Collective;
    And, "and", Fixed(2), ElementwiseBinary;
    Asin, "asin", Fixed(1), ElementwiseUnary;
    Asinh, "asinh", Fixed(1), ElementwiseUnary;
    AsyncDone, "async-done", Fixed(1), Async;
    AsyncStart, "async-start", Variadic, Async;
    AsyncUpdate, "async-update", Variadic, Async;
    Atan, "atan", Fixed(1), ElementwiseUnary;
    Atan2, "atan2", Fixed(2), ElementwiseBinary;
    Atanh, "atanh", Fixed(1), ElementwiseUnary;
    BatchNormGrad, "batch-norm-grad", Fixed(5), LinearAlgebra;
    BatchNormInference, "batch-norm-inference", Fixed(5), LinearAlgebra;
    BatchNormTraining, "batch-norm-training", Fixed(3), LinearAlgebra;
    Bitcast, "bitcast", Fixed(1), DataMovement;
    BitcastConvert, "bitcast-convert", Fixed(1), ElementwiseUnary;
    Broadcast, "broadcast", Fixed(1), DataMovement;
    Call, "call", Variadic, ControlFlow;
    Cbrt, "cbrt", Fixed(1), ElementwiseUnary;
    Ceil, "ceil", Fixed(1), ElementwiseUnary;
    Cholesky, "cholesky", Fixed(1), LinearAlgebra;
    Clamp, "clamp", Fixed(3), ElementwiseTernary;
    CollectiveBroadcast, "collective-broadcast", Variadic, Collective;
    CollectivePermute, "collective-permute", Variadic, Collective;
    CollectivePermuteDone, "collective-permute-done", Fixed(1), CollectiveDone;
    CollectivePermuteStart, "collective-permute-start", Variadic, CollectiveStart;
    CollectiveReduce, "collective-reduce", Variadic, Collective;
    Compare, "compare", Fixed(2), ElementwiseBinary;
    Complex, "complex", Fixed(2), ElementwiseBinary;
    Concatenate, "concatenate", Variadic, DataMovement;
    Conditional, "conditional", Variadic, ControlFlow;
    Constant, "constant", Fixed(0), Value;
    Convert, "convert", Fixed(1), ElementwiseUnary;
    Convolution, "convolution", Variadic, LinearAlgebra;
    Copy, "copy", Fixed(1), ElementwiseUnary;
    CopyDone, "copy-done", Fixed(1), Async;
    CopyStart, "copy-start", Fixed(1), Async;
    Cos, "cosine", Fixed(1), ElementwiseUnary;
    Cosh, "cosh", Fixed(1), ElementwiseUnary;
    Clz, "count-leading-zeros", Fixed(1), ElementwiseUnary;
    CustomCall, "custom-call", Variadic, SideEffect;
    Divide, "divide", Fixed(2), ElementwiseBinary;
    Domain, "domain", Fixed(1), DataMovement;
    Dot, "dot", Fixed(2), LinearAlgebra;
    DynamicReshape, "dynamic-reshape", Variadic, DataMovement;
    DynamicSlice, "dynamic-slice", Variadic, DataMovement;
    DynamicUpdateSlice, "dynamic-update-slice", Variadic, DataMovement;
    Erf, "erf", Fixed(1), ElementwiseUnary;
    Exp, "exponential", Fixed(1), ElementwiseUnary;
    Expm1, "exponential-minus-one", Fixed(1), ElementwiseUnary;
    Fft, "fft", Fixed(1), LinearAlgebra;
    Floor, "floor", Fixed(1), ElementwiseUnary;
    Fusion, "fusion", Variadic, ControlFlow;
    Gather, "gather", Fixed(2), DataMovement;
    GetDimensionSize, "get-dimension-size", Fixed(1), DataMovement;
    GetTupleElement, "get-tuple-element", Fixed(1), Tuple;
    Imag, "imag", Fixed(1), ElementwiseUnary;
    Infeed, "infeed", Fixed(1), SideEffect;
    Iota, "iota", Fixed(0), Value;
    IsFinite, "is-finite", Fixed(1), ElementwiseUnary;
    Log, "log", Fixed(1), ElementwiseUnary;
    Log1p, "log-plus-one", Fixed(1), ElementwiseUnary;
    Logistic, "logistic", Fixed(1), ElementwiseUnary;
    Map, "map", Variadic, Reduction;
    Maximum, "maximum", Fixed(2), ElementwiseBinary;
    Minimum, "minimum", Fixed(2), ElementwiseBinary;
    Mulhi, "mulhi", Fixed(2), ElementwiseBinary;
    Multiply, "multiply", Fixed(2), ElementwiseBinary;
    Negate, "negate", Fixed(1), ElementwiseUnary;
    Not, "not", Fixed(1), ElementwiseUnary;
    OptimizationBarrier, "opt-barrier", Fixed(1), SideEffect;
    Or, "or", Fixed(2), ElementwiseBinary;
    Outfeed, "outfeed", Fixed(2), SideEffect;
    Pad, "pad", Fixed(2), DataMovement;
    Parameter, "parameter", Fixed(0), Value;
    PartitionId, "partition-id", Fixed(0), Value;
    PopulationCount, "popcnt", Fixed(1), ElementwiseUnary;
    Power, "power", Fixed(2), ElementwiseBinary;
    RaggedAllToAll, "ragged-all-to-all", Fixed(6), Collective;
    RaggedDot, "ragged-dot", Fixed(3), LinearAlgebra;
    Real, "real", Fixed(1), ElementwiseUnary;
    Recv, "recv", Fixed(1), SideEffect;
    RecvDone, "recv-done", Fixed(1), SideEffect;
    Reduce, "reduce", Variadic, Reduction;
    ReducePrecision, "reduce-precision", Fixed(1), ElementwiseUnary;
    ReduceScatter, "reduce-scatter", Variadic, Collective;
    ReduceWindow, "reduce-window", Variadic, Reduction;
    Remainder, "remainder", Fixed(2), ElementwiseBinary;
    ReplicaId, "replica-id", Fixed(0), Value;
    Reshape, "reshape", Fixed(1), DataMovement;
    Reverse, "reverse", Fixed(1), DataMovement;
    Rng, "rng", Variadic, SideEffect;
    RngBitGenerator, "rng-bit-generator", Fixed(1), SideEffect;
    RngGetAndUpdateState, "rng-get-and-update-state", Fixed(0), SideEffect;
    RoundNearestAfz, "round-nearest-afz", Fixed(1), ElementwiseUnary;
    RoundNearestEven, "round-nearest-even", Fixed(1), ElementwiseUnary;
    Rsqrt, "rsqrt", Fixed(1), ElementwiseUnary;
    Scan, "scan", Variadic, Reduction;
    ScaledDot, "scaled-dot", Fixed(4), LinearAlgebra;
    Scatter, "scatter", Variadic, DataMovement;
    Select, "select", Fixed(3), ElementwiseTernary;
    SelectAndScatter, "select-and-scatter", Fixed(3), Reduction;
    Send, "send", Fixed(2), SideEffect;
    SendDone, "send-done", Fixed(1), SideEffect;
    SetDimensionSize, "set-dimension-size", Fixed(2), DataMovement;
    ShiftLeft, "shift-left", Fixed(2), ElementwiseBinary;
    ShiftRightArithmetic, "shift-right-arithmetic", Fixed(2), ElementwiseBinary;
    ShiftRightLogical, "shift-right-logical", Fixed(2), ElementwiseBinary;
    Shuffle, "shuffle", Fixed(1), DataMovement;
    Sign, "sign", Fixed(1), ElementwiseUnary;
    Sin, "sine", Fixed(1), ElementwiseUnary;
    Sinh, "sinh", Fixed(1), ElementwiseUnary;
    Slice, "slice", Fixed(1), DataMovement;
    Sort, "sort", Variadic, Reduction;
    Sqrt, "sqrt", Fixed(1), ElementwiseUnary;
    StochasticConvert, "stochastic-convert", Fixed(2), ElementwiseBinary;
    Subtract, "subtract", Fixed(2), ElementwiseBinary;
    Tan, "tan", Fixed(1), ElementwiseUnary;
    Tanh, "tanh", Fixed(1), ElementwiseUnary;
    TopK, "topk", Fixed(1), Reduction;
    Transpose, "transpose", Fixed(1), DataMovement;
    TriangularSolve, "triangular-solve", Fixed(2), LinearAlgebra;
    Tuple, "tuple", Variadic, Tuple;
    While, "while", Fixed(1), ControlFlow;
    Xor, "xor", Fixed(2), ElementwiseBinary;
}

impl Opcode {
    /// True for ops that compute each output element from the same-index
    /// elements of their operands.
    pub fn is_elementwise(self) -> bool {
        matches!(
            self.category(),
            Category::ElementwiseUnary | Category::ElementwiseBinary | Category::ElementwiseTernary
        )
    }

    /// True for collective communication ops (sync forms and native async starts).
    pub fn is_collective(self) -> bool {
        matches!(
            self.category(),
            Category::Collective | Category::CollectiveStart
        )
    }

    /// For a native async start or done op, the synchronous collective it stands for.
    pub fn sync_collective(self) -> Option<Opcode> {
        match self {
            Opcode::AllGatherStart | Opcode::AllGatherDone => Some(Opcode::AllGather),
            Opcode::AllReduceStart | Opcode::AllReduceDone => Some(Opcode::AllReduce),
            Opcode::CollectivePermuteStart | Opcode::CollectivePermuteDone => {
                Some(Opcode::CollectivePermute)
            }
            _ => None,
        }
    }

    /// Opcodes with native `-start`/`-done` forms may not be written with the
    /// generic async sugar (`all-reduce-start` is its own opcode).
    pub fn has_native_async(self) -> bool {
        matches!(
            self,
            Opcode::AllGather
                | Opcode::AllReduce
                | Opcode::CollectivePermute
                | Opcode::Copy
                | Opcode::Recv
                | Opcode::Send
        )
    }
}

impl std::fmt::Display for Opcode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_round_trip() {
        let mut seen = std::collections::HashSet::new();
        for &op in Opcode::ALL {
            assert!(seen.insert(op.name()), "duplicate {}", op.name());
            assert_eq!(Opcode::from_name(op.name()), Some(op));
        }
        assert!(Opcode::ALL.len() >= 133);
    }
}
