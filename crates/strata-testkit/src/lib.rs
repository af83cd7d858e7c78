//! Test harness for strata's S3 tests.
//!
//! This crate owns the real S3 servers the test suite runs against on
//! 127.0.0.1: finding the MinIO and SeaweedFS binaries ([`minio_bin`],
//! [`seaweedfs_bin`]), starting a single-node MinIO over http or https
//! ([`MinioServer`]), a 4-process erasure-coded MinIO cluster whose nodes
//! can be killed and restarted ([`MinioCluster`]), or a SeaweedFS cluster
//! with replication whose volume servers can be ([`SeaweedCluster`]),
//! creating buckets, and the environment a client process needs to reach
//! them ([`MinioServer::client_env`]). [`S3Impl`] picks the implementation
//! a suite runs on (`STRATA_TEST_S3`). [`LatencyProxy`] puts
//! latency between a client and such a server (and the
//! `strata-latency-proxy` binary does for the benchmarks), so a store that
//! answers in 0 ms can be measured as one that answers in 20.
//! [`lossy_fs`] is a FUSE file system that loses what was not synced, for
//! power-loss tests, and [`powerloss`] the loop that runs `strata serve` on
//! it through power cuts (the `strata-powerloss` binary runs it for soaks).
//!
//! Harness failures panic with a message meant for the person reading the
//! test output (MinIO's log tail, the curl error, the install command): a
//! test must fail loudly, never skip, when MinIO is missing or broken.
//!
//! Every MinIO process is killed when its guard drops, and also when the test
//! process dies (`PR_SET_PDEATHSIG`), so a crashed test run leaves no servers
//! behind. Dev-dependency only; the crate never ships.

mod cluster;
mod keeper;
mod latency_proxy;
pub mod lossy_fs;
mod node;
mod pki;
pub mod powerloss;
mod s3;
mod s3_service;
mod seaweedfs;
mod server;
mod shared_store;
pub mod stop_signal;
mod versitygw;

use std::path::PathBuf;

pub use cluster::{MinioCluster, CLUSTER_PORTS, LOCK_PATH};
pub use latency_proxy::{LatencyConfig, LatencyProxy, ProxyStats, Split};
pub use pki::TestPki;
pub use s3_service::{S3Impl, S3Service};
pub use seaweedfs::{SeaweedCluster, VOLUME_SERVERS};
pub use server::MinioServer;
pub use versitygw::VersitygwServer;

/// The pinned MinIO version `scripts/install-minio` builds.
pub const MINIO_VERSION: &str = "v0.0.0-20260212201848-7aac2a2c5b7c";

/// The pinned SeaweedFS version `scripts/install-seaweedfs` builds (the
/// Go module's pseudo-version; `weed version` says 4.53).
pub const SEAWEEDFS_VERSION: &str = "v0.0.0-20261109003541-7506e5f91cd6";

/// Root user of every test server. Fixed: the servers only listen on
/// 127.0.0.1 and live as long as a test.
pub const ACCESS_KEY: &str = "strata-test";
/// Root password of every test server (MinIO wants at least 8 characters).
pub const SECRET_KEY: &str = "strata-test-secret";
/// Region the servers report and clients sign for.
pub const REGION: &str = "us-east-1";

/// Path of the MinIO server binary: `$STRATA_MINIO_BIN` when set, else
/// `${STRATA_TEST_CACHE:-$HOME/.cache/strata-test}/minio-<version>/minio`,
/// where `scripts/install-minio` puts it.
///
/// # Panics
/// When the binary does not exist, naming the script that installs it.
pub fn minio_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("STRATA_MINIO_BIN") {
        let bin = PathBuf::from(bin);
        if !bin.is_file() {
            panic!(
                "STRATA_MINIO_BIN={} does not exist; unset it to use the binary \
                 scripts/install-minio installs",
                bin.display()
            );
        }
        return bin;
    }
    let bin = default_minio_bin();
    if !bin.is_file() {
        panic!(
            "MinIO server binary not found at {}: run scripts/install-minio \
             (or scripts/install-test-deps), or point STRATA_MINIO_BIN at a minio binary",
            bin.display()
        );
    }
    bin
}

/// The pinned versitygw version `scripts/install-versitygw` builds.
pub const VERSITYGW_VERSION: &str = "v1.8.0";

/// Path of the versitygw binary: `$STRATA_VERSITYGW_BIN` when set, else
/// `${STRATA_TEST_CACHE:-$HOME/.cache/strata-test}/versitygw-<version>/versitygw`,
/// where `scripts/install-versitygw` puts it.
///
/// # Panics
/// When the binary does not exist, naming the script that installs it.
pub fn versitygw_bin() -> PathBuf {
    cached_bin(
        "STRATA_VERSITYGW_BIN",
        &format!("versitygw-{VERSITYGW_VERSION}"),
        "versitygw",
        "scripts/install-versitygw",
    )
}

/// `$VARIABLE` when set, else `<test cache>/<dir>/<name>`.
///
/// # Panics
/// When the binary does not exist, naming `script`.
fn cached_bin(variable: &str, dir: &str, name: &str, script: &str) -> PathBuf {
    if let Some(bin) = std::env::var_os(variable) {
        let bin = PathBuf::from(bin);
        if !bin.is_file() {
            panic!(
                "{variable}={} does not exist; unset it to use the binary {script} installs",
                bin.display()
            );
        }
        return bin;
    }
    let bin = test_cache().join(dir).join(name);
    if !bin.is_file() {
        panic!(
            "{name} not found at {}: run {script} (or scripts/install-test-deps), \
             or point {variable} at a {name} binary",
            bin.display()
        );
    }
    bin
}

/// Path of the SeaweedFS binary (`weed`): `$STRATA_SEAWEEDFS_BIN` when
/// set, else `${STRATA_TEST_CACHE:-$HOME/.cache/strata-test}/seaweedfs-<version>/weed`,
/// where `scripts/install-seaweedfs` puts it.
///
/// # Panics
/// When the binary does not exist, naming the script that installs it.
pub fn seaweedfs_bin() -> PathBuf {
    cached_bin(
        "STRATA_SEAWEEDFS_BIN",
        &format!("seaweedfs-{SEAWEEDFS_VERSION}"),
        "weed",
        "scripts/install-seaweedfs",
    )
}

/// Where `scripts/install-minio` installs the binary (it may not exist).
fn default_minio_bin() -> PathBuf {
    test_cache()
        .join(format!("minio-{MINIO_VERSION}"))
        .join("minio")
}

/// `${STRATA_TEST_CACHE:-$HOME/.cache/strata-test}`.
fn test_cache() -> PathBuf {
    match std::env::var_os("STRATA_TEST_CACHE") {
        Some(dir) => PathBuf::from(dir),
        None => {
            let home =
                std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
            home.join(".cache").join("strata-test")
        }
    }
}

/// A bucket name no earlier call in this process, nor any other process
/// running now, returned (the process id is in it: test processes may
/// share one store). Buckets are how tests sharing a server stay out of
/// each other's way.
fn unique_bucket_name() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("strata-test-{}-{n}", std::process::id())
}

/// The client environment for an S3 endpoint: what `object_store`'s
/// `AmazonS3Builder::from_env` and the AWS tools read.
fn client_env(endpoint: &str, ca: Option<&std::path::Path>) -> Vec<(String, String)> {
    let mut env = vec![
        ("AWS_ACCESS_KEY_ID".to_owned(), ACCESS_KEY.to_owned()),
        ("AWS_SECRET_ACCESS_KEY".to_owned(), SECRET_KEY.to_owned()),
        ("AWS_REGION".to_owned(), REGION.to_owned()),
        ("AWS_ENDPOINT_URL".to_owned(), endpoint.to_owned()),
        ("AWS_ALLOW_HTTP".to_owned(), "true".to_owned()),
    ];
    if let Some(ca) = ca {
        env.push(("AWS_CA_BUNDLE".to_owned(), ca.display().to_string()));
    }
    env
}
