//! Which S3 implementation a suite runs on.
//!
//! This module owns [`S3Impl`] (the implementations the test kit can start)
//! and [`S3Service`] (what a suite needs of a running one: an endpoint, the
//! client environment, buckets and objects); `shared_store.rs` finds the
//! running one a process shares. The S3 suites take their
//! store from [`S3Impl::from_env`]: MinIO unless `STRATA_TEST_S3` names
//! another, so `scripts/test` runs the same suites again on SeaweedFS (the
//! habit of object_store's one conformance suite over every backend).

use crate::MinioServer;

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
}

/// What a suite needs of a running S3 implementation. Every method panics
/// with the server's answer when a request fails: harness failures fail
/// the test loudly.
pub trait S3Service: Sync {
    /// Which implementation this is.
    fn implementation(&self) -> S3Impl;
    /// `http(s)://127.0.0.1:PORT`.
    fn endpoint(&self) -> String;
    /// `AWS_*` variables a client process needs to reach it (plain HTTP
    /// with the test credentials, unless the server says otherwise).
    fn client_env(&self) -> Vec<(String, String)> {
        crate::client_env(&self.endpoint(), None)
    }
    /// A new bucket no other call in this process got.
    fn fresh_bucket(&self) -> String {
        let name = crate::unique_bucket_name();
        crate::s3::create_bucket(&self.endpoint(), None, &name);
        name
    }
    fn put_object(&self, bucket: &str, key: &str, data: &[u8]) {
        crate::s3::put_object(&self.endpoint(), None, bucket, key, data);
    }
    fn get_object(&self, bucket: &str, key: &str) -> Vec<u8> {
        crate::s3::get_object(&self.endpoint(), None, bucket, key)
    }
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
