//! The manifest: the one small mutable object of a volume, naming what it
//! is and where recovery starts.
//!
//! ## Object layout
//!
//! The envelope of `envelope.rs` (magic "STRATMAN", body at most 1 MiB).
//!
//! The body is JSON so that later fields (snapshots, parent, lease epoch)
//! can be added without a new binary layout; the envelope still gives it a
//! magic, a version and a checksum.

use serde::{Deserialize, Serialize};

use super::envelope;

const MAGIC: &[u8; 8] = b"STRATMAN";
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
        envelope::encode(MAGIC, &body)
    }

    pub fn decode(b: &[u8]) -> Result<Manifest, String> {
        let body = envelope::decode(MAGIC, "manifest", MAX_BODY_BYTES, b)?;
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
