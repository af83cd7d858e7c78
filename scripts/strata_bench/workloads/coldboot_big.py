"""coldboot_big: the coldboot-big workload: a large clone (8 GiB, 5/8 of it
filler never read) whose boot reads a working set (/usr) on a new host,
then the server left running until the volume is local; per store (MinIO,
SeaweedFS) one import, per row a first and a later clone (see
scripts/bench's docstring)."""

import contextlib
import json
import os
import random
import re
import shutil
import subprocess
import time

from ..sampling import Sampler, host_busy, host_cpu_ticks
from ..servers import StrataMinio, StrataMinio20ms, StrataSeaweedfs, StrataSeaweedfs20ms
from ..stats import (HydrationWatch, disk_cache_bytes, read_stats, stats_now, store_counts, store_gets, strata_cli,
                     wait_hydrated)
from ..util import BenchError, GiB, MiB, drop_caches, log, socket_accepts, spawn, stop_process, wait_for
from .coldboot import profile_summary
from .fsimage import FsMount, usr_image


# A large clone (8 GiB, 5 GiB never read) whose boot reads a small working
# set, file by file, then is left until it is local (only when named).
COLDBOOT_BIG = "coldboot-big"

# Its goals (the issue): first clone <= 1.3x the local read at 20 ms, a
# later clone (its profile prefetched) <= 1.1x, data bytes fetched <= 1.05x
# the volume's stored bytes once it is local.
BIGBOOT_GOAL_FIRST, BIGBOOT_GOAL_LATER, BIGBOOT_GOAL_FETCHED = 1.3, 1.1, 1.05
COLDBOOT_BIG_TITLE = ("a clone of an ext4 image (--coldboot-big-size) holding a sample of /usr (~0.9 GB at 8 GiB: a"
                      " boot's working set) and 5/8 of its size in filler files of random data that are never read,"
                      " on a new host (fresh strata serve, new data dir, --disk-cache-size = image + 1 GiB unless"
                      " --coldboot-big-disk-cache); only"
                      " /usr read, file by file (nbdfuse + loop --direct-io=on + mount -o ro, `find MNT/usr -type f"
                      " | xargs cat`), then the server left running until hydration ends. First clone: no access"
                      " profile yet (it records one, stored at its clean stop); later clone: another clone of the same"
                      " snapshot, its profile prefetched at open. read s: the read; ratio = the local reference's"
                      " time (nbdkit file on the image, page cache dropped) / the row's; GETs / MiB (read) = the read"
                      " path's data GETs and bytes from the server's start to the read's end (reads, read-ahead,"
                      " hydration, the profile's prefetch); local s = from the server's ready to hydration done"
                      " (hydration end s: to its end state, whichever); GETs / MiB (to hydration end) = the same"
                      " counters then; stored MiB = the volume's segment objects in"
                      " the store (compressed, as GETs fetch them); volume MiB = its data as hydration counts it"
                      " (total_bytes: decompressed, as the disk cache holds it); fetched/stored = data bytes"
                      " fetched to hydration end / stored MiB. Goals: at 20 ms, first clone <= %.1fx the local time"
                      " (ratio >= %.2f), later clone <= %.1fx (ratio >= %.2f); fetched/stored <= %.2f once local"
                      % (BIGBOOT_GOAL_FIRST, 1 / BIGBOOT_GOAL_FIRST, BIGBOOT_GOAL_LATER, 1 / BIGBOOT_GOAL_LATER,
                         BIGBOOT_GOAL_FETCHED))

# coldboot-big's rows: a read of the working set, then until local.
BIGBOOT_COLS = [("server", "%s"), ("time_s", "%.2f"), ("ratio", "%.3f"), ("read_gets", "%d"), ("read_mib", "%.0f"),
                ("local_s", "%.1f"), ("hydration_end_s", "%.1f"), ("reread_s", "%.2f"), ("reread_ratio", "%.3f"),
                ("total_gets", "%d"), ("total_mib", "%.0f"), ("stored_mib", "%.0f"),
                ("volume_mib", "%.0f"), ("fetched_ratio", "%.3f"), ("hydration", "%s"), ("cpu_s", "%.2f"),
                ("peak_rss_mib", "%.0f")]
BIGBOOT_HEAD = ["server", "read s", "ratio", "GETs (read)", "MiB fetched (read)", "local s", "hydration end s",
                "read once local s", "ratio once local",
                "GETs (to hydration end)", "MiB fetched (to hydration end)", "stored MiB", "volume MiB", "fetched/stored",
                "hydration", "CPU s (read)", "peak RSS MiB"]

# coldboot-big's wait for hydration to end, per clone (s), unless
# --hydration-wait is given.
BIGBOOT_HYDRATION_WAIT = 1800

# The never-read part of coldboot-big's image: files of random data (lz4
# and zstd store them as they are), BIGBOOT_FILLER_FILE each, making
# BIGBOOT_FILLER_SHARE of the image (5 GiB of 8 GiB); every second one in
# /filler (before /usr in mkfs.ext4 -d's name order), the others in
# /var/filler (after it).
BIGBOOT_FILLER_FILE = 64 * MiB
BIGBOOT_FILLER_SHARE = 5 / 8
BIGBOOT_FILLER_DIRS = ("filler", os.path.join("var", "filler"))
BIGBOOT_SEED = 8
# The /usr sample's budget (data blocks and 4 KiB per file, see usr_image)
# at 8 GiB, scaled with the image's size: ~0.9 GB of file data.
BIGBOOT_USR_AT_8G = 1_150_000_000
# The working set: what is read (under the mount point).
BIGBOOT_READ = "usr"
# Server log lines worth quoting in the row (and the report).
BIGBOOT_LOG_MARKS = ("volume is local", "hydration stopped", "access profile", "hydrating", "profile")


def bigboot_filler(size):
    """extra() for usr_image: the filler files (BIGBOOT_FILLER_*), random
    data from a fixed seed per file. Returns the function; it records
    (files, bytes) in its attribute `made`."""
    total = int(size * BIGBOOT_FILLER_SHARE) // MiB * MiB

    def make(root):
        n, left = 0, total
        while left > 0:
            k = min(BIGBOOT_FILLER_FILE, left)
            d = os.path.join(root, BIGBOOT_FILLER_DIRS[n % len(BIGBOOT_FILLER_DIRS)])
            os.makedirs(d, exist_ok=True)
            rnd = random.Random(BIGBOOT_SEED * 1_000_003 + n)
            with open(os.path.join(d, "%04d.bin" % n), "wb") as f:
                for off in range(0, k, 8 * MiB):
                    f.write(rnd.randbytes(min(8 * MiB, k - off)))
            n += 1
            left -= k
        make.made = (n, total)

    make.made = (0, 0)
    return make


def bigboot_image(ctx):
    """coldboot-big's image, made once per run: a sample of /usr (the
    working set) and the filler, mkfs.ext4 -d (usr_image)."""
    if getattr(ctx, "bigboot_image", None):
        return ctx.bigboot_image
    size = ctx.args.coldboot_big_size
    filler = bigboot_filler(size)
    image = usr_image(size, os.path.join(ctx.scratch, "coldboot-big-image"), "coldboot-big", extra=filler,
                      usr_budget=BIGBOOT_USR_AT_8G * size / (8 * GiB), extra_what="filler")
    image["filler_files"], image["filler_bytes"] = filler.made
    log("    working set: /usr, %d files, %d MiB (%.2f GB); never read: %d filler files, %d MiB, in /%s and /%s"
        % (image["sample_files"], image["sample_bytes"] >> 20, image["sample_bytes"] / 1e9, image["filler_files"],
           image["filler_bytes"] >> 20, BIGBOOT_FILLER_DIRS[0], BIGBOOT_FILLER_DIRS[1]))
    ctx.bigboot_image = image
    return image


def bigboot_log_lines(path):
    """The server log's hydration and profile lines, and its warnings and
    errors (ANSI colours and timestamps stripped): (marked, warnings)."""
    marked, warns = [], []
    try:
        with open(path, errors="replace") as f:
            for line in f:
                line = re.sub(r"\x1b\[[0-9;]*m", "", line).rstrip("\n")
                text = re.sub(r"^\S*\d{4}-\d\d-\d\dT\S+\s+", "", line)
                if re.match(r"(WARN|ERROR)\b", text):
                    warns.append(text[:400])
                elif any(k in text for k in BIGBOOT_LOG_MARKS):
                    marked.append(text[:400])
    except OSError:
        pass
    return marked, warns


def bigboot_log_dir(ctx):
    d = os.path.join(ctx.args.out, "coldboot-big-logs")
    os.makedirs(d, exist_ok=True)
    return d


def bigboot_keep_log(ctx, srv, tag, stats):
    """A copy of srv's log and of the stats file it wrote at exit in
    OUT/coldboot-big-logs/ (TAG.log, TAG.exit-stats.json: the data dir and
    its log go after the row): the log copy's path."""
    d = bigboot_log_dir(ctx)
    dst = os.path.join(d, tag + ".log")
    with contextlib.suppress(OSError):
        shutil.copyfile(stats, os.path.join(d, tag + ".exit-stats.json"))
    try:
        shutil.copyfile(srv.log, dst)
    except OSError:
        return None
    return dst


def bigboot_cache_text(st):
    """The disk cache's counters that say why a volume is not all local."""
    dc = ((st or {}).get("read_path") or {}).get("disk_cache") if isinstance(st, dict) else None
    if not isinstance(dc, dict):
        return None
    parts = ["disk cache %d of %d MiB used" % ((dc.get("used_bytes") or 0) >> 20, (dc.get("budget_bytes") or 0) >> 20)]
    for k in ("hydrated_insertions", "hydration_skips", "skipped_writes", "fetched_insertions", "not_admitted",
              "evictions", "io_errors"):
        if dc.get(k):
            parts.append("%s %d" % (k, dc[k]))
    if dc.get("disabled_by_error"):
        parts.append("DISABLED by a write error")
    return ", ".join(parts)


def bigboot_ref(ctx, image, read_timeout):
    """The local reference: the image through nbdkit file, only the working
    set read, page cache dropped first."""
    ref_dir = os.path.join(ctx.scratch, "coldboot-big-ref")
    os.makedirs(ref_dir, exist_ok=True)
    sock = os.path.join(ref_dir, "nbd.sock")
    nlog = os.path.join(ref_dir, "nbdkit.log")
    row = {"server": "nbdkit-file (local image)", "workload": COLDBOOT_BIG}
    proc = spawn(["nbdkit", "-f", "-r", "-U", sock, "file", "file=" + image["path"]], nlog)
    m = FsMount(ctx, ref_dir, "nbd+unix:///?socket=" + sock)
    try:
        wait_for(lambda: socket_accepts(sock), proc, "nbdkit", nlog)
        m.open()
        with Sampler(proc.pid) as sampler:
            t0 = time.time()
            dt, nbytes, dropped = m.read_all(read_timeout, sub=BIGBOOT_READ)
        cpu, rss = sampler.window(t0)
        notes = ["local reference (page cache %s first)%s" % ("dropped" if dropped else "NOT dropped",
                                                             "" if m.dio else "; loop WITHOUT direct I/O")]
        if nbytes != image["sample_bytes"]:
            notes.append("read %d bytes, the /usr sample holds %d" % (nbytes, image["sample_bytes"]))
        row.update({"status": "ok", "time_s": dt, "bytes_read": nbytes, "files": image["sample_files"],
                    "mbps": nbytes / dt / 1e6, "ratio": 1.0, "cpu_s": cpu,
                    "peak_rss_mib": rss / MiB if rss else None, "iops": None, "p50_us": None, "p99_us": None,
                    "p999_us": None, "note": "; ".join(notes),
                    "fio": m.commands(BIGBOOT_READ).replace(sock, "SOCK")})
    except (BenchError, subprocess.TimeoutExpired, OSError) as e:
        row.update({"status": "failed", "error": str(e)})
    finally:
        m.close()
        stop_process(proc)
    return row


def bigboot_read(m, pid, read_timeout):
    """The working set read once through mount `m` (caches dropped first),
    sampled: (seconds, bytes, whether the caches dropped, the server's CPU
    seconds and peak RSS, the host's busy share) during it."""
    with Sampler(pid) as sampler:
        t0, h0 = time.time(), host_cpu_ticks()
        dt, nbytes, dropped = m.read_all(read_timeout, sub=BIGBOOT_READ)
        busy = host_busy(h0, host_cpu_ticks())
    cpu, rss = sampler.window(t0)
    return dt, nbytes, dropped, cpu, rss, busy


def bigboot_clone(ctx, cls, importer, volume, which, image, ref, read_timeout, hyd_limit, profile=None):
    """One clone of coldboot-big: a fresh strata serve on a new data dir
    serving `volume`, the working set read at once, then the server left
    running until hydration ends, then stopped cleanly (a first clone's
    recorded access profile is stored then). `profile`: the summary of the
    profile a later clone prefetches (its note). importer.stored_bytes: the
    imported volume's segment objects' bytes. Returns the row."""
    args = ctx.args
    name = "%s %s clone" % (cls.name, which)
    tag = "%s-%s-%s" % (COLDBOOT_BIG, cls.name[len("strata-"):], which)
    srv = cls(ctx, image["size"], tag)
    srv.prefix = importer.prefix
    if isinstance(importer, StrataSeaweedfs):
        srv._bucket = importer.bucket  # the import's bucket (released with the importer)
    srv.volume = volume
    ctx.live.append(srv)
    row = {"server": name, "workload": COLDBOOT_BIG}
    stats = os.path.join(srv.dir, "stats.json")
    m = FsMount(ctx, srv.dir, "nbd+unix:///%s?socket=%s" % (srv.volume, srv.sock))
    watch = None
    # The whole volume must fit in the disk cache (the default, 10% of the
    # free disk, is smaller: hydration would end cache_full).
    cache = "%dMiB" % ((args.coldboot_big_disk_cache or image["size"] + GiB) >> 20)
    try:
        # Before the server starts: what it fetches at once (hydration, the
        # profile's prefetch) gets no head start while the caches drop.
        drop_caches()
        t_start = time.time()
        srv.start(create=False, extra=("--stats-file", stats, "--stats-interval-ms", "200",
                                       "--disk-cache-size", cache))
        started = time.time()
        watch = HydrationWatch(stats, started, srv.volume)
        m.open()
        mount_s = time.time() - started
        dt, nbytes, dropped, cpu, rss, busy = bigboot_read(m, srv.pid, read_timeout)
        read_end_s = time.time() - started
        st1 = stats_now(stats)
        # Until the volume is local (or hydration ends otherwise).
        hnote = watch.wait(hyd_limit)
        local_s = watch.end_s if watch.last is not None and watch.last.get("state") == "done" else None
        if hnote is None:  # no hydration in the stats file: ask volume info
            hnote, took = wait_hydrated(ctx, srv, started, hyd_limit)
            local_s = took
        st2 = stats_now(stats)
        # The later clone once local: the same read again (caches dropped),
        # strata's own floor on this host now, beside the row's time.
        reread = rcpu = rbusy = None
        if which == "later" and local_s is not None:
            reread, rbytes, _, rcpu, _, rbusy = bigboot_read(m, srv.pid, read_timeout)
            if rbytes != nbytes:
                raise BenchError("the read once local gave %d bytes, the first %d" % (rbytes, nbytes))
        with contextlib.suppress(OSError), open(os.path.join(bigboot_log_dir(ctx), tag + ".stats.json"), "w") as f:
            json.dump(st2, f, indent=1)  # the counters the row gives (the volume's hydration with them)
        vol = read_stats(stats, srv.volume) or {}
        h = vol.get("hydration") if isinstance(vol.get("hydration"), dict) else {}
        c1, c2 = store_counts(st1), store_counts(st2)
        # What the store holds (compressed) and the volume's bytes in it
        # (hydration's total_bytes: decompressed, what the disk cache holds).
        stored, logical = importer.stored_bytes, h.get("total_bytes")
        fetched = c2.get("data_get_bytes")
        row.update({"status": "ok", "time_s": dt, "bytes_read": nbytes, "files": image["sample_files"],
                    "mbps": nbytes / dt / 1e6, "cpu_s": cpu, "peak_rss_mib": rss / MiB if rss else None,
                    "iops": None, "p50_us": None, "p99_us": None, "p999_us": None,
                    "mount_s": mount_s, "read_end_s": read_end_s, "ready_s": started - t_start,
                    "read_gets": c1.get("data_gets"),
                    "read_mib": c1["data_get_bytes"] / MiB if "data_get_bytes" in c1 else None,
                    "read_counts": c1, "read_store_gets": store_gets(st1),
                    "local_s": local_s, "hydration_end_s": watch.end_s, "reread_s": reread,
                    "host_busy": busy, "reread_cpu_s": rcpu, "reread_host_busy": rbusy,
                    "reread_ratio": ref["time_s"] / reread if reread and ref.get("time_s") else None,
                    "total_gets": c2.get("data_gets"),
                    "total_mib": fetched / MiB if fetched is not None else None,
                    "total_counts": c2, "total_store_gets": store_gets(st2),
                    "stored_mib": stored / MiB if stored else None,
                    "volume_mib": logical / MiB if logical else None,
                    "fetched_ratio": fetched / stored if fetched is not None and stored else None,
                    "hydration": str(h.get("state")) if h else None, "hydration_stats": h or None,
                    "disk_cache_mib": (disk_cache_bytes(st2) or 0) / MiB if disk_cache_bytes(st2) is not None
                    else None,
                    "fio": m.commands(BIGBOOT_READ).replace(srv.sock, "SOCK")})
        notes = [srv.note(), "server ready %.1f s after its start (not in the times), mount %.1f s, read done"
                 " %.1f s after ready" % (started - t_start, mount_s, read_end_s)]
        if busy is not None:
            notes.append("host CPU busy during the read %.0f%% (of %d CPUs)" % (100 * busy, os.cpu_count() or 0))
        if reread is not None:
            notes.append("once local: read %.2f s, strata CPU %.2f s, host CPU busy %.0f%%"
                         % (reread, rcpu or 0, 100 * (rbusy or 0)))
        if nbytes != image["sample_bytes"]:
            notes.append("read %d bytes, the /usr sample holds %d" % (nbytes, image["sample_bytes"]))
        if not dropped:
            notes.append("page cache NOT dropped (not root?)")
        if c1.get("data_gets") is not None:
            notes.append("to the read's end: %d data GETs, %d MiB (%d GETs, %d MiB by hydration and the profile's"
                         " prefetch), %s store GETs of every kind"
                         % (c1["data_gets"], c1.get("data_get_bytes", 0) >> 20, c1.get("hydration_gets", 0),
                            c1.get("hydration_get_bytes", 0) >> 20, store_gets(st1)))
        notes.append(hnote)
        if c2.get("data_gets") is not None:
            notes.append("until then: %d data GETs, %d MiB (%d GETs, %d MiB by hydration), %s store GETs of every"
                         " kind" % (c2["data_gets"], c2.get("data_get_bytes", 0) >> 20, c2.get("hydration_gets", 0),
                                    c2.get("hydration_get_bytes", 0) >> 20, store_gets(st2)))
        if stored and logical:
            notes.append("stored: %d MiB of segment objects holding the volume's %d MiB (hydration total_bytes;"
                         " fetched / that %.3f)" % (stored >> 20, logical >> 20, fetched / logical if fetched else 0))
        if h.get("profile"):
            notes.append("hydration's profile: %s" % h["profile"])
        notes.append(bigboot_cache_text(st2))
        if which == "later":
            notes.append(profile[1] if profile else "no profile known")
        row["note"] = "; ".join(x for x in notes if x)
    except (BenchError, subprocess.TimeoutExpired, OSError) as e:
        row.update({"status": "failed", "error": str(e)})
    finally:
        if watch:
            watch.stop_ev.set()
        m.close()
        try:
            # Cleanly: a first clone stores its access profile when closed.
            srv.stop()
        except BenchError as e:
            if row.get("status") == "ok":
                row.update({"status": "failed", "error": "stop: %s" % e})
        ctx.live.remove(srv)
        kept = bigboot_keep_log(ctx, srv, tag, stats)
        marked, warns = bigboot_log_lines(srv.log)
        row["log"] = kept
        row["log_lines"] = marked
        row["log_warnings"] = warns
        if not args.keep:
            srv.cleanup()
    if row.get("status") == "ok":
        extra = []
        if marked:
            extra.append("log: " + " | ".join(marked[:6]))
        if warns:
            extra.append("%d warnings/errors in the log, e.g. %s" % (len(warns), " | ".join(warns[:3])))
        bigboot_ratio(row, ref, cls, which)
        row["note"] = "; ".join(x for x in [row.get("note")] + extra if x)
    return row


def bigboot_ratio(row, ref, cls, which):
    """ratio = the reference's time / the row's; the goals in the note."""
    goals = []
    if ref.get("status") == "ok" and row.get("time_s"):
        row["ratio"] = ref["time_s"] / row["time_s"]
        times = row["time_s"] / ref["time_s"]
        goal = BIGBOOT_GOAL_FIRST if which == "first" else BIGBOOT_GOAL_LATER
        goals.append("%.1fx the local time%s" % (
            times, " (goal <= %.1fx at %d ms: %s)" % (goal, cls.latency_ms, "met" if times <= goal else "missed")
            if cls.latency_ms else ""))
    if row.get("fetched_ratio") is not None:
        goals.append("fetched/stored %.3f (goal <= %.2f: %s)" % (
            row["fetched_ratio"], BIGBOOT_GOAL_FETCHED,
            "met" if row["fetched_ratio"] <= BIGBOOT_GOAL_FETCHED and row.get("hydration") == "done"
            else "missed" if row.get("hydration") == "done" else "not local"))
    row["note"] = "; ".join(x for x in goals + [row.get("note")] if x)


def bigboot_import(ctx, importer, snapshots):
    """The image imported into `importer`'s store (an import host's data
    dir), a snapshot per name in `snapshots` and two clones of each (NAME-
    first, NAME-later). Returns the seconds it took."""
    image = ctx.bigboot_image
    data = os.path.join(importer.dir, "data-import")
    try:
        t0 = time.time()
        strata_cli(ctx, importer, ["volume", "import", image["path"], "base"], data)
        t_import = time.time() - t0
        for snap in snapshots:
            strata_cli(ctx, importer, ["snapshot", "create", "base@" + snap], data)
            for which in ("first", "later"):
                strata_cli(ctx, importer, ["volume", "clone", "base@" + snap, "%s-%s" % (snap, which)], data)
        # The volume's bytes in the store (segment objects: compressed
        # data, headers, chunk tables), what fetched/stored is of.
        importer.stored_bytes = sum(size for key, size in importer.s3store().list(
            importer.prefix + "/base/segments/", bucket=importer.bucket))
        log("    %s: imported in %.1f s (%d MiB of segment objects), a snapshot and two clones of it per row in"
            " %.1f s" % (importer.s3store().name, t_import, importer.stored_bytes >> 20,
                         time.time() - t0 - t_import))
        return time.time() - t0
    finally:
        if not ctx.args.keep:
            shutil.rmtree(data, ignore_errors=True)


def run_coldboot_big(ctx):
    """A large clone whose boot reads a small part of it, on a new host; see
    scripts/bench's docstring. Yields its rows as they are measured."""
    args = ctx.args
    read_timeout = 7200
    hyd_limit = args.hydration_wait if args.hydration_wait_given else BIGBOOT_HYDRATION_WAIT
    try:
        image = bigboot_image(ctx)
    except (BenchError, subprocess.TimeoutExpired, OSError) as e:
        yield {"server": "image", "workload": COLDBOOT_BIG, "status": "failed", "error": "building the image: %s" % e}
        return
    ref = bigboot_ref(ctx, image, read_timeout)
    yield ref

    # Per store: the image imported once (MinIO: the run's bucket, a prefix
    # of its own; SeaweedFS: a bucket of its own), then per row a snapshot
    # of its own (nothing one row's first clone records helps another) and
    # its two clones. MinIO's rows at 0 ms and 20 ms share one import.
    stores = [(StrataMinio, (StrataMinio, StrataMinio20ms)), (StrataSeaweedfs, (StrataSeaweedfs20ms,))]
    if args.servers:  # only the rows named (an A/B of one row, say)
        want = args.servers.split(",")
        stores = [(i, tuple(c for c in cs if c.name in want)) for i, cs in stores]
        stores = [(i, cs) for i, cs in stores if cs]
    for i, (icls, classes) in enumerate(stores):
        if getattr(ctx, icls.store_attr) is None:
            for cls in classes:
                yield {"server": cls.name, "workload": COLDBOOT_BIG, "status": "failed",
                       "error": "%s is not running" % icls.store_attr}
            continue
        importer = icls(ctx, image["size"], "%s-%s-import" % (COLDBOOT_BIG, icls.store_attr))
        snaps = {cls: "big-%dms" % cls.latency_ms for cls in classes}
        try:
            bigboot_import(ctx, importer, [snaps[c] for c in classes])
        except (BenchError, subprocess.TimeoutExpired, OSError) as e:
            for cls in classes:
                yield {"server": cls.name, "workload": COLDBOOT_BIG, "status": "failed",
                       "error": "import/snapshot/clone: %s" % e}
            bigboot_release(ctx, importer)
            continue
        if i == len(stores) - 1 and not args.keep:
            # Imported everywhere: its disk space goes to the store's.
            with contextlib.suppress(OSError):
                os.unlink(image["path"])
        for cls in classes:
            snap = snaps[cls]
            first = bigboot_clone(ctx, cls, importer, snap + "-first", "first", image, ref, read_timeout, hyd_limit)
            pdata = os.path.join(importer.dir, "data-profile-" + snap)
            info, text = profile_summary(ctx, importer, "base@" + snap, pdata)
            shutil.rmtree(pdata, ignore_errors=True)
            first["access_profile"] = info
            if first.get("status") == "ok":
                first["note"] = "; ".join(x for x in (first.get("note"), ("recorded " if info else "") + text) if x)
            yield first
            later = bigboot_clone(ctx, cls, importer, snap + "-later", "later", image, ref, read_timeout, hyd_limit,
                                  profile=(info, text))
            later["access_profile"] = info
            yield later
        bigboot_release(ctx, importer)


def bigboot_release(ctx, importer):
    """After a store's rows: its objects (MinIO: the prefix; SeaweedFS: the
    bucket) and the import host's directory go, unless --keep."""
    if ctx.args.keep:
        return
    if isinstance(importer, StrataSeaweedfs):
        importer.release()
    else:
        try:
            n = importer.s3store().delete_prefix(importer.prefix + "/", bucket=importer.bucket)
            log("    %s: %d objects under %s/ deleted" % (importer.s3store().name, n, importer.prefix))
        except BenchError as e:
            log("    note: %s/%s not deleted: %s" % (importer.bucket, importer.prefix, e))
    importer.cleanup()


def bigboot_text(row):
    if row.get("status") != "ok":
        return "FAILED: %s" % row.get("error")
    if row.get("local_s") is None and row.get("read_gets") is None:
        return "read %.2f s, %.1f MB/s (reference)" % (row["time_s"], row["mbps"])

    def f(v, spec):
        return "-" if v is None else spec % v

    return ("read %.2f s%s; during the read %s data GETs, %s MiB; local after %s s (hydration %s): %s data GETs,"
            " %s MiB fetched of %s MiB stored (%s)" % (
                row["time_s"], ", ratio %.3f" % row["ratio"] if row.get("ratio") else "",
                f(row.get("read_gets"), "%d"), f(row.get("read_mib"), "%.0f"), f(row.get("local_s"), "%.1f"),
                row.get("hydration"), f(row.get("total_gets"), "%d"), f(row.get("total_mib"), "%.0f"),
                f(row.get("stored_mib"), "%.0f"), f(row.get("fetched_ratio"), "%.3fx")))
