//! Reading a snapshot's delta (`format/snapshot_delta.rs`).

use strata_store::{ObjectNames, Store};

use super::checkpoints::unseal;
use super::store_error::read_whole;
use crate::error::VolumeError;
use crate::format::key_wrap::Key;
use crate::format::manifest::{DeltaRecord, SnapshotRecord};
use crate::format::sealed_object::SealedKind;
use crate::format::snapshot_delta::{self, DeltaPiece};

/// Reads the delta `delta` of snapshot `record` of the volume with `uuid`,
/// verified and checked against the record (same volume, checkpoints, size).
pub(crate) async fn read_snapshot_delta(
    store: &Store,
    names: &ObjectNames,
    uuid: [u8; 16],
    record: &SnapshotRecord,
    delta: DeltaRecord,
    data_key: Option<&Key>,
) -> Result<Vec<DeltaPiece>, VolumeError> {
    let path = names.snapshot_delta(record.checkpoint_seq, delta.from_checkpoint_seq);
    let bytes = read_whole(store, &path).await?;
    let corrupt = |detail: String| VolumeError::Corrupt {
        path: path.to_string(),
        detail,
    };
    let to = record.checkpoint_seq;
    let bytes = unseal(&bytes, SealedKind::SnapshotDelta, to, &uuid, data_key).map_err(corrupt)?;
    let (info, pieces) = snapshot_delta::decode(&bytes).map_err(corrupt)?;
    let expected = (
        record.checkpoint_seq,
        delta.from_checkpoint_seq,
        uuid,
        record.size_bytes,
    );
    let found = (
        info.to_seq,
        info.from_seq,
        info.volume_uuid,
        info.volume_size_bytes,
    );
    if found != expected {
        return Err(corrupt(format!(
            "the delta does not match snapshot {:?} of the manifest",
            record.name
        )));
    }
    Ok(pieces)
}
