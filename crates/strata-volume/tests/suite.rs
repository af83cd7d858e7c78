//! Every integration test of `strata-volume`, in one test binary: one module per
//! file of this folder. One binary instead of one per file because each
//! binary links the workspace again: 11 binaries took minutes of
//! the suite's build (docs/benchmarks.md, issue 44). Run one file's tests
//! with its module name as the filter: `cargo test -p strata-volume --test suite
//! at_rest::`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod at_rest;
mod common;
mod conformance;
mod flush_seal;
mod fsck;
mod gc;
mod read_path;
mod recycled_segments;
mod snapshots;
mod staged_writes;
mod store_anomalies;
mod zero_writes;
