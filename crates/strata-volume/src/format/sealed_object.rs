//! The envelope of an encrypted volume's metadata objects: checkpoints and
//! snapshot deltas (the extent map: which ranges hold data, and where) and
//! snapshots' access profiles (which ranges a clone's guest reads first)
//! are sealed whole, so the bucket shows their size and nothing else. The
//! object inside is the unencrypted format (`checkpoint.rs`,
//! `snapshot_delta.rs`, `access_profile.rs`), decoded after opening.
//!
//! ## Layout (little endian)
//!
//! ```text
//!  0  8  magic "STRATSLD"
//!  8  2  version (1)
//! 10  2  kind: 1 checkpoint, 2 snapshot delta, 3 access profile
//! 12  4  zero
//! 16  8  seq: the checkpoint's, the delta's newer snapshot checkpoint, or
//!        the profiled snapshot's checkpoint
//! 24 16  volume uuid
//! 40 32  salt: the object's key is HKDF(data key, salt) (`frame.rs`)
//! 72  4  CRC32C of bytes [0, 72)
//! 76 ..  the inner object, AES-256-GCM, + 16 bytes of tag; associated
//!        data: uuid, seq and the kind's index (`FramePlace`)
//! ```
//!
//! A fresh random salt per object: objects rewritten under one name (a
//! checkpoint retried after a crash) never reuse a key with a nonce.

use super::bytes::{array16, le_u32, le_u64};
use super::frame::{FramePlace, SegmentKey, TAG_BYTES};

const MAGIC: &[u8; 8] = b"STRATSLD";
const VERSION: u16 = 1;
const HEADER_BYTES: usize = 76;
const SALT_BYTES: usize = 32;

/// What a sealed object holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SealedKind {
    Checkpoint,
    SnapshotDelta,
    AccessProfile,
}

impl SealedKind {
    fn code(self) -> u16 {
        match self {
            SealedKind::Checkpoint => 1,
            SealedKind::SnapshotDelta => 2,
            SealedKind::AccessProfile => 3,
        }
    }

    /// The nonce index of the object's one message: none a segment uses
    /// (frames count up from 0; `u64::MAX` is a segment's tables).
    fn index(self) -> u64 {
        u64::MAX - u64::from(self.code())
    }
}

/// Whether `bytes` is a sealed object (else an unencrypted one).
pub fn is_sealed(bytes: &[u8]) -> bool {
    bytes.starts_with(MAGIC)
}

/// `inner` sealed as object `seq` of `kind` of volume `volume_uuid`.
pub fn seal(
    inner: &[u8],
    kind: SealedKind,
    seq: u64,
    volume_uuid: &[u8; 16],
    data_key: &[u8; 32],
    salt: [u8; SALT_BYTES],
) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_BYTES + inner.len() + TAG_BYTES);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&kind.code().to_le_bytes());
    out.extend_from_slice(&[0u8; 4]);
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(volume_uuid);
    out.extend_from_slice(&salt);
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    let mut body = inner.to_vec();
    let key = SegmentKey::derive(data_key, &salt);
    key.seal_message(&place(kind, seq, volume_uuid), &mut body);
    out.extend_from_slice(&body);
    out
}

fn place(kind: SealedKind, seq: u64, volume_uuid: &[u8; 16]) -> FramePlace {
    FramePlace {
        volume_uuid: *volume_uuid,
        seq,
        chunk: kind.index(),
    }
}

/// The inner object of sealed `bytes`, which must be object `seq` of
/// `kind` of volume `volume_uuid`.
pub fn open(
    bytes: &[u8],
    kind: SealedKind,
    seq: u64,
    volume_uuid: &[u8; 16],
    data_key: Option<&[u8; 32]>,
) -> Result<Vec<u8>, String> {
    if bytes.len() < HEADER_BYTES + TAG_BYTES || !is_sealed(bytes) {
        return Err("not a sealed strata object (bad magic or truncated)".into());
    }
    if crc32c::crc32c(&bytes[..72]) != le_u32(&bytes[72..76]) {
        return Err("sealed object header checksum mismatch".into());
    }
    let version = u16::from_le_bytes([bytes[8], bytes[9]]);
    if version != VERSION {
        return Err(format!(
            "sealed object version {version} (this strata reads {VERSION}; upgrade)"
        ));
    }
    let found = (
        u16::from_le_bytes([bytes[10], bytes[11]]),
        le_u64(&bytes[16..24]),
        array16(&bytes[24..40]),
    );
    if found != (kind.code(), seq, *volume_uuid) {
        return Err("sealed object belongs to another object or volume".into());
    }
    let Some(data_key) = data_key else {
        return Err("the object is encrypted: the volume's key is needed to read it".into());
    };
    let mut salt = [0u8; SALT_BYTES];
    salt.copy_from_slice(&bytes[40..72]);
    let key = SegmentKey::derive(data_key, &salt);
    let mut body = bytes[HEADER_BYTES..].to_vec();
    let plain = key
        .open_message(&place(kind, seq, volume_uuid), &mut body)
        .map_err(|e| e.to_string())?;
    Ok(plain.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_objects_open_only_in_their_place_with_their_key() {
        let inner = b"STRATCKP and an extent map".to_vec();
        let key = [3u8; 32];
        let s = seal(&inner, SealedKind::Checkpoint, 9, &[1; 16], &key, [4; 32]);
        assert!(is_sealed(&s));
        assert!(!s.windows(inner.len()).any(|w| w == inner.as_slice()));
        let open_as = |b: &[u8], kind, seq, uuid: [u8; 16], k: Option<&[u8; 32]>| {
            open(b, kind, seq, &uuid, k)
        };
        let ck = SealedKind::Checkpoint;
        assert_eq!(open_as(&s, ck, 9, [1; 16], Some(&key)).unwrap(), inner);
        assert!(open_as(&s, ck, 9, [1; 16], None)
            .unwrap_err()
            .contains("key"));
        let e = open_as(&s, ck, 9, [1; 16], Some(&[5; 32])).unwrap_err();
        assert!(e.contains("authentication"), "{e}");
        assert!(open_as(&s, ck, 8, [1; 16], Some(&key)).is_err());
        assert!(open_as(&s, SealedKind::SnapshotDelta, 9, [1; 16], Some(&key)).is_err());
        assert!(open_as(&s, ck, 9, [2; 16], Some(&key)).is_err());
        for i in 0..s.len() {
            let mut b = s.clone();
            b[i] ^= 1;
            assert!(open_as(&b, ck, 9, [1; 16], Some(&key)).is_err(), "byte {i}");
        }
        assert!(open_as(&s[..80], ck, 9, [1; 16], Some(&key)).is_err());
    }
}
