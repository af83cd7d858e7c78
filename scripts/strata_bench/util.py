"""util: what every module uses: the repository's path, sizes (MiB,
GiB), BenchError (a failure that fails the run), the log, starting,
waiting for and stopping processes, commands run to completion, and fmt
(a figure or "-")."""

import os
import signal
import socket
import stat
import subprocess
import time


# The repository: scripts/strata_bench/util.py is three levels down.
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MiB = 1 << 20
GiB = 1 << 30


class BenchError(Exception):
    """A failure that makes the run fail (server under test, fio error)."""


_LOG_T0 = time.time()


def log(msg):
    """A progress line, led by the run's elapsed time for the steps
    ("==> ..."): where a run's minutes go is read off its log."""
    if msg.startswith("==>"):
        msg = "[%5.0f s] %s" % (time.time() - _LOG_T0, msg)
    print(msg, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(argv, logpath, env=None, stdout=None):
    """Starts argv in its own process group, stderr (and stdout) to logpath."""
    logf = open(logpath, "ab")
    return subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=stdout if stdout is not None else logf,
        stderr=logf,
        env=env,
        start_new_session=True,
    )


def stop_process(proc, timeout=30.0, sig=signal.SIGTERM):
    """Signals the process group; SIGKILL after timeout. Returns exit code."""
    if proc is None or proc.poll() is not None:
        return None if proc is None else proc.returncode
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        return None


def wait_for(pred, proc, what, logpath, timeout=60.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return
        if proc is not None and proc.poll() is not None:
            raise BenchError("%s exited (%s): %s" % (what, proc.returncode, tail(logpath)))
        time.sleep(0.05)
    raise BenchError("%s not ready after %.0f s: %s" % (what, timeout, tail(logpath)))


def tail(path, n=8):
    try:
        with open(path, "rb") as f:
            lines = f.read().decode(errors="replace").splitlines()
        return " | ".join(lines[-n:])
    except OSError:
        return ""


def is_socket(path):
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return False


def socket_accepts(path):
    if not os.path.exists(path):
        return False
    with socket.socket(socket.AF_UNIX) as s:
        try:
            s.connect(path)
            return True
        except OSError:
            return False


def run_cmd(argv, what=None, timeout=600, env=None):
    """Runs argv; its stdout, or BenchError with its stderr."""
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        raise BenchError("%s failed (exit %d): %s" % (what or " ".join(argv[:3]), r.returncode,
                                                      (r.stderr or r.stdout).strip()[-500:]))
    return r.stdout


def drop_caches():
    """sync, then drop the page cache, dentries and inodes (root only).
    False when not allowed."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def fmt(v, spec):
    return "-" if v is None else spec % v
