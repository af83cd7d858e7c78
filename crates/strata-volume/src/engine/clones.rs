//! Clones by name: a new volume whose map starts as a snapshot's, sharing
//! its segments (nothing is copied; `snapshot/lineage.rs` says how it
//! reads them).
//!
//! Made in three steps, so that a concurrent deletion of the snapshot and
//! the clone never both succeed (`Volume::delete_snapshot` marks the
//! snapshot `deleting`, then lists markers):
//! 1. the clone's marker under the parent (`<parent>/clones/<snap>/<clone>`);
//! 2. the clone's manifest, naming the parent snapshot;
//! 3. the parent snapshot read again: gone or being deleted undoes 2 and 1.
//!
//! A crash after 1 leaves a marker without a clone (a deletion removes
//! it); after 2, a clone that opens only while its snapshot exists.

use strata_store::{validate_volume_name, ObjectNames};

use super::{new_manifest, Engine};
use crate::at_rest::{compression_of, data_key_of, new_volume_at_rest};
use crate::clock::now_ms;
use crate::crash_point::crash_point;
use crate::error::VolumeError;
use crate::format::clone_marker::CloneMarker;
use crate::format::manifest::{validate_snapshot_name, Manifest, ParentRecord, SnapshotRecord};
use crate::objects::{read_manifest, store_error, store_for_prefix};
use crate::snapshot::{resolve_lineage, MAX_CLONE_DEPTH};

impl Engine {
    /// Makes volume `name`, a writable clone of snapshot `parent@snapshot`,
    /// in constant time. `parent_prefix`: the parent's prefix in this
    /// store's bucket, when it is under another one (S3).
    pub async fn create_clone(
        &self,
        parent_prefix: Option<&str>,
        parent: &str,
        snapshot: &str,
        name: &str,
    ) -> Result<Manifest, VolumeError> {
        validate_volume_name(parent).map_err(VolumeError::Invalid)?;
        validate_snapshot_name(snapshot).map_err(VolumeError::Invalid)?;
        validate_volume_name(name).map_err(VolumeError::Invalid)?;
        let own_prefix = self.store.bucket_prefix().map(str::to_string);
        let parent_prefix = parent_prefix
            .map(|p| p.trim_matches('/').to_string())
            .filter(|p| Some(p) != own_prefix.as_ref());
        let pstore = store_for_prefix(&self.store, parent_prefix.as_deref())?;
        let pm = read_manifest(&pstore, parent).await?;
        let record = clonable(&pm, snapshot)?;
        let depth = resolve_lineage(&pstore, &pm, false, None)
            .await?
            .lineage
            .depth()
            + 1;
        if depth > MAX_CLONE_DEPTH {
            return Err(VolumeError::Invalid(format!(
                "{parent}@{snapshot} is a snapshot of a clone {} levels deep; clones may nest {MAX_CLONE_DEPTH} deep (`strata volume flatten {parent}` first)",
                depth - 1
            )));
        }
        match read_manifest(&self.store, name).await {
            Ok(_) => return Err(VolumeError::AlreadyExists(name.to_string())),
            Err(VolumeError::NotFound(_)) => {}
            Err(e) => return Err(e),
        }
        let parent_record = ParentRecord {
            volume: parent.to_string(),
            uuid: pm.uuid.clone(),
            snapshot: snapshot.to_string(),
            checkpoint_seq: record.checkpoint_seq,
            prefix: parent_prefix.clone(),
        };
        let mut manifest = new_manifest(name, record.size_bytes, Some(parent_record));
        // The clone reads the parent's segments: it shares the parent's
        // data key (so the parent's key must be given) and compression.
        let kek = self.config.key.as_deref();
        let parent_key = data_key_of(&pm, kek)?;
        let compression = compression_of(&pm)?;
        let clone_kek = parent_key.as_ref().and(kek);
        new_volume_at_rest(&mut manifest, compression, clone_kek, parent_key.as_ref())?;
        let marker_path = ObjectNames::new(parent).clone_marker(snapshot, name);
        let marker = CloneMarker {
            clone: name.to_string(),
            clone_uuid: manifest.uuid.clone(),
            created_unix_ms: now_ms(),
            // Where a deletion of the snapshot finds the clone.
            clone_prefix: parent_prefix.as_ref().and(own_prefix.clone()),
        };
        let put = pstore.put_opts(
            &marker_path,
            bytes::Bytes::from(marker.encode()).into(),
            object_store::PutMode::Create.into(),
        );
        match put.await {
            Ok(_) => {}
            Err(object_store::Error::AlreadyExists { .. }) => {
                return Err(VolumeError::AlreadyExists(name.to_string()))
            }
            Err(e) => return Err(store_error(&pstore, "create", &marker_path)(e)),
        }
        crash_point("clone.after_marker");
        if let Err(e) = self.create_manifest(&manifest).await {
            drop_marker(&pstore, &marker_path).await;
            return Err(e);
        }
        crash_point("clone.after_manifest");
        let still = read_manifest(&pstore, parent).await;
        let check = still.and_then(|pm| {
            let now = clonable(&pm, snapshot)?;
            if now.checkpoint_seq != record.checkpoint_seq
                || pm.uuid != manifest_parent_uuid(&manifest)
            {
                return Err(VolumeError::Invalid(format!(
                    "snapshot {parent}@{snapshot} was deleted while the clone was made"
                )));
            }
            Ok(())
        });
        if let Err(e) = check {
            let path = ObjectNames::new(name).manifest();
            let _ = self.store.delete(&path).await;
            drop_marker(&pstore, &marker_path).await;
            return Err(e);
        }
        tracing::info!(clone = name, parent, snapshot, "clone made");
        Ok(manifest)
    }
}

/// Deletes a clone marker (a missing one counts as deleted).
async fn drop_marker(store: &strata_store::Store, path: &object_store::path::Path) {
    match store.delete(path).await {
        Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
        Err(e) => {
            tracing::warn!(marker = %path, error = %strata_store::ErrorText(&e), "cannot delete a clone marker; a later snapshot deletion removes it")
        }
    }
}

fn manifest_parent_uuid(m: &Manifest) -> String {
    m.parent
        .as_ref()
        .map(|p| p.uuid.clone())
        .unwrap_or_default()
}

/// Snapshot `snapshot` of `pm`, if a clone may be made of it now.
fn clonable(pm: &Manifest, snapshot: &str) -> Result<SnapshotRecord, VolumeError> {
    let record = pm
        .snapshot(snapshot)
        .ok_or_else(|| VolumeError::SnapshotNotFound {
            volume: pm.name.clone(),
            snapshot: snapshot.to_string(),
        })?;
    if record.deleting {
        return Err(VolumeError::Invalid(format!(
            "snapshot {}@{snapshot} is being deleted (or a deletion was interrupted: `strata snapshot delete {}@{snapshot}` finishes it)",
            pm.name, pm.name
        )));
    }
    Ok(record.clone())
}
