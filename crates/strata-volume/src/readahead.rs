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
//! A window that finds every prefetch slot busy is skipped (counted), never
//! queued.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futures::StreamExt;
use serde::Serialize;
use tokio::sync::Semaphore;

use crate::disk_cache::DiskKey;
use crate::extent_map::Target;
use crate::inflight::Claim;
use crate::read_path::{ChunkKey, RunBytes, SharedCaches, VolumeReader};
use crate::segment::CHUNK_BYTES;
use crate::volume::Volume;

/// Read streams tracked per volume.
pub const STREAMS: usize = 8;
/// The first window of a stream.
pub const MIN_WINDOW_BYTES: u64 = 256 << 10;
/// Windows being fetched at once, server-wide.
const MAX_WINDOWS_IN_FLIGHT: usize = 4;
/// Stored pieces one window collects at most (a window over a volume of
/// tiny extents stops early rather than holding the lock long).
const MAX_WINDOW_PIECES: usize = 4096;
/// GETs of one window in flight at once.
const MAX_WINDOW_GETS: usize = 4;

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
}

/// Server-wide read-ahead settings, bound and counters.
pub(crate) struct ReadAhead {
    max_window_bytes: u64,
    slots: Arc<Semaphore>,
    windows_issued: AtomicU64,
    windows_skipped: AtomicU64,
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

/// Claimed runs of one segment to prefetch.
type SegmentRuns = (u64, Vec<(Range<u64>, Claim<ChunkKey, RunBytes>)>);

impl Volume {
    /// Notes a read of `[offset, offset+len)` and, for a sequential reader,
    /// starts fetching the next window in the background. Never waits and
    /// does no I/O itself.
    pub(crate) fn start_readahead(&self, reader: &Arc<VolumeReader>, offset: u64, len: u64) {
        let ra = &self.caches.readahead;
        if ra.max_window_bytes == 0 || len == 0 {
            return;
        }
        let window =
            reader
                .streams
                .lock()
                .observe(offset, len, ra.max_window_bytes, self.size_bytes);
        let Some(window) = window else { return };
        let Ok(permit) = ra.slots.clone().try_acquire_owned() else {
            ra.windows_skipped.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let plan = claim_window(&self.caches, reader, self.stored_pieces(window));
        if plan.is_empty() {
            return;
        }
        ra.windows_issued.fetch_add(1, Ordering::Relaxed);
        let caches = self.caches.clone();
        let reader = reader.clone();
        let job = caches.background.start();
        tokio::spawn(async move {
            prefetch(&caches, &reader, plan).await;
            drop((permit, job));
        });
    }

    /// Stored pieces `(seq, segment offset, len)` of a volume range, looked
    /// up under the volume lock.
    fn stored_pieces(&self, range: Range<u64>) -> Vec<(u64, u64, u64)> {
        let mut out = Vec::new();
        let st = self.state.lock();
        st.map.lookup(range.start, range.end - range.start, |p| {
            if let Some(Target::Data { seq, offset }) = p.target {
                let in_memory = seq == st.open.seq || st.sealed.contains_key(&seq);
                if !in_memory && out.len() < MAX_WINDOW_PIECES {
                    out.push((seq, offset, p.len));
                }
            }
        });
        out
    }
}

/// Claims the chunks of `pieces` no tier has and nobody is fetching.
fn claim_window(
    caches: &SharedCaches,
    reader: &VolumeReader,
    pieces: Vec<(u64, u64, u64)>,
) -> Vec<SegmentRuns> {
    let mut by_seq: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for (seq, offset, len) in pieces {
        let chunks = offset / CHUNK_BYTES..=(offset + len - 1) / CHUNK_BYTES;
        by_seq.entry(seq).or_default().extend(chunks);
    }
    let mut plan = Vec::new();
    for (seq, mut numbers) in by_seq {
        numbers.sort_unstable();
        numbers.dedup();
        let cached = |c: u64| {
            caches.chunks.contains(&(reader.uuid, seq, c))
                || DiskKey::new(reader.disk_id, seq, c).is_some_and(|k| caches.disk.contains(&k))
        };
        let missing: Vec<usize> = (0..numbers.len())
            .filter(|&i| !cached(numbers[i]))
            .collect();
        // Chunks others are fetching come back as waits: nothing to do.
        let runs = caches
            .plan_fetch(reader.uuid, seq, &numbers, &missing, false)
            .runs;
        if !runs.is_empty() {
            plan.push((seq, runs));
        }
    }
    plan
}

/// Fetches claimed runs into the caches. Errors only end the prefetch (the
/// claims drop, and readers waiting for them fetch for themselves).
async fn prefetch(caches: &SharedCaches, reader: &VolumeReader, plan: Vec<SegmentRuns>) {
    for (seq, runs) in plan {
        let idx = match reader.segment_index(caches, seq).await {
            Ok(idx) => idx,
            Err(e) => {
                tracing::debug!(volume = %reader.name, seq, error = %e, "read-ahead stopped");
                return;
            }
        };
        let results: Vec<_> = futures::stream::iter(runs)
            .map(|(run, claim)| reader.fetch_run(caches, &idx, seq, run, claim, true))
            .buffer_unordered(MAX_WINDOW_GETS)
            .collect()
            .await;
        if let Some(Err(e)) = results.into_iter().find(Result::is_err) {
            tracing::debug!(volume = %reader.name, seq, error = %e, "read-ahead fetch failed");
        }
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
