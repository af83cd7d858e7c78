//! What one check covers: the volume named, its manifest as read when the
//! check began, the key to its data, the snapshot checked (`VOL@SNAP`),
//! and for a clone the ancestors that own the segments it inherits.

use strata_store::{ObjectNames, Store};

use crate::config::MAX_VOLUME_BYTES;
use crate::format::key_wrap::Key;
use crate::format::manifest::{Manifest, SnapshotRecord};
use crate::snapshot::Lineage;

/// The volume that owns a segment: the one checked, or an ancestor.
#[derive(Debug, Clone)]
pub(crate) struct Owner {
    pub name: String,
    pub uuid: [u8; 16],
    pub store: Store,
    pub names: ObjectNames,
    /// Not the volume checked: a clone's ancestor.
    pub ancestor: bool,
}

pub(crate) struct Scope {
    pub store: Store,
    pub names: ObjectNames,
    /// As read when the check began.
    pub manifest: Manifest,
    pub uuid: [u8; 16],
    /// The volume's data key, unwrapped (encrypted volumes).
    pub data_key: Option<Key>,
    /// A clone's ancestors (empty otherwise, or when they could not be
    /// resolved: a problem reported by the caller).
    pub lineage: Lineage,
    /// A clone whose ancestors could not be resolved (reported): the
    /// segments it inherits are not checked.
    pub inherited_unreadable: bool,
    /// The snapshot checked, if the check is of `VOL@SNAP`.
    pub snapshot: Option<SnapshotRecord>,
    pub quick: bool,
}

impl Scope {
    /// Segment numbers up to this one are a clone's ancestors' (0: none).
    pub fn base_seq(&self) -> u64 {
        self.manifest
            .parent
            .as_ref()
            .map_or(0, |p| p.checkpoint_seq)
    }

    /// The checkpoint the volume's map starts from: its own, or (a clone
    /// that has none yet) its parent snapshot's; 0 for an empty volume.
    pub fn checkpoint_seq(&self) -> u64 {
        self.manifest
            .checkpoint_seq
            .unwrap_or_else(|| self.base_seq())
    }

    /// Whose segment `seq` is.
    pub fn owner(&self, seq: u64) -> Owner {
        match self.lineage.owner_of(seq) {
            Some(a) => Owner {
                names: ObjectNames::new(&a.name),
                name: a.name.clone(),
                uuid: a.uuid,
                store: a.store.clone(),
                ancestor: true,
            },
            None => Owner {
                name: self.manifest.name.clone(),
                uuid: self.uuid,
                store: self.store.clone(),
                names: self.names.clone(),
                ancestor: false,
            },
        }
    }

    /// What a segment's entries are checked against: the volume's size for
    /// segments recovery replays (written after the last resize, whose
    /// checkpoint precedes them), the largest size for older ones (they
    /// may predate a shrink), as recovery and GC do.
    pub fn entry_bound_bytes(&self, seq: u64) -> u64 {
        if seq > self.checkpoint_seq() {
            self.manifest.size_bytes
        } else {
            MAX_VOLUME_BYTES
        }
    }
}
