//! Read-ahead's mechanism: turning a window `readahead.rs` opened into
//! claimed chunk runs and fetching them in the background through the read
//! path's verified fetch (so a reader arriving early waits for them instead
//! of fetching again).

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures::StreamExt;

use super::block_cache::BlockKey;
use super::fetch_plan::{ChunkKey, FetchKind, RunBytes};
use super::inflight::Claim;
use super::shared_caches::SharedCaches;
use super::volume_reader::VolumeReader;
use crate::format::segment::CHUNK_BYTES;

/// GETs of one window in flight at once.
const MAX_WINDOW_GETS: usize = 4;
/// Stored pieces one window collects at most (a window over a volume of
/// tiny extents stops early rather than holding the lock long).
pub(crate) const MAX_WINDOW_PIECES: usize = 4096;

/// Claimed runs of one segment to prefetch, with the reader of the volume
/// that owns the segment (a clone's ancestor's, for inherited data).
type SegmentRuns = (
    Arc<VolumeReader>,
    u64,
    Vec<(Range<u64>, Claim<ChunkKey, RunBytes>)>,
);

/// Notes a read of `[offset, offset+len)` of a volume of `size_bytes` and,
/// for a sequential reader, starts fetching the next window in the
/// background. `stored_pieces` looks a window up in the volume's map (under
/// its lock, no I/O); `reader_for` names the reader of the volume that owns
/// a segment (`Lineage::reader_for`: a clone reads ahead in its image's
/// data too). Never waits and does no I/O itself.
pub(crate) fn start_readahead(
    caches: &Arc<SharedCaches>,
    reader: &Arc<VolumeReader>,
    offset: u64,
    len: u64,
    size_bytes: u64,
    stored_pieces: impl FnOnce(Range<u64>) -> Vec<(u64, u64, u64)>,
    reader_for: impl Fn(u64) -> Arc<VolumeReader>,
) {
    let ra = &caches.readahead;
    if ra.max_window_bytes == 0 || len == 0 {
        return;
    }
    let window = reader
        .streams
        .lock()
        .observe(offset, len, ra.max_window_bytes, size_bytes);
    let Some(window) = window else { return };
    let Ok(permit) = ra.slots.clone().try_acquire_owned() else {
        ra.windows_skipped.fetch_add(1, Ordering::Relaxed);
        return;
    };
    let plan = claim_window(caches, stored_pieces(window), reader_for);
    if plan.is_empty() {
        return;
    }
    ra.windows_issued.fetch_add(1, Ordering::Relaxed);
    let caches = caches.clone();
    let job = caches.background.start();
    tokio::spawn(async move {
        prefetch(&caches, plan).await;
        drop((permit, job));
    });
}

/// Claims the chunks of `pieces` no tier has and nobody is fetching.
fn claim_window(
    caches: &SharedCaches,
    pieces: Vec<(u64, u64, u64)>,
    reader_for: impl Fn(u64) -> Arc<VolumeReader>,
) -> Vec<SegmentRuns> {
    let mut by_seq: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for (seq, offset, len) in pieces {
        let chunks = offset / CHUNK_BYTES..=(offset + len - 1) / CHUNK_BYTES;
        by_seq.entry(seq).or_default().extend(chunks);
    }
    let mut plan = Vec::new();
    for (seq, mut numbers) in by_seq {
        let reader = reader_for(seq);
        numbers.sort_unstable();
        numbers.dedup();
        let kept = caches.prefetched.covered(&reader.uuid, seq, &numbers);
        let cached = |i: usize, c: u64| {
            kept[i]
                || caches.chunks.contains(&(reader.uuid, seq, c))
                || BlockKey::of_chunk(reader.volume_key, seq, c)
                    .is_some_and(|k| caches.disk.contains(&k))
        };
        let missing: Vec<usize> = (0..numbers.len())
            .filter(|&i| !cached(i, numbers[i]))
            .collect();
        // Chunks others are fetching come back as waits: nothing to do.
        let runs = caches
            .plan_fetch(reader.uuid, seq, &numbers, &missing, false)
            .runs;
        if !runs.is_empty() {
            plan.push((reader, seq, runs));
        }
    }
    plan
}

/// Fetches claimed runs into the caches. Errors only end the prefetch (the
/// claims drop, and readers waiting for them fetch for themselves).
async fn prefetch(caches: &SharedCaches, plan: Vec<SegmentRuns>) {
    for (reader, seq, runs) in plan {
        let idx = match reader.segment_index(caches, seq).await {
            Ok(idx) => idx,
            Err(e) => {
                tracing::debug!(volume = %reader.name, seq, error = %strata_store::ErrorText(&e), "read-ahead stopped");
                return;
            }
        };
        let results: Vec<_> = futures::stream::iter(runs)
            .map(|(run, claim)| {
                reader.fetch_run(caches, &idx, seq, run, claim, FetchKind::ReadAhead)
            })
            .buffer_unordered(MAX_WINDOW_GETS)
            .collect()
            .await;
        if let Some(Err(e)) = results.into_iter().find(Result::is_err) {
            tracing::debug!(volume = %reader.name, seq, error = %strata_store::ErrorText(&e), "read-ahead fetch failed");
        }
    }
}
