//! Frames: how one 4 KiB chunk of a segment's data area is stored in a
//! version 2 segment, compressed and/or encrypted (design:
//! `docs/design/data-at-rest.md`). Pure functions over bytes; the segment
//! header's frame table holds one `FrameRecord` per chunk.
//!
//! ## Frame record (8 bytes, little endian)
//!
//! ```text
//! 0 2  stored length in bytes (at most 4096 + 16)
//! 2 1  codec: 0 raw, 1 lz4 (block format), 2 zstd
//! 3 1  zero
//! 4 4  CRC32C of the stored bytes
//! ```
//!
//! ## Stored bytes
//!
//! `codec(chunk)`, kept only when it saves at least an eighth (else raw);
//! then, for an encrypted volume, AES-256-GCM under the segment's key
//! (`SegmentKey`: HKDF-SHA256 of the volume's data key and the segment's
//! random salt), nonce = chunk index, associated data = volume uuid,
//! segment seq, chunk index and codec, the 16-byte tag appended. The CRC
//! covers what is stored, so damage is told apart from tampering: a frame
//! whose CRC matches and whose tag does not was altered or moved.

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
use ring::hkdf;

use super::bytes::le_u32;

/// Logical bytes per frame (a segment chunk).
pub const FRAME_LOGICAL_BYTES: usize = 4096;
pub const FRAME_RECORD_BYTES: usize = 8;
pub const TAG_BYTES: usize = 16;
/// Largest stored frame: raw and encrypted.
pub const MAX_STORED_FRAME_BYTES: usize = FRAME_LOGICAL_BYTES + TAG_BYTES;
const HKDF_INFO: &[u8] = b"strata segment v2";
/// Highest zstd level accepted (above it, compression gets very slow for
/// little gain on 4 KiB).
pub const MAX_ZSTD_LEVEL: i32 = 19;

/// How a frame's bytes were compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    Raw,
    Lz4,
    Zstd,
}

impl Codec {
    fn byte(self) -> u8 {
        match self {
            Codec::Raw => 0,
            Codec::Lz4 => 1,
            Codec::Zstd => 2,
        }
    }

    fn from_byte(b: u8) -> Option<Codec> {
        match b {
            0 => Some(Codec::Raw),
            1 => Some(Codec::Lz4),
            2 => Some(Codec::Zstd),
            _ => None,
        }
    }
}

/// How new frames are compressed: a volume setting, changeable at any
/// time (each frame records its codec).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Lz4,
    Zstd { level: i32 },
}

impl std::str::FromStr for Compression {
    type Err = String;

    /// `none`, `lz4`, `zstd` (level 3) or `zstd:LEVEL` (1 to 19).
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || {
            format!("compression {s:?}: use none, lz4, zstd or zstd:LEVEL (LEVEL 1 to {MAX_ZSTD_LEVEL})")
        };
        match s {
            "none" => Ok(Compression::None),
            "lz4" => Ok(Compression::Lz4),
            "zstd" => Ok(Compression::Zstd { level: 3 }),
            _ => {
                let level = s.strip_prefix("zstd:").ok_or_else(bad)?;
                let level: i32 = level.parse().map_err(|_| bad())?;
                if !(1..=MAX_ZSTD_LEVEL).contains(&level) {
                    return Err(bad());
                }
                Ok(Compression::Zstd { level })
            }
        }
    }
}

impl std::fmt::Display for Compression {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Compression::None => write!(f, "none"),
            Compression::Lz4 => write!(f, "lz4"),
            Compression::Zstd { level } => write!(f, "zstd:{level}"),
        }
    }
}

/// One entry of a segment's frame table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameRecord {
    pub stored_len: u16,
    pub codec: Codec,
    pub crc: u32,
}

impl FrameRecord {
    pub fn encode(&self) -> [u8; FRAME_RECORD_BYTES] {
        let mut b = [0u8; FRAME_RECORD_BYTES];
        b[0..2].copy_from_slice(&self.stored_len.to_le_bytes());
        b[2] = self.codec.byte();
        b[4..8].copy_from_slice(&self.crc.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<FrameRecord, String> {
        if b.len() != FRAME_RECORD_BYTES {
            return Err("frame record truncated".into());
        }
        let stored_len = u16::from_le_bytes([b[0], b[1]]);
        let codec =
            Codec::from_byte(b[2]).ok_or_else(|| format!("unknown frame codec {}", b[2]))?;
        if b[3] != 0 {
            return Err("frame record has unknown flags".into());
        }
        if stored_len == 0 || usize::from(stored_len) > MAX_STORED_FRAME_BYTES {
            return Err(format!("frame of {stored_len} stored bytes"));
        }
        Ok(FrameRecord {
            stored_len,
            codec,
            crc: le_u32(&b[4..8]),
        })
    }
}

/// The key of one segment object's frames.
pub struct SegmentKey(LessSafeKey);

impl std::fmt::Debug for SegmentKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SegmentKey(..)")
    }
}

impl SegmentKey {
    /// HKDF-SHA256 of the volume's data key and the segment's salt.
    pub fn derive(data_key: &[u8; 32], salt: &[u8; 32]) -> SegmentKey {
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, salt).extract(data_key);
        let mut key = [0u8; 32];
        let okm = prk.expand(&[HKDF_INFO], &AES_256_GCM);
        // Expanding 32 bytes of SHA-256 output cannot fail, nor can making
        // an AES-256 key of 32 bytes; stay total anyway.
        let filled = okm.and_then(|okm| okm.fill(&mut key));
        let unbound = filled.and_then(|()| UnboundKey::new(&AES_256_GCM, &key));
        let unbound = unbound.unwrap_or_else(|_| unreachable_key());
        SegmentKey(LessSafeKey::new(unbound))
    }
}

impl SegmentKey {
    /// Seals a message of the segment that is not a frame (its entry
    /// table), at `place` (a chunk index no frame has).
    pub fn seal_message(&self, place: &FramePlace, buf: &mut Vec<u8>) {
        let aad = Aad::from(place.aad(Codec::Raw));
        if self
            .0
            .seal_in_place_append_tag(place.nonce(), aad, buf)
            .is_err()
        {
            unreachable!("AES-GCM sealing of a segment table");
        }
    }

    /// Opens what `seal_message` sealed at `place`.
    pub fn open_message<'a>(
        &self,
        place: &FramePlace,
        buf: &'a mut [u8],
    ) -> Result<&'a [u8], FrameError> {
        let aad = Aad::from(place.aad(Codec::Raw));
        let opened = self.0.open_in_place(place.nonce(), aad, buf);
        opened.map(|b| &*b).map_err(|_| FrameError::Authentication)
    }
}

#[cold]
fn unreachable_key() -> UnboundKey {
    // AES_256_GCM takes any 32 bytes; this is never reached.
    #[allow(clippy::expect_used)]
    UnboundKey::new(&AES_256_GCM, &[0u8; 32]).expect("AES-256 key of 32 bytes")
}

/// Where a frame belongs: what its associated data binds it to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FramePlace {
    pub volume_uuid: [u8; 16],
    pub seq: u64,
    pub chunk: u64,
}

impl FramePlace {
    fn nonce(&self) -> Nonce {
        let mut n = [0u8; 12];
        n[4..12].copy_from_slice(&self.chunk.to_be_bytes());
        Nonce::assume_unique_for_key(n)
    }

    fn aad(&self, codec: Codec) -> [u8; 33] {
        let mut a = [0u8; 33];
        a[0..16].copy_from_slice(&self.volume_uuid);
        a[16..24].copy_from_slice(&self.seq.to_le_bytes());
        a[24..32].copy_from_slice(&self.chunk.to_le_bytes());
        a[32] = codec.byte();
        a
    }
}

/// Why a frame was not decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    /// The stored bytes do not match their CRC: damage.
    Checksum,
    /// The CRC matched, the tag did not: altered, moved, or another
    /// volume's frame.
    Authentication,
    /// Decoded to something that is not the chunk.
    Corrupt(String),
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::Checksum => write!(f, "frame checksum mismatch (damaged object)"),
            FrameError::Authentication => write!(
                f,
                "frame fails authentication: altered, moved from another place, or another volume's"
            ),
            FrameError::Corrupt(detail) => write!(f, "frame does not decode: {detail}"),
        }
    }
}

/// Stores `chunk` (1 to 4096 bytes): compressed as `compression` asks when
/// that saves an eighth, encrypted under `key` when given.
pub fn encode_frame(
    chunk: &[u8],
    compression: Compression,
    key: Option<&SegmentKey>,
    place: &FramePlace,
) -> (Vec<u8>, FrameRecord) {
    let mut out = Vec::with_capacity(MAX_STORED_FRAME_BYTES);
    let record = encode_frame_into(chunk, compression, key, place, &mut out);
    (out, record)
}

/// `encode_frame`, appending the frame to `out` (no allocation per frame:
/// a segment's frames go into one reused buffer).
pub fn encode_frame_into(
    chunk: &[u8],
    compression: Compression,
    key: Option<&SegmentKey>,
    place: &FramePlace,
    out: &mut Vec<u8>,
) -> FrameRecord {
    debug_assert!(!chunk.is_empty() && chunk.len() <= FRAME_LOGICAL_BYTES);
    let start = out.len();
    let codec = compress_into(chunk, compression, out);
    if let Some(key) = key {
        let aad = Aad::from(place.aad(codec));
        let sealed = key
            .0
            .seal_in_place_separate_tag(place.nonce(), aad, &mut out[start..]);
        match sealed {
            Ok(tag) => out.extend_from_slice(tag.as_ref()),
            // ring fails only for inputs beyond 2^36 bytes.
            Err(_) => unreachable!("AES-GCM sealing of at most 4 KiB"),
        }
    }
    FrameRecord {
        stored_len: (out.len() - start) as u16,
        codec,
        crc: crc32c::crc32c(&out[start..]),
    }
}

/// Appends `chunk` compressed (when that saves an eighth) or as it is.
fn compress_into(chunk: &[u8], compression: Compression, out: &mut Vec<u8>) -> Codec {
    let start = out.len();
    let limit = chunk.len() - chunk.len() / 8;
    match compression {
        Compression::Lz4 => {
            out.resize(
                start + lz4_flex::block::get_maximum_output_size(chunk.len()),
                0,
            );
            if let Ok(n) = lz4_flex::block::compress_into(chunk, &mut out[start..]) {
                if n <= limit {
                    out.truncate(start + n);
                    return Codec::Lz4;
                }
            }
            out.truncate(start);
        }
        Compression::Zstd { level } => {
            out.resize(start + zstd::zstd_safe::compress_bound(chunk.len()), 0);
            if let Ok(n) = zstd_compress(chunk, &mut out[start..], level) {
                if n <= limit {
                    out.truncate(start + n);
                    return Codec::Zstd;
                }
            }
            out.truncate(start);
        }
        Compression::None => {}
    }
    out.extend_from_slice(chunk);
    Codec::Raw
}

thread_local! {
    /// zstd contexts of this thread, reused: making one per 4 KiB frame
    /// (what `zstd::bulk::compress` does) costs more than compressing it.
    static ZSTD_COMPRESSOR: std::cell::RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> =
        const { std::cell::RefCell::new(None) };
    static ZSTD_DECOMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { std::cell::RefCell::new(None) };
}

fn zstd_compress(chunk: &[u8], out: &mut [u8], level: i32) -> std::io::Result<usize> {
    ZSTD_COMPRESSOR.with(|cell| {
        let mut cell = cell.borrow_mut();
        if cell.as_ref().is_none_or(|(l, _)| *l != level) {
            *cell = Some((level, zstd::bulk::Compressor::new(level)?));
        }
        match cell.as_mut() {
            Some((_, c)) => c.compress_to_buffer(chunk, out),
            None => Err(std::io::Error::other("no zstd context")),
        }
    })
}

fn zstd_decompress(frame: &[u8], out: &mut [u8]) -> std::io::Result<usize> {
    ZSTD_DECOMPRESSOR.with(|cell| {
        let mut cell = cell.borrow_mut();
        if cell.is_none() {
            *cell = Some(zstd::bulk::Decompressor::new()?);
        }
        match cell.as_mut() {
            Some(d) => d.decompress_to_buffer(frame, out),
            None => Err(std::io::Error::other("no zstd context")),
        }
    })
}

/// The chunk of `logical_len` bytes that `stored` holds, verified.
pub fn decode_frame(
    stored: &[u8],
    record: &FrameRecord,
    logical_len: usize,
    key: Option<&SegmentKey>,
    place: &FramePlace,
) -> Result<Vec<u8>, FrameError> {
    let mut out = Vec::with_capacity(logical_len);
    decode_frame_into(stored, record, logical_len, key, place, &mut out)?;
    Ok(out)
}

/// `decode_frame`, appending the chunk to `out` (on error `out` is left as
/// it was).
pub fn decode_frame_into(
    stored: &[u8],
    record: &FrameRecord,
    logical_len: usize,
    key: Option<&SegmentKey>,
    place: &FramePlace,
    out: &mut Vec<u8>,
) -> Result<(), FrameError> {
    if logical_len == 0 || logical_len > FRAME_LOGICAL_BYTES {
        return Err(FrameError::Corrupt(format!(
            "a chunk of {logical_len} bytes"
        )));
    }
    if stored.len() != usize::from(record.stored_len) || crc32c::crc32c(stored) != record.crc {
        return Err(FrameError::Checksum);
    }
    let start = out.len();
    let decoded = decode_verified(stored, record, logical_len, key, place, out);
    if decoded.is_err() {
        out.truncate(start);
    } else if out.len() - start != logical_len {
        let got = out.len() - start;
        out.truncate(start);
        return Err(FrameError::Corrupt(format!(
            "{got} bytes where the chunk has {logical_len}"
        )));
    }
    decoded
}

/// Opens (if encrypted) and decompresses a frame whose CRC matched.
fn decode_verified(
    stored: &[u8],
    record: &FrameRecord,
    logical_len: usize,
    key: Option<&SegmentKey>,
    place: &FramePlace,
    out: &mut Vec<u8>,
) -> Result<(), FrameError> {
    let start = out.len();
    // Encrypted: opened in place, in `out` for a raw chunk (its final
    // place), else in a buffer on the stack.
    let mut scratch = [0u8; MAX_STORED_FRAME_BYTES];
    let plain: &[u8] = match (key, record.codec) {
        (None, _) => stored,
        (Some(key), codec) => {
            let aad = Aad::from(place.aad(codec));
            let buf: &mut [u8] = if codec == Codec::Raw {
                out.extend_from_slice(stored);
                &mut out[start..]
            } else {
                let b = &mut scratch[..stored.len()];
                b.copy_from_slice(stored);
                b
            };
            let opened = key.0.open_in_place(place.nonce(), aad, buf);
            let n = opened.map_err(|_| FrameError::Authentication)?.len();
            if codec == Codec::Raw {
                out.truncate(start + n);
                return Ok(());
            }
            &scratch[..n]
        }
    };
    match record.codec {
        Codec::Raw => out.extend_from_slice(plain),
        Codec::Lz4 => {
            out.resize(start + logical_len, 0);
            let n = lz4_flex::block::decompress_into(plain, &mut out[start..])
                .map_err(|e| FrameError::Corrupt(format!("lz4: {e}")))?;
            out.truncate(start + n);
        }
        Codec::Zstd => {
            out.resize(start + logical_len, 0);
            let n = zstd_decompress(plain, &mut out[start..])
                .map_err(|e| FrameError::Corrupt(format!("zstd: {e}")))?;
            out.truncate(start + n);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLACE: FramePlace = FramePlace {
        volume_uuid: [7; 16],
        seq: 42,
        chunk: 9,
    };

    fn text_chunk() -> Vec<u8> {
        let line = b"strata keeps volumes as immutable segments in object storage\n";
        line.iter()
            .cycle()
            .take(FRAME_LOGICAL_BYTES)
            .copied()
            .collect()
    }

    fn random_chunk(seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..FRAME_LOGICAL_BYTES)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    fn key(byte: u8) -> SegmentKey {
        SegmentKey::derive(&[byte; 32], &[3; 32])
    }

    #[test]
    fn every_setting_round_trips_and_text_shrinks() {
        let k = key(1);
        for compression in [
            Compression::None,
            Compression::Lz4,
            Compression::Zstd { level: 3 },
        ] {
            for key in [None, Some(&k)] {
                for chunk in [text_chunk(), random_chunk(5), text_chunk()[..100].to_vec()] {
                    let (stored, rec) = encode_frame(&chunk, compression, key, &PLACE);
                    let back = decode_frame(&stored, &rec, chunk.len(), key, &PLACE);
                    assert_eq!(
                        back.as_deref(),
                        Ok(&chunk[..]),
                        "{compression} {}",
                        key.is_some()
                    );
                    let rec2 = FrameRecord::decode(&rec.encode()).unwrap();
                    assert_eq!(rec2, rec);
                }
            }
            let (stored, rec) = encode_frame(&text_chunk(), compression, None, &PLACE);
            if compression == Compression::None {
                assert_eq!((rec.codec, stored.len()), (Codec::Raw, 4096));
            } else {
                assert!(stored.len() < 1024, "{compression}: {} bytes", stored.len());
            }
            // Incompressible data is stored raw.
            let (_, rec) = encode_frame(&random_chunk(9), compression, None, &PLACE);
            assert_eq!(rec.codec, Codec::Raw);
        }
    }

    #[test]
    fn damage_tampering_moves_and_wrong_keys_are_told_apart() {
        let k = key(1);
        let (stored, rec) = encode_frame(&text_chunk(), Compression::Lz4, Some(&k), &PLACE);
        // A flipped bit: the CRC says damage.
        let mut flipped = stored.clone();
        flipped[10] ^= 4;
        let e = decode_frame(&flipped, &rec, 4096, Some(&k), &PLACE);
        assert_eq!(e, Err(FrameError::Checksum));
        // Tampered with a matching CRC: the tag says no.
        let forged = FrameRecord {
            crc: crc32c::crc32c(&flipped),
            ..rec
        };
        let e = decode_frame(&flipped, &forged, 4096, Some(&k), &PLACE);
        assert_eq!(e, Err(FrameError::Authentication));
        // The same frame at another chunk, segment or volume.
        for other in [
            FramePlace { chunk: 10, ..PLACE },
            FramePlace { seq: 43, ..PLACE },
            FramePlace {
                volume_uuid: [8; 16],
                ..PLACE
            },
        ] {
            let e = decode_frame(&stored, &rec, 4096, Some(&k), &other);
            assert_eq!(e, Err(FrameError::Authentication), "{other:?}");
        }
        // Another key, or the codec byte changed to another codec.
        let e = decode_frame(&stored, &rec, 4096, Some(&key(2)), &PLACE);
        assert_eq!(e, Err(FrameError::Authentication));
        let recoded = FrameRecord {
            codec: Codec::Zstd,
            ..rec
        };
        let e = decode_frame(&stored, &recoded, 4096, Some(&k), &PLACE);
        assert_eq!(e, Err(FrameError::Authentication));
    }

    #[test]
    fn bad_records_and_bad_settings_are_refused_with_a_reason() {
        let ok = FrameRecord {
            stored_len: 4096,
            codec: Codec::Raw,
            crc: 1,
        }
        .encode();
        for (at, value) in [(2usize, 9u8), (3, 1)] {
            let mut b = ok;
            b[at] = value;
            assert!(FrameRecord::decode(&b).is_err());
        }
        let mut big = ok;
        big[0..2].copy_from_slice(&(MAX_STORED_FRAME_BYTES as u16 + 1).to_le_bytes());
        assert!(FrameRecord::decode(&big).is_err());
        // A raw frame of the wrong length, a chunk longer than 4 KiB.
        let (stored, rec) = encode_frame(&text_chunk(), Compression::None, None, &PLACE);
        assert!(matches!(
            decode_frame(&stored, &rec, 100, None, &PLACE),
            Err(FrameError::Corrupt(_))
        ));
        assert!(decode_frame(&stored, &rec, 5000, None, &PLACE).is_err());
        for good in ["none", "lz4", "zstd", "zstd:1", "zstd:19"] {
            let c: Compression = good.parse().unwrap();
            let again: Compression = c.to_string().parse().unwrap();
            assert_eq!(c, again);
        }
        for bad in ["", "gzip", "zstd:0", "zstd:20", "zstd:x", "lz4:1"] {
            let e = bad.parse::<Compression>().unwrap_err();
            assert!(e.contains("use none, lz4, zstd"), "{e}");
        }
    }
}
