//! The local disk cache file's layout: `<data-dir>/cache/blocks`.
//!
//! The file is a cache: what it says is a hint, every block read from it is
//! verified chunk by chunk against its segment's CRC table before a byte is
//! served (`read/disk_fill.rs`). These records only make the directory
//! survive restarts without naming the wrong block.
//!
//! ```text
//!  offset              size                 what
//!  0                   4 KiB                superblock (below)
//!  4096                slots x 32, rounded  the directory: one entry per slot
//!                      up to 4 KiB
//!  data_offset()       slots x block_bytes  block data, slot i at
//!                                           data_offset + i x block_bytes
//! ```
//!
//! Superblock (little endian):
//!
//! ```text
//!  0  magic "STRATCCH"      8
//!  8  version = 1           u32
//!  12 block_bytes           u32   (65536)
//!  16 slot_count            u64
//!  24 ways                  u32   slots per set of the index
//!  28 CRC32C of bytes 0..28 u32
//! ```
//!
//! Directory entry, 32 bytes (little endian):
//!
//! ```text
//!  0  volume_key  u64   first 8 bytes of the volume's uuid
//!  8  seq         u64   segment sequence number
//!  16 block       u32   block number in the segment's data area
//!  20 len         u32   bytes of the block held (1..=block_bytes; the
//!                       last block of a segment may be short)
//!  24 flags       u32   1 = valid; anything else = empty
//!  28 CRC32C of bytes 0..28
//! ```
//!
//! A block is written data first, then entry; a slot is emptied (entry
//! zeroed) before new data goes over it. No fsync: a power loss may lose
//! entries or leave torn data behind a valid entry; the chunk verification
//! catches the latter.

use super::bytes::{le_u32, le_u64};

pub const MAGIC: &[u8; 8] = b"STRATCCH";
pub const VERSION: u32 = 1;
pub const SUPERBLOCK_BYTES: u64 = 4096;
pub const ENTRY_BYTES: u64 = 32;
const FLAG_VALID: u32 = 1;
/// Largest block size a superblock may claim (keeps offsets in range).
pub const MAX_BLOCK_BYTES: u32 = 1 << 20;
/// Largest slot count a superblock may claim (256 TiB of 64 KiB blocks):
/// bounds what a damaged superblock can make us allocate.
pub const MAX_SLOTS: u64 = 1 << 32;

/// The file's geometry, as the superblock records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheSuperblock {
    pub block_bytes: u32,
    pub slot_count: u64,
    pub ways: u32,
}

impl CacheSuperblock {
    pub fn encode(&self) -> [u8; SUPERBLOCK_BYTES as usize] {
        let mut b = [0u8; SUPERBLOCK_BYTES as usize];
        b[..8].copy_from_slice(MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&self.block_bytes.to_le_bytes());
        b[16..24].copy_from_slice(&self.slot_count.to_le_bytes());
        b[24..28].copy_from_slice(&self.ways.to_le_bytes());
        let crc = crc32c::crc32c(&b[..28]);
        b[28..32].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// The superblock at the start of `b`, if it is one this version wrote.
    pub fn decode(b: &[u8]) -> Result<CacheSuperblock, String> {
        if b.len() < 32 {
            return Err(format!("superblock truncated ({} bytes)", b.len()));
        }
        if &b[..8] != MAGIC {
            return Err("not a strata cache file (bad magic)".into());
        }
        if le_u32(&b[28..32]) != crc32c::crc32c(&b[..28]) {
            return Err("superblock checksum mismatch".into());
        }
        let version = le_u32(&b[8..12]);
        if version != VERSION {
            return Err(format!("cache file version {version}, expected {VERSION}"));
        }
        let sb = CacheSuperblock {
            block_bytes: le_u32(&b[12..16]),
            slot_count: le_u64(&b[16..24]),
            ways: le_u32(&b[24..28]),
        };
        if sb.block_bytes == 0
            || !sb.block_bytes.is_multiple_of(4096)
            || sb.block_bytes > MAX_BLOCK_BYTES
        {
            return Err(format!("bad block size {}", sb.block_bytes));
        }
        if sb.slot_count == 0 || sb.slot_count > MAX_SLOTS {
            return Err(format!("bad slot count {}", sb.slot_count));
        }
        if sb.ways == 0 || sb.ways > 64 || !sb.slot_count.is_multiple_of(u64::from(sb.ways)) {
            return Err(format!("bad ways {} for {} slots", sb.ways, sb.slot_count));
        }
        Ok(sb)
    }

    /// Bytes of the directory, rounded up to 4 KiB.
    pub fn directory_bytes(&self) -> u64 {
        (self.slot_count * ENTRY_BYTES).div_ceil(4096) * 4096
    }

    /// Where block data starts.
    pub fn data_offset(&self) -> u64 {
        SUPERBLOCK_BYTES + self.directory_bytes()
    }

    /// Offset of slot `slot`'s directory entry.
    pub fn entry_offset(&self, slot: u64) -> u64 {
        assert!(slot < self.slot_count);
        SUPERBLOCK_BYTES + slot * ENTRY_BYTES
    }

    /// Offset of slot `slot`'s data.
    pub fn block_offset(&self, slot: u64) -> u64 {
        assert!(slot < self.slot_count);
        self.data_offset() + slot * u64::from(self.block_bytes)
    }

    /// Size of the whole file.
    pub fn file_bytes(&self) -> u64 {
        self.data_offset() + self.slot_count * u64::from(self.block_bytes)
    }
}

/// One directory entry: which block a slot holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct CacheEntry {
    pub volume_key: u64,
    pub seq: u64,
    pub block: u32,
    pub len: u32,
}

impl CacheEntry {
    pub fn encode(&self) -> [u8; ENTRY_BYTES as usize] {
        let mut b = [0u8; ENTRY_BYTES as usize];
        b[..8].copy_from_slice(&self.volume_key.to_le_bytes());
        b[8..16].copy_from_slice(&self.seq.to_le_bytes());
        b[16..20].copy_from_slice(&self.block.to_le_bytes());
        b[20..24].copy_from_slice(&self.len.to_le_bytes());
        b[24..28].copy_from_slice(&FLAG_VALID.to_le_bytes());
        let crc = crc32c::crc32c(&b[..28]);
        b[28..32].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// The empty entry (what a slot being reused is set to first).
    pub const EMPTY: [u8; ENTRY_BYTES as usize] = [0; ENTRY_BYTES as usize];

    /// The entry in `b` if it is a valid one with `1..=block_bytes` bytes;
    /// `None` for an empty, torn or damaged entry.
    pub fn decode(b: &[u8], block_bytes: u32) -> Option<CacheEntry> {
        let b = b.get(..ENTRY_BYTES as usize)?;
        if le_u32(&b[24..28]) != FLAG_VALID || le_u32(&b[28..32]) != crc32c::crc32c(&b[..28]) {
            return None;
        }
        let e = CacheEntry {
            volume_key: le_u64(&b[..8]),
            seq: le_u64(&b[8..16]),
            block: le_u32(&b[16..20]),
            len: le_u32(&b[20..24]),
        };
        (e.len >= 1 && e.len <= block_bytes).then_some(e)
    }
}

/// The key of a volume in the cache: the first 8 bytes of its uuid (random
/// per volume instance, so a volume deleted and created again under the
/// same name misses).
pub fn volume_key(uuid: &[u8; 16]) -> u64 {
    le_u64(uuid)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn superblock_and_entries_round_trip_and_reject_damage() {
        let sb = CacheSuperblock {
            block_bytes: 65536,
            slot_count: 160,
            ways: 16,
        };
        let b = sb.encode();
        assert_eq!(CacheSuperblock::decode(&b).unwrap(), sb);
        assert_eq!(sb.directory_bytes(), 8192);
        assert_eq!(sb.data_offset(), 12288);
        assert_eq!(sb.file_bytes(), 12288 + 160 * 65536);
        for i in 0..32 {
            let mut bad = b;
            bad[i] ^= 0x40;
            assert!(CacheSuperblock::decode(&bad).is_err(), "byte {i}");
        }
        let e = CacheEntry {
            volume_key: 7,
            seq: 9,
            block: 3,
            len: 4096,
        };
        let eb = e.encode();
        assert_eq!(CacheEntry::decode(&eb, 65536), Some(e));
        assert_eq!(CacheEntry::decode(&CacheEntry::EMPTY, 65536), None);
        assert_eq!(CacheEntry::decode(&eb, 2048), None, "longer than a block");
        for i in 0..32 {
            let mut bad = eb;
            bad[i] ^= 1;
            assert_eq!(CacheEntry::decode(&bad, 65536), None, "byte {i}");
        }
    }
}
