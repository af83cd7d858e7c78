//! Compression and encryption at rest, on every backend: an encrypted
//! volume opens only with its key (a wrong or missing key is named at open,
//! never met as unreadable data), its objects hold no plaintext, and a
//! flipped bit, a chunk copied from another segment, or a forged frame
//! table each give a clear error, never wrong data. Compressed volumes
//! store fewer bytes and read the same.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::sync::Arc;

use bytes::Bytes;
use common::{backends, small_config, MIB, VOLUME_BYTES};
use object_store::path::Path;
use strata_store::Store;
use strata_volume::format::frame::FRAME_RECORD_BYTES;
use strata_volume::format::segment::{FixedHeader, FIXED_HEADER_BYTES};
use strata_volume::{Compression, Engine, Key, VolumeConfig, VolumeError};

const MARKER: &[u8] = b"strata plaintext marker: this text must never be stored in the clear. ";

fn key(byte: u8) -> Arc<Key> {
    Arc::new(Key::from_bytes([byte; 32]))
}

fn config(dir: &std::path::Path, compression: Compression, k: Option<Arc<Key>>) -> VolumeConfig {
    let mut c = small_config(dir);
    c.compression = compression;
    c.key = k;
    // Objects are inspected and altered: nothing may move or vanish.
    c.gc.enabled = false;
    c
}

/// 3 MiB: text that compresses, then random bytes that do not.
fn data() -> Vec<u8> {
    let mut d: Vec<u8> = MARKER
        .iter()
        .cycle()
        .take(2 * MIB as usize)
        .copied()
        .collect();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    d.extend((0..MIB).map(|_| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x as u8
    }));
    d
}

async fn write_all(engine: &Engine, name: &str, bytes: &[u8]) {
    let vol = engine.open_volume(name).await.unwrap();
    for (i, part) in bytes.chunks(256 << 10).enumerate() {
        vol.write(i as u64 * (256 << 10), part, false)
            .await
            .unwrap();
    }
    vol.flush().await.unwrap();
}

async fn read_all(engine: &Engine, name: &str, len: usize) -> Result<Vec<u8>, VolumeError> {
    let vol = engine.open_volume(name).await?;
    let mut buf = vec![0u8; len];
    vol.read(0, &mut buf).await?;
    Ok(buf)
}

async fn get(store: &Store, path: &Path) -> Vec<u8> {
    let r = store.object_store().get(path).await.unwrap();
    r.bytes().await.unwrap().to_vec()
}

async fn put(store: &Store, path: &Path, bytes: Vec<u8>) {
    store
        .object_store()
        .put(path, Bytes::from(bytes).into())
        .await
        .unwrap();
}

async fn segment_paths(store: &Store, volume: &str) -> Vec<Path> {
    let prefix = Path::from(format!("{volume}/segments"));
    let mut paths: Vec<Path> = store
        .list_all(&prefix)
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.location)
        .collect();
    paths.sort();
    paths
}

/// Where frame `chunk` of a version 2 segment object lies, and its
/// record's offset in the object.
fn frame_at(object: &[u8], chunk: usize) -> (std::ops::Range<usize>, usize) {
    let fixed = FixedHeader::decode(object).unwrap();
    assert_eq!(fixed.version, 2);
    let records = FIXED_HEADER_BYTES;
    let len_of = |i: usize| {
        let at = records + i * FRAME_RECORD_BYTES;
        match u16::from_le_bytes([object[at], object[at + 1]]) {
            0 => 4096,
            n => usize::from(n),
        }
    };
    let start = fixed.header_bytes as usize + (0..chunk).map(len_of).sum::<usize>();
    (
        start..start + len_of(chunk),
        records + chunk * FRAME_RECORD_BYTES,
    )
}

/// Recomputes the CRCs of a segment header after its frame table was
/// edited: what a forger who can write the bucket would do.
fn reseal_header(object: &mut [u8]) {
    let fixed = FixedHeader::decode(object).unwrap();
    let end = fixed.header_bytes as usize;
    let tables_crc = crc32c::crc32c(&object[FIXED_HEADER_BYTES..end]);
    object[96..100].copy_from_slice(&tables_crc.to_le_bytes());
    let header_crc = crc32c::crc32c(&object[0..100]);
    object[100..104].copy_from_slice(&header_crc.to_le_bytes());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_encrypted_volume_opens_only_with_its_key_and_stores_no_plaintext() {
    let want = data();
    for (backend, store, dir) in backends().await {
        let right = key(1);
        let engine = Engine::new(
            store.clone(),
            config(dir.path(), Compression::Lz4, Some(right.clone())),
        )
        .unwrap();
        engine.create_volume("v", VOLUME_BYTES).await.unwrap();
        write_all(&engine, "v", &want).await;
        // Two snapshots: a delta between them, diffs read through it.
        engine.create_snapshot("v", "a").await.unwrap();
        let vol = engine.open_volume("v").await.unwrap();
        vol.write(MIB, &[1u8; 8192], false).await.unwrap();
        engine.create_snapshot("v", "b").await.unwrap();
        let changes = engine.diff_snapshots("v", "a", "b").await.unwrap();
        assert_eq!(changes.len(), 1, "{backend}: {changes:?}");
        vol.write(MIB, &want[MIB as usize..MIB as usize + 8192], false)
            .await
            .unwrap();
        engine.close_all().await.unwrap();
        // No object of the volume holds the plaintext; the maps
        // (checkpoints, deltas) are sealed whole.
        let all = store.list_all(&Path::from("v")).await.unwrap();
        assert!(all.len() > 3, "{backend}: {all:?}");
        let mut sealed = 0;
        for m in &all {
            let bytes = get(&store, &m.location).await;
            assert!(
                !bytes.windows(32).any(|w| w == &MARKER[..32]),
                "{backend}: plaintext in {}",
                m.location
            );
            let name = m.location.as_ref();
            if name.contains("/checkpoints/") || name.contains("/deltas/") {
                assert!(
                    bytes.starts_with(b"STRATSLD"),
                    "{backend}: {name} not sealed"
                );
                sealed += 1;
            }
        }
        assert!(sealed >= 3, "{backend}: {sealed} sealed objects");
        // No key, another key: refused at open, naming the key it wants.
        for (given, says) in [(None, "is encrypted"), (Some(key(2)), "does not open")] {
            let other = tempfile::tempdir().unwrap();
            let e =
                Engine::new(store.clone(), config(other.path(), Compression::Lz4, given)).unwrap();
            let err = e.open_volume("v").await.err().unwrap();
            assert!(matches!(err, VolumeError::Key { .. }), "{backend}: {err}");
            let text = err.to_string();
            assert!(text.contains(says), "{backend}: {text}");
            assert!(text.contains(&right.fingerprint()), "{backend}: {text}");
        }
        // The right key reads it back (from the store: a fresh data dir).
        let other = tempfile::tempdir().unwrap();
        let e = Engine::new(
            store.clone(),
            config(other.path(), Compression::Lz4, Some(right)),
        )
        .unwrap();
        let got = read_all(&e, "v", want.len()).await.unwrap();
        assert!(got == want, "{backend}: data differs");
        let changes = e.diff_snapshots("v", "a", "b").await.unwrap();
        assert_eq!(changes.len(), 1, "{backend}: {changes:?}");
        let snap = e.open_snapshot("v", "b").await.unwrap();
        let mut buf = vec![0u8; 8192];
        snap.read(MIB, &mut buf).await.unwrap();
        assert!(buf.iter().all(|&b| b == 1), "{backend}: snapshot b");
        e.close_all().await.unwrap();
    }
}

/// Opens volume `v` from a fresh data dir and a fresh store handle (the
/// local store keeps segment files open: immutable objects, rewritten here
/// behind its back) and reads everything: the error.
async fn read_error(store_dir: &std::path::Path, k: Option<Arc<Key>>, len: usize) -> VolumeError {
    let store = Store::local(store_dir).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::new(store.clone(), config(dir.path(), Compression::Lz4, k)).unwrap();
    let err = read_all(&engine, "v", len).await.err().unwrap();
    engine.close_all().await.ok();
    err
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flipped_bits_swapped_chunks_and_forged_tables_are_errors_never_data() {
    let want = data();
    for (k, what) in [(Some(key(1)), "encrypted+lz4"), (None, "lz4")] {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::local(&dir.path().join("store")).unwrap();
        let engine = Engine::new(
            store.clone(),
            config(&dir.path().join("a"), Compression::Lz4, k.clone()),
        )
        .unwrap();
        engine.create_volume("v", VOLUME_BYTES).await.unwrap();
        write_all(&engine, "v", &want).await;
        engine.close_all().await.unwrap();
        let paths = segment_paths(&store, "v").await;
        assert!(paths.len() >= 2, "{what}: {paths:?}");
        let (a, b) = (&paths[0], &paths[1]);
        let original = get(&store, a).await;
        let other = get(&store, b).await;

        // A flipped bit in a frame: damage.
        let (frame, _) = frame_at(&original, 3);
        let mut bad = original.clone();
        bad[frame.start + 1] ^= 0x10;
        put(&store, a, bad).await;
        let err = read_error(&dir.path().join("store"), k.clone(), want.len()).await;
        assert!(matches!(err, VolumeError::Corrupt { .. }), "{what}: {err}");
        assert!(
            err.to_string().contains("checksum mismatch"),
            "{what}: {err}"
        );

        // Another segment's frame copied over one of the same length, its
        // record copied too and the header's CRCs recomputed (CRCs are no
        // secret): encrypted, the tag refuses it; plain, the chunk CRC
        // (sealed with the entries when encrypted) does.
        let chunks = |o: &[u8]| FixedHeader::decode(o).unwrap().chunk_count as usize;
        let pair = (0..chunks(&original))
            .flat_map(|i| (0..chunks(&other)).map(move |j| (i, j)))
            .map(|(i, j)| (frame_at(&original, i), frame_at(&other, j)))
            .find(|((fa, _), (fb, _))| {
                fa.len() == fb.len() && original[fa.clone()] != other[fb.clone()]
            });
        let ((fa, ra), (fb, rb)) = pair.expect("two frames of one length");
        let mut swapped = original.clone();
        swapped[fa.clone()].copy_from_slice(&other[fb]);
        swapped[ra..ra + FRAME_RECORD_BYTES].copy_from_slice(&other[rb..rb + FRAME_RECORD_BYTES]);
        reseal_header(&mut swapped);
        put(&store, a, swapped).await;
        let err = read_error(&dir.path().join("store"), k.clone(), want.len()).await;
        assert!(matches!(err, VolumeError::Corrupt { .. }), "{what}: {err}");
        let text = err.to_string();
        let says = if k.is_some() {
            "authentication"
        } else {
            "checksum mismatch"
        };
        assert!(text.contains(says), "{what}: {text}");

        // Undamaged again: reads back exactly.
        put(&store, a, original).await;
        let store = Store::local(&dir.path().join("store")).unwrap();
        let dir2 = tempfile::tempdir().unwrap();
        let e = Engine::new(
            store.clone(),
            config(dir2.path(), Compression::Lz4, k.clone()),
        )
        .unwrap();
        assert!(
            read_all(&e, "v", want.len()).await.unwrap() == want,
            "{what}"
        );
        e.close_all().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compression_stores_fewer_bytes_and_reads_the_same() {
    let want = data();
    let mut uploaded = Vec::new();
    for compression in [
        Compression::None,
        Compression::Lz4,
        Compression::Zstd { level: 3 },
    ] {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::local(&dir.path().join("store")).unwrap();
        let engine = Engine::new(
            store.clone(),
            config(&dir.path().join("a"), compression, None),
        )
        .unwrap();
        engine.create_volume("v", VOLUME_BYTES).await.unwrap();
        write_all(&engine, "v", &want).await;
        let vol = engine.open_volume("v").await.unwrap();
        engine.close_all().await.unwrap();
        let stats = vol.stats();
        uploaded.push((compression, stats.bytes_uploaded));
        let dir2 = tempfile::tempdir().unwrap();
        let e = Engine::new(store.clone(), config(dir2.path(), compression, None)).unwrap();
        assert!(
            read_all(&e, "v", want.len()).await.unwrap() == want,
            "{compression}"
        );
        e.close_all().await.unwrap();
    }
    println!("uploaded bytes for 2 MiB of text + 1 MiB random: {uploaded:?}");
    let plain = uploaded[0].1;
    assert!(plain >= want.len() as u64, "{uploaded:?}");
    for &(c, bytes) in &uploaded[1..] {
        // The text shrinks to a few percent; the random MiB stays raw.
        assert!(bytes < plain / 2, "{c}: {uploaded:?}");
        assert!(bytes > MIB, "{c}: random data cannot shrink: {uploaded:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clone_of_an_encrypted_volume_reads_its_parent_with_the_same_key() {
    let want = data();
    let dir = tempfile::tempdir().unwrap();
    let store = Store::local(&dir.path().join("store")).unwrap();
    let k = key(7);
    let engine = Engine::new(
        store.clone(),
        config(&dir.path().join("a"), Compression::Lz4, Some(k.clone())),
    )
    .unwrap();
    engine.create_volume("base", VOLUME_BYTES).await.unwrap();
    write_all(&engine, "base", &want).await;
    engine.create_snapshot("base", "s").await.unwrap();
    engine.create_clone(None, "base", "s", "c").await.unwrap();
    let clone = engine.open_volume("c").await.unwrap();
    clone.write(0, &[9u8; 4096], false).await.unwrap();
    engine.close_all().await.unwrap();
    let m = strata_volume::Manifest::decode(&get(&store, &Path::from("c/manifest")).await).unwrap();
    assert!(
        m.encryption.is_some(),
        "a clone of an encrypted volume is encrypted"
    );

    let dir2 = tempfile::tempdir().unwrap();
    let e = Engine::new(
        store.clone(),
        config(dir2.path(), Compression::Lz4, Some(k)),
    )
    .unwrap();
    let got = read_all(&e, "c", want.len()).await.unwrap();
    assert!(got[..4096].iter().all(|&b| b == 9));
    assert!(got[4096..] == want[4096..], "inherited data differs");
    e.close_all().await.unwrap();
    let e = Engine::new(store.clone(), config(dir2.path(), Compression::Lz4, None)).unwrap();
    let err = e.open_volume("c").await.err().unwrap();
    assert!(matches!(err, VolumeError::Key { .. }), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_of_the_previous_format_opens_and_can_start_compressing() {
    let want = data();
    let dir = tempfile::tempdir().unwrap();
    let store = Store::local(&dir.path().join("store")).unwrap();
    let engine = Engine::new(
        store.clone(),
        config(&dir.path().join("a"), Compression::None, None),
    )
    .unwrap();
    engine.create_volume("old", VOLUME_BYTES).await.unwrap();
    write_all(&engine, "old", &want).await;
    engine.close_all().await.unwrap();
    // What the previous strata wrote: no compression field, envelope
    // version 1, version 1 segments.
    let path = Path::from("old/manifest");
    let mut m = strata_volume::Manifest::decode(&get(&store, &path).await).unwrap();
    m.compression = None;
    let bytes = m.encode();
    assert_eq!(&bytes[8..10], &1u16.to_le_bytes());
    put(&store, &path, bytes).await;
    for p in segment_paths(&store, "old").await {
        let seg = get(&store, &p).await;
        assert_eq!(FixedHeader::decode(&seg).unwrap().version, 1);
    }
    let engine = Engine::new(
        store.clone(),
        config(&dir.path().join("b"), Compression::Lz4, None),
    )
    .unwrap();
    assert!(read_all(&engine, "old", want.len()).await.unwrap() == want);
    let vol = engine.open_volume("old").await.unwrap();
    assert_eq!(vol.compression(), Compression::None);
    vol.set_compression(Compression::Lz4).await.unwrap();
    vol.write(0, &want[MIB as usize..2 * MIB as usize], false)
        .await
        .unwrap();
    engine.close_all().await.unwrap();
    let mut expect = want.clone();
    expect.copy_within(MIB as usize..2 * MIB as usize, 0);
    let engine = Engine::new(
        store.clone(),
        config(&dir.path().join("c"), Compression::None, None),
    )
    .unwrap();
    let vol = engine.open_volume("old").await.unwrap();
    assert_eq!(vol.compression(), Compression::Lz4, "the setting is kept");
    assert!(read_all(&engine, "old", want.len()).await.unwrap() == expect);
    engine.close_all().await.unwrap();
    let versions: Vec<u16> = {
        let mut v = Vec::new();
        for p in segment_paths(&store, "old").await {
            v.push(FixedHeader::decode(&get(&store, &p).await).unwrap().version);
        }
        v
    };
    assert!(
        versions.contains(&1) && versions.contains(&2),
        "{versions:?}"
    );
}

/// GC on compressed data: segments are weighed by the data they hold, not
/// by their (small) objects, so overwritten compressed segments are
/// collected like plain ones. (Weighed by object bytes, a compressed
/// segment never looked emptier than its live data: nothing was collected.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overwritten_compressed_data_is_collected() {
    for k in [None, Some(key(3))] {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::local(&dir.path().join("store")).unwrap();
        let mut c = config(&dir.path().join("a"), Compression::Lz4, k.clone());
        c.gc.enabled = true;
        let engine = Engine::new(store.clone(), c).unwrap();
        engine.create_volume("v", VOLUME_BYTES).await.unwrap();
        let vol = engine.open_volume("v").await.unwrap();
        for round in 0..6u8 {
            let text: Vec<u8> = MARKER
                .iter()
                .map(|b| b.wrapping_add(round))
                .cycle()
                .take(8 * MIB as usize)
                .collect();
            for (i, part) in text.chunks(MIB as usize).enumerate() {
                vol.write(i as u64 * MIB, part, false).await.unwrap();
            }
        }
        vol.flush().await.unwrap();
        vol.gc_now(true).await.unwrap();
        let space = vol.stats().space;
        println!("encrypted {}: {space:?}", k.is_some());
        assert_eq!(space.live_bytes, 8 * MIB);
        // Six rounds were written; about one is left (plus headers).
        assert!(
            space.garbage_bytes * 4 <= space.stored_bytes,
            "encrypted {}: {space:?}",
            k.is_some()
        );
        assert!(space.stored_segments <= 12, "{space:?}");
        engine.close_all().await.unwrap();
        let dir2 = tempfile::tempdir().unwrap();
        let store2 = Store::local(&dir.path().join("store")).unwrap();
        let e = Engine::new(store2, config(dir2.path(), Compression::Lz4, k)).unwrap();
        let got = read_all(&e, "v", 8 * MIB as usize).await.unwrap();
        let last: Vec<u8> = MARKER
            .iter()
            .map(|b| b.wrapping_add(5))
            .cycle()
            .take(8 * MIB as usize)
            .collect();
        assert!(got == last);
        e.close_all().await.unwrap();
    }
}
