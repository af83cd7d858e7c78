//! The local-disk cache tier: verified segment chunks in one local file.
//!
//! This module owns `<data_dir>/cache/chunks`, a file of fixed 4 KiB slots
//! within a byte budget (`disk_cache_bytes`), and the in-memory index that
//! says which chunk is in which slot. It sits between the RAM chunk cache
//! and the object store: chunks fetched from the store are written here,
//! and a RAM miss looks here before going to the store.
//!
//! ## A cache, not state
//!
//! The file is emptied at startup and the index is never persisted: after a
//! restart the tier starts cold, so nothing here has to survive a crash or
//! be recovered. An exclusive `flock` on the file keeps two servers that
//! were given one data directory from sharing (and scribbling over) it; the
//! file is never unlinked, so the lock is never on a name someone else can
//! recreate.
//!
//! ## Untrusted reads
//!
//! Bytes read back from the file are untrusted (a bad disk, a stray writer,
//! a bug). The caller verifies every chunk against the CRC32C in its
//! segment's index before use; a mismatch is counted (`verify_failures`),
//! the entry is dropped and the chunk is read from the store.
//!
//! ## Index: set-associative, CLOCK within a set
//!
//! A chunk's key (volume id, segment, chunk number) hashes to one set of
//! `WAYS` slots; eviction runs CLOCK (a referenced bit per slot and a hand)
//! within the set. No hash map and no per-entry allocation: the index is
//! one fixed array, allocated when the server starts and never grown. Its
//! RAM cost is a 16-byte key per slot plus about 16 bytes of state per set
//! of 16 slots and a 4-byte generation per slot: ~21 bytes per 4 KiB slot,
//! plus 8 bytes of admission fingerprints: about 7.3 MiB of RAM per cached
//! GiB (0.7%). Volume uuids are mapped to a `u32` id by the caller to keep
//! the key that small.
//!
//! ## Concurrency
//!
//! `pread` / `pwrite` run outside the set's lock. Each slot has a
//! generation number, bumped whenever it is handed to a new key: a reader
//! notes it at lookup and checks it after its `pread`, so a slot reused
//! while it was being read is a miss, never wrong data (seqlock style). Per
//! slot, not per set: with one number per set, the writes of a concurrent
//! fetch turned a fifth of a scan's disk hits into misses. A slot being written is reserved (`writing`) and invisible to
//! lookups until its `pwrite` is done.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use parking_lot::Mutex;
use serde::Serialize;

use crate::error::VolumeError;
use crate::format::segment::CHUNK_BYTES;

/// Slots per set: enough ways that conflict misses are rare, few enough
/// that a lookup scans one cache line's worth of keys.
pub const WAYS: usize = 16;
const SLOT_BYTES: u64 = CHUNK_BYTES;
/// Name of the cache file inside `<data_dir>/cache/`.
pub const FILE_NAME: &str = "chunks";

/// What identifies a cached chunk: 16 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DiskKey {
    pub volume_id: u32,
    pub chunk: u32,
    pub seq: u64,
}

impl DiskKey {
    /// The key of chunk `chunk` of segment `seq`; `None` if the chunk
    /// number does not fit (segments hold at most 4 GiB, 2^20 chunks).
    pub fn new(volume_id: u32, seq: u64, chunk: u64) -> Option<DiskKey> {
        Some(DiskKey {
            volume_id,
            chunk: u32::try_from(chunk).ok()?,
            seq,
        })
    }

    fn hash(&self) -> u64 {
        let a = mix64(self.seq ^ (u64::from(self.volume_id) << 32));
        mix64(a ^ u64::from(self.chunk))
    }
}

/// Entries per bucket of the admission filter.
const SEEN_WAYS: usize = 4;

/// splitmix64's finaliser: spreads consecutive chunks over all sets.
fn mix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// One set of `ways` slots; bit `w` of each mask is slot `w`.
struct Set {
    keys: [DiskKey; WAYS],
    /// The slot holds the data of `keys[w]`.
    valid: u16,
    /// The slot is reserved for `keys[w]`, its `pwrite` not yet done.
    writing: u16,
    referenced: u16,
    hand: u8,
    generations: [u32; WAYS],
}

/// Where a lookup found a chunk, and the slot generation it saw.
#[derive(Debug, Clone, Copy)]
pub struct DiskHit {
    set: usize,
    way: usize,
    generation: u32,
}

/// Counters of the disk tier. `budget_bytes: 0` means disabled.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct DiskCacheStats {
    /// Chunks served from the file (after verification).
    pub hits: u64,
    /// Lookups not served: absent, reused while read, or failed verification.
    pub misses: u64,
    pub insertions: u64,
    pub evictions: u64,
    pub used_bytes: u64,
    pub budget_bytes: u64,
    /// Chunks read back whose CRC did not match (dropped, read from the store).
    pub verify_failures: u64,
    /// Failed `pread` / `pwrite` calls (the chunk is then not cached / read
    /// from the store).
    pub io_errors: u64,
    /// Chunks not written because the disk was behind (reads never wait
    /// for the disk tier).
    pub skipped_writes: u64,
    /// Chunks fetched for the first time, so not written (second-fetch
    /// admission).
    pub not_admitted: u64,
}

pub struct DiskCache {
    /// `None`: the tier is disabled (budget 0).
    file: Option<File>,
    path: PathBuf,
    ways: usize,
    sets: Vec<Mutex<Set>>,
    budget_bytes: u64,
    used_slots: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
    insertions: AtomicU64,
    evictions: AtomicU64,
    verify_failures: AtomicU64,
    io_errors: AtomicU64,
    skipped_writes: AtomicU64,
    /// Second-fetch admission: a fingerprint per recently fetched chunk
    /// (hash-indexed, overwritten on collision). A chunk is written to disk
    /// only when it is fetched from the store a second time, so a scan that
    /// reads data once (a backup, a cold copy) costs no disk writes.
    seen: Vec<AtomicU32>,
    not_admitted: AtomicU64,
}

impl DiskCache {
    /// Creates (empties) and locks the cache file in `dir`, sized for
    /// `budget_bytes`; a budget below one slot disables the tier.
    pub fn open(dir: &Path, budget_bytes: u64) -> Result<DiskCache, VolumeError> {
        let slots = budget_bytes / SLOT_BYTES;
        let path = dir.join(FILE_NAME);
        if slots == 0 {
            return Ok(DiskCache::with_geometry(None, path, budget_bytes, 1, 0));
        }
        let ways = (slots as usize).min(WAYS);
        let set_count = slots as usize / ways;
        let io = |what: &str, source| VolumeError::Io {
            what: format!("disk cache: {what} {}", path.display()),
            source,
        };
        std::fs::create_dir_all(dir).map_err(|e| io("create directory for", e))?;
        // Not truncated on open: another server may hold it; emptied once
        // the lock is ours.
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| io("open", e))?;
        lock_exclusive(&file, &path)?;
        file.set_len(0).map_err(|e| io("empty", e))?;
        let file_bytes = (set_count * ways) as u64 * SLOT_BYTES;
        file.set_len(file_bytes).map_err(|e| io("size", e))?;
        Ok(DiskCache::with_geometry(
            Some(file),
            path,
            budget_bytes,
            ways,
            set_count,
        ))
    }

    fn with_geometry(
        file: Option<File>,
        path: PathBuf,
        budget_bytes: u64,
        ways: usize,
        set_count: usize,
    ) -> DiskCache {
        assert!((1..=WAYS).contains(&ways));
        assert!((set_count * ways) as u64 * SLOT_BYTES <= budget_bytes);
        let sets = (0..set_count)
            .map(|_| {
                Mutex::new(Set {
                    keys: [DiskKey::default(); WAYS],
                    valid: 0,
                    writing: 0,
                    referenced: 0,
                    hand: 0,
                    generations: [0; WAYS],
                })
            })
            .collect();
        DiskCache {
            file,
            path,
            ways,
            sets,
            budget_bytes,
            used_slots: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            insertions: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            verify_failures: AtomicU64::new(0),
            io_errors: AtomicU64::new(0),
            skipped_writes: AtomicU64::new(0),
            // Two fingerprints per slot: 8 bytes of RAM per 4 KiB cached.
            seen: (0..2 * set_count * ways)
                .map(|_| AtomicU32::new(0))
                .collect(),
            not_admitted: AtomicU64::new(0),
        }
    }

    /// Whether a chunk just fetched from the store goes to disk: yes if it
    /// was fetched before (its fingerprint is in its bucket), else remember
    /// it (in a free entry of the bucket, else over a pseudo-random one).
    /// Races between threads only make the filter a little less exact.
    pub fn admit(&self, key: &DiskKey) -> bool {
        if self.seen.len() < SEEN_WAYS {
            return false;
        }
        let h = key.hash();
        let buckets = self.seen.len() / SEEN_WAYS;
        let base = (h >> 32) as usize % buckets * SEEN_WAYS;
        let bucket = &self.seen[base..base + SEEN_WAYS];
        let fingerprint = (h as u32) | 1;
        if bucket
            .iter()
            .any(|e| e.load(Ordering::Relaxed) == fingerprint)
        {
            return true;
        }
        let victim = bucket
            .iter()
            .find(|e| e.load(Ordering::Relaxed) == 0)
            .unwrap_or(&bucket[(h >> 8) as usize % SEEN_WAYS]);
        victim.store(fingerprint, Ordering::Relaxed);
        self.not_admitted.fetch_add(1, Ordering::Relaxed);
        false
    }

    pub fn enabled(&self) -> bool {
        self.file.is_some() && !self.sets.is_empty()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn set_of(&self, key: &DiskKey) -> usize {
        (key.hash() % self.sets.len() as u64) as usize
    }

    /// Byte offset of a slot in the file.
    fn slot_offset(&self, set: usize, way: usize) -> u64 {
        (set * self.ways + way) as u64 * SLOT_BYTES
    }

    /// Finds `key`'s slot and marks it referenced. Counts nothing: the
    /// caller counts a hit only once the bytes are verified.
    pub fn lookup(&self, key: &DiskKey) -> Option<DiskHit> {
        if !self.enabled() {
            return None;
        }
        let set = self.set_of(key);
        let mut s = self.sets[set].lock();
        let way = (0..self.ways).find(|&w| s.valid & (1 << w) != 0 && s.keys[w] == *key)?;
        s.referenced |= 1 << way;
        Some(DiskHit {
            set,
            way,
            generation: s.generations[way],
        })
    }

    /// Whether `key` is cached or being written (read-ahead asks; not a use).
    pub fn contains(&self, key: &DiskKey) -> bool {
        if !self.enabled() {
            return false;
        }
        let s = self.sets[self.set_of(key)].lock();
        (0..self.ways).any(|w| (s.valid | s.writing) & (1 << w) != 0 && s.keys[w] == *key)
    }

    /// Reads `len` bytes of a slot found by `lookup`. The bytes are
    /// untrusted until `still_holds` and the CRC check pass.
    pub fn read(&self, hit: &DiskHit, len: usize) -> io::Result<Vec<u8>> {
        assert!(len as u64 <= SLOT_BYTES);
        let file = self
            .file
            .as_ref()
            .ok_or_else(|| io::Error::other("disabled"))?;
        let mut buf = vec![0u8; len];
        file.read_exact_at(&mut buf, self.slot_offset(hit.set, hit.way))?;
        Ok(buf)
    }

    /// Whether the slot of `hit` was left alone while it was read.
    pub fn still_holds(&self, hit: &DiskHit, key: &DiskKey) -> bool {
        let s = self.sets[hit.set].lock();
        s.generations[hit.way] == hit.generation
            && s.valid & (1 << hit.way) != 0
            && s.keys[hit.way] == *key
    }

    pub fn count_hit(&self) {
        self.hits.fetch_add(1, Ordering::Relaxed);
    }

    pub fn count_miss(&self) {
        self.misses.fetch_add(1, Ordering::Relaxed);
    }

    pub fn count_io_error(&self) {
        self.io_errors.fetch_add(1, Ordering::Relaxed);
    }

    /// Drops an entry whose bytes failed verification.
    pub fn drop_corrupt(&self, hit: &DiskHit, key: &DiskKey) {
        self.verify_failures.fetch_add(1, Ordering::Relaxed);
        self.misses.fetch_add(1, Ordering::Relaxed);
        let mut s = self.sets[hit.set].lock();
        let bit = 1u16 << hit.way;
        if s.generations[hit.way] == hit.generation && s.valid & bit != 0 && s.keys[hit.way] == *key
        {
            s.valid &= !bit;
            s.referenced &= !bit;
            self.used_slots.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Writes a verified chunk into a slot (a blocking `pwrite`: callers
    /// run it off the async workers). Does nothing if the chunk is already
    /// cached or every slot of its set is being written.
    pub fn insert(&self, key: &DiskKey, data: &[u8]) {
        assert!(!data.is_empty() && data.len() as u64 <= SLOT_BYTES);
        let Some(file) = &self.file else { return };
        let Some((set, way)) = self.reserve(key) else {
            return;
        };
        let written = file.write_all_at(data, self.slot_offset(set, way));
        let mut s = self.sets[set].lock();
        let bit = 1u16 << way;
        // Reserved slots are never evicted or dropped, so it is still ours.
        assert!(s.writing & bit != 0 && s.keys[way] == *key);
        s.writing &= !bit;
        match written {
            Ok(()) => {
                s.valid |= bit;
                self.insertions.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                tracing::debug!(path = %self.path.display(), error = %e, "disk cache write failed");
                self.used_slots.fetch_sub(1, Ordering::Relaxed);
                self.io_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Picks a slot for `key` (a free one, else a CLOCK victim) and marks it
    /// being written; `None` if `key` is there already or nothing is free.
    fn reserve(&self, key: &DiskKey) -> Option<(usize, usize)> {
        let set = self.set_of(key);
        let mut s = self.sets[set].lock();
        let taken = s.valid | s.writing;
        if (0..self.ways).any(|w| taken & (1 << w) != 0 && s.keys[w] == *key) {
            return None;
        }
        let all: u16 = if self.ways == WAYS {
            u16::MAX
        } else {
            (1u16 << self.ways) - 1
        };
        let free = !taken & all;
        let way = if free != 0 {
            self.used_slots.fetch_add(1, Ordering::Relaxed);
            free.trailing_zeros() as usize
        } else {
            let way = clock_victim(&mut s, self.ways)?;
            self.evictions.fetch_add(1, Ordering::Relaxed);
            way
        };
        let bit = 1u16 << way;
        s.valid &= !bit;
        s.referenced &= !bit;
        s.writing |= bit;
        s.keys[way] = *key;
        s.generations[way] = s.generations[way].wrapping_add(1);
        Some((set, way))
    }

    pub fn stats(&self) -> DiskCacheStats {
        let used_bytes = self.used_slots.load(Ordering::Relaxed) * SLOT_BYTES;
        debug_assert!(used_bytes <= self.budget_bytes);
        DiskCacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            insertions: self.insertions.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
            used_bytes,
            budget_bytes: self.budget_bytes,
            verify_failures: self.verify_failures.load(Ordering::Relaxed),
            io_errors: self.io_errors.load(Ordering::Relaxed),
            skipped_writes: self.skipped_writes.load(Ordering::Relaxed),
            not_admitted: self.not_admitted.load(Ordering::Relaxed),
        }
    }

    /// Counts chunks not cached because the write queue was full.
    pub fn skip_writes(&self, chunks: u64) {
        self.skipped_writes.fetch_add(chunks, Ordering::Relaxed);
    }
}

/// CLOCK within one set: the first valid, unreferenced slot from the hand
/// on, clearing referenced bits on the way; slots being written are
/// skipped. Two sweeps find one unless every slot is being written.
fn clock_victim(s: &mut Set, ways: usize) -> Option<usize> {
    for _ in 0..2 * ways {
        let w = usize::from(s.hand) % ways;
        s.hand = ((w + 1) % ways) as u8;
        let bit = 1u16 << w;
        if s.writing & bit != 0 {
            continue;
        }
        if s.referenced & bit != 0 {
            s.referenced &= !bit;
            continue;
        }
        if s.valid & bit != 0 {
            return Some(w);
        }
    }
    None
}

fn lock_exclusive(file: &File, path: &Path) -> Result<(), VolumeError> {
    // SAFETY: flock only operates on the descriptor, which `file` owns and
    // keeps open for the duration of the call; no memory is passed.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        return Err(VolumeError::Busy(format!(
            "the disk cache {} is in use by another strata process using the same data directory; stop that server or give this one another data directory",
            path.display()
        )));
    }
    Err(VolumeError::Io {
        what: format!("disk cache: lock {}", path.display()),
        source: e,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn key(chunk: u64) -> DiskKey {
        DiskKey::new(1, 7, chunk).unwrap()
    }

    fn get(c: &DiskCache, k: &DiskKey) -> Option<Vec<u8>> {
        let hit = c.lookup(k)?;
        let bytes = c.read(&hit, 4096).unwrap();
        c.still_holds(&hit, k).then_some(bytes)
    }

    #[test]
    fn stores_evicts_within_budget_and_locks_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let budget = 64 * 4096 + 100;
        let c = DiskCache::open(dir.path(), budget).unwrap();
        assert!(c.enabled());
        assert_eq!(std::fs::metadata(c.path()).unwrap().len(), 64 * 4096);
        for i in 0..64u64 {
            c.insert(&key(i), &[i as u8; 4096]);
        }
        // Every key kept so far reads back its own bytes.
        let kept = (0..64u64)
            .filter(|&i| get(&c, &key(i)).is_some_and(|b| b == vec![i as u8; 4096]))
            .count();
        assert!(kept > 32, "{kept}");
        for i in 64..1000u64 {
            c.insert(&key(i), &[i as u8; 4096]);
            assert!(c.stats().used_bytes <= 64 * 4096);
        }
        let s = c.stats();
        assert_eq!(s.insertions, 1000, "{s:?}");
        assert!(s.evictions > 0 && s.used_bytes <= budget, "{s:?}");
        for i in 936..1000u64 {
            if let Some(b) = get(&c, &key(i)) {
                assert_eq!(b, vec![i as u8; 4096]);
            }
        }
        let err = DiskCache::open(dir.path(), budget).err().unwrap();
        assert!(matches!(err, VolumeError::Busy(_)), "{err}");
        drop(c);
        let c = DiskCache::open(dir.path(), budget).unwrap();
        assert!(get(&c, &key(999)).is_none(), "the file starts empty");
    }

    #[test]
    fn a_zero_budget_disables_the_tier_visibly() {
        let dir = tempfile::tempdir().unwrap();
        let c = DiskCache::open(dir.path(), 0).unwrap();
        assert!(!c.enabled());
        c.insert(&key(1), &[1; 4096]);
        assert!(c.lookup(&key(1)).is_none());
        assert_eq!(c.stats().budget_bytes, 0);
        assert!(!dir.path().join(FILE_NAME).exists());
    }

    #[test]
    fn a_reused_slot_is_a_miss_and_corrupt_entries_are_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let c = DiskCache::open(dir.path(), 4096).unwrap();
        c.insert(&key(1), &[1; 4096]);
        let hit = c.lookup(&key(1)).unwrap();
        // Another key takes the only slot while the first is "being read".
        c.insert(&key(2), &[2; 4096]);
        assert!(!c.still_holds(&hit, &key(1)));
        let hit = c.lookup(&key(2)).unwrap();
        c.drop_corrupt(&hit, &key(2));
        assert!(c.lookup(&key(2)).is_none());
        let s = c.stats();
        assert_eq!((s.verify_failures, s.used_bytes, s.evictions), (1, 0, 1));
    }
}
