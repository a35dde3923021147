//! Ops that apply a called computation: reduce (multi-output), reduce-window,
//! select-and-scatter, sort (multi-operand, stable), scatter and map; and
//! topk, which sorts without one.
//!
//! Invariants: when the called computation is a single binary op of its two
//! parameters (add, multiply, maximum, minimum, and, or, xor) the op runs a
//! typed, vectorisable kernel; otherwise it calls the computation through the
//! interpreter per element, which is exact for any computation. Reductions
//! visit elements in row-major order in the generic path; the fast path may
//! reassociate (XLA's CPU backend does too). Sorting uses an own stable merge
//! sort that tolerates inconsistent comparators without panicking.
//!
//! One submodule per family, all built on `combiner` (recognising a called
//! computation as one binary op or compare, the typed fast-path dispatch,
//! and the scalar plumbing of the generic path), none using another:
//! `reduction` (reduce), `window` (reduce-window, select-and-scatter),
//! `sort` (sort, topk), `scatter`, `map`.

mod combiner;
mod map;
mod reduction;
mod scatter;
mod sort;
mod window;

pub(crate) use combiner::compare_of_params;
pub use combiner::{binary_reducer, Elem};
pub use map::map;
pub use reduction::reduce;
pub use scatter::scatter;
pub use sort::{sort, topk};
pub use window::{reduce_window, select_and_scatter};
