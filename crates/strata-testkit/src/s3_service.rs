//! Which S3 implementation a suite runs on.
//!
//! This module owns [`S3Impl`] (the implementations the test kit can start)
//! and [`S3Service`] (what a suite needs of a running one: an endpoint, the
//! client environment, buckets and objects). The S3 suites take their
//! store from [`S3Impl::from_env`]: MinIO unless `STRATA_TEST_S3` names
//! another, so `scripts/test` runs the same suites again on SeaweedFS (the
//! habit of object_store's one conformance suite over every backend).

use std::sync::{Mutex, OnceLock};

use crate::{MinioServer, SeaweedCluster, VersitygwServer};

/// An S3 implementation the test kit starts on 127.0.0.1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum S3Impl {
    /// One MinIO server ([`MinioServer`]).
    Minio,
    /// A SeaweedFS cluster: master, three volume servers with replication,
    /// filer, S3 gateway ([`SeaweedCluster`]).
    Seaweedfs,
    /// versitygw with its POSIX backend ([`VersitygwServer`]).
    Versitygw,
}

impl S3Impl {
    /// Every implementation, in the order the README's table lists them.
    pub const ALL: [S3Impl; 3] = [S3Impl::Minio, S3Impl::Seaweedfs, S3Impl::Versitygw];

    /// `STRATA_TEST_S3`: `minio` (the default when unset or empty),
    /// `seaweedfs` or `versitygw`.
    ///
    /// # Panics
    /// On any other value, naming the ones it takes.
    pub fn from_env() -> S3Impl {
        let value = std::env::var("STRATA_TEST_S3").unwrap_or_default();
        match S3Impl::parse(&value) {
            Some(i) => i,
            None => panic!("STRATA_TEST_S3={value:?}: use minio, seaweedfs or versitygw"),
        }
    }

    /// The implementation named `name` (`""` is MinIO).
    pub fn parse(name: &str) -> Option<S3Impl> {
        match name {
            "" | "minio" => Some(S3Impl::Minio),
            "seaweedfs" => Some(S3Impl::Seaweedfs),
            "versitygw" => Some(S3Impl::Versitygw),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            S3Impl::Minio => "minio",
            S3Impl::Seaweedfs => "seaweedfs",
            S3Impl::Versitygw => "versitygw",
        }
    }

    /// The server of this implementation shared by every test of the
    /// process, started on first use.
    ///
    /// # Panics
    /// When it is not installed or does not start (see each type's
    /// `shared`).
    ///
    /// SeaweedFS takes about 15 s to start, so when
    /// `STRATA_TEST_SEAWEEDFS_ENDPOINT` names one already running (what
    /// `scripts/test` starts with `strata-test-store seaweedfs` for the
    /// whole run) that one is used: heavy suites share servers.
    pub fn shared(self) -> &'static dyn S3Service {
        match self {
            S3Impl::Minio => MinioServer::shared(),
            S3Impl::Seaweedfs => match RunningStore::from_env(self) {
                Some(running) => running,
                None => SeaweedCluster::shared(),
            },
            S3Impl::Versitygw => VersitygwServer::shared(),
        }
    }

    /// The variable naming an already running store of this kind.
    pub fn endpoint_variable(self) -> &'static str {
        match self {
            S3Impl::Minio => "STRATA_TEST_MINIO_ENDPOINT",
            S3Impl::Seaweedfs => "STRATA_TEST_SEAWEEDFS_ENDPOINT",
            S3Impl::Versitygw => "STRATA_TEST_VERSITYGW_ENDPOINT",
        }
    }
}

/// A store started by another process (`strata-test-store`), reached at
/// the endpoint its variable names, with the test credentials. The buckets
/// this process made are deleted, with what they hold, when it exits: a
/// store shared by a whole test run would otherwise keep every test's data
/// (about 12 GB on SeaweedFS, two copies of everything, for one
/// `scripts/test`), and SeaweedFS gives deleted objects' space back only
/// when their bucket's volumes go.
struct RunningStore {
    implementation: S3Impl,
    endpoint: String,
    buckets: Mutex<Vec<String>>,
}

impl RunningStore {
    /// The store `implementation.endpoint_variable()` names, if set (one
    /// per implementation and process).
    fn from_env(implementation: S3Impl) -> Option<&'static RunningStore> {
        let cell = match implementation {
            S3Impl::Seaweedfs => &SEAWEEDFS,
            S3Impl::Minio | S3Impl::Versitygw => return None,
        };
        cell.get_or_init(|| {
            let endpoint = std::env::var(implementation.endpoint_variable()).ok()?;
            if !endpoint.starts_with("http://127.0.0.1:") {
                panic!(
                    "{}={endpoint:?}: expected http://127.0.0.1:PORT (tests talk to loopback only)",
                    implementation.endpoint_variable()
                );
            }
            eprintln!(
                "strata-testkit: using the {} at {endpoint} ({})",
                implementation.name(),
                implementation.endpoint_variable()
            );
            // SAFETY: registering a plain extern "C" fn with no captures.
            if unsafe { libc::atexit(drop_running_buckets) } != 0 {
                eprintln!("strata-testkit: atexit failed; this process's buckets will stay");
            }
            Some(RunningStore {
                implementation,
                endpoint,
                buckets: Mutex::new(Vec::new()),
            })
        })
        .as_ref()
    }
}

/// The running stores this process used (see [`RunningStore::from_env`]).
static SEAWEEDFS: OnceLock<Option<RunningStore>> = OnceLock::new();

extern "C" fn drop_running_buckets() {
    // Nothing may unwind out of an exit handler.
    let _ = std::panic::catch_unwind(|| {
        let Some(Some(store)) = SEAWEEDFS.get() else {
            return;
        };
        let buckets = match store.buckets.try_lock() {
            Ok(mut buckets) => std::mem::take(&mut *buckets),
            Err(_) => return,
        };
        for bucket in buckets {
            if let Err(e) = crate::s3::request(&store.endpoint, None, "DELETE", &bucket, None) {
                eprintln!("strata-testkit: could not delete bucket {bucket}: {e}");
            }
        }
    });
}

impl S3Service for RunningStore {
    fn implementation(&self) -> S3Impl {
        self.implementation
    }
    fn endpoint(&self) -> String {
        self.endpoint.clone()
    }
    fn client_env(&self) -> Vec<(String, String)> {
        crate::client_env(&self.endpoint, None)
    }
    fn fresh_bucket(&self) -> String {
        let name = crate::unique_bucket_name();
        crate::s3::create_bucket(&self.endpoint, None, &name);
        self.buckets
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(name.clone());
        name
    }
    fn put_object(&self, bucket: &str, key: &str, data: &[u8]) {
        crate::s3::put_object(&self.endpoint, None, bucket, key, data)
    }
    fn get_object(&self, bucket: &str, key: &str) -> Vec<u8> {
        crate::s3::get_object(&self.endpoint, None, bucket, key)
    }
}

/// What a suite needs of a running S3 implementation. Every method panics
/// with the server's answer when a request fails: harness failures fail
/// the test loudly.
pub trait S3Service: Sync {
    /// Which implementation this is.
    fn implementation(&self) -> S3Impl;
    /// `http(s)://127.0.0.1:PORT`.
    fn endpoint(&self) -> String;
    /// `AWS_*` variables a client process needs to reach it.
    fn client_env(&self) -> Vec<(String, String)>;
    /// A new bucket no other call in this process got.
    fn fresh_bucket(&self) -> String;
    fn put_object(&self, bucket: &str, key: &str, data: &[u8]);
    fn get_object(&self, bucket: &str, key: &str) -> Vec<u8>;
}

impl S3Service for MinioServer {
    fn implementation(&self) -> S3Impl {
        S3Impl::Minio
    }
    fn endpoint(&self) -> String {
        MinioServer::endpoint(self)
    }
    fn client_env(&self) -> Vec<(String, String)> {
        MinioServer::client_env(self)
    }
    fn fresh_bucket(&self) -> String {
        MinioServer::fresh_bucket(self)
    }
    fn put_object(&self, bucket: &str, key: &str, data: &[u8]) {
        MinioServer::put_object(self, bucket, key, data)
    }
    fn get_object(&self, bucket: &str, key: &str) -> Vec<u8> {
        MinioServer::get_object(self, bucket, key)
    }
}

impl S3Service for SeaweedCluster {
    fn implementation(&self) -> S3Impl {
        S3Impl::Seaweedfs
    }
    fn endpoint(&self) -> String {
        SeaweedCluster::endpoint(self)
    }
    fn client_env(&self) -> Vec<(String, String)> {
        SeaweedCluster::client_env(self)
    }
    fn fresh_bucket(&self) -> String {
        SeaweedCluster::fresh_bucket(self)
    }
    fn put_object(&self, bucket: &str, key: &str, data: &[u8]) {
        SeaweedCluster::put_object(self, bucket, key, data)
    }
    fn get_object(&self, bucket: &str, key: &str) -> Vec<u8> {
        SeaweedCluster::get_object(self, bucket, key)
    }
}

impl S3Service for VersitygwServer {
    fn implementation(&self) -> S3Impl {
        S3Impl::Versitygw
    }
    fn endpoint(&self) -> String {
        VersitygwServer::endpoint(self)
    }
    fn client_env(&self) -> Vec<(String, String)> {
        VersitygwServer::client_env(self)
    }
    fn fresh_bucket(&self) -> String {
        VersitygwServer::fresh_bucket(self)
    }
    fn put_object(&self, bucket: &str, key: &str, data: &[u8]) {
        VersitygwServer::put_object(self, bucket, key, data)
    }
    fn get_object(&self, bucket: &str, key: &str) -> Vec<u8> {
        VersitygwServer::get_object(self, bucket, key)
    }
}
