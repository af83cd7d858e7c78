//! The write side of a volume, below the `Volume` type: the local journal
//! and its group commit, the in-memory tail of the log (open and sealed
//! segments), the state behind the volume lock, and getting segments into
//! the store.
//!
//! ```text
//!  write -> journal.rs (append; journal_commit.rs: pwrite by the leader,
//!           fdatasync by the sync thread; journal_file.rs: create, scan)
//!        -> state.rs apply_op: open_segment.rs + the extent map (map/)
//!        -> bulk writes on the embedded store: their bytes pwrite'n into
//!           the open segment's file first, a pointer in the journal
//!           (staged_segment.rs)
//!  seal  -> SealedSegment -> segment_put.rs (PUT If-None-Match, retried
//!           while the lease is valid) -> state.rs mark_uploaded
//! ```
//!
//! It never reads from the store, knows nothing of the read path's caches,
//! and does not sequence the steps itself: `volume/` does.

pub(crate) mod host_budget;
pub(crate) mod journal;
mod journal_commit;
mod journal_disk;
pub(crate) mod journal_file;
pub(crate) mod open_segment;
pub(crate) mod segment_put;
pub(crate) mod staged_segment;
pub(crate) mod standby_state;
pub(crate) mod state;
