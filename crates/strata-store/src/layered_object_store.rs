//! Stacking the store wrappers in their standard order.
//!
//! This module owns that order, [`layer`], its configuration
//! [`LayerConfig`] and its result [`Layered`] (the stacked store and the
//! handles on every layer's counters). Outermost first:
//!
//! ```text
//! RetryingObjectStore        what the engine calls
//!   InstrumentedObjectStore  sees every attempt
//!     LimitedObjectStore     bounds attempts in flight
//!       FaultInjectingObjectStore  (tests only) fails like the server would
//!         inner store
//! ```
//!
//! Why this order:
//! * Retry is outermost, so a retried call is several requests below it:
//!   metrics count every attempt (their error counts show the failures that
//!   retries hid), and backoff sleeps happen without holding a request
//!   permit, so a struggling store does not starve other callers of slots.
//! * Metrics sit above the limit so their latency includes waiting for a
//!   permit, i.e. what a caller experiences per attempt; the limiter's own
//!   wait counter tells how much of it was queueing.
//! * Faults sit right above the inner store, inside the limit, so injected
//!   failures and latency look exactly like a slow or failing server to every
//!   layer above (counted, limited, retried, and hidden from the caller when
//!   a retry succeeds).

use std::sync::Arc;

use object_store::ObjectStore;
use serde::Serialize;

use crate::fault_config::FaultConfig;
use crate::fault_injecting_object_store::{
    FaultInjectingObjectStore, FaultStats, FaultStatsSnapshot,
};
use crate::instrumented_object_store::InstrumentedObjectStore;
use crate::limited_object_store::{LimitStats, LimitStatsSnapshot, LimitedObjectStore};
use crate::retry_policy::RetryPolicy;
use crate::retrying_object_store::{RetryStats, RetryStatsSnapshot, RetryingObjectStore};
use crate::store_metrics::{StoreMetrics, StoreMetricsSnapshot};

/// Default bound on requests in flight to one store.
pub const DEFAULT_MAX_IN_FLIGHT_REQUESTS: usize = 64;

/// How to wrap a store.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerConfig {
    pub retry: RetryPolicy,
    /// At most this many requests run in the inner store at once.
    pub max_in_flight_requests: usize,
    /// Faults to inject (tests); `None` leaves the fault layer out.
    pub faults: Option<FaultConfig>,
    /// The embedded store only: bytes of deleted segment files kept to be
    /// overwritten by new ones (`recycled_files.rs`); 0 turns it off.
    pub recycle_bytes: u64,
    /// The embedded store only: objects smaller than this are not
    /// recycled (tests lower it).
    pub recycle_min_bytes: u64,
}

impl Default for LayerConfig {
    fn default() -> LayerConfig {
        LayerConfig {
            retry: RetryPolicy::default(),
            max_in_flight_requests: DEFAULT_MAX_IN_FLIGHT_REQUESTS,
            faults: None,
            recycle_bytes: crate::recycled_files::DEFAULT_RECYCLE_BYTES,
            recycle_min_bytes: crate::recycled_files::MIN_RECYCLE_BYTES,
        }
    }
}

/// A wrapped store and the counters of its layers.
#[derive(Debug, Clone)]
pub struct Layered {
    pub store: Arc<dyn ObjectStore>,
    pub metrics: Arc<StoreMetrics>,
    pub retry_stats: Arc<RetryStats>,
    pub limit_stats: Arc<LimitStats>,
    /// Present when faults are injected.
    pub fault_stats: Option<Arc<FaultStats>>,
}

/// All layers' counters at one moment, for the stats file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LayeredSnapshot {
    pub requests: StoreMetricsSnapshot,
    pub retries: RetryStatsSnapshot,
    pub limit: LimitStatsSnapshot,
    pub faults: Option<FaultStatsSnapshot>,
}

impl Layered {
    pub fn snapshot(&self) -> LayeredSnapshot {
        LayeredSnapshot {
            requests: self.metrics.snapshot(),
            retries: self.retry_stats.snapshot(),
            limit: self.limit_stats.snapshot(),
            faults: self.fault_stats.as_ref().map(|stats| stats.snapshot()),
        }
    }
}

/// Wraps `inner` in the standard order (see the module doc).
pub fn layer(inner: Arc<dyn ObjectStore>, cfg: &LayerConfig) -> Layered {
    let (base, fault_stats): (Arc<dyn ObjectStore>, _) = match &cfg.faults {
        Some(faults) => {
            let faulty = FaultInjectingObjectStore::new(inner, faults.clone());
            let stats = Arc::clone(faulty.stats());
            (Arc::new(faulty), Some(stats))
        }
        None => (inner, None),
    };
    let limited = LimitedObjectStore::new(base, cfg.max_in_flight_requests);
    let limit_stats = Arc::clone(limited.stats());
    let metrics = Arc::new(StoreMetrics::new());
    let instrumented = InstrumentedObjectStore::new(limited, Arc::clone(&metrics));
    let retrying = RetryingObjectStore::new(instrumented, cfg.retry.clone());
    let retry_stats = Arc::clone(retrying.stats());
    Layered {
        store: Arc::new(retrying),
        metrics,
        retry_stats,
        limit_stats,
        fault_stats,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use object_store::memory::InMemory;
    use object_store::path::Path;

    fn config(faults: &str) -> LayerConfig {
        LayerConfig {
            max_in_flight_requests: 4,
            faults: Some(FaultConfig::parse(faults).unwrap()),
            ..LayerConfig::default()
        }
    }

    /// Paused time: the real backoff sleeps (up to seconds) pass at once.
    #[tokio::test(start_paused = true)]
    async fn faults_are_counted_below_and_hidden_above() {
        let layered = layer(Arc::new(InMemory::new()), &config("error_rate=0.3,seed=11"));
        let store = &layered.store;
        for i in 0..100 {
            let path = Path::from(format!("vol/o{i}"));
            let body = Bytes::from(format!("body {i}"));
            store.put(&path, body.clone().into()).await.unwrap();
            assert_eq!(store.get(&path).await.unwrap().bytes().await.unwrap(), body);
        }
        let s = layered.snapshot();
        let faults = s.faults.unwrap();
        assert!(s.retries.retries > 0);
        assert_eq!(s.retries.gave_up, 0);
        assert_eq!(s.retries.retries, faults.injected_errors);
        // Metrics see every attempt, failures included.
        assert_eq!(
            s.requests.put.requests + s.requests.get.requests,
            faults.calls
        );
        assert_eq!(s.requests.total_errors(), faults.injected_errors);
        assert_eq!(
            s.requests.put.bytes_written,
            (0..100)
                .map(|i| format!("body {i}").len() as u64)
                .sum::<u64>()
        );
        assert_eq!(s.limit.requests, faults.calls);
        let json = serde_json::to_string(&s).unwrap();
        assert!(json.contains("\"injected_errors\""), "{json}");
    }

    #[tokio::test(start_paused = true)]
    async fn exhausted_retries_surface_the_injected_error() {
        let layered = layer(Arc::new(InMemory::new()), &config("error_rate=1"));
        let error = layered.store.head(&Path::from("a")).await.unwrap_err();
        assert!(error.to_string().contains("injected fault"), "{error}");
        let s = layered.snapshot();
        assert_eq!(s.requests.head.requests, 8);
        assert_eq!(s.retries.gave_up, 1);
    }

    #[tokio::test]
    async fn without_faults_there_is_no_fault_layer() {
        let layered = layer(Arc::new(InMemory::new()), &LayerConfig::default());
        assert!(layered.fault_stats.is_none());
        let error = layered.store.head(&Path::from("a")).await.unwrap_err();
        assert!(
            matches!(error, object_store::Error::NotFound { .. }),
            "{error}"
        );
        let s = layered.snapshot();
        assert_eq!(s.faults, None);
        assert_eq!((s.requests.head.requests, s.retries.retries), (1, 0));
        let description = layered.store.to_string();
        assert!(
            description
                .starts_with("RetryingObjectStore(InstrumentedObjectStore(LimitedObjectStore(64, "),
            "{description}"
        );
    }
}
