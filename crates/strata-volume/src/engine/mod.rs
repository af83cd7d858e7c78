//! The engine: the set of volumes in one store, and their administration.
//!
//! Owns the open volumes of a process (each opened once and shared by all
//! its clients), the caches they share, and create / list / info / delete;
//! snapshots by name are in `snapshots.rs`.

mod clones;
mod control_client;
pub(crate) mod diffs;
mod fsck;
pub(crate) mod handover;
mod handover_outcome;
mod holder_ops;
pub(crate) mod images;
mod snapshots;
pub(crate) mod standby;

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use object_store::{PutMode, PutOptions, PutPayload};
use serde::Serialize;
use strata_store::{validate_volume_name, ObjectNames, Store};
use tokio::sync::OnceCell;

use crate::at_rest::{compression_of, data_key_of, new_volume_at_rest};
use crate::clock::now_ms;
use crate::config::check_volume_size;
use crate::config::VolumeConfig;
use crate::error::VolumeError;
use crate::format::frame::Compression;
use crate::format::key_wrap::Key;
use crate::format::manifest::{
    GcPassRecord, Manifest, ParentRecord, RollbackRecord, SnapshotRecord,
};
use crate::gc::GcPassReport;
use crate::objects::{
    list_clone_markers, list_segments, read_checkpoint, read_manifest, store_error,
    store_for_prefix,
};
use crate::ownership::{live_holder, read_lease, take_ownership, HostLiveness};
use crate::read::{ReadPathStats, SharedCaches};
use crate::volume::{Volume, VolumeStats};
use crate::write::host_budget::HostWriteBudget;

/// The manifest of a new volume (a clone if `parent` is given).
pub(crate) fn new_manifest(name: &str, size_bytes: u64, parent: Option<ParentRecord>) -> Manifest {
    Manifest {
        name: name.to_string(),
        uuid: uuid::Uuid::new_v4().simple().to_string(),
        size_bytes,
        created_unix_ms: now_ms(),
        checkpoint_seq: None,
        epoch: 0,
        pending_deletions: Vec::new(),
        last_gc: None,
        snapshots: Vec::new(),
        last_rollback: None,
        parent,
        compression: None,
        encryption: None,
        qos: None,
    }
}

pub use crate::config::MAX_VOLUME_BYTES;

/// What `volume list` and `volume info` report.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct VolumeInfo {
    pub name: String,
    pub size_bytes: u64,
    pub uuid: String,
    pub created_unix_ms: u64,
    pub checkpoint_seq: Option<u64>,
    pub segments: u64,
    pub stored_bytes: u64,
    /// Bumped by every server that opened the volume for writing.
    pub epoch: u64,
    /// The server holding a live lease on the volume, if any.
    pub served_by: Option<String>,
    /// Bytes of stored segments the extent map points at, and where that
    /// figure comes from ("open volume", or "checkpoint N": exact when the
    /// volume was closed cleanly, older while a server writes to it).
    pub live_bytes: Option<u64>,
    pub live_as_of: String,
    /// Stored segment bytes nothing points at (stored - live).
    pub garbage_bytes: Option<u64>,
    /// Objects waiting for their grace period before deletion.
    pub pending_deletions: u64,
    pub pending_bytes: u64,
    /// The last garbage collection pass that deleted something.
    pub last_gc: Option<GcPassRecord>,
    /// Snapshots, oldest first.
    pub snapshots: Vec<SnapshotRecord>,
    /// The last rollback to a snapshot, if any.
    pub last_rollback: Option<RollbackRecord>,
    /// For a clone: the snapshot it was made from.
    pub parent: Option<ParentRecord>,
    /// How new segments are compressed (`none`, `lz4`, `zstd:LEVEL`).
    pub compression: String,
    /// For an encrypted volume: the fingerprint of the key that opens it.
    pub encryption_key_fingerprint: Option<String>,
    /// Background hydration on the server of this host that serves the
    /// volume (`None`: not served here).
    pub hydration: Option<crate::read::HydrationStats>,
    /// QoS limits from the manifest (`None`: no limit).
    pub qos: Option<crate::qos::QosLimits>,
    /// What the limits held back on the server of this host that serves
    /// the volume (`None`: not served here).
    pub qos_stats: Option<crate::qos::QosStats>,
}

/// What `Engine::stats` reports (the `--stats-file` JSON).
#[derive(Debug, Clone, Serialize)]
pub struct EngineStats {
    pub store: strata_store::StoreStats,
    pub read_path: ReadPathStats,
    pub volumes: std::collections::BTreeMap<String, VolumeStats>,
}

pub struct Engine {
    store: Store,
    config: Arc<VolumeConfig>,
    caches: Arc<SharedCaches>,
    /// Written data not yet in the store, all volumes together
    /// (`--write-buffer-total`).
    host_writes: Arc<HostWriteBudget>,
    /// One cell per volume name, so opening (recovering) one volume does
    /// not hold up clients of another.
    open: parking_lot::Mutex<HashMap<String, Arc<OnceCell<Arc<Volume>>>>>,
    /// Read-only snapshot views in use, by `VOL@SNAP`.
    snapshot_views:
        parking_lot::Mutex<HashMap<String, std::sync::Weak<crate::snapshot::SnapshotView>>>,
    /// This host's liveness, started at the first volume this engine takes
    /// (`ownership/host_liveness.rs`); every lease it holds names it.
    /// Replaced when an admin command's engine stopped it and needs it again.
    host: parking_lot::Mutex<Option<Arc<HostLiveness>>>,
    /// Held while the host is started or stopped (both write the store),
    /// so two opens start one host.
    host_change: tokio::sync::Mutex<()>,
    /// Opens (and deletions) under way: the host must not stop under them.
    host_users: std::sync::atomic::AtomicUsize,
    /// Volumes this engine handed over on request, and when: it does not
    /// take them back for `HANDOVER_HOLD_OFF` (the asker opens them).
    handed_over: parking_lot::Mutex<HashMap<String, std::time::Instant>>,
    /// Volumes handed over whose close still finishes here (disk cache,
    /// journal space): an open of one waits for it.
    finishing: parking_lot::Mutex<HashMap<String, tokio::sync::watch::Receiver<bool>>>,
    /// A server: its host record stays alive while no volume is open.
    serving: std::sync::atomic::AtomicBool,
    /// Standbys in use (`engine/standby.rs`), by volume name.
    standbys: parking_lot::Mutex<HashMap<String, std::sync::Weak<standby::Standby>>>,
    /// Held while a standby is made, so one volume gets one.
    standby_open: tokio::sync::Mutex<()>,
}

/// How long `close_all` waits for background cache work.
const CLOSE_SETTLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

impl Engine {
    pub fn new(store: Store, config: VolumeConfig) -> Result<Engine, VolumeError> {
        config.validate().map_err(VolumeError::Invalid)?;
        Ok(Engine {
            store,
            caches: Arc::new(SharedCaches::new(&config)?),
            host_writes: Arc::new(HostWriteBudget::with_uploads(
                config.write_buffer_total_bytes,
                config.max_parallel_uploads_total,
            )),
            config: Arc::new(config),
            open: parking_lot::Mutex::new(HashMap::new()),
            snapshot_views: parking_lot::Mutex::new(HashMap::new()),
            host: parking_lot::Mutex::new(None),
            host_change: tokio::sync::Mutex::new(()),
            host_users: std::sync::atomic::AtomicUsize::new(0),
            handed_over: parking_lot::Mutex::new(HashMap::new()),
            finishing: parking_lot::Mutex::new(HashMap::new()),
            standbys: parking_lot::Mutex::new(HashMap::new()),
            standby_open: tokio::sync::Mutex::new(()),
            serving: std::sync::atomic::AtomicBool::new(false),
        })
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn config(&self) -> &VolumeConfig {
        &self.config
    }

    pub fn caches(&self) -> &Arc<SharedCaches> {
        &self.caches
    }

    /// Creates an empty volume; fails if the name is taken.
    /// Compression is the engine's (`VolumeConfig::compression`); with the
    /// engine's key set, the volume is encrypted under it.
    pub async fn create_volume(
        &self,
        name: &str,
        size_bytes: u64,
    ) -> Result<Manifest, VolumeError> {
        self.create_volume_with(name, size_bytes, self.config.compression)
            .await
    }

    /// Creates an empty volume compressed with `compression`.
    pub async fn create_volume_with(
        &self,
        name: &str,
        size_bytes: u64,
        compression: Compression,
    ) -> Result<Manifest, VolumeError> {
        let no_limits = crate::qos::QosLimits::default();
        self.create_volume_limited(name, size_bytes, compression, no_limits)
            .await
    }

    /// Creates an empty volume compressed with `compression`, served
    /// within `qos`.
    pub async fn create_volume_limited(
        &self,
        name: &str,
        size_bytes: u64,
        compression: Compression,
        qos: crate::qos::QosLimits,
    ) -> Result<Manifest, VolumeError> {
        validate_volume_name(name).map_err(VolumeError::Invalid)?;
        check_volume_size(size_bytes).map_err(VolumeError::Invalid)?;
        qos.validate().map_err(VolumeError::Invalid)?;
        let mut manifest = new_manifest(name, size_bytes, None);
        manifest.qos = (!qos.is_unlimited()).then_some(qos);
        new_volume_at_rest(&mut manifest, compression, self.config.key.as_deref(), None)?;
        self.create_manifest(&manifest).await?;
        Ok(manifest)
    }

    /// Writes the manifest of a new volume; fails if the name is taken.
    pub(crate) async fn create_manifest(&self, manifest: &Manifest) -> Result<(), VolumeError> {
        let name = manifest.name.as_str();
        let path = ObjectNames::new(name).manifest();
        let opts = PutOptions {
            mode: PutMode::Create,
            ..PutOptions::default()
        };
        let payload = PutPayload::from(Bytes::from(manifest.encode()));
        match self.store.put_opts(&path, payload, opts).await {
            // Durable once acknowledged (`Store::put_opts`).
            Ok(_) => return Ok(()),
            Err(object_store::Error::AlreadyExists { .. }) => {
                // Ours, if a retry followed a write whose reply was lost.
                let existing = read_manifest(&self.store, name).await?;
                if existing.uuid != manifest.uuid {
                    return Err(VolumeError::AlreadyExists(name.to_string()));
                }
            }
            Err(e) => return Err(store_error(&self.store, "create", &path)(e)),
        }
        // An earlier attempt may have stopped before its sync.
        self.store
            .make_durable(&path)
            .await
            .map_err(|source| VolumeError::Io {
                what: format!("sync {path}"),
                source,
            })?;
        Ok(())
    }

    /// Every volume in the store, by name.
    pub async fn list_volumes(&self) -> Result<Vec<VolumeInfo>, VolumeError> {
        let listing = self
            .store
            .object_store()
            .list_with_delimiter(None)
            .await
            .map_err(store_error(
                &self.store,
                "list",
                &object_store::path::Path::from(""),
            ))?;
        let mut out = Vec::new();
        for prefix in listing.common_prefixes {
            let Some(name) = prefix.filename() else {
                continue;
            };
            if validate_volume_name(name).is_err() {
                continue;
            }
            match self.volume_info_with(name, false).await {
                Ok(info) => out.push(info),
                Err(VolumeError::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// What `volume info` shows, live bytes included (reads the checkpoint).
    pub async fn volume_info(&self, name: &str) -> Result<VolumeInfo, VolumeError> {
        self.volume_info_with(name, true).await
    }

    /// `volume_info`, reading live bytes from the checkpoint only when
    /// `with_live` (lists, and callers that know them, skip that read).
    pub async fn volume_info_with(
        &self,
        name: &str,
        with_live: bool,
    ) -> Result<VolumeInfo, VolumeError> {
        validate_volume_name(name).map_err(VolumeError::Invalid)?;
        let m = read_manifest(&self.store, name).await?;
        let names = ObjectNames::new(name);
        let segs = list_segments(&self.store, &names).await?;
        // An unreadable lease is reported, not fatal: info must still work.
        let served_by = match read_lease(&self.store, &names).await {
            Ok(Some((l, _))) => match live_holder(&self.store, &l).await {
                Ok(holder) => holder,
                Err(e) => Some(format!("unknown ({e})")),
            },
            Ok(None) => None,
            Err(e) => Some(format!("unknown ({e})")),
        };
        let stored_bytes: u64 = segs.iter().map(|s| s.1).sum();
        let (live_bytes, live_as_of) = if with_live {
            self.live_bytes(name, &m).await
        } else {
            (None, "not computed for lists".into())
        };
        Ok(VolumeInfo {
            epoch: m.epoch,
            served_by,
            live_bytes,
            live_as_of,
            // Compressed segments hold more than their object bytes: their
            // garbage is known to the server that has them open (its
            // stats), not from sizes alone.
            garbage_bytes: live_bytes
                .filter(|_| stored_bytes == 0 || compression_of(&m).ok() == Some(Compression::None))
                .map(|l| stored_bytes.saturating_sub(l)),
            compression: m.compression.clone().unwrap_or_else(|| "none".into()),
            encryption_key_fingerprint: m.encryption.as_ref().map(|e| e.key_fingerprint.clone()),
            hydration: None,
            qos: m.qos.clone(),
            qos_stats: None,
            pending_deletions: m.pending_deletions.len() as u64,
            pending_bytes: m.pending_deletions.iter().map(|p| p.bytes).sum(),
            last_gc: m.last_gc,
            snapshots: m.snapshots,
            last_rollback: m.last_rollback,
            parent: m.parent,
            name: m.name,
            size_bytes: m.size_bytes,
            uuid: m.uuid,
            created_unix_ms: m.created_unix_ms,
            checkpoint_seq: m.checkpoint_seq,
            segments: segs.len() as u64,
            stored_bytes,
        })
    }

    /// Live bytes of a volume: exact if it is open here, else as of its
    /// checkpoint (`None` if that cannot be read).
    async fn live_bytes(&self, name: &str, m: &Manifest) -> (Option<u64>, String) {
        if let Some(vol) = self.served(name) {
            return (Some(vol.stats().space.live_bytes), "open volume".into());
        }
        let Some(seq) = m.checkpoint_seq else {
            return (Some(0), "no checkpoint yet".into());
        };
        let names = ObjectNames::new(name);
        let Ok(uuid) = m.uuid_bytes() else {
            return (None, "unknown (bad uuid)".into());
        };
        let key = match self.data_key(m) {
            Ok(k) => k,
            Err(_) => return (None, "unknown (encrypted: give its key to see it)".into()),
        };
        match read_checkpoint(&self.store, &names, m, uuid, seq, key.as_ref()).await {
            Ok((_, map)) => (
                Some(map.usage().total_live_bytes()),
                format!("checkpoint {seq}"),
            ),
            Err(e) => (None, format!("unknown ({e})")),
        }
    }

    /// The volume if this engine has it open.
    pub fn served(&self, name: &str) -> Option<Arc<Volume>> {
        self.open.lock().get(name).and_then(|c| c.get().cloned())
    }

    /// Notes that volume `name` is about to be opened (by a task not yet
    /// running): `served_or_opening` then waits for it.
    pub fn will_open(&self, name: &str) {
        self.open.lock().entry(name.to_string()).or_default();
    }

    /// The volume if this engine has it open or is opening it (waits for
    /// the open: a server that opens its volumes in the background answers
    /// for them from its start).
    /// A fenced volume is returned too: what is asked of it fails saying so.
    pub async fn served_or_opening(&self, name: &str) -> Option<Arc<Volume>> {
        if let Some(vol) = self.served(name) {
            return Some(vol);
        }
        if self.open.lock().contains_key(name) {
            return self.open_volume(name).await.ok();
        }
        None
    }

    /// Runs a garbage collection pass on volume `name` (`Volume::gc_now`):
    /// on the open volume if this engine serves it, otherwise it opens the
    /// volume (taking its lease: refused while another server holds it),
    /// runs the pass, and closes it.
    /// Resizes volume `name` (`Volume::resize`); returns the old size.
    pub async fn resize_volume(
        &self,
        name: &str,
        size_bytes: u64,
        allow_shrink: bool,
    ) -> Result<u64, VolumeError> {
        self.with_volume(name, |vol| async move {
            vol.resize(size_bytes, allow_shrink).await
        })
        .await
    }

    /// The data key of volume `m`, unwrapped with this engine's key (`None`
    /// if the volume is not encrypted).
    pub(crate) fn data_key(&self, m: &Manifest) -> Result<Option<Key>, VolumeError> {
        data_key_of(m, self.config.key.as_deref())
    }

    /// Changes the compression of volume `name` (`Volume::set_compression`);
    /// returns the previous setting.
    pub async fn set_volume_compression(
        &self,
        name: &str,
        compression: Compression,
    ) -> Result<Compression, VolumeError> {
        self.with_volume(
            name,
            |vol| async move { vol.set_compression(compression).await },
        )
        .await
    }

    /// Replaces the QoS limits of volume `name` (`Volume::set_qos`);
    /// returns the previous ones.
    pub async fn set_volume_qos(
        &self,
        name: &str,
        limits: crate::qos::QosLimits,
    ) -> Result<crate::qos::QosLimits, VolumeError> {
        limits.validate().map_err(VolumeError::Invalid)?;
        self.with_volume(name, |vol| async move { vol.set_qos(limits).await })
            .await
    }

    /// Wraps encrypted volume `name`'s data key with `new_key`
    /// (`Volume::rekey`); returns the new key's fingerprint.
    pub async fn rekey_volume(&self, name: &str, new_key: &Key) -> Result<String, VolumeError> {
        self.with_volume(name, |vol| async move { vol.rekey(new_key).await })
            .await
    }

    /// Flattens clone `name` (`Volume::flatten`); returns the bytes copied.
    pub async fn flatten_volume(&self, name: &str) -> Result<u64, VolumeError> {
        self.with_volume(name, |vol| async move { vol.flatten().await })
            .await
    }

    pub async fn gc_volume(&self, name: &str, wait: bool) -> Result<GcPassReport, VolumeError> {
        self.with_volume(name, |vol| async move { vol.gc_now(wait).await })
            .await
    }

    /// Runs `op` on volume `name`: the open one if this engine serves it,
    /// otherwise it opens the volume (taking its lease: refused while
    /// another server holds it), runs `op`, and closes it.
    pub(crate) async fn with_volume<T, F, Fut>(&self, name: &str, op: F) -> Result<T, VolumeError>
    where
        F: FnOnce(Arc<Volume>) -> Fut,
        Fut: std::future::Future<Output = Result<T, VolumeError>>,
    {
        validate_volume_name(name).map_err(VolumeError::Invalid)?;
        if let Some(vol) = self.served(name) {
            return op(vol).await;
        }
        let vol = self.open_volume(name).await?;
        let result = op(vol.clone()).await;
        let closed = vol.close().await;
        self.open.lock().remove(name);
        self.stop_host_if_unused().await;
        let out = result?;
        closed?;
        Ok(out)
    }

    /// Closes volume `name` if this engine has it open (`Volume::close`:
    /// every write in the store, the lease released), so another host may
    /// open it at once, and so may this one (unlike `hand_over`, no
    /// hold-off). False if it was not open. The caller makes sure no
    /// client of its own still uses it (a CSI node unstaging it).
    pub async fn close_volume(&self, name: &str) -> Result<bool, VolumeError> {
        validate_volume_name(name).map_err(VolumeError::Invalid)?;
        let Some(vol) = self.served_or_opening(name).await else {
            return Ok(false);
        };
        let closed = vol.close().await;
        self.open.lock().remove(name);
        self.stop_host_if_unused().await;
        closed.map(|()| true)
    }

    /// Deletes a volume and everything it stored; refused while it is open
    /// in this process.
    pub async fn delete_volume(&self, name: &str) -> Result<(), VolumeError> {
        validate_volume_name(name).map_err(VolumeError::Invalid)?;
        let is_open = self.open.lock().get(name).is_some_and(|c| c.initialized());
        if is_open {
            return Err(VolumeError::Invalid(format!(
                "volume {name:?} is being served; stop serving it first"
            )));
        }
        let result = {
            let _user = HostUser::new(&self.host_users);
            self.delete_held(name).await
        };
        // An admin command's host record goes with its last use.
        self.stop_host_if_unused().await;
        result
    }

    /// `delete_volume` once it is not open here.
    async fn delete_held(&self, name: &str) -> Result<(), VolumeError> {
        // Refuse while any server holds the volume; hold it while deleting.
        let host = self.host().await?;
        let (_ownership, manifest, version, ()) =
            take_ownership(&self.store, &self.config, &host, name, |_| Ok(())).await?;
        let uuid = manifest.uuid_bytes().map_err(VolumeError::Invalid)?;
        let names = ObjectNames::new(name);
        self.refuse_if_cloned(&manifest, &version).await?;
        // The manifest goes first: from then on the volume does not exist,
        // whatever happens to the rest.
        self.store
            .delete(&names.manifest())
            .await
            .map_err(store_error(&self.store, "delete", &names.manifest()))?;
        let prefix = names.volume_prefix();
        let objects: Vec<_> = self.store.list_all(&prefix).await.map_err(store_error(
            &self.store,
            "list",
            &prefix,
        ))?;
        for o in objects {
            match self.store.delete(&o.location).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(store_error(&self.store, "delete", &o.location)(e)),
            }
        }
        // Segment files a crash left (`write/staged_segment.rs`): listings
        // skip them.
        let staged = self.store.list_staged(&names.segments_prefix());
        for (_, _, path) in staged.unwrap_or_default() {
            if let Err(e) = strata_store::remove_staged_path(&path) {
                tracing::warn!(file = %path.display(), error = %strata_store::ErrorText(&e), "cannot remove a segment file of the deleted volume");
            }
        }
        if let Some(parent) = &manifest.parent {
            // No longer a clone of anything: the parent snapshot may go.
            let marker = ObjectNames::new(&parent.volume).clone_marker(&parent.snapshot, name);
            let pstore = store_for_prefix(&self.store, parent.prefix.as_deref())?;
            match pstore.delete(&marker).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => {
                    tracing::warn!(marker = %marker, error = %strata_store::ErrorText(&e), "cannot delete this clone's marker under its parent; deleting the parent's snapshot removes it")
                }
            }
        }
        {
            let jpath = self.config.journal_path(name, &uuid);
            match std::fs::remove_file(&jpath) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(source) => {
                    return Err(VolumeError::Io {
                        what: format!("remove journal {}", jpath.display()),
                        source,
                    })
                }
            }
        }
        Ok(())
    }

    /// Refuses to delete a volume that has clones: every snapshot is marked
    /// `deleting` first (no clone can be made of them any more), then the
    /// markers are listed; with live clones the marks are undone.
    async fn refuse_if_cloned(
        &self,
        m: &Manifest,
        version: &object_store::UpdateVersion,
    ) -> Result<(), VolumeError> {
        if m.snapshots.is_empty() {
            return Ok(());
        }
        let names = ObjectNames::new(&m.name);
        let path = names.manifest();
        let mut marked = m.clone();
        for s in &mut marked.snapshots {
            s.deleting = true;
        }
        let payload = PutPayload::from(Bytes::from(marked.encode()));
        let marked_version = self
            .store
            .put_if(&path, payload, Some(version))
            .await
            .map_err(store_error(&self.store, "update", &path))?;
        let markers = list_clone_markers(&self.store, &names.clone_markers_prefix()).await?;
        let live: Vec<&str> = markers
            .iter()
            .filter(|f| f.live)
            .map(|f| f.marker.clone.as_str())
            .collect();
        if live.is_empty() {
            return Ok(());
        }
        let payload = PutPayload::from(Bytes::from(m.encode()));
        let restored = self
            .store
            .put_if(&path, payload, Some(&marked_version))
            .await;
        if let Err(e) = restored {
            tracing::warn!(volume = %m.name, error = %strata_store::ErrorText(&e), "cannot clear the deletion marks of the volume's snapshots");
        }
        Err(VolumeError::Busy(format!(
            "volume {:?} has clones: {}; delete them (or `strata volume flatten` them) first",
            m.name,
            live.join(", ")
        )))
    }

    /// The open volume `name`, opening (recovering) it on first use.
    pub async fn open_volume(&self, name: &str) -> Result<Arc<Volume>, VolumeError> {
        self.open_volume_as(name, OpenAs::Client).await
    }

    /// `open_volume` for a take (a standby's, an explicit one): a volume
    /// this engine handed over a moment ago may be taken back.
    pub(crate) async fn open_volume_to_take(&self, name: &str) -> Result<Arc<Volume>, VolumeError> {
        self.open_volume_as(name, OpenAs::Taker).await
    }

    pub(crate) async fn open_volume_as(
        &self,
        name: &str,
        open_as: OpenAs<'_>,
    ) -> Result<Arc<Volume>, VolumeError> {
        validate_volume_name(name).map_err(VolumeError::Invalid)?;
        let cell = self
            .open
            .lock()
            .entry(name.to_string())
            .or_default()
            .clone();
        let vol = cell
            .get_or_try_init(|| async {
                let handed_token = match open_as {
                    OpenAs::Client => {
                        self.refuse_if_handed_over(name)?;
                        None
                    }
                    // A take may take back what this engine handed over.
                    OpenAs::Taker => {
                        self.handed_over.lock().remove(name);
                        None
                    }
                    OpenAs::Successor(token) => {
                        self.handed_over.lock().remove(name);
                        Some(token)
                    }
                };
                self.wait_for_finishing_close(name).await;
                let _user = HostUser::new(&self.host_users);
                Volume::open(
                    self.store.clone(),
                    name,
                    self.config.clone(),
                    self.caches.clone(),
                    self.host_writes.clone(),
                    self.host().await?,
                    handed_token,
                )
                .await
            })
            .await;
        let vol = match vol {
            Ok(v) => v,
            Err(e) => {
                self.stop_host_if_unused().await;
                return Err(e);
            }
        };
        if let Some(detail) = vol.fenced_detail() {
            return Err(VolumeError::Failed {
                name: name.to_string(),
                detail,
            });
        }
        Ok(vol.clone())
    }

    /// This host's liveness, started on first use (`HostLiveness::start`),
    /// and again if an admin command's engine stopped it meanwhile.
    pub(crate) async fn host(&self) -> Result<Arc<HostLiveness>, VolumeError> {
        let _change = self.host_change.lock().await;
        if let Some(h) = self.host.lock().as_ref().filter(|h| !h.is_stopped()) {
            return Ok(h.clone());
        }
        let socket = self
            .config
            .control_socket
            .as_ref()
            .map(|p| p.display().to_string());
        let started = HostLiveness::start(
            self.store.clone(),
            &self.config.data_dir,
            self.config.lease_ttl_ms,
            socket,
        )
        .await?;
        *self.host.lock() = Some(started.clone());
        Ok(started)
    }

    /// A server keeps its host record alive while it has no volume open
    /// (it may open one at any moment, and answers handover requests).
    pub fn set_serving(&self) {
        self.serving
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// An admin command's engine says its host stopped once nothing is
    /// open or opening: no record is left renewing behind a finished
    /// command.
    async fn stop_host_if_unused(&self) {
        use std::sync::atomic::Ordering;
        if self.serving.load(Ordering::Acquire) {
            return;
        }
        let _change = self.host_change.lock().await;
        let any_open = self.open.lock().values().any(|c| c.initialized());
        if any_open || self.host_users.load(Ordering::Acquire) > 0 {
            return;
        }
        let host = self.host.lock().take();
        if let Some(h) = host {
            h.stop().await;
        }
    }

    /// What this host's liveness looks like (`None`: not started: this
    /// engine holds no volume yet).
    pub fn host_stats(&self) -> Option<crate::ownership::HostStats> {
        self.host.lock().as_ref().map(|h| h.stats())
    }

    /// Counters of the store, the shared caches and every open volume.
    pub fn stats(&self) -> EngineStats {
        let volumes = self
            .open
            .lock()
            .iter()
            .filter_map(|(name, cell)| cell.get().map(|v| (name.clone(), v.stats())))
            .collect();
        EngineStats {
            store: self.store.stats(),
            read_path: self.caches.stats(),
            volumes,
        }
    }

    /// Closes every open volume cleanly.
    pub async fn close_all(&self) -> Result<(), VolumeError> {
        // Opens still under way (a server opens its volumes in the
        // background) finish first, so their leases are released too.
        let opening: Vec<String> = {
            let open = self.open.lock();
            let pending = open.iter().filter(|(_, c)| !c.initialized());
            pending.map(|(n, _)| n.clone()).collect()
        };
        for name in opening {
            let _ = self.open_volume(&name).await;
        }
        let cells: Vec<_> = self.open.lock().drain().map(|(_, c)| c).collect();
        let volumes: Vec<Arc<Volume>> = cells.iter().filter_map(|c| c.get().cloned()).collect();
        let results = futures::future::join_all(volumes.iter().map(|v| v.close())).await;
        // Every lease is released: the host record says this host stopped.
        let host = self.host.lock().take();
        if let Some(host) = host {
            host.stop().await;
        }
        // The disk cache's queue (at most 64 MiB of page-cache writes) is
        // written out, so a clean restart finds all of it; bounded, since a
        // cache may always forget.
        let settled = tokio::time::timeout(CLOSE_SETTLE_TIMEOUT, self.caches.settle()).await;
        if settled.is_err() {
            tracing::warn!("background reads and disk cache writes still running at close; the disk cache may miss their blocks after the restart");
        }
        results.into_iter().collect()
    }
}

/// Counts an open or a deletion under way (`Engine::host_users`) while it
/// lives.
struct HostUser<'a>(&'a std::sync::atomic::AtomicUsize);

impl<'a> HostUser<'a> {
    fn new(users: &'a std::sync::atomic::AtomicUsize) -> Self {
        users.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        HostUser(users)
    }
}

impl Drop for HostUser<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// Who opens a volume (`Engine::open_volume_as`).
#[derive(Debug, Clone, Copy)]
pub(crate) enum OpenAs<'a> {
    /// A client: refused for a while after this engine handed it over.
    Client,
    /// A take (a standby's, an explicit one): may take it back at once.
    Taker,
    /// A standby whose holder handed it the lease under this token
    /// (`ownership/lease_transfer.rs`).
    Successor(&'a str),
}
