//! The journal file's disk behaviour around the records the commit path
//! writes (`journal_commit.rs`): zeros written ahead of them, and how much
//! of what was written a journal may leave to the kernel's writeback while
//! other journals are flushing.
//!
//! Zeros ahead: a journal is a sparse file (`journal_file::create`), and a
//! record written into a hole, or into an `fallocate`d (unwritten) extent,
//! makes the next `fdatasync` commit block metadata. Measured here (fio
//! 4 KiB write + FLUSH at QD1), FLUSH p50/p99: 120/181 µs on a zero-filled
//! journal, 198/289 µs on a sparse one, 200/261 µs with `fallocate` ahead,
//! 134/202 µs with zeros written ahead. Only bytes at or past the batch
//! about to be written (nothing of this lap is there yet: the batch
//! overwrites them next) and before the tail's next lap (live records) are
//! zeroed; the caller holds the journal's `write_lock`.
//!
//! Writeback: a FLUSH's `fdatasync` ends with a flush of the device's
//! cache, which waits for every write queued on the disk, other volumes'
//! included. A journal written flat out (1 MiB writes at QD32) leaves
//! hundreds of MiB of dirty pages that the kernel writes back meanwhile,
//! and a quiet volume's FLUSH next to it waited 9x its usual p99. So while
//! any journal of the process is flushing (`Flushing`), a journal that has
//! more than `YIELD_DIRTY_BYTES` written and not yet on disk starts its
//! writeback and waits for it (`sync_file_range`) before its next batch:
//! its writers are paced by the disk instead of by the page cache.
//!
//! Released bytes are not synced: a FLUSH's `fdatasync` writes every dirty
//! page of the ring, and under large writes most of what was written since
//! the last one is already released (its segments were synced by their
//! uploads): written to disk a second time for nothing. Measured
//! (`seqwrite-flush`: 1 MiB writes, a FLUSH every 64): the disk received
//! 1.85x the client's bytes. So before an `fdatasync`, the released part of
//! what was written since the last one, when it is at least
//! `--journal-punch-min-size` (8 MiB; an eighth of a smaller ring), is
//! punched out of the ring (its dirty pages are dropped, not written).
//! Nothing reads it again: recovery starts at the store's position, which
//! is at or past the tail. The cost: the next lap writes those records into
//! holes, whose blocks the following `fdatasync` commits (a small FLUSH
//! there takes ~200 µs instead of ~130 µs until the lap has passed);
//! small-write workloads never release that much between two FLUSHes and
//! keep their zero-filled ring.

use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The ring is written with zeros this far ahead of the records ...
const ZERO_AHEAD_BYTES: u64 = 4 << 20;
/// ... in steps of this much (one step under `write_lock` at a time).
const ZERO_STEP_BYTES: u64 = 2 << 20;
/// Written, not yet on disk: what a journal may leave to writeback while
/// another is flushing.
pub(crate) const YIELD_DIRTY_BYTES: u64 = 1 << 20;

/// Punches are whole pages: records around them keep their bytes.
const PAGE_BYTES: u64 = 4096;

/// `fdatasync`s of journals in progress, process-wide.
static FLUSHING: AtomicUsize = AtomicUsize::new(0);

/// A journal's `fdatasync` in progress (counted while alive).
pub(crate) struct Flushing(());

impl Flushing {
    pub fn start() -> Flushing {
        FLUSHING.fetch_add(1, Ordering::AcqRel);
        Flushing(())
    }

    /// Whether any journal of the process is in its `fdatasync` now.
    pub fn any() -> bool {
        FLUSHING.load(Ordering::Acquire) > 0
    }
}

impl Drop for Flushing {
    fn drop(&mut self) {
        FLUSHING.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Where a journal's ring stands on disk, in logical positions.
#[derive(Debug)]
pub(crate) struct JournalDisk {
    /// `[zeroed_from, zeroed_until)` is written (zeros or records) since
    /// the journal was opened or punched; the whole ring once the span
    /// reaches it.
    zeroed_from: u64,
    zeroed_until: u64,
    /// Records before this are on disk, or on their way (writeback waited
    /// for or `fdatasync`ed).
    clean_until: u64,
    /// The end of the last batch written.
    written_until: u64,
    /// `written_until` when the last `fdatasync` began: what is past it is
    /// dirty in the page cache.
    synced_until: u64,
    /// The filesystem refused a punch: released bytes are synced as before.
    punch_unsupported: bool,
    /// Released bytes punched only from this much (`before_sync`).
    punch_min_bytes: u64,
}

impl JournalDisk {
    /// A journal whose next record goes at `head_lpos`; what is before it
    /// is taken as written (a no-op to zero or flush again). Released
    /// bytes are punched from `punch_min_bytes` (never less than a page).
    pub fn at(head_lpos: u64, punch_min_bytes: u64) -> JournalDisk {
        JournalDisk {
            zeroed_from: head_lpos,
            zeroed_until: head_lpos,
            clean_until: head_lpos,
            written_until: head_lpos,
            synced_until: head_lpos,
            punch_unsupported: false,
            punch_min_bytes: punch_min_bytes.max(PAGE_BYTES),
        }
    }

    /// Writes zeros ahead of the batch `[start_lpos, end_lpos)` about to be
    /// written (see the module doc).
    pub fn zero_ahead(
        &mut self,
        file: &File,
        ring: u64,
        (start_lpos, end_lpos): (u64, u64),
        tail_lpos: u64,
    ) -> io::Result<()> {
        let whole = self.zeroed_until.saturating_sub(self.zeroed_from) >= ring;
        if whole || end_lpos + ZERO_AHEAD_BYTES <= self.zeroed_until {
            return Ok(());
        }
        let from = self.zeroed_until.max(start_lpos);
        let until = (end_lpos + ZERO_AHEAD_BYTES + ZERO_STEP_BYTES)
            .min(self.zeroed_from + ring)
            .min(tail_lpos + ring);
        for_ring_pieces(ring, from, until, |a, b| {
            super::journal_file::write_zeros(file, a, b)
        })?;
        self.zeroed_until = self.zeroed_until.max(until);
        Ok(())
    }

    /// After a batch ending at `end_lpos` was written: while another
    /// journal is flushing, waits until this one's writes older than
    /// `YIELD_DIRTY_BYTES` are on disk (see the module doc).
    pub fn after_write(&mut self, file: &File, ring: u64, end_lpos: u64) -> io::Result<()> {
        self.written_until = self.written_until.max(end_lpos);
        let dirty = end_lpos.saturating_sub(self.clean_until);
        if dirty <= YIELD_DIRTY_BYTES || !Flushing::any() {
            return Ok(());
        }
        let from = self.clean_until.max(end_lpos.saturating_sub(ring));
        for_ring_pieces(ring, from, end_lpos, |a, b| {
            super::journal_file::write_back(file, a, b)
        })?;
        self.clean_until = end_lpos;
        Ok(())
    }

    /// Before an `fdatasync`: punches out the released part of what was
    /// written since the last one, if large enough (see the module doc).
    /// The caller holds the journal's `write_lock` (no batch lands in the
    /// ring meanwhile). Never fails: a punch refused leaves the bytes to be
    /// synced, as they were before this existed. Returns the position the
    /// sync covers (the end of the last batch written).
    pub fn before_sync(&mut self, file: &File, ring: u64, tail_lpos: u64) -> u64 {
        // Only this lap's bytes: what is a ring or more behind the last
        // batch lies under newer records.
        let from = self
            .synced_until
            .max(self.written_until.saturating_sub(ring))
            .next_multiple_of(PAGE_BYTES);
        let until = tail_lpos.min(self.written_until) / PAGE_BYTES * PAGE_BYTES;
        self.synced_until = self.written_until;
        if self.punch_unsupported || until < from + self.punch_min_bytes {
            return self.synced_until;
        }
        debug_assert!(until <= tail_lpos, "punching records not yet released");
        let punched = for_ring_pieces(ring, from, until, |a, b| {
            super::journal_file::punch_hole(file, a, b)
        });
        if let Err(e) = punched {
            tracing::debug!(error = %e, "released journal bytes not punched; they are synced instead");
            self.punch_unsupported = true;
        }
        self.synced_until
    }

    /// The ring was punched with the head at `head_lpos`.
    pub fn punched(&mut self, head_lpos: u64) {
        let (unsupported, min_bytes) = (self.punch_unsupported, self.punch_min_bytes);
        *self = JournalDisk::at(head_lpos, min_bytes);
        self.punch_unsupported = unsupported;
    }
}

/// Calls `f` with the ring offsets of logical positions `[from, until)`,
/// in at most two pieces (the ring's end splits them).
fn for_ring_pieces(
    ring: u64,
    from: u64,
    until: u64,
    mut f: impl FnMut(u64, u64) -> io::Result<()>,
) -> io::Result<()> {
    let mut at = from;
    while at < until {
        let phys = at % ring;
        let len = (until - at).min(ring - phys);
        f(phys, phys + len)?;
        at += len;
    }
    Ok(())
}
