"""profiles: perf record of a server while it is measured (--profile,
--profile-cold), and perf report's top functions, whole process and the
strata binary's own."""

import os
import re
import shutil
import signal
import subprocess
import time

from .util import spawn, stop_process


def start_perf(ctx, srv):
    if not shutil.which("perf"):
        return None
    data = os.path.join(ctx.args.out, "perf.data")
    proc = spawn(["perf", "record", "-g", "-F", "999", "-p", str(srv.pid), "-o", data],
                 os.path.join(ctx.args.out, "perf-record.log"))
    time.sleep(0.5)
    return (proc, data)


def finish_perf(ctx, perf, tag=None):
    proc, data = perf
    stop_process(proc, sig=signal.SIGINT, timeout=120)
    report = ["perf", "report", "-i", data, "--no-children", "--sort", "symbol", "--stdio", "-g", "none",
              "--percent-limit", "0.5"]
    r = subprocess.run(report, capture_output=True, text=True)
    own = subprocess.run(report + ["--dsos", os.path.basename(ctx.strata)], capture_output=True, text=True)
    with open(os.path.join(ctx.args.out, "profile-%s.txt" % tag if tag else "profile.txt"), "w") as f:
        f.write(r.stdout + "\n\n# Only the strata binary's own functions (--dsos strata):\n\n" + own.stdout)
    n = ctx.args.profile_top
    return {"all": parse_perf_report(r.stdout)[:n], "strata": parse_perf_report(own.stdout)[:n]}


def parse_perf_report(text):
    """[(percent, symbol)] of `perf report --stdio --sort symbol` output."""
    top = []
    for line in text.splitlines():
        s = line.strip()
        if not s or s.startswith("#") or "%" not in s.split()[0]:
            continue
        pct, rest = s.split(None, 1)
        sym = rest.split("] ", 1)[1] if "] " in rest else rest
        # perf appends columns (e.g. IPC "-  -") after wide padding.
        top.append((float(pct.rstrip("%")), re.split(r"\s{2,}", sym.strip())[0]))
    return top
