//! Engine configuration: every budget and limit, with defaults, and where a
//! volume's local files live in the data directory.
//!
//! Depends only on `format/` (for layout minimums); every folder may use it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::format::frame::Compression;
use crate::format::journal::MIN_RING_BYTES;
use crate::format::key_wrap::Key;

const MIB: u64 = 1 << 20;

/// Largest volume accepted: 1 PiB. Also the bound segment headers are
/// checked against once a segment may predate a shrink.
pub const MAX_VOLUME_BYTES: u64 = 1 << 50;

/// A size a volume may have: a positive multiple of 512 bytes, at most
/// `MAX_VOLUME_BYTES`.
pub fn check_volume_size(size_bytes: u64) -> Result<(), String> {
    if size_bytes == 0 || !size_bytes.is_multiple_of(512) || size_bytes > MAX_VOLUME_BYTES {
        return Err(format!(
            "volume size must be a positive multiple of 512 bytes, at most 1 PiB (got {size_bytes})"
        ));
    }
    Ok(())
}

/// A lease not renewed for this long is free to take (default).
pub const DEFAULT_LEASE_TTL_MS: u64 = 30_000;
/// Shortest lease TTL accepted (tests use a few seconds).
pub const MIN_LEASE_TTL_MS: u64 = 1_000;
/// Written data not yet in the store, all volumes of a server together:
/// 16 volumes writing at once get 32 MiB each (two segments), one alone
/// its own `write_buffer_bytes`.
pub const DEFAULT_WRITE_BUFFER_TOTAL_BYTES: u64 = 512 * MIB;
/// Segment uploads in flight, all volumes of a server together: 8 volumes
/// at their own cap (4), or 32 volumes with one each.
pub const DEFAULT_PARALLEL_UPLOADS_TOTAL: usize = 32;
/// Read-ahead holds up to a few windows of GET buffers at once.
const MAX_READAHEAD_BYTES: u64 = 64 * MIB;

/// Budgets and limits of the engine. Memory use is bounded by these, not by
/// volume size (the extent map aside, which is O(extents)).
#[derive(Debug, Clone)]
pub struct VolumeConfig {
    /// Local state: journals live in `<data_dir>/journals`.
    pub data_dir: PathBuf,
    /// A segment is sealed when its entries reach this many journal bytes.
    pub segment_bytes: u64,
    /// ... or when it is this old and not empty.
    pub segment_max_age_ms: u64,
    /// Unsealed plus sealed-but-not-uploaded data, per volume; writers wait
    /// beyond it (back-pressure).
    pub write_buffer_bytes: u64,
    /// The same, all volumes of a server together (0: no server-wide
    /// limit); shared fairly (`write/host_budget.rs`).
    pub write_buffer_total_bytes: u64,
    /// Segment uploads in flight, all volumes together (0: no server-wide
    /// limit); shared fairly (`fair_slots.rs`).
    pub max_parallel_uploads_total: usize,
    /// Data GETs in flight, all volumes together (0: no server-wide limit);
    /// shared fairly (`fair_slots.rs`). The store's own request limit
    /// (`--max-store-requests`), so one volume's GETs never fill the
    /// store's queue ahead of another's.
    pub max_gets_total: usize,
    /// Size of each volume's journal ring.
    pub journal_bytes: u64,
    /// Released journal bytes, written since the last FLUSH, punched out
    /// of the ring before the next FLUSH rather than synced
    /// (`write/journal_disk.rs`); at most an eighth of the ring.
    pub journal_punch_min_bytes: u64,
    /// A FLUSH that finds at least this much written since the journal's
    /// last sync and not yet in the store (on the embedded store only)
    /// seals the open segment and waits for the uploads instead: each byte
    /// reaches the disk once, in its segment, not also in the ring
    /// (`volume/write.rs`). 0 never does.
    pub flush_seal_min_bytes: u64,
    /// How long such a FLUSH waits for those uploads before it syncs the
    /// bytes in the ring after all (an upload retrying a failing disk must
    /// not hold FLUSHes up: the ring has the bytes).
    pub flush_seal_wait_ms: u64,
    /// On the embedded store, a write of at least this many bytes to a
    /// volume that neither compresses nor encrypts goes straight into its
    /// segment's file, and the journal gets a pointer to it instead of the
    /// bytes (`write/staged_segment.rs`): one copy per byte. 0 never does.
    pub bulk_write_min_bytes: u64,
    /// RAM cache of segment data, shared by all volumes of a server.
    pub cache_bytes: u64,
    /// Local-disk cache of segment data, shared by all volumes of a server:
    /// one file, `<data_dir>/cache/chunks`, emptied at startup. 0 disables
    /// it. Its in-memory index costs about 7.3 MiB of RAM per GiB (index and admission filter).
    pub disk_cache_bytes: u64,
    /// Largest read-ahead window of a sequential reader (windows also stay
    /// within a quarter of `cache_bytes`). 0 disables read-ahead.
    pub readahead_max_bytes: u64,
    /// Uploads in flight per volume.
    pub max_parallel_uploads: usize,
    /// A checkpoint is written every this many segments.
    pub checkpoint_every_segments: u64,
    /// Largest single write the engine accepts.
    pub max_write_bytes: u64,
    /// A host that has not renewed its liveness for this long may have its
    /// volumes taken over by another server (`ownership/host_liveness.rs`);
    /// it renews every third of it.
    pub lease_ttl_ms: u64,
    /// The control socket a server answers on, advertised in its host
    /// record so another server on this machine can ask it to hand a
    /// volume over at once (`None`: requests come through the store).
    pub control_socket: Option<PathBuf>,
    /// When FLUSH (and FUA) return: journal on local disk, or the store.
    pub durability: Durability,
    /// Whether a volume another host holds is served as a standby, and
    /// what takes it over (`engine/standby.rs`).
    pub standby: StandbyPolicy,
    /// Longest a standby's write waits for the volume (its holder's
    /// handover), then fails.
    pub standby_wait_ms: u64,
    /// Garbage collection (`gc/`).
    pub gc: GcConfig,
    /// How volumes created through this engine compress their data (each
    /// volume keeps its own setting, changeable later).
    pub compression: Compression,
    /// The user's key (`at_rest/`): opens encrypted volumes, and volumes
    /// created while it is set are encrypted under it.
    pub key: Option<Arc<Key>>,
    /// Background hydration of volumes whose data is not local.
    pub hydrate: HydrateConfig,
    /// A client's small GET slower than the store's usual tail is sent
    /// again, the first answer wins (`read/hedge.rs`). Off for the engine
    /// (its tests count requests exactly); `strata serve` turns it on.
    pub hedge_reads: bool,
    /// Access profiles of clones (`volume/profile.rs`): record the first
    /// reads of a clone whose snapshot has none; prefetch a snapshot's
    /// profile when a clone of it opens. Off for the engine; `strata
    /// serve` turns both on.
    pub profile_record: bool,
    pub profile_prefetch: bool,
}

/// When a volume's stored data is fetched into the disk cache in the
/// background (`volume/hydrate.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HydrateMode {
    /// Every volume opened on a remote store with a disk cache.
    On,
    Off,
    /// Clones, and volumes this data directory did not write (no journal
    /// of theirs here when opened): the cold cases.
    Auto,
}

impl HydrateMode {
    pub fn as_str(self) -> &'static str {
        match self {
            HydrateMode::On => "on",
            HydrateMode::Off => "off",
            HydrateMode::Auto => "auto",
        }
    }
}

impl std::str::FromStr for HydrateMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "on" => Ok(HydrateMode::On),
            "off" => Ok(HydrateMode::Off),
            "auto" => Ok(HydrateMode::Auto),
            _ => Err(format!("hydrate mode must be on, off or auto (got {s:?})")),
        }
    }
}

/// Hydration settings; the defaults need no tuning.
#[derive(Debug, Clone, Copy)]
pub struct HydrateConfig {
    pub mode: HydrateMode,
    /// Server-wide bandwidth of hydration GETs, bytes per second; 0: no
    /// limit (hydration still takes at most 8 of the store's request
    /// slots, so clients' reads go first).
    pub rate_bytes_per_sec: u64,
}

/// Off for the engine: embedders and the engine's tests count store
/// requests exactly. `strata serve` asks for `auto`.
impl Default for HydrateConfig {
    fn default() -> Self {
        HydrateConfig {
            mode: HydrateMode::Off,
            rate_bytes_per_sec: 0,
        }
    }
}

/// Garbage collection settings. The defaults need no tuning: GC copies only
/// while the write buffer is at most half full, at a bounded rate.
#[derive(Debug, Clone)]
pub struct GcConfig {
    /// Run compaction and deletion in the background.
    pub enabled: bool,
    /// Segments with less than this share of live bytes are compacted.
    pub live_threshold_percent: u32,
    /// While stored bytes exceed live bytes by more than this (percent of
    /// live), fuller segments are compacted too, emptiest first.
    pub space_target_percent: u32,
    /// An unreferenced object is deleted this long after it became so.
    pub grace_ms: u64,
    /// How often the background task looks for work.
    pub interval_ms: u64,
    /// Copy bandwidth of compaction, bytes per second.
    pub rate_bytes_per_sec: u64,
    /// Rewrite the pieces of a fragmented large read contiguously (only
    /// while the write buffer is at most half full; `gc/read_rewrite.rs`).
    pub rewrite_fragmented_reads: bool,
}

/// The grace period on S3 stores: a GET may queue behind the store's
/// in-flight limit and a few retries.
pub const GC_GRACE_REMOTE_MS: u64 = 30_000;
/// The grace period on the embedded store: a read there is a `pread` on
/// the reader's own thread, which queues behind nothing, and a recycled
/// file read through an old descriptor fails its CRCs and is looked up
/// again like a deleted one. Shorter means deleted segments' files come
/// back to the writers sooner (strata-store `recycled_files.rs`).
pub const GC_GRACE_EMBEDDED_MS: u64 = 2_000;

impl Default for GcConfig {
    fn default() -> Self {
        GcConfig {
            enabled: true,
            live_threshold_percent: 60,
            space_target_percent: 140,
            // 30 s: the reads it protects are this process's own, between
            // a map lookup and the GET it sends (a GET already under way
            // completes, on S3 and on a local file alike); a read that
            // loses anyway finds the object gone and looks the map up
            // again (volume/read.rs). Longer only holds garbage longer
            // (docs/design/gc.md has the figures).
            grace_ms: GC_GRACE_REMOTE_MS,
            interval_ms: 2_000,
            rate_bytes_per_sec: 64 * MIB,
            rewrite_fragmented_reads: true,
        }
    }
}

/// Default longest wait of a standby's write for its volume.
pub const DEFAULT_STANDBY_WAIT_MS: u64 = 60_000;

/// What a client of a volume another live host holds gets (live migration:
/// the destination's QEMU connects before the switchover).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StandbyPolicy {
    /// A standby: reads from the store; the first write (or FLUSH, TRIM)
    /// asks the holder to hand over and waits for the volume.
    #[default]
    Auto,
    /// A standby whose writes wait for an explicit take (`strata volume
    /// handover` on this host, at QEMU's pre-switchover pause).
    Explicit,
    /// Refused, naming the holder.
    Off,
}

/// What a completed FLUSH guarantees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// Everything before the FLUSH is in the local journal (fdatasync): it
    /// survives a crash of the process or the host, not loss of the disk.
    #[default]
    Local,
    /// Everything before the FLUSH is in the object store: it survives loss
    /// of the host. Each FLUSH seals and uploads a (possibly small) segment.
    Remote,
}

impl VolumeConfig {
    pub fn new(data_dir: PathBuf) -> Self {
        VolumeConfig {
            data_dir,
            segment_bytes: 16 * MIB,
            segment_max_age_ms: 5_000,
            write_buffer_bytes: 128 * MIB,
            write_buffer_total_bytes: DEFAULT_WRITE_BUFFER_TOTAL_BYTES,
            max_parallel_uploads_total: DEFAULT_PARALLEL_UPLOADS_TOTAL,
            max_gets_total: strata_store::DEFAULT_MAX_IN_FLIGHT_REQUESTS,
            journal_bytes: 256 * MIB,
            journal_punch_min_bytes: 8 * MIB,
            flush_seal_min_bytes: 8 * MIB,
            bulk_write_min_bytes: 64 << 10,
            flush_seal_wait_ms: 2_000,
            cache_bytes: 256 * MIB,
            disk_cache_bytes: 0,
            readahead_max_bytes: 8 * MIB,
            max_parallel_uploads: 4,
            checkpoint_every_segments: 16,
            max_write_bytes: 32 * MIB,
            lease_ttl_ms: DEFAULT_LEASE_TTL_MS,
            control_socket: None,
            durability: Durability::Local,
            standby: StandbyPolicy::Auto,
            standby_wait_ms: DEFAULT_STANDBY_WAIT_MS,
            gc: GcConfig::default(),
            compression: Compression::Lz4,
            key: None,
            hydrate: HydrateConfig::default(),
            hedge_reads: false,
            profile_record: false,
            profile_prefetch: false,
        }
    }

    /// Checks that the budgets fit together (so no writer can wait forever).
    pub fn validate(&self) -> Result<(), String> {
        if self.segment_bytes < MIB || self.segment_bytes > 1024 * MIB {
            return Err(format!(
                "segment size must be between 1 MiB and 1 GiB (got {} bytes)",
                self.segment_bytes
            ));
        }
        let min_buffer = 2 * self.segment_bytes + self.max_write_bytes;
        if self.write_buffer_bytes < min_buffer {
            return Err(format!(
                "write buffer ({} bytes) must hold two segments plus one maximal write: at least {min_buffer} bytes",
                self.write_buffer_bytes
            ));
        }
        let min_journal = (self.write_buffer_bytes + 2 * self.max_write_bytes).max(MIN_RING_BYTES);
        if self.journal_bytes < min_journal {
            return Err(format!(
                "journal ({} bytes) must be at least the write buffer plus two maximal writes: {min_journal} bytes",
                self.journal_bytes
            ));
        }
        if !self.journal_bytes.is_multiple_of(4096) {
            return Err("journal size must be a multiple of 4 KiB".into());
        }
        if self.lease_ttl_ms < MIN_LEASE_TTL_MS {
            return Err(format!(
                "lease TTL must be at least {} ms (got {})",
                MIN_LEASE_TTL_MS, self.lease_ttl_ms
            ));
        }
        if self.max_parallel_uploads == 0 || self.checkpoint_every_segments == 0 {
            return Err("parallel uploads and checkpoint interval must be at least 1".into());
        }
        if self.disk_cache_bytes != 0 && self.disk_cache_bytes < MIB {
            return Err(format!(
                "the disk cache must be 0 (off) or at least 1 MiB (got {} bytes)",
                self.disk_cache_bytes
            ));
        }
        if !(1..=99).contains(&self.gc.live_threshold_percent) {
            return Err(format!(
                "GC live threshold must be between 1 and 99 percent (got {})",
                self.gc.live_threshold_percent
            ));
        }
        if self.gc.space_target_percent < 101 {
            return Err(format!(
                "GC space target must be above 100 percent of live bytes (got {})",
                self.gc.space_target_percent
            ));
        }
        if self.gc.rate_bytes_per_sec < MIB || self.gc.interval_ms == 0 {
            return Err(format!(
                "GC rate must be at least 1 MiB/s and its interval above 0 (got {} bytes/s, {} ms)",
                self.gc.rate_bytes_per_sec, self.gc.interval_ms
            ));
        }
        if self.readahead_max_bytes > MAX_READAHEAD_BYTES {
            return Err(format!(
                "read-ahead window must be at most {MAX_READAHEAD_BYTES} bytes (got {})",
                self.readahead_max_bytes
            ));
        }
        Ok(())
    }

    pub fn journal_dir(&self) -> PathBuf {
        self.data_dir.join("journals")
    }

    /// Where the disk cache file lives.
    pub fn cache_dir(&self) -> PathBuf {
        self.data_dir.join("cache")
    }

    /// The journal file of volume `name` (instance `uuid`).
    pub fn journal_path(&self, name: &str, uuid: &[u8; 16]) -> PathBuf {
        self.local_path(name, uuid, "journal")
    }

    /// The local lock file of volume `name` (instance `uuid`).
    pub fn lock_path(&self, name: &str, uuid: &[u8; 16]) -> PathBuf {
        self.local_path(name, uuid, "lock")
    }

    fn local_path(&self, name: &str, uuid: &[u8; 16], ext: &str) -> PathBuf {
        let hex: String = uuid.iter().map(|b| format!("{b:02x}")).collect();
        self.journal_dir().join(format!("{name}-{hex}.{ext}"))
    }
}

const GIB: u64 = 1 << 30;
/// `--disk-cache-size auto` for a remote store: this share of the free
/// space of the data directory's file system ...
const AUTO_DISK_CACHE_PERCENT: u64 = 10;
/// ... at least this much ...
const AUTO_DISK_CACHE_MIN_BYTES: u64 = GIB;
/// ... and at most this much.
const AUTO_DISK_CACHE_MAX_BYTES: u64 = 256 * GIB;

/// The disk cache size `auto` means for a remote store, for the data
/// directory `data_dir`: 10% of the free space of its file system (counting
/// the space the cache file already takes), in whole GiB, between 1 GiB and
/// 256 GiB. An existing cache keeps its size while it stays within twice
/// that share, so a restart does not empty the cache because free space
/// moved a little.
pub fn auto_disk_cache_bytes(data_dir: &Path) -> u64 {
    let cache_file = data_dir.join("cache").join("blocks");
    let existing = existing_cache_bytes(&cache_file);
    let cache_allocated = std::fs::metadata(&cache_file)
        .map(|m| std::os::unix::fs::MetadataExt::blocks(&m) * 512)
        .unwrap_or(0);
    let free = free_bytes(data_dir).unwrap_or(0) + cache_allocated;
    let share = free / 100 * AUTO_DISK_CACHE_PERCENT;
    if let Some(bytes) = existing {
        if (AUTO_DISK_CACHE_MIN_BYTES..=AUTO_DISK_CACHE_MAX_BYTES).contains(&bytes)
            && bytes <= 2 * share
        {
            return bytes;
        }
    }
    (share / GIB * GIB).clamp(AUTO_DISK_CACHE_MIN_BYTES, AUTO_DISK_CACHE_MAX_BYTES)
}

/// The size of the disk cache file at `path` as its superblock says, if it
/// has a valid one.
fn existing_cache_bytes(path: &Path) -> Option<u64> {
    use crate::format::cache_file::CacheSuperblock;
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(path).ok()?;
    let mut sb = [0u8; 64];
    f.read_exact_at(&mut sb, 0).ok()?;
    let sb = CacheSuperblock::decode(&sb).ok()?;
    Some(sb.slot_count * u64::from(sb.block_bytes))
}

/// Free bytes (for unprivileged users) of the file system holding `path`,
/// or of its nearest existing ancestor.
fn free_bytes(path: &Path) -> Option<u64> {
    let existing = path.ancestors().find(|p| p.exists())?;
    let c = std::ffi::CString::new(existing.as_os_str().as_encoded_bytes()).ok()?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: `c` is a valid NUL-terminated path and `st` points to
    // writable memory of the right type for the duration of the call.
    let rc = unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: statvfs returned 0, so it filled the struct.
    let st = unsafe { st.assume_init() };
    Some(st.f_bavail.saturating_mul(st.f_frsize))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_bound_volumes_as_config_does() {
        assert_eq!(
            MAX_VOLUME_BYTES,
            crate::format::snapshot_delta::MAX_VOLUME_BYTES
        );
    }

    #[test]
    fn auto_disk_cache_size_is_a_share_of_free_space_and_stable() {
        #![allow(clippy::unwrap_used)]
        let dir = tempfile::tempdir().unwrap();
        let data_dir = dir.path().join("not-yet-created");
        let auto = auto_disk_cache_bytes(&data_dir);
        assert!(
            (GIB..=256 * GIB).contains(&auto) && auto.is_multiple_of(GIB),
            "{auto}"
        );
        let free = free_bytes(&data_dir).unwrap();
        assert!(auto <= (free / 10).max(GIB), "{auto} of {free} free");
        // An existing cache of another valid size keeps it.
        let keep = auto.saturating_sub(GIB).max(GIB);
        let sb = crate::format::cache_file::CacheSuperblock {
            block_bytes: 65536,
            slot_count: keep / 65536,
            ways: 16,
        };
        std::fs::create_dir_all(data_dir.join("cache")).unwrap();
        std::fs::write(data_dir.join("cache").join("blocks"), sb.encode()).unwrap();
        assert_eq!(auto_disk_cache_bytes(&data_dir), keep);
    }

    #[test]
    fn defaults_validate_and_bad_combinations_do_not() {
        let c = VolumeConfig::new("/tmp".into());
        c.validate().unwrap();
        let mut bad = c.clone();
        bad.journal_bytes = bad.write_buffer_bytes;
        assert!(bad.validate().is_err());
        let mut bad = c.clone();
        bad.write_buffer_bytes = bad.segment_bytes;
        assert!(bad.validate().is_err());
        let mut bad = c.clone();
        bad.disk_cache_bytes = 4096;
        assert!(bad.validate().is_err());
        let mut bad = c.clone();
        bad.readahead_max_bytes = 1 << 30;
        assert!(bad.validate().is_err());
    }
}
