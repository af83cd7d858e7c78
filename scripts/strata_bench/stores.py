"""stores: the S3 stores the bench starts on 127.0.0.1 (Minio, Seaweedfs:
start, buckets, listings, GETs, the environment strata's S3 client gets)
and strata-latency-proxy in front of them (LatencyProxy, PROXY_LATENCY_MS:
the 20 ms rows)."""

import concurrent.futures
import os
import re
import signal
import subprocess
import time
import urllib.parse
import xml.etree.ElementTree as ET

from .sampling import Sampler, TreeSampler
from .util import BenchError, REPO, free_port, log, spawn, stop_process, wait_for


# The credentials of the MinIO the bench starts, and its run-wide bucket.
S3_KEY, S3_SECRET, S3_REGION, BUCKET = "strata-bench", "strata-bench-secret", "us-east-1", "strata-bench"

# The latency strata-minio-20ms's proxy adds (ms): delay, ± jitter.
PROXY_LATENCY_MS, PROXY_JITTER_MS = 20, 10


class S3Store:
    """An S3 store the bench started on 127.0.0.1 (MinIO, SeaweedFS): the
    requests the harness makes itself (curl --aws-sigv4: buckets, listings,
    GETs), the environment strata's S3 client gets, and its processes (CPU
    and RSS of the GET reference). Subclasses start it (start()) and set
    `port`."""

    name = "?"  # in logs and notes
    tag = "?"  # file names and rows: TAG.log, the cold read's TAG-get row
    key, secret, region = S3_KEY, S3_SECRET, S3_REGION

    def __init__(self, scratch, cpus=None):
        self.dir = os.path.join(scratch, self.tag)
        self.log = os.path.join(scratch, self.tag + ".log")
        self.proc = None
        self.port = None
        self.cpus = cpus  # --pin-store: the store's own CPUs
        self.buckets = 0

    @property
    def endpoint(self):
        return "http://127.0.0.1:%d" % self.port

    def pinned(self, argv):
        """argv under taskset on the store's CPUs (--pin-store); taskset
        execs it, so the pid stays the store's (CPU sampling)."""
        if self.cpus:
            return ["taskset", "-c", ",".join(str(c) for c in sorted(self.cpus))] + argv
        return argv

    def make_bucket(self, bucket):
        self.s3("PUT", bucket, check=False)
        if self.s3("GET", bucket + "?max-keys=1", check=False).returncode != 0:
            raise BenchError("cannot create bucket %s on %s" % (bucket, self.name))

    def new_bucket(self, what):
        """A bucket of its own for `what` (made now), named after it."""
        self.buckets += 1
        name = "%s-%d-%s" % (BUCKET, self.buckets, re.sub(r"[^a-z0-9-]+", "-", what.lower()))
        name = name[:63].rstrip("-")
        self.make_bucket(name)
        return name

    def delete_bucket(self, bucket, parallel=8):
        """Deletes every object of `bucket`, then the bucket."""
        objs = self.list("", bucket=bucket)
        with concurrent.futures.ThreadPoolExecutor(parallel) as ex:
            list(ex.map(lambda kv: self.s3("DELETE", "%s/%s" % (bucket, urllib.parse.quote(kv[0]))), objs))
        self.s3("DELETE", bucket)
        return len(objs)

    def delete_prefix(self, prefix, bucket=BUCKET, parallel=8):
        """Deletes every object under `prefix` of `bucket`: how many."""
        objs = self.list(prefix, bucket=bucket)
        with concurrent.futures.ThreadPoolExecutor(parallel) as ex:
            list(ex.map(lambda kv: self.s3("DELETE", "%s/%s" % (bucket, urllib.parse.quote(kv[0]))), objs))
        return len(objs)

    def http_status(self, path):
        r = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", self.endpoint + path],
                           capture_output=True, text=True)
        return int(r.stdout or 0) if r.stdout.isdigit() else 0

    def s3(self, method, path, out="-", check=True):
        argv = ["curl", "-sS", "--fail-with-body", "--max-time", "600", "-X", method,
                "--user", "%s:%s" % (self.key, self.secret), "--aws-sigv4", "aws:amz:%s:s3" % self.region]
        if method == "PUT":
            # curl --aws-sigv4 sends no x-amz-content-sha256: SeaweedFS
            # (and others) refuse a PUT with a body without one
            # (SignatureDoesNotMatch).
            argv += ["-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD"]
        argv += ["-o", out, "%s/%s" % (self.endpoint, path)]
        r = subprocess.run(argv, capture_output=True)
        if check and r.returncode != 0:
            raise BenchError("S3 %s %s: %s" % (method, path, (r.stdout + r.stderr).decode(errors="replace")[-300:]))
        return r

    def list(self, prefix, bucket=BUCKET):
        """(key, size) of every object under prefix. The prefix is
        URL-encoded, '/' too: curl signs the query as sent, and stores
        that canonicalise %2F refuse the signature of a bare '/'."""
        objs, token = [], None
        while True:
            q = "list-type=2&prefix=" + urllib.parse.quote(prefix, safe="")
            if token:
                q += "&continuation-token=" + urllib.parse.quote(token, safe="")
            root = ET.fromstring(self.s3("GET", "%s?%s" % (bucket, q)).stdout)
            ns = root.tag[: root.tag.index("}") + 1] if root.tag.startswith("{") else ""
            for c in root.iter(ns + "Contents"):
                objs.append((c.find(ns + "Key").text, int(c.find(ns + "Size").text)))
            if root.findtext(ns + "IsTruncated") != "true":
                return objs
            token = root.findtext(ns + "NextContinuationToken")

    def env(self):
        return dict(os.environ, AWS_ACCESS_KEY_ID=self.key, AWS_SECRET_ACCESS_KEY=self.secret,
                    AWS_ENDPOINT_URL=self.endpoint, AWS_REGION=self.region, AWS_ALLOW_HTTP="true")

    def sampler(self):
        """A Sampler of the store's CPU and RSS."""
        return Sampler(self.proc.pid)

    def stop(self):
        stop_process(self.proc)


def install(script, what):
    """The binary scripts/install-* prints last (a fast no-op when built)."""
    out = subprocess.run([os.path.join(REPO, "scripts", script)], capture_output=True, text=True)
    binary = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
    if out.returncode != 0 or not os.access(binary, os.X_OK):
        raise BenchError("scripts/%s gave no %s binary: %s" % (script, what, out.stderr[-500:]))
    return binary


class Minio(S3Store):
    """A private MinIO on 127.0.0.1 with bucket strata-bench."""

    name, tag = "MinIO", "minio"

    def start(self):
        binary = install("install-minio", "MinIO")
        os.makedirs(self.dir, exist_ok=True)
        self.port = free_port()
        env = dict(os.environ, MINIO_ROOT_USER=S3_KEY, MINIO_ROOT_PASSWORD=S3_SECRET, MINIO_CI_CD="1")
        argv = self.pinned([binary, "server", self.dir, "--address", "127.0.0.1:%d" % self.port,
                            "--console-address", "127.0.0.1:%d" % free_port()])
        self.proc = spawn(argv, self.log, env=env)
        wait_for(lambda: self.http_status("/minio/health/cluster") == 200, self.proc, "MinIO", self.log)
        self.make_bucket(BUCKET)


# The test kit's SeaweedFS gateway knows only its own credentials
# (crates/strata-testkit: ACCESS_KEY, SECRET_KEY).
SEAWEEDFS_KEY, SEAWEEDFS_SECRET = "strata-test", "strata-test-secret"


class SeaweedfsStart:
    """ctx.seaweedfs's start, waited for at once (begin()) or in the
    background, then by ready() before the first row that needs it. A
    failed start is a failure of the run and leaves ctx.seaweedfs None."""

    def __init__(self, ctx, failures):
        self.ctx, self.failures = ctx, failures
        self.future = None
        self.t0 = None

    def begin(self, background):
        log("==> starting SeaweedFS (strata-test-store seaweedfs, ~15 s%s)"
            % (", in the background" if background else ""))
        self.ctx.seaweedfs = Seaweedfs(self.ctx.scratch, self.ctx.store_cpus)
        self.t0 = time.time()
        pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="seaweedfs-start")
        self.future = pool.submit(self.ctx.seaweedfs.start)
        pool.shutdown(wait=False)
        if not background:
            self.ready()

    def ready(self):
        """Waits for the start begun; whether SeaweedFS serves."""
        if self.future is not None:
            future, self.future = self.future, None
            try:
                future.result()
                log("    SeaweedFS's S3 gateway at %s after %.1f s"
                    % (self.ctx.seaweedfs.endpoint, time.time() - self.t0))
            except BenchError as e:
                self.failures.append("SeaweedFS: %s" % e)
                self.ctx.seaweedfs.stop()
                self.ctx.seaweedfs = None
        return self.ctx.seaweedfs is not None


class Seaweedfs(S3Store):
    """A private SeaweedFS cluster on 127.0.0.1, the test kit's:
    `strata-test-store seaweedfs` (crates/strata-testkit, built when
    missing) starts a master, three volume servers (replication 001: every
    chunk on two of them), a filer and the S3 gateway, prints `endpoint
    URL` once the gateway has stored an object (~15 s: a fresh filer holds
    its announcement to the master for 10 s), and stops them all and
    removes their data on SIGTERM. Its data and the processes' logs are in
    the scratch directory (TMPDIR), on the same disk as MinIO's.

    No run-wide bucket: each strata-seaweedfs row makes its own
    (new_bucket) and deletes it when it is done (StrataSeaweedfs.release).
    SeaweedFS reclaims a deleted object's bytes only when it compacts a
    volume; a deleted bucket (a collection) drops its volumes at once."""

    name, tag = "SeaweedFS", "seaweedfs"
    key, secret = SEAWEEDFS_KEY, SEAWEEDFS_SECRET

    def start(self):
        weed = install("install-seaweedfs", "SeaweedFS")
        os.makedirs(self.dir, exist_ok=True)
        self.out = os.path.join(os.path.dirname(self.dir), "seaweedfs.out")
        env = dict(os.environ, TMPDIR=self.dir, STRATA_SEAWEEDFS_BIN=weed)
        with open(self.out, "wb") as outf:
            self.proc = spawn(self.pinned([find_test_store(), "seaweedfs"]), self.log, env=env, stdout=outf)

        def ready():
            try:
                with open(self.out) as f:
                    m = re.search(r"^endpoint http://127\.0\.0\.1:(\d+)$", f.read(), re.M)
            except OSError:
                return False
            if m:
                self.port = int(m.group(1))
            return m is not None

        wait_for(ready, self.proc, "strata-test-store seaweedfs", self.log, timeout=240)

    def sampler(self):
        """strata-test-store's six weed processes, summed."""
        return TreeSampler(self.proc.pid)

    def stop(self):
        """SIGTERM to strata-test-store alone: it stops its processes in
        order (gateway first, master last) and removes their data."""
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            pass
        stop_process(self.proc, timeout=10, sig=signal.SIGKILL)


def find_test_store():
    """strata-test-store from target/release, built when missing."""
    target = os.environ.get("CARGO_TARGET_DIR") or os.path.join(REPO, "target")
    path = os.path.join(target, "release", "strata-test-store")
    if not os.access(path, os.X_OK):
        log("==> cargo build --release -p strata-testkit --bin strata-test-store")
        r = subprocess.run(["cargo", "build", "--release", "-p", "strata-testkit", "--bin", "strata-test-store"],
                           cwd=REPO)
        if r.returncode != 0 or not os.access(path, os.X_OK):
            raise BenchError("cannot build %s" % path)
    return path


class LatencyProxy:
    """strata-latency-proxy in front of an S3 store (MinIO, SeaweedFS's
    gateway): every request/response through it costs `latency_ms` ±
    `jitter_ms` more (see crates/strata-testkit/src/latency_proxy.rs). One
    per store and latency per run."""

    def __init__(self, ctx, store, latency_ms, jitter_ms, seed=1):
        self.ctx, self.store = ctx, store
        self.latency_ms, self.jitter_ms, self.seed = latency_ms, jitter_ms, seed
        # MinIO's keeps its name of before SeaweedFS (proxy-20ms.log).
        tag = "proxy-%dms" % latency_ms if store.tag == "minio" else "proxy-%s-%dms" % (store.tag, latency_ms)
        self.log = os.path.join(ctx.scratch, tag + ".log")
        self.out = os.path.join(ctx.scratch, tag + ".out")
        self.proc = None
        self.endpoint = None

    def argv(self):
        return [self.ctx.proxy_bin(), "--upstream", "127.0.0.1:%d" % self.store.port,
                "--latency-ms", str(self.latency_ms), "--jitter-ms", str(self.jitter_ms), "--seed", str(self.seed)]

    def start(self):
        with open(self.out, "wb") as outf:
            self.proc = spawn(self.argv(), self.log, stdout=outf)

        def bound():
            try:
                with open(self.out) as f:
                    m = re.search(r"^listening (127\.0\.0\.1:\d+)$", f.read(), re.M)
            except OSError:
                return False
            if m:
                self.endpoint = "http://" + m.group(1)
            return m is not None

        wait_for(bound, self.proc, "strata-latency-proxy", self.log, timeout=30)

    def describe(self):
        return "S3 (%s) through strata-latency-proxy, %d ms ± %d per request" % (
            self.store.name, self.latency_ms, self.jitter_ms)

    def stop(self):
        stop_process(self.proc)
        self.proc = None


def find_proxy(args):
    """strata-latency-proxy: --latency-proxy, or target/release's, built
    when missing or older than its crate's sources."""
    if args.latency_proxy:
        return args.latency_proxy
    target = os.environ.get("CARGO_TARGET_DIR") or os.path.join(REPO, "target")
    path = os.path.join(target, "release", "strata-latency-proxy")
    src = os.path.join(REPO, "crates", "strata-testkit")
    newest = max((os.path.getmtime(os.path.join(d, f)) for d, _, fs in os.walk(src) for f in fs), default=0)
    if not os.access(path, os.X_OK) or os.path.getmtime(path) < newest:
        log("==> cargo build --release -p strata-testkit --bin strata-latency-proxy")
        r = subprocess.run(["cargo", "build", "--release", "-p", "strata-testkit", "--bin", "strata-latency-proxy"],
                           cwd=REPO)
        if r.returncode != 0 or not os.access(path, os.X_OK):
            raise BenchError("cannot build %s" % path)
    return path
