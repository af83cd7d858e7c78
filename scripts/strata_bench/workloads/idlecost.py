"""idlecost: what idle volumes cost in store requests: N volumes written
once and left idle on one server, its /metrics' store requests over the
idle window, per volume-hour and per host, and the monthly bill at S3
Standard prices; a fit over several N."""

import os
import re
import subprocess
import time
import urllib.request

from ..sampling import Sampler, proc_rss
from ..util import BenchError, GiB, MiB, free_port, spawn, tail, wait_for
from .manyvolumes import create_volumes


# Idle cost: what N idle volumes served from MinIO cost in store requests
# (per volume-hour, per host per 10 s, dollars a month at S3 Standard).
IDLECOST = "idlecost"
IDLECOST_TITLE = ("N volumes of 1 GiB, each written once (fio, a FLUSH at the end), served by one `strata serve`"
                  " on MinIO and left to settle, then idle: store requests over the idle window"
                  " (/metrics' strata_store_requests_total, delta by operation); host renewals ="
                  " strata_host_liveness_renewals_total's delta (a strata without it: -, and every request counted"
                  " both per volume and per host); per volume-hour = the rest / N / hours; per host per 10 s = the"
                  " renewals / (window / 10 s); $/month = the request bill of 1,000 such volumes on one host for"
                  " 30 days at S3 Standard prices (per volume-hour x 1,000 x 720 + the host's renewals); with two"
                  " or more N, a fit of the whole rate against N gives the part per volume and the part per host."
                  " Goal: <= 1 request per idle volume-hour plus at most one renewal per host every 10 s")

# idlecost's rows are one server each, idle.
IDLE_COLS = [("server", "%s"), ("window_s", "%.0f"), ("requests", "%d"), ("host_renewals", "%d"),
             ("per_volume_hour", "%.1f"),
             ("put_per_volume_hour", "%.1f"), ("per_host_10s", "%.1f"), ("usd_month_1000", "%.2f"),
             ("fit_per_volume_hour", "%.2f"), ("fit_host_per_10s", "%.2f"), ("fit_usd_month_1000", "%.2f"),
             ("cpu_s", "%.2f"), ("idle_rss_mib", "%.0f")]
IDLE_HEAD = ["server", "idle s", "requests", "host renewals", "per volume-hour", "PUT per volume-hour",
             "per host per 10 s", "$/month, 1,000 volumes", "fit: per volume-hour", "fit: per host per 10 s",
             "fit: $/month, 1,000", "CPU s", "RSS MiB"]

# S3 Standard request prices, dollars per request (us-east-1): PUT, COPY,
# POST (the multipart calls, "other" here) and LIST $0.005 per 1,000;
# GET, HEAD and every other $0.0004 per 1,000; DELETE free.
S3_PRICE = {"put": 0.005e-3, "copy": 0.005e-3, "list": 0.005e-3, "other": 0.005e-3,
            "get": 0.0004e-3, "get_range": 0.0004e-3, "head": 0.0004e-3, "delete": 0.0}
HOURS_PER_MONTH = 720  # 30 days
IDLECOST_FLEET = 1000  # volumes the monthly bill is for
# The design before a host-wide liveness object: one lease PUT per volume
# every 10 s, 360 per volume-hour.
IDLECOST_BEFORE_PER_VOLUME_HOUR = 360


def scrape_store_counters(url):
    """The store's request counters in /metrics (classic text), by family
    (requests, request_errors, not_found, condition_failed) and operation;
    and, from a strata that keeps a host liveness record, its renewals
    (family "host": renewals, renewal_failures)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback, never a proxy
    with opener.open(url, timeout=60) as r:
        text = r.read().decode(errors="replace")
    out = {}
    for m in re.finditer(r"^strata_store_(requests|request_errors|not_found|condition_failed)_total\{([^}]*)\} (\S+)$",
                         text, re.M):
        op = re.search(r'op="([^"]*)"', m.group(2))
        if op:
            out.setdefault(m.group(1), {})[op.group(1)] = float(m.group(3))
    for m in re.finditer(r"^strata_host_liveness_(renewals|renewal_failures)_total (\S+)$", text, re.M):
        out.setdefault("host", {})[m.group(1)] = float(m.group(2))
    if "requests" not in out:
        raise BenchError("no strata_store_requests_total in %s" % url)
    return out


def idle_write(ctx, srv, n, per_volume):
    """Writes per_volume bytes at the start of each of v1..vn (1 MiB
    blocks, iodepth 4, a FLUSH at the end), 32 volumes per fio, two fio
    at a time. The first fio's arguments."""
    from concurrent.futures import ThreadPoolExecutor
    batches = [range(i, min(i + 32, n + 1)) for i in range(1, n + 1, 32)]

    def one(k):
        out = os.path.join(srv.dir, "write-%d.json" % k)
        argv = ["fio", "--output-format=json", "--output=" + out, "--ioengine=nbd", "--rw=write", "--bs=1M",
                "--iodepth=4", "--size=%d" % per_volume, "--end_fsync=1", "--refill_buffers"]
        for i in batches[k]:
            argv += ["--name=v%d" % i, "--uri=nbd+unix:///v%d?socket=%s" % (i, srv.sock)]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
        if r.returncode != 0:
            raise BenchError("fio (write v%d..v%d): exit %d: %s" % (batches[k][0], batches[k][-1], r.returncode,
                                                                   r.stderr[-300:]))
        return argv

    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(one, range(len(batches))))[0]


def s3_bill(by_op):
    """Dollars for these requests at S3 Standard prices (S3_PRICE; an
    operation it does not know at the PUT price)."""
    return sum(v * S3_PRICE.get(op, S3_PRICE["put"]) for op, v in by_op.items())


def ops_text(by_op, spec="%.0f"):
    """'PUT 6, GET 1', the largest first."""
    return ", ".join(("%s " + spec) % (op.upper(), v) for op, v in sorted(by_op.items(), key=lambda kv: -kv[1]))


def run_idlecost(ctx, cls, n):
    """N volumes written once, settled, then idle: store requests over the
    idle window (see IDLECOST_TITLE)."""
    args = ctx.args
    srv = cls(ctx, GiB, "%s-%d" % (IDLECOST, n))
    ctx.live.append(srv)
    row = {"server": "%s %d volumes" % (srv.name, n), "workload": IDLECOST, "volumes": n}
    data = os.path.join(srv.dir, "data")
    env = srv.env()
    per_volume = args.idlecost_write or (4 * MiB if n <= 100 else MiB)
    try:
        created_s = create_volumes(ctx, srv.store(), data, env, n, GiB)
        out = os.path.join(srv.dir, "serve.out")
        metrics_url = "http://127.0.0.1:%d/metrics" % free_port()
        argv = [ctx.strata, "--store", srv.store(), "--data-dir", data, "serve", "--listen", "unix:" + srv.sock,
                "--metrics-listen", metrics_url[len("http://"):-len("/metrics")]]
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
        t0 = time.time()
        fio = idle_write(ctx, srv, n, per_volume)
        write_s = time.time() - t0
        # Open segments sealed (segment max age) and uploaded, GC's pass
        # after the last upload done: what is left is the idle cost.
        time.sleep(args.idlecost_settle_s)
        if srv.proc.poll() is not None:
            raise BenchError("%s exited (%s): %s" % (srv.name, srv.proc.returncode, tail(srv.log)))
        with Sampler(srv.proc.pid, interval=1.0) as sampler:
            # The counters' instant: the middle of each scrape (1,000
            # volumes' /metrics take a while to write).
            s0 = time.time()
            before = scrape_store_counters(metrics_url)
            s1 = time.time()
            time.sleep(max(0.0, args.idlecost_idle_s - (s1 - s0) / 2))
            s2 = time.time()
            after = scrape_store_counters(metrics_url)
            s3 = time.time()
        window_s = (s2 + s3) / 2 - (s0 + s1) / 2
        cpu, peak = sampler.window(s1)
        rss = proc_rss(srv.proc.pid)

        def delta(family):
            a, b = after.get(family, {}), before.get(family, {})
            return {op: a[op] - b.get(op, 0) for op in a if a[op] - b.get(op, 0) > 0}

        by_op = delta("requests")
        total = sum(by_op.values())
        hours = window_s / 3600
        # A strata with a host liveness record counts its renewals (PUTs):
        # those are the host's, the rest the volumes'. Without it the
        # requests cannot be told apart: all of them per volume, or all
        # per host (per_host_10s).
        host = sum(delta("host").values()) if "host" in before and "host" in after else None
        vol_by_op = dict(by_op)
        if host is not None:
            vol_by_op["put"] = max(0.0, vol_by_op.get("put", 0.0) - host)
            vol_by_op = {op: v for op, v in vol_by_op.items() if v > 0}
        per_vh = {op: v / n / hours for op, v in vol_by_op.items()}
        per_vh_total = sum(vol_by_op.values()) / n / hours
        per_host_10s = (total if host is None else host) / (window_s / 10)
        month = {op: v * IDLECOST_FLEET * HOURS_PER_MONTH for op, v in per_vh.items()}
        if host is not None:
            month["put"] = month.get("put", 0.0) + host / hours * HOURS_PER_MONTH
        usd = s3_bill(month)
        # Everything measured as the host's own, for a month (the other
        # bound when the host's renewals are not counted apart).
        host_usd = s3_bill({op: v / hours * HOURS_PER_MONTH for op, v in by_op.items()})
        before_usd = IDLECOST_BEFORE_PER_VOLUME_HOUR * IDLECOST_FLEET * HOURS_PER_MONTH * S3_PRICE["put"]
        goal = n * hours + window_s / 10  # 1 per volume-hour + 1 per host per 10 s
        first = fio[:fio.index("--name=v2")] if "--name=v2" in fio else fio  # v1's job stands for the rest
        row.update({"status": "ok", "created_s": created_s, "ready_s": ready_s, "written_mib": per_volume / MiB,
                    "write_s": write_s, "settle_s": args.idlecost_settle_s, "window_s": window_s,
                    "requests": total, "requests_by_op": by_op, "per_volume_hour": per_vh_total,
                    "per_volume_hour_by_op": per_vh, "put_per_volume_hour": per_vh.get("put", 0.0),
                    "per_host_10s": per_host_10s, "host_renewals": host, "requests_month_1000": sum(month.values()),
                    "usd_month_1000": usd, "host_usd_month": host_usd, "goal_requests": goal,
                    "goal_met": total <= goal, "not_found": delta("not_found"),
                    "condition_failed": delta("condition_failed"), "request_errors": delta("request_errors"),
                    "cpu_s": cpu, "idle_rss_mib": rss / MiB, "peak_rss_mib": peak / MiB if peak else None,
                    "fio": " ".join(a for a in first if not a.startswith("--output"))})
        where = "on MinIO" if not srv.latency_ms else "on MinIO through %s" % srv.note()
        extra = ["%s: %s" % (what, ops_text(row[k])) for k, what in
                 (("not_found", "not found"), ("condition_failed", "condition failed"),
                  ("request_errors", "errors")) if row[k]]
        if host is None:
            split = ("%.1f per volume-hour (%s) or %.1f per host per 10 s (the host's renewals not counted apart)"
                     % (per_vh_total, ops_text(per_vh, "%.1f") or "none", per_host_10s))
            bill = ("1,000 such volumes: $%s a month at S3 Standard (%s requests; all of it per host instead: $%s a"
                    " month a host)" % ("{:,.2f}".format(usd), "{:,.0f}".format(sum(month.values())),
                                        "{:,.2f}".format(host_usd)))
        else:
            split = ("%d of them the host's liveness renewals: %.1f per volume-hour (%s) plus %.1f per host per 10 s"
                     % (host, per_vh_total, ops_text(per_vh, "%.1f") or "none", per_host_10s))
            bill = ("1,000 such volumes on one host: $%s a month at S3 Standard (%s requests)"
                    % ("{:,.2f}".format(usd), "{:,.0f}".format(sum(month.values()))))
        row["note"] = ("%d volumes idle %.0f s %s: %d requests (%s), %s; goal (<= 1 per volume-hour + 1 per host per"
                       " 10 s: <= %.1f here) %s; %s, was $%s with a lease PUT per volume every 10 s%s; server CPU"
                       " %.2f s, RSS %.0f MiB over the window; %g MiB written to each volume in %.1f s, settled %d s;"
                       " %d volumes created in %.1f s, ready %.2f s after start"
                       % (n, window_s, where, total, ops_text(by_op) or "none", split, goal,
                          "met" if total <= goal else "missed", bill, "{:,.0f}".format(before_usd),
                          "; " + "; ".join(extra) if extra else "", cpu or 0, rss / MiB,
                          per_volume / MiB, write_s, args.idlecost_settle_s, n, created_s, ready_s))
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


def idlecost_fit(rows):
    """With two or more N among one server's rows: a least-squares fit of
    each operation's requests per hour against N, a*N + b: a per
    volume-hour, b per host-hour; 1,000 volumes on one host priced with it
    (a negative part counted as 0). Added to the rows (fit_*) and their
    notes; the note, or None."""
    rs = [r for r in rows if r["workload"] == IDLECOST and r["status"] == "ok"]
    xs = [r["volumes"] for r in rs]
    if len(set(xs)) < 2:
        return None
    mx = sum(xs) / len(xs)
    var = sum((x - mx) ** 2 for x in xs)
    per_volume, per_host = {}, {}
    for op in sorted({op for r in rs for op in r["requests_by_op"]}):
        ys = [r["requests_by_op"].get(op, 0) / r["window_s"] * 3600 for r in rs]
        my = sum(ys) / len(ys)
        a = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var
        per_volume[op], per_host[op] = a, my - a * mx
    month = {op: max(per_volume[op], 0) * IDLECOST_FLEET * HOURS_PER_MONTH
             + max(per_host[op], 0) * HOURS_PER_MONTH for op in per_volume}
    a_total, b_total = sum(per_volume.values()), sum(per_host.values())
    usd = s3_bill(month)
    note = ("fit over N = %s: %.2f per volume-hour (%s) + %.2f per host per 10 s (%s): 1,000 volumes on one"
            " host $%s a month" % (", ".join(str(x) for x in sorted(set(xs))), a_total,
                                    ops_text(per_volume, "%.2f") or "none", b_total / 360,
                                    ops_text({op: v / 360 for op, v in per_host.items()}, "%.2f") or "none",
                                    "{:,.2f}".format(usd)))
    for r in rs:
        r.update({"fit_per_volume_hour": a_total, "fit_host_per_10s": b_total / 360,
                  "fit_usd_month_1000": usd})
        r["note"] = "%s; %s" % (r["note"], note)
    return note
