//! Hydration's mechanism: fetching the blocks a volume's stored pieces
//! touch into the disk cache, in large ranged GETs, many in flight, within
//! server-wide bounds; and each volume's progress.
//!
//! This file owns the per-volume progress (`Hydration`, reported as
//! `HydrationStats`) and the fetch of one segment's missing blocks
//! (`hydrate_segment`); the server-wide bounds are `hydration_limits.rs`. Which ranges
//! to hydrate, in which order, and when to stop is `volume/hydrate.rs`.
//!
//! Bounds: at most `MAX_HYDRATION_GETS` GETs server-wide (of the store's 64
//! request slots, so client reads always find room), each of at most
//! `MAX_GET_BYTES`; fetched runs wait in read-ahead's kept runs (a byte
//! budget) until the disk cache's writer has them, and the writer takes
//! them only while its queue is at most half full. Blocks go into free
//! slots only (`BlockCache::insert_hydrated`): hydration never evicts.
//!
//! Every byte is verified against its segment's CRC table before it is
//! kept (`fetch_run`), as for any read; chunks being fetched by a client
//! read are not fetched again (the flight table's claims).

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use super::block_cache::{BlockKey, CHUNKS_PER_BLOCK};
use super::fetch_plan::{coalesce, Coalescing, FetchKind, RunBytes};
use super::hydration_limits::MAX_HYDRATION_GETS;
use super::rest_gate::RestGate;
use super::shared_caches::SharedCaches;
use super::volume_reader::VolumeReader;
use crate::error::VolumeError;
use crate::format::segment::CHUNK_BYTES;

/// Where a volume's hydration stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[repr(u8)]
pub enum HydrationState {
    /// Not hydrating (`--hydrate off`, `auto` on a volume this host
    /// wrote, no disk cache, or the embedded store).
    Off = 0,
    /// Measuring what the volume reads from the store.
    Scanning = 1,
    /// Fetching.
    Running = 2,
    /// Every stored byte of the volume is in the disk cache.
    Done = 3,
    /// Stopped: the disk cache has no free slot left (hydration never
    /// evicts; a volume larger than the cache stays partly remote).
    CacheFull = 4,
    /// Stopped by errors (the store failing); clients' reads still work.
    Failed = 5,
}

impl HydrationState {
    fn from_u8(v: u8) -> HydrationState {
        match v {
            1 => HydrationState::Scanning,
            2 => HydrationState::Running,
            3 => HydrationState::Done,
            4 => HydrationState::CacheFull,
            5 => HydrationState::Failed,
            _ => HydrationState::Off,
        }
    }
}

/// A volume's hydration, as `volume info` and `/metrics` show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HydrationStats {
    /// The mode asked for (`on`, `off`, `auto`) and why it runs or not.
    pub mode: String,
    pub state: HydrationState,
    /// Bytes of the volume's data in stored segments (not in memory) ...
    pub total_bytes: u64,
    /// ... of which in the disk cache (local).
    pub local_bytes: u64,
    /// Bytes hydration fetched since the volume was opened, in GETs.
    pub fetched_bytes: u64,
    pub gets: u64,
    /// Fetch rate since hydration started.
    pub rate_bytes_per_sec: u64,
    /// Seconds until local at that rate (while running).
    pub eta_seconds: Option<u64>,
    /// Since the volume was opened, until done or stopped.
    pub elapsed_ms: u64,
    /// The clone's access profile: recording, prefetching, prefetched (or
    /// empty: none).
    pub profile: String,
    /// Bytes of the profile's ranges local after its prefetch so far.
    pub profile_bytes: u64,
    /// Of `gets` and `fetched_bytes`: those ahead of a client's reads
    /// (the region it reads, fetched before it asks).
    pub lead_gets: u64,
    pub lead_bytes: u64,
}

/// One volume's hydration progress. Cheap atomics: the task writes, stats
/// read.
pub(crate) struct Hydration {
    pub mode: String,
    state: AtomicU8,
    pub total_bytes: AtomicU64,
    pub local_bytes: AtomicU64,
    pub fetched_bytes: AtomicU64,
    pub gets: AtomicU64,
    started: Instant,
    /// When the state became final (done, cache full, failed).
    finished: Mutex<Option<Instant>>,
    profile: Mutex<String>,
    pub profile_bytes: AtomicU64,
    /// GETs and bytes of units ahead of a reader (`HydrationStats`).
    pub lead_gets: AtomicU64,
    pub lead_bytes: AtomicU64,
    /// GETs of the rest of the volume in flight, as clients allow.
    pub(crate) rest_gate: RestGate,
    /// Bytes the volume's clients have read since it was opened: how far
    /// into the profile a boot is (`volume/hydrate.rs`, its prefetch).
    pub(crate) client_read_bytes: AtomicU64,
}

impl Hydration {
    pub fn new(mode: String, state: HydrationState) -> Hydration {
        Hydration {
            mode,
            state: AtomicU8::new(state as u8),
            total_bytes: AtomicU64::new(0),
            local_bytes: AtomicU64::new(0),
            fetched_bytes: AtomicU64::new(0),
            gets: AtomicU64::new(0),
            started: Instant::now(),
            finished: Mutex::new(None),
            profile: Mutex::new(String::new()),
            profile_bytes: AtomicU64::new(0),
            lead_gets: AtomicU64::new(0),
            lead_bytes: AtomicU64::new(0),
            rest_gate: RestGate::new(MAX_HYDRATION_GETS),
            client_read_bytes: AtomicU64::new(0),
        }
    }

    pub fn state(&self) -> HydrationState {
        HydrationState::from_u8(self.state.load(Ordering::Acquire))
    }

    pub fn set_state(&self, state: HydrationState) {
        self.state.store(state as u8, Ordering::Release);
        if matches!(
            state,
            HydrationState::Done | HydrationState::CacheFull | HydrationState::Failed
        ) {
            self.finished.lock().get_or_insert_with(Instant::now);
        }
    }

    pub fn set_profile(&self, what: String) {
        *self.profile.lock() = what;
    }

    pub fn elapsed(&self) -> Duration {
        self.finished
            .lock()
            .unwrap_or_else(Instant::now)
            .duration_since(self.started)
    }

    pub fn stats(&self) -> HydrationStats {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let state = self.state();
        let elapsed = self.elapsed();
        let fetched = load(&self.fetched_bytes);
        let rate = if elapsed.as_millis() > 0 {
            (fetched as u128 * 1000 / elapsed.as_millis()) as u64
        } else {
            0
        };
        let (total, local) = (load(&self.total_bytes), load(&self.local_bytes));
        let eta_seconds = match state {
            HydrationState::Running | HydrationState::Scanning if rate > 0 => {
                Some(total.saturating_sub(local) / rate)
            }
            _ => None,
        };
        HydrationStats {
            mode: self.mode.clone(),
            state,
            total_bytes: total,
            local_bytes: local.min(total),
            fetched_bytes: fetched,
            gets: load(&self.gets),
            rate_bytes_per_sec: rate,
            eta_seconds,
            elapsed_ms: elapsed.as_millis() as u64,
            profile: self.profile.lock().clone(),
            profile_bytes: load(&self.profile_bytes),
            lead_gets: load(&self.lead_gets),
            lead_bytes: load(&self.lead_bytes),
        }
    }
}

/// Missing blocks at most `coalescing.max_gap_bytes` apart in a segment
/// share one GET: fetching what lies between costs less than a request to a store
/// that answers in 10-30 ms (1 MiB at ~100 MB/s a connection is ~10 ms).
/// `cache_between`: the blocks between go to the disk cache too (a
/// profile's neighbours, which hydration wants next anyway); otherwise
/// only the missing blocks do, so data no piece holds (dead, or another
/// volume's) never takes a slot.
/// `coalescing` also bounds each GET; `lead`: the fetch is ahead of a
/// client's reads (its own slots, so the rest of hydration does not hold
/// it up); `yields`: each GET passes the volume's `RestGate` first (the
/// rest of the volume, which waits while clients read).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Gaps {
    pub coalescing: Coalescing,
    pub cache_between: bool,
    pub lead: bool,
    pub yields: bool,
}

/// What hydrating one segment's pieces found and did.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct SegmentOutcome {
    /// Bytes of the pieces local after the fetch.
    pub local_bytes: u64,
    /// Bytes of the pieces still not local (cache full, a failed GET).
    pub remote_bytes: u64,
}

/// Fetches into the disk cache the blocks of segment `seq` that `pieces`
/// (`(segment offset, len)`, of logical data) touch and the cache lacks;
/// through `reader`, the reader of the volume that owns the segment.
/// Returns how much of the pieces is local afterwards. A GET that fails
/// is an error for the caller to count; nothing is cached from it.
/// `gaps`: how far apart missing blocks may be and still share a GET, and
/// what becomes of the blocks between them.
pub(crate) async fn hydrate_segment(
    caches: &SharedCaches,
    reader: &VolumeReader,
    seq: u64,
    pieces: &[(u64, u64)],
    progress: &Hydration,
    gaps: Gaps,
) -> Result<SegmentOutcome, VolumeError> {
    let blocks_of = |&(offset, len): &(u64, u64)| {
        let chunk_bytes = CHUNK_BYTES * CHUNKS_PER_BLOCK;
        offset / chunk_bytes..=(offset + len.max(1) - 1) / chunk_bytes
    };
    let mut blocks: Vec<u64> = pieces.iter().flat_map(blocks_of).collect();
    blocks.sort_unstable();
    blocks.dedup();
    let theirs = fetch_missing(caches, reader, seq, &blocks, progress, gaps).await?;
    let local = |b: u64| is_local(caches, reader, seq, &theirs, b);
    let mut out = SegmentOutcome::default();
    for p in pieces {
        if blocks_of(p).all(local) {
            out.local_bytes += p.1;
        } else {
            out.remote_bytes += p.1;
        }
    }
    Ok(out)
}

/// Fetches into the disk cache the blocks `blocks` (sorted, distinct) of
/// segment `seq` that the cache lacks, all of them kept (hydration's main
/// pass: each a block of live data); returns how many of `blocks` are
/// local afterwards.
pub(crate) async fn hydrate_blocks(
    caches: &SharedCaches,
    reader: &VolumeReader,
    seq: u64,
    blocks: &[u64],
    progress: &Hydration,
    gaps: Gaps,
) -> Result<u64, VolumeError> {
    let theirs = fetch_missing(caches, reader, seq, blocks, progress, gaps).await?;
    let local = blocks
        .iter()
        .filter(|&&b| is_local(caches, reader, seq, &theirs, b))
        .count();
    Ok(local as u64)
}

fn block_key(reader: &VolumeReader, seq: u64, block: u64) -> BlockKey {
    BlockKey {
        volume_key: reader.volume_key,
        seq,
        block: u32::try_from(block).unwrap_or(u32::MAX),
    }
}

/// Whether block `block` is local after a fetch: on disk, or fetched by
/// another (`theirs`, sorted), which writes it.
fn is_local(
    caches: &SharedCaches,
    reader: &VolumeReader,
    seq: u64,
    theirs: &[u64],
    block: u64,
) -> bool {
    theirs.binary_search(&block).is_ok() || caches.disk.contains(&block_key(reader, seq, block))
}

/// Claims and fetches the chunks of the blocks of `blocks` (sorted,
/// distinct) the disk cache lacks and has room for, coalesced into GETs as
/// `gaps` says, each under a server-wide slot and the rate limit, and
/// waits until the disk cache's writer is done with them. Returns the
/// blocks others were fetching (waited for), sorted: they go to disk
/// through them (a client read, another clone's hydration).
async fn fetch_missing(
    caches: &SharedCaches,
    reader: &VolumeReader,
    seq: u64,
    blocks: &[u64],
    progress: &Hydration,
    gaps: Gaps,
) -> Result<Vec<u64>, VolumeError> {
    let blocks: Vec<u64> = blocks
        .iter()
        .copied()
        .filter(|&b| {
            let key = block_key(reader, seq, b);
            !caches.disk.contains(&key) && caches.disk.has_room_for(&key)
        })
        .collect();
    if blocks.is_empty() {
        return Ok(Vec::new());
    }
    let blocks = &blocks[..];
    let idx = reader.segment_index(caches, seq).await?;
    let chunk_count = u64::from(idx.fixed.chunk_count);
    let numbers: Vec<u64> = blocks
        .iter()
        .flat_map(|&b| b * CHUNKS_PER_BLOCK..((b + 1) * CHUNKS_PER_BLOCK).min(chunk_count))
        .collect();
    // A unit that yields to clients plans and claims each GET's chunks
    // only once it passes the gate: a claim waiting there would hold up a
    // client read of those chunks for as long as the client keeps it shut.
    let how = gaps.coalescing;
    let groups: Vec<Vec<u64>> = if gaps.yields {
        let run_chunks = (how.max_get_bytes / CHUNK_BYTES).max(1);
        coalesce(&numbers, how.max_gap_bytes / CHUNK_BYTES, run_chunks)
            .into_iter()
            .map(|(_, covered)| numbers[covered].to_vec())
            .collect()
    } else {
        vec![numbers]
    };
    let fetches = futures::stream::iter(groups).map(|group| {
        let idx = idx.clone();
        async move {
            let _pass = match gaps.yields {
                true => Some(progress.rest_gate.enter().await),
                false => None,
            };
            fetch_group(caches, reader, seq, &idx, &group, blocks, progress, gaps).await
        }
    });
    let groups: Vec<_> = fetches.buffer_unordered(MAX_HYDRATION_GETS).collect().await;
    let mut waited = Vec::new();
    let mut results = Vec::new();
    for (written, theirs) in groups {
        results.extend(written);
        waited.extend(theirs);
    }
    let mut first_error = None;
    for r in results {
        match r {
            // Dropped unsent only when the tier went off: nothing to wait for.
            Ok(written) => {
                for w in written {
                    drop(w.await);
                }
            }
            Err(e) => first_error = first_error.or(Some(e)),
        }
    }
    if let Some(e) = first_error {
        return Err(e);
    }
    let mut theirs: Vec<u64> = waited
        .into_iter()
        .flatten()
        .flat_map(|run| {
            let first = run.first_chunk / CHUNKS_PER_BLOCK;
            let chunks = (run.bytes.len() as u64).div_ceil(CHUNK_BYTES);
            first..first + chunks.div_ceil(CHUNKS_PER_BLOCK)
        })
        .collect();
    theirs.sort_unstable();
    theirs.dedup();
    Ok(theirs)
}

type Written = Result<Vec<tokio::sync::oneshot::Receiver<()>>, VolumeError>;

/// Plans `numbers` (chunks of segment `seq`, sorted), claims what no one
/// fetches, and fetches it in GETs under the hydration slots; returns each
/// GET's disk writes, and the runs of the chunks a client read was
/// fetching already (not ours).
#[allow(clippy::too_many_arguments)]
async fn fetch_group(
    caches: &SharedCaches,
    reader: &VolumeReader,
    seq: u64,
    idx: &std::sync::Arc<crate::format::segment::SegmentIndex>,
    numbers: &[u64],
    blocks: &[u64],
    progress: &Hydration,
    gaps: Gaps,
) -> (Vec<Written>, Vec<Option<RunBytes>>) {
    let all: Vec<usize> = (0..numbers.len()).collect();
    // The rate limit is taken before anything is claimed: a client read of
    // these chunks waits for a claim's GET, and must not wait for the
    // limit too (with `--hydrate-rate 4KiB`, a client's 4 KiB read of a
    // claimed chunk waited past qemu-io's 120 s timeout:
    // `tests/hydration.rs::a_clients_read_never_waits_for_the_hydration_rate_limit`).
    if let (Some(&first), Some(&last)) = (numbers.first(), numbers.last()) {
        let stored = idx.chunk_range(first, last);
        caches.hydration_rate.take(stored.end - stored.start).await;
    }
    // Chunks a client read is fetching come back as waits: not ours.
    let plan = caches.plan_fetch_with_gap(reader.uuid, seq, numbers, &all, false, gaps.coalescing);
    let fetches = futures::stream::iter(plan.runs).map(|(run, claim)| {
        let idx = idx.clone();
        async move {
            let slots = if gaps.lead {
                &caches.lead_slots
            } else {
                &caches.hydration_slots
            };
            let _slot = slots
                .acquire()
                .await
                .map_err(|_| VolumeError::Invalid("hydration stopped".into()))?;
            let fetched = reader
                .fetch_run(caches, &idx, seq, run, claim, FetchKind::Hydrate)
                .await?;
            progress.gets.fetch_add(1, Ordering::Relaxed);
            let got = fetched.bytes.len() as u64;
            progress.fetched_bytes.fetch_add(got, Ordering::Relaxed);
            if gaps.lead {
                progress.lead_gets.fetch_add(1, Ordering::Relaxed);
                progress.lead_bytes.fetch_add(got, Ordering::Relaxed);
            }
            let mut written = Vec::new();
            for part in wanted_parts(&fetched, blocks, gaps.cache_between) {
                written.push(caches.insert_hydrated(reader.volume_key, seq, &part).await);
            }
            Ok::<_, VolumeError>(written)
        }
    });
    let waits = futures::future::join_all(plan.waits.into_iter().map(|(_, w)| w.value()));
    let (results, waited) = futures::future::join(
        fetches
            .buffer_unordered(MAX_HYDRATION_GETS)
            .collect::<Vec<_>>(),
        waits,
    )
    .await;
    (results, waited)
}

/// The parts of a fetched, block-aligned run to write to the disk cache:
/// all of it (`cache_between`), or its maximal stretches of `wanted`
/// blocks (sorted), sliced without a copy.
fn wanted_parts(run: &RunBytes, wanted: &[u64], cache_between: bool) -> Vec<RunBytes> {
    if cache_between {
        return vec![run.clone()];
    }
    let block_bytes = (CHUNK_BYTES * CHUNKS_PER_BLOCK) as usize;
    let first = run.first_chunk / CHUNKS_PER_BLOCK;
    let count = run.bytes.len().div_ceil(block_bytes) as u64;
    let mut parts: Vec<RunBytes> = Vec::new();
    let mut stretch: Option<(u64, u64)> = None;
    let close = |from: u64, to: u64, parts: &mut Vec<RunBytes>| {
        let at = (from - first) as usize * block_bytes;
        let end = ((to - first) as usize * block_bytes).min(run.bytes.len());
        parts.push(RunBytes {
            first_chunk: from * CHUNKS_PER_BLOCK,
            bytes: run.bytes.slice(at..end),
        });
    };
    for b in first..first + count {
        let want = wanted.binary_search(&b).is_ok();
        stretch = match (stretch, want) {
            (Some((from, to)), true) if to == b => Some((from, b + 1)),
            (Some((from, to)), _) => {
                close(from, to, &mut parts);
                want.then_some((b, b + 1))
            }
            (None, true) => Some((b, b + 1)),
            (None, false) => None,
        };
    }
    if let Some((from, to)) = stretch {
        close(from, to, &mut parts);
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_wanted_blocks_of_a_run_are_written_unless_asked() {
        let block = (CHUNK_BYTES * CHUNKS_PER_BLOCK) as usize;
        let bytes: Vec<u8> = (0..5 * block - 100).map(|i| (i / block) as u8).collect();
        let run = RunBytes {
            first_chunk: 10 * CHUNKS_PER_BLOCK,
            bytes: bytes::Bytes::from(bytes),
        };
        assert_eq!(wanted_parts(&run, &[], true).len(), 1);
        let parts = wanted_parts(&run, &[3, 10, 11, 13, 14, 20], false);
        let got: Vec<(u64, usize, u8)> = parts
            .iter()
            .map(|p| (p.first_chunk / CHUNKS_PER_BLOCK, p.bytes.len(), p.bytes[0]))
            .collect();
        // Blocks 10-11, then 13-14 (the last one short, as the run is).
        assert_eq!(got, vec![(10, 2 * block, 0), (13, 2 * block - 100, 3)]);
        assert!(wanted_parts(&run, &[12], false)[0]
            .bytes
            .iter()
            .all(|&b| b == 2));
    }

    #[test]
    fn stats_report_rate_and_eta_only_while_running() {
        let h = Hydration::new("on".into(), HydrationState::Running);
        h.total_bytes.store(100 << 20, Ordering::Relaxed);
        h.local_bytes.store(50 << 20, Ordering::Relaxed);
        h.fetched_bytes.store(50 << 20, Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(20));
        let s = h.stats();
        assert!(s.rate_bytes_per_sec > 0);
        assert!(s.eta_seconds.is_some());
        h.set_state(HydrationState::Done);
        let s = h.stats();
        assert_eq!(s.state, HydrationState::Done);
        assert_eq!(s.eta_seconds, None);
        let frozen = s.elapsed_ms;
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(h.stats().elapsed_ms, frozen, "elapsed stops when done");
    }
}
