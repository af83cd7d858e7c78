"""reports: the rows of a run made into what it reports: each row's line in
the log and whether it fails the run (report_row), the ratios (to
nbdkit-memory, to a reference, between stores), the tables (their columns
are each workload's, workloads.CATALOG), bench.md, bench.png, the baseline
comparison, and the machine and commit a run is of."""

import json
import os
import platform
import subprocess

from .load import LOADS, base_name, load_of
from .servers import SERVERS
from .stores import PROXY_JITTER_MS, PROXY_LATENCY_MS
from .util import GiB, REPO, fmt, log
from .workloads import BY_NAME, SPECIAL
from .workloads.coldboot import COLDBOOT, boot_text
from .workloads.coldboot_big import COLDBOOT_BIG, bigboot_text
from .workloads.coldread import COLD
from .workloads.guestio import GUESTIO, add_guestio_ratios, guestio_cells, guestio_text
from .workloads.handover import HANDOVER
from .workloads.idlecost import IDLECOST
from .workloads.manyvolumes import MANYVOLS
from .workloads.migrate import MIGRATE
from .workloads.powerloss import POWERLOSS


BASE = "nbdkit-memory"  # ratios are to this server


def add_ratios(rows):
    add_guestio_ratios(rows)
    base = {r["workload"]: r["iops"] for r in rows if r["server"] == BASE and r["status"] == "ok"}
    # The cold read has no nbdkit-memory row: its ratio is to the same
    # store's own GETs (MB/s): minio-get, seaweedfs-get.
    refs = {}
    for r in rows:
        if r["workload"] == COLD and r["server"].endswith("-get") and r["status"] == "ok":
            refs.setdefault(r.get("store", "minio"), r["mbps"])
    for c in rows:
        ref = refs.get(c.get("store", "minio"))
        if c["workload"] == COLD and c.get("status") == "ok" and "random" not in c["server"] and ref:
            c["ratio"] = c["mbps"] / ref
    for r in rows:
        b = base.get(r["workload"])
        if r["workload"] not in SPECIAL:
            r["ratio"] = r["iops"] / b if r.get("status") == "ok" and b else None
    # strata on S3 next to the embedded store (the warm-S3 yardstick), at
    # 20 ms next to 0 ms on the same store, and on SeaweedFS next to MinIO
    # at the same latency.
    def iops_of(server):
        return {r["workload"]: r["iops"] for r in rows
                if r["server"] == server and r["status"] == "ok" and r.get("iops")}
    emb = iops_of("strata-embedded")
    # Sustained writes next to the disk's own limit under the same syncs.
    disk = iops_of("disk-fsync")
    s3 = {n: iops_of(n) for n in ("strata-minio", "strata-minio-20ms", "strata-seaweedfs")}
    on_s3 = ("strata-minio", "strata-minio-20ms", "strata-seaweedfs", "strata-seaweedfs-20ms")
    for r in rows:
        if r.get("status") != "ok" or r["workload"] in SPECIAL:
            continue
        notes = []
        e = emb.get(r["workload"])
        if r["server"] in on_s3 and e:
            r["vs_embedded"] = r["iops"] / e
            notes.append("%.2fx strata-embedded" % r["vs_embedded"])
        m = s3["strata-minio"].get(r["workload"])
        if r["server"] == "strata-minio-20ms" and m:
            r["vs_minio_0ms"] = r["iops"] / m
            notes.append("%.2fx strata-minio (0 ms)" % r["vs_minio_0ms"])
        d = disk.get(r["workload"])
        if r["server"].startswith("strata-") and d:
            r["vs_disk"] = r["iops"] / d
            notes.append("%.2fx disk-fsync (the disk's limit)" % r["vs_disk"])
        w = s3["strata-seaweedfs"].get(r["workload"])
        if r["server"] == "strata-seaweedfs-20ms" and w:
            r["vs_seaweedfs_0ms"] = r["iops"] / w
            notes.append("%.2fx strata-seaweedfs (0 ms)" % r["vs_seaweedfs_0ms"])
        m = s3[r["server"].replace("seaweedfs", "minio")].get(r["workload"]) \
            if r["server"] in ("strata-seaweedfs", "strata-seaweedfs-20ms") else None
        if m:
            r["vs_minio"] = r["iops"] / m
            notes.append("%.2fx %s" % (r["vs_minio"], r["server"].replace("seaweedfs", "minio")))
        if notes:
            r["note"] = "; ".join(x for x in notes + [r.get("note")] if x)


def columns(wl):
    """(columns, headings) of a workload's table (its CATALOG entry's; a
    loaded row's, its workload's)."""
    w = BY_NAME[base_name(wl)]
    return w.cols, w.head


def table_rows(rows, wl):
    cols, _ = columns(wl)
    out = []
    for r in rows:
        if r["workload"] != wl:
            continue
        if r["status"] != "ok":
            out.append([r["server"]] + ["-"] * (len(cols) - 1) + ["FAILED: " + r.get("error", "")[:200]
                                                                  + ("; " + r["note"][-800:] if r.get("note") else "")])
        elif wl == GUESTIO:
            out.append(guestio_cells(r) + [r.get("note", "")])
        else:
            out.append([fmt(r.get(k), s) if k != "server" else r[k] for k, s in cols] + [r.get("note", "")])
    return out


def workload_title(wl):
    load = load_of(wl)
    title = BY_NAME[base_name(wl)].title
    return "%s, %s" % (title, LOADS[load]) if load else title


def print_tables(rows, workloads):
    for wl in workloads:
        body = table_rows(rows, wl)
        if not body:
            continue
        log("\n== %s: %s" % (wl, workload_title(wl)))
        head = columns(wl)[1]
        widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
        log("  ".join(h.rjust(w) if i else h.ljust(w) for i, (h, w) in enumerate(zip(head, widths))))
        for b in body:
            cells = [c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(b, widths))]
            log("  ".join(cells) + ("  " + b[-1] if b[-1] else ""))


def markdown(rows, workloads, meta, fio_params):
    lines = ["# strata bench", "",
             "- date: %s" % meta["date"], "- commit: %s" % meta["commit"],
             "- machine: %s" % meta["machine"], "- strata binary: %s" % meta.get("strata"),
             "- mode: %s; volume/file size %d MiB; warm-up %s s, then %s s per workload"
             % ("quick" if meta["quick"] else "full", meta["size"] >> 20, meta["ramp"], meta["runtime"]),
             "- ratio = IOPS (or MB/s: same block size) / the same workload on nbdkit memory;"
             " latencies are fio completion latencies (clat) of reads for mixed workloads;"
             " the cold read's ratio is to its store's own GET throughput of the same segment objects"
             " (minio-get for strata-minio rows, seaweedfs-get for strata-seaweedfs rows);"
             " coldclone's, coldrandread's, coldboot's and coldboot-big's ratios are to their local reference (nbdkit file,"
             " page cache dropped):"
             " its time / the row's time, or the row's IOPS / its IOPS; guestio's are to qsd-vhost (see its section);"
             " seqwrite's and seqwrite-flush's strata rows also to disk-fsync (fio writing a file of the same"
             " disk with strata's syncs: the disk's limit);"
             " CPU s = server CPU time (user+sys) during the measured window; peak RSS sampled every 0.1 s",
             "- S3 latency: strata-minio and strata-seaweedfs rows (and `... 0ms` rows) talk to their store on"
             " 127.0.0.1 directly (~0 ms); strata-minio-20ms and strata-seaweedfs-20ms rows (and `... 20ms` rows)"
             " through strata-latency-proxy in front of it, %d ms ± %d per request"
             % (PROXY_LATENCY_MS, PROXY_JITTER_MS),
             ""]
    if any(r["server"].startswith("strata-seaweedfs") for r in rows):
        lines.insert(-1, "- SeaweedFS: strata-seaweedfs rows (and -20ms: the same proxy in front of its gateway) on a"
                     " SeaweedFS cluster on 127.0.0.1 (strata-test-store: master, 3 volume servers with replication"
                     " 001, filer, S3 gateway), a bucket per row, deleted after it")
    if meta.get("pin_store"):
        lines.insert(-1, "- --pin-store: the S3 stores (MinIO, SeaweedFS) on CPUs %s, servers, fio and curl on the"
                     " others" % meta["pin_store"])
    for wl in workloads:
        body = table_rows(rows, wl)
        if not body:
            continue
        lines += ["## %s" % wl, "", workload_title(wl), ""]
        if wl in fio_params:
            lines += ["`%s`" % fio_params[wl], ""]
        head = columns(wl)[1]
        lines.append("| " + " | ".join(head + ["note"]) + " |")
        lines.append("|" + "---|" * (len(head) + 1))
        for b in body:
            lines.append("| " + " | ".join(c.replace("|", "/") for c in b) + " |")
        lines.append("")
    prof = [r for r in rows if r.get("profile")]
    for r in prof:
        for part, what in (("all", "whole process (kernel included)"),
                           ("strata", "the strata binary's own functions (--dsos strata)")):
            lines += ["## profile: %s, %s: %s" % (r["server"], r.get("profiled_workload", r["workload"]), what), "",
                      "perf record -g, perf report --no-children --sort symbol", "",
                      "| % of samples | function |", "|---|---|"]
            lines += ["| %.2f | `%s` |" % (p, s) for p, s in r["profile"][part]]
            lines.append("")
    return "\n".join(lines)


def chart(rows, workloads, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib not installed (apt-get install python3-matplotlib): no chart"
    wls = [w for w in workloads if w not in SPECIAL]
    # The servers with a ratio in a charted workload (the special
    # workloads' rows have ratios of their own kinds, not charted).
    charted = [r for r in rows if r.get("ratio") and r["workload"] in wls]
    servers = [s.name for s in SERVERS if any(r["server"] == s.name for r in charted)]
    servers += sorted({r["server"] for r in charted} - set(servers))
    if not servers or not wls:
        return "no ratios: no chart"
    fig, ax = plt.subplots(figsize=(max(8, 1.8 * len(wls)), 4.5))
    width = 0.8 / len(servers)
    for i, s in enumerate(servers):
        vals = []
        for w in wls:
            v = [r.get("ratio") for r in rows if r["server"] == s and r["workload"] == w]
            vals.append(v[0] if v and v[0] is not None else 0)
        xs = [j + (i - (len(servers) - 1) / 2) * width for j in range(len(wls))]
        ax.bar(xs, vals, width, label=s)
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(wls)))
    ax.set_xticklabels(wls)
    ax.set_ylabel("IOPS ratio to nbdkit memory")
    ax.set_title("strata bench: throughput relative to nbdkit memory (higher is better)")
    # Beside the bars, not over them.
    ax.legend(fontsize=8, ncol=1, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def compare_baseline(rows, path, tolerance):
    """Rows whose ratio fell more than `tolerance` (fraction) below baseline."""
    try:
        with open(path) as f:
            base = json.load(f)["ratios"]
    except (OSError, ValueError, KeyError) as e:
        return None, "no baseline at %s (%s)" % (path, e)
    regressions = []
    for r in rows:
        b = base.get(r["workload"], {}).get(r["server"])
        if b and r.get("ratio") is not None and r["ratio"] < b * (1 - tolerance):
            regressions.append((r["workload"], r["server"], b, r["ratio"]))
    return regressions, None


def ratios_of(rows):
    out = {}
    for r in rows:
        if r.get("ratio") is not None:
            out.setdefault(r["workload"], {})[r["server"]] = round(r["ratio"], 4)
    return out


def machine():
    mem = 0
    try:
        with open("/proc/meminfo") as f:
            mem = int(f.readline().split()[1]) * 1024
    except OSError:
        pass
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "")
    except OSError:
        pass
    return "%d cores (%s), %.1f GiB RAM, Linux %s" % (os.cpu_count(), cpu, mem / GiB, platform.release())


def git_commit():
    r = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return r.stdout.strip() + ("-dirty" if dirty else "")


def report_row(row, server_cls, failures):
    if row["workload"] == GUESTIO:
        log("    %s: %s" % (row["server"], guestio_text(row)))
        # A guest that did not reach its marker in time, or a strata binary
        # without --vhost-user-dir (soft), does not fail the run.
        if row["status"] != "ok" and server_cls.required and not row.get("soft"):
            failures.append("%s %s: %s" % (row["workload"], row["server"], row.get("error")))
        return
    if row["workload"] == COLDBOOT:
        log("    %s: %s" % (row["server"], boot_text(row)))
        # A boot that did not reach its marker in time (soft) does not fail
        # the run: a timing.
        if row["status"] != "ok" and server_cls.required and not row.get("soft"):
            failures.append("%s %s: %s" % (row["workload"], row["server"], row.get("error")))
        return
    if row["workload"] == COLDBOOT_BIG:
        log("    %s: %s" % (row["server"], bigboot_text(row)))
        if row["status"] != "ok" and server_cls.required:
            failures.append("%s %s: %s" % (row["workload"], row["server"], row.get("error")))
        return
    if row["workload"] in (MANYVOLS, IDLECOST, HANDOVER, MIGRATE, POWERLOSS) and row["status"] == "ok":
        log("    %s: %s" % (row["server"], row["note"]))
        return
    if row["status"] == "ok" and row.get("time_s") is not None:
        log("    %s: %.2f s, %.1f MB/s%s" % (row["server"], row["time_s"], row["mbps"],
                                          ", ratio %.4f" % row["ratio"] if row.get("ratio") else ""))
    elif row["status"] == "ok":
        log("    %s%.0f IOPS, %.1f MB/s%s" % (row["server"] + ": " if row["workload"] in SPECIAL else "",
                                           row["iops"], row["mbps"],
                                           ", ratio %.4f" % row["ratio"] if row.get("ratio") else ""))
    else:
        log("    FAILED: %s" % row.get("error"))
        if server_cls.required:
            failures.append("%s %s: %s" % (row["workload"], row["server"], row.get("error")))
