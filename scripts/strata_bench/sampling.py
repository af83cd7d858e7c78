"""sampling: a process's CPU ticks and RSS sampled over a run (Sampler;
TreeSampler for a process and its descendants), read from /proc, and the
host's busy CPU share."""

import os
import threading
import time


CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def proc_cpu_ticks(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime (fields 14, 15)


def proc_rss(pid):
    with open("/proc/%d/statm" % pid) as f:
        return int(f.read().split()[1]) * PAGE


class Sampler:
    """Samples a process's CPU ticks and RSS every `interval` seconds."""

    def __init__(self, pid, interval=0.1):
        self.pid, self.interval = pid, interval
        self.samples = []  # (time, cpu_ticks, rss)
        self.stop_ev = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def sample(self):
        try:
            self.samples.append((time.time(), proc_cpu_ticks(self.pid), proc_rss(self.pid)))
        except (OSError, IndexError, ValueError):
            pass

    def run(self):
        while not self.stop_ev.wait(self.interval):
            self.sample()

    def __enter__(self):
        self.sample()
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop_ev.set()
        self.thread.join()
        self.sample()

    def window(self, t0):
        """CPU seconds and peak RSS from time t0 (after warm-up) to the end."""
        s = [x for x in self.samples if x[0] >= t0] or self.samples[-1:]
        if not s:
            return None, None
        before = [x for x in self.samples if x[0] < t0]
        start = before[-1] if before else s[0]
        return (s[-1][1] - start[1]) / CLK_TCK, max(x[2] for x in s)


def host_cpu_ticks():
    """(busy, total) CPU ticks of the whole host so far (/proc/stat's cpu
    line; idle and iowait are not busy)."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)


def host_busy(before, after):
    """The host's busy fraction (0-1 of all its CPUs) between two
    host_cpu_ticks() readings."""
    total = after[1] - before[1]
    return (after[0] - before[0]) / total if total > 0 else None


def proc_tree(pid):
    """pid and all its descendants (/proc/PID/task/TID/children)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for tid in os.listdir("/proc/%d/task" % p):
                with open("/proc/%d/task/%s/children" % (p, tid)) as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


class TreeSampler(Sampler):
    """A Sampler of a process and its descendants, CPU ticks and RSS summed
    (a store of several processes: SeaweedFS's six under
    strata-test-store). The tree is read once, at the start."""

    def __enter__(self):
        self.pids = proc_tree(self.pid)
        return super().__enter__()

    def sample(self):
        ticks = rss = 0
        for p in self.pids:
            try:
                ticks += proc_cpu_ticks(p)
                rss += proc_rss(p)
            except (OSError, IndexError, ValueError):
                pass
        self.samples.append((time.time(), ticks, rss))
