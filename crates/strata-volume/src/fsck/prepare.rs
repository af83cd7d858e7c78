//! The start of a check: the manifest, the key, the snapshot named, a
//! clone's lineage, the listing of the volume's segments, and the maps,
//! read again from a newer manifest when the checkpoint named is deleted
//! before it could be read (replaced meanwhile).

use std::collections::{BTreeMap, BTreeSet};

use strata_store::{ObjectNames, Store};

use super::findings::{Findings, Reach, ReadFailure};
use super::maps::{read_snapshot_maps, read_volume_maps, Maps};
use super::places::Places;
use super::report::{ProblemKind, Severity};
use super::scope::Scope;
use super::state::State;
use crate::at_rest::data_key_of;
use crate::error::VolumeError;
use crate::format::key_wrap::Key;
use crate::format::manifest::Manifest;
use crate::map::ExtentMap;
use crate::objects::{list_segments, read_manifest};
use crate::snapshot::{resolve_lineage, Lineage};

/// Times the maps are read from a newer manifest when the checkpoint the
/// previous one named was deleted before it could be read.
const PREPARE_ATTEMPTS: usize = 5;

/// A check ready to read segments.
pub(crate) struct Ready {
    pub scope: Scope,
    pub maps: Maps,
    /// The volume's own segments as listed: `seq -> object bytes`.
    pub listed: BTreeMap<u64, u64>,
    pub st: State,
}

pub(crate) enum Prepared {
    Ready(Box<Ready>),
    ManifestDamaged(String),
}

/// Reads the manifest, the lineage, the segment listing and the maps; from
/// a newer manifest again if the checkpoint named is gone meanwhile.
pub(crate) async fn prepare(
    store: &Store,
    kek: Option<&Key>,
    volume: &str,
    snapshot: Option<&str>,
    quick: bool,
) -> Result<Prepared, VolumeError> {
    let mut gone_checkpoint = None;
    for _ in 0..PREPARE_ATTEMPTS {
        let mut st = State::default();
        let manifest = match read_manifest(store, volume).await {
            Ok(m) => m,
            Err(VolumeError::Corrupt { detail, .. }) => {
                return Ok(Prepared::ManifestDamaged(detail))
            }
            Err(e) => return Err(e),
        };
        let scope = open_scope(store, kek, manifest, snapshot, quick, &mut st.findings);
        let (scope, base_map) = scope.await?;
        let listed: BTreeMap<u64, u64> = list_segments(store, &scope.names)
            .await?
            .into_iter()
            .collect();
        let maps = match &scope.snapshot {
            Some(record) => read_snapshot_maps(&scope, record, &mut st).await?,
            None => {
                let missing_is_lost = gone_checkpoint == scope.manifest.checkpoint_seq;
                let read = read_volume_maps(&scope, base_map, &listed, &mut st).await?;
                match read {
                    Some(maps) => maps,
                    None if missing_is_lost => lost_checkpoint(&scope, &listed, &mut st),
                    None => {
                        gone_checkpoint = scope.manifest.checkpoint_seq;
                        continue;
                    }
                }
            }
        };
        return Ok(Prepared::Ready(Box::new(Ready {
            scope,
            maps,
            listed,
            st,
        })));
    }
    Err(VolumeError::NotDone {
        name: volume.to_string(),
        detail: "its checkpoints were replaced faster than fsck could read them; run it again"
            .into(),
    })
}

/// The volume's checkpoint is gone and the manifest read again still names
/// it: lost. Its map is unknown; the segments are still checked.
fn lost_checkpoint(scope: &Scope, listed: &BTreeMap<u64, u64>, st: &mut State) -> Maps {
    let seq = scope.checkpoint_seq();
    let detail = format!("checkpoint {seq}, which the manifest names, is not in the store: the volume's map is lost and the volume cannot be opened");
    let object = scope.names.checkpoint(seq).to_string();
    let kind = ProblemKind::Missing;
    st.findings
        .add(Severity::Error, kind, object, detail, Reach::VolumeMap);
    let tail: Vec<u64> = listed.range(seq + 1..).map(|(&s, _)| s).collect();
    Maps {
        map: None,
        tail,
        damaged_tail: BTreeSet::new(),
        after_gap: Vec::new(),
        places: Places::default(),
    }
}

/// The scope of a check of `manifest`'s volume, and (a clone with no
/// checkpoint of its own) its parent snapshot's map.
async fn open_scope(
    store: &Store,
    kek: Option<&Key>,
    manifest: Manifest,
    snapshot: Option<&str>,
    quick: bool,
    findings: &mut Findings,
) -> Result<(Scope, Option<ExtentMap>), VolumeError> {
    let uuid = manifest.uuid_bytes().map_err(VolumeError::Invalid)?;
    let data_key = data_key_of(&manifest, kek)?;
    let record =
        match snapshot {
            None => None,
            Some(name) => Some(manifest.snapshot(name).cloned().ok_or_else(|| {
                VolumeError::SnapshotNotFound {
                    volume: manifest.name.clone(),
                    snapshot: name.to_string(),
                }
            })?),
        };
    let names = ObjectNames::new(&manifest.name);
    let for_open = record.is_none() && manifest.checkpoint_seq.is_none();
    let key = data_key.as_ref();
    let (lineage, base_map, unreadable) = match manifest.parent {
        None => (Lineage::default(), None, false),
        Some(_) => match resolve_lineage(store, &manifest, for_open, key).await {
            Ok(i) => (i.lineage, i.base_map.map(|(map, _)| map), false),
            Err(e) => {
                lineage_problem(&manifest, &names, e, findings)?;
                (Lineage::default(), None, true)
            }
        },
    };
    let scope = Scope {
        store: store.clone(),
        names,
        manifest,
        uuid,
        data_key,
        lineage,
        inherited_unreadable: unreadable,
        snapshot: record,
        quick,
    };
    Ok((scope, base_map))
}

/// A clone's parent, or its snapshot, cannot be resolved or read: every
/// range it inherits is unreadable.
fn lineage_problem(
    m: &Manifest,
    names: &ObjectNames,
    e: VolumeError,
    findings: &mut Findings,
) -> Result<(), VolumeError> {
    let detail = match e {
        VolumeError::Invalid(detail) => detail,
        e => match ReadFailure::of(e) {
            ReadFailure::Damaged(detail) => format!("its parent snapshot's map: {detail}"),
            ReadFailure::Gone => "its parent snapshot's map is not in the store".into(),
            ReadFailure::Failed(e) => return Err(e),
        },
    };
    let base = m.parent.as_ref().map_or(0, |p| p.checkpoint_seq);
    let detail = format!(
        "{detail}; the ranges it inherits cannot be read (its parent's segments are not checked)"
    );
    let object = names.manifest().to_string();
    let reach = Reach::Inherited(base);
    findings.add(Severity::Error, ProblemKind::Lineage, object, detail, reach);
    Ok(())
}
