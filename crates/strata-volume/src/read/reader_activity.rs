//! What a volume's clients are doing, as hydration needs to know it: where
//! in the stored data they read last, when, and how many of their fetches
//! are at the store now. Kept per reader (`VolumeReader`), updated by
//! every client read while a hydration reads through that reader, read by
//! `volume/hydrate.rs` to put the client first.
//!
//! Cheap on the read path: atomics only, written only while hydrating.
//! Hydration is woken on a client's store fetch (a miss: the reader moved
//! to data that is not local), not on every read.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

use tokio::sync::Notify;

use super::block_cache::BLOCK_BYTES;

/// Bits of the packed position given to the block in its segment (64 KiB
/// blocks: a segment of up to 1 TiB); the segment's sequence number takes
/// the rest.
const BLOCK_BITS: u32 = 24;
/// No read noted yet.
const NOWHERE: u64 = u64::MAX;

/// A reader's clients, as hydration sees them.
pub(crate) struct ReaderActivity {
    /// `(seq << BLOCK_BITS) | block` of the last client read's first piece.
    last_position: AtomicU64,
    /// When a client last read, in ms since `epoch()` (+1: 0 is never).
    last_read_ms: AtomicU64,
    /// Client reads' fetches at the store now (not read-ahead's).
    fetches_in_flight: AtomicUsize,
    /// Wakes the hydration reading through this reader.
    pub wake: Notify,
}

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn now_ms() -> u64 {
    epoch().elapsed().as_millis() as u64 + 1
}

impl Default for ReaderActivity {
    fn default() -> ReaderActivity {
        ReaderActivity {
            last_position: AtomicU64::new(NOWHERE),
            last_read_ms: AtomicU64::new(0),
            fetches_in_flight: AtomicUsize::new(0),
            wake: Notify::new(),
        }
    }
}

impl ReaderActivity {
    /// Notes a client read of segment `seq` at data offset `offset`.
    pub fn note_read(&self, seq: u64, offset: u64) {
        let block = (offset / BLOCK_BYTES).min((1 << BLOCK_BITS) - 1);
        if seq < (1 << (64 - BLOCK_BITS)) - 1 {
            self.last_position
                .store((seq << BLOCK_BITS) | block, Ordering::Relaxed);
        }
        self.last_read_ms.store(now_ms(), Ordering::Relaxed);
    }

    /// Notes that a client fetch goes to the store (a miss) and wakes
    /// hydration; the guard counts it until dropped.
    pub fn fetch_started(&self) -> FetchInFlight<'_> {
        self.fetches_in_flight.fetch_add(1, Ordering::Relaxed);
        self.wake.notify_one();
        FetchInFlight(self)
    }

    /// The segment and block the clients read last.
    pub fn position(&self) -> Option<(u64, u64)> {
        let p = self.last_position.load(Ordering::Relaxed);
        (p != NOWHERE).then_some((p >> BLOCK_BITS, p & ((1 << BLOCK_BITS) - 1)))
    }

    /// Whether a client read within the last `ms`.
    pub fn read_within(&self, ms: u64) -> bool {
        let last = self.last_read_ms.load(Ordering::Relaxed);
        last != 0 && now_ms().saturating_sub(last) <= ms
    }

    /// Client fetches at the store now.
    pub fn fetches_in_flight(&self) -> usize {
        self.fetches_in_flight.load(Ordering::Relaxed)
    }
}

/// One client fetch at the store, counted while alive.
pub(crate) struct FetchInFlight<'a>(&'a ReaderActivity);

impl Drop for FetchInFlight<'_> {
    fn drop(&mut self) {
        self.0.fetches_in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn position_and_activity_round_trip() {
        let a = ReaderActivity::default();
        assert_eq!(a.position(), None);
        assert!(!a.read_within(1_000));
        a.note_read(7, 3 * BLOCK_BYTES + 5);
        assert_eq!(a.position(), Some((7, 3)));
        assert!(a.read_within(1_000));
        {
            let _f = a.fetch_started();
            assert_eq!(a.fetches_in_flight(), 1);
        }
        assert_eq!(a.fetches_in_flight(), 0);
        // A block past what the packing holds is clamped, not wrapped.
        a.note_read(9, u64::MAX);
        assert_eq!(a.position(), Some((9, (1 << BLOCK_BITS) - 1)));
    }
}
