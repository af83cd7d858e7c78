//! Opening a volume: take ownership (`ownership/`), recover its state
//! (`recovery/`), then start its background work: uploads of segments
//! sealed during replay, the age sealer and lease re-claims (`tasks.rs`).

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;

use parking_lot::Mutex;
use strata_store::{ObjectNames, Store};
use tokio::sync::Notify;

use super::hydrate::hydration_mode;
use super::profile::{profile_exists, ProfilePlace, Recording};
use super::Volume;
use crate::at_rest::AtRest;
use crate::config::VolumeConfig;
use crate::error::VolumeError;
use crate::format::manifest::Manifest;
use crate::gc::GcCounters;
use crate::ownership::{take_ownership, take_transferred_ownership, ManifestWriter};
use crate::read::{Hydration, HydrationState, SharedCaches};
use crate::recovery::recover;
use crate::snapshot::resolve_lineage;
use crate::snapshot::Lineage;

impl Volume {
    /// Opens (and recovers) volume `name`; with the lease its holder
    /// handed to this host under `handed_token`, if any (a standby's take).
    pub(crate) async fn open(
        store: Store,
        name: &str,
        config: Arc<VolumeConfig>,
        caches: Arc<SharedCaches>,
        host_writes: Arc<crate::write::host_budget::HostWriteBudget>,
        host: Arc<crate::ownership::HostLiveness>,
        handed_token: Option<&str>,
    ) -> Result<Arc<Volume>, VolumeError> {
        config.validate().map_err(VolumeError::Invalid)?;
        let started = std::time::Instant::now();
        let kek = config.key.clone();
        let check = |m: &Manifest| AtRest::open(m, kek.as_deref());
        let (ownership, manifest, manifest_version, at_rest) = match handed_token {
            Some(token) => {
                take_transferred_ownership(&store, &config, &host, name, token, check).await?
            }
            None => take_ownership(&store, &config, &host, name, check).await?,
        };
        let ownership_ms = started.elapsed().as_millis() as u64;
        let uuid = manifest.uuid_bytes().map_err(VolumeError::Invalid)?;
        let data_key = at_rest.data_key().cloned();
        let inherited = resolve_lineage(&store, &manifest, true, data_key.as_deref()).await?;
        // Before recovery creates it: no journal here means this host did
        // not write the volume (a move, a new host), so its data is cold.
        let journal_was_here = config.journal_path(name, &uuid).exists();
        let mut recovered = recover(
            &store,
            &config,
            name,
            &manifest,
            uuid,
            inherited.base_map,
            data_key.as_deref(),
            ownership.last_opened_here,
        )
        .await?;
        let recovered_ms = started.elapsed().as_millis() as u64;
        let lineage = inherited.lineage;
        // A clone never writes, moves or deletes its ancestors' segments.
        recovered.state.pins.inherit_upto(lineage.base_seq());
        recovered.state.attach_host_budget(host_writes.clone());
        let size_bytes = manifest.size_bytes;
        let qos = manifest.qos.clone().unwrap_or_default();
        qos.validate().map_err(|e| VolumeError::Invalid(format!(
            "volume {name:?}: its manifest's QoS limits are invalid ({e}); set valid ones with `strata volume set-qos {name} SPEC` (or `none`)"
        )))?;
        let (hydrate_mode, hydrate) = hydration_mode(
            config.hydrate.mode,
            store.is_local(),
            caches.disk_enabled(),
            lineage.depth() > 0,
            journal_was_here,
        );
        let (profile_recording, profile) = profiles_at_open(
            &config, &store, &manifest, &lineage, &at_rest, &caches, name,
        )
        .await;
        let hydration_state = if hydrate {
            HydrationState::Scanning
        } else {
            HydrationState::Off
        };
        let vol = Arc::new(Volume {
            name: name.to_string(),
            uuid,
            size_bytes: AtomicU64::new(size_bytes),
            size_watch: tokio::sync::watch::channel(size_bytes).0,
            store,
            names: ObjectNames::new(name),
            upload_slots: Arc::new(tokio::sync::Semaphore::new(config.max_parallel_uploads)),
            config,
            journal: recovered.journal,
            state: Mutex::new(recovered.state),
            space: Notify::new(),
            progress: Notify::new(),
            caches,
            manifest: ManifestWriter::new(name, manifest, manifest_version),
            closed: AtomicBool::new(false),
            host_writes: host_writes.clone(),
            uploads_in_flight: std::sync::atomic::AtomicUsize::new(0),
            ownership,
            segments_uploaded: AtomicU64::new(0),
            zero_write_bytes_elided: AtomicU64::new(0),
            placed_write_bytes: AtomicU64::new(0),
            placed_in_flight: Arc::default(),
            staged_segments_published: AtomicU64::new(0),
            bytes_uploaded: AtomicU64::new(0),
            gc: GcCounters::default(),
            counters: Default::default(),
            gc_wake: Arc::new(Notify::new()),
            gc_quiet: AtomicBool::new(false),
            housekeeping: Arc::new(Notify::new()),
            gc_pass: tokio::sync::Mutex::new(()),
            gc_pending: Mutex::new((0, 0)),
            lineage,
            at_rest,
            tasks_in_flight: AtomicU64::new(0),
            hydration: Arc::new(Hydration::new(hydrate_mode, hydration_state)),
            profile_recording,
            qos: crate::qos::VolumeQos::new(qos),
            standby: Default::default(),
            closed_cleanly: AtomicBool::new(false),
            last_flush_unix_ms: AtomicU64::new(0),
            successor_epoch: AtomicU64::new(0),
            standby_watch: Mutex::new(None),
        });
        // Before any background work: GC must know what snapshots keep.
        vol.pin_snapshots(&vol.manifest.current().await).await?;
        vol.start_replayed_uploads();
        vol.start_housekeeping();
        vol.start_lease_reclaim();
        vol.start_gc();
        vol.start_hydration(profile);
        vol.start_profile_timer();
        tracing::info!(volume = %name, holder = %vol.ownership.holder, epoch = vol.ownership.epoch, replayed_records = recovered.replayed_records, ownership_ms, recovered_ms, elapsed_ms = started.elapsed().as_millis() as u64, "volume open");
        Ok(vol)
    }

    /// Segments sealed during replay could not be uploaded before the volume
    /// existed; start them now.
    fn start_replayed_uploads(self: &Arc<Self>) {
        let sealed: Vec<_> = self.state.lock().sealed.values().cloned().collect();
        for s in sealed {
            self.spawn_tracked(|vol| async move { vol.upload(s, None).await });
        }
    }
}

/// A clone's access profile at open (`profile.rs`): where the snapshot's
/// is, to prefetch, or a recording of this clone's first reads when the
/// snapshot has none. Only where hydration could run (a remote store, a disk
/// cache); an encrypted volume's are sealed with its data key.
async fn profiles_at_open(
    config: &VolumeConfig,
    store: &Store,
    manifest: &Manifest,
    lineage: &Lineage,
    at_rest: &AtRest,
    caches: &SharedCaches,
    name: &str,
) -> (Option<Recording>, Option<ProfilePlace>) {
    let wanted = config.profile_record || config.profile_prefetch;
    let usable = !store.is_local() && caches.disk_enabled();
    let Some(parent) = lineage.parent().filter(|_| wanted && usable) else {
        return (None, None);
    };
    let place = ProfilePlace {
        store: parent.store.clone(),
        names: ObjectNames::new(&parent.name),
        uuid: parent.uuid,
        checkpoint_seq: parent.bound_seq,
        size_bytes: manifest.size_bytes,
        // A clone shares its ancestors' data key.
        data_key: at_rest.data_key().cloned(),
    };
    // Only a HEAD here: the profile itself is read when hydration's turn
    // comes (a bounded number of volumes at once, `hydrate.rs`).
    match profile_exists(name, &place).await {
        Some(true) if config.profile_prefetch => (None, Some(place)),
        Some(false) if config.profile_record => (Some(Recording::new(place)), None),
        _ => (None, None),
    }
}
