"""servers: the servers under test, one class each, all alike to the
workloads (start, fio_target, pid, stop; see Server): strata serve on the
embedded store and its compressed, encrypted, /metrics, TCP and TLS
variants, strata on the run's MinIO and SeaweedFS (at ~0 and 20 ms),
strata-embedded as a loop device of this host (on its own FUSE file, and
on nbdfuse's), nbdkit memory and file, qemu-nbd, s3backer (SERVERS, in
--servers' and the chart's order); and guestio's (GUEST_SERVERS):
qemu-storage-daemon and strata serve as a QEMU guest's disk, over
vhost-user-blk and NBD."""

import os
import shutil
import subprocess
import threading
import time
import urllib.request

from .fio import prefill_opts, run_fio
from .stores import BUCKET, PROXY_JITTER_MS, PROXY_LATENCY_MS, S3_KEY, S3_SECRET
from .util import BenchError, MiB, free_port, is_socket, log, socket_accepts, spawn, stop_process, tail, wait_for


class Server:
    """One server instance serving one fresh volume/file of `size` bytes.

    start() -> None (raises BenchError); fio_target() -> fio options;
    pid -> the process whose CPU and RSS are measured; stop()."""

    name = "?"
    required = True  # its failure fails the run
    needs_minio = False
    needs_seaweedfs = False
    # Without --servers: the only workloads it runs (None: every one), and
    # whether --quick runs it at all (main).
    default_workloads = None
    in_quick = True

    def __init__(self, ctx, size, tag):
        self.ctx = ctx
        self.size = size
        self.dir = os.path.join(ctx.scratch, "%s-%s" % (self.name, tag))
        os.makedirs(self.dir, exist_ok=True)
        self.sock = os.path.join(self.dir, "nbd.sock")
        self.log = os.path.join(self.dir, "server.log")
        self.proc = None

    @property
    def pid(self):
        return self.proc.pid

    def fio_target(self):
        return {"ioengine": "nbd", "uri": "nbd+unix:///%s?socket=%s" % (self.export, self.sock)}

    export = ""

    def start_and_wait_socket(self, argv, env=None):
        self.proc = spawn(argv, self.log, env=env)
        wait_for(lambda: socket_accepts(self.sock), self.proc, self.name, self.log)

    def stop(self):
        code = stop_process(self.proc)
        self.proc = None
        return code

    def release(self):
        """Frees what the row holds outside its directory (run_one,
        run_coldread: after the row, --keep or not)."""

    def cleanup(self):
        shutil.rmtree(self.dir, ignore_errors=True)


class StrataServer(Server):
    volume = "vol"  # the volume served (and the NBD export's name)

    @property
    def export(self):
        return self.volume

    def __init__(self, ctx, size, tag):
        super().__init__(ctx, size, tag)
        self.prefix = "bench-%s-%d-%s" % (time.strftime("%Y%m%d-%H%M%S"), os.getpid(), tag)
        # A cold workload's clones are served from their image's prefix
        # (srv.prefix = importer.prefix): only the prefix's owner deletes it.
        self.own_prefix = self.prefix
        self.out = None
        self.data_n = 0

    def store(self):
        return os.path.join(self.dir, "store")

    def data_dir(self):
        """The data dir of the last start."""
        return os.path.join(self.dir, "data-%d" % self.data_n)

    def at_rest_args(self):
        """Volumes stored plain (the other strata-embedded-* rows compress
        and encrypt): the ratio base of those rows, and comparable with
        runs before compression existed."""
        return ["--compression", "none"]

    def env(self):
        env = dict(os.environ)
        for k in ("STRATA_STORE", "STRATA_DATA_DIR", "STRATA_FAULTS", "STRATA_KEY", "STRATA_KEY_FILE"):
            env.pop(k, None)
        return env

    def start(self, create=True, extra=(), keep_data=False):
        """Starts strata serve with a fresh data dir (the store is kept),
        or with the last one (`keep_data`: caches and journals kept)."""
        if not keep_data or self.data_n == 0:
            self.data_n += 1
        data = self.data_dir()
        if os.path.exists(self.sock):
            os.unlink(self.sock)
        self.starts = getattr(self, "starts", 0) + 1
        self.out = os.path.join(self.dir, "serve-%d.out" % self.starts)
        argv = [self.ctx.strata, "--store", self.store(), "--data-dir", data, "serve",
                "--listen", "unix:" + self.sock]
        argv += ["--create", "%s=%d" % (self.volume, self.size)] if create else ["--volume", self.volume]
        argv += self.at_rest_args() + list(extra) + list(self.ctx.args.strata_args.split())
        with open(self.out, "wb") as outf:
            self.proc = spawn(argv, self.log, env=self.env(), stdout=outf)

        def ready():
            try:
                with open(self.out) as f:
                    return "ready" in f.read().split()
            except OSError:
                return False

        wait_for(ready, self.proc, self.name, self.log)

    def store_bytes(self):
        """Bytes of the volume's segment and checkpoint objects, and of the
        deleted segments' files the store keeps to overwrite (.strata-recycle:
        disk space too, though no object's)."""
        total = 0
        for d in (os.path.join(self.store(), "vol", "segments"),
                  os.path.join(self.store(), "vol", "checkpoints"),
                  os.path.join(self.store(), ".strata-recycle")):
            for name in os.listdir(d) if os.path.isdir(d) else []:
                try:
                    total += os.path.getsize(os.path.join(d, name))
                except FileNotFoundError:
                    pass  # deleted or taken while listed
        return total

    def stop(self):
        """Clean stop (SIGTERM): everything uploaded, lease released."""
        proc = self.proc
        code = stop_process(proc, timeout=300)
        self.proc = None
        if proc is not None and code != 0:
            raise BenchError("%s did not stop cleanly (exit %s): %s" % (self.name, code, tail(self.log)))
        return code


class StrataEmbedded(StrataServer):
    name = "strata-embedded"


class StrataEmbeddedLz4(StrataEmbedded):
    """strata-embedded with its volume compressed with lz4 (the default)."""
    name = "strata-embedded-lz4"
    compression = "lz4"
    encrypted = False

    def at_rest_args(self):
        args = ["--compression", self.compression]
        if self.encrypted:
            args += ["--key-file", bench_key(self.ctx)]
        return args


class StrataEmbeddedZstd(StrataEmbeddedLz4):
    name = "strata-embedded-zstd"
    compression = "zstd"


class StrataEmbeddedEnc(StrataEmbeddedLz4):
    """Encrypted (AES-256-GCM), not compressed."""
    name = "strata-embedded-enc"
    compression = "none"
    encrypted = True


class StrataEmbeddedEncLz4(StrataEmbeddedLz4):
    name = "strata-embedded-enc-lz4"
    encrypted = True


class StrataEmbeddedMetrics(StrataEmbedded):
    """strata-embedded serving /metrics on 127.0.0.1, scraped every second
    for as long as it runs (what a Prometheus server does, at a tighter
    interval than its usual 15 s)."""
    name = "strata-embedded-metrics"
    interval_s = 1.0

    def start(self, create=True, extra=(), keep_data=False):
        self.metrics_url = "http://127.0.0.1:%d/metrics" % free_port()
        port_arg = self.metrics_url[len("http://"):-len("/metrics")]
        extra = list(extra) + ["--metrics-listen", port_arg]
        super().start(create=create, extra=extra, keep_data=keep_data)
        self.scrapes = getattr(self, "scrapes", 0)
        self.scrape_errors = getattr(self, "scrape_errors", [])
        self.scrape_bytes = getattr(self, "scrape_bytes", 0)
        self.scraping = threading.Event()
        self.scraper = threading.Thread(target=self.scrape_loop, args=(self.scraping,), daemon=True)
        self.scraper.start()

    def scrape_loop(self, stop):
        headers = {"Accept": "application/openmetrics-text; version=1.0.0"}
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback, never a proxy
        while not stop.wait(self.interval_s):
            try:
                req = urllib.request.Request(self.metrics_url, headers=headers)
                with opener.open(req, timeout=10) as r:
                    body = r.read()
                if not body.endswith(b"# EOF\n"):
                    raise ValueError("response does not end with # EOF")
                self.scrapes += 1
                self.scrape_bytes = len(body)
            except (OSError, ValueError) as e:
                if not stop.is_set():
                    self.scrape_errors.append(str(e))

    def note(self):
        return "/metrics scraped every %gs: %d scrapes of %d KiB" % (
            self.interval_s, self.scrapes, self.scrape_bytes >> 10)

    def stop(self):
        if getattr(self, "scraper", None) is not None:
            self.scraping.set()
            self.scraper.join(15)
            self.scraper = None
        code = super().stop()
        if self.scrape_errors:
            raise BenchError("%s: %d scrapes failed, e.g. %s" % (
                self.name, len(self.scrape_errors), self.scrape_errors[0]))
        return code


def bench_key(ctx):
    """A key file made once per run with `strata key generate`."""
    path = os.path.join(ctx.scratch, "bench.key")
    if not os.path.exists(path):
        r = subprocess.run([ctx.strata, "key", "generate", path], capture_output=True, text=True)
        if r.returncode != 0:
            raise BenchError("strata key generate failed: %s" % r.stderr.strip())
    return path


class StrataS3(StrataServer):
    """strata serve on an S3 store the bench started (store_attr: the Ctx
    attribute holding it), at ~0 ms or, with latency_ms, through the run's
    latency proxy in front of that store."""
    store_attr = None
    latency_ms = 0

    def s3store(self):
        return getattr(self.ctx, self.store_attr)

    @property
    def bucket(self):
        return BUCKET

    def store(self):
        return "s3://%s/%s" % (self.bucket, self.prefix)

    def proxy(self):
        return self.ctx.latency_proxy(PROXY_LATENCY_MS, PROXY_JITTER_MS, self.s3store())

    def start(self, create=True, extra=(), keep_data=False):
        store = self.s3store()
        if store.proc is not None and store.proc.poll() is not None:
            raise BenchError("%s exited (%s): %s" % (store.name, store.proc.returncode, tail(store.log)))
        super().start(create=create, extra=extra, keep_data=keep_data)

    def env(self):
        env = self.s3store().env()
        for k in ("STRATA_STORE", "STRATA_DATA_DIR", "STRATA_FAULTS"):
            env.pop(k, None)
        if self.latency_ms:
            env["AWS_ENDPOINT_URL"] = self.proxy().endpoint
        return env

    def store_bytes(self):
        return sum(size for key, size in self.s3store().list(self.prefix + "/vol/", bucket=self.bucket)
                   if "/segments/" in key or "/checkpoints/" in key)

    def note(self):
        if self.latency_ms:
            return self.proxy().describe()
        return "S3 at ~0 ms (%s on 127.0.0.1)" % self.s3store().name

    def release(self):
        """Deletes the row's objects (its prefix of the run's bucket),
        --keep or not: a full run's MinIO rows otherwise keep every row's
        volume, 40 GB of a 1 GiB run, which filled the disk of the 2-core
        VM halfway through one (2026-11-29)."""
        if getattr(self, "_released", False) or self.prefix != self.own_prefix:
            return
        store = getattr(self.ctx, self.store_attr, None)
        if store is None or store.proc is None or store.proc.poll() is not None:
            return
        try:
            store.delete_prefix(self.prefix + "/", bucket=self.bucket)
        except BenchError as e:
            log("    note: objects under %s/%s/ not deleted: %s" % (self.bucket, self.prefix, e))
        self._released = True

    def cleanup(self):
        self.release()
        super().cleanup()


class StrataMinio(StrataS3):
    name = "strata-minio"
    needs_minio = True
    store_attr = "minio"


class StrataMinio20ms(StrataMinio):
    """strata-minio with its S3 endpoint a latency proxy (20 ms ± 10) in
    front of the same MinIO."""
    name = "strata-minio-20ms"
    latency_ms = PROXY_LATENCY_MS


class StrataSeaweedfs(StrataS3):
    """strata serve on the run's SeaweedFS cluster (Seaweedfs), in a bucket
    of its own made at its first start and deleted after the row
    (release)."""
    name = "strata-seaweedfs"
    needs_seaweedfs = True
    store_attr = "seaweedfs"
    # Without --servers, the per-store comparison only: warm randrw, and
    # the cold read next to SeaweedFS's own GETs (--quick: ~15 s to start
    # the cluster, then two short rows).
    default_workloads = ("randrw", "coldread")

    def __init__(self, ctx, size, tag):
        super().__init__(ctx, size, tag)
        self._bucket = None

    @property
    def bucket(self):
        if self._bucket is None:
            self._bucket = self.s3store().new_bucket(os.path.basename(self.dir))
        return self._bucket

    def release(self):
        """Deletes the row's bucket, --keep or not: SeaweedFS frees a
        deleted object's bytes only when it compacts its volume, a deleted
        bucket's at once, and keeps 1% of the disk free (more rows on a
        tight disk: 500s for PUTs, "No more free space left"). The store's
        data goes at the end of the run anyway."""
        if self._bucket is not None and self.ctx.seaweedfs is not None:
            try:
                self.s3store().delete_bucket(self._bucket)
            except BenchError as e:
                log("    note: bucket %s not deleted: %s" % (self._bucket, e))
            self._bucket = None


class StrataSeaweedfs20ms(StrataSeaweedfs):
    """strata-seaweedfs through a latency proxy (20 ms ± 10) in front of
    the same SeaweedFS gateway."""
    name = "strata-seaweedfs-20ms"
    latency_ms = PROXY_LATENCY_MS
    in_quick = False  # the proxy's path is strata-minio-20ms's


class LoopTarget:
    """fio on a loop device (libaio, O_DIRECT) instead of over NBD: a
    volume as the block device of a host without the kernel's nbd module
    (what the CSI node gives a pod). Needs root, /dev/fuse and a free loop
    device; a host without them gives a failed row that does not fail
    the run."""
    required = False
    default_workloads = ("randrw", "randread", "seqwrite", "seqread")
    device = None

    def fio_target(self):
        return {"ioengine": "libaio", "direct": "1", "filename": self.device}

    def check_host(self):
        if not os.path.exists("/dev/fuse"):
            raise BenchError("no /dev/fuse: no loop device on a FUSE file here")
        if not shutil.which("losetup"):
            raise BenchError("losetup not installed (apt-get install mount)")


class StrataEmbeddedLoop(LoopTarget, StrataEmbedded):
    """strata-embedded with `serve --loop-dir`: the volume as a file of
    strata's own FUSE mount on a loop device (as the CSI node attaches
    it), read and written by fio as /dev/loopN."""
    name = "strata-embedded-loop"

    def start(self, create=True, extra=(), keep_data=False):
        self.check_host()
        loop_dir = os.path.join(self.dir, "loop")
        super().start(create=create, extra=list(extra) + ["--loop-dir", loop_dir], keep_data=keep_data)
        with open(self.out) as f:
            lines = [ln.split() for ln in f.read().splitlines()]
        devices = [ln[2] for ln in lines if len(ln) == 3 and ln[0] == "loop" and ln[1] == self.volume]
        if not devices:
            raise BenchError("%s printed no `loop %s /dev/loopN` line: %s" % (self.name, self.volume, tail(self.log)))
        self.device = devices[0]

    def note(self):
        return "fio libaio O_DIRECT on /dev/loopN: strata's FUSE file (serve --loop-dir)"

    def stop(self):
        try:
            return super().stop()
        finally:
            # strata detaches at a clean stop; after a crash its mount is
            # dead: let go of it (the loop device is freed with it).
            mnt = os.path.join(self.dir, "loop", self.volume)
            if os.path.ismount(mnt):
                if self.device:
                    subprocess.run(["losetup", "-d", self.device], capture_output=True)
                subprocess.run(["umount", "-l", mnt], capture_output=True)


class StrataEmbeddedNbdfuse(LoopTarget, StrataEmbedded):
    """strata-embedded's NBD export through nbdfuse (libnbd's FUSE file)
    on a loop device: the other way to a device node without the kernel's
    NBD client. nbdfuse's own CPU is not in the row's CPU s."""
    name = "strata-embedded-nbdfuse"
    fuse = None

    def start(self, create=True, extra=(), keep_data=False):
        self.check_host()
        if not shutil.which("nbdfuse"):
            raise BenchError("nbdfuse not installed (apt-get install nbdfuse)")
        super().start(create=create, extra=extra, keep_data=keep_data)
        self.mount = os.path.join(self.dir, "nbdfuse")
        os.makedirs(self.mount, exist_ok=True)
        disk = os.path.join(self.mount, "disk")
        self.fuse = spawn(["nbdfuse", disk, "nbd+unix:///%s?socket=%s" % (self.volume, self.sock)],
                          os.path.join(self.dir, "nbdfuse.log"))
        wait_for(lambda: os.path.ismount(self.mount) and os.path.exists(disk), self.fuse, "nbdfuse",
                 os.path.join(self.dir, "nbdfuse.log"))
        r = subprocess.run(["losetup", "--find", "--show", "--direct-io=on", disk], capture_output=True, text=True)
        if r.returncode != 0 or not r.stdout.strip().startswith("/dev/loop"):
            raise BenchError("losetup on nbdfuse's file failed: %s" % (r.stderr.strip() or r.stdout.strip()))
        self.device = r.stdout.strip()

    def note(self):
        return "fio libaio O_DIRECT on /dev/loopN: nbdfuse over the NBD export"

    def stop(self):
        if self.device:
            subprocess.run(["losetup", "-d", self.device], capture_output=True)
            self.device = None
        if self.fuse is not None:
            for _ in range(50):
                if subprocess.run(["fusermount3", "-u", self.mount], capture_output=True).returncode == 0:
                    break
                time.sleep(0.1)
            stop_process(self.fuse)
            self.fuse = None
        return super().stop()


class NbdkitMemory(Server):
    name = "nbdkit-memory"

    def start(self):
        self.start_and_wait_socket(["nbdkit", "-f", "-U", self.sock, "memory", "size=%d" % self.size])


class FileServer(Server):
    def make_file(self):
        self.file = os.path.join(self.dir, "disk.img")
        with open(self.file, "wb") as f:
            f.truncate(self.size)


class NbdkitFile(FileServer):
    name = "nbdkit-file"

    def start(self):
        self.make_file()
        self.start_and_wait_socket(["nbdkit", "-f", "-U", self.sock, "file", "file=" + self.file])


class DiskFsync(FileServer):
    """No server: fio itself writes a file in the scratch dir (buffered
    psync, the disk strata's data dir is on) with a sync every 16 writes,
    16 MiB of the 1 MiB seqwrite: what the embedded store does with each
    segment it stores. The disk's own limit under strata's sync pattern,
    the yardstick of sustained writes (a workload that FLUSHes sets its
    own `fsync` and overrides it: seqwrite-flush's every 64 writes). Its
    CPU is not sampled (no process of its own)."""
    name = "disk-fsync"
    default_workloads = ("seqwrite", "seqwrite-flush")
    in_quick = False
    SYNC_EVERY_WRITES = 16

    @property
    def pid(self):
        return -1

    def start(self):
        self.make_file()

    def fio_target(self):
        return {"ioengine": "psync", "filename": self.file, "fsync": str(self.SYNC_EVERY_WRITES)}

    def note(self):
        return "fio on a file of the data dir's disk, buffered, a sync every %d writes" % self.SYNC_EVERY_WRITES

    def stop(self):
        return 0


class QemuNbd(FileServer):
    cache, aio = "writeback", "threads"

    def start(self):
        self.make_file()
        self.start_and_wait_socket(["qemu-nbd", "-f", "raw", "--socket=" + self.sock, "--cache=" + self.cache,
                                    "--aio=" + self.aio, "--shared=8", "--persistent", self.file])


class QemuNbdWriteback(QemuNbd):
    name = "qemu-nbd-wb"


class QemuNbdNone(QemuNbd):
    name = "qemu-nbd-none"
    cache, aio = "none", "native"


class StrataEmbeddedTcp(StrataServer):
    """strata-embedded with fio over TCP: the plain side of the TLS rows."""
    name = "strata-embedded-tcp"

    def start(self, create=True, extra=(), keep_data=False):
        self.port = free_port()
        extra = list(extra) + ["--listen", "tcp:127.0.0.1:%d" % self.port] + self.tls_args()
        super().start(create=create, extra=extra, keep_data=keep_data)

    def tls_args(self):
        return []

    def fio_target(self):
        return {"ioengine": "nbd", "uri": "nbd://127.0.0.1:%d/vol" % self.port}


class StrataEmbeddedTls(StrataEmbeddedTcp):
    """strata-embedded over TLS (STARTTLS, required), fio through libnbd."""
    name = "strata-embedded-tls"

    def tls_args(self):
        self.pki = test_pki(self.ctx.scratch)
        return ["--tls", "require", "--tls-cert", self.pki["cert"], "--tls-key", self.pki["key"]]

    def fio_target(self):
        return {"ioengine": "nbd", "uri": "nbds://127.0.0.1:%d/vol" % self.port, "_home": self.pki["home"]}


def test_pki(scratch):
    """A CA and a server certificate for 127.0.0.1 (P-256), made once per
    run; `home` holds .pki/libnbd/ca-cert.pem, where libnbd looks."""
    d = os.path.join(scratch, "pki")
    out = {"cert": os.path.join(d, "server.crt"), "key": os.path.join(d, "server.key"),
           "home": os.path.join(d, "home"), "dir": os.path.join(d, "home", ".pki", "libnbd")}
    if os.path.exists(out["cert"]):
        return out
    os.makedirs(out["dir"], exist_ok=True)
    cnf = os.path.join(d, "openssl.cnf")
    with open(cnf, "w") as f:
        f.write("[req]\ndistinguished_name = dn\nprompt = no\n[dn]\nCN = bench CA\n"
                "[ca]\nbasicConstraints = critical, CA:TRUE\nkeyUsage = critical, keyCertSign\n"
                "[server]\nbasicConstraints = critical, CA:FALSE\nkeyUsage = critical, digitalSignature\n"
                "extendedKeyUsage = serverAuth\nsubjectAltName = IP:127.0.0.1, DNS:localhost\n")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-config", cnf]
    ca, cakey, csr = (os.path.join(d, n) for n in ("ca.crt", "ca.key", "server.csr"))
    for argv in (["openssl", "req", "-x509", "-extensions", "ca", "-days", "3"] + ec + ["-keyout", cakey, "-out", ca],
                 ["openssl", "req", "-new", "-subj", "/CN=127.0.0.1"] + ec + ["-keyout", out["key"], "-out", csr],
                 ["openssl", "x509", "-req", "-days", "3", "-set_serial", "2", "-extensions", "server", "-extfile", cnf,
                  "-in", csr, "-CA", ca, "-CAkey", cakey, "-out", out["cert"]]):
        r = subprocess.run(argv, capture_output=True, text=True)
        if r.returncode != 0:
            raise BenchError("%s failed: %s" % (" ".join(argv[:3]), r.stderr.strip()))
    shutil.copy(ca, os.path.join(out["dir"], "ca-cert.pem"))
    return out


class S3backer(Server):
    """s3backer (FUSE: one file whose blocks are S3 objects) on the same MinIO.

    fio reads and writes MOUNT/file with libaio + O_DIRECT (psync when the
    mount refuses O_DIRECT). Optional: its failure does not fail the run."""

    name = "s3backer-minio"
    required = False
    needs_minio = True
    block_size = "1M"

    def start(self):
        if not shutil.which("s3backer"):
            raise BenchError("s3backer not installed (apt-get install s3backer)")
        if not os.path.exists("/dev/fuse"):
            raise BenchError("no /dev/fuse")
        self.mount = os.path.join(self.dir, "mnt")
        os.makedirs(self.mount, exist_ok=True)
        prefix = "s3backer-%s-%d-%s/" % (time.strftime("%Y%m%d-%H%M%S"), os.getpid(), os.path.basename(self.dir))
        argv = ["s3backer", "-f", "--baseURL=%s/" % self.ctx.minio.endpoint, "--accessId=" + S3_KEY,
                "--accessKey=" + S3_SECRET, "--authVersion=aws4", "--size=%d" % self.size,
                "--blockSize=" + self.block_size, "--prefix=" + prefix, "--noAutoDetect",
                "--blockCacheSize=1000", "--blockCacheThreads=8", "--blockCacheWriteDelay=250",
                "--timeout=30", "-o", "direct_io", BUCKET, self.mount]
        self.file = os.path.join(self.mount, "file")
        self.proc = spawn(argv, self.log)
        wait_for(lambda: os.path.ismount(self.mount) and os.path.exists(self.file), self.proc, self.name,
                 self.log)
        try:
            fd = os.open(self.file, os.O_RDONLY | os.O_DIRECT)
            os.close(fd)
            self.direct = True
        except OSError:
            self.direct = False

    def note(self):
        return "FUSE direct_io, %s, %s blocks, 1000-block cache" % (
            "libaio O_DIRECT" if self.direct else "psync (O_DIRECT refused)", self.block_size)

    def fio_target(self):
        if self.direct:
            return {"ioengine": "libaio", "direct": "1", "filename": self.file}
        return {"ioengine": "psync", "filename": self.file}

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            subprocess.run(["fusermount", "-u", self.mount], capture_output=True)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                pass
        return super().stop()


SERVERS = [StrataEmbedded, StrataEmbeddedMetrics, StrataMinio, StrataMinio20ms, StrataSeaweedfs, StrataSeaweedfs20ms,
           StrataEmbeddedLz4, StrataEmbeddedZstd, StrataEmbeddedEnc,
           StrataEmbeddedEncLz4, StrataEmbeddedTcp, StrataEmbeddedTls, StrataEmbeddedLoop, StrataEmbeddedNbdfuse,
           NbdkitMemory, NbdkitFile, DiskFsync, QemuNbdWriteback, QemuNbdNone, S3backer]


# The guest disk's virtio queues (guestio's servers).
GUESTIO_QUEUES = 2


class QsdServer(FileServer):
    """qemu-storage-daemon on a preallocated raw file in the scratch dir,
    filled from the host first (1 MiB writes of fio's random data), through
    the host's page cache (cache.direct=off, aio=threads)."""

    def start(self):
        self.make_file()
        with open(self.file, "r+b") as f:
            os.posix_fallocate(f.fileno(), 0, self.size)
        timeout = 600 + self.size // MiB
        run_fio("prefill", {"ioengine": "psync", "filename": self.file}, prefill_opts(self.size, timeout),
                os.path.join(self.dir, "prefill.json"), timeout)
        blockdev = "driver=file,node-name=file0,filename=%s,cache.direct=off,aio=threads" % self.file
        self.start_and_wait_socket(["qemu-storage-daemon", "--blockdev", blockdev] + self.export_args())

    def prefill(self):
        pass  # done before the daemon starts


class QsdVhost(QsdServer):
    name = "qsd-vhost"

    def export_args(self):
        return ["--export", "type=vhost-user-blk,id=exp0,node-name=file0,addr.type=unix,addr.path=%s,"
                            "writable=on,num-queues=%d" % (self.sock, GUESTIO_QUEUES)]

    def guest_disk_args(self):
        return vhost_disk_args(self.sock)


class QsdNbd(QsdServer):
    name = "qsd-nbd"
    export = "disk"

    def export_args(self):
        return ["--nbd-server", "addr.type=unix,addr.path=%s" % self.sock,
                "--export", "type=nbd,id=exp0,node-name=file0,name=%s,writable=on" % self.export]

    def guest_disk_args(self):
        return nbd_disk_args(self.sock, self.export)


def nbd_disk_args(sock, export):
    """The guest's disk over QEMU's NBD client (as README's "Attaching to
    QEMU": its own iothread, cache.direct=on, one queue per vCPU)."""
    return ["-object", "iothread,id=ioth0",
            "-blockdev", "driver=nbd,node-name=disk0,server.type=unix,server.path=%s,export=%s,cache.direct=on"
            % (sock, export),
            "-device", "virtio-blk-pci,drive=disk0,iothread=ioth0,num-queues=%d" % GUESTIO_QUEUES]


def vhost_disk_args(sock):
    """The guest's disk as a vhost-user-blk device on the backend's socket
    (the guest's memory is a shared memfd: see GuestFio.argv)."""
    return ["-chardev", "socket,id=c0,path=%s,reconnect=1" % sock,
            "-device", "vhost-user-blk-pci,chardev=c0,num-queues=%d" % GUESTIO_QUEUES]


class StrataGuestNbd(StrataServer):
    """strata serve on its embedded store, a fresh plain volume (as
    strata-embedded), the guest's disk over QEMU's NBD client."""
    name = "strata-nbd"

    def prefill(self):
        timeout = 600 + self.size // MiB
        run_fio("prefill", self.fio_target(), prefill_opts(self.size, timeout),
                os.path.join(self.dir, "prefill.json"), timeout)

    def guest_disk_args(self):
        return nbd_disk_args(self.sock, self.volume)


class StrataGuestVhost(StrataGuestNbd):
    """strata serve --vhost-user-dir DIR (DIR/<volume>.sock), prefilled over
    its NBD socket before the guest attaches. A binary whose `serve --help`
    has no --vhost-user-dir gives a failed row that does not fail the run."""
    name = "strata-vhost"

    def start(self, create=True, extra=(), keep_data=False):
        self.vhost_dir = os.path.join(self.dir, "vhost")
        os.makedirs(self.vhost_dir, exist_ok=True)
        self.vhost_sock = os.path.join(self.vhost_dir, "%s.sock" % self.volume)
        try:
            super().start(create=create, extra=list(extra) + ["--vhost-user-dir", self.vhost_dir],
                          keep_data=keep_data)
            # The socket's existence, not a probe connection: a vhost-user
            # backend may serve one front-end at a time.
            wait_for(lambda: is_socket(self.vhost_sock), self.proc, self.name + "'s vhost-user socket " +
                     self.vhost_sock, self.log)
        except BenchError as e:
            if not self.supported():
                raise BenchError("%s (this strata binary's `serve --help` has no --vhost-user-dir)" % e,
                                 "soft") from e
            raise

    def supported(self):
        r = subprocess.run([self.ctx.strata, "serve", "--help"], capture_output=True, text=True)
        return "--vhost-user-dir" in r.stdout + r.stderr

    def guest_disk_args(self):
        return vhost_disk_args(self.vhost_sock)


GUEST_SERVERS = [QsdVhost, QsdNbd, StrataGuestNbd, StrataGuestVhost]
