"""guestio: fio inside a QEMU guest on its virtio disk, one boot per server
(servers.GUEST_SERVERS: qemu-storage-daemon and strata, over
vhost-user-blk and NBD): the guest's initramfs (busybox, fio and its
libraries, the virtio modules), the boot (GuestFio), its rows and their
ratios to qsd-vhost."""

import contextlib
import json
import os
import re
import shutil
import subprocess
import threading
import time

from ..profiles import finish_perf, start_perf
from ..sampling import CLK_TCK, Sampler, proc_cpu_ticks
from ..servers import GUEST_SERVERS
from ..util import BenchError, MiB, fmt, log, run_cmd, stop_process, tail
from .qemu import BOOT_INIT_TIMEOUT, BootProc, guest_kernel, static_busybox


# Guest-side disk I/O: fio inside a QEMU guest over vhost-user-blk and NBD
# (its own servers, servers.GUEST_SERVERS; see scripts/bench's docstring).
GUESTIO = "guestio"

GUESTIO_TITLE = ("fio inside a QEMU guest (TCG, 2 vCPUs, 512 MiB shared memory (memfd); Debian's kernel from /boot,"
                 " an initramfs of busybox-static, the kernel's virtio modules and the host's fio with its libraries),"
                 " on its virtio disk (/dev/vda, --guestio-size, prefilled from the host), O_DIRECT, one boot per"
                 " server (fio's ioengine in the note): randrw 70/30 4 KiB with 16 and with 64 jobs (threads) at"
                 " QD1 each (IOPS); 1 MiB sequential write, then read, 4 jobs x iodepth 2 (MB/s); 4 KiB random"
                 " read, then write, 1 job at"
                 " QD1 (total latency, mean / p99 µs). ratio (in brackets) = the row's / qsd-vhost's (latency:"
                 " qsd-vhost's / the row's: higher is better); the last column is their geometric mean."
                 " CPU s = the serving process's CPU (user+sys) over the six measures, their ramps included")

GUESTIO_HEAD = ["server", "randrw 16 jobs IOPS", "randrw 64 jobs IOPS", "seq write MB/s", "seq read MB/s",
                "QD1 read mean / p99 µs", "QD1 write mean / p99 µs", "server CPU s", "peak RSS MiB", "ratio"]
GUESTIO_COLS = [(h, "%s") for h in GUESTIO_HEAD]  # cells made by guestio_cells

GUESTIO_BASE = "qsd-vhost"  # guestio's ratios are to this server
GUESTIO_MEM_MIB, GUESTIO_CPUS = 512, 2
# No root filesystem: the guest runs from its initramfs (/gio/init).
GUESTIO_CMDLINE = "console=ttyS0 rdinit=/gio/init panic=-1"
# The measures, in the order the guest runs them (all in one boot).
# "split": each job its own 1/numjobs of the disk (sequential); the others
# roam the whole disk.
GUESTIO_MEASURES = [
    {"name": "randrw-16j", "fio": {"rw": "randrw", "rwmixread": "70", "bs": "4k", "iodepth": "1", "numjobs": "16"}},
    {"name": "randrw-64j", "fio": {"rw": "randrw", "rwmixread": "70", "bs": "4k", "iodepth": "1", "numjobs": "64"}},
    {"name": "seqwrite", "fio": {"rw": "write", "bs": "1M", "iodepth": "2", "numjobs": "4"}, "split": True},
    {"name": "seqread", "fio": {"rw": "read", "bs": "1M", "iodepth": "2", "numjobs": "4"}, "split": True},
    {"name": "randread-qd1", "fio": {"rw": "randread", "bs": "4k", "iodepth": "1", "numjobs": "1"}},
    {"name": "randwrite-qd1", "fio": {"rw": "randwrite", "bs": "4k", "iodepth": "1", "numjobs": "1"}},
]
# What each ratio compares: (measure, row key, higher is better).
GUESTIO_RATIOS = [("randrw-16j", "iops_16j", True), ("randrw-64j", "iops_64j", True),
                  ("seqwrite", "seqw_mbps", True), ("seqread", "seqr_mbps", True),
                  ("randread-qd1", "rd_lat_us", False), ("randwrite-qd1", "wr_lat_us", False)]

# The guest's /gio/init, in an initramfs of its own (not Debian's initrd:
# its 130 MiB unpacked, with fio's ~85 MiB of libraries, overflow the
# 512 MiB guest's rootfs: "Initramfs unpacking failed: write error"):
# /gio/modules (virtio_pci, virtio_blk and their dependencies, from the
# kernel's /lib/modules), a static busybox, fio and the libraries ldd
# lists, run through their own loader. Lines starting GUESTIO are the host's markers;
# each fio's JSON is printed between `GUESTIO json NAME` and
# `GUESTIO end NAME rc=N` (kernel messages off by then).
GUESTIO_INIT = r"""#!/gio/bin/sh
# scripts/bench guestio's guest: finds its virtio disk, runs the fio
# measures on it, prints their JSON on the console, powers off.
export PATH=/gio/bin
mkdir -p /proc /sys /dev /tmp
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev 2>/dev/null
mount -t tmpfs tmp /tmp
echo "GUESTIO init"
for m in @MODULES@; do
    insmod /gio/modules/$m || echo "GUESTIO insmod $m failed"
done
d=
i=0
while [ $i -lt 300 ]; do
    for b in /sys/block/vd*; do
        [ -e "$b" ] && d=${b##*/} && break
    done
    [ -n "$d" ] && [ -b /dev/$d ] && break
    d=
    i=$((i+1))
    sleep 0.1
done
if [ -z "$d" ]; then
    echo "GUESTIO no-disk: no /dev/vd* after 30 s"
    dmesg | grep -iE 'virtio|vd[a-z]|blk' | tail -20
    poweroff -f
fi
FIO="/gio/lib/@LOADER@ --library-path /gio/lib /gio/bin/fio"
if $FIO --enghelp 2>/dev/null | grep -qw libaio; then ENGINE=libaio; else ENGINE=psync; fi
echo "GUESTIO disk /dev/$d sectors=$(cat /sys/block/$d/size) engine=$ENGINE cpus=$(grep -c ^processor /proc/cpuinfo) queues=$(ls /sys/block/$d/mq 2>/dev/null | wc -l) fio=$($FIO --version)"
echo "1 4 1 7" > /proc/sys/kernel/printk
measure() {
    name=$1
    shift
    echo "GUESTIO begin $name"
    $FIO --name=$name --filename=/dev/$d --ioengine=$ENGINE --output-format=json --output=/tmp/$name.json "$@" 2>/tmp/$name.err
    rc=$?
    echo "GUESTIO json $name"
    cat /tmp/$name.json
    echo
    echo "GUESTIO end $name rc=$rc"
    head -c 1500 /tmp/$name.err
}
@MEASURES@
echo "GUESTIO done"
poweroff -f
"""


def guestio_fio_args(m, size, runtime, ramp):
    """The guest's fio options of one measure (besides name, filename,
    ioengine, output), as a list."""
    opts = dict(m["fio"])
    if m.get("split"):
        per_job = size // int(opts["numjobs"]) // MiB * MiB
        opts.update({"size": str(per_job), "offset_increment": str(per_job)})
    opts.update({"direct": "1", "thread": None, "eta": "never", "time_based": None, "runtime": str(runtime),
                 "ramp_time": str(ramp), "group_reporting": None, "randrepeat": "0", "norandommap": None,
                 "lat_percentiles": "1", "percentile_list": "50:99:99.9"})
    return ["--%s=%s" % (k, v) if v is not None else "--" + k for k, v in opts.items()]


def guestio_commands(args):
    """{measure: the guest's fio command line as run, DISK and ENGINE as
    placeholders}."""
    return {m["name"]: " ".join(["fio", "--name=" + m["name"], "--filename=/dev/DISK", "--ioengine=ENGINE"]
                                + guestio_fio_args(m, args.guestio_size, args.runtime, args.ramp))
            for m in GUESTIO_MEASURES}


def cpio_newc(out, entries):
    """Writes a newc cpio archive (what the kernel unpacks as an initramfs)
    of entries (name, mode, data: bytes, a host path to copy, or None;
    rdev (major, minor)) to the open file out."""
    def pad(n):
        return b"\0" * (-n % 4)

    def header(ino, name, mode, size, rdev=(0, 0)):
        namez = name.encode() + b"\0"
        fields = (ino, mode, 0, 0, 1, 0, size, 0, 0, rdev[0], rdev[1], len(namez), 0)
        h = b"070701" + b"".join(b"%08X" % v for v in fields) + namez
        return h + pad(len(h))

    ino = 1
    for name, mode, data, rdev in entries:
        if isinstance(data, str):  # a host file, streamed
            size = os.path.getsize(data)
            out.write(header(ino, name, mode, size, rdev))
            with open(data, "rb") as f:
                shutil.copyfileobj(f, out, 1 << 20)
            out.write(pad(size))
        else:
            data = data or b""
            out.write(header(ino, name, mode, len(data), rdev))
            out.write(data + pad(len(data)))
        ino += 1
    trailer = header(ino, "TRAILER!!!", 0, 0)
    out.write(trailer)
    out.write(b"\0" * (-(out.tell()) % 512))


GUESTIO_MODULES = ("virtio_pci", "virtio_blk")


def kernel_modules(kernel, names):
    """The .ko files (host paths, in load order: dependencies first) of
    names and what they depend on, from /lib/modules/VERSION/modules.dep
    of the kernel /boot/vmlinuz-VERSION (the same package installs both)."""
    version = os.path.basename(kernel)[len("vmlinuz-"):]
    root = os.path.join("/lib/modules", version)
    try:
        with open(os.path.join(root, "modules.dep")) as f:
            deps = {}
            for line in f:
                if ":" in line:
                    mod, rest = line.split(":", 1)
                    deps[mod.strip()] = rest.split()
    except OSError as e:
        raise BenchError("no modules for %s (%s): linux-image-%s" % (kernel, e, version))
    by_name = {re.sub(r"\.ko(\.\w+)?$", "", os.path.basename(m)).replace("-", "_"): m for m in deps}
    order = []

    def add(mod):
        for dep in deps.get(mod, []):
            add(dep)
        if mod not in order:
            order.append(mod)

    for n in names:
        if n not in by_name:
            raise BenchError("%s: no module %s in %s/modules.dep (built in?)" % (kernel, n, root))
        add(by_name[n])
    return [os.path.join(root, m) for m in order]


def guestio_initrd(ctx, kernel, body=None, name="guestio-initrd.img"):
    """The guest's initramfs, an uncompressed newc archive: /gio/init
    (GUESTIO_INIT with the measures, or with `body` in their place),
    /gio/modules (kernel_modules), /gio/bin (static busybox and its
    applets), /gio/bin/fio and /gio/lib (every library `ldd fio` lists, its
    loader too), dev/console. Made once per run and name; returns (path,
    {fio, libs, mib})."""
    made = getattr(ctx, "guestio_imgs", None)
    if made is None:
        made = ctx.guestio_imgs = {}
    if name in made:
        return made[name]
    args = ctx.args
    bb = static_busybox()
    fio = shutil.which("fio")
    if not fio:
        raise BenchError("no fio on the host (apt-get install fio): the guest runs the host's")
    fio = os.path.realpath(fio)
    libs, loader = [], None
    for line in run_cmd(["ldd", fio], "ldd fio").splitlines():
        parts = line.split()
        if "=>" in parts:
            if "not found" in line:
                raise BenchError("fio's library %s not found (ldd)" % parts[0])
            if len(parts) > 2 and parts[2].startswith("/"):
                libs.append((parts[0], parts[2]))
        elif parts and parts[0].startswith("/"):
            loader = os.path.basename(parts[0])
            libs.append((loader, parts[0]))
    if loader is None:
        raise BenchError("ldd %s names no loader: a static fio? (%s)" % (fio, libs))
    lines = []
    for m in GUESTIO_MEASURES:
        lines.append("measure %s %s" % (m["name"], " ".join(
            guestio_fio_args(m, args.guestio_size, args.runtime, args.ramp))))
    modules = []
    for path in kernel_modules(kernel, GUESTIO_MODULES):
        name = os.path.basename(path)
        if path.endswith(".ko.xz"):
            import lzma
            with open(path, "rb") as f_:
                modules.append((name[:-3], lzma.decompress(f_.read())))
        elif path.endswith(".ko.gz"):
            import gzip
            with open(path, "rb") as f_:
                modules.append((name[:-3], gzip.decompress(f_.read())))
        elif path.endswith(".ko"):
            modules.append((name, path))
        else:
            raise BenchError("%s: a compressed module this script cannot unpack" % path)
    init = GUESTIO_INIT.replace("@LOADER@", loader).replace("@MEASURES@", body or "\n".join(lines))
    init = init.replace("@MODULES@", " ".join(n for n, _ in modules))
    d, f = 0o040755, 0o100755
    entries = [("dev", d, None, (0, 0)), ("dev/console", 0o020600, None, (5, 1)), ("proc", d, None, (0, 0)),
               ("sys", d, None, (0, 0)), ("tmp", 0o041777, None, (0, 0)), ("gio", d, None, (0, 0)),
               ("gio/bin", d, None, (0, 0)), ("gio/lib", d, None, (0, 0)), ("gio/modules", d, None, (0, 0))]
    entries += [("gio/modules/" + n, 0o100644, data, (0, 0)) for n, data in modules]
    entries += [
               ("gio/init", f, init.encode(), (0, 0)), ("gio/bin/busybox", f, bb, (0, 0)),
               ("gio/bin/fio", f, fio, (0, 0))]
    for applet in run_cmd([bb, "--list"], "busybox --list").split():
        if applet not in ("busybox", "fio"):
            entries.append(("gio/bin/" + applet, 0o120777, b"busybox", (0, 0)))
    seen = set()
    for name, path in libs:
        if name not in seen:
            seen.add(name)
            entries.append(("gio/lib/" + name, f, os.path.realpath(path), (0, 0)))
    path = os.path.join(ctx.scratch, name)
    with open(path, "wb") as out:
        cpio_newc(out, entries)
        size = out.tell()
    made[name] = (path, {"fio": fio, "libs": len(seen), "mib": round(size / MiB, 1),
                         "modules": [n for n, _ in modules]})
    return made[name]


def guestio_qemu_argv(kernel, initrd):
    """QEMU's arguments for a guest booting `kernel` with guestio's
    initramfs `initrd` (TCG, GUESTIO_CPUS vCPUs, GUESTIO_MEM_MIB of RAM);
    the caller adds its disk and console."""
    return ["qemu-system-x86_64", "-machine", "q35", "-accel", "tcg,thread=multi",
            "-smp", str(GUESTIO_CPUS), "-m", "%dM" % GUESTIO_MEM_MIB,
            "-nodefaults", "-display", "none", "-no-reboot",
            "-kernel", kernel, "-initrd", initrd, "-append", GUESTIO_CMDLINE]


class GuestFio:
    """One boot of the guestio guest on a server's disk: QEMU with the
    console on its stdout, read by a thread that timestamps each line,
    collects each measure's JSON and samples the server's and QEMU's CPU
    at each measure's start and end. run() -> a result dict; QEMU is
    killed on every way out."""

    def __init__(self, ctx, d, kernel, initrd, disk_args, server_pid):
        self.ctx, self.d = ctx, d
        self.kernel, self.initrd, self.disk_args, self.server_pid = kernel, initrd, disk_args, server_pid
        self.console = os.path.join(d, "console.log")
        self.log = os.path.join(d, "qemu.log")
        self.lines = []  # (seconds from QEMU's start, line)
        self.marks = {}  # "init", "disk", "no-disk", "done", "begin NAME", "json NAME", "end NAME" -> (t, line, cpu)
        self.json = {}  # measure -> its fio JSON text
        self.qemu_pid = None

    def argv(self):
        # Shared memory: a vhost-user-blk backend maps the guest's RAM.
        return guestio_qemu_argv(self.kernel, self.initrd) + [
            "-object", "memory-backend-memfd,id=mem,size=%dM,share=on" % GUESTIO_MEM_MIB,
            "-numa", "node,memdev=mem"] + list(self.disk_args) + [
            "-chardev", "stdio,id=con,signal=off", "-serial", "chardev:con"]

    def command(self):
        return " ".join(self.argv()).replace(self.initrd, "INITRD")

    def cpu_now(self):
        out = []
        for pid in (self.server_pid, self.qemu_pid):
            try:
                out.append(proc_cpu_ticks(pid) / CLK_TCK if pid else None)
            except (OSError, IndexError, ValueError):
                out.append(None)
        return tuple(out)

    def read_console(self, out, t0):
        capture = None
        with open(self.console, "wb") as f:
            for raw in iter(out.readline, b""):
                t = time.time() - t0
                f.write(raw)
                f.flush()
                line = raw.decode(errors="replace").rstrip("\r\n")
                self.lines.append((t, line))
                # fio's progress lines end in no newline: a marker may
                # follow one on the same line.
                s = line[line.find("GUESTIO "):].strip() if "GUESTIO " in line else ""
                if s:
                    words = s.split()
                    key = words[1].rstrip(":")
                    if key in ("begin", "json", "end") and len(words) > 2:
                        key += " " + words[2]
                    if key not in self.marks:
                        self.marks[key] = (t, s, self.cpu_now())
                    if key.startswith("json "):
                        capture = (key[5:], [])
                        continue
                    if key.startswith("end ") and capture:
                        self.json[capture[0]] = "\n".join(capture[1])
                        capture = None
                if capture is not None:
                    capture[1].append(line)

    def tail(self, n=15):
        return " | ".join(l for _, l in self.lines[-n:] if l.strip())

    def run(self, measure_timeout):
        """Boots, waits for every measure; returns {status: ok|timeout|exited,
        why, boot_s, disk_line, measures: {name: {t0, t1, rc, json, cpu_s,
        qemu_cpu_s}}, peak_rss, exit_code}."""
        logf = open(self.log, "ab")
        res = {"status": "ok"}
        sampler = Sampler(self.server_pid) if self.server_pid else None
        t0 = time.time()
        proc = subprocess.Popen(self.argv(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=logf,
                                start_new_session=True)
        self.qemu_pid = proc.pid
        holder = BootProc(proc)
        self.ctx.live.append(holder)
        reader = threading.Thread(target=self.read_console, args=(proc.stdout, t0), daemon=True)
        reader.start()
        waits = [(("init",), BOOT_INIT_TIMEOUT), (("disk", "no-disk"), 120)]
        for m in GUESTIO_MEASURES:
            waits.append((("end " + m["name"],), measure_timeout))
        waits.append((("done",), 60))
        try:
            with (sampler if sampler else contextlib.nullcontext()):
                t_last = t0
                for keys, limit in waits:
                    while not any(k in self.marks for k in keys):
                        if proc.poll() is not None:
                            reader.join(5)
                            if any(k in self.marks for k in keys):
                                break
                            res.update({"status": "exited", "exit_code": proc.returncode,
                                        "why": "QEMU exited (%s) before %r" % (proc.returncode, keys[0])})
                            break
                        if time.time() - t_last > limit:
                            res.update({"status": "timeout",
                                        "why": "no %r within %d s" % (keys[0], limit)})
                            break
                        time.sleep(0.05)
                    if res["status"] != "ok":
                        break
                    if "no-disk" in self.marks:
                        res.update({"status": "failed", "why": "the guest saw no disk: " + self.marks["no-disk"][1]})
                        break
                    t_last = time.time()
                if res["status"] == "ok":
                    try:
                        res["exit_code"] = proc.wait(60)  # poweroff -f; -no-reboot
                    except subprocess.TimeoutExpired:
                        res["exit_code"] = None
        finally:
            stop_process(proc, timeout=10)
            reader.join(10)
            self.ctx.live.remove(holder)
            logf.close()
        if sampler:
            res["peak_rss"] = sampler.window(t0)[1]
        if "init" in self.marks:
            res["boot_s"] = self.marks["init"][0]
        if "disk" in self.marks:
            res["disk_line"] = self.marks["disk"][1]
        measures = {}
        for m in GUESTIO_MEASURES:
            n = m["name"]
            b, j, e = (self.marks.get("%s %s" % (k, n)) for k in ("begin", "json", "end"))
            if not (b and j and e):
                continue
            rc = re.search(r"rc=(\d+)", e[1])
            measures[n] = {"t0": b[0], "t1": j[0], "rc": int(rc.group(1)) if rc else None,
                           "json": self.json.get(n, ""),
                           "cpu_s": j[2][0] - b[2][0] if None not in (j[2][0], b[2][0]) else None,
                           "qemu_cpu_s": j[2][1] - b[2][1] if None not in (j[2][1], b[2][1]) else None,
                           "err": self.err_after(e[0])}
        res["measures"] = measures
        if res["status"] != "ok":
            qemu = tail(self.log, 3)
            res["tail"] = (self.tail() or "(no console output)") + (" / QEMU: " + qemu if qemu else "")
        return res

    def err_after(self, t):
        """The console lines right after an end marker (fio's stderr)."""
        out = []
        for tl, l in self.lines:
            if tl <= t or not l.strip():
                continue
            if l.startswith("GUESTIO"):
                break
            out.append(l)
        return " | ".join(out[:6])


def guestio_summary(text):
    """A guest fio JSON -> {iops, mbps, read/write: {iops, mbps, lat_mean_us,
    lat_p50_us, lat_p99_us, lat_p999_us}} (total latency: lat_ns)."""
    data = json.loads(text[text.index("{"):])
    job = data["jobs"][0]
    if job.get("error"):
        raise BenchError("fio job error %s" % job["error"])
    out = {"iops": 0.0, "mbps": 0.0}
    for d in ("read", "write"):
        s = job[d]
        out["iops"] += s["iops"]
        out["mbps"] += s["bw_bytes"] / 1e6
        if not s["total_ios"]:
            continue
        lat = s.get("lat_ns") or {}
        pct = lat.get("percentile") or s.get("clat_ns", {}).get("percentile") or {}

        def p(key):
            return pct[key] / 1000.0 if key in pct else None

        out[d] = {"iops": s["iops"], "mbps": s["bw_bytes"] / 1e6, "lat_mean_us": lat.get("mean", 0) / 1000.0,
                  "lat_p50_us": p("50.000000"), "lat_p99_us": p("99.000000"), "lat_p999_us": p("99.900000")}
    return out


def guestio_row(srv, res, commands):
    row = {"server": srv.name, "workload": GUESTIO, "boot_s": res.get("boot_s"), "disk": res.get("disk_line")}
    measures = {}
    errors = []
    for m in GUESTIO_MEASURES:
        n = m["name"]
        r = res["measures"].get(n)
        if r is None:
            continue
        entry = {"seconds": r["t1"] - r["t0"], "cpu_s": r["cpu_s"], "qemu_cpu_s": r["qemu_cpu_s"], "rc": r["rc"]}
        try:
            entry.update(guestio_summary(r["json"]))
        except (ValueError, KeyError, IndexError, BenchError) as e:
            errors.append("%s: fio rc=%s, %s: %s" % (n, r["rc"], e, r["err"][:500]))
        if r["rc"] and not errors:
            errors.append("%s: fio rc=%s: %s" % (n, r["rc"], r["err"][:500]))
        measures[n] = entry
    row["measures"] = measures
    if res["status"] != "ok" or errors:
        row.update({"status": "failed", "soft": res["status"] == "timeout",
                    "error": res.get("why") or "; ".join(errors),
                    "note": "console: " + res.get("tail", "")[-1500:] if res.get("tail") else None})
        return row
    missing = [x["name"] for x in GUESTIO_MEASURES if x["name"] not in measures]
    if missing:
        row.update({"status": "failed", "error": "no result for %s" % ", ".join(missing),
                    "note": "console: " + (res.get("tail") or "")[-1500:]})
        return row
    m = measures
    row.update({"status": "ok",
                "iops_16j": m["randrw-16j"]["iops"], "iops_64j": m["randrw-64j"]["iops"],
                "seqw_mbps": m["seqwrite"]["mbps"], "seqr_mbps": m["seqread"]["mbps"],
                "rd_lat_us": m["randread-qd1"]["read"]["lat_mean_us"],
                "rd_p99_us": m["randread-qd1"]["read"]["lat_p99_us"],
                "wr_lat_us": m["randwrite-qd1"]["write"]["lat_mean_us"],
                "wr_p99_us": m["randwrite-qd1"]["write"]["lat_p99_us"],
                "iops": m["randrw-16j"]["iops"]})
    cpus = [x["cpu_s"] for x in m.values()]
    qcpus = [x["qemu_cpu_s"] for x in m.values()]
    row["cpu_s"] = sum(cpus) if None not in cpus else None
    row["qemu_cpu_s"] = sum(qcpus) if None not in qcpus else None
    row["measured_s"] = sum(x["seconds"] for x in m.values())
    row["peak_rss_mib"] = res["peak_rss"] / MiB if res.get("peak_rss") else None
    notes = ["boot %.1f s" % row["boot_s"] if row.get("boot_s") is not None else "",
             (res.get("disk_line") or "").replace("GUESTIO disk ", "guest: "),
             "CPU over %.0f s of measures; QEMU CPU %s s" % (row["measured_s"], fmt(row["qemu_cpu_s"], "%.1f")),
             "server CPU s per measure: " + ", ".join("%s %s" % (k, fmt(v["cpu_s"], "%.1f")) for k, v in m.items())]
    if getattr(srv, "note", None):
        notes.insert(0, srv.note())
    row["note"] = "; ".join(x for x in notes if x)
    row["fio"] = " ; ".join(commands[x["name"]] for x in GUESTIO_MEASURES)
    return row


def add_guestio_ratios(rows):
    """Each guestio row's ratios to qsd-vhost's (latency: base / row) and
    their geometric mean (ratio)."""
    base = next((r for r in rows if r["workload"] == GUESTIO and r["server"] == GUESTIO_BASE
                 and r.get("status") == "ok"), None)
    if base is None:
        return
    for r in rows:
        if r["workload"] != GUESTIO or r.get("status") != "ok":
            continue
        ratios = {}
        for name, key, higher in GUESTIO_RATIOS:
            a, b = r.get(key), base.get(key)
            if a and b:
                ratios[name] = a / b if higher else b / a
        for key in ("rd_p99_us", "wr_p99_us"):
            if r.get(key) and base.get(key):
                ratios[key[:2] + "-p99"] = base[key] / r[key]
        r["ratios"] = ratios
        main = [ratios[n] for n, _, _ in GUESTIO_RATIOS if n in ratios]
        if len(main) == len(GUESTIO_RATIOS):
            g = 1.0
            for v in main:
                g *= v
            r["ratio"] = g ** (1.0 / len(main))


def guestio_cells(r):
    ratios = r.get("ratios") or {}

    def with_ratio(v, spec, measure):
        x = ratios.get(measure)
        return fmt(v, spec) + (" (%.2f)" % x if x is not None and r["server"] != GUESTIO_BASE else "")

    def lat(mean, p99, measure):
        x = ratios.get(measure)
        return "%s / %s" % (fmt(mean, "%.0f"), fmt(p99, "%.0f")) + (
            " (%.2f)" % x if x is not None and r["server"] != GUESTIO_BASE else "")

    return [r["server"], with_ratio(r.get("iops_16j"), "%.0f", "randrw-16j"),
            with_ratio(r.get("iops_64j"), "%.0f", "randrw-64j"), with_ratio(r.get("seqw_mbps"), "%.1f", "seqwrite"),
            with_ratio(r.get("seqr_mbps"), "%.1f", "seqread"),
            lat(r.get("rd_lat_us"), r.get("rd_p99_us"), "randread-qd1"),
            lat(r.get("wr_lat_us"), r.get("wr_p99_us"), "randwrite-qd1"),
            fmt(r.get("cpu_s"), "%.1f"), fmt(r.get("peak_rss_mib"), "%.0f"), fmt(r.get("ratio"), "%.3f")]


def guestio_text(row):
    if row.get("status") == "ok":
        return "randrw %.0f / %.0f IOPS (16 / 64 jobs), seq %.0f / %.0f MB/s (w / r), QD1 %.0f / %.0f µs (r / w)" \
               ", CPU %s s%s" % (row["iops_16j"], row["iops_64j"], row["seqw_mbps"], row["seqr_mbps"],
                                 row["rd_lat_us"], row["wr_lat_us"], fmt(row.get("cpu_s"), "%.1f"),
                                 ", boot %.1f s" % row["boot_s"] if row.get("boot_s") is not None else "")
    return "FAILED: %s%s" % (row.get("error"), " (not a failed run)" if row.get("soft") else "")


def run_guestio(ctx, server_classes):
    """guestio: one boot per server, the six measures in it (see
    GUESTIO_TITLE). Yields (row, server class) as they are measured."""
    args = ctx.args
    try:
        kernel, _ = guest_kernel()
        initrd, info = guestio_initrd(ctx, kernel)
        log("    guest initramfs: %.1f MiB (busybox, %s and its %d libraries, modules %s)"
            % (info["mib"], info["fio"], info["libs"], " ".join(info["modules"])))
    except (BenchError, subprocess.TimeoutExpired, OSError) as e:
        yield {"server": "guest image", "workload": GUESTIO, "status": "failed",
               "error": "guest initramfs: %s" % e}, GUEST_SERVERS[0]
        return
    commands = guestio_commands(args)
    measure_timeout = 3 * (args.runtime + args.ramp) + 180
    for cls in server_classes:
        log("==> %-10s %-16s" % (GUESTIO, cls.name))
        srv = cls(ctx, args.guestio_size, GUESTIO)
        ctx.live.append(srv)
        row = {"server": srv.name, "workload": GUESTIO}
        try:
            srv.start()
            srv.prefill()
            guest = GuestFio(ctx, srv.dir, kernel, initrd, srv.guest_disk_args(), srv.pid)
            # --profile: strata's own CPU per request under the guest's
            # measures (the guest's CPU is QEMU's, not profiled here).
            perf = start_perf(ctx, srv) if args.profile and srv.name.startswith("strata") else None
            try:
                res = guest.run(measure_timeout)
            finally:
                profile = finish_perf(ctx, perf, srv.name) if perf else None
            row = guestio_row(srv, res, commands)
            if profile:
                row["profile"] = profile
            row["qemu"] = guest.command()
            row["disk_args"] = " ".join(srv.guest_disk_args())
        except (BenchError, subprocess.TimeoutExpired, OSError) as e:
            row.update({"status": "failed", "error": str(e.args[0]) if isinstance(e, BenchError) else str(e)})
            if isinstance(e, BenchError) and e.args[1:] == ("soft",):
                row["soft"] = True
        finally:
            try:
                srv.stop()
            except BenchError as e:
                if row.get("status") == "ok":
                    row.update({"status": "failed", "error": "stop: %s" % e})
            ctx.live.remove(srv)
            if not args.keep:
                srv.cleanup()
        yield row, cls
