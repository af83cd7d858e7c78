//! The manifest: the one small mutable object of a volume, naming what it
//! is and where recovery starts.
//!
//! ## Object layout
//!
//! ```text
//!  0  8  magic "STRATMAN"
//!  8  2  version (1), little endian
//! 10  2  zero
//! 12  4  body length in bytes (at most 1 MiB), little endian
//! 16  4  CRC32C of the body, little endian
//! 20  .. body: UTF-8 JSON, the fields of `Manifest`
//! ```
//! The body is JSON so that later fields (snapshots, parent, lease epoch)
//! can be added without a new binary layout; the envelope still gives it a
//! magic, a version and a checksum.

use serde::{Deserialize, Serialize};

use crate::journal::le_u32;

const MAGIC: &[u8; 8] = b"STRATMAN";
const VERSION: u16 = 1;
const ENVELOPE_BYTES: usize = 20;
pub const MAX_BODY_BYTES: usize = 1 << 20;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub name: String,
    /// 32 hex digits.
    pub uuid: String,
    pub size_bytes: u64,
    pub created_unix_ms: u64,
    /// Latest checkpoint; `None` until the first one is written.
    pub checkpoint_seq: Option<u64>,
    /// Bumped by every server that opens the volume for writing.
    #[serde(default)]
    pub epoch: u64,
}

impl Manifest {
    pub fn uuid_bytes(&self) -> Result<[u8; 16], String> {
        let u =
            uuid::Uuid::parse_str(&self.uuid).map_err(|e| format!("bad uuid in manifest: {e}"))?;
        Ok(*u.as_bytes())
    }

    pub fn encode(&self) -> Vec<u8> {
        // Serialising a struct of strings and integers cannot fail.
        let body = serde_json::to_vec_pretty(self).unwrap_or_default();
        let mut b = Vec::with_capacity(ENVELOPE_BYTES + body.len());
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&[0u8; 2]);
        b.extend_from_slice(&(body.len() as u32).to_le_bytes());
        b.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
        b.extend_from_slice(&body);
        b
    }

    pub fn decode(b: &[u8]) -> Result<Manifest, String> {
        if b.len() < ENVELOPE_BYTES || &b[0..8] != MAGIC {
            return Err("not a strata manifest (bad magic or truncated)".into());
        }
        let version = u16::from_le_bytes([b[8], b[9]]);
        if version != VERSION {
            return Err(format!("unsupported manifest version {version}"));
        }
        let len = le_u32(&b[12..16]) as usize;
        if len > MAX_BODY_BYTES || b.len() != ENVELOPE_BYTES + len {
            return Err("manifest length does not match its header".into());
        }
        let body = &b[ENVELOPE_BYTES..];
        if crc32c::crc32c(body) != le_u32(&b[16..20]) {
            return Err("manifest checksum mismatch".into());
        }
        let m: Manifest =
            serde_json::from_slice(body).map_err(|e| format!("manifest body: {e}"))?;
        m.uuid_bytes()?;
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_corruption() {
        let m = Manifest {
            name: "vm1".into(),
            uuid: uuid::Uuid::new_v4().simple().to_string(),
            size_bytes: 1 << 30,
            created_unix_ms: 1,
            checkpoint_seq: Some(4),
            epoch: 2,
        };
        let b = m.encode();
        assert_eq!(Manifest::decode(&b).unwrap(), m);
        for i in [0, 8, 13, 17, 30] {
            let mut c = b.clone();
            c[i] ^= 1;
            assert!(Manifest::decode(&c).is_err(), "byte {i}");
        }
        assert!(Manifest::decode(&b[..b.len() - 1]).is_err());
    }
}
