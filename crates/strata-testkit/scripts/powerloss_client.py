#!/usr/bin/env python3
"""The client of strata's power-loss loop (strata_testkit::powerloss).

Talks to one volume over NBD through libnbd (Python binding), one request
at a time (QD1: the order of requests is the order strata received them, so
"a prefix of the acknowledged writes" is well defined), and keeps the
history the checks need. Every 4 KiB block a write puts down is stamped with
the write's number and the block's index (LSVD's crash test), so a read-back
names the write each block came from.

Driven by the orchestrator over stdin/stdout, one command per line, one
answer line each (stdout is line-flushed):

  work URI SEED KILL_AFTER SNAPS   requests chosen by SEED: writes (some
      FUA), trims, write-zeroes, FLUSHes, and with SNAPS=1 snapshots;
      after KILL_AFTER of them are answered it prints "kill" (the
      orchestrator then kills the server), and goes on until the
      connection fails. Answer: "worked sent=N acked=A durable=D".
  snap NAME               (answer line printed by `work`, not a command) the
      client stops between two requests and waits for "go" or "skip": the
      orchestrator takes snapshot NAME of the volume, which must equal the
      state after every request answered so far.
  verify URI              reads the volume back: every FLUSHed and FUA write
      is there, and the volume equals the state after some prefix of the
      requests sent. Answer: "ok prefix=P durable=D sent=N" (and the state
      becomes the new base) or "fail WHAT".
  verify-snap URI NAME    the snapshot export equals the state it was taken
      at. Answer "ok" or "fail WHAT".
  forget-snap NAME        the snapshot was deleted.
  quit

Durable point: every request answered before a FLUSH that was answered, and
every answered FUA write with all before it (strata's journal keeps order).
"""

import random
import struct
import sys

import nbd

BS = 4096
MAGIC = b"STRATAPL"
MIX = 0x9E3779B97F4A7C15
M64 = (1 << 64) - 1
CHUNK = 1 << 20

# Request mix (weights) and sizes, in blocks.
WEIGHTS = [("write", 55), ("fua", 6), ("trim", 8), ("zero", 5), ("flush", 14), ("snap", 1)]
SMALL_MAX, LARGE = 16, 64


def stamp(op, blk):
    rec = struct.pack("<8sQQQ", MAGIC, op, blk, (op * MIX ^ blk) & M64)
    return rec * (BS // len(rec))


ZERO = bytes(BS)


def decode(blk, data):
    """The write a block came from: 0 for zeros, None if neither."""
    if data == ZERO:
        return 0
    if len(data) != BS or data[:8] != MAGIC:
        return None
    op = struct.unpack_from("<Q", data, 8)[0]
    return op if data == stamp(op, blk) else None


class History:
    def __init__(self, nblocks):
        self.nblocks = nblocks
        self.base = [0] * nblocks  # the verified state
        self.next_op = 1  # write numbers are unique across cycles
        self.ops = []  # this cycle: (op, kind, first, count)
        self.acked = 0  # requests answered (a prefix: QD1)
        self.durable = 0
        self.snaps = {}  # name -> state (list)

    def state_after(self, n):
        s = list(self.base)
        for op in self.ops[:n]:
            apply(s, op)
        return s

    def rebase(self, prefix):
        self.base = self.state_after(prefix)
        self.ops, self.acked, self.durable = [], 0, 0


def apply(state, op):
    num, kind, first, count = op
    if kind in ("write", "fua"):
        for b in range(first, first + count):
            state[b] = num
    elif kind in ("trim", "zero"):
        for b in range(first, first + count):
            state[b] = 0


def out(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def choose(rnd, h):
    kind = rnd.choices([k for k, _ in WEIGHTS], [w for _, w in WEIGHTS])[0]
    count = LARGE if rnd.random() < 0.05 else rnd.randint(1, SMALL_MAX)
    count = min(count, h.nblocks)
    first = rnd.randrange(0, h.nblocks - count + 1)
    return kind, first, count


def work(h, uri, seed, kill_after, snaps):
    rnd = random.Random(seed)
    conn = nbd.NBD()
    conn.connect_uri(uri)
    answered = 0
    killed = False
    snap_no = 0
    try:
        while True:
            if answered >= kill_after and not killed:
                out("kill")
                killed = True
            kind, first, count = choose(rnd, h)
            if kind == "snap":
                if killed or not snaps:
                    continue
                snap_no += 1
                name = "s%d-%d" % (seed % 100000, snap_no)
                out("snap " + name)
                if sys.stdin.readline().strip() == "go":
                    h.snaps[name] = h.state_after(h.acked)
                continue
            if kind == "flush":
                conn.flush()
                h.durable = h.acked
                answered += 1
                continue
            op = (h.next_op, kind, first, count)
            h.next_op += 1
            h.ops.append(op)
            off, length = first * BS, count * BS
            if kind in ("write", "fua"):
                buf = b"".join(stamp(op[0], b) for b in range(first, first + count))
                flags = nbd.CMD_FLAG_FUA if kind == "fua" else 0
                conn.pwrite(buf, off, flags)
            elif kind == "trim":
                conn.trim(length, off)
            else:
                conn.zero(length, off)
            h.acked = len(h.ops)
            if kind == "fua":
                h.durable = h.acked
            answered += 1
    except nbd.Error:
        pass
    try:
        conn.shutdown()
    except nbd.Error:
        pass
    out("worked sent=%d acked=%d durable=%d" % (len(h.ops), h.acked, h.durable))


def read_all(uri, nblocks):
    conn = nbd.NBD()
    conn.connect_uri(uri)
    size = conn.get_size()
    if size < nblocks * BS:
        raise RuntimeError("export is %d bytes, expected at least %d" % (size, nblocks * BS))
    got = []
    for off in range(0, nblocks * BS, CHUNK):
        n = min(CHUNK, nblocks * BS - off)
        data = conn.pread(n, off)
        for i in range(0, n, BS):
            got.append(data[i:i + BS])
    conn.shutdown()
    return got


def observe(blocks):
    seen = []
    for b, data in enumerate(blocks):
        op = decode(b, data)
        if op is None:
            return None, "block %d holds neither zeros nor a whole stamp (torn or foreign): %r" % (
                b, data[:40])
        seen.append(op)
    return seen, None


def verify(h, uri):
    seen, err = observe(read_all(uri, h.nblocks))
    if err:
        return "fail " + err
    # The state after n requests, for n from 0 up: count blocks that differ.
    state = list(h.base)
    diff = sum(1 for a, b in zip(state, seen) if a != b)
    match = []
    for n in range(0, len(h.ops) + 1):
        if n > 0:
            num, kind, first, count = h.ops[n - 1]
            new = num if kind in ("write", "fua") else 0
            for b in range(first, first + count):
                before = state[b] != seen[b]
                state[b] = new
                diff += (state[b] != seen[b]) - before
        if diff == 0:
            match.append(n)
    good = [n for n in match if n >= h.durable]
    if not good:
        worst = explain(h, seen)
        if match:
            return "fail lost FLUSHed writes: the volume is the state after %d requests, but %d were durable (sent %d); %s" % (
                max(match), h.durable, len(h.ops), worst)
        return "fail the volume is no prefix of the requests sent (durable %d, sent %d): %s" % (
            h.durable, len(h.ops), worst)
    prefix = max(good)
    line = "ok prefix=%d durable=%d sent=%d" % (prefix, h.durable, len(h.ops))
    h.rebase(prefix)
    return line


def explain(h, seen):
    """The first blocks that differ from the durable state."""
    want = h.state_after(h.durable)
    bad = [(b, want[b], seen[b]) for b in range(h.nblocks) if want[b] != seen[b]]
    return "%d blocks differ from the durable state, first: %s" % (
        len(bad), ", ".join("block %d wants write %d has %d" % x for x in bad[:5]))


def verify_snap(h, uri, name):
    want = h.snaps.get(name)
    if want is None:
        return "fail no such snapshot in the history: " + name
    seen, err = observe(read_all(uri, h.nblocks))
    if err:
        return "fail snapshot %s: %s" % (name, err)
    bad = [b for b in range(h.nblocks) if want[b] != seen[b]]
    if bad:
        b = bad[0]
        return "fail snapshot %s: %d blocks differ, first block %d wants write %d has %d" % (
            name, len(bad), b, want[b], seen[b])
    return "ok"


def main():
    nblocks = int(sys.argv[1])
    h = History(nblocks)
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        cmd = words[0]
        try:
            if cmd == "work":
                work(h, words[1], int(words[2]), int(words[3]), words[4] == "1")
            elif cmd == "verify":
                out(verify(h, words[1]))
            elif cmd == "verify-snap":
                out(verify_snap(h, words[1], words[2]))
            elif cmd == "forget-snap":
                h.snaps.pop(words[1], None)
                out("ok")
            elif cmd == "quit":
                return
            else:
                out("fail unknown command " + cmd)
        except (nbd.Error, RuntimeError, OSError) as e:
            out("fail %s: %s" % (cmd, str(e).replace("\n", " ")))


if __name__ == "__main__":
    main()
