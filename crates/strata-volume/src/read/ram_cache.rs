//! A fixed-budget RAM cache (CLOCK eviction) with hit and miss counters.
//!
//! It owns cached copies of verified segment chunks and decoded segment
//! indexes. Its budget is in bytes and never grows with the volume; its
//! counters are exported so a cache that never hits shows (one seed's cache
//! was silently disabled by a config bug for months).

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use super::key_hasher::KeyHasherBuilder;
use serde::Serialize;

struct Slot<K, V> {
    key: K,
    value: V,
    cost_bytes: u64,
    referenced: bool,
}

/// Entries stay in their slot until evicted, and the hand moves past a
/// victim, so a new entry (put in a freed slot) gets a full sweep of the
/// hand before it can be evicted. (Compacting the slots with `swap_remove`
/// put the newest entry under the hand, so it was evicted by the next
/// insertion: a scan larger than the cache then kept the old entries and
/// dropped every new one.)
struct Inner<K, V> {
    map: HashMap<K, usize, KeyHasherBuilder>,
    slots: Vec<Option<Slot<K, V>>>,
    free: Vec<usize>,
    hand: usize,
    used_bytes: u64,
}

/// Counters of one cache tier. A tier whose budget is 0 is disabled, and
/// shows it: `budget_bytes: 0`, every lookup a miss.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct CacheStats {
    pub hits: u64,
    pub misses: u64,
    pub insertions: u64,
    pub evictions: u64,
    pub used_bytes: u64,
    pub budget_bytes: u64,
}

pub struct ClockCache<K, V> {
    inner: Mutex<Inner<K, V>>,
    budget_bytes: u64,
    hits: AtomicU64,
    misses: AtomicU64,
    insertions: AtomicU64,
    evictions: AtomicU64,
}

impl<K: Hash + Eq + Clone, V: Clone> ClockCache<K, V> {
    pub fn new(budget_bytes: u64) -> Self {
        ClockCache {
            inner: Mutex::new(Inner {
                map: HashMap::default(),
                slots: Vec::new(),
                free: Vec::new(),
                hand: 0,
                used_bytes: 0,
            }),
            budget_bytes,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            insertions: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
        }
    }

    pub fn get(&self, key: &K) -> Option<V> {
        let mut inner = self.inner.lock();
        let found = match inner.map.get(key).copied() {
            Some(i) => inner.slots[i].as_mut().map(|slot| {
                slot.referenced = true;
                slot.value.clone()
            }),
            None => None,
        };
        drop(inner);
        let counter = if found.is_some() {
            &self.hits
        } else {
            &self.misses
        };
        counter.fetch_add(1, Ordering::Relaxed);
        found
    }

    /// Whether `key` is cached, without counting a hit or miss or marking
    /// the entry referenced (read-ahead asks this; it is not a use).
    pub fn contains(&self, key: &K) -> bool {
        self.inner.lock().map.contains_key(key)
    }

    /// Inserts `value`, evicting as needed; values costing more than the
    /// whole budget are not cached.
    pub fn insert(&self, key: K, value: V, cost_bytes: u64) {
        if cost_bytes > self.budget_bytes {
            return;
        }
        let mut inner = self.inner.lock();
        if inner.map.contains_key(&key) {
            return;
        }
        while inner.used_bytes + cost_bytes > self.budget_bytes && !inner.map.is_empty() {
            self.evict_one(&mut inner);
        }
        inner.used_bytes += cost_bytes;
        assert!(inner.used_bytes <= self.budget_bytes, "cache over budget");
        let slot = Some(Slot {
            key: key.clone(),
            value,
            cost_bytes,
            referenced: false,
        });
        let idx = match inner.free.pop() {
            Some(i) => {
                assert!(inner.slots[i].is_none(), "free slot in use");
                inner.slots[i] = slot;
                i
            }
            None => {
                inner.slots.push(slot);
                inner.slots.len() - 1
            }
        };
        inner.map.insert(key, idx);
        self.insertions.fetch_add(1, Ordering::Relaxed);
    }

    /// Drops `key`'s entry, if any (not counted as an eviction).
    pub fn remove(&self, key: &K) {
        let mut inner = self.inner.lock();
        let Some(i) = inner.map.remove(key) else {
            return;
        };
        if let Some(slot) = inner.slots[i].take() {
            inner.used_bytes -= slot.cost_bytes;
            inner.free.push(i);
        }
    }

    /// Evicts the first unreferenced entry from the hand on, clearing
    /// referenced bits on the way (two sweeps find one; the caller checked
    /// that the cache is not empty).
    fn evict_one(&self, inner: &mut Inner<K, V>) {
        for _ in 0..2 * inner.slots.len() + 1 {
            if inner.hand >= inner.slots.len() {
                inner.hand = 0;
            }
            let h = inner.hand;
            inner.hand += 1;
            let Some(slot) = inner.slots[h].as_mut() else {
                continue;
            };
            if slot.referenced {
                slot.referenced = false;
                continue;
            }
            if let Some(victim) = inner.slots[h].take() {
                inner.map.remove(&victim.key);
                inner.free.push(h);
                inner.used_bytes -= victim.cost_bytes;
                self.evictions.fetch_add(1, Ordering::Relaxed);
            }
            return;
        }
        unreachable!("evict_one on an empty cache");
    }

    pub fn stats(&self) -> CacheStats {
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            insertions: self.insertions.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
            used_bytes: self.inner.lock().used_bytes,
            budget_bytes: self.budget_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stays_within_budget_and_keeps_hot_entries() {
        let c: ClockCache<u64, u64> = ClockCache::new(10 * 4096);
        for k in 0..10 {
            c.insert(k, k, 4096);
        }
        assert_eq!(c.get(&3), Some(3));
        for k in 10..25 {
            c.insert(k, k, 4096);
            assert_eq!(c.get(&3), Some(3), "hot entry evicted at {k}");
            assert!(c.stats().used_bytes <= 10 * 4096);
        }
        assert_eq!(c.get(&0), None);
        let s = c.stats();
        assert!(s.hits >= 16 && s.misses == 1 && s.evictions == 15, "{s:?}");
        c.insert(99, 99, 11 * 4096);
        assert_eq!(c.get(&99), None, "oversized values are not cached");
    }

    #[test]
    fn a_scan_larger_than_the_cache_keeps_its_newest_entries() {
        let c: ClockCache<u64, u64> = ClockCache::new(10 * 4096);
        for k in 0..100 {
            c.insert(k, k, 4096);
        }
        // Untouched entries age out in insertion order: the last 10 stay.
        for k in 90..100 {
            assert_eq!(c.get(&k), Some(k), "entry {k}");
        }
        assert_eq!(c.stats().evictions, 90);
        // Mixed costs: evicting several small entries makes room for a big one.
        c.insert(1000, 1000, 3 * 4096);
        assert!(c.stats().used_bytes <= 10 * 4096);
        assert_eq!(c.get(&1000), Some(1000));
    }
}
