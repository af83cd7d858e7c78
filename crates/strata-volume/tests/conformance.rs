//! The engine's conformance suite: every test runs against every store
//! backend (in-memory, the local directory, and a real MinIO on 127.0.0.1
//! started by `strata-testkit`, one bucket per test), compared with a
//! byte-for-byte model.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::Path;
use std::sync::Arc;

use common::*;
use strata_store::Store;
use strata_volume::{Allocation, Engine, VolumeError};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_ops_match_the_model_across_clean_reopens() {
    for (backend, store, dir) in backends().await {
        let engine = Engine::new(store.clone(), small_config(dir.path())).unwrap();
        engine.create_volume("v", VOLUME_BYTES).await.unwrap();
        let mut model = vec![0u8; VOLUME_BYTES as usize];
        let mut rng = Rng(0x2545F4914F6CDD1D);
        for round in 0..3 {
            let engine = Engine::new(store.clone(), small_config(dir.path())).unwrap();
            let vol = engine.open_volume("v").await.unwrap();
            assert_matches(&vol, &model, &format!("{backend} after reopen {round}")).await;
            for i in 0..300 {
                random_op(&vol, &mut model, &mut rng).await;
                if i % 50 == 0 {
                    let off = rng.below(VOLUME_BYTES - 70_000);
                    let mut buf = vec![0u8; 1 + rng.below(70_000) as usize];
                    vol.read(off, &mut buf).await.unwrap();
                    assert_eq!(
                        buf[..],
                        model[off as usize..off as usize + buf.len()],
                        "{backend} read {off}"
                    );
                }
            }
            assert_matches(&vol, &model, &format!("{backend} round {round}")).await;
            engine.close_all().await.unwrap();
            assert_accounting(&vol, &store, &format!("{backend} round {round}")).await;
            let info = engine.volume_info("v").await.unwrap();
            assert!(
                info.segments > 0 && info.checkpoint_seq.is_some(),
                "{backend}: {info:?}"
            );
        }
    }
}

/// An empty range reads as empty bytes on every backend, without a
/// request (S3 clients refuse a GET of zero bytes; the local directory
/// would answer it): an uncompressed segment sealed empty has zero bytes
/// of tables, and recovery, reads and fsck ask for them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_range_is_empty_on_every_backend() {
    for (backend, store, _dir) in backends().await {
        let path = object_store::path::Path::from("v/segments/0000000000000001");
        store
            .object_store()
            .put(&path, vec![7u8; 104].into())
            .await
            .unwrap();
        let got = store.get_range(&path, 104..104).await;
        assert!(
            got.as_ref().is_ok_and(|b| b.is_empty()),
            "{backend}: {got:?}"
        );
        let whole = store.get_range(&path, 0..104).await.unwrap();
        assert_eq!(whole.len(), 104, "{backend}");
    }
}

/// Runs `ops` acknowledged operations on a runtime that is then torn down
/// without closing the volume: what a `kill -9` leaves (the journal file
/// holds every acknowledged write; uploads stop wherever they were).
fn crash_after(store: &Store, dir: &Path, model: &mut [u8], rng: &mut Rng, ops: usize) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let engine = Engine::new(store.clone(), small_config(dir)).unwrap();
        let vol = engine.open_volume("v").await.unwrap();
        assert_matches(&vol, model, "before crash").await;
        for _ in 0..ops {
            random_op(&vol, model, rng).await;
        }
    });
    // Up to a minute: a dropped volume's journal writes what is pending and
    // fdatasyncs it on the worker dropping it; on a busy CI disk that took
    // over 5 s, the leftover thread still held the volume's lock, and the
    // reopen below found it 'served by another process'. Returns at once
    // when nothing is left running.
    rt.shutdown_timeout(std::time::Duration::from_secs(60));
}

#[test]
fn crash_recovery_keeps_every_acknowledged_write() {
    // Each crash is a runtime torn down: the S3 client's pooled connections
    // die with it, and the retry layer must cope with that too.
    let setup = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for (backend, store, dir) in setup.block_on(backends()) {
        let mut model = vec![0u8; VOLUME_BYTES as usize];
        let mut rng = Rng(0x9E3779B97F4A7C15);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let engine = Engine::new(store.clone(), small_config(dir.path())).unwrap();
            engine.create_volume("v", VOLUME_BYTES).await.unwrap();
        });
        // Crash points from "just opened" to "many laps of the journal".
        for ops in [0usize, 1, 7, 60, 250, 600] {
            crash_after(&store, dir.path(), &mut model, &mut rng, ops);
        }
        rt.block_on(async {
            let engine = Engine::new(store.clone(), small_config(dir.path())).unwrap();
            let vol = engine.open_volume("v").await.unwrap();
            vol.verify_accounting().unwrap();
            assert_matches(&vol, &model, &format!("{backend} after crashes")).await;
            engine.close_all().await.unwrap();
            assert_accounting(&vol, &store, &format!("{backend} after crashes")).await;
        });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_and_flush_from_another_handle() {
    for (backend, store, dir) in backends().await {
        let engine = Arc::new(Engine::new(store.clone(), small_config(dir.path())).unwrap());
        engine.create_volume("v", VOLUME_BYTES).await.unwrap();
        let vol = engine.open_volume("v").await.unwrap();
        let mut tasks = Vec::new();
        for t in 0..8u64 {
            let vol = vol.clone();
            tasks.push(tokio::spawn(async move {
                for i in 0..200u64 {
                    let block = t * 200 + i;
                    vol.write(block * 4096, &[(block % 251) as u8; 4096], false)
                        .await
                        .unwrap();
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let other = engine.open_volume("v").await.unwrap();
        other.flush().await.unwrap();
        let mut buf = vec![0u8; 4096];
        for block in 0..1600u64 {
            vol.read(block * 4096, &mut buf).await.unwrap();
            assert!(
                buf.iter().all(|&b| b == (block % 251) as u8),
                "{backend} block {block}"
            );
        }
        engine.close_all().await.unwrap();
    }
}

#[tokio::test]
async fn block_status_reports_holes_zeros_and_data() {
    for (backend, store, dir) in backends().await {
        let engine = Engine::new(store, small_config(dir.path())).unwrap();
        engine.create_volume("v", VOLUME_BYTES).await.unwrap();
        let vol = engine.open_volume("v").await.unwrap();
        vol.write(8192, &[1u8; 8192], false).await.unwrap();
        vol.write_zeroes(16384, 4096, true, false).await.unwrap();
        vol.write_zeroes(20480, 4096, false, false).await.unwrap();
        let got = vol.block_status(0, 32768, 16).unwrap();
        let want = vec![
            (8192, Allocation::Hole),
            (8192, Allocation::Data),
            (4096, Allocation::Zero),
            (12288, Allocation::Hole),
        ];
        assert_eq!(got, want, "{backend}");
        vol.trim(8192, 4096, false).await.unwrap();
        let got = vol.block_status(0, 32768, 2).unwrap();
        assert_eq!(
            got,
            vec![(12288, Allocation::Hole), (4096, Allocation::Data)],
            "{backend}"
        );
        engine.close_all().await.unwrap();
    }
}

#[tokio::test]
async fn bad_requests_and_admin_errors_are_clear() {
    for (backend, store, dir) in backends().await {
        let engine = Engine::new(store, small_config(dir.path())).unwrap();
        engine.create_volume("v", VOLUME_BYTES).await.unwrap();
        assert!(
            matches!(
                engine.create_volume("v", MIB).await,
                Err(VolumeError::AlreadyExists(_))
            ),
            "{backend}"
        );
        assert!(matches!(
            engine.open_volume("nope").await,
            Err(VolumeError::NotFound(_))
        ));
        assert!(matches!(
            engine.create_volume("a/b", MIB).await,
            Err(VolumeError::Invalid(_))
        ));
        assert!(matches!(
            engine.create_volume("odd", 1000).await,
            Err(VolumeError::Invalid(_))
        ));
        let vol = engine.open_volume("v").await.unwrap();
        let mut buf = [0u8; 2];
        assert!(matches!(
            vol.read(VOLUME_BYTES - 1, &mut buf).await,
            Err(VolumeError::OutOfRange { .. })
        ));
        assert!(matches!(
            vol.write(u64::MAX, &buf, false).await,
            Err(VolumeError::OutOfRange { .. })
        ));
        assert!(matches!(
            vol.write(0, &vec![0u8; 2 * MIB as usize], false).await,
            Err(VolumeError::Invalid(_))
        ));
        assert!(
            matches!(
                engine.delete_volume("v").await,
                Err(VolumeError::Invalid(_))
            ),
            "delete while open"
        );
        engine.close_all().await.unwrap();
        engine.delete_volume("v").await.unwrap();
        assert!(engine.list_volumes().await.unwrap().is_empty(), "{backend}");
    }
}

#[tokio::test]
async fn a_corrupt_segment_is_reported_not_served() {
    let dir = tempfile::tempdir().unwrap();
    let store_dir = dir.path().join("store");
    let store = Store::local(&store_dir).unwrap();
    let engine = Engine::new(store.clone(), small_config_plain(dir.path())).unwrap();
    engine.create_volume("v", VOLUME_BYTES).await.unwrap();
    let vol = engine.open_volume("v").await.unwrap();
    vol.write(0, &[7u8; 65536], false).await.unwrap();
    engine.close_all().await.unwrap();
    // Flip one byte near the end of the segment's data area.
    let seg = store_dir.join("v/segments/0000000000000001");
    let mut bytes = std::fs::read(&seg).unwrap();
    let n = bytes.len();
    bytes[n - 100] ^= 0x55;
    std::fs::write(&seg, &bytes).unwrap();
    let engine = Engine::new(store, small_config_plain(dir.path())).unwrap();
    let vol = engine.open_volume("v").await.unwrap();
    let mut buf = vec![0u8; 4096];
    vol.read(0, &mut buf).await.unwrap();
    assert!(buf.iter().all(|&b| b == 7), "intact chunks still read");
    let err = vol.read(61440, &mut buf).await.unwrap_err();
    assert!(matches!(err, VolumeError::Corrupt { .. }), "{err}");
    assert!(err.to_string().contains("checksum mismatch"), "{err}");
    engine.close_all().await.unwrap();
}

#[tokio::test]
async fn one_writer_per_volume() {
    for (backend, store, dir) in backends().await {
        let first = Engine::new(store.clone(), small_config(&dir.path().join("a"))).unwrap();
        first.create_volume("v", VOLUME_BYTES).await.unwrap();
        let vol = first.open_volume("v").await.unwrap();
        vol.write(0, b"first", false).await.unwrap();
        // Another data directory (another host): refused, naming the holder.
        let other = Engine::new(store.clone(), small_config(&dir.path().join("b"))).unwrap();
        let err = other.open_volume("v").await.unwrap_err();
        assert!(matches!(err, VolumeError::Busy(_)), "{backend}: {err}");
        assert!(err.to_string().contains("being served by"), "{err}");
        assert!(matches!(
            other.delete_volume("v").await,
            Err(VolumeError::Busy(_))
        ));
        // The same data directory in another engine (process): refused too.
        let same = Engine::new(store.clone(), small_config(&dir.path().join("a"))).unwrap();
        assert!(
            matches!(same.open_volume("v").await, Err(VolumeError::Busy(_))),
            "{backend}"
        );
        // A clean close hands the volume over at once.
        first.close_all().await.unwrap();
        let vol = other.open_volume("v").await.unwrap();
        let mut buf = [0u8; 5];
        vol.read(0, &mut buf).await.unwrap();
        assert_eq!(&buf, b"first", "{backend}");
        other.close_all().await.unwrap();
    }
}

/// Live and stored bytes per volume (what GC weighs): overwrites and TRIM
/// turn stored data into garbage, and a reopen, which rebuilds the counts
/// from checkpoint, segments and listing, agrees with the running server.
#[tokio::test]
async fn overwrites_and_trims_become_counted_garbage() {
    // Exact counts of what was written: no collection in between.
    let config = |dir: &Path| {
        let mut c = small_config_plain(dir);
        c.gc.enabled = false;
        c
    };
    for (backend, store, dir) in backends().await {
        let engine = Engine::new(store.clone(), config(dir.path())).unwrap();
        engine.create_volume("v", VOLUME_BYTES).await.unwrap();
        let data = vec![0x5au8; (4 * MIB) as usize];
        let mut before = None;
        for round in 0..2 {
            let engine = Engine::new(store.clone(), config(dir.path())).unwrap();
            let vol = engine.open_volume("v").await.unwrap();
            if let Some(before) = before {
                assert_eq!(
                    vol.stats().space,
                    before,
                    "{backend}: counts after reopen {round}"
                );
            }
            for chunk in 0..4 {
                let off = chunk * MIB;
                vol.write(off, &data[off as usize..(off + MIB) as usize], false)
                    .await
                    .unwrap();
            }
            if round == 1 {
                vol.trim(3 * MIB, MIB, false).await.unwrap();
            }
            engine.close_all().await.unwrap();
            let s = vol.stats();
            let live = if round == 0 { 4 * MIB } else { 3 * MIB };
            assert_eq!(s.space.live_bytes, live, "{backend} round {round}: {s:?}");
            assert_eq!(s.mapped_data_bytes, live, "{backend} round {round}");
            let written = 4 * MIB * (round + 1);
            assert!(
                s.space.stored_bytes >= written,
                "{backend} round {round}: {s:?}"
            );
            // Segment headers: a few KiB per segment, nothing more.
            assert!(
                s.space.stored_bytes < written + 64 * 1024,
                "{backend}: {s:?}"
            );
            assert_eq!(
                s.space.garbage_bytes,
                s.space.stored_bytes - live,
                "{backend}"
            );
            before = Some(s.space);
        }
    }
}
