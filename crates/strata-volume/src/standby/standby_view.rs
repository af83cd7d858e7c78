//! What a standby reads: volume V as its holder stored it, followed.
//!
//! The view is built at its first read (a standby's export opens at once;
//! QEMU reads nothing before the switchover): V's latest checkpoint (or, for
//! a clone without one, its parent snapshot's map), then V's stored segments
//! after it in sequence order, as recovery applies them, but read-only (a
//! gap is not "repaired": the holder owns V). Before every read it looks for
//! the segments stored since (`FETCH_BATCH` headers at a time), so a read
//! sees every segment the holder had stored when the read arrived: with the
//! holder in standby mode (every FLUSH uploads, see
//! `volume/standby_mode.rs`) that is every write the holder acknowledged a
//! FLUSH for. Concurrent reads share one look.
//!
//! Garbage collection on the holder rewrites segments into later ones and
//! deletes what nothing references: the view applies the rewrites as they
//! come, and when the next segment is missing but the manifest names a
//! checkpoint at or past it (GC deleted segments it covers) the view
//! starts again from that checkpoint. A read that finds a segment gone
//! (deleted after the view looked) starts the view again and retries once.

use std::sync::Arc;
use std::time::Instant;

use parking_lot::RwLock;
use strata_store::{ObjectNames, Store};

use crate::error::VolumeError;
use crate::format::key_wrap::Key;
use crate::format::manifest::{Manifest, SnapshotRecord};
use crate::format::segment::Entry;
use crate::map::{Allocation, ExtentMap};
use crate::objects::{fetch_segment_header, is_not_found, read_checkpoint, read_manifest};
use crate::read::SharedCaches;
use crate::recovery::apply_entries;
use crate::snapshot::{resolve_lineage, SnapshotView};

/// Most segments applied by one look: a sanity bound far above what a
/// holder stores between two reads.
const MAX_SEGMENTS_PER_LOOK: usize = 65_536;
/// Segment headers fetched at once while catching up (a holder in standby
/// mode stores a small segment per FLUSH: one at a time, a standby 20 ms
/// from the store would never catch up with a busy one).
const FETCH_BATCH: u64 = 8;

/// A followed, read-only view of a volume another host holds.
pub struct StandbyView {
    name: String,
    store: Store,
    names: ObjectNames,
    caches: Arc<SharedCaches>,
    /// The volume's data key (encrypted volumes): fixed for its life.
    key: Option<Arc<Key>>,
    /// `None` until the first read builds it.
    current: RwLock<Option<Followed>>,
    /// The volume's size when the standby opened.
    size_bytes: u64,
    /// One look at the store at a time; a read that arrives while one runs
    /// waits for it and for no other if it started after the read arrived.
    look: tokio::sync::Mutex<()>,
}

struct Followed {
    view: Arc<SnapshotView>,
    /// The first segment not applied.
    next_seq: u64,
    /// When the latest look that completed started.
    looked_at: Option<Instant>,
    size_bytes: u64,
    uuid: [u8; 16],
}

impl std::fmt::Debug for StandbyView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StandbyView({})", self.name)
    }
}

impl StandbyView {
    /// The view of volume `m.name`, built at its first read.
    pub(crate) fn open(
        store: Store,
        m: &Manifest,
        caches: Arc<SharedCaches>,
        key: Option<Arc<Key>>,
    ) -> StandbyView {
        StandbyView {
            name: m.name.clone(),
            names: ObjectNames::new(&m.name),
            store,
            caches,
            key,
            current: RwLock::new(None),
            size_bytes: m.size_bytes,
            look: tokio::sync::Mutex::new(()),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The volume's size when the standby opened.
    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    /// The view's map, built or brought up to date first.
    async fn current_view(&self, arrived: Instant) -> Result<Arc<SnapshotView>, VolumeError> {
        self.look(arrived).await?;
        match self.current.read().as_ref() {
            Some(c) => Ok(c.view.clone()),
            None => Err(VolumeError::Invalid(format!(
                "volume {:?}: the standby's view could not be built",
                self.name
            ))),
        }
    }

    /// Reads `buf.len()` bytes at `offset`, as the holder stored them when
    /// the read arrived.
    pub async fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), VolumeError> {
        let arrived = Instant::now();
        let view = self.current_view(arrived).await?;
        match view.read(offset, buf).await {
            Err(e) if is_not_found(&e) => {
                // Deleted by the holder's GC after the view looked.
                tracing::info!(volume = %self.name, error = %e, "a segment the standby view read is gone; following the volume again from its checkpoint");
                self.restart().await?;
                self.current_view(Instant::now())
                    .await?
                    .read(offset, buf)
                    .await
            }
            other => other,
        }
    }

    /// Allocation of `[offset, offset+len)` in at most `max_extents` runs,
    /// as stored when asked.
    pub async fn block_status(
        &self,
        offset: u64,
        len: u64,
        max_extents: usize,
    ) -> Result<Vec<(u64, Allocation)>, VolumeError> {
        let view = self.current_view(Instant::now()).await?;
        view.block_status(offset, len, max_extents)
    }

    /// Applies the segments stored since the last look, unless a look that
    /// started after `arrived` already did.
    async fn look(&self, arrived: Instant) -> Result<(), VolumeError> {
        let _one = self.look.lock().await;
        let started = Instant::now();
        let followed = self
            .current
            .read()
            .as_ref()
            .map(|c| (c.looked_at, c.next_seq, c.uuid, c.size_bytes));
        let Some((looked_at, next_seq, uuid, size)) = followed else {
            return self.restart_locked(started).await;
        };
        if looked_at.is_some_and(|t| t >= arrived) {
            return Ok(());
        }
        let key = self.key.as_deref();
        let new = stored_after(&self.store, &self.names, next_seq, uuid, size, key).await?;
        if new.is_empty() && self.checkpoint_passed(next_seq).await? {
            tracing::info!(volume = %self.name, next_seq, "segments the standby view had not read were collected; following the volume again from its checkpoint");
            return self.restart_locked(started).await;
        }
        let mut guard = self.current.write();
        let Some(c) = guard.as_mut() else {
            return Ok(());
        };
        if !new.is_empty() {
            let mut map = c.view.map().clone();
            for (seq, entries) in &new {
                apply_entries(&mut map, *seq, entries);
            }
            c.view = c.view.with_map(map);
            c.next_seq = next_seq + new.len() as u64;
        }
        c.looked_at = Some(started);
        Ok(())
    }

    /// Whether the manifest names a checkpoint at or past `next_seq`: the
    /// segments before it may be gone (GC), so following must start again.
    async fn checkpoint_passed(&self, next_seq: u64) -> Result<bool, VolumeError> {
        let m = read_manifest(&self.store, &self.name).await?;
        Ok(m.checkpoint_seq.is_some_and(|c| c >= next_seq))
    }

    async fn restart(&self) -> Result<(), VolumeError> {
        let _one = self.look.lock().await;
        self.restart_locked(Instant::now()).await
    }

    async fn restart_locked(&self, started: Instant) -> Result<(), VolumeError> {
        let m = read_manifest(&self.store, &self.name).await?;
        let key = self.key.clone();
        let mut followed = start(&self.store, &self.names, &m, &self.caches, key).await?;
        followed.looked_at = Some(started);
        *self.current.write() = Some(followed);
        Ok(())
    }
}

/// The view of `m` as stored: its checkpoint's map (or its parent
/// snapshot's), then every stored segment after it.
async fn start(
    store: &Store,
    names: &ObjectNames,
    m: &Manifest,
    caches: &Arc<SharedCaches>,
    key: Option<Arc<Key>>,
) -> Result<Followed, VolumeError> {
    let uuid = m.uuid_bytes().map_err(VolumeError::Invalid)?;
    let inherited = resolve_lineage(store, m, true, key.as_deref()).await?;
    let (mut map, base) = match (m.checkpoint_seq, inherited.base_map) {
        (Some(seq), _) => {
            let (_, map) = read_checkpoint(store, names, m, uuid, seq, key.as_deref()).await?;
            (map, seq)
        }
        (None, Some((map, seq))) => (map, seq),
        (None, None) => (ExtentMap::new(), 0),
    };
    let mut next_seq = base + 1;
    loop {
        let new = stored_after(store, names, next_seq, uuid, m.size_bytes, key.as_deref()).await?;
        if new.is_empty() {
            break;
        }
        for (seq, entries) in &new {
            apply_entries(&mut map, *seq, entries);
        }
        next_seq += new.len() as u64;
    }
    let record = SnapshotRecord {
        name: "standby".to_string(),
        checkpoint_seq: base,
        created_unix_ms: 0,
        size_bytes: m.size_bytes,
        deleting: false,
        delta: None,
    };
    let reader = caches.reader(&m.name, uuid, store, key);
    let view = SnapshotView::new(
        &m.name,
        record,
        map,
        caches.clone(),
        reader,
        inherited.lineage,
    );
    Ok(Followed {
        view: Arc::new(view),
        next_seq,
        looked_at: None,
        size_bytes: m.size_bytes,
        uuid,
    })
}

/// The entries of segments `next_seq`, `next_seq + 1`, ... while stored
/// without a gap (at most `MAX_SEGMENTS_PER_LOOK`), `FETCH_BATCH` at once.
async fn stored_after(
    store: &Store,
    names: &ObjectNames,
    next_seq: u64,
    uuid: [u8; 16],
    size_bytes: u64,
    key: Option<&Key>,
) -> Result<Vec<(u64, Vec<Entry>)>, VolumeError> {
    let mut out = Vec::new();
    let mut seq = next_seq;
    while out.len() < MAX_SEGMENTS_PER_LOOK {
        let batch = (seq..seq + FETCH_BATCH)
            .map(|s| fetch_segment_header(store, names, s, uuid, size_bytes, key));
        for (i, fetched) in futures::future::join_all(batch)
            .await
            .into_iter()
            .enumerate()
        {
            match fetched {
                Ok((_, entries)) => out.push((seq + i as u64, entries)),
                // The first one missing ends the contiguous run (uploads
                // run in parallel: a later one may be stored already).
                Err(e) if is_not_found(&e) => return Ok(out),
                Err(e) => return Err(e),
            }
        }
        seq += FETCH_BATCH;
    }
    Ok(out)
}
