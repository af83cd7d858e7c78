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

use crate::fault_injecting_object_store::{
    FaultConfig, FaultInjectingObjectStore, FaultStats, FaultStatsSnapshot,
};
use crate::instrumented_object_store::{
    InstrumentedObjectStore, StoreMetrics, StoreMetricsSnapshot,
};
use crate::limited_object_store::{LimitStats, LimitStatsSnapshot, LimitedObjectStore};
use crate::retrying_object_store::{
    RetryPolicy, RetryStats, RetryStatsSnapshot, RetryingObjectStore,
};

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
}

impl Default for LayerConfig {
    fn default() -> LayerConfig {
        LayerConfig {
            retry: RetryPolicy::default(),
            max_in_flight_requests: DEFAULT_MAX_IN_FLIGHT_REQUESTS,
            faults: None,
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
