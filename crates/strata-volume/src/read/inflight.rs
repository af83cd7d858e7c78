//! Fetches in flight: one fetch per key, everyone else waits for it.
//!
//! This module owns the table of keys (segment chunks, segment indexes)
//! whose fetch from the store has started and not yet finished. A fetcher
//! `claim`s keys and gets a [`Claim`]; while it holds it, a reader needing
//! one of those keys gets a [`Waiter`] for the claim's value instead of
//! fetching it again.
//!
//! Nothing can be left behind: a claim's `Drop` removes its keys from the
//! table whatever happened (value delivered, fetch failed, or the fetching
//! future dropped because its client went away). Waiters of a claim that
//! ends without a value get `None` and fetch for themselves, so no waiter
//! hangs and no error of another request is handed to them.

use std::collections::HashMap;

use super::key_hasher::KeyHasherBuilder;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};
use tokio::sync::watch;

struct Entry<V> {
    claim_id: u64,
    rx: watch::Receiver<Option<V>>,
}

pub struct Flights<K, V> {
    table: Mutex<HashMap<K, Entry<V>, KeyHasherBuilder>>,
    next_claim_id: AtomicU64,
}

impl<K: Hash + Eq + Clone, V: Clone> Flights<K, V> {
    pub fn new() -> Self {
        Flights {
            table: Mutex::new(HashMap::default()),
            next_claim_id: AtomicU64::new(1),
        }
    }

    /// The table, locked: look keys up and claim them in one critical
    /// section. Claims must not be dropped while it is held.
    pub fn lock(self: &Arc<Self>) -> Table<'_, K, V> {
        Table {
            flights: self,
            map: self.table.lock(),
        }
    }

    /// Keys in flight now (a gauge: 0 whenever nothing is being fetched).
    pub fn len(&self) -> usize {
        self.table.lock().len()
    }
}

pub struct Table<'a, K, V> {
    flights: &'a Arc<Flights<K, V>>,
    map: MutexGuard<'a, HashMap<K, Entry<V>, KeyHasherBuilder>>,
}

impl<K: Hash + Eq + Clone, V: Clone> Table<'_, K, V> {
    /// A waiter for `key` if someone is fetching it.
    pub fn waiter(&self, key: &K) -> Option<Waiter<V>> {
        self.map.get(key).map(|e| Waiter(e.rx.clone()))
    }

    /// Claims `keys` (replacing any earlier claim of them: its waiters
    /// keep waiting for it, new ones wait for this one).
    pub fn claim(&mut self, keys: Vec<K>) -> Claim<K, V> {
        let claim_id = self.flights.next_claim_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = watch::channel(None);
        for k in &keys {
            let entry = Entry {
                claim_id,
                rx: rx.clone(),
            };
            self.map.insert(k.clone(), entry);
        }
        Claim {
            flights: self.flights.clone(),
            claim_id,
            keys,
            tx,
        }
    }
}

/// The right and duty to fetch some keys; see the module doc.
pub struct Claim<K: Hash + Eq + Clone, V: Clone> {
    flights: Arc<Flights<K, V>>,
    claim_id: u64,
    keys: Vec<K>,
    tx: watch::Sender<Option<V>>,
}

impl<K: Hash + Eq + Clone, V: Clone> Claim<K, V> {
    /// Hands `value` to every waiter (present and future, until dropped).
    pub fn complete(&self, value: V) {
        self.tx.send_replace(Some(value));
    }
}

impl<K: Hash + Eq + Clone, V: Clone> Drop for Claim<K, V> {
    fn drop(&mut self) {
        let mut map = self.flights.table.lock();
        for k in &self.keys {
            if map.get(k).is_some_and(|e| e.claim_id == self.claim_id) {
                map.remove(k);
            }
        }
    }
}

pub struct Waiter<V>(watch::Receiver<Option<V>>);

impl<V: Clone> Waiter<V> {
    /// The claim's value, or `None` if it ended without one.
    pub async fn value(mut self) -> Option<V> {
        match self.0.wait_for(Option::is_some).await {
            Ok(v) => v.clone(),
            Err(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[tokio::test]
    async fn waiters_get_the_value_or_none_and_nothing_leaks() {
        let f: Arc<Flights<u64, u64>> = Arc::new(Flights::new());
        let claim = f.lock().claim(vec![1, 2]);
        let w = f.lock().waiter(&2).unwrap();
        assert!(f.lock().waiter(&3).is_none());
        claim.complete(42);
        drop(claim);
        assert_eq!(w.value().await, Some(42));
        assert_eq!(f.len(), 0);

        // A claim dropped without a value (failed or cancelled fetch).
        let claim = f.lock().claim(vec![5]);
        let w = f.lock().waiter(&5).unwrap();
        let task = tokio::spawn(w.value());
        tokio::task::yield_now().await;
        drop(claim);
        assert_eq!(task.await.unwrap(), None);
        assert_eq!(f.len(), 0);

        // A newer claim of a key is not removed by the older one's drop.
        let old = f.lock().claim(vec![7]);
        let new = f.lock().claim(vec![7]);
        drop(old);
        assert_eq!(f.len(), 1);
        drop(new);
        assert_eq!(f.len(), 0);
    }
}
