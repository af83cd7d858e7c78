//! Ownership per host (docs/design/ownership.md): one liveness object per
//! `strata serve` instead of one lease renewal per volume, and volumes that
//! move between hosts on request (`strata volume handover`).
//!
//! (a) Idle volumes send no store requests: a server with 8 volumes, each
//!     written a little and settled (sealed, uploaded), sends over an idle
//!     window of 6 renewal periods (--lease-ttl-ms 3000) at most one store
//!     request per renewal period plus 2 — independent of the volume count,
//!     where per-volume lease renewals would send 8 times that — and its
//!     host liveness renewals (`strata_host_liveness_renewals_total`) go on,
//!     counted among those store requests.
//! (b) Handover through the control socket (MinIO): server A holds a volume
//!     whose latest writes are only in its journal (no FLUSH, segments
//!     sealed only after 60 s); `volume handover --json` run for another
//!     data dir says it went through the control socket, names A, reports
//!     bytes uploaded; A then refuses new clients of the volume (it does not
//!     take it back), a server B on the other data dir opens it at once
//!     (well within the 30 s TTL), reads every byte A was written, and A's
//!     `volume info` names B as the holder.
//! (c) Handover through the store: the same with A's control socket file
//!     removed, so the request can only reach A through its host record:
//!     the command says "store", A answers at its next renewal (TTL 3 s),
//!     and B reads A's journal-only writes from MinIO.
//! (d) Upgrade: a version 1 lease as the previous release wrote it (fixture
//!     bytes built here, CRC32C by hand) is respected while live: a server
//!     refuses the volume naming its holder and pid and leaves the lease as
//!     it was, and `volume handover` says to stop that server (it cannot
//!     answer a request); once its 4 s TTL passed the server opens the
//!     volume and serves the data written before, holding it with a version
//!     2 lease; it then moves (`volume handover` to another data dir, where
//!     a server serves it), and a clean stop leaves a released version 1
//!     lease an older release can read. (This release changed no other
//!     format of the store: manifests, checkpoints and segments are the
//!     previous release's.)
//! (e) Fencing by partition: server A (--durability remote, TTL 2 s) is
//!     cut off from the store by the fault layer (`partition_file`: every
//!     request of A fails while the file exists) while a writer keeps 64
//!     FUA writes in flight to it; B, whose requests reach the store, takes
//!     the volume over past A's TTL and writes; the partition heals and A
//!     logs "fenced". A's last acknowledgement came before B's first (the
//!     writers stamp each with CLOCK_MONOTONIC), and every write either
//!     acknowledged reads back, through B and through a third server from
//!     the store alone.
//! (f) A handover racing writes: the same checks when B's host asks A to
//!     hand over (control socket) while A's writer has 64 plain writes in
//!     flight (--durability local: A's acknowledged writes are in its
//!     journal, which the handover uploads).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::clients::{pattern_reads, qemu_io_verify, write_patterns};
use common::crash_check::{
    check_region, parse_logs, spawn_race_writer, wait_log, WriterLog, NBLOCKS,
};
use common::*;
use std::path::Path;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const VOL: u64 = 64 * MIB;

fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

// ---------------------------------------------------------------------------
// /metrics
// ---------------------------------------------------------------------------

/// One scrape of `/metrics` (the classic text format).
fn scrape(addr: &str) -> String {
    let out = run_ok(
        Command::new("curl").args(["-sSf", &format!("http://{addr}/metrics")]),
        Duration::from_secs(30),
    );
    stdout_str(&out)
}

/// The samples of family `name` in a scrape: (labels text, value).
fn samples<'a>(text: &'a str, name: &str) -> Vec<(&'a str, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let labels = match series.split_once('{') {
                Some((n, rest)) if n == name => rest.trim_end_matches('}'),
                None if series == name => "",
                _ => return None,
            };
            Some((labels, value.parse().ok()?))
        })
        .collect()
}

/// The sum of every sample of family `name` (0 when it has none).
fn family_sum(text: &str, name: &str) -> f64 {
    samples(text, name).iter().map(|(_, v)| v).sum()
}

/// The sample of family `name` with exactly the labels text `labels`
/// (e.g. `volume="v0"`).
fn sample(text: &str, name: &str, labels: &str) -> Option<f64> {
    samples(text, name)
        .into_iter()
        .find(|(l, _)| *l == labels)
        .map(|(_, v)| v)
}

// ---------------------------------------------------------------------------
// (a) Idle volumes
// ---------------------------------------------------------------------------

#[test]
fn idle_volumes_send_no_store_requests() {
    let _serial = serial();
    let t = Instant::now();
    require_tools(&["qemu-io", "curl"]);
    let tmp = tempfile::TempDir::new().unwrap();
    let store = S3Store::on_shared("idle");
    const VOLUMES: usize = 8;
    const TTL_MS: u64 = 3000;
    let names: Vec<String> = (0..VOLUMES).map(|i| format!("v{i}")).collect();
    let ttl = TTL_MS.to_string();
    let mut args: Vec<&str> = vec![
        "--lease-ttl-ms",
        &ttl,
        // Settles fast: the open segment is sealed and uploaded 500 ms
        // after the last write.
        "--segment-age-ms",
        "500",
        "--metrics-listen",
        "127.0.0.1:0",
    ];
    for n in &names {
        args.extend(["--volume", n.as_str()]);
    }
    let target = Target::strata_s3(&store, &args);
    let volumes: Vec<(&str, u64)> = names.iter().map(|n| (n.as_str(), VOL)).collect();
    let mut server = Server::start(tmp.path(), target, &volumes);
    let addr = server.metrics_addr();

    for (i, n) in names.iter().enumerate() {
        let p = 0x30 + i as u8;
        write_patterns(
            &server.uri(n),
            &[(p, 0, 64 * KIB), (p, 3 * MIB + 7, 5000)],
            true,
        );
    }
    // Settled: every volume has uploaded its data and has nothing pending.
    let settle = Instant::now();
    loop {
        let m = scrape(&addr);
        let settled = names.iter().all(|n| {
            let v = format!("volume=\"{n}\"");
            sample(&m, "strata_volume_uploaded_segments_total", &v).unwrap_or(0.0) >= 1.0
                && sample(&m, "strata_volume_upload_pending_segments", &v) == Some(0.0)
                && sample(&m, "strata_volume_upload_pending_bytes", &v) == Some(0.0)
        });
        if settled {
            break;
        }
        assert!(
            settle.elapsed() < Duration::from_secs(30),
            "the volumes did not upload their writes within 30 s:\n{}",
            m.lines()
                .filter(|l| l.starts_with("strata_volume_upl"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        thread::sleep(Duration::from_millis(200));
    }
    // What follows an upload (manifest, checkpoint, a GC look) is done.
    thread::sleep(Duration::from_secs(2));
    eprintln!("settled {:.1?} after the writes", settle.elapsed());

    // The idle window.
    let before = scrape(&addr);
    let started = Instant::now();
    thread::sleep(Duration::from_secs(6));
    let after = scrape(&addr);
    let window = started.elapsed();
    server.assert_alive();

    // Every volume is still open (an idle, not a closed, volume).
    for n in &names {
        assert!(
            sample(
                &after,
                "strata_volume_lease_epoch",
                &format!("volume=\"{n}\"")
            )
            .is_some(),
            "volume {n} is not open on the server:\n{}",
            after
                .lines()
                .filter(|l| l.starts_with("strata_volume_lease"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    let by_op = |m: &str| -> Vec<(String, f64)> {
        samples(m, "strata_store_requests_total")
            .into_iter()
            .map(|(l, v)| (l.to_string(), v))
            .collect()
    };
    let deltas: Vec<String> = by_op(&after)
        .iter()
        .map(|(l, v)| {
            let b = by_op(&before)
                .iter()
                .find(|(bl, _)| bl == l)
                .map_or(0.0, |(_, bv)| *bv);
            format!("{l} +{}", v - b)
        })
        .collect();
    let requests = family_sum(&after, "strata_store_requests_total")
        - family_sum(&before, "strata_store_requests_total");
    let renewal_name = "strata_host_liveness_renewals_total";
    let renewals = family_sum(&after, renewal_name) - family_sum(&before, renewal_name);
    let period_ms = TTL_MS / 3;
    let periods = (window.as_millis() as u64).div_ceil(period_ms);
    let allowed = periods + 2;
    eprintln!(
        "idle window {window:.2?} ({periods} renewal periods of {period_ms} ms), {VOLUMES} open volumes: \
         {requests} store requests ({}), {renewals} host liveness renewals; allowed {allowed}",
        deltas.join(", ")
    );
    assert!(
        samples(&after, renewal_name).len() == 1,
        "no {renewal_name} in /metrics"
    );
    assert!(
        renewals >= 1.0,
        "the host liveness was not renewed during {window:.1?} (TTL {TTL_MS} ms)"
    );
    assert!(
        renewals + 2.0 >= periods as f64,
        "{renewals} host liveness renewals in {window:.1?}: one every {period_ms} ms expected"
    );
    assert!(
        requests >= renewals,
        "{requests} store requests counted for {renewals} renewals: renewals bypass the \
         counted store, so this test would not see per-volume traffic either"
    );
    assert!(
        requests <= allowed as f64,
        "{VOLUMES} idle volumes sent {requests} store requests in {window:.1?} ({}); a host \
         sends one renewal per {period_ms} ms whatever its volume count: at most {allowed}",
        deltas.join(", ")
    );
    server.stop();
    eprintln!("idle volumes: {:.1?}", t.elapsed());
}

// ---------------------------------------------------------------------------
// (b), (c) Handover
// ---------------------------------------------------------------------------

/// Data A is written before the handover: `flushed` reach A's journal
/// durably; `unflushed` are only written (the last overwrites part of the
/// first). What the volume then holds: `expected`.
const FLUSHED: [(u8, u64, u64); 2] = [(0x61, 0, MIB), (0x62, 5 * MIB + 3, 12345)];
const UNFLUSHED: [(u8, u64, u64); 2] = [(0x63, 16 * MIB, 2 * MIB), (0x64, 4096, 4096)];
const EXPECTED: [(u8, u64, u64); 6] = [
    (0x61, 0, 4096),
    (0x64, 4096, 4096),
    (0x61, 8192, MIB - 8192),
    (0x62, 5 * MIB + 3, 12345),
    (0x63, 16 * MIB, 2 * MIB),
    (0x00, 40 * MIB, 64 * KIB),
];

/// `strata volume handover vol --json` run for another data dir (the
/// server `asker`, not started); the parsed output.
fn handover(asker: &Server, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["volume", "handover", "vol", "--json"];
    args.extend(extra);
    let started = Instant::now();
    let out = asker.cli(&args);
    let took = started.elapsed();
    assert!(
        out.status.success(),
        "strata {args:?} failed ({}) after {took:.1?}:\n{}{}",
        out.status,
        stdout_str(&out),
        stderr_str(&out)
    );
    let v: serde_json::Value = serde_json::from_str(&stdout_str(&out))
        .unwrap_or_else(|e| panic!("handover --json is not JSON ({e}): {}", stdout_str(&out)));
    eprintln!("handover ({took:.1?} in all): {v}");
    v
}

/// A must not take the volume back after handing it over: a new client of
/// its export is refused, saying why (libnbd shows the server's message
/// only in its debug output).
fn assert_holder_refuses_new_clients(a: &Server) {
    let out = run_timeout(
        Command::new("nbdinfo")
            .env("LIBNBD_DEBUG", "1")
            .arg(a.vol_uri()),
        Duration::from_secs(60),
    );
    assert!(
        !out.status.success(),
        "a new client of A opened the volume A just handed over: {}",
        stdout_str(&out)
    );
    let err = stderr_str(&out);
    let said: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("server error message"))
        .collect();
    eprintln!(
        "new client of A after the handover: {}",
        said.first().unwrap_or(&"(no message)")
    );
    assert!(
        said.iter().any(|l| l.contains("handed over")),
        "A refused a new client without saying the volume was handed over: {said:#?}\n{}",
        err.lines()
            .filter(|l| !l.contains("libnbd: debug"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// After a handover to B: B reads everything A was written, and `volume
/// info` on A's data dir names B as the holder.
fn assert_moved(a: &mut Server, b: &Server) {
    qemu_io_verify(
        &b.vol_uri(),
        &pattern_reads(&EXPECTED),
        "through B after the handover",
    );
    let b_data = std::fs::canonicalize(b.data_dir()).unwrap();
    let info = a.cli_ok(&["volume", "info", "vol", "--json"]);
    let info: serde_json::Value = serde_json::from_str(&info).unwrap();
    let served_by = info["served_by"].as_str().unwrap_or_default().to_string();
    assert!(
        served_by.contains(&b_data.display().to_string()),
        "after the handover A's `volume info` says served_by {served_by:?}, not B ({})",
        b_data.display()
    );
    a.assert_alive();
}

/// A serving "vol" on `store`, written `FLUSHED` then `UNFLUSHED`.
fn holder_with_journal_data(dir: &Path, target: &Target) -> Server {
    let a = Server::start(dir, target.clone(), &[("vol", VOL)]);
    write_patterns(&a.vol_uri(), &FLUSHED, true);
    write_patterns(&a.vol_uri(), &UNFLUSHED, false);
    a
}

#[test]
fn handover_through_the_control_socket_moves_a_volume_at_once() {
    let _serial = serial();
    let t = Instant::now();
    require_tools(&["qemu-io", "nbdinfo"]);
    let tmp = tempfile::TempDir::new().unwrap();
    let store = S3Store::on_shared("handover-socket");
    // The default lease TTL (30 s): B opening "at once" is told from B
    // waiting for the TTL. Segments are sealed after 60 s only: what A was
    // written is in its journal, not the store, when it is asked.
    // `--standby off`: a client of A after the handover is refused rather
    // than served as a standby (standby.rs tests those).
    let target = Target::strata_s3(
        &store,
        &[
            "--volume",
            "vol",
            "--segment-age-ms",
            "60000",
            "--standby",
            "off",
        ],
    );
    let mut a = holder_with_journal_data(&tmp.path().join("a"), &target);
    let a_data = std::fs::canonicalize(a.data_dir()).unwrap();
    assert!(a.data_dir().join("control.sock").exists());

    let asker = Server::new_stopped(&tmp.path().join("b"), target.clone());
    let v = handover(&asker, &[]);
    let released = Instant::now();
    assert_eq!(v["volume"], "vol", "{v}");
    assert_eq!(v["via"], "control socket", "{v}");
    let holder = v["holder"].as_str().unwrap_or_default();
    assert!(
        holder.contains(&a_data.display().to_string())
            && holder.contains(&format!("pid {}", a.pid())),
        "the handover names {holder:?}, not A ({}, pid {})",
        a_data.display(),
        a.pid()
    );
    let report = &v["report"];
    assert_eq!(report["volume"], "vol", "{v}");
    assert_eq!(report["was_open"], true, "{v}");
    assert!(
        report["bytes_uploaded"].as_u64() > Some(0),
        "A uploaded nothing when it let go, yet its journal held writes: {v}"
    );
    let elapsed_ms = v["elapsed_ms"].as_u64().expect("elapsed_ms");
    assert!(
        elapsed_ms < 10_000,
        "the handover took {elapsed_ms} ms: {v}"
    );
    a.assert_alive();

    assert_holder_refuses_new_clients(&a);
    let b = Server::start(&tmp.path().join("b"), target.clone(), &[("vol", VOL)]);
    let took = released.elapsed();
    eprintln!("B ready {took:.1?} after the handover returned");
    assert!(
        took < Duration::from_secs(10),
        "B needed {took:.1?} to open a volume handed over to it (the lease TTL is 30 s)"
    );
    assert_moved(&mut a, &b);
    drop(b);
    a.stop();
    eprintln!("handover through the control socket: {:.1?}", t.elapsed());
}

#[test]
fn handover_through_the_store_reaches_a_holder_without_its_socket() {
    let _serial = serial();
    let t = Instant::now();
    require_tools(&["qemu-io", "nbdinfo"]);
    let tmp = tempfile::TempDir::new().unwrap();
    let store = S3Store::on_shared("handover-store");
    const TTL_MS: u64 = 3000;
    let target = Target::strata_s3(
        &store,
        &[
            "--volume",
            "vol",
            "--lease-ttl-ms",
            "3000",
            "--segment-age-ms",
            "60000",
            "--standby",
            "off",
        ],
    );
    let mut a = holder_with_journal_data(&tmp.path().join("a"), &target);
    let a_data = std::fs::canonicalize(a.data_dir()).unwrap();
    // Without its socket file A can be reached only through the store (the
    // handover uses the advertised socket only when its path exists).
    let socket = a.data_dir().join("control.sock");
    assert!(socket.exists(), "no control socket {}", socket.display());
    std::fs::remove_file(&socket).unwrap();

    let asker = Server::new_stopped(&tmp.path().join("b"), target.clone());
    let v = handover(&asker, &["--timeout-ms", "20000"]);
    assert_eq!(v["volume"], "vol", "{v}");
    assert_eq!(v["via"], "store", "{v}");
    assert!(v["report"].is_null(), "{v}");
    let holder = v["holder"].as_str().unwrap_or_default();
    assert!(
        holder.contains(&a_data.display().to_string()),
        "the handover names {holder:?}, not A ({})",
        a_data.display()
    );
    let elapsed_ms = v["elapsed_ms"].as_u64().expect("elapsed_ms");
    eprintln!(
        "through the store: released {elapsed_ms} ms after the request (renewal every {} ms)",
        TTL_MS / 3
    );
    // A finds the request at its next renewal (within TTL/3), then uploads
    // a few MiB to MinIO on this machine: seconds to spare.
    let bound_ms = 2 * TTL_MS / 3 + 3000;
    assert!(
        elapsed_ms < bound_ms,
        "the handover through the store took {elapsed_ms} ms (over {bound_ms} ms; A renews \
         every {} ms): {v}",
        TTL_MS / 3
    );
    a.assert_alive();

    assert_holder_refuses_new_clients(&a);
    let b = Server::start(&tmp.path().join("b"), target.clone(), &[("vol", VOL)]);
    assert_moved(&mut a, &b);
    drop(b);
    a.stop();
    eprintln!("handover through the store: {:.1?}", t.elapsed());
}

// ---------------------------------------------------------------------------
// (e), (f) Fencing: a partitioned holder, a handover racing writes
// ---------------------------------------------------------------------------

/// The acknowledgement times of writer logs: the old holder's last must
/// come before the new holder's first (one clock: `time.monotonic_ns()`).
fn assert_no_ack_after_takeover(old: &WriterLog, new: &WriterLog, what: &str) {
    let (Some(last_old), Some(first_new)) = (old.last_ack_ns, new.first_ack_ns) else {
        panic!(
            "{what}: no acknowledgement to compare (old holder {} acks, new holder {})",
            old.acks, new.acks
        );
    };
    eprintln!(
        "{what}: old holder {} acks ({} failed), its last {:.1} ms before the new holder's first \
         of {} acks",
        old.acks,
        old.failed,
        (first_new as f64 - last_old as f64) / 1e6,
        new.acks
    );
    assert!(
        last_old < first_new,
        "{what}: the old holder acknowledged a write {:.1} ms after the new holder served its \
         first",
        (last_old - first_new) as f64 / 1e6
    );
}

/// Every write acknowledged by either holder reads back, through `server`
/// and then through a third server with an empty data dir (the store
/// alone).
fn assert_every_ack_in_the_volume(tmp: &Path, target: &Target, log: &WriterLog, b: &mut Server) {
    let old_holders = log.acked.values().filter(|g| **g < NEW_HOLDER_GENS).count();
    assert!(
        old_holders > 100,
        "only {old_holders} blocks keep a write the old holder acknowledged: too few to check"
    );
    check_region(&b.vol_uri(), tmp, log, "through the new holder");
    b.stop();
    let mut c = Server::start(&tmp.join("c"), target.clone(), &[("vol", VOL)]);
    check_region(
        &c.vol_uri(),
        tmp,
        log,
        "through a third host, from the store alone",
    );
    c.stop();
}

/// Generations of the new holder's writer start above the old one's.
const NEW_HOLDER_GENS: u64 = 1 << 40;
/// The new holder writes over the second half of the old one's blocks
/// only: the first half keeps what the old holder acknowledged, to check.
const NEW_HOLDER_BLOCKS: std::ops::Range<u64> = NBLOCKS / 2..NBLOCKS;

#[test]
fn a_holder_cut_off_from_the_store_is_fenced_without_losing_an_acknowledged_write() {
    let _serial = serial();
    let t = Instant::now();
    let tmp = tempfile::TempDir::new().unwrap();
    let store = S3Store::on_shared("partition");
    const TTL_MS: u64 = 2000;
    // Remote durability: an acknowledged FUA write is in the store, so a
    // takeover that finds the holder silent keeps it (with local
    // durability it would stay in the cut-off host's journal).
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
    // A's store requests fail while `cut` exists; B's reach the store.
    let cut = tmp.path().join("cut");
    let a_target = target.clone().with_args(&[
        "--inject-faults",
        &format!("partition_file={}", cut.display()),
    ]);
    let mut a = Server::start(&tmp.path().join("a"), a_target, &[("vol", VOL)]);
    let (mut wa, wa_log) =
        spawn_race_writer(tmp.path(), &a.vol_uri(), "race-fua", 1, 0, 120, 0..NBLOCKS);
    wait_log(&mut wa, &wa_log, Duration::from_secs(60), |l| l.acks >= 200);

    // The partition: A can neither renew its liveness nor upload; its
    // writes in flight wait. Past its TTL B takes the volume over.
    std::fs::write(&cut, b"").unwrap();
    let cut_at = Instant::now();
    thread::sleep(Duration::from_millis(TTL_MS + TTL_MS / 2));
    let mut b = Server::start(&tmp.path().join("b"), target.clone(), &[("vol", VOL)]);
    eprintln!(
        "B took the volume over {:.1?} into A's partition",
        cut_at.elapsed()
    );
    let (mut wb, wb_log) = spawn_race_writer(
        tmp.path(),
        &b.vol_uri(),
        "race-fua",
        2,
        NEW_HOLDER_GENS,
        3,
        NEW_HOLDER_BLOCKS,
    );
    let st = wb.wait(Duration::from_secs(60));
    assert!(st.success(), "B's writer failed ({st}): {}", wb.stderr());

    // The partition heals: A must find out it lost the volume.
    std::fs::remove_file(&cut).unwrap();
    let healed = Instant::now();
    while !a.stderr().contains("fenced") {
        a.assert_alive();
        assert!(
            healed.elapsed() < Duration::from_secs(20),
            "A did not log \"fenced\" within 20 s of the partition healing\n{}",
            a.stderr()
        );
        thread::sleep(Duration::from_millis(50));
    }
    eprintln!(
        "A logged \"fenced\" {:.1?} after the partition healed",
        healed.elapsed()
    );
    let st = wa.wait(Duration::from_secs(60));
    let old = parse_logs(std::slice::from_ref(&wa_log));
    assert!(
        old.failed > 0 || old.error.is_some(),
        "A's writer saw no write fail ({st}), yet A lost the volume under it: {:?}",
        old.error
    );
    let new = parse_logs(std::slice::from_ref(&wb_log));
    assert_no_ack_after_takeover(&old, &new, "partition");
    let _ = a.stop_status(libc::SIGTERM);
    let both = parse_logs(&[wa_log, wb_log]);
    assert_every_ack_in_the_volume(tmp.path(), &target, &both, &mut b);
    eprintln!("partitioned holder: {:.1?}", t.elapsed());
}

#[test]
fn a_handover_racing_writes_keeps_every_acknowledged_write() {
    let _serial = serial();
    let t = Instant::now();
    let tmp = tempfile::TempDir::new().unwrap();
    let store = S3Store::on_shared("handover-race");
    // Local durability, plain writes: what A acknowledged is in its
    // journal (or memory) only, and the handover must upload all of it.
    let target = Target::strata_s3(&store, &["--volume", "vol", "--standby", "off"]);
    let mut a = Server::start(&tmp.path().join("a"), target.clone(), &[("vol", VOL)]);
    let (mut wa, wa_log) =
        spawn_race_writer(tmp.path(), &a.vol_uri(), "race", 1, 0, 120, 0..NBLOCKS);
    wait_log(&mut wa, &wa_log, Duration::from_secs(60), |l| {
        l.acks >= 2000
    });

    // B's host asks while A's writer has 64 writes in flight.
    let asker = Server::new_stopped(&tmp.path().join("b"), target.clone());
    let v = handover(&asker, &[]);
    assert_eq!(v["via"], "control socket", "{v}");
    let mut b = Server::start(&tmp.path().join("b"), target.clone(), &[("vol", VOL)]);
    let (mut wb, wb_log) = spawn_race_writer(
        tmp.path(),
        &b.vol_uri(),
        "race",
        2,
        NEW_HOLDER_GENS,
        3,
        NEW_HOLDER_BLOCKS,
    );
    let st = wb.wait(Duration::from_secs(60));
    assert!(st.success(), "B's writer failed ({st}): {}", wb.stderr());
    let st = wa.wait(Duration::from_secs(60));
    let old = parse_logs(std::slice::from_ref(&wa_log));
    assert!(
        !st.success() && (old.failed > 0 || old.error.is_some()),
        "A's writer went on writing ({st}) through a handover"
    );
    let new = parse_logs(std::slice::from_ref(&wb_log));
    assert_no_ack_after_takeover(&old, &new, "handover racing writes");
    assert_holder_refuses_new_clients(&a);
    a.stop();
    let both = parse_logs(&[wa_log, wb_log]);
    assert_every_ack_in_the_volume(tmp.path(), &target, &both, &mut b);
    eprintln!("handover racing writes: {:.1?}", t.elapsed());
}

// ---------------------------------------------------------------------------
// (d) Upgrade: a version 1 lease
// ---------------------------------------------------------------------------

/// CRC32C (Castagnoli, reflected), bit by bit: the fixture does not use
/// strata's code to build what strata must read.
fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// A lease object as the previous release wrote it: magic, version 1 (u16
/// LE), 2 zero bytes, body length (u32 LE), CRC32C of the body (u32 LE),
/// then the JSON body.
fn v1_lease(body: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(b"STRATLSE");
    b.extend_from_slice(&1u16.to_le_bytes());
    b.extend_from_slice(&[0, 0]);
    b.extend_from_slice(&(body.len() as u32).to_le_bytes());
    b.extend_from_slice(&crc32c(body).to_le_bytes());
    b.extend_from_slice(body);
    b
}

/// A lease object's envelope version and JSON body; checks its length and
/// CRC32C.
fn read_lease(path: &Path) -> (u16, serde_json::Value) {
    let b = std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    assert!(b.len() > 20 && &b[..8] == b"STRATLSE", "not a lease: {b:?}");
    let len = u32::from_le_bytes(b[12..16].try_into().unwrap()) as usize;
    assert_eq!(b.len(), 20 + len, "lease length");
    let crc = u32::from_le_bytes(b[16..20].try_into().unwrap());
    assert_eq!(crc32c(&b[20..]), crc, "lease CRC32C");
    let version = u16::from_le_bytes([b[8], b[9]]);
    (version, serde_json::from_slice(&b[20..]).unwrap())
}

/// What a server of the previous release needs in a lease to read it (its
/// struct: `holder`, `pid`, `renewed_unix_ms`, `ttl_ms` required).
fn assert_readable_by_the_previous_release(lease: &serde_json::Value) {
    assert!(lease["holder"].is_string(), "{lease}");
    assert!(
        lease["pid"]
            .as_u64()
            .is_some_and(|p| p <= u64::from(u32::MAX)),
        "{lease}"
    );
    assert!(lease["renewed_unix_ms"].is_u64(), "{lease}");
    assert!(lease["ttl_ms"].is_u64(), "{lease}");
}

#[test]
fn a_lease_of_the_previous_release_is_respected_then_taken() {
    let _serial = serial();
    let t = Instant::now();
    require_tools(&["qemu-io"]);
    assert_eq!(crc32c(b"123456789"), 0xE306_9283, "CRC32C check value");
    let tmp = tempfile::TempDir::new().unwrap();
    // The embedded store: objects are files, `<store>/<volume>/lease`.
    let target = Target::strata_with(&["--volume", "vol"]);
    let mut server = Server::start(tmp.path(), target, &[("vol", VOL)]);
    let ws = [(0x71, 0, MIB), (0x72, 9 * MIB + 5, 7777)];
    write_patterns(&server.vol_uri(), &ws, true);
    server.stop();
    let lease_path = server.store_dir().join("vol").join("lease");
    let (version, released) = read_lease(&lease_path);
    assert_eq!(version, 1, "a released lease is version 1: {released}");
    assert_eq!(released["released"], true, "{released}");
    assert_readable_by_the_previous_release(&released);
    let info = server.cli_ok(&["volume", "info", "vol", "--json"]);
    let info: serde_json::Value = serde_json::from_str(&info).unwrap();
    let epoch = info["epoch"].as_u64().expect("epoch");
    assert!(info["served_by"].is_null(), "{info}");

    // A server of the previous release holds the volume (it renews its
    // lease every 1.3 s, the TTL is 4 s) under the manifest's epoch.
    const OLD_TTL_MS: u64 = 4000;
    let renewed = now_unix_ms();
    let body = format!(
        r#"{{"holder":"oldhost:/var/lib/strata (0123456789ab)","pid":4242,"token":"t","epoch":{epoch},"renewed_unix_ms":{renewed},"ttl_ms":{OLD_TTL_MS},"released":false}}"#
    );
    let fixture = v1_lease(body.as_bytes());
    let staged = tmp.path().join("lease.v1");
    std::fs::write(&staged, &fixture).unwrap();
    std::fs::rename(&staged, &lease_path).unwrap();

    match server.try_start_again() {
        Ok(()) => {
            server.kill9();
            panic!(
                "the server opened volume vol {} ms after a server of the previous release \
                 renewed its lease (TTL {OLD_TTL_MS} ms)",
                now_unix_ms() - renewed
            );
        }
        Err((st, stderr)) => {
            let refused_after = now_unix_ms() - renewed;
            eprintln!(
                "refused {refused_after} ms into the old lease ({st}): {}",
                stderr.lines().last().unwrap_or("")
            );
            assert!(!st.success(), "{st}");
            assert!(
                stderr.contains("oldhost:/var/lib/strata") && stderr.contains("pid 4242"),
                "the refusal does not name the holder of the version 1 lease:\n{stderr}"
            );
            // It cannot be asked to let go: the refusal says to stop it.
            assert!(
                stderr.contains("stop that server") && !stderr.contains("volume handover"),
                "the refusal offers a handover an older release cannot answer:\n{stderr}"
            );
        }
    }
    // Such a holder cannot answer a handover request: the command says to
    // stop it (when it runs before the lease expires).
    let out = strata_cli(
        &server.store_dir(),
        &tmp.path().join("asker"),
        &["volume", "handover", "vol", "--json"],
    );
    let asked_after = now_unix_ms() - renewed;
    if asked_after < OLD_TTL_MS {
        let err = stderr_str(&out);
        eprintln!(
            "handover of a version 1 lease ({asked_after} ms in): {}",
            err.lines().last().unwrap_or("")
        );
        assert!(
            !out.status.success() && err.contains("stop that server") && err.contains("oldhost"),
            "`volume handover` of a volume a server of the previous release holds did not say \
             to stop it ({}):\n{}{err}",
            out.status,
            stdout_str(&out)
        );
    } else {
        eprintln!("handover of a version 1 lease not checked: it ran {asked_after} ms in");
    }
    assert_eq!(
        std::fs::read(&lease_path).unwrap(),
        fixture,
        "a refused server (or the handover command) changed the lease of the previous release"
    );

    // Its TTL passes without a renewal (the old server died): the volume
    // is taken with a version 2 lease and serves what was written.
    let free_at = renewed + OLD_TTL_MS + 300;
    thread::sleep(Duration::from_millis(free_at.saturating_sub(now_unix_ms())));
    server.start_again();
    qemu_io_verify(
        &server.vol_uri(),
        &pattern_reads(&ws),
        "after taking the volume from an expired version 1 lease",
    );
    let data = std::fs::canonicalize(server.data_dir()).unwrap();
    let (version, held) = read_lease(&lease_path);
    assert_eq!(version, 2, "the serving server's lease: {held}");
    assert_eq!(held["released"], false, "{held}");
    assert!(held["host"]["id"].is_string(), "{held}");
    assert!(
        held["holder"]
            .as_str()
            .is_some_and(|h| h.contains(&data.display().to_string())),
        "{held}"
    );
    assert_eq!(
        held["pid"].as_u64(),
        Some(u64::from(server.pid())),
        "{held}"
    );
    assert!(
        held["epoch"].as_u64().is_some_and(|e| e > epoch),
        "the new holder's epoch is not above the old one's ({epoch}): {held}"
    );
    let info = server.cli_ok(&["volume", "info", "vol", "--json"]);
    let info: serde_json::Value = serde_json::from_str(&info).unwrap();
    assert!(
        info["served_by"]
            .as_str()
            .is_some_and(|s| s.contains(&data.display().to_string()) && !s.contains("oldhost")),
        "{info}"
    );

    // The upgraded volume moves: another host asks for it, and a server on
    // that host's data dir serves it.
    let out = strata_cli(
        &server.store_dir(),
        &tmp.path().join("asker"),
        &["volume", "handover", "vol", "--json"],
    );
    assert!(
        out.status.success(),
        "handover of the upgraded volume failed ({}):\n{}",
        out.status,
        stderr_str(&out)
    );
    let v: serde_json::Value = serde_json::from_str(&stdout_str(&out)).unwrap();
    assert_eq!(v["via"], "control socket", "{v}");
    assert_eq!(v["report"]["was_open"], true, "{v}");
    server.stop();
    server.set_data_dir(&tmp.path().join("another-host"));
    server.start_again();
    qemu_io_verify(
        &server.vol_uri(),
        &pattern_reads(&ws),
        "on another host after a handover of the upgraded volume",
    );

    // A clean stop leaves a released version 1 lease (an older release may
    // open the volume again).
    server.stop();
    let (version, released) = read_lease(&lease_path);
    assert_eq!(version, 1, "the lease after a clean stop: {released}");
    assert_eq!(released["released"], true, "{released}");
    assert_readable_by_the_previous_release(&released);
    eprintln!("version 1 lease respected then taken: {:.1?}", t.elapsed());
}
