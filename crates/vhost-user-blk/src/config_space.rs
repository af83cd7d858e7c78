//! The virtio-blk configuration space a guest reads (virtio 1.2 §5.2.4),
//! and the request limits it announces.
//!
//! Byte layout (little-endian, offsets in bytes), as Linux and QEMU read
//! it; a frontend asks for a range of it with VHOST_USER_GET_CONFIG:
//!
//! | offset | field | here |
//! | --- | --- | --- |
//! | 0 | capacity (le64, 512-byte sectors) | the device's size |
//! | 8 | size_max (le32) | bytes of one buffer at most |
//! | 12 | seg_max (le32) | buffers of one request at most |
//! | 16 | geometry (cylinders le16, heads u8, sectors u8) | 0 (not offered) |
//! | 20 | blk_size (le32) | 512: logical block |
//! | 24 | physical_block_exp (u8) | 3: 4 KiB physical blocks |
//! | 25 | alignment_offset (u8) | 0 |
//! | 26 | min_io_size (le16, blocks) | 8 (4 KiB) |
//! | 28 | opt_io_size (le32, blocks) | 0 |
//! | 32 | writeback (u8) | 0 (CONFIG_WCE not offered) |
//! | 34 | num_queues (le16) | queues offered |
//! | 36 | max_discard_sectors (le32) | |
//! | 40 | max_discard_seg (le32) | |
//! | 44 | discard_sector_alignment (le32) | 8 (4 KiB) |
//! | 48 | max_write_zeroes_sectors (le32) | |
//! | 52 | max_write_zeroes_seg (le32) | |
//! | 56 | write_zeroes_may_unmap (u8) | 1 |
//! | 57..64 | unused, secure erase (not offered) | 0 |

/// Bytes of the configuration space served (through
/// write_zeroes_may_unmap, padded to the secure-erase fields).
pub const CONFIG_BYTES: usize = 64;

/// What one request may ask, announced in the configuration space and
/// enforced by the parser.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Data bytes of one read or write at most (seg_max × size_max fit
    /// in it, so a guest that follows the config never exceeds it).
    pub max_request_bytes: u32,
    /// Buffers of one request (seg_max).
    pub seg_max: u32,
    pub max_discard_sectors: u32,
    pub max_discard_ranges: u32,
    pub max_write_zeroes_sectors: u32,
    pub max_write_zeroes_ranges: u32,
}

impl Limits {
    /// Limits for a queue of `queue_size` descriptors and requests of at
    /// most `max_request_bytes` (at least 1 MiB).
    pub fn new(queue_size: u16, max_request_bytes: u32) -> Limits {
        // Two descriptors go to the header and the status (Linux's
        // virtio-blk counts seg_max without them).
        let seg_max = u32::from(queue_size).saturating_sub(2).clamp(1, 254);
        // 8 GiB of discard or zeroes per range: it only changes the map.
        let big_sectors = 1 << 24;
        Limits {
            max_request_bytes,
            seg_max,
            max_discard_sectors: big_sectors,
            max_discard_ranges: 16,
            max_write_zeroes_sectors: big_sectors,
            max_write_zeroes_ranges: 16,
        }
    }

    /// size_max: a buffer's bytes at most, so that seg_max buffers fit in
    /// max_request_bytes; whole 4 KiB pages.
    pub fn size_max(&self) -> u32 {
        let per = self.max_request_bytes / self.seg_max.max(1);
        (per / 4096 * 4096).max(4096)
    }
}

/// The configuration space of a device of `capacity_bytes` with
/// `num_queues` queues.
pub fn config_bytes(capacity_bytes: u64, num_queues: u16, limits: &Limits) -> [u8; CONFIG_BYTES] {
    let mut c = [0u8; CONFIG_BYTES];
    let mut put = |at: usize, bytes: &[u8]| c[at..at + bytes.len()].copy_from_slice(bytes);
    put(0, &(capacity_bytes / 512).to_le_bytes());
    put(8, &limits.size_max().to_le_bytes());
    put(12, &limits.seg_max.to_le_bytes());
    put(20, &512u32.to_le_bytes());
    put(24, &[3]);
    put(26, &8u16.to_le_bytes());
    put(34, &num_queues.to_le_bytes());
    put(36, &limits.max_discard_sectors.to_le_bytes());
    put(40, &limits.max_discard_ranges.to_le_bytes());
    put(44, &8u32.to_le_bytes());
    put(48, &limits.max_write_zeroes_sectors.to_le_bytes());
    put(52, &limits.max_write_zeroes_ranges.to_le_bytes());
    put(56, &[1]);
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_is_what_linux_reads() {
        let l = Limits::new(128, 32 << 20);
        let c = config_bytes(1 << 30, 2, &l);
        assert_eq!(u64::from_le_bytes(c[0..8].try_into().unwrap()), 2 << 20);
        assert_eq!(u32::from_le_bytes(c[12..16].try_into().unwrap()), 126);
        let size_max = u32::from_le_bytes(c[8..12].try_into().unwrap());
        assert!(u64::from(size_max) * 126 <= 32 << 20, "{size_max}");
        assert_eq!(size_max % 4096, 0);
        assert_eq!(u32::from_le_bytes(c[20..24].try_into().unwrap()), 512);
        assert_eq!(u16::from_le_bytes(c[34..36].try_into().unwrap()), 2);
        assert_eq!(c[56], 1);
    }
}
