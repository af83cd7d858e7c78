//! The caches shared by the volumes of one server, within fixed budgets:
//! verified 4 KiB chunks in RAM, the disk tier and its writer, decoded
//! segment indexes, the fetches in flight, read-ahead's server-wide bound,
//! and the read path's counters.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use serde::Serialize;
use strata_store::{ObjectNames, Store};

use super::background::Background;
use super::block_cache::{BlockCache, BlockKey, DiskCacheStats, BLOCK_BYTES, CHUNKS_PER_BLOCK};
use super::disk_writer::{BlockSource, Blocks, DiskWriter, OnDone};
use super::fetch_plan::{
    coalesce, ChunkKey, Coalescing, FetchPlan, IndexKey, RunBytes, MAX_GAP_BYTES, MAX_GET_BYTES,
};
use super::hedge::HedgePolicy;
use super::hydration_limits::{hydrating_volumes, hydration_slots, RateLimit};
use super::inflight::Flights;
use super::prefetched_runs::PrefetchedRuns;
use super::ram_cache::{CacheStats, ClockCache};
use super::readahead::{ReadAhead, ReadAheadStats, Streams};
use super::volume_reader::VolumeReader;
use crate::config::VolumeConfig;
use crate::error::VolumeError;
use crate::format::cache_file::volume_key;
use crate::format::key_wrap::Key;
use crate::format::segment::{SegmentIndex, CHUNK_BYTES};

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
    /// Of `data_gets`: GETs by hydration, and their bytes.
    pub hydration_gets: u64,
    pub hydration_get_bytes: u64,
    /// Of `data_gets`: second requests of hedged reads, and how many of
    /// them answered first.
    pub hedged_gets: u64,
    pub hedge_wins: u64,
}

/// Everything the read path counts, per tier; see `SharedCaches::stats`.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct ReadPathStats {
    /// Verified 4 KiB chunks in RAM.
    pub ram_chunks: CacheStats,
    /// The local disk cache (64 KiB blocks).
    pub disk_cache: DiskCacheStats,
    /// Decoded segment headers (the chunk CRC tables).
    pub segment_indexes: CacheStats,
    pub readahead: ReadAheadStats,
    pub store: StoreReadStats,
}

#[derive(Default)]
pub(crate) struct StoreCounters {
    pub data_gets: AtomicU64,
    pub data_get_bytes: AtomicU64,
    pub header_gets: AtomicU64,
    pub coalesced_pieces: AtomicU64,
    pub inflight_waits: AtomicU64,
    pub inflight_fallbacks: AtomicU64,
    pub hydration_gets: AtomicU64,
    pub hydration_get_bytes: AtomicU64,
}

/// Caches shared by the volumes of one server, within fixed budgets.
pub struct SharedCaches {
    pub(crate) chunks: ClockCache<ChunkKey, Bytes>,
    pub(crate) indexes: ClockCache<IndexKey, Arc<SegmentIndex>>,
    pub(crate) disk: Arc<BlockCache>,
    pub(crate) chunk_flights: Arc<Flights<ChunkKey, RunBytes>>,
    pub(crate) index_flights: Arc<Flights<IndexKey, Arc<SegmentIndex>>>,
    disk_writer: DiskWriter,
    pub(crate) readahead: ReadAhead,
    /// Read-ahead's runs, whole, until readers take them.
    pub(crate) prefetched: PrefetchedRuns,
    /// Per-volume read state, by volume uuid. One small entry per volume
    /// read since the server started.
    readers: Mutex<HashMap<[u8; 16], Arc<VolumeReader>>>,
    pub(crate) counters: StoreCounters,
    pub(crate) background: Arc<Background>,
    /// Hydration's GETs in flight, server-wide (`hydration.rs`) ...
    pub(crate) hydration_slots: Arc<tokio::sync::Semaphore>,
    /// ... and those of its units ahead of a client's reads, apart.
    pub(crate) lead_slots: Arc<tokio::sync::Semaphore>,
    /// Volumes hydrating at once, server-wide.
    pub(crate) hydrating_volumes: Arc<tokio::sync::Semaphore>,
    /// Hydration's bandwidth, server-wide (`--hydrate-rate`).
    pub(crate) hydration_rate: RateLimit,
    /// Hedged reads: on, and when (`hedge.rs`).
    pub(crate) hedge_reads: bool,
    pub(crate) hedge: HedgePolicy,
    /// Data GETs in flight, shared fairly by the volumes reading
    /// (`fair_slots.rs`).
    pub(crate) gets_in_flight: crate::fair_slots::FairSlots,
}

impl SharedCaches {
    /// RAM chunk cache of `cache_bytes`; indexes get an eighth of it (at
    /// least 4 MiB: a 16 MiB segment's index is 16 KiB); the disk tier
    /// (`disk_cache_bytes`, 0 = off) in `<data_dir>/cache/`.
    pub fn new(config: &VolumeConfig) -> Result<Self, VolumeError> {
        let disk = Arc::new(BlockCache::open(
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
            prefetched: PrefetchedRuns::new(prefetched_budget_bytes(config)),
            readers: Mutex::new(HashMap::new()),
            counters: StoreCounters::default(),
            background: Arc::new(Background::default()),
            hydration_slots: hydration_slots(),
            lead_slots: hydration_slots(),
            hydrating_volumes: hydrating_volumes(),
            hydration_rate: RateLimit::new(config.hydrate.rate_bytes_per_sec),
            hedge_reads: config.hedge_reads,
            hedge: HedgePolicy::default(),
            gets_in_flight: crate::fair_slots::FairSlots::new(config.max_gets_total),
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
            disk_cache: self.disk.stats(),
            segment_indexes: self.indexes.stats(),
            readahead: ReadAheadStats {
                kept_bytes: self.prefetched.used_bytes(),
                kept_chunk_hits: self.prefetched.hits.load(Ordering::Relaxed),
                ..self.readahead.stats()
            },
            store: StoreReadStats {
                data_gets: load(&c.data_gets),
                data_get_bytes: load(&c.data_get_bytes),
                header_gets: load(&c.header_gets),
                coalesced_pieces: load(&c.coalesced_pieces),
                inflight_waits: load(&c.inflight_waits),
                inflight_fallbacks: load(&c.inflight_fallbacks),
                chunks_in_flight: self.chunk_flights.len() as u64,
                hydration_gets: load(&c.hydration_gets),
                hydration_get_bytes: load(&c.hydration_get_bytes),
                hedged_gets: load(&self.hedge.hedged),
                hedge_wins: load(&self.hedge.hedge_wins),
            },
        }
    }

    /// Waits until the background work started before the call (read-ahead
    /// windows, disk-tier writes) has finished: for tests and benchmarks
    /// that compare counters, and for an orderly shutdown.
    pub async fn settle(&self) {
        self.background.settle().await;
    }

    /// The read state of volume `name` (instance `uuid`), created on its
    /// first read.
    /// `data_key`: an encrypted volume's (clones share their parent's).
    pub(crate) fn reader(
        &self,
        name: &str,
        uuid: [u8; 16],
        store: &Store,
        data_key: Option<Arc<Key>>,
    ) -> Arc<VolumeReader> {
        let mut readers = self.readers.lock();
        readers
            .entry(uuid)
            .or_insert_with(|| {
                Arc::new(VolumeReader {
                    name: name.to_string(),
                    uuid,
                    volume_key: volume_key(&uuid),
                    store: store.clone(),
                    names: ObjectNames::new(name),
                    streams: Mutex::new(Streams::default()),
                    gets: AtomicU64::new(0),
                    get_bytes: AtomicU64::new(0),
                    data_key,
                    hydrating: AtomicU64::new(0),
                    disk_read_ahead: Mutex::new(Default::default()),
                    gets_in_flight: std::sync::atomic::AtomicUsize::new(0),
                    activity: Default::default(),
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
        let client = Coalescing {
            max_gap_bytes: MAX_GAP_BYTES,
            max_get_bytes: MAX_GET_BYTES,
        };
        self.plan_fetch_with_gap(uuid, seq, numbers, missing, force, client)
    }

    /// `plan_fetch`, coalescing as `how` says (hydration's own bounds).
    pub(crate) fn plan_fetch_with_gap(
        &self,
        uuid: [u8; 16],
        seq: u64,
        numbers: &[u64],
        missing: &[usize],
        force: bool,
        how: Coalescing,
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
            how.max_gap_bytes / CHUNK_BYTES,
            (how.max_get_bytes / CHUNK_BYTES).max(1),
        )
        .into_iter()
        .map(|(run, claimed)| {
            let keys = own[claimed].iter().map(|&c| (uuid, seq, c)).collect();
            (run, table.claim(keys))
        })
        .collect();
        FetchPlan { runs, waits }
    }

    /// Caches the chunks `want` of a verified run in RAM, one copy per
    /// chunk (a slice would pin the whole GET's buffer and make the budget
    /// lie). The rest of the run (the block around a small read) only goes
    /// to disk: RAM keeps what was asked for.
    pub(crate) fn insert_ram(&self, uuid: [u8; 16], seq: u64, run: &RunBytes, want: &Range<u64>) {
        let from = want.start.max(run.first_chunk);
        for c in from..want.end {
            let Some(chunk) = run.chunk(c) else { break };
            let copy = Bytes::copy_from_slice(&chunk);
            self.chunks.insert((uuid, seq, c), copy, CHUNK_BYTES);
        }
    }

    /// Hands the whole blocks of a verified run to the disk cache's writer
    /// (`disk_writer.rs`), each on its second fetch (`admit`), or its first
    /// when `first_fetch` (a volume being hydrated). Slices of
    /// the GET's buffer, held only while queued. Never waits: measured
    /// here, a fetch that waited for the disk tier made a cold sequential
    /// read from MinIO 2.8x slower (131 vs 370 MB/s).
    pub(crate) fn insert_fetched(
        &self,
        volume_key: u64,
        seq: u64,
        run: &RunBytes,
        chunk_count: u64,
        first_fetch: bool,
    ) {
        if !self.disk.enabled() {
            return;
        }
        let end_chunk = run.first_chunk + (run.bytes.len() as u64).div_ceil(CHUNK_BYTES);
        let first_block = run.first_chunk.div_ceil(CHUNKS_PER_BLOCK);
        for block in first_block.. {
            let first = block * CHUNKS_PER_BLOCK;
            let last = (first + CHUNKS_PER_BLOCK).min(chunk_count);
            if last > end_chunk || first >= last {
                break;
            }
            let Ok(block32) = u32::try_from(block) else {
                break;
            };
            let key = BlockKey {
                volume_key,
                seq,
                block: block32,
            };
            if !first_fetch && !self.disk.admit(&key) {
                continue;
            }
            let at = ((first - run.first_chunk) * CHUNK_BYTES) as usize;
            let end = (((last - run.first_chunk) * CHUNK_BYTES) as usize).min(run.bytes.len());
            let blocks = Blocks {
                volume_key,
                seq,
                first_block: block32,
                bytes: run.bytes.slice(at..end),
                source: BlockSource::Fetched,
            };
            self.disk_writer
                .submit(blocks, None, self.background.start());
        }
    }

    /// Hands the data area of a segment written on this host, now in the
    /// store, to the disk cache's writer, waiting (boundedly) for room in
    /// its queue (`disk_writer.rs`); `on_done` runs once the writer lets go
    /// of it (at once when the tier is off or the data is dropped).
    pub(crate) async fn insert_written(
        &self,
        uuid: &[u8; 16],
        seq: u64,
        data: Bytes,
        on_done: OnDone,
    ) {
        if data.is_empty() || !self.disk.enabled() {
            on_done();
            return;
        }
        let blocks = Blocks {
            volume_key: volume_key(uuid),
            seq,
            first_block: 0,
            bytes: data,
            source: BlockSource::Written,
        };
        self.disk_writer
            .submit_written(blocks, Some(on_done), self.background.start())
            .await;
    }

    /// Hands a verified run fetched by hydration (block-aligned: the fetch
    /// widened it) to the disk cache's writer, waiting while its queue is
    /// over half full (`DiskWriter::submit_hydrated`). The receiver hears
    /// (or is dropped) once the writer is done with it.
    pub(crate) async fn insert_hydrated(
        &self,
        volume_key: u64,
        seq: u64,
        run: &RunBytes,
    ) -> tokio::sync::oneshot::Receiver<()> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let Ok(first_block) = u32::try_from(run.first_chunk / CHUNKS_PER_BLOCK) else {
            return rx;
        };
        if run.bytes.is_empty() || !run.first_chunk.is_multiple_of(CHUNKS_PER_BLOCK) {
            return rx;
        }
        let blocks = Blocks {
            volume_key,
            seq,
            first_block,
            bytes: run.bytes.clone(),
            source: BlockSource::Hydrated,
        };
        let done: OnDone = Box::new(move || {
            let _ = tx.send(());
        });
        self.disk_writer
            .submit_hydrated(blocks, done, self.background.start())
            .await;
        rx
    }

    /// Drops what the caches hold of segments that hold no live data any
    /// more (`(seq, object bytes)`, as a checkpoint lists them for
    /// deletion): their disk-cache blocks and their RAM index.
    pub(crate) fn forget_segments(&self, uuid: &[u8; 16], segments: &[(u64, u64)]) {
        for &(seq, object_bytes) in segments {
            self.indexes.remove(&(*uuid, seq));
            // The object's size bounds its data area's blocks.
            let blocks = u32::try_from(object_bytes.div_ceil(BLOCK_BYTES)).unwrap_or(u32::MAX);
            self.disk.forget_segment(volume_key(uuid), seq, blocks);
        }
    }

    /// Caches the index of a segment this server uploaded.
    pub(crate) fn insert_index(&self, uuid: [u8; 16], seq: u64, idx: Arc<SegmentIndex>) {
        self.indexes
            .insert((uuid, seq), idx.clone(), index_cost_bytes(&idx));
    }

    /// Whether the disk cache is on (and working).
    pub(crate) fn disk_enabled(&self) -> bool {
        self.disk.enabled()
    }
}

/// Read-ahead's kept runs: as much as the windows in flight can fetch
/// (`MAX_WINDOWS_IN_FLIGHT` of the largest window), twice, so a window
/// lands while the one before it is being read.
fn prefetched_budget_bytes(config: &VolumeConfig) -> u64 {
    let window = config.readahead_max_bytes.min(config.cache_bytes / 4);
    2 * super::readahead::MAX_WINDOWS_IN_FLIGHT as u64 * window
}

/// What a segment index costs in the index cache.
pub(crate) fn index_cost_bytes(idx: &SegmentIndex) -> u64 {
    idx.table_cost_bytes() + 256
}

/// Widens a run of chunks to the disk cache's blocks (so a small read miss
/// fetches, and caches, the whole 64 KiB block around it) when the disk
/// cache is on; within the segment's `chunk_count`.
pub(crate) fn block_aligned(run: &Range<u64>, chunk_count: u64) -> Range<u64> {
    let start = run.start / CHUNKS_PER_BLOCK * CHUNKS_PER_BLOCK;
    let end = run.end.div_ceil(CHUNKS_PER_BLOCK) * CHUNKS_PER_BLOCK;
    start..end.min(chunk_count).max(run.end)
}

const _: () = assert!(BLOCK_BYTES == CHUNKS_PER_BLOCK * CHUNK_BYTES);
