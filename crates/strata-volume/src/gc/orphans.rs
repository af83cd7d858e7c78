//! Orphans: objects under a volume's prefix that nothing references
//! (segments stored after a gap, uploads of a crashed or fenced writer,
//! leftovers of a crash during GC, checkpoints no manifest names), found by
//! listing and deleted once older than the grace period.
//!
//! A segment is ours while it is in `stored` (listed at open, or uploaded
//! since) or may still be uploading (`durable_seq < seq <= open_seq`); a
//! checkpoint is ours if the manifest names it, lists it as pending, or it
//! may still be in flight (newer than the manifest's), or a snapshot keeps
//! it; a snapshot delta if the manifest names it or it may still be in
//! flight (leads to a checkpoint newer than the manifest's). Anything else
//! older
//! than the grace period is an orphan. The manifest and the lease are never
//! orphans.
//!
//! An object's age counts from the end of the second its listed time
//! names: S3 gives `LastModified` to the second (AWS lists `.000Z`;
//! SeaweedFS's gateway too), so an object listed at `12:00:05` may have
//! been written at `12:00:05.999`. Taken as exact, such a time makes every
//! object look up to a second older than it is and shortens the grace
//! period by as much (found on SeaweedFS: a 300 ms grace let an object
//! written 100 ms earlier be swept).

use std::collections::{BTreeMap, BTreeSet};

use object_store::ObjectMeta;
use strata_store::ObjectNames;

use super::pending_deletions::pending_keys;
use crate::format::manifest::{ObjectKind, PendingDeletion};

/// What the volume references, as of after the listing.
pub(crate) struct OrphanView<'a> {
    pub stored: &'a BTreeMap<u64, u64>,
    pub durable_seq: u64,
    pub open_seq: u64,
    pub manifest_checkpoint: Option<u64>,
    pub pending: &'a [PendingDeletion],
    /// Checkpoints snapshots keep.
    pub kept_checkpoints: &'a BTreeSet<u64>,
    /// Snapshot deltas the manifest names: `(to, from)`.
    pub named_deltas: &'a BTreeSet<(u64, u64)>,
}

/// How precise a listed `LastModified` may be: S3's is to the second.
pub(crate) const LISTED_TIME_PRECISION_MS: u64 = 1000;

/// How long ago `o` was last written, at the least: its listed time is
/// rounded down to [`LISTED_TIME_PRECISION_MS`] by some stores.
fn min_age_ms(o: &ObjectMeta, now_ms: u64) -> u64 {
    let listed_ms = o.last_modified.timestamp_millis().max(0) as u64;
    now_ms.saturating_sub(listed_ms.saturating_add(LISTED_TIME_PRECISION_MS))
}

/// Orphans among `listing` (objects under the volume's prefix).
pub(crate) fn find_orphans(
    names: &ObjectNames,
    listing: &[ObjectMeta],
    view: &OrphanView<'_>,
    now_ms: u64,
    grace_ms: u64,
) -> Vec<ObjectMeta> {
    let segments = names.segments_prefix();
    let checkpoints = names.checkpoints_prefix();
    let deltas = names.deltas_prefix();
    let pending_keys = pending_keys(view.pending);
    let pending = |kind: ObjectKind, seq: u64| pending_keys.contains(&(kind, seq));
    listing
        .iter()
        .filter(|o| {
            if min_age_ms(o, now_ms) < grace_ms {
                return false;
            }
            if o.location.prefix_matches(&deltas) {
                let Some((to, from)) = ObjectNames::parse_delta(&o.location) else {
                    return false;
                };
                let newer = view.manifest_checkpoint.is_none_or(|c| to > c);
                return !newer && !view.named_deltas.contains(&(to, from));
            }
            let Some(seq) = ObjectNames::parse_seq(&o.location) else {
                return false;
            };
            let parent = o.location.prefix_matches(&segments);
            if parent {
                let in_flight = seq > view.durable_seq && seq <= view.open_seq;
                return !view.stored.contains_key(&seq)
                    && !in_flight
                    && !pending(ObjectKind::Segment, seq);
            }
            if o.location.prefix_matches(&checkpoints) {
                let named =
                    view.manifest_checkpoint == Some(seq) || view.kept_checkpoints.contains(&seq);
                let newer = view.manifest_checkpoint.is_none_or(|c| seq > c);
                return !named && !newer && !pending(ObjectKind::Checkpoint, seq);
            }
            false
        })
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::path::Path;

    fn meta(location: Path, modified_ms: i64) -> ObjectMeta {
        ObjectMeta {
            location,
            last_modified: chrono::DateTime::from_timestamp_millis(modified_ms).unwrap_or_default(),
            size: 1,
            e_tag: None,
            version: None,
        }
    }

    #[test]
    fn only_old_unreferenced_segments_checkpoints_and_deltas_are_orphans() {
        let n = ObjectNames::new("v");
        let listing = vec![
            meta(n.manifest(), 0),
            meta(n.lease(), 0),
            meta(n.segment(1), 0),             // stored: ours
            meta(n.segment(2), 0),             // not stored, not pending: orphan
            meta(n.segment(3), 0),             // pending deletion: not an orphan
            meta(n.segment(6), 0),             // may still be uploading
            meta(n.segment(9), 0),             // beyond the open segment: orphan
            meta(n.segment(4), 990),           // too young (listed to the second)
            meta(n.checkpoint(2), 0),          // replaced, not pending: orphan
            meta(n.checkpoint(3), 0),          // a snapshot's
            meta(n.checkpoint(5), 0),          // named
            meta(n.checkpoint(7), 0),          // newer: in flight
            meta(n.snapshot_delta(3, 1), 0),   // named
            meta(n.snapshot_delta(3, 2), 0),   // not named: orphan
            meta(n.snapshot_delta(8, 3), 0),   // newer: in flight
            meta(n.snapshot_delta(4, 3), 990), // too young
        ];
        let stored = BTreeMap::from([(1, 1)]);
        let pending = [PendingDeletion {
            kind: ObjectKind::Segment,
            seq: 3,
            since_unix_ms: 0,
            bytes: 1,
        }];
        let view = OrphanView {
            stored: &stored,
            durable_seq: 5,
            open_seq: 7,
            manifest_checkpoint: Some(5),
            pending: &pending,
            kept_checkpoints: &BTreeSet::from([3]),
            named_deltas: &BTreeSet::from([(3, 1)]),
        };
        let found: Vec<Path> =
            find_orphans(&n, &listing, &view, 1000 + LISTED_TIME_PRECISION_MS, 100)
                .into_iter()
                .map(|o| o.location)
                .collect();
        assert_eq!(
            found,
            vec![
                n.segment(2),
                n.segment(9),
                n.checkpoint(2),
                n.snapshot_delta(3, 2)
            ]
        );
    }

    /// A store that lists times to the second: an object listed at second
    /// S is not older than the grace period until S + 1 s + grace.
    #[test]
    fn a_listed_time_counts_from_the_end_of_its_second() {
        let n = ObjectNames::new("v");
        let stored = BTreeMap::new();
        let view = OrphanView {
            stored: &stored,
            durable_seq: 0,
            open_seq: 0,
            manifest_checkpoint: None,
            pending: &[],
            kept_checkpoints: &BTreeSet::new(),
            named_deltas: &BTreeSet::new(),
        };
        // Written at 5.900 s, listed as 5.000 s; grace 300 ms.
        let listing = vec![meta(n.segment(9), 5_000)];
        let at = |now_ms| find_orphans(&n, &listing, &view, now_ms, 300).len();
        assert_eq!(at(6_000), 0, "100 ms after the write");
        assert_eq!(at(6_299), 0, "399 ms after the write");
        assert_eq!(
            at(6_300),
            1,
            "past the grace period however precise the time"
        );
    }
}
