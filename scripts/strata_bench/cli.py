"""cli: the command line and the run: parse_args (`scripts/bench --help`),
the tools a run needs, and main: which servers run which workloads (the
defaults, --servers, --workloads, --quick's smoke test), the stores started
for them, every runner called in turn, and the report files written."""

import argparse
import datetime
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time

from .context import Ctx, split_cpus
from .fio import WORKLOADS, generic_fio, run_one
from .load import QUIET, loaded, parse_loads
from .reports import (BASE, add_ratios, chart, compare_baseline, git_commit, machine, markdown, print_tables,
                      ratios_of, report_row)
from .servers import (GUEST_SERVERS, QsdServer, SERVERS, StrataEmbedded, StrataMinio, StrataMinio20ms, StrataSeaweedfs,
                      StrataSeaweedfs20ms, StrataServer)
from .stores import Minio, PROXY_LATENCY_MS, SeaweedfsStart, find_proxy
from .util import BenchError, GiB, MiB, REPO, log, stop_process
from .workloads import CATALOG
from .workloads.coldboot import COLDBOOT, run_coldboot
from .workloads.coldboot_big import BIGBOOT_HYDRATION_WAIT, COLDBOOT_BIG, run_coldboot_big
from .workloads.coldclone import COLDCLONE, run_coldclone
from .workloads.coldrandread import COLDRAND, run_coldrandread
from .workloads.coldread import COLD, run_coldread
from .workloads.guestio import GUESTIO, run_guestio
from .workloads.handover import HANDOVER, handover_cases, run_handover
from .workloads.idlecost import IDLECOST, idlecost_fit, run_idlecost
from .workloads.manyvolumes import MANYVOLS, run_manyvolumes
from .workloads.migrate import MIGRATE, MIGRATE_MODES, migrate_cases, run_migrate
from .workloads.powerloss import POWERLOSS, run_powerloss
from .workloads.qemu import guest_kernel, static_busybox
from .workloads.space import SPACE, run_space


def parse_size(s):
    units = {"k": 1 << 10, "m": MiB, "g": GiB}
    s = s.strip().lower().rstrip("ib").rstrip("b") if s[-1:].lower() == "b" else s.strip().lower()
    if s[-1:] in units:
        return int(float(s[:-1]) * units[s[-1]])
    return int(s)


# --help's first line: scripts/bench's docstring's.
DESCRIPTION = "bench: strata next to its peers, through fio, in one run."


def parse_args(argv):
    p = argparse.ArgumentParser(description=DESCRIPTION)
    p.add_argument("--quick", action="store_true", help="CI smoke test (~3 min; it measures nothing): small volumes, ~1 s per row; alone (without"
                        " --servers or --workloads) every server runs randrw, strata-embedded every fio workload,"
                        " strata-minio randrw-restart too, space and manyvolumes strata-embedded only, coldboot,"
                        " coldclone and coldrandread at 0 ms only, one migration")
    p.add_argument("--out", default=os.path.join(REPO, "target/bench"), help="output directory")
    p.add_argument("--size", type=parse_size, help="volume/file size per server (default 2GiB, quick 128MiB)")
    p.add_argument("--runtime", type=int, help="measured seconds per workload (default 20, quick 1)")
    p.add_argument("--ramp", type=int, help="warm-up seconds before measuring (default 5, quick 0)")
    p.add_argument("--load", default=QUIET,
                   help="comma-separated loads the fio workloads run under, each a row of its own named"
                        " WORKLOAD+LOAD next to the quiet one (default quiet): quiet, hog (one process spinning"
                        " at normal priority beside the client: a busy host), guest (a QEMU TCG guest beside"
                        " it, 2 vCPUs running fio randrw on a disk of its own: a peer VM; ~15 s to boot per row)."
                        " E.g. --load quiet,hog,guest")
    p.add_argument("--servers", help="comma-separated subset of: " + ",".join(s.name for s in SERVERS)
                   + "; guestio's: " + ",".join(s.name for s in GUEST_SERVERS)
                   + " (without --servers: every one, strata-seaweedfs and -20ms on randrw and coldread only,"
                     " --quick without strata-seaweedfs-20ms)")
    # The list as --help has always given it (workloads.CATALOG is the code's).
    p.add_argument("--workloads", help="comma-separated subset of: "
                   + ",".join([w["name"] for w in WORKLOADS] + [COLD, SPACE, COLDCLONE, COLDRAND, COLDBOOT, MANYVOLS,
                                                        IDLECOST, HANDOVER])
                   + "; only when named: " + ",".join([POWERLOSS, GUESTIO, COLDBOOT_BIG]))
    p.add_argument("--guestio-size", type=parse_size,
                   help="guestio: the guest's disk under test (default 1GiB, quick 128MiB)")
    p.add_argument("--cycles", type=int,
                   help="powerloss: power cuts per server (default 500, quick 20)")
    p.add_argument("--seed", type=int, help="powerloss: base seed (default: from the clock; printed)")
    p.add_argument("--manyvolumes", type=int,
                   help="manyvolumes: how many volumes one server holds (default 1000, quick 20)")
    p.add_argument("--idlecost-volumes",
                   help="idlecost: comma-separated volume counts, one server each (default 50,1000, quick 20)")
    p.add_argument("--idlecost-idle-s", type=int,
                   help="idlecost: seconds of idle measured (default 60, quick 3)")
    p.add_argument("--idlecost-settle-s", type=int,
                   help="idlecost: seconds between the writes and the idle window (default 15, quick 2)")
    p.add_argument("--idlecost-write", type=parse_size,
                   help="idlecost: bytes written to each volume (default 4MiB, 1MiB past 100 volumes)")
    p.add_argument("--handover-runs", type=int, help="handover: runs per row (default 5, quick 1)")
    p.add_argument("--handover-write",
                   help="handover: comma-separated sizes written to the holder before each handover, one row each"
                        " (default 8MiB,64MiB, quick 4MiB)")
    p.add_argument("--handover-lease-ttl-ms", type=int,
                   help="handover: both hosts' --lease-ttl-ms; the store path waits for the holder's renewal,"
                        " every third of it (default strata's, 30000; quick 3000)")
    p.add_argument("--migrations", type=int, help="migrate: migrations per row (default 10, quick 1)")
    p.add_argument("--migrate-via", choices=("socket", "store"), default="socket",
                   help="migrate: how the two hosts' strata reach each other: their control sockets (one"
                        " machine; the default) or only their records in the store (as across machines:"
                        " the control sockets removed)")
    p.add_argument("--migrate-writers", help="migrate: the guest writers to run, comma-separated, of %s"
                   " (default all; --quick: 4k)" % ", ".join(MIGRATE_MODES))
    p.add_argument("--coldclone-size", type=parse_size,
                   help="coldclone's ext4 image size (default 1GiB, quick 64MiB; ~60%% of it file data)")
    p.add_argument("--coldboot-big-size", type=parse_size,
                   help="coldboot-big's ext4 image size (default 8GiB, quick 512MiB; 5/8 of it never-read filler,"
                        " ~0.9 GB per 8 GiB a sample of /usr, the part read)")
    p.add_argument("--coldboot-big-disk-cache", type=parse_size,
                   help="coldboot-big: each strata serve's --disk-cache-size (default the image's size + 1 GiB)")
    p.add_argument("--coldboot-timeout", type=int,
                   help="coldboot: seconds a boot may take to read its image (from QEMU's start; default 900, quick 300)")
    p.add_argument("--hydration-wait", type=int,
                   help="coldrandread: seconds to poll `volume info` for hydration to finish (default 600, quick 20);"
                        " coldboot-big: seconds per clone to wait for it to end (default %d, quick too)"
                        % BIGBOOT_HYDRATION_WAIT)
    p.add_argument("--latency-proxy", help="strata-latency-proxy binary (default: target/release's, built when missing)")
    p.add_argument("--space-runtime", type=int, help="seconds of randrw in the space workload (default 120, quick 2)")
    p.add_argument("--no-space-wait", dest="space_wait_grace", action="store_false",
                   help="space workload: do not wait for the grace period after the run")
    p.add_argument("--strata", help="strata binary (default: $CARGO_TARGET_DIR or target /release/strata, built)")
    p.add_argument("--profile", action="store_true", help="perf profile of strata under randrw")
    p.add_argument("--strata-args", default="", help="extra arguments for every `strata serve` (e.g. \"--readahead 32MiB\")")
    p.add_argument("--profile-workload", default="randrw", choices=[w["name"] for w in WORKLOADS],
                   help="which workload --profile records (default randrw)")
    p.add_argument("--profile-cold", action="store_true", help="perf profile of strata during the cold read")
    p.add_argument("--profile-server", default="strata-embedded",
                   choices=[c.name for c in SERVERS if issubclass(c, StrataServer)],
                   help="which strata --profile records (default strata-embedded)")
    p.add_argument("--profile-top", type=int, default=15)
    p.add_argument("--baseline", default=os.path.join(REPO, "bench/baseline.json"))
    p.add_argument("--tolerance", type=float, default=0.15, help="regression tolerance (fraction)")
    p.add_argument("--fail-on-regression", action="store_true")
    p.add_argument("--write-baseline", metavar="PATH", help="write this run's ratios as a baseline")
    p.add_argument("--keep", action="store_true", help="keep the scratch directory")
    p.add_argument("--pin-store", action="store_true",
                   help="the S3 stores (MinIO, SeaweedFS) on their own CPUs (the first half), servers, fio "
                        "and curl on the others: as if the store were another machine, so S3 rows measure "
                        "strata rather than the CPU it shares with the store (every row then runs on half "
                        "the CPUs)")
    p.add_argument("--scratch-parent", default=None, help="where the scratch directory goes (a disk, not tmpfs)")
    a = p.parse_args(argv)
    if a.size is None:
        a.size = 128 * MiB if a.quick else 2 * GiB
    if a.runtime is None:
        a.runtime = 1 if a.quick else 20
    if a.ramp is None:
        a.ramp = 0 if a.quick else 5
    if a.space_runtime is None:
        a.space_runtime = 2 if a.quick else 120
    if a.coldclone_size is None:
        a.coldclone_size = 64 * MiB if a.quick else GiB
    if a.guestio_size is None:
        a.guestio_size = 128 * MiB if a.quick else GiB
    if a.coldboot_timeout is None:
        a.coldboot_timeout = 300 if a.quick else 900
    a.hydration_wait_given = a.hydration_wait is not None
    if a.hydration_wait is None:
        a.hydration_wait = 20 if a.quick else 600
    if a.coldboot_big_size is None:
        a.coldboot_big_size = 512 * MiB if a.quick else 8 * GiB
    if a.manyvolumes is None:
        a.manyvolumes = 20 if a.quick else 1000
    if a.cycles is None:
        a.cycles = 20 if a.quick else 500
    a.idlecost_volumes = [int(x) for x in (a.idlecost_volumes or ("20" if a.quick else "50,1000")).split(",")]
    if a.idlecost_idle_s is None:
        a.idlecost_idle_s = 3 if a.quick else 60
    if a.idlecost_settle_s is None:
        a.idlecost_settle_s = 2 if a.quick else 15
    if a.handover_runs is None:
        a.handover_runs = 1 if a.quick else 5
    a.handover_write = [parse_size(x) for x in (a.handover_write or ("4MiB" if a.quick else "8MiB,64MiB")).split(",")]
    if a.migrations is None:
        a.migrations = 1 if a.quick else 10
    if a.handover_lease_ttl_ms is None and a.quick:
        a.handover_lease_ttl_ms = 3000
    if a.quick:
        a.space_wait_grace = False
    a.out = os.path.abspath(a.out)
    return a


def find_strata(args):
    if args.strata:
        return args.strata
    target = os.environ.get("CARGO_TARGET_DIR") or os.path.join(REPO, "target")
    path = os.path.join(target, "release", "strata")
    log("==> cargo build --release -p strata")
    r = subprocess.run(["cargo", "build", "--release", "-p", "strata"], cwd=REPO)
    if r.returncode != 0 or not os.access(path, os.X_OK):
        raise BenchError("cannot build %s" % path)
    return path


def check_tools(servers, cold_fs=False, boot=False, guest_servers=(), nbd_py=False):
    missing = [t for t in ("fio", "curl") if not shutil.which(t)]
    if nbd_py:
        import importlib.util
        if importlib.util.find_spec("nbd") is None:
            missing.append("libnbd's Python bindings (python3-libnbd)")
    if cold_fs:
        missing += [t for t in ("nbdfuse", "fusermount3", "losetup", "mount", "umount", "mkfs.ext4", "nbdkit")
                    if not shutil.which(t)]
    if boot:
        missing += [t for t in ("qemu-system-x86_64", "mkfs.ext4", "nbdkit", "ldd") if not shutil.which(t)]
        try:
            static_busybox()
            guest_kernel()
        except BenchError as e:
            missing.append(str(e))
    if guest_servers:
        missing += [t for t in ("qemu-system-x86_64", "ldd") if not shutil.which(t)]
        if any(issubclass(s, QsdServer) for s in guest_servers) and not shutil.which("qemu-storage-daemon"):
            missing.append("qemu-storage-daemon (qemu-system-x86 / qemu-utils)")
        try:
            static_busybox()
            guest_kernel()
        except BenchError as e:
            missing.append(str(e))
    r = subprocess.run(["fio", "--enghelp"], capture_output=True, text=True) if not missing else None
    if r is not None and "nbd" not in r.stdout.split():
        missing.append("fio with the nbd engine")
    for s in servers:
        tool = {"nbdkit-memory": "nbdkit", "nbdkit-file": "nbdkit", "qemu-nbd-wb": "qemu-nbd",
                "qemu-nbd-none": "qemu-nbd"}.get(s.name)
        if tool and not shutil.which(tool):
            missing.append(tool)
    if missing:
        raise BenchError("missing: %s (scripts/install-test-deps installs them)" % ", ".join(missing))


def in_smoke(wl, cls):
    """Whether --quick's smoke test runs fio workload `wl` on `cls`: each
    server proves it starts and serves I/O on the first workload (randrw),
    strata-embedded runs every workload (each one's fio options, prefill,
    restart and ageing), strata on MinIO also restarts (the write-back
    cache's path). A pair's code is the server's and the workload's: the
    full matrix (~120 rows) measures, the smoke test does not."""
    return wl is WORKLOADS[0] or cls is StrataEmbedded or (cls is StrataMinio and wl.get("restart"))


def main(argv):
    args = parse_args(argv)
    # Benchmarks talk only to loopback: no S3 client here (strata's, mc's)
    # asks the cloud instance metadata service.
    os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
    os.environ["AWS_METADATA_ENDPOINT"] = "http://127.0.0.1:1"
    os.makedirs(args.out, exist_ok=True)
    # Without --servers: every server, those with default_workloads on
    # those only (only[cls]), and with --quick none that is not in_quick.
    servers = [s for s in SERVERS if s.in_quick or not args.quick]
    only = {s: set(s.default_workloads) for s in servers if s.default_workloads is not None}
    guest_servers = GUEST_SERVERS
    if args.servers:
        want = args.servers.split(",")
        unknown = set(want) - {s.name for s in SERVERS + GUEST_SERVERS}
        if unknown:
            raise BenchError("unknown server(s): %s" % ", ".join(sorted(unknown)))
        servers = [s for s in SERVERS if s.name in want]
        only = {}
        guest_servers = [s for s in GUEST_SERVERS if s.name in want]
    # The workloads named, or the default set (CATALOG's default); guestio
    # also when --servers names its servers and no --workloads are given.
    if args.workloads:
        want = args.workloads.split(",")
        unknown = set(want) - {w.name for w in CATALOG}
        if unknown:
            raise BenchError("unknown workload(s): %s" % ", ".join(sorted(unknown)))
    else:
        want = [w.name for w in CATALOG if w.default]
        if args.servers and any(s.name in args.servers.split(",") for s in GUEST_SERVERS):
            want.append(GUESTIO)
    try:
        loads = parse_loads(args.load)
    except ValueError as e:
        raise BenchError(str(e))
    # Each fio workload under each load (load.py), the quiet one first.
    workloads = [loaded(w, load) for w in WORKLOADS if w["name"] in want for load in loads]
    want_cold = COLD in want
    want_space = SPACE in want
    want_clone = COLDCLONE in want
    want_crand = COLDRAND in want
    want_boot = COLDBOOT in want
    want_many = MANYVOLS in want
    want_idle = IDLECOST in want
    want_handover = HANDOVER in want
    want_migrate = MIGRATE in want
    want_power = POWERLOSS in want
    want_guest = GUESTIO in want
    want_bigboot = COLDBOOT_BIG in want
    if not want_guest:
        guest_servers = []
    # A server whose default_workloads are none of this run's is not run
    # (its store is not started).
    wanted = {w.get("base", w["name"]) for w in workloads} | ({COLD} if want_cold else set())
    servers = [s for s in servers if s not in only or only[s] & wanted]
    # The smoke test (--quick alone) runs these on the embedded store only.
    smoke = args.quick and not args.servers and not args.workloads
    pair = (StrataEmbedded,) if smoke else (StrataEmbedded, StrataMinio)
    space_servers = [s for s in servers if s in pair] if want_space else []
    many_servers = [s for s in servers if s in pair] if want_many else []
    power_servers = [s for s in servers if s in (StrataEmbedded, StrataMinio)] if want_power else []
    # idlecost: strata on MinIO; at 20 ms only when --servers names it.
    idle_servers = [s for s in servers if s is StrataMinio or (s is StrataMinio20ms and args.servers)] \
        if want_idle else []
    # handover: strata on the embedded store and MinIO; at 20 ms too,
    # except in --quick unless --servers names it.
    handover_servers = [s for s in servers if s in (StrataEmbedded, StrataMinio)
                        or (s is StrataMinio20ms and (args.servers or not args.quick))] if want_handover else []
    # migrate: strata on MinIO at ~0 and 20 ms (--quick: ~0 ms, 4 KiB only).
    migrate_classes = [s for s in servers if s in (StrataMinio, StrataMinio20ms)] if want_migrate else []
    cold_classes = [c for c in (StrataMinio, StrataMinio20ms, StrataSeaweedfs, StrataSeaweedfs20ms)
                    if c in servers and COLD in only.get(c, {COLD})] if want_cold else []
    want_cold = bool(cold_classes)
    # The cold-data workloads run strata on MinIO at 0 and 20 ms (--quick:
    # 0 ms).
    s3_strata = any(issubclass(s, StrataMinio) for s in servers)
    want_clone = want_clone and s3_strata
    want_crand = want_crand and s3_strata
    want_boot = want_boot and s3_strata
    check_tools(servers, cold_fs=want_clone or want_bigboot, boot=want_boot or bool(migrate_classes),
                guest_servers=guest_servers, nbd_py=bool(handover_servers))
    args.strata = find_strata(args)
    if want_clone or want_crand or want_boot or want_bigboot or any(getattr(s, "latency_ms", 0) for s in servers):
        find_proxy(args)

    scratch = tempfile.mkdtemp(prefix="strata-bench.", dir=args.scratch_parent)
    ctx = Ctx(args, scratch)
    if args.pin_store:
        ctx.store_cpus, rest = split_cpus()
        # Children (servers, fio, curl) inherit this; the S3 stores are
        # started on store_cpus (S3Store.pinned).
        os.sched_setaffinity(0, rest)
        log("pinned: S3 stores on CPUs %s, everything else on %s" % (sorted(ctx.store_cpus), sorted(rest)))
    rows, failures, notes = [], [], []

    def on_term(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    started = time.time()
    try:
        pcls = next(c for c in SERVERS if c.name == args.profile_server) if args.profile else None
        if (any(s.needs_minio for s in servers) or any(c.needs_minio for c in cold_classes) or want_clone
                or want_crand or want_boot or want_bigboot or (pcls and pcls.needs_minio)):
            ctx.minio = Minio(scratch, ctx.store_cpus)
            try:
                ctx.minio.start()
            except BenchError as e:
                failures.append("MinIO: %s" % e)
                ctx.minio = None
                servers = [s for s in servers if not s.needs_minio]
                cold_classes = [c for c in cold_classes if not c.needs_minio]
                want_clone = want_crand = want_boot = False
        seaweedfs = SeaweedfsStart(ctx, failures)
        if any(s.needs_seaweedfs for s in servers) or (pcls and pcls.needs_seaweedfs) or want_bigboot:
            # The smoke test measures nothing: the ~15 s start overlaps
            # its first rows. A measuring run waits for it first.
            seaweedfs.begin(background=smoke)
        for wl in workloads:
            for s in servers:
                if wl.get("strata_only") and not issubclass(s, StrataServer):
                    continue
                if s in only and wl.get("base", wl["name"]) not in only[s]:
                    continue
                if smoke and not in_smoke(wl, s):
                    continue
                if s.needs_seaweedfs and not seaweedfs.ready():
                    continue
                log("==> %-10s %-16s" % (wl["name"], s.name))
                row = run_one(ctx, s, wl)
                report_row(row, s, failures)
                rows.append(row)
        for s in space_servers:
            if s.needs_minio and ctx.minio is None:
                continue
            log("==> %-10s %-16s (GC on, then off)" % (SPACE, s.name))
            for row in run_space(ctx, s):
                report_row(row, s, failures)
                rows.append(row)
        referenced = set()  # stores whose own GETs were measured
        for cls in cold_classes:
            if cls.needs_seaweedfs and not seaweedfs.ready():
                continue
            log("==> %-10s %-16s" % (COLD, cls.name))
            reference = cls.store_attr not in referenced
            referenced.add(cls.store_attr)
            for row in run_coldread(ctx, cls, reference=reference):
                report_row(row, cls, failures)
                rows.append(row)
        for s in many_servers:
            if s.needs_minio and ctx.minio is None:
                continue
            log("==> %-10s %-16s (%d volumes)" % (MANYVOLS, s.name, args.manyvolumes))
            for row in run_manyvolumes(ctx, s):
                report_row(row, s, failures)
                rows.append(row)
        for s in idle_servers:
            if ctx.minio is None:
                continue
            srows = []
            for n in args.idlecost_volumes:
                log("==> %-10s %-16s (%d volumes, %d s idle)" % (IDLECOST, s.name, n, args.idlecost_idle_s))
                for row in run_idlecost(ctx, s, n):
                    report_row(row, s, failures)
                    srows.append(row)
            fit = idlecost_fit(srows)
            if fit:
                log("    %s: %s" % (s.name, fit))
            rows += srows
        for s in handover_servers:
            if s.needs_minio and ctx.minio is None:
                continue
            for via, nbytes in handover_cases(args, s):
                log("==> %-10s %-16s (via %s, %g MiB in the holder's journal, %d runs)"
                    % (HANDOVER, s.name, via, nbytes / MiB, args.handover_runs))
                row = run_handover(ctx, s, via, nbytes)
                report_row(row, s, failures)
                rows.append(row)
        for s, mode in migrate_cases(args, migrate_classes):
            if ctx.minio is None:
                continue
            log("==> %-10s %-16s (%s, %d migrations)" % (MIGRATE, s.name, MIGRATE_MODES[mode], args.migrations))
            row = run_migrate(ctx, s, mode, args.migrations)
            report_row(row, s, failures)
            rows.append(row)
        for s in power_servers:
            if s.needs_minio and ctx.minio is None:
                continue
            log("==> %-10s %-16s (%d cycles)" % (POWERLOSS, s.name, args.cycles))
            row = run_powerloss(ctx, s)
            report_row(row, s, failures)
            rows.append(row)
        if want_clone:
            log("==> %-10s strata-minio at 0%s ms, nbdkit-file"
                % (COLDCLONE, "" if args.quick else " and %d" % PROXY_LATENCY_MS))
            for row in run_coldclone(ctx):
                report_row(row, StrataMinio, failures)
                rows.append(row)
        if want_crand:
            log("==> %-10s strata-minio at 0%s ms, nbdkit-file"
                % (COLDRAND, "" if args.quick else " and %d" % PROXY_LATENCY_MS))
            for row in run_coldrandread(ctx):
                report_row(row, StrataMinio, failures)
                rows.append(row)
        if want_boot:
            log("==> %-10s strata-minio at 0%s ms (first boot, clone with profile)%s"
                % (COLDBOOT, "" if args.quick else " and %d" % PROXY_LATENCY_MS,
                   "" if args.quick else ", nbdkit-file"))
            for row in run_coldboot(ctx):
                report_row(row, StrataMinio, failures)
                rows.append(row)
        if want_bigboot:
            seaweedfs.ready()  # its rows are left out without it
            log("==> %-10s strata-minio at 0 and %d ms, strata-seaweedfs at %d ms (first clone, later clone),"
                " nbdkit-file" % (COLDBOOT_BIG, PROXY_LATENCY_MS, PROXY_LATENCY_MS))
            for row in run_coldboot_big(ctx):
                report_row(row, StrataMinio, failures)
                rows.append(row)
        if guest_servers:
            for row, cls in run_guestio(ctx, guest_servers):
                report_row(row, cls, failures)
                rows.append(row)
        if args.profile:
            log("==> profile: %s on %s under perf record" % (args.profile_workload, pcls.name))
            if not shutil.which("perf"):
                notes.append("perf not installed: no profile")
            elif pcls.needs_seaweedfs and not seaweedfs.ready():
                failures.append("profile run: SeaweedFS did not start")
            else:
                pwl = next(w for w in WORKLOADS if w["name"] == args.profile_workload)
                prow = run_one(ctx, pcls, pwl, profile=True)
                if prow["status"] != "ok":
                    failures.append("profile run: %s" % prow.get("error"))
                else:
                    prow["server"] = "%s (perf)" % pcls.name
                    prow["profiled_workload"] = pwl["name"]
                    prow["workload"] = "profile"
                    rows.append(prow)
    except KeyboardInterrupt:
        log("interrupted: stopping servers")
        failures.append("interrupted")
    finally:
        for m in reversed(list(ctx.mounts)):
            m.close()
        for srv in list(ctx.live):
            stop_process(srv.proc, timeout=10)
        for p in ctx.proxies.values():
            p.stop()
        if ctx.minio:
            ctx.minio.stop()
        if ctx.seaweedfs:
            ctx.seaweedfs.stop()
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
        else:
            log("scratch kept: %s" % scratch)

    add_ratios(rows)
    # The workloads that ran, in CATALOG's order.
    ran = {w["name"] for w in workloads} | {name for name, did in (
        (COLD, want_cold), (SPACE, space_servers), (COLDCLONE, want_clone), (COLDRAND, want_crand),
        (COLDBOOT, want_boot), (COLDBOOT_BIG, want_bigboot), (MANYVOLS, many_servers), (IDLECOST, idle_servers),
        (HANDOVER, handover_servers), (MIGRATE, migrate_classes), (POWERLOSS, power_servers),
        (GUESTIO, guest_servers)) if did}
    wl_names = [w.name for w in CATALOG if w.name in ran]
    # A loaded fio workload's table right after its quiet one's.
    wl_names = [n for name in wl_names for n in [name] + [w["name"] for w in workloads
                                                          if w.get("base") == name]]
    wl_names += [w["name"] for w in workloads if w.get("base") and w["base"] not in wl_names]
    fio_params = {}
    for r in sorted(rows, key=lambda r: r["server"] != BASE):
        if r.get("fio") and r["workload"] not in fio_params:
            fio_params[r["workload"]] = generic_fio(r["fio"])
    meta = {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"), "commit": git_commit(),
            "machine": machine(), "quick": args.quick, "size": args.size, "runtime": args.runtime,
            "ramp": args.ramp, "elapsed_s": round(time.time() - started, 1), "strata": args.strata,
            "pin_store": sorted(ctx.store_cpus) if ctx.store_cpus else None}

    print_tables(rows, wl_names)
    prof = [r for r in rows if r.get("profile")]
    for r in prof:
        for part, what in (("all", "whole process"), ("strata", "strata's own functions")):
            log("\n== profile: %s, %s, %s (perf report --no-children --sort symbol)" % (r["server"], r.get("profiled_workload", r["workload"]), what))
            for pct, sym in r["profile"][part]:
                log("%6.2f%%  %s" % (pct, sym))

    png = os.path.join(args.out, "bench.png")
    note = chart(rows, wl_names, png)
    if note:
        notes.append(note)

    regressions = None
    if not args.quick:
        regressions, note = compare_baseline(rows, args.baseline, args.tolerance)
        if note:
            notes.append(note)
        elif regressions:
            log("\n== regressions beyond %.0f%% of %s" % (args.tolerance * 100, args.baseline))
            for wl, srv, b, now in regressions:
                log("  %-10s %-16s baseline %.3f  now %.3f  (%+.0f%%)" % (wl, srv, b, now, (now / b - 1) * 100))
        else:
            log("\n== no regression beyond %.0f%% of %s" % (args.tolerance * 100, args.baseline))

    result = {"meta": meta, "fio": fio_params, "rows": rows, "ratios": ratios_of(rows),
              "regressions": regressions, "failures": failures, "notes": notes}
    with open(os.path.join(args.out, "bench.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(args.out, "bench.md"), "w") as f:
        f.write(markdown(rows, wl_names, meta, fio_params))
    if args.write_baseline:
        with open(args.write_baseline, "w") as f:
            json.dump({"meta": meta, "ratios": ratios_of(rows)}, f, indent=1, sort_keys=True)
            f.write("\n")
    for n in notes:
        log("note: %s" % n)
    log("\nwrote %s/bench.{json,md%s} in %.0f s" % (args.out, ",png" if os.path.exists(png) else "",
                                                    meta["elapsed_s"]))
    if failures:
        log("\nFAILED:")
        for f_ in failures:
            log("  " + f_)
        return 1
    if regressions and args.fail_on_regression:
        return 2
    return 0
