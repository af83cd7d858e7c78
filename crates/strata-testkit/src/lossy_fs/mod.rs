//! A FUSE file system that loses what was not synced: a disk with a
//! volatile cache, for power-loss tests.
//!
//! [`LossyFs`] behaves like an ordinary local file system while mounted
//! ([`LossyFs::mount`]). Unmounted, [`LossyFs::power_cut`] simulates losing
//! power: whatever POSIX did not promise to keep may be lost, as the
//! [`LossMode`] decides, and the next mount serves exactly what survived.
//! Modelled on Jepsen's LazyFS (its clear-cache, torn-op and checkpoint
//! faults) and on POSIX's weakest promises as jepsen-io/local-fs states
//! them: a program that is correct here relies only on what every POSIX
//! file system must keep.
//!
//! # What is durable
//!
//! The model is inode-based: regular files and directories, with hard
//! links; also unix sockets and fifos, as data-less names (strata binds its
//! control socket in its data directory). No symlinks or devices: creating
//! one fails with `EPERM`, what symlink(2) and mknod(2) say a file system
//! without them returns.
//!
//! * **File data.** Each file has a current view (what reads return) and a
//!   durable view. Every write, truncate/extend (`ftruncate`, `O_TRUNC`, a
//!   growing `fallocate`), hole punch and zero-range since the file's last
//!   `fsync`/`fdatasync` is an unsynced data op in that file's log. `fsync`
//!   and `fdatasync` (the same here) make the file's whole log durable —
//!   and nothing else: **not the file's name**.
//! * **Names.** Every create, mkdir, link, unlink, rmdir and rename (also
//!   across directories, replacing a target, `RENAME_NOREPLACE`,
//!   `RENAME_EXCHANGE`) is an unsynced namespace op in one global, ordered
//!   log, tagged with the directories it changes. `fsync` of a directory
//!   makes durable every logged op of that directory *and every op logged
//!   before it*. Why a prefix: the durable tree is then always a state the
//!   tree really passed through (a file never survives in a directory whose
//!   mkdir was lost, a rename never leaves two names), which is also what a
//!   journaling file system gives — its metadata commits in order. It is
//!   slightly stronger than POSIX for the earlier ops of *other*
//!   directories; the rule that matters for the programs under test, "sync
//!   the directory after changing it", is modelled exactly.
//! * A file whose durable names are all gone after a cut is gone, data and
//!   all. So a new file that was written and fsynced, in a directory never
//!   fsynced since, does not exist after [`LossMode::DropAll`]; an
//!   unsynced rename or unlink is undone by it; a file whose data and
//!   directory were both synced survives every mode.
//! * **What one data op is.** One FUSE request, which is not always one
//!   `pwrite`: buffered writes reach the file system in requests of at
//!   most 1 MiB, and one starting mid-page sends its first partial page as
//!   a request of its own; `O_DIRECT` writes of up to 1 MiB arrive whole.
//!   So Subset and Torn may keep part of a program's large or unaligned
//!   write — as a real disk may.
//! * Attributes other than the size (mode, owner, times) live in memory and
//!   are not loss-modelled: a cut leaves them as they were.
//!
//! # The cut
//!
//! See [`LossMode`]. Decisions come from a SplitMix64 stream seeded by the
//! caller: the same seed and the same history give the same outcome.
//! After the cut the current state is the durable one, nothing is pending,
//! and inodes keep their numbers (nothing is mounted across a cut).
//!
//! # Serving
//!
//! fuser 0.18's own mount code (no libfuse: `mount(2)` as root, the
//! `fusermount3` helper otherwise), four request threads on cloned
//! `/dev/fuse` descriptors around one mutex. No writeback cache: every
//! `write()` reaches the model before it returns, so the model sees what the
//! program did, in order. Entry and attribute timeouts are 1 s: the mount
//! is the only writer, and a cut only happens unmounted, so kernel caches
//! can never show a state from before a cut. `flock`/`fcntl` locks are left
//! to the kernel (not implemented here, so they work locally, as wanted).
//! Permissions are checked by the kernel (`default_permissions`).
//!
//! File data lives in files under the backing directory (two per file, plus
//! one spill file holding the bytes of pending writes), never in RAM beyond
//! a small record per pending op: a test may write hundreds of MiB between
//! syncs.
//!
//! Layout: `model.rs` (the file system without FUSE), `namespace.rs`
//! (trees and namespace ops), `data.rs` (one file's views and log),
//! `spill.rs` (pending write bytes), `rng.rs` (SplitMix64), `fuse.rs` (the
//! FUSE adapter), `mount.rs` (mounting and unmounting).

mod cut_report;
mod data;
mod fuse;
mod loss_mode;
mod model;
mod mount;
mod namespace;
mod rng;
mod shared;
mod spill;

use std::fmt;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

pub use cut_report::{CutReport, Pending};
pub use loss_mode::{LossMode, LOSS_MODES};
pub use mount::LossyMount;
use shared::Shared;

use model::{Model, Owner};

/// A lossy file system (cheap to clone: clones share it). See the module
/// documentation for what it keeps.
#[derive(Clone)]
pub struct LossyFs {
    shared: Arc<Shared>,
}

impl fmt::Debug for LossyFs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LossyFs")
            .field("backing", &self.shared._backing.path())
            .field("mounted", &self.shared.mounted.load(Ordering::SeqCst))
            .finish()
    }
}

impl LossyFs {
    /// An empty file system whose file data lives in files under
    /// `backing_dir` (created if missing; in a fresh subdirectory removed
    /// when the last clone drops). It must be on a real disk, not inside the
    /// mount. The root directory belongs to the calling user.
    pub fn new(backing_dir: &Path) -> io::Result<LossyFs> {
        std::fs::create_dir_all(backing_dir)?;
        let backing = tempfile::Builder::new()
            .prefix("lossy-fs-")
            .tempdir_in(backing_dir)?;
        // SAFETY: getuid/getgid cannot fail and touch no memory.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        let root = Owner {
            perm: 0o755,
            uid,
            gid,
        };
        let model = Model::new(backing.path(), root)?;
        Ok(LossyFs {
            shared: Arc::new(Shared {
                model: Mutex::new(model),
                mounted: AtomicBool::new(false),
                _backing: backing,
            }),
        })
    }

    /// Mounts it at `mountpoint` (an existing empty directory); serves until
    /// the returned mount is dropped or unmounted. At most one mount at a
    /// time (`Err` otherwise, also while a lazily detached earlier mount
    /// still has open files).
    pub fn mount(&self, mountpoint: &Path) -> io::Result<LossyMount> {
        mount::mount(&self.shared, mountpoint)
    }

    /// The power cut: only while not mounted (`Err` otherwise). Afterwards
    /// the contents are exactly the durable state after the loss, nothing is
    /// pending, and the next mount serves that.
    pub fn power_cut(&self, mode: LossMode, seed: u64) -> io::Result<CutReport> {
        let mut model = self.shared.model.lock();
        if self.shared.mounted.load(Ordering::SeqCst) {
            return Err(io::Error::new(
                io::ErrorKind::ResourceBusy,
                "lossy_fs: power_cut while mounted; unmount first",
            ));
        }
        model.power_cut(mode, seed)
    }

    /// What is unsynced right now.
    pub fn pending(&self) -> Pending {
        self.shared.model.lock().pending()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loss_mode_words_round_trip() {
        for mode in LOSS_MODES {
            assert_eq!(mode.to_string().parse::<LossMode>(), Ok(mode));
        }
        let err = "clear".parse::<LossMode>().unwrap_err();
        assert!(err.contains("drop, subset, torn, all"), "{err}");
    }

    #[test]
    fn handle_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<LossyFs>();
        check::<LossyMount>();
    }
}
