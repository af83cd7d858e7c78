//! One server per volume on a shared S3 store (MinIO): the lease.
//!
//! (a) A second `strata serve --volume vol` on another data dir (another
//!     host) exits non-zero naming the first server (its data dir).
//! (b) Once the first stops cleanly (SIGTERM releases the lease) the second
//!     opens the volume at once, well within the 30 s TTL.
//! (c) Fencing: server A is frozen (SIGSTOP) past its 2 s lease TTL, B
//!     takes the volume over and writes; when A runs again (SIGCONT) it
//!     must notice within seconds: its clients' requests fail, new
//!     connections are refused, its log says "fenced", and nothing it had
//!     buffered reaches the store: B's data is intact, through B and through
//!     a third server on yet another data dir. A fenced server takes no
//!     snapshot, deletes none and resizes nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::clients::{pattern_reads, qemu_io, qemu_io_verify, write_patterns};
use common::*;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

const VOL: u64 = 64 * MIB;

#[test]
fn s3_second_server_is_refused_until_the_first_stops_cleanly() {
    let _serial = serial();
    let t = Instant::now();
    let tmp = tempfile::TempDir::new().unwrap();
    let store = S3Store::on_shared("lease");
    let target = Target::strata_s3(&store, &["--volume", "vol"]);
    let mut a = Server::start(&tmp.path().join("a"), target.clone(), &[("vol", VOL)]);
    let ws = [(0x61, 0, MIB), (0x62, 5 * MIB + 3, 12345)];
    write_patterns(&a.vol_uri(), &ws, true);

    // (a) Another host is refused, and told who holds the volume.
    let a_data = std::fs::canonicalize(a.data_dir()).unwrap();
    let refused = Instant::now();
    let (st, stderr) =
        match Server::try_start(&tmp.path().join("b"), target.clone(), &[("vol", VOL)]) {
            Ok(mut b) => {
                b.kill9();
                panic!("a second server opened volume vol while the first serves it");
            }
            Err(e) => e,
        };
    eprintln!(
        "second server refused in {:.1?} ({st}): {}",
        refused.elapsed(),
        stderr.lines().last().unwrap_or("")
    );
    assert!(!st.success(), "{st}");
    assert!(
        stderr.contains("is being served by") && stderr.contains(&a_data.display().to_string()),
        "the refusal does not name the first server's data dir {}:\n{stderr}",
        a_data.display()
    );
    assert!(
        stderr.contains(&format!("pid {}", a.pid())),
        "the refusal does not name the first server's pid {}:\n{stderr}",
        a.pid()
    );
    a.assert_alive();
    qemu_io_verify(
        &a.vol_uri(),
        &pattern_reads(&ws),
        "through the first server",
    );
    // `volume info` tells an operator who holds it.
    let info = stdout_str(&a.cli(&["volume", "info", "vol", "--json"]));
    let info: serde_json::Value = serde_json::from_str(&info).unwrap();
    let served_by = info["served_by"].as_str().unwrap_or_default().to_string();
    assert!(
        served_by.contains(&a_data.display().to_string()),
        "volume info says served_by {served_by:?}"
    );
    assert!(info["epoch"].as_u64().unwrap() >= 1, "{info}");

    // (b) A clean stop releases the lease: the other host opens the volume
    // at once, no TTL wait.
    a.stop();
    let stopped = Instant::now();
    let mut b = Server::start(&tmp.path().join("b"), target, &[("vol", VOL)]);
    let took = stopped.elapsed();
    eprintln!("second server ready {took:.1?} after the first stopped");
    assert!(
        took < Duration::from_secs(10),
        "the second server needed {took:.1?} to open a volume released by a clean stop \
         (the lease TTL is 30 s)"
    );
    qemu_io_verify(
        &b.vol_uri(),
        &pattern_reads(&ws),
        "through the second server",
    );
    b.stop();
    let info = stdout_str(&b.cli(&["volume", "info", "vol", "--json"]));
    let info: serde_json::Value = serde_json::from_str(&info).unwrap();
    assert!(
        info["served_by"].is_null(),
        "released after a clean stop: {info}"
    );
    eprintln!("s3 lease refuse/release: {:.1?}", t.elapsed());
}

/// A libnbd client that connects, says "connected", waits for `trigger`
/// to exist, then writes 64 KiB at 60 MiB and FLUSHes. Exit 0 and
/// "refused: ..." when the server failed the request (as a fenced one
/// must), exit 1 and "written" when it succeeded.
const LATE_CLIENT: &str = r#"
import os, sys, time
import nbd
uri, trigger = sys.argv[1], sys.argv[2]
h = nbd.NBD()
h.connect_uri(uri)
print("connected", flush=True)
while not os.path.exists(trigger):
    time.sleep(0.05)
try:
    h.pwrite(b"\xa5" * 65536, 60 * 1024 * 1024)
    h.flush()
except nbd.Error as e:
    print("refused: %s" % e, flush=True)
    sys.exit(0)
print("written", flush=True)
sys.exit(1)
"#;

#[test]
fn s3_frozen_server_is_fenced_after_a_takeover() {
    let _serial = serial();
    let t = Instant::now();
    require_tools(&["qemu-io", "nbdinfo"]);
    let tmp = tempfile::TempDir::new().unwrap();
    let store = S3Store::on_shared("fence");
    // Remote durability: what A FLUSHed is in the store when B takes over
    // (with local durability it could still be in A's journal only).
    let target = Target::strata_s3(
        &store,
        &[
            "--volume",
            "vol",
            "--lease-ttl-ms",
            "2000",
            "--durability",
            "remote",
        ],
    );
    let mut a = Server::start(&tmp.path().join("a"), target.clone(), &[("vol", VOL)]);
    let a_uri = a.vol_uri();

    // A's data, in the store (FLUSHed).
    let a_flushed = [(0x41, 0, MIB), (0x42, 8 * MIB, MIB)];
    write_patterns(&a_uri, &a_flushed, true);
    // A client of A that will write after the takeover.
    let script = tmp.path().join("late_client.py");
    std::fs::write(&script, LATE_CLIENT).unwrap();
    let trigger = tmp.path().join("go");
    let mut late = BgProcess::spawn(
        "late_client.py",
        Command::new(python_with_nbd())
            .arg(&script)
            .arg(&a_uri)
            .arg(&trigger),
    );
    let t0 = Instant::now();
    while !late.stdout().contains("connected") {
        assert!(
            late.try_status().is_none(),
            "late client exited: {}",
            late.stderr()
        );
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "late client never connected"
        );
        thread::sleep(Duration::from_millis(20));
    }
    // And writes A only buffered (no FLUSH; the open segment is sealed by
    // age after 5 s): A freezes holding them. If A ever uploaded them after
    // the takeover, they would show up over B's data below.
    let a_buffered = [(0x43, 16 * MIB, 2 * MIB), (0x44, 0, 4096)];
    write_patterns(&a_uri, &a_buffered, false);

    // A snapshot A takes while it holds the volume.
    let out = a.cli(&["snapshot", "create", "vol@keep"]);
    assert!(out.status.success(), "{}", stderr_str(&out));

    // A freezes past its TTL; B takes over.
    a.signal(libc::SIGSTOP);
    let frozen = Instant::now();
    thread::sleep(Duration::from_millis(3000));
    let mut b = Server::start(&tmp.path().join("b"), target.clone(), &[("vol", VOL)]);
    eprintln!(
        "B took the volume over {:.1?} after A froze",
        frozen.elapsed()
    );
    let b_uri = b.vol_uri();
    // What B sees of A's data: the flushed part (A's buffered writes were
    // never uploaded, and B recovers from the store only).
    qemu_io_verify(
        &b_uri,
        &pattern_reads(&a_flushed[1..]),
        "A's flushed data through B",
    );
    let b_writes = [
        (0x51, 0, 4096),           // over A's buffered 0x44 and flushed 0x41
        (0x52, 16 * MIB, 2 * MIB), // over A's buffered 0x43
        (0x53, 32 * MIB + 7, 300_000),
    ];
    write_patterns(&b_uri, &b_writes, true);
    let mut expect: Vec<(u8, u64, u64)> = b_writes.to_vec();
    expect.push((0x41, 4096, MIB - 4096));
    expect.push(a_flushed[1]);
    expect.push((0x00, 60 * MIB, 65536)); // the late client's target
    qemu_io_verify(&b_uri, &pattern_reads(&expect), "B's data through B");

    // A wakes up and must find out it was taken over.
    a.signal(libc::SIGCONT);
    let woke = Instant::now();
    while !a.stderr().contains("fenced") {
        a.assert_alive();
        assert!(
            woke.elapsed() < Duration::from_secs(15),
            "A did not log \"fenced\" within 15 s of running again\n{}",
            a.stderr()
        );
        thread::sleep(Duration::from_millis(50));
    }
    eprintln!("A logged \"fenced\" {:.1?} after SIGCONT", woke.elapsed());
    // A fenced server takes no snapshot, deletes none, resizes nothing.
    for args in [
        &["snapshot", "create", "vol@late"][..],
        &["snapshot", "delete", "vol@keep"][..],
        &["volume", "resize", "vol", "--size", "128MiB"][..],
    ] {
        let out = a.cli(args);
        let err = stderr_str(&out);
        assert!(
            !out.status.success() && err.contains("fenced"),
            "the fenced server A did {args:?}: {err}"
        );
    }
    // Its connected client's write fails.
    std::fs::write(&trigger, b"go").unwrap();
    let st = late.wait(Duration::from_secs(60));
    assert!(
        st.success(),
        "a write through the fenced server A did not fail ({st}): {}{}",
        late.stdout(),
        late.stderr()
    );
    eprintln!("late client of A: {}", late.stdout().trim());
    // New connections are refused, saying why (libnbd shows the server's
    // message text only in its debug output).
    let out = run_timeout(
        Command::new("nbdinfo").env("LIBNBD_DEBUG", "1").arg(&a_uri),
        Duration::from_secs(60),
    );
    assert!(
        !out.status.success(),
        "nbdinfo connected to the fenced server A: {}",
        stdout_str(&out)
    );
    let err = stderr_str(&out);
    let said: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("server error message"))
        .collect();
    eprintln!(
        "new client of A: {}",
        said.first().unwrap_or(&"(no message)")
    );
    assert!(
        !said.is_empty() && said.iter().all(|l| l.contains("fenced")),
        "the fenced server refused a new client without saying \"fenced\": {said:#?}\n{}",
        err.lines()
            .filter(|l| !l.contains("libnbd: debug"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let out = qemu_io(&a_uri, &["read 0 4096".to_string()]);
    assert!(
        !out.status.success() || stdout_str(&out).contains("failed"),
        "a read through the fenced server A succeeded: {}",
        stdout_str(&out)
    );
    // Give A time to try whatever it would do with its buffered writes
    // (its open segment is past its seal age by now).
    thread::sleep(Duration::from_secs(3));
    let a_status = a.stop_status(libc::SIGTERM);
    eprintln!("fenced server A exited with {a_status} on SIGTERM");

    // B's data is intact: through B, and from the store alone; the
    // snapshot is still there and the volume's size unchanged.
    qemu_io_verify(
        &b_uri,
        &pattern_reads(&expect),
        "through B after A was fenced",
    );
    let out = b.cli(&["snapshot", "list", "vol", "--json"]);
    let listed = stdout_str(&out);
    assert!(
        listed.contains("\"keep\"") && !listed.contains("\"late\""),
        "{listed}"
    );
    let info = stdout_str(&b.cli(&["volume", "info", "vol", "--json"]));
    assert!(info.contains(&format!("\"size_bytes\": {VOL}")), "{info}");
    b.stop();
    let mut c = Server::start(&tmp.path().join("c"), target.clone(), &[("vol", VOL)]);
    qemu_io_verify(
        &c.vol_uri(),
        &pattern_reads(&expect),
        "on a third host after B stopped",
    );
    c.stop();

    // A restarted on its old data dir (its journal still holds the writes
    // it never uploaded) must not bring them back over B's data: it either
    // refuses to open the volume or serves what the store holds.
    match a.try_start_again() {
        Ok(()) => {
            qemu_io_verify(
                &a_uri,
                &pattern_reads(&expect),
                "through A restarted on its data dir",
            );
            a.stop();
        }
        Err((st, stderr)) => eprintln!(
            "A refused to restart on its old data dir ({st}): {}",
            stderr.lines().last().unwrap_or("")
        ),
    }
    eprintln!("s3 lease fencing: {:.1?}", t.elapsed());
}
