"""stats: what strata reports of itself beside a running server: its stats
file (read_stats, stats_now; store and read-path counters), `strata`
commands on a server's store and data dir (strata_cli, volume_info), and a
volume's hydration (HydrationWatch, wait_hydrated)."""

import json
import subprocess
import threading
import time

from .util import BenchError, run_cmd


def read_stats(path, volume="vol"):
    try:
        with open(path) as f:
            return json.load(f)["volumes"][volume]
    except (OSError, ValueError, KeyError):
        return None


def strata_cli(ctx, srv, args, data_dir, timeout=3600):
    """`strata --store S --data-dir D ARGS` with srv's store and environment."""
    argv = [ctx.strata, "--store", srv.store(), "--data-dir", data_dir] + list(args)
    return run_cmd(argv, "strata " + " ".join(args[:2]), timeout=timeout, env=srv.env())


def stats_now(path):
    """The stats file once strata wrote it again (--stats-interval-ms 200)."""
    time.sleep(0.5)
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def store_gets(st):
    """GET requests strata made so far (every layer's count of get and
    get_range), from its stats file; None when not there."""
    try:
        reqs = st["store"]["layers"]["requests"]
    except (KeyError, TypeError):
        return None
    total = 0
    found = False
    for op, v in (reqs.items() if isinstance(reqs, dict) else ()):
        if op.startswith("get") and isinstance(v, dict) and isinstance(v.get("requests"), int):
            total += v["requests"]
            found = True
        elif op.startswith("get") and isinstance(v, int):
            total += v
            found = True
    return total if found else None


def store_counts(st):
    """Every store request so far, and the read path's data and hydration
    GETs, from strata's stats file (None when not there)."""
    out = {}
    try:
        out["store_requests"] = sum(v.get("requests", 0) for v in st["store"]["layers"]["requests"].values()
                                    if isinstance(v, dict))
    except (KeyError, TypeError, AttributeError):
        pass
    rp = (st.get("read_path") or {}).get("store") or {} if isinstance(st, dict) else {}
    for k in ("data_gets", "data_get_bytes", "hydration_gets", "hydration_get_bytes"):
        if isinstance(rp.get(k), int):
            out[k] = rp[k]
    return out


def counts_delta(before, after):
    a, b = store_counts(after), store_counts(before)
    return {k: v - b.get(k, 0) for k, v in a.items()}


def disk_cache_bytes(st):
    try:
        return st["read_path"]["disk_cache"]["used_bytes"]
    except (KeyError, TypeError):
        return None


def volume_info(ctx, srv):
    """`strata volume info vol --json` on srv's host (its data dir), or None."""
    try:
        out = strata_cli(ctx, srv, ["volume", "info", srv.volume, "--json"], srv.data_dir(), timeout=120)
        return json.loads(out)
    except (BenchError, ValueError, subprocess.TimeoutExpired):
        return None


HYDRATION_END = ("done", "cache_full", "failed", "off")


def hydration_text(h):
    """`volume info`'s hydration in a few words."""
    if not isinstance(h, dict):
        return json.dumps(h)[:200]
    parts = [str(h.get("state"))]
    if isinstance(h.get("local_bytes"), int) and isinstance(h.get("total_bytes"), int):
        parts.append("%d of %d MiB local" % (h["local_bytes"] >> 20, h["total_bytes"] >> 20))
    if h.get("gets") is not None:
        parts.append("%s GETs" % h["gets"])
    if h.get("elapsed_ms") is not None:
        parts.append("%.1f s" % (h["elapsed_ms"] / 1000.0))
    if h.get("mode"):
        parts.append("mode %s" % h["mode"])
    return ", ".join(parts)


class HydrationWatch:
    """Watches the hydration strata reports in its stats file
    (volumes.vol.hydration, rewritten every --stats-interval-ms) from the
    server's start: when it reached an end state, without spawning anything
    while a measurement runs."""

    def __init__(self, stats_path, started, volume="vol"):
        self.path, self.started, self.volume = stats_path, started, volume
        self.last = None  # the last hydration object seen
        self.end_s = None  # seconds from `started` to an end state
        self.stop_ev = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.stop_ev.wait(0.2):
            h = (read_stats(self.path, self.volume) or {}).get("hydration")
            if isinstance(h, dict):
                self.last = h
                if str(h.get("state")) in HYDRATION_END:
                    self.end_s = time.time() - self.started
                    return

    def wait(self, limit_s):
        """Waits up to limit_s for an end state (only if hydration is
        reported at all); returns a note."""
        if self.last is not None:
            self.thread.join(limit_s)
        self.stop_ev.set()
        self.thread.join()
        if self.last is None:
            return None
        state = str(self.last.get("state"))
        if self.end_s is None:
            return "hydration still %s after %d s more (%s)" % (state, limit_s, hydration_text(self.last))
        return "hydration %s %.1f s after the server was ready (%s)" % (
            "done: all local" if state == "done" else "ended " + state, self.end_s, hydration_text(self.last))


def wait_hydrated(ctx, srv, started, limit_s):
    """Polls volume info each second while it reports hydration under way:
    (note, seconds from the server's start until done or None)."""
    info = volume_info(ctx, srv)
    if not info or not isinstance(info.get("hydration"), dict):
        return "hydration: n/a (volume info reports none)", None
    deadline = time.time() + limit_s
    while True:
        h = info.get("hydration") or {}
        state = str(h.get("state"))
        if state in HYDRATION_END:
            took = time.time() - started if state == "done" else None
            return ("hydration %s%s (%s)" % (state, ": all local %.1f s after the server was ready" % took
                                             if took is not None else "", hydration_text(h)), took)
        if time.time() > deadline:
            return "hydration still %s after %d s of polling (%s)" % (state, limit_s, hydration_text(h)), None
        time.sleep(1)
        info = volume_info(ctx, srv) or info
