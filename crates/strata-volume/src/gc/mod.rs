//! Garbage collection: how space comes back after overwrites, TRIM and
//! WRITE_ZEROES, without deleting anything a reader, recovery or a later
//! holder still needs. The safety argument is `docs/design/gc.md`.
//!
//! Owns the decisions and the pure steps, one file per thing collected or
//! decided; `volume/gc.rs` sequences them for one volume (it holds the
//! lock, the store and the ownership):
//!
//! - `victims.rs`: which stored segments to compact (live share, space
//!   target, small segments), within a per-pass copy budget;
//! - `live_pieces.rs`: the pieces of a segment the map still points at,
//!   found from its entry table (no scan of the whole map);
//! - `piece_read.rs`: reading those pieces from the store, verified;
//! - `repoint.rs`: copies into the open segment, each only where the map
//!   still points exactly where the copy was read from;
//! - `read_rewrite.rs`: what a fragmented read found, rewritten in address
//!   order by the same rule (old volumes become contiguous again);
//! - `pending_deletions.rs`: what a checkpoint leaves unreferenced, recorded
//!   in the manifest, and deleted after the grace period;
//! - `orphans.rs`: objects nothing references, found by listing;
//! - `gc_stats.rs`: counters.
//!
//! May not touch the journal or the read caches.

mod gc_stats;
mod live_pieces;
mod orphans;
mod pending_deletions;
mod piece_read;
mod read_rewrite;
mod repoint;
mod victims;

pub(crate) use gc_stats::GcCounters;
pub use gc_stats::{GcPassReport, GcStats};
pub(crate) use live_pieces::{in_address_order, live_pieces, LivePiece};
pub(crate) use orphans::{find_orphans, OrphanView};
pub(crate) use pending_deletions::{
    add_pending, deletion_candidates, due_deletions, pending_keys, remove_deleted, Unreferenced,
};
pub(crate) use piece_read::read_live_data;
pub(crate) use read_rewrite::{is_fragmented, repoint_read, rewrite_cost_bytes, ReadPiece};
pub(crate) use repoint::repoint;
pub(crate) use victims::{pick_victims, VictimPolicy};
