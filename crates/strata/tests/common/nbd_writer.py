#!/usr/bin/env python3
"""Write load with exact acknowledgement tracking, for strata's crash tests.

Writes 4 KiB blocks at random indexes of a region of an NBD export through
libnbd's asynchronous API, many writes in flight, never two in flight to the
same block (so the order of writes to one block is well defined). Every block
is stamped with (block index, generation); generations increase globally.

The log file (append only, one record per line) is the ground truth:
  I <idx> <gen>   written (to the OS) before the write is submitted
  A <idx> <gen>   written only after libnbd reported the write successful
  F               written after a FLUSH, issued when no write was in flight,
                  was acknowledged (mode "flush" only)
Records are written with os.write after each completion batch, so they reach
the kernel before the next poll; a killed writer loses no logged record.

Usage: nbd_writer.py URI LOG BASE_OFFSET NBLOCKS MODE SEED [MAX_SECONDS [GEN_BASE]]
  MODE crash: write until the connection fails (the server is killed).
  MODE flush: write PHASE1 = 4 * NBLOCKS writes, wait for all of them, FLUSH,
              log F, then keep writing until the connection fails.
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
    assert mode in ("crash", "flush")
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
                lines.append("A %d %d\n" % (idx, g))

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


if __name__ == "__main__":
    main()
