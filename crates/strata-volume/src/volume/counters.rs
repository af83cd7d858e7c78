//! Counters of an open volume that no other part owns: how long writers
//! waited for room (back-pressure, by what they waited for), and the
//! snapshots taken, deleted and rolled back to, and the FLUSHes that made
//! bulk data durable as segments. Relaxed atomics, touched only when a
//! writer had to wait, a snapshot operation succeeded or a FLUSH sealed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;

/// What a write waited for before it could be appended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WaitFor {
    /// The write buffer (segments not yet uploaded) was full.
    WriteBuffer,
    /// The journal's ring was full (its space frees as uploads finish).
    Journal,
    /// The lease may have lapsed; writes wait for a renewal.
    Lease,
    /// A resize was under way.
    Resize,
    /// The server's budget for written data (`--write-buffer-total`) was
    /// full and this volume held more than its fair share of it.
    HostBuffer,
}

impl WaitFor {
    const ALL: [WaitFor; 5] = [
        WaitFor::WriteBuffer,
        WaitFor::Journal,
        WaitFor::Lease,
        WaitFor::Resize,
        WaitFor::HostBuffer,
    ];

    fn name(self) -> &'static str {
        match self {
            WaitFor::WriteBuffer => "write_buffer",
            WaitFor::Journal => "journal",
            WaitFor::Lease => "lease",
            WaitFor::Resize => "resize",
            WaitFor::HostBuffer => "host_write_buffer",
        }
    }
}

/// How a FLUSH that sealed its bulk data ended (`volume/write.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FlushSeal {
    /// Every segment up to the seal was in the store in time.
    Stored,
    /// The uploads took too long: the ring's sync covered the rest.
    TimedOut,
}

#[derive(Debug, Default)]
struct WaitCounter {
    writes: AtomicU64,
    waited_us: AtomicU64,
}

#[derive(Debug, Default)]
pub(crate) struct VolumeCounters {
    waits: [WaitCounter; WaitFor::ALL.len()],
    pub snapshots_created: AtomicU64,
    pub snapshots_deleted: AtomicU64,
    pub rollbacks: AtomicU64,
    flushes_sealed: AtomicU64,
    flush_seals_timed_out: AtomicU64,
}

impl VolumeCounters {
    /// A write that waited `waited` in all, first for `reason`.
    pub(crate) fn waited(&self, reason: WaitFor, waited: Duration) {
        let c = &self.waits[reason as usize];
        c.writes.fetch_add(1, Ordering::Relaxed);
        let waited_us = u64::try_from(waited.as_micros()).unwrap_or(u64::MAX);
        c.waited_us.fetch_add(waited_us, Ordering::Relaxed);
    }

    /// A FLUSH that sealed its bulk data, and how that ended.
    pub(crate) fn flush_sealed(&self, outcome: FlushSeal) {
        self.flushes_sealed.fetch_add(1, Ordering::Relaxed);
        if outcome == FlushSeal::TimedOut {
            self.flush_seals_timed_out.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn flush_seals(&self) -> FlushSealStats {
        FlushSealStats {
            sealed: self.flushes_sealed.load(Ordering::Relaxed),
            timed_out: self.flush_seals_timed_out.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn add(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn write_waits(&self) -> Vec<WriteWaitStats> {
        WaitFor::ALL
            .iter()
            .map(|&reason| {
                let c = &self.waits[reason as usize];
                WriteWaitStats {
                    reason: reason.name(),
                    writes: c.writes.load(Ordering::Relaxed),
                    waited_us: c.waited_us.load(Ordering::Relaxed),
                }
            })
            .collect()
    }

    pub(crate) fn snapshots(&self, count: u64) -> SnapshotStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        SnapshotStats {
            count,
            created: get(&self.snapshots_created),
            deleted: get(&self.snapshots_deleted),
            rollbacks: get(&self.rollbacks),
        }
    }
}

/// Writes (WRITE, TRIM, WRITE_ZEROES) that waited for room, by what they
/// waited for first, and the time they waited in all.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WriteWaitStats {
    pub reason: &'static str,
    pub writes: u64,
    pub waited_us: u64,
}

/// FLUSHes that sealed and uploaded their bulk data rather than sync it
/// in the journal's ring, and of those, the ones whose uploads took too
/// long (the ring's sync covered them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct FlushSealStats {
    pub sealed: u64,
    pub timed_out: u64,
}

/// The volume's snapshots now, and what this server did to them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct SnapshotStats {
    pub count: u64,
    pub created: u64,
    pub deleted: u64,
    pub rollbacks: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_add_up_per_reason() {
        let counters = VolumeCounters::default();
        counters.waited(WaitFor::Journal, Duration::from_micros(5));
        counters.waited(WaitFor::Journal, Duration::from_micros(7));
        counters.waited(WaitFor::Lease, Duration::from_secs(1));
        let waits = counters.write_waits();
        let get = |name| waits.iter().find(|w| w.reason == name).unwrap().clone();
        assert_eq!((get("journal").writes, get("journal").waited_us), (2, 12));
        assert_eq!(get("lease").waited_us, 1_000_000);
        assert_eq!(get("write_buffer").writes, 0);
        assert_eq!(waits.len(), 5);
        assert_eq!(get("host_write_buffer").writes, 0);
    }
}
