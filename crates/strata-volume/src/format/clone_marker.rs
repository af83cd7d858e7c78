//! The clone marker: a small object under the parent volume's prefix,
//! `<parent>/clones/<snapshot>/<clone>`, saying that volume `<clone>` reads
//! through snapshot `<snapshot>`. A snapshot with a live marker is not
//! deleted, nor is the volume (`volume/snapshot.rs`, `engine/`).
//!
//! ## Object layout
//!
//! The envelope of `envelope.rs` (magic "STRATCLN", version 1, body at
//! most 4 KiB) around a JSON body.

use serde::{Deserialize, Serialize};

use super::envelope;

const MAGIC: &[u8; 8] = b"STRATCLN";
const MAX_BODY_BYTES: usize = 4096;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CloneMarker {
    pub clone: String,
    /// The clone's uuid (32 hex digits): a volume deleted and made again
    /// under the same name is another clone.
    pub clone_uuid: String,
    pub created_unix_ms: u64,
    /// The clone's prefix in the same bucket, when it is not the parent's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clone_prefix: Option<String>,
}

impl CloneMarker {
    pub fn encode(&self) -> Vec<u8> {
        // Serialising a struct of strings and integers cannot fail.
        let body = serde_json::to_vec(self).unwrap_or_default();
        envelope::encode(MAGIC, &body)
    }

    pub fn decode(b: &[u8]) -> Result<CloneMarker, String> {
        let body = envelope::decode(MAGIC, "clone marker", MAX_BODY_BYTES, b)?;
        serde_json::from_slice(body).map_err(|e| format!("clone marker body: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_corruption() {
        let m = CloneMarker {
            clone: "vm7".into(),
            clone_uuid: "0123456789abcdef0123456789abcdef".into(),
            created_unix_ms: 9,
            clone_prefix: Some("elsewhere".into()),
        };
        let b = m.encode();
        assert_eq!(CloneMarker::decode(&b).unwrap(), m);
        let mut c = b.clone();
        c[25] ^= 1;
        assert!(CloneMarker::decode(&c).is_err());
    }
}
