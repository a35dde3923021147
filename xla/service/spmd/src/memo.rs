//! `MemoTable`: the storage of the partitioner's memo tables (derived
//! grids, reshard plans, converted shardings).
//!
//! A lookup builds no key: it takes the key's hash and a predicate on the
//! stored keys, so a hit costs no allocation and no reference counting
//! (keys hold vectors and shared grids). Entries are bucketed by hash; a
//! bucket holds its first entry inline.
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
    buckets: RefCell<FxHashMap<u64, Bucket<K, V>>>,
}

/// The entries of one hash: almost always one.
enum Bucket<K, V> {
    One(K, V),
    Many(Vec<(K, V)>),
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
        match self.buckets.borrow().get(&hash)? {
            Bucket::One(k, v) => matches(k).then(|| v.clone()),
            Bucket::Many(entries) => entries.iter().find(|e| matches(&e.0)).map(|e| e.1.clone()),
        }
    }

    /// Stores `value` under `key` (whose hash is `hash`).
    pub fn insert(&self, hash: u64, key: K, value: V) {
        let mut buckets = self.buckets.borrow_mut();
        match buckets.remove(&hash) {
            None => {
                buckets.insert(hash, Bucket::One(key, value));
            }
            Some(Bucket::One(k, v)) => {
                buckets.insert(hash, Bucket::Many(vec![(k, v), (key, value)]));
            }
            Some(Bucket::Many(mut entries)) => {
                entries.push((key, value));
                buckets.insert(hash, Bucket::Many(entries));
            }
        }
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
