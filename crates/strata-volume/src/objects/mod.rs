//! Typed reads of a volume's objects in the store, and the error mapping
//! every store access shares.
//!
//! Owns: turning an `object_store` error into a `VolumeError` that names the
//! store, the operation and the object (`store_error`); reading and
//! verifying the manifest, segment headers, checkpoints, snapshot
//! deltas and access profiles; listing
//! segments. Every byte read here is decoded by `format/` and rejected with
//! a clear error when it does not verify. Writes are not here: each has its
//! own conditions (segments `write/`, manifest and lease `ownership/`).
//! May not touch volume state, the journal or the caches.

mod checkpoints;
mod clone_markers;
mod manifests;
mod other_prefix;
mod profiles;
mod segments;
mod snapshot_deltas;
mod store_error;

pub(crate) use checkpoints::{read_checkpoint, read_checkpoint_recorded, read_snapshot_map};
pub(crate) use clone_markers::{list_clone_markers, read_clone_markers};
pub(crate) use manifests::{read_manifest, read_manifest_versioned};
pub(crate) use other_prefix::store_for_prefix;
pub(crate) use profiles::read_profile;
pub(crate) use segments::{
    fetch_fixed_header, fetch_segment_header, list_segments, list_segments_upto,
};
pub(crate) use snapshot_deltas::read_snapshot_delta;
pub(crate) use store_error::{is_condition_refused, is_not_found, read_versioned, store_error};
