"""qemu: what the QEMU guests of coldboot, migrate and guestio share: a
static busybox for their root, the host's kernel and initrd, BootProc (a
QEMU among ctx.live, stopped on every way out) and how long a guest may
take to reach its init."""

import os
import shutil
import subprocess

from ..util import BenchError


# Seconds a guest may take to reach its init (the kernel and initrd come
# from the host's files: TCG boots in ~10 s).
BOOT_INIT_TIMEOUT = 300


def static_busybox():
    """The path of a statically linked busybox (busybox-static), or
    BenchError."""
    bb = shutil.which("busybox")
    if not bb:
        raise BenchError("no busybox (apt-get install busybox-static; scripts/install-test-deps)")
    r = subprocess.run(["ldd", bb], capture_output=True, text=True)
    if r.returncode == 0 and "not a dynamic" not in r.stdout + r.stderr:
        raise BenchError("%s is dynamically linked: install busybox-static" % bb)
    return bb


def guest_kernel():
    """Debian's newest kernel in /boot and its initrd (as
    crates/strata/tests/qemu_guest.rs boots), or BenchError."""
    kernels = sorted(n for n in os.listdir("/boot") if n.startswith("vmlinuz-")) if os.path.isdir("/boot") else []
    if not kernels:
        raise BenchError("no /boot/vmlinuz-*: scripts/install-test-deps (linux-image-amd64)")
    kernel = os.path.join("/boot", kernels[-1])
    initrd = os.path.join("/boot", "initrd.img-" + kernels[-1][len("vmlinuz-"):])
    if not os.path.isfile(initrd):
        raise BenchError("%s has no initrd %s" % (kernel, initrd))
    return kernel, initrd


class BootProc:
    """QEMU in ctx.live (main() stops it on every exit path)."""

    name = "qemu"

    def __init__(self, proc):
        self.proc = proc
