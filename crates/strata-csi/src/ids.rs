//! How CSI's names and ids map to strata's volumes and snapshots.
//!
//! A volume's id is its strata name; a snapshot's is `VOLUME@SNAPSHOT`,
//! strata's own notation. CSI names are free text of up to 128 bytes
//! while strata's are at most 64 bytes of `[A-Za-z0-9._-]`, so a name that
//! is not a valid strata name maps to `csi-` and 32 hex digits of its
//! SHA-256: a function, so a retried call finds what the first one made
//! without an index.

use strata_store::validate_name;

/// The driver's name (the CSIDriver object's and the StorageClass's
/// `provisioner`).
pub const DRIVER_NAME: &str = "csi.strata.dev";

/// Hex digits of the name's SHA-256 kept in a mapped name (128 bits: two
/// names never meet in practice).
const HASH_HEX_DIGITS: usize = 32;

/// The strata name for CSI name `name` (`kind`: "volume" or "snapshot").
pub fn strata_name(kind: &str, name: &str) -> String {
    if validate_name(kind, name).is_ok() && !name.starts_with("csi-") {
        return name.to_string();
    }
    // A valid name that starts with "csi-" is mapped too: it could be
    // another name's mapping.
    let digest = ring::digest::digest(&ring::digest::SHA256, name.as_bytes());
    let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("csi-{}", &hex[..HASH_HEX_DIGITS])
}

/// A snapshot's CSI id from its volume and strata name.
pub fn snapshot_id(volume: &str, snapshot: &str) -> String {
    format!("{volume}@{snapshot}")
}

/// The volume and snapshot of snapshot id `id`, if it is one this driver
/// could have made.
pub fn parse_snapshot_id(id: &str) -> Option<(&str, &str)> {
    let (volume, snapshot) = id.split_once('@')?;
    (validate_name("volume", volume).is_ok() && validate_name("snapshot", snapshot).is_ok())
        .then_some((volume, snapshot))
}

/// Whether `id` is a volume id this driver could have made.
pub fn is_volume_id(id: &str) -> bool {
    validate_name("volume", id).is_ok()
}

/// The snapshot a clone made from a volume (CSI's volume source) reads:
/// taken of the source for it, deleted with it.
pub fn clone_source_snapshot(clone: &str) -> String {
    // "csi-clone." and a 64-byte volume name would be too long: the
    // snapshot name is mapped like any other.
    strata_name("snapshot", &format!("csi-clone.{clone}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubernetes_names_are_kept_and_others_mapped() {
        let pvc = "pvc-0b5bde2e-6f7b-4c2b-9d27-6f2f5d3f1a11";
        assert_eq!(strata_name("volume", pvc), pvc);
        let long =
            "sanity-Controller Service CreateVolume should not fail with maximum-length name "
                .repeat(2);
        let mapped = strata_name("volume", &long);
        assert!(mapped.starts_with("csi-") && mapped.len() == 4 + HASH_HEX_DIGITS);
        assert!(validate_name("volume", &mapped).is_ok());
        assert_eq!(mapped, strata_name("volume", &long), "a function");
        assert_ne!(strata_name("volume", "csi-abc"), "csi-abc");
    }

    #[test]
    fn snapshot_ids_round_trip_and_reject_what_is_not_one() {
        let id = snapshot_id("vm1", "s1");
        assert_eq!(parse_snapshot_id(&id), Some(("vm1", "s1")));
        for bad in ["vm1", "vm1@", "@s1", "vm1@s 1", "a@b@c"] {
            assert_eq!(parse_snapshot_id(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_clones_snapshot_name_is_valid_for_the_longest_volume_name() {
        let name = clone_source_snapshot(&"v".repeat(64));
        assert!(validate_name("snapshot", &name).is_ok(), "{name}");
    }
}
