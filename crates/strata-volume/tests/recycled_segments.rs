//! Segment files recycled on the embedded store (strata-store
//! `recycled_files.rs`): a segment GC deleted is overwritten by a later
//! one, and no read, through any tier, ever gets the old bytes for the
//! new segment or the new bytes for the old data.
//!
//! The tiers of the embedded store's read path, each read here: the open
//! segment in memory, a sealed segment in memory, a stored segment read
//! with `pread` through a cached descriptor (and its cached index), and a
//! new engine with nothing cached.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path as FsPath;
use std::sync::Arc;

use strata_store::{LayerConfig, ObjectNames, Store};
use strata_volume::{Engine, Volume, VolumeConfig};

const MIB: u64 = 1 << 20;
const VOLUME_BYTES: u64 = 64 * MIB;
/// Two segments' worth: what each generation of data takes.
const SPAN: u64 = 4 * MIB;

fn config(dir: &FsPath) -> VolumeConfig {
    config_with(dir, strata_volume::Durability::Remote)
}

fn config_with(dir: &FsPath, durability: strata_volume::Durability) -> VolumeConfig {
    let mut c = VolumeConfig::new(dir.join("data"));
    c.segment_bytes = 2 * MIB;
    c.max_write_bytes = MIB;
    c.write_buffer_bytes = 16 * MIB;
    c.journal_bytes = 24 * MIB;
    c.segment_max_age_ms = 600_000;
    c.checkpoint_every_segments = 2;
    c.readahead_max_bytes = 0;
    c.compression = strata_volume::Compression::None;
    // Remote: a FLUSH returns once everything is stored. Local: bulk
    // writes go straight into their segment's file (a pooled one).
    c.durability = durability;
    // GC runs when the test says, and deletes at once.
    c.gc.enabled = false;
    c.gc.grace_ms = 0;
    c
}

fn store(dir: &FsPath) -> Store {
    let layers = LayerConfig {
        recycle_bytes: 64 * MIB,
        ..LayerConfig::default()
    };
    Store::local_with(&dir.join("store"), &layers).unwrap()
}

/// Generation `g`'s byte at volume offset `off`: every generation differs
/// from every other at every offset.
fn byte(g: u8, off: u64) -> u8 {
    ((off / 4096).wrapping_mul(31) as u8) ^ (off as u8) ^ g.wrapping_mul(85)
}

async fn write_gen(vol: &Arc<Volume>, g: u8, start: u64) {
    for off in (start..start + SPAN).step_by(MIB as usize) {
        let data: Vec<u8> = (off..off + MIB).map(|o| byte(g, o)).collect();
        vol.write(off, &data, false).await.unwrap();
    }
}

async fn expect_gen(vol: &Arc<Volume>, g: u8, start: u64, tier: &str) {
    // Reads of 64 KiB, as a client's, and one of the whole span.
    for (off, len) in [(start + 12_288, 65_536), (start, SPAN)] {
        let mut buf = vec![0u8; len as usize];
        vol.read(off, &mut buf).await.unwrap();
        if let Some(i) = (0..len).find(|&i| buf[i as usize] != byte(g, off + i)) {
            let got = buf[i as usize];
            let which = (0..=8u8).find(|&o| byte(o, off + i) == got);
            panic!(
                "{tier}: byte {} is {got:#x}, of generation {which:?}, not {g}",
                off + i
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recycled_segment_file_never_serves_old_or_new_bytes_in_the_wrong_place() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let engine = Engine::new(store.clone(), config(dir.path())).unwrap();
    engine.create_volume("v", VOLUME_BYTES).await.unwrap();
    let vol = engine.open_volume("v").await.unwrap();
    let names = ObjectNames::new("v");

    // Generation 1 at [0, 4 MiB): read from the open and sealed segments,
    // then, once stored, from their files.
    write_gen(&vol, 1, 0).await;
    expect_gen(&vol, 1, 0, "in memory").await;
    vol.flush().await.unwrap();
    expect_gen(&vol, 1, 0, "stored").await;
    let first: Vec<u64> = vol.stored_segments();
    assert!(first.len() >= 2, "{first:?}");

    // Generation 2 over the same range: generation 1's segments are
    // garbage; GC deletes them and their files go to the pool.
    write_gen(&vol, 2, 0).await;
    vol.flush().await.unwrap();
    let report = vol.gc_now(true).await.unwrap();
    assert!(report.objects_deleted >= 2, "{report:?}");
    let kept = store.stats().recycle.unwrap();
    assert!(kept.kept_files >= 2, "{kept:?}");
    for seq in &first {
        assert!(
            store
                .object_store()
                .head(&names.segment(*seq))
                .await
                .is_err(),
            "segment {seq} still stored"
        );
    }

    // Generation 3 elsewhere: new segments overwrite the pooled files.
    write_gen(&vol, 3, SPAN).await;
    vol.flush().await.unwrap();
    let reused = store.stats().recycle.unwrap();
    assert!(reused.reused_files >= 2, "{reused:?}");
    expect_gen(&vol, 2, 0, "after recycling").await;
    expect_gen(&vol, 3, SPAN, "recycled files").await;

    // Generation 4 back over [0, 4 MiB) in memory, then everything read
    // by an engine that has nothing cached.
    write_gen(&vol, 4, 0).await;
    expect_gen(&vol, 4, 0, "in memory over recycled").await;
    drop(vol);
    engine.close_all().await.unwrap();
    drop(engine);
    let engine = Engine::new(store.clone(), config(dir.path())).unwrap();
    let vol = engine.open_volume("v").await.unwrap();
    expect_gen(&vol, 4, 0, "reopened").await;
    expect_gen(&vol, 3, SPAN, "reopened, recycled files").await;
    drop(vol);
    engine.close_all().await.unwrap();
}

/// Waits until every sealed segment is stored (local durability: a FLUSH
/// does not wait for uploads).
async fn uploaded(vol: &Arc<Volume>) {
    for _ in 0..500 {
        if vol.stats().upload_pending_segments == 0 {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("uploads did not finish: {:?}", vol.stats());
}

/// With local durability, 1 MiB writes go straight into the open
/// segment's file (`write/staged_segment.rs`), which is a pooled file when
/// the pool has one: old bytes under the new segment's name, until each
/// place is written. Every generation reads back right through memory,
/// the published files and a fresh engine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recycled_file_as_the_open_segments_file_never_serves_old_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let local = strata_volume::Durability::Local;
    let engine = Engine::new(store.clone(), config_with(dir.path(), local)).unwrap();
    engine.create_volume("v", VOLUME_BYTES).await.unwrap();
    let vol = engine.open_volume("v").await.unwrap();
    for (g, start) in [(1, 0), (2, 0)] {
        write_gen(&vol, g, start).await;
        vol.flush().await.unwrap();
        uploaded(&vol).await;
        expect_gen(&vol, g, start, "published").await;
    }
    let report = vol.gc_now(true).await.unwrap();
    assert!(report.objects_deleted >= 2, "{report:?}");
    // Generation 3 elsewhere: placed into pooled files.
    write_gen(&vol, 3, SPAN).await;
    expect_gen(&vol, 3, SPAN, "in memory, placed").await;
    vol.flush().await.unwrap();
    uploaded(&vol).await;
    let s = vol.stats();
    assert!(s.placed_write_bytes >= SPAN, "{s:?}");
    assert!(s.staged_segments_published >= 6, "{s:?}");
    let reused = store.stats().recycle.unwrap();
    assert!(reused.reused_files >= 2, "{reused:?}");
    expect_gen(&vol, 2, 0, "after recycling").await;
    expect_gen(&vol, 3, SPAN, "published from pooled files").await;
    drop(vol);
    engine.close_all().await.unwrap();
    drop(engine);
    let engine = Engine::new(store.clone(), config_with(dir.path(), local)).unwrap();
    let vol = engine.open_volume("v").await.unwrap();
    expect_gen(&vol, 2, 0, "reopened").await;
    expect_gen(&vol, 3, SPAN, "reopened, published from pooled files").await;
    drop(vol);
    engine.close_all().await.unwrap();
}
