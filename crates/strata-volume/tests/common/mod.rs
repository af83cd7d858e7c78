//! What the engine's test suites share: small budgets, every store
//! backend, a seeded RNG, random operations against a byte model.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;

use strata_store::Store;
use strata_volume::{Compression, Key, Volume, VolumeConfig};

pub const MIB: u64 = 1 << 20;
pub const VOLUME_BYTES: u64 = 48 * MIB;

/// Small budgets so that sealing, uploads, checkpoints, back-pressure and
/// journal wrap-around all happen within a short test.
pub fn small_config(data_dir: &Path) -> VolumeConfig {
    let mut c = VolumeConfig::new(data_dir.to_path_buf());
    c.segment_bytes = MIB;
    c.max_write_bytes = MIB;
    c.write_buffer_bytes = 3 * MIB;
    c.journal_bytes = 5 * MIB;
    c.cache_bytes = 2 * MIB;
    c.checkpoint_every_segments = 3;
    c.segment_max_age_ms = 50;
    // Garbage collection runs all the time, deleting soon after: every
    // suite exercises it.
    c.gc.interval_ms = 100;
    c.gc.grace_ms = 300;
    at_rest_from_env(&mut c);
    c
}

/// `small_config` storing plain version 1 segments whatever the matrix
/// says: for tests that look at the stored bytes themselves.
pub fn small_config_plain(data_dir: &Path) -> VolumeConfig {
    let mut c = small_config(data_dir);
    c.compression = Compression::None;
    c.key = None;
    c
}

/// The key the test matrix encrypts with.
pub fn test_key() -> Arc<Key> {
    Arc::new(Key::from_bytes([0x42; 32]))
}

/// The suites run once plain and, in CI, again with `STRATA_TEST_AT_REST`
/// set to `lz4`, `zstd`, `encrypted` or `encrypted+lz4`: every volume they
/// create is then compressed and/or encrypted.
pub fn at_rest_from_env(c: &mut VolumeConfig) {
    let setting = std::env::var("STRATA_TEST_AT_REST").unwrap_or_default();
    let (compression, encrypted) = match setting.as_str() {
        "" | "none" => (Compression::None, false),
        "lz4" => (Compression::Lz4, false),
        "zstd" => (Compression::Zstd { level: 3 }, false),
        "encrypted" => (Compression::None, true),
        "encrypted+lz4" => (Compression::Lz4, true),
        other => {
            panic!("STRATA_TEST_AT_REST={other:?}: use none, lz4, zstd, encrypted or encrypted+lz4")
        }
    };
    c.compression = compression;
    c.key = encrypted.then(test_key);
}

/// Whether this run is one of the at-rest reruns (`STRATA_TEST_AT_REST`
/// set to something other than `none`).
fn at_rest_matrix() -> bool {
    !matches!(
        std::env::var("STRATA_TEST_AT_REST")
            .unwrap_or_default()
            .as_str(),
        "" | "none"
    )
}

/// (name, store, data dir) per backend; the tempdirs live as long as the
/// tuple. Every S3 implementation the test kit starts is a backend: one
/// conformance suite over every store (object_store's habit).
pub async fn backends() -> Vec<(&'static str, Store, tempfile::TempDir)> {
    let mem_dir = tempfile::tempdir().unwrap();
    let local_dir = tempfile::tempdir().unwrap();
    let local = Store::local(&local_dir.path().join("store")).unwrap();
    let s3_dir = tempfile::tempdir().unwrap();
    let seaweed_dir = tempfile::tempdir().unwrap();
    let versity_dir = tempfile::tempdir().unwrap();
    let faulty_dir = tempfile::tempdir().unwrap();
    // 5% of store calls fail and 2% of writes land but report an error (a
    // lost reply): the retry layer and the conditional-write checks must
    // hide all of it.
    let faults =
        strata_store::FaultConfig::parse("error_rate=0.05,lost_reply_rate=0.02,seed=7").unwrap();
    let faulty = Store::in_memory_with(&strata_store::LayerConfig {
        faults: Some(faults),
        ..strata_store::LayerConfig::default()
    });
    let mut all = vec![
        ("memory", Store::in_memory(), mem_dir),
        ("memory+faults", faulty, faulty_dir),
        ("local", local, local_dir),
        ("minio", minio_store().await, s3_dir),
    ];
    // The at-rest matrix (compressed, encrypted) multiplies formats, not
    // stores: what a store sees is opaque objects either way, so its
    // reruns keep one S3 implementation and stay short.
    if !at_rest_matrix() {
        all.push((
            "seaweedfs",
            s3_store(strata_testkit::S3Impl::Seaweedfs).await,
            seaweed_dir,
        ));
        all.push((
            "versitygw",
            s3_store(strata_testkit::S3Impl::Versitygw).await,
            versity_dir,
        ));
    }
    all
}

/// A store in a fresh bucket of the test process's MinIO.
pub async fn minio_store() -> Store {
    s3_store(strata_testkit::S3Impl::Minio).await
}

/// A store in a fresh bucket of the test process's shared server of
/// `implementation` (started on first use).
pub async fn s3_store(implementation: strata_testkit::S3Impl) -> Store {
    let (env, bucket) = tokio::task::spawn_blocking(move || {
        let server = implementation.shared();
        (server.client_env(), server.fresh_bucket())
    })
    .await
    .unwrap();
    let env: std::collections::HashMap<String, String> = env.into_iter().collect();
    let lookup = |k: &str| env.get(k).cloned();
    Store::s3(
        &format!("s3://{bucket}/conformance"),
        &lookup,
        &strata_store::LayerConfig::default(),
    )
    .await
    .unwrap()
}

pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Applies one random operation to the volume and the model.
pub async fn random_op(vol: &Arc<Volume>, model: &mut [u8], rng: &mut Rng) {
    let offset = rng.below(VOLUME_BYTES - 1);
    let max_len = (VOLUME_BYTES - offset).min(if rng.below(10) == 0 { MIB } else { 64 << 10 });
    let len = 1 + rng.below(max_len);
    let (o, l) = (offset as usize, len as usize);
    match rng.below(20) {
        0 => {
            vol.trim(offset, len, false).await.unwrap();
            model[o..o + l].fill(0);
        }
        1 => {
            let keep = rng.below(2) == 0;
            vol.write_zeroes(offset, len, keep, rng.below(4) == 0)
                .await
                .unwrap();
            model[o..o + l].fill(0);
        }
        2 => vol.flush().await.unwrap(),
        _ => {
            let seed = rng.next();
            let data: Vec<u8> = (0..len)
                .map(|i| (seed.wrapping_mul(i + 1) >> 13) as u8)
                .collect();
            vol.write(offset, &data, rng.below(10) == 0).await.unwrap();
            model[o..o + l].copy_from_slice(&data);
        }
    }
}

pub async fn assert_matches(vol: &std::sync::Arc<Volume>, model: &[u8], what: &str) {
    let mut buf = vec![0u8; MIB as usize];
    for start in (0..VOLUME_BYTES).step_by(MIB as usize) {
        vol.read(start, &mut buf).await.unwrap();
        let s = start as usize;
        if buf[..] != model[s..s + MIB as usize] {
            let i = buf
                .iter()
                .zip(&model[s..])
                .position(|(a, b)| a != b)
                .unwrap();
            panic!(
                "{what}: byte {} differs: got {:#x}, want {:#x}",
                s + i,
                buf[i],
                model[s + i]
            );
        }
    }
}

/// Accounting equals a recomputation, and the segments the volume counts
/// as stored are exactly those listed (call on a closed volume: nothing
/// moves any more).
pub async fn assert_accounting(vol: &std::sync::Arc<Volume>, store: &Store, what: &str) {
    vol.verify_accounting()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let names = strata_store::ObjectNames::new(vol.name());
    let listed: Vec<u64> = store
        .list_all(&names.segments_prefix())
        .await
        .unwrap()
        .iter()
        .filter_map(|m| strata_store::ObjectNames::parse_seq(&m.location))
        .collect::<std::collections::BTreeSet<u64>>()
        .into_iter()
        .collect();
    assert_eq!(
        vol.stored_segments(),
        listed,
        "{what}: stored segments vs listing"
    );
}
