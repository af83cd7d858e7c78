//! Entry points for the fuzz targets (`crates/strata-volume/fuzz`) and the
//! randomized test below: every decoder of this folder run over arbitrary
//! bytes. Nothing may panic; what decodes must survive a re-encode and
//! decode unchanged.

use super::bytes::le_u32;
use super::cache_file::{CacheEntry, CacheSuperblock};
use super::checkpoint;
use super::clone_marker::CloneMarker;
use super::diff_file::{self, DiffHeader};
use super::envelope;
use super::host_record::HostRecord;
use super::journal::{Placed, RecordHeader, RecordKind, Superblock, RECORD_HEADER_BYTES};
use super::lease::Lease;
use super::manifest::Manifest;
use super::segment::{FixedHeader, SegmentIndex, CHUNK_BYTES, FIXED_HEADER_BYTES};
use super::snapshot_delta;

/// Every decoder on `data`.
pub fn decode_everything(data: &[u8]) {
    decode_segment(data);
    decode_checkpoint(data);
    decode_envelopes(data);
    decode_journal(data);
    decode_cache_file(data);
    decode_diff_file(data);
    decode_snapshot_delta(data);
    decode_frames(data);
    decode_sealed_object(data);
    decode_access_profile(data);
}

/// An access profile: what decodes must encode back to the same bytes.
pub fn decode_access_profile(data: &[u8]) {
    if let Ok(p) = super::access_profile::AccessProfile::decode(data) {
        assert_eq!(p.encode(), data);
        assert!(p.ranges.len() <= super::access_profile::MAX_RANGES);
    }
}

/// A frame record and the bytes after it as a stored frame, with and
/// without a key; and the bytes as a chunk, which must round-trip.
pub fn decode_frames(data: &[u8]) {
    use super::frame::{self, Compression, FramePlace, FrameRecord, SegmentKey};
    let place = FramePlace {
        volume_uuid: [1; 16],
        seq: 2,
        chunk: 3,
    };
    let key = SegmentKey::derive(&[4; 32], &[5; 32]);
    if data.len() >= frame::FRAME_RECORD_BYTES {
        if let Ok(rec) = FrameRecord::decode(&data[..frame::FRAME_RECORD_BYTES]) {
            let stored = &data[frame::FRAME_RECORD_BYTES..];
            for k in [None, Some(&key)] {
                if let Ok(chunk) = frame::decode_frame(stored, &rec, 4096, k, &place) {
                    assert_eq!(chunk.len(), 4096);
                }
            }
        }
    }
    let chunk = &data[..data.len().min(frame::FRAME_LOGICAL_BYTES)];
    if !chunk.is_empty() {
        for c in [Compression::Lz4, Compression::Zstd { level: 1 }] {
            let (stored, rec) = frame::encode_frame(chunk, c, Some(&key), &place);
            assert!(stored.len() <= frame::MAX_STORED_FRAME_BYTES);
            let back = frame::decode_frame(&stored, &rec, chunk.len(), Some(&key), &place);
            assert_eq!(back.as_deref(), Ok(chunk));
        }
    }
}

/// A snapshot delta: what decodes re-encodes to the same pieces, sorted,
/// within bounds, each a change.
pub fn decode_snapshot_delta(data: &[u8]) {
    if let Ok((info, pieces)) = snapshot_delta::decode(data) {
        assert!(info.from_seq < info.to_seq);
        let mut end = 0;
        for p in &pieces {
            assert!(p.len > 0 && p.start >= end && !p.is_no_change());
            end = p.end();
        }
        let again = snapshot_delta::decode(&snapshot_delta::encode(&info, &pieces));
        assert_eq!(again.ok(), Some((info, pieces)));
    }
}

/// The disk cache file's superblock and directory entries; what decodes
/// re-encodes to the same bytes' meaning, and its geometry stays in bounds.
pub fn decode_cache_file(data: &[u8]) {
    if let Ok(sb) = CacheSuperblock::decode(data) {
        assert_eq!(CacheSuperblock::decode(&sb.encode()).ok(), Some(sb));
        assert!(sb.data_offset() <= sb.file_bytes());
        let _ = sb.entry_offset(sb.slot_count - 1);
    }
    for raw in data.chunks(32) {
        for block_bytes in [4096, 65536] {
            if let Some(e) = CacheEntry::decode(raw, block_bytes) {
                assert!(e.len >= 1 && e.len <= block_bytes);
                assert_eq!(CacheEntry::decode(&e.encode(), block_bytes), Some(e));
            }
        }
    }
}

/// A segment header, its tables, and chunk verification of what follows.
pub fn decode_segment(data: &[u8]) {
    let Ok(fixed) = FixedHeader::decode(data) else {
        return;
    };
    let end = (fixed.header_bytes as usize).min(data.len());
    let tables = data.get(FIXED_HEADER_BYTES..end).unwrap_or_default();
    let key = [7u8; 32];
    for (volume_size_bytes, data_key) in [(0, None), (1 << 20, None), (u64::MAX, Some(&key))] {
        let Ok((idx, entries)) =
            SegmentIndex::decode_tables(fixed, tables, volume_size_bytes, data_key)
        else {
            continue;
        };
        assert_eq!(entries.len(), fixed.entry_count as usize);
        let body = data.get(end..).unwrap_or_default();
        let _ = idx.verify(0, body);
        let _ = idx.verify(u64::from(fixed.chunk_count), body);
        let _ = idx.decode_run(0, body);
        if fixed.chunk_count > 0 {
            let last = u64::from(fixed.chunk_count) - 1;
            let r = idx.chunk_range(0, last);
            let tags = 16 * u64::from(fixed.chunk_count);
            assert!(r.end - r.start <= fixed.data_bytes.max(CHUNK_BYTES) + tags);
            if let Some(stored) = body.get(..(r.end - r.start) as usize) {
                if let Ok(plain) = idx.decode_run(0, stored) {
                    assert_eq!(plain.len() as u64, fixed.data_bytes);
                }
            }
        }
    }
}

/// A sealed object (an encrypted volume's checkpoint or delta), with a
/// key and without.
pub fn decode_sealed_object(data: &[u8]) {
    use super::sealed_object::{open, SealedKind};
    for kind in [
        SealedKind::Checkpoint,
        SealedKind::SnapshotDelta,
        SealedKind::AccessProfile,
    ] {
        let _ = open(data, kind, 1, &[0; 16], None);
        if let Ok(inner) = open(data, kind, 1, &[0; 16], Some(&[7; 32])) {
            decode_checkpoint(&inner);
            decode_snapshot_delta(&inner);
        }
    }
}

/// A checkpoint; what decodes re-encodes to an equal checkpoint.
pub fn decode_checkpoint(data: &[u8]) {
    let Ok((info, map)) = checkpoint::decode(data) else {
        return;
    };
    map.check_invariants();
    let again = checkpoint::encode(&info, &map);
    let (info2, map2) = match checkpoint::decode(&again) {
        Ok(d) => d,
        Err(e) => panic!("re-encoded checkpoint does not decode: {e}"),
    };
    assert_eq!(info, info2);
    assert!(map.iter().eq(map2.iter()));
}

/// The envelope and the JSON objects inside it (manifest, lease, host
/// record).
pub fn decode_envelopes(data: &[u8]) {
    let _ = envelope::decode(b"STRATMAN", "manifest", 1 << 20, data);
    if let Ok(m) = Manifest::decode(data) {
        assert_eq!(Manifest::decode(&m.encode()).ok(), Some(m));
    }
    if let Ok(l) = Lease::decode(data) {
        assert_eq!(Lease::decode(&l.encode()).ok(), Some(l));
    }
    if let Ok(h) = HostRecord::decode(data) {
        assert_eq!(HostRecord::decode(&h.encode()).ok(), Some(h));
    }
    if let Ok(c) = CloneMarker::decode(data) {
        assert_eq!(CloneMarker::decode(&c.encode()).ok(), Some(c));
    }
}

/// A diff file's header and a record header (`format/diff_file.rs`).
pub fn decode_diff_file(data: &[u8]) {
    if let Ok(h) = DiffHeader::decode(data) {
        assert_eq!(DiffHeader::decode(&h.encode()).ok(), Some(h));
    }
    let n = diff_file::RECORD_HEADER_BYTES;
    if data.len() >= n {
        if let Ok(r) = diff_file::RecordHeader::decode(&data[..n]) {
            let _ = r.verify(&data[..n], &data[n..]);
        }
    }
}

/// A journal superblock and a record header with its payload.
pub fn decode_journal(data: &[u8]) {
    if let Ok(sb) = Superblock::decode(data) {
        assert_eq!(Superblock::decode(&sb.encode()).ok(), Some(sb));
    }
    if let Some(h) = RecordHeader::decode(data) {
        let header = &data[..RECORD_HEADER_BYTES as usize];
        let end = (RECORD_HEADER_BYTES as usize).saturating_add(h.payload_bytes as usize);
        if let Some(payload) = data.get(RECORD_HEADER_BYTES as usize..end) {
            let _ = h.verify(&[0; 16], header, payload);
            if h.kind == RecordKind::Placed {
                if let Ok(p) = Placed::decode(payload) {
                    assert_eq!(Placed::decode(&p.encode()).ok(), Some(p));
                }
            }
        }
        assert!(h.record_bytes() >= RECORD_HEADER_BYTES);
    }
    // A placed write's payload alone, whatever the header.
    if let Ok(p) = Placed::decode(data) {
        assert_eq!(&p.encode()[..], data);
    }
}

/// Every decoder on `data` after stamping it with valid magics, versions,
/// lengths and checksums, so the field checks behind the CRCs are reached
/// (random bytes almost never pass a CRC32C).
pub fn decode_with_valid_checksums(data: &[u8]) {
    decode_segment(&stamped(
        data,
        b"STRATSEG",
        &[(96, 104, HEADER_BYTES_FIELD), (100, 0, 100)],
    ));
    for version in [1, 2] {
        decode_checkpoint(&stamped_version(
            data,
            b"STRATCKP",
            version,
            &[(96, 104, usize::MAX), (100, 0, 100)],
        ));
    }
    decode_journal(&stamped(data, b"STRATJNL", &[(64, 0, 64)]));
    decode_snapshot_delta(&stamped(
        data,
        b"STRATDLT",
        &[(64, 72, usize::MAX), (68, 0, 68)],
    ));
    decode_cache_file(&stamped_cache_file(data));
    for magic in [b"STRATMAN", b"STRATLSE"] {
        let mut b = stamped(data, magic, &[]);
        if b.len() >= 20 {
            let body_len = (b.len() - 20) as u32;
            b[12..16].copy_from_slice(&body_len.to_le_bytes());
            let crc = crc32c::crc32c(&b[20..]);
            b[16..20].copy_from_slice(&crc.to_le_bytes());
        }
        decode_envelopes(&b);
    }
}

/// `data` made into a cache superblock (magic, version 1, CRC) followed by
/// directory entries (each 32 bytes flagged valid, with its CRC).
fn stamped_cache_file(data: &[u8]) -> Vec<u8> {
    let mut b = data.to_vec();
    if b.len() < 32 {
        return b;
    }
    b[..8].copy_from_slice(b"STRATCCH");
    b[8..12].copy_from_slice(&1u32.to_le_bytes());
    for entry in b.chunks_mut(32) {
        if entry.len() == 32 {
            if entry[..8] != *b"STRATCCH" {
                entry[24..28].copy_from_slice(&1u32.to_le_bytes());
            }
            let crc = crc32c::crc32c(&entry[..28]);
            entry[28..32].copy_from_slice(&crc.to_le_bytes());
        }
    }
    b
}

/// A CRC range end meaning "the segment's `header_bytes` field" (the
/// tables CRC covers the tables, not the data after them).
const HEADER_BYTES_FIELD: usize = usize::MAX - 1;

/// `data` with `magic` and version 1 at its start and, for each
/// `(at, from, to)`, the CRC32C of bytes `[from, to)` stored at `at`
/// (in order, so a later CRC covers an earlier one).
fn stamped(data: &[u8], magic: &[u8; 8], crcs: &[(usize, usize, usize)]) -> Vec<u8> {
    stamped_version(data, magic, 1, crcs)
}

/// `stamped` with another version number.
fn stamped_version(
    data: &[u8],
    magic: &[u8; 8],
    version: u16,
    crcs: &[(usize, usize, usize)],
) -> Vec<u8> {
    let mut b = data.to_vec();
    if b.len() < 10 {
        return b;
    }
    b[..8].copy_from_slice(magic);
    b[8..10].copy_from_slice(&version.to_le_bytes());
    for &(at, from, to) in crcs {
        let to = match to {
            HEADER_BYTES_FIELD if b.len() >= 16 => le_u32(&b[12..16]) as usize,
            _ => to,
        };
        let to = to.min(b.len());
        if at + 4 > b.len() || from > to {
            continue;
        }
        let crc = crc32c::crc32c(&b[from..to]);
        b[at..at + 4].copy_from_slice(&crc.to_le_bytes());
    }
    b
}
