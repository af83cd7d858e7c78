//! A volume: the type the rest of the program sees, and the sequencing of
//! the engine's pieces for one volume.
//!
//! `Volume` holds one volume's write-side state (`write::state::State`
//! behind one lock: extent map, open and sealed segments), its journal, its
//! right to write (`ownership/`), its manifest writer, and a handle on the
//! server's read caches (`read/`). The lower folders each do one job and
//! know nothing of `Volume`; the files here put them in order:
//!
//! - `open.rs`: take ownership, recover (`recovery/`), start the tasks;
//! - `write.rs`: WRITE / TRIM / WRITE_ZEROES / FLUSH: journal and open
//!   segment under the lock, then wait outside it; sealing;
//! - `read.rs`: map lookup under the lock, in-memory data copied, stored
//!   pieces handed to the read path; block status;
//! - `upload.rs`: a sealed segment into the store, then durable;
//! - `staged.rs`: bulk writes straight into the open segment's file on
//!   the embedded store, its syncs for FLUSH, its publication at upload;
//! - `checkpoint.rs`: checkpoints and the manifest that names them;
//! - `tasks.rs`: lease re-claims and the age sealer;
//! - `gc.rs`: garbage collection passes (`gc/` holds the steps);
//! - `hydrate.rs`: stored data fetched into the disk cache in the
//!   background (`read/hydration.rs` fetches), a profile's ranges first;
//! - `profile.rs`: access profiles of clones: recorded, stored, loaded;
//! - `snapshot.rs`: snapshots: create, delete, roll back (`snapshot/`
//!   holds the rules);
//! - `snapshot_deltas.rs`: the chain of deltas from each snapshot to the
//!   next, kept whole as snapshots come and go;
//! - `resize.rs`: growing and shrinking, served or not;
//! - `flatten.rs`: a clone's inherited data copied in, the parent dropped;
//! - `standby_mode.rs`: FLUSH uploads while another host stands by;
//! - `close.rs`: the clean close.
//!
//! Those files only add methods to `Volume`; none refers to another by path.

mod at_rest;
mod checkpoint;
mod close;
mod counters;
mod flatten;
mod gc;
mod hydrate;
mod live_blocks;
mod open;
mod profile;
mod qos;
mod read;
mod reader_follow;
mod resize;
mod snapshot;
mod snapshot_deltas;
mod staged;
mod standby_mode;
mod tasks;
mod upload;
mod write;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use strata_store::{ObjectNames, Store};
use tokio::sync::Notify;

use crate::at_rest::AtRest;
use crate::config::VolumeConfig;
use crate::error::VolumeError;
use crate::gc::{GcCounters, GcStats, Unreferenced};
pub use crate::map::Allocation;
use crate::ownership::{LeaseStats, ManifestWriter, Ownership, WriteRefused};
use crate::read::{CacheStats, Hydration, HydrationStats, SharedCaches};
use crate::snapshot::Lineage;
use crate::write::journal::Journal;
use crate::write::state::{SpaceUsage, State};
use counters::VolumeCounters;
pub use counters::{FlushSealStats, SnapshotStats, WriteWaitStats};

/// Counters a volume exports.
#[derive(Debug, Clone, serde::Serialize)]
pub struct VolumeStats {
    pub extents: u64,
    pub mapped_data_bytes: u64,
    pub open_segment_seq: u64,
    pub durable_seq: u64,
    pub buffered_bytes: u64,
    pub segments_uploaded: u64,
    pub bytes_uploaded: u64,
    /// Bytes of WRITEs that were all zeros, recorded as holes instead.
    pub zero_write_bytes_elided: u64,
    /// Bytes of WRITEs that went straight into their segment's file, the
    /// journal recording where (`write/staged_segment.rs`).
    pub placed_write_bytes: u64,
    /// Segments published from their staged file (no second write of
    /// their data).
    pub staged_segments_published: u64,
    /// Ranged GETs of this volume's segment data (reads and read-ahead).
    pub store_reads: u64,
    pub store_read_bytes: u64,
    /// The server's RAM chunk cache (shared by all volumes); every tier is
    /// in `SharedCaches::stats`.
    pub chunk_cache: CacheStats,
    /// Segment objects in the store, how much of them is live, and the
    /// garbage GC can reclaim.
    pub space: SpaceUsage,
    /// Garbage collection since the volume was opened.
    pub gc: GcStats,
    /// Segments the volume's snapshots keep from garbage collection.
    pub snapshot_pinned_segments: u64,
    /// Sealed segments not yet in the store, and their journal bytes (the
    /// write buffer holds these and the open segment).
    pub upload_pending_segments: u64,
    pub upload_pending_bytes: u64,
    pub write_buffer_budget_bytes: u64,
    /// The journal's ring: bytes not yet safe in the store, and its size.
    pub journal_used_bytes: u64,
    pub journal_ring_bytes: u64,
    /// Writes that waited for room, by what they waited for.
    pub write_waits: Vec<WriteWaitStats>,
    /// FLUSHes that made their bulk data durable as segments.
    pub flush_seals: FlushSealStats,
    pub lease: LeaseStats,
    pub snapshots: SnapshotStats,
    /// Background hydration: how much of the volume is local.
    pub hydration: HydrationStats,
    /// QoS limits and what they held back.
    pub qos: crate::qos::QosStats,
}

/// A change of the whole map at a seal point (a rollback replaces it, a
/// shrink cuts it).
pub(crate) type MapEdit = Box<dyn FnOnce(&mut crate::map::ExtentMap) + Send>;

/// A checkpoint taken at a seal point, on its way to the store.
pub(crate) struct CheckpointJob {
    pub seq: u64,
    pub bytes: bytes::Bytes,
    /// What it leaves unreferenced (pending deletions once it is named).
    pub unreferenced: Unreferenced,
}

pub struct Volume {
    pub(crate) name: String,
    pub(crate) uuid: [u8; 16],
    /// What clients may address; changed only by a resize, under the lock.
    pub(crate) size_bytes: AtomicU64,
    /// Follows `size_bytes` for frontends that tell their guests of a
    /// resize (vhost-user-blk's configuration change).
    pub(crate) size_watch: tokio::sync::watch::Sender<u64>,
    pub(crate) store: Store,
    pub(crate) names: ObjectNames,
    pub(crate) config: Arc<VolumeConfig>,
    pub(crate) journal: Journal,
    pub(crate) state: Mutex<State>,
    /// Woken when buffer or journal space frees up, or the volume fails.
    pub(crate) space: Notify,
    /// Woken when `durable_seq` or `checkpoint_done_seq` moves.
    pub(crate) progress: Notify,
    pub(crate) caches: Arc<SharedCaches>,
    pub(crate) upload_slots: Arc<tokio::sync::Semaphore>,
    /// The manifest as we last wrote it; every write is conditional on its
    /// version (`ownership/manifest_writer.rs`).
    pub(crate) manifest: ManifestWriter,
    pub(crate) closed: AtomicBool,
    /// The server's budget for written data, and its pool of recycled
    /// segment buffers (fresh memory costs page faults: measured here,
    /// first-touch pages cost 10-20x a reused page) (`write/host_budget.rs`).
    pub(crate) host_writes: Arc<crate::write::host_budget::HostWriteBudget>,
    /// Its uploads in flight, as the server's upload slots count them.
    pub(crate) uploads_in_flight: std::sync::atomic::AtomicUsize,
    /// The right to write: local lock, lease, epoch (`ownership/`).
    pub(crate) ownership: Ownership,
    pub(crate) segments_uploaded: AtomicU64,
    pub(crate) zero_write_bytes_elided: AtomicU64,
    pub(crate) placed_write_bytes: AtomicU64,
    /// Placed writes whose bytes are still being written
    /// (`write/staged_segment.rs`).
    pub(crate) placed_in_flight: Arc<crate::write::staged_segment::PlacedInFlight>,
    pub(crate) staged_segments_published: AtomicU64,
    pub(crate) bytes_uploaded: AtomicU64,
    pub(crate) gc: GcCounters,
    /// Back-pressure and snapshot counters (`counters.rs`).
    pub(crate) counters: VolumeCounters,
    /// Wakes the background garbage collector (an explicit request).
    pub(crate) gc_wake: Arc<Notify>,
    /// The collector found nothing to do and waits for `gc_wake` only.
    pub(crate) gc_quiet: AtomicBool,
    /// Wakes housekeeping (`tasks.rs`): a write into an empty open
    /// segment, new data from GC, a close.
    pub(crate) housekeeping: Arc<Notify>,
    /// One garbage collection pass at a time.
    pub(crate) gc_pass: tokio::sync::Mutex<()>,
    /// Pending deletions (count, bytes) as of the last manifest we wrote.
    pub(crate) gc_pending: parking_lot::Mutex<(u64, u64)>,
    /// For a clone: the volumes it reads through (`snapshot/lineage.rs`).
    pub(crate) lineage: Lineage,
    /// Compression and encryption of what it stores (`at_rest/`).
    pub(crate) at_rest: AtRest,
    /// Upload and checkpoint tasks still running (`spawn_tracked`): a close
    /// waits for them, so nothing holds the volume (and the caches, whose
    /// disk file stays locked) after it returns.
    pub(crate) tasks_in_flight: AtomicU64,
    /// Background hydration's progress (`hydrate.rs`).
    pub(crate) hydration: Arc<Hydration>,
    /// A clone's first reads being recorded (`profile.rs`).
    pub(crate) profile_recording: Option<profile::Recording>,
    /// The limits its clients are served within (`qos/`), from its
    /// manifest.
    pub(crate) qos: crate::qos::VolumeQos,
    /// Another host standing by to take the volume (live migration).
    pub(crate) standby: crate::write::standby_state::StandbyState,
    /// Set once `close` stored everything and released the lease: a FLUSH
    /// after it has nothing left to make durable.
    pub(crate) closed_cleanly: AtomicBool,
    /// Wall clock (ms) of the last FLUSH answered: a handover logs it (the
    /// storage part of a live migration's downtime starts there).
    pub(crate) last_flush_unix_ms: AtomicU64,
    /// Non-zero while a close hands the lease to a successor: the epoch
    /// the final checkpoint's manifest write gives the successor
    /// (`close.rs`).
    pub(crate) successor_epoch: AtomicU64,
    /// While a standby exists: its host looks for requests through the
    /// store often (`ownership/request_watch.rs`).
    pub(crate) standby_watch: Mutex<Option<crate::ownership::RequestWatch>>,
}

impl std::fmt::Debug for Volume {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Volume({})", self.name)
    }
}

impl Volume {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn size_bytes(&self) -> u64 {
        self.size_bytes.load(Ordering::Acquire)
    }

    /// The volume's size, changed by each resize.
    pub fn watch_size(&self) -> tokio::sync::watch::Receiver<u64> {
        self.size_watch.subscribe()
    }

    pub fn uuid(&self) -> [u8; 16] {
        self.uuid
    }

    /// This volume's read state in the shared caches.
    pub(crate) fn reader(&self) -> Arc<crate::read::VolumeReader> {
        let key = self.at_rest.data_key().cloned();
        self.caches.reader(&self.name, self.uuid, &self.store, key)
    }

    pub(crate) fn check_range(&self, offset: u64, len: u64) -> Result<(), VolumeError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size_bytes() => Ok(()),
            _ => Err(VolumeError::OutOfRange {
                offset,
                len,
                size: self.size_bytes(),
            }),
        }
    }

    /// Stops serving the volume: another server took it over. Nothing
    /// more is written (journal, segments, manifest) and reads fail too,
    /// since the data may have changed elsewhere.
    pub(crate) fn fence(&self, detail: String) {
        let detail = format!(
            "fenced: {detail}; this server stopped serving the volume (reconnect to the server that holds it now)"
        );
        tracing::error!(volume = %self.name, epoch = self.ownership.epoch, %detail, "volume fenced");
        self.ownership.fence(detail.clone());
        self.state.lock().failed.get_or_insert(detail);
        self.space.notify_waiters();
        self.progress.notify_waiters();
    }

    /// The reason a write needing ownership was refused; fences the volume
    /// first if the store showed a takeover.
    pub(crate) fn refused(&self, refused: WriteRefused) -> String {
        match refused {
            WriteRefused::Fenced(detail) => detail,
            WriteRefused::TakenOver(detail) => {
                self.fence(detail.clone());
                detail
            }
        }
    }

    /// Why the volume was fenced (taken over by another server), if it was.
    pub fn fenced_detail(&self) -> Option<String> {
        self.ownership.fenced()
    }

    pub(crate) fn check_failed(&self) -> Result<(), VolumeError> {
        if let Some(detail) = &self.state.lock().failed {
            return Err(VolumeError::Failed {
                name: self.name.clone(),
                detail: detail.clone(),
            });
        }
        Ok(())
    }

    pub fn stats(&self) -> VolumeStats {
        let reader = self.reader();
        let (journal_used_bytes, journal_ring_bytes) = self.journal.usage_bytes();
        let st = self.state.lock();
        let sealed_bytes = st.buffered_cost_bytes.saturating_sub(st.open.cost_bytes);
        VolumeStats {
            extents: st.map.len() as u64,
            // O(segments), not O(extents): the lock is held.
            mapped_data_bytes: st.map.usage().total_live_bytes(),
            open_segment_seq: st.open.seq,
            durable_seq: st.durable_seq,
            buffered_bytes: st.buffered_cost_bytes,
            segments_uploaded: self.segments_uploaded.load(Ordering::Relaxed),
            zero_write_bytes_elided: self.zero_write_bytes_elided.load(Ordering::Relaxed),
            placed_write_bytes: self.placed_write_bytes.load(Ordering::Relaxed),
            staged_segments_published: self.staged_segments_published.load(Ordering::Relaxed),
            bytes_uploaded: self.bytes_uploaded.load(Ordering::Relaxed),
            store_reads: reader.gets.load(Ordering::Relaxed),
            store_read_bytes: reader.get_bytes.load(Ordering::Relaxed),
            chunk_cache: self.caches.chunk_stats(),
            space: st.space_usage(),
            gc: {
                let (n, bytes) = *self.gc_pending.lock();
                self.gc.snapshot(n, bytes)
            },
            snapshot_pinned_segments: st.pins.len() as u64,
            upload_pending_segments: st.sealed.len() as u64,
            upload_pending_bytes: sealed_bytes,
            write_buffer_budget_bytes: self.config.write_buffer_bytes,
            journal_used_bytes,
            journal_ring_bytes,
            write_waits: self.counters.write_waits(),
            flush_seals: self.counters.flush_seals(),
            lease: self.ownership.stats(),
            snapshots: self.counters.snapshots(self.manifest.snapshot_count()),
            hydration: self.hydration.stats(),
            qos: self.qos.stats(),
        }
    }

    /// Checks the space accounting against a recomputation from the extent
    /// map (O(extents)): live bytes per segment as kept equal those
    /// recomputed, and every segment the map points into is in memory or
    /// stored (GC deleted none the map needs). For tests and checks.
    pub fn verify_accounting(&self) -> Result<(), String> {
        let st = self.state.lock();
        let recomputed = st.map.recompute_usage();
        if *st.map.usage() != recomputed {
            return Err(format!(
                "live bytes per segment kept {:?}, recomputed {:?}",
                st.map.usage(),
                recomputed
            ));
        }
        for (seq, live) in recomputed.iter() {
            let here = seq == st.open.seq
                || st.sealed.contains_key(&seq)
                || st.stored.contains_key(&seq)
                || seq <= self.lineage.base_seq();
            if !here {
                return Err(format!("the map points at {live} bytes of segment {seq}, which is neither in memory nor stored"));
            }
        }
        Ok(())
    }

    /// Sequence numbers of the segments the volume counts as stored.
    pub fn stored_segments(&self) -> Vec<u64> {
        self.state.lock().stored.keys().copied().collect()
    }

    /// Waits until `pred` holds for the state (checked on every progress).
    /// Spawns `task` (an upload or a checkpoint) counted in
    /// `tasks_in_flight` until it ends.
    pub(crate) fn spawn_tracked<F>(self: &Arc<Self>, task: impl FnOnce(Arc<Self>) -> F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        self.tasks_in_flight.fetch_add(1, Ordering::AcqRel);
        let guard = TaskGuard(self.clone());
        let fut = task(self.clone());
        tokio::spawn(async move {
            fut.await;
            drop(guard);
        });
    }

    pub(crate) async fn wait_until(&self, pred: impl Fn(&State) -> bool) {
        loop {
            let notified = self.progress.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if pred(&self.state.lock()) {
                return;
            }
            notified.await;
        }
    }
}

/// Counts a tracked task as ended when dropped (also if it panicked).
struct TaskGuard(Arc<Volume>);

impl Drop for TaskGuard {
    fn drop(&mut self) {
        self.0.tasks_in_flight.fetch_sub(1, Ordering::AcqRel);
        self.0.progress.notify_waiters();
    }
}
