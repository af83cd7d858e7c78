//! Every integration test of `strata`, in one test binary: one module per
//! file of this folder. One binary instead of one per file because each
//! binary links the workspace again: 43 binaries took minutes of
//! the suite's build (docs/benchmarks.md, issue 44). Run one file's tests
//! with its module name as the filter: `cargo test -p strata --test suite
//! at_rest::`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod at_rest;
mod bad_input;
mod clones;
mod common;
mod copy;
mod crash;
mod csi;
mod diffs;
mod disk_cache;
mod filesystem;
mod fio_verify;
mod fsck;
mod gc_crash;
mod gc_fencing;
mod gc_filesystem;
mod hedged_reads;
mod hydration;
mod log_format;
mod many_volumes;
mod memory;
mod metrics;
mod migration;
mod nbdinfo;
mod ownership;
mod powerloss;
mod qemu_guest;
mod qemu_io;
mod qos;
mod read_rewrite;
mod resize;
mod s3_clients;
mod s3_cluster;
mod s3_crash;
mod s3_faults;
mod s3_lease;
mod s3_seaweedfs;
mod snapshot_crash;
mod snapshot_filesystem;
mod snapshots;
mod socket_activation;
mod staged_crash;
mod standby;
mod store_check;
mod tls;
mod vhost_guest;
