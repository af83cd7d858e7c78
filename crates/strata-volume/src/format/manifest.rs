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
    /// Objects nothing references any more, deleted once the grace period
    /// after `since_unix_ms` has passed (`gc/`). Recorded here, in the same
    /// conditional write that makes them unreferenced, so a crash resumes
    /// the deletion and a new holder carries it out. At most
    /// `MAX_PENDING_DELETIONS`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending_deletions: Vec<PendingDeletion>,
    /// The last garbage collection pass that finished, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_gc: Option<GcPassRecord>,
}

/// Pending deletions a manifest may list (about 100 bytes each in JSON).
pub const MAX_PENDING_DELETIONS: usize = 4096;

/// Which kind of object a pending deletion names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ObjectKind {
    Segment,
    Checkpoint,
}

/// An object of the volume to delete once `since_unix_ms + grace` passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingDeletion {
    pub kind: ObjectKind,
    pub seq: u64,
    /// When it stopped being referenced (wall clock of the writer).
    pub since_unix_ms: u64,
    /// Object bytes (what deleting it reclaims).
    #[serde(default)]
    pub bytes: u64,
}

/// What a garbage collection pass did (shown by `strata volume info`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GcPassRecord {
    pub finished_unix_ms: u64,
    pub segments_rewritten: u64,
    pub bytes_copied: u64,
    pub objects_deleted: u64,
    pub bytes_reclaimed: u64,
    /// Stored and live segment bytes when the pass finished.
    pub stored_bytes: u64,
    pub live_bytes: u64,
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
        if m.pending_deletions.len() > MAX_PENDING_DELETIONS {
            return Err(format!(
                "manifest lists {} pending deletions (at most {MAX_PENDING_DELETIONS})",
                m.pending_deletions.len()
            ));
        }
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
            pending_deletions: vec![PendingDeletion {
                kind: ObjectKind::Segment,
                seq: 3,
                since_unix_ms: 5,
                bytes: 7,
            }],
            last_gc: Some(GcPassRecord::default()),
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
