//! Named crash points, for crash tests: the process aborts (as kill -9
//! would stop it) when it reaches the point named by `STRATA_CRASH_AT`.
//!
//! A leaf. `STRATA_CRASH_AT=gc.after_repoint` aborts at the first pass
//! there; `gc.between_deletions:3` at the third. Read once; unset (the
//! normal case) costs one load per point.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// The crash points, in the order a garbage collection pass reaches them.
pub const GC_CRASH_POINTS: &[&str] = &[
    "gc.after_repoint",
    "gc.after_copy_put",
    "gc.after_checkpoint",
    "gc.between_deletions",
    "gc.after_deletions",
];

/// Crash points of snapshot operations (`volume/snapshot.rs`): for a
/// create and a rollback, once the seal point's checkpoint is stored but
/// before the manifest write that names it (with the snapshot or the
/// rollback), and after that write; for a delete, once the snapshot is
/// marked as being deleted (clones are checked next) and after the write
/// that drops it; then a clone's creation after its marker and after its
/// manifest (before it checks the parent snapshot); a resize before and
/// after the write that names its size; a flatten before and after the
/// write that drops the parent.
pub const SNAPSHOT_CRASH_POINTS: &[&str] = &[
    "snapshot.before_manifest",
    "snapshot.after_create",
    "snapshot.marked_deleting",
    "snapshot.after_delete",
    "rollback.before_manifest",
    "rollback.after_manifest",
    "clone.after_marker",
    "clone.after_manifest",
    "resize.before_manifest",
    "resize.after_manifest",
    "flatten.before_manifest",
    "flatten.after_manifest",
];

/// Crash points of placed writes and of a segment published from its
/// staged file (`volume/staged.rs`): a placed write's record appended,
/// its bytes not yet written; a FLUSH's staged files synced, the journal
/// not yet; the segment's header and the bytes not yet in its file
/// written, before the sync and link; after the link, before the upload
/// is counted durable.
pub const STAGED_CRASH_POINTS: &[&str] = &[
    "staged.before_bytes",
    "staged.between_syncs",
    "staged.before_publish",
    "staged.after_publish",
];

/// Right after a fragmented read's pieces were repointed to the open
/// segment, before that segment is stored (`gc/read_rewrite.rs`).
pub const READ_REWRITE_CRASH_POINT: &str = "gc.after_read_rewrite";

static TARGET: OnceLock<Option<(String, u64)>> = OnceLock::new();
static HITS: AtomicU64 = AtomicU64::new(0);

fn target() -> &'static Option<(String, u64)> {
    TARGET.get_or_init(|| {
        let spec = std::env::var("STRATA_CRASH_AT").ok()?;
        let (name, nth) = match spec.split_once(':') {
            Some((n, k)) => (n.to_string(), k.parse().unwrap_or(1)),
            None => (spec, 1),
        };
        Some((name, nth.max(1)))
    })
}

/// Aborts the process if this is the configured crash point (and hit).
pub(crate) fn crash_point(name: &str) {
    let Some((want, nth)) = target() else { return };
    if want != name {
        return;
    }
    if HITS.fetch_add(1, Ordering::SeqCst) + 1 == *nth {
        eprintln!("strata: STRATA_CRASH_AT={name}: aborting here (crash test)");
        std::process::abort();
    }
}
