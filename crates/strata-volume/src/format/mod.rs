//! Byte layouts of everything strata persists: segment objects,
//! checkpoints, the manifest, lease and host record (JSON in a checked envelope), and the
//! journal's superblock and records.
//!
//! Encoding, decoding and verification only: no I/O, no tokio, no store, no
//! clock. Every decoder takes untrusted bytes and returns an error (never
//! panics) for anything it cannot verify; each is fuzzed (`fuzzing.rs`,
//! `crates/strata-volume/fuzz`, and the stable `random_inputs` test). Each
//! file documents its layout at the top.

pub mod access_profile;
pub(crate) mod bytes;
pub mod cache_file;
pub mod checkpoint;
pub mod chunk_crcs;
pub mod clone_marker;
pub mod diff_file;
pub mod envelope;
pub mod frame;
#[doc(hidden)]
pub mod fuzzing;
pub mod host_record;
pub mod journal;
pub mod key_wrap;
pub mod lease;
pub mod manifest;
pub mod sealed_object;
pub mod segment;
pub mod segment_frames;
pub mod snapshot_delta;

#[cfg(test)]
mod random_tests;
