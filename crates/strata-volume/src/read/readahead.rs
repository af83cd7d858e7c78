//! Sequential read-ahead: spotting sequential readers and fetching ahead.
//!
//! This module owns, per volume, a small table of read streams (the end
//! offsets of the last `STREAMS` unrelated reads, with each stream's
//! window), and, server-wide, the bound on prefetch work: at most
//! `MAX_WINDOWS_IN_FLIGHT` windows are being fetched at once, so read-ahead
//! holds at most that many windows' worth of GET buffers.
//!
//! A read that starts where a tracked stream ended continues it; so does
//! one that skips ahead at most `MAX_SKIP_BYTES` (a filesystem's reader
//! walking the files of a directory, laid out one after another with gaps,
//! or a strided scan), and one that lands at most `MAX_BEHIND_BYTES`
//! behind its end (requests of one reader overtaking each other in flight)
//! is absorbed without moving it. A stream is trusted once it scores 2: an
//! exact continuation scores 2, a skip 1, so random reads that happen to
//! land near a stream rarely open a window.
//! When a trusted stream's prefetched lead falls below half its window, the window
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
/// A read starting at most this far past a stream's end continues it.
pub const MAX_SKIP_BYTES: u64 = 1 << 20;
/// A read starting at most this far before a stream's end is part of it.
pub const MAX_BEHIND_BYTES: u64 = 256 << 10;
/// Score at which a stream opens windows (see the module doc).
const TRUSTED_SCORE: u32 = 2;
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
    /// 2 for an exact continuation, 1 for a skip; trusted at `TRUSTED_SCORE`.
    score: u32,
}

/// How a read relates to a stream ending at `stream_end`: `Some(2)` an
/// exact continuation, `Some(1)` a skip ahead, `Some(0)` behind its end
/// (absorbed), `None` unrelated.
fn relation(stream_end: u64, offset: u64) -> Option<u32> {
    if offset == stream_end {
        Some(2)
    } else if offset > stream_end && offset - stream_end <= MAX_SKIP_BYTES {
        Some(1)
    } else if offset < stream_end && stream_end - offset <= MAX_BEHIND_BYTES {
        Some(0)
    } else {
        None
    }
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
        // The closest related stream, an exact continuation first.
        let found = self
            .slots
            .iter_mut()
            .flatten()
            .filter_map(|s| relation(s.end, offset).map(|r| (r, s)))
            .max_by_key(|(r, s)| (*r, std::cmp::Reverse(s.end.abs_diff(offset))));
        let Some((score, s)) = found else {
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
                    score: 0,
                });
            }
            return None;
        };
        s.last_used = tick;
        if score == 0 {
            // Behind the end: the stream neither moves nor grows.
            s.end = s.end.max(end);
            return None;
        }
        s.end = end;
        s.score = s.score.saturating_add(score);
        if s.score < TRUSTED_SCORE {
            return None;
        }
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

    #[test]
    fn reads_that_skip_ahead_or_overtake_each_other_keep_a_stream() {
        const KIB: u64 = 1 << 10;
        let observe = |s: &mut Streams, at: u64, len: u64| s.observe(at, len, 8 * MIB, 1 << 40);
        // Files of a directory read one after another, 200 KiB apart.
        let mut s = Streams::default();
        assert_eq!(observe(&mut s, 0, 128 * KIB), None, "new stream");
        assert_eq!(
            observe(&mut s, 328 * KIB, 64 * KIB),
            None,
            "one skip: not trusted yet"
        );
        let w = observe(&mut s, 592 * KIB, 64 * KIB).expect("two skips: a stream");
        assert_eq!(w, 656 * KIB..912 * KIB);
        // A request that overtook this one arrives late: absorbed, no new
        // stream, and the next read in order goes on.
        assert_eq!(observe(&mut s, 600 * KIB, 4 * KIB), None);
        assert_eq!(s.slots.iter().flatten().count(), 1);
        assert!(
            observe(&mut s, 656 * KIB, 192 * KIB).is_some(),
            "lead below half"
        );
        // A jump past MAX_SKIP_BYTES starts another stream.
        assert_eq!(observe(&mut s, 10 * MIB, 4 * KIB), None);
        assert_eq!(s.slots.iter().flatten().count(), 2);
        // Random reads across a volume open no window.
        let mut s = Streams::default();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut windows = 0;
        for _ in 0..10_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let at = (x % (1 << 18)) * 4 * KIB; // 1 GiB, 4 KiB aligned
            windows += usize::from(observe(&mut s, at, 4 * KIB).is_some());
        }
        assert!(windows < 50, "{windows} windows for 10,000 random reads");
    }
}
