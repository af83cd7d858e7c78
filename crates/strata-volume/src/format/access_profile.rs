//! Access profiles: the volume ranges a clone of a snapshot read first (a
//! VM's first boot), in the order it read them, so later clones of the
//! same snapshot fetch them before their guest asks
//! (`volume/profile.rs` records and stores one; `volume/hydrate.rs`
//! prefetches it).
//!
//! ## Object layout (little endian), `<volume>/profiles/<checkpoint:016x>`
//!
//! Stored under the snapshot's volume, named by the snapshot's checkpoint
//! (names may be reused after a delete; checkpoints never are).
//!
//! ```text
//!   0  8  magic "STRATPRF"
//!   8  2  version (1)
//!  10  2  zero
//!  12  4  range_count (at most MAX_RANGES)
//!  16 16  uuid of the snapshot's volume
//!  32  8  the snapshot's checkpoint seq
//!  40  8  volume size in bytes at the snapshot (every range ends within it)
//!  48  8  how long the recording ran, ms
//!  56  4  CRC32C of the ranges
//!  60  4  CRC32C of bytes [0, 60)
//!  64     range_count x 16 bytes, in the order first read:
//!           0 8 volume offset
//!           8 4 length in bytes (1 ..= MAX_RANGE_BYTES)
//!          12 4 ms after the first read (never decreasing)
//! ```
//!
//! A profile is a hint: a reader that cannot verify one (checksums, the
//! volume, the snapshot, bounds) ignores it with one log line; it never
//! becomes an I/O error.

use super::bytes::{array16, le_u32, le_u64};

const MAGIC: &[u8; 8] = b"STRATPRF";
const VERSION: u16 = 1;
pub const HEADER_BYTES: usize = 64;
const RANGE_BYTES: usize = 16;
/// Ranges one profile holds at most (a 1 MiB object).
pub const MAX_RANGES: usize = 65_536 - 4;
/// Longest single range: reads are merged up to this.
pub const MAX_RANGE_BYTES: u64 = 32 << 20;
/// Largest object a reader accepts.
pub const MAX_PROFILE_BYTES: usize = HEADER_BYTES + MAX_RANGES * RANGE_BYTES;

/// One range read, `at_ms` after the first read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProfileRange {
    pub offset: u64,
    pub len: u64,
    pub at_ms: u32,
}

/// A decoded profile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessProfile {
    pub volume_uuid: [u8; 16],
    pub checkpoint_seq: u64,
    pub size_bytes: u64,
    pub recorded_ms: u64,
    pub ranges: Vec<ProfileRange>,
}

impl AccessProfile {
    /// Bytes the ranges cover (overlaps counted twice).
    pub fn bytes(&self) -> u64 {
        self.ranges.iter().map(|r| r.len).sum()
    }

    pub fn encode(&self) -> Vec<u8> {
        assert!(self.ranges.len() <= MAX_RANGES);
        let mut body = Vec::with_capacity(self.ranges.len() * RANGE_BYTES);
        for r in &self.ranges {
            assert!(r.len >= 1 && r.len <= MAX_RANGE_BYTES);
            body.extend_from_slice(&r.offset.to_le_bytes());
            body.extend_from_slice(&(r.len as u32).to_le_bytes());
            body.extend_from_slice(&r.at_ms.to_le_bytes());
        }
        let mut out = Vec::with_capacity(HEADER_BYTES + body.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&[0, 0]);
        out.extend_from_slice(&(self.ranges.len() as u32).to_le_bytes());
        out.extend_from_slice(&self.volume_uuid);
        out.extend_from_slice(&self.checkpoint_seq.to_le_bytes());
        out.extend_from_slice(&self.size_bytes.to_le_bytes());
        out.extend_from_slice(&self.recorded_ms.to_le_bytes());
        out.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
        let header_crc = crc32c::crc32c(&out);
        out.extend_from_slice(&header_crc.to_le_bytes());
        out.extend_from_slice(&body);
        out
    }

    /// Decodes and checks a profile object (what it says about itself;
    /// `check_for` compares it with the snapshot it should belong to).
    pub fn decode(data: &[u8]) -> Result<AccessProfile, String> {
        if data.len() < HEADER_BYTES {
            return Err(format!("{} bytes, shorter than the header", data.len()));
        }
        if data.len() > MAX_PROFILE_BYTES {
            return Err(format!(
                "{} bytes, over the {MAX_PROFILE_BYTES} a profile may have",
                data.len()
            ));
        }
        if &data[..8] != MAGIC {
            return Err("not an access profile (bad magic)".into());
        }
        if le_u32(&data[60..]) != crc32c::crc32c(&data[..60]) {
            return Err("header checksum mismatch".into());
        }
        let version = u16::from_le_bytes([data[8], data[9]]);
        if version != VERSION {
            return Err(format!("unsupported access profile version {version}"));
        }
        if data[10..12] != [0, 0] {
            return Err("reserved header bytes are not zero".into());
        }
        let count = le_u32(&data[12..]) as usize;
        if count > MAX_RANGES || data.len() != HEADER_BYTES + count * RANGE_BYTES {
            return Err(format!("{count} ranges do not fit {} bytes", data.len()));
        }
        let body = &data[HEADER_BYTES..];
        if le_u32(&data[56..]) != crc32c::crc32c(body) {
            return Err("ranges checksum mismatch".into());
        }
        let size_bytes = le_u64(&data[40..]);
        let mut ranges = Vec::with_capacity(count);
        let mut last_ms = 0;
        for i in 0..count {
            let r = &body[i * RANGE_BYTES..(i + 1) * RANGE_BYTES];
            let range = ProfileRange {
                offset: le_u64(&r[0..]),
                len: u64::from(le_u32(&r[8..])),
                at_ms: le_u32(&r[12..]),
            };
            let end = range.offset.checked_add(range.len);
            if range.len == 0 || range.len > MAX_RANGE_BYTES || end.is_none_or(|e| e > size_bytes) {
                return Err(format!(
                    "range {i} ({}+{}) outside the volume",
                    range.offset, range.len
                ));
            }
            if range.at_ms < last_ms {
                return Err(format!("range {i} is out of order"));
            }
            last_ms = range.at_ms;
            ranges.push(range);
        }
        Ok(AccessProfile {
            volume_uuid: array16(&data[16..]),
            checkpoint_seq: le_u64(&data[32..]),
            size_bytes,
            recorded_ms: le_u64(&data[48..]),
            ranges,
        })
    }

    /// Whether this profile is of snapshot `checkpoint_seq` of volume
    /// `uuid` (an object left by a deleted volume of the same name is not).
    pub fn check_for(&self, uuid: &[u8; 16], checkpoint_seq: u64) -> Result<(), String> {
        if &self.volume_uuid != uuid || self.checkpoint_seq != checkpoint_seq {
            return Err("made for another volume or snapshot".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn sample() -> AccessProfile {
        AccessProfile {
            volume_uuid: [7; 16],
            checkpoint_seq: 42,
            size_bytes: 1 << 30,
            recorded_ms: 60_000,
            ranges: vec![
                ProfileRange {
                    offset: 0,
                    len: 4096,
                    at_ms: 0,
                },
                ProfileRange {
                    offset: 1 << 20,
                    len: 1 << 20,
                    at_ms: 5,
                },
            ],
        }
    }

    #[test]
    fn round_trip_and_every_damage_is_refused() {
        let p = sample();
        let bytes = p.encode();
        assert_eq!(bytes.len(), HEADER_BYTES + 2 * RANGE_BYTES);
        assert_eq!(AccessProfile::decode(&bytes).unwrap(), p);
        assert!(p.check_for(&[7; 16], 42).is_ok());
        assert!(p.check_for(&[7; 16], 41).is_err());
        // Every single flipped byte is caught; every truncation too.
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x40;
            assert!(AccessProfile::decode(&b).is_err(), "byte {i}");
        }
        for n in 0..bytes.len() {
            assert!(AccessProfile::decode(&bytes[..n]).is_err(), "cut at {n}");
        }
        // Ranges past the volume, empty, or out of order, even when
        // checksummed.
        for bad in [
            ProfileRange {
                offset: (1 << 30) - 10,
                len: 4096,
                at_ms: 9,
            },
            ProfileRange {
                offset: 0,
                len: 0,
                at_ms: 9,
            },
            ProfileRange {
                offset: 0,
                len: 4096,
                at_ms: 1,
            },
            ProfileRange {
                offset: u64::MAX - 1,
                len: 4096,
                at_ms: 9,
            },
        ] {
            let mut q = sample();
            q.ranges.push(bad);
            let encoded = encode_unchecked(&q);
            assert!(AccessProfile::decode(&encoded).is_err(), "{bad:?}");
        }
    }

    /// `encode` without its asserts, for damage that checksums cover.
    fn encode_unchecked(p: &AccessProfile) -> Vec<u8> {
        let ok = AccessProfile {
            ranges: vec![],
            ..p.clone()
        };
        let mut out = ok.encode();
        let mut body = Vec::new();
        for r in &p.ranges {
            body.extend_from_slice(&r.offset.to_le_bytes());
            body.extend_from_slice(&(r.len as u32).to_le_bytes());
            body.extend_from_slice(&r.at_ms.to_le_bytes());
        }
        out[12..16].copy_from_slice(&(p.ranges.len() as u32).to_le_bytes());
        out[56..60].copy_from_slice(&crc32c::crc32c(&body).to_le_bytes());
        let crc = crc32c::crc32c(&out[..60]);
        out[60..64].copy_from_slice(&crc.to_le_bytes());
        out.extend_from_slice(&body);
        out
    }
}
