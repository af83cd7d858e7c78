//! The strata volume engine.
//!
//! A volume is a log: writes go to a local journal (durable at once) and an
//! in-memory open segment; sealed segments become immutable objects in the
//! store; an extent map says where every byte lives; checkpoints of the map
//! and a small manifest let a volume open in well under a second. See
//! ARCHITECTURE.md at the top of the repository for the whole picture.
//!
//! Folders follow the data path; each module doc says what it owns and what
//! it may not touch. Dependencies point down this list, never up
//! (`scripts/check-layout` enforces it):
//!
//! ```text
//! engine/        the volumes of a store: open once, create, list, info, delete;
//!                snapshots by name (`engine/snapshots.rs`)
//! fsck/          checking what the store holds of a volume (reads only)
//! standby/       a volume another host holds, read from the store, followed
//! volume/        the `Volume` type; sequences the folders below for one volume
//! at_rest/       compression and encryption: settings, keys, segment encoding
//! gc/            garbage collection: victims, copies, deletions, orphans
//! recovery/      rebuilding a volume's state from store and journal
//! write/         journal + group commit, open segment, state, segment PUTs
//! snapshot/      snapshots: what they keep from GC, their names, read-only views
//! read/          the read path: RAM and disk tiers, fetches, read-ahead
//! ownership/     one writer per volume: local lock, lease, epoch, manifest writes
//! objects/       typed reads of a volume's objects; store error mapping
//! map/           the extent map
//! format/        byte layouts: encode, decode, verify; no I/O (fuzzed)
//! config.rs error.rs clock.rs backoff.rs fair_slots.rs   leaves
//! ```

mod at_rest;
mod backoff;
mod clock;
mod config;
mod crash_point;
mod engine;
mod error;
mod fair_slots;
pub mod format;
mod fsck;
mod gc;
mod map;
mod objects;
mod ownership;
mod qos;
mod read;
mod recovery;
mod snapshot;
mod standby;
mod volume;
mod write;

pub use at_rest::{generate_key_file, key_from_env, load_key_file, KEY_ENV};
pub use config::{
    auto_disk_cache_bytes, Durability, GcConfig, HydrateConfig, HydrateMode, StandbyPolicy,
    VolumeConfig, DEFAULT_LEASE_TTL_MS, DEFAULT_STANDBY_WAIT_MS, GC_GRACE_EMBEDDED_MS,
    GC_GRACE_REMOTE_MS, MIN_LEASE_TTL_MS,
};
pub use crash_point::{
    GC_CRASH_POINTS, READ_REWRITE_CRASH_POINT, SNAPSHOT_CRASH_POINTS, STAGED_CRASH_POINTS,
};
pub use engine::diffs::DiffSummary;
pub use engine::handover::{HandoverOutcome, HandoverReport};
pub use engine::images::{ImageSink, ImageSummary};
pub use engine::standby::{Export, Standby, TakeOutcome};
pub use engine::{Engine, EngineStats, VolumeInfo, MAX_VOLUME_BYTES};
pub use error::{JournalError, VolumeError};
pub use format::access_profile::{AccessProfile, ProfileRange};
pub use format::frame::Compression;
pub use format::key_wrap::Key;
pub use format::manifest::{
    DeltaRecord, GcPassRecord, Manifest, ParentRecord, RollbackRecord, SnapshotRecord,
};
pub use fsck::{
    AffectedRanges, Affects, ByteRange, Checked, FsckOptions, FsckProgress, FsckReport, Problem,
    ProblemKind, ProgressFn, Severity, SnapshotRanges, SpaceReport,
};
pub use gc::{GcPassReport, GcStats};
pub use map::SegmentUsage;
pub use ownership::{HostStats, LeaseState, LeaseStats, Successor};
pub use qos::{Limit, QosKind, QosLimits, QosStats, VolumeQos, QOS_KEYS};
pub use read::{
    CacheStats, DiskCacheStats, HydrationState, HydrationStats, ReadAheadStats, ReadPathStats,
    SharedCaches, StoreReadStats,
};
pub use snapshot::{
    split_export_name, Change, ChangeKind, ExportName, SnapshotView, MAX_CLONE_DEPTH,
};
pub use standby::StandbyView;
pub use volume::{Allocation, FlushSealStats, SnapshotStats, Volume, VolumeStats, WriteWaitStats};
pub use write::state::SpaceUsage;
