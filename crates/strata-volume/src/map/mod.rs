//! Where each byte of a volume lives: the extent map, and how many bytes
//! of each segment it still points at (`segment_usage.rs`).
//!
//! A leaf: it knows byte ranges, segment numbers and offsets, nothing of
//! objects, files or tasks. The volume's write path changes it under the
//! volume lock; reads look it up under the same lock.

mod extent_map;
mod segment_usage;

pub use extent_map::{Allocation, ExtentMap, ExtentRecord, Target, MAX_EXTENT_BYTES};
pub use segment_usage::SegmentUsage;
