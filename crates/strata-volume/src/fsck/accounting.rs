//! Space: what the volume stores against what references it. A stored
//! segment no map points into, that recovery does not read and that no
//! deletion is pending for, is unreferenced; so is a checkpoint or delta
//! no manifest entry names. These are warnings (space, not data): a
//! segment stored after the checkpoint that made it garbage was encoded
//! is listed for deletion by the next one (an idle volume keeps it until
//! then), and GC's listing sweep deletes objects nothing names. Segments
//! after a gap (an upload in flight, or left by a crash: recovery deletes
//! them) are warnings too. Objects newer than the manifest's checkpoint
//! may still be in flight and are never unreferenced.

use std::collections::{BTreeMap, BTreeSet};

use super::findings::{Findings, Reach};
use super::report::{ProblemKind, Severity, SpaceReport};
use super::scope::Scope;
use crate::error::VolumeError;
use crate::format::manifest::ObjectKind;
use crate::gc::pending_keys;
use crate::objects::store_error;
use strata_store::ObjectNames;

/// What references the volume's own segments.
pub(crate) struct References<'a> {
    /// Own segments some map points into.
    pub referenced: &'a BTreeSet<u64>,
    pub after_gap: &'a [u64],
    /// Bytes the volume's map points at (`None`: unknown).
    pub live_bytes: Option<u64>,
    /// Bytes any map points at, counted once.
    pub referenced_bytes: u64,
    /// Whether every map could be read (else nothing is called a leak).
    pub maps_complete: bool,
}

/// Warns of leaks and segments after a gap; returns the space report.
pub(crate) async fn account(
    scope: &Scope,
    listed: &BTreeMap<u64, u64>,
    refs: &References<'_>,
    findings: &mut Findings,
) -> Result<SpaceReport, VolumeError> {
    let m = &scope.manifest;
    let pending = pending_keys(&m.pending_deletions);
    let checkpoint = scope.checkpoint_seq();
    let mut space = SpaceReport {
        stored_segments: listed.len() as u64,
        stored_bytes: listed.values().sum(),
        live_bytes: refs.live_bytes.unwrap_or(0),
        referenced_bytes: refs.referenced_bytes,
        pending_deletions: m.pending_deletions.len() as u64,
        pending_bytes: m.pending_deletions.iter().map(|p| p.bytes).sum(),
        ..SpaceReport::default()
    };
    for &seq in refs.after_gap {
        let detail = format!("segment {seq} is stored after a missing one: an upload still in flight, or left by a crash (recovery deletes it; its writes come from the journal)");
        warn(
            findings,
            ProblemKind::AfterGap,
            scope.names.segment(seq),
            detail,
        );
    }
    if !refs.maps_complete {
        return Ok(space);
    }
    for (&seq, &bytes) in listed.range(..=checkpoint) {
        let inherited = seq <= scope.base_seq();
        let kept = !inherited
            && (refs.referenced.contains(&seq) || pending.contains(&(ObjectKind::Segment, seq)));
        if kept {
            continue;
        }
        space.unreferenced_segments += 1;
        space.unreferenced_bytes += bytes;
        let detail = if inherited {
            format!("segment {seq} ({bytes} bytes) is numbered like the parent's segments, which a clone never writes: an orphan (GC's listing sweep deletes it)")
        } else {
            format!("segment {seq} ({bytes} bytes) is referenced by no map and no deletion is pending for it: garbage not listed for deletion yet (the volume's next checkpoint lists it, or GC's listing sweep deletes it)")
        };
        warn(
            findings,
            ProblemKind::Unreferenced,
            scope.names.segment(seq),
            detail,
        );
    }
    map_object_leaks(scope, &pending, findings).await?;
    Ok(space)
}

/// Checkpoints and deltas at or before the manifest's checkpoint that
/// nothing names and no pending deletion lists.
async fn map_object_leaks(
    scope: &Scope,
    pending: &BTreeSet<(ObjectKind, u64)>,
    findings: &mut Findings,
) -> Result<(), VolumeError> {
    let m = &scope.manifest;
    let Some(checkpoint) = m.checkpoint_seq else {
        return Ok(());
    };
    let (store, names) = (&scope.store, &scope.names);
    let prefix = names.checkpoints_prefix();
    let listing = store
        .list_all(&prefix)
        .await
        .map_err(store_error(store, "list", &prefix))?;
    for o in listing {
        let Some(seq) = ObjectNames::parse_seq(&o.location) else {
            continue;
        };
        let named = seq == checkpoint || m.snapshot_keeps_checkpoint(seq);
        if seq < checkpoint && !named && !pending.contains(&(ObjectKind::Checkpoint, seq)) {
            let detail = format!("checkpoint {seq} is named by no manifest entry and no deletion is pending for it: space not reclaimed (GC's listing sweep deletes it)");
            warn(findings, ProblemKind::Unreferenced, o.location, detail);
        }
    }
    let prefix = names.deltas_prefix();
    let listing = store
        .list_all(&prefix)
        .await
        .map_err(store_error(store, "list", &prefix))?;
    for o in listing {
        let Some((to, from)) = ObjectNames::parse_delta(&o.location) else {
            continue;
        };
        let named = m
            .snapshots
            .iter()
            .any(|s| s.checkpoint_seq == to && s.delta_from(from).is_some());
        if to <= checkpoint && !named {
            let detail = format!("delta {to}-{from} is named by no snapshot: space not reclaimed (GC's listing sweep deletes it)");
            warn(findings, ProblemKind::Unreferenced, o.location, detail);
        }
    }
    Ok(())
}

fn warn(
    findings: &mut Findings,
    kind: ProblemKind,
    object: object_store::path::Path,
    detail: String,
) {
    findings.add(
        Severity::Warning,
        kind,
        object.to_string(),
        detail,
        Reach::Nothing,
    );
}
