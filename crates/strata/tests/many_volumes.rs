//! Many volumes on one server: 50 volumes written at once by 50 clients,
//! the server killed -9 right after every write was acknowledged (the data
//! is in 50 sparse journals, not yet in the store), restarted, and every
//! acknowledged write of every volume read back; then a server-wide write
//! budget smaller than one volume's share of it still lets all of them
//! write (each under its fair share never waits for the others).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::clients::{qemu_io, qemu_io_verify};
use common::*;

const VOLUMES: usize = 50;
const VOL: u64 = 32 * MIB;

fn names() -> Vec<String> {
    (0..VOLUMES).map(|i| format!("v{i}")).collect()
}

/// Writes of volume `i`: 16 patterns of 1 MiB at 2 MiB strides, each
/// volume's patterns its own.
fn writes(i: usize) -> Vec<String> {
    (0..16)
        .map(|k| format!("write -P {:#x} {}M 1M", (i * 16 + k) % 255 + 1, 2 * k))
        .collect()
}

fn reads(i: usize) -> Vec<String> {
    writes(i)
        .into_iter()
        .map(|w| w.replacen("write", "read", 1))
        .collect()
}

/// Every volume written at once, one client each; returns once all are
/// acknowledged.
fn write_all(server: &Server) {
    let uris: Vec<String> = names().iter().map(|n| server.uri(n)).collect();
    let clients: Vec<_> = uris
        .into_iter()
        .enumerate()
        .map(|(i, uri)| std::thread::spawn(move || (i, qemu_io(&uri, &writes(i)))))
        .collect();
    for c in clients {
        let (i, out) = c.join().unwrap();
        assert!(out.status.success(), "v{i}: {}", stderr_str(&out));
    }
}

#[test]
fn fifty_volumes_written_at_once_survive_kill_9() {
    require_tools(&["qemu-io"]);
    let _serial = serial();
    let tmp = tempfile::TempDir::new().unwrap();
    let names = names();
    let volumes: Vec<(&str, u64)> = names.iter().map(|n| (n.as_str(), VOL)).collect();
    // Segments only sealed by size or at close: what was acknowledged is in
    // the journals when the server dies.
    let target = Target::strata_with(&["--segment-age-ms", "600000", "--gc", "off"]);
    let mut server = Server::start(tmp.path(), target, &volumes);
    write_all(&server);
    server.crash_restart();
    for (i, name) in names.iter().enumerate() {
        qemu_io_verify(&server.uri(name), &reads(i), &format!("v{i} after kill -9"));
    }
    // A clean stop leaves every journal's space given back.
    server.stop();
    let journals = server.data_dir().join("journals");
    let mut allocated = 0u64;
    for e in std::fs::read_dir(&journals).unwrap() {
        let e = e.unwrap();
        if e.path().extension().is_some_and(|x| x == "journal") {
            use std::os::unix::fs::MetadataExt;
            allocated += e.metadata().unwrap().blocks() * 512;
        }
    }
    assert!(
        allocated <= VOLUMES as u64 * (64 << 10),
        "{allocated} bytes of journals on disk after a clean stop"
    );
}

#[test]
fn a_small_server_budget_is_shared_by_every_volume_writing() {
    require_tools(&["qemu-io"]);
    let _serial = serial();
    let tmp = tempfile::TempDir::new().unwrap();
    let names = names();
    let volumes: Vec<(&str, u64)> = names.iter().map(|n| (n.as_str(), VOL)).collect();
    // 64 MiB for 50 volumes writing 16 MiB each: shares of ~1.3 MiB.
    let stats = tmp.path().join("stats.json");
    let sp = stats.display().to_string();
    let target = Target::strata_with(&[
        "--write-buffer-total",
        "64MiB",
        "--gc",
        "off",
        "--stats-file",
        &sp,
        "--stats-interval-ms",
        "100",
    ]);
    let mut server = Server::start(tmp.path(), target, &volumes);
    write_all(&server);
    for (i, name) in names.iter().enumerate() {
        qemu_io_verify(&server.uri(name), &reads(i), &format!("v{i}"));
    }
    // The budget held writers back (and none of them for ever): the
    // counters of the served volumes (the file at exit lists none).
    std::thread::sleep(std::time::Duration::from_millis(500));
    let st: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    server.stop();
    let log = server.last_stderr();
    assert!(!log.contains("ERROR"), "{log}");
    let waited: u64 = st["volumes"]
        .as_object()
        .unwrap()
        .values()
        .flat_map(|v| v["write_waits"].as_array().unwrap().clone())
        .filter(|w| w["reason"] == "host_write_buffer")
        .map(|w| w["writes"].as_u64().unwrap())
        .sum();
    assert!(waited > 0, "no write waited for the server's budget: {st}");
}
