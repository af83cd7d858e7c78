//! The server driven by real NBD clients: nbdinfo, qemu-io, qemu-img,
//! nbdcopy and nbdsh (libnbd), over both the unix and the tcp listener.

// Test helpers outside #[test] functions unwrap too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::sync::Arc;

use common::mem_device::{Exports, MemDevice};
use common::{run, run_ok, TestServer};
use nbd_server::{Allocation, BlockSizes};
use serde_json::Value;

const MIB: u64 = 1024 * 1024;

fn provider(device: Arc<MemDevice>) -> Arc<Exports<MemDevice>> {
    Arc::new(
        Exports::new()
            .with("", "the default export", Arc::clone(&device))
            .with("second", "another disk", Arc::new(MemDevice::new(MIB))),
    )
}

async fn nbdinfo_json(uri: &str) -> Value {
    let stdout = run_ok("nbdinfo", &["--json", uri]).await;
    let info: Value = serde_json::from_str(&stdout).unwrap();
    info["exports"][0].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nbdinfo_reports_size_flags_block_sizes_and_context() {
    let server = TestServer::start(provider(Arc::new(MemDevice::new(64 * MIB)))).await;
    for uri in server.uris("") {
        let export = nbdinfo_json(&uri).await;
        assert_eq!(export["export-size"], 64 * MIB, "{export}");
        for flag in [
            "can_multi_conn",
            "can_flush",
            "can_fua",
            "can_trim",
            "can_zero",
            "can_fast_zero",
            "can_cache",
        ] {
            assert_eq!(export[flag], true, "{flag}: {export}");
        }
        assert_eq!(export["is_read_only"], false);
        assert_eq!(export["block_size_minimum"], 1, "{export}");
        assert_eq!(export["block_size_preferred"], 4096);
        assert_eq!(export["block_size_maximum"], 32 * MIB);
        assert_eq!(export["contexts"], serde_json::json!(["base:allocation"]));
    }
    let second = nbdinfo_json(&server.unix_uri("second")).await;
    assert_eq!(second["export-size"], MIB);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nbdinfo_read_only_and_custom_block_sizes() {
    let sizes = BlockSizes {
        minimum_bytes: 512,
        preferred_bytes: 65536,
        maximum_bytes: 4 * MIB as u32,
    };
    let device = MemDevice::new(8 * MIB).read_only().with_block_sizes(sizes);
    let server = TestServer::start(provider(Arc::new(device))).await;
    let export = nbdinfo_json(&server.tcp_uri("")).await;
    assert_eq!(export["is_read_only"], true, "{export}");
    assert_eq!(export["can_trim"], false);
    assert_eq!(export["can_zero"], false);
    assert_eq!(export["can_fua"], false);
    assert_eq!(export["can_flush"], true);
    assert_eq!(export["block_size_minimum"], 512);
    assert_eq!(export["block_size_preferred"], 65536);
    assert_eq!(export["block_size_maximum"], 4 * MIB);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nbdinfo_lists_exports() {
    let server = TestServer::start(provider(Arc::new(MemDevice::new(MIB)))).await;
    for uri in server.uris("") {
        let stdout = run_ok("nbdinfo", &["--list", "--json", &uri]).await;
        let info: Value = serde_json::from_str(&stdout).unwrap();
        let exports = info["exports"].as_array().unwrap();
        let names: Vec<&str> = exports
            .iter()
            .map(|e| e["export-name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["", "second"], "{info}");
        assert_eq!(exports[1]["description"], "another disk", "{info}");
    }
    let stdout = run_ok("nbdinfo", &["--list", &server.unix_uri("")]).await;
    assert!(stdout.contains("another disk"), "{stdout}");
    server.stop().await;
}

/// qemu-io with a list of commands; fails on any error or failed verification.
async fn qemu_io(uri: &str, commands: &[&str]) -> String {
    let mut args = vec!["-f", "raw"];
    for command in commands {
        args.extend(["-c", command]);
    }
    args.push(uri);
    let stdout = run_ok("qemu-io", &args).await;
    for bad in ["fail", "error", "Error", "mismatch"] {
        assert!(!stdout.contains(bad), "qemu-io {commands:?}: {stdout}");
    }
    stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qemu_io_writes_and_reads_patterns_at_unaligned_offsets() {
    let device = Arc::new(MemDevice::new(16 * MIB));
    let server = TestServer::start(provider(Arc::clone(&device))).await;
    let [unix_uri, tcp_uri] = server.uris("");
    qemu_io(
        &unix_uri,
        &[
            "write -P 0xab 1000 5000",
            "write -P 0xcd 4096 65536",
            "write -P 0x11 16777215 1",
            "write -f -P 0x22 3 7",
            "aio_write -P 0x33 1048576 131072",
            "aio_write -P 0x44 2097152 4096",
            "aio_flush",
        ],
    )
    .await;
    qemu_io(
        &tcp_uri,
        &[
            "read -P 0xab 1000 3096",
            "read -P 0xcd 4096 65536",
            "read -P 0x11 16777215 1",
            "read -P 0x22 3 7",
            "read -P 0x33 1048576 131072",
            "read -P 0x44 2097152 4096",
            "read -P 0 69632 100",
        ],
    )
    .await;
    assert_eq!(device.snapshot(1000, 3096), vec![0xab; 3096]);
    assert_eq!(device.snapshot(3, 7), vec![0x22; 7]);
    assert_eq!(device.snapshot(16 * MIB - 1, 1), vec![0x11]);
    assert!(device.flushes.load(std::sync::atomic::Ordering::Relaxed) >= 1);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qemu_io_zero_discard_and_block_status_map() {
    let device = Arc::new(MemDevice::new(4 * MIB));
    let server = TestServer::start(provider(Arc::clone(&device))).await;
    let uri = server.unix_uri("");
    qemu_io(
        &uri,
        &[
            "write -P 0x55 0 1M",
            "write -z 65536 65536",
            "discard 131072 65536",
            "write -P 0x66 2M 512",
            "read -P 0 65536 131072",
            "read -P 0x55 196608 65536",
        ],
    )
    .await;
    // qemu-io `write -z` without -u asks for NO_HOLE.
    assert_eq!(device.allocation_at(65536), Allocation::Zero);
    assert_eq!(device.allocation_at(131072), Allocation::Hole);
    assert_eq!(device.allocation_at(0), Allocation::Data);

    let map = run_ok("nbdinfo", &["--map", &uri]).await;
    let rows: Vec<(u64, u64, u64)> = map
        .lines()
        .map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            (
                fields[0].parse().unwrap(),
                fields[1].parse().unwrap(),
                fields[2].parse().unwrap(),
            )
        })
        .collect();
    let expected = vec![
        (0, 65536, 0),
        (65536, 65536, 2),
        (131072, 65536, 3),
        (196608, MIB - 196608, 0),
        (MIB, MIB, 3),
        (2 * MIB, 512, 0),
        (2 * MIB + 512, 2 * MIB - 512, 3),
    ];
    assert_eq!(rows, expected, "{map}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qemu_img_and_nbdcopy_round_trip_an_image() {
    let device = Arc::new(MemDevice::new(8 * MIB));
    let server = TestServer::start(provider(Arc::clone(&device))).await;
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("source.img");
    let copy = dir.path().join("copy.img");
    let mut image = vec![0u8; 8 * MIB as usize];
    for (index, chunk) in image.chunks_mut(65536).enumerate() {
        if index % 3 != 0 {
            chunk.fill(index as u8 + 1);
        }
    }
    std::fs::write(&source, &image).unwrap();
    let source_path = source.to_str().unwrap();
    let copy_path = copy.to_str().unwrap();

    run_ok("nbdcopy", &[source_path, &server.unix_uri("")]).await;
    assert_eq!(device.snapshot(0, image.len()), image);
    run_ok("nbdcopy", &[&server.tcp_uri(""), copy_path]).await;
    assert_eq!(std::fs::read(&copy).unwrap(), image);

    let compare = run(
        "qemu-img",
        &[
            "compare",
            "-f",
            "raw",
            "-F",
            "raw",
            source_path,
            &server.tcp_uri(""),
        ],
    )
    .await;
    assert!(compare.status.success(), "{compare:?}");
    server.stop().await;
}

const NBDSH_SCRIPT: &str = r#"
import errno
size = h.get_size()
assert h.can_fast_zero() and h.can_cache() and h.can_multi_conn()
h.pwrite(b"\x77" * 8192, 0)
h.zero(4096, 0, nbd.CMD_FLAG_NO_HOLE | nbd.CMD_FLAG_FAST_ZERO)
assert h.pread(4096, 0) == bytes(4096)
h.cache(65536, 0)
h.flush()
h.pwrite(b"\x88" * 512, 8192, nbd.CMD_FLAG_FUA)
seen = []
def cb(metacontext, offset, entries, err):
    seen.append(list(entries))
h.block_status(65536, 0, cb)
assert seen[-1][:6] == [4096, 2, 4096 + 512, 0, 65536 - 8704, 3], seen
h.block_status(65536, 0, cb, nbd.CMD_FLAG_REQ_ONE)
assert seen[-1] == [4096, 2], seen
h.set_strict_mode(0)
for call, expected in [
    (lambda: h.pread(512, size), errno.EINVAL),
    (lambda: h.pwrite(b"x" * 512, size - 1), errno.ENOSPC),
    (lambda: h.trim(512, size), errno.EINVAL),
    (lambda: h.pread(64 * 1024 * 1024, 0), errno.EINVAL),
]:
    try:
        call()
        raise AssertionError("no error")
    except nbd.Error as e:
        assert e.errnum == expected, (e, expected)
assert h.pread(512, 0) == bytes(512)
print("ok")
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nbdsh_flags_zero_cache_block_status_and_errors() {
    let device = Arc::new(MemDevice::new(4 * MIB));
    let server = TestServer::start(provider(Arc::clone(&device))).await;
    for uri in server.uris("") {
        // nbdsh is `python3 -m nbd`; use the system python that has libnbd.
        let stdout = run_ok(
            "/usr/bin/python3",
            &[
                "-m",
                "nbd",
                "--base-allocation",
                "-u",
                &uri,
                "-c",
                NBDSH_SCRIPT,
            ],
        )
        .await;
        assert_eq!(stdout.trim(), "ok");
    }
    assert_eq!(device.allocation_at(0), Allocation::Zero);
    server.stop().await;
}
