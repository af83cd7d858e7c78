//! The read of one volume's stored pieces, through every tier.
//!
//! 1. pieces are grouped by segment; segments are read in parallel
//!    (at most `MAX_PARALLEL_SEGMENTS` per read);
//! 2. each chunk a piece needs is looked up in RAM, then on disk
//!    (`disk_fill.rs`), then among the fetches in flight (waited for, not
//!    fetched again);
//! 3. the rest are claimed and coalesced (`fetch_plan.rs`) and fetched by
//!    ranged GETs in parallel (`segment_fetch.rs`), verified, cached, and
//!    handed to waiters;
//! 4. the pieces are copied out of the chunks into the client's buffer.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use parking_lot::Mutex;
use strata_store::{ObjectNames, Store};

use super::disk_streams::DiskStreams;
use super::fetch_plan::{ChunkKey, FetchKind, RunBytes, SegmentChunks, StoredPiece};
use super::inflight::Claim;
use super::readahead::Streams;
use super::reader_activity::ReaderActivity;
use super::shared_caches::SharedCaches;
use crate::error::VolumeError;
use crate::format::key_wrap::Key;
use crate::format::segment::{SegmentIndex, CHUNK_BYTES};
use crate::objects::store_error;

/// Segments of one read fetched at once.
const MAX_PARALLEL_SEGMENTS: usize = 8;
/// GETs of one segment (of one read) in flight at once.
const MAX_PARALLEL_GETS: usize = 8;
/// Largest `pread` of the embedded store's direct read (8 MiB).
const MAX_LOCAL_RUN_CHUNKS: u64 = 2048;
/// Read state of one volume: what fetching its segments needs (so
/// read-ahead tasks can run without the `Volume`), its stream table for
/// read-ahead, and its GET counters.
pub(crate) struct VolumeReader {
    pub name: String,
    pub uuid: [u8; 16],
    /// The volume's key in the disk cache (from its uuid).
    pub volume_key: u64,
    pub(crate) store: Store,
    pub(crate) names: ObjectNames,
    pub streams: Mutex<Streams>,
    pub gets: AtomicU64,
    pub get_bytes: AtomicU64,
    /// An encrypted volume's data key.
    pub data_key: Option<Arc<Key>>,
    /// Hydration tasks reading through this reader (a volume's own, or its
    /// clones' for an ancestor's segments): while any runs, what clients
    /// fetch enters the disk cache on its first fetch.
    pub hydrating: AtomicU64,
    /// The disk cache's read-ahead: the recent streams through segments,
    /// and how far ahead each asked the kernel to read (`disk_fill.rs`).
    pub disk_read_ahead: Mutex<DiskStreams>,
    /// This volume's data GETs in flight (its part of the server's fair
    /// share, `SharedCaches::gets_in_flight`).
    pub gets_in_flight: std::sync::atomic::AtomicUsize,
    /// What its clients do, for hydration to put them first.
    pub activity: ReaderActivity,
}

impl VolumeReader {
    pub(crate) fn corrupt(&self, seq: u64, detail: String) -> VolumeError {
        let path = self.names.segment(seq).to_string();
        tracing::error!(volume = %self.name, object = %path, %detail, "corrupt segment");
        VolumeError::Corrupt { path, detail }
    }

    /// Fills every piece's `dst` (see the module doc).
    pub async fn read_pieces(
        &self,
        caches: &SharedCaches,
        pieces: Vec<StoredPiece<'_>>,
    ) -> Result<(), VolumeError> {
        if self.store.is_local() && !caches.disk_enabled() {
            return self.read_local(caches, pieces).await;
        }
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
        if self.hydrating.load(Ordering::Relaxed) > 0 {
            if let Some(p) = pieces.first() {
                self.activity.note_read(seq, p.offset);
            }
        }
        let idx = self.segment_index(caches, seq).await?;
        let mut numbers = Vec::new();
        for p in &pieces {
            self.check_piece(&idx, seq, p)?;
        }
        // A sequential reader's pieces are in a run read-ahead kept: one
        // copy each, straight into the client's buffer.
        pieces = caches.prefetched.serve(&self.uuid, seq, pieces);
        if pieces.is_empty() {
            return Ok(());
        }
        // Pieces whose blocks are all in the disk cache are read straight
        // from it into the client's buffer (`disk_fill.rs`).
        if caches.disk_enabled() {
            pieces = self.serve_from_disk(caches, &idx, seq, pieces);
            if pieces.is_empty() {
                return Ok(());
            }
        }
        for p in &pieces {
            let end = p.offset + p.dst.len() as u64;
            numbers.extend(p.offset / CHUNK_BYTES..=(end - 1) / CHUNK_BYTES);
        }
        numbers.sort_unstable();
        numbers.dedup();
        let data = numbers
            .iter()
            .map(|&c| caches.chunks.get(&(self.uuid, seq, c)))
            .collect();
        let mut chunks = SegmentChunks { numbers, data };
        caches.prefetched.fill(&self.uuid, seq, &mut chunks);
        self.fill_from_disk(caches, &idx, seq, &mut chunks).await;
        self.fetch_missing(caches, &idx, seq, &mut chunks, &pieces)
            .await?;
        chunks
            .copy_out(&mut pieces)
            .map_err(|d| self.corrupt(seq, d))
    }

    /// The embedded store's read: its segments are local files in the page
    /// cache already, so no RAM cache (a second copy of the same bytes), no
    /// fetch bookkeeping: the pieces of each segment, sorted, are read in
    /// runs of touching chunks (one `pread` each, on this thread), verified,
    /// and copied once into the client's buffer.
    async fn read_local(
        &self,
        caches: &SharedCaches,
        mut pieces: Vec<StoredPiece<'_>>,
    ) -> Result<(), VolumeError> {
        pieces.sort_unstable_by_key(|p| (p.seq, p.offset));
        let mut rest = &mut pieces[..];
        while let Some(seq) = rest.first().map(|p| p.seq) {
            let n = rest.partition_point(|p| p.seq == seq);
            let (same, next) = rest.split_at_mut(n);
            let idx = self.segment_index(caches, seq).await?;
            self.read_local_segment(caches, &idx, seq, same)?;
            rest = next;
        }
        Ok(())
    }

    /// Reads `pieces` (of segment `seq`, sorted by offset) in runs: one
    /// `pread` each, verified; a run that is one piece of whole chunks is
    /// read into the client's buffer itself, others into a buffer reused
    /// across runs and copied out.
    fn read_local_segment(
        &self,
        caches: &SharedCaches,
        idx: &SegmentIndex,
        seq: u64,
        pieces: &mut [StoredPiece<'_>],
    ) -> Result<(), VolumeError> {
        let path = self.names.segment(seq);
        let file = match self.store.local_file(&path) {
            Some(f) => f.map_err(store_error(&self.store, "read", &path))?,
            None => return Err(self.corrupt(seq, "not a local store".into())),
        };
        let read_stored = |offset: u64, buf: &mut [u8]| {
            file.read_exact_at(buf, offset)
                .map_err(store_error(&self.store, "read", &path))?;
            self.count_data_read(caches, buf.len() as u64);
            Ok::<(), VolumeError>(())
        };
        let mut scratch: Vec<u8> = Vec::new();
        let mut k = 0;
        while k < pieces.len() {
            let (first, last, m) = self.local_run(idx, seq, pieces, k)?;
            let range = idx.chunk_range(first, last);
            let len = (range.end - range.start) as usize;
            let p = &mut pieces[k];
            let whole = p.offset == first * CHUNK_BYTES && p.dst.len() == len;
            if m == k + 1 && whole && idx.stored_as_is(first, len) {
                read_stored(range.start, p.dst)?;
                idx.verify(first, p.dst).map_err(|d| self.corrupt(seq, d))?;
                k = m;
                continue;
            }
            if scratch.len() < len {
                scratch.resize(len, 0);
            }
            read_stored(range.start, &mut scratch[..len])?;
            let bytes = idx
                .decode_run(first, &scratch[..len])
                .map_err(|d| self.corrupt(seq, d))?;
            for p in &mut pieces[k..m] {
                let at = (p.offset - first * CHUNK_BYTES) as usize;
                let src = bytes
                    .get(at..at + p.dst.len())
                    .ok_or_else(|| self.corrupt(seq, "short segment read".into()))?;
                p.dst.copy_from_slice(src);
            }
            k = m;
        }
        Ok(())
    }

    /// The run starting at piece `k`: its first and last chunk and the end
    /// (exclusive) of its pieces, which touch or overlap chunk-wise, up to
    /// `MAX_LOCAL_RUN_CHUNKS`.
    fn local_run(
        &self,
        idx: &SegmentIndex,
        seq: u64,
        pieces: &[StoredPiece<'_>],
        k: usize,
    ) -> Result<(u64, u64, usize), VolumeError> {
        let first = pieces[k].offset / CHUNK_BYTES;
        let mut last = first;
        let mut m = k;
        while let Some(p) = pieces.get(m) {
            self.check_piece(idx, seq, p)?;
            let end = p.offset + p.dst.len() as u64;
            let (pf, pl) = (p.offset / CHUNK_BYTES, (end - 1) / CHUNK_BYTES);
            if m > k && (pf > last + 1 || pl + 1 - first > MAX_LOCAL_RUN_CHUNKS) {
                break;
            }
            last = last.max(pl);
            m += 1;
        }
        Ok((first, last, m))
    }

    /// A stored piece the map handed us must lie within the segment's data.
    fn check_piece(
        &self,
        idx: &SegmentIndex,
        seq: u64,
        p: &StoredPiece<'_>,
    ) -> Result<(), VolumeError> {
        let end = p.offset + p.dst.len() as u64;
        if p.dst.is_empty() || end > idx.fixed.data_bytes {
            let detail = format!(
                "map points past the data end ({}+{})",
                p.offset,
                p.dst.len()
            );
            return Err(self.corrupt(seq, detail));
        }
        Ok(())
    }

    /// Fetches what no cache had: waits for fetches in flight, claims and
    /// fetches the rest. A second round fetches what the waited-for
    /// fetches did not deliver, without waiting again.
    async fn fetch_missing(
        &self,
        caches: &SharedCaches,
        idx: &Arc<SegmentIndex>,
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
                .map(|(run, claim)| self.fetch_run(caches, idx, seq, run, claim, FetchKind::Read))
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
