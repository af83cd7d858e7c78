//! A clone's ancestors: which volume each segment number it reads belongs
//! to. A clone of `P@S` starts with the map of snapshot `S` and numbers its
//! own segments from `S + 1`; every segment number up to `S` is `P`'s, or,
//! at or below the snapshot `P` itself was cloned from, an older
//! ancestor's. So a segment number names one object of one volume, and
//! each is read through that volume's reader (its object names, its cache
//! keys: clones of one image share the image's cached blocks).
//!
//! At most `MAX_CLONE_DEPTH` ancestors; each is checked when the chain is
//! resolved (same uuid as recorded, the snapshot still there).

use std::sync::Arc;

use strata_store::{ObjectNames, Store};

use crate::error::VolumeError;
use crate::format::key_wrap::Key;
use crate::format::manifest::{Manifest, SnapshotRecord};
use crate::map::ExtentMap;
use crate::objects::{read_manifest, read_snapshot_map, store_for_prefix};
use crate::read::{SharedCaches, StoredPiece, VolumeReader};

/// Clones of clones may nest this deep.
pub const MAX_CLONE_DEPTH: usize = 16;

/// One volume a clone reads through.
#[derive(Debug, Clone)]
pub(crate) struct Ancestor {
    pub name: String,
    pub uuid: [u8; 16],
    /// Where it lives (another prefix of the bucket, or the same store).
    pub store: Store,
    /// The highest segment number of this volume the clone reads (the
    /// snapshot's checkpoint); the next lower ancestor owns those at or
    /// below its own bound.
    pub bound_seq: u64,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct Lineage {
    /// Oldest first (ascending `bound_seq`).
    ancestors: Vec<Ancestor>,
}

/// What opening a clone needs from its parent: the lineage and, for a
/// clone that has no checkpoint of its own yet, the snapshot's map.
pub(crate) struct Inherited {
    pub lineage: Lineage,
    pub base_map: Option<(ExtentMap, u64)>,
}

impl Lineage {
    /// Segments up to this number are ancestors' (0: not a clone).
    pub fn base_seq(&self) -> u64 {
        self.ancestors.last().map_or(0, |a| a.bound_seq)
    }

    /// The ancestor that owns segment `seq` (`None`: the volume itself).
    pub fn owner_of(&self, seq: u64) -> Option<&Ancestor> {
        self.ancestors.iter().find(|a| seq <= a.bound_seq)
    }

    /// The volume whose snapshot this clone was made from.
    pub fn parent(&self) -> Option<&Ancestor> {
        self.ancestors.last()
    }

    pub fn depth(&self) -> usize {
        self.ancestors.len()
    }

    /// The readers of every ancestor, oldest first.
    pub fn ancestor_readers(
        &self,
        caches: &SharedCaches,
        own: &Arc<VolumeReader>,
    ) -> Vec<Arc<VolumeReader>> {
        self.ancestors
            .iter()
            .map(|a| caches.reader(&a.name, a.uuid, &a.store, own.data_key.clone()))
            .collect()
    }

    /// The reader of the volume that owns segment `seq` (`own` for the
    /// volume's own segments).
    pub fn reader_for(
        &self,
        caches: &SharedCaches,
        own: &Arc<VolumeReader>,
        seq: u64,
    ) -> Arc<VolumeReader> {
        match self.owner_of(seq) {
            // A clone shares its ancestors' data key.
            Some(a) => caches.reader(&a.name, a.uuid, &a.store, own.data_key.clone()),
            None => own.clone(),
        }
    }

    /// Reads stored pieces, each through the reader of the volume that
    /// owns its segment.
    pub async fn read_pieces(
        &self,
        caches: &Arc<SharedCaches>,
        own: &Arc<VolumeReader>,
        pieces: Vec<StoredPiece<'_>>,
    ) -> Result<(), VolumeError> {
        let base = self.base_seq();
        if pieces.iter().all(|p| p.seq > base) {
            return own.read_pieces(caches, pieces).await;
        }
        let mut groups: Vec<Vec<StoredPiece<'_>>> =
            (0..=self.ancestors.len()).map(|_| Vec::new()).collect();
        for p in pieces {
            let i = self
                .ancestors
                .iter()
                .position(|a| p.seq <= a.bound_seq)
                .unwrap_or(self.ancestors.len());
            groups[i].push(p);
        }
        let reads = groups
            .into_iter()
            .enumerate()
            .filter(|(_, g)| !g.is_empty())
            .map(|(i, g)| {
                let reader = match self.ancestors.get(i) {
                    // A clone shares its ancestors' data key.
                    Some(a) => caches.reader(&a.name, a.uuid, &a.store, own.data_key.clone()),
                    None => own.clone(),
                };
                async move { reader.read_pieces(caches, g).await }
            });
        for result in futures::future::join_all(reads).await {
            result?;
        }
        Ok(())
    }
}

/// Resolves the ancestors of the volume `m` describes (none for a volume
/// that is not a clone), and, `for_open`, the parent snapshot's map if the
/// clone has no checkpoint of its own yet (read with `data_key`: a clone
/// shares its ancestors' data key).
pub(crate) async fn resolve_lineage(
    store: &Store,
    m: &Manifest,
    for_open: bool,
    data_key: Option<&Key>,
) -> Result<Inherited, VolumeError> {
    let mut ancestors = Vec::new();
    let mut base_map = None;
    let mut child = m.clone();
    let mut child_store = store.clone();
    while let Some(parent) = child.parent.clone() {
        let pstore = store_for_prefix(&child_store, parent.prefix.as_deref())?;
        if ancestors.len() >= MAX_CLONE_DEPTH {
            return Err(VolumeError::Invalid(format!(
                "volume {:?} is a clone more than {MAX_CLONE_DEPTH} levels deep",
                m.name
            )));
        }
        let pm = read_manifest(&pstore, &parent.volume)
            .await
            .map_err(|e| match e {
                VolumeError::NotFound(_) => VolumeError::Invalid(format!(
                    "volume {:?} is a clone of {}@{}, and volume {:?} is gone",
                    child.name, parent.volume, parent.snapshot, parent.volume
                )),
                e => e,
            })?;
        let record = parent_snapshot(&child, &pm)?;
        let uuid = pm.uuid_bytes().map_err(VolumeError::Invalid)?;
        if for_open && ancestors.is_empty() && m.checkpoint_seq.is_none() {
            let names = ObjectNames::new(&pm.name);
            // A clone shares its parent's data key.
            let map = read_snapshot_map(&pstore, &names, &pm.name, uuid, &record, data_key).await?;
            base_map = Some((map, record.checkpoint_seq));
        }
        ancestors.push(Ancestor {
            name: pm.name.clone(),
            uuid,
            store: pstore.clone(),
            bound_seq: record.checkpoint_seq,
        });
        child = pm;
        child_store = pstore;
    }
    ancestors.reverse();
    Ok(Inherited {
        lineage: Lineage { ancestors },
        base_map,
    })
}

/// The snapshot of `pm` that `child` was cloned from, checked.
fn parent_snapshot(child: &Manifest, pm: &Manifest) -> Result<SnapshotRecord, VolumeError> {
    let Some(parent) = &child.parent else {
        return Err(VolumeError::Invalid(format!(
            "volume {:?} has no parent",
            child.name
        )));
    };
    if pm.uuid != parent.uuid {
        return Err(VolumeError::Invalid(format!(
            "volume {:?} is a clone of {}@{}, but {:?} was deleted and made again since",
            child.name, parent.volume, parent.snapshot, parent.volume
        )));
    }
    match pm.snapshot(&parent.snapshot) {
        Some(s) if s.checkpoint_seq == parent.checkpoint_seq => Ok(s.clone()),
        _ => Err(VolumeError::Invalid(format!(
            "volume {:?} is a clone of snapshot {}@{}, which is gone",
            child.name, parent.volume, parent.snapshot
        ))),
    }
}
