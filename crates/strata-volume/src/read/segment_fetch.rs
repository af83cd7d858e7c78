//! Fetching from the store for one volume's reader: a segment's verified
//! index (fetched once however many ask), and ranged GETs of chunk runs,
//! verified against the index before anything is cached or handed out.

use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;

use super::background_cpu;
use super::fetch_plan::{ChunkKey, FetchKind, RunBytes};
use super::hedge::{hedged, Race, MAX_HEDGED_BYTES};
use super::inflight::Claim;
use super::shared_caches::{block_aligned, index_cost_bytes, SharedCaches};
use super::volume_reader::VolumeReader;
use crate::config::MAX_VOLUME_BYTES;
use crate::error::VolumeError;
use crate::format::segment::SegmentIndex;
use crate::objects::{fetch_segment_header, store_error};

impl VolumeReader {
    /// One ranged GET for chunks `run` (widened to whole disk-cache blocks
    /// when that tier is on): verified, the chunks of `run` cached in RAM
    /// (a client read) or the run kept whole (read-ahead, hydration),
    /// handed to the claim's waiters, then the blocks written to disk.
    pub(crate) async fn fetch_run(
        &self,
        caches: &SharedCaches,
        idx: &Arc<SegmentIndex>,
        seq: u64,
        run: Range<u64>,
        claim: Claim<ChunkKey, RunBytes>,
        kind: FetchKind,
    ) -> Result<RunBytes, VolumeError> {
        let chunk_count = u64::from(idx.fixed.chunk_count);
        if run.is_empty() || run.end > chunk_count {
            let detail = format!("chunks {run:?} outside the segment");
            return Err(self.corrupt(seq, detail));
        }
        let get = if caches.disk_enabled() {
            block_aligned(&run, chunk_count)
        } else {
            run.clone()
        };
        let range = idx.chunk_range(get.start, get.end - 1);
        // A client's miss while hydrating: hydration hears of it (and
        // counts it) to fetch what lies ahead of the reader.
        let client_miss = kind == FetchKind::Read && self.hydrating.load(Ordering::Relaxed) > 0;
        let in_flight = client_miss.then(|| self.activity.fetch_started());
        let stored = self.get_range(caches, seq, range, kind).await?;
        drop(in_flight);
        // A client waits for its own runs' decode; read-ahead's and
        // hydration's run beside it at a lower priority.
        let decoded = if kind == FetchKind::Read {
            decode(idx, get.start, stored)
        } else {
            let idx = idx.clone();
            background_cpu::run(move || decode(&idx, get.start, stored)).await
        };
        let bytes = decoded.map_err(|d| self.corrupt(seq, d))?;
        let fetched = RunBytes {
            first_chunk: get.start,
            bytes,
        };
        match kind {
            FetchKind::Read => caches.insert_ram(self.uuid, seq, &fetched, &run),
            // Kept whole until readers take them or, for hydration, until
            // the disk cache's writer has them on disk.
            FetchKind::ReadAhead | FetchKind::Hydrate => {
                caches.prefetched.insert(self.uuid, seq, fetched.clone())
            }
        }
        claim.complete(fetched.clone());
        drop(claim);
        match kind {
            // Hydration hands its runs to the disk cache itself, and waits.
            FetchKind::Hydrate => {}
            _ => {
                // A volume being hydrated caches what clients read at once:
                // it is wanted on disk anyway.
                let first_fetch = self.hydrating.load(Ordering::Relaxed) > 0;
                caches.insert_fetched(self.volume_key, seq, &fetched, chunk_count, first_fetch)
            }
        }
        Ok(fetched)
    }

    async fn get_range(
        &self,
        caches: &SharedCaches,
        seq: u64,
        range: Range<u64>,
        kind: FetchKind,
    ) -> Result<Bytes, VolumeError> {
        let path = self.names.segment(seq);
        let want = range.end - range.start;
        let c = &caches.counters;
        c.data_gets.fetch_add(1, Ordering::Relaxed);
        self.gets.fetch_add(1, Ordering::Relaxed);
        // Clients' small reads are hedged past the store's usual tail
        // (`hedge.rs`); read-ahead and hydration never wait on one GET.
        let delay = match kind {
            FetchKind::Read if caches.hedge_reads => caches.hedge.delay_for(want),
            _ => None,
        };
        // A volume over its share of the server's GETs waits here, not in
        // the store's queue ahead of another volume's read (`fair_slots.rs`).
        let slot = caches.gets_in_flight.acquire(&self.gets_in_flight).await;
        let started = std::time::Instant::now();
        let send = || {
            let (path, range) = (&path, range.clone());
            async move { self.store.get_range(path, range).await }
        };
        let (answer, race) = hedged(send, delay).await;
        drop(slot);
        if kind == FetchKind::Read && want <= MAX_HEDGED_BYTES {
            caches.hedge.record(started.elapsed());
        }
        if race != Race::Once {
            c.data_gets.fetch_add(1, Ordering::Relaxed);
            self.gets.fetch_add(1, Ordering::Relaxed);
            caches.hedge.hedged.fetch_add(1, Ordering::Relaxed);
        }
        if race == Race::SecondWon {
            caches.hedge.hedge_wins.fetch_add(1, Ordering::Relaxed);
        }
        let bytes = answer.map_err(store_error(&self.store, "read", &path))?;
        let got = bytes.len() as u64;
        c.data_get_bytes.fetch_add(got, Ordering::Relaxed);
        self.get_bytes.fetch_add(got, Ordering::Relaxed);
        match kind {
            FetchKind::ReadAhead => caches.readahead.count_prefetched(got),
            FetchKind::Hydrate => {
                c.hydration_gets.fetch_add(1, Ordering::Relaxed);
                c.hydration_get_bytes.fetch_add(got, Ordering::Relaxed);
            }
            FetchKind::Read => {}
        }
        if got != want {
            return Err(self.corrupt(seq, format!("short read: {got} of {want} bytes")));
        }
        Ok(bytes)
    }

    /// Counts a read of segment data that did not go through `get_range`
    /// (the embedded store's direct `pread`s) like a GET.
    pub(crate) fn count_data_read(&self, caches: &SharedCaches, bytes: u64) {
        let c = &caches.counters;
        c.data_gets.fetch_add(1, Ordering::Relaxed);
        c.data_get_bytes.fetch_add(bytes, Ordering::Relaxed);
        self.gets.fetch_add(1, Ordering::Relaxed);
        self.get_bytes.fetch_add(bytes, Ordering::Relaxed);
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
            // Any size the volume ever had: a segment may predate a shrink.
            fetch_segment_header(&self.store, &self.names, seq, self.uuid, MAX_VOLUME_BYTES, self.data_key.as_deref())
                .await
                .inspect_err(|e| {
                    if matches!(e, VolumeError::Corrupt { .. }) {
                        tracing::error!(volume = %self.name, object = %self.names.segment(seq), error = %strata_store::ErrorText(e), "corrupt segment");
                    }
                })?;
        let idx = Arc::new(idx);
        caches
            .indexes
            .insert(key, idx.clone(), index_cost_bytes(&idx));
        if let Some(claim) = claim {
            claim.complete(idx.clone());
        }
        Ok(idx)
    }
}

/// A fetched run's logical bytes: `stored` itself when it is stored as it
/// is (verified), else decoded and verified.
fn decode(idx: &SegmentIndex, first_chunk: u64, stored: Bytes) -> Result<Bytes, String> {
    match idx.decode_run(first_chunk, &stored)? {
        std::borrow::Cow::Borrowed(_) => Ok(stored),
        std::borrow::Cow::Owned(decoded) => Ok(Bytes::from(decoded)),
    }
}
