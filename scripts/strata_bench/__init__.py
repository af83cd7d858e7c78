"""strata_bench: the bench harness scripts/bench runs.

scripts/bench is the one entry point, and its docstring the manual (the
servers, the workloads, the outputs); this package is the code. Its
modules, each doc opening with what it owns; a module imports only from
those below it:

    cli.py         the command line (parse_args) and the run (main): which
                   servers and workloads run, in what order, the stores
                   started for them, the report files written at the end
    reports.py     rows into tables, bench.md, bench.png; the ratios; the
                   baseline comparison; each row's line in the log
    workloads/     every workload listed once (workloads/__init__.py's
                   CATALOG), and a module per workload that is not one fio
                   run per server (coldread, space, coldboot, migrate, ...)
    servers.py     the servers under test (SERVERS; guestio's own,
                   GUEST_SERVERS): strata in its variants, nbdkit,
                   qemu-nbd, s3backer, qemu-storage-daemon
    stats.py       what strata reports of itself: its stats file, `strata`
                   commands beside a server, a volume's hydration
    fio.py         the fio workloads (WORKLOADS), fio runs and their
                   summary, run_one: one fio workload on one fresh server
    profiles.py    perf record / perf report of a server
    context.py     Ctx, the run's context: its arguments, scratch
                   directory, stores, and what to stop at exit
    stores.py      the S3 stores the bench starts (MinIO, SeaweedFS), the
                   latency proxy in front of them
    sampling.py    a process's CPU and RSS over time, the host's CPU
    util.py        the repository's path, sizes, BenchError, the log,
                   processes and commands

Stdlib only (see scripts/bench's docstring for the optional matplotlib and
libnbd).
"""
