//! Every integration test of `nbd-server`, in one test binary: one module per
//! file of this folder. One binary instead of one per file because each
//! binary links the workspace again: 7 binaries took minutes of
//! the suite's build (docs/benchmarks.md, issue 44). Run one file's tests
//! with its module name as the filter: `cargo test -p nbd-server --test suite
//! clients::`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod clients;
mod common;
mod concurrency;
mod lifecycle;
mod limits;
mod raw_protocol;
mod stalls;
mod tls;
