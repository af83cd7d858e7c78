//! Snapshots of a volume: create, delete, roll back (`snapshot/` holds the
//! rules, `docs/design/snapshots.md` the safety argument).
//!
//! Each is one conditional manifest write, so after a crash it happened
//! completely or not at all. Creating and rolling back seal the open
//! segment (an empty one too: history needs a sequence number of its own)
//! and name that seal point's checkpoint in the same write that records the
//! snapshot or the rollback. Each holds the volume's GC lock throughout: no
//! garbage collection pass, deletion or orphan sweep runs meanwhile.

use std::sync::Arc;

use super::counters::VolumeCounters;
use super::{MapEdit, Volume};
use crate::clock::now_ms;
use crate::crash_point::crash_point;
use crate::error::VolumeError;
use crate::format::manifest::{
    validate_snapshot_name, Manifest, ObjectKind, PendingDeletion, RollbackRecord, SnapshotRecord,
    MAX_PENDING_DELETIONS, MAX_SNAPSHOTS,
};
use crate::map::{ExtentMap, SegmentUsage};
use crate::objects::{list_clone_markers, read_snapshot_map};
use crate::snapshot::ChangedRanges;
use crate::write::state::State;

impl Volume {
    /// Takes snapshot `name` of every write acknowledged before the call:
    /// no data is copied (one seal, one checkpoint, one manifest write).
    pub async fn create_snapshot(
        self: &Arc<Self>,
        name: &str,
    ) -> Result<SnapshotRecord, VolumeError> {
        validate_snapshot_name(name).map_err(VolumeError::Invalid)?;
        self.check_failed()?;
        let _pass = self.gc_pass.lock().await;
        let current = self.manifest.current().await;
        if current.snapshot(name).is_some() {
            return Err(VolumeError::Invalid(format!(
                "volume {:?} already has a snapshot named {name:?}",
                self.name
            )));
        }
        if current.snapshots.len() >= MAX_SNAPSHOTS {
            return Err(VolumeError::Invalid(format!(
                "volume {:?} has {MAX_SNAPSHOTS} snapshots, the most it may have; delete one first",
                self.name
            )));
        }
        let previous = current.snapshots.last().map(|s| s.checkpoint_seq);
        let size = self.size_bytes();
        let (job, usage, delta, replaced) = {
            let mut st = self.state.lock();
            self.check_failed_locked(&st)?;
            let job = self.seal_for_history_locked(&mut st, None, size);
            // The map as of the seal point: what the snapshot keeps.
            let usage = st.map.usage().clone();
            st.pins.pin(&usage);
            // What changed since the newest snapshot, as of the seal point.
            let delta = match (&st.changed, previous) {
                (Some(c), Some(p)) if c.since_seq() == p => Some((p, c.pieces(&st.map))),
                _ => None,
            };
            let replaced = st.changed.replace(ChangedRanges::new(job.seq));
            (job, usage, delta, replaced)
        };
        let seq = job.seq;
        let undo = |vol: &Self| {
            let mut st = vol.state.lock();
            st.pins.unpin(&usage);
            if let (Some(c), Some(old)) = (&mut st.changed, &replaced) {
                c.absorb_older(old.since_seq(), old.runs());
            }
            if replaced.is_none() {
                st.changed = None;
            }
        };
        let delta = match delta {
            Some((from, pieces)) => match self.store_delta(seq, from, size, &pieces).await {
                Ok(d) => Some(d),
                Err(detail) => {
                    undo(self);
                    return Err(self.failed(format!("snapshot {name:?} not taken: {detail}")));
                }
            },
            None => None,
        };
        let record = SnapshotRecord {
            name: name.to_string(),
            checkpoint_seq: seq,
            created_unix_ms: now_ms(),
            size_bytes: size,
            deleting: false,
            delta,
        };
        let add = {
            let record = record.clone();
            move |m: &mut Manifest| {
                // Runs just before the manifest write that names it.
                crash_point("snapshot.before_manifest");
                m.snapshots.push(record.clone())
            }
        };
        if let Err(detail) = self.store_checkpoint_with(job, Some(&add)).await {
            undo(self);
            return Err(self.failed(format!("snapshot {name:?} not taken: {detail}")));
        }
        crash_point("snapshot.after_create");
        tracing::info!(volume = %self.name, snapshot = name, checkpoint = record.checkpoint_seq, "snapshot taken");
        VolumeCounters::add(&self.counters.snapshots_created);
        Ok(record)
    }

    /// Deletes snapshot `name`: its checkpoint becomes a pending deletion,
    /// and the segments only it kept become garbage for the next GC pass.
    pub async fn delete_snapshot(self: &Arc<Self>, name: &str) -> Result<(), VolumeError> {
        validate_snapshot_name(name).map_err(VolumeError::Invalid)?;
        self.check_failed()?;
        let _pass = self.gc_pass.lock().await;
        let current = self.manifest.current().await;
        let record = self.snapshot_record(&current, name)?;
        // What it kept, read back from its checkpoint (pins hold counts only).
        let usage = self.snapshot_map(&record).await?.usage().clone();
        self.refuse_if_cloned(name).await?;
        let repair = self
            .repair_chain(&self.manifest.current().await, name)
            .await?;
        let now = now_ms();
        let change = |m: &Manifest| {
            let mut next = m.clone();
            repair.apply(&mut next);
            next.snapshots.retain(|s| s.name != name);
            let seq = record.checkpoint_seq;
            let named = m.checkpoint_seq == Some(seq);
            let full = next.pending_deletions.len() >= MAX_PENDING_DELETIONS;
            // The named checkpoint goes when the next one replaces it; with
            // the list full, the orphan sweep finds it.
            if seq != 0 && !named && !full {
                next.pending_deletions.push(PendingDeletion {
                    kind: ObjectKind::Checkpoint,
                    seq,
                    since_unix_ms: now,
                    bytes: 0,
                });
            }
            Some(next)
        };
        let update = self.manifest.update(&self.store, &self.ownership, change);
        if let Err(refused) = update.await {
            return Err(self.failed(format!(
                "snapshot {name:?} not deleted: {}",
                self.refused(refused)
            )));
        }
        crash_point("snapshot.after_delete");
        self.state.lock().pins.unpin(&usage);
        repair.finish(self, record.checkpoint_seq).await;
        self.delete_profile(record.checkpoint_seq).await;
        self.gc_wake.notify_one();
        tracing::info!(volume = %self.name, snapshot = name, "snapshot deleted");
        VolumeCounters::add(&self.counters.snapshots_deleted);
        Ok(())
    }

    /// Deletes the access profile of the snapshot at `checkpoint_seq`, if
    /// any: a hint, so a failure is a log line (the object stays, named by
    /// a checkpoint number never reused; `volume delete` removes it).
    async fn delete_profile(&self, checkpoint_seq: u64) {
        let path = self.names.profile(checkpoint_seq);
        match self.store.delete(&path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => {
                tracing::warn!(volume = %self.name, object = %path, error = %strata_store::ErrorText(&e), "the deleted snapshot's access profile was not deleted");
            }
        }
    }

    /// Makes the volume what it was when snapshot `name` was taken; every
    /// write since is dropped (the snapshot stays). For a volume no client
    /// uses: the caller makes sure nobody serves it.
    pub async fn rollback_to_snapshot(
        self: &Arc<Self>,
        name: &str,
    ) -> Result<RollbackRecord, VolumeError> {
        validate_snapshot_name(name).map_err(VolumeError::Invalid)?;
        self.check_failed()?;
        let _pass = self.gc_pass.lock().await;
        let current = self.manifest.current().await;
        let record = self.snapshot_record(&current, name)?;
        if record.size_bytes != self.size_bytes() {
            return Err(VolumeError::Invalid(format!(
                "snapshot {name:?} is {} bytes and volume {:?} {} bytes: resize the volume to the snapshot's size first",
                record.size_bytes,
                self.name,
                self.size_bytes()
            )));
        }
        let map = self.snapshot_map(&record).await?;
        let changed = self.changed_after_rollback(&current, &record, &map).await?;
        let job = {
            let mut st = self.state.lock();
            self.check_failed_locked(&st)?;
            check_kept(&st, map.usage(), self.lineage.base_seq(), &self.name, name)?;
            let size = self.size_bytes();
            let replace: MapEdit = Box::new(move |m: &mut ExtentMap| *m = map);
            let job = self.seal_for_history_locked(&mut st, Some(replace), size);
            st.changed = Some(changed);
            job
        };
        let rollback = RollbackRecord {
            snapshot: name.to_string(),
            checkpoint_seq: job.seq,
            unix_ms: now_ms(),
        };
        let add = {
            let rollback = rollback.clone();
            move |m: &mut Manifest| {
                crash_point("rollback.before_manifest");
                m.last_rollback = Some(rollback.clone())
            }
        };
        let stored = self.store_checkpoint_with(job, Some(&add)).await;
        let named = self.manifest.current().await.checkpoint_seq == Some(rollback.checkpoint_seq);
        match stored {
            Ok(()) if named => {}
            Ok(()) => {
                let detail =
                    "a newer checkpoint was named first (was the volume written meanwhile?)";
                return Err(self.failed(format!("rollback to {name:?} not done: {detail}")));
            }
            Err(detail) => {
                return Err(self.failed(format!("rollback to {name:?} not done: {detail}")));
            }
        }
        crash_point("rollback.after_manifest");
        tracing::info!(volume = %self.name, snapshot = name, checkpoint = rollback.checkpoint_seq, "rolled back");
        VolumeCounters::add(&self.counters.rollbacks);
        Ok(rollback)
    }

    /// Refuses the deletion of snapshot `name` while clones of it live.
    /// The snapshot is marked `deleting` first: a clone is made by writing
    /// its marker, then its manifest, then checking that the snapshot is
    /// not being deleted; so a clone either sees the mark and gives up, or
    /// its marker and manifest are in the store before this lists them.
    /// Markers of clones that do not exist are deleted. The mark stays on
    /// success (the deletion's write drops the snapshot).
    async fn refuse_if_cloned(&self, name: &str) -> Result<(), VolumeError> {
        self.set_deleting(name, true).await?;
        crash_point("snapshot.marked_deleting");
        let prefix = self.names.snapshot_clones_prefix(name);
        let markers = match list_clone_markers(&self.store, &prefix).await {
            Ok(m) => m,
            Err(e) => {
                let _ = self.set_deleting(name, false).await;
                return Err(e);
            }
        };
        let live: Vec<&str> = markers
            .iter()
            .filter(|m| m.live)
            .map(|m| m.marker.clone.as_str())
            .collect();
        if !live.is_empty() {
            self.set_deleting(name, false).await?;
            return Err(VolumeError::Busy(format!(
                "snapshot {}@{name} has clones: {}; delete them (or `strata volume flatten` them) first",
                self.name,
                live.join(", ")
            )));
        }
        for m in markers {
            match self.store.delete(&m.path).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => {
                    tracing::warn!(volume = %self.name, marker = %m.path, error = %strata_store::ErrorText(&e), "cannot delete the marker of a clone that does not exist")
                }
            }
        }
        Ok(())
    }

    async fn set_deleting(&self, name: &str, deleting: bool) -> Result<(), VolumeError> {
        let change = |m: &Manifest| {
            let mut next = m.clone();
            let s = next.snapshots.iter_mut().find(|s| s.name == name)?;
            if s.deleting == deleting {
                return None;
            }
            s.deleting = deleting;
            Some(next)
        };
        match self
            .manifest
            .update(&self.store, &self.ownership, change)
            .await
        {
            Ok(_) => Ok(()),
            Err(refused) => Err(self.failed(format!(
                "snapshot {name:?} not deleted: {}",
                self.refused(refused)
            ))),
        }
    }

    fn snapshot_record(&self, m: &Manifest, name: &str) -> Result<SnapshotRecord, VolumeError> {
        m.snapshot(name)
            .cloned()
            .ok_or_else(|| VolumeError::SnapshotNotFound {
                volume: self.name.clone(),
                snapshot: name.to_string(),
            })
    }

    /// The map of a snapshot of this volume, from its checkpoint.
    pub(crate) async fn snapshot_map(
        &self,
        record: &SnapshotRecord,
    ) -> Result<ExtentMap, VolumeError> {
        let key = self.at_rest.data_key().map(|k| &**k);
        read_snapshot_map(&self.store, &self.names, &self.name, self.uuid, record, key).await
    }

    /// Pins the segments of every snapshot in `m` (at open), and works out
    /// what changed since the newest one.
    pub(crate) async fn pin_snapshots(&self, m: &Manifest) -> Result<(), VolumeError> {
        let mut newest = None;
        for record in &m.snapshots {
            let map = self.snapshot_map(record).await?;
            self.state.lock().pins.pin(map.usage());
            newest = Some((record, map));
        }
        let mut st = self.state.lock();
        st.changed = newest.map(|(record, map)| {
            let size = record.size_bytes.max(self.size_bytes());
            ChangedRanges::between(record.checkpoint_seq, &map, &st.map, size)
        });
        Ok(())
    }

    /// What differs between the newest snapshot and `map`, the map of
    /// snapshot `target` a rollback is about to restore.
    async fn changed_after_rollback(
        &self,
        m: &Manifest,
        target: &SnapshotRecord,
        map: &ExtentMap,
    ) -> Result<ChangedRanges, VolumeError> {
        let newest = m.snapshots.last().unwrap_or(target);
        if newest.name == target.name {
            return Ok(ChangedRanges::new(target.checkpoint_seq));
        }
        let newest_map = self.snapshot_map(newest).await?;
        let size = newest.size_bytes.max(target.size_bytes);
        Ok(ChangedRanges::between(
            newest.checkpoint_seq,
            &newest_map,
            map,
            size,
        ))
    }

    fn check_failed_locked(&self, st: &State) -> Result<(), VolumeError> {
        match &st.failed {
            Some(detail) => Err(VolumeError::Failed {
                name: self.name.clone(),
                detail: detail.clone(),
            }),
            None => Ok(()),
        }
    }

    pub(crate) fn failed(&self, detail: String) -> VolumeError {
        VolumeError::NotDone {
            name: self.name.clone(),
            detail,
        }
    }
}

/// Every segment a snapshot's map points into must still be stored (pins
/// kept them; anything else is a bug or damage, reported, not rolled to);
/// a clone's ancestors' segments (up to `base`) are their volumes'.
fn check_kept(
    st: &State,
    usage: &SegmentUsage,
    base: u64,
    volume: &str,
    snapshot: &str,
) -> Result<(), VolumeError> {
    for (seq, _) in usage.iter() {
        if seq > base && !st.stored.contains_key(&seq) && !st.sealed.contains_key(&seq) {
            return Err(VolumeError::Corrupt {
                path: format!("{volume}@{snapshot}"),
                detail: format!(
                    "the snapshot's map points into segment {seq}, which is not in the store"
                ),
            });
        }
    }
    Ok(())
}
