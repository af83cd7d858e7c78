//! A volume: the engine's write path, read path and their shared state.
//!
//! `Volume` owns one volume's extent map, open segment, sealed segments
//! waiting for upload, and journal. A write is appended to the journal and
//! the open segment under one lock (so journal order is map order), then
//! waits, outside the lock, for the journal writer to have it in the file.
//! Reads look the map up under the same lock, copy what is in memory, and
//! fetch the rest through the read path's tiers (`read_path.rs`) after
//! releasing it.
//! Uploads and checkpoints run in `uploader.rs`, recovery in `recovery.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use strata_store::{ObjectNames, Store};
use tokio::sync::Notify;

use crate::cache::CacheStats;
use crate::config::{Durability, VolumeConfig};
use crate::error::VolumeError;
use crate::extent_map::{ExtentMap, Target};
use crate::journal::{record_bytes, Journal, RecordKind};
use crate::manifest::Manifest;
use crate::read_path::{SharedCaches, StoredPiece};
use crate::segment::{EntryKind, JournalSpan, OpenSegment, SealedSegment};

/// Segment buffers kept for reuse.
const BUFFER_POOL_MAX: usize = 2;

/// Allocation state of a range (for NBD block status).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allocation {
    Data,
    Zero,
    Hole,
}

/// Mutable state behind the volume lock.
pub(crate) struct State {
    pub map: ExtentMap,
    pub open: OpenSegment,
    /// Sealed segments still in memory: uploading, or uploaded but not yet
    /// contiguous with `durable_seq`.
    pub sealed: BTreeMap<u64, Arc<SealedSegment>>,
    pub uploaded: BTreeSet<u64>,
    /// Journal bytes of everything in memory (open + sealed).
    pub buffered_cost_bytes: u64,
    /// Every segment up to this one is in the store.
    pub durable_seq: u64,
    pub segments_since_checkpoint: u64,
    /// Journal span of the newest sealed segment (or of the checkpoint or
    /// segment recovery ended with).
    pub last_sealed_span: JournalSpan,
    /// Highest checkpoint requested / stored.
    pub checkpoint_requested_seq: u64,
    pub checkpoint_done_seq: u64,
    pub failed: Option<String>,
}

impl State {
    /// Seals the open segment into `sealed` and opens the next one in
    /// `buffer` (the write path and journal replay share this).
    pub(crate) fn seal_open(&mut self, buffer: Vec<u8>) -> Arc<SealedSegment> {
        let next = OpenSegment::new(self.open.seq + 1, buffer, self.open.span.journal_id);
        let sealed = Arc::new(std::mem::replace(&mut self.open, next).seal());
        self.sealed.insert(sealed.seq, sealed.clone());
        self.last_sealed_span = sealed.span;
        self.segments_since_checkpoint += 1;
        sealed
    }
}

/// Counters a volume exports.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct VolumeStats {
    pub extents: u64,
    pub mapped_data_bytes: u64,
    pub open_segment_seq: u64,
    pub durable_seq: u64,
    pub buffered_bytes: u64,
    pub segments_uploaded: u64,
    pub bytes_uploaded: u64,
    /// Ranged GETs of this volume's segment data (reads and read-ahead).
    pub store_reads: u64,
    pub store_read_bytes: u64,
    /// The server's RAM chunk cache (shared by all volumes); every tier is
    /// in `SharedCaches::stats`.
    pub chunk_cache: CacheStats,
}

pub struct Volume {
    pub(crate) name: String,
    pub(crate) uuid: [u8; 16],
    pub(crate) size_bytes: u64,
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
    /// The manifest as we last wrote it, and its version in the store (every
    /// write is conditional on it: see `lease.rs`).
    pub(crate) manifest: tokio::sync::Mutex<(Manifest, object_store::UpdateVersion)>,
    pub(crate) closed: AtomicBool,
    /// Recycled segment buffers: fresh memory costs page faults (measured
    /// here: first-touch pages cost 10-20x a reused page).
    pub(crate) buffer_pool: Mutex<Vec<Vec<u8>>>,
    /// The right to write: local lock, lease, epoch (see `lease.rs`).
    pub(crate) ownership: crate::lease::Ownership,
    pub(crate) segments_uploaded: AtomicU64,
    pub(crate) bytes_uploaded: AtomicU64,
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
        self.size_bytes
    }

    pub fn uuid(&self) -> [u8; 16] {
        self.uuid
    }

    fn check_range(&self, offset: u64, len: u64) -> Result<(), VolumeError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size_bytes => Ok(()),
            _ => Err(VolumeError::OutOfRange {
                offset,
                len,
                size: self.size_bytes,
            }),
        }
    }

    /// Writes `data` at `offset`. Returns once the write survives a crash of
    /// this process; with `fua`, once it survives loss of power.
    pub async fn write(
        self: &Arc<Self>,
        offset: u64,
        data: &[u8],
        fua: bool,
    ) -> Result<(), VolumeError> {
        if data.len() as u64 > self.config.max_write_bytes {
            return Err(VolumeError::Invalid(format!(
                "write of {} bytes exceeds the maximum of {}",
                data.len(),
                self.config.max_write_bytes
            )));
        }
        self.log_op(RecordKind::Write, offset, data.len() as u64, data, fua)
            .await
    }

    /// Unmaps a range: it reads as zeros and costs no storage.
    pub async fn trim(
        self: &Arc<Self>,
        offset: u64,
        len: u64,
        fua: bool,
    ) -> Result<(), VolumeError> {
        self.log_op(RecordKind::Unmap, offset, len, &[], fua).await
    }

    /// Makes a range read as zeros; with `keep_allocated` it stays allocated
    /// (NBD's NO_HOLE), otherwise it is unmapped like a trim.
    pub async fn write_zeroes(
        self: &Arc<Self>,
        offset: u64,
        len: u64,
        keep_allocated: bool,
        fua: bool,
    ) -> Result<(), VolumeError> {
        let kind = if keep_allocated {
            RecordKind::Zero
        } else {
            RecordKind::Unmap
        };
        self.log_op(kind, offset, len, &[], fua).await
    }

    /// Makes every write completed before this call durable: in the local
    /// journal (survives loss of power), or with `Durability::Remote` in the
    /// store (survives loss of the host).
    pub async fn flush(self: &Arc<Self>) -> Result<(), VolumeError> {
        self.check_failed()?;
        match self.config.durability {
            Durability::Local => {
                let jseq = self.journal.last_appended_jseq();
                self.journal.sync(jseq).await?;
            }
            Durability::Remote => self.flush_to_store().await?,
        }
        Ok(())
    }

    /// Seals what is open and waits until every segment up to it is stored.
    async fn flush_to_store(self: &Arc<Self>) -> Result<(), VolumeError> {
        let target_seq = {
            let mut st = self.state.lock();
            self.seal_locked(&mut st, false);
            st.open.seq - 1
        };
        self.wait_until(|st| st.durable_seq >= target_seq || st.failed.is_some())
            .await;
        self.check_failed()
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

    /// Why the volume was fenced (taken over by another server), if it was.
    pub fn fenced_detail(&self) -> Option<String> {
        self.ownership.fenced()
    }

    fn check_failed(&self) -> Result<(), VolumeError> {
        if let Some(detail) = &self.state.lock().failed {
            return Err(VolumeError::Failed {
                name: self.name.clone(),
                detail: detail.clone(),
            });
        }
        Ok(())
    }

    async fn log_op(
        self: &Arc<Self>,
        kind: RecordKind,
        offset: u64,
        len: u64,
        data: &[u8],
        fua: bool,
    ) -> Result<(), VolumeError> {
        self.check_range(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        if self.closed.load(Ordering::Acquire) {
            return Err(VolumeError::Closed(self.name.clone()));
        }
        let jseq = loop {
            let notified = self.space.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(jseq) = self.try_log_op(kind, offset, len, data)? {
                break jseq;
            }
            notified.await;
        };
        match (fua, self.config.durability) {
            (false, _) => self.journal.wait_written(jseq).await?,
            (true, Durability::Local) => self.journal.sync(jseq).await?,
            (true, Durability::Remote) => {
                self.journal.wait_written(jseq).await?;
                self.flush_to_store().await?;
            }
        }
        Ok(())
    }

    /// Appends to journal and open segment if the budgets allow; `None` means
    /// wait for space.
    fn try_log_op(
        self: &Arc<Self>,
        kind: RecordKind,
        offset: u64,
        len: u64,
        data: &[u8],
    ) -> Result<Option<u64>, VolumeError> {
        let cost = record_bytes(data.len());
        let mut st = self.state.lock();
        if st.failed.is_none() {
            // A journal that cannot write fails the volume for writes at once
            // (its records would otherwise queue until the ring is full).
            st.failed = self
                .journal
                .failure_detail()
                .map(|d| format!("journal write failed: {d}"));
        }
        if let Some(detail) = &st.failed {
            return Err(VolumeError::Failed {
                name: self.name.clone(),
                detail: detail.clone(),
            });
        }
        if st.buffered_cost_bytes > 0
            && st.buffered_cost_bytes + cost > self.config.write_buffer_bytes
        {
            return Ok(None);
        }
        if !self.ownership.is_valid() {
            // The lease may have expired: another server may own the volume
            // now. Wait for a renewal (or fencing) before acknowledging.
            return Ok(None);
        }
        let Some((jseq, end_lpos)) = self.journal.try_append(kind, offset, len, data) else {
            return Ok(None);
        };
        apply_op(&mut st, kind, offset, len, data, cost, jseq, end_lpos);
        if st.open.cost_bytes >= self.config.segment_bytes {
            self.seal_locked(&mut st, false);
        }
        Ok(Some(jseq))
    }

    /// Seals the open segment (if not empty) and starts its upload; takes a
    /// checkpoint at the seal point every N segments or when `checkpoint`.
    pub(crate) fn seal_locked(self: &Arc<Self>, st: &mut State, checkpoint: bool) {
        if st.open.is_empty() {
            return;
        }
        let sealed = st.seal_open(self.take_buffer());
        let take_checkpoint =
            checkpoint || st.segments_since_checkpoint >= self.config.checkpoint_every_segments;
        let ckpt = take_checkpoint.then(|| {
            st.segments_since_checkpoint = 0;
            st.checkpoint_requested_seq = sealed.seq;
            self.encode_checkpoint(st, sealed.seq, sealed.span)
        });
        let vol = self.clone();
        tokio::spawn(async move { vol.upload(sealed, ckpt).await });
    }

    /// An empty segment buffer: a recycled one if there is one.
    pub(crate) fn take_buffer(&self) -> Vec<u8> {
        self.buffer_pool
            .lock()
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(self.config.segment_bytes as usize))
    }

    /// Keeps an uploaded segment's buffer for reuse (at most a few).
    pub(crate) fn recycle_buffer(&self, buffer: Vec<u8>) {
        let mut pool = self.buffer_pool.lock();
        if pool.len() < BUFFER_POOL_MAX && buffer.capacity() as u64 <= 2 * self.config.segment_bytes
        {
            pool.push(buffer);
        }
    }

    /// Seals the open segment if it is older than the configured age.
    pub(crate) fn seal_if_old(self: &Arc<Self>) {
        let mut st = self.state.lock();
        let age_ms = st.open.opened_at.elapsed().as_millis() as u64;
        if !st.open.is_empty() && age_ms >= self.config.segment_max_age_ms {
            self.seal_locked(&mut st, false);
        }
    }

    /// Reads `buf.len()` bytes at `offset`.
    pub async fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), VolumeError> {
        self.check_range(offset, buf.len() as u64)?;
        if let Some(detail) = self.ownership.fenced() {
            return Err(VolumeError::Failed {
                name: self.name.clone(),
                detail,
            });
        }
        let reader = self.caches.reader(self);
        let mut misses: Vec<Miss> = Vec::new();
        {
            let st = self.state.lock();
            st.map.lookup(offset, buf.len() as u64, |p| {
                let at = (p.start - offset) as usize;
                let dst = &mut buf[at..at + p.len as usize];
                match p.target {
                    None | Some(Target::Zero) => dst.fill(0),
                    Some(Target::Data { seq, offset: so }) => {
                        let so = so as usize;
                        if seq == st.open.seq {
                            dst.copy_from_slice(&st.open.data[so..so + dst.len()]);
                        } else if let Some(s) = st.sealed.get(&seq) {
                            dst.copy_from_slice(&s.data[so..so + dst.len()]);
                        } else {
                            misses.push(Miss {
                                buf_offset: at,
                                seq,
                                segment_offset: so as u64,
                                len: p.len,
                            });
                        }
                    }
                }
            });
        }
        self.start_readahead(&reader, offset, buf.len() as u64);
        if misses.is_empty() {
            return Ok(());
        }
        // Disjoint destination slices, one per miss (misses are in order and
        // do not overlap), so stored data lands in `buf` with no extra copy.
        let mut dsts = Vec::with_capacity(misses.len());
        let mut rest: &mut [u8] = buf;
        let mut consumed = 0usize;
        for m in &misses {
            let tail = std::mem::take(&mut rest);
            let (_, tail) = tail.split_at_mut(m.buf_offset - consumed);
            let (dst, tail) = tail.split_at_mut(m.len as usize);
            dsts.push(dst);
            rest = tail;
            consumed = m.buf_offset + m.len as usize;
        }
        let pieces = misses
            .iter()
            .zip(dsts)
            .map(|(m, dst)| StoredPiece {
                seq: m.seq,
                offset: m.segment_offset,
                dst,
            })
            .collect();
        reader.read_pieces(&self.caches, pieces).await
    }

    /// Allocation of `[offset, offset+len)` in at most `max_extents` runs.
    pub fn block_status(
        &self,
        offset: u64,
        len: u64,
        max_extents: usize,
    ) -> Result<Vec<(u64, Allocation)>, VolumeError> {
        self.check_range(offset, len)?;
        let mut out: Vec<(u64, Allocation)> = Vec::new();
        let st = self.state.lock();
        st.map.lookup(offset, len, |p| {
            let a = match p.target {
                None => Allocation::Hole,
                Some(Target::Zero) => Allocation::Zero,
                Some(Target::Data { .. }) => Allocation::Data,
            };
            match out.last_mut() {
                Some(last) if last.1 == a => last.0 += p.len,
                _ => out.push((p.len, a)),
            }
        });
        out.truncate(max_extents.max(1));
        Ok(out)
    }

    pub fn stats(&self) -> VolumeStats {
        let reader = self.caches.reader(self);
        let st = self.state.lock();
        VolumeStats {
            extents: st.map.len() as u64,
            mapped_data_bytes: st.map.data_bytes(),
            open_segment_seq: st.open.seq,
            durable_seq: st.durable_seq,
            buffered_bytes: st.buffered_cost_bytes,
            segments_uploaded: self.segments_uploaded.load(Ordering::Relaxed),
            bytes_uploaded: self.bytes_uploaded.load(Ordering::Relaxed),
            store_reads: reader.gets.load(Ordering::Relaxed),
            store_read_bytes: reader.get_bytes.load(Ordering::Relaxed),
            chunk_cache: self.caches.chunk_stats(),
        }
    }
}

struct Miss {
    buf_offset: usize,
    seq: u64,
    segment_offset: u64,
    len: u64,
}

/// Applies one logged operation to the open segment and the map (the write
/// path and journal replay share this).
#[allow(clippy::too_many_arguments)]
pub(crate) fn apply_op(
    st: &mut State,
    kind: RecordKind,
    offset: u64,
    len: u64,
    data: &[u8],
    cost: u64,
    jseq: u64,
    end_lpos: u64,
) {
    let entry_kind = match kind {
        RecordKind::Write => EntryKind::Write,
        RecordKind::Zero => EntryKind::Zero,
        RecordKind::Unmap | RecordKind::Wrap => EntryKind::Unmap,
    };
    let data_offset = st
        .open
        .push(entry_kind, offset, len, data, cost, jseq, end_lpos);
    let target = match entry_kind {
        EntryKind::Write => Some(Target::Data {
            seq: st.open.seq,
            offset: data_offset,
        }),
        EntryKind::Zero => Some(Target::Zero),
        EntryKind::Unmap => None,
    };
    st.map.set(offset, len, target);
    st.buffered_cost_bytes += cost;
}
