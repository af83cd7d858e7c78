//! The read path for stored data: every tier between a read miss and the
//! store.
//!
//! Owns the caches shared by all volumes of a server (`SharedCaches`:
//! verified 4 KiB chunks in RAM, the local-disk tier and its writer thread,
//! decoded segment indexes, the fetches in flight, read-ahead's bound and
//! the counters) and, per volume, the fetch of the stored pieces of a read
//! (`VolumeReader`). No byte reaches a reader or a cache before its CRC is
//! checked.
//!
//! It is handed *stored pieces* (segment, offset, length, destination): the
//! volume looks its map up and serves in-memory data itself. So this folder
//! never sees the extent map, the journal or the open segment, and writes
//! nothing to the store.
//!
//! ```text
//!  VolumeReader::read_pieces (volume_reader.rs)
//!    -> RAM (ram_cache.rs) -> disk cache (disk_fill.rs, block_cache.rs)
//!    -> fetch in flight (inflight.rs) -> ranged GET (segment_fetch.rs,
//!       coalesced by fetch_plan.rs) -> verified -> RAM, disk (disk_writer.rs)
//!  written data: segment uploaded -> disk (SharedCaches::insert_written)
//!  read-ahead: readahead.rs (streams, windows) + prefetch.rs (fetching)
//!  hydration: hydration.rs (a volume's stored blocks -> disk, in the
//!     background; what and when: volume/hydrate.rs)
//! ```

mod background;
mod background_cpu;
mod block_cache;
mod disk_fill;
mod disk_streams;
mod disk_writer;
mod fetch_plan;
mod hedge;
mod hydration;
mod hydration_limits;
mod inflight;
mod key_hasher;
mod prefetch;
mod prefetched_runs;
mod ram_cache;
mod readahead;
mod reader_activity;
mod rest_gate;
mod segment_fetch;
mod shared_caches;
mod volume_reader;

pub use block_cache::DiskCacheStats;
pub(crate) use block_cache::BLOCK_BYTES;
pub(crate) use disk_writer::OnDone;
pub(crate) use fetch_plan::{stored_pieces_in, StoredPiece};
pub(crate) use fetch_plan::{Coalescing, MAX_GET_BYTES};
pub(crate) use hydration::{hydrate_blocks, hydrate_segment, Gaps, Hydration};
pub use hydration::{HydrationState, HydrationStats};
pub(crate) use hydration_limits::MAX_HYDRATION_GETS;
pub(crate) use prefetch::{start_readahead, MAX_WINDOW_PIECES};
pub use ram_cache::CacheStats;
pub use readahead::ReadAheadStats;
pub use shared_caches::{ReadPathStats, SharedCaches, StoreReadStats};
pub(crate) use volume_reader::VolumeReader;
