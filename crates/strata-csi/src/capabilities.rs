//! Which volume capabilities strata offers: block or a filesystem (ext4,
//! xfs), used from one node at a time (a volume has one writer: its
//! lease's holder).

use crate::proto::volume_capability::access_mode::Mode;
use crate::proto::volume_capability::AccessType;
use crate::proto::VolumeCapability;

/// Filesystems a mount volume may have (made on first stage).
pub const FS_TYPES: [&str; 2] = ["ext4", "xfs"];
/// The filesystem of a mount volume whose capability names none, unless
/// `strata csi --default-fs-type` says otherwise.
pub const DEFAULT_FS_TYPE: &str = "ext4";

/// Ok if strata can serve `cap`; else what it cannot, for the message.
pub fn check(cap: &VolumeCapability) -> Result<(), String> {
    match &cap.access_type {
        None => return Err("a volume capability needs an access type: block or mount".to_string()),
        Some(AccessType::Block(_)) => {}
        Some(AccessType::Mount(m)) => {
            if !m.fs_type.is_empty() && !FS_TYPES.contains(&m.fs_type.as_str()) {
                return Err(format!(
                    "fs_type {:?} is not offered: {} (default {DEFAULT_FS_TYPE})",
                    m.fs_type,
                    FS_TYPES.join(", ")
                ));
            }
        }
    }
    let mode = cap
        .access_mode
        .as_ref()
        .map(|m| Mode::try_from(m.mode).unwrap_or(Mode::Unknown))
        .unwrap_or(Mode::Unknown);
    match mode {
        Mode::SingleNodeWriter
        | Mode::SingleNodeReaderOnly
        | Mode::SingleNodeSingleWriter
        | Mode::SingleNodeMultiWriter => Ok(()),
        Mode::Unknown => Err("a volume capability needs an access mode (e.g. SINGLE_NODE_WRITER)".to_string()),
        other => Err(format!(
            "access mode {} is not offered: a strata volume is used from one node at a time (SINGLE_NODE_WRITER, SINGLE_NODE_READER_ONLY, SINGLE_NODE_SINGLE_WRITER, SINGLE_NODE_MULTI_WRITER)",
            other.as_str_name()
        )),
    }
}

/// Whether `cap` asks for a raw block device.
pub fn is_block(cap: &VolumeCapability) -> bool {
    matches!(cap.access_type, Some(AccessType::Block(_)))
}

/// The filesystem a mount capability asks for, `default` when it names
/// none (`None` for block).
pub fn fs_type<'a>(cap: &'a VolumeCapability, default: &'a str) -> Option<&'a str> {
    match &cap.access_type {
        Some(AccessType::Mount(m)) if m.fs_type.is_empty() => Some(default),
        Some(AccessType::Mount(m)) => Some(m.fs_type.as_str()),
        _ => None,
    }
}

/// Whether `cap` asks for read-only use.
pub fn is_read_only(cap: &VolumeCapability) -> bool {
    cap.access_mode
        .as_ref()
        .is_some_and(|m| m.mode == Mode::SingleNodeReaderOnly as i32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::volume_capability::{AccessMode, BlockVolume, MountVolume};

    fn cap(access: AccessType, mode: Mode) -> VolumeCapability {
        VolumeCapability {
            access_type: Some(access),
            access_mode: Some(AccessMode { mode: mode as i32 }),
        }
    }

    fn mount(fs: &str) -> AccessType {
        AccessType::Mount(MountVolume {
            fs_type: fs.to_string(),
            ..MountVolume::default()
        })
    }

    #[test]
    fn single_node_block_and_ext4_or_xfs_are_offered() {
        for access in [
            AccessType::Block(BlockVolume {}),
            mount(""),
            mount("ext4"),
            mount("xfs"),
        ] {
            assert_eq!(check(&cap(access, Mode::SingleNodeWriter)), Ok(()));
        }
        assert_eq!(
            fs_type(&cap(mount(""), Mode::SingleNodeWriter), "xfs"),
            Some("xfs")
        );
        assert_eq!(
            fs_type(&cap(mount("ext4"), Mode::SingleNodeWriter), "xfs"),
            Some("ext4")
        );
        assert!(is_block(&cap(
            AccessType::Block(BlockVolume {}),
            Mode::SingleNodeWriter
        )));
    }

    #[test]
    fn what_is_not_offered_is_named() {
        let e = check(&cap(mount("btrfs"), Mode::SingleNodeWriter)).unwrap_err();
        assert!(e.contains("btrfs") && e.contains("ext4, xfs"), "{e}");
        let e = check(&cap(mount("ext4"), Mode::MultiNodeMultiWriter)).unwrap_err();
        assert!(e.contains("MULTI_NODE_MULTI_WRITER"), "{e}");
        let no_mode = VolumeCapability {
            access_type: Some(mount("ext4")),
            access_mode: None,
        };
        assert!(check(&no_mode).unwrap_err().contains("access mode"));
    }
}
