//! The maps a check covers, read and checked: the volume's checkpoint and
//! the segments recovery replays after it (its map as a new holder would
//! build it), each snapshot's checkpoint and delta. Each checkpoint is
//! verified (checksums; authentication when encrypted; same volume, size
//! and position as the manifest says) and its recorded live bytes per
//! segment compared with what its extents point at (the accounting the
//! engine keeps). Their places go into `Places`; only the map checked
//! (the volume's, or the snapshot's) is kept.

use std::collections::{BTreeMap, BTreeSet};

use super::collected::Gone;
use super::findings::{Findings, Reach, ReadFailure};
use super::places::Places;
use super::report::{ProblemKind, Severity};
use super::scope::Scope;
use super::state::State;
use crate::error::VolumeError;
use crate::format::checkpoint::UsageTable;
use crate::format::manifest::SnapshotRecord;
use crate::map::ExtentMap;
use crate::objects::{fetch_segment_header, read_checkpoint_recorded, read_snapshot_delta};
use crate::recovery::apply_entries;

/// Segments of an accounting mismatch named in its detail.
const NAMED_MISMATCHES: usize = 3;

/// What the maps phase st.
pub(crate) struct Maps {
    /// The map checked: the volume's (checkpoint, then the segments after
    /// it replayed) or the snapshot's; `None` if it could not be read.
    pub map: Option<ExtentMap>,
    /// Own segments recovery replays after the checkpoint, in order.
    pub tail: Vec<u64>,
    /// Of them, those whose header or tables do not verify (recovery,
    /// hence opening the volume, fails on them).
    pub damaged_tail: BTreeSet<u64>,
    /// Own segments stored after a gap (recovery deletes them).
    pub after_gap: Vec<u64>,
    /// Where every map checked points.
    pub places: Places,
}

enum MapRead {
    Map(ExtentMap),
    Damaged,
    Gone,
}

/// The volume's maps: its own, then every snapshot's. `None` when the
/// checkpoint the manifest names is gone (replaced and collected since:
/// read the manifest again). `base_map`: a clone's parent snapshot map,
/// for a clone with no checkpoint of its own.
pub(crate) async fn read_volume_maps(
    scope: &Scope,
    base_map: Option<ExtentMap>,
    listed: &BTreeMap<u64, u64>,
    st: &mut State,
) -> Result<Option<Maps>, VolumeError> {
    let m = &scope.manifest;
    let mut map = match m.checkpoint_seq {
        Some(seq) => {
            let whose = "the volume's map; the volume cannot be opened until it is repaired";
            match read_map(scope, seq, m.size_bytes, whose, Reach::VolumeMap, st).await? {
                MapRead::Map(map) => Some(map),
                MapRead::Damaged => None,
                MapRead::Gone => return Ok(None),
            }
        }
        // A clone whose parent's map could not be read has none.
        None => base_map.or_else(|| (scope.base_seq() == 0).then(ExtentMap::new)),
    };
    let mut maps = replay_tail(scope, &mut map, listed, st).await?;
    if let Some(map) = &map {
        maps.places.add_map(map);
    }
    maps.map = map;
    for record in &m.snapshots {
        if let Some(map) = read_snapshot(scope, record, st).await? {
            maps.places.add_map(&map);
        }
    }
    Ok(Some(maps))
}

/// Snapshot `record`'s map and delta (a check of `VOL@SNAP`).
pub(crate) async fn read_snapshot_maps(
    scope: &Scope,
    record: &SnapshotRecord,
    st: &mut State,
) -> Result<Maps, VolumeError> {
    let map = read_snapshot(scope, record, st).await?;
    let mut places = Places::default();
    if let Some(map) = &map {
        places.add_map(map);
    }
    Ok(Maps {
        map,
        tail: Vec::new(),
        damaged_tail: BTreeSet::new(),
        after_gap: Vec::new(),
        places,
    })
}

/// A snapshot's map (`None` if damaged or gone: recorded) and its delta.
async fn read_snapshot(
    scope: &Scope,
    record: &SnapshotRecord,
    st: &mut State,
) -> Result<Option<ExtentMap>, VolumeError> {
    st.checked.snapshots += 1;
    let name = &record.name;
    let whose = format!("snapshot {name}'s map; the snapshot cannot be read, nor a clone made from it that has no checkpoint of its own opened");
    let reach = Reach::SnapshotMap(name.clone());
    let seq = record.checkpoint_seq;
    let read = read_map(scope, seq, record.size_bytes, &whose, reach, st).await?;
    check_delta(scope, record, st).await?;
    Ok(match read {
        MapRead::Map(map) => Some(map),
        MapRead::Damaged => None,
        MapRead::Gone => {
            let name = name.clone();
            st.gone.push(Gone::SnapshotCheckpoint { name, seq });
            None
        }
    })
}

/// Reads checkpoint `seq` of a volume of `size_bytes` (0: the empty map of
/// a snapshot taken before anything was stored), checks its accounting,
/// and records damage as a problem reaching `reach`.
async fn read_map(
    scope: &Scope,
    seq: u64,
    size_bytes: u64,
    whose: &str,
    reach: Reach,
    st: &mut State,
) -> Result<MapRead, VolumeError> {
    if seq == 0 {
        return Ok(MapRead::Map(ExtentMap::new()));
    }
    let key = scope.data_key.as_ref();
    let read =
        read_checkpoint_recorded(&scope.store, &scope.names, scope.uuid, seq, size_bytes, key);
    let object = scope.names.checkpoint(seq).to_string();
    match read.await.map_err(ReadFailure::of) {
        Ok((_, map, recorded)) => {
            st.checked.checkpoints += 1;
            check_usage(&mut st.findings, &object, seq, recorded, &map);
            Ok(MapRead::Map(map))
        }
        Err(ReadFailure::Gone) => Ok(MapRead::Gone),
        Err(ReadFailure::Damaged(detail)) => {
            let detail = format!("{detail} (it holds {whose})");
            let kind = ProblemKind::Corrupt;
            st.findings
                .add(Severity::Error, kind, object, detail, reach);
            Ok(MapRead::Damaged)
        }
        Err(ReadFailure::Failed(e)) => Err(e),
    }
}

/// Replays the segments after the checkpoint onto `map`, in order, as
/// recovery does, while they are contiguous; the rest are after a gap.
async fn replay_tail(
    scope: &Scope,
    map: &mut Option<ExtentMap>,
    listed: &BTreeMap<u64, u64>,
    st: &mut State,
) -> Result<Maps, VolumeError> {
    let mut maps = Maps {
        map: None,
        tail: Vec::new(),
        damaged_tail: BTreeSet::new(),
        after_gap: Vec::new(),
        places: Places::default(),
    };
    let first = scope.checkpoint_seq() + 1;
    let (size, key) = (scope.manifest.size_bytes, scope.data_key.as_ref());
    for (&seq, _) in listed.range(first..) {
        if seq != first + maps.tail.len() as u64 {
            maps.after_gap.push(seq);
            continue;
        }
        maps.tail.push(seq);
        let read = fetch_segment_header(&scope.store, &scope.names, seq, scope.uuid, size, key);
        match read.await.map_err(ReadFailure::of) {
            Ok((_, entries)) => {
                if let Some(map) = map {
                    apply_entries(map, seq, &entries);
                }
            }
            Err(ReadFailure::Gone) => st.gone.push(Gone::Segment(seq)),
            // The segment's own check reports what is wrong.
            Err(ReadFailure::Damaged(_)) => {
                maps.damaged_tail.insert(seq);
            }
            Err(ReadFailure::Failed(e)) => return Err(e),
        }
    }
    Ok(maps)
}

/// Checks a snapshot's delta; a damaged one only slows diffs down (they
/// compare whole maps across it) but is reported: the object is damaged.
async fn check_delta(
    scope: &Scope,
    record: &SnapshotRecord,
    st: &mut State,
) -> Result<(), VolumeError> {
    let Some(delta) = record.delta else {
        return Ok(());
    };
    let (to, from) = (record.checkpoint_seq, delta.from_checkpoint_seq);
    let key = scope.data_key.as_ref();
    let read = read_snapshot_delta(&scope.store, &scope.names, scope.uuid, record, delta, key);
    match read.await.map_err(ReadFailure::of) {
        Ok(_) => st.checked.snapshot_deltas += 1,
        Err(ReadFailure::Gone) => st.gone.push(Gone::Delta {
            snapshot: record.name.clone(),
            to,
            from,
        }),
        Err(ReadFailure::Damaged(detail)) => {
            let object = scope.names.snapshot_delta(to, from).to_string();
            let detail = format!(
                "{detail} (snapshot {}'s delta: diffs across it compare whole maps instead, same result, slower)",
                record.name
            );
            let kind = ProblemKind::Corrupt;
            st.findings
                .add(Severity::Error, kind, object, detail, Reach::Nothing);
        }
        Err(ReadFailure::Failed(e)) => return Err(e),
    }
    Ok(())
}

/// Compares the live bytes per segment checkpoint `seq` recorded with
/// what its extents point at.
fn check_usage(
    findings: &mut Findings,
    object: &str,
    seq: u64,
    recorded: Option<UsageTable>,
    map: &ExtentMap,
) {
    let Some(recorded) = recorded else { return };
    let recorded: BTreeMap<u64, u64> = recorded.into_iter().collect();
    let counted: BTreeMap<u64, u64> = map.usage().iter().collect();
    let segments: BTreeSet<u64> = recorded.keys().chain(counted.keys()).copied().collect();
    let differ: Vec<String> = segments
        .into_iter()
        .filter_map(|s| {
            let (r, c) = (recorded.get(&s), counted.get(&s));
            (r != c).then(|| {
                let (r, c) = (r.copied().unwrap_or(0), c.copied().unwrap_or(0));
                format!("segment {s}: {r} recorded, {c} pointed at")
            })
        })
        .collect();
    if differ.is_empty() {
        return;
    }
    let named = differ[..differ.len().min(NAMED_MISMATCHES)].join("; ");
    let more = differ.len().saturating_sub(NAMED_MISMATCHES);
    let detail = format!(
        "checkpoint {seq} records live bytes per segment that its extents do not point at ({named}{}); no data is affected (strata recomputes them at open), but the strata that wrote it miscounted",
        if more > 0 { format!("; {more} more") } else { String::new() }
    );
    let kind = ProblemKind::Accounting;
    findings.add(
        Severity::Error,
        kind,
        object.to_string(),
        detail,
        Reach::Nothing,
    );
}
