//! The open segment's file on the embedded store: bulk writes go straight
//! into it, and the journal gets a pointer to them (issue 31, one write
//! per byte).
//!
//! Owns [`StagedSegment`]: the file (`strata_store::StagedFile`, named
//! `<segment object>#<tag>`), where its data area starts (`data_start`, a
//! fixed reserve for the header the seal writes), and whether what was
//! written into it is synced. The byte layout of a padded header is
//! `format/segment.rs`; the pointer record's is `format/journal.rs`.
//!
//! The order that keeps a power cut from breaking anything:
//! - a write's place in the file and its pointer record are taken under
//!   the volume lock (so journal order stays map order); its bytes are
//!   `pwrite`n right after, outside it, before the write is acknowledged:
//!   kill -9 keeps both (page cache). Replay stops at a record whose bytes
//!   are not there, as at a bad record, so what replays stays a prefix; and
//!   so that nothing acknowledged or FLUSHed sits behind such a record, a
//!   write is acknowledged, and a FLUSH syncs, only once every placed write
//!   before it has its bytes in its file (`PlacedInFlight`);
//! - a FLUSH (or FUA) syncs every staged file with unsynced bytes, and its
//!   directory once, before the journal: a record a FLUSH covered always
//!   finds its bytes after a power cut;
//! - the seal waits for the writes in flight into the file, then writes
//!   the bytes that are not in the file yet (small writes,
//!   garbage collector copies, replayed ones), then the padded header at
//!   offset 0, and publishes the file under the segment's name (synced,
//!   linked create-only, directory synced), as a PUT would;
//! - the staging name goes once the segment is durable (every earlier one
//!   is stored, so no replay reads its records again).
//!
//! Why recovery cannot mistake old bytes for new: a pointer names its file
//! by segment and a random tag, so only records of the journal that made
//! the file point into it; a recycled file's old bytes fail the pointer's
//! CRC; the file of a published segment keeps its staging name until the
//! segment is durable, and the recycling pool refuses a file with two names.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use strata_store::StagedFile;
use tokio::sync::Notify;

use crate::format::segment::{CHUNK_BYTES, FIXED_HEADER_BYTES};

use super::journal_disk::{Flushing, YIELD_DIRTY_BYTES};

/// The open segment's staged file. See the module doc.
#[derive(Debug)]
pub struct StagedSegment {
    pub file: StagedFile,
    pub tag: u64,
    /// File offset of the data area: the header's reserve.
    pub data_start: u64,
    /// Writes into the file (a counter), and how many of them a sync has
    /// covered: a FLUSH syncs only a file with writes it has not.
    written: AtomicU64,
    synced: AtomicU64,
    dir_synced: AtomicBool,
    /// Writes placed (their range reserved, their record appended) whose
    /// bytes are not in the file yet: the seal waits for them.
    in_flight: AtomicU64,
    /// Bytes written since the last pacing wait (`pace`).
    unpaced_bytes: AtomicU64,
    idle: Notify,
    /// Data-area ranges whose bytes are in the file; the seal writes the
    /// rest from memory.
    ranges: Mutex<Vec<(u64, u64)>>,
}

/// The journal sequence numbers of a volume's placed writes whose bytes
/// are not in their file yet. A write is acknowledged, and a FLUSH syncs,
/// only once none below its own is left: replay stops at the first placed
/// record whose bytes are missing, so nothing acknowledged or FLUSHed may
/// sit behind one.
#[derive(Debug, Default)]
pub struct PlacedInFlight {
    jseqs: Mutex<std::collections::BTreeSet<u64>>,
    done: Notify,
}

impl PlacedInFlight {
    /// Waits until every placed write with a jseq below `jseq` has its
    /// bytes in its file (or gave up: the volume failed).
    pub async fn wait_below(&self, jseq: u64) {
        loop {
            let done = self.done.notified();
            tokio::pin!(done);
            done.as_mut().enable();
            let first = self.jseqs.lock().first().copied();
            if first.is_none_or(|first| first >= jseq) {
                return;
            }
            done.await;
        }
    }
}

/// A placed write whose bytes are still to be written into the file
/// (outside the volume lock, right after its record is appended). Dropped
/// unwritten (its `pwrite` failed, which fails the volume), its range is
/// left to the seal, which writes it from memory.
#[derive(Debug)]
pub struct PendingPlace {
    staged: Arc<StagedSegment>,
    file_offset: u64,
    data_offset: u64,
    in_flight: Arc<PlacedInFlight>,
    jseq: u64,
}

impl PendingPlace {
    /// Writes the bytes into the file. Blocking.
    pub fn write(self, data: &[u8]) -> std::io::Result<()> {
        self.staged.file.write_all_at(data, self.file_offset)?;
        self.staged
            .ranges
            .lock()
            .push((self.data_offset, data.len() as u64));
        self.staged.written.fetch_add(1, Ordering::AcqRel);
        self.staged.pace(data.len() as u64);
        Ok(())
    }
}

impl Drop for PendingPlace {
    fn drop(&mut self) {
        if self.staged.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.staged.idle.notify_waiters();
        }
        self.in_flight.jseqs.lock().remove(&self.jseq);
        self.in_flight.done.notify_waiters();
    }
}

impl StagedSegment {
    pub fn new(file: StagedFile, tag: u64, data_start: u64) -> StagedSegment {
        StagedSegment {
            file,
            tag,
            data_start,
            written: AtomicU64::new(0),
            synced: AtomicU64::new(0),
            dir_synced: AtomicBool::new(false),
            in_flight: AtomicU64::new(0),
            unpaced_bytes: AtomicU64::new(0),
            idle: Notify::new(),
            ranges: Mutex::new(Vec::new()),
        }
    }

    /// A placed write's bytes at `file_offset` (data offset
    /// `data_offset`), its record appended as `jseq`: to be written, under
    /// the volume lock (so the seal and `wait_below` see it at once).
    pub fn begin(
        self: &Arc<Self>,
        file_offset: u64,
        data_offset: u64,
        in_flight: &Arc<PlacedInFlight>,
        jseq: u64,
    ) -> PendingPlace {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        in_flight.jseqs.lock().insert(jseq);
        PendingPlace {
            staged: self.clone(),
            file_offset,
            data_offset,
            in_flight: in_flight.clone(),
            jseq,
        }
    }

    /// After a placed write of `len` bytes: while a journal of the process
    /// is flushing, waits until this file's writes are on disk once more
    /// than `YIELD_DIRTY_BYTES` went in since the last wait. A FLUSH's
    /// device cache flush waits for every write queued on the disk: a
    /// volume written flat out in 1 MiB writes otherwise leaves hundreds of
    /// MiB of dirty pages in its segment file for a quiet volume's FLUSH to
    /// wait behind (the journal's own writers are paced the same way,
    /// `journal_disk.rs`). Pacing, not durability: an error is left to the
    /// seal's or the FLUSH's sync, which report it.
    fn pace(&self, len: u64) {
        let dirty = self.unpaced_bytes.fetch_add(len, Ordering::AcqRel) + len;
        if dirty <= YIELD_DIRTY_BYTES || !Flushing::any() {
            return;
        }
        // Concurrent writers may both wait: either wait paces them.
        self.unpaced_bytes.store(0, Ordering::Release);
        if let Err(e) = self.file.write_back() {
            tracing::debug!(error = %e, "staged segment: writeback for pacing failed");
        }
    }

    /// Waits until no placed write is in flight (the segment is sealed:
    /// no new one starts).
    pub async fn wait_idle(&self) {
        loop {
            let idle = self.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if self.in_flight.load(Ordering::Acquire) == 0 {
                return;
            }
            idle.await;
        }
    }

    /// The data-area ranges whose bytes are in the file, sorted.
    pub fn written_ranges(&self) -> Vec<(u64, u64)> {
        let mut r = self.ranges.lock().clone();
        r.sort_unstable();
        r
    }

    /// Whether writes went in since the last sync.
    pub fn needs_sync(&self) -> bool {
        self.synced.load(Ordering::Acquire) < self.written.load(Ordering::Acquire)
            || !self.dir_synced.load(Ordering::Acquire)
    }

    /// Makes every write noted before this call, and the file's name,
    /// survive power loss. Blocking. Two FLUSHes may both sync: each syncs
    /// what it needs, never relying on a sync under way.
    pub fn sync(&self) -> std::io::Result<()> {
        let target = self.written.load(Ordering::Acquire);
        if !self.dir_synced.load(Ordering::Acquire) {
            self.file.sync_dir()?;
            self.dir_synced.store(true, Ordering::Release);
        }
        if self.synced.load(Ordering::Acquire) < target {
            self.file.sync_data()?;
            self.synced.fetch_max(target, Ordering::AcqRel);
        }
        Ok(())
    }
}

/// The header reserve of a staged file for segments of `segment_bytes`:
/// the fixed part, the chunk CRC table of a full data area (a write is
/// placed only where it fits: the open segment is sealed first otherwise)
/// and `reserved_entries` entries, rounded up to 4 KiB: 52 KiB for a
/// 16 MiB segment (0.3%). A staged segment seals once it has that many
/// entries; one whose header does not fit all the same (garbage collector
/// copies) is written whole at its seal, as on any other store.
pub fn header_reserve_bytes(segment_bytes: u64) -> u64 {
    let chunks = segment_bytes.div_ceil(CHUNK_BYTES);
    let bytes = FIXED_HEADER_BYTES as u64 + 4 * chunks + 32 * reserved_entries(segment_bytes);
    bytes.div_ceil(CHUNK_BYTES) * CHUNK_BYTES
}

/// Entries a staged segment's header has room for: one per 16 KiB of the
/// segment size (1,024 for 16 MiB), at least 64. Writes that small are
/// not placed; what fills a staged segment's entries is small writes
/// between bulk ones.
pub fn reserved_entries(segment_bytes: u64) -> u64 {
    (segment_bytes / (16 << 10)).max(64)
}

/// The parts of `[0, total)` that `ranges` (sorted, disjoint) do not cover.
pub fn gaps(ranges: &[(u64, u64)], total: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut at = 0;
    for &(off, len) in ranges {
        if off > at {
            out.push((at, off - at));
        }
        at = at.max(off + len);
    }
    if at < total {
        out.push((at, total - at));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_are_what_ranges_leave() {
        let r = vec![(10, 5), (15, 5), (30, 10)];
        assert_eq!(gaps(&r, 50), vec![(0, 10), (20, 10), (40, 10)]);
        assert_eq!(gaps(&r, 40), vec![(0, 10), (20, 10)]);
        assert_eq!(gaps(&[], 7), vec![(0, 7)]);
        assert!(gaps(&[(0, 7)], 7).is_empty());
    }

    #[test]
    fn the_reserve_holds_a_full_segments_tables() {
        let r = header_reserve_bytes(16 << 20);
        assert_eq!(r % CHUNK_BYTES, 0);
        assert!(r >= FIXED_HEADER_BYTES as u64 + 4 * (16 << 20) / 4096 + 32 * 1024);
        assert_eq!(r, 52 << 10);
        assert_eq!(header_reserve_bytes(1 << 20), 4 << 10);
        assert_eq!(reserved_entries(1 << 20), 64);
    }
}
