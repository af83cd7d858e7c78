"""space: randrw on a filled volume with background GC on, then off: the
store's bytes over the live bytes (at the end, after the grace period) and
the IOPS GC costs."""

import os
import subprocess
import threading
import time

from ..fio import WORKLOADS, fio_summary, measured_opts, prefill_opts, run_fio
from ..sampling import Sampler
from ..stats import read_stats
from ..util import BenchError, MiB


# Space: randrw for --space-runtime seconds on a filled volume, GC on and
# off in the same run; store bytes / live bytes and the IOPS GC costs.
SPACE = "space"
SPACE_TITLE = ("randrw 70/30 4 KiB (iodepth 32 x 4 jobs) on a filled volume, background GC on vs off;"
               " ratio = IOPS with GC / IOPS without; store/live = segment+checkpoint bytes in the store"
               " / live bytes, at the end of the run and once the grace period (30 s) has passed")


def run_space(ctx, server_cls):
    """randrw on a filled volume with GC on, then off; store/live bytes."""
    args = ctx.args
    rows = []
    for gc in ("on", "off"):
        srv = server_cls(ctx, args.size, "%s-gc-%s" % (SPACE, gc))
        ctx.live.append(srv)
        row = {"server": "%s gc %s" % (srv.name, gc), "workload": SPACE}
        timeout = args.space_runtime + 1800
        stats = os.path.join(srv.dir, "stats.json")
        try:
            srv.start(extra=["--gc", gc, "--stats-file", stats, "--stats-interval-ms", "1000"])
            target = srv.fio_target()
            run_fio("prefill", target, prefill_opts(args.size, timeout), os.path.join(srv.dir, "prefill.json"), timeout)
            opts = measured_opts(WORKLOADS[0], args.size, args.space_runtime, args.ramp)
            peak = [0.0]
            running = threading.Event()
            running.set()

            def watch():
                # The stats file's segment bytes over live bytes, each second.
                while running.is_set():
                    sp = (read_stats(stats) or {}).get("space", {})
                    if sp.get("live_bytes"):
                        peak[0] = max(peak[0], sp["stored_bytes"] / sp["live_bytes"])
                    time.sleep(1)

            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()
            with Sampler(srv.pid) as sampler:
                t0 = time.time()
                try:
                    argv, data = run_fio(SPACE, target, opts, os.path.join(srv.dir, "fio.json"), timeout)
                finally:
                    running.clear()
                    watcher.join()
            cpu, rss = sampler.window(t0 + args.ramp)
            row.update(fio_summary(data, "read"))
            time.sleep(1.5)  # one more stats interval
            st = read_stats(stats) or {}
            live = st.get("space", {}).get("live_bytes") or args.size
            end = srv.store_bytes()
            row.update({"store_bytes_end": end, "live_bytes": live, "store_live_end": end / live})
            row["store_live_peak"] = peak[0]
            note = "store/live %.2f at the end (segments: peak %.2f during the run)" % (end / live, peak[0])
            if gc == "on" and args.space_wait_grace:
                # Deletions made pending in the run come due after the grace period.
                deadline = time.time() + 90
                while time.time() < deadline:
                    time.sleep(2)
                    st = read_stats(stats) or {}
                    if st.get("gc", {}).get("pending_deletions", 1) == 0:
                        break
                # The embedded store keeps deleted segments' files to
                # overwrite, and unlinks those unused for 10 s.
                pool = os.path.join(srv.store(), ".strata-recycle") if hasattr(srv, "store") else None
                while pool and time.time() < deadline + 20 and os.path.isdir(pool) and os.listdir(pool):
                    time.sleep(1)
                after = srv.store_bytes()
                row.update({"store_bytes_after_grace": after, "store_live_after_grace": after / live})
                note += ", %.2f after the grace period" % (after / live)
            if gc == "on":
                g = st.get("gc", {})
                note += "; GC copied %.0f MiB, deleted %d objects" % (g.get("bytes_copied", 0) / MiB,
                                                                     g.get("objects_deleted", 0))
            row.update({"cpu_s": cpu, "peak_rss_mib": rss / MiB if rss else None, "status": "ok", "note": note,
                        "fio": " ".join(a for a in argv if not a.startswith("--output"))})
        except (BenchError, subprocess.TimeoutExpired, OSError) as e:
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
        rows.append(row)
    on, off = rows
    if on["status"] == "ok" and off["status"] == "ok":
        on["ratio"] = on["iops"] / off["iops"]
        off["ratio"] = 1.0
    return rows
