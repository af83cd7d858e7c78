//! The S3 server a test process shares, per implementation.
//!
//! This module owns [`S3Impl::shared`]: the process-wide server of an
//! implementation, or one another process started for the whole test run
//! (`strata-test-store`, named by an environment variable), and the
//! buckets a process made on such a shared store, dropped at exit.

use std::sync::{Mutex, OnceLock};

use crate::{MinioServer, S3Impl, S3Service, SeaweedCluster, VersitygwServer};

impl S3Impl {
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
    /// Remembered, so the buckets go at exit.
    fn fresh_bucket(&self) -> String {
        let name = crate::unique_bucket_name();
        crate::s3::create_bucket(&self.endpoint, None, &name);
        self.buckets
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(name.clone());
        name
    }
}
