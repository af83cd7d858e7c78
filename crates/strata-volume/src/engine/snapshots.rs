//! Snapshots by name, for the command line and the NBD server: on the
//! volume this engine has open, or (create, delete, rollback) by opening
//! the volume here, holding its lease meanwhile, and closing it after.
//! Read-only views (`VOL@SNAP` exports) need no lease and are shared by
//! every connection to the same snapshot.

use std::sync::{Arc, Weak};

use strata_store::{validate_volume_name, ObjectNames};

use super::Engine;
use crate::at_rest::data_key_of;
use crate::error::VolumeError;
use crate::format::access_profile::AccessProfile;
use crate::format::manifest::{validate_snapshot_name, Manifest, RollbackRecord, SnapshotRecord};
use crate::map::ExtentMap;
use crate::objects::{read_manifest, read_profile, read_snapshot_map};
use crate::snapshot::{resolve_lineage, SnapshotView};

impl Engine {
    /// Takes snapshot `name` of `volume` (`Volume::create_snapshot`).
    pub async fn create_snapshot(
        &self,
        volume: &str,
        name: &str,
    ) -> Result<SnapshotRecord, VolumeError> {
        validate_snapshot_name(name).map_err(VolumeError::Invalid)?;
        self.with_volume(volume, |vol| async move { vol.create_snapshot(name).await })
            .await
    }

    /// Deletes snapshot `name` of `volume`.
    pub async fn delete_snapshot(&self, volume: &str, name: &str) -> Result<(), VolumeError> {
        validate_snapshot_name(name).map_err(VolumeError::Invalid)?;
        self.with_volume(volume, |vol| async move { vol.delete_snapshot(name).await })
            .await?;
        self.snapshot_views
            .lock()
            .remove(&format!("{volume}@{name}"));
        Ok(())
    }

    /// Rolls `volume` back to snapshot `name`; refused while this engine
    /// serves the volume (its clients would see data change under them),
    /// and, through the lease, while any other server does.
    pub async fn rollback_snapshot(
        &self,
        volume: &str,
        name: &str,
    ) -> Result<RollbackRecord, VolumeError> {
        validate_snapshot_name(name).map_err(VolumeError::Invalid)?;
        if self.served(volume).is_some() {
            return Err(VolumeError::Busy(format!(
                "volume {volume:?} is being served by this server; stop serving it before a rollback (its clients would see the data change under them)"
            )));
        }
        self.with_volume(
            volume,
            |vol| async move { vol.rollback_to_snapshot(name).await },
        )
        .await
    }

    /// The snapshots of `volume`, oldest first (from its manifest; no lease).
    pub async fn list_snapshots(&self, volume: &str) -> Result<Vec<SnapshotRecord>, VolumeError> {
        validate_volume_name(volume).map_err(VolumeError::Invalid)?;
        Ok(read_manifest(&self.store, volume).await?.snapshots)
    }

    /// The access profile of snapshot `name` of `volume` (`None`: no clone
    /// of it recorded one yet); an error when it does not verify.
    pub async fn snapshot_profile(
        &self,
        volume: &str,
        name: &str,
    ) -> Result<Option<AccessProfile>, VolumeError> {
        validate_volume_name(volume).map_err(VolumeError::Invalid)?;
        validate_snapshot_name(name).map_err(VolumeError::Invalid)?;
        let m = read_manifest(&self.store, volume).await?;
        let record = snapshot_of(&m, volume, name)?;
        let uuid = m.uuid_bytes().map_err(VolumeError::Invalid)?;
        let names = ObjectNames::new(volume);
        let key = self.data_key(&m)?;
        read_profile(
            &self.store,
            &names,
            &uuid,
            record.checkpoint_seq,
            key.as_ref(),
        )
        .await
    }

    /// Snapshot `name` of `volume`, read-only (shared while in use).
    pub async fn open_snapshot(
        &self,
        volume: &str,
        name: &str,
    ) -> Result<Arc<SnapshotView>, VolumeError> {
        validate_volume_name(volume).map_err(VolumeError::Invalid)?;
        validate_snapshot_name(name).map_err(VolumeError::Invalid)?;
        let key = format!("{volume}@{name}");
        if let Some(view) = self.snapshot_views.lock().get(&key).and_then(Weak::upgrade) {
            return Ok(view);
        }
        let m = read_manifest(&self.store, volume).await?;
        let record = snapshot_of(&m, volume, name)?.clone();
        let uuid = m.uuid_bytes().map_err(VolumeError::Invalid)?;
        let names = ObjectNames::new(volume);
        let data_key = self.data_key(&m)?;
        let read = read_snapshot_map(
            &self.store,
            &names,
            volume,
            uuid,
            &record,
            data_key.as_ref(),
        );
        let map = read.await?;
        let view = self.snapshot_view(&m, record, map).await?;
        let mut views = self.snapshot_views.lock();
        views.retain(|_, v| v.strong_count() > 0);
        views.insert(key, Arc::downgrade(&view));
        Ok(view)
    }

    /// A read-only view of snapshot `record` of the volume `m` describes,
    /// through `map` (the snapshot's, or the part of it a diff reads).
    pub(crate) async fn snapshot_view(
        &self,
        m: &Manifest,
        record: SnapshotRecord,
        map: ExtentMap,
    ) -> Result<Arc<SnapshotView>, VolumeError> {
        let uuid = m.uuid_bytes().map_err(VolumeError::Invalid)?;
        let lineage = resolve_lineage(&self.store, m, false, None).await?.lineage;
        let key = data_key_of(m, self.config.key.as_deref())?.map(Arc::new);
        let reader = self.caches.reader(&m.name, uuid, &self.store, key);
        Ok(Arc::new(SnapshotView::new(
            &m.name,
            record,
            map,
            self.caches.clone(),
            reader,
            lineage,
        )))
    }
}

/// Snapshot `name` in `volume`'s manifest `m`, or the error that says so.
fn snapshot_of<'m>(
    m: &'m Manifest,
    volume: &str,
    name: &str,
) -> Result<&'m SnapshotRecord, VolumeError> {
    m.snapshot(name)
        .ok_or_else(|| VolumeError::SnapshotNotFound {
            volume: volume.to_string(),
            snapshot: name.to_string(),
        })
}
