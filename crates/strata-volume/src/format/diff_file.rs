//! The diff file of `strata volume export-diff` / `import-diff`: what
//! changed between two snapshots of a volume, as data and zero records.
//!
//! ## Byte layout (little endian)
//!
//! Header:
//! ```text
//!   0  8  magic "STRATDIF"
//!   8  2  version (1)
//!  10  2  zero
//!  12  4  header length H in bytes (at most 4096), CRC included
//!  16  8  volume size in bytes (of the newer snapshot)
//!  24 16  uuid of the volume it was exported from
//!  40  2  length F of the older snapshot's name, then F bytes
//!  ..  2  length T of the newer snapshot's name, then T bytes
//! H-4  4  CRC32C of bytes [0, H-4)
//! ```
//! Then records, in increasing offset order, not overlapping:
//! ```text
//!   0  1  kind: 1 data, 2 zeros, 255 end
//!   1  7  zero
//!   8  8  offset in bytes (end: the number of records before it)
//!  16  8  length in bytes (data: at most 4 MiB; end: data bytes in all)
//!  24  4  CRC32C of bytes [0, 24) and of the data that follows
//!  28  ..  data (kind 1 only: `length` bytes)
//! ```
//! A file ends with exactly one end record. Readers verify every CRC, the
//! order, the bounds and the end record's counts before applying anything.

use super::bytes::{le_u32, le_u64};

const MAGIC: &[u8; 8] = b"STRATDIF";
const VERSION: u16 = 1;
/// Fixed part of the header, before the names.
pub const HEADER_PREFIX_BYTES: usize = 16;
pub const MAX_HEADER_BYTES: usize = 4096;
pub const RECORD_HEADER_BYTES: usize = 28;
/// Largest data record.
pub const MAX_DATA_RECORD_BYTES: u64 = 4 << 20;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiffHeader {
    pub volume_size_bytes: u64,
    pub volume_uuid: [u8; 16],
    pub from_snapshot: String,
    pub to_snapshot: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordKind {
    Data,
    Zero,
    End,
}

impl RecordKind {
    fn code(self) -> u8 {
        match self {
            RecordKind::Data => 1,
            RecordKind::Zero => 2,
            RecordKind::End => 255,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordHeader {
    pub kind: RecordKind,
    pub offset: u64,
    pub length: u64,
    crc: u32,
}

impl DiffHeader {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(64);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&[0u8; 2]);
        b.extend_from_slice(&[0u8; 4]); // length, below
        b.extend_from_slice(&self.volume_size_bytes.to_le_bytes());
        b.extend_from_slice(&self.volume_uuid);
        for name in [&self.from_snapshot, &self.to_snapshot] {
            b.extend_from_slice(&(name.len() as u16).to_le_bytes());
            b.extend_from_slice(name.as_bytes());
        }
        let len = (b.len() + 4) as u32;
        b[12..16].copy_from_slice(&len.to_le_bytes());
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    /// The header length announced by its first 16 bytes (checked: the
    /// caller reads that many bytes, then calls `decode`).
    pub fn announced_len(prefix: &[u8]) -> Result<usize, String> {
        if prefix.len() < HEADER_PREFIX_BYTES || &prefix[0..8] != MAGIC {
            return Err("not a strata diff file (bad magic or truncated)".into());
        }
        let version = u16::from_le_bytes([prefix[8], prefix[9]]);
        if version != VERSION {
            return Err(format!(
                "diff file version {version}; this strata reads version {VERSION}"
            ));
        }
        let len = le_u32(&prefix[12..16]) as usize;
        if !(44..=MAX_HEADER_BYTES).contains(&len) {
            return Err(format!("diff file header length {len} is out of bounds"));
        }
        Ok(len)
    }

    pub fn decode(b: &[u8]) -> Result<DiffHeader, String> {
        let len = DiffHeader::announced_len(b)?;
        if b.len() != len {
            return Err("diff file header is truncated".into());
        }
        if crc32c::crc32c(&b[..len - 4]) != le_u32(&b[len - 4..]) {
            return Err("diff file header checksum mismatch".into());
        }
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&b[24..40]);
        let mut pos = 40;
        let mut names = Vec::new();
        for _ in 0..2 {
            if pos + 2 > len - 4 {
                return Err("diff file header is truncated".into());
            }
            let n = u16::from_le_bytes([b[pos], b[pos + 1]]) as usize;
            pos += 2;
            if pos + n > len - 4 {
                return Err("diff file header is truncated".into());
            }
            let name = std::str::from_utf8(&b[pos..pos + n])
                .map_err(|_| "diff file names a snapshot in invalid UTF-8".to_string())?;
            super::manifest::validate_snapshot_name(name)?;
            names.push(name.to_string());
            pos += n;
        }
        if pos != len - 4 {
            return Err("diff file header has trailing bytes".into());
        }
        let to_snapshot = names.pop().unwrap_or_default();
        let from_snapshot = names.pop().unwrap_or_default();
        Ok(DiffHeader {
            volume_size_bytes: le_u64(&b[16..24]),
            volume_uuid: uuid,
            from_snapshot,
            to_snapshot,
        })
    }
}

/// The 28 header bytes of a record whose data (kind `Data`) is `data`.
pub fn encode_record(kind: RecordKind, offset: u64, length: u64, data: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(RECORD_HEADER_BYTES);
    b.push(kind.code());
    b.extend_from_slice(&[0u8; 7]);
    b.extend_from_slice(&offset.to_le_bytes());
    b.extend_from_slice(&length.to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&b), data);
    b.extend_from_slice(&crc.to_le_bytes());
    b
}

impl RecordHeader {
    /// Decodes a record's header (its CRC is checked with its data by
    /// `verify`).
    pub fn decode(b: &[u8]) -> Result<RecordHeader, String> {
        if b.len() != RECORD_HEADER_BYTES {
            return Err("diff record is truncated".into());
        }
        let kind = match b[0] {
            1 => RecordKind::Data,
            2 => RecordKind::Zero,
            255 => RecordKind::End,
            k => return Err(format!("diff record of unknown kind {k}")),
        };
        if b[1..8] != [0u8; 7] {
            return Err("diff record has non-zero reserved bytes".into());
        }
        let h = RecordHeader {
            kind,
            offset: le_u64(&b[8..16]),
            length: le_u64(&b[16..24]),
            crc: le_u32(&b[24..28]),
        };
        if kind == RecordKind::Data && (h.length == 0 || h.length > MAX_DATA_RECORD_BYTES) {
            return Err(format!("diff data record of {} bytes", h.length));
        }
        Ok(h)
    }

    /// Whether the record's CRC matches its header bytes `raw` and `data`.
    pub fn verify(&self, raw: &[u8], data: &[u8]) -> bool {
        raw.len() == RECORD_HEADER_BYTES
            && crc32c::crc32c_append(crc32c::crc32c(&raw[..24]), data) == self.crc
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_and_records_round_trip_and_reject_damage() {
        let h = DiffHeader {
            volume_size_bytes: 1 << 30,
            volume_uuid: [7; 16],
            from_snapshot: "a".into(),
            to_snapshot: "b-2".into(),
        };
        let b = h.encode();
        assert_eq!(DiffHeader::announced_len(&b[..16]).unwrap(), b.len());
        assert_eq!(DiffHeader::decode(&b).unwrap(), h);
        for i in 0..b.len() {
            let mut c = b.clone();
            c[i] ^= 1;
            assert!(DiffHeader::decode(&c).is_err(), "byte {i}");
        }
        let data = vec![9u8; 100];
        let raw = encode_record(RecordKind::Data, 4096, 100, &data);
        let r = RecordHeader::decode(&raw).unwrap();
        assert_eq!((r.kind, r.offset, r.length), (RecordKind::Data, 4096, 100));
        assert!(r.verify(&raw, &data));
        let mut bad = data.clone();
        bad[3] ^= 1;
        assert!(!r.verify(&raw, &bad));
        let mut raw2 = raw.clone();
        raw2[9] ^= 1;
        let r2 = RecordHeader::decode(&raw2).unwrap();
        assert!(!r2.verify(&raw2, &data));
    }
}
