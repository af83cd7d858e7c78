//! A FLUSH after bulk writes on the embedded store makes them durable as
//! segments (sealed, uploaded, released from the journal) rather than by
//! syncing them in the journal's ring, so each byte reaches the disk once
//! (`volume/write.rs`, `Volume::flush_seals`). Small-write FLUSHes keep the
//! ring's sync; a FLUSH whose uploads take too long syncs the ring after
//! all; and nothing acknowledged is lost to a crash either way.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path as FsPath;
use std::sync::Arc;
use std::time::Duration;

use strata_store::Store;
use strata_volume::{Durability, Engine, Volume, VolumeConfig};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const VOLUME_BYTES: u64 = 32 * MIB;

fn config(dir: &FsPath) -> VolumeConfig {
    let mut c = VolumeConfig::new(dir.join("data"));
    c.segment_bytes = 4 * MIB;
    c.max_write_bytes = MIB;
    c.write_buffer_bytes = 16 * MIB;
    c.journal_bytes = 24 * MIB;
    // Nothing is sealed by age: only a full segment or a FLUSH seals.
    c.segment_max_age_ms = 600_000;
    c.durability = Durability::Local;
    c.flush_seal_min_bytes = 2 * MIB;
    // Bulk writes' bytes through the journal: what a FLUSH seal is for
    // (placed writes, `staged_writes.rs`, leave the ring nothing to seal).
    c.bulk_write_min_bytes = 0;
    c.gc.enabled = false;
    c
}

fn store(dir: &FsPath) -> Store {
    Store::local(&dir.join("store")).unwrap()
}

/// The same store with 400 ms added to every write call (its reads bypass
/// the layers): an upload cannot be stored within a short FLUSH wait.
fn slow_store(dir: &FsPath) -> Store {
    let layers = strata_store::LayerConfig {
        faults: Some(strata_store::FaultConfig::parse("latency_ms=400,seed=1").unwrap()),
        ..strata_store::LayerConfig::default()
    };
    Store::local_with(&dir.join("store"), &layers).unwrap()
}

fn pattern(i: u64, len: u64) -> Vec<u8> {
    (0..len)
        .map(|b| (i * 131 + b * 7 + b / 4096) as u8)
        .collect()
}

/// Writes `[start, start + len)` in 1 MiB writes into `vol` and `model`.
async fn write_mib(vol: &Arc<Volume>, model: &mut [u8], start: u64, len: u64) {
    for (i, off) in (start..start + len).step_by(MIB as usize).enumerate() {
        let data = pattern(off / MIB + i as u64, MIB);
        vol.write(off, &data, false).await.unwrap();
        model[off as usize..(off + MIB) as usize].copy_from_slice(&data);
    }
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_after_bulk_writes_stores_them_and_a_small_one_syncs_the_journal() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::new(store(dir.path()), config(dir.path())).unwrap();
    let vol = open(&engine).await;
    let mut model = vec![0u8; VOLUME_BYTES as usize];

    // 3 MiB in a 4 MiB segment: nothing sealed, all of it in the journal.
    write_mib(&vol, &mut model, 0, 3 * MIB).await;
    let before = vol.stats();
    assert_eq!(before.segments_uploaded, 0, "{before:?}");
    assert!(before.journal_used_bytes >= 3 * MIB, "{before:?}");

    vol.flush().await.unwrap();
    let after = vol.stats();
    assert_eq!(
        (after.flush_seals.sealed, after.flush_seals.timed_out),
        (1, 0),
        "{after:?}"
    );
    assert_eq!(after.segments_uploaded, 1, "the FLUSH stored the segment");
    assert_eq!(after.durable_seq, before.open_segment_seq);
    assert_eq!(
        after.journal_used_bytes, 0,
        "every record the FLUSH covered is released from the journal"
    );

    // A small write's FLUSH syncs the journal: no seal, no upload.
    vol.write(8 * MIB, &pattern(77, 4 * KIB), false)
        .await
        .unwrap();
    model[8 * MIB as usize..(8 * MIB + 4 * KIB) as usize].copy_from_slice(&pattern(77, 4 * KIB));
    vol.flush().await.unwrap();
    let small = vol.stats();
    assert_eq!(small.flush_seals.sealed, 1, "{small:?}");
    assert_eq!(small.segments_uploaded, 1, "{small:?}");

    // A FLUSH with nothing new written since the last one does nothing.
    vol.flush().await.unwrap();
    assert_eq!(vol.stats().flush_seals.sealed, 1);

    let mut buf = vec![0u8; VOLUME_BYTES as usize];
    vol.read(0, &mut buf).await.unwrap();
    assert!(buf == model, "data read back differs");
    engine.close_all().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_flush_seal_off_or_a_remote_store_a_flush_only_syncs_the_journal() {
    // The in-memory store stands for S3 here: an upload is a request, not
    // a local file's write, and a FLUSH never waits for one.
    for case in ["embedded, seal off", "remote"] {
        let dir = tempfile::tempdir().unwrap();
        let mut c = config(dir.path());
        let store = match case {
            "remote" => Store::in_memory(),
            _ => {
                c.flush_seal_min_bytes = 0;
                store(dir.path())
            }
        };
        let engine = Engine::new(store, c).unwrap();
        let vol = open(&engine).await;
        let mut model = vec![0u8; VOLUME_BYTES as usize];
        write_mib(&vol, &mut model, 0, 3 * MIB).await;
        vol.flush().await.unwrap();
        let st = vol.stats();
        assert_eq!(
            (st.flush_seals.sealed, st.segments_uploaded),
            (0, 0),
            "{case}: {st:?}"
        );
        engine.close_all().await.unwrap();
    }
}

/// Writes `bulk` bytes and FLUSHes them, then writes 1 MiB more, on a
/// runtime then torn down without closing (kill -9), with `wait_ms` for the
/// FLUSH's uploads; returns the volume's FLUSH counters. What recovery
/// replays plus `bulk` stays under a segment: only the FLUSH seals.
fn flush_then_crash(
    store: &Store,
    dir: &FsPath,
    model: &mut [u8],
    start: u64,
    bulk: u64,
    wait_ms: u64,
) -> strata_volume::FlushSealStats {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let stats = rt.block_on(async {
        let mut c = config(dir);
        c.flush_seal_wait_ms = wait_ms;
        let engine = Engine::new(store.clone(), c).unwrap();
        let vol = open(&engine).await;
        write_mib(&vol, &mut model[..], start, bulk).await;
        vol.flush().await.unwrap();
        // Acknowledged after the FLUSH, not flushed: survives kill -9.
        write_mib(&vol, &mut model[..], start + bulk, MIB).await;
        vol.stats().flush_seals
    });
    rt.shutdown_timeout(Duration::from_secs(60));
    stats
}

#[test]
fn a_crash_after_a_sealing_flush_or_one_that_timed_out_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let mut model = vec![0u8; VOLUME_BYTES as usize];
    // The uploads in time; then uploads that take 400 ms against a wait of
    // 50: the journal's sync must cover the data.
    let stored = flush_then_crash(&store, dir.path(), &mut model, 0, 3 * MIB, 2_000);
    assert_eq!((stored.sealed, stored.timed_out), (1, 0), "{stored:?}");
    let slow = slow_store(dir.path());
    let timed_out = flush_then_crash(&slow, dir.path(), &mut model, 8 * MIB, 2 * MIB, 50);
    assert_eq!(
        (timed_out.sealed, timed_out.timed_out),
        (1, 1),
        "{timed_out:?}"
    );

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let engine = Engine::new(store.clone(), config(dir.path())).unwrap();
        let vol = engine.open_volume("v").await.unwrap();
        vol.verify_accounting().unwrap();
        let mut buf = vec![0u8; VOLUME_BYTES as usize];
        vol.read(0, &mut buf).await.unwrap();
        assert!(buf == model, "data after the crashes differs");
        engine.close_all().await.unwrap();
    });
}
