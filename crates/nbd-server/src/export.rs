//! What a connection knows about its export once negotiated: the device,
//! its size, the transmission flags we advertise, the block size limits we
//! enforce, and the per-connection options (structured replies, metadata
//! context).

use std::sync::Arc;

use nbd_proto::consts::*;

use crate::config::ServerConfig;
use crate::device::{BlockDevice, BlockSizes};

/// Largest minimum block size the specification allows.
const MAX_MINIMUM_BLOCK_BYTES: u32 = 64 * 1024;
/// Largest READ that fits one OFFSET_DATA chunk (length field minus offset).
const MAX_READ_CHUNK_BYTES: u32 = u32::MAX - OFFSET_DATA_PREFIX_BYTES as u32;

/// Size, flags and block sizes of a device, as INFO, GO and EXPORT_NAME
/// report them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ExportParams {
    pub size_bytes: u64,
    pub read_only: bool,
    pub transmission_flags: u16,
    pub block_sizes: BlockSizes,
}

impl ExportParams {
    pub(crate) fn of<D: BlockDevice>(device: &D, config: &ServerConfig) -> Self {
        let read_only = device.is_read_only();
        ExportParams {
            size_bytes: device.size_bytes(),
            read_only,
            transmission_flags: transmission_flags(read_only),
            block_sizes: effective_block_sizes(device.block_sizes(), config.max_request_bytes),
        }
    }
}

/// The flags we advertise: everything we implement, minus the write
/// features on a read-only export.
pub(crate) fn transmission_flags(read_only: bool) -> u16 {
    let common = FLAG_HAS_FLAGS | FLAG_SEND_FLUSH | FLAG_CAN_MULTI_CONN | FLAG_SEND_CACHE;
    if read_only {
        common | FLAG_READ_ONLY
    } else {
        common | FLAG_SEND_FUA | FLAG_SEND_TRIM | FLAG_SEND_WRITE_ZEROES | FLAG_SEND_FAST_ZERO
    }
}

/// The device's block sizes made valid per the specification and capped by
/// `max_request_bytes`: minimum a power of two <= 64 KiB, preferred a power
/// of two >= max(minimum, 512), maximum a multiple of the minimum.
pub(crate) fn effective_block_sizes(device: BlockSizes, max_request_bytes: u32) -> BlockSizes {
    let minimum_bytes = device
        .minimum_bytes
        .max(1)
        .checked_next_power_of_two()
        .unwrap_or(MAX_MINIMUM_BLOCK_BYTES)
        .min(MAX_MINIMUM_BLOCK_BYTES);
    let preferred_bytes = device
        .preferred_bytes
        .max(minimum_bytes)
        .max(512)
        .checked_next_power_of_two()
        .unwrap_or(1 << 31);
    let capped = device
        .maximum_bytes
        .min(max_request_bytes)
        .min(MAX_READ_CHUNK_BYTES);
    let maximum_bytes = (capped - capped % minimum_bytes).max(minimum_bytes);
    BlockSizes {
        minimum_bytes,
        preferred_bytes,
        maximum_bytes,
    }
}

/// A negotiated export, shared by the tasks of one connection.
pub(crate) struct Export<D> {
    pub name: String,
    pub device: Arc<D>,
    pub params: ExportParams,
    pub structured_replies: bool,
    /// Context id of `base:allocation` when negotiated for this export.
    pub base_allocation_id: Option<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sizes(minimum_bytes: u32, preferred_bytes: u32, maximum_bytes: u32) -> BlockSizes {
        BlockSizes {
            minimum_bytes,
            preferred_bytes,
            maximum_bytes,
        }
    }

    #[test]
    fn default_sizes_are_kept() {
        let device = BlockSizes::default();
        assert_eq!(effective_block_sizes(device, 32 << 20), device);
    }

    #[test]
    fn invalid_sizes_are_repaired() {
        assert_eq!(
            effective_block_sizes(sizes(0, 0, 0), 1 << 20),
            sizes(1, 512, 1)
        );
        assert_eq!(
            effective_block_sizes(sizes(3000, 100, 10_000), 1 << 20),
            sizes(4096, 4096, 8192)
        );
        assert_eq!(
            effective_block_sizes(sizes(1 << 20, 1, u32::MAX), u32::MAX),
            sizes(1 << 16, 1 << 16, u32::MAX - (1 << 16) + 1)
        );
        assert_eq!(
            effective_block_sizes(sizes(512, 4096, 1 << 30), 1000),
            sizes(512, 4096, 512)
        );
    }

    #[test]
    fn read_only_hides_write_features() {
        let flags = transmission_flags(true);
        assert_ne!(flags & FLAG_READ_ONLY, 0);
        assert_eq!(
            flags & (FLAG_SEND_FUA | FLAG_SEND_TRIM | FLAG_SEND_WRITE_ZEROES),
            0
        );
        let flags = transmission_flags(false);
        assert_eq!(flags & FLAG_READ_ONLY, 0);
        assert_ne!(flags & FLAG_SEND_FAST_ZERO, 0);
    }
}
