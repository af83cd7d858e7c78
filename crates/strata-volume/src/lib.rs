//! The strata volume engine.
//!
//! A volume is a log: writes go to a local journal (durable at once) and an
//! in-memory open segment; sealed segments become immutable objects in the
//! store; an extent map says where every byte lives; checkpoints of the map
//! and a small manifest let a volume open in well under a second. See
//! ARCHITECTURE.md at the top of the repository for the whole picture.
//!
//! One file per concept: `journal` (local log + group commit), `segment`
//! (object format), `extent_map`, `checkpoint`, `manifest`, `cache` (RAM
//! tier), `disk_cache` (local-disk tier), `volume` (write and read paths),
//! `read_path` (fetching stored data), `inflight` (one fetch per chunk),
//! `readahead` (sequential readers),
//! `uploader` (uploads, checkpoints, close), `recovery` (open), `engine`
//! (the set of volumes and their administration).

mod cache;
mod checkpoint;
mod config;
mod disk_cache;
mod disk_writer;
mod engine;
mod envelope;
mod error;
mod extent_map;
mod inflight;
mod journal;
mod lease;
mod manifest;
mod read_path;
mod readahead;
mod recovery;
mod segment;
mod uploader;
mod volume;

pub use cache::CacheStats;
pub use config::{Durability, VolumeConfig};
pub use disk_cache::DiskCacheStats;
pub use engine::{Engine, EngineStats, VolumeInfo, MAX_VOLUME_BYTES};
pub use error::VolumeError;
pub use manifest::Manifest;
pub use read_path::{ReadPathStats, SharedCaches, StoreReadStats};
pub use readahead::ReadAheadStats;
pub use volume::{Allocation, Volume, VolumeStats};
