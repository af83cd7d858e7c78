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

use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The ring is written with zeros this far ahead of the records ...
const ZERO_AHEAD_BYTES: u64 = 4 << 20;
/// ... in steps of this much (one step under `write_lock` at a time).
const ZERO_STEP_BYTES: u64 = 2 << 20;
/// Written, not yet on disk: what a journal may leave to writeback while
/// another is flushing.
const YIELD_DIRTY_BYTES: u64 = 1 << 20;

/// `fdatasync`s of journals in progress, process-wide.
static FLUSHING: AtomicUsize = AtomicUsize::new(0);

/// A journal's `fdatasync` in progress (counted while alive).
pub(crate) struct Flushing(());

impl Flushing {
    pub fn start() -> Flushing {
        FLUSHING.fetch_add(1, Ordering::AcqRel);
        Flushing(())
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
}

impl JournalDisk {
    /// A journal whose next record goes at `head_lpos`; what is before it
    /// is taken as written (a no-op to zero or flush again).
    pub fn at(head_lpos: u64) -> JournalDisk {
        JournalDisk {
            zeroed_from: head_lpos,
            zeroed_until: head_lpos,
            clean_until: head_lpos,
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
        let dirty = end_lpos.saturating_sub(self.clean_until);
        if dirty <= YIELD_DIRTY_BYTES || FLUSHING.load(Ordering::Acquire) == 0 {
            return Ok(());
        }
        let from = self.clean_until.max(end_lpos.saturating_sub(ring));
        for_ring_pieces(ring, from, end_lpos, |a, b| {
            super::journal_file::write_back(file, a, b)
        })?;
        self.clean_until = end_lpos;
        Ok(())
    }

    /// The ring was punched with the head at `head_lpos`.
    pub fn punched(&mut self, head_lpos: u64) {
        *self = JournalDisk::at(head_lpos);
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
