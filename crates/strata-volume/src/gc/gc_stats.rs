//! Counters of garbage collection, per volume (exported in the stats
//! file), and the report of one explicit pass.

use std::sync::atomic::{AtomicU64, Ordering};

/// Running totals since the volume was opened.
#[derive(Debug, Default)]
pub(crate) struct GcCounters {
    pub passes: AtomicU64,
    pub segments_rewritten: AtomicU64,
    pub bytes_copied: AtomicU64,
    /// Bytes whose copy was dropped because a user write replaced them
    /// while the copy was read (the write wins).
    pub bytes_superseded: AtomicU64,
    pub objects_deleted: AtomicU64,
    pub bytes_reclaimed: AtomicU64,
    pub orphans_deleted: AtomicU64,
    pub errors: AtomicU64,
    /// Fragmented reads whose pieces were rewritten contiguously, and the
    /// bytes moved (`read_rewrite.rs`).
    pub read_rewrites: AtomicU64,
    pub bytes_rewritten_on_read: AtomicU64,
}

/// A snapshot of the counters, plus what is waiting for deletion.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct GcStats {
    pub passes: u64,
    pub segments_rewritten: u64,
    pub bytes_copied: u64,
    pub bytes_superseded: u64,
    pub objects_deleted: u64,
    pub bytes_reclaimed: u64,
    pub orphans_deleted: u64,
    pub errors: u64,
    pub read_rewrites: u64,
    pub bytes_rewritten_on_read: u64,
    pub pending_deletions: u64,
    pub pending_bytes: u64,
}

impl GcCounters {
    pub(crate) fn snapshot(&self, pending_deletions: u64, pending_bytes: u64) -> GcStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        GcStats {
            passes: get(&self.passes),
            segments_rewritten: get(&self.segments_rewritten),
            bytes_copied: get(&self.bytes_copied),
            bytes_superseded: get(&self.bytes_superseded),
            objects_deleted: get(&self.objects_deleted),
            bytes_reclaimed: get(&self.bytes_reclaimed),
            orphans_deleted: get(&self.orphans_deleted),
            errors: get(&self.errors),
            read_rewrites: get(&self.read_rewrites),
            bytes_rewritten_on_read: get(&self.bytes_rewritten_on_read),
            pending_deletions,
            pending_bytes,
        }
    }

    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// What an explicit pass did.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct GcPassReport {
    pub segments_rewritten: u64,
    pub bytes_copied: u64,
    pub bytes_superseded: u64,
    pub objects_deleted: u64,
    pub bytes_reclaimed: u64,
    /// Still waiting for their grace period (without `wait`).
    pub pending_deletions: u64,
    pub pending_bytes: u64,
    pub stored_bytes: u64,
    pub live_bytes: u64,
}
