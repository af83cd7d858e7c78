"""workloads: every workload of the bench, listed once (CATALOG), and a
module per workload that is not one fio run per server.

The fio workloads (randrw, randread, seqwrite, ...) are fio.WORKLOADS, each
run by fio.run_one; the others, one module each:

    coldread       strata on S3 read after a restart with empty caches,
                   next to the store's own GETs of the same objects
    space          randrw with GC on and off: store bytes over live bytes
    coldclone      a cloned ext4 image read file by file on a new host
    coldrandread   random reads of a volume never read on this host
    coldboot       a QEMU guest boots a cloned root filesystem
    coldboot_big   a large clone whose boot reads little of it, then the
                   server left until the volume is local
    manyvolumes    a VM host: many volumes on one server
    idlecost       what idle volumes cost in store requests
    handover       a volume handed over between two hosts on request
    migrate        live migration of a running QEMU guest between two hosts
    powerloss      the power-loss soak (strata-powerloss)
    guestio        fio inside a QEMU guest, vhost-user-blk next to NBD

and what some of them share: fsimage (an ext4 image of /usr's files; an
NBD export's filesystem mounted as a VM's: coldclone, coldboot,
coldboot-big), qemu (the guest's kernel and busybox, QEMU among the live
processes: coldboot, migrate, guestio).

A workload's module holds its name (the rows' "workload"), its title (the
line under its heading in the reports), its table's columns, its runner
and what only it needs. cli.main picks the servers each runs on and calls
the runners; reports makes the tables. A new workload: its module here, its
entry in CATALOG, its block in cli.main, its name in --workloads' help and
its paragraph in scripts/bench's docstring."""

from collections import namedtuple

from ..fio import COLS, HEAD, WORKLOADS, run_one
from .coldboot import BOOT_COLS, BOOT_HEAD, COLDBOOT, COLDBOOT_TITLE, run_coldboot
from .coldboot_big import BIGBOOT_COLS, BIGBOOT_HEAD, COLDBOOT_BIG, COLDBOOT_BIG_TITLE, run_coldboot_big
from .coldclone import CLONE_COLS, CLONE_HEAD, COLDCLONE, COLDCLONE_TITLE, run_coldclone
from .coldrandread import COLDRAND, COLDRAND_COLS, COLDRAND_HEAD, COLDRAND_TITLE, run_coldrandread
from .coldread import COLD, COLD_TITLE, run_coldread
from .guestio import GUESTIO, GUESTIO_COLS, GUESTIO_HEAD, GUESTIO_TITLE, run_guestio
from .handover import HANDOVER, HANDOVER_COLS, HANDOVER_HEAD, HANDOVER_TITLE, run_handover
from .idlecost import IDLE_COLS, IDLE_HEAD, IDLECOST, IDLECOST_TITLE, run_idlecost
from .manyvolumes import MANYVOLS, MANYVOLS_COLS, MANYVOLS_HEAD, MANYVOLS_TITLE, run_manyvolumes
from .migrate import MIGRATE, MIGRATE_COLS, MIGRATE_HEAD, MIGRATE_TITLE, run_migrate
from .powerloss import POWER_COLS, POWER_HEAD, POWERLOSS, POWERLOSS_TITLE, run_powerloss
from .space import SPACE, SPACE_TITLE, run_space

# name: --workloads' name and the rows' "workload"; title: the line under
# its heading in the reports; default: whether it runs without
# --workloads (and so, small, in --quick's smoke test) or only when named;
# run: its runner, which cli.main calls with the servers it picks; cols,
# head: its table's columns (row keys and formats) and headings.
Workload = namedtuple("Workload", "name title default run cols head")

# Every workload, in the reports' order: the fio ones first. Only when
# named: coldboot-big (~25 GB of disk and minutes), powerloss (a soak),
# guestio (minutes: a TCG guest boot per server; also when --servers names
# its servers and no --workloads are given).
CATALOG = [Workload(w["name"], w["title"], True, run_one, COLS, HEAD) for w in WORKLOADS] + [
    Workload(COLD, COLD_TITLE, True, run_coldread, COLS, HEAD),
    Workload(SPACE, SPACE_TITLE, True, run_space, COLS, HEAD),
    Workload(COLDCLONE, COLDCLONE_TITLE, True, run_coldclone, CLONE_COLS, CLONE_HEAD),
    Workload(COLDRAND, COLDRAND_TITLE, True, run_coldrandread, COLDRAND_COLS, COLDRAND_HEAD),
    Workload(COLDBOOT, COLDBOOT_TITLE, True, run_coldboot, BOOT_COLS, BOOT_HEAD),
    Workload(COLDBOOT_BIG, COLDBOOT_BIG_TITLE, False, run_coldboot_big, BIGBOOT_COLS, BIGBOOT_HEAD),
    Workload(MANYVOLS, MANYVOLS_TITLE, True, run_manyvolumes, MANYVOLS_COLS, MANYVOLS_HEAD),
    Workload(IDLECOST, IDLECOST_TITLE, True, run_idlecost, IDLE_COLS, IDLE_HEAD),
    Workload(HANDOVER, HANDOVER_TITLE, True, run_handover, HANDOVER_COLS, HANDOVER_HEAD),
    Workload(MIGRATE, MIGRATE_TITLE, True, run_migrate, MIGRATE_COLS, MIGRATE_HEAD),
    Workload(POWERLOSS, POWERLOSS_TITLE, False, run_powerloss, POWER_COLS, POWER_HEAD),
    Workload(GUESTIO, GUESTIO_TITLE, False, run_guestio, GUESTIO_COLS, GUESTIO_HEAD),
]
BY_NAME = {w.name: w for w in CATALOG}
# Workloads that are not one fio run per server (no nbdkit-memory ratio).
SPECIAL = tuple(w.name for w in CATALOG[len(WORKLOADS):])
