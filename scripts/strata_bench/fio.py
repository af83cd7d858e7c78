"""fio: the fio workloads (WORKLOADS: one fio run per server, each with its
ratio to nbdkit-memory), fio's command line, runs and their summary
(IOPS, MB/s, latency percentiles), the prefill, and run_one: one such
workload on one fresh server, sampled. COLS and HEAD are their table's."""

import contextlib
import json
import os
import subprocess
import time

from .load import host_load
from .profiles import finish_perf, start_perf
from .sampling import Sampler, host_busy, host_cpu_ticks
from .util import BenchError, MiB


# Each workload: fio options (besides engine/target/size/time), the
# direction whose latency is reported, and whether the volume is filled
# before (reads must not read never-written blocks, which some servers
# answer without touching storage).
WORKLOADS = [
    {
        "name": "randrw",
        "title": "randrw 70/30 4 KiB, iodepth 32 x 4 jobs (the Hive yardstick)",
        "fio": {"rw": "randrw", "rwmixread": "70", "bs": "4k", "iodepth": "32"},
        "numjobs": 4,
        "lat_dir": "read",
        "prefill": True,
    },
    {
        "name": "randrw-restart",
        "title": "randrw 70/30 4 KiB, iodepth 32 x 4 jobs, after a clean restart that keeps the data dir"
                 " (strata only: the disk cache must still hold what was written)",
        "fio": {"rw": "randrw", "rwmixread": "70", "bs": "4k", "iodepth": "32"},
        "numjobs": 4,
        "lat_dir": "read",
        "prefill": True,
        "restart": True,
        "strata_only": True,
    },
    {
        "name": "randread",
        "title": "randread 4 KiB, iodepth 128 x 4 jobs",
        "fio": {"rw": "randread", "bs": "4k", "iodepth": "128"},
        "numjobs": 4,
        "lat_dir": "read",
        "prefill": True,
    },
    {
        "name": "seqwrite",
        "title": "sequential write 1 MiB, iodepth 8",
        "fio": {"rw": "write", "bs": "1M", "iodepth": "8"},
        "numjobs": 1,
        "lat_dir": "write",
        "prefill": False,
    },
    {
        "name": "seqwrite-flush",
        "title": "sequential write 1 MiB, iodepth 8, FLUSH every 64 writes (fsync=64): every server must"
                 " get the data to disk, as strata does with each segment (plain seqwrite lets a file"
                 " server keep overwriting its page cache: the disk column shows what reached the disk)",
        "fio": {"rw": "write", "bs": "1M", "iodepth": "8", "fsync": "64"},
        "numjobs": 1,
        "lat_dir": "write",
        "prefill": False,
    },
    {
        "name": "seqread",
        "title": "sequential read 1 MiB, iodepth 8",
        "fio": {"rw": "read", "bs": "1M", "iodepth": "8"},
        "numjobs": 1,
        "lat_dir": "read",
        "prefill": True,
    },
    {
        "name": "seqread-aged",
        "title": "sequential read 1 MiB, iodepth 8, after 15 s of randrw 70/30 4 KiB over the filled volume"
                 " (data written randomly, read sequentially: backups, image copies, file scans)",
        "fio": {"rw": "read", "bs": "1M", "iodepth": "8"},
        "numjobs": 1,
        "lat_dir": "read",
        "prefill": True,
        "age_s": 15,
    },
    {
        "name": "fsyncwrite",
        "title": "random write 4 KiB, iodepth 1, FLUSH after every write (fsync=1)",
        "fio": {"rw": "randwrite", "bs": "4k", "iodepth": "1", "fsync": "1"},
        "numjobs": 1,
        "lat_dir": "write",
        "prefill": False,
    },
]

# A fio workload's table (coldread's and space's too).
COLS = [("server", "%s"), ("iops", "%.0f"), ("mbps", "%.1f"), ("p50_us", "%.0f"), ("p99_us", "%.0f"),
        ("p999_us", "%.0f"), ("cpu_s", "%.2f"), ("peak_rss_mib", "%.0f"), ("ratio", "%.3f")]
HEAD = ["server", "IOPS", "MB/s", "p50 µs", "p99 µs", "p99.9 µs", "CPU s", "peak RSS MiB", "ratio"]


def fio_argv(name, target, opts, output):
    """fio's arguments; target keys starting with "_" are not fio's."""
    argv = ["fio", "--name=" + name, "--output-format=json", "--output=" + output]
    for k, v in list(target.items()) + list(opts.items()):
        if k.startswith("_"):
            continue
        argv.append("--%s=%s" % (k, v) if v is not None else "--" + k)
    return argv


def run_fio(name, target, opts, output, timeout):
    argv = fio_argv(name, target, opts, output)
    env = None
    if "_home" in target:
        # libnbd finds TLS credentials in $HOME/.pki/libnbd (fio's URIs may
        # not name local files).
        env = dict(os.environ, HOME=target["_home"])
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    try:
        with open(output) as f:
            text = f.read()
        # fio may print notes before the JSON document.
        data = json.loads(text[text.index("{"):])
    except (OSError, ValueError) as e:
        raise BenchError("fio %s: no JSON output (%s): %s" % (name, e, (r.stderr or r.stdout)[-500:]))
    errors = [j.get("error", 0) for j in data.get("jobs", [])]
    if r.returncode != 0 or any(errors):
        raise BenchError("fio %s: exit %d, job errors %s: %s" % (name, r.returncode, errors,
                                                              (r.stderr or "")[-500:]))
    return argv, data


def fio_summary(data, lat_dir):
    """IOPS, MB/s (10^6 B/s), latency percentiles (µs) of the group-reported job."""
    job = data["jobs"][0]
    iops = bw = 0.0
    for d in ("read", "write"):
        iops += job[d]["iops"]
        bw += job[d]["bw_bytes"]
    d = job[lat_dir]
    pct = d.get("clat_ns", {}).get("percentile", {}) if d["total_ios"] else {}

    def p(key):
        v = pct.get(key)
        return v / 1000.0 if v is not None else None

    res = {"iops": iops, "mbps": bw / 1e6, "lat_dir": lat_dir,
           "p50_us": p("50.000000"), "p99_us": p("99.000000"), "p999_us": p("99.900000")}
    notes = []
    if job["read"]["total_ios"] and job["write"]["total_ios"]:
        wp = job["write"].get("clat_ns", {}).get("percentile", {})
        res["write_p99_us"] = wp.get("99.000000", 0) / 1000.0
        notes.append("write p99 %.0f µs" % res["write_p99_us"])
    sync = job.get("sync", {})
    if sync.get("total_ios"):
        sp = sync.get("lat_ns", {}).get("percentile", {})
        res["flush_us"] = {k: sp.get(v, 0) / 1000.0 for k, v in
                           (("p50", "50.000000"), ("p99", "99.000000"), ("p99.9", "99.900000"))}
        notes.append("FLUSH p50/p99/p99.9 %.0f/%.0f/%.0f µs" % tuple(res["flush_us"].values()))
    if notes:
        res["note"] = "; ".join(notes)
    return res


def disk_written_bytes():
    """Bytes written to this machine's disks so far (/sys/block/*/stat,
    sectors written, whole devices with a driver: no loop, dm or md
    devices, which would count the same bytes twice). None if unknown."""
    total = 0
    try:
        for dev in os.listdir("/sys/block"):
            if not os.path.exists("/sys/block/%s/device" % dev):
                continue
            with open("/sys/block/%s/stat" % dev) as f:
                total += int(f.read().split()[6]) * 512
    except (OSError, ValueError, IndexError):
        return None
    return total


def prefill_opts(size, timeout_s):
    return {"rw": "write", "bs": "1M", "iodepth": "8", "size": str(size), "end_fsync": "1",
            "refill_buffers": None}


def measured_opts(wl, size, runtime, ramp):
    nj = wl["numjobs"]
    opts = dict(wl["fio"])
    per_job = size // nj // MiB * MiB
    opts.update({"size": str(per_job), "numjobs": str(nj), "time_based": None,
                 "runtime": str(runtime), "ramp_time": str(ramp), "group_reporting": None,
                 "percentile_list": "50:99:99.9", "randrepeat": "0", "norandommap": None,
                 "refill_buffers": None})
    if nj > 1:
        opts["offset_increment"] = str(per_job)
    return opts


def run_one(ctx, server_cls, wl, profile=False):
    """One workload on one fresh server (under the workload's load, if it
    has one: load.py). Returns a result row."""
    args = ctx.args
    tag = wl["name"] + ("-profile" if profile else "")
    srv = server_cls(ctx, args.size, tag)
    ctx.live.append(srv)
    row = {"server": srv.name, "workload": wl["name"]}
    fio_timeout = args.runtime + args.ramp + 600
    load = contextlib.ExitStack()
    try:
        load.enter_context(host_load(ctx, wl.get("load")))
        srv.start()
        target = srv.fio_target()
        if wl["prefill"]:
            run_fio("prefill", target, prefill_opts(args.size, fio_timeout),
                    os.path.join(srv.dir, "prefill.json"), fio_timeout)
        if wl.get("restart"):
            srv.stop()
            srv.start(create=False, keep_data=True)
            target = srv.fio_target()
        if wl.get("age_s"):
            # Unmeasured: random overwrites scatter the data first.
            age = measured_opts(WORKLOADS[0], args.size, 1 if args.quick else wl["age_s"], 0)
            run_fio("age", target, age, os.path.join(srv.dir, "age.json"), fio_timeout)
        opts = measured_opts(wl, args.size, args.runtime, args.ramp)
        perf = start_perf(ctx, srv) if profile else None
        with Sampler(srv.pid) as sampler:
            t0, h0 = time.time(), host_cpu_ticks()
            disk0 = disk_written_bytes()
            argv, data = run_fio(wl["name"], target, opts, os.path.join(srv.dir, "fio.json"), fio_timeout)
            disk1 = disk_written_bytes()
            fio_s = time.time() - t0
            row["host_busy"] = host_busy(h0, host_cpu_ticks())
        load.close()
        if perf:
            row["profile"] = finish_perf(ctx, perf)
        cpu, rss = sampler.window(t0 + args.ramp)
        row.update(fio_summary(data, wl["lat_dir"]))
        if disk0 is not None and disk1 is not None and wl["lat_dir"] == "write":
            # Ramp included (the counters cannot tell it apart): a rate
            # over the whole fio run, next to the measured client rate.
            row["disk_write_mbps"] = (disk1 - disk0) / fio_s / 1e6
            row["note"] = "; ".join(x for x in ("disk written %.0f MB/s" % row["disk_write_mbps"],
                                                 row.get("note")) if x)
        if getattr(srv, "note", None):
            row["note"] = "; ".join(x for x in (srv.note(), row.get("note")) if x)
        if row["host_busy"] is not None:
            row["note"] = "; ".join(x for x in (row.get("note"), "host CPUs busy %.0f%%%s"
                                                % (row["host_busy"] * 100,
                                                   " (%s beside)" % wl["load"] if wl.get("load") else "")) if x)
        row.update({"cpu_s": cpu, "peak_rss_mib": rss / MiB if rss else None, "status": "ok",
                    "fio": " ".join(a for a in argv if not a.startswith("--output"))})
    except (BenchError, subprocess.TimeoutExpired, OSError) as e:
        row.update({"status": "failed", "error": str(e)})
    finally:
        load.close()
        try:
            srv.stop()
        except BenchError as e:
            if row.get("status") == "ok":
                row.update({"status": "failed", "error": str(e)})
        ctx.live.remove(srv)
        srv.release()
        if not args.keep:
            srv.cleanup()
    return row


def generic_fio(cmd):
    """The fio command line with the per-server target replaced by a placeholder."""
    return " ".join("--uri=nbd+unix:///EXPORT?socket=SOCK" if a.startswith("--uri=") else a
                    for a in cmd.split(" "))
