//! The manifest: the one small mutable object of a volume, naming what it
//! is and where recovery starts.
//!
//! ## Object layout
//!
//! The envelope of `envelope.rs` (magic "STRATMAN", body at most 1 MiB),
//! version 1, or version 2 when the manifest lists snapshots (a strata
//! that knows only version 1 would collect their segments as garbage, so
//! it must refuse the volume).
//!
//! The body is JSON so that later fields (snapshots, parent, lease epoch)
//! can be added without a new binary layout; the envelope still gives it a
//! magic, a version and a checksum.

use serde::{Deserialize, Serialize};

use super::envelope;

const MAGIC: &[u8; 8] = b"STRATMAN";
pub const MAX_BODY_BYTES: usize = 1 << 20;
/// Version 2: snapshots, clones.
const VERSION_SNAPSHOTS: u16 = 2;
/// Version 3: compression or encryption settings (segments of version 2,
/// which an older strata cannot read; an encrypted volume must never be
/// read as if it were plain).
const VERSION_AT_REST: u16 = 3;
/// Snapshots a volume may have.
pub const MAX_SNAPSHOTS: usize = 256;

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
    /// Snapshots, oldest first (`snapshot/`). Each keeps its checkpoint and
    /// every segment that checkpoint's map points into. At most
    /// `MAX_SNAPSHOTS`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub snapshots: Vec<SnapshotRecord>,
    /// The last rollback, recorded in the write that made it happen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_rollback: Option<RollbackRecord>,
    /// For a clone: the snapshot it was made from. Its map starts as that
    /// snapshot's; segments up to `checkpoint_seq` are the parent's (or
    /// its ancestors'), never written, moved or deleted by the clone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<ParentRecord>,
    /// How new segment data is compressed: `none`, `lz4`, `zstd:LEVEL`
    /// (`format/frame.rs`). `None` for volumes made before compression
    /// existed (no compression). Changeable at any time: every frame
    /// records its codec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression: Option<String>,
    /// For an encrypted volume: its data key, wrapped by the user's key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<EncryptionRecord>,
    /// The volume's QoS limits (`qos/`); `None`: no limit. Any server that
    /// opens the volume applies them. (A strata older than this field
    /// reads the manifest and, if it rewrites it, drops them.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos: Option<crate::qos::QosLimits>,
}

/// How an encrypted volume's data key is kept (`format/key_wrap.rs`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EncryptionRecord {
    /// `aes-256-gcm`, the only cipher this version writes.
    pub cipher: String,
    /// The data key wrapped by the key-encryption key (hex).
    pub wrapped_key: String,
    /// Which key-encryption key wraps it (`Key::fingerprint`): named in
    /// the error when another key is given.
    pub key_fingerprint: String,
}

/// The one cipher of this version.
pub const CIPHER_AES_256_GCM: &str = "aes-256-gcm";

/// The snapshot a clone was made from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParentRecord {
    /// The parent volume (same store).
    pub volume: String,
    /// The parent's uuid: a volume deleted and created again under the
    /// same name is not the parent.
    pub uuid: String,
    pub snapshot: String,
    /// The snapshot's checkpoint: the clone's own segments come after it.
    pub checkpoint_seq: u64,
    /// The parent's prefix in the same bucket, when it is not the clone's
    /// (S3 stores; `None`: the same store).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
}

/// A snapshot: a name for a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotRecord {
    pub name: String,
    /// The checkpoint holding the snapshot's map; 0 for a snapshot of a
    /// volume that never stored a segment (an empty map, no object).
    pub checkpoint_seq: u64,
    pub created_unix_ms: u64,
    /// The volume's size when the snapshot was taken.
    pub size_bytes: u64,
    /// Set while a deletion checks for clones (`volume/snapshot.rs`): no
    /// clone may be made of it meanwhile. Cleared if clones are found.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deleting: bool,
    /// What changed since the previous snapshot in the list
    /// (`format/snapshot_delta.rs`); `None` for the oldest, and where the
    /// chain was cut (diffs across it compare whole maps).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delta: Option<DeltaRecord>,
}

/// The delta object of a snapshot: `<volume>/deltas/<to>-<from>`, `to`
/// being the snapshot's checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeltaRecord {
    /// The previous snapshot's checkpoint.
    pub from_checkpoint_seq: u64,
    /// Object bytes.
    pub bytes: u64,
}

impl SnapshotRecord {
    /// The delta, if it leads from the snapshot at checkpoint `previous`.
    pub fn delta_from(&self, previous: u64) -> Option<DeltaRecord> {
        self.delta.filter(|d| d.from_checkpoint_seq == previous)
    }
}

/// Checks a snapshot name: 1..=64 bytes of `[A-Za-z0-9._-]`, not starting
/// with `.` or `-` (so `VOL@NAME` is a safe NBD export name).
pub fn validate_snapshot_name(name: &str) -> Result<(), String> {
    strata_store::validate_name("snapshot", name)
}

/// What the last rollback did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RollbackRecord {
    pub snapshot: String,
    /// The checkpoint that holds the rolled-back map.
    pub checkpoint_seq: u64,
    pub unix_ms: u64,
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
        let version = if self.compression.is_some() || self.encryption.is_some() {
            VERSION_AT_REST
        } else if self.snapshots.is_empty() && self.parent.is_none() {
            1
        } else {
            VERSION_SNAPSHOTS
        };
        envelope::encode_version(MAGIC, version, &body)
    }

    pub fn decode(b: &[u8]) -> Result<Manifest, String> {
        let (version, body) =
            envelope::decode_versions(MAGIC, "manifest", VERSION_AT_REST, MAX_BODY_BYTES, b)?;
        let m: Manifest =
            serde_json::from_slice(body).map_err(|e| format!("manifest body: {e}"))?;
        m.uuid_bytes()?;
        if m.pending_deletions.len() > MAX_PENDING_DELETIONS {
            return Err(format!(
                "manifest lists {} pending deletions (at most {MAX_PENDING_DELETIONS})",
                m.pending_deletions.len()
            ));
        }
        if version < VERSION_SNAPSHOTS && (!m.snapshots.is_empty() || m.parent.is_some()) {
            return Err("manifest version 1 lists snapshots or a parent".into());
        }
        if version < VERSION_AT_REST && (m.compression.is_some() || m.encryption.is_some()) {
            return Err("manifest version 2 names compression or encryption".into());
        }
        if let Some(c) = &m.compression {
            c.parse::<super::frame::Compression>()
                .map_err(|e| format!("manifest: {e}"))?;
        }
        if let Some(e) = &m.encryption {
            if e.cipher != CIPHER_AES_256_GCM {
                return Err(format!(
                    "manifest: volume encrypted with {:?}, which this strata does not know (upgrade)",
                    e.cipher
                ));
            }
        }
        if let Some(p) = &m.parent {
            strata_store::validate_volume_name(&p.volume)
                .map_err(|e| format!("manifest parent: {e}"))?;
            validate_snapshot_name(&p.snapshot).map_err(|e| format!("manifest parent: {e}"))?;
            uuid::Uuid::parse_str(&p.uuid).map_err(|e| format!("manifest parent uuid: {e}"))?;
        }
        m.check_snapshots()?;
        Ok(m)
    }

    /// The snapshot named `name`.
    pub fn snapshot(&self, name: &str) -> Option<&SnapshotRecord> {
        self.snapshots.iter().find(|s| s.name == name)
    }

    /// Whether a snapshot keeps checkpoint `seq`.
    pub fn snapshot_keeps_checkpoint(&self, seq: u64) -> bool {
        self.snapshots.iter().any(|s| s.checkpoint_seq == seq)
    }

    fn check_snapshots(&self) -> Result<(), String> {
        if self.snapshots.len() > MAX_SNAPSHOTS {
            return Err(format!(
                "manifest lists {} snapshots (at most {MAX_SNAPSHOTS})",
                self.snapshots.len()
            ));
        }
        let mut names = std::collections::BTreeSet::new();
        for s in &self.snapshots {
            validate_snapshot_name(&s.name).map_err(|e| format!("manifest snapshot: {e}"))?;
            if !names.insert(s.name.as_str()) {
                return Err(format!("manifest lists snapshot {:?} twice", s.name));
            }
        }
        Ok(())
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
            snapshots: Vec::new(),
            last_rollback: None,
            parent: None,
            compression: None,
            encryption: None,
            qos: None,
        };
        let b = m.encode();
        assert_eq!(&b[8..10], &1u16.to_le_bytes());
        assert_eq!(Manifest::decode(&b).unwrap(), m);
        for i in [0, 8, 13, 17, 30] {
            let mut c = b.clone();
            c[i] ^= 1;
            assert!(Manifest::decode(&c).is_err(), "byte {i}");
        }
        assert!(Manifest::decode(&b[..b.len() - 1]).is_err());
    }

    #[test]
    fn snapshots_make_version_2_and_are_checked() {
        let mut m = Manifest {
            name: "vm1".into(),
            uuid: uuid::Uuid::new_v4().simple().to_string(),
            size_bytes: 1 << 30,
            created_unix_ms: 1,
            checkpoint_seq: Some(4),
            epoch: 2,
            pending_deletions: Vec::new(),
            last_gc: None,
            snapshots: vec![SnapshotRecord {
                name: "before-upgrade".into(),
                checkpoint_seq: 4,
                created_unix_ms: 3,
                size_bytes: 1 << 30,
                deleting: false,
                delta: Some(DeltaRecord {
                    from_checkpoint_seq: 2,
                    bytes: 72,
                }),
            }],
            last_rollback: None,
            parent: None,
            compression: None,
            encryption: None,
            qos: None,
        };
        let b = m.encode();
        assert_eq!(&b[8..10], &2u16.to_le_bytes());
        assert_eq!(Manifest::decode(&b).unwrap(), m);
        // What an older strata says of it.
        let old = envelope::decode(MAGIC, "manifest", MAX_BODY_BYTES, &b).unwrap_err();
        assert!(old.contains("version 2"), "{old}");
        let mut future = b.clone();
        future[8] = 4;
        let e = Manifest::decode(&future).unwrap_err();
        assert!(e.contains("upgrade"), "{e}");
        // Compression or encryption make version 3; an older strata
        // (reading up to 2) refuses it, naming the version.
        let mut at_rest = m.clone();
        at_rest.compression = Some("lz4".into());
        let b3 = at_rest.encode();
        assert_eq!(&b3[8..10], &3u16.to_le_bytes());
        assert_eq!(Manifest::decode(&b3).unwrap(), at_rest);
        let old = envelope::decode_versions(MAGIC, "manifest", 2, MAX_BODY_BYTES, &b3).unwrap_err();
        assert!(old.contains("version 3"), "{old}");
        let mut v2 = b3.clone();
        v2[8] = 2;
        assert!(
            Manifest::decode(&v2).is_err(),
            "version 2 naming compression"
        );
        at_rest.compression = Some("brotli".into());
        assert!(Manifest::decode(&at_rest.encode()).is_err());
        at_rest.compression = None;
        at_rest.encryption = Some(EncryptionRecord {
            cipher: "rot13".into(),
            wrapped_key: String::new(),
            key_fingerprint: String::new(),
        });
        let e = Manifest::decode(&at_rest.encode()).unwrap_err();
        assert!(e.contains("upgrade"), "{e}");
        m.snapshots.push(m.snapshots[0].clone());
        assert!(Manifest::decode(&m.encode()).unwrap_err().contains("twice"));
        m.snapshots[1].name = "a/b".into();
        assert!(Manifest::decode(&m.encode()).is_err());
    }
}
