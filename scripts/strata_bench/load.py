"""load: what runs beside the client in rows measured under a declared
load (--load), so a figure that drops on a busy host shows up next to its
quiet row in one run. A VM host is never quiet: its guests' CPUs, other
volumes and the store share it.

A loaded row is the fio workload's own row under another name,
WORKLOAD+LOAD (randrw+hog): it runs on the same servers, its ratio is to
nbdkit-memory under the same load, and its table follows the quiet one.

    hog   one process spinning at normal priority for the whole row (the
          server's start, the prefill, the measured run): one of the
          host's CPUs taken, as by a busy guest's vCPU
"""

import contextlib
import subprocess
import sys

QUIET = "quiet"
LOADS = {
    "hog": "beside a CPU hog (one process spinning at normal priority: one of the host's CPUs busy)",
}
SEPARATOR = "+"


def parse_loads(text):
    """--load's list: QUIET and names of LOADS, in the order given."""
    names = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [x for x in names if x != QUIET and x not in LOADS]
    if unknown or not names:
        raise ValueError("--load takes a comma-separated list of %s (got %r)"
                         % (", ".join([QUIET] + sorted(LOADS)), text))
    return names


def loaded(wl, load):
    """fio workload `wl` under `load`: the same dict, named WORKLOAD+LOAD."""
    if load == QUIET:
        return wl
    return dict(wl, name=wl["name"] + SEPARATOR + load, base=wl["name"], load=load,
                title="%s, %s" % (wl["title"], LOADS[load]))


def base_name(name):
    """The workload a (loaded) row's name stands for: randrw+hog -> randrw."""
    return name.split(SEPARATOR, 1)[0]


def load_of(name):
    """The load in a row's workload name, or None (quiet)."""
    parts = name.split(SEPARATOR, 1)
    return parts[1] if len(parts) == 2 and parts[1] in LOADS else None


@contextlib.contextmanager
def host_load(load):
    """Runs `load` (a LOADS name; None: nothing) until the block ends."""
    if load is None:
        yield
        return
    if load != "hog":
        raise ValueError("unknown load %r" % load)
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield
    finally:
        hog.kill()
        hog.wait()
