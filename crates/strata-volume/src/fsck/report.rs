//! What `fsck` reports: the problems it found, what each affects, what it
//! checked, and the volume's space. Serialisable: `strata fsck --json`
//! prints this document as it is.

use std::ops::Range;

use serde::Serialize;

/// Problems a report lists at most (the counts stay exact beyond it).
pub const MAX_LISTED_PROBLEMS: usize = 1000;
/// Byte ranges one problem lists per volume or snapshot at most (the
/// affected byte count stays exact beyond it).
pub const MAX_LISTED_RANGES: usize = 256;

/// How bad a problem is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// Damage: data or metadata a reader, recovery or a snapshot needs is
    /// missing or fails its checks. `strata fsck` exits 1.
    Error,
    /// Nothing a reader needs is wrong: space is not reclaimed (a leak),
    /// or garbage is damaged. Reported; the exit status stays 0.
    Warning,
}

/// What kind of problem it is (stable names, for scripts).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProblemKind {
    /// An object something references is not in the store.
    Missing,
    /// An object fails its checksums, authentication or decoding.
    Corrupt,
    /// A segment object is shorter than its header says.
    Truncated,
    /// An object belongs to another volume, position or size, or is
    /// longer than its header says.
    Mismatch,
    /// A map extent points past the end of its segment's data.
    MapPastEnd,
    /// A map extent points at segment bytes no write entry holds, or that
    /// were written for another volume offset.
    MapInconsistent,
    /// A checkpoint's live bytes per segment differ from what its extents
    /// point at.
    Accounting,
    /// A stored object nothing references: space not reclaimed.
    Unreferenced,
    /// A segment stored after a missing one (an upload in flight, or left
    /// by a crash: recovery deletes it).
    AfterGap,
    /// A clone's parent, or the snapshot it was made from, is gone.
    Lineage,
    /// A clone marker is unreadable, or its clone does not exist.
    CloneMarker,
}

/// One byte range of a volume or snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ByteRange {
    pub offset: u64,
    pub length: u64,
}

/// The byte ranges of one volume or snapshot that a problem affects.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct AffectedRanges {
    /// Everything: the map itself is lost or could not be read.
    pub whole: bool,
    /// Bytes in `ranges` and those left out of it.
    pub bytes: u64,
    /// Sorted, merged; at most `MAX_LISTED_RANGES`.
    pub ranges: Vec<ByteRange>,
    /// Ranges not listed (beyond `MAX_LISTED_RANGES`).
    pub ranges_omitted: u64,
}

impl AffectedRanges {
    pub fn whole() -> AffectedRanges {
        AffectedRanges {
            whole: true,
            ..AffectedRanges::default()
        }
    }

    /// The ranges `found` (in any order, possibly overlapping), merged;
    /// `None` if there are none.
    pub fn of(mut found: Vec<Range<u64>>) -> Option<AffectedRanges> {
        found.retain(|r| r.end > r.start);
        if found.is_empty() {
            return None;
        }
        found.sort_unstable_by_key(|r| r.start);
        let mut merged: Vec<Range<u64>> = Vec::new();
        for r in found {
            match merged.last_mut() {
                Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
                _ => merged.push(r),
            }
        }
        let bytes = merged.iter().map(|r| r.end - r.start).sum();
        let omitted = merged.len().saturating_sub(MAX_LISTED_RANGES) as u64;
        merged.truncate(MAX_LISTED_RANGES);
        Some(AffectedRanges {
            whole: false,
            bytes,
            ranges: merged
                .into_iter()
                .map(|r| ByteRange {
                    offset: r.start,
                    length: r.end - r.start,
                })
                .collect(),
            ranges_omitted: omitted,
        })
    }
}

/// A snapshot's affected ranges.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SnapshotRanges {
    pub snapshot: String,
    #[serde(flatten)]
    pub ranges: AffectedRanges,
}

/// What a problem affects: the volume's ranges (its map as the store
/// holds it: checkpoint and the segments after it), each snapshot's, and
/// the clones that read it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Affects {
    /// `None`: the volume's map does not read the damaged bytes (or the
    /// check was of a snapshot only).
    pub volume: Option<AffectedRanges>,
    pub snapshots: Vec<SnapshotRanges>,
    /// Clones made from an affected snapshot (they read its data until
    /// they overwrite it), or from a snapshot whose map is damaged.
    pub clones: Vec<String>,
}

impl Affects {
    pub fn is_empty(&self) -> bool {
        self.volume.is_none() && self.snapshots.is_empty() && self.clones.is_empty()
    }
}

/// One problem found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    pub severity: Severity,
    pub kind: ProblemKind,
    /// The object, as named in the store (`VOL/segments/00000000000000a3`).
    pub object: String,
    /// What is wrong, in words.
    pub detail: String,
    pub affects: Affects,
}

/// What was checked.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Checked {
    /// Checkpoints read and verified (the volume's, snapshots').
    pub checkpoints: u64,
    pub snapshots: u64,
    pub snapshot_deltas: u64,
    pub clone_markers: u64,
    /// Map extents pointing into segments, each checked against its
    /// segment's size and entries.
    pub extents: u64,
    /// Segments whose header and tables were read and verified.
    pub segments: u64,
    /// Of them, owned by a clone's ancestors.
    pub ancestor_segments: u64,
    /// Segment bytes read (headers, tables and, unless quick, data).
    pub bytes_read: u64,
    /// Logical data bytes whose checksums (and authentication, when
    /// encrypted) were verified; 0 with `--quick`.
    pub data_bytes_verified: u64,
}

/// Space as the store holds it (checks of a whole volume only).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SpaceReport {
    pub stored_segments: u64,
    /// Object bytes of the volume's own stored segments.
    pub stored_bytes: u64,
    /// Bytes of stored segments the volume's map points at.
    pub live_bytes: u64,
    /// Bytes of stored segments the volume's or a snapshot's map points
    /// at, each counted once.
    pub referenced_bytes: u64,
    /// Stored segments nothing references and no deletion is pending for
    /// (leaks: the listing sweep of GC deletes them).
    pub unreferenced_segments: u64,
    pub unreferenced_bytes: u64,
    /// Objects waiting for their grace period before deletion.
    pub pending_deletions: u64,
    pub pending_bytes: u64,
}

/// The result of `fsck`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FsckReport {
    pub volume: String,
    /// The snapshot checked (`VOL@SNAP`), or `None` for the whole volume.
    pub snapshot: Option<String>,
    /// For a clone: the volume and snapshot it was made from.
    pub clone_of: Option<String>,
    /// Headers only: segment data was not read.
    pub quick: bool,
    /// The server holding a live lease on the volume when the check began.
    pub served_by: Option<String>,
    /// The checkpoint the volume's map was read from.
    pub checkpoint_seq: Option<u64>,
    /// No error found (warnings may be listed).
    pub clean: bool,
    pub errors: u64,
    pub warnings: u64,
    pub checked: Checked,
    pub space: Option<SpaceReport>,
    /// Objects found gone (or damaged) while the check ran that the
    /// volume, its manifest read again, no longer needs: collected by GC
    /// meanwhile, not problems.
    pub collected_while_checking: u64,
    /// At most `MAX_LISTED_PROBLEMS`, errors first.
    pub problems: Vec<Problem>,
    pub problems_omitted: u64,
}

/// Progress of a check, for a progress bar.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FsckProgress {
    pub segments_done: u64,
    pub segments_total: u64,
    /// Object bytes read so far, and what the segments to check hold.
    pub bytes_done: u64,
    pub bytes_total: u64,
}

/// Reports progress; called from the checking task.
pub type ProgressFn<'a> = &'a (dyn Fn(FsckProgress) + Send + Sync);

/// How to check.
#[derive(Debug, Clone, Copy, Default)]
pub struct FsckOptions {
    /// Segment headers and tables only (one or two small ranged GETs per
    /// segment); data is not read.
    pub quick: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_merged_counted_and_capped() {
        assert_eq!(AffectedRanges::of(std::iter::once(5..5).collect()), None);
        let r = AffectedRanges::of(vec![10..20, 0..4, 15..30, 30..31]).unwrap();
        assert_eq!(r.bytes, 25);
        assert_eq!(
            r.ranges,
            vec![
                ByteRange {
                    offset: 0,
                    length: 4
                },
                ByteRange {
                    offset: 10,
                    length: 21
                }
            ]
        );
        let many: Vec<Range<u64>> = (0..1000u64).map(|i| i * 10..i * 10 + 1).collect();
        let r = AffectedRanges::of(many).unwrap();
        assert_eq!(r.bytes, 1000);
        assert_eq!(r.ranges.len(), MAX_LISTED_RANGES);
        assert_eq!(r.ranges_omitted, 1000 - MAX_LISTED_RANGES as u64);
    }
}
