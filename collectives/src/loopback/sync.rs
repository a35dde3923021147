//! Locking for the loopback backend's mutexes.
//!
//! Invariant: a lock poisoned by a rank thread that panicked is used as it
//! is, so the other ranks go on and report the failure as an error instead
//! of panicking in turn.

use std::sync::{Mutex, MutexGuard};

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
