//! What the server counts: per NBD command kind, requests, error replies,
//! bytes and latency, per export group (see
//! [`ExportProvider::metrics_group`](crate::ExportProvider::metrics_group));
//! and connections. Read back as plain snapshots for an exporter
//! (Prometheus in the `strata` binary): this crate formats nothing.
//!
//! The request path pays relaxed atomic adds and two clock reads, no lock
//! and no allocation: a connection looks its group's counters up once,
//! when its transmission starts. Latency goes into a fixed log2 histogram
//! of microseconds ([`LATENCY_BUCKETS`] counters), from which an exporter
//! derives coarser buckets.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nbd_proto::consts::*;

/// Number of latency buckets. Bucket 0 holds 0 µs, bucket `i` holds
/// `[2^(i-1), 2^i)` µs; the last one also holds everything longer.
pub const LATENCY_BUCKETS: usize = 40;

/// The NBD commands counted, as exporters name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NbdOp {
    Read,
    Write,
    Flush,
    Trim,
    Cache,
    WriteZeroes,
    BlockStatus,
    /// A command type the server does not know (refused).
    Other,
}

impl NbdOp {
    pub const ALL: [NbdOp; 8] = [
        NbdOp::Read,
        NbdOp::Write,
        NbdOp::Flush,
        NbdOp::Trim,
        NbdOp::Cache,
        NbdOp::WriteZeroes,
        NbdOp::BlockStatus,
        NbdOp::Other,
    ];

    pub fn name(self) -> &'static str {
        match self {
            NbdOp::Read => "read",
            NbdOp::Write => "write",
            NbdOp::Flush => "flush",
            NbdOp::Trim => "trim",
            NbdOp::Cache => "cache",
            NbdOp::WriteZeroes => "write_zeroes",
            NbdOp::BlockStatus => "block_status",
            NbdOp::Other => "other",
        }
    }

    /// The op of a request header's command type.
    pub(crate) fn of_command(command_type: u16) -> NbdOp {
        match command_type {
            CMD_READ => NbdOp::Read,
            CMD_WRITE => NbdOp::Write,
            CMD_FLUSH => NbdOp::Flush,
            CMD_TRIM => NbdOp::Trim,
            CMD_CACHE => NbdOp::Cache,
            CMD_WRITE_ZEROES => NbdOp::WriteZeroes,
            CMD_BLOCK_STATUS => NbdOp::BlockStatus,
            _ => NbdOp::Other,
        }
    }
}

/// A log2 histogram of latencies in microseconds, with their sum.
#[derive(Debug)]
struct LatencyHistogram {
    counts: [AtomicU64; LATENCY_BUCKETS],
    sum_us: AtomicU64,
}

impl Default for LatencyHistogram {
    fn default() -> LatencyHistogram {
        LatencyHistogram {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_us: AtomicU64::new(0),
        }
    }
}

impl LatencyHistogram {
    fn record(&self, latency: Duration) {
        let latency_us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        let bucket = (u64::BITS - latency_us.leading_zeros()) as usize;
        self.counts[bucket.min(LATENCY_BUCKETS - 1)].fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(latency_us, Ordering::Relaxed);
    }
}

/// The counters of one [`NbdOp`] of one group.
#[derive(Debug, Default)]
struct OpCounters {
    requests: AtomicU64,
    errors: AtomicU64,
    bytes: AtomicU64,
    latency: LatencyHistogram,
}

/// The counters of one export group, shared by its connections.
#[derive(Debug, Default)]
pub(crate) struct GroupCounters {
    ops: [OpCounters; NbdOp::ALL.len()],
}

impl GroupCounters {
    /// A request answered after `latency`: `length_bytes` is what its
    /// header asked for (data read or written, range trimmed or zeroed).
    pub(crate) fn record(&self, op: NbdOp, length_bytes: u32, latency: Duration, failed: bool) {
        let c = &self.ops[op as usize];
        c.requests.fetch_add(1, Ordering::Relaxed);
        c.bytes.fetch_add(length_bytes.into(), Ordering::Relaxed);
        if failed {
            c.errors.fetch_add(1, Ordering::Relaxed);
        }
        c.latency.record(latency);
    }

    /// A request refused before it reached the device (invalid, or a
    /// command the export does not allow): an error, no latency sample.
    pub(crate) fn record_refused(&self, op: NbdOp) {
        let c = &self.ops[op as usize];
        c.requests.fetch_add(1, Ordering::Relaxed);
        c.errors.fetch_add(1, Ordering::Relaxed);
    }

    fn snapshot(&self) -> GroupSnapshot {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let ops = NbdOp::ALL.map(|op| {
            let c = &self.ops[op as usize];
            OpSnapshot {
                op,
                requests: load(&c.requests),
                errors: load(&c.errors),
                bytes: load(&c.bytes),
                latency_buckets: std::array::from_fn(|i| load(&c.latency.counts[i])),
                latency_sum_us: load(&c.latency.sum_us),
            }
        });
        GroupSnapshot { ops }
    }
}

/// Most groups tracked; connections to further groups count under
/// [`OVERFLOW_GROUP`] (a provider whose groups are unbounded must not
/// grow the server's memory or an exporter's series without bound).
pub const MAX_GROUPS: usize = 1024;
/// The group of connections past [`MAX_GROUPS`].
pub const OVERFLOW_GROUP: &str = "_other";

/// The server's counters: per group, and connections.
#[derive(Debug, Default)]
pub struct NbdMetrics {
    groups: Mutex<BTreeMap<String, Arc<GroupCounters>>>,
    connections_accepted: AtomicU64,
    connections_refused: AtomicU64,
    connections_open: AtomicU64,
    transmissions_open: AtomicU64,
}

impl NbdMetrics {
    /// The counters of `group`, created on first use.
    pub(crate) fn group(&self, group: &str) -> Arc<GroupCounters> {
        let mut groups = self.groups.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(counters) = groups.get(group) {
            return Arc::clone(counters);
        }
        let key = match groups.len() < MAX_GROUPS {
            true => group,
            false => OVERFLOW_GROUP,
        };
        Arc::clone(groups.entry(key.to_string()).or_default())
    }

    /// Counts an accepted connection, open while the guard lives (a
    /// connection task aborted at shutdown drops it too).
    pub(crate) fn connection_accepted(self: &Arc<Self>) -> OpenGuard {
        self.connections_accepted.fetch_add(1, Ordering::Relaxed);
        OpenGuard::new(self, |m| &m.connections_open)
    }

    pub(crate) fn connection_refused(&self) {
        self.connections_refused.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a connection in transmission while the guard lives.
    pub(crate) fn transmitting(self: &Arc<Self>) -> OpenGuard {
        OpenGuard::new(self, |m| &m.transmissions_open)
    }

    /// The counters now, groups in name order.
    pub fn snapshot(&self) -> NbdSnapshot {
        let groups: Vec<(String, Arc<GroupCounters>)> = {
            let groups = self.groups.lock().unwrap_or_else(|e| e.into_inner());
            groups
                .iter()
                .map(|(k, v)| (k.clone(), Arc::clone(v)))
                .collect()
        };
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        NbdSnapshot {
            groups: groups
                .into_iter()
                .map(|(name, counters)| (name, counters.snapshot()))
                .collect(),
            connections_accepted: load(&self.connections_accepted),
            connections_refused: load(&self.connections_refused),
            connections_open: load(&self.connections_open),
            transmissions_open: load(&self.transmissions_open),
        }
    }
}

/// Holds one count of an "open" gauge, given back when dropped.
pub(crate) struct OpenGuard {
    metrics: Arc<NbdMetrics>,
    gauge: fn(&NbdMetrics) -> &AtomicU64,
}

impl OpenGuard {
    fn new(metrics: &Arc<NbdMetrics>, gauge: fn(&NbdMetrics) -> &AtomicU64) -> OpenGuard {
        gauge(metrics).fetch_add(1, Ordering::Relaxed);
        OpenGuard {
            metrics: Arc::clone(metrics),
            gauge,
        }
    }
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        (self.gauge)(&self.metrics).fetch_sub(1, Ordering::Relaxed);
    }
}

/// One op's counters at a point in time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpSnapshot {
    pub op: NbdOp,
    /// Requests answered (refused ones included).
    pub requests: u64,
    /// Requests answered with an error.
    pub errors: u64,
    /// Bytes the requests' headers asked for.
    pub bytes: u64,
    /// Requests per log2 latency bucket (see [`LATENCY_BUCKETS`]); refused
    /// requests have no sample.
    pub latency_buckets: [u64; LATENCY_BUCKETS],
    pub latency_sum_us: u64,
}

/// One group's counters, one entry per [`NbdOp::ALL`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupSnapshot {
    pub ops: [OpSnapshot; NbdOp::ALL.len()],
}

impl GroupSnapshot {
    /// The counters of a group no connection used yet: all zero.
    pub fn empty() -> GroupSnapshot {
        GroupSnapshot {
            ops: NbdOp::ALL.map(|op| OpSnapshot {
                op,
                requests: 0,
                errors: 0,
                bytes: 0,
                latency_buckets: [0; LATENCY_BUCKETS],
                latency_sum_us: 0,
            }),
        }
    }
}

/// [`NbdMetrics`] at a point in time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NbdSnapshot {
    pub groups: BTreeMap<String, GroupSnapshot>,
    pub connections_accepted: u64,
    /// Closed at once: over `max_connections`.
    pub connections_refused: u64,
    /// Accepted and not closed yet (in the handshake or transmission).
    pub connections_open: u64,
    /// Connections past the handshake, serving requests.
    pub transmissions_open: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_per_op_and_bucket() {
        let metrics = NbdMetrics::default();
        let group = metrics.group("vol");
        group.record(NbdOp::Write, 4096, Duration::from_micros(100), false);
        group.record(NbdOp::Write, 4096, Duration::from_micros(3), true);
        group.record_refused(NbdOp::Other);
        let snapshot = metrics.snapshot();
        let (name, vol) = snapshot.groups.iter().next().unwrap();
        assert_eq!(name, "vol");
        let write = &vol.ops[NbdOp::Write as usize];
        assert_eq!((write.requests, write.errors, write.bytes), (2, 1, 8192));
        assert_eq!(write.latency_sum_us, 103);
        assert_eq!(write.latency_buckets[7], 1, "100 us is in [64, 128)");
        assert_eq!(write.latency_buckets[2], 1, "3 us is in [2, 4)");
        let other = &vol.ops[NbdOp::Other as usize];
        assert_eq!((other.requests, other.errors), (1, 1));
        assert_eq!(other.latency_buckets.iter().sum::<u64>(), 0);
        assert_eq!(vol.ops.clone().map(|o| o.op), NbdOp::ALL);
    }

    #[test]
    fn groups_are_bounded() {
        let metrics = NbdMetrics::default();
        for i in 0..MAX_GROUPS + 10 {
            metrics.group(&format!("g{i}")).record_refused(NbdOp::Read);
        }
        let snapshot = metrics.snapshot();
        assert_eq!(snapshot.groups.len(), MAX_GROUPS + 1);
        let overflow = &snapshot.groups[OVERFLOW_GROUP];
        assert_eq!(overflow.ops[0].requests, 10);
    }

    #[test]
    fn huge_latency_lands_in_the_last_bucket() {
        let metrics = NbdMetrics::default();
        let group = metrics.group("g");
        group.record(NbdOp::Flush, 0, Duration::from_secs(u64::MAX), false);
        let snapshot = metrics.snapshot();
        let flush = &snapshot.groups.values().next().unwrap().ops[NbdOp::Flush as usize];
        assert_eq!(flush.latency_buckets[LATENCY_BUCKETS - 1], 1);
    }
}
