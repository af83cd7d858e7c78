//! Recovery from the store: the latest checkpoint, then the segments
//! stored after it, while contiguous.

use std::collections::BTreeMap;

use futures::StreamExt;

use strata_store::{ObjectNames, Store};

use crate::error::VolumeError;
use crate::format::key_wrap::Key;
use crate::format::manifest::Manifest;
use crate::format::segment::{Entry, EntryKind, JournalSpan};
use crate::map::{ExtentMap, Target};
use crate::objects::{fetch_segment_header, list_segments_upto, read_checkpoint, store_error};

/// What the store says about a volume.
pub(crate) struct Recovered {
    pub map: ExtentMap,
    /// The first sequence number not in the store.
    pub next_seq: u64,
    /// Journal span of the last segment (or checkpoint) applied.
    pub span: Option<JournalSpan>,
    pub checkpoint_seq: u64,
    /// Object bytes of the stored segments before `next_seq`.
    pub stored: BTreeMap<u64, u64>,
    /// Logical data bytes of the segments whose headers were read.
    pub data_sizes: BTreeMap<u64, u64>,
}

/// Segment headers read at once during recovery.
const PARALLEL_HEADER_READS: usize = 8;

/// Steps 1 and 2: the checkpoint's map, then every contiguous later
/// segment applied; segments after a gap deleted.
///
/// The checkpoint, the listing and the probe for the segment after the
/// checkpoint go to the store at once, and the headers of the listed
/// segments after it `PARALLEL_HEADER_READS` at a time (applied in
/// order): an open costs round trips, not their sum (a live migration's
/// switchover waits for it).
pub(crate) async fn recover_from_store(
    store: &Store,
    names: &ObjectNames,
    manifest: &Manifest,
    uuid: [u8; 16],
    base_map: Option<(ExtentMap, u64)>,
    data_key: Option<&Key>,
) -> Result<Recovered, VolumeError> {
    let base = manifest
        .checkpoint_seq
        .or(base_map.as_ref().map(|(_, seq)| *seq))
        .unwrap_or(0);
    let start = async {
        Ok::<_, VolumeError>(match (manifest.checkpoint_seq, base_map) {
            (Some(seq), _) => {
                let (info, map) =
                    read_checkpoint(store, names, manifest, uuid, seq, data_key).await?;
                (map, Some(info.span))
            }
            // A clone's first open: its parent snapshot's map; its own
            // segments come after the snapshot's checkpoint.
            (None, Some((map, _))) => (map, None),
            (None, None) => (ExtentMap::new(), None),
        })
    };
    let (started, segments, first_probe) = tokio::join!(
        start,
        list_segments_upto(store, names, base),
        probe_unlisted(store, names, base + 1)
    );
    let (mut map, mut span) = started?;
    let listed: BTreeMap<u64, u64> = segments?.into_iter().collect();
    let mut first_probe = Some(first_probe);
    let mut stored: BTreeMap<u64, u64> = listed.range(..=base).map(|(&s, &b)| (s, b)).collect();
    let mut next = base + 1;
    let mut data_sizes = BTreeMap::new();
    loop {
        // The listed run from `next`, read at once; past it, a probe (a
        // segment found is a run of one).
        let mut run: Vec<(u64, u64)> = (next..)
            .map_while(|s| listed.get(&s).map(|&size| (s, size)))
            .collect();
        if run.is_empty() {
            let probed = match first_probe.take().filter(|_| next == base + 1) {
                Some(p) => p?,
                None => probe_unlisted(store, names, next).await?,
            };
            let Some(size) = probed else { break };
            tracing::warn!(volume = %names.volume_prefix(), seq = next, "the store's listing did not show a segment it holds; recovering it");
            run.push((next, size));
        }
        first_probe = None;
        let size = manifest.size_bytes;
        let mut headers = futures::stream::iter(run.into_iter().map(|(seq, bytes)| async move {
            fetch_segment_header(store, names, seq, uuid, size, data_key)
                .await
                .map(|h| (seq, bytes, h))
        }))
        .buffered(PARALLEL_HEADER_READS);
        while let Some(read) = headers.next().await {
            let (seq, bytes, (idx, entries)) = read?;
            apply_entries(&mut map, seq, &entries);
            data_sizes.insert(seq, idx.fixed.data_bytes);
            span = Some(idx.fixed.span);
            stored.insert(seq, bytes);
            next = seq + 1;
        }
    }
    let orphans: Vec<u64> = listed.range(next..).map(|(&s, _)| s).collect();
    delete_orphans(store, names, &orphans).await?;
    Ok(Recovered {
        map,
        next_seq: next,
        span,
        checkpoint_seq: base,
        stored,
        data_sizes,
    })
}

/// Asks the store for the segment the listing ends before. Some stores'
/// listings lag their writes (SeaweedFS was seen to list segments 80 and
/// 81 but not 78, written just before a kill -9): trusting the listing
/// would delete 80 and 81 and then find 78 in the way of the next upload.
/// One HEAD per open; it finds nothing on a store whose listing is exact.
async fn probe_unlisted(
    store: &Store,
    names: &ObjectNames,
    seq: u64,
) -> Result<Option<u64>, VolumeError> {
    let path = names.segment(seq);
    match store.object_store().head(&path).await {
        Ok(meta) => Ok(Some(meta.size)),
        Err(object_store::Error::NotFound { .. }) => Ok(None),
        Err(e) => Err(store_error(store, "head", &path)(e)),
    }
}

/// Applies a stored segment's entries to the map, in log order.
pub(crate) fn apply_entries(map: &mut ExtentMap, seq: u64, entries: &[Entry]) {
    for e in entries {
        let target = match e.kind {
            EntryKind::Write => Some(Target::Data {
                seq,
                offset: e.data_offset,
            }),
            EntryKind::Zero => Some(Target::Zero),
            EntryKind::Unmap => None,
        };
        map.set(e.offset, e.len, target);
    }
}

/// Deletes segments stored after a missing one: their writes are in the
/// journal, whose replay starts before the gap, and applying them before
/// the gap's writes would break the prefix order.
async fn delete_orphans(
    store: &Store,
    names: &ObjectNames,
    orphans: &[u64],
) -> Result<(), VolumeError> {
    for &seq in orphans {
        tracing::warn!(volume = %names.volume_prefix(), seq, "deleting segment stored after a missing one; the journal replays its writes");
        let path = names.segment(seq);
        store
            .delete(&path)
            .await
            .map_err(store_error(store, "delete", &path))?;
    }
    Ok(())
}
