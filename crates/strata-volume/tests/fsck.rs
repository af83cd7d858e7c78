//! `fsck` of volumes, snapshots and clones: clean ones are reported clean
//! on every backend; a flipped bit, a missing segment, a truncated
//! checkpoint, a map extent forged past its segment's end and a truncated
//! segment are each found, with the object named and the volume ranges,
//! snapshots and clones they affect; `--quick` finds what headers show,
//! not damaged data; and a check while the volume is written and GC
//! deletes what it no longer needs reports no problem, and writes nothing.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::Path as FsPath;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use common::*;
use object_store::path::Path;
use strata_store::Store;
use strata_volume::format::segment::{
    Entry, EntryKind, FixedHeader, SegmentIndex, FIXED_HEADER_BYTES,
};
use strata_volume::{
    Compression, Engine, FsckOptions, FsckReport, Key, Problem, ProblemKind, Severity, VolumeConfig,
};

/// Checks `target` (`VOL` or `VOL@SNAP`) through an engine of its own on
/// `store` (a data dir of its own: nothing shared with a server).
async fn fsck(store: &Store, config: &VolumeConfig, target: &str, quick: bool) -> FsckReport {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config.clone();
    c.data_dir = dir.path().to_path_buf();
    let engine = Engine::new(store.clone(), c).unwrap();
    let (volume, snapshot) = match target.split_once('@') {
        Some((v, s)) => (v, Some(s)),
        None => (target, None),
    };
    let options = FsckOptions { quick };
    engine
        .fsck(volume, snapshot, options, &|_| {})
        .await
        .unwrap_or_else(|e| panic!("fsck {target} did not run: {e}"))
}

/// Whether `r` found no error and warns of nothing but leaked map
/// objects: a periodic checkpoint stored while a snapshot's checkpoint
/// was named first is never named itself (`volume/checkpoint.rs`), and
/// stays until GC's listing sweep; fsck rightly reports it. With `lossy`
/// (a store that loses replies), leaked segments too.
fn clean(r: &FsckReport, lossy: bool) -> bool {
    let expected = |p: &Problem| {
        p.severity == Severity::Warning
            && p.kind == ProblemKind::Unreferenced
            && (lossy || !p.object.contains("/segments/"))
    };
    r.clean && r.errors == 0 && r.problems.iter().all(expected)
}

fn errors(r: &FsckReport) -> Vec<&Problem> {
    r.problems
        .iter()
        .filter(|p| p.severity == Severity::Error)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_volume_snapshot_and_clone_are_clean() {
    for (backend, store, dir) in backends().await {
        let config = small_config(dir.path());
        let engine = Engine::new(store.clone(), config.clone()).unwrap();
        engine.create_volume("v", VOLUME_BYTES).await.unwrap();
        let vol = engine.open_volume("v").await.unwrap();
        let mut model = vec![0u8; VOLUME_BYTES as usize];
        let mut rng = Rng(11);
        for _ in 0..120 {
            random_op(&vol, &mut model, &mut rng).await;
        }
        engine.create_snapshot("v", "a").await.unwrap();
        for _ in 0..80 {
            random_op(&vol, &mut model, &mut rng).await;
        }
        engine.create_snapshot("v", "b").await.unwrap();
        engine.create_clone(None, "v", "a", "c").await.unwrap();
        let clone = engine.open_volume("c").await.unwrap();
        let mut clone_model = model.clone();
        for _ in 0..40 {
            random_op(&clone, &mut clone_model, &mut rng).await;
        }
        engine.close_all().await.unwrap();
        for target in ["v", "v@a", "v@b", "c"] {
            for quick in [false, true] {
                let what = format!("{backend} {target} quick={quick}");
                let r = fsck(&store, &config, target, quick).await;
                assert!(clean(&r, backend == "memory+faults"), "{what}: {r:#?}");
                assert!(
                    r.checked.segments > 0 && r.checked.extents > 0,
                    "{what}: {r:#?}"
                );
                assert_eq!(r.checked.data_bytes_verified > 0, !quick, "{what}: {r:#?}");
            }
        }
        let whole = fsck(&store, &config, "v", false).await;
        assert_eq!(whole.checked.snapshots, 2, "{backend}: {whole:#?}");
        assert!(whole.checked.snapshot_deltas >= 1, "{backend}: {whole:#?}");
        assert_eq!(whole.checked.clone_markers, 1, "{backend}: {whole:#?}");
        let space = whole.space.as_ref().unwrap();
        assert!(space.live_bytes > 0 && space.referenced_bytes >= space.live_bytes);
        let c = fsck(&store, &config, "c", false).await;
        assert!(c.checked.ancestor_segments > 0, "{backend}: {c:#?}");
        assert_eq!(c.clone_of.as_deref(), Some("v@a"));
    }
}

/// A volume on the local store, written so that its layout is known:
/// 4 MiB of random bytes at 0, snapshot `s`, the first 256 KiB written
/// again, clone `c` of `s`. GC off: objects are altered behind its back.
struct Damageable {
    dir: tempfile::TempDir,
    config: VolumeConfig,
}

impl Damageable {
    async fn new(compression: Compression, key: Option<Arc<Key>>) -> Damageable {
        let dir = tempfile::tempdir().unwrap();
        let mut config = small_config_plain(&dir.path().join("data"));
        config.compression = compression;
        config.key = key;
        config.gc.enabled = false;
        let engine = Engine::new(self_store(dir.path()), config.clone()).unwrap();
        engine.create_volume("v", VOLUME_BYTES).await.unwrap();
        let vol = engine.open_volume("v").await.unwrap();
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let data: Vec<u8> = (0..4 * MIB)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        for (i, part) in data.chunks(256 << 10).enumerate() {
            vol.write(i as u64 * (256 << 10), part, false)
                .await
                .unwrap();
        }
        engine.create_snapshot("v", "s").await.unwrap();
        vol.write(0, &data[MIB as usize..MIB as usize + (256 << 10)], false)
            .await
            .unwrap();
        engine.create_clone(None, "v", "s", "c").await.unwrap();
        engine.close_all().await.unwrap();
        Damageable { dir, config }
    }

    /// A fresh handle: the local store keeps segment files open, and the
    /// tests rewrite them.
    fn store(&self) -> Store {
        self_store(self.dir.path())
    }

    async fn fsck(&self, target: &str, quick: bool) -> FsckReport {
        fsck(&self.store(), &self.config, target, quick).await
    }

    async fn get(&self, path: &Path) -> Vec<u8> {
        let got = self.store().object_store().get(path).await.unwrap();
        got.bytes().await.unwrap().to_vec()
    }

    async fn put(&self, path: &Path, bytes: Vec<u8>) {
        let store = self.store();
        store
            .object_store()
            .put(path, Bytes::from(bytes).into())
            .await
            .unwrap();
    }

    /// The segment holding the byte at volume `offset` (as written before
    /// the snapshot, never overwritten), and where that byte lies in it.
    async fn segment_holding(&self, offset: u64) -> (Path, SegmentIndex, u64) {
        let listing = self.store().list_all(&Path::from("v/segments")).await;
        for meta in listing.unwrap() {
            let object = self.get(&meta.location).await;
            let fixed = FixedHeader::decode(&object).unwrap();
            let tables = &object[FIXED_HEADER_BYTES..fixed.header_bytes as usize];
            let key = self.data_key().await;
            let key = key.as_ref().map(|k| k.bytes());
            let (idx, entries) =
                SegmentIndex::decode_tables(fixed, tables, VOLUME_BYTES, key).unwrap();
            let holds = |e: &&Entry| {
                e.kind == EntryKind::Write && e.offset <= offset && offset < e.offset + e.len
            };
            if let Some(e) = entries.iter().find(holds) {
                let data_offset = e.data_offset + (offset - e.offset);
                return (meta.location, idx, data_offset);
            }
        }
        panic!("no segment holds volume offset {offset}");
    }

    /// The volume's data key (unwrapped from its manifest with the user's
    /// key), for decoding its segments here.
    async fn data_key(&self) -> Option<Key> {
        let kek = self.config.key.as_ref()?;
        let m = strata_volume::Manifest::decode(&self.get(&Path::from("v/manifest")).await);
        let m = m.unwrap();
        let wrapped = &m.encryption.as_ref().unwrap().wrapped_key;
        let uuid = m.uuid_bytes().unwrap();
        Some(strata_volume::format::key_wrap::unwrap(kek, wrapped, &uuid).unwrap())
    }

    async fn checkpoint_path(&self) -> Path {
        let m = self.get(&Path::from("v/manifest")).await;
        let m = strata_volume::Manifest::decode(&m).unwrap();
        Path::from(format!("v/checkpoints/{:016x}", m.checkpoint_seq.unwrap()))
    }
}

fn self_store(dir: &FsPath) -> Store {
    Store::local(&dir.join("store")).unwrap()
}

/// The one error of `r`, which must be of `kind` and name `object`.
fn the_error<'a>(r: &'a FsckReport, kind: ProblemKind, object: &Path, what: &str) -> &'a Problem {
    let errors = errors(r);
    assert_eq!(errors.len(), 1, "{what}: {r:#?}");
    assert_eq!(errors[0].kind, kind, "{what}: {r:#?}");
    assert_eq!(errors[0].object, object.to_string(), "{what}: {r:#?}");
    assert!(!r.clean && r.errors == 1, "{what}: {r:#?}");
    errors[0]
}

/// Whether `ranges` include volume byte `offset`.
fn covers(ranges: &strata_volume::AffectedRanges, offset: u64) -> bool {
    ranges
        .ranges
        .iter()
        .any(|r| r.offset <= offset && offset < r.offset + r.length)
}

/// What a problem in the bytes of volume offset `offset` (never
/// overwritten) must name: that range of the volume, of snapshot `s`, and
/// clone `c`.
fn assert_reaches(p: &Problem, offset: u64, what: &str) {
    let volume = p.affects.volume.as_ref().expect("the volume");
    assert!(covers(volume, offset), "{what}: {p:#?}");
    assert_eq!(p.affects.snapshots.len(), 1, "{what}: {p:#?}");
    assert_eq!(p.affects.snapshots[0].snapshot, "s", "{what}: {p:#?}");
    assert!(
        covers(&p.affects.snapshots[0].ranges, offset),
        "{what}: {p:#?}"
    );
    assert_eq!(p.affects.clones, vec!["c".to_string()], "{what}: {p:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_bit_and_a_missing_segment_are_found_with_what_they_affect() {
    let key = Some(Arc::new(Key::from_bytes([7; 32])));
    for (compression, key, what) in [
        (Compression::None, None, "plain"),
        (Compression::Lz4, key, "encrypted+lz4"),
    ] {
        let v = Damageable::new(compression, key).await;
        let offset = 2 * MIB + 5000;
        let (path, idx, data_offset) = v.segment_holding(offset).await;
        let original = v.get(&path).await;

        // A flipped bit in the data: found by a full check only.
        let chunk = data_offset / 4096;
        let mut bad = original.clone();
        bad[idx.chunk_range(chunk, chunk).start as usize + 7] ^= 0x04;
        v.put(&path, bad).await;
        let r = v.fsck("v", false).await;
        let p = the_error(&r, ProblemKind::Corrupt, &path, what);
        assert!(
            p.detail.contains(&format!("chunk {chunk}")),
            "{what}: {p:#?}"
        );
        assert_reaches(p, offset, what);
        let quick = v.fsck("v", true).await;
        assert!(clean(&quick, false), "{what}: quick: {quick:#?}");
        // The snapshot and the clone (which inherits the segment) too.
        let s = v.fsck("v@s", false).await;
        let p = the_error(&s, ProblemKind::Corrupt, &path, what);
        assert!(p.affects.volume.is_none(), "{what}: {p:#?}");
        assert!(
            covers(&p.affects.snapshots[0].ranges, offset),
            "{what}: {p:#?}"
        );
        assert_eq!(p.affects.clones, vec!["c".to_string()]);
        let c = v.fsck("c", false).await;
        let p = the_error(&c, ProblemKind::Corrupt, &path, what);
        assert!(
            covers(p.affects.volume.as_ref().unwrap(), offset),
            "{what}: {p:#?}"
        );
        assert!(p.detail.contains("of v (inherited)"), "{what}: {p:#?}");

        // The segment gone: found by both.
        v.store().delete(&path).await.unwrap();
        for quick in [false, true] {
            let r = v.fsck("v", quick).await;
            let p = the_error(&r, ProblemKind::Missing, &path, what);
            assert_reaches(p, offset, what);
            assert_eq!(r.collected_while_checking, 0);
        }
        v.put(&path, original).await;
        let r = v.fsck("v", false).await;
        assert!(clean(&r, false), "{what}: repaired: {r:#?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_checkpoint_a_forged_extent_and_a_truncated_segment_are_found() {
    let v = Damageable::new(Compression::None, None).await;
    let checkpoint = v.checkpoint_path().await;
    let original = v.get(&checkpoint).await;

    // A truncated checkpoint: the volume's map is lost (all of it), the
    // snapshot and the clone (their own maps) are not affected.
    v.put(&checkpoint, original[..original.len() * 3 / 5].to_vec())
        .await;
    for quick in [false, true] {
        let r = v.fsck("v", quick).await;
        let p = the_error(
            &r,
            ProblemKind::Corrupt,
            &checkpoint,
            "truncated checkpoint",
        );
        assert!(p.affects.volume.as_ref().unwrap().whole, "{p:#?}");
        assert!(p.affects.snapshots.is_empty() && p.affects.clones.is_empty());
    }
    assert!(clean(&v.fsck("v@s", false).await, false));

    // An extent pointing past its segment's data, checksums recomputed
    // (what a strata bug writing the map would leave): its range, exactly.
    const RECORD: usize = 24;
    let mut forged = original.clone();
    let at = 104 + RECORD;
    let start = u64::from_le_bytes(forged[at..at + 8].try_into().unwrap());
    let len = u32::from_le_bytes(forged[at + 20..at + 24].try_into().unwrap());
    forged[at + 16..at + 20].copy_from_slice(&(1u32 << 31).to_le_bytes());
    let body_crc = crc32c::crc32c(&forged[104..]);
    forged[96..100].copy_from_slice(&body_crc.to_le_bytes());
    let header_crc = crc32c::crc32c(&forged[..100]);
    forged[100..104].copy_from_slice(&header_crc.to_le_bytes());
    v.put(&checkpoint, forged).await;
    for quick in [false, true] {
        let r = v.fsck("v", quick).await;
        let errors = errors(&r);
        assert_eq!(errors.len(), 1, "{r:#?}");
        let p = errors[0];
        assert_eq!(p.kind, ProblemKind::MapPastEnd, "{r:#?}");
        assert!(p.detail.contains("past its end"), "{p:#?}");
        let volume = p.affects.volume.as_ref().unwrap();
        assert_eq!(volume.bytes, u64::from(len), "{p:#?}");
        assert_eq!(volume.ranges[0].offset, start, "{p:#?}");
        assert!(p.affects.snapshots.is_empty(), "{p:#?}");
    }
    v.put(&checkpoint, original).await;

    // A truncated segment, cut at the chunk holding volume offset
    // `offset`: the listing shows it, so quick finds it; what is cut off
    // is what it affects.
    let offset = 3 * MIB + 100;
    let (path, idx, data_offset) = v.segment_holding(offset).await;
    let segment = v.get(&path).await;
    let cut = idx
        .chunk_range(data_offset / 4096, data_offset / 4096)
        .start as usize;
    v.put(&path, segment[..cut].to_vec()).await;
    for quick in [false, true] {
        let r = v.fsck("v", quick).await;
        let p = the_error(&r, ProblemKind::Truncated, &path, "truncated segment");
        assert_reaches(p, offset, "truncated segment");
    }
    v.put(&path, segment).await;
    assert!(clean(&v.fsck("v", false).await, false));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_while_written_and_collected_reports_no_false_problem() {
    for (backend, store, dir) in backends().await {
        let mut config = small_config(dir.path());
        // Deleted as soon as unreferenced: objects vanish under the check.
        config.gc.grace_ms = 0;
        config.gc.interval_ms = 50;
        let engine = Engine::new(store.clone(), config.clone()).unwrap();
        engine.create_volume("v", VOLUME_BYTES).await.unwrap();
        let vol = engine.open_volume("v").await.unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (vol, stop) = (vol.clone(), stop.clone());
            tokio::spawn(async move {
                let mut model = vec![0u8; VOLUME_BYTES as usize];
                let mut rng = Rng(5);
                while !stop.load(Ordering::Relaxed) {
                    random_op(&vol, &mut model, &mut rng).await;
                }
            })
        };
        // The check through a store handle of its own (the same objects),
        // as another process would have: it must not write or delete
        // anything. 5 ms per request stretches each check over several
        // GC passes.
        let layers = strata_store::LayerConfig {
            faults: Some(strata_store::FaultConfig::parse("latency_ms=5").unwrap()),
            ..strata_store::LayerConfig::default()
        };
        let checker = Store::from_object_store(
            store.object_store().clone(),
            format!("{backend}, slowed"),
            &layers,
        );
        let (mut runs, mut collected) = (0u64, 0u64);
        while runs < 6 || (collected == 0 && runs < 40) {
            let r = fsck(&checker, &config, "v", runs % 3 == 2).await;
            assert_eq!(r.errors, 0, "{backend} check {runs}: {r:#?}");
            collected += r.collected_while_checking;
            runs += 1;
            match runs {
                2 => drop(engine.create_snapshot("v", "s").await.unwrap()),
                4 => engine.delete_snapshot("v", "s").await.unwrap(),
                _ => {}
            }
        }
        stop.store(true, Ordering::Relaxed);
        writer.await.unwrap();
        println!("{backend}: {runs} checks, {collected} objects collected meanwhile");
        assert!(
            collected > 0,
            "{backend}: GC deleted nothing under {runs} checks: the race was not tried"
        );
        let ops = checker.stats().layers.requests;
        assert!(ops.get_range.requests > 0, "{backend}: {ops:?}");
        assert_eq!((ops.put.requests, ops.delete.requests), (0, 0), "{ops:?}");
        engine.close_all().await.unwrap();
        let r = fsck(&store, &config, "v", false).await;
        assert!(r.clean, "{backend}: closed: {r:#?}");
    }
}
