#!/usr/bin/env python3
"""Write load with exact acknowledgement tracking, for strata's crash tests.

Writes 4 KiB blocks at random indexes of a region of an NBD export through
libnbd's asynchronous API, many writes in flight, never two in flight to the
same block (so the order of writes to one block is well defined). Every block
is stamped with (block index, generation); generations increase globally.

The log file (append only, one record per line) is the ground truth:
  I <idx> <gen>   written (to the OS) before the write is submitted
  A <idx> <gen> <t_ns>  written only after libnbd reported the write
                  successful; t_ns: time.monotonic_ns() when the writer saw it
                  (one clock for every process of the machine)
  X <idx> <gen> <t_ns>  the write failed (modes race, race-fua)
  F               written after a FLUSH, issued when no write was in flight,
                  was acknowledged (mode "flush" only)
Records are written with os.write after each completion batch, so they reach
the kernel before the next poll; a killed writer loses no logged record.

Usage: nbd_writer.py URI LOG BASE_OFFSET NBLOCKS MODE SEED [MAX_SECONDS [GEN_BASE]]
  MODE crash: write until the connection fails (the server is killed).
  MODE flush: write PHASE1 = 4 * NBLOCKS writes, wait for all of them, FLUSH,
              log F, then keep writing until the connection fails.
  MODE race: write until MAX_SECONDS or a write fails; then issue nothing
              more and wait for every write in flight (each logged A or X)
              until the connection is gone or 30 s passed. Exit 3 after a
              failed write, 0 otherwise. For fencing tests: a server that
              lost its volume must fail, never acknowledge, what it holds.
  MODE race-fua: the same, every write with FUA.
  In the race modes block indexes (logged and stamped) count from the
  export's start, not from BASE_OFFSET (two writers share one region check).
  GEN_BASE: generations start above it (later runs on the same volume pass a
  higher base so generations stay unique and increasing across runs).
Exit status: 3 when the connection failed (expected), 0 at MAX_SECONDS.
"""

import os
import random
import struct
import sys
import time

import nbd

BS = 4096
MAGIC = 0x5354524154414331  # "STRATAC1"
MIX = 0x9E3779B97F4A7C15
QD = 64


def stamp(idx, gen):
    rec = struct.pack("<QQQQ", MAGIC, idx, gen, MAGIC ^ idx ^ gen ^ MIX)
    return rec * (BS // len(rec))


def main():
    uri, log, base, nblocks, mode, seed = sys.argv[1:7]
    max_seconds = float(sys.argv[7]) if len(sys.argv) > 7 else 120.0
    gen_base = int(sys.argv[8]) if len(sys.argv) > 8 else 0
    base, nblocks, seed = int(base), int(nblocks), int(seed)
    assert mode in ("crash", "flush", "race", "race-fua")
    rnd = random.Random(seed)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)

    def out(lines):
        if lines:
            os.write(fd, "".join(lines).encode())

    h = nbd.NBD()
    h.connect_uri(uri)
    out(["S connected\n"])

    gen = gen_base
    issued = 0
    inflight = {}  # cookie -> (idx, gen, buf)
    busy = set()
    phase1 = 4 * nblocks if mode == "flush" else None
    flushed = mode != "flush"
    deadline = time.monotonic() + max_seconds
    done = []

    def reap(lines, swallow):
        for cookie in list(inflight):
            try:
                completed = h.aio_command_completed(cookie)
            except nbd.Error:
                if not swallow:
                    raise
                continue
            if completed:
                idx, g, _ = inflight.pop(cookie)
                busy.discard(idx)
                lines.append("A %d %d %d\n" % (idx, g, time.monotonic_ns()))

    if mode.startswith("race"):
        return race(h, out, rnd, base, nblocks, gen, deadline, mode == "race-fua")

    try:
        while time.monotonic() < deadline:
            batch = []
            while len(inflight) + len(batch) < QD and (flushed or issued < phase1):
                idx = rnd.randrange(nblocks)
                if idx in busy:
                    continue
                gen += 1
                issued += 1
                busy.add(idx)
                batch.append((idx, gen))
            out(["I %d %d\n" % b for b in batch])
            for idx, g in batch:
                buf = stamp(idx, g)
                cookie = h.aio_pwrite(buf, base + idx * BS)
                inflight[cookie] = (idx, g, buf)
            if not inflight:
                # Phase 1 complete: every write acknowledged. FLUSH.
                h.flush()
                out(["F\n"])
                flushed = True
                continue
            h.poll(-1)
            done = []
            reap(done, False)
            out(done)
            done = []
    except nbd.Error as e:
        # The server went away. Log every write whose successful reply was
        # received (including replies not yet retired when the error hit).
        reap(done, True)
        out(done)
        out(["E %s\n" % str(e).replace("\n", " ")])
        sys.exit(3)
    return 0


def race(h, out, rnd, base, nblocks, gen, deadline, fua):
    """Modes race and race-fua (see the module doc)."""
    flags = nbd.CMD_FLAG_FUA if fua else 0
    assert base % BS == 0
    first = base // BS
    inflight = {}  # cookie -> (idx, gen)
    busy = set()
    failed = False

    def reap():
        lines = []
        for cookie in list(inflight):
            try:
                completed = h.aio_command_completed(cookie)
                kind = "A"
            except nbd.Error:
                completed, kind = True, "X"
            if completed:
                idx, g = inflight.pop(cookie)
                busy.discard(idx)
                lines.append("%s %d %d %d\n" % (kind, idx, g, time.monotonic_ns()))
        out(lines)
        return any(line.startswith("X") for line in lines)

    def connection_gone():
        return h.aio_is_dead() or h.aio_is_closed()

    while not failed and time.monotonic() < deadline:
        batch = []
        while len(inflight) + len(batch) < QD:
            idx = first + rnd.randrange(nblocks)
            if idx in busy:
                continue
            gen += 1
            busy.add(idx)
            batch.append((idx, gen))
        out(["I %d %d\n" % b for b in batch])
        try:
            for idx, g in batch:
                cookie = h.aio_pwrite(stamp(idx, g), idx * BS, flags=flags)
                inflight[cookie] = (idx, g)
            h.poll(1000)
        except nbd.Error as e:
            out(["E %s\n" % str(e).replace("\n", " ")])
            failed = True
        failed = reap() or failed
    # Drain: every write in flight ends acknowledged or failed.
    drain_until = time.monotonic() + 30.0
    while inflight and time.monotonic() < drain_until and not connection_gone():
        try:
            h.poll(1000)
        except nbd.Error:
            break
        failed = reap() or failed
    reap()
    if inflight:
        out(["E %d writes still in flight when the writer gave up\n" % len(inflight)])
    sys.exit(3 if failed else 0)


if __name__ == "__main__":
    main()
