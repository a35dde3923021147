//! Aggressiveness levels (XLA's `aggressiveness`): the driver runs the
//! rules to a fix point at each level in turn, and each level lets more
//! rules act, so that the most direct evidence (pass-through ops) settles
//! first and broadcasts, which invent the most, act last.
//!
//! Invariant: levels only grow within a run; a rule enabled at a level is
//! enabled at every higher one.

/// Only pass-through ops propagate (elementwise ops, copies, reshapes,
/// transposes, tuples, GTEs, whiles, calls, dynamic slices, concatenates,
/// `Sharding` custom-calls), and partial shardings are not merged.
pub(crate) const PASS_THROUGH_LEVEL: i64 = 0;

/// Every op propagates, and compatible partial shardings are merged.
pub(crate) const ALL_OPS_LEVEL: i64 = 1;

/// Broadcasts also take shardings from their users.
pub(crate) const BROADCAST_FROM_USERS_LEVEL: i64 = 2;

/// Broadcasts also pass their operand's sharding on to their result; the
/// last level.
pub(crate) const BROADCAST_FORWARD_LEVEL: i64 = 3;

/// Above every level: the dot look-ahead asks users with all rules enabled.
pub(crate) const MAX_LEVEL: i64 = i64::MAX;

/// Whether compatible partial shardings may be merged at `level` (XLA's
/// `may_combine_partial_sharding`).
pub(crate) fn may_combine_partial(level: i64) -> bool {
    level > PASS_THROUGH_LEVEL
}
