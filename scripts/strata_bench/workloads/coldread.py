"""coldread: strata on an S3 store (MinIO, SeaweedFS; ~0 and 20 ms) read
cold: filled, stopped cleanly, restarted on a fresh data dir, read
sequentially; next to the store's own GET throughput of the same segment
objects (s3_get_reference: the minio-get and seaweedfs-get rows), and cold
random 4 KiB reads."""

import concurrent.futures
import json
import os
import subprocess
import time

from ..fio import fio_summary, prefill_opts, run_fio
from ..profiles import finish_perf, start_perf
from ..sampling import Sampler, TreeSampler
from ..servers import StrataMinio
from ..util import BenchError, MiB, stop_process


COLD = "coldread"
COLD_TITLE = ("cold sequential read 1 MiB, iodepth 8, strata on S3 (MinIO, SeaweedFS) after a restart with empty"
              " caches; ratio = MB/s / the same store's own GET throughput of the same segment objects"
              " (minio-get, seaweedfs-get)")


def run_coldread(ctx, cls=StrataMinio, reference=True):
    """strata on an S3 store (cls: MinIO or SeaweedFS, at 0 or 20 ms):
    fill, clean stop, restart with a fresh data dir, read; the store's own
    GETs of the segments with `reference`. Rows carry the store's tag (the
    ratio is to the same store's GETs)."""
    args = ctx.args
    srv = cls(ctx, args.size, COLD)
    ctx.live.append(srv)
    rows = []
    store = srv.s3store().tag
    row = {"server": srv.name, "workload": COLD, "store": store}
    timeout = 1800
    try:
        srv.start()
        run_fio("fill", srv.fio_target(), prefill_opts(args.size, timeout),
                os.path.join(srv.dir, "fill.json"), timeout)
        t = time.time()
        srv.stop()
        row["clean_stop_s"] = time.time() - t
        srv.start(create=False)
        opts = {"rw": "read", "bs": "1M", "iodepth": "8", "size": str(args.size),
                "percentile_list": "50:99:99.9"}
        perf = start_perf(ctx, srv) if args.profile_cold else None
        with Sampler(srv.pid) as sampler:
            t0 = time.time()
            argv, data = run_fio(COLD, srv.fio_target(), opts, os.path.join(srv.dir, "cold.json"), timeout)
        if perf:
            row["profile"] = finish_perf(ctx, perf)
        cpu, rss = sampler.window(t0)
        row.update(fio_summary(data, "read"))
        row.update({"cpu_s": cpu, "peak_rss_mib": rss / MiB if rss else None, "status": "ok",
                    "fio": " ".join(a for a in argv if not a.startswith("--output"))})
        srv.stop()
        if getattr(srv, "note", None):
            row["note"] = srv.note()
        rows.append(row)
        if reference:
            rows.append(s3_get_reference(ctx, srv.s3store(), srv.bucket, srv.prefix + "/vol/segments/"))
        rows.append(dict(cold_random_row(ctx, srv), store=store))
    except (BenchError, subprocess.TimeoutExpired, OSError) as e:
        row.update({"status": "failed", "error": str(e)})
        rows.append(row)
    finally:
        stop_process(srv.proc)
        ctx.live.remove(srv)
        srv.release()
        if not args.keep:
            srv.cleanup()
    return rows


def cold_random_row(ctx, srv):
    """Cold random 4 KiB reads: a restart with a fresh data dir (empty
    caches), fio randread QD32 x 4 for the runtime; GETs per read from the
    server's stats file."""
    args = ctx.args
    row = {"server": srv.name + " random 4 KiB", "workload": COLD}
    stats = os.path.join(srv.dir, "cold-random-stats.json")
    srv.start(create=False, extra=("--stats-file", stats, "--stats-interval-ms", "1000"))
    opts = {"rw": "randread", "bs": "4k", "iodepth": "32", "numjobs": "4", "size": str(args.size // 4),
            "offset_increment": str(args.size // 4), "group_reporting": None, "time_based": None,
            "runtime": str(args.runtime), "percentile_list": "50:99:99.9", "randrepeat": "0",
            "norandommap": None}
    with Sampler(srv.pid) as sampler:
        t0 = time.time()
        argv, data = run_fio("cold-random", srv.fio_target(), opts, os.path.join(srv.dir, "cold-random.json"),
                             args.runtime + 600)
    cpu, rss = sampler.window(t0)
    srv.stop()
    row.update(fio_summary(data, "read"))
    try:
        with open(stats) as f:
            st = json.load(f)
        gets = st["read_path"]["store"]["data_gets"]
        reads = data["jobs"][0]["read"]["total_ios"]
        row["note"] = "%.2f data GETs per read (%d GETs, %d reads); not a ratio" % (gets / max(reads, 1), gets, reads)
        if getattr(srv, "note", None):
            row["note"] += "; " + srv.note()
    except (OSError, ValueError, KeyError, IndexError) as e:
        row["note"] = "no stats: %s" % e
    row.update({"cpu_s": cpu, "peak_rss_mib": rss / MiB if rss else None, "status": "ok",
                "fio": " ".join(a for a in argv if not a.startswith("--output"))})
    return row


def s3_get_reference(ctx, store, bucket, prefix, parallel=8):
    """The store's own GET throughput of the objects under bucket/prefix,
    `parallel` curls: the row TAG-get (minio-get, seaweedfs-get)."""
    objs = store.list(prefix, bucket=bucket)
    if not objs:
        raise BenchError("no objects under %s/%s" % (bucket, prefix))
    total = sum(s for _, s in objs)
    with store.sampler() as sampler:
        t0 = time.time()
        with concurrent.futures.ThreadPoolExecutor(parallel) as ex:
            list(ex.map(lambda kv: store.s3("GET", "%s/%s" % (bucket, kv[0]), out="/dev/null"), objs))
        dt = time.time() - t0
    cpu, rss = sampler.window(t0)
    note = "%d segment objects, %d MiB, %d curl GETs in parallel" % (len(objs), total >> 20, parallel)
    if isinstance(sampler, TreeSampler):
        note += "; CPU and RSS: its %d processes, summed" % (len(sampler.pids) - 1)
    return {"server": "%s-get" % store.tag, "workload": COLD, "store": store.tag, "status": "ok",
            "iops": len(objs) / dt, "mbps": total / dt / 1e6, "cpu_s": cpu,
            "peak_rss_mib": rss / MiB if rss else None, "p50_us": None, "p99_us": None, "p999_us": None,
            "note": note}
