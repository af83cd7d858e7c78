//! Opening a volume for writing: the local lock, the lease, then a new
//! epoch in the manifest (If-Match), in that order (see `mod.rs`).

use bytes::Bytes;
use object_store::{PutPayload, UpdateVersion};
use strata_store::{ObjectNames, Store};

use std::sync::Arc;

use super::host_liveness::HostLiveness;
use super::lease::{acquire, read_lease};
use super::lease_transfer::check_transferred;
use super::local_lock::lock_locally;
use super::right_to_write::Ownership;
use crate::config::VolumeConfig;
use crate::error::VolumeError;
use crate::format::manifest::Manifest;
use crate::objects::{read_manifest_versioned, store_error};

/// Takes the local lock, the store lease (held through `host`) and a new
/// epoch of volume `name` (see `lease.rs`). Returns the manifest as written
/// with the new epoch.
pub(crate) async fn take_ownership<T>(
    store: &Store,
    config: &VolumeConfig,
    host: &Arc<HostLiveness>,
    name: &str,
    check: impl FnOnce(&Manifest) -> Result<T, VolumeError>,
) -> Result<(Ownership, Manifest, UpdateVersion, T), VolumeError> {
    let (mut manifest, mut version) = read_manifest_versioned(store, name).await?;
    // Before anything changes (the lease, the epoch): a volume this server
    // cannot open (say, without its key) is left as it was.
    let checked = check(&manifest)?;
    let uuid = manifest.uuid_bytes().map_err(VolumeError::Invalid)?;
    create_journal_dir(config)?;
    let lock = lock_locally(&config.lock_path(name, &uuid), name)?;
    let names = ObjectNames::new(name);
    let epoch = manifest.epoch + 1;
    let held = acquire(store, &names, host, epoch, name).await?;
    let path = names.manifest();
    loop {
        if manifest.epoch >= epoch {
            return Err(VolumeError::Busy(format!(
                "volume {name:?} was opened by another server (epoch {}) while this one was opening it",
                manifest.epoch
            )));
        }
        manifest.epoch = epoch;
        let payload = PutPayload::from(Bytes::from(manifest.encode()));
        match store.put_if(&path, payload, Some(&version)).await {
            Ok(v) => {
                version = v;
                break;
            }
            Err(object_store::Error::Precondition { .. }) => {
                // Changed since we read it: maybe a lost reply of our own
                // write, maybe a late write of the previous holder.
                (manifest, version) = read_manifest_versioned(store, name).await?;
                if manifest.epoch == epoch {
                    break;
                }
            }
            Err(e) => return Err(store_error(store, "write", &path)(e)),
        }
    }
    let ownership = Ownership::new(host.clone(), lock, held);
    Ok((ownership, manifest, version, checked))
}

/// Opens volume `name` with the lease its holder handed to this host
/// under `token` (`lease_transfer.rs`): reads the manifest and the lease
/// at once, and takes the local lock; the holder wrote the new epoch into
/// the manifest before it wrote the lease. `Busy` if the lease or the
/// epoch is not what the handover promised (the caller then takes the
/// volume the ordinary way).
pub(crate) async fn take_transferred_ownership<T>(
    store: &Store,
    config: &VolumeConfig,
    host: &Arc<HostLiveness>,
    name: &str,
    token: &str,
    check: impl FnOnce(&Manifest) -> Result<T, VolumeError>,
) -> Result<(Ownership, Manifest, UpdateVersion, T), VolumeError> {
    let names = ObjectNames::new(name);
    let (manifest, lease) = tokio::join!(
        read_manifest_versioned(store, name),
        read_lease(store, &names)
    );
    let (manifest, version) = manifest?;
    let held = check_transferred(lease?, host, token, manifest.epoch).map_err(|why| {
        VolumeError::Busy(format!(
            "volume {name:?} was not handed to this server as promised: {why}"
        ))
    })?;
    let checked = check(&manifest)?;
    let uuid = manifest.uuid_bytes().map_err(VolumeError::Invalid)?;
    create_journal_dir(config)?;
    let lock = lock_locally(&config.lock_path(name, &uuid), name)?;
    Ok((
        Ownership::new(host.clone(), lock, held),
        manifest,
        version,
        checked,
    ))
}

/// `<data-dir>/journals`, made durable in its parent when it is new: a
/// journal's FLUSHed records are only as durable as the names that lead to
/// it (the journal's own directory is synced when it is created).
fn create_journal_dir(config: &VolumeConfig) -> Result<(), VolumeError> {
    let dir = config.journal_dir();
    if dir.is_dir() {
        return Ok(());
    }
    let io = |what: &str, p: &std::path::Path| {
        let what = format!("{what} {}", p.display());
        move |source| VolumeError::Io { what, source }
    };
    std::fs::create_dir_all(&dir).map_err(io("create journal directory", &dir))?;
    if let Some(parent) = dir.parent() {
        std::fs::File::open(parent)
            .and_then(|d| d.sync_all())
            .map_err(io("sync directory", parent))?;
    }
    Ok(())
}
