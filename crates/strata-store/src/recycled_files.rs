//! Files of deleted objects, kept to be overwritten by the next ones.
//!
//! This module owns the embedded store's pool of recycled files,
//! `<root>/.strata-recycle/`. On a cloud VM a page-cache page the kernel
//! has never used costs a host fault, and a disk block a file has never
//! held costs an allocation (and, on thin disks, a first write): measured
//! here, writing 2 GiB into a new file took 0.77 s of system time and
//! 6.3 s with its `fdatasync`, overwriting the same file in place 0.12 s
//! and 1.05 s. Every segment PUT used to be a new file, so bulk writes ran
//! at that first speed. Now a large object deleted (by GC, after its grace
//! period) is renamed into the pool instead of unlinked, and a large
//! create-only PUT takes the oldest pooled file and overwrites it, so
//! steady-state writing reuses pages and blocks the kernel already has.
//!
//! Safety (why a recycled file never serves old bytes, and old names never
//! serve new ones):
//! - a file enters the pool by `rename` from its object name, and the
//!   object's directory is synced before the file can be taken: after a
//!   power cut the old name is gone, or the file still holds its old bytes;
//! - it is taken by `rename` onto a fresh staging name (`<name>#<n>`, which
//!   listings skip), overwritten from offset 0, cut to the new length and
//!   synced before it is linked to its new name (`durable_local_store.rs`),
//!   so a name only ever points at the bytes written for it;
//! - a reader of this process with a descriptor opened before the delete
//!   could see new bytes: every chunk it reads is checked against the old
//!   segment's CRCs, and a read that fails on a segment GC deleted looks
//!   the map up again (`strata-volume` `volume/read.rs`), as it does for a
//!   file that is gone. The pool is FIFO, so a file waits for as long as
//!   the pool is deep before it is reused.
//!
//! Bounded: at most `budget_bytes` in the pool (`--recycle-bytes`); a
//! delete beyond that unlinks. A write that finds the disk full empties
//! the pool, so recycling never turns free space into a full disk.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use serde::Serialize;

/// The pool's directory under the store root (not a volume name: those
/// cannot start with a dot).
pub const RECYCLE_DIR: &str = ".strata-recycle";
/// Objects smaller than this are not worth a pooled file (leases,
/// manifests, small checkpoints): their pages are few. Segments sealed by
/// age before they fill are often a few hundred KiB.
pub const MIN_RECYCLE_BYTES: u64 = 256 << 10;
/// Default pool budget: 64 segments of 16 MiB. GC deletes in bursts (a
/// pass every 500 ms while it finds work); the pool must hold a burst for
/// writes at disk speed to find files in it.
pub const DEFAULT_RECYCLE_BYTES: u64 = 1 << 30;
/// A pooled file not reused for this long is unlinked: the pool holds
/// space only while something writes, and a volume that stops writing
/// gives its garbage's space back as before.
pub const RECYCLE_IDLE_MS: u64 = 10_000;
/// At most this many files in the pool, whatever their size: each is an
/// inode (and, on a FUSE disk, open descriptors); the power-loss soak,
/// which recycles segments of a few KiB, found the byte budget alone no
/// bound on them.
pub const MAX_RECYCLED_FILES: u64 = 256;

/// Names in the pool are `<pid>-<n>#0`, `n` unique in the process (two
/// stores on one directory in a process must not reuse a name).
static NEXT_NAME: AtomicU64 = AtomicU64::new(0);

/// What the pool did, for metrics and the bench.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RecycleSnapshot {
    /// Large PUTs that overwrote a pooled file.
    pub reused_files: u64,
    /// Large PUTs that found the pool empty and wrote a new file.
    pub new_files: u64,
    /// Deleted objects kept in the pool.
    pub kept_files: u64,
    /// Deleted objects unlinked because the pool was full.
    pub unlinked_files: u64,
    pub pool_files: u64,
    pub pool_bytes: u64,
    pub budget_bytes: u64,
}

#[derive(Debug)]
struct Pooled {
    path: PathBuf,
    len: u64,
    since: Instant,
}

#[derive(Debug, Default)]
struct Pool {
    /// Oldest first.
    files: VecDeque<Pooled>,
    /// Bytes of `files`, plus those reserved by a `keep` under way.
    bytes: u64,
    /// `files.len()`, plus the `keep`s under way.
    count: u64,
}

impl Pool {
    /// A file of `len` bytes left the pool (or its `keep` failed).
    fn release(&mut self, len: u64) {
        debug_assert!(self.bytes >= len && self.count > 0);
        self.bytes -= len;
        self.count -= 1;
    }
}

/// See the module doc.
#[derive(Debug)]
pub(crate) struct RecycledFiles {
    dir: PathBuf,
    budget_bytes: u64,
    /// Smaller objects are unlinked and written new (`MIN_RECYCLE_BYTES`;
    /// the power-loss loop lowers it so its small segments are recycled).
    min_bytes: u64,
    pool: Mutex<Pool>,
    reused: AtomicU64,
    new: AtomicU64,
    kept: AtomicU64,
    unlinked: AtomicU64,
}

impl RecycledFiles {
    /// The pool of the store at `root`, with what an earlier process left
    /// in it (over the budget: unlinked). `None` with a budget of 0.
    /// A thread unlinks files idle for `RECYCLE_IDLE_MS`.
    pub(crate) fn open(
        root: &Path,
        budget_bytes: u64,
        min_bytes: u64,
    ) -> io::Result<Option<Arc<RecycledFiles>>> {
        let dir = root.join(RECYCLE_DIR);
        if budget_bytes == 0 {
            return Ok(None);
        }
        match std::fs::create_dir(&dir) {
            Ok(()) => File::open(root)?.sync_all()?,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        // (seconds since pooled, path, size): a rename into the pool sets
        // the file's ctime, so ages survive restarts (a server restarted
        // more often than the idle time would otherwise keep every file).
        let now = SystemTime::now();
        let mut found: Vec<(Duration, PathBuf, u64)> = Vec::new();
        for entry in std::fs::read_dir(&dir)? {
            // Another process sharing the store may take or unlink a
            // pooled file while this one lists them.
            let meta = match entry.and_then(|e| e.metadata().map(|m| (e, m))) {
                Ok((e, m)) => (e.path(), m),
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            let (path, meta) = meta;
            if meta.is_file() {
                let pooled_at = UNIX_EPOCH
                    + Duration::new(meta.ctime().max(0) as u64, meta.ctime_nsec().max(0) as u32);
                let age = now.duration_since(pooled_at).unwrap_or_default();
                found.push((age, path, meta.len()));
            }
        }
        // Oldest first.
        found.sort_by_key(|f| std::cmp::Reverse(f.0));
        let mut pool = Pool::default();
        let idle = Duration::from_millis(RECYCLE_IDLE_MS);
        let started = Instant::now();
        for (age, path, len) in found {
            let fits = pool.bytes + len <= budget_bytes && pool.count < MAX_RECYCLED_FILES;
            match started.checked_sub(age) {
                Some(since) if fits && age < idle => {
                    pool.bytes += len;
                    pool.count += 1;
                    pool.files.push_back(Pooled { path, len, since });
                }
                _ => {
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        let pool = Arc::new(RecycledFiles {
            dir,
            budget_bytes,
            min_bytes,
            pool: Mutex::new(pool),
            reused: AtomicU64::new(0),
            new: AtomicU64::new(0),
            kept: AtomicU64::new(0),
            unlinked: AtomicU64::new(0),
        });
        let weak = Arc::downgrade(&pool);
        std::thread::Builder::new()
            .name("strata-recycle".into())
            .spawn(move || trim_while_alive(&weak))?;
        Ok(Some(pool))
    }

    /// Called for a delete of the object at `path`: moves a large file into
    /// the pool if it fits, its directory synced so the old name cannot
    /// come back. `Ok(true)`: the object is gone; `Ok(false)`: not kept,
    /// the caller unlinks it; an error: nothing was done.
    pub(crate) fn keep(&self, path: &Path) -> io::Result<bool> {
        let meta = std::fs::metadata(path)?;
        let len = meta.len();
        // A file with another name (a user's `cp -al` backup, a copy by
        // hard link) is never overwritten: that name would change.
        if meta.nlink() > 1 {
            return Ok(false);
        }
        if len < self.min_bytes || !self.reserve(len) {
            self.unlinked
                .fetch_add(u64::from(len >= self.min_bytes), Ordering::Relaxed);
            return Ok(false);
        }
        let n = NEXT_NAME.fetch_add(1, Ordering::Relaxed);
        // `#0`: a name object_store's listings skip, should one ever walk
        // this directory.
        let pooled = self.dir.join(format!("{}-{n}#0", std::process::id()));
        if let Err(e) = std::fs::rename(path, &pooled) {
            self.pool.lock().release(len);
            return Err(e);
        }
        let synced = match path.parent() {
            Some(parent) => File::open(parent).and_then(|d| d.sync_all()),
            None => Ok(()),
        };
        let mut pool = self.pool.lock();
        if let Err(e) = synced {
            // The old name may come back after a power cut, so the file
            // is never reused: unlinked, as a delete would have done.
            pool.release(len);
            drop(pool);
            tracing::warn!(file = %path.display(), error = %e, "cannot sync a directory after a delete; the file is unlinked, not recycled");
            let _ = std::fs::remove_file(&pooled);
            return Ok(true);
        }
        pool.files.push_back(Pooled {
            path: pooled,
            len,
            since: Instant::now(),
        });
        self.kept.fetch_add(1, Ordering::Relaxed);
        Ok(true)
    }

    /// Whether a PUT of `len` bytes should take a pooled file.
    pub(crate) fn wants(&self, len: u64) -> bool {
        len >= self.min_bytes
    }

    fn reserve(&self, len: u64) -> bool {
        let mut pool = self.pool.lock();
        if pool.bytes + len > self.budget_bytes || pool.count >= MAX_RECYCLED_FILES {
            return false;
        }
        pool.bytes += len;
        pool.count += 1;
        true
    }

    /// For a large PUT staged at `staging` (an empty file just created
    /// there): the oldest pooled file renamed over it and opened for
    /// writing, or `None` when the pool is empty (nothing was renamed: the
    /// caller's own descriptor still names `staging`). Once a rename
    /// happened the caller's descriptor is stale, so whatever goes wrong
    /// after it, what is returned is a descriptor of `staging`.
    pub(crate) fn take(&self, staging: &Path) -> io::Result<Option<File>> {
        loop {
            let Some(Pooled {
                path: pooled, len, ..
            }) = self.pool.lock().files.pop_front()
            else {
                self.new.fetch_add(1, Ordering::Relaxed);
                return Ok(None);
            };
            let renamed = std::fs::rename(&pooled, staging);
            self.pool.lock().release(len);
            match renamed {
                Ok(()) => return self.open_taken(staging).map(Some),
                // Taken by another process sharing the store: try the next.
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => {
                    tracing::warn!(file = %pooled.display(), error = %e, "cannot reuse a recycled file; writing a new one");
                    self.new.fetch_add(1, Ordering::Relaxed);
                    return Ok(None);
                }
            }
        }
    }

    /// The file just renamed onto `staging`, open for writing; a new empty
    /// file there instead if it cannot be reused.
    fn open_taken(&self, staging: &Path) -> io::Result<File> {
        let file = OpenOptions::new().read(true).write(true).open(staging)?;
        // Linked elsewhere since it was pooled (a user's `cp -al`): not
        // ours to overwrite, as that other name would change.
        if file.metadata()?.nlink() == 1 {
            self.reused.fetch_add(1, Ordering::Relaxed);
            return Ok(file);
        }
        std::fs::remove_file(staging)?;
        self.new.fetch_add(1, Ordering::Relaxed);
        OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(staging)
    }

    /// Unlinks every pooled file (the disk is full: the space is worth
    /// more than the pages).
    pub(crate) fn drain(&self) {
        let n = self.unlink_where(|_| true);
        if n > 0 {
            tracing::warn!(
                files = n,
                "disk full: unlinked the recycled segment files to make room"
            );
        }
    }

    /// Unlinks the files pooled for longer than `RECYCLE_IDLE_MS`.
    pub(crate) fn trim_idle(&self) -> usize {
        let idle = Duration::from_millis(RECYCLE_IDLE_MS);
        self.unlink_where(|p| p.since.elapsed() >= idle)
    }

    /// Unlinks the pooled files (oldest first) while `pred` holds.
    fn unlink_where(&self, pred: impl Fn(&Pooled) -> bool) -> usize {
        let mut gone = Vec::new();
        {
            let mut pool = self.pool.lock();
            while pool.files.front().is_some_and(&pred) {
                if let Some(p) = pool.files.pop_front() {
                    pool.release(p.len);
                    gone.push(p);
                }
            }
        }
        for p in &gone {
            let _ = std::fs::remove_file(&p.path);
        }
        gone.len()
    }

    pub(crate) fn snapshot(&self) -> RecycleSnapshot {
        let pool = self.pool.lock();
        RecycleSnapshot {
            reused_files: self.reused.load(Ordering::Relaxed),
            new_files: self.new.load(Ordering::Relaxed),
            kept_files: self.kept.load(Ordering::Relaxed),
            unlinked_files: self.unlinked.load(Ordering::Relaxed),
            pool_files: pool.files.len() as u64,
            pool_bytes: pool.bytes,
            budget_bytes: self.budget_bytes,
        }
    }
}

/// The trimming thread's loop: ends when the pool is dropped.
fn trim_while_alive(pool: &Weak<RecycledFiles>) {
    let period = Duration::from_millis(RECYCLE_IDLE_MS / 4);
    loop {
        std::thread::sleep(period);
        let Some(pool) = pool.upgrade() else { return };
        pool.trim_idle();
    }
}
