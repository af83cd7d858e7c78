//! Checkpoints: the extent map written out, so recovery need not replay the
//! whole log.
//!
//! A checkpoint with seq S is the extent map after applying segments 1..=S,
//! exactly: it is taken at the moment segment S is sealed (the open segment
//! is empty then) and stored only after every segment up to S is in the
//! store. Recovery loads it and replays segments S+1.. and the journal.
//!
//! ## Object layout (little endian)
//!
//! ```text
//!   0  8  magic "STRATCKP"
//!   8  2  version (2; version 1 has no usage table)
//!  10  2  zero
//!  12  4  usage_count (version 2; zero in version 1)
//!  16  8  seq
//!  24 16  volume uuid
//!  40 16  journal id   }
//!  56  8  first_jseq   } journal span of segment `seq`, so a volume with
//!  64  8  last_jseq    } no later segment knows where its journal resumes
//!  72  8  end_lpos     }
//!  80  8  volume size in bytes
//!  88  8  extent_count
//!  96  4  CRC32C of the extent records
//! 100  4  CRC32C of bytes [0, 100)
//! 104     extent_count x 24 bytes, sorted, non-overlapping:
//!           0 8 volume offset  8 8 segment seq (u64::MAX: zeros)
//!          16 4 data offset   20 4 length
//!         usage table (version 2): usage_count x 16 bytes, by seq:
//!           0 8 segment seq    8 8 live bytes (what the map points at)
//! ```
//!
//! The CRC at 96 covers extents and usage table. The usage table is
//! redundant on purpose: recovery recomputes live bytes from the extents
//! and compares (`objects/checkpoints.rs`); a mismatch is a bug, logged,
//! and the recomputation wins. Version 1 checkpoints still decode.

use super::bytes::{array16, le_u32, le_u64};
use super::segment::{JournalSpan, JOURNAL_SPAN_BYTES};
use crate::map::{ExtentMap, ExtentRecord, Target, MAX_EXTENT_BYTES};

const MAGIC: &[u8; 8] = b"STRATCKP";
const VERSION: u16 = 2;
const HEADER_BYTES: usize = 104;
const RECORD_BYTES: usize = 24;
const USAGE_BYTES: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointInfo {
    pub seq: u64,
    pub volume_uuid: [u8; 16],
    pub span: JournalSpan,
    pub volume_size_bytes: u64,
}

/// Serialises `map` as checkpoint `info.seq`.
pub fn encode(info: &CheckpointInfo, map: &ExtentMap) -> Vec<u8> {
    let mut b = Vec::with_capacity(HEADER_BYTES + RECORD_BYTES * map.len());
    b.extend_from_slice(MAGIC);
    let usage = map.usage();
    b.extend_from_slice(&VERSION.to_le_bytes());
    b.extend_from_slice(&[0u8; 2]);
    b.extend_from_slice(&(usage.len() as u32).to_le_bytes());
    b.extend_from_slice(&info.seq.to_le_bytes());
    b.extend_from_slice(&info.volume_uuid);
    info.span.encode_into(&mut b);
    b.extend_from_slice(&info.volume_size_bytes.to_le_bytes());
    b.extend_from_slice(&(map.len() as u64).to_le_bytes());
    b.extend_from_slice(&[0u8; 8]);
    for e in map.iter() {
        let (seq, offset) = match e.target {
            Target::Data { seq, offset } => (seq, offset as u32),
            Target::Zero => (u64::MAX, 0),
        };
        b.extend_from_slice(&e.start.to_le_bytes());
        b.extend_from_slice(&seq.to_le_bytes());
        b.extend_from_slice(&offset.to_le_bytes());
        b.extend_from_slice(&(e.len as u32).to_le_bytes());
    }
    for (seq, live) in usage.iter() {
        b.extend_from_slice(&seq.to_le_bytes());
        b.extend_from_slice(&live.to_le_bytes());
    }
    let body_crc = crc32c::crc32c(&b[HEADER_BYTES..]);
    b[96..100].copy_from_slice(&body_crc.to_le_bytes());
    let header_crc = crc32c::crc32c(&b[0..100]);
    b[100..104].copy_from_slice(&header_crc.to_le_bytes());
    b
}

/// Verifies and loads a checkpoint.
pub fn decode(b: &[u8]) -> Result<(CheckpointInfo, ExtentMap), String> {
    decode_with_usage(b).map(|(info, map, _)| (info, map))
}

/// Live bytes per segment as a checkpoint recorded them: `(seq, bytes)`.
pub type UsageTable = Vec<(u64, u64)>;

/// Verifies and loads a checkpoint, with the live bytes per segment it
/// recorded (`None` for version 1), for comparison with the map's.
pub fn decode_with_usage(
    b: &[u8],
) -> Result<(CheckpointInfo, ExtentMap, Option<UsageTable>), String> {
    if b.len() < HEADER_BYTES || &b[0..8] != MAGIC {
        return Err("not a strata checkpoint (bad magic or truncated)".into());
    }
    let version = u16::from_le_bytes([b[8], b[9]]);
    if version != 1 && version != VERSION {
        return Err(format!(
            "unsupported checkpoint version {version} (this strata reads 1 and {VERSION}; a newer strata wrote it)"
        ));
    }
    if crc32c::crc32c(&b[0..100]) != le_u32(&b[100..104]) {
        return Err("checkpoint header checksum mismatch".into());
    }
    let info = CheckpointInfo {
        seq: le_u64(&b[16..24]),
        volume_uuid: array16(&b[24..40]),
        span: JournalSpan::decode(&b[40..40 + JOURNAL_SPAN_BYTES]),
        volume_size_bytes: le_u64(&b[80..88]),
    };
    let count = le_u64(&b[88..96]);
    let usage_count = if version == 1 {
        0
    } else {
        u64::from(le_u32(&b[12..16]))
    };
    let all = &b[HEADER_BYTES..];
    let extent_bytes = count.checked_mul(RECORD_BYTES as u64);
    let expect = extent_bytes.and_then(|e| e.checked_add(usage_count * USAGE_BYTES as u64));
    if Some(all.len() as u64) != expect || usage_count > count {
        return Err(format!(
            "checkpoint holds {} bytes of tables, header says {count} extents and {usage_count} segments",
            all.len()
        ));
    }
    if crc32c::crc32c(all) != le_u32(&b[96..100]) {
        return Err("checkpoint extents checksum mismatch".into());
    }
    let (body, usage_table) = all.split_at(count as usize * RECORD_BYTES);
    let mut map = ExtentMap::new();
    let mut prev_end = 0u64;
    for r in body.chunks_exact(RECORD_BYTES) {
        let rec = decode_record(r);
        let end = rec.start.checked_add(rec.len).ok_or("extent overflows")?;
        if rec.start < prev_end
            || rec.len == 0
            || rec.len > MAX_EXTENT_BYTES
            || end > info.volume_size_bytes
        {
            return Err(format!("checkpoint extent out of order or bounds: {rec:?}"));
        }
        if let Target::Data { seq, offset } = rec.target {
            if seq > info.seq {
                return Err(format!(
                    "checkpoint {} refers to later segment {seq}",
                    info.seq
                ));
            }
            // A segment's data is addressed by 32-bit offsets: the map
            // cannot hold an extent that ends beyond them.
            if offset + rec.len > u64::from(u32::MAX) {
                return Err(format!(
                    "checkpoint extent past any segment's data: {rec:?}"
                ));
            }
        }
        prev_end = end;
        map.set(rec.start, rec.len, Some(rec.target));
    }
    let usage = (version >= 2)
        .then(|| decode_usage(usage_table))
        .transpose()?;
    Ok((info, map, usage))
}

/// The usage table: `(seq, live bytes)`, seqs strictly increasing, live
/// bytes above zero.
fn decode_usage(table: &[u8]) -> Result<UsageTable, String> {
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(table.len() / USAGE_BYTES);
    for r in table.chunks_exact(USAGE_BYTES) {
        let (seq, live) = (le_u64(&r[0..8]), le_u64(&r[8..16]));
        if live == 0 || out.last().is_some_and(|&(prev, _)| prev >= seq) {
            return Err(format!(
                "checkpoint usage table out of order at segment {seq}"
            ));
        }
        out.push((seq, live));
    }
    Ok(out)
}

fn decode_record(r: &[u8]) -> ExtentRecord {
    let seq = le_u64(&r[8..16]);
    let target = if seq == u64::MAX {
        Target::Zero
    } else {
        Target::Data {
            seq,
            offset: u64::from(le_u32(&r[16..20])),
        }
    };
    ExtentRecord {
        start: le_u64(&r[0..8]),
        len: u64::from(le_u32(&r[20..24])),
        target,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_corruption() {
        let mut map = ExtentMap::new();
        map.set(
            0,
            4096,
            Some(Target::Data {
                seq: 3,
                offset: 8192,
            }),
        );
        map.set(1 << 20, 1 << 21, Some(Target::Zero));
        map.set(10_000, 17, Some(Target::Data { seq: 5, offset: 1 }));
        let info = CheckpointInfo {
            seq: 5,
            volume_uuid: [1; 16],
            span: JournalSpan {
                journal_id: [2; 16],
                first_jseq: 4,
                last_jseq: 9,
                end_lpos: 999,
            },
            volume_size_bytes: 1 << 30,
        };
        let b = encode(&info, &map);
        let (info2, map2, usage) = decode_with_usage(&b).unwrap();
        assert_eq!(info2, info);
        assert_eq!(usage, Some(vec![(3, 4096), (5, 17)]));
        assert_eq!(
            map2.iter().collect::<Vec<_>>(),
            map.iter().collect::<Vec<_>>()
        );
        for i in [0, 17, 90, 110, b.len() - 1] {
            let mut c = b.clone();
            c[i] ^= 4;
            assert!(decode(&c).is_err(), "byte {i}");
        }
        assert!(decode(&b[..b.len() - 3]).is_err());
        // An extent ending past what 32-bit segment offsets address is
        // refused (the map would panic on it).
        let mut far = b.clone();
        let rec = HEADER_BYTES + RECORD_BYTES;
        far[rec + 16..rec + 20].copy_from_slice(&(u32::MAX - 8).to_le_bytes());
        let body_crc = crc32c::crc32c(&far[HEADER_BYTES..]);
        far[96..100].copy_from_slice(&body_crc.to_le_bytes());
        let header_crc = crc32c::crc32c(&far[0..100]);
        far[100..104].copy_from_slice(&header_crc.to_le_bytes());
        assert!(decode(&far).unwrap_err().contains("past any segment"));
        let mut small = info;
        small.volume_size_bytes = 4096;
        assert!(decode(&encode(&small, &map)).is_err());
    }

    /// Version 1 (no usage table) still decodes: its layout is version 2's
    /// with usage_count 0.
    #[test]
    fn version_1_still_decodes() {
        let mut map = ExtentMap::new();
        map.set(0, 4096, Some(Target::Data { seq: 1, offset: 0 }));
        let info = CheckpointInfo {
            seq: 1,
            volume_uuid: [1; 16],
            span: JournalSpan::default(),
            volume_size_bytes: 1 << 20,
        };
        let mut b = encode(&info, &map);
        b.truncate(HEADER_BYTES + RECORD_BYTES);
        b[8..10].copy_from_slice(&1u16.to_le_bytes());
        b[12..16].fill(0);
        let body_crc = crc32c::crc32c(&b[HEADER_BYTES..]);
        b[96..100].copy_from_slice(&body_crc.to_le_bytes());
        let header_crc = crc32c::crc32c(&b[0..100]);
        b[100..104].copy_from_slice(&header_crc.to_le_bytes());
        let (_, map1, usage) = decode_with_usage(&b).unwrap();
        assert_eq!(usage, None);
        assert_eq!(map1.usage().live_bytes(1), 4096);
    }
}
