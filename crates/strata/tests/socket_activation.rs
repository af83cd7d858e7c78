//! strata under systemd: the units in contrib/systemd verify and serve
//! through socket activation (`systemd-socket-activate`, the tool systemd
//! ships to run a service the way a socket unit does), a descriptor that is
//! not a listening socket is refused, and `Type=notify` readiness and
//! stopping notices reach `NOTIFY_SOCKET`.
//!
//! Restarts with the socket held across them (clients queue, nothing is
//! refused) are exercised under a running QEMU guest in qemu_guest.rs.

// Test helpers outside #[test] functions unwrap too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use common::clients::qemu_io;
use common::*;

fn contrib_systemd() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../contrib/systemd")
}

/// The values of `key=` lines of a unit file (comments skipped).
fn unit_values(unit: &str, key: &str) -> Vec<String> {
    let prefix = format!("{key}=");
    unit.lines()
        .map(str::trim)
        .filter_map(|line| line.strip_prefix(&prefix))
        .map(str::to_string)
        .collect()
}

#[test]
fn the_systemd_units_verify_and_serve_through_socket_activation() {
    let _serial = serial();
    require_tools(&[
        "systemd-analyze",
        "systemd-socket-activate",
        "qemu-io",
        "nbdinfo",
    ]);
    let tmp = tempfile::TempDir::new().unwrap();
    let dir = tmp.path();
    let socket_unit = std::fs::read_to_string(contrib_systemd().join("strata.socket")).unwrap();
    let service_unit = std::fs::read_to_string(contrib_systemd().join("strata.service")).unwrap();

    // The units as installed, with this build's binary.
    let units = dir.join("units");
    std::fs::create_dir_all(&units).unwrap();
    std::fs::write(units.join("strata.socket"), &socket_unit).unwrap();
    std::fs::write(
        units.join("strata.service"),
        service_unit.replace("/usr/local/bin/strata", strata_bin()),
    )
    .unwrap();
    let out = run_timeout(
        Command::new("systemd-analyze")
            .arg("verify")
            .arg(units.join("strata.socket"))
            .arg(units.join("strata.service")),
        Duration::from_secs(60),
    );
    assert!(
        out.status.success() && stderr_str(&out).trim().is_empty(),
        "systemd-analyze verify of contrib/systemd: {}\n{}",
        out.status,
        stderr_str(&out)
    );

    // Run the service's command the way the socket unit would: its first
    // ListenStream (moved into the test's directory) passed as fd 3.
    let listen = unit_values(&socket_unit, "ListenStream");
    assert_eq!(
        listen,
        ["/run/strata/nbd.sock"],
        "the unix socket of strata.socket"
    );
    let socket = dir.join("nbd.sock");
    let data_dir = dir.join("state");
    let exec = unit_values(&service_unit, "ExecStart");
    assert_eq!(exec, ["/usr/local/bin/strata serve"]);
    let env = unit_values(&service_unit, "Environment");
    assert_eq!(env, ["STRATA_DATA_DIR=/var/lib/strata"]);
    let data_env = env[0].replace("/var/lib/strata", data_dir.to_str().unwrap());
    let out = run_timeout(
        strata_command(None, &[])
            .arg("--data-dir")
            .arg(&data_dir)
            .args(["volume", "create", "vm", "--size", "64MiB"]),
        Duration::from_secs(60),
    );
    assert!(out.status.success(), "{}", stderr_str(&out));
    let mut service = BgProcess::spawn(
        "systemd-socket-activate",
        Command::new("systemd-socket-activate")
            .arg("-l")
            .arg(&socket)
            .arg("-E")
            .arg(&data_env)
            .arg(strata_bin())
            .arg("serve"),
    );
    wait_for_path(&socket, &service);
    // The first connection starts strata; it must be served.
    let uri = nbd_uri(&socket, "vm");
    let out = qemu_io(
        &uri,
        &[
            "write -P 0x5a 1M 64k".to_string(),
            "read -P 0x5a 1M 64k".to_string(),
        ],
    );
    assert!(
        out.status.success(),
        "qemu-io through the activated socket: {}{}\n--- service ---\n{}",
        stdout_str(&out),
        stderr_str(&out),
        service.stderr()
    );
    assert!(
        service.stdout().contains(&uri) && service.stdout().contains("ready"),
        "strata prints the socket it was given:\n{}",
        service.stdout()
    );
    assert!(
        service.stderr().contains("socket passed by systemd"),
        "{}",
        service.stderr()
    );
    // SIGTERM (systemctl stop): a clean stop, exit 0; the socket file is
    // the socket unit's, left in place.
    // SAFETY: plain kill(2) on our own child.
    unsafe { libc::kill(service.pid() as libc::pid_t, libc::SIGTERM) };
    let status = service.wait(STOP_TIMEOUT);
    assert!(status.success(), "{status}\n{}", service.stderr());
    assert!(socket.exists(), "strata removed systemd's socket file");
    assert!(
        service.stderr().contains("closed cleanly"),
        "{}",
        service.stderr()
    );
}

#[test]
fn tcp_sockets_are_served_through_socket_activation() {
    let _serial = serial();
    require_tools(&["systemd-socket-activate", "nbdinfo"]);
    let tmp = tempfile::TempDir::new().unwrap();
    let data_dir = tmp.path().join("data");
    let port = free_tcp_port();
    let mut service = BgProcess::spawn(
        "systemd-socket-activate",
        Command::new("systemd-socket-activate")
            .arg("-l")
            .arg(format!("127.0.0.1:{port}"))
            .arg(strata_bin())
            .arg("--data-dir")
            .arg(&data_dir)
            .args(["serve", "--create", "vm=16MiB"]),
    );
    let uri = format!("nbd://127.0.0.1:{port}/vm");
    let t0 = Instant::now();
    let out = loop {
        let out = run_timeout(
            Command::new("nbdinfo").arg("--size").arg(&uri),
            Duration::from_secs(60),
        );
        if out.status.success() || t0.elapsed() > READY_TIMEOUT {
            break out;
        }
        thread::sleep(Duration::from_millis(50));
    };
    assert!(
        out.status.success(),
        "{}\n--- service ---\n{}",
        stderr_str(&out),
        service.stderr()
    );
    assert_eq!(stdout_str(&out).trim(), (16 * MIB).to_string());
    assert!(service.stdout().contains(&uri), "{}", service.stdout());
    service.kill();
}

#[test]
fn a_passed_descriptor_that_is_not_a_socket_is_refused() {
    let _serial = serial();
    let tmp = tempfile::TempDir::new().unwrap();
    let file = tmp.path().join("not-a-socket");
    std::fs::write(&file, b"x").unwrap();
    let out = run_timeout(
        Command::new("sh")
            .arg("-c")
            .arg(r#"LISTEN_PID=$$ LISTEN_FDS=1 exec "$0" "$@" 3<"$NOT_A_SOCKET""#)
            .arg(strata_bin())
            .arg("--data-dir")
            .arg(tmp.path().join("data"))
            .arg("serve")
            .env("NOT_A_SOCKET", &file)
            .stdin(Stdio::null()),
        Duration::from_secs(60),
    );
    let err = stderr_str(&out);
    assert!(!out.status.success(), "strata served on a file:\n{err}");
    assert!(
        err.contains("file descriptor 3") && err.contains("LISTEN_FDS"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "one line:\n{err}");
}

/// `Type=notify`: READY=1 once `ready` is printed, STOPPING=1 on SIGTERM.
#[test]
fn readiness_and_stopping_are_notified() {
    let _serial = serial();
    let tmp = tempfile::TempDir::new().unwrap();
    let notify_path = tmp.path().join("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    notify
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let target = Target::strata().with_env("NOTIFY_SOCKET", notify_path.to_str().unwrap());
    let mut server = Server::start(&tmp.path().join("srv"), target, &[("vm", 16 * MIB)]);
    let mut buf = [0u8; 256];
    let n = notify.recv(&mut buf).expect("a READY=1 notice");
    assert_eq!(String::from_utf8_lossy(&buf[..n]).trim(), "READY=1");
    server.stop();
    let n = notify.recv(&mut buf).expect("a STOPPING=1 notice");
    assert_eq!(String::from_utf8_lossy(&buf[..n]).trim(), "STOPPING=1");
}

fn wait_for_path(path: &Path, process: &BgProcess) {
    let t0 = Instant::now();
    while !path.exists() {
        assert!(
            t0.elapsed() < READY_TIMEOUT,
            "{} never appeared:\n{}",
            path.display(),
            process.stderr()
        );
        thread::sleep(Duration::from_millis(20));
    }
}
