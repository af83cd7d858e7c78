//! Hedged reads against MinIO: with one store request in ten made a
//! second slower (`--inject-faults slow_rate=0.1,slow_ms=1000`), a
//! client's small GETs that run past the store's usual tail are sent
//! again and the first answer wins: every byte read back is right (one
//! answer used, verified), hedges are sent within their budget, and some
//! second requests win; `--hedge-reads off` sends none.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::Path;

use common::clients::{qemu_io, qemu_io_verify};
use common::*;

const VOL: u64 = 16 * MIB;

fn run(hedge: &str) -> serde_json::Value {
    let tmp = tempfile::TempDir::new().unwrap();
    let stats_path = tmp.path().join("stats.json");
    let sp = stats_path.display().to_string();
    let store = S3Store::on_shared(&format!("hedge-{hedge}"));
    let args = [
        "--compression",
        "none",
        "--segment-size",
        "1MiB",
        "--gc",
        "off",
        "--hydrate",
        "off",
        // Each read must be a GET of its own: read-ahead would take reads
        // that land near each other as a stream and fetch them in windows.
        "--readahead",
        "0",
        "--hedge-reads",
        hedge,
        "--stats-interval-ms",
        "100",
        "--stats-file",
        &sp,
    ];
    let mut server = Server::start(
        tmp.path(),
        Target::strata_s3(&store, &args),
        &[("vol", VOL)],
    );
    let writes: Vec<String> = (0..16)
        .map(|i| format!("write -P {:#x} {i}M 1M", 0x40 + i))
        .chain(["flush".to_string()])
        .collect();
    let out = qemu_io(&server.vol_uri(), &writes);
    assert!(out.status.success(), "{}", stderr_str(&out));
    server.stop();
    // A new host (cold caches) whose store has a latency tail.
    server.target = Target::strata_s3(&store, &args)
        .with_args(&["--inject-faults", "slow_rate=0.1,slow_ms=1000,seed=11"]);
    server.restart_on_new_host();
    // 4 KiB reads, spread so that each is a GET of its own (64 KiB blocks).
    let reads: Vec<String> = (0..256u64)
        .map(|k| {
            let at = (k * 37 % 256) * (64 << 10) + 4096;
            format!("read -P {:#x} {at} 4k", 0x40 + at / MIB)
        })
        .collect();
    qemu_io_verify(&server.vol_uri(), &reads, "under a slow tail");
    server.stop();
    stats(&stats_path)
}

fn stats(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn slow_gets_are_hedged_within_budget_and_reads_stay_right() {
    require_tools(&["qemu-io"]);
    let _serial = serial();
    let s = run("on");
    let st = &s["read_path"]["store"];
    let (gets, hedged, wins) = (
        st["data_gets"].as_u64().unwrap(),
        st["hedged_gets"].as_u64().unwrap(),
        st["hedge_wins"].as_u64().unwrap(),
    );
    assert!(hedged > 0 && wins > 0, "no hedge won: {st}");
    assert!(hedged * 20 <= gets + 20, "over budget: {st}");

    let s = run("off");
    let st = &s["read_path"]["store"];
    assert_eq!(st["hedged_gets"].as_u64(), Some(0), "{st}");
}
