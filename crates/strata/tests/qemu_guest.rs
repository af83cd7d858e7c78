//! A QEMU guest whose root filesystem is a strata volume keeps running, with
//! no I/O error, while the host restarts strata under it (issue 13).
//!
//! The guest (TCG, no KVM): Debian's kernel and initrd from /boot, and an
//! ext4 root filesystem made here from busybox-static, with an init script
//! that writes 1 MiB files with fsync, records their checksums, drops its
//! page cache and verifies every file, round after round, until the host
//! says `stop` on a second serial port; a second writer rewrites another
//! file with fsync meanwhile, so requests are in flight at every event. The disk is virtio-blk over QEMU's
//! NBD client (`reconnect-delay=60`, `cache.direct=on`) on a unix socket
//! the harness holds and passes to each strata process as systemd does
//! (socket activation), so the guest's reconnects wait in its backlog.
//!
//! Under the guest, the host: stops strata cleanly three times (SIGTERM,
//! start again), kills it with -9 once (start again on the same data dir:
//! the journal replays), and moves the volume to a second strata process
//! with another data dir. After each event the guest must complete two
//! more rounds. At the end: no `FAIL` line, no I/O error or read-only
//! remount in the guest's kernel log, a final verification of every file,
//! and `e2fsck -fn` of the volume clean. The guest's console log is kept
//! (path in the failure message) when the test fails.
//!
//! Each event's hand-over time (the old server stops answering -> a new
//! connection is answered by the next one) is printed for the record, not
//! asserted (timings belong to the bench harness).

// Test helpers outside #[test] functions unwrap too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::Path;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use common::guest::*;
use common::*;

/// The guest's root filesystem.
const ROOT_SIZE_BYTES: u64 = 128 * MIB;

#[test]
fn guest_runs_through_restarts_a_kill_and_a_move() {
    let _serial = serial();
    require_tools(&[
        "qemu-system-x86_64",
        "mkfs.ext4",
        "e2fsck",
        "busybox",
        "nbdinfo",
    ]);
    let boot = GuestBoot::find();
    let tmp = tempfile::TempDir::new().unwrap();
    let dir = tmp.path();
    let image = make_root_image(dir, WRITE_VERIFY_INIT, ROOT_SIZE_BYTES);
    let mut server = Server::new_stopped(&dir.join("srv"), Target::strata());
    server.cli_ok(&["volume", "import", image.to_str().unwrap(), "vm"]);
    server.volumes = vec![("vm".to_string(), ROOT_SIZE_BYTES)];
    server.hold_socket();
    server.start_again();

    let mut guest = start_guest(&boot, &server.socket, dir);
    guest.wait_round(1, BOOT_TIMEOUT, "boot");
    let mut handovers = Vec::new();
    for n in 1..=3 {
        handovers.push(Event::CleanRestart.run(&mut server, dir));
        guest.next_rounds(&format!("clean restart {n}"));
    }
    handovers.push(Event::Kill9Restart.run(&mut server, dir));
    guest.next_rounds("kill -9 and restart");
    handovers.push(Event::MoveToNewDataDir.run(&mut server, dir));
    guest.next_rounds("move to another data dir");
    guest.stop_and_check();
    for line in &handovers {
        eprintln!("[handover] {line}");
    }

    server.stop();
    let exported = dir.join("exported.img");
    server.cli_ok(&["volume", "export", "vm", exported.to_str().unwrap()]);
    let out = run_timeout(
        Command::new("e2fsck").arg("-fn").arg(&exported),
        Duration::from_secs(120),
    );
    assert!(
        out.status.success(),
        "e2fsck -fn of the volume after the guest's run: {}\n{}{}",
        out.status,
        stdout_str(&out),
        stderr_str(&out)
    );
}

/// What the host does to strata under the running guest.
#[derive(Clone, Copy, Debug)]
enum Event {
    /// SIGTERM (a clean stop: replies to what was read, uploads, releases
    /// the lease), then a new process on the same data dir.
    CleanRestart,
    /// SIGKILL, then a new process on the same data dir (journal replay).
    Kill9Restart,
    /// SIGTERM, then a new process with a new, empty data dir.
    MoveToNewDataDir,
}

impl Event {
    /// Runs the event; returns a line with its hand-over time.
    fn run(self, server: &mut Server, dir: &Path) -> String {
        let uri = server.vol_uri();
        let mark = server.stderr().matches("shutting down").count();
        let t0 = Instant::now();
        let probe = match self {
            Event::CleanRestart | Event::MoveToNewDataDir => {
                server.signal(libc::SIGTERM);
                // Probe once the old server no longer accepts: its answer
                // then comes from the next process.
                wait_for_log(server, "shutting down", mark + 1);
                let probe = Probe::start(&uri, t0);
                let status = server.wait_exit(STOP_TIMEOUT);
                assert!(
                    status.is_some_and(|s| s.success()),
                    "{self:?}: strata did not stop cleanly: {status:?}\n{}",
                    server.last_stderr()
                );
                probe
            }
            Event::Kill9Restart => {
                server.kill9();
                Probe::start(&uri, t0)
            }
        };
        let stopped_ms = t0.elapsed().as_millis();
        if let Event::MoveToNewDataDir = self {
            server.set_data_dir(&dir.join("srv").join("data-moved"));
        }
        server.start_again();
        let ready_ms = t0.elapsed().as_millis();
        let answered_ms = probe.join().as_millis();
        format!(
            "{self:?}: old process gone after {stopped_ms} ms, new one ready after \
             {ready_ms} ms, first request answered after {answered_ms} ms"
        )
    }
}

/// Waits until `needle` appears `count` times in the server's stderr.
fn wait_for_log(server: &Server, needle: &str, count: usize) {
    let t0 = Instant::now();
    while server.stderr().matches(needle).count() < count {
        assert!(
            t0.elapsed() < STOP_TIMEOUT,
            "server never logged {needle:?}:\n{}",
            server.last_stderr()
        );
        thread::sleep(Duration::from_millis(5));
    }
}

/// A client that connects and asks for the export's size until it gets an
/// answer; the time from the event to that answer is the hand-over time.
struct Probe(thread::JoinHandle<Duration>);

impl Probe {
    fn start(uri: &str, t0: Instant) -> Probe {
        let uri = uri.to_string();
        Probe(thread::spawn(move || loop {
            let out = run_timeout(
                Command::new("nbdinfo").arg("--size").arg(&uri),
                Duration::from_secs(120),
            );
            if out.status.success() {
                return t0.elapsed();
            }
            assert!(
                t0.elapsed() < Duration::from_secs(300),
                "no answer on {uri} for 300 s: {}",
                stderr_str(&out)
            );
            thread::sleep(Duration::from_millis(10));
        }))
    }

    fn join(self) -> Duration {
        self.0.join().expect("probe thread")
    }
}

/// The guest, its root filesystem on virtio-blk over QEMU's NBD client.
fn start_guest(boot: &GuestBoot, socket: &Path, dir: &Path) -> Guest {
    let blockdev = format!(
        "driver=nbd,node-name=disk0,server.type=unix,server.path={},export=vm,\
         reconnect-delay=60,cache.direct=on",
        socket.display()
    );
    let machine: Vec<String> = [
        "-m",
        "256",
        "-smp",
        "1",
        "-blockdev",
        &blockdev,
        "-device",
        "virtio-blk-pci,drive=disk0",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    Guest::start(boot, dir, "qemu_guest", &machine)
}
