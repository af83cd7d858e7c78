//! The server's budget for written data not yet in the store, shared by
//! its volumes (`--write-buffer-total`): memory for open and sealed
//! segments, and (the journal holds the same records until they are
//! uploaded) the live part of the journals.
//!
//! Fairness: a volume may always hold its fair share, the total divided
//! by the volumes holding anything (itself included), whatever the others
//! hold; above its share it may use what the others leave free, up to the
//! total. So a busy volume may take what idle ones do not use, and a
//! volume under its share never waits for one above it. Its per-volume cap
//! (`--write-buffer`) still applies. The total may be overshot by the
//! shares of volumes that start writing while others hold it all: at most
//! twice the total, and only until the heavy ones upload (they wait
//! meanwhile). A volume holding nothing may always write (progress).

use parking_lot::Mutex;
use tokio::sync::Notify;

#[derive(Debug)]
pub(crate) struct HostWriteBudget {
    /// 0: no host-wide limit.
    total_bytes: u64,
    state: Mutex<Held>,
    /// Notified when a volume's held bytes go down.
    freed: Notify,
    /// Segment buffers of finished uploads, for the next segment of any
    /// volume (a fresh buffer costs page faults on every first touch);
    /// at most `POOL_BUFFERS`.
    pool: Mutex<Vec<Vec<u8>>>,
    /// Segment uploads in flight, all volumes together.
    pub uploads: crate::fair_slots::FairSlots,
}

/// Segment buffers kept for reuse, server-wide: enough for the segments a
/// few busy volumes seal at once; memory of idle volumes is never kept.
const POOL_BUFFERS: usize = 4;

#[derive(Debug, Default)]
struct Held {
    bytes: u64,
    /// Volumes holding anything.
    volumes: u64,
}

impl HostWriteBudget {
    pub fn new(total_bytes: u64) -> HostWriteBudget {
        HostWriteBudget::with_uploads(total_bytes, 0)
    }

    /// A budget of `total_bytes` and of `total_uploads` uploads in flight
    /// (0: no server-wide limit).
    pub fn with_uploads(total_bytes: u64, total_uploads: usize) -> HostWriteBudget {
        HostWriteBudget {
            uploads: crate::fair_slots::FairSlots::new(total_uploads),
            total_bytes,
            state: Mutex::new(Held::default()),
            freed: Notify::new(),
            pool: Mutex::new(Vec::new()),
        }
    }

    /// An empty segment buffer: a recycled one if there is one, else none
    /// until the segment's first write (`OpenSegment::before_entry`).
    pub fn take_buffer(&self) -> Vec<u8> {
        self.pool.lock().pop().unwrap_or_default()
    }

    /// Keeps a finished buffer for reuse if the pool has room and it is
    /// not oversized (at most `max_capacity`).
    pub fn recycle_buffer(&self, mut buffer: Vec<u8>, max_capacity: usize) {
        if buffer.capacity() == 0 || buffer.capacity() > max_capacity {
            return;
        }
        let mut pool = self.pool.lock();
        if pool.len() < POOL_BUFFERS {
            buffer.clear();
            pool.push(buffer);
        }
    }

    /// No host-wide limit (unit tests, embedders that size volumes alone).
    pub fn unlimited() -> HostWriteBudget {
        HostWriteBudget::new(0)
    }

    /// Whether a volume holding `held` may add `cost` now.
    pub fn admits(&self, held: u64, cost: u64) -> bool {
        if self.total_bytes == 0 || held == 0 {
            return true;
        }
        let st = self.state.lock();
        let share = self.total_bytes / st.volumes.max(1);
        held + cost <= share || st.bytes + cost <= self.total_bytes
    }

    /// A volume holding `held` added `cost`.
    pub fn add(&self, held: u64, cost: u64) {
        let mut st = self.state.lock();
        st.bytes += cost;
        if held == 0 && cost > 0 {
            st.volumes += 1;
        }
    }

    /// A volume gave back `freed` and now holds `held`.
    pub fn release(&self, held: u64, freed: u64) {
        if freed == 0 {
            return;
        }
        {
            let mut st = self.state.lock();
            debug_assert!(st.bytes >= freed);
            st.bytes = st.bytes.saturating_sub(freed);
            if held == 0 {
                st.volumes = st.volumes.saturating_sub(1);
            }
        }
        self.freed.notify_waiters();
    }

    /// Resolves after some volume gave bytes back.
    pub fn freed(&self) -> tokio::sync::futures::Notified<'_> {
        self.freed.notified()
    }

    /// (bytes held, volumes holding) now.
    #[cfg(test)]
    pub fn held(&self) -> (u64, u64) {
        let st = self.state.lock();
        (st.bytes, st.volumes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_volume_under_its_share_never_waits_for_one_above_it() {
        let b = HostWriteBudget::new(100);
        // Alone, a volume may take it all.
        b.add(0, 10);
        assert!(b.admits(10, 90));
        b.add(10, 90);
        assert!(!b.admits(100, 1), "the total");
        // A second volume: its first write always, then up to its share
        // (50) although the host is over the total.
        assert!(b.admits(0, 5));
        b.add(0, 5);
        assert!(b.admits(5, 45));
        assert!(!b.admits(5, 46));
        // The heavy one waits until it is back under its share or the
        // total has room.
        assert!(!b.admits(100, 1));
        b.release(40, 60);
        assert_eq!(b.held(), (45, 2));
        assert!(b.admits(40, 10));
        // Emptied volumes stop counting.
        b.release(0, 40);
        b.release(0, 5);
        assert_eq!(b.held(), (0, 0));
        assert!(HostWriteBudget::unlimited().admits(1 << 40, 1 << 40));
    }
}
