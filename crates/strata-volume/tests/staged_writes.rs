//! Bulk writes on the embedded store go straight into their segment's
//! file, the journal recording where (`write/staged_segment.rs`): each
//! byte is copied once. These tests check what that must keep: reads see
//! every write, segments are published from their files (fsck finds them
//! whole), a crash before any upload loses nothing acknowledged (replay
//! reads the bytes back from the files), replay stops at a placed write
//! whose bytes a power cut took (a prefix, the FLUSHed writes before it
//! kept), and no staging name outlives its need.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use strata_store::Store;
use strata_volume::{Durability, Engine, FsckOptions, Volume, VolumeConfig};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const VOLUME_BYTES: u64 = 64 * MIB;

fn config(dir: &FsPath) -> VolumeConfig {
    let mut c = VolumeConfig::new(dir.join("data"));
    c.segment_bytes = 4 * MIB;
    c.max_write_bytes = 2 * MIB;
    c.write_buffer_bytes = 32 * MIB;
    c.journal_bytes = 48 * MIB;
    // Nothing is sealed by age: what a crash finds is chosen by the test.
    c.segment_max_age_ms = 600_000;
    c.durability = Durability::Local;
    c.gc.enabled = false;
    // Placed writes are for volumes whose segments hold the bytes as
    // written (compressed or encrypted frames are built at the seal).
    c.compression = strata_volume::Compression::None;
    c
}

fn store(dir: &FsPath) -> Store {
    Store::local(&dir.join("store")).unwrap()
}

fn pattern(seed: u64, len: u64) -> Vec<u8> {
    (0..len)
        .map(|b| (seed * 131 + b * 7 + b / 4096 + 1) as u8)
        .collect()
}

/// A mix the seal must put together: 1 MiB writes (placed), 4 KiB and
/// odd-sized ones (journal) between them, a trim, and overwrites.
async fn write_mix(vol: &Arc<Volume>, model: &mut [u8], round: u64) {
    let mut ops: Vec<(u64, u64)> = Vec::new();
    for i in 0..12u64 {
        ops.push(((i * 3 + round) % 60 * MIB, MIB));
        ops.push(((i * 7 + round) % 60 * MIB + 12 * KIB, 4 * KIB));
        ops.push(((i * 5 + round) % 60 * MIB + 100, 70 * KIB + 3));
    }
    for (n, (off, len)) in ops.into_iter().enumerate() {
        let data = pattern(round * 1000 + n as u64, len);
        vol.write(off, &data, false).await.unwrap();
        model[off as usize..(off + len) as usize].copy_from_slice(&data);
    }
    let trim_at = (round % 60 + 2) * MIB;
    vol.trim(trim_at, 64 * KIB, false).await.unwrap();
    model[trim_at as usize..(trim_at + 64 * KIB) as usize].fill(0);
}

async fn check(vol: &Arc<Volume>, model: &[u8], what: &str) {
    for off in (0..VOLUME_BYTES).step_by(MIB as usize) {
        let mut got = vec![0u8; MIB as usize];
        vol.read(off, &mut got).await.unwrap();
        assert!(
            got[..] == model[off as usize..(off + MIB) as usize],
            "{what}: MiB at {off} differs"
        );
    }
}

/// fsck reads every segment whole (data against its chunk CRCs).
async fn fsck_clean(engine: &Engine) {
    let options = FsckOptions { quick: false };
    let r = engine.fsck("v", None, options, &|_| {}).await.unwrap();
    assert!(r.clean && r.errors == 0, "{r:?}");
}

async fn open(engine: &Engine) -> Arc<Volume> {
    match engine.open_volume("v").await {
        Ok(v) => v,
        Err(_) => {
            engine.create_volume("v", VOLUME_BYTES).await.unwrap();
            engine.open_volume("v").await.unwrap()
        }
    }
}

/// A new engine on the test's store and data dir, and the volume open.
async fn engine_and_volume(dir: &FsPath) -> (Engine, Arc<Volume>) {
    let engine = Engine::new(store(dir), config(dir)).unwrap();
    let vol = open(&engine).await;
    (engine, vol)
}

/// Staging names (`<segment>#<tag>`) in the volume's segment directory.
fn staged_files(dir: &FsPath) -> Vec<PathBuf> {
    let segments = dir.join("store/v/segments");
    let Ok(entries) = std::fs::read_dir(&segments) else {
        return Vec::new();
    };
    entries
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| strata_store::parse_staged_name(n).is_some())
        })
        .collect()
}

/// Runs `f` on a runtime of its own, then tears it down without closing
/// anything: what kill -9 leaves (the page cache keeps every `pwrite`).
fn then_crash<T>(f: impl std::future::Future<Output = T>) -> T {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let out = rt.block_on(f);
    rt.shutdown_timeout(Duration::from_secs(60));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_writes_are_placed_and_segments_published_from_their_files() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, vol) = engine_and_volume(dir.path()).await;
    let mut model = vec![0u8; VOLUME_BYTES as usize];
    for round in 0..3 {
        write_mix(&vol, &mut model, round).await;
        check(&vol, &model, "before the uploads").await;
        vol.flush().await.unwrap();
    }
    let s = vol.stats();
    assert_eq!(s.placed_write_bytes, 3 * 12 * (MIB + 70 * KIB + 3));
    // The journal held records, not the bytes of the placed writes.
    let (used, _) = (s.journal_used_bytes, s.journal_ring_bytes);
    assert!(used < 2 * MIB, "journal used {used}");
    engine.close_all().await.unwrap();
    let s = vol.stats();
    assert!(s.staged_segments_published >= 6, "{s:?}");
    assert!(
        staged_files(dir.path()).is_empty(),
        "{:?}",
        staged_files(dir.path())
    );
    drop(vol);
    drop(engine);

    let (engine, vol) = engine_and_volume(dir.path()).await;
    check(&vol, &model, "after reopening").await;
    fsck_clean(&engine).await;
    engine.close_all().await.unwrap();
}

#[test]
fn a_crash_before_any_upload_loses_no_acknowledged_write() {
    let dir = tempfile::tempdir().unwrap();
    let mut model = vec![0u8; VOLUME_BYTES as usize];
    then_crash(async {
        let (_engine, vol) = engine_and_volume(dir.path()).await;
        write_mix(&vol, &mut model, 0).await;
        vol.flush().await.unwrap();
        // Acknowledged, not flushed, most of them not uploaded.
        write_mix(&vol, &mut model, 1).await;
    });
    assert!(!staged_files(dir.path()).is_empty(), "the crash left files");
    then_crash(async {
        let (_engine, vol) = engine_and_volume(dir.path()).await;
        check(&vol, &model, "after the crash").await;
        // A second crash before the replayed data is stored: the files
        // replay read are still there to read again.
        write_mix(&vol, &mut model, 2).await;
    });
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let (engine, vol) = engine_and_volume(dir.path()).await;
        check(&vol, &model, "after the second crash").await;
        engine.close_all().await.unwrap();
        assert!(
            staged_files(dir.path()).is_empty(),
            "{:?}",
            staged_files(dir.path())
        );
        fsck_clean(&engine).await;
    });
}

#[test]
fn replay_stops_at_a_placed_write_whose_bytes_a_cut_took_and_keeps_what_was_flushed() {
    let dir = tempfile::tempdir().unwrap();
    let mut model = vec![0u8; VOLUME_BYTES as usize];
    let flushed = pattern(1, 4 * KIB);
    let placed = pattern(2, MIB);
    let after = pattern(3, 4 * KIB);
    then_crash(async {
        let (_engine, vol) = engine_and_volume(dir.path()).await;
        vol.write(8 * MIB, &flushed, false).await.unwrap();
        vol.flush().await.unwrap();
        // Acknowledged, not FLUSHed: a power cut may take them.
        vol.write(0, &placed, false).await.unwrap();
        vol.write(16 * MIB, &after, false).await.unwrap();
    });
    // What a power cut does to bytes no FLUSH synced: the placed write's
    // bytes in its file are not what its record says; the ring kept both
    // records.
    let files = staged_files(dir.path());
    assert_eq!(files.len(), 1, "{files:?}");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&files[0])
        .unwrap();
    let len = f.metadata().unwrap().len();
    use std::os::unix::fs::FileExt;
    f.write_all_at(&vec![0xeeu8; 64 * KIB as usize], len - 64 * KIB)
        .unwrap();
    drop(f);
    // A prefix: the FLUSHed write, not the placed one nor the one after.
    model[8 * MIB as usize..(8 * MIB + 4 * KIB) as usize].copy_from_slice(&flushed);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let (engine, vol) = engine_and_volume(dir.path()).await;
        check(&vol, &model, "after the cut").await;
        // The journal goes on from there: a new write and a reopen.
        vol.write(16 * MIB, &after, false).await.unwrap();
        model[16 * MIB as usize..(16 * MIB + 4 * KIB) as usize].copy_from_slice(&after);
        engine.close_all().await.unwrap();
        assert!(staged_files(dir.path()).is_empty());
        drop(vol);
        let (engine, vol) = engine_and_volume(dir.path()).await;
        check(&vol, &model, "after a reopen").await;
        engine.close_all().await.unwrap();
    });
}

#[test]
fn deleting_a_crashed_volume_removes_its_segment_files() {
    let dir = tempfile::tempdir().unwrap();
    let mut model = vec![0u8; VOLUME_BYTES as usize];
    then_crash(async {
        let (_engine, vol) = engine_and_volume(dir.path()).await;
        write_mix(&vol, &mut model, 0).await;
    });
    assert!(!staged_files(dir.path()).is_empty(), "the crash left files");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let engine = Engine::new(store(dir.path()), config(dir.path())).unwrap();
        engine.delete_volume("v").await.unwrap();
    });
    assert!(
        staged_files(dir.path()).is_empty(),
        "{:?}",
        staged_files(dir.path())
    );
}
