//! The request metrics model of an object store.
//!
//! This module owns what is counted and how it is read back: the operation
//! kinds [`StoreOp`], the shared counters [`StoreMetrics`] (one set per
//! operation, each with its latency histogram), and the plain
//! [`StoreMetricsSnapshot`] read from them (serialisable, for the JSON stats
//! file, and displayable, for log lines). What is recorded when is the
//! business of the store wrapper that records into it,
//! `InstrumentedObjectStore`.
//!
//! Per operation kind it keeps requests, errors, bytes read, bytes written,
//! and latency in a fixed log2 histogram of microseconds: 40 counters
//! whatever the traffic, from which p50/p99 are estimated to within a factor
//! of two (each estimate is the top of its bucket, clamped to the largest
//! latency seen). The raw buckets and the latency sum are in the snapshot
//! too, for an exporter's histograms (not in the JSON).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;

/// The kinds of request metrics are kept for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreOp {
    Get,
    GetRange,
    Put,
    Delete,
    Head,
    List,
    Copy,
    Other,
}

impl StoreOp {
    pub const ALL: [StoreOp; 8] = [
        StoreOp::Get,
        StoreOp::GetRange,
        StoreOp::Put,
        StoreOp::Delete,
        StoreOp::Head,
        StoreOp::List,
        StoreOp::Copy,
        StoreOp::Other,
    ];

    pub fn name(self) -> &'static str {
        match self {
            StoreOp::Get => "get",
            StoreOp::GetRange => "get_range",
            StoreOp::Put => "put",
            StoreOp::Delete => "delete",
            StoreOp::Head => "head",
            StoreOp::List => "list",
            StoreOp::Copy => "copy",
            StoreOp::Other => "other",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Number of latency buckets. Bucket 0 holds 0 µs, bucket `i` holds
/// `[2^(i-1), 2^i)` µs; the last one also holds everything longer
/// (2^38 µs is over three days).
pub const LATENCY_BUCKETS: usize = 40;

/// A log2 histogram of latencies in microseconds.
#[derive(Debug)]
struct LatencyHistogram {
    counts: [AtomicU64; LATENCY_BUCKETS],
    max_us: AtomicU64,
    sum_us: AtomicU64,
}

impl Default for LatencyHistogram {
    fn default() -> LatencyHistogram {
        LatencyHistogram {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            max_us: AtomicU64::new(0),
            sum_us: AtomicU64::new(0),
        }
    }
}

impl LatencyHistogram {
    fn record_us(&self, latency_us: u64) {
        let bucket = (u64::BITS - latency_us.leading_zeros()) as usize;
        self.counts[bucket.min(LATENCY_BUCKETS - 1)].fetch_add(1, Ordering::Relaxed);
        self.max_us.fetch_max(latency_us, Ordering::Relaxed);
        self.sum_us.fetch_add(latency_us, Ordering::Relaxed);
    }

    fn buckets(&self) -> [u64; LATENCY_BUCKETS] {
        std::array::from_fn(|i| self.counts[i].load(Ordering::Relaxed))
    }

    fn max_us(&self) -> u64 {
        self.max_us.load(Ordering::Relaxed)
    }

    /// The latency `quantile` (in `[0, 1]`) of the samples fall under,
    /// rounded up to the top of its bucket; 0 without samples.
    fn quantile_us(&self, quantile: f64) -> u64 {
        let counts: Vec<u64> = self
            .counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return 0;
        }
        let rank = ((quantile * total as f64).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (bucket, count) in counts.iter().enumerate() {
            seen += count;
            if seen >= rank {
                return bucket_top_us(bucket).min(self.max_us());
            }
        }
        self.max_us()
    }
}

/// The largest latency bucket `bucket` holds.
fn bucket_top_us(bucket: usize) -> u64 {
    if bucket + 1 >= LATENCY_BUCKETS {
        return u64::MAX;
    }
    (1u64 << bucket) - 1
}

/// How a request ended, for counting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The store did what was asked.
    Done,
    /// The store answered that the object does not exist: an answer, not an
    /// error (strata asks on purpose, e.g. for a lease or a manifest that
    /// is not written yet).
    NotFound,
    /// The store refused a conditional request because the condition did
    /// not hold: an answer, not an error (leases and the store probe ask
    /// such questions on purpose).
    ConditionFailed,
    /// Anything else: the request failed.
    Failed,
}

/// The counters of one [`StoreOp`].
#[derive(Debug, Default)]
pub(crate) struct OpMetrics {
    requests: AtomicU64,
    errors: AtomicU64,
    not_found: AtomicU64,
    condition_failed: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    latency: LatencyHistogram,
}

impl OpMetrics {
    /// One finished request; `latency` is `None` when it is not known.
    pub(crate) fn record(&self, latency: Option<Duration>, outcome: Outcome) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        match outcome {
            Outcome::Done => {}
            Outcome::NotFound => {
                self.not_found.fetch_add(1, Ordering::Relaxed);
            }
            Outcome::ConditionFailed => {
                self.condition_failed.fetch_add(1, Ordering::Relaxed);
            }
            Outcome::Failed => self.add_error(),
        }
        if let Some(latency) = latency {
            let latency_us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
            self.latency.record_us(latency_us);
        }
    }

    pub(crate) fn add_error(&self) {
        self.errors.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn add_bytes_read(&self, size_bytes: u64) {
        self.bytes_read.fetch_add(size_bytes, Ordering::Relaxed);
    }

    pub(crate) fn add_bytes_written(&self, size_bytes: u64) {
        self.bytes_written.fetch_add(size_bytes, Ordering::Relaxed);
    }

    fn snapshot(&self) -> OpMetricsSnapshot {
        OpMetricsSnapshot {
            requests: self.requests.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            not_found: self.not_found.load(Ordering::Relaxed),
            condition_failed: self.condition_failed.load(Ordering::Relaxed),
            bytes_read: self.bytes_read.load(Ordering::Relaxed),
            bytes_written: self.bytes_written.load(Ordering::Relaxed),
            latency_p50_us: self.latency.quantile_us(0.50),
            latency_p99_us: self.latency.quantile_us(0.99),
            latency_max_us: self.latency.max_us(),
            latency_buckets: self.latency.buckets(),
            latency_sum_us: self.latency.sum_us.load(Ordering::Relaxed),
        }
    }
}

/// Request metrics of one store, shared (`Arc`) between the instrumented
/// store and whoever reports them.
#[derive(Debug, Default)]
pub struct StoreMetrics {
    ops: [OpMetrics; StoreOp::ALL.len()],
}

impl StoreMetrics {
    pub fn new() -> StoreMetrics {
        StoreMetrics::default()
    }

    /// The counters of `op`, for the store that records into them.
    pub(crate) fn op(&self, op: StoreOp) -> &OpMetrics {
        &self.ops[op.index()]
    }

    pub fn snapshot(&self) -> StoreMetricsSnapshot {
        let s = |op| self.op(op).snapshot();
        StoreMetricsSnapshot {
            get: s(StoreOp::Get),
            get_range: s(StoreOp::GetRange),
            put: s(StoreOp::Put),
            delete: s(StoreOp::Delete),
            head: s(StoreOp::Head),
            list: s(StoreOp::List),
            copy: s(StoreOp::Copy),
            other: s(StoreOp::Other),
        }
    }
}

/// A point-in-time copy of one operation's metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct OpMetricsSnapshot {
    pub requests: u64,
    /// Failed requests (and failed body reads of successful `get`s). A
    /// "not found" or a refused condition is an answer, counted below.
    pub errors: u64,
    /// Requests the store answered with "no such object".
    pub not_found: u64,
    /// Conditional requests the store refused because the condition did
    /// not hold (`If-None-Match` on an existing object, a stale `If-Match`).
    pub condition_failed: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// Estimated median latency (top of its log2 bucket).
    pub latency_p50_us: u64,
    /// Estimated 99th percentile latency (top of its log2 bucket).
    pub latency_p99_us: u64,
    /// Exact largest latency seen.
    pub latency_max_us: u64,
    /// Requests per log2 bucket (bucket `i` holds `[2^(i-1), 2^i)` µs).
    #[serde(skip)]
    pub latency_buckets: [u64; LATENCY_BUCKETS],
    /// Sum of the latencies recorded.
    #[serde(skip)]
    pub latency_sum_us: u64,
}

impl Default for OpMetricsSnapshot {
    fn default() -> OpMetricsSnapshot {
        OpMetricsSnapshot {
            requests: 0,
            errors: 0,
            not_found: 0,
            condition_failed: 0,
            bytes_read: 0,
            bytes_written: 0,
            latency_p50_us: 0,
            latency_p99_us: 0,
            latency_max_us: 0,
            latency_buckets: [0; LATENCY_BUCKETS],
            latency_sum_us: 0,
        }
    }
}

/// A point-in-time copy of [`StoreMetrics`], one field per [`StoreOp`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct StoreMetricsSnapshot {
    pub get: OpMetricsSnapshot,
    pub get_range: OpMetricsSnapshot,
    pub put: OpMetricsSnapshot,
    pub delete: OpMetricsSnapshot,
    pub head: OpMetricsSnapshot,
    pub list: OpMetricsSnapshot,
    pub copy: OpMetricsSnapshot,
    pub other: OpMetricsSnapshot,
}

impl StoreMetricsSnapshot {
    /// Each operation with its metrics, in [`StoreOp::ALL`] order.
    pub fn ops(&self) -> [(StoreOp, &OpMetricsSnapshot); 8] {
        [
            (StoreOp::Get, &self.get),
            (StoreOp::GetRange, &self.get_range),
            (StoreOp::Put, &self.put),
            (StoreOp::Delete, &self.delete),
            (StoreOp::Head, &self.head),
            (StoreOp::List, &self.list),
            (StoreOp::Copy, &self.copy),
            (StoreOp::Other, &self.other),
        ]
    }

    pub fn total_requests(&self) -> u64 {
        self.ops().iter().map(|(_, m)| m.requests).sum()
    }

    pub fn total_errors(&self) -> u64 {
        self.ops().iter().map(|(_, m)| m.errors).sum()
    }

    pub fn total_not_found(&self) -> u64 {
        self.ops().iter().map(|(_, m)| m.not_found).sum()
    }
}

/// One log line: the operations that saw requests, e.g.
/// `put 12 req 0 err 0 B read 3145728 B written p50 511us p99 2047us max 1900us`.
impl fmt::Display for StoreMetricsSnapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for (op, m) in self.ops().iter().filter(|(_, m)| m.requests > 0) {
            if !first {
                f.write_str("; ")?;
            }
            first = false;
            write!(
                f,
                "{} {} req {} err {} B read {} B written p50 {}us p99 {}us max {}us",
                op.name(),
                m.requests,
                m.errors,
                m.bytes_read,
                m.bytes_written,
                m.latency_p50_us,
                m.latency_p99_us,
                m.latency_max_us
            )?;
        }
        if first {
            f.write_str("no requests")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_percentiles_are_within_a_factor_of_two() {
        let histogram = LatencyHistogram::default();
        assert_eq!(histogram.quantile_us(0.5), 0, "empty");
        for latency_us in 1..=1000 {
            histogram.record_us(latency_us);
        }
        let p50 = histogram.quantile_us(0.5);
        let p99 = histogram.quantile_us(0.99);
        assert!((500..1000).contains(&p50), "p50 {p50}");
        assert!((990..=1000).contains(&p99), "p99 {p99}");
        assert_eq!(histogram.max_us(), 1000);
        assert_eq!(histogram.quantile_us(1.0), 1000, "clamped to the max");
        assert_eq!(histogram.quantile_us(0.0), 1, "the smallest bucket");
        assert_eq!(histogram.sum_us.load(Ordering::Relaxed), 500_500);
        let buckets = histogram.buckets();
        assert_eq!(buckets.iter().sum::<u64>(), 1000);
        assert_eq!(buckets[1], 1, "1 us alone in [1, 2)");
        assert_eq!(buckets[10], 1000 - 511, "[512, 1024)");
    }

    #[test]
    fn histogram_separates_fast_from_slow() {
        let histogram = LatencyHistogram::default();
        for _ in 0..98 {
            histogram.record_us(100);
        }
        histogram.record_us(50_000);
        histogram.record_us(u64::MAX);
        assert_eq!(histogram.quantile_us(0.5), 127);
        assert_eq!(histogram.quantile_us(0.98), 127);
        assert_eq!(histogram.quantile_us(0.99), 65_535);
        assert_eq!(histogram.max_us(), u64::MAX, "no overflow at the top");
    }

    #[test]
    fn snapshot_serialises_and_displays() {
        let metrics = StoreMetrics::new();
        let put = metrics.op(StoreOp::Put);
        put.record(Some(Duration::from_micros(300)), Outcome::Done);
        put.add_bytes_written(10);
        let snapshot = metrics.snapshot();
        let json = serde_json::to_value(snapshot).unwrap();
        assert_eq!(json["put"]["requests"], 1);
        assert_eq!(json["put"]["bytes_written"], 10);
        assert!(json["get"]["latency_p99_us"].is_u64());
        let line = snapshot.to_string();
        assert!(
            line.starts_with("put 1 req 0 err 0 B read 10 B written"),
            "{line}"
        );
        assert!(
            !line.contains("get"),
            "idle operations are left out: {line}"
        );
        assert_eq!(StoreMetricsSnapshot::default().to_string(), "no requests");
    }

    #[test]
    fn snapshot_fields_follow_the_operations() {
        let metrics = StoreMetrics::new();
        for (i, op) in StoreOp::ALL.into_iter().enumerate() {
            for _ in 0..=i {
                metrics.op(op).record(
                    None,
                    if i % 2 == 0 {
                        Outcome::Done
                    } else {
                        Outcome::Failed
                    },
                );
            }
        }
        let snapshot = metrics.snapshot();
        let ops: Vec<StoreOp> = snapshot.ops().iter().map(|(op, _)| *op).collect();
        assert_eq!(ops, StoreOp::ALL);
        for (i, (op, m)) in snapshot.ops().into_iter().enumerate() {
            let requests = i as u64 + 1;
            let errors = if i % 2 == 0 { 0 } else { requests };
            assert_eq!((m.requests, m.errors), (requests, errors), "{op:?}");
            assert_eq!(m.latency_max_us, 0, "no latency sample: {op:?}");
        }
        assert_eq!(snapshot.total_requests(), 36);
        assert_eq!(snapshot.total_errors(), 2 + 4 + 6 + 8);
    }
}
