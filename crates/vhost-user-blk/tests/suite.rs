//! Every integration test of `vhost-user-blk`, in one test binary: one module per
//! file of this folder. One binary instead of one per file because each
//! binary links the workspace again: 4 binaries took minutes of
//! the suite's build (docs/benchmarks.md, issue 44). Run one file's tests
//! with its module name as the filter: `cargo test -p vhost-user-blk --test suite
//! inflight_resubmit::`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod inflight_resubmit;
mod malformed_chains;
mod migration;
mod random_chains;
