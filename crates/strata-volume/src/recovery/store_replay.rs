//! Recovery from the store: the latest checkpoint, then the segments
//! stored after it, while contiguous.

use std::collections::BTreeMap;

use strata_store::{ObjectNames, Store};

use crate::error::VolumeError;
use crate::format::key_wrap::Key;
use crate::format::manifest::Manifest;
use crate::format::segment::{Entry, EntryKind, JournalSpan};
use crate::map::{ExtentMap, Target};
use crate::objects::{fetch_segment_header, list_segments, read_checkpoint, store_error};

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

/// Steps 1 and 2: the checkpoint's map, then every contiguous later
/// segment applied; segments after a gap deleted.
pub(crate) async fn recover_from_store(
    store: &Store,
    names: &ObjectNames,
    manifest: &Manifest,
    uuid: [u8; 16],
    base_map: Option<(ExtentMap, u64)>,
    data_key: Option<&Key>,
) -> Result<Recovered, VolumeError> {
    let (mut map, base, mut span) = match (manifest.checkpoint_seq, base_map) {
        (Some(seq), _) => {
            let (info, map) = read_checkpoint(store, names, manifest, uuid, seq, data_key).await?;
            (map, seq, Some(info.span))
        }
        // A clone's first open: its parent snapshot's map; its own
        // segments come after the snapshot's checkpoint.
        (None, Some((map, seq))) => (map, seq, None),
        (None, None) => (ExtentMap::new(), 0, None),
    };
    let segments = list_segments(store, names).await?;
    let mut next = base + 1;
    let mut orphans = Vec::new();
    let mut data_sizes = BTreeMap::new();
    for &(seq, _) in segments.iter().filter(|s| s.0 > base) {
        if seq != next {
            orphans.push(seq);
            continue;
        }
        let (idx, entries) =
            fetch_segment_header(store, names, seq, uuid, manifest.size_bytes, data_key).await?;
        apply_entries(&mut map, seq, &entries);
        data_sizes.insert(seq, idx.fixed.data_bytes);
        span = Some(idx.fixed.span);
        next += 1;
    }
    delete_orphans(store, names, &orphans).await?;
    let stored = segments.into_iter().filter(|s| s.0 < next).collect();
    Ok(Recovered {
        map,
        next_seq: next,
        span,
        checkpoint_seq: base,
        stored,
        data_sizes,
    })
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
