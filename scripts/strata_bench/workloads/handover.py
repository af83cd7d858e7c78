"""handover: a volume handed over between two `strata serve` on one store
on request (`strata volume handover`), from the request to the new
holder's first write, through the control socket and through the store
(issue 41). StrataHost: one such serve, also migrate's."""

import json
import os
import random
import re
import statistics
import subprocess
import time

from ..servers import StrataEmbedded
from ..stats import strata_cli
from ..util import BenchError, GiB, MiB, fmt, log, spawn, stop_process, tail, wait_for


# Handover (issue 41): a volume moved between two hosts on request, from
# the request to the new holder's first write served.
HANDOVER = "handover"
HANDOVER_TITLE = ("a volume handed over between two `strata serve` (A and B: own data dirs, one store); A holds it"
                  " with the row's MiB of random data written and no FLUSH (--segment-age-ms 60000: in its"
                  " journal); t0 = `strata volume handover vol --json` run for B's data dir, t1 = B's first 4 KiB"
                  " FUA write acknowledged (libnbd connect: B opens the volume at that connection; then the"
                  " write); total = t1 - t0 (median and max over the runs); command = the command's wall time,"
                  " released = its elapsed_ms (request to lease released); holder's close = A's own report"
                  " (upload, checkpoint, lease released; A's log line through the store); overhead = total -"
                  " holder's close. Via store: A's control.sock removed, A answers at its next liveness renewal"
                  " (every lease TTL / 3). Goal: <= 100 ms plus the upload of what A's journal held"
                  " (overhead <= 100 ms)")

# handover's rows are one kind of handover each, medians over the runs.
HANDOVER_COLS = [("server", "%s"), ("runs", "%d"), ("total_ms", "%.0f"), ("total_max_ms", "%.0f"),
                 ("command_ms", "%.0f"), ("release_ms", "%.0f"), ("holder_ms", "%.0f"), ("uploaded_mib", "%.1f"),
                 ("first_write_ms", "%.0f"), ("connect_ms", "%.0f"), ("overhead_ms", "%.0f"),
                 ("overhead_max_ms", "%.0f")]
HANDOVER_HEAD = ["server", "runs", "total ms", "total max ms", "command ms", "released ms", "holder's close ms",
                 "uploaded MiB", "first write ms", "connect+open ms", "overhead ms", "overhead max ms"]

HANDOVER_GOAL_MS = 100  # plus the holder's upload
HANDOVER_PATHS = ("control socket", "store")  # as the command's JSON names them ("via")


class StrataHost:
    """One `strata serve` of a handover (a "host"): its own data dir and
    socket in srv's directory, on srv's store with srv's environment (srv:
    the run's StrataServer, never started itself). Has `proc`, so ctx.live
    stops it on exit."""

    def __init__(self, ctx, srv, tag):
        self.ctx, self.srv, self.tag = ctx, srv, tag
        self.data = os.path.join(srv.dir, tag + "-data")
        self.sock = os.path.join(srv.dir, tag + ".sock")
        self.log = os.path.join(srv.dir, tag + ".log")
        self.out = os.path.join(srv.dir, tag + ".out")
        self.proc = None

    def start(self, extra):
        argv = [self.ctx.strata, "--store", self.srv.store(), "--data-dir", self.data, "serve",
                "--listen", "unix:" + self.sock] + list(extra) + self.ctx.args.strata_args.split()
        with open(self.out, "wb") as outf:
            self.proc = spawn(argv, self.log, env=self.srv.env(), stdout=outf)

        def ready():
            try:
                with open(self.out) as f:
                    return "ready" in f.read().split()
            except OSError:
                return False

        wait_for(ready, self.proc, "%s (host %s)" % (self.srv.name, self.tag), self.log)

    def stop(self):
        """Clean stop (SIGTERM); the exit code."""
        code = stop_process(self.proc, timeout=300)
        self.proc = None
        return code


def nbd_connect(sock, export="vol"):
    """A libnbd handle connected to export on the unix socket."""
    import nbd
    h = nbd.NBD()
    h.set_export_name(export)
    h.connect_unix(sock)
    return h


def handover_write(sock, nbytes):
    """nbytes of random data at the start of the volume, 1 MiB writes, no
    FLUSH (they stay in the holder's journal); the data."""
    import nbd
    data = os.urandom(nbytes)
    try:
        h = nbd_connect(sock)
        for off in range(0, nbytes, MiB):
            h.pwrite(data[off:off + MiB], off)
        h.shutdown()
    except nbd.Error as e:
        raise BenchError("writing %d MiB to the holder: %s" % (nbytes >> 20, e))
    return data


def first_write(sock, offset, page):
    """B's first write: connect (B opens the volume at this connection),
    then `page` at offset with FUA (write + FLUSH without FUA). The handle
    and the connect's and the write's ms."""
    import nbd
    try:
        t0 = time.monotonic()
        h = nbd_connect(sock)
        t1 = time.monotonic()
        if h.can_fua():
            h.pwrite(page, offset, nbd.CMD_FLAG_FUA)
        else:
            h.pwrite(page, offset)
            h.flush()
        t2 = time.monotonic()
    except nbd.Error as e:
        raise BenchError("the new holder's first write: %s" % e)
    return h, (t1 - t0) * 1e3, (t2 - t1) * 1e3


def verify_handover(h, data, offset, page):
    """Reads back through the new holder the first, middle and last 64 KiB
    of what the old one was written, 8 pages at random and the first
    write: a difference is a lost write (BenchError)."""
    import nbd
    n, span = len(data), min(64 << 10, len(data))
    pick = random.Random(n)
    ranges = [(0, span), ((n // 2) & ~4095, span), (n - span, span)]
    ranges += [(pick.randrange(max(1, n // 4096)) * 4096, min(4096, n)) for _ in range(8)]
    try:
        for off, ln in ranges:
            if h.pread(ln, off) != data[off:off + ln]:
                raise BenchError("the new holder read %d bytes at offset %d that differ from what the old holder"
                                 " was written (lost in the handover)" % (ln, off))
        if h.pread(len(page), offset) != page:
            raise BenchError("the new holder does not read back its own first write at offset %d" % offset)
        h.shutdown()
    except nbd.Error as e:
        raise BenchError("reading back through the new holder: %s" % e)


def holder_log_report(path):
    """(bytes uploaded, ms) of the holder's close from its log line
    "volume handed over on request" (through the store the command gets
    no report); (None, None) when not logged."""
    try:
        with open(path, errors="replace") as f:
            text = f.read()
    except OSError:
        return None, None
    m = re.search(r"volume handed over on request.*?bytes_uploaded=(\d+).*?elapsed_ms=(\d+)", text)
    return (int(m.group(1)), int(m.group(2))) if m else (None, None)


def handover_measure(ctx, srv, a, b, via, nbytes):
    """A written nbytes, then at once the handover to B and B's first
    write, timed (see HANDOVER_TITLE); then read back. The run's dict."""
    data = handover_write(a.sock, nbytes)
    page = os.urandom(4096)
    # At once (what a VM writes just before it moves): in A's journal,
    # bar the full segments already uploaded (A's report tells).
    t0 = time.monotonic()
    out = strata_cli(ctx, srv, ["volume", "handover", "vol", "--json"], b.data, timeout=300)
    t_cmd = time.monotonic()
    h, connect_ms, write_ms = first_write(b.sock, nbytes, page)
    t1 = time.monotonic()
    verify_handover(h, data, nbytes, page)
    v = json.loads(out)
    if v.get("via") != via or not v.get("holder"):
        raise BenchError("the handover went via %r (asked for %r), holder %r: %s"
                         % (v.get("via"), via, v.get("holder"), out.strip()[-300:]))
    report = v.get("report") or {}
    uploaded, holder_ms = report.get("bytes_uploaded"), report.get("elapsed_ms")
    if holder_ms is None:
        uploaded, holder_ms = holder_log_report(a.log)
    total_ms = (t1 - t0) * 1e3
    return {"total_ms": total_ms, "command_ms": (t_cmd - t0) * 1e3, "release_ms": v.get("elapsed_ms"),
            "holder_ms": holder_ms, "uploaded_bytes": uploaded, "first_write_ms": (t1 - t_cmd) * 1e3,
            "connect_ms": connect_ms, "write_ms": write_ms,
            "overhead_ms": total_ms - holder_ms if holder_ms is not None else None}


def handover_once(ctx, cls, via, nbytes, run):
    """One handover on a fresh store (embedded: a directory; S3: a
    prefix) and fresh data dirs: A started holding the volume, B started
    (it cannot open it yet: an error in its log, expected), measured, both
    stopped (A would refuse the volume for 30 s after handing it over)."""
    args = ctx.args
    size = max(GiB, nbytes + MiB)  # room for B's first write past A's data
    srv = cls(ctx, size, "handover-%s-%d-%d" % (via.split()[-1], nbytes >> 20, run))
    a, b = StrataHost(ctx, srv, "a"), StrataHost(ctx, srv, "b")
    ctx.live += [a, b]
    ttl = ["--lease-ttl-ms", str(args.handover_lease_ttl_ms)] if args.handover_lease_ttl_ms else []
    try:
        a.start(["--create", "vol=%d" % size, "--volume", "vol", "--segment-age-ms", "60000"]
                + srv.at_rest_args() + ttl)
        if via == "store":
            # The command asks over a holder's socket only when its file
            # exists: without it, only A's host record reaches A.
            os.unlink(os.path.join(a.data, "control.sock"))
        b.start(ttl)
        res = handover_measure(ctx, srv, a, b, via, nbytes)
        res["store_note"] = srv.note() if hasattr(srv, "note") else "embedded store (a local directory)"
    finally:
        codes = {h.tag: h.stop() for h in (b, a)}
        ctx.live.remove(a)
        ctx.live.remove(b)
        if not args.keep:
            srv.cleanup()
    bad = ["%s exit %s" % (t, c) for t, c in sorted(codes.items()) if c != 0]
    if bad:
        log_path = a.log if codes["a"] != 0 else b.log
        raise BenchError("a host did not stop cleanly (%s): %s" % (", ".join(bad), tail(log_path)))
    return res


def median_of(runs, key):
    xs = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(xs) if xs else None


def max_of(runs, key):
    xs = [r[key] for r in runs if r.get(key) is not None]
    return max(xs) if xs else None


def handover_summary(runs):
    """A row's figures: the median of each part over the runs, the max of
    the total and of the overhead, and the goal (overhead <= 100 ms)."""
    row = {k: median_of(runs, k) for k in ("total_ms", "command_ms", "release_ms", "holder_ms", "first_write_ms",
                                           "connect_ms", "write_ms", "overhead_ms", "uploaded_bytes")}
    row["total_max_ms"] = max_of(runs, "total_ms")
    row["overhead_max_ms"] = max_of(runs, "overhead_ms")
    row["uploaded_mib"] = row["uploaded_bytes"] / MiB if row["uploaded_bytes"] is not None else None
    row["runs"] = len(runs)
    row["goal_runs"] = sum(1 for r in runs if r["overhead_ms"] is not None and r["overhead_ms"] <= HANDOVER_GOAL_MS)
    row["goal_met"] = row["overhead_ms"] is not None and row["overhead_ms"] <= HANDOVER_GOAL_MS
    row["runs_detail"] = [{k: v for k, v in r.items() if k != "store_note"} for r in runs]
    return row


def handover_note(row, via, ttl_ms, store_note):
    def f(v):
        return fmt(v, "%.0f")

    path = ("through A's control socket" if via == "control socket" else
            "through the store (A's control.sock removed; A renews its liveness every %d ms, lease TTL %d ms%s)"
            % (ttl_ms // 3, ttl_ms, ", strata's default" if ttl_ms == 30000 else ""))
    return ("%s, %s: %d runs, A written %g MiB (no FLUSH); total %s ms median, %s max: the command %s ms (released"
            " after %s), the holder's close %s ms (%s MiB uploaded), B's first write %s ms (connect, B opening the"
            " volume, %s; FUA write %s); overhead (total - holder's close) %s ms median, %s max: goal (<= %d ms"
            " plus the upload) %s (%d of %d runs)"
            % (store_note, path, row["runs"], row["written_mib"], f(row["total_ms"]), f(row["total_max_ms"]),
               f(row["command_ms"]), f(row["release_ms"]), f(row["holder_ms"]), fmt(row["uploaded_mib"], "%.1f"),
               f(row["first_write_ms"]), f(row["connect_ms"]), f(row["write_ms"]), f(row["overhead_ms"]),
               f(row["overhead_max_ms"]), HANDOVER_GOAL_MS, "met" if row["goal_met"] else "missed",
               row["goal_runs"], row["runs"]))


def handover_cases(args, cls):
    """(via, bytes written) of cls's rows: every size through each path;
    --quick goes through the store on strata-embedded only (and its TTL
    is short)."""
    paths = [p for p in HANDOVER_PATHS if p != "store" or not args.quick or cls is StrataEmbedded]
    return [(via, n) for via in paths for n in args.handover_write]


def run_handover(ctx, cls, via, nbytes):
    """--handover-runs handovers of one kind (see HANDOVER_TITLE): a row."""
    args = ctx.args
    row = {"server": "%s via %s, %g MiB" % (cls.name, via, nbytes / MiB), "workload": HANDOVER, "via": via,
           "written_mib": nbytes / MiB}
    runs = []
    try:
        for i in range(1, args.handover_runs + 1):
            r = handover_once(ctx, cls, via, nbytes, i)
            runs.append(r)
            log("    run %d: %.0f ms (command %.0f, holder's close %s with %s MiB, first write %.0f of which open %.0f)"
                % (i, r["total_ms"], r["command_ms"], fmt(r["holder_ms"], "%.0f"),
                   fmt(r["uploaded_bytes"] / MiB if r["uploaded_bytes"] is not None else None, "%.1f"),
                   r["first_write_ms"], r["connect_ms"]))
        row.update(handover_summary(runs))
        row["note"] = handover_note(row, via, args.handover_lease_ttl_ms or 30000, runs[-1]["store_note"])
        row["status"] = "ok"
    except (BenchError, subprocess.TimeoutExpired, OSError, ValueError, KeyError) as e:
        row.update({"status": "failed", "error": str(e), "runs_detail": runs})
    return row
