//! The pass's options: which Sharding custom-calls to replace and whether
//! propagation may change the entry computation's output and parameter
//! shardings.
//!
//! Invariant: `Default` gives XLA's settings for SPMD partitioning.

/// Options of the pass. The defaults are XLA's for SPMD partitioning.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardingPropagationOptions {
    /// Replace `Sharding` custom-calls by copies (named `copy`, `copy.1`,
    /// ...) as XLA does; otherwise keep them.
    pub replace_sharding_custom_calls: bool,
    /// Per-output permission to change the entry root's sharding; `None`
    /// reads `allow_spmd_sharding_propagation_to_output` from the module.
    pub allow_propagation_to_output: Option<Vec<bool>>,
    /// Per-parameter permission to change entry parameter shardings; `None`
    /// reads `allow_spmd_sharding_propagation_to_parameters`.
    pub allow_propagation_to_parameters: Option<Vec<bool>>,
    /// On a module with Shardy annotations, run Shardy's propagation
    /// (`sdy-propagation`, as XLA's `shardy-xla`); otherwise import them and
    /// run GSPMD's.
    pub shardy_propagation: bool,
    /// XLA's `is_spmd`: propagate for the SPMD partitioner (the default).
    /// When false, as XLA's pass for per-device placement: partial
    /// shardings never merge, custom-calls and reverses take no tiled
    /// sharding, rng is not elementwise, an operand is tiled by a
    /// concatenate user on the devices its slice lands on, a broadcast
    /// user sharded on new dims, a reduce over sharded dims and gathers and
    /// scatters on their parallel or passthrough dims give nothing tiled.
    pub is_spmd: bool,
    /// Inline every `call` first (but shard_map bodies and calls marked
    /// `inlineable="false"` or sharded), as XLA's SPMD pipeline runs its
    /// `CallInliner` before propagation (the default); false propagates
    /// through calls, as XLA's `ShardingPropagation` pass alone does.
    pub inline_calls: bool,
    /// XLA's `execution_threads` argument: propagate only in computations
    /// of these threads (a computation without `execution_thread=` is on
    /// `main`); an async op running another thread takes a manual operand's
    /// sharding whole. `None`: every thread.
    pub execution_threads: Option<Vec<String>>,
}

impl Default for ShardingPropagationOptions {
    fn default() -> Self {
        ShardingPropagationOptions {
            replace_sharding_custom_calls: true,
            allow_propagation_to_output: None,
            allow_propagation_to_parameters: None,
            shardy_propagation: true,
            is_spmd: true,
            inline_calls: true,
            execution_threads: None,
        }
    }
}
