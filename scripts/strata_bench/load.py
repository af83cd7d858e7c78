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
    guest a QEMU guest (TCG, guestio's kernel and initramfs) running fio
          randrw on a disk of its own (a raw file through QEMU's block
          layer) for the whole row: a peer VM busy on the same host, its
          vCPUs, its emulation and its disk I/O; booted before the row
"""

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time

from .util import BenchError, MiB, stop_process, tail

QUIET = "quiet"
LOADS = {
    "hog": "beside a CPU hog (one process spinning at normal priority: one of the host's CPUs busy)",
    "guest": "beside a busy guest (QEMU TCG, 2 vCPUs, fio randrw 70/30 4 KiB, 2 jobs at QD4, O_DIRECT on a"
             " 512 MiB virtio disk of its own: a raw file of the same host disk through QEMU's block layer)",
}
# The busy guest's disk, and its fio: looped until QEMU is killed.
GUEST_DISK_MIB = 512
GUEST_BODY = r"""echo "GUESTIO busy"
while true; do
    $FIO --name=busy --filename=/dev/$d --ioengine=$ENGINE --direct=1 --rw=randrw --rwmixread=70 --bs=4k \
        --iodepth=4 --numjobs=2 --thread --time_based --runtime=600 --randrepeat=0 --norandommap \
        --output=/dev/null >/dev/null 2>&1
done"""
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
def host_load(ctx, load):
    """Runs `load` (a LOADS name; None: nothing) until the block ends."""
    if load is None:
        yield
        return
    if load == "guest":
        with busy_guest(ctx):
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


@contextlib.contextmanager
def busy_guest(ctx):
    """The `guest` load: boots it, waits until its fio starts, and kills
    QEMU when the block ends (BenchError if it does not come up)."""
    # Imported here: the workloads import the servers, which import fio.py,
    # which imports this module.
    from .workloads.guestio import guestio_initrd, guestio_qemu_argv
    from .workloads.qemu import BOOT_INIT_TIMEOUT, BootProc, guest_kernel
    kernel, _ = guest_kernel()
    initrd, _ = guestio_initrd(ctx, kernel, body=GUEST_BODY, name="busy-guest-initrd.img")
    d = tempfile.mkdtemp(prefix="busy-guest-", dir=ctx.scratch)
    disk, console, log = (os.path.join(d, n) for n in ("disk.img", "console.log", "qemu.log"))
    with open(disk, "wb") as f:
        f.truncate(GUEST_DISK_MIB * MiB)
    argv = guestio_qemu_argv(kernel, initrd) + [
        "-drive", "file=%s,format=raw,if=none,id=d0,cache=none,aio=threads" % disk,
        "-device", "virtio-blk-pci,drive=d0", "-serial", "file:" + console]
    with open(log, "ab") as logf:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=logf,
                                start_new_session=True)
    holder = BootProc(proc)
    ctx.live.append(holder)
    try:
        deadline = time.time() + BOOT_INIT_TIMEOUT
        while not _console_says(console, b"GUESTIO busy"):
            if proc.poll() is not None:
                raise BenchError("the busy guest's QEMU exited (%s): %s" % (proc.returncode, tail(log, 3)))
            if time.time() > deadline:
                raise BenchError("the busy guest did not start its fio within %d s: %s"
                                 % (BOOT_INIT_TIMEOUT, tail(console, 3)))
            time.sleep(0.2)
        yield
    finally:
        stop_process(proc, timeout=10)
        ctx.live.remove(holder)
        shutil.rmtree(d, ignore_errors=True)


def _console_says(path, marker):
    try:
        with open(path, "rb") as f:
            return marker in f.read()
    except OSError:
        return False
