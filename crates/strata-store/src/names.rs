//! Object names. One volume owns everything under `<volume>/`:
//!
//! ```text
//! <volume>/manifest                    small; latest checkpoint, identity
//! <volume>/segments/<seq:016x>         immutable log segments
//! <volume>/checkpoints/<seq:016x>      extent map as of segment <seq>
//! <volume>/lease                       one-writer lease
//! <volume>/clones/<snapshot>/<clone>   a clone made from that snapshot
//! <volume>/profiles/<seq:016x>         what the first clone of the snapshot at
//!                                      checkpoint <seq> read first
//! .hosts/<host id>                     a host's liveness (no volume name
//!                                      starts with '.')
//! ```
//! Sequence numbers are zero-padded hex so a listing sorts in log order.

use object_store::path::Path;

/// Longest volume name accepted, in bytes.
pub const MAX_VOLUME_NAME_BYTES: usize = 64;

/// Checks a volume name: 1..=64 bytes of `[A-Za-z0-9._-]`, not starting
/// with `.` or `-` (so it is a safe path component and NBD export name).
pub fn validate_volume_name(name: &str) -> Result<(), String> {
    validate_name("volume", name)
}

/// Checks the name of a `kind` (volume, snapshot) by the volume name rule.
pub fn validate_name(kind: &str, name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_VOLUME_NAME_BYTES {
        return Err(format!(
            "{kind} name must be 1 to {MAX_VOLUME_NAME_BYTES} bytes long (got {})",
            name.len()
        ));
    }
    if name.starts_with('.') || name.starts_with('-') {
        return Err(format!(
            "{kind} name {name:?} must not start with '.' or '-'"
        ));
    }
    let ok = name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-');
    if !ok {
        return Err(format!(
            "{kind} name {name:?} may only contain letters, digits, '.', '_' and '-'"
        ));
    }
    Ok(())
}

/// The volume an object belongs to (its first path component, when that is
/// a valid volume name), for log lines; `-` for objects of no volume.
pub fn volume_of(path: &Path) -> String {
    path.parts()
        .next()
        .map(|part| part.as_ref().to_string())
        .filter(|first| validate_volume_name(first).is_ok())
        .unwrap_or_else(|| "-".to_string())
}

/// The object names of one volume.
#[derive(Debug, Clone)]
pub struct ObjectNames {
    volume: String,
}

impl ObjectNames {
    /// Names for `volume`, which must have passed [`validate_volume_name`].
    pub fn new(volume: &str) -> Self {
        debug_assert!(validate_volume_name(volume).is_ok());
        ObjectNames {
            volume: volume.to_string(),
        }
    }

    pub fn volume_prefix(&self) -> Path {
        Path::from(self.volume.as_str())
    }

    pub fn manifest(&self) -> Path {
        Path::from(format!("{}/manifest", self.volume))
    }

    /// The liveness record of host `id` (`.hosts/<id>`).
    pub fn host_record(id: &str) -> Path {
        Path::from(format!(".hosts/{id}"))
    }

    pub fn lease(&self) -> Path {
        Path::from(format!("{}/lease", self.volume))
    }

    pub fn segments_prefix(&self) -> Path {
        Path::from(format!("{}/segments", self.volume))
    }

    pub fn segment(&self, seq: u64) -> Path {
        Path::from(format!("{}/segments/{seq:016x}", self.volume))
    }

    pub fn checkpoints_prefix(&self) -> Path {
        Path::from(format!("{}/checkpoints", self.volume))
    }

    pub fn checkpoint(&self, seq: u64) -> Path {
        Path::from(format!("{}/checkpoints/{seq:016x}", self.volume))
    }

    /// Where the deltas between consecutive snapshots live.
    pub fn deltas_prefix(&self) -> Path {
        Path::from(format!("{}/deltas", self.volume))
    }

    /// The delta from the snapshot at checkpoint `from` to the one at
    /// checkpoint `to`.
    pub fn snapshot_delta(&self, to: u64, from: u64) -> Path {
        Path::from(format!("{}/deltas/{to:016x}-{from:016x}", self.volume))
    }

    /// `(to, from)` of a delta's object name, if it is one.
    pub fn parse_delta(location: &Path) -> Option<(u64, u64)> {
        let (to, from) = location.filename()?.split_once('-')?;
        if to.len() != 16 || from.len() != 16 {
            return None;
        }
        let to = u64::from_str_radix(to, 16).ok()?;
        Some((to, u64::from_str_radix(from, 16).ok()?))
    }

    /// The access profile of the snapshot at checkpoint `seq`: what its
    /// first clone read first (`format/access_profile.rs`).
    pub fn profile(&self, seq: u64) -> Path {
        Path::from(format!("{}/profiles/{seq:016x}", self.volume))
    }

    /// Where clones of this volume's snapshots are registered.
    pub fn clone_markers_prefix(&self) -> Path {
        Path::from(format!("{}/clones", self.volume))
    }

    /// The markers of clones made from snapshot `snapshot`.
    pub fn snapshot_clones_prefix(&self, snapshot: &str) -> Path {
        Path::from(format!("{}/clones/{snapshot}", self.volume))
    }

    /// The marker saying volume `clone` was made from snapshot `snapshot`
    /// of this volume (both names validated by the caller).
    pub fn clone_marker(&self, snapshot: &str, clone: &str) -> Path {
        Path::from(format!("{}/clones/{snapshot}/{clone}", self.volume))
    }

    /// The sequence number in a segment or checkpoint object name, if it is one.
    pub fn parse_seq(location: &Path) -> Option<u64> {
        let last = location.filename()?;
        if last.len() != 16 {
            return None;
        }
        u64::from_str_radix(last, 16).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_sort_in_log_order_and_parse_back() {
        let n = ObjectNames::new("vm1");
        assert_eq!(n.segment(255).as_ref(), "vm1/segments/00000000000000ff");
        assert_eq!(ObjectNames::parse_seq(&n.segment(255)), Some(255));
        assert_eq!(ObjectNames::parse_seq(&n.manifest()), None);
        assert!(n.segment(9).as_ref() < n.segment(10).as_ref());
        let d = n.snapshot_delta(0x20, 7);
        assert_eq!(d.as_ref(), "vm1/deltas/0000000000000020-0000000000000007");
        assert_eq!(ObjectNames::parse_delta(&d), Some((0x20, 7)));
        assert_eq!(ObjectNames::parse_delta(&n.segment(3)), None);
        assert_eq!(ObjectNames::parse_seq(&d), None);
    }

    #[test]
    fn bad_names_are_rejected() {
        for bad in ["", ".x", "-x", "a/b", "a b", "é", &"x".repeat(65)] {
            assert!(validate_volume_name(bad).is_err(), "{bad:?}");
        }
        for good in ["vm1", "a.b_c-d", "X"] {
            assert!(validate_volume_name(good).is_ok(), "{good:?}");
        }
    }
}
