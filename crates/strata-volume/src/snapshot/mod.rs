//! Snapshots: names for checkpoints, kept with every segment their maps
//! point into, and served read-only. The safety argument is
//! `docs/design/snapshots.md`.
//!
//! Owns the rules that make history safe against garbage collection, one
//! file per thing; `volume/snapshot.rs` sequences them for one volume (it
//! holds the lock, the store and the ownership):
//!
//! - `snapshot_pins.rs`: the segments snapshots keep (GC neither moves
//!   their data nor deletes them), counted per segment;
//! - `export_name.rs`: `VOL@SNAP`, the name a snapshot is served under;
//! - `lineage.rs`: a clone's ancestors, and which of them owns a segment;
//! - `diff.rs`: what changed between two snapshots' maps;
//! - `changed_ranges.rs`: what changed since the newest snapshot, and
//!   the deltas from each snapshot to the next that diffs read;
//! - `snapshot_view.rs`: a snapshot's map over the volume's read path,
//!   read-only, needing no lease.
//!
//! A snapshot's checkpoint is kept because the manifest lists it (GC reads
//! the manifest before deleting a checkpoint); its segments because the
//! volume's pins list them (GC reads the pins before it picks, moves or
//! deletes). May not touch the journal.

mod changed_ranges;
mod diff;
mod export_name;
mod lineage;
mod snapshot_pins;
mod snapshot_view;

pub(crate) use changed_ranges::{changes_of, data_map, overlay, ChangedRanges};
pub use diff::{diff_maps, Change, ChangeKind};
pub use export_name::{split_export_name, ExportName};
pub use lineage::MAX_CLONE_DEPTH;
pub(crate) use lineage::{resolve_lineage, Lineage};
pub(crate) use snapshot_pins::SnapshotPins;
pub use snapshot_view::SnapshotView;
