"""powerloss: the power-loss soak: strata-powerloss kills strata with -9 and
loses what its disk had not synced, cycle after cycle, and checks every
durable write (a durability check, not a speed)."""

import os
import re
import subprocess
import tempfile
import time

from ..stores import BUCKET
from ..util import BenchError, REPO, log


POWERLOSS = "powerloss"
POWERLOSS_TITLE = ("power-loss soak: kill -9, the data dir's disk loses what was not synced (modes drop, subset,"
                   " torn, all in turn), restart, every FLUSHed/FUA write read back and the volume a prefix state;"
                   " snapshots, clones and GC on (strata-powerloss)")

POWER_COLS = [("server", "%s"), ("cycles", "%d"), ("time_s", "%.1f"), ("requests", "%d"), ("durable", "%d"),
              ("lost_unflushed", "%d"), ("snapshot_checks", "%d"), ("seed", "%d")]
POWER_HEAD = ["server", "cycles", "seconds", "requests", "durable read back", "unflushed lost (allowed)",
              "snapshot checks", "base seed"]


def find_powerloss():
    """strata-powerloss from target/release, built when missing or older
    than its crate's sources."""
    target = os.environ.get("CARGO_TARGET_DIR") or os.path.join(REPO, "target")
    path = os.path.join(target, "release", "strata-powerloss")
    src = os.path.join(REPO, "crates", "strata-testkit")
    newest = max((os.path.getmtime(os.path.join(d, f)) for d, _, fs in os.walk(src) for f in fs), default=0)
    if not os.access(path, os.X_OK) or os.path.getmtime(path) < newest:
        log("==> cargo build --release -p strata-testkit --bin strata-powerloss")
        r = subprocess.run(["cargo", "build", "--release", "-p", "strata-testkit", "--bin", "strata-powerloss"],
                           cwd=REPO)
        if r.returncode != 0 or not os.access(path, os.X_OK):
            raise BenchError("cannot build %s" % path)
    return path


def run_powerloss(ctx, cls):
    """The power-loss soak on one server class (see POWERLOSS_TITLE)."""
    args = ctx.args
    seed = args.seed if args.seed is not None else int(time.time() * 1000) % (1 << 31)
    work = tempfile.mkdtemp(prefix="powerloss.", dir=ctx.scratch)
    row = {"server": cls.name, "workload": POWERLOSS, "seed": seed, "cycles": args.cycles}
    argv = [find_powerloss(), "--strata", ctx.strata, "--work-dir", work, "--cycles", str(args.cycles),
            "--seed", str(seed), "--extras", "--fsck-every", "25"]
    env = dict(os.environ, AWS_EC2_METADATA_DISABLED="true", AWS_METADATA_ENDPOINT="http://127.0.0.1:1")
    if cls.needs_minio:
        argv += ["--s3", "s3://%s/powerloss-%d" % (BUCKET, seed)]
        env.update(ctx.minio.env())
    log("    seed %d: %s" % (seed, " ".join(argv)))
    out_path = os.path.join(work, "out.txt")
    t0 = time.time()
    with open(out_path, "w") as out:
        r = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    row["time_s"] = time.time() - t0
    with open(out_path) as f:
        text = f.read()
    last = text.strip().splitlines()[-1] if text.strip() else ""
    if r.returncode != 0:
        row.update({"status": "failed", "error": "seed %d: %s" % (seed, text[-1500:])})
        return row
    found = re.findall(r"(\d+) (requests sent|durable ones read back|unflushed ones lost|snapshot and)", last)
    inv = {label: int(n) for n, label in found}
    row.update({"status": "ok", "requests": inv.get("requests sent"), "durable": inv.get("durable ones read back"),
                "lost_unflushed": inv.get("unflushed ones lost"), "snapshot_checks": inv.get("snapshot and"),
                "note": last})
    return row
