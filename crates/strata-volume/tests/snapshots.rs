//! Snapshots against every store backend: taken in constant time (counted
//! in store requests, not timed), exact while garbage collection runs
//! concurrently with writes and snapshots (a snapshot taken between a
//! pass's mark and its deletions), kept across a reopen, and their space
//! returned once deleted.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::sync::Arc;

use common::*;
use strata_store::Store;
use strata_volume::{ChangeKind, Engine, SnapshotView, VolumeConfig};

const GIB: u64 = 1 << 30;

/// Store requests of every kind so far.
fn requests(store: &Store) -> u64 {
    let r = store.stats().layers.requests;
    r.ops().iter().map(|(_, m)| m.requests).sum()
}

async fn assert_view_matches(view: &Arc<SnapshotView>, model: &[u8], what: &str) {
    let mut buf = vec![0u8; MIB as usize];
    for start in (0..VOLUME_BYTES).step_by(MIB as usize) {
        view.read(start, &mut buf).await.unwrap();
        let s = start as usize;
        if buf[..] != model[s..s + MIB as usize] {
            let i = buf
                .iter()
                .zip(&model[s..])
                .position(|(a, b)| a != b)
                .unwrap();
            panic!("{what}: byte {} differs", s + i);
        }
    }
}

/// The same writes (100 of 64 KiB, spread over the whole volume) on a
/// 1 GiB and a 100 GiB volume: a snapshot of each, and a clone of that,
/// cost the same number of store requests, and few (a snapshot: a seal
/// point's segment, its checkpoint, the manifest; a clone: manifests read,
/// its marker, its manifest); a later snapshot one more (its delta).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_and_a_clone_cost_the_same_store_requests_on_1_gib_and_100_gib() {
    let mut costs = Vec::new();
    for size in [GIB, 100 * GIB] {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::local(&dir.path().join("store")).unwrap();
        let mut config = VolumeConfig::new(dir.path().join("data"));
        config.gc.enabled = false;
        config.segment_max_age_ms = 3_600_000;
        config.lease_ttl_ms = 3_600_000;
        let engine = Engine::new(store.clone(), config).unwrap();
        engine.create_volume("v", size).await.unwrap();
        let vol = engine.open_volume("v").await.unwrap();
        let data = vec![0x5au8; 64 << 10];
        for i in 0..100u64 {
            vol.write(i * (size / 100), &data, false).await.unwrap();
        }
        vol.flush().await.unwrap();
        let before = requests(&store);
        vol.create_snapshot("s").await.unwrap();
        let cost = requests(&store) - before;
        let before = requests(&store);
        engine.create_clone(None, "v", "s", "c").await.unwrap();
        let clone_cost = requests(&store) - before;
        let view = engine.open_snapshot("v", "s").await.unwrap();
        let mut buf = vec![0u8; 64 << 10];
        view.read(99 * (size / 100), &mut buf).await.unwrap();
        assert_eq!(buf, data, "{size}: the snapshot's last write");
        let clone = engine.open_volume("c").await.unwrap();
        clone.read(99 * (size / 100), &mut buf).await.unwrap();
        assert_eq!(buf, data, "{size}: the clone's last write");
        clone.close().await.unwrap();
        // A second snapshot also stores its delta from the first.
        for i in 0..10u64 {
            vol.write(i * (size / 10) + 4096, &data, false)
                .await
                .unwrap();
        }
        vol.flush().await.unwrap();
        let before = requests(&store);
        vol.create_snapshot("s2").await.unwrap();
        let second_cost = requests(&store) - before;
        vol.close().await.unwrap();
        costs.push((cost, clone_cost, second_cost));
    }
    eprintln!(
        "store requests per snapshot, per clone, per later snapshot: 1 GiB {:?}, 100 GiB {:?}",
        costs[0], costs[1]
    );
    assert_eq!(costs[0], costs[1], "store requests: 1 GiB vs 100 GiB");
    assert!(
        costs[0].0 <= 6,
        "a snapshot took {} store requests",
        costs[0].0
    );
    assert!(
        costs[0].1 <= 8,
        "a clone took {} store requests",
        costs[0].1
    );
    assert_eq!(costs[0].2, costs[0].0 + 1, "a later snapshot: one PUT more");
}

/// Random writes, TRIMs and zeroes with garbage collection running in the
/// background (and explicit passes between rounds); a snapshot after each
/// round. Every snapshot reads back exactly what the volume held when it
/// was taken: after later overwrites and passes, after a reopen, and after
/// other snapshots are deleted. Deleting them all gives the space back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn snapshots_stay_exact_while_gc_runs_and_after_a_reopen() {
    const ROUNDS: usize = 4;
    for (backend, store, dir) in backends().await {
        let mut config = small_config(dir.path());
        config.gc.grace_ms = 0;
        let engine = Engine::new(store.clone(), config.clone()).unwrap();
        engine.create_volume("v", VOLUME_BYTES).await.unwrap();
        let vol = engine.open_volume("v").await.unwrap();
        let mut model = vec![0u8; VOLUME_BYTES as usize];
        let mut rng = Rng(0x5eed ^ backend.len() as u64);
        let mut kept: Vec<(String, Vec<u8>)> = Vec::new();
        for round in 0..ROUNDS {
            for _ in 0..150 {
                random_op(&vol, &mut model, &mut rng).await;
            }
            if round % 2 == 1 {
                vol.gc_now(false).await.unwrap();
            }
            let name = format!("s{round}");
            vol.create_snapshot(&name).await.unwrap();
            kept.push((name, model.clone()));
        }
        for _ in 0..150 {
            random_op(&vol, &mut model, &mut rng).await;
        }
        vol.gc_now(true).await.unwrap();
        for (name, want) in &kept {
            let view = engine.open_snapshot("v", name).await.unwrap();
            assert_view_matches(&view, want, &format!("{backend}: {name} after GC")).await;
        }
        assert_matches(&vol, &model, &format!("{backend}: the volume")).await;
        vol.close().await.unwrap();
        drop(engine);

        let engine = Engine::new(store.clone(), config.clone()).unwrap();
        let vol = engine.open_volume("v").await.unwrap();
        assert_matches(&vol, &model, &format!("{backend}: the volume, reopened")).await;
        // Every other snapshot goes; GC runs; the rest stay exact.
        for (name, _) in kept.iter().step_by(2) {
            vol.delete_snapshot(name).await.unwrap();
        }
        vol.gc_now(true).await.unwrap();
        for (name, want) in kept.iter().skip(1).step_by(2) {
            let view = engine.open_snapshot("v", name).await.unwrap();
            assert_view_matches(&view, want, &format!("{backend}: {name}, reopened")).await;
        }
        for (name, _) in kept.iter().skip(1).step_by(2) {
            vol.delete_snapshot(name).await.unwrap();
        }
        vol.gc_now(true).await.unwrap();
        let space = vol.stats().space;
        assert!(
            space.stored_bytes * 2 <= space.live_bytes * 3 + 2 * config.segment_bytes,
            "{backend}: stored {} bytes for {} live once every snapshot is gone",
            space.stored_bytes,
            space.live_bytes
        );
        assert_eq!(vol.stats().snapshot_pinned_segments, 0, "{backend}");
        assert_matches(&vol, &model, &format!("{backend}: the volume at the end")).await;
        vol.close().await.unwrap();
        assert_accounting(&vol, &store, backend).await;
    }
}

/// A clone made while its snapshot is being deleted: never both. The two
/// run together, round after round, over a store with random latency so
/// their steps interleave differently. After each round: a clone that was
/// made reads the snapshot's data and its snapshot is still there; a
/// snapshot that was deleted left no clone behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_clone_made_while_its_snapshot_is_deleted_never_outlives_it() {
    let dir = tempfile::tempdir().unwrap();
    let faults = strata_store::FaultConfig::parse("latency_ms=1,jitter_ms=6,seed=11").unwrap();
    let store = Store::in_memory_with(&strata_store::LayerConfig {
        faults: Some(faults),
        ..strata_store::LayerConfig::default()
    });
    let engine = Engine::new(store.clone(), small_config(dir.path())).unwrap();
    engine.create_volume("p", VOLUME_BYTES).await.unwrap();
    let vol = engine.open_volume("p").await.unwrap();
    let data = vec![0x77u8; MIB as usize];
    vol.write(0, &data, false).await.unwrap();
    let (mut clones, mut deletions, mut neither) = (0, 0, 0);
    for round in 0..40 {
        let snap = format!("s{round}");
        let clone = format!("c{round}");
        vol.create_snapshot(&snap).await.unwrap();
        // The deletion starts 0 to 19 ms after the clone: each step of one
        // meets a different step of the other.
        let stagger = std::time::Duration::from_millis(round % 20);
        let delete = async {
            tokio::time::sleep(stagger).await;
            vol.delete_snapshot(&snap).await
        };
        let (made, deleted) = tokio::join!(engine.create_clone(None, "p", &snap, &clone), delete);
        let listed = engine.list_snapshots("p").await.unwrap();
        let snapshot_left = listed.iter().any(|s| s.name == snap);
        match (made, deleted) {
            (Ok(_), Ok(())) => panic!("round {round}: the clone was made and its snapshot deleted"),
            (Ok(_), Err(e)) => {
                assert!(snapshot_left, "round {round}: {e}");
                let c = engine.open_volume(&clone).await.unwrap();
                let mut buf = vec![0u8; MIB as usize];
                c.read(0, &mut buf).await.unwrap();
                assert_eq!(buf, data, "round {round}: the clone's data");
                c.close().await.unwrap();
                clones += 1;
            }
            (Err(_), Ok(())) => {
                assert!(!snapshot_left, "round {round}");
                let gone = engine.volume_info(&clone).await;
                assert!(
                    gone.is_err(),
                    "round {round}: a clone of a deleted snapshot: {gone:?}"
                );
                deletions += 1;
            }
            (Err(_), Err(_)) => {
                assert!(snapshot_left, "round {round}");
                neither += 1;
            }
        }
    }
    eprintln!(
        "40 races: {clones} clones made, {deletions} snapshots deleted, {neither} both refused"
    );
    vol.close().await.unwrap();
}

/// Every snapshot but the oldest has a delta leading from the one before.
async fn assert_chain_whole(engine: &Engine, what: &str) {
    let list = engine.list_snapshots("v").await.unwrap();
    for pair in list.windows(2) {
        let d = pair[1]
            .delta
            .unwrap_or_else(|| panic!("{what}: {} has no delta", pair[1].name));
        assert_eq!(
            d.from_checkpoint_seq, pair[0].checkpoint_seq,
            "{what}: delta of {} leads from elsewhere",
            pair[1].name
        );
    }
}

/// For every pair of snapshots (`all`; else the pairs ending at the
/// newest): the diff read from the deltas equals the diff of the whole
/// maps, and applied to the older image gives the newer.
async fn assert_diffs_exact(engine: &Engine, kept: &[(String, Vec<u8>)], all: bool, what: &str) {
    for (i, (a, older)) in kept.iter().enumerate() {
        let later = if all { i + 1 } else { kept.len() - 1 };
        for (b, newer) in kept.iter().skip(later.max(i + 1)) {
            let fast = engine.diff_snapshots("v", a, b).await.unwrap();
            let whole = engine.diff_snapshots_whole("v", a, b).await.unwrap();
            if fast != whole {
                let i = fast.iter().zip(&whole).position(|(x, y)| x != y);
                let i = i.unwrap_or(fast.len().min(whole.len()));
                panic!(
                    "{what}: {a} -> {b}: {} changes from the deltas, {} from the maps; first difference {:?} vs {:?}",
                    fast.len(),
                    whole.len(),
                    fast.get(i),
                    whole.get(i)
                );
            }
            let mut image = older.clone();
            for c in &fast {
                let r = c.offset as usize..(c.offset + c.length) as usize;
                match c.kind {
                    ChangeKind::Data => image[r.clone()].copy_from_slice(&newer[r]),
                    ChangeKind::Zero => image[r].fill(0),
                }
            }
            assert!(image == *newer, "{what}: {a} + diff != {b}");
        }
    }
}

/// Diffs read the deltas between consecutive snapshots, and say exactly
/// what comparing the whole maps says, through everything that moves data
/// or changes history: random writes, TRIMs and zeroes with GC running, an
/// explicit pass, a reopen (what changed since the newest snapshot is then
/// computed from the maps), deleting a middle snapshot (its delta merges
/// into the next), deleting the newest (it merges into what changed
/// since), a shrink and grow, a rollback, and deleting the oldest.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn diffs_from_deltas_equal_whole_map_diffs_through_gc_reopen_deletions_resize_and_rollback() {
    for (backend, store, dir) in backends().await {
        let mut config = small_config(dir.path());
        config.gc.grace_ms = 0;
        let mut engine = Engine::new(store.clone(), config.clone()).unwrap();
        engine.create_volume("v", VOLUME_BYTES).await.unwrap();
        let mut vol = engine.open_volume("v").await.unwrap();
        let mut model = vec![0u8; VOLUME_BYTES as usize];
        let mut rng = Rng(0xd1ff ^ backend.len() as u64);
        let mut kept: Vec<(String, Vec<u8>)> = Vec::new();
        for step in 0..9 {
            for _ in 0..60 {
                random_op(&vol, &mut model, &mut rng).await;
            }
            match step {
                2 => drop(vol.gc_now(true).await.unwrap()),
                3 => {
                    vol.close().await.unwrap();
                    drop(engine);
                    engine = Engine::new(store.clone(), config.clone()).unwrap();
                    vol = engine.open_volume("v").await.unwrap();
                }
                4 => {
                    let (name, _) = kept.remove(1);
                    vol.delete_snapshot(&name).await.unwrap();
                }
                5 => {
                    let (name, _) = kept.pop().unwrap();
                    vol.delete_snapshot(&name).await.unwrap();
                }
                6 => {
                    vol.resize(VOLUME_BYTES / 2, true).await.unwrap();
                    vol.resize(VOLUME_BYTES, false).await.unwrap();
                    model[(VOLUME_BYTES / 2) as usize..].fill(0);
                }
                7 => {
                    vol.rollback_to_snapshot(&kept[0].0).await.unwrap();
                    model = kept[0].1.clone();
                    random_op(&vol, &mut model, &mut rng).await;
                }
                _ => {}
            }
            let name = format!("s{step}");
            vol.create_snapshot(&name).await.unwrap();
            kept.push((name, model.clone()));
            let what = format!("{backend}, step {step}");
            assert_chain_whole(&engine, &what).await;
            assert_diffs_exact(&engine, &kept, step == 4 || step == 5, &what).await;
        }
        let (oldest, _) = kept.remove(0);
        vol.delete_snapshot(&oldest).await.unwrap();
        assert_chain_whole(&engine, backend).await;
        assert_diffs_exact(&engine, &kept, true, &format!("{backend}, oldest deleted")).await;
        vol.gc_now(true).await.unwrap();
        assert_diffs_exact(&engine, &kept, true, &format!("{backend}, after GC")).await;
        vol.close().await.unwrap();
    }
}

/// GETs and bytes a call reads from the store.
async fn reads<T>(store: &Store, f: impl std::future::Future<Output = T>) -> (T, u64, u64) {
    let before = store.stats().layers.requests;
    let out = f.await;
    let after = store.stats().layers.requests;
    let gets = after.get.requests + after.get_range.requests
        - before.get.requests
        - before.get_range.requests;
    let bytes = after.get.bytes_read + after.get_range.bytes_read
        - before.get.bytes_read
        - before.get_range.bytes_read;
    (out, gets, bytes)
}

/// A diff costs what changed: 4,000 scattered writes make each snapshot's
/// map thousands of extents, then 8 + 8 blocks change over two snapshots.
/// The diff reads the manifest and the two deltas, the same on a 1 GiB and
/// a 100 GiB volume, a few KiB against the whole maps' hundreds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_diff_reads_what_changed_not_the_whole_maps() {
    let mut figures = Vec::new();
    for size in [GIB, 100 * GIB] {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::local(&dir.path().join("store")).unwrap();
        let mut config = VolumeConfig::new(dir.path().join("data"));
        config.gc.enabled = false;
        let engine = Engine::new(store.clone(), config).unwrap();
        engine.create_volume("v", size).await.unwrap();
        let vol = engine.open_volume("v").await.unwrap();
        let block = vec![0x42u8; 4096];
        for i in 0..4000u64 {
            vol.write(i * (size / 4000), &block, false).await.unwrap();
        }
        vol.create_snapshot("a").await.unwrap();
        let changed = vec![0x17u8; 4096];
        for (snap, first) in [("b", 1u64), ("c", 2000)] {
            for i in first..first + 8 {
                vol.write(i * (size / 4000) + 8192, &changed, false)
                    .await
                    .unwrap();
            }
            vol.create_snapshot(snap).await.unwrap();
        }
        let (fast, gets, bytes) = reads(&store, engine.diff_snapshots("v", "a", "c")).await;
        let fast = fast.unwrap();
        let (whole, _, whole_bytes) =
            reads(&store, engine.diff_snapshots_whole("v", "a", "c")).await;
        assert_eq!(fast, whole.unwrap(), "{size}");
        assert_eq!(fast.len(), 16, "{size}: {fast:?}");
        assert!(fast
            .iter()
            .all(|c| c.length == 4096 && c.kind == ChangeKind::Data));
        let mut out = Vec::new();
        let export = engine.export_diff("v", "a", "c", &mut out, &|_, _| {});
        let (summary, export_gets, _) = reads(&store, export).await;
        assert_eq!(summary.unwrap().data_bytes, 16 * 4096, "{size}");
        figures.push((gets, bytes, whole_bytes, export_gets));
        vol.close().await.unwrap();
    }
    eprintln!(
        "diff a->c (GETs, bytes read, bytes a whole-map diff reads, export GETs): 1 GiB {:?}, 100 GiB {:?}",
        figures[0], figures[1]
    );
    assert_eq!(
        figures[0].0, figures[1].0,
        "GETs per diff: 1 GiB vs 100 GiB"
    );
    assert_eq!(
        figures[0].3, figures[1].3,
        "GETs per export: 1 GiB vs 100 GiB"
    );
    for (gets, bytes, whole_bytes, _) in figures {
        assert_eq!(gets, 3, "a diff reads the manifest and two deltas");
        assert!(bytes < 16 << 10, "a diff read {bytes} bytes");
        assert!(
            whole_bytes > 150_000,
            "the whole maps are {whole_bytes} bytes"
        );
    }
}
