//! The local disk cache through the real server and qemu-io: data written
//! on this host is read back from local disk after its upload, after a
//! clean restart and after kill -9 (no data GET); a corrupted block is
//! detected, counted and read from the store; a full cache disk degrades to
//! the store with a log line and no error to the client.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::clients::{qemu_io, qemu_io_verify};
use common::*;

const MIB: u64 = 1 << 20;
const VOL: u64 = 64 * MIB;
const BLOCK: u64 = 64 << 10;

fn args(stats: &Path, cache_size: &str) -> Vec<String> {
    [
        "--disk-cache-size",
        cache_size,
        "--segment-size",
        "1MiB",
        "--gc",
        "off",
        "--stats-interval-ms",
        "100",
        "--stats-file",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([stats.display().to_string()])
    .collect()
}

fn target(stats: &Path, cache_size: &str) -> Target {
    let a = args(stats, cache_size);
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    Target::strata_with(&a)
}

fn stats(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn disk(s: &serde_json::Value, field: &str) -> u64 {
    s["read_path"]["disk_cache"][field]
        .as_u64()
        .unwrap_or_else(|| panic!("no disk_cache.{field} in {s}"))
}

fn data_gets(s: &serde_json::Value) -> u64 {
    s["read_path"]["store"]["data_gets"].as_u64().unwrap()
}

/// Waits until the disk cache has taken `blocks` written blocks.
fn wait_written(path: &Path, blocks: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got = std::fs::read_to_string(path)
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .and_then(|s| s["read_path"]["disk_cache"]["written_insertions"].as_u64());
        if got.is_some_and(|n| n >= blocks) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "written blocks: {got:?} of {blocks}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn write(server: &Server, pattern: u8, at_mib: u64, mib: u64) {
    let out = qemu_io(
        &server.vol_uri(),
        &[
            format!("write -P {pattern:#x} {at_mib}M {mib}M"),
            "flush".into(),
        ],
    );
    assert!(out.status.success(), "{}", stderr_str(&out));
}

fn read(server: &Server, pattern: u8, at_mib: u64, mib: u64, when: &str) {
    qemu_io_verify(
        &server.vol_uri(),
        &[format!("read -P {pattern:#x} {at_mib}M {mib}M")],
        when,
    );
}

/// Flips one byte in each data block of the cache file holding data.
fn corrupt_blocks(file: &Path) -> u64 {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(file)
        .unwrap();
    let len = f.metadata().unwrap().len();
    let slots = (len - 4096) / BLOCK;
    let data_offset = 4096 + (slots * 32).div_ceil(4096) * 4096;
    let mut block = vec![0u8; BLOCK as usize];
    let mut n = 0;
    for off in (data_offset..len).step_by(BLOCK as usize) {
        f.read_exact_at(&mut block, off).unwrap();
        if block.iter().any(|&b| b != 0) {
            block[7] ^= 0xff;
            f.write_all_at(&block, off).unwrap();
            n += 1;
        }
    }
    n
}

#[test]
fn written_data_is_read_from_local_disk_after_restarts_and_corruption_is_caught() {
    require_tools(&["qemu-io"]);
    let _serial = serial();
    let tmp = tempfile::TempDir::new().unwrap();
    let stats_path = tmp.path().join("stats.json");
    let mut server = Server::start(tmp.path(), target(&stats_path, "64MiB"), &[("vol", VOL)]);
    write(&server, 0x5a, 0, 8);
    // A clean stop uploads every segment and writes out the cache's queue.
    server.stop();
    let s = stats(&stats_path);
    assert!(disk(&s, "written_insertions") >= 128, "{s}");

    server.start_again();
    read(&server, 0x5a, 0, 8, "after a clean restart");
    server.stop();
    let s = stats(&stats_path);
    assert!(disk(&s, "restored_blocks") >= 128, "{s}");
    assert!(disk(&s, "hits") >= 2048, "{s}");
    assert_eq!(data_gets(&s), 0, "read from the store, not the cache: {s}");

    // Written, uploaded and cached, then kill -9: still a hit.
    server.start_again();
    write(&server, 0x6b, 8, 8);
    wait_written(&stats_path, 128);
    server.kill9();
    server.start_again();
    read(&server, 0x5a, 0, 8, "after kill -9");
    read(&server, 0x6b, 8, 8, "after kill -9");
    server.stop();
    let s = stats(&stats_path);
    assert!(disk(&s, "hits") >= 4096, "{s}");
    assert_eq!(data_gets(&s), 0, "{s}");

    // Damage every cached block: each is caught, dropped, counted, and
    // the data comes from the store.
    let corrupted = corrupt_blocks(&server.data_dir().join("cache").join("blocks"));
    assert!(corrupted >= 256, "{corrupted}");
    server.start_again();
    read(&server, 0x5a, 0, 8, "after the cache file was damaged");
    read(&server, 0x6b, 8, 8, "after the cache file was damaged");
    server.stop();
    let s = stats(&stats_path);
    assert!(disk(&s, "verify_failures") >= 256, "{s}");
    assert!(data_gets(&s) > 0, "{s}");
    assert!(
        server.stderr().contains("failed verification"),
        "no log line for the damaged blocks"
    );
}

/// A tmpfs mounted over `dir`, unmounted on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(dir).unwrap();
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "this test mounts a small tmpfs to fill a disk (needs root): {}",
            stderr_str(&out)
        );
        Tmpfs(dir.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

#[test]
fn a_full_cache_disk_degrades_to_the_store_with_a_log_line() {
    require_tools(&["qemu-io"]);
    let _serial = serial();
    let tmp = tempfile::TempDir::new().unwrap();
    let stats_path = tmp.path().join("stats.json");
    // The cache file is sparse: 64 MiB of cache on a 1 MiB file system
    // opens fine and fills up at the 16th block or so.
    let _full = Tmpfs::mount(&tmp.path().join("data").join("cache"), "1m");
    let mut server = Server::start(tmp.path(), target(&stats_path, "64MiB"), &[("vol", VOL)]);
    write(&server, 0x3c, 0, 16);
    read(&server, 0x3c, 0, 16, "while the cache disk is full");
    server.stop();
    let s = stats(&stats_path);
    assert!(
        s["read_path"]["disk_cache"]["disabled_by_error"] == true,
        "{s}"
    );
    let cached = disk(&s, "written_insertions");
    assert!(cached > 0 && cached < 256, "{s}");
    let log = server.stderr();
    assert!(
        log.contains("disk cache write failed") && log.contains("No space left"),
        "no log line naming the full disk:\n{log}"
    );
    // After a restart, what fitted is served from disk, the rest from the
    // store, until the disk is full again.
    server.start_again();
    read(
        &server,
        0x3c,
        0,
        16,
        "after a restart with the cache disk full",
    );
    server.stop();
    let s = stats(&stats_path);
    assert_eq!(disk(&s, "restored_blocks"), cached, "{s}");
    assert!(disk(&s, "hits") > 0 && data_gets(&s) > 0, "{s}");
}
