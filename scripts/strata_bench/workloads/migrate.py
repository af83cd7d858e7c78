"""migrate: live migration of a running QEMU guest between two hosts'
strata servers (issue 42): the guest writes all along; the storage part
of each downtime from the hosts' logs, QEMU's downtime, and the guest's
longest write."""

import contextlib
import datetime
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import threading
import time

from ..servers import StrataMinio
from ..stats import strata_cli
from ..stores import PROXY_LATENCY_MS
from ..util import BenchError, MiB, fmt, log, run_cmd, stop_process, tail
from .handover import StrataHost
from .qemu import BOOT_INIT_TIMEOUT, BootProc, guest_kernel, static_busybox


MIGRATE = "migrate"  # live migration (issue 42): see run_migrate

MIGRATE_TITLE = ("a running QEMU guest (TCG, 1 vCPU, 256 MiB; Debian's kernel, a busybox ext4 root on volume `vm`,"
                 " virtio-blk over QEMU's NBD client, cache.direct=on) live-migrated back and forth between two"
                 " `strata serve` (own data dirs, one MinIO, every volume served, --standby auto: the destination's"
                 " first write takes the volume) over a unix socket, QEMU's defaults; the guest writes all along"
                 " (4 KiB QD1 or 8 writers of 1 MiB: dd oflag=direct conv=fsync, one console line per write)."
                 " Storage downtime = the destination's first write answered (its log: first_write_unix_ms) -"
                 " the source's last FLUSH answered (its handover line: last_flush_unix_ms); handover part ="
                 " released_unix_ms - last_flush_unix_ms, rest = first write - released; before the take = the"
                 " destination's take's start (its line `the standby took the volume over`, less its elapsed_ms)"
                 " - the last FLUSH: QEMU's switchover, no request waiting on strata; take = that elapsed_ms (the"
                 " request to the source, its close, the open); p50 and max over the migrations. QEMU downtime = query-migrate's `downtime`. Guest longest write = the longest gap"
                 " between two completed writes of one writer (console lines, timestamped on the host) during"
                 " the migrations (migrate to completed), next to the same over an equal time with none."
                 " Goal: storage downtime p50 <= 100 ms at ~0 ms, <= 300 ms at 20 ms per request")

# migrate's rows are one store latency and writer each, over its migrations.
MIGRATE_COLS = [("server", "%s"), ("migrations", "%d"), ("storage_ms", "%.0f"), ("storage_max_ms", "%.0f"),
                ("handover_ms", "%.0f"), ("handover_max_ms", "%.0f"), ("rest_ms", "%.0f"), ("rest_max_ms", "%.0f"),
                ("before_take_ms", "%.0f"), ("take_ms", "%.0f"),
                ("qemu_downtime_ms", "%.0f"), ("qemu_downtime_max_ms", "%.0f"), ("guest_gap_mig_ms", "%.0f"),
                ("guest_gap_idle_ms", "%.0f")]
MIGRATE_HEAD = ["server", "migrations", "storage downtime p50 ms", "max ms", "handover p50 ms", "max ms",
                "rest p50 ms", "max ms", "before the take p50 ms", "take p50 ms", "QEMU downtime p50 ms", "max ms", "guest longest write, migrating ms",
                "guest longest write, not migrating ms"]

# The guest's /sbin/init (busybox sh): one writer mode, from the kernel
# command line (bench_mode=4k: 4 KiB writes, O_DIRECT + fsync, QD1;
# bench_mode=1m: eight writers of 1 MiB, O_DIRECT + fsync). Each write
# completed prints "W<writer> <seq>" on the console; the host timestamps
# the lines as they arrive.
MIGRATE_INIT = r"""#!/bin/sh
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev 2>/dev/null
mount -t tmpfs tmp /tmp
mount -o remount,rw /
mkdir -p /data
mode=4k
case "$(cat /proc/cmdline)" in *bench_mode=1m*) mode=1m;; esac
echo "BENCH booted $mode"
dd if=/dev/urandom of=/tmp/r bs=1M count=1 2>/dev/null
if [ "$mode" = 4k ]; then
    dd if=/dev/zero of=/data/w bs=1M count=16 conv=fsync 2>/dev/null || echo "BENCH FAIL prealloc"
    echo "BENCH ready"
    i=0
    while :; do
        i=$((i+1))
        dd if=/tmp/r of=/data/w bs=4k count=1 skip=$((i % 256)) seek=$((i % 4096)) \
            oflag=direct conv=notrunc,fsync 2>/dev/null || echo "BENCH FAIL write $i"
        echo "W0 $i"
    done
else
    for j in 1 2 3 4 5 6 7 8; do
        dd if=/dev/zero of=/data/b$j bs=1M count=4 conv=fsync 2>/dev/null || echo "BENCH FAIL prealloc $j"
    done
    echo "BENCH ready"
    for j in 1 2 3 4 5 6 7 8; do
        (
            i=0
            while :; do
                i=$((i+1))
                dd if=/tmp/r of=/data/b$j bs=1M count=1 seek=$((i % 4)) \
                    oflag=direct conv=notrunc,fsync 2>/dev/null || echo "BENCH FAIL write $j.$i"
                echo "W$j $i"
            done
        ) &
    done
    wait
fi
"""

MIGRATE_GOAL_MS = {0: 100, PROXY_LATENCY_MS: 300}
MIGRATE_ROOT_SIZE = 128 * MiB
MIGRATE_MODES = {"4k": "4 KiB QD1", "1m": "1 MiB QD8"}
MIGRATE_TIMEOUT_S = 300
MIGRATE_ERRORS = ("I/O error", "Buffer I/O", "EXT4-fs error", "EXT4-fs warning", "Remounting filesystem read-only",
                  "blk_update_request", "print_req_error", "Aborting journal", "BENCH FAIL",
                  "kernel BUG", "Oops", "list_del corruption", "general protection fault", "Kernel panic")


class Qmp:
    """A tiny QMP client on a unix socket (events skipped)."""

    def __init__(self, path, proc, timeout=30.0):
        deadline = time.time() + timeout
        while True:
            try:
                s = socket.socket(socket.AF_UNIX)
                s.connect(path)
                break
            except OSError:
                s.close()
                if proc.poll() is not None or time.time() > deadline:
                    raise BenchError("QMP socket %s: QEMU %s" % (path, "exited (%s)" % proc.returncode
                                                                  if proc.poll() is not None else "not listening"))
                time.sleep(0.05)
        s.settimeout(120)
        self.sock, self.f = s, s.makefile("rb")
        self.read()  # greeting
        self.execute("qmp_capabilities")

    def read(self):
        while True:
            line = self.f.readline()
            if not line:
                raise BenchError("QMP: connection closed")
            msg = json.loads(line)
            if "event" not in msg:
                return msg

    def execute(self, cmd, arguments=None):
        req = {"execute": cmd}
        if arguments is not None:
            req["arguments"] = arguments
        self.sock.sendall(json.dumps(req).encode() + b"\n")
        msg = self.read()
        if "error" in msg:
            raise BenchError("QMP %s: %s" % (cmd, msg["error"].get("desc")))
        return msg.get("return")

    def close(self):
        with contextlib.suppress(OSError):
            self.f.close()
            self.sock.close()


class MigrateVm:
    """One QEMU process of the migrating guest, its disk on a host's NBD
    socket (export vm); the console on its stdout, each line timestamped
    as it arrives: "W" lines into `writes` (shared by the VMs of a row:
    (time, writer)), every line into `lines` and console.log."""

    def __init__(self, ctx, d, name, kernel, initrd, sock, mode, incoming, writes):
        self.ctx, self.name, self.writes, self.lines = ctx, name, writes, []
        d = os.path.join(d, name)
        os.makedirs(d, exist_ok=True)
        self.console = os.path.join(d, "console.log")
        self.qmp_path = os.path.join(d, "qmp.sock")
        blockdev = ("driver=nbd,node-name=disk0,server.type=unix,server.path=%s,export=vm,reconnect-delay=60,"
                    "cache.direct=on" % sock)
        argv = ["qemu-system-x86_64", "-machine", "q35,accel=tcg", "-m", "256", "-smp", "1",
                "-nodefaults", "-display", "none", "-no-reboot", "-kernel", kernel, "-initrd", initrd,
                "-append", "console=ttyS0 root=/dev/vda rw init=/sbin/init panic=-1 bench_mode=" + mode,
                "-blockdev", blockdev, "-device", "virtio-blk-pci,drive=disk0",
                "-chardev", "stdio,id=con,signal=off", "-serial", "chardev:con",
                "-qmp", "unix:%s,server=on,wait=off" % self.qmp_path]
        if incoming:
            argv += ["-incoming", "defer"]
        self.logf = open(os.path.join(d, "qemu.log"), "ab")
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self.logf,
                                     start_new_session=True)
        self.holder = BootProc(self.proc)
        ctx.live.append(self.holder)
        self.reader = threading.Thread(target=self.read_console, daemon=True)
        self.reader.start()
        try:
            self.qmp = Qmp(self.qmp_path, self.proc)
        except BenchError as e:
            self.stop()
            raise BenchError("%s: %s: %s" % (name, e, tail(self.logf.name, 3)))

    def read_console(self):
        with open(self.console, "wb") as f:
            for raw in iter(self.proc.stdout.readline, b""):
                t = time.time()
                f.write(raw)
                line = raw.decode(errors="replace").strip()
                self.lines.append((t, line))
                m = re.match(r"W(\d+) \d+$", line)
                if m:
                    self.writes.append((t, int(m.group(1))))

    def seen(self, marker):
        return any(marker in l for _, l in self.lines)

    def errors(self):
        return [l for _, l in self.lines if any(e in l for e in MIGRATE_ERRORS)]

    def tail(self, n=12):
        return " | ".join(l for _, l in self.lines[-n:] if l)

    def stop(self, quit=False):
        if quit and self.proc.poll() is None:
            with contextlib.suppress(BenchError, OSError, ValueError):
                self.qmp.execute("quit")
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(30)
        stop_process(self.proc, timeout=10)
        self.reader.join(10)
        if getattr(self, "qmp", None):
            self.qmp.close()
        if self.holder in self.ctx.live:
            self.ctx.live.remove(self.holder)
        self.logf.close()


def migrate_image(ctx):
    """The guest's root filesystem (MIGRATE_ROOT_SIZE, ext4 from a busybox
    root with MIGRATE_INIT as /sbin/init), made once per run."""
    if getattr(ctx, "migrate_img", None):
        return ctx.migrate_img
    d = os.path.join(ctx.scratch, "migrate-root")
    root = os.path.join(d, "root")
    bb = static_busybox()
    for sub in ("bin", "sbin", "proc", "sys", "dev", "tmp", "data", "etc"):
        os.makedirs(os.path.join(root, sub), exist_ok=True)
    shutil.copyfile(bb, os.path.join(root, "bin", "busybox"))
    os.chmod(os.path.join(root, "bin", "busybox"), 0o755)
    for applet in run_cmd([bb, "--list"], "busybox --list").split():
        link = os.path.join(root, "bin", applet)
        if not os.path.lexists(link):
            os.symlink("busybox", link)
    init = os.path.join(root, "sbin", "init")
    with open(init, "w") as f:
        f.write(MIGRATE_INIT)
    os.chmod(init, 0o755)
    img = os.path.join(d, "root.img")
    run_cmd(["mkfs.ext4", "-q", "-F", "-d", root, img, "%dM" % (MIGRATE_ROOT_SIZE >> 20)], "mkfs.ext4 -d")
    ctx.migrate_img = img
    return img


def log_unix_ms(line):
    """The unix ms of a strata log line's RFC 3339 UTC timestamp, or None."""
    m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?Z", line.strip())
    if not m:
        return None
    t = datetime.datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S").replace(tzinfo=datetime.timezone.utc)
    return t.timestamp() * 1e3 + float(m.group(2) or 0) * 1e3


def strata_takes(path):
    """A strata serve's standby takeovers from its log: [(unix ms the take
    ended, its elapsed_ms)] ("the standby took the volume over")."""
    try:
        with open(path, errors="replace") as f:
            lines = [l for l in f if "the standby took the volume over" in l]
    except OSError:
        return []
    out = []
    for l in lines:
        m = re.search(r"elapsed_ms=(\d+)", l)
        out.append((log_unix_ms(l), int(m.group(1)) if m else None))
    return out


def strata_log_events(path):
    """From a strata serve's log: its handovers [(last_flush_unix_ms,
    released_unix_ms)] and its takeovers' first writes [unix ms]."""
    try:
        with open(path, errors="replace") as f:
            text = f.read()
    except OSError:
        return [], []
    handed, first = [], []
    for line in text.splitlines():
        if "volume handed over on request" in line:
            lf = re.search(r"last_flush_unix_ms=(\d+)", line)
            rel = re.search(r"released_unix_ms=(\d+)", line)
            handed.append((int(lf.group(1)) if lf else None, int(rel.group(1)) if rel else None))
        elif "first write served after the takeover" in line:
            fw = re.search(r"first_write_unix_ms=(\d+)", line)
            first.append(int(fw.group(1)) if fw else None)
    return handed, first


def longest_gap(writes, windows):
    """The longest gap (ms) between two consecutive completed writes of one
    writer that overlaps one of the windows [(t0, t1)]; and the number of
    writes completed within them."""
    by = {}
    for t, w in writes:
        by.setdefault(w, []).append(t)
    best, n = None, 0
    for ts in by.values():
        ts.sort()
        for a, b in zip(ts, ts[1:]):
            if any(b > w0 and a < w1 for w0, w1 in windows):
                best = max(best or 0.0, (b - a) * 1e3)
        n += sum(1 for t in ts if any(w0 <= t <= w1 for w0, w1 in windows))
    return best, n


def migrate_one(ctx, d, n, vm, src, dst, mode, boot, writes):
    """Migration n of the guest from host src to dst: the new QEMU and the
    migration's dict (QEMU's figures, the window, the strata log figures)."""
    kernel, initrd = boot
    handed_before = len(strata_log_events(src.log)[0])
    first_before = len(strata_log_events(dst.log)[1])
    takes_before = len(strata_takes(dst.log))
    to = MigrateVm(ctx, d, "vm%d" % n, kernel, initrd, dst.sock, mode, True, writes)
    try:
        uri = "unix:" + os.path.join(d, "mig%d.sock" % n)
        to.qmp.execute("migrate-incoming", {"uri": uri})
        t0 = time.time()
        vm.qmp.execute("migrate", {"uri": uri})
        while True:
            q = vm.qmp.execute("query-migrate")
            status = q.get("status")
            if status == "completed":
                break
            if status in ("failed", "cancelled"):
                raise BenchError("migration %d %s: %s" % (n, status, q.get("error-desc", "")))
            if time.time() - t0 > MIGRATE_TIMEOUT_S:
                raise BenchError("migration %d not completed in %d s: %s" % (n, MIGRATE_TIMEOUT_S, q))
            time.sleep(0.05)
        t1 = time.time()
        while to.qmp.execute("query-status").get("status") != "running":
            if time.time() - t1 > 30:
                raise BenchError("migration %d completed but the destination is not running" % n)
            time.sleep(0.05)
    except BenchError:
        to.stop()
        raise
    vm.stop(quit=True)
    # The strata logs: the source's handover, the destination's first write.
    deadline = time.time() + 30
    while True:
        handed = strata_log_events(src.log)[0][handed_before:]
        first = strata_log_events(dst.log)[1][first_before:]
        if handed and first:
            break
        if time.time() > deadline:
            raise BenchError("migration %d: no %s in the %s's log within 30 s after completion" % (
                n, "handover" if not handed else "first write after the takeover",
                "source" if not handed else "destination"))
        time.sleep(0.1)
    last_flush, released = handed[-1]
    fw = first[-1]
    res = {"n": n, "from": src.tag, "to": dst.tag, "t0": t0, "t1": t1, "migrate_s": t1 - t0,
           "qemu_downtime_ms": q.get("downtime"), "qemu_total_ms": q.get("total-time"),
           "qemu_setup_ms": q.get("setup-time"), "ram_mib": (q.get("ram") or {}).get("transferred", 0) / MiB,
           "last_flush_unix_ms": last_flush, "released_unix_ms": released, "first_write_unix_ms": fw}
    ok = last_flush and fw
    res["storage_ms"] = fw - last_flush if ok else None
    res["handover_ms"] = released - last_flush if last_flush and released else None
    res["rest_ms"] = fw - released if released and fw else None
    # The destination's take (its log line's time and elapsed_ms: the
    # request to the source, its close, the open): before it, no request
    # of the destination was waiting on the volume (QEMU's switchover).
    takes = strata_takes(dst.log)[takes_before:]
    if takes and takes[-1][0] is not None and takes[-1][1] is not None and ok:
        took_at, take_ms = takes[-1]
        res["take_ms"] = take_ms
        res["before_take_ms"] = took_at - take_ms - last_flush
        res["after_take_ms"] = fw - took_at
    return to, res


def migrate_summary(migs):
    def p50(k):
        xs = [m[k] for m in migs if m.get(k) is not None]
        return statistics.median(xs) if xs else None

    def mx(k):
        xs = [m[k] for m in migs if m.get(k) is not None]
        return max(xs) if xs else None

    return {"migrations": len(migs), "storage_ms": p50("storage_ms"), "storage_max_ms": mx("storage_ms"),
            "handover_ms": p50("handover_ms"), "handover_max_ms": mx("handover_ms"),
            "rest_ms": p50("rest_ms"), "rest_max_ms": mx("rest_ms"),
            "before_take_ms": p50("before_take_ms"), "take_ms": p50("take_ms"), "take_max_ms": mx("take_ms"),
            "after_take_ms": p50("after_take_ms"),
            "qemu_downtime_ms": p50("qemu_downtime_ms"), "qemu_downtime_max_ms": mx("qemu_downtime_ms"),
            "migrate_s": p50("migrate_s")}


def run_migrate(ctx, cls, mode, count):
    """One row: a fresh store prefix and data dirs, the root image
    imported as `vm`, two hosts serving every volume, the guest booted on
    A, `count` migrations A -> B -> A ..., then an equal time with none."""
    args = ctx.args
    row = {"server": "%s, %s%s" % (cls.name, MIGRATE_MODES[mode],
                                    ", via the store" if args.migrate_via == "store" else ""),
           "workload": MIGRATE, "mode": mode, "latency_ms": cls.latency_ms}
    srv = cls(ctx, MIGRATE_ROOT_SIZE, "migrate-%s" % mode)
    hosts = [StrataHost(ctx, srv, "a"), StrataHost(ctx, srv, "b")]
    vm, migs, writes = None, [], []
    d = os.path.join(srv.dir, "vms")
    try:
        boot = guest_kernel()
        image = migrate_image(ctx)
        strata_cli(ctx, srv, ["volume", "import", image, "vm"], hosts[0].data, timeout=600)
        ctx.live += hosts
        for h in hosts:
            h.start([])
            if args.migrate_via == "store":
                # As across machines: the hosts reach each other through
                # their records in the store only.
                os.unlink(os.path.join(h.data, "control.sock"))
        t_boot = time.time()
        vm = MigrateVm(ctx, d, "vm0", boot[0], boot[1], hosts[0].sock, mode, False, writes)
        while not vm.seen("BENCH ready"):
            if vm.proc.poll() is not None or time.time() - t_boot > BOOT_INIT_TIMEOUT or vm.errors():
                raise BenchError("the guest did not get ready (%s): %s" % (
                    "QEMU exited" if vm.proc.poll() is not None else "errors" if vm.errors() else "timeout",
                    vm.tail()))
            time.sleep(0.1)
        row["boot_s"] = time.time() - t_boot
        # Seconds the guest writes on a host before each migration (the
        # smoke test's are shorter: it measures nothing).
        settle_s = 0.5 if args.quick else 2
        time.sleep(settle_s)
        for n in range(1, count + 1):
            src, dst = hosts[(n - 1) % 2], hosts[n % 2]
            old = vm
            vm, m = migrate_one(ctx, d, n, vm, src, dst, mode, boot, writes)
            if old.errors():
                raise BenchError("the guest on %s reported: %s" % (old.name, old.errors()[0]))
            migs.append(m)
            log("    migration %d (%s -> %s): storage %s ms (handover %s, rest %s; before the take %s, take %s,"
                " after %s), QEMU downtime %s ms, migrate %.1f s"
                % (n, src.tag, dst.tag, fmt(m["storage_ms"], "%d"), fmt(m["handover_ms"], "%d"),
                   fmt(m["rest_ms"], "%d"), fmt(m.get("before_take_ms"), "%.0f"), fmt(m.get("take_ms"), "%d"),
                   fmt(m.get("after_take_ms"), "%.0f"), fmt(m["qemu_downtime_ms"], "%d"), m["migrate_s"]))
            # The guest writes on its new host before the next one.
            seen = len(writes)
            t = time.time()
            while len(writes) < seen + 3:
                if time.time() - t > 60 or vm.proc.poll() is not None or vm.errors():
                    raise BenchError("the guest stopped writing after migration %d: %s" % (
                        n, vm.errors()[0] if vm.errors() else vm.tail()))
                time.sleep(0.05)
            time.sleep(settle_s)
        # An equal time without migration.
        windows = [(m["t0"], m["t1"]) for m in migs]
        span = max(1.0 if args.quick else 5.0, sum(b - a for a, b in windows))
        b0 = time.time()
        time.sleep(span)
        b1 = time.time()
        if vm.errors():
            raise BenchError("the guest reported: %s" % vm.errors()[0])
        row.update(migrate_summary(migs))
        row["guest_gap_mig_ms"], row["writes_mig"] = longest_gap(writes, windows)
        row["guest_gap_idle_ms"], row["writes_idle"] = longest_gap(writes, [(b0, b1)])
        row["window_s"] = span
        row["goal_ms"] = MIGRATE_GOAL_MS.get(cls.latency_ms)
        row["goal_met"] = row["storage_ms"] is not None and row["goal_ms"] is not None \
            and row["storage_ms"] <= row["goal_ms"]
        row["migrations_detail"] = migs
        row["note"] = migrate_note(row, srv)
        row["status"] = "ok"
    except (BenchError, subprocess.TimeoutExpired, OSError, ValueError, KeyError) as e:
        row.update({"status": "failed", "error": str(e), "migrations_detail": migs})
    finally:
        if vm is not None:
            vm.stop(quit=True)
        codes = {}
        for h in hosts:
            if h.proc is not None:
                codes[h.tag] = h.stop()
            if h in ctx.live:
                ctx.live.remove(h)
        if not args.keep:
            srv.cleanup()
    bad = ["%s exit %s" % (t, c) for t, c in sorted(codes.items()) if c != 0]
    if bad and row["status"] == "ok":
        row.update({"status": "failed", "error": "a host did not stop cleanly (%s)" % ", ".join(bad)})
    return row


def migrate_note(row, srv):
    f = lambda v: fmt(v, "%.0f")  # noqa: E731
    return ("%s, %s: %d migrations (%.1f s each, median); storage downtime %s ms p50, %s max (handover %s / %s,"
            " rest %s / %s; p50s: before the destination's take %s, the take %s (max %s), after it %s);"
            " QEMU downtime %s / %s ms; guest's longest write %s ms during the migrations"
            " (%d writes), %s ms over %.0f s without (%d writes); goal (p50 <= %s ms) %s"
            % (srv.note(), MIGRATE_MODES[row["mode"]], row["migrations"], row["migrate_s"] or 0,
               f(row["storage_ms"]), f(row["storage_max_ms"]), f(row["handover_ms"]), f(row["handover_max_ms"]),
               f(row["rest_ms"]), f(row["rest_max_ms"]), f(row["before_take_ms"]), f(row["take_ms"]),
               f(row["take_max_ms"]), f(row["after_take_ms"]), f(row["qemu_downtime_ms"]), f(row["qemu_downtime_max_ms"]),
               f(row["guest_gap_mig_ms"]), row["writes_mig"], f(row["guest_gap_idle_ms"]), row["window_s"],
               row["writes_idle"], fmt(row["goal_ms"], "%d"), "met" if row["goal_met"] else "missed"))


def migrate_cases(args, classes):
    """(class, mode) of the rows: --quick the ~0 ms 4 KiB row only."""
    modes = ["4k"] if args.quick else list(MIGRATE_MODES)
    if args.migrate_writers:
        modes = [m.strip() for m in args.migrate_writers.split(",") if m.strip()]
        bad = [m for m in modes if m not in MIGRATE_MODES]
        if bad or not modes:
            raise BenchError("--migrate-writers: %s is not one of %s" % (", ".join(bad) or "nothing",
                                                                          ", ".join(MIGRATE_MODES)))
    return [(c, m) for c in classes for m in modes if not args.quick or c is StrataMinio]
