//! Objects found gone while a check runs: deleted by the serving server's
//! garbage collection (not a problem), or lost (a problem).
//!
//! GC deletes a segment only after a manifest write named a checkpoint at
//! or past it whose map no longer points into it, while no snapshot's map
//! did (`gc/pending_deletions.rs`, `docs/design/gc.md`); a snapshot's
//! checkpoint only once the snapshot is out of the manifest; a delta only
//! once no snapshot names it. So an object the check needed, found gone,
//! was collected exactly when the manifest read again no longer needs it:
//! its checkpoint (read again) does not point into the segment and is at
//! or past it, no snapshot listed now points into it, and (a clone's
//! inherited segment) the clone may have been flattened. Anything else
//! gone is lost. The same recheck drops damage found in a segment the
//! volume no longer needs (only possible while it is served: a fenced
//! writer's late upload may recreate a name GC deleted). One recheck, after
//! the segments were checked, covers all of them; a volume nobody serves
//! needs, read again, exactly what it needed, so nothing is dropped.

use std::collections::BTreeSet;

use super::findings::{Findings, Reach, ReadFailure};
use super::report::{ProblemKind, Severity};
use super::scope::Scope;
use crate::error::VolumeError;
use crate::format::manifest::Manifest;
use crate::map::ExtentMap;
use crate::objects::{read_checkpoint_recorded, read_manifest, read_snapshot_map};

/// Times the manifest is read again when the checkpoint it names is
/// itself replaced and deleted before it could be read.
const RECHECK_ATTEMPTS: usize = 5;

/// An object the check needed and found gone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Gone {
    Segment(u64),
    /// Snapshot `name`'s checkpoint `seq`.
    SnapshotCheckpoint {
        name: String,
        seq: u64,
    },
    /// The delta of the snapshot at checkpoint `to` from the one at `from`.
    Delta {
        snapshot: String,
        to: u64,
        from: u64,
    },
}

/// Decides, with the manifest read again, which objects found gone were
/// collected by GC and which are lost; and drops the damage found in
/// segments the volume no longer needs (a live volume's GC may delete a
/// segment mid-read, or a fenced writer's late upload recreate a name it
/// deleted: neither is the volume's data any more).
pub(crate) async fn settle(
    scope: &Scope,
    gone: Vec<Gone>,
    findings: &mut Findings,
) -> Result<(), VolumeError> {
    let damaged = findings.damaged_segments();
    if gone.is_empty() && damaged.is_empty() {
        return Ok(());
    }
    let needed = read_needed(scope).await?;
    let unneeded: BTreeSet<u64> = damaged
        .into_keys()
        .filter(|&seq| needed.collected(scope, &Gone::Segment(seq)))
        .collect();
    findings.collected += unneeded.len() as u64;
    findings.forget_segments(&unneeded);
    for gone in gone {
        if needed.collected(scope, &gone) {
            if let (Gone::SnapshotCheckpoint { name, .. }, Some(_)) = (&gone, &scope.snapshot) {
                return Err(VolumeError::SnapshotNotFound {
                    volume: scope.manifest.name.clone(),
                    snapshot: format!("{name} (deleted while it was checked)"),
                });
            }
            findings.collected += 1;
            continue;
        }
        let (object, detail, reach) = match gone {
            Gone::Segment(seq) => {
                let owner = scope.owner(seq);
                let detail = format!(
                    "segment {seq} of {} is not in the store, and the volume still needs it",
                    owner.name
                );
                (
                    owner.names.segment(seq).to_string(),
                    detail,
                    Reach::whole_segment(seq),
                )
            }
            Gone::SnapshotCheckpoint { name, seq } => {
                let detail = format!("checkpoint {seq}, snapshot {name}'s map, is not in the store: the snapshot cannot be read");
                (
                    scope.names.checkpoint(seq).to_string(),
                    detail,
                    Reach::SnapshotMap(name),
                )
            }
            Gone::Delta { snapshot, to, from } => {
                let detail = format!("snapshot {snapshot}'s delta is not in the store: diffs across it compare whole maps instead (same result, slower)");
                (
                    scope.names.snapshot_delta(to, from).to_string(),
                    detail,
                    Reach::Nothing,
                )
            }
        };
        let kind = ProblemKind::Missing;
        findings.add(Severity::Error, kind, object, detail, reach);
    }
    Ok(())
}

/// What the volume needs now, from its manifest read again.
pub(crate) struct Needed {
    manifest: Manifest,
    /// Segments the checkpoint named now points into, and those any
    /// snapshot listed now points into.
    checkpoint_segments: BTreeSet<u64>,
    snapshot_segments: BTreeSet<u64>,
    /// A map read again was damaged: nothing counts as collected.
    unknown: bool,
}

/// Reads the manifest again, then the maps it names.
pub(crate) async fn read_needed(scope: &Scope) -> Result<Needed, VolumeError> {
    let name = &scope.manifest.name;
    let not_done = |detail: &str| VolumeError::NotDone {
        name: name.clone(),
        detail: detail.to_string(),
    };
    for _ in 0..RECHECK_ATTEMPTS {
        let m = match read_manifest(&scope.store, name).await {
            Err(VolumeError::NotFound(_)) => {
                return Err(not_done("the volume was deleted while it was checked"))
            }
            m => m?,
        };
        if m.uuid != scope.manifest.uuid {
            return Err(not_done(
                "the volume was deleted and created again while it was checked",
            ));
        }
        if let Some(needed) = needed_by(scope, m).await? {
            return Ok(needed);
        }
        // A map it names was replaced and collected before it was read.
    }
    Err(not_done(
        "its checkpoints were replaced faster than fsck could read them; run it again",
    ))
}

/// The segments `m`'s checkpoint and snapshots point into; `None` if a map
/// it names is gone already.
async fn needed_by(scope: &Scope, m: Manifest) -> Result<Option<Needed>, VolumeError> {
    let key = scope.data_key.as_ref();
    let mut needed = Needed {
        checkpoint_segments: BTreeSet::new(),
        snapshot_segments: BTreeSet::new(),
        unknown: false,
        manifest: m,
    };
    let m = &needed.manifest;
    if let Some(seq) = m.checkpoint_seq {
        let (store, names) = (&scope.store, &scope.names);
        let read = read_checkpoint_recorded(store, names, scope.uuid, seq, m.size_bytes, key);
        match read.await.map_err(ReadFailure::of) {
            Ok((_, map, _)) => needed.checkpoint_segments = segments_of(&map),
            Err(ReadFailure::Gone) => return Ok(None),
            Err(ReadFailure::Damaged(_)) => needed.unknown = true,
            Err(ReadFailure::Failed(e)) => return Err(e),
        }
    }
    for s in &m.snapshots {
        let read = read_snapshot_map(&scope.store, &scope.names, &m.name, scope.uuid, s, key);
        match read.await.map_err(ReadFailure::of) {
            Ok(map) => needed.snapshot_segments.extend(segments_of(&map)),
            Err(ReadFailure::Gone) => return Ok(None),
            Err(ReadFailure::Damaged(_)) => needed.unknown = true,
            Err(ReadFailure::Failed(e)) => return Err(e),
        }
    }
    Ok(Some(needed))
}

fn segments_of(map: &ExtentMap) -> BTreeSet<u64> {
    map.usage().iter().map(|(seq, _)| seq).collect()
}

impl Needed {
    /// Whether `gone` was deleted by GC: the volume does not need it now.
    pub fn collected(&self, scope: &Scope, gone: &Gone) -> bool {
        let m = &self.manifest;
        match gone {
            Gone::Segment(seq) => self.segment_collected(scope, *seq),
            Gone::SnapshotCheckpoint { name, seq } => {
                let kept = m
                    .snapshots
                    .iter()
                    .any(|s| s.name == *name && s.checkpoint_seq == *seq);
                !kept && m.checkpoint_seq != Some(*seq)
            }
            Gone::Delta { to, from, .. } => !m
                .snapshots
                .iter()
                .any(|s| s.checkpoint_seq == *to && s.delta_from(*from).is_some()),
        }
    }

    fn segment_collected(&self, scope: &Scope, seq: u64) -> bool {
        if self.unknown {
            return false;
        }
        if seq <= scope.base_seq() && self.manifest.parent != scope.manifest.parent {
            // Flattened: the clone no longer reads its ancestors.
            return true;
        }
        let Some(checkpoint) = self.manifest.checkpoint_seq else {
            return false;
        };
        seq <= checkpoint
            && !self.checkpoint_segments.contains(&seq)
            && !self.snapshot_segments.contains(&seq)
    }
}
