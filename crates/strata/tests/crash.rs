//! Test 6: crash consistency. The server is killed with SIGKILL while a
//! writer we control (tests/common/nbd_writer.py, libnbd's Python binding, 64
//! writes in flight) and an fio load on another region are running. After a
//! restart, every write the writer logged as acknowledged must read back with
//! its generation, or with a later generation that was issued to that block
//! (in flight at the kill). Blocks must never be torn or foreign.
//!
//! The FLUSH variant: a phase of writes, a FLUSH acknowledged, more writes,
//! kill -9: everything acknowledged before the flush (and after) reads back.
//!
//! What this cannot test: loss of power. Killing the process leaves the page
//! cache intact, so it checks "an acknowledged write survives a crash of the
//! strata process", not that FLUSH/FUA reached stable media (that needs a VM
//! or a fault-injecting block device, which CI does not have).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::crash_check::{crash_under_load, KillAfter, CRASH_SERVE_ARGS};
use common::*;

fn target() -> Target {
    Target::under_test(Target::strata_with(&CRASH_SERVE_ARGS), Target::NbdkitFile)
}

/// Three crashes in a row, each under load on the volume recovered from the
/// previous one: after a long run, right after the restart, and mid-way.
#[test]
fn acknowledged_writes_survive_kill_9_under_load() {
    let _serial = serial();
    let tmp = tempfile::TempDir::new().unwrap();
    crash_under_load(
        tmp.path(),
        target(),
        "crash",
        11,
        &[
            KillAfter::Acks(30_000),
            KillAfter::Millis(300),
            KillAfter::Millis(2500),
        ],
    );
}

#[test]
fn flushed_writes_survive_kill_9() {
    let _serial = serial();
    let tmp = tempfile::TempDir::new().unwrap();
    crash_under_load(
        tmp.path(),
        target(),
        "flush",
        12,
        &[KillAfter::AcksAfterFlush(2000)],
    );
}
