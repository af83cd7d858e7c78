//! Where each byte of a volume lives: the extent map.
//!
//! A leaf: it knows byte ranges, segment numbers and offsets, nothing of
//! objects, files or tasks. The volume's write path changes it under the
//! volume lock; reads look it up under the same lock.

mod extent_map;

pub use extent_map::{ExtentMap, ExtentRecord, Target, MAX_EXTENT_BYTES};
