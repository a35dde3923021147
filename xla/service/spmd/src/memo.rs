//! `MemoTable`: the storage of the partitioner's memo tables (derived
//! grids, reshard plans, converted shardings).
//!
//! A lookup builds no key: it takes the key's hash and a predicate on the
//! stored keys, so a hit costs no allocation and no reference counting
//! (keys hold vectors and shared grids). Entries are bucketed by hash.
//!
//! Invariant: a caller hashes a key the same way for `get` and `insert`
//! (with [`hash_of`] over the same borrowed form), and its predicate holds
//! exactly for the stored keys equal to the one looked up.

use rustc_hash::{FxHashMap, FxHasher};
use std::cell::RefCell;
use std::hash::{Hash, Hasher};

/// The hash a memo table files a key under.
pub fn hash_of(key: impl Hash) -> u64 {
    let mut h = FxHasher::default();
    key.hash(&mut h);
    h.finish()
}

/// Values by key, behind a `RefCell` so that tables can be shared by
/// reference while computations that fill them recurse into them (no
/// borrow is held while a value is computed).
pub struct MemoTable<K, V> {
    buckets: RefCell<FxHashMap<u64, Vec<(K, V)>>>,
}

impl<K, V> Default for MemoTable<K, V> {
    fn default() -> Self {
        MemoTable {
            buckets: RefCell::new(FxHashMap::default()),
        }
    }
}

impl<K, V: Clone> MemoTable<K, V> {
    /// The value stored under `hash` whose key satisfies `matches`.
    pub fn get(&self, hash: u64, matches: impl Fn(&K) -> bool) -> Option<V> {
        self.buckets
            .borrow()
            .get(&hash)?
            .iter()
            .find(|e| matches(&e.0))
            .map(|e| e.1.clone())
    }

    /// Stores `value` under `key` (whose hash is `hash`).
    pub fn insert(&self, hash: u64, key: K, value: V) {
        self.buckets
            .borrow_mut()
            .entry(hash)
            .or_default()
            .push((key, value));
    }

    /// The value of `key` (hash `hash`, found by `matches`), computed by
    /// `compute` and stored when absent; `make_key` builds the stored key.
    pub fn get_or_insert_with(
        &self,
        hash: u64,
        matches: impl Fn(&K) -> bool,
        make_key: impl FnOnce() -> K,
        compute: impl FnOnce() -> V,
    ) -> V {
        if let Some(v) = self.get(hash, matches) {
            return v;
        }
        let v = compute();
        self.insert(hash, make_key(), v.clone());
        v
    }
}
