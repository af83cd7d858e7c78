"""manyvolumes: a VM host: N volumes served by one `strata serve`: time to
ready, idle RSS, local disk and CPU; 16 of them busy (IOPS, Jain's
fairness index, peak RSS); the FLUSH p99 of 8 quiet volumes, alone and
next to a noisy one."""

import json
import os
import subprocess
import time

from ..sampling import CLK_TCK, Sampler, proc_cpu_ticks, proc_rss
from ..util import BenchError, GiB, MiB, spawn, wait_for


# A VM host: many volumes on one server (issue 27). Created, then served
# by one `strata serve`: time to ready, idle RSS, local disk and CPU; then
# 16 of them written at once (fio randwrite 4 KiB QD4 each): total IOPS,
# Jain's fairness index over the 16, peak RSS.
MANYVOLS = "manyvolumes"
MANYVOLS_TITLE = ("N volumes of 8 GiB created, then served by one `strata serve` (no --volume): start to"
                  " `ready`, RSS and local disk (data dir) after 10 s idle (quick: 1 s), CPU over the next 10 s"
                  " idle (per 10 s); then"
                  " 16 of them written at once (fio randwrite 4 KiB, iodepth 4 each, one job per volume):"
                  " total IOPS, Jain's fairness index of the 16 volumes' IOPS, peak RSS")

# manyvolumes' rows are one server each.
MANYVOLS_COLS = [("server", "%s"), ("ready_s", "%.2f"), ("idle_rss_mib", "%.0f"), ("disk_mib", "%.1f"),
                 ("idle_cpu_s", "%.2f"), ("iops", "%.0f"), ("jain", "%.3f"), ("peak_rss_mib", "%.0f"),
                 ("flush_p99_us", "%.0f"), ("flush_p99_noisy_us", "%.0f")]
MANYVOLS_HEAD = ["server", "ready s", "idle RSS MiB", "local disk MiB", "idle CPU s/10 s", "16 busy IOPS",
                 "Jain", "peak RSS MiB", "FLUSH p99 µs", "FLUSH p99 µs, noisy"]

MANYVOLS_BUSY = 16


def jain_index(xs):
    """Jain's fairness index: 1 when all equal, 1/n when one takes all."""
    xs = [float(x) for x in xs]
    sq = sum(x * x for x in xs)
    return (sum(xs) ** 2) / (len(xs) * sq) if sq else None


def create_volumes(ctx, store, data, env, n, size):
    """`strata volume create` of v1..vn, 8 at a time; seconds taken."""
    from concurrent.futures import ThreadPoolExecutor
    t0 = time.time()

    def one(i):
        r = subprocess.run([ctx.strata, "--store", store, "--data-dir", data, "volume", "create",
                            "v%d" % i, "--size", str(size), "--compression", "none"],
                           capture_output=True, text=True, env=env, timeout=300)
        if r.returncode != 0:
            raise BenchError("volume create v%d: %s" % (i, r.stderr.strip()[-300:]))

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(1, n + 1)))
    return time.time() - t0


def dir_bytes(path):
    """Disk space a directory tree takes (allocated blocks, as du)."""
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_blocks * 512
            except OSError:
                pass
    return total


def flush_neighbour(ctx, srv, n):
    """FLUSH p99 (µs) of 8 volumes doing 4 KiB write + FLUSH at QD1, alone
    and next to one volume writing 1 MiB blocks at QD32; that volume's
    MB/s."""
    quiet = ["v%d" % i for i in range(1, min(8, n) + 1)]
    heavy = "v%d" % min(9, n)
    runtime = max(2 if ctx.args.quick else 5, ctx.args.runtime // 2)
    res, heavy_mbps = [], None
    for noisy in (False, True):
        out = os.path.join(srv.dir, "flush-%s.json" % ("noisy" if noisy else "quiet"))
        argv = ["fio", "--output-format=json", "--output=" + out, "--ioengine=nbd", "--time_based",
                "--runtime=%d" % runtime, "--ramp_time=1", "--randrepeat=0", "--norandommap", "--size=1g"]
        for v in quiet:
            argv += ["--name=" + v, "--uri=nbd+unix:///%s?socket=%s" % (v, srv.sock), "--rw=randwrite",
                     "--bs=4k", "--iodepth=1", "--fsync=1"]
        if noisy:
            argv += ["--name=heavy", "--uri=nbd+unix:///%s?socket=%s" % (heavy, srv.sock), "--rw=write",
                     "--bs=1M", "--iodepth=32"]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=runtime + 300)
        if r.returncode != 0:
            raise BenchError("fio (flush): exit %d: %s" % (r.returncode, r.stderr[-300:]))
        with open(out) as f:
            text = f.read()
        data = json.loads(text[text.index("{"):])
        p99s = [j["sync"]["lat_ns"]["percentile"]["99.000000"] / 1000.0
                for j in data["jobs"] if j["jobname"] in quiet and j.get("sync", {}).get("total_ios")]
        res.append(max(p99s) if p99s else None)
        if noisy:
            # What pacing the heavy volume costs it (journal_disk.rs,
            # staged_segment.rs: it waits for its writeback while the
            # others FLUSH).
            heavy_mbps = sum(j["write"]["bw_bytes"] for j in data["jobs"] if j["jobname"] == "heavy") / 1e6
    return res[0], res[1], heavy_mbps


def run_manyvolumes(ctx, cls):
    """One server, many volumes: start, idle cost, 16 busy (see MANYVOLS_TITLE)."""
    args = ctx.args
    n = args.manyvolumes
    srv = cls(ctx, 8 * GiB, MANYVOLS)
    ctx.live.append(srv)
    row = {"server": "%s %d volumes" % (srv.name, n), "workload": MANYVOLS, "volumes": n}
    data = os.path.join(srv.dir, "data")
    env = srv.env()
    try:
        created_s = create_volumes(ctx, srv.store(), data, env, n, 8 * GiB)
        out = os.path.join(srv.dir, "serve.out")
        argv = [ctx.strata, "--store", srv.store(), "--data-dir", data, "serve", "--listen", "unix:" + srv.sock]
        argv += list(args.strata_args.split())
        t0 = time.time()
        with open(out, "wb") as outf:
            srv.proc = spawn(argv, srv.log, env=env, stdout=outf)

        def ready():
            try:
                with open(out) as f:
                    return "ready" in f.read().split()
            except OSError:
                return False

        wait_for(ready, srv.proc, srv.name, srv.log, timeout=600)
        ready_s = time.time() - t0
        idle_s = 1 if args.quick else 10
        time.sleep(idle_s)
        idle_rss = proc_rss(srv.proc.pid)
        disk = dir_bytes(data)
        c0 = proc_cpu_ticks(srv.proc.pid)
        time.sleep(idle_s)
        # CPU seconds per 10 s idle.
        idle_cpu = (proc_cpu_ticks(srv.proc.pid) - c0) / CLK_TCK * 10 / idle_s
        busy = min(MANYVOLS_BUSY, n)
        fio_out = os.path.join(srv.dir, "fio.json")
        fargv = ["fio", "--output-format=json", "--output=" + fio_out, "--ioengine=nbd", "--rw=randwrite",
                 "--bs=4k", "--iodepth=4", "--size=1g", "--time_based", "--runtime=%d" % args.runtime,
                 "--ramp_time=%d" % args.ramp, "--randrepeat=0", "--norandommap"]
        for i in range(1, busy + 1):
            fargv += ["--name=v%d" % i, "--uri=nbd+unix:///v%d?socket=%s" % (i, srv.sock)]
        with Sampler(srv.proc.pid) as sampler:
            t1 = time.time()
            r = subprocess.run(fargv, capture_output=True, text=True, timeout=args.runtime + args.ramp + 600)
        _, peak = sampler.window(t1)
        with open(fio_out) as f:
            text = f.read()
        fdata = json.loads(text[text.index("{"):])
        if r.returncode != 0:
            raise BenchError("fio: exit %d: %s" % (r.returncode, r.stderr[-300:]))
        per = [j["write"]["iops"] for j in fdata["jobs"]]
        total = sum(per)
        jain = jain_index(per)
        quiet_p99, noisy_p99, heavy_mbps = flush_neighbour(ctx, srv, n)
        row.update({"status": "ok", "created_s": created_s, "ready_s": ready_s,
                    "idle_rss_mib": idle_rss / MiB, "disk_mib": disk / MiB, "idle_cpu_s": idle_cpu,
                    "iops": total, "jain": jain, "peak_rss_mib": peak / MiB if peak else None,
                    "flush_p99_us": quiet_p99, "flush_p99_noisy_us": noisy_p99, "heavy_mbps": heavy_mbps,
                    "fio": " ".join(a for a in fargv if not a.startswith("--output"))})
        row["note"] = ("%d volumes created in %.1f s; ready %.2f s after start; idle: RSS %.0f MiB, "
                       "local disk %.1f MiB, CPU %.2f s in 10 s; %d busy: %.0f IOPS (min %.0f, max %.0f a volume),"
                       " Jain %.3f, peak RSS %.0f MiB; FLUSH p99 of 8 volumes at QD1 %.0f µs alone, %.0f µs next"
                       " to one writing 1 MiB at QD32 (%.1fx; it wrote %.0f MB/s)"
                       % (n, created_s, ready_s, idle_rss / MiB, disk / MiB, idle_cpu, busy, total, min(per),
                          max(per), jain or 0, (peak or 0) / MiB, quiet_p99, noisy_p99,
                          noisy_p99 / quiet_p99 if quiet_p99 else 0, heavy_mbps))
    except (BenchError, subprocess.TimeoutExpired, OSError, ValueError, KeyError) as e:
        row.update({"status": "failed", "error": str(e)})
    finally:
        try:
            srv.stop()
        except BenchError as e:
            if row.get("status") == "ok":
                row.update({"status": "failed", "error": str(e)})
        ctx.live.remove(srv)
        if not args.keep:
            srv.cleanup()
    return [row]
