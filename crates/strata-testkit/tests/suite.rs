//! Every integration test of `strata-testkit`, in one test binary: one module per
//! file of this folder. One binary instead of one per file because each
//! binary links the workspace again: 7 binaries took minutes of
//! the suite's build (docs/benchmarks.md, issue 44). Run one file's tests
//! with its module name as the filter: `cargo test -p strata-testkit --test suite
//! cluster::`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cluster;
mod latency_proxy;
mod lossy_fs;
mod seaweedfs;
mod server;
mod tls;
mod versitygw;
