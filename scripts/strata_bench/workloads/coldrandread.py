"""coldrandread: fio randread 4 KiB on a filled volume never read on this
host, at 0 and 20 ms, next to nbdkit file on a filled file; IOPS per
second, and how long until the volume is all local (hydration)."""

import os
import re
import subprocess
import time

from ..fio import COLS, HEAD, fio_summary, prefill_opts, run_fio
from ..sampling import Sampler
from ..servers import NbdkitFile, StrataMinio, StrataMinio20ms
from ..stats import HydrationWatch, disk_cache_bytes, stats_now, store_counts, store_gets, wait_hydrated
from ..util import BenchError, MiB, drop_caches, stop_process


COLDRAND = "coldrandread"

COLDRAND_TITLE = ("randread 4 KiB, iodepth 32 x 4 jobs, on a filled volume never read on this host (fresh data dir);"
                  " ratio = IOPS / nbdkit file on a filled file with its page cache dropped first; the IOPS"
                  " of the whole run average a cold start and what the caches hold later: the notes give"
                  " the first and the last 5 s (the JSON has every second)")

COLDRAND_COLS = COLS[:-1] + [("store_gets", "%d"), ("ratio", "%.4f")]
COLDRAND_HEAD = HEAD[:-1] + ["store GETs", "ratio"]


def coldrand_opts(args, d):
    """fio randread 4 KiB, QD32 x 4 jobs over the whole volume, --runtime s,
    IOPS logged per second (in d) to show how it changes as data arrives."""
    per_job = args.size // 4 // MiB * MiB
    return {"rw": "randread", "bs": "4k", "iodepth": "32", "numjobs": "4", "size": str(per_job),
            "offset_increment": str(per_job), "group_reporting": None, "time_based": None,
            "runtime": str(args.runtime), "percentile_list": "50:99:99.9", "randrepeat": "0",
            "norandommap": None, "write_iops_log": os.path.join(d, "iops"), "log_avg_msec": "1000"}


def iops_per_second(d):
    """Per-second IOPS summed over fio's jobs, from write_iops_log files
    (log_avg_msec=1000). An entry at time t is the average over the window
    since the job's previous entry (a window without completions is logged
    later, longer), so each second takes the entry whose window covers its
    middle; only seconds every job covers are kept."""
    jobs = []
    for name in sorted(os.listdir(d)):
        if not (name.startswith("iops_iops.") and name.endswith(".log")):
            continue
        entries = []
        with open(os.path.join(d, name)) as f:
            for line in f:
                parts = [x.strip() for x in line.split(",")]
                if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit():
                    entries.append((int(parts[0]), int(parts[1])))
        if entries:
            jobs.append(sorted(entries))
    if not jobs:
        return []
    out = []
    for sec in range(min(j[-1][0] for j in jobs) // 1000):
        mid = sec * 1000 + 500
        out.append(sum(next(v for t, v in j if t >= mid) for j in jobs))
    return out


def iops_phases(d, data, runtime):
    """(note, per-second list): IOPS in the first and the last 5 s. fio
    does not log a job's last window: the seconds after the last one every
    job logged get what fio counted and the log lacks, spread evenly."""
    series = iops_per_second(d)
    try:
        total = data["jobs"][0]["read"]["total_ios"]
    except (KeyError, IndexError, TypeError):
        total = None
    if total is not None and series and runtime > len(series):
        rest = max(0, total - sum(series)) / (runtime - len(series))
        series += [int(rest)] * (runtime - len(series))
    if len(series) < 2:
        return None, series
    n = min(5, len(series) // 2)
    first, last = sum(series[:n]) / n, sum(series[-n:]) / n
    return "IOPS first %d s %.0f, last %d s %.0f" % (n, first, n, last), series


def generic_log_dir(cmd):
    """fio's command with the per-server log path replaced by a placeholder."""
    return re.sub(r"--write_iops_log=\S+", "--write_iops_log=DIR/iops", cmd)


def run_coldrandread(ctx):
    """Random 4 KiB reads of a volume never read on this host; see
    scripts/bench's docstring."""
    args = ctx.args
    rows = []
    timeout = args.runtime + 1800
    # Reference: a filled local file through nbdkit file, page cache dropped.
    ref_srv = NbdkitFile(ctx, args.size, COLDRAND + "-ref")
    ref = {"server": "nbdkit-file (filled file)", "workload": COLDRAND}
    ctx.live.append(ref_srv)
    try:
        ref_srv.start()
        run_fio("prefill", ref_srv.fio_target(), prefill_opts(args.size, timeout),
                os.path.join(ref_srv.dir, "prefill.json"), timeout)
        dropped = drop_caches()
        with Sampler(ref_srv.pid) as sampler:
            t0 = time.time()
            argv, data = run_fio(COLDRAND, ref_srv.fio_target(), coldrand_opts(args, ref_srv.dir),
                                 os.path.join(ref_srv.dir, "fio.json"), timeout)
        cpu, rss = sampler.window(t0)
        ref.update(fio_summary(data, "read"))
        phases, ref["iops_per_s"] = iops_phases(ref_srv.dir, data, args.runtime)
        ref.update({"status": "ok", "cpu_s": cpu, "peak_rss_mib": rss / MiB if rss else None, "ratio": 1.0,
                    "note": "; ".join(x for x in ("local reference (page cache %s first)"
                                                  % ("dropped" if dropped else "NOT dropped"), phases) if x),
                    "fio": generic_log_dir(" ".join(a for a in argv if not a.startswith("--output")))})
    except (BenchError, subprocess.TimeoutExpired, OSError) as e:
        ref.update({"status": "failed", "error": str(e)})
    finally:
        ref_srv.stop()
        ctx.live.remove(ref_srv)
        if not args.keep:
            ref_srv.cleanup()
    rows.append(ref)

    filler = StrataMinio(ctx, args.size, COLDRAND + "-fill")
    ctx.live.append(filler)
    try:
        filler.start()
        run_fio("fill", filler.fio_target(), prefill_opts(args.size, timeout),
                os.path.join(filler.dir, "fill.json"), timeout)
        filler.stop()  # clean: everything uploaded
    except (BenchError, subprocess.TimeoutExpired, OSError) as e:
        rows.append({"server": "strata-minio", "workload": COLDRAND, "status": "failed", "error": "fill: %s" % e})
        return rows
    finally:
        stop_process(filler.proc)
        ctx.live.remove(filler)

    # --quick: the 0 ms row only (see coldclone).
    for cls in (StrataMinio,) if ctx.args.quick else (StrataMinio, StrataMinio20ms):
        lat = "%dms" % cls.latency_ms
        srv = cls(ctx, args.size, "%s-%s" % (COLDRAND, lat))
        srv.prefix = filler.prefix
        ctx.live.append(srv)
        row = {"server": "strata-minio %s" % lat, "workload": COLDRAND}
        stats = os.path.join(srv.dir, "stats.json")
        watch = None
        try:
            srv.start(create=False, extra=("--stats-file", stats, "--stats-interval-ms", "200"))
            started = time.time()
            watch = HydrationWatch(stats, started)
            with Sampler(srv.pid) as sampler:
                t0 = time.time()
                argv, data = run_fio(COLDRAND, srv.fio_target(), coldrand_opts(args, srv.dir),
                                     os.path.join(srv.dir, "fio.json"), timeout)
            cpu, rss = sampler.window(t0)
            st = stats_now(stats)
            row.update(fio_summary(data, "read"))
            gets = store_gets(st)
            reads = data["jobs"][0]["read"]["total_ios"]
            dc = disk_cache_bytes(st)
            hnote = watch.wait(args.hydration_wait)
            hyd_s = watch.end_s if watch.last and watch.last.get("state") == "done" else None
            if hnote is None:  # not in the stats file: ask volume info
                hnote, hyd_s = wait_hydrated(ctx, srv, started, args.hydration_wait)
            phases, row["iops_per_s"] = iops_phases(srv.dir, data, args.runtime)
            notes = [srv.note(), phases]
            if gets is not None:
                notes.append("%d GETs for %d reads (%d MiB of data GETs)" % (
                    gets, reads, store_counts(st).get("data_get_bytes", 0) >> 20))
            if dc is not None:
                notes.append("disk cache %d MiB" % (dc >> 20))
            notes.append(hnote)
            row.update(store_counts(st))
            row.update({"status": "ok", "cpu_s": cpu, "peak_rss_mib": rss / MiB if rss else None,
                        "store_gets": gets, "disk_cache_mib": dc / MiB if dc is not None else None,
                        "hydrated_s": hyd_s, "note": "; ".join(x for x in notes if x),
                        "fio": generic_log_dir(" ".join(a for a in argv if not a.startswith("--output")))})
            if ref.get("status") == "ok" and ref.get("iops"):
                row["ratio"] = row["iops"] / ref["iops"]
        except (BenchError, subprocess.TimeoutExpired, OSError) as e:
            row.update({"status": "failed", "error": str(e)})
        finally:
            if watch:
                watch.stop_ev.set()
            try:
                srv.stop()
            except BenchError as e:
                if row.get("status") == "ok":
                    row.update({"status": "failed", "error": str(e)})
            ctx.live.remove(srv)
            if not args.keep:
                srv.cleanup()
        rows.append(row)
    if not args.keep:
        filler.cleanup()
    return rows
