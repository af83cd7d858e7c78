//! A QEMU guest whose root filesystem is a strata volume served over
//! vhost-user-blk keeps running, with no I/O error, while the host
//! restarts strata under it and kills it with -9 with requests in flight;
//! a snapshot of the volume is served read-only beside it.
//!
//! The guest (TCG, 2 vCPUs, its 256 MiB of memory shared with the backend
//! as vhost-user needs): the kernel, initrd and busybox root filesystem of
//! qemu_guest.rs (tests/common/guest.rs), with an init script that writes
//! 1 MiB files with fsync, records their checksums, drops its page cache
//! and verifies every file, round after round. Meanwhile a second writer
//! rewrites another file with fsync and a reader pinned to each vCPU (so
//! to each queue) reads the disk directly, so requests of every kind are
//! in flight on both queues at every event. Its disks: /dev/vda, the
//! volume `vm`, and /dev/vdb, the snapshot `vm@base` taken before the
//! server started, both `vhost-user-blk-pci` with 2 queues, on sockets the
//! harness holds and passes to each strata process as systemd does
//! (socket activation, with the NBD socket: `LISTEN_FDS=3`); QEMU
//! reconnects every second (`reconnect=1`) and waits in the socket's
//! backlog while strata restarts.
//!
//! Under the guest, the host stops strata cleanly three times (SIGTERM,
//! start again: requests taken are returned before the connection
//! closes), then kills it with -9 and starts it again on the same data
//! dir. Before the kill a QoS write limit (`volume set-qos`) holds the
//! guest's writes in the backend, taken from the ring and not done, while
//! the readers' requests behind them on the same queue complete: the
//! kill always catches requests in flight with later ones already
//! returned. QEMU keeps the inflight area (VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD)
//! across the crash; the new process must resubmit exactly what the old
//! one had taken (it says so on stderr). Without the area QEMU resumes
//! the ring at the used index: returned requests run again and the ones
//! in flight never do, which the guest's kernel reports at once ("id N is
//! not a head") before its writers hang; that fails the test too.
//!
//! After each event the guest must complete two more rounds. It checks at
//! boot and at the end that /dev/vdb is read-only (a direct write fails
//! in the guest's kernel, nothing reaches the device) and reads as the
//! image the volume was made from. At the end: no `FAIL` line, no I/O
//! error or read-only remount in the guest's kernel log, a final
//! verification of every file, and `e2fsck -fn` of the volume clean. The
//! guest's console log is kept (path in the failure message) when the
//! test fails.
//!
//! Before the restarts, an online resize: `strata volume resize` through
//! the serving server; the guest must see the new size (strata sends
//! VHOST_USER_BACKEND_CONFIG_CHANGE_MSG, QEMU tells the guest), writes
//! 1 MiB past the old end, and every later verification (and the exported
//! volume) must read it back.
//!
//! Each event's hand-over time (the old process gone -> QEMU connected to
//! the new one) is printed for the record, not asserted.

// Test helpers outside #[test] functions unwrap too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::Path;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use common::guest::*;
use common::*;

/// The guest's root filesystem, and the volume's size until it grows.
const ROOT_SIZE_BYTES: u64 = 128 * MIB;
/// The volume's size after the online resize.
const GROWN_SIZE_BYTES: u64 = 192 * MIB;
/// Virtqueues of each disk (QEMU's num-queues; -smp 2 maps one per vCPU).
const QUEUES: u32 = 2;
/// The snapshot served on /dev/vdb.
const SNAPSHOT: &str = "base";
/// The write limit that holds requests in flight in the backend at the
/// kill -9: each takes about 1/WRITE_IOPS s to be admitted.
const KILL_WRITE_IOPS: &str = "write-iops=4";
/// Kills -9 at most, until one catches requests in flight.
const KILL_ATTEMPTS: usize = 3;

/// The guest's /sbin/init.
const GUEST_INIT: &str = r#"#!/bin/sh
# The guest of crates/strata/tests/vhost_guest.rs: writes and verifies files
# on /dev/vda until the host writes "stop" on the second serial port;
# checks the read-only snapshot disk /dev/vdb at boot and at the end.
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev 2>/dev/null
mount -o remount,rw /
say() { echo "STRATA-TEST $*"; }
fail() { echo "STRATA-TEST FAIL $*"; }
stty -F /dev/ttyS1 raw -echo 2>/dev/null
exec 3</dev/ttyS1
mkdir -p /data
# 1 MiB at the old end of the disk (past the filesystem), read directly.
grown_sum() {
    dd if=/dev/vda iflag=direct bs=64k skip=OLD_END_BLOCKS count=16 2>/dev/null \
        | md5sum | cut -d' ' -f1
}
verify() {
    echo 3 > /proc/sys/vm/drop_caches
    for sum in /data/*.md5; do
        [ -e "$sum" ] || continue
        (cd /data && md5sum -c -s "${sum##*/}") || fail "verify ${sum##*/} at $1"
    done
    if [ -e /data/grown.sum ]; then
        [ "$(grown_sum)" = "$(cat /data/grown.sum)" ] || fail "verify the grown part at $1"
    fi
}
# The snapshot disk: read-only (a direct write fails, nothing reaches the
# device), and what it reads.
snapshot() {
    if dd if=/dev/zero of=/dev/vdb bs=4k count=1 oflag=direct conv=notrunc 2>/tmp/ro.err; then
        fail "a direct write to the snapshot disk succeeded at $1"
        refused=no
    else
        refused=yes
    fi
    say "snapshot write error at $1: $(cat /tmp/ro.err)"
    sum=$(dd if=/dev/vdb iflag=direct bs=1M 2>/dev/null | md5sum | cut -d' ' -f1)
    say "snapshot $1 ro=$(cat /sys/block/vdb/ro) write-refused=$refused size=$(cat /sys/block/vdb/size) md5=$sum"
}
say booted
say "queues $(ls /sys/block/vda/mq | wc -l)"
boot_size=$(cat /sys/block/vda/size)
snapshot boot
# A second writer keeps requests in flight whenever the host acts.
(
    j=0
    while :; do
        j=$((j+1))
        dd if=/dev/urandom of=/data/load bs=64k count=16 conv=fsync 2>/dev/null \
            || fail "background write $j"
    done
) &
load=$!
# And a reader on each vCPU, so on each queue: while the host holds
# writes back (before its kill -9), reads taken after them complete
# first, so each queue has requests returned out of order around ones
# still in flight, which a restarted backend can only sort out with the
# inflight area (resuming at the used index would run returned requests
# again and never the ones in flight).
reader() {
    j=0
    while :; do
        j=$((j+1))
        dd if=/dev/vda iflag=direct of=/dev/null bs=4k count=256 \
            skip=$((RANDOM % (OLD_END_BLOCKS * 16 - 256))) 2>/dev/null || fail "background read $j"
    done
}
reader &
reader0=$!
taskset -p 1 $reader0 >/dev/null || fail "taskset reader 0"
reader &
reader1=$!
taskset -p 2 $reader1 >/dev/null || fail "taskset reader 1"
i=0
while :; do
    i=$((i+1))
    slot=$((i % 12))
    dd if=/dev/urandom of=/data/f$slot bs=64k count=16 conv=fsync 2>/tmp/dd.err \
        || { fail "write f$slot round $i"; cat /tmp/dd.err; }
    (cd /data && md5sum f$slot > f$slot.new && mv f$slot.new f$slot.md5) \
        || fail "checksum f$slot round $i"
    sync || fail "sync round $i"
    size=$(cat /sys/block/vda/size)
    say "size $size"
    if [ "$size" -gt "$boot_size" ] && [ ! -e /data/grown.sum ]; then
        dd if=/dev/urandom of=/tmp/grown bs=64k count=16 2>/dev/null
        dd if=/tmp/grown of=/dev/vda bs=64k seek=OLD_END_BLOCKS oflag=direct conv=notrunc,fsync \
            2>/tmp/dd.err || { fail "write the grown part round $i"; cat /tmp/dd.err; }
        md5sum < /tmp/grown | cut -d' ' -f1 > /data/grown.new && mv /data/grown.new /data/grown.sum
        sync
        say "grown part written md5=$(cat /data/grown.sum)"
    fi
    verify "round $i"
    grep -q ' / ext4 ro' /proc/mounts && fail "root filesystem read-only at round $i"
    say "round $i ok"
    if read -t 1 cmd <&3; then
        case "$cmd" in stop*) break;; esac
    fi
done
kill $load $reader0 $reader1
wait $load $reader0 $reader1 2>/dev/null
verify final
snapshot final
sync
errors=$(dmesg | grep -ciE 'KERNEL_ERROR_PATTERN')
say "kernel-errors $errors"
dmesg | grep -iE 'KERNEL_ERROR_PATTERN'
mount -o remount,ro / || fail "remount read-only"
say done
poweroff -f
"#;

#[test]
fn vhost_guest_sees_a_resize_and_runs_through_restarts_and_a_kill_and_reads_a_snapshot() {
    run_guest(true, "vhost_guest");
}

/// The scenario of the module doc; `grow`: with the online resize.
fn run_guest(grow: bool, name: &str) {
    let _serial = serial();
    require_tools(&[
        "qemu-system-x86_64",
        "mkfs.ext4",
        "e2fsck",
        "busybox",
        "md5sum",
    ]);
    let boot = GuestBoot::find();
    let tmp = tempfile::TempDir::new().unwrap();
    let dir = tmp.path();
    let old_end_blocks = (ROOT_SIZE_BYTES / (64 * KIB)).to_string();
    let init = GUEST_INIT.replace("OLD_END_BLOCKS", &old_end_blocks);
    let image = make_root_image(dir, &init, ROOT_SIZE_BYTES);
    let image_md5 = md5_of(&image, 0, ROOT_SIZE_BYTES);

    // The volume from the image, and its snapshot, before any server.
    let vhost_dir = dir.join("vhost");
    let snapshot_socket = dir.join("snap").join("vm-base.sock");
    std::fs::create_dir_all(&vhost_dir).unwrap();
    std::fs::create_dir_all(snapshot_socket.parent().unwrap()).unwrap();
    let volume_socket = vhost_dir.join("vm.sock");
    let target = Target::strata_with(&[
        "--vhost-user-dir",
        vhost_dir.to_str().unwrap(),
        "--vhost-user-socket",
        &format!("vm@{SNAPSHOT}={}", snapshot_socket.display()),
    ]);
    let mut server = Server::new_stopped(&dir.join("srv"), target);
    server.cli_ok(&["volume", "import", image.to_str().unwrap(), "vm"]);
    server.cli_ok(&["snapshot", "create", &format!("vm@{SNAPSHOT}")]);
    // Every socket is held here and passed to each process: the NBD one
    // (fd 3), then the two vhost-user ones, which strata recognises by
    // their paths.
    server.hold_socket();
    server.hold_extra_socket(&volume_socket);
    server.hold_extra_socket(&snapshot_socket);
    server.start_again();

    let mut guest = start_guest(&boot, dir, name, &volume_socket, &snapshot_socket);
    // What a ring out of step with the guest looks like (a request
    // returned twice: the queue is then broken), and the hang that
    // follows; both end the test at once rather than at a timeout.
    guest.also_fail_on(&["is not a head", "blocked for more than"]);
    guest.wait_round(1, BOOT_TIMEOUT, "boot");
    let log = guest.log();
    if !log.contains(&format!("STRATA-TEST queues {QUEUES}")) {
        guest.fail(&format!(
            "the guest's /dev/vda does not have {QUEUES} queues"
        ));
    }
    check_snapshot(&guest, "boot", &image_md5);

    if grow {
        grow_volume(&mut server, &mut guest);
    }

    let mut handovers = Vec::new();
    for n in 1..=3 {
        handovers.push(Event::CleanRestart.run(&mut server, &guest));
        guest.rounds_after_event(&format!("clean restart {n}"));
    }
    // Killed until one kill catches requests in flight (the first one
    // does, as a rule: see `hold_writes_in_flight`).
    let mut caught = false;
    for attempt in 1..=KILL_ATTEMPTS {
        handovers.push(Event::Kill9Restart.run(&mut server, &guest));
        // The queues start right after the frontend connects; the first
        // thing a queue does is resubmit what the inflight area holds.
        caught = wait_for_stderr(&server, RESUBMITTED, Duration::from_secs(30));
        // Back to no limit (it is kept in the manifest) for the rounds.
        server.cli_ok(&["volume", "set-qos", "vm", "none"]);
        guest.rounds_after_event(&format!("kill -9 and restart ({attempt})"));
        if caught {
            for line in server
                .last_stderr()
                .lines()
                .filter(|l| l.contains(RESUBMITTED))
            {
                eprintln!("[harness] after kill -9 {attempt}: {}", line.trim());
            }
            break;
        }
        eprintln!("[harness] kill -9 {attempt} caught no request in flight");
    }
    if !caught {
        guest.fail(&format!(
            "after {KILL_ATTEMPTS} kills -9, the new strata never resubmitted anything: no \
             request was in flight, or the inflight area was not used; its stderr:\n{}",
            server.last_stderr()
        ));
    }

    guest.stop_and_check();
    check_snapshot(&guest, "final", &image_md5);
    for line in &handovers {
        eprintln!("[handover] {line}");
    }

    server.stop();
    // Every request came back done: none failed or was refused in any of
    // the processes (the write to the snapshot never reached one).
    let refused: Vec<String> = server
        .stderr()
        .lines()
        .filter(|l| l.contains(": vhost-user-blk "))
        .map(str::to_string)
        .collect();
    assert!(
        refused.is_empty(),
        "strata refused or failed requests:\n{}",
        refused.join("\n")
    );
    let exported = dir.join("exported.img");
    server.cli_ok(&["volume", "export", "vm", exported.to_str().unwrap()]);
    let log = guest.log();
    if !grow {
        return e2fsck(&exported);
    }
    let written = log
        .lines()
        .find_map(|l| l.trim().strip_prefix("STRATA-TEST grown part written md5="))
        .unwrap_or_else(|| guest.fail("the guest never wrote the grown part"))
        .to_string();
    let stored = md5_of(&exported, ROOT_SIZE_BYTES, MIB);
    assert_eq!(
        stored, written,
        "the volume's 1 MiB at the old end is not what the guest wrote there"
    );
    e2fsck(&exported);
}

/// Asserts `e2fsck -fn` finds the exported volume's filesystem clean.
fn e2fsck(exported: &Path) {
    let out = run_timeout(
        Command::new("e2fsck").arg("-fn").arg(exported),
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

/// The guest with /dev/vda on `volume` and /dev/vdb on `snapshot`, both
/// vhost-user-blk with [`QUEUES`] queues, QEMU reconnecting every second
/// when the backend goes.
fn start_guest(boot: &GuestBoot, dir: &Path, name: &str, volume: &Path, snapshot: &Path) -> Guest {
    let mut machine: Vec<String> = [
        "-m",
        "256",
        "-smp",
        "2",
        // vhost-user: the backend maps the guest's memory.
        "-object",
        "memory-backend-memfd,id=mem,size=256M,share=on",
        "-numa",
        "node,memdev=mem",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for (id, socket) in [("c0", volume), ("c1", snapshot)] {
        machine.push("-chardev".into());
        machine.push(format!(
            "socket,id={id},path={},reconnect=1",
            socket.display()
        ));
        machine.push("-device".into());
        machine.push(format!(
            "vhost-user-blk-pci,chardev={id},num-queues={QUEUES}"
        ));
    }
    Guest::start(boot, dir, name, &machine)
}

/// Asserts what the guest found of the snapshot disk at `when`: read-only,
/// a direct write refused, the image's size and bytes.
fn check_snapshot(guest: &Guest, when: &str, image_md5: &str) {
    let log = guest.log();
    let prefix = format!("STRATA-TEST snapshot {when} ");
    let Some(line) = log.lines().find_map(|l| l.trim().strip_prefix(&prefix)) else {
        guest.fail(&format!(
            "the guest did not check the snapshot disk at {when}"
        ));
    };
    let expected = format!(
        "ro=1 write-refused=yes size={} md5={image_md5}",
        ROOT_SIZE_BYTES / 512
    );
    if line != expected {
        guest.fail(&format!(
            "the snapshot disk at {when}: {line}, expected {expected}"
        ));
    }
    let why = log
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix(&format!("STRATA-TEST snapshot write error at {when}: "))
        })
        .unwrap_or_default();
    eprintln!("[guest] snapshot disk at {when}: {line} (the write: {why})");
}

/// Grows the volume under the running guest; waits until the guest sees
/// the new size and has written past the old end.
fn grow_volume(server: &mut Server, guest: &mut Guest) {
    server.cli_ok(&[
        "volume",
        "resize",
        "vm",
        "--size",
        &size_arg(GROWN_SIZE_BYTES),
    ]);
    let sectors = GROWN_SIZE_BYTES / 512;
    let seen = format!("STRATA-TEST size {sectors}");
    let t0 = Instant::now();
    loop {
        let log = guest.log();
        guest.check_log(&log);
        if log.contains(&seen) && log.contains("STRATA-TEST grown part written") {
            break;
        }
        if t0.elapsed() > ROUNDS_TIMEOUT {
            guest.fail(&format!(
                "the guest did not see the volume grow to {sectors} sectors within \
                 {ROUNDS_TIMEOUT:?} (strata tells QEMU with a configuration-change \
                 message; it logs when it cannot); its stderr:\n{}",
                server.last_stderr()
            ));
        }
        thread::sleep(Duration::from_millis(200));
    }
    let log = guest.log();
    let notice = log
        .lines()
        .find(|l| l.contains("new size") && l.contains(&sectors.to_string()))
        .unwrap_or("(no kernel notice)");
    eprintln!("[guest] grew to {sectors} sectors: {}", notice.trim());
    guest.rounds_after_event("grown");
}

/// What the host does to strata under the running guest.
#[derive(Clone, Copy, Debug)]
enum Event {
    /// SIGTERM (a clean stop: requests taken are returned first), then a
    /// new process on the same data dir.
    CleanRestart,
    /// SIGKILL with writes held in flight, then a new process on the same
    /// data dir (journal replay; the frontend's inflight area says what to
    /// resubmit).
    Kill9Restart,
}

impl Event {
    /// Runs the event; returns a line with its hand-over time.
    fn run(self, server: &mut Server, guest: &Guest) -> String {
        if let Event::Kill9Restart = self {
            hold_writes_in_flight(server);
        }
        let t0 = Instant::now();
        match self {
            Event::CleanRestart => server.stop(),
            Event::Kill9Restart => server.kill9(),
        }
        let stopped_ms = t0.elapsed().as_millis();
        server.start_again();
        let ready_ms = t0.elapsed().as_millis();
        // Both disks reconnect (QEMU retries every second).
        let connected = wait_connected(server, guest, 2);
        format!(
            "{self:?}: old process gone after {stopped_ms} ms, new one ready after \
             {ready_ms} ms, both frontends connected after {} ms",
            (connected - t0).as_millis()
        )
    }
}

/// Sets a write limit low enough that the guest's writes wait in the
/// backend (taken from the ring, not yet done) while the readers' requests
/// behind them complete, and leaves it a few seconds to be so, so that
/// the kill -9 catches requests in flight with later ones returned.
fn hold_writes_in_flight(server: &Server) {
    server.cli_ok(&["volume", "set-qos", "vm", KILL_WRITE_IOPS]);
    // The limit applies to requests from now on; the guest's writers
    // never pause for long, so a few seconds of it leave some waiting.
    thread::sleep(Duration::from_secs(5));
}

/// What strata logs when a queue starts with requests a previous backend
/// had taken (found in the frontend's inflight area).
const RESUBMITTED: &str = "resubmitting the requests a previous backend had taken";

/// Waits up to `timeout` until the running server logged `needle` since
/// its start.
fn wait_for_stderr(server: &Server, needle: &str, timeout: Duration) -> bool {
    let t0 = Instant::now();
    while !server.last_stderr().contains(needle) {
        if t0.elapsed() > timeout {
            return false;
        }
        thread::sleep(Duration::from_millis(50));
    }
    true
}

/// Waits until the running server logged `count` frontend connections
/// since its start; returns when.
fn wait_connected(server: &Server, guest: &Guest, count: usize) -> Instant {
    let t0 = Instant::now();
    loop {
        let seen = server
            .last_stderr()
            .matches("vhost-user frontend connected")
            .count();
        if seen >= count {
            return Instant::now();
        }
        if t0.elapsed() > ROUNDS_TIMEOUT {
            guest.fail(&format!(
                "QEMU did not reconnect to the new strata within {ROUNDS_TIMEOUT:?} ({seen} \
                 of {count} frontends); its stderr:\n{}",
                server.last_stderr()
            ));
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// The MD5 (hex) of `len` bytes of `file` from `offset`, both multiples
/// of 64 KiB.
fn md5_of(file: &Path, offset: u64, len: u64) -> String {
    let block = 64 * KIB;
    let out = run_ok(
        Command::new("sh")
            .arg("-c")
            .arg(r#"dd if="$0" bs=64k skip="$1" count="$2" status=none | md5sum"#)
            .arg(file)
            .arg((offset / block).to_string())
            .arg((len / block).to_string()),
        Duration::from_secs(120),
    );
    stdout_str(&out)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}
