//! Power loss: every FLUSHed write survives a lost page cache, tested by
//! losing it. `strata serve` runs on a FUSE disk that keeps what was not
//! synced in memory and, at each power cut, drops it, keeps a random subset,
//! tears the last write, or keeps it all (strata_testkit::lossy_fs); the
//! loop (strata_testkit::powerloss) kills the server, cuts, restarts and
//! checks that every write acknowledged before a completed FLUSH (or with
//! FUA) reads back, that the volume is the state after a prefix of the
//! requests, that snapshots read as taken, and that `strata fsck` is clean.
//!
//! Each run prints its base seed and each cycle's; `STRATA_POWERLOSS_SEED`
//! runs the same requests and losses again. The suite runs 200 cycles
//! across the modes (110 + 50 + 40: issue 28's floor for CI, and under a
//! minute); long runs: `scripts/bench --workloads powerloss --cycles N`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::*;
use strata_testkit::lossy_fs::LossMode;
use strata_testkit::powerloss::{run, LoopConfig, LoopStore};

const DROP_SUBSET_TORN: [LossMode; 3] = [LossMode::DropAll, LossMode::Subset, LossMode::Torn];

fn seed() -> u64 {
    match std::env::var("STRATA_POWERLOSS_SEED") {
        Ok(s) => s.parse().expect("STRATA_POWERLOSS_SEED: an integer"),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos()
            .into(),
    }
}

fn run_loop(cycles: u64, modes: &[LossMode], store: LoopStore, extras: bool) {
    let tmp = tempfile::TempDir::new().unwrap();
    let cfg = LoopConfig {
        strata: strata_bin().into(),
        work_dir: tmp.path().to_path_buf(),
        cycles,
        seed: seed(),
        modes: modes.to_vec(),
        store,
        extras,
        fsck_every: 25,
        max_requests: 300,
    };
    eprintln!(
        "power-loss loop: base seed {} (STRATA_POWERLOSS_SEED reruns it)",
        cfg.seed
    );
    match run(&cfg, &mut |line| eprintln!("{line}")) {
        Ok(s) => eprintln!(
            "passed: {} cycles in {:.1?}: {} requests, {} durable read back, {} unflushed lost, \
             {} snapshot and {} clone checks, {} fscks",
            s.cycles,
            s.elapsed,
            s.requests_sent,
            s.durable_checked,
            s.undurable_lost,
            s.snapshots_checked,
            s.clones_checked,
            s.fscks
        ),
        Err(e) => panic!("power loss (base seed {}): {e}", cfg.seed),
    }
}

#[test]
fn flushed_writes_survive_power_loss_on_the_embedded_store() {
    let _serial = serial();
    run_loop(110, &DROP_SUBSET_TORN, LoopStore::Embedded, false);
}

#[test]
fn snapshots_clones_and_gc_survive_power_loss_on_the_embedded_store() {
    let _serial = serial();
    let all = [
        LossMode::DropAll,
        LossMode::Subset,
        LossMode::Torn,
        LossMode::KeepAll,
    ];
    run_loop(50, &all, LoopStore::Embedded, true);
}

#[test]
fn flushed_writes_survive_power_loss_of_the_data_dir_on_minio() {
    let _serial = serial();
    let store = S3Store::on_shared_minio("powerloss");
    let s3 = LoopStore::S3 {
        url: store.url(),
        env: store.env.clone(),
    };
    run_loop(40, &DROP_SUBSET_TORN, s3, true);
}
