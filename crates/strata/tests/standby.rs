//! Standby exports (issue 42), at the protocol level on MinIO: a server
//! serves a volume another live server holds (a live migration's
//! destination), and takes it over when told to write.
//!
//! (a) A holds `vol` and is written through one NBD connection held open;
//!     B (another data dir) is connected to `vol` too and becomes its
//!     standby: it reads what A had FLUSHed before B connected, and what A
//!     FLUSHes after (A uploads on every FLUSH while a standby exists: with
//!     A's default local durability the data would otherwise stay in A's
//!     journal); B's reads take nothing from A (A goes on writing). A third
//!     server C is refused as a second standby, saying so. B's first write
//!     takes the volume over: B then reads every write A acknowledged
//!     (FLUSHed or not: A's handover uploads its journal), A's next write
//!     fails, and A's `volume info` names B.
//! (b) Policies: a server with `--standby explicit --standby-wait-ms 2000`
//!     accepts the client, but its write waits 2 s and fails saying to run
//!     `strata volume handover` while A keeps the volume and writes; when
//!     its client disconnects, A logs that the standby is gone (the
//!     migration was cancelled); `strata volume handover vol` run on its
//!     data dir (its server running) takes the volume, and its next client
//!     writes at once. A server with `--standby off` refuses the client,
//!     naming the holder.
//! (b2) A holder that does not answer (SIGSTOP): the standby's write fails
//!     at its bound, and the holder, running again, keeps the volume.
//! (c) Host loss: the holder is killed (-9) while a standby waits; the
//!     standby's write takes the volume once the holder's liveness expires,
//!     with every write the holder acknowledged a FLUSH (or FUA) for.
//! (d) Destinations that cannot use the store (wrong credentials, no
//!     answer) fail in one clear line; the holder keeps the volume.
//! (e) The holder's GC deletes segments the standby's view had not read:
//!     the view starts again from the checkpoint and reads the latest data.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::thread;
use std::time::{Duration, Instant};

use common::nbd_session::NbdSession;
use common::*;

const VOL: u64 = 64 * MIB;
const K64: u64 = 64 * KIB;

fn wait_log(server: &Server, needle: &str, timeout: Duration) {
    let t0 = Instant::now();
    while !server.stderr().contains(needle) {
        assert!(
            t0.elapsed() < timeout,
            "no {needle:?} in the server's log within {timeout:?}:\n{}",
            server.stderr()
        );
        thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_standby_reads_what_its_holder_flushed_and_takes_over_at_its_first_write() {
    let _serial = serial();
    let t = Instant::now();
    let tmp = tempfile::TempDir::new().unwrap();
    let store = S3Store::on_shared("standby");
    let target = Target::strata_s3(&store, &[]);
    let mut a = Server::start(&tmp.path().join("a"), target.clone(), &[("vol", VOL)]);
    let mut b = Server::start(&tmp.path().join("b"), target.clone(), &[]);
    let mut s = NbdSession::start();
    s.ok(&format!("open a {}", a.vol_uri()));
    s.ok(&format!("write a 0 65 {K64} 0"));
    s.ok("flush a");

    s.ok(&format!("open b {}", b.uri("vol")));
    wait_log(
        &b,
        "serving the volume as a standby",
        Duration::from_secs(5),
    );
    assert_eq!(
        s.fill("b", 0, K64),
        65,
        "the standby does not read what A flushed before"
    );
    s.ok(&format!("write a {MIB} 66 {K64} 0"));
    s.ok("flush a");
    assert_eq!(
        s.fill("b", MIB, K64),
        66,
        "the standby does not read what A flushed while it stood by"
    );
    s.ok(&format!("write a {} 67 4096 0", 2 * MIB));
    // B's reads took nothing: A still writes (FUA).
    s.ok(&format!("write a {} 68 4096 1", 3 * MIB));

    // A second standby is refused, saying why.
    let c = Server::start(&tmp.path().join("c"), target.clone(), &[]);
    let reply = s.cmd(&format!("open c {}", c.uri("vol")));
    assert!(
        reply.starts_with("err"),
        "a second standby was accepted: {reply}"
    );
    wait_log(&c, "already has a standby", Duration::from_secs(5));

    // B's first write takes the volume.
    let took = Instant::now();
    s.ok(&format!("write b {} 69 4096 1", 4 * MIB));
    eprintln!(
        "the standby's first write took the volume in {:.1?}",
        took.elapsed()
    );
    for (offset, len, byte) in [
        (0, K64, 65),
        (MIB, K64, 66),
        (2 * MIB, 4096, 67),
        (3 * MIB, 4096, 68),
        (4 * MIB, 4096, 69),
    ] {
        assert_eq!(
            s.fill("b", offset, len),
            byte,
            "B at {offset} after taking over"
        );
    }
    // A is on this machine: it wrote the lease over to B, which opened
    // with it (no release to poll for, no lease of its own to take).
    wait_log(&a, "transferred=true", Duration::from_secs(5));
    assert!(
        !b.stderr().contains("the ordinary way"),
        "B fell back to the ordinary take: {}",
        b.stderr()
    );
    let reply = s.cmd(&format!("write a {} 70 4096 0", 5 * MIB));
    assert!(
        reply.starts_with("err"),
        "A still wrote after B took the volume: {reply}"
    );
    let info = a.cli_ok(&["volume", "info", "vol", "--json"]);
    let info: serde_json::Value = serde_json::from_str(&info).unwrap();
    let b_data = std::fs::canonicalize(b.data_dir()).unwrap();
    assert!(
        info["served_by"]
            .as_str()
            .is_some_and(|h| h.contains(&b_data.display().to_string())),
        "A's volume info after the takeover: {info}"
    );
    drop(s);
    drop(c);
    b.stop();
    a.stop();
    eprintln!("standby takeover: {:.1?}", t.elapsed());
}

#[test]
fn standby_policies_explicit_and_off_and_the_wait_bound() {
    let _serial = serial();
    let t = Instant::now();
    let tmp = tempfile::TempDir::new().unwrap();
    let store = S3Store::on_shared("standby-policy");
    let target = Target::strata_s3(&store, &[]);
    let mut a = Server::start(&tmp.path().join("a"), target.clone(), &[("vol", VOL)]);
    let explicit =
        target
            .clone()
            .with_args(&["--standby", "explicit", "--standby-wait-ms", "2000"]);
    let mut d = Server::start(&tmp.path().join("d"), explicit, &[]);
    let mut s = NbdSession::start();
    s.ok(&format!("open a {}", a.vol_uri()));
    s.ok("write a 0 65 4096 1");

    s.ok(&format!("open d {}", d.uri("vol")));
    let asked = Instant::now();
    let reply = s.cmd("write d 4096 66 4096 1");
    let waited = asked.elapsed();
    assert!(
        reply.starts_with("err"),
        "an explicit standby wrote untold: {reply}"
    );
    assert!(
        waited >= Duration::from_millis(1900) && waited < Duration::from_secs(30),
        "the explicit standby's write failed after {waited:?}, not after its 2 s bound"
    );
    wait_log(
        &d,
        "was not given it within 2000 ms",
        Duration::from_secs(5),
    );
    s.ok("write a 8192 67 4096 1");
    assert_eq!(
        s.fill("a", 8192, 4096),
        67,
        "A lost the volume to a standby that only waited"
    );

    // The standby's client goes: the migration was cancelled.
    s.ok("close d");
    wait_log(&a, "the standby is gone", Duration::from_secs(10));

    // An explicit take on D's host.
    let out = d.cli(&["volume", "handover", "vol", "--json"]);
    assert!(
        out.status.success(),
        "explicit take failed: {}",
        stderr_str(&out)
    );
    eprintln!("explicit take: {}", stdout_str(&out).replace('\n', " "));
    s.ok(&format!("open d2 {}", d.uri("vol")));
    s.ok("write d2 12288 68 4096 1");
    assert_eq!(s.fill("d2", 0, 4096), 65);
    assert_eq!(s.fill("d2", 8192, 4096), 67);
    let reply = s.cmd("write a 16384 69 4096 0");
    assert!(
        reply.starts_with("err"),
        "A wrote after the explicit take: {reply}"
    );

    // --standby off: refused, naming the holder.
    let off = target.clone().with_args(&["--standby", "off"]);
    let e = Server::start(&tmp.path().join("e"), off, &[]);
    let reply = s.cmd(&format!("open e {}", e.uri("vol")));
    assert!(
        reply.starts_with("err"),
        "--standby off served the volume: {reply}"
    );
    wait_log(&e, "is being served by", Duration::from_secs(5));
    drop(s);
    drop(e);
    d.stop();
    a.stop();
    eprintln!("standby policies: {:.1?}", t.elapsed());
}

/// (b2) The holder does not answer (its process stopped, SIGSTOP, as a
/// host that hangs): the standby's write fails at its bound
/// (`--standby-wait-ms 3000`, every step of the take together), saying
/// so; when the holder runs again it does not hand the volume to the
/// standby that stopped waiting (the request carried the deadline), keeps
/// it, and its client writes on.
#[test]
fn a_standby_whose_holder_does_not_answer_fails_its_write_at_the_bound() {
    let _serial = serial();
    let tmp = tempfile::TempDir::new().unwrap();
    let store = S3Store::on_shared("standby-frozen");
    let target = Target::strata_s3(&store, &["--lease-ttl-ms", "60000"]);
    let a = Server::start(&tmp.path().join("a"), target.clone(), &[("vol", VOL)]);
    let waits = target.with_args(&["--standby-wait-ms", "3000"]);
    let b = Server::start(&tmp.path().join("b"), waits, &[]);
    let mut s = NbdSession::start();
    s.ok(&format!("open a {}", a.vol_uri()));
    s.ok("write a 0 65 4096 1");
    s.ok(&format!("open b {}", b.uri("vol")));
    assert_eq!(s.fill("b", 0, 4096), 65, "the standby reads A's write");

    a.signal(libc::SIGSTOP);
    let asked = Instant::now();
    let reply = s.cmd("write b 4096 66 4096 1");
    let waited = asked.elapsed();
    a.signal(libc::SIGCONT);
    assert!(
        reply.starts_with("err"),
        "the standby wrote while its holder was stopped: {reply}"
    );
    assert!(
        waited >= Duration::from_millis(2900) && waited < Duration::from_secs(6),
        "the standby's write failed after {waited:?}, not at its 3 s bound"
    );
    wait_log(&b, "not taken over from", Duration::from_secs(5));
    // The holder, running again, reads the request it was sent while
    // stopped and refuses it: the standby stopped waiting.
    wait_log(&a, "stopped waiting", Duration::from_secs(15));
    s.ok("write a 8192 67 4096 1");
    assert_eq!(s.fill("a", 0, 4096), 65);
    assert_eq!(s.fill("a", 8192, 4096), 67, "A lost the volume");
    assert!(
        !a.stderr().contains("volume handed over on request"),
        "A handed the volume over after its standby stopped waiting:\n{}",
        a.stderr()
    );
}

/// (c) The holder's host dies while a standby waits: the standby's write
/// takes the volume once the holder's liveness expires (TTL 3 s), and
/// every write the holder acknowledged a FLUSH for is there: with a
/// standby the holder uploads on FLUSH, so even its default local
/// durability loses nothing FLUSHed.
#[test]
fn a_standby_takes_over_from_a_dead_holder_without_losing_a_flushed_write() {
    let _serial = serial();
    let t = Instant::now();
    let tmp = tempfile::TempDir::new().unwrap();
    let store = S3Store::on_shared("standby-loss");
    let target = Target::strata_s3(&store, &["--lease-ttl-ms", "3000"]);
    let mut a = Server::start(&tmp.path().join("a"), target.clone(), &[("vol", VOL)]);
    let mut b = Server::start(&tmp.path().join("b"), target.clone(), &[]);
    let mut s = NbdSession::start();
    s.ok(&format!("open a {}", a.vol_uri()));
    s.ok(&format!("write a 0 65 {K64} 0"));
    s.ok(&format!("open b {}", b.uri("vol")));
    s.ok(&format!("write a {MIB} 66 {K64} 0"));
    s.ok("flush a");
    s.ok(&format!("write a {} 67 4096 1", 2 * MIB));
    // Written, not flushed: may be lost with A.
    s.ok(&format!("write a {} 68 4096 0", 3 * MIB));
    a.kill9();
    let killed = Instant::now();
    s.ok(&format!("write b {} 69 4096 1", 4 * MIB));
    let took = killed.elapsed();
    eprintln!("the standby took the volume {took:.1?} after its holder was killed (TTL 3 s)");
    assert!(
        took >= Duration::from_millis(1000) && took < Duration::from_secs(20),
        "the standby took the volume {took:?} after the kill, not once the 3 s liveness expired"
    );
    for (offset, len, byte) in [
        (0, K64, 65),
        (MIB, K64, 66),
        (2 * MIB, 4096, 67),
        (4 * MIB, 4096, 69),
    ] {
        assert_eq!(
            s.fill("b", offset, len),
            byte,
            "after the takeover at {offset}"
        );
    }
    let unflushed = s.cmd(&format!("read b {} 4096", 3 * MIB));
    eprintln!(
        "A's unflushed write after the takeover: {unflushed} (68 kept, 0 lost: both allowed)"
    );
    assert!(
        unflushed == "fill 68" || unflushed == "fill 0",
        "{unflushed}"
    );
    drop(s);
    b.stop();
    eprintln!("standby after host loss: {:.1?}", t.elapsed());
}

/// (c1) Holder and standby on different machines (the holder's control
/// socket out of reach, as on another host): the standby registers through
/// the holder's record (answered at its next renewal), and at its first
/// write asks through the record too; the holder, which looks at its
/// record every 200 ms while it has a standby, hands the lease straight
/// over, well before its next renewal.
#[test]
fn a_standby_on_another_machine_takes_over_through_the_store() {
    let _serial = serial();
    let tmp = tempfile::TempDir::new().unwrap();
    let store = S3Store::on_shared("standby-remote");
    // Renewals every 3 s: a take within 2.5 s came from a look.
    let target = Target::strata_s3(&store, &["--lease-ttl-ms", "9000"]);
    let a = Server::start(&tmp.path().join("a"), target.clone(), &[("vol", VOL)]);
    let mut b = Server::start(&tmp.path().join("b"), target.clone(), &[]);
    std::fs::remove_file(a.data_dir().join("control.sock")).unwrap();
    let mut s = NbdSession::start();
    s.ok(&format!("open a {}", a.vol_uri()));
    s.ok(&format!("write a 0 65 {K64} 0"));
    s.ok(&format!("open b {}", b.uri("vol")));
    wait_log(&b, "via=\"store\"", Duration::from_secs(5));
    s.ok(&format!("write a {MIB} 66 {K64} 0"));
    s.ok("flush a");
    assert_eq!(
        s.fill("b", MIB, K64),
        66,
        "the standby reads A's flushed write"
    );
    let asked = Instant::now();
    s.ok(&format!("write b {} 69 4096 1", 2 * MIB));
    let took = asked.elapsed();
    eprintln!("through the store, the standby took the volume in {took:.1?}");
    wait_log(&a, "transferred=true", Duration::from_secs(5));
    assert!(
        took < Duration::from_millis(2500),
        "the take waited {took:?}: the holder did not look at its record while it had a standby"
    );
    for (offset, len, byte) in [(0, K64, 65), (MIB, K64, 66), (2 * MIB, 4096, 69)] {
        assert_eq!(s.fill("b", offset, len), byte, "after the take at {offset}");
    }
    drop(s);
    b.stop();
}

/// (c2) The holder dies in the middle of handing the volume to its
/// standby (the process aborts at each step after the final checkpoint,
/// as kill -9 would stop it there): after the manifest carries the
/// standby's epoch but before the lease names it, the standby takes the
/// volume once the holder's liveness expires; after the lease names it, at
/// once (the lease is its own). Either way every write the holder
/// acknowledged a FLUSH for reads back, and the standby's first write
/// lands.
#[test]
fn a_holder_that_dies_while_handing_over_loses_no_flushed_write() {
    let _serial = serial();
    let tmp = tempfile::TempDir::new().unwrap();
    for (n, (point, expires_first)) in [
        ("handover.after_manifest", true),
        ("handover.after_lease", false),
    ]
    .into_iter()
    .enumerate()
    {
        let store = S3Store::on_shared(&format!("standby-crash-{n}"));
        let target = Target::strata_s3(&store, &["--lease-ttl-ms", "3000"]);
        let crashing = target.clone().with_env("STRATA_CRASH_AT", point);
        let dir = tmp.path().join(format!("{n}"));
        let a = Server::start(&dir.join("a"), crashing, &[("vol", VOL)]);
        let mut b = Server::start(&dir.join("b"), target.clone(), &[]);
        let mut s = NbdSession::start();
        s.ok(&format!("open a {}", a.vol_uri()));
        s.ok(&format!("write a 0 65 {K64} 0"));
        s.ok(&format!("open b {}", b.uri("vol")));
        s.ok(&format!("write a {MIB} 66 {K64} 0"));
        s.ok("flush a");
        s.ok(&format!("write a {} 67 4096 1", 2 * MIB));
        let asked = Instant::now();
        s.ok(&format!("write b {} 69 4096 1", 4 * MIB));
        let took = asked.elapsed();
        wait_log(
            &a,
            &format!("STRATA_CRASH_AT={point}"),
            Duration::from_secs(5),
        );
        eprintln!("{point}: the standby took the volume in {took:.1?} (TTL 3 s)");
        if expires_first {
            assert!(
                took >= Duration::from_millis(1000),
                "{point}: taken in {took:?}, before the dead holder's liveness expired"
            );
        } else {
            assert!(
                took < Duration::from_secs(3),
                "{point}: the lease named the standby, yet it waited {took:?}"
            );
        }
        for (offset, len, byte) in [
            (0, K64, 65),
            (MIB, K64, 66),
            (2 * MIB, 4096, 67),
            (4 * MIB, 4096, 69),
        ] {
            assert_eq!(s.fill("b", offset, len), byte, "{point}: at {offset}");
        }
        drop(s);
        b.stop();
        // What B left reads back from the store alone (fsck: every
        // segment and checkpoint readable, the map consistent).
        b.cli_ok(&["fsck", "vol"]);
    }
}

/// (d) Destinations that cannot use the store: a server whose credentials
/// the store refuses, and one whose store does not answer, never become a
/// standby; each says what is wrong in one line (a client connecting gets
/// no volume), and the holder keeps the volume and writes.
#[test]
fn destinations_that_cannot_use_the_store_are_refused_clearly() {
    let _serial = serial();
    let tmp = tempfile::TempDir::new().unwrap();
    let store = S3Store::on_shared("standby-bad");
    let target = Target::strata_s3(&store, &[]);
    let mut a = Server::start(&tmp.path().join("a"), target.clone(), &[("vol", VOL)]);
    let mut s = NbdSession::start();
    s.ok(&format!("open a {}", a.vol_uri()));
    s.ok("write a 0 65 4096 1");
    let cases = [
        (
            "wrong credentials",
            target
                .clone()
                .with_env("AWS_SECRET_ACCESS_KEY", "not-the-secret"),
            ["credential", "signature", "denied", "forbidden", "403"],
        ),
        (
            "an unreachable store",
            target
                .clone()
                .with_env("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
                .with_args(&["--store-attempts", "2"]),
            ["connect", "reach", "refused", "unreachable", "9"],
        ),
    ];
    for (i, (what, bad, words)) in cases.into_iter().enumerate() {
        let dir = tmp.path().join(format!("bad{i}"));
        let said = match Server::try_start(&dir, bad, &[]) {
            Err((st, stderr)) => {
                assert!(!st.success(), "{what}: {st}");
                stderr
            }
            Ok(mut server) => {
                // Started: a client of the volume must get nothing.
                let reply = s.cmd(&format!("open bad{i} {}", server.uri("vol")));
                assert!(
                    reply.starts_with("err"),
                    "{what}: a client got the volume: {reply}"
                );
                thread::sleep(Duration::from_millis(500));
                let log = server.stderr();
                server.stop();
                log
            }
        };
        let last = said
            .lines()
            .rev()
            .find(|l| l.contains("ERROR") || l.contains("error"))
            .unwrap_or("");
        eprintln!("{what}: {last}");
        let lower = last.to_lowercase();
        assert!(
            words.iter().any(|w| lower.contains(w)),
            "{what}: the error does not say what is wrong: {last}\n{said}"
        );
    }
    // The holder never noticed.
    s.ok("write a 4096 66 4096 1");
    assert_eq!(s.fill("a", 0, 4096), 65);
    assert_eq!(s.fill("a", 4096, 4096), 66);
    a.assert_alive();
    drop(s);
    a.stop();
}

/// (e) The holder's garbage collection under a standby's view: the
/// standby reads once (its view follows the first segments), the holder
/// then overwrites one region over 40 FLUSHes (40 segments: checkpoints
/// pass them) and collects garbage with a short grace (the early segments,
/// all overwritten, are deleted); the standby's next reads find the next
/// segment gone, start again from the checkpoint, and read the latest data.
#[test]
fn a_standby_follows_its_volume_through_garbage_collection() {
    let _serial = serial();
    let tmp = tempfile::TempDir::new().unwrap();
    let store = S3Store::on_shared("standby-gc");
    let holder = Target::strata_s3(&store, &["--gc-grace-ms", "200"]);
    let mut a = Server::start(&tmp.path().join("a"), holder, &[("vol", VOL)]);
    let mut b = Server::start(&tmp.path().join("b"), Target::strata_s3(&store, &[]), &[]);
    let mut s = NbdSession::start();
    s.ok(&format!("open a {}", a.vol_uri()));
    s.ok(&format!("write a 0 1 {K64} 0"));
    s.ok("flush a");
    s.ok(&format!("open b {}", b.uri("vol")));
    assert_eq!(s.fill("b", 0, K64), 1);
    for round in 2..=41u64 {
        s.ok(&format!("write a 0 {round} {K64} 0"));
        s.ok(&format!("write a {} {round} 4096 0", MIB + round * 4096));
        s.ok("flush a");
    }
    let out = a.cli(&["volume", "gc", "vol", "--wait"]);
    assert!(out.status.success(), "gc: {}", stderr_str(&out));
    eprintln!(
        "holder's gc: {}",
        stdout_str(&out).lines().next().unwrap_or("")
    );
    assert_eq!(
        s.fill("b", 0, K64),
        41,
        "the standby's view after the holder's GC"
    );
    for round in 2..=41u64 {
        assert_eq!(s.fill("b", MIB + round * 4096, 4096), round as u8);
    }
    let restarts = b.stderr().matches("following the volume again").count();
    eprintln!("the standby started its view again {restarts} times");
    assert!(
        restarts >= 1,
        "the holder's GC deleted what the standby's view had not read, yet the view never started again"
    );
    drop(s);
    b.stop();
    a.stop();
}
