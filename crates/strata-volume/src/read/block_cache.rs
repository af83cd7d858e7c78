//! The local disk cache: verified 64 KiB blocks of segments in one file
//! that survives restarts.
//!
//! This module owns `<data_dir>/cache/blocks` (layout in
//! `format/cache_file.rs`): a superblock, a directory of one 32-byte entry
//! per slot, and fixed 64 KiB slots within a byte budget
//! (`disk_cache_bytes`), plus the RAM index that says which block is in
//! which slot. It sits between the RAM chunk cache and the object store.
//! Written data enters it once its segment is uploaded (`insert_written`:
//! the local disk is a write-back cache of the recent log, LSVD's design);
//! blocks fetched from the store enter it on their second fetch.
//!
//! ## Surviving restarts
//!
//! The directory is rebuilt into the RAM index at start (an entry whose
//! checksum fails, or that sits in the wrong set, is ignored). A block is
//! written data first, then its entry; a slot being reused has its entry
//! emptied before new data goes over it. Nothing is fsynced: a kill -9
//! leaves everything in the page cache, a power loss may tear blocks. So
//! nothing read from the file is trusted: the caller verifies every chunk
//! against its segment's CRC table (from the store, not from this file)
//! before use; a mismatch drops the block (`verify_failures`) and the chunk
//! is read from the store. Verifying against the store's table, not a CRC
//! kept here, also covers a block cached from a segment whose upload
//! raced a crash and whose sequence number was then reused.
//!
//! ## Index: set-associative with two choices, CLOCK within a set
//!
//! A block's key (volume key, segment, block number) hashes to two sets of
//! `WAYS` slots and goes into the one with more free slots (lookups look
//! in both); eviction runs CLOCK within its first set. Why two: with one,
//! a set's share of the blocks is a Poisson draw, so some sets are full
//! long before the cache is: a 2 GiB volume hydrated into a 3 GiB cache
//! left 5% of its blocks with no room (fetched again on every read); with
//! the emptier of two, sets fill evenly until the cache is nearly full.
//! An entry a server of the one-set layout finds in its key's second set
//! is ignored at start (a miss, never wrong data). One fixed array,
//! allocated at start and never grown: per slot a 24-byte key, a 4-byte
//! generation, 3 bits of state and 8 bytes of admission fingerprints, about
//! 37 bytes per 64 KiB block: 0.6 MiB of RAM per cached GiB.
//!
//! ## Concurrency and failure
//!
//! `pread` / `pwrite` run outside the set's lock. Each slot has a
//! generation number, bumped whenever it is handed to a new key: a reader
//! notes it at lookup and checks it after its `pread`, so a slot reused
//! while it was being read is a miss, never wrong data. A slot being
//! written is reserved (`writing`) and invisible to lookups until its
//! entry is written. A failed write (a full disk, an I/O error) switches
//! the tier off with one log line: reads go to the store from then on and
//! no client sees an error. An exclusive `flock` keeps two servers given
//! one data directory from sharing the file.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use parking_lot::Mutex;
use serde::Serialize;

use super::key_hasher::mix64;
use crate::error::VolumeError;
use crate::format::cache_file::{CacheEntry, CacheSuperblock, ENTRY_BYTES, SUPERBLOCK_BYTES};
use crate::format::segment::CHUNK_BYTES;

/// The unit of the disk cache: what one slot holds and one directory entry
/// names.
pub const BLOCK_BYTES: u64 = 64 << 10;
pub const CHUNKS_PER_BLOCK: u64 = BLOCK_BYTES / CHUNK_BYTES;
/// Slots per set: enough ways that conflict misses are rare.
pub const WAYS: usize = 16;
/// Name of the cache file inside `<data_dir>/cache/`.
pub const FILE_NAME: &str = "blocks";
/// The 4 KiB-slot file of earlier versions (emptied at each start, so
/// nothing in it is worth keeping): removed to give its space back.
const OLD_FILE_NAME: &str = "chunks";
/// The directory is read at start in pieces of this size.
const DIRECTORY_READ_BYTES: u64 = 1 << 20;

/// What identifies a cached block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BlockKey {
    pub volume_key: u64,
    pub seq: u64,
    pub block: u32,
}

impl BlockKey {
    /// The key of the block holding chunk `chunk` of segment `seq`; `None`
    /// if the block number does not fit (never for segments under 256 TiB).
    pub fn of_chunk(volume_key: u64, seq: u64, chunk: u64) -> Option<BlockKey> {
        Some(BlockKey {
            volume_key,
            seq,
            block: u32::try_from(chunk / CHUNKS_PER_BLOCK).ok()?,
        })
    }

    pub fn first_chunk(&self) -> u64 {
        u64::from(self.block) * CHUNKS_PER_BLOCK
    }

    fn hash(&self) -> u64 {
        let a = mix64(self.seq ^ self.volume_key.rotate_left(29));
        mix64(a ^ u64::from(self.block))
    }
}

/// Entries per bucket of the admission filter.
const SEEN_WAYS: usize = 4;
/// Fingerprints the admission filter keeps at least.
const MIN_SEEN_ENTRIES: u64 = 4096;

/// One set of `ways` slots; bit `w` of each mask is slot `w`.
struct Set {
    keys: [BlockKey; WAYS],
    /// The slot holds the data of `keys[w]`.
    valid: u16,
    /// The slot is reserved for `keys[w]`, its writes not yet done.
    writing: u16,
    referenced: u16,
    hand: u8,
    generations: [u32; WAYS],
}

impl Set {
    fn empty() -> Set {
        Set {
            keys: [BlockKey::default(); WAYS],
            valid: 0,
            writing: 0,
            referenced: 0,
            hand: 0,
            generations: [0; WAYS],
        }
    }
}

/// Where a lookup found a block, and the slot generation it saw.
#[derive(Debug, Clone, Copy)]
pub struct DiskHit {
    set: usize,
    way: usize,
    generation: u32,
}

/// Counters of the disk cache. `budget_bytes: 0` means disabled.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct DiskCacheStats {
    /// 4 KiB chunks served from the file (after verification).
    pub hits: u64,
    /// Chunk lookups not served: absent, reused while read, or failed
    /// verification.
    pub misses: u64,
    /// Blocks written, of data written on this host (after its upload) ...
    pub written_insertions: u64,
    /// ... and of data fetched from the store.
    pub fetched_insertions: u64,
    /// ... and of data fetched by hydration (free slots only).
    pub hydrated_insertions: u64,
    /// Hydrated blocks not written because their set had no free slot:
    /// hydration never evicts (the cache is as full as it may get).
    pub hydration_skips: u64,
    pub evictions: u64,
    pub used_bytes: u64,
    pub budget_bytes: u64,
    /// Blocks found in the file's directory at start.
    pub restored_blocks: u64,
    /// Blocks dropped because a chunk read back did not match its
    /// segment's CRC (then read from the store).
    pub verify_failures: u64,
    /// Failed `pread` / `pwrite` calls.
    pub io_errors: u64,
    /// Blocks not written because the writer was behind (reads and client
    /// writes never wait for the disk cache; uploads wait a little).
    pub skipped_writes: u64,
    /// Fetched blocks not written because it was their first fetch
    /// (second-fetch admission: a scan that reads data once writes nothing).
    pub not_admitted: u64,
    /// Blocks dropped because their segment holds no live data any more.
    pub forgotten_blocks: u64,
    /// The tier switched itself off after a write failed (a full disk).
    pub disabled_by_error: bool,
    /// RAM taken by the index (fixed at start).
    pub index_ram_bytes: u64,
}

/// Where the RAM index starts from.
enum Start {
    Restored(u64),
    Empty(String),
}

pub struct BlockCache {
    /// `None`: the tier is disabled (budget 0).
    file: Option<File>,
    path: PathBuf,
    geometry: CacheSuperblock,
    ways: usize,
    sets: Vec<Mutex<Set>>,
    budget_bytes: u64,
    /// Set when a write failed: the tier is off from then on.
    failed: AtomicBool,
    used_slots: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
    written_insertions: AtomicU64,
    fetched_insertions: AtomicU64,
    hydrated_insertions: AtomicU64,
    hydration_skips: AtomicU64,
    evictions: AtomicU64,
    restored_blocks: AtomicU64,
    verify_failures: AtomicU64,
    io_errors: AtomicU64,
    skipped_writes: AtomicU64,
    /// Second-fetch admission: a fingerprint per recently fetched block
    /// (hash-indexed, overwritten on collision).
    seen: Vec<AtomicU32>,
    not_admitted: AtomicU64,
    forgotten: AtomicU64,
}

impl BlockCache {
    /// Opens and locks the cache file in `dir`, sized for `budget_bytes`
    /// of blocks (the directory adds 0.05%), and loads what it holds from
    /// an earlier run if its geometry is the same; a budget below one
    /// block disables the tier.
    pub fn open(dir: &Path, budget_bytes: u64) -> Result<BlockCache, VolumeError> {
        let slots = budget_bytes / BLOCK_BYTES;
        let path = dir.join(FILE_NAME);
        if slots == 0 {
            let geometry = CacheSuperblock {
                block_bytes: BLOCK_BYTES as u32,
                slot_count: 0,
                ways: 1,
            };
            return Ok(BlockCache::with_geometry(
                None,
                path,
                geometry,
                budget_bytes,
            ));
        }
        let ways = slots.min(WAYS as u64);
        let geometry = CacheSuperblock {
            block_bytes: BLOCK_BYTES as u32,
            slot_count: slots / ways * ways,
            ways: ways as u32,
        };
        let io = |what: &str, source| VolumeError::Io {
            what: format!("disk cache: {what} {}", path.display()),
            source,
        };
        std::fs::create_dir_all(dir).map_err(|e| io("create directory for", e))?;
        // Not truncated on open: another server may hold it, and what it
        // holds is kept across restarts.
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| io("open", e))?;
        lock_exclusive(&file, &path)?;
        advise_random(&file);
        let _ = std::fs::remove_file(dir.join(OLD_FILE_NAME));
        let cache = BlockCache::with_geometry(None, path.clone(), geometry, budget_bytes);
        match cache.restore(&file) {
            Ok(Start::Restored(blocks)) => {
                tracing::info!(path = %path.display(), blocks, "disk cache: kept {} from the last run", size_text(blocks * BLOCK_BYTES));
            }
            Ok(Start::Empty(reason)) => {
                tracing::info!(path = %path.display(), "disk cache: starting empty ({reason})");
                file.set_len(0).map_err(|e| io("empty", e))?;
                file.set_len(geometry.file_bytes())
                    .map_err(|e| io("size", e))?;
                file.write_all_at(&geometry.encode(), 0)
                    .map_err(|e| io("write the superblock of", e))?;
            }
            Err(e) => return Err(io("read", e)),
        }
        Ok(BlockCache {
            file: Some(file),
            ..cache
        })
    }

    fn with_geometry(
        file: Option<File>,
        path: PathBuf,
        geometry: CacheSuperblock,
        budget_bytes: u64,
    ) -> BlockCache {
        let ways = geometry.ways as usize;
        assert!((1..=WAYS).contains(&ways));
        assert!(geometry.slot_count * BLOCK_BYTES <= budget_bytes);
        let set_count = (geometry.slot_count / geometry.ways as u64) as usize;
        BlockCache {
            file,
            path,
            geometry,
            ways,
            sets: (0..set_count).map(|_| Mutex::new(Set::empty())).collect(),
            budget_bytes,
            failed: AtomicBool::new(false),
            used_slots: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            written_insertions: AtomicU64::new(0),
            fetched_insertions: AtomicU64::new(0),
            hydrated_insertions: AtomicU64::new(0),
            hydration_skips: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            restored_blocks: AtomicU64::new(0),
            verify_failures: AtomicU64::new(0),
            io_errors: AtomicU64::new(0),
            skipped_writes: AtomicU64::new(0),
            // Two fingerprints per slot: 8 bytes of RAM per block; at
            // least 4096 (16 KiB), so a small cache's filter does not
            // forget first fetches to bucket overflow (64 blocks in 128
            // buckets of 4 overflowed one in ~50 runs of a test).
            seen: (0..(2 * geometry.slot_count).max(MIN_SEEN_ENTRIES)
                * u64::from(geometry.slot_count > 0))
                .map(|_| AtomicU32::new(0))
                .collect(),
            not_admitted: AtomicU64::new(0),
            forgotten: AtomicU64::new(0),
        }
    }

    /// Loads the directory of an earlier run into the index, if the file
    /// has this geometry; says why not otherwise.
    fn restore(&self, file: &File) -> io::Result<Start> {
        let len = file.metadata()?.len();
        if len < SUPERBLOCK_BYTES {
            return Ok(Start::Empty("new cache file".into()));
        }
        let mut sb = [0u8; SUPERBLOCK_BYTES as usize];
        file.read_exact_at(&mut sb, 0)?;
        let found = match CacheSuperblock::decode(&sb) {
            Ok(found) => found,
            Err(reason) => return Ok(Start::Empty(reason)),
        };
        if found != self.geometry {
            return Ok(Start::Empty(format!(
                "its size changed from {} to {}",
                size_text(found.slot_count * BLOCK_BYTES),
                size_text(self.geometry.slot_count * BLOCK_BYTES)
            )));
        }
        if len < found.file_bytes() {
            return Ok(Start::Empty(format!("file truncated to {len} bytes")));
        }
        let mut restored = 0;
        let mut buf = vec![0u8; DIRECTORY_READ_BYTES as usize];
        let per_read = DIRECTORY_READ_BYTES / ENTRY_BYTES;
        let mut slot = 0u64;
        while slot < found.slot_count {
            let n = per_read.min(found.slot_count - slot);
            let bytes = &mut buf[..(n * ENTRY_BYTES) as usize];
            file.read_exact_at(bytes, found.entry_offset(slot))?;
            for (i, raw) in bytes.chunks_exact(ENTRY_BYTES as usize).enumerate() {
                if let Some(e) = CacheEntry::decode(raw, found.block_bytes) {
                    restored += u64::from(self.install(slot + i as u64, e));
                }
            }
            slot += n;
        }
        self.restored_blocks.store(restored, Ordering::Relaxed);
        Ok(Start::Restored(restored))
    }

    /// Puts a restored entry into the index at its slot, if its key hashes
    /// to that slot's set and is not there already.
    fn install(&self, slot: u64, e: CacheEntry) -> bool {
        let key = BlockKey {
            volume_key: e.volume_key,
            seq: e.seq,
            block: e.block,
        };
        let (set, way) = (slot as usize / self.ways, slot as usize % self.ways);
        if !self.sets_of(&key).contains(&set) || self.find(&key, false).is_some() {
            return false;
        }
        let mut s = self.sets[set].lock();
        s.keys[way] = key;
        s.valid |= 1 << way;
        self.used_slots.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Whether a block just fetched from the store goes to disk: yes if it
    /// was fetched before (its fingerprint is in its bucket), else remember
    /// it. Races between threads only make the filter a little less exact.
    pub fn admit(&self, key: &BlockKey) -> bool {
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
        self.file.is_some() && !self.sets.is_empty() && !self.failed.load(Ordering::Relaxed)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The two sets `key` may live in (the same one twice when the hashes
    /// agree, or there is one set).
    fn sets_of(&self, key: &BlockKey) -> [usize; 2] {
        let n = self.sets.len() as u64;
        let h = key.hash();
        [(h % n) as usize, (mix64(h) % n) as usize]
    }

    /// Where `key` is valid (and, with `writing`, being written): its set
    /// and way.
    fn find(&self, key: &BlockKey, writing: bool) -> Option<(usize, usize)> {
        for set in self.sets_of(key) {
            let s = self.sets[set].lock();
            let mask = if writing {
                s.valid | s.writing
            } else {
                s.valid
            };
            if let Some(way) = (0..self.ways).find(|&w| mask & (1 << w) != 0 && s.keys[w] == *key) {
                return Some((set, way));
            }
        }
        None
    }

    fn slot(&self, set: usize, way: usize) -> u64 {
        (set * self.ways + way) as u64
    }

    /// Finds `key`'s slot and marks it referenced. Counts nothing: the
    /// caller counts hits per chunk once the bytes are verified.
    pub fn lookup(&self, key: &BlockKey) -> Option<DiskHit> {
        if !self.enabled() {
            return None;
        }
        for set in self.sets_of(key) {
            let mut s = self.sets[set].lock();
            let Some(way) = (0..self.ways).find(|&w| s.valid & (1 << w) != 0 && s.keys[w] == *key)
            else {
                continue;
            };
            s.referenced |= 1 << way;
            return Some(DiskHit {
                set,
                way,
                generation: s.generations[way],
            });
        }
        None
    }

    /// Whether `key` is cached or being written (read-ahead asks; not a use).
    pub fn contains(&self, key: &BlockKey) -> bool {
        if !self.enabled() {
            return false;
        }
        self.find(key, true).is_some()
    }

    /// Reads `buf.len()` bytes at `offset` of the block found by `lookup`.
    /// The bytes are untrusted until `still_holds` and the CRC check pass.
    pub fn read_at(&self, hit: &DiskHit, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        assert!(offset + buf.len() as u64 <= BLOCK_BYTES);
        let file = self
            .file
            .as_ref()
            .ok_or_else(|| io::Error::other("disabled"))?;
        let at = self.geometry.block_offset(self.slot(hit.set, hit.way)) + offset;
        file.read_exact_at(buf, at)
    }

    /// Asks the kernel to start reading block `key` into the page cache
    /// (`POSIX_FADV_WILLNEED`, no wait) if it is cached: the disk cache's
    /// read-ahead. Its slots are placed by hash, so the kernel's own
    /// read-ahead cannot know which slot holds a segment's next block.
    pub fn read_ahead(&self, key: &BlockKey) -> bool {
        let Some(file) = &self.file else { return false };
        if !self.enabled() {
            return false;
        }
        let Some((set, way)) = self.find(key, false) else {
            return false;
        };
        let slot = self.slot(set, way);
        let at = self.geometry.block_offset(slot);
        let (Ok(at), Ok(len)) = (i64::try_from(at), i64::try_from(BLOCK_BYTES)) else {
            return false;
        };
        // SAFETY: posix_fadvise only operates on the descriptor, which
        // `file` owns and keeps open for the call; no memory is passed.
        unsafe { libc::posix_fadvise(file.as_raw_fd(), at, len, libc::POSIX_FADV_WILLNEED) == 0 }
    }

    /// Whether the slot of `hit` was left alone while it was read.
    pub fn still_holds(&self, hit: &DiskHit, key: &BlockKey) -> bool {
        let s = self.sets[hit.set].lock();
        s.generations[hit.way] == hit.generation
            && s.valid & (1 << hit.way) != 0
            && s.keys[hit.way] == *key
    }

    pub fn count_hits(&self, chunks: u64) {
        self.hits.fetch_add(chunks, Ordering::Relaxed);
    }

    pub fn count_misses(&self, chunks: u64) {
        self.misses.fetch_add(chunks, Ordering::Relaxed);
    }

    pub fn count_io_error(&self) {
        self.io_errors.fetch_add(1, Ordering::Relaxed);
    }

    /// Drops a block whose bytes failed verification, in the index and in
    /// the file's directory (so the next start does not load it again).
    pub fn drop_corrupt(&self, hit: &DiskHit, key: &BlockKey) {
        self.verify_failures.fetch_add(1, Ordering::Relaxed);
        let mut s = self.sets[hit.set].lock();
        let bit = 1u16 << hit.way;
        if s.generations[hit.way] == hit.generation && s.valid & bit != 0 && s.keys[hit.way] == *key
        {
            self.free_slot(&mut s, hit.set, hit.way);
        }
    }

    /// Empties valid slot `way` of set `set` (locked as `s`), in the index
    /// and in the file's directory. Under the set's lock: a new owner of
    /// the slot writes its entry after taking it, never before this.
    fn free_slot(&self, s: &mut Set, set: usize, way: usize) {
        let bit = 1u16 << way;
        s.valid &= !bit;
        s.referenced &= !bit;
        s.generations[way] = s.generations[way].wrapping_add(1);
        self.used_slots.fetch_sub(1, Ordering::Relaxed);
        if let Some(file) = &self.file {
            let at = self.geometry.entry_offset(self.slot(set, way));
            let _ = file.write_all_at(&CacheEntry::EMPTY, at);
        }
    }

    /// Drops the blocks `0..blocks` of segment `seq` that are cached, in
    /// the index and in the file's directory: the segment holds no live
    /// data any more (a checkpoint listed it for deletion), so its slots
    /// are better spent on data that may be read. Without this, dead
    /// segments' blocks (compaction's victims, overwritten data) filled
    /// sets until CLOCK evicted live blocks: a warm randrw on MinIO over
    /// 1 GiB with a 4 GiB cache saw 1,864 evictions and 1,514 misses.
    /// Returns how many were cached.
    pub fn forget_segment(&self, volume_key: u64, seq: u64, blocks: u32) -> u64 {
        if !self.enabled() {
            return 0;
        }
        let mut forgotten = 0;
        for block in 0..blocks {
            let key = BlockKey {
                volume_key,
                seq,
                block,
            };
            // Both sets: a copy left behind would outlive its segment.
            for set in self.sets_of(&key) {
                let mut s = self.sets[set].lock();
                let ways = (0..self.ways).filter(|&w| s.valid & (1 << w) != 0 && s.keys[w] == key);
                for way in ways.collect::<Vec<_>>() {
                    self.free_slot(&mut s, set, way);
                    forgotten += 1;
                }
            }
        }
        self.forgotten.fetch_add(forgotten, Ordering::Relaxed);
        forgotten
    }

    /// Writes a block of data written on this host (its segment is in the
    /// store): blocking `pwrite`s, run by the writer thread.
    pub fn insert_written(&self, key: &BlockKey, data: &[u8]) {
        if self.insert(key, data, true) {
            self.written_insertions.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Writes a verified block fetched from the store.
    pub fn insert_fetched(&self, key: &BlockKey, data: &[u8]) {
        if self.insert(key, data, true) {
            self.fetched_insertions.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Writes a verified block fetched by hydration, into a free slot
    /// only: hydration fills the cache, it never evicts what clients read
    /// (a volume larger than the cache keeps what was used, not what
    /// hydration fetched last). A block with no free slot is counted.
    pub fn insert_hydrated(&self, key: &BlockKey, data: &[u8]) {
        if self.insert(key, data, false) {
            self.hydrated_insertions.fetch_add(1, Ordering::Relaxed);
        } else if self.enabled() && !self.contains(key) {
            self.hydration_skips.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Whether `key` would find a free slot in its set now (hydration asks
    /// before it fetches a block: a block with no room is not fetched,
    /// and counted as skipped).
    pub fn has_room_for(&self, key: &BlockKey) -> bool {
        if !self.enabled() {
            return false;
        }
        let room = self.sets_of(key).iter().any(|&set| {
            let s = self.sets[set].lock();
            ((s.valid | s.writing).count_ones() as usize) < self.ways
        });
        if room {
            return true;
        }
        self.hydration_skips.fetch_add(1, Ordering::Relaxed);
        false
    }

    /// Whether hydration could still add a block: some slot is free.
    pub fn has_free_slots(&self) -> bool {
        self.enabled() && self.used_slots.load(Ordering::Relaxed) < self.geometry.slot_count
    }

    /// Empties the slot's entry, writes the data, then the entry. Does
    /// nothing if the block is cached already, every slot of its set is
    /// being written, or (`evict` false) none is free. A failed write
    /// switches the tier off.
    fn insert(&self, key: &BlockKey, data: &[u8], evict: bool) -> bool {
        assert!(!data.is_empty() && data.len() as u64 <= BLOCK_BYTES);
        let Some(file) = &self.file else { return false };
        if !self.enabled() {
            return false;
        }
        let Some((set, way)) = self.reserve(key, evict) else {
            return false;
        };
        let slot = self.slot(set, way);
        let entry = CacheEntry {
            volume_key: key.volume_key,
            seq: key.seq,
            block: key.block,
            len: data.len() as u32,
        };
        let entry_at = self.geometry.entry_offset(slot);
        let written = file
            .write_all_at(&CacheEntry::EMPTY, entry_at)
            .and_then(|()| file.write_all_at(data, self.geometry.block_offset(slot)))
            .and_then(|()| file.write_all_at(&entry.encode(), entry_at));
        let mut s = self.sets[set].lock();
        let bit = 1u16 << way;
        // Reserved slots are never evicted or dropped, so it is still ours.
        assert!(s.writing & bit != 0 && s.keys[way] == *key);
        s.writing &= !bit;
        match written {
            Ok(()) => {
                s.valid |= bit;
                true
            }
            Err(e) => {
                drop(s);
                self.used_slots.fetch_sub(1, Ordering::Relaxed);
                self.io_errors.fetch_add(1, Ordering::Relaxed);
                if !self.failed.swap(true, Ordering::Relaxed) {
                    tracing::error!(path = %self.path.display(), error = %strata_store::ErrorText(&e), "disk cache write failed; the disk cache is off until the server restarts, reads go to the store (free space on that disk or give --disk-cache-size a smaller size)");
                }
                false
            }
        }
    }

    /// Picks a slot for `key` (a free one, else, if `evict`, a CLOCK
    /// victim) and marks it being written; `None` if `key` is there
    /// already or nothing is free.
    fn reserve(&self, key: &BlockKey, evict: bool) -> Option<(usize, usize)> {
        let [first, second] = self.sets_of(key);
        // Both sets locked, in index order (no deadlock), so two inserts
        // of one key cannot place it in both.
        let (lo, hi) = (first.min(second), first.max(second));
        let mut lo_guard = self.sets[lo].lock();
        let mut hi_guard = (hi != lo).then(|| self.sets[hi].lock());
        let (first_set, second_set): (&mut Set, Option<&mut Set>) = match hi_guard.as_deref_mut() {
            Some(h) if first == hi => (h, Some(&mut *lo_guard)),
            other => (&mut *lo_guard, other),
        };
        let taken = |s: &Set| s.valid | s.writing;
        let holds = |s: &Set| (0..self.ways).any(|w| taken(s) & (1 << w) != 0 && s.keys[w] == *key);
        if holds(first_set) || second_set.as_deref().is_some_and(holds) {
            return None;
        }
        // The emptier set; the first on a tie (and for eviction).
        let free_in = |s: &Set| self.ways - taken(s).count_ones() as usize;
        let emptier = second_set
            .as_deref()
            .is_some_and(|t| free_in(t) > free_in(first_set));
        let (set, s) = match second_set {
            Some(t) if emptier => (second, t),
            _ => (first, first_set),
        };
        let taken = s.valid | s.writing;
        let all: u16 = if self.ways == WAYS {
            u16::MAX
        } else {
            (1u16 << self.ways) - 1
        };
        let free = !taken & all;
        let way = if free != 0 {
            self.used_slots.fetch_add(1, Ordering::Relaxed);
            free.trailing_zeros() as usize
        } else if evict {
            let way = clock_victim(s, self.ways)?;
            self.evictions.fetch_add(1, Ordering::Relaxed);
            way
        } else {
            return None;
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
        let used_bytes = self.used_slots.load(Ordering::Relaxed) * BLOCK_BYTES;
        debug_assert!(used_bytes <= self.budget_bytes);
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        DiskCacheStats {
            hits: load(&self.hits),
            misses: load(&self.misses),
            written_insertions: load(&self.written_insertions),
            fetched_insertions: load(&self.fetched_insertions),
            hydrated_insertions: load(&self.hydrated_insertions),
            hydration_skips: load(&self.hydration_skips),
            evictions: load(&self.evictions),
            used_bytes,
            budget_bytes: self.budget_bytes,
            restored_blocks: load(&self.restored_blocks),
            verify_failures: load(&self.verify_failures),
            io_errors: load(&self.io_errors),
            skipped_writes: load(&self.skipped_writes),
            not_admitted: load(&self.not_admitted),
            forgotten_blocks: load(&self.forgotten),
            disabled_by_error: self.failed.load(Ordering::Relaxed),
            index_ram_bytes: self.index_ram_bytes(),
        }
    }

    /// Counts blocks not cached because the write queue was full.
    pub fn skip_writes(&self, blocks: u64) {
        self.skipped_writes.fetch_add(blocks, Ordering::Relaxed);
    }

    /// RAM the index takes (for the memory budget tests).
    pub fn index_ram_bytes(&self) -> u64 {
        (self.sets.len() * std::mem::size_of::<Mutex<Set>>()
            + self.seen.len() * std::mem::size_of::<AtomicU32>()) as u64
    }
}

/// `bytes` for a log line, in MiB.
fn size_text(bytes: u64) -> String {
    format!("{} MiB", bytes >> 20)
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

/// Slots are placed by hash, so a block's neighbours in the file are
/// unrelated: the kernel's read-ahead around each read only fills (and
/// zeroes, in holes) pages nobody reads (`page_cache_ra_*` was 5% of a warm
/// S3 randrw's profile; IOPS did not move measurably, 96-97k either way).
/// Sequential streams have strata's own read-ahead.
fn advise_random(file: &File) {
    // SAFETY: posix_fadvise only operates on the descriptor, which `file`
    // owns and keeps open for the duration of the call; no memory is passed.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
    if rc != 0 {
        tracing::debug!(
            error = rc,
            "disk cache: posix_fadvise(RANDOM) refused; kernel read-ahead stays on"
        );
    }
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

    const B: usize = BLOCK_BYTES as usize;

    fn key(block: u32) -> BlockKey {
        BlockKey {
            volume_key: 1,
            seq: 7,
            block,
        }
    }

    fn get(c: &BlockCache, k: &BlockKey) -> Option<Vec<u8>> {
        let hit = c.lookup(k)?;
        let mut bytes = vec![0u8; B];
        c.read_at(&hit, 0, &mut bytes).unwrap();
        c.still_holds(&hit, k).then_some(bytes)
    }

    #[test]
    fn stores_evicts_within_budget_and_locks_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let budget = 64 * BLOCK_BYTES + 100;
        let c = BlockCache::open(dir.path(), budget).unwrap();
        assert!(c.enabled());
        for i in 0..64u32 {
            c.insert_written(&key(i), &vec![i as u8; B]);
        }
        let kept = (0..64u32)
            .filter(|&i| get(&c, &key(i)).is_some_and(|b| b == vec![i as u8; B]))
            .count();
        assert!(kept > 32, "{kept}");
        for i in 64..300u32 {
            c.insert_fetched(&key(i), &vec![i as u8; B]);
            assert!(c.stats().used_bytes <= 64 * BLOCK_BYTES);
        }
        let s = c.stats();
        assert_eq!(s.written_insertions + s.fetched_insertions, 300, "{s:?}");
        assert!(s.evictions > 0 && s.used_bytes <= budget, "{s:?}");
        let err = BlockCache::open(dir.path(), budget).err().unwrap();
        assert!(matches!(err, VolumeError::Busy(_)), "{err}");
        drop(c);
        // 1 GiB of cache (a sparse file): its index takes under 1 MiB.
        let big = BlockCache::open(&dir.path().join("big"), 1 << 30).unwrap();
        assert!(
            big.index_ram_bytes() <= 1 << 20,
            "{}",
            big.index_ram_bytes()
        );
    }

    #[test]
    fn hydration_fills_the_cache_nearly_full_and_a_restart_finds_it_all() {
        let dir = tempfile::tempdir().unwrap();
        // 4,096 slots (256 sets); 90% of them offered, never evicting.
        let slots = 4096u32;
        let c = BlockCache::open(dir.path(), u64::from(slots) * BLOCK_BYTES).unwrap();
        let offered = slots * 9 / 10;
        let data = vec![5u8; B];
        for i in 0..offered {
            c.insert_hydrated(&key(i), &data);
        }
        let kept = (0..offered).filter(|&i| c.contains(&key(i))).count() as u32;
        // One set per key left 6% out at this load (measured: full sets).
        assert!(kept >= offered * 99 / 100, "{kept} of {offered}");
        drop(c);
        let c = BlockCache::open(dir.path(), u64::from(slots) * BLOCK_BYTES).unwrap();
        let found = (0..offered).filter(|&i| get(&c, &key(i)).is_some()).count() as u32;
        assert_eq!(
            found, kept,
            "blocks in either of their sets are found after a restart"
        );
        // And forgotten from either.
        assert_eq!(c.forget_segment(1, 7, offered), u64::from(kept));
        assert!((0..offered).all(|i| !c.contains(&key(i))));
    }

    #[test]
    fn a_dead_segments_blocks_are_forgotten_and_stay_so_after_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let budget = 256 * BLOCK_BYTES;
        let c = BlockCache::open(dir.path(), budget).unwrap();
        let other = |block| BlockKey {
            volume_key: 1,
            seq: 8,
            block,
        };
        for i in 0..40u32 {
            c.insert_written(&key(i), &vec![1; B]);
            c.insert_written(&other(i), &vec![2; B]);
        }
        let cached = |c: &BlockCache, k: &dyn Fn(u32) -> BlockKey| {
            (0..40).filter(|&i| c.lookup(&k(i)).is_some()).count() as u64
        };
        let (of_7, of_8) = (cached(&c, &key), cached(&c, &other));
        assert!(of_7 > 30 && of_8 > 30, "{of_7} {of_8}");
        let used = c.stats().used_bytes;
        assert_eq!(c.forget_segment(1, 7, 64), of_7);
        assert_eq!(cached(&c, &key), 0);
        assert_eq!(cached(&c, &other), of_8);
        let s = c.stats();
        assert_eq!(s.forgotten_blocks, of_7);
        assert_eq!(s.used_bytes, used - of_7 * BLOCK_BYTES);
        drop(c);
        let c = BlockCache::open(dir.path(), budget).unwrap();
        assert_eq!(c.stats().restored_blocks, of_8);
        assert_eq!(cached(&c, &key), 0);
        assert_eq!(cached(&c, &other), of_8);
        let one = (0..40).find(|&i| c.lookup(&other(i)).is_some()).unwrap();
        assert_eq!(get(&c, &other(one)).unwrap(), vec![2; B]);
    }

    #[test]
    fn what_was_cached_is_there_after_a_restart_unless_the_size_changed() {
        let dir = tempfile::tempdir().unwrap();
        let budget = 256 * BLOCK_BYTES;
        let c = BlockCache::open(dir.path(), budget).unwrap();
        for i in 0..100u32 {
            c.insert_written(&key(i), &vec![i as u8; B]);
        }
        let kept: Vec<u32> = (0..100).filter(|&i| c.lookup(&key(i)).is_some()).collect();
        drop(c);
        let c = BlockCache::open(dir.path(), budget).unwrap();
        assert_eq!(c.stats().restored_blocks, kept.len() as u64);
        for &i in &kept {
            assert_eq!(get(&c, &key(i)).unwrap(), vec![i as u8; B], "block {i}");
        }
        // A damaged entry is ignored; the rest stays.
        let slot = {
            let hit = c.lookup(&key(kept[0])).unwrap();
            c.slot(hit.set, hit.way)
        };
        let entry_at = c.geometry.entry_offset(slot);
        drop(c);
        let f = OpenOptions::new()
            .write(true)
            .open(dir.path().join(FILE_NAME))
            .unwrap();
        f.write_all_at(&[0xee], entry_at + 9).unwrap();
        let c = BlockCache::open(dir.path(), budget).unwrap();
        assert_eq!(c.stats().restored_blocks, kept.len() as u64 - 1);
        assert!(c.lookup(&key(kept[0])).is_none());
        drop(c);
        let c = BlockCache::open(dir.path(), 2 * budget).unwrap();
        assert_eq!(c.stats().restored_blocks, 0);
        assert!(c.lookup(&key(kept[1])).is_none());
    }

    #[test]
    fn a_zero_budget_disables_the_tier_visibly() {
        let dir = tempfile::tempdir().unwrap();
        let c = BlockCache::open(dir.path(), 0).unwrap();
        assert!(!c.enabled());
        c.insert_written(&key(1), &[1; 4096]);
        assert!(c.lookup(&key(1)).is_none());
        assert_eq!(c.stats().budget_bytes, 0);
        assert!(!dir.path().join(FILE_NAME).exists());
    }

    #[test]
    fn a_reused_slot_is_a_miss_and_corrupt_blocks_are_dropped_for_good() {
        let dir = tempfile::tempdir().unwrap();
        let c = BlockCache::open(dir.path(), BLOCK_BYTES).unwrap();
        c.insert_written(&key(1), &[1; 4096]);
        let hit = c.lookup(&key(1)).unwrap();
        c.insert_written(&key(2), &[2; 4096]);
        assert!(!c.still_holds(&hit, &key(1)));
        let hit = c.lookup(&key(2)).unwrap();
        c.drop_corrupt(&hit, &key(2));
        assert!(c.lookup(&key(2)).is_none());
        let s = c.stats();
        assert_eq!((s.verify_failures, s.used_bytes, s.evictions), (1, 0, 1));
        drop(c);
        let c = BlockCache::open(dir.path(), BLOCK_BYTES).unwrap();
        assert_eq!(c.stats().restored_blocks, 0, "dropped on disk too");
    }
}
