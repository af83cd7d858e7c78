//! The envelope of small JSON objects (manifest, lease): a binary header
//! with magic, version, length and checksum around a JSON body, so the body
//! can gain fields while every read is still verified.
//!
//! ```text
//!  0  8  magic (per object kind)
//!  8  2  version, little endian: 1; a manifest is version 2 when it
//!         holds what a reader of version 1 would mishandle (snapshots,
//!         a parent): an older strata then refuses it instead of, say,
//!         collecting a snapshot's segments as garbage
//! 10  2  zero
//! 12  4  body length in bytes, little endian
//! 16  4  CRC32C of the body, little endian
//! 20  .. body: UTF-8 JSON
//! ```

use super::bytes::le_u32;

const VERSION: u16 = 1;
const ENVELOPE_BYTES: usize = 20;

/// Wraps a JSON body (version 1).
pub(crate) fn encode(magic: &[u8; 8], body: &[u8]) -> Vec<u8> {
    encode_version(magic, VERSION, body)
}

/// Wraps a JSON body with the given version.
pub(crate) fn encode_version(magic: &[u8; 8], version: u16, body: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(ENVELOPE_BYTES + body.len());
    b.extend_from_slice(magic);
    b.extend_from_slice(&version.to_le_bytes());
    b.extend_from_slice(&[0u8; 2]);
    b.extend_from_slice(&(body.len() as u32).to_le_bytes());
    b.extend_from_slice(&crc32c::crc32c(body).to_le_bytes());
    b.extend_from_slice(body);
    b
}

/// Verifies an envelope (version 1) and returns its body; `what` names
/// the object kind.
pub(crate) fn decode<'a>(
    magic: &[u8; 8],
    what: &str,
    max_body_bytes: usize,
    b: &'a [u8],
) -> Result<&'a [u8], String> {
    decode_versions(magic, what, VERSION, max_body_bytes, b).map(|(_, body)| body)
}

/// Verifies an envelope of version 1 to `max_version`; its version and body.
pub(crate) fn decode_versions<'a>(
    magic: &[u8; 8],
    what: &str,
    max_version: u16,
    max_body_bytes: usize,
    b: &'a [u8],
) -> Result<(u16, &'a [u8]), String> {
    if b.len() < ENVELOPE_BYTES || &b[0..8] != magic {
        return Err(format!("not a strata {what} (bad magic or truncated)"));
    }
    let version = u16::from_le_bytes([b[8], b[9]]);
    if version == 0 || version > max_version {
        return Err(format!(
            "unsupported {what} version {version} (this strata reads versions 1 to {max_version}; a newer strata wrote it: upgrade)"
        ));
    }
    let len = le_u32(&b[12..16]) as usize;
    if len > max_body_bytes || b.len() != ENVELOPE_BYTES + len {
        return Err(format!("{what} length does not match its header"));
    }
    let body = &b[ENVELOPE_BYTES..];
    if crc32c::crc32c(body) != le_u32(&b[16..20]) {
        return Err(format!("{what} checksum mismatch"));
    }
    Ok((version, body))
}
