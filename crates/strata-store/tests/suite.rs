//! Every integration test of `strata-store`, in one test binary: one module per
//! file of this folder. One binary instead of one per file because each
//! binary links the workspace again: 2 binaries took minutes of
//! the suite's build (docs/benchmarks.md, issue 44). Run one file's tests
//! with its module name as the filter: `cargo test -p strata-store --test suite
//! conditional_writes::`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod conditional_writes;
mod s3;
