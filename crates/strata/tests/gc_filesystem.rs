//! fio verify on ext4 (nbdfuse + loop device) on a volume whose garbage
//! collector runs all the time (every 50 ms, segments under 80% live
//! rewritten, deletions without grace): files rewritten, one deleted and
//! trimmed, all verified by fio's crc32c headers, before and after a
//! restart; fsck.ext4 clean. The stats file shows GC copied and deleted
//! during the run. Needs root (loop devices, mount) and /dev/fuse.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;

const VOL: u64 = 256 * MIB;

fn fio_verify(dir: &Path, name: &str, verify_only: bool) {
    let mut c = Command::new("fio");
    c.arg(format!("--name={name}"))
        .arg(format!("--directory={}", dir.display()))
        .args([
            "--size=32M",
            "--rw=randwrite",
            "--bs=4k",
            "--ioengine=psync",
            "--direct=1",
            "--numjobs=2",
            "--loops=3",
            "--randseed=42",
            "--verify=crc32c",
            "--verify_fatal=1",
            "--do_verify=1",
        ]);
    if verify_only {
        c.arg("--verify_only");
    }
    let out = run_timeout(&mut c, Duration::from_secs(600));
    assert!(
        out.status.success() && !stdout_str(&out).contains("verify: bad"),
        "fio {name} (verify_only={verify_only}) failed ({}):\n{}\n{}",
        out.status,
        stdout_str(&out),
        stderr_str(&out)
    );
}

fn gc_counter(stats: &Path, key: &str) -> u64 {
    let text = std::fs::read_to_string(stats).unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    v["volumes"]["vol"]["gc"][key].as_u64().unwrap_or(0)
}

#[test]
fn fio_verify_on_ext4_while_gc_runs_continuously() {
    require_tools(&[
        "fio",
        "nbdfuse",
        "fusermount3",
        "losetup",
        "mkfs.ext4",
        "fsck.ext4",
        "mount",
        "fstrim",
    ]);
    let _serial = serial();
    let tmp = tempfile::TempDir::new().unwrap();
    let stats = tmp.path().join("stats.json");
    let stats_arg = stats.display().to_string();
    let args = [
        "--segment-size",
        "1MiB",
        "--segment-age-ms",
        "200",
        "--gc-interval-ms",
        "50",
        "--gc-live-threshold",
        "95",
        "--gc-grace-ms",
        "0",
        "--stats-file",
        &stats_arg,
        "--stats-interval-ms",
        "200",
    ];
    let mut server = Server::start(tmp.path(), Target::strata_with(&args), &[("vol", VOL)]);
    let fuse = FuseFile::mount(&tmp.path().join("fuse"), &server.vol_uri());
    let lo = LoopDev::attach(&fuse.file);
    run_ok(
        Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&lo.dev),
        Duration::from_secs(300),
    );
    let m = Mount::mount_dev(&lo.dev, &tmp.path().join("mnt"));
    // A file that is written, then deleted and trimmed: garbage to collect.
    fio_verify(&m.dir, "scratch", false);
    for entry in std::fs::read_dir(&m.dir).unwrap() {
        let p = entry.unwrap().path();
        if p.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("scratch"))
        {
            std::fs::remove_file(p).unwrap();
        }
    }
    run_ok(Command::new("fstrim").arg(&m.dir), Duration::from_secs(120));
    fio_verify(&m.dir, "kept", false);
    run_ok(&mut Command::new("sync"), Duration::from_secs(120));
    std::thread::sleep(Duration::from_millis(600));
    let copied = gc_counter(&stats, "bytes_copied");
    let deleted = gc_counter(&stats, "objects_deleted");
    eprintln!("GC during the run: {copied} bytes copied, {deleted} objects deleted");
    assert!(
        copied > 0 && deleted > 0,
        "GC did not run: {}",
        std::fs::read_to_string(&stats).unwrap_or_default()
    );
    fio_verify(&m.dir, "kept", true);
    m.unmount();
    run_ok(
        Command::new("fsck.ext4").arg("-fn").arg(&lo.dev),
        Duration::from_secs(300),
    );
    lo.detach();
    fuse.unmount();
    server.restart();
    let fuse = FuseFile::mount(&tmp.path().join("fuse"), &server.vol_uri());
    let lo = LoopDev::attach(&fuse.file);
    run_ok(
        Command::new("fsck.ext4").arg("-fn").arg(&lo.dev),
        Duration::from_secs(300),
    );
    let m = Mount::mount_dev(&lo.dev, &tmp.path().join("mnt"));
    fio_verify(&m.dir, "kept", true);
    m.unmount();
    lo.detach();
    fuse.unmount();
    server.assert_alive();
}
