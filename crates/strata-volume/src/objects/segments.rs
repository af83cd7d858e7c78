//! Listing a volume's segments and reading their headers.

use strata_store::{ObjectNames, Store};

use super::store_error::store_error;
use crate::error::VolumeError;
use crate::format::key_wrap::Key;
use crate::format::segment::{Entry, FixedHeader, SegmentIndex, FIXED_HEADER_BYTES};

/// Sequence numbers and sizes of a volume's stored segments, sorted.
pub(crate) async fn list_segments(
    store: &Store,
    names: &ObjectNames,
) -> Result<Vec<(u64, u64)>, VolumeError> {
    let prefix = names.segments_prefix();
    let metas = store
        .list_all(&prefix)
        .await
        .map_err(store_error(store, "list", &prefix))?;
    let mut seqs: Vec<(u64, u64)> = metas
        .iter()
        .filter_map(|m| ObjectNames::parse_seq(&m.location).map(|s| (s, m.size)))
        .collect();
    seqs.sort_unstable();
    Ok(seqs)
}

/// Fetches and verifies the fixed part of a stored segment's header (one
/// small ranged GET): its sizes, for garbage collection's weighing.
pub(crate) async fn fetch_fixed_header(
    store: &Store,
    names: &ObjectNames,
    seq: u64,
) -> Result<FixedHeader, VolumeError> {
    let path = names.segment(seq);
    let head = store
        .get_range(&path, 0..FIXED_HEADER_BYTES as u64)
        .await
        .map_err(store_error(store, "read", &path))?;
    FixedHeader::decode(&head).map_err(|detail| VolumeError::Corrupt {
        path: path.to_string(),
        detail,
    })
}

/// Fetches and verifies a stored segment's header and tables (reads need
/// the chunk CRCs, recovery the entries).
pub(crate) async fn fetch_segment_header(
    store: &Store,
    names: &ObjectNames,
    seq: u64,
    uuid: [u8; 16],
    volume_size_bytes: u64,
    data_key: Option<&Key>,
) -> Result<(SegmentIndex, Vec<Entry>), VolumeError> {
    let path = names.segment(seq);
    let corrupt = |detail: String| VolumeError::Corrupt {
        path: path.to_string(),
        detail,
    };
    let head = store
        .get_range(&path, 0..FIXED_HEADER_BYTES as u64)
        .await
        .map_err(store_error(store, "read", &path))?;
    let fixed = FixedHeader::decode(&head).map_err(corrupt)?;
    if fixed.seq != seq || fixed.volume_uuid != uuid {
        return Err(corrupt(
            "segment belongs to another volume or position".into(),
        ));
    }
    let tables = store
        .get_range(&path, FIXED_HEADER_BYTES as u64..fixed.tables_end())
        .await
        .map_err(store_error(store, "read", &path))?;
    let key = data_key.map(Key::bytes);
    SegmentIndex::decode_tables(fixed, &tables, volume_size_bytes, key).map_err(corrupt)
}
