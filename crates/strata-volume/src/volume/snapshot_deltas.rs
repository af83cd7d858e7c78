//! Keeping the chain of snapshot deltas (`snapshot/changed_ranges.rs`)
//! whole as snapshots come and go: a new snapshot stores what changed
//! since the newest one; deleting a snapshot merges its delta into the
//! next one's, or, for the newest, into what changed since.
//!
//! A delta object is written before the manifest write that names it, and
//! deleted after the one that stops naming it: a crash in between leaves
//! an unnamed object, which the orphan sweep deletes (`gc/orphans.rs`).
//! What changed since the newest snapshot is in memory only; opening a
//! volume computes it again from the maps (`pin_snapshots`).

use std::sync::Arc;

use super::Volume;
use crate::error::VolumeError;
use crate::format::manifest::{DeltaRecord, Manifest, SnapshotRecord};
use crate::format::sealed_object::SealedKind;
use crate::format::snapshot_delta::{self, DeltaInfo, DeltaPiece};
use crate::map::ExtentMap;
use crate::objects::read_snapshot_delta;
use crate::snapshot::{overlay, ChangedRanges};

/// What deleting a snapshot does to the chain, worked out before the
/// manifest write.
pub(crate) struct ChainRepair {
    /// The next snapshot's new delta (`None`: cut), if there is a next one.
    next: Option<(String, Option<DeltaRecord>)>,
    /// For the newest: what it changed from the one before (to fold into
    /// what changed since), or that map to compare with when its delta is
    /// missing; `None` with no snapshot left.
    newest: Option<NewestDeleted>,
    /// Delta objects nothing names after the write.
    unnamed: Vec<(u64, u64)>,
}

enum NewestDeleted {
    Delta(u64, Vec<DeltaPiece>),
    Map(u64, Box<ExtentMap>),
    LastOne,
}

impl Volume {
    /// Stores the delta from snapshot checkpoint `from` to `to`.
    pub(crate) async fn store_delta(
        &self,
        to: u64,
        from: u64,
        size_bytes: u64,
        pieces: &[DeltaPiece],
    ) -> Result<DeltaRecord, String> {
        let info = DeltaInfo {
            to_seq: to,
            from_seq: from,
            volume_uuid: self.uuid,
            volume_size_bytes: size_bytes,
        };
        let inner = bytes::Bytes::from(snapshot_delta::encode(&info, pieces));
        let path = self.names.snapshot_delta(to, from);
        let kind = (SealedKind::SnapshotDelta, to);
        let bytes = self.put_map_object(&path, inner, kind).await;
        Ok(DeltaRecord {
            from_checkpoint_seq: from,
            bytes: bytes.map_err(|e| format!("snapshot delta {e}"))?,
        })
    }

    /// The pieces of `record`'s delta if it leads from `previous`; `None`
    /// when it does not, or cannot be read (logged: the chain is cut there
    /// and diffs across it compare whole maps).
    async fn delta_pieces(
        &self,
        record: &SnapshotRecord,
        previous: &SnapshotRecord,
    ) -> Option<Vec<DeltaPiece>> {
        let delta = record.delta_from(previous.checkpoint_seq)?;
        let key = self.at_rest.data_key().map(|k| &**k);
        let read = read_snapshot_delta(&self.store, &self.names, self.uuid, record, delta, key);
        match read.await {
            Ok(pieces) => Some(pieces),
            Err(e) => {
                tracing::warn!(volume = %self.name, snapshot = %record.name, error = %strata_store::ErrorText(&e), "snapshot delta unreadable; diffs across it compare whole snapshots");
                None
            }
        }
    }

    /// Works out (and stores the merged delta for) the deletion of
    /// snapshot `name` from `m`.
    pub(crate) async fn repair_chain(
        &self,
        m: &Manifest,
        name: &str,
    ) -> Result<ChainRepair, VolumeError> {
        let i = m.snapshots.iter().position(|s| s.name == name);
        let Some(i) = i else {
            return Err(VolumeError::SnapshotNotFound {
                volume: self.name.clone(),
                snapshot: name.to_string(),
            });
        };
        let record = &m.snapshots[i];
        let prev = i.checked_sub(1).map(|p| &m.snapshots[p]);
        let next = m.snapshots.get(i + 1);
        let mut unnamed: Vec<(u64, u64)> = [record, next.unwrap_or(record)]
            .iter()
            .filter_map(|s| s.delta.map(|d| (s.checkpoint_seq, d.from_checkpoint_seq)))
            .collect();
        unnamed.dedup();
        let Some(next) = next else {
            let newest = match prev {
                None => NewestDeleted::LastOne,
                Some(p) => match self.delta_pieces(record, p).await {
                    Some(pieces) => NewestDeleted::Delta(p.checkpoint_seq, pieces),
                    None => {
                        let map = self.snapshot_map(p).await?;
                        NewestDeleted::Map(p.checkpoint_seq, Box::new(map))
                    }
                },
            };
            return Ok(ChainRepair {
                next: None,
                newest: Some(newest),
                unnamed,
            });
        };
        let mut merged = None;
        if let Some(p) = prev {
            let older = self.delta_pieces(record, p).await;
            let newer = self.delta_pieces(next, record).await;
            if let (Some(older), Some(newer)) = (older, newer) {
                let pieces = overlay(&older, &newer);
                let (to, from) = (next.checkpoint_seq, p.checkpoint_seq);
                let stored = self.store_delta(to, from, next.size_bytes, &pieces).await;
                merged = Some(stored.map_err(|detail| VolumeError::NotDone {
                    name: self.name.clone(),
                    detail: format!("snapshot {name:?} not deleted: {detail}"),
                })?);
            }
        }
        Ok(ChainRepair {
            next: Some((next.name.clone(), merged)),
            newest: None,
            unnamed,
        })
    }
}

impl ChainRepair {
    /// Applies the repair to the manifest being written.
    pub(crate) fn apply(&self, m: &mut Manifest) {
        if let Some((name, delta)) = &self.next {
            if let Some(s) = m.snapshots.iter_mut().find(|s| &s.name == name) {
                s.delta = *delta;
            }
        }
    }

    /// After the write: what changed since the newest snapshot follows
    /// the new newest; delta objects nothing names go.
    pub(crate) async fn finish(self, vol: &Arc<Volume>, deleted_seq: u64) {
        if let Some(newest) = self.newest {
            let mut st = vol.state.lock();
            let size = vol.size_bytes();
            let current = st.changed.take().filter(|c| c.since_seq() == deleted_seq);
            st.changed = match (newest, current) {
                (NewestDeleted::LastOne, _) => None,
                (NewestDeleted::Delta(prev, pieces), Some(mut c)) => {
                    c.absorb_older(prev, pieces.iter().map(|p| (p.start, p.len, p.before)));
                    Some(c)
                }
                (NewestDeleted::Map(prev, map), _) => {
                    Some(ChangedRanges::between(prev, &map, &st.map, size))
                }
                (NewestDeleted::Delta(..), None) => {
                    // Not tracked against the deleted one (a bug): say so;
                    // the next snapshot has no delta, diffs compare maps.
                    tracing::error!(volume = %vol.name, "BUG: changes were not tracked against the newest snapshot");
                    None
                }
            };
        }
        for (to, from) in self.unnamed {
            let path = vol.names.snapshot_delta(to, from);
            match vol.store.delete(&path).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => {
                    tracing::warn!(volume = %vol.name, object = %path, error = %strata_store::ErrorText(&e), "cannot delete a snapshot delta nothing names; the orphan sweep will")
                }
            }
        }
    }
}
