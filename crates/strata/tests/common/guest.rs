//! A QEMU guest (TCG, no KVM) that boots from a disk served by strata and
//! reports on its first serial port, for the guest tests (qemu_guest.rs
//! over NBD, vhost_guest.rs over vhost-user-blk).
//!
//! The guest: Debian's kernel and initrd from /boot ([`GuestBoot`]) and an
//! ext4 root filesystem made here from busybox-static with the test's
//! init script ([`make_root_image`]). The script prints `STRATA-TEST ...`
//! lines on the console (`round N ok` after each round, `FAIL ...` on any
//! failure) and stops when the host writes `stop` on the second serial
//! port ([`Guest::stop_and_check`]).

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use super::{run_ok, BgProcess, MIB};

/// Rounds the guest must complete after each host event.
pub const ROUNDS_PER_EVENT: u64 = 2;
/// How long the guest may take to boot (TCG on a busy 2-core machine).
pub const BOOT_TIMEOUT: Duration = Duration::from_secs(240);
/// How long the guest may take for `ROUNDS_PER_EVENT` rounds, an event
/// included.
pub const ROUNDS_TIMEOUT: Duration = Duration::from_secs(240);
/// Kernel log lines that mean the guest saw a failed request. An init
/// script gets it where it says `KERNEL_ERROR_PATTERN` (grep -E syntax).
pub const KERNEL_ERROR_PATTERN: &str = "I/O error|Buffer I/O|EXT4-fs error|EXT4-fs warning|\
Remounting filesystem read-only|blk_update_request|print_req_error|critical medium error|\
Aborting journal";

/// The guest's kernel and initrd: Debian's newest in /boot.
pub struct GuestBoot {
    pub kernel: PathBuf,
    pub initrd: PathBuf,
}

impl GuestBoot {
    pub fn find() -> GuestBoot {
        let mut kernels: Vec<PathBuf> = std::fs::read_dir("/boot")
            .map(|entries| {
                entries
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| {
                        p.file_name()
                            .and_then(|n| n.to_str())
                            .is_some_and(|n| n.starts_with("vmlinuz-"))
                    })
                    .collect()
            })
            .unwrap_or_default();
        kernels.sort();
        let kernel = kernels.pop().unwrap_or_else(|| {
            panic!("no /boot/vmlinuz-*: run scripts/install-test-deps (linux-image-amd64)")
        });
        let version = kernel
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix("vmlinuz-"))
            .unwrap_or_default()
            .to_string();
        let initrd = PathBuf::from(format!("/boot/initrd.img-{version}"));
        assert!(
            initrd.is_file(),
            "{} has no initrd {}: run update-initramfs -c -k {version}",
            kernel.display(),
            initrd.display()
        );
        GuestBoot { kernel, initrd }
    }
}

/// An ext4 image (`DIR/root.img`, `size_bytes`) of a busybox root
/// filesystem whose /sbin/init is `init` (with [`KERNEL_ERROR_PATTERN`]
/// filled in).
pub fn make_root_image(dir: &Path, init: &str, size_bytes: u64) -> PathBuf {
    let busybox = which("busybox");
    let ldd = Command::new("ldd").arg(&busybox).output();
    assert!(
        ldd.is_ok_and(
            |o| !o.status.success() || String::from_utf8_lossy(&o.stdout).contains("not a dynamic")
        ),
        "{} is dynamically linked: install busybox-static",
        busybox.display()
    );
    let root = dir.join("root");
    for sub in ["bin", "sbin", "proc", "sys", "dev", "tmp", "data", "etc"] {
        std::fs::create_dir_all(root.join(sub)).unwrap();
    }
    std::fs::copy(&busybox, root.join("bin/busybox")).unwrap();
    let applets = Command::new(&busybox).arg("--list").output().unwrap();
    for applet in String::from_utf8_lossy(&applets.stdout).split_whitespace() {
        let link = root.join("bin").join(applet);
        if !link.exists() {
            std::os::unix::fs::symlink("busybox", link).unwrap();
        }
    }
    let init_path = root.join("sbin/init");
    let pattern = KERNEL_ERROR_PATTERN.replace('\n', "");
    std::fs::write(&init_path, init.replace("KERNEL_ERROR_PATTERN", &pattern)).unwrap();
    std::fs::set_permissions(
        &init_path,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let image = dir.join("root.img");
    run_ok(
        Command::new("mkfs.ext4")
            .args(["-q", "-F", "-d"])
            .arg(&root)
            .arg(&image)
            .arg(format!("{}M", size_bytes / MIB)),
        Duration::from_secs(60),
    );
    image
}

/// What is wrong in a guest's console log: a `FAIL` line, or a kernel
/// error ([`KERNEL_ERROR_PATTERN`] or one of `extra`).
pub fn console_error(log: &str, extra: &[&str]) -> Option<String> {
    if let Some(line) = log.lines().find(|l| l.contains("STRATA-TEST FAIL")) {
        return Some(format!("the guest failed: {line}"));
    }
    let mut errors: Vec<&str> = KERNEL_ERROR_PATTERN.split('|').collect();
    errors.extend(extra);
    log.lines()
        .find(|l| !l.contains("STRATA-TEST") && errors.iter().any(|e| l.contains(e)))
        .map(|line| format!("the guest's kernel reported an error: {line}"))
}

pub fn which(tool: &str) -> PathBuf {
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join(tool))
                .find(|p| p.is_file())
        })
        .unwrap_or_else(|| panic!("{tool} not in PATH: run scripts/install-test-deps"))
}

/// The running guest: QEMU, its console log and its control port.
pub struct Guest {
    pub qemu: BgProcess,
    console: PathBuf,
    control: UnixStream,
    /// The last round the host has seen completed.
    pub round: u64,
    /// Where the console log is copied when the test fails.
    kept_log: PathBuf,
    /// Console lines that fail the test besides [`KERNEL_ERROR_PATTERN`]'s.
    extra_errors: Vec<&'static str>,
}

impl Guest {
    /// Starts QEMU on `boot` with the root filesystem on /dev/vda;
    /// `machine` are the arguments that differ between tests (memory,
    /// vCPUs, disks). The console log is `DIR/console.log`, kept as
    /// `<target tmp dir>/<name>-console.log` when the test fails.
    pub fn start(boot: &GuestBoot, dir: &Path, name: &str, machine: &[String]) -> Guest {
        let console = dir.join("console.log");
        let control_path = dir.join("control.sock");
        let qemu = BgProcess::spawn(
            "qemu",
            Command::new("qemu-system-x86_64")
                .args(["-machine", "q35,accel=tcg"])
                .args(machine)
                .args(["-nodefaults", "-display", "none", "-no-reboot"])
                .arg("-kernel")
                .arg(&boot.kernel)
                .arg("-initrd")
                .arg(&boot.initrd)
                .args([
                    "-append",
                    "console=ttyS0 root=/dev/vda rw init=/sbin/init panic=-1",
                ])
                .arg("-serial")
                .arg(format!("file:{}", console.display()))
                .arg("-chardev")
                .arg(format!(
                    "socket,id=control,path={},server=on,wait=off",
                    control_path.display()
                ))
                .args(["-serial", "chardev:control"]),
        );
        let t0 = Instant::now();
        let control = loop {
            match UnixStream::connect(&control_path) {
                Ok(stream) => break stream,
                Err(error) => {
                    assert!(
                        t0.elapsed() < Duration::from_secs(30),
                        "QEMU's control port {}: {error}\n{}",
                        control_path.display(),
                        qemu.stderr()
                    );
                    thread::sleep(Duration::from_millis(50));
                }
            }
        };
        let kept_log =
            PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-console.log"));
        Guest {
            qemu,
            console,
            control,
            round: 0,
            kept_log,
            extra_errors: Vec::new(),
        }
    }

    /// Console lines containing any of `errors` fail the test too.
    pub fn also_fail_on(&mut self, errors: &[&'static str]) {
        self.extra_errors.extend_from_slice(errors);
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.console).unwrap_or_default()
    }

    /// Fails the test with the guest's log (kept at `kept_log`).
    pub fn fail(&self, why: &str) -> ! {
        let log = self.log();
        let _ = std::fs::write(&self.kept_log, &log);
        let tail: String = log
            .lines()
            .rev()
            .take(60)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n");
        panic!(
            "{why}\nguest console log kept at {}; its end:\n{tail}\nQEMU stderr:\n{}",
            self.kept_log.display(),
            self.qemu.stderr()
        );
    }

    /// Fails on any `FAIL` line or kernel error the guest printed.
    pub fn check_log(&self, log: &str) {
        if let Some(why) = console_error(log, &self.extra_errors) {
            self.fail(&why);
        }
    }

    /// The highest round the guest reported complete.
    pub fn last_round(log: &str) -> u64 {
        log.lines()
            .filter_map(|l| l.trim().strip_prefix("STRATA-TEST round "))
            .filter_map(|rest| rest.strip_suffix(" ok")?.parse().ok())
            .max()
            .unwrap_or(0)
    }

    /// Waits until the guest completed round `round`.
    pub fn wait_round(&mut self, round: u64, timeout: Duration, what: &str) {
        let t0 = Instant::now();
        loop {
            let log = self.log();
            self.check_log(&log);
            let last = Guest::last_round(&log);
            if last >= round {
                eprintln!("[guest] round {last} done ({what}, {:.1?})", t0.elapsed());
                self.round = last;
                return;
            }
            if t0.elapsed() > timeout {
                self.fail(&format!(
                    "{what}: the guest did not complete round {round} within {timeout:?}"
                ));
            }
            thread::sleep(Duration::from_millis(200));
        }
    }

    /// Waits for `ROUNDS_PER_EVENT` more rounds after an event.
    pub fn next_rounds(&mut self, what: &str) {
        let target = self.round + ROUNDS_PER_EVENT;
        self.wait_round(target, ROUNDS_TIMEOUT, what);
    }

    /// Waits for `ROUNDS_PER_EVENT` more rounds than the guest has
    /// completed now (an event just ended: rounds that completed while it
    /// ran do not count).
    pub fn rounds_after_event(&mut self, what: &str) {
        let log = self.log();
        self.check_log(&log);
        let target = Guest::last_round(&log) + ROUNDS_PER_EVENT;
        self.wait_round(target, ROUNDS_TIMEOUT, what);
    }

    /// Tells the guest to stop; waits for its final verification and
    /// power-off; checks its log.
    pub fn stop_and_check(&mut self) {
        if let Err(error) = self.control.write_all(b"stop\n") {
            self.fail(&format!(
                "cannot write to the guest's control port: {error}"
            ));
        }
        let status = self.qemu.wait(ROUNDS_TIMEOUT);
        let log = self.log();
        self.check_log(&log);
        if !status.success() {
            self.fail(&format!("QEMU exited with {status}"));
        }
        if !log.contains("STRATA-TEST kernel-errors 0") {
            self.fail("the guest's kernel log has I/O errors");
        }
        if !log.contains("STRATA-TEST done") {
            self.fail("the guest did not finish its final verification");
        }
        eprintln!(
            "[guest] stopped after round {}: every file verified, no kernel error",
            Guest::last_round(&log)
        );
    }
}

/// A guest /sbin/init (qemu_guest.rs, migration.rs): writes 1 MiB files
/// with fsync, records their checksums, drops its page cache and verifies
/// every file, round after round (`STRATA-TEST round N ok`), a second
/// writer keeping requests in flight, until the host writes `stop` on the
/// second serial port; then a final verification and power-off.
pub const WRITE_VERIFY_INIT: &str = r#"#!/bin/sh
# The guest of qemu_guest.rs and migration.rs: writes and verifies files
# until the host writes "stop" on the second serial port.
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
verify() {
    echo 3 > /proc/sys/vm/drop_caches
    for sum in /data/*.md5; do
        [ -e "$sum" ] || continue
        (cd /data && md5sum -c -s "${sum##*/}") || fail "verify ${sum##*/} at $1"
    done
}
say booted
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
i=0
while :; do
    i=$((i+1))
    slot=$((i % 12))
    dd if=/dev/urandom of=/data/f$slot bs=64k count=16 conv=fsync 2>/tmp/dd.err \
        || { fail "write f$slot round $i"; cat /tmp/dd.err; }
    (cd /data && md5sum f$slot > f$slot.new && mv f$slot.new f$slot.md5) \
        || fail "checksum f$slot round $i"
    sync || fail "sync round $i"
    verify "round $i"
    grep -q ' / ext4 ro' /proc/mounts && fail "root filesystem read-only at round $i"
    say "round $i ok"
    if read -t 1 cmd <&3; then
        case "$cmd" in stop*) break;; esac
    fi
done
kill $load
wait $load 2>/dev/null
verify final
sync
errors=$(dmesg | grep -ciE 'KERNEL_ERROR_PATTERN')
say "kernel-errors $errors"
dmesg | grep -iE 'KERNEL_ERROR_PATTERN'
mount -o remount,ro / || fail "remount read-only"
say done
poweroff -f
"#;
