//! `fsck`: checks a volume, one of its snapshots, or a clone, as the store
//! holds it, and says what each problem affects.
//!
//! Owns the checking of stored objects against each other; reuses the
//! decoders of `format/` and the typed reads of `objects/` (nothing here
//! decodes bytes itself). One file per concern:
//!
//! - `scope.rs`: what one check covers (volume, snapshot, key, ancestors);
//! - `prepare.rs`: manifest, key, lineage, listing, then the maps;
//! - `maps.rs`: the maps: checkpoints (checksums, agreement with the
//!   manifest, recorded live bytes against the extents), the segments
//!   recovery replays after the checkpoint, snapshot deltas;
//! - `places.rs`: where the maps point, merged across maps, and the check
//!   that every place lies in its segment's data and in a write entry that
//!   wrote it at the volume offset the map says;
//! - `segments.rs`: each segment object: header, tables, size, data;
//!   `segment_pass.rs`: all of them, a few at a time, into problems;
//! - `accounting.rs`: space, leaks and segments after a gap;
//! - `clones.rs`: clone markers, and which clones read which snapshot;
//! - `collected.rs`: objects found gone, collected by GC or lost;
//! - `findings.rs`, `state.rs`, `affected.rs`, `report.rs`: problems, the
//!   ranges, snapshots and clones each affects, and the report.
//!
//! **Read only, and safe while the volume is served.** It takes no lock
//! and no lease, writes and deletes nothing, and does not touch the read
//! caches. Objects are immutable once written, except the manifest and
//! the lease, so what it reads cannot change under it: it can only
//! disappear, and only by garbage collection (or a snapshot or volume
//! deletion), each of which first writes a manifest that no longer needs
//! the object. So an object found gone (or damaged) is checked against
//! the manifest read again (`collected.rs`): no longer needed is GC at
//! work, not a problem; still needed is lost. A checkpoint the manifest
//! names that is gone already (replaced, then deleted after the grace
//! period) restarts the reading of the maps from the new manifest (at most
//! `prepare::PREPARE_ATTEMPTS` times). Segments uploaded after the
//! manifest was read are checked as part of the log after its checkpoint.
//! ARCHITECTURE.md ("Checking a volume") has the whole argument.
//!
//! **Memory** is bounded by the maps (one volume map kept, snapshots'
//! read one at a time; the places all maps point at, merged) and by
//! `segment_pass::PARALLEL_SEGMENTS` segments in flight, each holding its
//! tables and at most one 4 MiB run of data: never a volume's data.

mod accounting;
mod affected;
mod clones;
mod collected;
mod findings;
mod maps;
mod places;
mod prepare;
mod report;
mod scope;
mod segment_pass;
mod segments;
mod state;

use std::collections::{BTreeMap, BTreeSet};

use strata_store::{validate_volume_name, ObjectNames, Store};

pub use report::{
    AffectedRanges, Affects, ByteRange, Checked, FsckOptions, FsckProgress, FsckReport, Problem,
    ProblemKind, ProgressFn, Severity, SnapshotRanges, SpaceReport, MAX_LISTED_PROBLEMS,
};

use crate::error::VolumeError;
use crate::format::key_wrap::Key;
use crate::format::manifest::{validate_snapshot_name, SnapshotRecord};
use crate::map::ExtentMap;
use crate::objects::read_snapshot_map;
use crate::ownership::read_lease;
use accounting::{account, References};
use affected::Attribution;
use collected::settle;
use findings::{Findings, ReadFailure};
use maps::Maps;
use prepare::{prepare, Prepared, Ready};
use scope::Scope;
use segment_pass::check_segments;
use state::State;

/// Checks volume `volume` (or its snapshot `snapshot`) in `store`; `kek`
/// opens an encrypted volume. `Err` when the check could not run (no such
/// volume or snapshot, no key, the store failing); problems found are in
/// the report.
pub(crate) async fn fsck(
    store: &Store,
    kek: Option<&Key>,
    volume: &str,
    snapshot: Option<&str>,
    options: FsckOptions,
    progress: ProgressFn<'_>,
) -> Result<FsckReport, VolumeError> {
    validate_volume_name(volume).map_err(VolumeError::Invalid)?;
    if let Some(s) = snapshot {
        validate_snapshot_name(s).map_err(VolumeError::Invalid)?;
    }
    let served_by = served_by(store, volume).await;
    let Ready {
        scope,
        mut maps,
        listed,
        mut st,
    } = match prepare(store, kek, volume, snapshot, options.quick).await? {
        Prepared::Ready(p) => *p,
        Prepared::ManifestDamaged(detail) => {
            return Ok(manifest_damaged(
                volume, snapshot, options, served_by, detail,
            ))
        }
    };
    let referenced = own_referenced(&scope, &maps);
    let referenced_bytes = maps.places.bytes();
    st.checked.extents = maps.places.extents();
    check_segments(&scope, &mut maps, &listed, &mut st, progress).await?;
    let gone = std::mem::take(&mut st.gone);
    settle(&scope, gone, &mut st.findings).await?;
    let space = match &scope.snapshot {
        Some(_) => None,
        None => {
            let refs = References {
                referenced: &referenced,
                after_gap: &maps.after_gap,
                live_bytes: maps.map.as_ref().map(|m| m.usage().total_live_bytes()),
                referenced_bytes,
                maps_complete: maps.map.is_some() && !st.findings.maps_lost(),
            };
            Some(account(&scope, &listed, &refs, &mut st.findings).await?)
        }
    };
    let clones = clones::check_markers(&scope, &mut st.findings, &mut st.checked).await?;
    let affects = attribute(&scope, &maps, &st.findings, &clones).await?;
    Ok(report(&scope, served_by, st, affects, space))
}

/// The holder of a live lease on the volume, if any (for the report only:
/// an unreadable lease is not fsck's business).
async fn served_by(store: &Store, volume: &str) -> Option<String> {
    let lease = read_lease(store, &ObjectNames::new(volume)).await.ok()??;
    crate::ownership::live_holder(store, &lease.0).await.ok()?
}

/// The volume's own segments some map points into.
fn own_referenced(scope: &Scope, maps: &Maps) -> BTreeSet<u64> {
    let base = scope.base_seq();
    maps.places
        .seqs()
        .into_iter()
        .filter(|&s| s > base)
        .collect()
}

/// What each problem affects: the volume's ranges, each snapshot's (their
/// maps read again, one at a time, only if some problem reaches segment
/// bytes), and the clones of affected snapshots.
async fn attribute(
    scope: &Scope,
    maps: &Maps,
    findings: &Findings,
    clones: &BTreeMap<String, Vec<String>>,
) -> Result<Vec<Affects>, VolumeError> {
    let mut a = Attribution::new(findings);
    match &scope.snapshot {
        Some(record) => a.snapshot_map(&record.name, maps.map.as_ref()),
        None => {
            a.volume_map(maps.map.as_ref());
            let walk = findings.reaches_segments();
            for record in &scope.manifest.snapshots {
                let map = match walk {
                    true => reread_snapshot(scope, record).await?,
                    false => None,
                };
                a.snapshot_map(&record.name, map.as_ref());
            }
        }
    }
    for (snapshot, names) in clones {
        a.clones_of(snapshot, names);
    }
    Ok(a.finish())
}

/// A snapshot's map read again (`None` if gone or damaged: reported
/// already).
async fn reread_snapshot(
    scope: &Scope,
    record: &SnapshotRecord,
) -> Result<Option<ExtentMap>, VolumeError> {
    let (m, key) = (&scope.manifest, scope.data_key.as_ref());
    let read = read_snapshot_map(&scope.store, &scope.names, &m.name, scope.uuid, record, key);
    match read.await.map_err(ReadFailure::of) {
        Ok(map) => Ok(Some(map)),
        Err(ReadFailure::Failed(e)) => Err(e),
        Err(_) => Ok(None),
    }
}

/// The report: errors first, at most `MAX_LISTED_PROBLEMS` listed.
fn report(
    scope: &Scope,
    served_by: Option<String>,
    st: State,
    affects: Vec<Affects>,
    space: Option<SpaceReport>,
) -> FsckReport {
    let collected = st.findings.collected;
    let mut problems = st.findings.into_problems(affects);
    problems.sort_by_key(|p| p.severity != Severity::Error);
    let errors = problems
        .iter()
        .filter(|p| p.severity == Severity::Error)
        .count() as u64;
    let warnings = problems.len() as u64 - errors;
    let omitted = problems.len().saturating_sub(MAX_LISTED_PROBLEMS) as u64;
    problems.truncate(MAX_LISTED_PROBLEMS);
    let m = &scope.manifest;
    FsckReport {
        volume: m.name.clone(),
        snapshot: scope.snapshot.as_ref().map(|s| s.name.clone()),
        clone_of: m
            .parent
            .as_ref()
            .map(|p| format!("{}@{}", p.volume, p.snapshot)),
        quick: scope.quick,
        served_by,
        checkpoint_seq: match &scope.snapshot {
            Some(s) => Some(s.checkpoint_seq),
            None => m.checkpoint_seq,
        },
        clean: errors == 0,
        errors,
        warnings,
        checked: st.checked,
        space,
        collected_while_checking: collected,
        problems,
        problems_omitted: omitted,
    }
}

/// The report of a volume whose manifest does not verify: nothing else
/// can be found without it.
fn manifest_damaged(
    volume: &str,
    snapshot: Option<&str>,
    options: FsckOptions,
    served_by: Option<String>,
    detail: String,
) -> FsckReport {
    let problem = Problem {
        severity: Severity::Error,
        kind: ProblemKind::Corrupt,
        object: ObjectNames::new(volume).manifest().to_string(),
        detail: format!("{detail} (the manifest names everything else: the volume cannot be opened, nor anything else checked)"),
        affects: Affects {
            volume: Some(AffectedRanges::whole()),
            ..Affects::default()
        },
    };
    FsckReport {
        volume: volume.to_string(),
        snapshot: snapshot.map(str::to_string),
        clone_of: None,
        quick: options.quick,
        served_by,
        checkpoint_seq: None,
        clean: false,
        errors: 1,
        warnings: 0,
        checked: Checked::default(),
        space: None,
        collected_while_checking: 0,
        problems: vec![problem],
        problems_omitted: 0,
    }
}
