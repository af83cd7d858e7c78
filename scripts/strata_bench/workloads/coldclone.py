"""coldclone: every file of a cloned ext4 image read once on a new host (a
fresh data dir), first and second read, at 0 and 20 ms, next to nbdkit
file on the image (see scripts/bench's docstring)."""

import os
import shutil
import subprocess
import time

from ..sampling import Sampler
from ..servers import StrataMinio, StrataMinio20ms
from ..stats import (HydrationWatch, counts_delta, disk_cache_bytes, hydration_text, stats_now, store_gets, strata_cli,
                     volume_info)
from ..util import BenchError, MiB, log, socket_accepts, spawn, stop_process, wait_for
from .fsimage import FsMount, usr_image


# Cold data on a new host (see scripts/bench's docstring): a cloned
# filesystem image read file by file, and random reads of a never-read
# volume (coldrandread), each at store latencies of 0 and 20 ms (± 10) next
# to a local file.
COLDCLONE = "coldclone"

COLDCLONE_TITLE = ("every file of a cloned ext4 image read once on a new host (fresh data dir: empty caches),"
                   " through nbdfuse + loop (--direct-io=on) + mount -o ro, `find -type f | xargs cat`; then again"
                   " after umount + drop_caches + mount (second read); ratio = the local reference's time"
                   " (nbdkit file on the image, page cache dropped) / this row's time")

# coldclone's rows are timed reads of files, not fio runs.
CLONE_COLS = [("server", "%s"), ("time_s", "%.2f"), ("mbps", "%.1f"), ("files_per_s", "%.0f"),
              ("store_gets", "%d"), ("disk_cache_mib", "%.0f"), ("cpu_s", "%.2f"), ("peak_rss_mib", "%.0f"),
              ("ratio", "%.4f")]
CLONE_HEAD = ["server", "read s", "MB/s", "files/s", "store GETs", "disk cache MiB", "CPU s", "peak RSS MiB", "ratio"]


def coldclone_image(ctx):
    """coldclone's image, made once per run (usr_image)."""
    if getattr(ctx, "image", None):
        return ctx.image
    ctx.image = usr_image(ctx.args.coldclone_size, os.path.join(ctx.scratch, "coldclone-image"), "coldclone")
    return ctx.image


def clone_row(name, dt, nbytes, image, st_before, st_after, cpu, rss, dropped):
    gets = None
    if store_gets(st_after) is not None:
        gets = store_gets(st_after) - (store_gets(st_before) or 0)
    dc = disk_cache_bytes(st_after)
    row = {"server": name, "workload": COLDCLONE, "status": "ok", "time_s": dt, "bytes_read": nbytes,
           "files": image["files"], "mbps": nbytes / dt / 1e6, "files_per_s": image["files"] / dt,
           "iops": None, "p50_us": None, "p99_us": None, "p999_us": None,
           "store_gets": gets, "disk_cache_mib": dc / MiB if dc is not None else None,
           "cpu_s": cpu, "peak_rss_mib": rss / MiB if rss else None}
    notes = []
    if nbytes != image["bytes"]:
        notes.append("read %d bytes, the image's files hold %d" % (nbytes, image["bytes"]))
    if not dropped:
        notes.append("page cache NOT dropped (not root?)")
    if st_after:
        row.update(counts_delta(st_before, st_after))
        if row.get("data_gets") is not None:
            notes.append("%d data GETs (%d MiB)%s" % (
                row["data_gets"], row.get("data_get_bytes", 0) >> 20,
                ", %d hydration GETs" % row["hydration_gets"] if row.get("hydration_gets") else ""))
    row["note"] = "; ".join(notes)
    return row


def run_coldclone(ctx):
    """The cloned filesystem image read on a new host; see scripts/bench's
    docstring."""
    args = ctx.args
    rows = []
    try:
        image = coldclone_image(ctx)
    except (BenchError, subprocess.TimeoutExpired, OSError) as e:
        return [{"server": "image", "workload": COLDCLONE, "status": "failed", "error": "building the image: %s" % e}]
    read_timeout = 7200
    # The local reference: the image file through nbdkit file.
    ref_dir = os.path.join(ctx.scratch, "coldclone-ref")
    os.makedirs(ref_dir, exist_ok=True)
    sock = os.path.join(ref_dir, "nbd.sock")
    ref = {"server": "nbdkit-file (local image)", "workload": COLDCLONE}
    proc = spawn(["nbdkit", "-f", "-r", "-U", sock, "file", "file=" + image["path"]],
                 os.path.join(ref_dir, "nbdkit.log"))
    m = FsMount(ctx, ref_dir, "nbd+unix:///?socket=" + sock)
    try:
        wait_for(lambda: socket_accepts(sock), proc, "nbdkit", os.path.join(ref_dir, "nbdkit.log"))
        m.open()
        with Sampler(proc.pid) as sampler:
            t0 = time.time()
            dt, nbytes, dropped = m.read_all(read_timeout)
        cpu, rss = sampler.window(t0)
        ref = clone_row(ref["server"], dt, nbytes, image, {}, {}, cpu, rss, dropped)
        ref["ratio"] = 1.0
        ref["note"] = "; ".join(x for x in ("local reference (cold: page cache dropped)%s"
                                            % ("" if m.dio else "; loop WITHOUT direct I/O"), ref["note"]) if x)
        ref["fio"] = m.commands().replace(sock, "SOCK")
    except (BenchError, subprocess.TimeoutExpired, OSError) as e:
        ref.update({"status": "failed", "error": str(e)})
    finally:
        m.close()
        stop_process(proc)
    rows.append(ref)

    # The volume, made on an "import host"; per latency its own snapshot
    # and clone of it, so that nothing one run leaves beside a snapshot
    # (an access profile its first clone records) helps the other.
    # --quick: the 0 ms row only (a smoke test; the 20 ms path is
    # strata-minio-20ms's randrw row's too).
    latencies = (StrataMinio,) if ctx.args.quick else (StrataMinio, StrataMinio20ms)
    importer = StrataMinio(ctx, image["size"], COLDCLONE + "-import")
    data = os.path.join(importer.dir, "data-import")
    try:
        t0 = time.time()
        strata_cli(ctx, importer, ["volume", "import", image["path"], "base"], data)
        for cls in latencies:
            lat = "%dms" % cls.latency_ms
            strata_cli(ctx, importer, ["snapshot", "create", "base@gold-" + lat], data)
            strata_cli(ctx, importer, ["volume", "clone", "base@gold-" + lat, "clone-" + lat], data)
        made_s = time.time() - t0
        log("    imported, snapshotted and cloned (one snapshot and clone per latency) in %.1f s" % made_s)
    except (BenchError, subprocess.TimeoutExpired, OSError) as e:
        rows.append({"server": "strata-minio", "workload": COLDCLONE, "status": "failed",
                     "error": "import/snapshot/clone: %s" % e})
        return rows
    finally:
        if not args.keep:
            shutil.rmtree(data, ignore_errors=True)

    for cls in latencies:
        lat = "%dms" % cls.latency_ms
        srv = cls(ctx, image["size"], "%s-%s" % (COLDCLONE, lat))
        srv.prefix = importer.prefix
        srv.volume = "clone-" + lat
        ctx.live.append(srv)
        first = {"server": "strata-minio %s first read" % lat, "workload": COLDCLONE}
        stats = os.path.join(srv.dir, "stats.json")
        m = FsMount(ctx, srv.dir, "nbd+unix:///%s?socket=%s" % (srv.volume, srv.sock))
        watch = None
        try:
            srv.start(create=False, extra=("--stats-file", stats, "--stats-interval-ms", "200"))
            started = time.time()
            watch = HydrationWatch(stats, started, srv.volume)
            m.open()
            mount_s = time.time() - started
            # At once: a VM boots as soon as its disk is there (and anything
            # the server does by itself meanwhile, such as hydration, gets
            # no head start). Counters are from the server's start, the
            # mount's reads included.
            with Sampler(srv.pid) as sampler:
                t0 = time.time()
                dt, nbytes, dropped = m.read_all(read_timeout)
            cpu, rss = sampler.window(t0)
            done_s = time.time() - started
            st1 = stats_now(stats)
            first = clone_row(first["server"], dt, nbytes, image, {}, st1, cpu, rss, dropped)
            info = volume_info(ctx, srv)
            notes = [srv.note(), "mount %.1f s, all read %.1f s after the server was ready" % (mount_s, done_s)]
            if info and info.get("compression"):
                notes.append("volume compression %s" % info["compression"])
            if info and "hydration" in info:
                first["volume_info"] = info
                notes.append("hydration after it: %s" % hydration_text(info["hydration"]))
            if watch.end_s is not None:
                notes.append("hydration ended (%s) %.1f s after the server was ready"
                             % (watch.last.get("state"), watch.end_s))
            first["note"] = "; ".join(x for x in notes + [first["note"]] if x)
            first["fio"] = m.commands().replace(srv.sock, "SOCK")
            rows.append(first)
            # Second read: the same server, filesystem caches dropped.
            second = {"server": "strata-minio %s second read" % lat, "workload": COLDCLONE}
            m.umount()
            m.mount()
            st1 = stats_now(stats)
            with Sampler(srv.pid) as sampler:
                t0 = time.time()
                dt, nbytes, dropped = m.read_all(read_timeout)
            cpu, rss = sampler.window(t0)
            st2 = stats_now(stats)
            second = clone_row(second["server"], dt, nbytes, image, st1, st2, cpu, rss, dropped)
            second["note"] = "; ".join(x for x in ("same server, after umount + drop_caches + mount", second["note"]) if x)
            rows.append(second)
        except (BenchError, subprocess.TimeoutExpired, OSError) as e:
            if first.get("status") != "ok":
                first.update({"status": "failed", "error": str(e)})
                rows.append(first)
            else:
                rows.append({"server": "strata-minio %s second read" % lat, "workload": COLDCLONE,
                             "status": "failed", "error": str(e)})
        finally:
            if watch:
                watch.stop_ev.set()
            m.close()
            try:
                srv.stop()
            except BenchError as e:
                rows.append({"server": "strata-minio %s stop" % lat, "workload": COLDCLONE,
                             "status": "failed", "error": str(e)})
            ctx.live.remove(srv)
            if not args.keep:
                srv.cleanup()
    if ref.get("status") == "ok":
        for r in rows:
            if r is not ref and r.get("status") == "ok" and r.get("time_s"):
                r["ratio"] = ref["time_s"] / r["time_s"]
                r["note"] = "; ".join(x for x in ("%.1fx the local time" % (r["time_s"] / ref["time_s"]),
                                                  r.get("note")) if x)
    if not args.keep:
        importer.cleanup()
    return rows
