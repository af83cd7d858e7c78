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

/// Segment sequence numbers one listing request covers (an S3 listing
/// page holds 1,000 keys).
const LISTING_SPAN_SEQS: u64 = 1000;
/// Listing requests sent at once by `list_segments_upto`.
const PARALLEL_LISTINGS: usize = 8;

/// `list_segments` for a volume whose segments go up to about `upto`
/// (its checkpoint's seq): the range up to it is listed in spans of
/// `LISTING_SPAN_SEQS` sequence numbers, `PARALLEL_LISTINGS` at once, so
/// thousands of segments (a standby's holder uploads at every FLUSH) cost
/// a round trip or two instead of one per page.
pub(crate) async fn list_segments_upto(
    store: &Store,
    names: &ObjectNames,
    upto: u64,
) -> Result<Vec<(u64, u64)>, VolumeError> {
    use futures::StreamExt;
    let prefix = names.segments_prefix();
    let spans = upto / LISTING_SPAN_SEQS + 1;
    let listings = futures::stream::iter((0..spans).map(|i| {
        let (first, last) = (i * LISTING_SPAN_SEQS, (i + 1) * LISTING_SPAN_SEQS);
        // The last span has no end: whatever follows the checkpoint.
        let before = (i + 1 < spans).then(|| names.segment(last));
        let after = (first > 0).then(|| names.segment(first - 1));
        let prefix = &prefix;
        async move {
            store
                .list_between(prefix, after.as_ref(), before.as_ref())
                .await
        }
    }))
    .buffered(PARALLEL_LISTINGS);
    let mut seqs = Vec::new();
    futures::pin_mut!(listings);
    while let Some(listed) = listings.next().await {
        let metas = listed.map_err(store_error(store, "list", &prefix))?;
        seqs.extend(
            metas
                .iter()
                .filter_map(|m| ObjectNames::parse_seq(&m.location).map(|s| (s, m.size))),
        );
    }
    seqs.sort_unstable();
    seqs.dedup_by_key(|(s, _)| *s);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::segment::empty_segment_header;

    /// A segment sealed empty (a snapshot with no write since the last
    /// seal point), uncompressed, has zero bytes of tables: its index is
    /// read, empty, from a store that refuses a GET of zero bytes (the
    /// in-memory one does, as S3 clients do). Found by the power-loss loop
    /// on MinIO: recovery could not open a volume whose journal tail held
    /// such a segment.
    #[tokio::test]
    async fn an_empty_segments_index_is_read() {
        let store = Store::in_memory();
        let names = ObjectNames::new("v");
        let uuid = [3u8; 16];
        let header = empty_segment_header(12, &uuid);
        store
            .object_store()
            .put(&names.segment(12), header.into())
            .await
            .expect("put");
        let (idx, entries) = fetch_segment_header(&store, &names, 12, uuid, 1 << 30, None)
            .await
            .expect("the index of an empty segment");
        assert!(entries.is_empty());
        assert_eq!(idx.fixed.chunk_count, 0);
    }

    async fn spans_list_what_one_listing_does(store: Store) {
        let names = ObjectNames::new("v");
        let seqs = [1u64, 2, 999, 1000, 1001, 1999, 2500, 3000, 3001, 5000];
        for &s in &seqs {
            let body = vec![0u8; s as usize % 7 + 1];
            store
                .object_store()
                .put(&names.segment(s), body.into())
                .await
                .expect("put");
        }
        // Not a segment: ignored by both.
        let other = object_store::path::Path::from("v/segments/notaseq");
        store
            .object_store()
            .put(&other, vec![1u8].into())
            .await
            .expect("put");
        let whole = list_segments(&store, &names).await.expect("list");
        assert_eq!(whole.len(), seqs.len());
        for upto in [0, 999, 1000, 3000, 4999, 10_000] {
            let spans = list_segments_upto(&store, &names, upto)
                .await
                .expect("list");
            assert_eq!(spans, whole, "upto {upto}");
        }
    }

    #[tokio::test]
    async fn listing_in_spans_in_memory() {
        spans_list_what_one_listing_does(Store::in_memory()).await;
    }

    #[tokio::test]
    async fn listing_in_spans_on_a_directory() {
        let dir = tempfile::tempdir().expect("tempdir");
        spans_list_what_one_listing_does(Store::local(dir.path()).expect("store")).await;
    }
}
