"""fsimage: the cold-data workloads' filesystem images and mounts: an ext4
image holding a fixed random sample of /usr's files (usr_image: coldclone,
coldboot, coldboot-big), and an NBD export's filesystem mounted read-only
as a VM sees its disk (FsMount: nbdfuse, loop with direct I/O, mount)."""

import os
import random
import shutil
import subprocess
import time

from ..util import BenchError, MiB, drop_caches, log, run_cmd, spawn, stop_process, wait_for


class FsMount:
    """An NBD export's ext4 filesystem mounted read-only, the way a VM sees
    its disk: nbdfuse (the export as a file), a read-only loop device with
    direct I/O (so the FUSE file's page cache never answers a read), mount
    -o ro. close() undoes every step that was done, also after a failure
    half-way; main() closes what is left at exit."""

    def __init__(self, ctx, d, uri):
        self.ctx, self.uri = ctx, uri
        self.fuse_dir = os.path.join(d, "fuse")
        self.file = os.path.join(self.fuse_dir, "nbd")
        self.mnt = os.path.join(d, "mnt")
        self.pidfile = os.path.join(d, "nbdfuse.pid")
        self.log = os.path.join(d, "nbdfuse.log")
        self.proc, self.dev, self.mounted, self.dio = None, None, False, None

    def commands(self, sub=None):
        """The commands as run (the URI's socket path is the run's); `sub`:
        read_all's subdirectory."""
        return ("nbdfuse -r -P PIDFILE FUSEDIR/nbd '%s'; losetup --find --show --read-only --direct-io=on FUSEDIR/nbd;"
                " mount -o ro /dev/loopN MNT; then per read: sync; echo 3 > /proc/sys/vm/drop_caches;"
                " find MNT%s -type f -print0 | xargs -0 -r cat | wc -c" % (self.uri, "/" + sub if sub else ""))

    def open(self):
        self.ctx.mounts.append(self)
        os.makedirs(self.fuse_dir, exist_ok=True)
        os.makedirs(self.mnt, exist_ok=True)
        if os.path.exists(self.pidfile):
            os.unlink(self.pidfile)
        # nbdfuse stays in the foreground; the pidfile appears once the FUSE
        # file is there.
        self.proc = spawn(["nbdfuse", "-r", "-P", self.pidfile, self.file, self.uri], self.log)
        wait_for(lambda: os.path.exists(self.pidfile) and os.path.exists(self.file), self.proc, "nbdfuse",
                 self.log, timeout=120)
        dev = run_cmd(["losetup", "--find", "--show", "--read-only", "--direct-io=on", self.file], "losetup").strip()
        if not dev.startswith("/dev/loop"):
            raise BenchError("losetup printed %r" % dev)
        self.dev = dev
        try:
            with open("/sys/block/%s/loop/dio" % os.path.basename(dev)) as f:
                self.dio = f.read().strip() == "1"
        except OSError:
            self.dio = None
        self.mount()

    def mount(self):
        run_cmd(["mount", "-o", "ro", self.dev, self.mnt], "mount", timeout=1800)
        self.mounted = True

    def umount(self):
        if self.mounted:
            run_cmd(["umount", self.mnt], "umount", timeout=1800)
            self.mounted = False

    def read_all(self, timeout, sub=None):
        """Every file read once (only those under MNT/`sub` when given), the
        caches dropped first: (seconds, bytes read, whether the caches could
        be dropped)."""
        dropped = drop_caches()
        t0 = time.time()
        top = os.path.join(self.mnt, sub) if sub else self.mnt
        out = run_cmd(["bash", "-c", 'set -o pipefail; find "$1" -type f -print0 | xargs -0 -r cat | wc -c',
                       "read-all", top], "reading every file", timeout=timeout)
        return time.time() - t0, int(out.split()[0]), dropped

    def close(self):
        """Best effort, each step whatever the others did."""
        if self in self.ctx.mounts:
            self.ctx.mounts.remove(self)
        if self.mounted:
            if subprocess.run(["umount", self.mnt], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", self.mnt], capture_output=True)
            self.mounted = False
        if self.dev:
            subprocess.run(["losetup", "-d", self.dev], capture_output=True)
            self.dev = None
        if self.proc is not None:
            if self.proc.poll() is None:
                subprocess.run(["fusermount3", "-u", self.fuse_dir], capture_output=True)
                try:
                    self.proc.wait(30)
                except subprocess.TimeoutExpired:
                    subprocess.run(["fusermount3", "-uz", self.fuse_dir], capture_output=True)
            stop_process(self.proc, timeout=10)
            self.proc = None


IMAGE_SOURCES = ("/usr/lib", "/usr/share", "/usr/bin", "/usr/sbin", "/usr/libexec", "/usr/include")


_USR_SAMPLE = []


def usr_sample():
    """The regular files under IMAGE_SOURCES of at most 16 MiB, as (path,
    size), in a fixed random order. Walked once per run: the walk of a
    developer machine's /usr takes seconds, and coldclone, coldboot and
    coldboot-big each build an image from it."""
    if not _USR_SAMPLE:
        candidates = []
        for top in IMAGE_SOURCES:
            for dirpath, _, filenames in os.walk(top):
                for name in filenames:
                    path = os.path.join(dirpath, name)
                    try:
                        st = os.lstat(path)
                    except OSError:
                        continue
                    if st.st_mode & 0o170000 == 0o100000 and st.st_size <= 16 * MiB:  # regular files
                        candidates.append((path, st.st_size))
        candidates.sort()
        random.Random(20).shuffle(candidates)
        _USR_SAMPLE.extend(candidates)
    return _USR_SAMPLE


def usr_image(size, d, label, extra=None, usr_budget=None, extra_what="a busybox root"):
    """An ext4 image of `size` in directory d: a deterministic random sample
    of the regular files under /usr (each at most 16 MiB: /usr's mix of
    sizes, mostly small, a few large), copied with their paths until they
    fill ~60% of it (or `usr_budget` bytes of it: data blocks and 4 KiB per
    file), then `extra(root)` (more files outside that budget: coldboot's
    busybox and init, coldboot-big's filler; `extra_what` says what in the
    log line), then mkfs.ext4 -d. Returns {path, size, files, dirs, bytes,
    sample_files, sample_bytes, build_s}; files and bytes count every
    regular file in it, sample_* the /usr sample's alone."""
    root = os.path.join(d, "root")
    os.makedirs(root, exist_ok=True)
    t0 = time.time()
    candidates = usr_sample()
    budget = int(size * 0.6) if usr_budget is None else int(usr_budget)
    files = used = nbytes = 0
    for path, fsize in candidates:
        blocks = (fsize + 4095) // 4096 * 4096 + 4096  # data blocks, and a margin for metadata
        if used + blocks > budget:
            if used >= budget - 256 * 1024:
                break
            continue
        dst = os.path.join(root, os.path.relpath(path, "/"))
        try:
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copyfile(path, dst)
            fsize = os.path.getsize(dst)
        except OSError:
            continue
        files += 1
        used += blocks
        nbytes += fsize
    if not files:
        raise BenchError("no readable files under %s" % ", ".join(IMAGE_SOURCES))
    others = 0  # links, devices: inodes too
    sample_files, sample_bytes = files, nbytes
    if extra is not None:
        extra(root)
        files = nbytes = 0
        for dirpath, _, filenames in os.walk(root):
            for name in filenames:
                st = os.lstat(os.path.join(dirpath, name))
                if st.st_mode & 0o170000 == 0o100000:
                    files += 1
                    nbytes += st.st_size
                else:
                    others += 1
    dirs = sum(1 for _ in os.walk(root))
    img = os.path.join(d, "disk.img")
    with open(img, "wb") as f:
        f.truncate(size)
    inodes = int((files + dirs + others) * 1.25) + 1024
    run_cmd(["mkfs.ext4", "-q", "-F", "-N", str(inodes), "-L", label, "-d", root, img], "mkfs.ext4 -d",
            timeout=1800)
    shutil.rmtree(root, ignore_errors=True)
    image = {"path": img, "size": size, "files": files, "dirs": dirs, "bytes": nbytes,
             "sample_files": sample_files, "sample_bytes": sample_bytes, "build_s": time.time() - t0}
    log("    image: %d MiB ext4, %d files in %d directories, %d MiB of file data sampled from /usr%s (%.1f s)"
        % (size >> 20, files, dirs, nbytes >> 20, " and " + extra_what if extra else "", image["build_s"]))
    return image
