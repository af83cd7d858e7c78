//! Compression and encryption of what a volume stores (design:
//! `docs/design/data-at-rest.md`).
//!
//! Owns a volume's settings at rest (`settings.rs`: its compression,
//! changeable, and its data key, unwrapped at open with the user's key),
//! the user's key itself (`key_file.rs`: a 0600 file or `STRATA_KEY`,
//! never an argument), and turning a sealed segment into the object that
//! is stored (`segment_encoding.rs`). Byte layouts are in `format/`
//! (`frame.rs`, `segment_frames.rs`, `key_wrap.rs`); the read path decodes
//! frames through `SegmentIndex::decode_run`.

mod key_file;
mod random;
mod segment_encoding;
mod settings;

pub use key_file::{generate_key_file, key_from_env, load_key_file, KEY_ENV};
pub(crate) use random::random_array;
pub(crate) use segment_encoding::encode_sealed;
pub(crate) use settings::{compression_of, data_key_of, new_volume_at_rest, wrap_record, AtRest};
