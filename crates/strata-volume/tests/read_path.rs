//! The read path for remote data, observed through the store: an in-memory
//! store behind a wrapper that counts (and can hold or fail) its GETs.
//! Volumes are written through the engine, closed, and reopened with fresh
//! caches, so every read starts cold. No assertion depends on timing.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fmt;
use std::ops::Range;
use std::path::Path as FsPath;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{
    GetOptions, GetRange, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult,
};
use strata_store::{ObjectNames, Store};
use strata_volume::{Engine, ReadPathStats, Volume, VolumeConfig};
use tokio::sync::Semaphore;

const MIB: u64 = 1 << 20;
const KIB: u64 = 1 << 10;
const VOLUME_BYTES: u64 = 64 * MIB;

/// What the wrapper saw, and how it treats data GETs.
#[derive(Debug, Default)]
struct Probe {
    data_gets: AtomicU64,
    data_get_bytes: AtomicU64,
    header_gets: AtomicU64,
    data_in_flight: AtomicU64,
    max_data_in_flight: AtomicU64,
    /// Fail this many of the next data GETs.
    fail_data_gets: AtomicU64,
    /// When set, data GETs wait for a permit of it.
    gate: Mutex<Option<Arc<Semaphore>>>,
    /// When set, the next data GET (only that one) waits for a permit.
    hold_next: Mutex<Option<Arc<Semaphore>>>,
    /// Data GETs that took `hold_next` (and so are held now or were).
    held: AtomicU64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Counts {
    data_gets: u64,
    data_get_bytes: u64,
    header_gets: u64,
}

impl Probe {
    fn counts(&self) -> Counts {
        Counts {
            data_gets: self.data_gets.load(Ordering::SeqCst),
            data_get_bytes: self.data_get_bytes.load(Ordering::SeqCst),
            header_gets: self.header_gets.load(Ordering::SeqCst),
        }
    }

    fn since(&self, before: Counts) -> Counts {
        let now = self.counts();
        Counts {
            data_gets: now.data_gets - before.data_gets,
            data_get_bytes: now.data_get_bytes - before.data_get_bytes,
            header_gets: now.header_gets - before.header_gets,
        }
    }

    fn close_gate(&self) -> Arc<Semaphore> {
        let gate = Arc::new(Semaphore::new(0));
        *self.gate.lock().unwrap() = Some(gate.clone());
        gate
    }
}

/// Segment header GETs start at 0 (fixed part) or 104 (tables); segment
/// data starts after the tables.
fn is_segment_data(location: &Path, range: &Range<u64>) -> Option<bool> {
    location
        .as_ref()
        .contains("/segments/")
        .then_some(range.start != 0 && range.start != 104)
}

struct InFlight<'a>(&'a Probe);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.data_in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

#[derive(Debug)]
struct CountingStore {
    inner: InMemory,
    probe: Arc<Probe>,
}

impl fmt::Display for CountingStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CountingStore({})", self.inner)
    }
}

impl CountingStore {
    async fn data_get(&self, location: &Path, range: Range<u64>) -> object_store::Result<Bytes> {
        let p = &self.probe;
        p.data_gets.fetch_add(1, Ordering::SeqCst);
        let n = p.data_in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        let _in_flight = InFlight(p);
        p.max_data_in_flight.fetch_max(n, Ordering::SeqCst);
        // Yield once, as a network request would: GETs issued together are
        // all in flight before any of them completes.
        tokio::task::yield_now().await;
        let held = p.hold_next.lock().unwrap().take();
        if let Some(held) = held {
            p.held.fetch_add(1, Ordering::SeqCst);
            held.acquire().await.unwrap().forget();
        }
        let gate = p.gate.lock().unwrap().clone();
        if let Some(gate) = gate {
            gate.acquire().await.unwrap().forget();
        }
        let fail = p
            .fail_data_gets
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if fail {
            return Err(object_store::Error::Generic {
                store: "CountingStore",
                source: "injected failure".into(),
            });
        }
        let bytes = self.inner.get_range(location, range).await?;
        p.data_get_bytes
            .fetch_add(bytes.len() as u64, Ordering::SeqCst);
        Ok(bytes)
    }

    fn count_other(&self, location: &Path, range: Option<&Range<u64>>) {
        if let Some(false) = range.and_then(|r| is_segment_data(location, r)) {
            self.probe.header_gets.fetch_add(1, Ordering::SeqCst);
        }
    }
}

#[async_trait]
impl ObjectStore for CountingStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let range = match &options.range {
            Some(GetRange::Bounded(r)) => Some(r.clone()),
            _ => None,
        };
        assert_ne!(
            range.as_ref().and_then(|r| is_segment_data(location, r)),
            Some(true),
            "segment data is read with get_range"
        );
        self.count_other(location, range.as_ref());
        self.inner.get_opts(location, options).await
    }

    async fn get_range(&self, location: &Path, range: Range<u64>) -> object_store::Result<Bytes> {
        if is_segment_data(location, &range) == Some(true) {
            return self.data_get(location, range).await;
        }
        self.count_other(location, Some(&range));
        self.inner.get_range(location, range).await
    }

    async fn delete(&self, location: &Path) -> object_store::Result<()> {
        self.inner.delete(location).await
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy(&self, from: &Path, to: &Path) -> object_store::Result<()> {
        self.inner.copy(from, to).await
    }

    async fn copy_if_not_exists(&self, from: &Path, to: &Path) -> object_store::Result<()> {
        self.inner.copy_if_not_exists(from, to).await
    }
}

fn counting_store() -> (Store, Arc<Probe>) {
    let probe = Arc::new(Probe::default());
    let inner = CountingStore {
        inner: InMemory::new(),
        probe: probe.clone(),
    };
    let store = Store::from_object_store(
        Arc::new(inner),
        "counting memory://".into(),
        // No retries: the probe counts and fails GETs one by one.
        &strata_store::LayerConfig {
            retry: strata_store::RetryPolicy {
                max_attempts: 1,
                ..strata_store::RetryPolicy::default()
            },
            ..strata_store::LayerConfig::default()
        },
    );
    (store, probe)
}

/// 4 MiB segments, RAM cache big enough to keep everything, long segment
/// age (sealing happens by size and at close only).
fn config(dir: &FsPath) -> VolumeConfig {
    let mut c = VolumeConfig::new(dir.to_path_buf());
    c.segment_bytes = 4 * MIB;
    c.max_write_bytes = MIB;
    c.write_buffer_bytes = 16 * MIB;
    c.journal_bytes = 24 * MIB;
    c.cache_bytes = 64 * MIB;
    c.segment_max_age_ms = 600_000;
    c.checkpoint_every_segments = 4;
    // GETs are counted exactly: no background collection (tests call it).
    c.gc.enabled = false;
    // Byte counts below are of plain segments (`at_rest.rs` counts GETs
    // of compressed and encrypted ones).
    c.compression = strata_volume::Compression::None;
    c.gc.grace_ms = 0;
    c
}

fn no_readahead(dir: &FsPath) -> VolumeConfig {
    let mut c = config(dir);
    c.readahead_max_bytes = 0;
    c
}

/// The byte every test expects at volume offset `off` (after `fill`).
fn pattern(off: u64) -> u8 {
    ((off / 4096).wrapping_mul(37) ^ (off % 251)) as u8
}

fn pattern_range(start: u64, len: u64) -> Vec<u8> {
    (start..start + len).map(pattern).collect()
}

/// Creates volume "v", runs `write` on it, closes it (everything goes to
/// the store); the engine is dropped before returning.
async fn write_volume<F, Fut>(store: &Store, dir: &FsPath, write: F)
where
    F: FnOnce(Arc<Volume>) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let engine = Engine::new(store.clone(), no_readahead(dir)).unwrap();
    engine.create_volume("v", VOLUME_BYTES).await.unwrap();
    let vol = engine.open_volume("v").await.unwrap();
    write(vol).await;
    engine.close_all().await.unwrap();
}

/// Writes `pattern` over `[start, start+len)` in 1 MiB writes.
async fn fill(vol: &Arc<Volume>, start: u64, len: u64) {
    for off in (start..start + len).step_by(MIB as usize) {
        let n = MIB.min(start + len - off);
        vol.write(off, &pattern_range(off, n), false).await.unwrap();
    }
}

async fn read_expect(vol: &std::sync::Arc<Volume>, start: u64, len: u64) {
    let mut buf = vec![0u8; len as usize];
    vol.read(start, &mut buf).await.unwrap();
    let want = pattern_range(start, len);
    if buf != want {
        let i = buf.iter().zip(&want).position(|(a, b)| a != b).unwrap();
        panic!("byte {} differs", start + i as u64);
    }
}

fn assert_within_budgets(s: &ReadPathStats) {
    assert!(
        s.ram_chunks.used_bytes <= s.ram_chunks.budget_bytes,
        "{s:?}"
    );
    assert!(
        s.disk_cache.used_bytes <= s.disk_cache.budget_bytes,
        "{s:?}"
    );
    assert!(
        s.segment_indexes.used_bytes <= s.segment_indexes.budget_bytes,
        "{s:?}"
    );
    assert_eq!(s.store.chunks_in_flight, 0, "{s:?}");
}

#[tokio::test]
async fn a_cold_read_inside_one_segment_is_one_get() {
    let dir = tempfile::tempdir().unwrap();
    let (store, probe) = counting_store();
    write_volume(&store, dir.path(), |vol| async move {
        fill(&vol, 0, 8 * MIB).await
    })
    .await;
    // Default config: read-ahead on (a first read is not sequential).
    let engine = Engine::new(store, config(dir.path())).unwrap();
    let vol = engine.open_volume("v").await.unwrap();
    let before = probe.counts();
    read_expect(&vol, MIB, MIB).await;
    let d = probe.since(before);
    assert_eq!(d.data_gets, 1, "{d:?}");
    assert_eq!(d.data_get_bytes, MIB);
    assert_eq!(d.header_gets, 2, "fixed header + tables");
    let s = engine.caches().stats();
    assert_eq!((s.store.data_gets, s.store.data_get_bytes), (1, MIB));
    assert_eq!(s.store.header_gets, 2);
    assert_eq!(s.readahead.windows_issued, 0);
    assert_eq!(s.ram_chunks.insertions, 256);
    let vs = vol.stats();
    assert_eq!((vs.store_reads, vs.store_read_bytes), (1, MIB));
    // Warm: no GET at all.
    read_expect(&vol, MIB + 4096, 64 * KIB).await;
    assert_eq!(probe.since(before).data_gets, 1);
    assert_eq!(engine.caches().stats().ram_chunks.hits, 16);
    assert_within_budgets(&engine.caches().stats());
    engine.close_all().await.unwrap();
}

#[tokio::test]
async fn pieces_close_in_one_segment_share_one_get() {
    let dir = tempfile::tempdir().unwrap();
    let (store, probe) = counting_store();
    write_volume(&store, dir.path(), |vol| async move {
        // 32 blocks in descending volume order: ascending in the segment,
        // so each is its own extent (nothing merges) yet they are adjacent
        // in the segment.
        for b in (0..32u64).rev() {
            vol.write(b * 4096, &pattern_range(b * 4096, 4096), false)
                .await
                .unwrap();
        }
        // 32 blocks with 8 KiB of other data between them in the segment.
        for b in 0..32u64 {
            let off = MIB + b * 4096;
            vol.write(off, &pattern_range(off, 4096), false)
                .await
                .unwrap();
            let other = 32 * MIB + b * 8192;
            vol.write(other, &pattern_range(other, 8192), false)
                .await
                .unwrap();
        }
        // Two blocks 128 KiB apart in the segment: too far to share a GET.
        vol.write(2 * MIB, &pattern_range(2 * MIB, 4096), false)
            .await
            .unwrap();
        let far = 40 * MIB;
        vol.write(far, &pattern_range(far, 128 * KIB), false)
            .await
            .unwrap();
        let off = 2 * MIB + 4096;
        vol.write(off, &pattern_range(off, 4096), false)
            .await
            .unwrap();
    })
    .await;
    let engine = Engine::new(store, no_readahead(dir.path())).unwrap();
    let vol = engine.open_volume("v").await.unwrap();
    assert!(vol.stats().open_segment_seq <= 2, "all in one segment");

    let before = probe.counts();
    read_expect(&vol, 0, 128 * KIB).await;
    let d = probe.since(before);
    assert_eq!(d.data_gets, 1, "32 adjacent pieces: {d:?}");
    assert_eq!(d.data_get_bytes, 128 * KIB);
    assert_eq!(engine.caches().stats().store.coalesced_pieces, 31);

    let before = probe.counts();
    read_expect(&vol, MIB, 128 * KIB).await;
    let d = probe.since(before);
    assert_eq!(d.data_gets, 1, "32 pieces with 8 KiB gaps: {d:?}");
    assert_eq!(d.data_get_bytes, 32 * 4096 + 31 * 8192, "gaps fetched too");
    assert_eq!(engine.caches().stats().store.coalesced_pieces, 62);
    // The gaps were cached: reading the data between the pieces is free.
    read_expect(&vol, 32 * MIB, 31 * 8192).await;
    assert_eq!(probe.since(before).data_gets, 1);

    let before = probe.counts();
    read_expect(&vol, 2 * MIB, 8192).await;
    assert_eq!(probe.since(before).data_gets, 2, "128 KiB apart");
    engine.close_all().await.unwrap();
}

#[tokio::test]
async fn pieces_in_two_segments_are_two_concurrent_gets() {
    let dir = tempfile::tempdir().unwrap();
    let (store, probe) = counting_store();
    write_volume(&store, dir.path(), |vol| async move {
        fill(&vol, 0, 8 * MIB).await
    })
    .await;
    let engine = Engine::new(store, no_readahead(dir.path())).unwrap();
    let vol = engine.open_volume("v").await.unwrap();
    let before = probe.counts();
    // Segment 1 holds [0, 4 MiB), segment 2 [4 MiB, 8 MiB).
    read_expect(&vol, 3 * MIB + 512 * KIB, MIB).await;
    let d = probe.since(before);
    assert_eq!((d.data_gets, d.header_gets), (2, 4), "{d:?}");
    assert_eq!(probe.max_data_in_flight.load(Ordering::SeqCst), 2);
    engine.close_all().await.unwrap();
}

async fn scan(vol: &std::sync::Arc<Volume>, len: u64, read_bytes: u64) -> u64 {
    let mut reads = 0;
    for off in (0..len).step_by(read_bytes as usize) {
        read_expect(vol, off, read_bytes).await;
        reads += 1;
    }
    reads
}

#[tokio::test]
async fn a_sequential_scan_reads_ahead_in_few_gets() {
    let dir = tempfile::tempdir().unwrap();
    let (store, probe) = counting_store();
    write_volume(&store, dir.path(), |vol| async move {
        fill(&vol, 0, 32 * MIB).await
    })
    .await;

    let engine = Engine::new(store.clone(), config(dir.path())).unwrap();
    let vol = engine.open_volume("v").await.unwrap();
    let before = probe.counts();
    let reads = scan(&vol, 32 * MIB, MIB).await;
    engine.caches().settle().await;
    let d = probe.since(before);
    let s = engine.caches().stats();
    assert_eq!(reads, 32);
    // Two cold reads, then windows of up to 8 MiB, split at the 4 MiB
    // segment boundaries (13 GETs as tuned today).
    assert!(
        d.data_gets * 2 <= reads,
        "{} GETs for {reads} reads: {s:?}",
        d.data_gets
    );
    assert!(
        s.readahead.windows_issued > 0 && s.readahead.bytes_prefetched > 0,
        "{s:?}"
    );
    assert_eq!(s.readahead.max_window_bytes, 8 * MIB);
    // Everything read was fetched once (read-ahead stops at the volume's
    // data only where the map has none: past 32 MiB are holes).
    assert_eq!(d.data_get_bytes, 32 * MIB, "{s:?}");
    assert_within_budgets(&s);
    engine.close_all().await.unwrap();
    drop(engine);

    // Small sequential reads: 4 KiB at a time.
    let engine = Engine::new(store.clone(), config(dir.path())).unwrap();
    let vol = engine.open_volume("v").await.unwrap();
    let before = probe.counts();
    let reads = scan(&vol, 4 * MIB, 4 * KIB).await;
    engine.caches().settle().await;
    let d = probe.since(before);
    assert_eq!(reads, 1024);
    assert!(d.data_gets <= 16, "{} GETs for {reads} reads", d.data_gets);
    engine.close_all().await.unwrap();
    drop(engine);

    // Read-ahead disabled: one GET per read, no read-ahead counter moves.
    let engine = Engine::new(store, no_readahead(dir.path())).unwrap();
    let vol = engine.open_volume("v").await.unwrap();
    let before = probe.counts();
    let reads = scan(&vol, 32 * MIB, MIB).await;
    engine.caches().settle().await;
    let s = engine.caches().stats();
    assert_eq!(probe.since(before).data_gets, reads);
    assert_eq!(s.readahead, Default::default(), "{s:?}");
    engine.close_all().await.unwrap();
}

#[tokio::test]
async fn concurrent_reads_of_a_cold_range_fetch_it_once() {
    let dir = tempfile::tempdir().unwrap();
    let (store, probe) = counting_store();
    write_volume(&store, dir.path(), |vol| async move {
        fill(&vol, 0, 4 * MIB).await
    })
    .await;
    let engine = Engine::new(store, no_readahead(dir.path())).unwrap();
    let vol = engine.open_volume("v").await.unwrap();
    let before = probe.counts();
    tokio::join!(read_expect(&vol, MIB, MIB), read_expect(&vol, MIB, MIB));
    let d = probe.since(before);
    assert_eq!((d.data_gets, d.header_gets), (1, 2), "{d:?}");
    let s = engine.caches().stats();
    assert_eq!(
        (s.store.inflight_waits, s.store.inflight_fallbacks),
        (256, 0),
        "{s:?}"
    );
    // Overlapping ranges: the second fetches only what the first does not.
    let before = probe.counts();
    tokio::join!(
        read_expect(&vol, 2 * MIB, 512 * KIB),
        read_expect(&vol, 2 * MIB + 256 * KIB, 512 * KIB)
    );
    let d = probe.since(before);
    assert_eq!((d.data_gets, d.data_get_bytes), (2, 768 * KIB), "{d:?}");
    assert_within_budgets(&engine.caches().stats());
    engine.close_all().await.unwrap();
}

#[tokio::test]
async fn a_failed_or_abandoned_fetch_leaves_no_waiter_stuck_and_no_entry_behind() {
    let dir = tempfile::tempdir().unwrap();
    let (store, probe) = counting_store();
    write_volume(&store, dir.path(), |vol| async move {
        fill(&vol, 0, 4 * MIB).await
    })
    .await;
    let engine = Engine::new(store, no_readahead(dir.path())).unwrap();
    let vol = engine.open_volume("v").await.unwrap();

    // A's GET fails while B waits for it: A gets the error, B fetches.
    let gate = probe.close_gate();
    probe.fail_data_gets.store(1, Ordering::SeqCst);
    let before = probe.counts();
    let a = tokio::spawn({
        let vol = vol.clone();
        async move {
            let mut buf = vec![0u8; MIB as usize];
            vol.read(0, &mut buf).await.map(|_| ())
        }
    });
    while probe.since(before).data_gets == 0 {
        tokio::task::yield_now().await;
    }
    let b = tokio::spawn({
        let vol = vol.clone();
        async move { read_expect(&vol, 0, MIB).await }
    });
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert_eq!(probe.since(before).data_gets, 1, "B waits, not fetches");
    gate.add_permits(100);
    let err = a.await.unwrap().unwrap_err();
    assert!(err.to_string().contains("injected failure"), "{err}");
    b.await.unwrap();
    assert_eq!(probe.since(before).data_gets, 2);
    let s = engine.caches().stats();
    assert_eq!(
        (s.store.inflight_waits, s.store.inflight_fallbacks),
        (256, 256)
    );
    assert_eq!(s.store.chunks_in_flight, 0);

    // A read whose future is dropped mid-GET leaves nothing in flight.
    let gate = probe.close_gate();
    let before = probe.counts();
    let a = tokio::spawn({
        let vol = vol.clone();
        async move { read_expect(&vol, 2 * MIB, MIB).await }
    });
    while probe.since(before).data_gets == 0 {
        tokio::task::yield_now().await;
    }
    assert_eq!(engine.caches().stats().store.chunks_in_flight, 256);
    a.abort();
    assert!(a.await.unwrap_err().is_cancelled());
    assert_eq!(engine.caches().stats().store.chunks_in_flight, 0);
    gate.add_permits(100);
    read_expect(&vol, 2 * MIB, MIB).await;
    engine.close_all().await.unwrap();
}

fn disk_config(dir: &FsPath) -> VolumeConfig {
    let mut c = no_readahead(dir);
    c.cache_bytes = MIB;
    c.disk_cache_bytes = 16 * MIB;
    c
}

/// Flips one byte in every 64 KiB block of the cache file's data area
/// that holds data (the area starts after the 4 KiB superblock and the
/// directory, 32 bytes per slot rounded up to 4 KiB).
fn corrupt_disk_cache(path: &FsPath) -> u64 {
    use std::os::unix::fs::FileExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let len = file.metadata().unwrap().len();
    let slots = (len - 4096) / (64 * KIB);
    let data_offset = 4096 + (slots * 32).div_ceil(4096) * 4096;
    let mut block = vec![0u8; 64 * KIB as usize];
    let mut corrupted = 0;
    for off in (data_offset..len).step_by(64 * KIB as usize) {
        file.read_exact_at(&mut block, off).unwrap();
        if block.iter().any(|&b| b != 0) {
            block[100] ^= 0xff;
            file.write_all_at(&block, off).unwrap();
            corrupted += 1;
        }
    }
    corrupted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_evicted_from_ram_comes_from_the_disk_tier_verified() {
    let dir = tempfile::tempdir().unwrap();
    let (store, probe) = counting_store();
    write_volume(&store, dir.path(), |vol| async move {
        fill(&vol, 0, 4 * MIB).await
    })
    .await;
    let engine = Engine::new(store, disk_config(dir.path())).unwrap();
    let vol = engine.open_volume("v").await.unwrap();
    // First fetch of each block: RAM only (second-fetch admission), so a
    // scan that reads data once writes nothing to disk.
    let before = probe.counts();
    scan(&vol, 4 * MIB, MIB).await;
    engine.caches().settle().await;
    assert_eq!(probe.since(before).data_gets, 4);
    let s = engine.caches().stats();
    assert_eq!(s.disk_cache.fetched_insertions, 0, "{s:?}");
    assert_eq!(s.disk_cache.not_admitted, 64, "{s:?}");
    assert!(s.ram_chunks.evictions >= 768, "RAM holds 1 MiB: {s:?}");

    // Second fetch (RAM lost it): now it goes to disk too.
    let before = probe.counts();
    scan(&vol, 4 * MIB, MIB).await;
    engine.caches().settle().await;
    assert_eq!(probe.since(before).data_gets, 4);
    let s = engine.caches().stats();
    assert_eq!(s.disk_cache.fetched_insertions, 64, "{s:?}");
    assert_eq!(s.disk_cache.not_admitted, 64, "{s:?}");

    // Again: what RAM lost comes from disk, without a GET.
    let before = probe.counts();
    scan(&vol, 4 * MIB, MIB).await;
    let s = engine.caches().stats();
    assert_eq!(probe.since(before).data_gets, 0, "{s:?}");
    // RAM kept the last MiB read, which the scan evicts before reaching it.
    assert_eq!(s.disk_cache.hits, 1024, "{s:?}");
    assert_eq!(s.disk_cache.verify_failures, 0);
    assert_within_budgets(&s);

    // Garbage in the cache file is caught and read from the store.
    engine.caches().settle().await;
    let path = dir.path().join("cache/blocks");
    let corrupted = corrupt_disk_cache(&path);
    assert_eq!(corrupted, 64);
    let before = probe.counts();
    scan(&vol, 4 * MIB, MIB).await;
    engine.caches().settle().await;
    let s = engine.caches().stats();
    assert_eq!(s.disk_cache.verify_failures, 64, "{s:?}");
    assert_eq!(probe.since(before).data_gets, 4, "{s:?}");
    assert_within_budgets(&s);
    // The entries were replaced with good ones.
    let hits = s.disk_cache.hits;
    let before = probe.counts();
    scan(&vol, 4 * MIB, MIB).await;
    let s = engine.caches().stats();
    assert_eq!(probe.since(before).data_gets, 0, "{s:?}");
    assert_eq!(s.disk_cache.hits, hits + 1024);
    engine.close_all().await.unwrap();
}

#[tokio::test]
async fn a_second_engine_on_the_data_dir_cannot_share_the_disk_cache() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _probe) = counting_store();
    let first = Engine::new(store.clone(), disk_config(dir.path())).unwrap();
    let err = Engine::new(store.clone(), disk_config(dir.path()))
        .err()
        .unwrap();
    assert!(
        err.to_string().contains("in use by another strata process"),
        "{err}"
    );
    // Disabled tiers show as budget 0.
    let other = tempfile::tempdir().unwrap();
    let engine = Engine::new(store, no_readahead(other.path())).unwrap();
    let s = engine.caches().stats();
    assert_eq!(
        (s.disk_cache.budget_bytes, s.readahead.max_window_bytes),
        (0, 0)
    );
    assert_eq!(first.caches().stats().disk_cache.budget_bytes, 16 * MIB);
}

struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Every tier on, with budgets small enough that everything evicts, and
/// concurrent sequential and random readers over data written in a
/// scattered order: every byte read matches the model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_readers_through_every_tier_read_the_right_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _probe) = counting_store();
    let mut model = vec![0u8; 24 * MIB as usize];
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    let mut writes = Vec::new();
    for _ in 0..400 {
        let off = rng.below(24 * MIB - 64 * KIB);
        let len = 1 + rng.below(64 * KIB);
        let data: Vec<u8> = (0..len).map(|_| rng.below(256) as u8).collect();
        model[off as usize..(off + len) as usize].copy_from_slice(&data);
        writes.push((off, data));
    }
    write_volume(&store, dir.path(), |vol| async move {
        for (off, data) in writes {
            vol.write(off, &data, false).await.unwrap();
        }
    })
    .await;
    let mut c = config(dir.path());
    c.cache_bytes = 2 * MIB;
    c.disk_cache_bytes = 4 * MIB;
    let engine = Engine::new(store, c).unwrap();
    let vol = engine.open_volume("v").await.unwrap();
    let model = Arc::new(model);
    let mut tasks = Vec::new();
    for t in 0..4u64 {
        let (vol, model) = (vol.clone(), model.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng(0x9E37_79B9_7F4A_7C15 + t);
            let mut off = 0u64;
            for _ in 0..150 {
                let len = 1 + rng.below(256 * KIB);
                if t % 2 == 1 || off + len > model.len() as u64 {
                    off = rng.below(model.len() as u64 - len);
                }
                let mut buf = vec![0u8; len as usize];
                vol.read(off, &mut buf).await.unwrap();
                let want = &model[off as usize..(off + len) as usize];
                assert!(buf == want, "task {t}: read {off}+{len} differs");
                off += len;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    engine.caches().settle().await;
    let s = engine.caches().stats();
    assert_within_budgets(&s);
    assert!(
        s.ram_chunks.evictions > 0 && s.disk_cache.evictions > 0,
        "{s:?}"
    );
    assert!(
        s.disk_cache.hits > 0 && s.readahead.windows_issued > 0,
        "{s:?}"
    );
    assert_eq!(s.disk_cache.verify_failures, 0);
    engine.close_all().await.unwrap();
}

/// A read looks a segment up, and its GET is held while garbage
/// collection copies that data elsewhere and deletes the segment (grace
/// period 0, so the GET arrives after the deletion): the read still
/// returns the right bytes, from where the data is now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_delayed_across_a_gc_deletion_still_reads_the_right_data() {
    let dir = tempfile::tempdir().unwrap();
    let (store, probe) = counting_store();
    write_volume(&store, dir.path(), |vol| async move {
        // Segment 1: 4 MiB; then 3 MiB of it overwritten (same bytes, so
        // the expected data never changes): segment 1 is 25% live.
        fill(&vol, 0, 4 * MIB).await;
        fill(&vol, MIB, 3 * MIB).await;
    })
    .await;
    let engine = Engine::new(store.clone(), no_readahead(dir.path())).unwrap();
    let vol = engine.open_volume("v").await.unwrap();
    let hold = Arc::new(Semaphore::new(0));
    *probe.hold_next.lock().unwrap() = Some(hold.clone());
    let reader = {
        let vol = vol.clone();
        tokio::spawn(async move { read_expect(&vol, 0, 64 * KIB).await })
    };
    // Until the reader's GET is the one held: "in flight" alone let GC's
    // own GET (issued next) take the hold now and then, and the test hung
    // (GC waiting for a permit given only after GC returns).
    while probe.held.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    let report = vol.gc_now(true).await.unwrap();
    assert!(
        report.bytes_copied >= MIB && report.objects_deleted >= 1,
        "{report:?}"
    );
    let segment_1 = ObjectNames::new("v").segment(1);
    assert!(
        store.object_store().head(&segment_1).await.is_err(),
        "segment 1 still stored"
    );
    hold.add_permits(1);
    reader.await.unwrap();
    read_expect(&vol, 0, 4 * MIB).await;
    engine.close_all().await.unwrap();
}

/// Data written with the disk cache on is read back from it after a
/// restart, and memory stays within its budgets while the disk cache holds
/// far more than RAM: the RAM chunk cache within its 1 MiB, the disk
/// cache's index under 1 MiB per cached GiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn written_data_comes_back_from_disk_after_a_restart_within_memory_budgets() {
    let dir = tempfile::tempdir().unwrap();
    let (store, probe) = counting_store();
    let mut c = no_readahead(dir.path());
    c.cache_bytes = MIB;
    // Room for every block whatever the volume's (random) key: the index
    // is 16-way set-associative, and with 64 MiB (64 sets of 16 for 384
    // blocks) a set can overflow and evict a block, which then has to be
    // fetched. One CI run restored 382 of 384 blocks (not reproduced in 60
    // runs here); the first engine's evictions are asserted now, to tell
    // an overflow from a lost write next time. 256 sets.
    c.disk_cache_bytes = 256 * MIB;
    let engine = Engine::new(store.clone(), c.clone()).unwrap();
    engine.create_volume("v", VOLUME_BYTES).await.unwrap();
    let vol = engine.open_volume("v").await.unwrap();
    fill(&vol, 0, 24 * MIB).await;
    drop(vol);
    engine.close_all().await.unwrap();
    let s = engine.caches().stats();
    assert_eq!(s.disk_cache.written_insertions, 384, "{s:?}");
    assert_eq!(s.disk_cache.evictions, 0, "{s:?}");
    drop(engine);

    let engine = Engine::new(store, c).unwrap();
    let vol = engine.open_volume("v").await.unwrap();
    let before = probe.counts();
    scan(&vol, 24 * MIB, 256 * KIB).await;
    let s = engine.caches().stats();
    assert_eq!(probe.since(before).data_gets, 0, "{s:?}");
    assert_eq!(s.disk_cache.restored_blocks, 384, "{s:?}");
    assert_eq!(s.disk_cache.hits, 6144, "{s:?}");
    assert!(
        s.disk_cache.used_bytes >= 24 * s.ram_chunks.budget_bytes,
        "{s:?}"
    );
    assert!(
        s.disk_cache.index_ram_bytes * 1024 <= s.disk_cache.budget_bytes,
        "{s:?}"
    );
    assert_within_budgets(&s);
    engine.close_all().await.unwrap();
}

/// Data this server just uploaded is read from memory until the disk
/// cache's writer has written its blocks: a reader racing the writes never
/// GETs what was written here (before, a read between the upload and the
/// writer's turn went to the store).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_racing_uploads_never_get_data_written_here() {
    let dir = tempfile::tempdir().unwrap();
    let (store, probe) = counting_store();
    let mut c = no_readahead(dir.path());
    c.cache_bytes = MIB;
    // Room for every block: no set of the cache overflows.
    c.disk_cache_bytes = 512 * MIB;
    let engine = Engine::new(store.clone(), c).unwrap();
    engine.create_volume("v", VOLUME_BYTES).await.unwrap();
    let vol = engine.open_volume("v").await.unwrap();
    let written = Arc::new(AtomicU64::new(0));
    let reader = {
        let (vol, written) = (vol.clone(), written.clone());
        tokio::spawn(async move {
            let mut reads = 0u64;
            let mut x = 0x9e37_79b9_7f4a_7c15u64;
            loop {
                let upto = written.load(Ordering::SeqCst);
                if upto == u64::MAX {
                    return reads;
                }
                if upto == 0 {
                    tokio::task::yield_now().await;
                    continue;
                }
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let at = (x % (upto / (4 * KIB))) * 4 * KIB;
                read_expect(&vol, at, 4 * KIB).await;
                reads += 1;
            }
        })
    };
    for off in (0..32 * MIB).step_by(MIB as usize) {
        vol.write(off, &pattern_range(off, MIB), false)
            .await
            .unwrap();
        written.store(off + MIB, Ordering::SeqCst);
    }
    // Let the last uploads and their cache writes happen under the reads.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    written.store(u64::MAX, Ordering::SeqCst);
    let reads = reader.await.unwrap();
    let s = engine.caches().stats();
    assert!(reads > 1000, "too few racing reads: {reads}");
    assert_eq!(probe.counts().data_gets, 0, "{reads} reads; {s:?}");
    engine.close_all().await.unwrap();
}

/// Waits until the store holds `n` data GETs (the gate keeps them there).
async fn until_data_in_flight(probe: &Probe, n: u64) {
    for _ in 0..1000 {
        if probe.data_in_flight.load(Ordering::SeqCst) == n {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!(
        "data GETs in flight stayed at {}, expected {n}",
        probe.data_in_flight.load(Ordering::SeqCst)
    );
}

/// The server's GETs are shared fairly (`fair_slots.rs`): a volume with
/// many read misses takes the whole total while alone, and another
/// volume's one read miss still goes to the store at once rather than
/// queueing behind them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_with_many_read_misses_does_not_queue_another_volumes_get() {
    let dir = tempfile::tempdir().unwrap();
    let (store, probe) = counting_store();
    {
        let engine = Engine::new(store.clone(), no_readahead(dir.path())).unwrap();
        for name in ["busy", "quiet"] {
            engine.create_volume(name, VOLUME_BYTES).await.unwrap();
            let vol = engine.open_volume(name).await.unwrap();
            fill(&vol, 0, 4 * MIB).await;
        }
        engine.close_all().await.unwrap();
    }
    let mut c = no_readahead(dir.path());
    c.max_gets_total = 4;
    let engine = Engine::new(store, c).unwrap();
    let busy = engine.open_volume("busy").await.unwrap();
    let quiet = engine.open_volume("quiet").await.unwrap();
    // Indexes first (not data GETs; they are not held by the gate).
    read_expect(&busy, 0, 4 * KIB).await;
    read_expect(&quiet, 0, 4 * KIB).await;
    let gate = probe.close_gate();
    // 8 misses 512 KiB apart: 4 reach the store (the total), 4 wait.
    let mut reads = Vec::new();
    for k in 1..=8u64 {
        let vol = busy.clone();
        reads.push(tokio::spawn(async move {
            read_expect(&vol, k * 512 * KIB - 8 * KIB, 4 * KIB).await
        }));
    }
    until_data_in_flight(&probe, 4).await;
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(probe.data_in_flight.load(Ordering::SeqCst), 4, "the total");
    // The quiet volume is under its share (2 of 4): its GET goes out.
    let vol = quiet.clone();
    reads.push(tokio::spawn(async move {
        read_expect(&vol, 3 * MIB, 4 * KIB).await
    }));
    until_data_in_flight(&probe, 5).await;
    gate.add_permits(1000);
    for r in reads {
        r.await.unwrap();
    }
    assert_eq!(probe.max_data_in_flight.load(Ordering::SeqCst), 5);
    engine.close_all().await.unwrap();
}
