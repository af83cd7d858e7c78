//! Reading stored segment data: every tier between a read miss and the store.
//!
//! This module owns the caches shared by all volumes of a server
//! ([`SharedCaches`]: verified 4 KiB chunks in RAM, the local-disk tier of
//! `disk_cache.rs`, decoded segment indexes, the fetches in flight of
//! `inflight.rs`, and the read path's counters), and, per volume
//! ([`VolumeReader`]), the fetch of the stored pieces of a read:
//!
//! 1. pieces are grouped by segment; segments are read in parallel
//!    (at most `MAX_PARALLEL_SEGMENTS` per read);
//! 2. each chunk a piece needs is looked up in RAM, then on disk (verified
//!    against the segment's chunk CRC, then promoted to RAM), then among the
//!    fetches in flight (waited for, not fetched again);
//! 3. the rest are claimed and coalesced: chunks at most `MAX_GAP_BYTES`
//!    apart share one ranged GET (the gap is fetched and cached too), up to
//!    `MAX_GET_BYTES` per GET; the GETs run in parallel (bounded), and what
//!    they return is verified, put in RAM and on disk, and handed to waiters;
//! 4. the pieces are copied out of the chunks into the client's buffer.
//!
//! Read-ahead (`readahead.rs`) goes through the same claims and fetch, so a
//! reader never fetches what read-ahead is fetching, and no byte reaches a
//! reader or a cache before its CRC is checked.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use parking_lot::Mutex;
use serde::Serialize;
use strata_store::{ObjectNames, Store};
use tokio::sync::Notify;

use crate::cache::{CacheStats, ClockCache};
use crate::config::VolumeConfig;
use crate::disk_cache::{DiskCache, DiskCacheStats, DiskHit, DiskKey};
use crate::disk_writer::DiskWriter;
use crate::error::VolumeError;
use crate::inflight::{Claim, Flights, Waiter};
use crate::readahead::{ReadAhead, ReadAheadStats, Streams};
use crate::recovery::store_error;
use crate::segment::{Entry, FixedHeader, SegmentIndex, CHUNK_BYTES, FIXED_HEADER_BYTES};
use crate::volume::Volume;

/// Chunks this close in a segment share one GET: fetching 64 KiB more
/// costs less than a second request to a remote store (1-10 ms each).
pub const MAX_GAP_BYTES: u64 = 64 << 10;
/// Largest single GET (bounds the buffer one fetch holds).
pub const MAX_GET_BYTES: u64 = 8 << 20;
/// Segments of one read fetched at once.
const MAX_PARALLEL_SEGMENTS: usize = 8;
/// GETs of one segment (of one read) in flight at once.
const MAX_PARALLEL_GETS: usize = 8;
/// Disk-tier reads of at most this many chunks are `pread` on the calling
/// worker (microseconds from the page cache, like the embedded store's
/// reads); more go to the blocking pool so a cold disk cannot stall a
/// worker for long.
const INLINE_DISK_READ_CHUNKS: usize = 4;

pub(crate) type ChunkKey = ([u8; 16], u64, u64);
type IndexKey = ([u8; 16], u64);

/// Verified bytes of consecutive chunks, from `first_chunk` on.
#[derive(Clone)]
pub(crate) struct RunBytes {
    pub first_chunk: u64,
    pub bytes: Bytes,
}

impl RunBytes {
    fn chunk(&self, chunk: u64) -> Option<Bytes> {
        let at = chunk.checked_sub(self.first_chunk)? * CHUNK_BYTES;
        let at = usize::try_from(at).ok()?;
        if at >= self.bytes.len() {
            return None;
        }
        let end = (at + CHUNK_BYTES as usize).min(self.bytes.len());
        Some(self.bytes.slice(at..end))
    }
}

/// Counters of the store traffic of the read path.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct StoreReadStats {
    /// Ranged GETs of segment data (reads and read-ahead).
    pub data_gets: u64,
    pub data_get_bytes: u64,
    /// GETs of segment headers and chunk tables (two per index fetched).
    pub header_gets: u64,
    /// Pieces of a read that needed no GET of their own: their chunks came
    /// with a GET issued for another piece of the same read.
    pub coalesced_pieces: u64,
    /// Chunks a read waited for because another read or read-ahead was
    /// fetching them.
    pub inflight_waits: u64,
    /// ... of which the fetch failed or was abandoned, so the read fetched
    /// them itself.
    pub inflight_fallbacks: u64,
    /// Chunks being fetched now (a gauge).
    pub chunks_in_flight: u64,
}

/// Everything the read path counts, per tier; see `SharedCaches::stats`.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct ReadPathStats {
    /// Verified 4 KiB chunks in RAM.
    pub ram_chunks: CacheStats,
    /// The local-disk tier.
    pub disk_chunks: DiskCacheStats,
    /// Decoded segment headers (the chunk CRC tables).
    pub segment_indexes: CacheStats,
    pub readahead: ReadAheadStats,
    pub store: StoreReadStats,
}

#[derive(Default)]
struct StoreCounters {
    data_gets: AtomicU64,
    data_get_bytes: AtomicU64,
    header_gets: AtomicU64,
    coalesced_pieces: AtomicU64,
    inflight_waits: AtomicU64,
    inflight_fallbacks: AtomicU64,
}

/// Background work of the caches (read-ahead windows, disk-tier writes),
/// counted so that `SharedCaches::settle` can wait for it.
#[derive(Default)]
pub(crate) struct Background {
    pending: AtomicU64,
    idle: Notify,
}

/// One unit of background work; finishing (or dropping) it is counted.
pub(crate) struct BackgroundJob(Arc<Background>);

impl Background {
    pub(crate) fn start(self: &Arc<Self>) -> BackgroundJob {
        self.pending.fetch_add(1, Ordering::AcqRel);
        BackgroundJob(self.clone())
    }
}

impl Drop for BackgroundJob {
    fn drop(&mut self) {
        if self.0.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// Caches shared by the volumes of one server, within fixed budgets.
pub struct SharedCaches {
    pub(crate) chunks: ClockCache<ChunkKey, Bytes>,
    indexes: ClockCache<IndexKey, Arc<SegmentIndex>>,
    pub(crate) disk: Arc<DiskCache>,
    pub(crate) chunk_flights: Arc<Flights<ChunkKey, RunBytes>>,
    index_flights: Arc<Flights<IndexKey, Arc<SegmentIndex>>>,
    disk_writer: DiskWriter,
    pub(crate) readahead: ReadAhead,
    /// Per-volume read state, by volume uuid. One small entry per volume
    /// read since the server started.
    readers: Mutex<HashMap<[u8; 16], Arc<VolumeReader>>>,
    counters: StoreCounters,
    pub(crate) background: Arc<Background>,
}

impl SharedCaches {
    /// RAM chunk cache of `cache_bytes`; indexes get an eighth of it (at
    /// least 4 MiB: a 16 MiB segment's index is 16 KiB); the disk tier
    /// (`disk_cache_bytes`, 0 = off) in `<data_dir>/cache/`.
    pub fn new(config: &VolumeConfig) -> Result<Self, VolumeError> {
        let disk = Arc::new(DiskCache::open(
            &config.cache_dir(),
            config.disk_cache_bytes,
        )?);
        Ok(SharedCaches {
            chunks: ClockCache::new(config.cache_bytes),
            indexes: ClockCache::new((config.cache_bytes / 8).max(4 << 20)),
            disk: disk.clone(),
            chunk_flights: Arc::new(Flights::new()),
            index_flights: Arc::new(Flights::new()),
            disk_writer: DiskWriter::new(disk),
            readahead: ReadAhead::new(config.readahead_max_bytes, config.cache_bytes),
            readers: Mutex::new(HashMap::new()),
            counters: StoreCounters::default(),
            background: Arc::new(Background::default()),
        })
    }

    pub fn chunk_stats(&self) -> CacheStats {
        self.chunks.stats()
    }

    /// Every counter of the read path.
    pub fn stats(&self) -> ReadPathStats {
        let c = &self.counters;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ReadPathStats {
            ram_chunks: self.chunks.stats(),
            disk_chunks: self.disk.stats(),
            segment_indexes: self.indexes.stats(),
            readahead: self.readahead.stats(),
            store: StoreReadStats {
                data_gets: load(&c.data_gets),
                data_get_bytes: load(&c.data_get_bytes),
                header_gets: load(&c.header_gets),
                coalesced_pieces: load(&c.coalesced_pieces),
                inflight_waits: load(&c.inflight_waits),
                inflight_fallbacks: load(&c.inflight_fallbacks),
                chunks_in_flight: self.chunk_flights.len() as u64,
            },
        }
    }

    /// Waits until the background work started before the call (read-ahead
    /// windows, disk-tier writes) has finished: for tests and benchmarks
    /// that compare counters, and for an orderly shutdown.
    pub async fn settle(&self) {
        loop {
            let idle = self.background.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if self.background.pending.load(Ordering::Acquire) == 0 {
                return;
            }
            idle.await;
        }
    }

    /// The read state of `vol` (created on its first read).
    pub(crate) fn reader(&self, vol: &Volume) -> Arc<VolumeReader> {
        let mut readers = self.readers.lock();
        let next_id = readers.len() as u32;
        readers
            .entry(vol.uuid)
            .or_insert_with(|| {
                Arc::new(VolumeReader {
                    name: vol.name.clone(),
                    uuid: vol.uuid,
                    disk_id: next_id,
                    size_bytes: vol.size_bytes,
                    store: vol.store.clone(),
                    names: vol.names.clone(),
                    streams: Mutex::new(Streams::default()),
                    gets: AtomicU64::new(0),
                    get_bytes: AtomicU64::new(0),
                })
            })
            .clone()
    }

    /// Under one lock of the flight table: which of the `missing` chunks
    /// (positions in `numbers`) others are fetching (waits), and claims,
    /// one per coalesced run, for the rest. `force` claims all of them.
    pub(crate) fn plan_fetch(
        &self,
        uuid: [u8; 16],
        seq: u64,
        numbers: &[u64],
        missing: &[usize],
        force: bool,
    ) -> FetchPlan {
        let mut table = self.chunk_flights.lock();
        let mut waits = Vec::new();
        let mut own: Vec<u64> = Vec::with_capacity(missing.len());
        for &pos in missing {
            let key = (uuid, seq, numbers[pos]);
            match table.waiter(&key).filter(|_| !force) {
                Some(w) => waits.push((pos, w)),
                None => own.push(numbers[pos]),
            }
        }
        let runs = coalesce(
            &own,
            MAX_GAP_BYTES / CHUNK_BYTES,
            MAX_GET_BYTES / CHUNK_BYTES,
        )
        .into_iter()
        .map(|(run, claimed)| {
            let keys = own[claimed].iter().map(|&c| (uuid, seq, c)).collect();
            (run, table.claim(keys))
        })
        .collect();
        FetchPlan { runs, waits }
    }

    /// Caches a verified run in RAM, one copy per chunk (a slice would pin
    /// the whole GET's buffer and make the budget lie); returns the copies
    /// for the disk tier.
    fn insert_ram(&self, uuid: [u8; 16], seq: u64, run: &RunBytes) -> Vec<(u64, Bytes)> {
        run.bytes
            .chunks(CHUNK_BYTES as usize)
            .enumerate()
            .map(|(i, chunk)| {
                let c = run.first_chunk + i as u64;
                let copy = Bytes::copy_from_slice(chunk);
                self.chunks
                    .insert((uuid, seq, c), copy.clone(), CHUNK_BYTES);
                (c, copy)
            })
            .collect()
    }

    /// Hands verified chunks to the disk tier's writer (`disk_writer.rs`).
    /// Never waits: measured here, a fetch that waited for the disk tier
    /// made a cold sequential read from MinIO 2.8x slower (131 vs 370 MB/s).
    async fn insert_disk(&self, disk_id: u32, seq: u64, chunks: Vec<(u64, Bytes)>) {
        if !self.disk.enabled() {
            return;
        }
        let chunks: Vec<(u64, Bytes)> = chunks
            .into_iter()
            .filter(|(c, _)| DiskKey::new(disk_id, seq, *c).is_some_and(|k| self.disk.admit(&k)))
            .collect();
        if chunks.is_empty() {
            return;
        }
        self.disk_writer
            .submit(disk_id, seq, chunks, self.background.start());
    }
}

/// What a segment read must fetch itself and what it waits for.
pub(crate) struct FetchPlan {
    pub runs: Vec<(Range<u64>, Claim<ChunkKey, RunBytes>)>,
    pub waits: Vec<(usize, Waiter<RunBytes>)>,
}

/// Groups sorted, distinct chunk numbers into runs to fetch with one GET
/// each: a chunk joins the previous run if at most `max_gap_chunks` lie
/// between them and the run stays within `max_run_chunks`. Returns each
/// run's chunk range and the slice of `chunks` it covers.
pub(crate) fn coalesce(
    chunks: &[u64],
    max_gap_chunks: u64,
    max_run_chunks: u64,
) -> Vec<(Range<u64>, Range<usize>)> {
    assert!(max_run_chunks >= 1);
    let mut runs: Vec<(Range<u64>, Range<usize>)> = Vec::new();
    for (i, &c) in chunks.iter().enumerate() {
        match runs.last_mut() {
            Some((run, covered))
                if c >= run.end
                    && c - run.end <= max_gap_chunks
                    && c + 1 - run.start <= max_run_chunks =>
            {
                run.end = c + 1;
                covered.end = i + 1;
            }
            _ => runs.push((c..c + 1, i..i + 1)),
        }
    }
    runs
}

/// A stored piece of a read: `dst.len()` bytes at `offset` of segment
/// `seq`'s data.
pub(crate) struct StoredPiece<'a> {
    pub seq: u64,
    pub offset: u64,
    pub dst: &'a mut [u8],
}

/// The chunks one read needs from one segment, and what has been found.
struct SegmentChunks {
    /// Chunk numbers, sorted and distinct.
    numbers: Vec<u64>,
    data: Vec<Option<Bytes>>,
}

impl SegmentChunks {
    fn missing(&self) -> Vec<usize> {
        (0..self.numbers.len())
            .filter(|&i| self.data[i].is_none())
            .collect()
    }

    fn fill_run(&mut self, run: &RunBytes) {
        let end = run.first_chunk + (run.bytes.len() as u64).div_ceil(CHUNK_BYTES);
        let from = self.numbers.partition_point(|&c| c < run.first_chunk);
        let to = self.numbers.partition_point(|&c| c < end);
        for pos in from..to {
            if self.data[pos].is_none() {
                self.data[pos] = run.chunk(self.numbers[pos]);
            }
        }
    }

    /// Copies each piece out of the chunks.
    fn copy_out(&self, pieces: &mut [StoredPiece<'_>]) -> Result<(), String> {
        for p in pieces {
            let end = p.offset + p.dst.len() as u64;
            let mut pos = p.offset;
            while pos < end {
                let c = pos / CHUNK_BYTES;
                let i = self
                    .numbers
                    .binary_search(&c)
                    .map_err(|_| "chunk missing after fetch".to_string())?;
                let chunk = self.data[i].as_ref().ok_or("chunk missing after fetch")?;
                let chunk_start = c * CHUNK_BYTES;
                let from = (pos - chunk_start) as usize;
                let to = (end.min(chunk_start + CHUNK_BYTES) - chunk_start) as usize;
                if to > chunk.len() {
                    return Err("chunk shorter than the map says".into());
                }
                let at = (pos - p.offset) as usize;
                p.dst[at..at + (to - from)].copy_from_slice(&chunk[from..to]);
                pos = chunk_start + to as u64;
            }
        }
        Ok(())
    }
}

/// Read state of one volume: what fetching its segments needs (so
/// read-ahead tasks can run without the `Volume`), its stream table for
/// read-ahead, and its GET counters.
pub(crate) struct VolumeReader {
    pub name: String,
    pub uuid: [u8; 16],
    /// The volume's small id in disk-tier keys.
    pub disk_id: u32,
    pub size_bytes: u64,
    store: Store,
    names: ObjectNames,
    pub streams: Mutex<Streams>,
    pub gets: AtomicU64,
    pub get_bytes: AtomicU64,
}

impl VolumeReader {
    fn corrupt(&self, seq: u64, detail: String) -> VolumeError {
        tracing::error!(volume = %self.name, seq, %detail, "corrupt segment");
        VolumeError::Corrupt {
            path: self.names.segment(seq).to_string(),
            detail,
        }
    }

    /// Fills every piece's `dst` (see the module doc).
    pub async fn read_pieces(
        &self,
        caches: &SharedCaches,
        pieces: Vec<StoredPiece<'_>>,
    ) -> Result<(), VolumeError> {
        // Most reads touch one segment: no grouping, no fan-out machinery.
        if let Some(seq) = pieces.first().map(|p| p.seq) {
            if pieces.iter().all(|p| p.seq == seq) {
                return self.read_segment(caches, seq, pieces).await;
            }
        }
        let mut by_seq: BTreeMap<u64, Vec<StoredPiece<'_>>> = BTreeMap::new();
        for p in pieces {
            by_seq.entry(p.seq).or_default().push(p);
        }
        // A loop, not a closure over `StoredPiece<'_>`: such a closure is
        // not general over the lifetime and the read future would not be
        // `Send` to the compiler (rust-lang/rust#102211).
        let mut reads = Vec::with_capacity(by_seq.len());
        for (seq, pieces) in by_seq {
            reads.push(self.read_segment(caches, seq, pieces));
        }
        futures::stream::iter(reads)
            .buffer_unordered(MAX_PARALLEL_SEGMENTS)
            .try_collect::<Vec<()>>()
            .await?;
        Ok(())
    }

    async fn read_segment(
        &self,
        caches: &SharedCaches,
        seq: u64,
        mut pieces: Vec<StoredPiece<'_>>,
    ) -> Result<(), VolumeError> {
        let idx = self.segment_index(caches, seq).await?;
        let mut numbers = Vec::new();
        for p in &pieces {
            let end = p.offset + p.dst.len() as u64;
            if p.dst.is_empty() || end > idx.fixed.data_bytes {
                let detail = format!(
                    "map points past the data end ({}+{})",
                    p.offset,
                    p.dst.len()
                );
                return Err(self.corrupt(seq, detail));
            }
            numbers.extend(p.offset / CHUNK_BYTES..=(end - 1) / CHUNK_BYTES);
        }
        numbers.sort_unstable();
        numbers.dedup();
        let data = numbers
            .iter()
            .map(|&c| caches.chunks.get(&(self.uuid, seq, c)))
            .collect();
        let mut chunks = SegmentChunks { numbers, data };
        self.fill_from_disk(caches, &idx, seq, &mut chunks).await;
        self.fetch_missing(caches, &idx, seq, &mut chunks, &pieces)
            .await?;
        chunks
            .copy_out(&mut pieces)
            .map_err(|d| self.corrupt(seq, d))
    }

    /// Fetches what no cache had: waits for fetches in flight, claims and
    /// fetches the rest. A second round fetches what the waited-for
    /// fetches did not deliver, without waiting again.
    async fn fetch_missing(
        &self,
        caches: &SharedCaches,
        idx: &SegmentIndex,
        seq: u64,
        chunks: &mut SegmentChunks,
        pieces: &[StoredPiece<'_>],
    ) -> Result<(), VolumeError> {
        for round in 0..2 {
            if chunks.data.iter().all(Option::is_some) {
                return Ok(());
            }
            let missing = chunks.missing();
            let plan = caches.plan_fetch(self.uuid, seq, &chunks.numbers, &missing, round > 0);
            count_coalesced(caches, pieces, &plan.runs);
            let fetches = futures::stream::iter(plan.runs)
                .map(|(run, claim)| self.fetch_run(caches, idx, seq, run, claim, false))
                .buffer_unordered(MAX_PARALLEL_GETS)
                .try_collect::<Vec<RunBytes>>();
            let waits = futures::future::join_all(
                plan.waits
                    .into_iter()
                    .map(|(pos, w)| async move { (pos, w.value().await) }),
            );
            let (fetched, waited) =
                futures::future::try_join(fetches, async { Ok(waits.await) }).await?;
            for run in &fetched {
                chunks.fill_run(run);
            }
            for (pos, run) in waited {
                caches
                    .counters
                    .inflight_waits
                    .fetch_add(1, Ordering::Relaxed);
                match run.and_then(|r| r.chunk(chunks.numbers[pos])) {
                    Some(b) => chunks.data[pos] = Some(b),
                    None => {
                        caches
                            .counters
                            .inflight_fallbacks
                            .fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
        // Round 1 claimed and fetched everything still missing.
        assert!(chunks.missing().is_empty(), "chunks missing after fetch");
        Ok(())
    }

    /// Chunks of the disk tier, verified against the segment's CRCs; a
    /// verified chunk is promoted to RAM.
    async fn fill_from_disk(
        &self,
        caches: &SharedCaches,
        idx: &SegmentIndex,
        seq: u64,
        chunks: &mut SegmentChunks,
    ) {
        if !caches.disk.enabled() || chunks.data.iter().all(Option::is_some) {
            return;
        }
        let mut hits: Vec<(usize, DiskKey, DiskHit, usize)> = Vec::new();
        for pos in chunks.missing() {
            let c = chunks.numbers[pos];
            let found = DiskKey::new(self.disk_id, seq, c)
                .and_then(|k| caches.disk.lookup(&k).map(|h| (k, h)));
            match found {
                Some((key, hit)) => hits.push((pos, key, hit, chunk_len(idx, c))),
                None => caches.disk.count_miss(),
            }
        }
        if hits.is_empty() {
            return;
        }
        let reads = read_disk_slots(&caches.disk, &hits).await;
        for ((pos, key, hit, _), read) in hits.into_iter().zip(reads) {
            let c = chunks.numbers[pos];
            let bytes = match read {
                Ok(b) => b,
                Err(e) => {
                    tracing::debug!(error = %e, "disk cache read failed");
                    caches.disk.count_io_error();
                    caches.disk.count_miss();
                    continue;
                }
            };
            if !caches.disk.still_holds(&hit, &key) {
                caches.disk.count_miss();
                continue;
            }
            if let Err(detail) = idx.verify(c, &bytes) {
                tracing::warn!(volume = %self.name, seq, chunk = c, %detail, path = %caches.disk.path().display(), "disk cache entry failed verification; reading it from the store");
                caches.disk.drop_corrupt(&hit, &key);
                continue;
            }
            caches.disk.count_hit();
            let bytes = Bytes::from(bytes);
            caches
                .chunks
                .insert((self.uuid, seq, c), bytes.clone(), CHUNK_BYTES);
            chunks.data[pos] = Some(bytes);
        }
    }

    /// One ranged GET for chunks `run`: verified, cached in RAM, handed to
    /// the claim's waiters, then written to the disk tier.
    pub(crate) async fn fetch_run(
        &self,
        caches: &SharedCaches,
        idx: &SegmentIndex,
        seq: u64,
        run: Range<u64>,
        claim: Claim<ChunkKey, RunBytes>,
        readahead: bool,
    ) -> Result<RunBytes, VolumeError> {
        if run.is_empty() || run.end > u64::from(idx.fixed.chunk_count) {
            let detail = format!("chunks {run:?} outside the segment");
            return Err(self.corrupt(seq, detail));
        }
        let range = idx.chunk_range(run.start, run.end - 1);
        let bytes = self.get_range(caches, seq, range, readahead).await?;
        idx.verify(run.start, &bytes)
            .map_err(|d| self.corrupt(seq, d))?;
        let fetched = RunBytes {
            first_chunk: run.start,
            bytes,
        };
        let copies = caches.insert_ram(self.uuid, seq, &fetched);
        claim.complete(fetched.clone());
        drop(claim);
        caches.insert_disk(self.disk_id, seq, copies).await;
        Ok(fetched)
    }

    async fn get_range(
        &self,
        caches: &SharedCaches,
        seq: u64,
        range: Range<u64>,
        readahead: bool,
    ) -> Result<Bytes, VolumeError> {
        let path = self.names.segment(seq);
        let want = range.end - range.start;
        let c = &caches.counters;
        c.data_gets.fetch_add(1, Ordering::Relaxed);
        self.gets.fetch_add(1, Ordering::Relaxed);
        let bytes = self
            .store
            .get_range(&path, range)
            .await
            .map_err(store_error(&self.store, "read", &path))?;
        let got = bytes.len() as u64;
        c.data_get_bytes.fetch_add(got, Ordering::Relaxed);
        self.get_bytes.fetch_add(got, Ordering::Relaxed);
        if readahead {
            caches.readahead.count_prefetched(got);
        }
        if got != want {
            return Err(self.corrupt(seq, format!("short read: {got} of {want} bytes")));
        }
        Ok(bytes)
    }

    /// The verified index of stored segment `seq`: cached, or fetched once
    /// however many readers ask for it at the same time.
    pub(crate) async fn segment_index(
        &self,
        caches: &SharedCaches,
        seq: u64,
    ) -> Result<Arc<SegmentIndex>, VolumeError> {
        let key = (self.uuid, seq);
        if let Some(idx) = caches.indexes.get(&key) {
            return Ok(idx);
        }
        let claimed = {
            let mut table = caches.index_flights.lock();
            match table.waiter(&key) {
                Some(w) => Err(w),
                None => Ok(table.claim(vec![key])),
            }
        };
        let claim = match claimed {
            Ok(claim) => Some(claim),
            Err(waiter) => match waiter.value().await {
                Some(idx) => return Ok(idx),
                // Its fetch failed or was abandoned: fetch it ourselves.
                None => None,
            },
        };
        caches.counters.header_gets.fetch_add(2, Ordering::Relaxed);
        let (idx, _) =
            fetch_segment_header(&self.store, &self.names, seq, self.uuid, self.size_bytes)
                .await
                .inspect_err(|e| {
                    if matches!(e, VolumeError::Corrupt { .. }) {
                        tracing::error!(volume = %self.name, seq, error = %e, "corrupt segment");
                    }
                })?;
        let idx = Arc::new(idx);
        let cost_bytes = 4 * idx.chunk_crcs.len() as u64 + 256;
        caches.indexes.insert(key, idx.clone(), cost_bytes);
        if let Some(claim) = claim {
            claim.complete(idx.clone());
        }
        Ok(idx)
    }
}

/// Counts the pieces whose chunks a GET issued for another piece fetched.
fn count_coalesced(
    caches: &SharedCaches,
    pieces: &[StoredPiece<'_>],
    runs: &[(Range<u64>, Claim<ChunkKey, RunBytes>)],
) {
    if runs.is_empty() {
        return;
    }
    // Runs are sorted and disjoint: a binary search per piece.
    let fetching = pieces
        .iter()
        .filter(|p| {
            let first = p.offset / CHUNK_BYTES;
            let last = (p.offset + p.dst.len() as u64 - 1) / CHUNK_BYTES;
            let i = runs.partition_point(|(r, _)| r.end <= first);
            runs.get(i).is_some_and(|(r, _)| r.start <= last)
        })
        .count();
    let saved = fetching.saturating_sub(runs.len()) as u64;
    caches
        .counters
        .coalesced_pieces
        .fetch_add(saved, Ordering::Relaxed);
}

/// Bytes of chunk `c` of a segment (the last one may be short).
fn chunk_len(idx: &SegmentIndex, c: u64) -> usize {
    (idx.fixed.data_bytes - c * CHUNK_BYTES).min(CHUNK_BYTES) as usize
}

/// Reads the slots of `hits` (see `INLINE_DISK_READ_CHUNKS`).
async fn read_disk_slots(
    disk: &Arc<DiskCache>,
    hits: &[(usize, DiskKey, DiskHit, usize)],
) -> Vec<std::io::Result<Vec<u8>>> {
    let jobs: Vec<(DiskHit, usize)> = hits.iter().map(|h| (h.2, h.3)).collect();
    if jobs.len() <= INLINE_DISK_READ_CHUNKS {
        return jobs.iter().map(|(hit, len)| disk.read(hit, *len)).collect();
    }
    let n = jobs.len();
    let disk = disk.clone();
    let read_all = move || jobs.iter().map(|(hit, len)| disk.read(hit, *len)).collect();
    match tokio::task::spawn_blocking(read_all).await {
        Ok(reads) => reads,
        Err(e) => (0..n)
            .map(|_| Err(std::io::Error::other(e.to_string())))
            .collect(),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coalesce_joins_close_chunks_and_splits_far_or_long_runs() {
        let runs = |chunks: &[u64], gap, max| -> Vec<Range<u64>> {
            coalesce(chunks, gap, max)
                .into_iter()
                .map(|r| r.0)
                .collect()
        };
        assert_eq!(runs(&[], 16, 100), Vec::<Range<u64>>::new());
        assert_eq!(runs(&[3, 4, 5], 0, 100), vec![3..6]);
        assert_eq!(runs(&[3, 5], 0, 100), vec![3..4, 5..6]);
        assert_eq!(runs(&[3, 5, 21, 39], 16, 100), vec![3..22, 39..40]);
        assert_eq!(runs(&[0, 1, 2, 3, 4], 16, 2), vec![0..2, 2..4, 4..5]);
        let covered: Vec<Range<usize>> = coalesce(&[1, 2, 40, 41], 16, 100)
            .into_iter()
            .map(|r| r.1)
            .collect();
        assert_eq!(covered, vec![0..2, 2..4]);
    }
}
