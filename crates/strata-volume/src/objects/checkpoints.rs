//! Reading a volume's checkpoint.

use strata_store::{ObjectNames, Store};

use super::store_error::read_whole;
use crate::error::VolumeError;
use std::borrow::Cow;

use crate::format::checkpoint::{self, CheckpointInfo, UsageTable};
use crate::format::key_wrap::Key;
use crate::format::manifest::{Manifest, SnapshotRecord};
use crate::format::sealed_object::{is_sealed, open, SealedKind};
use crate::map::ExtentMap;

/// The object inside `bytes` as stored: opened if sealed (an encrypted
/// volume's; `format/sealed_object.rs`). An encrypted volume's object in
/// the clear is refused: it was not written by strata.
pub(crate) fn unseal<'a>(
    bytes: &'a [u8],
    kind: SealedKind,
    seq: u64,
    uuid: &[u8; 16],
    data_key: Option<&Key>,
) -> Result<Cow<'a, [u8]>, String> {
    if is_sealed(bytes) {
        return open(bytes, kind, seq, uuid, data_key.map(Key::bytes)).map(Cow::Owned);
    }
    if data_key.is_some() {
        return Err("an encrypted volume's object is stored unencrypted (altered?)".into());
    }
    Ok(Cow::Borrowed(bytes))
}

/// Reads checkpoint `seq` of the volume `manifest` describes, verified and
/// checked against the manifest (same volume, same size, same position).
pub(crate) async fn read_checkpoint(
    store: &Store,
    names: &ObjectNames,
    manifest: &Manifest,
    uuid: [u8; 16],
    seq: u64,
    data_key: Option<&Key>,
) -> Result<(CheckpointInfo, ExtentMap), VolumeError> {
    let size = manifest.size_bytes;
    read_checkpoint_of_size(store, names, &manifest.name, uuid, seq, size, data_key).await
}

/// The map of snapshot `record` of the volume with `uuid` (empty for a
/// snapshot of a volume that never stored a segment).
pub(crate) async fn read_snapshot_map(
    store: &Store,
    names: &ObjectNames,
    volume: &str,
    uuid: [u8; 16],
    record: &SnapshotRecord,
    data_key: Option<&Key>,
) -> Result<ExtentMap, VolumeError> {
    if record.checkpoint_seq == 0 {
        return Ok(ExtentMap::new());
    }
    let seq = record.checkpoint_seq;
    let read =
        read_checkpoint_of_size(store, names, volume, uuid, seq, record.size_bytes, data_key);
    Ok(read.await?.1)
}

/// Reads checkpoint `seq`, verified and checked: same volume, `size_bytes`,
/// same position.
async fn read_checkpoint_of_size(
    store: &Store,
    names: &ObjectNames,
    volume: &str,
    uuid: [u8; 16],
    seq: u64,
    size_bytes: u64,
    data_key: Option<&Key>,
) -> Result<(CheckpointInfo, ExtentMap), VolumeError> {
    let (info, map, usage) =
        read_checkpoint_recorded(store, names, uuid, seq, size_bytes, data_key).await?;
    if let Some(recorded) = usage {
        let recomputed: Vec<(u64, u64)> = map.usage().iter().collect();
        if recorded != recomputed {
            // The map decoded and verified; its own counts win.
            tracing::error!(volume = %volume, checkpoint = seq, ?recorded, ?recomputed, "BUG: live bytes per segment recorded in the checkpoint differ from those recomputed from its extents; using the recomputation");
        }
    }
    Ok((info, map))
}

/// Reads checkpoint `seq`, verified and checked (same volume,
/// `size_bytes`, same position), with the live bytes per segment it
/// recorded (`None` for version 1) for a comparison with its map's.
pub(crate) async fn read_checkpoint_recorded(
    store: &Store,
    names: &ObjectNames,
    uuid: [u8; 16],
    seq: u64,
    size_bytes: u64,
    data_key: Option<&Key>,
) -> Result<(CheckpointInfo, ExtentMap, Option<UsageTable>), VolumeError> {
    let path = names.checkpoint(seq);
    let bytes = read_whole(store, &path).await?;
    let corrupt = |detail: String| VolumeError::Corrupt {
        path: path.to_string(),
        detail,
    };
    let bytes = unseal(&bytes, SealedKind::Checkpoint, seq, &uuid, data_key).map_err(corrupt)?;
    let (info, map, usage) = checkpoint::decode_with_usage(&bytes).map_err(corrupt)?;
    if info.seq != seq || info.volume_uuid != uuid || info.volume_size_bytes != size_bytes {
        return Err(corrupt("checkpoint does not match the manifest".into()));
    }
    Ok((info, map, usage))
}
