//! A volume written randomly and read sequentially, through the real
//! server and qemu-io: the large read finds its data scattered and writes
//! it back contiguously (counted in the stats file); every block reads back
//! what was written, after a clean restart the same read finds one run and
//! rewrites nothing, and a server killed right after the rewrite's repoint
//! (before its segment is stored) loses nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::clients::{qemu_io, qemu_io_verify};
use common::*;

const MIB: u64 = 1 << 20;
const VOL: u64 = 16 * MIB;
/// The scattered range: 1024 blocks of 4 KiB.
const BLOCKS: u64 = 1024;
const BLOCK: u64 = 4096;

fn target(stats: &Path) -> Target {
    let stats = stats.display().to_string();
    Target::strata_with(&[
        "--segment-size",
        "1MiB",
        "--segment-age-ms",
        "100",
        // Background passes out of the way: only reads rewrite here.
        "--gc-interval-ms",
        "600000",
        "--stats-interval-ms",
        "100",
        "--stats-file",
        &stats,
    ])
}

/// The byte block `i` holds.
fn pattern(i: u64) -> u64 {
    i % 250 + 1
}

/// Every block written once, in an order that scatters neighbours over
/// the segments (a stride coprime with the block count).
fn scattered_writes() -> Vec<String> {
    let mut cmds: Vec<String> = (0..BLOCKS)
        .map(|k| (k * 389) % BLOCKS)
        .map(|i| format!("write -P {} {} {}", pattern(i), i * BLOCK, BLOCK))
        .collect();
    cmds.push("flush".into());
    cmds
}

fn block_reads() -> Vec<String> {
    (0..BLOCKS)
        .map(|i| format!("read -P {} {} {}", pattern(i), i * BLOCK, BLOCK))
        .collect()
}

/// A GC counter of the volume from the stats file, once it is at least
/// `at_least` (or the deadline passed).
fn gc_counter(stats: &Path, key: &str, at_least: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(stats).unwrap_or_default();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        let got = v["volumes"]["vol"]["gc"][key].as_u64();
        if let Some(n) = got {
            if n >= at_least || Instant::now() > deadline {
                return n;
            }
        } else if Instant::now() > deadline {
            panic!("no volumes.vol.gc.{key} in the stats file: {text}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn write_scattered(server: &Server) {
    let out = qemu_io(&server.vol_uri(), &scattered_writes());
    assert!(out.status.success(), "writes failed: {}", stderr_str(&out));
}

fn read_all(server: &Server) {
    let out = qemu_io(&server.vol_uri(), &[format!("read 0 {}", BLOCKS * BLOCK)]);
    assert!(out.status.success(), "read failed: {}", stderr_str(&out));
}

#[test]
fn a_scattered_range_read_sequentially_is_rewritten_contiguously() {
    require_tools(&["qemu-io"]);
    let _serial = serial();
    let tmp = tempfile::TempDir::new().unwrap();
    let stats = tmp.path().join("stats.json");
    let mut server = Server::start(tmp.path(), target(&stats), &[("vol", VOL)]);
    write_scattered(&server);
    // A clean restart: everything is in stored segments, none in memory.
    server.restart();
    read_all(&server);
    let rewritten = gc_counter(&stats, "bytes_rewritten_on_read", BLOCKS * BLOCK);
    assert_eq!(
        rewritten,
        BLOCKS * BLOCK,
        "the scattered range was not rewritten whole"
    );
    qemu_io_verify(&server.vol_uri(), &block_reads(), "after the rewrite");
    server.restart();
    qemu_io_verify(&server.vol_uri(), &block_reads(), "after a restart");
    read_all(&server);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        gc_counter(&stats, "read_rewrites", 0),
        0,
        "the rewritten range is still scattered"
    );
    server.stop();
}

#[test]
fn a_server_killed_after_a_rewrite_loses_nothing() {
    require_tools(&["qemu-io"]);
    let _serial = serial();
    let tmp = tempfile::TempDir::new().unwrap();
    let stats = tmp.path().join("stats.json");
    let point = strata_volume::READ_REWRITE_CRASH_POINT;
    let mut server = Server::start(tmp.path(), target(&stats), &[("vol", VOL)]);
    write_scattered(&server);
    server.stop();
    server.target = target(&stats).with_env("STRATA_CRASH_AT", point);
    server.start_again();
    let _ = qemu_io(&server.vol_uri(), &[format!("read 0 {}", BLOCKS * BLOCK)]);
    let status = server.wait_exit(Duration::from_secs(30));
    assert!(
        status.is_some_and(|s| !s.success()),
        "server did not abort at {point}: {status:?}"
    );
    assert!(
        server
            .stderr()
            .contains(&format!("STRATA_CRASH_AT={point}")),
        "aborted elsewhere:\n{}",
        server.stderr()
    );
    server.target = target(&stats);
    server.start_again();
    qemu_io_verify(
        &server.vol_uri(),
        &block_reads(),
        &format!("after a crash at {point}"),
    );
    // The rewrite is redone by the next read, and holds.
    read_all(&server);
    assert!(gc_counter(&stats, "bytes_rewritten_on_read", BLOCKS * BLOCK) > 0);
    server.restart();
    qemu_io_verify(
        &server.vol_uri(),
        &block_reads(),
        "after the rewrite was redone",
    );
    server.stop();
}
