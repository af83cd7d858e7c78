//! Reading segment data back from the store.
//!
//! Owns the caches shared by all volumes of a server (verified 4 KiB chunks
//! and decoded segment indexes) and the fetch of a range of a stored
//! segment: cached chunks are used, missing runs of chunks are fetched with
//! one ranged GET each (in parallel), verified against the segment's chunk
//! CRCs, cached, and copied out.

use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;

use crate::cache::{CacheStats, ClockCache};
use crate::error::VolumeError;
use crate::recovery::store_error;
use strata_store::{ObjectNames, Store};

use crate::segment::{Entry, FixedHeader, SegmentIndex, CHUNK_BYTES, FIXED_HEADER_BYTES};
use crate::volume::Volume;

type ChunkKey = ([u8; 16], u64, u64);
type IndexKey = ([u8; 16], u64);

/// Caches shared by the volumes of one server, within fixed budgets.
pub struct SharedCaches {
    chunks: ClockCache<ChunkKey, Bytes>,
    indexes: ClockCache<IndexKey, Arc<SegmentIndex>>,
}

impl SharedCaches {
    /// `chunk_budget_bytes` for data; indexes get an eighth of it (at least
    /// 4 MiB): a 16 MiB segment's index is 16 KiB.
    pub fn new(chunk_budget_bytes: u64) -> Self {
        SharedCaches {
            chunks: ClockCache::new(chunk_budget_bytes),
            indexes: ClockCache::new((chunk_budget_bytes / 8).max(4 << 20)),
        }
    }

    pub fn chunk_stats(&self) -> CacheStats {
        self.chunks.stats()
    }

    pub fn index_stats(&self) -> CacheStats {
        self.indexes.stats()
    }
}

impl Volume {
    fn corrupt(&self, seq: u64, detail: String) -> VolumeError {
        tracing::error!(volume = %self.name, seq, %detail, "corrupt segment");
        VolumeError::Corrupt {
            path: self.names.segment(seq).to_string(),
            detail,
        }
    }

    async fn get_range(&self, seq: u64, range: Range<u64>) -> Result<Bytes, VolumeError> {
        let path = self.names.segment(seq);
        let want = range.end - range.start;
        let bytes = self
            .store
            .get_range(&path, range)
            .await
            .map_err(store_error(&self.store, "read", &path))?;
        self.store_reads.fetch_add(1, Ordering::Relaxed);
        self.store_read_bytes
            .fetch_add(bytes.len() as u64, Ordering::Relaxed);
        if bytes.len() as u64 != want {
            return Err(self.corrupt(seq, format!("short read: {} of {want} bytes", bytes.len())));
        }
        Ok(bytes)
    }

    /// The verified index of stored segment `seq` (cached).
    pub(crate) async fn segment_index(&self, seq: u64) -> Result<Arc<SegmentIndex>, VolumeError> {
        let key = (self.uuid, seq);
        if let Some(idx) = self.caches.indexes.get(&key) {
            return Ok(idx);
        }
        let (idx, _) =
            fetch_segment_header(&self.store, &self.names, seq, self.uuid, self.size_bytes)
                .await
                .inspect_err(|e| {
                    if matches!(e, VolumeError::Corrupt { .. }) {
                        tracing::error!(volume = %self.name, seq, error = %e, "corrupt segment");
                    }
                })?;
        let idx = Arc::new(idx);
        let cost = 4 * idx.chunk_crcs.len() as u64 + 256;
        self.caches.indexes.insert(key, idx.clone(), cost);
        Ok(idx)
    }

    /// Fills `dst` with the bytes at `offset` of stored segment `seq`'s data.
    pub(crate) async fn read_segment(
        &self,
        seq: u64,
        offset: u64,
        dst: &mut [u8],
    ) -> Result<(), VolumeError> {
        let len = dst.len() as u64;
        let idx = self.segment_index(seq).await?;
        if offset + len > idx.fixed.data_bytes {
            return Err(self.corrupt(
                seq,
                format!("map points past the data end ({offset}+{len})"),
            ));
        }
        let first = offset / CHUNK_BYTES;
        let last = (offset + len - 1) / CHUNK_BYTES;
        let mut chunks: Vec<Option<Bytes>> = (first..=last)
            .map(|c| self.caches.chunks.get(&(self.uuid, seq, c)))
            .collect();
        let runs = missing_runs(&chunks, first);
        let fetched = futures::future::try_join_all(
            runs.iter().map(|r| self.fetch_chunks(&idx, seq, r.clone())),
        )
        .await?;
        for (run, bytes) in runs.iter().zip(fetched) {
            for (i, c) in (run.start..run.end).enumerate() {
                let at = i * CHUNK_BYTES as usize;
                let end = (at + CHUNK_BYTES as usize).min(bytes.len());
                chunks[(c - first) as usize] = Some(bytes.slice(at..end));
            }
        }
        let mut pos = offset;
        for (i, chunk) in chunks.iter().enumerate() {
            let chunk = chunk
                .as_ref()
                .ok_or_else(|| self.corrupt(seq, "chunk missing after fetch".into()))?;
            let chunk_start = (first + i as u64) * CHUNK_BYTES;
            let from = (pos - chunk_start) as usize;
            let to = ((offset + len).min(chunk_start + CHUNK_BYTES) - chunk_start) as usize;
            if to > chunk.len() {
                return Err(self.corrupt(seq, "chunk shorter than the map says".into()));
            }
            let at = (pos - offset) as usize;
            dst[at..at + (to - from)].copy_from_slice(&chunk[from..to]);
            pos = chunk_start + to as u64;
        }
        Ok(())
    }

    /// One ranged GET for chunks `run`, verified and cached.
    async fn fetch_chunks(
        &self,
        idx: &SegmentIndex,
        seq: u64,
        run: Range<u64>,
    ) -> Result<Bytes, VolumeError> {
        let bytes = self
            .get_range(seq, idx.chunk_range(run.start, run.end - 1))
            .await?;
        idx.verify(run.start, &bytes)
            .map_err(|d| self.corrupt(seq, d))?;
        for (i, chunk) in bytes.chunks(CHUNK_BYTES as usize).enumerate() {
            let copy = Bytes::copy_from_slice(chunk);
            self.caches
                .chunks
                .insert((self.uuid, seq, run.start + i as u64), copy, CHUNK_BYTES);
        }
        Ok(bytes)
    }
}

/// Fetches and verifies a stored segment's header and tables (reads need
/// the chunk CRCs, recovery the entries).
pub(crate) async fn fetch_segment_header(
    store: &Store,
    names: &ObjectNames,
    seq: u64,
    uuid: [u8; 16],
    volume_size_bytes: u64,
) -> Result<(SegmentIndex, Vec<Entry>), VolumeError> {
    let path = names.segment(seq);
    let corrupt = |detail: String| VolumeError::Corrupt {
        path: path.to_string(),
        detail,
    };
    let head = store
        .get_range(&path, 0..FIXED_HEADER_BYTES as u64)
        .await
        .map_err(store_error(store, "read", &path))?;
    let fixed = FixedHeader::decode(&head).map_err(corrupt)?;
    if fixed.seq != seq || fixed.volume_uuid != uuid {
        return Err(corrupt(
            "segment belongs to another volume or position".into(),
        ));
    }
    let tables = store
        .get_range(
            &path,
            FIXED_HEADER_BYTES as u64..u64::from(fixed.header_bytes),
        )
        .await
        .map_err(store_error(store, "read", &path))?;
    SegmentIndex::decode_tables(fixed, &tables, volume_size_bytes).map_err(corrupt)
}

/// Runs of consecutive uncached chunks, as chunk-number ranges.
fn missing_runs(chunks: &[Option<Bytes>], first: u64) -> Vec<Range<u64>> {
    let mut runs: Vec<Range<u64>> = Vec::new();
    for (i, c) in chunks.iter().enumerate() {
        if c.is_some() {
            continue;
        }
        let n = first + i as u64;
        match runs.last_mut() {
            Some(r) if r.end == n => r.end = n + 1,
            _ => runs.push(n..n + 1),
        }
    }
    runs
}
