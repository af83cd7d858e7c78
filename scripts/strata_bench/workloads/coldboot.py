"""coldboot: a QEMU guest boots a clone of a root filesystem on a new host
and reads every file once; a first clone, then a clone that prefetches the
first one's access profile, at 0 and 20 ms, next to nbdkit file on the
image (GuestBoot: the boot, timed from the serial console)."""

import contextlib
import json
import os
import re
import shutil
import subprocess
import threading
import time

from ..sampling import Sampler
from ..servers import StrataMinio, StrataMinio20ms
from ..stats import HydrationWatch, counts_delta, disk_cache_bytes, hydration_text, stats_now, store_gets, strata_cli
from ..util import BenchError, MiB, drop_caches, log, run_cmd, socket_accepts, spawn, stop_process, tail, wait_for
from .fsimage import usr_image
from .qemu import BOOT_INIT_TIMEOUT, BootProc, guest_kernel, static_busybox


COLDBOOT = "coldboot"

COLDBOOT_TITLE = ("a QEMU guest (TCG, 1 vCPU, 512 MiB; Debian's kernel and initrd from /boot, virtio-blk over"
                  " QEMU's NBD client, read-only) boots a cloned ext4 root filesystem on a new host (fresh data"
                  " dir) and its /init reads every file once (`find / -xdev -type f | xargs cat`); times from"
                  " QEMU's start to init's first line and to the end of the read on the serial console;"
                  " ratio = the local reference's read-done time (nbdkit file on the image, page cache"
                  " dropped) / this row's")

# coldboot's rows are timed boots.
BOOT_COLS = [("server", "%s"), ("init_s", "%.2f"), ("time_s", "%.2f"), ("mbps", "%.1f"), ("store_gets", "%d"),
             ("disk_cache_mib", "%.0f"), ("cpu_s", "%.2f"), ("peak_rss_mib", "%.0f"), ("ratio", "%.3f")]
BOOT_HEAD = ["server", "init s", "read-done s", "guest read MB/s", "store GETs", "disk cache MiB", "CPU s",
             "peak RSS MiB", "ratio"]

# The guest's /init: the VM's first boot, reading its whole image once.
# The initramfs has mounted /proc, /sys and /dev already (moved into the
# root): those mounts may fail. Its lines go to ttyS0 (the console).
BOOT_INIT = r"""#!/bin/sh
# scripts/bench coldboot's guest: prints when init runs, reads every file
# of its root filesystem once, prints when done, powers off.
export PATH=/bin
mount -t proc proc /proc 2>/dev/null
mount -t sysfs sys /sys 2>/dev/null
mount -t devtmpfs dev /dev 2>/dev/null
mount -t tmpfs tmp /tmp
echo "STRATA-BOOT init"
find / -xdev -type f -print0 | xargs -0 cat > /dev/null 2>/tmp/read.err
rc=$?
echo "STRATA-BOOT read-done status=$rc errors=$(wc -l < /tmp/read.err) io-errors=$(dmesg | grep -ciE 'I/O error|EXT4-fs error|Buffer I/O')"
head -5 /tmp/read.err
dmesg | grep -iE 'I/O error|EXT4-fs error|Buffer I/O' | head -5
poweroff -f
"""
BOOT_MARKERS = ("STRATA-BOOT init", "STRATA-BOOT read-done")
# Not quiet: the kernel's log on the console shows where a boot that
# times out stopped (it costs no measurable boot time).
BOOT_CMDLINE = "console=ttyS0 root=/dev/vda ro init=/init panic=-1"


def boot_root(root):
    """Makes a usr_image root bootable: /bin/busybox (static) and its
    applets as links, /dev, /proc, /sys, /run, /tmp, /init (BOOT_INIT) and
    /sbin/init -> /init."""
    bb = static_busybox()
    for sub in ("bin", "sbin", "dev", "proc", "sys", "run", "tmp", "etc"):
        os.makedirs(os.path.join(root, sub), exist_ok=True)
    shutil.copyfile(bb, os.path.join(root, "bin", "busybox"))
    os.chmod(os.path.join(root, "bin", "busybox"), 0o755)
    for applet in run_cmd([bb, "--list"], "busybox --list").split():
        link = os.path.join(root, "bin", applet)
        if not os.path.lexists(link):
            os.symlink("busybox", link)
    init = os.path.join(root, "init")
    with open(init, "w") as f:
        f.write(BOOT_INIT)
    os.chmod(init, 0o755)
    if not os.path.lexists(os.path.join(root, "sbin", "init")):
        os.symlink("../init", os.path.join(root, "sbin", "init"))


def coldboot_image(ctx):
    """coldboot's image, made once per run: coldclone's (the same sample of
    /usr at --coldclone-size) and a busybox root filesystem."""
    if getattr(ctx, "boot_image", None):
        return ctx.boot_image
    ctx.boot_image = usr_image(ctx.args.coldclone_size, os.path.join(ctx.scratch, "coldboot-image"), "coldboot",
                               extra=boot_root)
    return ctx.boot_image


class GuestBoot:
    """One boot of the guest on an NBD export (a unix socket): QEMU (TCG,
    virtio-blk over its NBD client, read-only) with the console on its
    stdout, read by a thread that timestamps each line as it arrives (and
    copies it to console.log). run() -> {init_s, done_s, ...} from QEMU's
    start; QEMU is killed on every way out."""

    def __init__(self, ctx, d, kernel, initrd, sock, export=None):
        self.ctx, self.d = ctx, d
        self.kernel, self.initrd, self.sock, self.export = kernel, initrd, sock, export
        self.console = os.path.join(d, "console.log")
        self.log = os.path.join(d, "qemu.log")
        self.lines = []  # (seconds from QEMU's start, line)
        self.marks = {}  # marker -> (seconds, line)

    def argv(self):
        blockdev = "driver=nbd,node-name=disk0,server.type=unix,server.path=%s%s,read-only=on,cache.direct=on" % (
            self.sock, ",export=" + self.export if self.export else "")
        return ["qemu-system-x86_64", "-machine", "q35,accel=tcg", "-m", "512", "-smp", "1",
                "-nodefaults", "-display", "none", "-no-reboot",
                "-kernel", self.kernel, "-initrd", self.initrd, "-append", BOOT_CMDLINE,
                "-blockdev", blockdev, "-device", "virtio-blk-pci,drive=disk0",
                "-chardev", "stdio,id=con,signal=off", "-serial", "chardev:con"]

    def command(self):
        """The command line as run, its socket and export as placeholders."""
        a = " ".join(self.argv()).replace(self.sock, "SOCK")
        return a.replace(",export=" + self.export, ",export=EXPORT") if self.export else a

    def read_console(self, out, t0):
        with open(self.console, "wb") as f:
            for raw in iter(out.readline, b""):
                t = time.time() - t0
                f.write(raw)
                f.flush()
                line = raw.decode(errors="replace").rstrip("\r\n")
                self.lines.append((t, line))
                for m in BOOT_MARKERS:
                    if m not in self.marks and line.strip().startswith(m):
                        self.marks[m] = (t, line.strip())

    def tail(self, n=15):
        return " | ".join(l for _, l in self.lines[-n:] if l.strip())

    def run(self, done_timeout, sample_pid=None):
        """Boots; returns {status: ok|timeout|exited, init_s, done_s,
        done_line, exit_code, qemu_cpu_s, cpu_s, peak_rss, why}. cpu_s and
        peak_rss are sample_pid's (the NBD server) over the boot."""
        logf = open(self.log, "ab")
        res = {"status": "ok"}
        sampler = Sampler(sample_pid) if sample_pid else None
        t0 = time.time()
        proc = subprocess.Popen(self.argv(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=logf,
                                start_new_session=True)
        holder = BootProc(proc)
        self.ctx.live.append(holder)
        reader = threading.Thread(target=self.read_console, args=(proc.stdout, t0), daemon=True)
        reader.start()
        qsampler = Sampler(proc.pid, interval=0.5)
        try:
            with qsampler, (sampler if sampler else contextlib.nullcontext()):
                for marker, limit in ((BOOT_MARKERS[0], min(BOOT_INIT_TIMEOUT, done_timeout)),
                                      (BOOT_MARKERS[1], done_timeout)):
                    while marker not in self.marks:
                        if proc.poll() is not None:
                            reader.join(5)
                            if marker in self.marks:
                                break
                            res.update({"status": "exited", "exit_code": proc.returncode,
                                        "why": "QEMU exited (%s) before %r" % (proc.returncode, marker)})
                            break
                        if time.time() - t0 > limit:
                            res.update({"status": "timeout",
                                        "why": "no %r within %d s of QEMU's start" % (marker, limit)})
                            break
                        time.sleep(0.05)
                    if res["status"] != "ok":
                        break
                if res["status"] == "ok":
                    # poweroff -f: QEMU exits (-no-reboot).
                    try:
                        res["exit_code"] = proc.wait(60)
                    except subprocess.TimeoutExpired:
                        res["exit_code"] = None
        finally:
            stop_process(proc, timeout=10)
            reader.join(10)
            self.ctx.live.remove(holder)
            logf.close()
        if sampler:
            res["cpu_s"], res["peak_rss"] = sampler.window(t0)
        res["qemu_cpu_s"] = qsampler.window(t0)[0]
        for key, m in (("init_s", BOOT_MARKERS[0]), ("done_s", BOOT_MARKERS[1])):
            if m in self.marks:
                res[key] = self.marks[m][0]
        if BOOT_MARKERS[1] in self.marks:
            res["done_line"] = self.marks[BOOT_MARKERS[1]][1]
        if res["status"] != "ok":
            qemu = tail(self.log, 3)
            res["tail"] = (self.tail() or "(no console output)") + (" / QEMU: " + qemu if qemu else "")
        return res


def boot_counts(line):
    """status, errors and io-errors of the guest's read-done line."""
    return {k: int(v) for k, v in re.findall(r"([a-z-]+)=(\d+)", line or "")}


def boot_row(name, res, image, st_before, st_after, ref=None):
    """A coldboot row of a GuestBoot result (and the server's stats file
    before and after, {} for nbdkit)."""
    row = {"server": name, "workload": COLDBOOT, "iops": None, "p50_us": None, "p99_us": None, "p999_us": None}
    if res["status"] != "ok":
        # A boot that did not reach its marker in time is a failed row, not
        # a failed run (a timing); QEMU exiting early is a failure.
        row.update({"status": "failed", "error": res["why"], "soft": res["status"] == "timeout",
                    "init_s": res.get("init_s"), "note": "console: " + res.get("tail", "")[-1500:]})
        return row
    counts = boot_counts(res.get("done_line"))
    read_s = res["done_s"] - res["init_s"]
    row.update({"status": "ok", "init_s": res["init_s"], "time_s": res["done_s"], "read_s": read_s,
                "mbps": image["bytes"] / read_s / 1e6 if read_s > 0 else None, "files": image["files"],
                "cpu_s": res.get("cpu_s"), "peak_rss_mib": res["peak_rss"] / MiB if res.get("peak_rss") else None,
                "qemu_cpu_s": res.get("qemu_cpu_s"), "guest": counts})
    if counts.get("status") or counts.get("errors") or counts.get("io-errors"):
        row.update({"status": "failed", "error": "the guest's reads failed: %s" % res.get("done_line")})
        return row
    notes = []
    if st_after:
        gets = store_gets(st_after)
        if gets is not None:
            row["store_gets"] = gets - (store_gets(st_before) or 0)
        dc = disk_cache_bytes(st_after)
        row["disk_cache_mib"] = dc / MiB if dc is not None else None
        row.update(counts_delta(st_before, st_after))
        if row.get("data_gets") is not None:
            # data GETs count hydration's (the profile's prefetch included).
            hyd = row.get("hydration_gets", 0)
            notes.append("%d data GETs (%d MiB): %d by hydration and the profile's prefetch, %d for the guest's reads"
                         % (row["data_gets"], row.get("data_get_bytes", 0) >> 20, hyd, row["data_gets"] - hyd))
    notes.append("QEMU CPU %.1f s" % res["qemu_cpu_s"] if res.get("qemu_cpu_s") is not None else "")
    if res.get("exit_code") not in (0, None):
        notes.append("QEMU exit %s after power-off" % res["exit_code"])
    elif res.get("exit_code") is None:
        notes.append("QEMU still running 60 s after read-done (killed)")
    row["note"] = "; ".join(x for x in notes if x)
    return row


def profile_summary(ctx, srv, target, data_dir):
    """`strata snapshot profile TARGET --json`: (dict or None, text)."""
    try:
        out = strata_cli(ctx, srv, ["snapshot", "profile", target, "--json"], data_dir, timeout=300)
    except (BenchError, subprocess.TimeoutExpired) as e:
        return None, "snapshot profile failed: %s" % e
    try:
        p = json.loads(out[out.index("{"):])
    except ValueError:
        return None, "no access profile recorded (%s)" % out.strip()[:200]
    n = len(p.get("ranges") or [])
    text = "profile of %s: %d ranges, %.1f MiB, recorded over %.1f s" % (
        target, n, (p.get("bytes") or 0) / MiB, (p.get("recorded_ms") or 0) / 1000.0)
    if (p.get("recorded_ms") or 0) >= 59000:
        text += " (the recording's 60 s limit)"
    return {"ranges": n, "bytes": p.get("bytes"), "recorded_ms": p.get("recorded_ms")}, text


def boot_ratio(row, ref):
    """ratio = the reference's read-done time / the row's; init's in the note."""
    if ref and ref.get("status") == "ok" and row.get("status") == "ok" and row.get("time_s"):
        row["ratio"] = ref["time_s"] / row["time_s"]
        row["init_ratio"] = ref["init_s"] / row["init_s"]
        row["note"] = "; ".join(x for x in ("init ratio %.3f (%.2f s; local %.2f s)" % (
            row["init_ratio"], row["init_s"], ref["init_s"]), row.get("note")) if x)


def boot_reference(ctx, kernel, initrd, image, timeout):
    """The local reference's row: the image file through nbdkit file,
    booted with the page cache dropped first."""
    ref_dir = os.path.join(ctx.scratch, "coldboot-ref")
    os.makedirs(ref_dir, exist_ok=True)
    sock = os.path.join(ref_dir, "nbd.sock")
    ref = {"server": "nbdkit-file (local image)", "workload": COLDBOOT}
    nlog = os.path.join(ref_dir, "nbdkit.log")
    proc = spawn(["nbdkit", "-f", "-r", "-U", sock, "file", "file=" + image["path"]], nlog)
    holder = BootProc(proc)
    ctx.live.append(holder)
    try:
        wait_for(lambda: socket_accepts(sock), proc, "nbdkit", nlog)
        dropped = drop_caches()
        boot = GuestBoot(ctx, ref_dir, kernel, initrd, sock)
        res = boot.run(timeout, sample_pid=proc.pid)
        ref = boot_row(ref["server"], res, image, {}, {})
        if ref["status"] == "ok":
            ref["ratio"] = 1.0
            ref["note"] = "; ".join(x for x in ("local reference (page cache %s first)"
                                                % ("dropped" if dropped else "NOT dropped"), ref["note"]) if x)
        ref["fio"] = boot.command()
    except (BenchError, subprocess.TimeoutExpired, OSError) as e:
        ref.update({"status": "failed", "error": str(e)})
    finally:
        stop_process(proc)
        ctx.live.remove(holder)
    return ref


def run_coldboot(ctx):
    """A QEMU guest booting a cloned root filesystem on a new host; see
    scripts/bench's docstring. Yields its rows as they are measured."""
    args = ctx.args
    try:
        kernel, initrd = guest_kernel()
        image = coldboot_image(ctx)
    except (BenchError, subprocess.TimeoutExpired, OSError) as e:
        yield {"server": "image", "workload": COLDBOOT, "status": "failed", "error": "guest image: %s" % e}
        return
    timeout = args.coldboot_timeout

    # The local reference: the image file through nbdkit file (not in
    # --quick: a smoke test of strata's boots, no ratio).
    ref = None
    if not args.quick:
        ref = boot_reference(ctx, kernel, initrd, image, timeout)
        yield ref

    # The image, imported once; per latency its own snapshot, and two
    # clones of it: the first boots with no profile (and records one), the
    # second boots with it.
    # --quick: the 0 ms row only (the 20 ms path is coldclone's too).
    latencies = (StrataMinio,) if args.quick else (StrataMinio, StrataMinio20ms)
    importer = StrataMinio(ctx, image["size"], COLDBOOT + "-import")
    data = os.path.join(importer.dir, "data-import")
    try:
        t0 = time.time()
        strata_cli(ctx, importer, ["volume", "import", image["path"], "base"], data)
        for cls in latencies:
            lat = "%dms" % cls.latency_ms
            strata_cli(ctx, importer, ["snapshot", "create", "base@boot-" + lat], data)
            for which in ("first", "second"):
                strata_cli(ctx, importer, ["volume", "clone", "base@boot-" + lat, "boot-%s-%s" % (lat, which)], data)
        log("    imported, snapshotted and cloned (a snapshot and two clones per latency) in %.1f s"
            % (time.time() - t0))
    except (BenchError, subprocess.TimeoutExpired, OSError) as e:
        yield {"server": "strata-minio", "workload": COLDBOOT, "status": "failed",
               "error": "import/snapshot/clone: %s" % e}
        return
    finally:
        if not args.keep:
            shutil.rmtree(data, ignore_errors=True)

    for cls in latencies:
        lat = "%dms" % cls.latency_ms
        profile = None
        for which, title in (("first", "first boot"), ("second", "clone with profile")):
            name = "strata-minio %s %s" % (lat, title)
            srv = cls(ctx, image["size"], "%s-%s-%s" % (COLDBOOT, lat, which))
            srv.prefix = importer.prefix
            srv.volume = "boot-%s-%s" % (lat, which)
            ctx.live.append(srv)
            row = {"server": name, "workload": COLDBOOT}
            stats = os.path.join(srv.dir, "stats.json")
            watch = None
            try:
                # Before the server starts: what it fetches at once (its
                # hydration, the profile's prefetch) gets no head start
                # while the caches drop.
                dropped = drop_caches()
                t_start = time.time()
                srv.start(create=False, extra=("--stats-file", stats, "--stats-interval-ms", "200"))
                started = time.time()
                watch = HydrationWatch(stats, started, srv.volume)
                boot = GuestBoot(ctx, srv.dir, kernel, initrd, srv.sock, srv.volume)
                res = boot.run(timeout, sample_pid=srv.pid)
                st = stats_now(stats)
                row = boot_row(name, res, image, {}, st)
                row["fio"] = boot.command()
                notes = [srv.note(), "server ready %.1f s after its start (not in the times)" % (started - t_start)]
                if not dropped:
                    notes.append("page cache NOT dropped")
                if watch.last is not None and watch.last.get("state") == "off":
                    notes.append("hydration off")
                elif watch.end_s is not None:
                    notes.append("hydration %s %.1f s after the server was ready"
                                 % (watch.last.get("state"), watch.end_s))
                elif watch.last is not None:
                    notes.append("hydration %s at the end" % hydration_text(watch.last))
                if which == "second":
                    notes.append(profile[1] if profile else "no profile known")
                row["note"] = "; ".join(x for x in notes + [row.get("note")] if x)
            except (BenchError, subprocess.TimeoutExpired, OSError) as e:
                row.update({"status": "failed", "error": str(e)})
            finally:
                if watch:
                    watch.stop_ev.set()
                try:
                    # Cleanly: the first clone stores its profile when closed.
                    srv.stop()
                except BenchError as e:
                    if row.get("status") == "ok":
                        row.update({"status": "failed", "error": "stop: %s" % e})
                ctx.live.remove(srv)
                if not args.keep:
                    srv.cleanup()
            if which == "first":
                pdata = os.path.join(importer.dir, "data-profile-" + lat)
                info, text = profile_summary(ctx, importer, "base@boot-" + lat, pdata)
                shutil.rmtree(pdata, ignore_errors=True)
                profile = (info, text)
                row["access_profile"] = info
                if info is None:
                    row["note"] = "; ".join(x for x in (row.get("note"), text) if x)
                else:
                    row["note"] = "; ".join(x for x in (row.get("note"), "recorded " + text) if x)
            elif profile:
                row["access_profile"] = profile[0]
            boot_ratio(row, ref)
            yield row
    if not args.keep:
        importer.cleanup()


def boot_text(row):
    if row.get("status") == "ok":
        return "init %.2f s, read-done %.2f s%s%s" % (
            row["init_s"], row["time_s"],
            ", %d store GETs" % row["store_gets"] if row.get("store_gets") is not None else "",
            ", ratio %.3f" % row["ratio"] if row.get("ratio") else "")
    return "FAILED: %s%s" % (row.get("error"), " (not a failed run: a timing)" if row.get("soft") else "")
