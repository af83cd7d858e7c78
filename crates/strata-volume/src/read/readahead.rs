//! Sequential read-ahead: spotting sequential readers and fetching ahead.
//!
//! This module owns, per volume, a small table of read streams (the end
//! offsets of the last `STREAMS` unrelated reads, with each stream's
//! window), and, server-wide, the bound on prefetch work: at most
//! `MAX_WINDOWS_IN_FLIGHT` windows are being fetched at once, so read-ahead
//! holds at most that many windows' worth of GET buffers.
//!
//! A read that starts exactly where a tracked stream ended is sequential.
//! When the stream's prefetched lead falls below half its window, the window
//! doubles (from 256 KiB, or twice the read, up to `readahead_max_bytes` and
//! at most a quarter of the RAM chunk cache, so prefetched data is not
//! evicted before it is read) and the volume range up to `end + window` that
//! was not prefetched yet is:
//!
//! 1. looked up in the extent map under the volume lock (no I/O; in-memory
//!    data and holes need nothing);
//! 2. reduced to the stored chunks not in RAM, on disk, or in flight, and
//!    those are claimed, coalesced into runs, in the flight table (so a
//!    reader arriving before they land waits instead of fetching again);
//! 3. fetched by a background task through the read path's verified fetch.
//!
//! This file is the policy (streams, windows, the bound, counters);
//! `prefetch.rs` does steps 1-3.
//!
//! A window that finds every prefetch slot busy is skipped (counted), never
//! queued.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde::Serialize;
use tokio::sync::Semaphore;

/// Read streams tracked per volume.
pub const STREAMS: usize = 8;
/// The first window of a stream.
pub const MIN_WINDOW_BYTES: u64 = 256 << 10;
/// Windows being fetched at once, server-wide.
pub(crate) const MAX_WINDOWS_IN_FLIGHT: usize = 4;

/// Read-ahead counters.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct ReadAheadStats {
    /// Largest window in effect; 0 means read-ahead is disabled.
    pub max_window_bytes: u64,
    /// Windows that started fetching.
    pub windows_issued: u64,
    /// Windows dropped because `MAX_WINDOWS_IN_FLIGHT` were being fetched.
    pub windows_skipped: u64,
    /// Bytes read-ahead GETs returned.
    pub bytes_prefetched: u64,
    /// Bytes of fetched runs kept whole for readers (`prefetched_runs.rs`).
    pub kept_bytes: u64,
    /// Chunks readers took from the kept runs.
    pub kept_chunk_hits: u64,
}

/// Server-wide read-ahead settings, bound and counters.
pub(crate) struct ReadAhead {
    pub(crate) max_window_bytes: u64,
    pub(crate) slots: Arc<Semaphore>,
    pub(crate) windows_issued: AtomicU64,
    pub(crate) windows_skipped: AtomicU64,
    bytes_prefetched: AtomicU64,
}

impl ReadAhead {
    pub fn new(readahead_max_bytes: u64, ram_cache_bytes: u64) -> Self {
        ReadAhead {
            max_window_bytes: readahead_max_bytes.min(ram_cache_bytes / 4),
            slots: Arc::new(Semaphore::new(MAX_WINDOWS_IN_FLIGHT)),
            windows_issued: AtomicU64::new(0),
            windows_skipped: AtomicU64::new(0),
            bytes_prefetched: AtomicU64::new(0),
        }
    }

    pub fn count_prefetched(&self, bytes: u64) {
        self.bytes_prefetched.fetch_add(bytes, Ordering::Relaxed);
    }

    pub fn stats(&self) -> ReadAheadStats {
        ReadAheadStats {
            max_window_bytes: self.max_window_bytes,
            windows_issued: self.windows_issued.load(Ordering::Relaxed),
            windows_skipped: self.windows_skipped.load(Ordering::Relaxed),
            bytes_prefetched: self.bytes_prefetched.load(Ordering::Relaxed),
            kept_bytes: 0,
            kept_chunk_hits: 0,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Stream {
    end: u64,
    window_bytes: u64,
    /// Read-ahead has been issued up to here.
    prefetched_until: u64,
    last_used: u64,
}

/// The read streams of one volume.
#[derive(Debug, Default)]
pub(crate) struct Streams {
    slots: [Option<Stream>; STREAMS],
    tick: u64,
}

impl Streams {
    /// Records a read of `[offset, offset+len)`; returns the volume range to
    /// prefetch now, if any.
    pub fn observe(
        &mut self,
        offset: u64,
        len: u64,
        max_window_bytes: u64,
        volume_bytes: u64,
    ) -> Option<Range<u64>> {
        self.tick += 1;
        let tick = self.tick;
        let end = offset + len;
        let found = self.slots.iter_mut().flatten().find(|s| s.end == offset);
        let Some(s) = found else {
            // A new stream replaces the least recently used one.
            let victim = self
                .slots
                .iter_mut()
                .min_by_key(|s| s.map_or(0, |s| s.last_used));
            if let Some(slot) = victim {
                *slot = Some(Stream {
                    end,
                    window_bytes: 0,
                    prefetched_until: end,
                    last_used: tick,
                });
            }
            return None;
        };
        s.end = end;
        s.last_used = tick;
        let lead = s.prefetched_until.saturating_sub(end);
        if s.window_bytes > 0 && lead >= s.window_bytes / 2 {
            return None;
        }
        s.window_bytes = (s.window_bytes * 2)
            .max(MIN_WINDOW_BYTES)
            .max(2 * len)
            .min(max_window_bytes);
        let start = end.max(s.prefetched_until);
        let stop = (end + s.window_bytes).min(volume_bytes);
        if stop <= start {
            return None;
        }
        s.prefetched_until = stop;
        Some(start..stop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn sequential_reads_open_doubling_windows_and_random_ones_none() {
        let mut s = Streams::default();
        assert_eq!(s.observe(0, MIB, 8 * MIB, 1 << 40), None, "new stream");
        assert_eq!(
            s.observe(MIB, MIB, 8 * MIB, 1 << 40),
            Some(2 * MIB..4 * MIB)
        );
        assert_eq!(
            s.observe(2 * MIB, MIB, 8 * MIB, 1 << 40),
            None,
            "lead 1 MiB"
        );
        assert_eq!(
            s.observe(3 * MIB, MIB, 8 * MIB, 1 << 40),
            Some(4 * MIB..8 * MIB)
        );
        // Reads elsewhere start other streams and leave this one alone.
        for i in 0..STREAMS as u64 - 1 {
            assert_eq!(
                s.observe((100 + 10 * i) * MIB, 4096, 8 * MIB, 1 << 40),
                None
            );
        }
        assert_eq!(
            s.observe(4 * MIB, MIB, 8 * MIB, 1 << 40),
            None,
            "lead 3 MiB"
        );
        assert_eq!(
            s.observe(5 * MIB, MIB, 8 * MIB, 1 << 40),
            None,
            "lead 2 MiB"
        );
        assert_eq!(
            s.observe(6 * MIB, MIB, 8 * MIB, 1 << 40),
            Some(8 * MIB..15 * MIB)
        );
        // Windows stop at the end of the volume and at the maximum.
        let mut s = Streams::default();
        s.observe(0, 4096, 64 << 10, 100 << 10);
        assert_eq!(
            s.observe(4096, 4096, 64 << 10, 100 << 10),
            Some(8192..(72 << 10))
        );
        let mut s = Streams::default();
        s.observe(0, 4096, MIB, 300 << 10);
        assert_eq!(
            s.observe(4096, 4096, MIB, 300 << 10),
            Some(8192..(264 << 10))
        );
        assert_eq!(
            s.observe(8192, 130 << 10, MIB, 300 << 10),
            Some((264 << 10)..(300 << 10))
        );
    }
}
