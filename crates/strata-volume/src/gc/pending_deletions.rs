//! Deleting what nothing references any more, safely.
//!
//! 1. When checkpoint C is encoded (under the volume lock), the stored
//!    segments up to C with no live bytes are *unreferenced*: the map C
//!    holds does not point into them, recovery from C reads only segments
//!    after C, and nothing new ever points into a sealed segment.
//! 2. The manifest write that names C also lists them, and the checkpoint
//!    C replaces, as pending deletions with the time they became
//!    unreferenced (one conditional write: a writer that was taken over
//!    records nothing).
//! 3. Once the grace period has passed, the holder of the lease deletes
//!    them (a missing object counts as deleted: the delete may be a
//!    repeat after a crash), then removes them from the manifest. A crash in
//!    between repeats the deletes; a new holder inherits the list.

use std::collections::{BTreeMap, BTreeSet};

use crate::format::manifest::{Manifest, ObjectKind, PendingDeletion, MAX_PENDING_DELETIONS};
use crate::map::SegmentUsage;
use crate::snapshot::SnapshotPins;

/// The objects `pending` names, as a set (the list holds up to
/// `MAX_PENDING_DELETIONS`: looked up per object, a scan would be
/// quadratic).
pub(crate) fn pending_keys(pending: &[PendingDeletion]) -> BTreeSet<(ObjectKind, u64)> {
    pending.iter().map(|p| (p.kind, p.seq)).collect()
}

/// Segments a checkpoint leaves unreferenced: `(seq, object bytes)`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Unreferenced {
    pub segments: Vec<(u64, u64)>,
}

/// Stored segments up to `checkpoint_seq` that the map no longer points
/// into and no snapshot keeps (call under the lock that encodes the
/// checkpoint).
pub(crate) fn deletion_candidates(
    stored: &BTreeMap<u64, u64>,
    usage: &SegmentUsage,
    pins: &SnapshotPins,
    checkpoint_seq: u64,
) -> Unreferenced {
    let segments = stored
        .range(..=checkpoint_seq)
        .filter(|(&seq, _)| usage.live_bytes(seq) == 0 && !pins.is_pinned(seq))
        .map(|(&seq, &bytes)| (seq, bytes))
        .collect();
    Unreferenced { segments }
}

/// `m` with the segments of `unreferenced` and the replaced checkpoint
/// (unless a snapshot keeps it) added to its pending deletions (no
/// duplicates; at most
/// `MAX_PENDING_DELETIONS`: the rest are found again at a later
/// checkpoint, or by the orphan sweep).
pub(crate) fn add_pending(
    m: &mut Manifest,
    unreferenced: &Unreferenced,
    replaced_checkpoint: Option<u64>,
    now_ms: u64,
) {
    let checkpoint = replaced_checkpoint
        .filter(|&seq| !m.snapshot_keeps_checkpoint(seq))
        .map(|seq| (ObjectKind::Checkpoint, seq, 0));
    let segments = unreferenced
        .segments
        .iter()
        .map(|&(seq, bytes)| (ObjectKind::Segment, seq, bytes));
    let mut known = pending_keys(&m.pending_deletions);
    for (kind, seq, bytes) in checkpoint.into_iter().chain(segments) {
        if m.pending_deletions.len() >= MAX_PENDING_DELETIONS {
            break;
        }
        if !known.insert((kind, seq)) {
            continue;
        }
        m.pending_deletions.push(PendingDeletion {
            kind,
            seq,
            since_unix_ms: now_ms,
            bytes,
        });
    }
}

/// Pending deletions whose grace period has passed.
pub(crate) fn due_deletions(m: &Manifest, now_ms: u64, grace_ms: u64) -> Vec<PendingDeletion> {
    m.pending_deletions
        .iter()
        .filter(|p| p.since_unix_ms.saturating_add(grace_ms) <= now_ms)
        .copied()
        .collect()
}

/// `m` without the deletions in `done`.
pub(crate) fn remove_deleted(m: &Manifest, done: &[PendingDeletion]) -> Manifest {
    let mut next = m.clone();
    let done = pending_keys(done);
    next.pending_deletions
        .retain(|p| !done.contains(&(p.kind, p.seq)));
    next
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest() -> Manifest {
        Manifest {
            name: "v".into(),
            uuid: "0123456789abcdef0123456789abcdef".into(),
            size_bytes: 1 << 20,
            created_unix_ms: 0,
            checkpoint_seq: Some(9),
            epoch: 1,
            pending_deletions: Vec::new(),
            last_gc: None,
            snapshots: Vec::new(),
            last_rollback: None,
            parent: None,
            compression: None,
            encryption: None,
            qos: None,
        }
    }

    #[test]
    fn candidates_are_unreferenced_stored_segments_up_to_the_checkpoint() {
        let stored = BTreeMap::from([(1, 10), (2, 20), (3, 30), (12, 40)]);
        let mut usage = SegmentUsage::default();
        usage.add(2, 5);
        let mut pins = SnapshotPins::default();
        let c = deletion_candidates(&stored, &usage, &pins, 9);
        assert_eq!(c.segments, vec![(1, 10), (3, 30)]);
        let mut kept = SegmentUsage::default();
        kept.add(3, 1);
        pins.pin(&kept);
        let c = deletion_candidates(&stored, &usage, &pins, 9);
        assert_eq!(c.segments, vec![(1, 10)]);
    }

    #[test]
    fn pending_deletions_are_added_once_and_due_after_the_grace_period() {
        let mut m = manifest();
        let u = Unreferenced {
            segments: vec![(1, 10), (3, 30)],
        };
        add_pending(&mut m, &u, Some(5), 1000);
        add_pending(&mut m, &u, Some(5), 2000);
        assert_eq!(m.pending_deletions.len(), 3);
        assert!(due_deletions(&m, 1999, 1000).is_empty());
        let due = due_deletions(&m, 2000, 1000);
        assert_eq!(due.len(), 3);
        let left = remove_deleted(&m, &due[..1]);
        assert_eq!(left.pending_deletions.len(), 2);
        assert_eq!(left.pending_deletions[0].kind, ObjectKind::Segment);
    }
}
