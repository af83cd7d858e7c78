//! A fenced server's garbage collector deletes nothing. Server A (MinIO,
//! 2 s lease) makes garbage and lists it as pending deletions in the
//! manifest (grace 4 s); A is frozen (SIGSTOP) past its lease, B takes the
//! volume over with background GC off; once the grace period has passed,
//! A runs again (SIGCONT) until it logs "fenced": every object that was in
//! the store is still there. B then collects what A left (it inherits the
//! pending deletions with the manifest) and the data reads back.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::collections::BTreeSet;
use std::thread;
use std::time::{Duration, Instant};

use common::clients::{qemu_io, qemu_io_verify};
use common::*;

const VOL: u64 = 64 * MIB;

fn pending_deletions(server: &Server) -> u64 {
    let out = server.cli(&["volume", "info", "vol", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v["pending_deletions"].as_u64().unwrap_or(0)
}

fn objects(store: &S3Store) -> BTreeSet<String> {
    store
        .list("vol/")
        .into_iter()
        .map(|(k, _)| k)
        .filter(|k| k.contains("/segments/") || k.contains("/checkpoints/"))
        .collect()
}

#[test]
fn a_fenced_servers_gc_deletes_nothing() {
    let _serial = serial();
    require_tools(&["qemu-io"]);
    let tmp = tempfile::TempDir::new().unwrap();
    let store = S3Store::on_shared("gcfence");
    let common_args = [
        "--volume",
        "vol",
        "--lease-ttl-ms",
        "2000",
        "--durability",
        "remote",
        "--segment-size",
        "1MiB",
        "--gc-grace-ms",
        "4000",
    ];
    let a_target = Target::strata_s3(&store, &common_args).with_args(&["--gc-interval-ms", "100"]);
    let mut a = Server::start(&tmp.path().join("a"), a_target, &[("vol", VOL)]);
    // 8 one-segment writes, then 3/4 of each overwritten: garbage.
    let mut cmds: Vec<String> = (0..8).map(|i| format!("write -P 0x11 {i}M 1M")).collect();
    cmds.extend((0..8).map(|i| format!("write -P 0x22 {i}M 768K")));
    cmds.push("flush".into());
    let out = qemu_io(&a.vol_uri(), &cmds);
    assert!(out.status.success(), "{}", stderr_str(&out));
    let t0 = Instant::now();
    while pending_deletions(&a) == 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "A listed no pending deletions:\n{}",
            a.stderr()
        );
        thread::sleep(Duration::from_millis(100));
    }
    let pending_at = Instant::now();
    a.signal(libc::SIGSTOP);
    thread::sleep(Duration::from_millis(3000));
    let b_target = Target::strata_s3(&store, &common_args).with_args(&["--gc", "off"]);
    let mut b = Server::start(&tmp.path().join("b"), b_target, &[("vol", VOL)]);
    let before = objects(&store);
    // Past A's grace period, then A runs again until it knows.
    if let Some(rest) = Duration::from_millis(5000).checked_sub(pending_at.elapsed()) {
        thread::sleep(rest);
    }
    a.signal(libc::SIGCONT);
    let woke = Instant::now();
    while !a.stderr().contains("fenced") {
        assert!(
            woke.elapsed() < Duration::from_secs(15),
            "A was not fenced:\n{}",
            a.stderr()
        );
        thread::sleep(Duration::from_millis(50));
    }
    thread::sleep(Duration::from_millis(1000)); // A's GC had its chances
    let after = objects(&store);
    let gone: Vec<_> = before.difference(&after).collect();
    assert!(gone.is_empty(), "the fenced server deleted {gone:?}");
    assert!(!a.stderr().contains("deleting an orphan"), "{}", a.stderr());
    // B inherits the pending deletions and carries them out.
    let reads: Vec<String> = (0..8)
        .flat_map(|i| {
            [
                format!("read -P 0x22 {i}M 768K"),
                format!("read -P 0x11 {} 256K", i * MIB + 768 * 1024),
            ]
        })
        .collect();
    qemu_io_verify(&b.vol_uri(), &reads, "through B");
    let gc = b.cli(&["volume", "gc", "vol", "--wait"]);
    assert!(gc.status.success(), "{}", stderr_str(&gc));
    assert!(
        objects(&store).len() < before.len(),
        "B deleted nothing: {}",
        stdout_str(&gc)
    );
    assert_eq!(pending_deletions(&b), 0);
    qemu_io_verify(&b.vol_uri(), &reads, "through B after its GC");
    b.stop();
    a.kill9();
}
