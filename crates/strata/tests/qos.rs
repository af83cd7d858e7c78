//! Per-volume QoS against real clients: fio held to an IOPS limit and to a
//! bandwidth limit within 5% over 10 s (after the burst), a burst served
//! at once after idling, `volume set-qos` taking effect on a served volume
//! within a second, limits kept across a restart on another host, and bad
//! specs refused in one line.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::*;
use std::process::Command;
use std::time::{Duration, Instant};

const VOL: u64 = 256 * MIB;

/// fio through libnbd on `uri`: `rw` with `bs` at `iodepth`, a 2 s ramp
/// (the bucket's burst spent) then `secs` measured; (IOPS, bytes/s).
fn fio_rate(
    tmp: &std::path::Path,
    uri: &str,
    rw: &str,
    bs: &str,
    iodepth: u32,
    secs: u32,
) -> (f64, f64) {
    let out_path = tmp.join("fio.json");
    let out = run_ok(
        Command::new("fio")
            .arg("--name=qos")
            .arg("--ioengine=nbd")
            .arg(format!("--uri={uri}"))
            .arg(format!("--rw={rw}"))
            .arg(format!("--bs={bs}"))
            .arg(format!("--iodepth={iodepth}"))
            .arg(format!("--size={VOL}"))
            .arg("--time_based")
            .arg("--ramp_time=2")
            .arg(format!("--runtime={secs}"))
            .arg("--output-format=json")
            .arg(format!("--output={}", out_path.display())),
        Duration::from_secs(u64::from(secs) + 60),
    );
    assert!(out.status.success(), "{}", stderr_str(&out));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out_path).unwrap()).unwrap();
    let dir = if rw.contains("read") { "read" } else { "write" };
    let j = &v["jobs"][0][dir];
    (j["iops"].as_f64().unwrap(), j["bw_bytes"].as_f64().unwrap())
}

fn within(what: &str, got: f64, limit: f64) {
    assert!(
        (got - limit).abs() <= limit * 0.05,
        "{what}: {got:.0} against a limit of {limit:.0} (over 5% off)"
    );
}

/// `/metrics` of a server started with `--metrics-listen 127.0.0.1:0`.
fn metrics_text(server: &Server) -> String {
    let addr = server
        .banner
        .iter()
        .find_map(|l| l.strip_prefix("metrics http://"))
        .expect("a metrics line before ready")
        .to_string();
    let out = run_ok(
        Command::new("curl").args(["-sf", &format!("http://{addr}")]),
        Duration::from_secs(30),
    );
    stdout_str(&out)
}

#[test]
fn fio_is_held_to_its_limits_and_set_qos_applies_live() {
    require_tools(&["fio"]);
    let _serial = serial();
    let tmp = tempfile::TempDir::new().unwrap();
    let target = Target::strata_with(&["--metrics-listen", "127.0.0.1:0"]);
    let mut server = Server::start(tmp.path(), target, &[("vol", VOL)]);
    let uri = server.vol_uri();
    server.cli_ok(&["volume", "set-qos", "vol", "iops=2000"]);
    let (iops, _) = fio_rate(tmp.path(), &uri, "randwrite", "4k", 32, 5);
    within("randwrite IOPS", iops, 2000.0);
    let (iops, _) = fio_rate(tmp.path(), &uri, "randread", "4k", 32, 5);
    within("randread IOPS", iops, 2000.0);
    server.cli_ok(&["volume", "set-qos", "vol", "write-bw=50MiB"]);
    let (_, bw) = fio_rate(tmp.path(), &uri, "write", "1M", 8, 5);
    within("write bytes/s", bw, (50 << 20) as f64);
    let info = server.cli_ok(&["volume", "info", "vol"]);
    assert!(info.contains("qos:         write-bw=50 MiB ("), "{info}");
    assert!(!info.contains("requests held back, 0.0 s"), "{info}");
    let m = metrics_text(&server);
    assert!(
        m.contains("strata_volume_qos_throttled_requests_total{volume=\"vol\"}"),
        "{m}"
    );

    // Lifted: well over the old limit.
    server.cli_ok(&["volume", "set-qos", "vol", "none"]);
    let (iops, _) = fio_rate(tmp.path(), &uri, "randwrite", "4k", 32, 3);
    assert!(iops > 4000.0, "no limit, yet {iops:.0} IOPS");

    // A change reaches a client already being held back within a second:
    // a 1 IOPS limit, a client queued behind it, then a high limit.
    server.cli_ok(&["volume", "set-qos", "vol", "iops=1"]);
    let writes: Vec<String> = (0..20)
        .map(|i| format!("write -P 7 {}k 4k", i * 4))
        .collect();
    let started = Instant::now();
    let uri2 = uri.clone();
    let client = std::thread::spawn(move || common::clients::qemu_io(&uri2, &writes));
    std::thread::sleep(Duration::from_millis(1500));
    server.cli_ok(&["volume", "set-qos", "vol", "iops=100000"]);
    let out = client.join().unwrap();
    assert!(out.status.success(), "{}", stderr_str(&out));
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(4),
        "20 writes took {took:?} after the limit was raised"
    );

    // Limits live in the volume: a server on another host applies them.
    server.cli_ok(&["volume", "set-qos", "vol", "iops=500"]);
    server.restart_on_new_host();
    let info = server.cli_ok(&["volume", "info", "vol"]);
    assert!(info.contains("qos:         iops=500"), "{info}");
    let (iops, _) = fio_rate(tmp.path(), &server.vol_uri(), "randwrite", "4k", 16, 5);
    within("IOPS on another host", iops, 500.0);
}

#[test]
fn a_burst_is_served_at_once_after_idling() {
    require_tools(&["qemu-io"]);
    let _serial = serial();
    let tmp = tempfile::TempDir::new().unwrap();
    let server = Server::start(tmp.path(), Target::strata(), &[("vol", VOL)]);
    server.cli_ok(&["volume", "set-qos", "vol", "iops=50,iops-burst=400"]);
    // 400 writes at once: the burst, not 8 s at 50 a second.
    let burst: Vec<String> = (0..400)
        .map(|i| format!("write -P 1 {}k 4k", i * 4))
        .collect();
    let started = Instant::now();
    let out = common::clients::qemu_io(&server.vol_uri(), &burst);
    assert!(out.status.success(), "{}", stderr_str(&out));
    let took = started.elapsed();
    assert!(took < Duration::from_secs(4), "the burst took {took:?}");
    // Spent: the next 100 take about 2 s.
    let more: Vec<String> = (0..100)
        .map(|i| format!("write -P 2 {}k 4k", i * 4))
        .collect();
    let started = Instant::now();
    let out = common::clients::qemu_io(&server.vol_uri(), &more);
    assert!(out.status.success(), "{}", stderr_str(&out));
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(1800),
        "100 writes over the rate took {took:?}"
    );
}

#[test]
fn bad_qos_specs_are_refused_in_one_line() {
    let _serial = serial();
    let tmp = tempfile::TempDir::new().unwrap();
    let server = Server::start(tmp.path(), Target::strata(), &[("vol", VOL)]);
    for (spec, says) in [
        ("iops=-1", "cannot be negative"),
        ("iops=0", "would stop the volume"),
        ("bw=10MiB,bw-burst=1MiB", "below"),
        ("latency=5", "unknown QoS key"),
    ] {
        let err = server.cli_err(&["volume", "set-qos", "vol", spec]);
        assert!(err.contains(says), "{spec}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{spec}: {err}");
        let err = server.cli_err(&["volume", "create", "other", "--size", "1GiB", "--qos", spec]);
        assert!(err.contains(says), "{spec}: {err}");
    }
    let info = server.cli_ok(&["volume", "info", "vol"]);
    assert!(info.contains("qos:         none"), "{info}");
}
