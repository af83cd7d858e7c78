"""context: Ctx, the run's context every server and workload gets: the
arguments, the scratch directory, the strata binary, the stores and
latency proxies started, and what cli.main stops or undoes at exit (live
servers, mounts). Workloads keep what they make once per run on it too
(images: ctx.image, ctx.boot_image, ...)."""

import os

from .stores import LatencyProxy, find_proxy
from .util import BenchError


def split_cpus():
    """(store CPUs, the others): the first half of this process's CPUs."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise BenchError("--pin-store needs at least 2 CPUs (have %d)" % len(cpus))
    half = len(cpus) // 2
    return set(cpus[:half]), set(cpus[half:])


class Ctx:
    def __init__(self, args, scratch):
        self.args = args
        self.scratch = scratch
        self.store_cpus = None  # --pin-store
        self.strata = args.strata
        self.minio = None
        self.seaweedfs = None
        self.live = []  # servers to stop on exit
        self.mounts = []  # FsMounts to undo on exit
        self.proxies = {}  # (store tag, latency ms) -> LatencyProxy
        self._proxy_bin = None

    def proxy_bin(self):
        if self._proxy_bin is None:
            self._proxy_bin = find_proxy(self.args)
        return self._proxy_bin

    def latency_proxy(self, latency_ms, jitter_ms, store=None):
        """The run's proxy of this latency in front of `store` (MinIO when
        None), started on first use, stopped at exit."""
        store = store or self.minio
        p = self.proxies.get((store.tag, latency_ms))
        if p is None:
            p = LatencyProxy(self, store, latency_ms, jitter_ms)
            p.start()
            self.proxies[(store.tag, latency_ms)] = p
        return p
