//! Standbys: a volume served on a host that does not hold it (the
//! destination of a live migration), read-only until it takes the volume.
//!
//! Owns the standby's view of the store (`standby_view.rs`): the holder's
//! stored segments, followed as they appear, read through the volume's read
//! path. Taking the volume over (asking the holder to hand over, then
//! opening it) is the engine's (`engine/standby.rs`). The design and why
//! reads from the store are fresh enough for QEMU: `docs/design/live-migration.md`.
//! May not touch the journal or write to the store.

mod standby_view;

pub use standby_view::StandbyView;
