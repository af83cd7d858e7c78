//! The write side's state behind the volume lock: the extent map, the open
//! segment, sealed segments waiting for upload, and how far the store has
//! caught up.
//!
//! Owns the rules that keep them consistent: an operation goes to the open
//! segment and the map together (`apply_op`, shared by the write path and
//! journal replay); sealing opens the next segment; an upload is durable
//! only once every earlier one is (`mark_uploaded`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::host_budget::HostWriteBudget;
use super::open_segment::{OpenSegment, SealedSegment};
use crate::format::journal::RecordKind;
use crate::format::segment::{EntryKind, JournalSpan};
use crate::map::{ExtentMap, Target};
use crate::snapshot::{ChangedRanges, SnapshotPins};

/// Mutable state behind the volume lock.
pub(crate) struct State {
    pub map: ExtentMap,
    pub open: OpenSegment,
    /// Sealed segments still in memory: uploading, or uploaded but not yet
    /// contiguous with `durable_seq`.
    pub sealed: BTreeMap<u64, Arc<SealedSegment>>,
    /// Data of uploaded segments whose blocks the disk cache's writer has
    /// not written yet (read from here meanwhile, not by GETs); bounded by
    /// the writer's queue, each dropped once its batch is done.
    pub settling: BTreeMap<u64, Arc<Vec<u8>>>,
    pub uploaded: BTreeSet<u64>,
    /// Object bytes of every segment in the store that recovery or the map
    /// may need (what garbage collection weighs live bytes against).
    pub stored: BTreeMap<u64, u64>,
    /// Logical data bytes of stored segments, where known (uploaded by this
    /// process, read at recovery or by GC): a compressed segment's live
    /// bytes are weighed against these, not against its object bytes.
    pub data_sizes: BTreeMap<u64, u64>,
    /// Journal bytes of everything in memory (open + sealed); changed only
    /// through `add_buffered`/`release_buffered`, which keep the server's
    /// budget (`host`) in step.
    pub buffered_cost_bytes: u64,
    /// The server's budget for written data, shared by its volumes
    /// (unlimited until `Volume::open` attaches the server's).
    pub host: Arc<HostWriteBudget>,
    /// Every segment up to this one is in the store.
    pub durable_seq: u64,
    pub segments_since_checkpoint: u64,
    /// Journal span of the newest sealed segment (or of the checkpoint or
    /// segment recovery ended with).
    pub last_sealed_span: JournalSpan,
    /// Highest checkpoint requested / stored.
    pub checkpoint_requested_seq: u64,
    pub checkpoint_done_seq: u64,
    pub failed: Option<String>,
    /// Segments the volume's snapshots keep (garbage collection moves and
    /// deletes none of them).
    pub pins: SnapshotPins,
    /// A resize is under way: writes wait (`volume/resize.rs`).
    pub resizing: bool,
    /// What changed since the newest snapshot (`None` while the volume has
    /// none): the next snapshot's delta.
    pub changed: Option<ChangedRanges>,
    /// Staging names of segment files (`staged_segment.rs`) to remove once
    /// the segment they are keyed by is durable: no replay reads through
    /// them after that.
    pub staged_unlink: BTreeMap<u64, Vec<std::path::PathBuf>>,
}

impl State {
    /// Whether segment `seq`'s data is in memory (open, sealed, or
    /// uploaded but not yet in the disk cache): reads copy it, no fetch.
    pub(crate) fn in_memory(&self, seq: u64) -> bool {
        seq == self.open.seq || self.sealed.contains_key(&seq) || self.settling.contains_key(&seq)
    }

    /// Seals the open segment into `sealed` and opens the next one in
    /// `buffer` (the write path and journal replay share this).
    pub(crate) fn seal_open(&mut self, buffer: Vec<u8>) -> Arc<SealedSegment> {
        if self.open.span.first_jseq == 0 {
            self.open.span = self.copy_only_span();
        }
        let mut next = OpenSegment::new(self.open.seq + 1, buffer, self.open.span.journal_id);
        next.reserve_bytes = self.open.reserve_bytes;
        let sealed = Arc::new(std::mem::replace(&mut self.open, next).seal());
        self.sealed.insert(sealed.seq, sealed.clone());
        self.last_sealed_span = sealed.span;
        self.segments_since_checkpoint += 1;
        sealed
    }

    /// The span of a segment holding only garbage collector copies (no
    /// journal record). Recovery resumes the journal where the last applied
    /// segment's span ends, so this one says where its predecessor ended,
    /// in the journal in use: when the predecessor came through another
    /// journal (the volume was served elsewhere), the current one started
    /// at position 0 right after its last record.
    fn copy_only_span(&self) -> JournalSpan {
        let last = self.last_sealed_span;
        let journal_id = self.open.span.journal_id;
        JournalSpan {
            journal_id,
            first_jseq: 0,
            last_jseq: last.last_jseq,
            end_lpos: if last.journal_id == journal_id {
                last.end_lpos
            } else {
                0
            },
        }
    }

    /// The staging names whose segments are durable now, taken out.
    pub(crate) fn take_staged_unlinks(&mut self) -> Vec<std::path::PathBuf> {
        let keep = self.staged_unlink.split_off(&(self.durable_seq + 1));
        let done = std::mem::replace(&mut self.staged_unlink, keep);
        done.into_values().flatten().collect()
    }

    /// Records an upload; advances `durable_seq` over contiguous uploads and
    /// frees their memory. Returns the journal position everything before
    /// which is now in the store, if it moved.
    pub(crate) fn mark_uploaded(
        &mut self,
        seq: u64,
        object_bytes: u64,
        data_bytes: u64,
    ) -> Option<u64> {
        self.uploaded.insert(seq);
        self.stored.insert(seq, object_bytes);
        self.data_sizes.insert(seq, data_bytes);
        let mut release_lpos = None;
        loop {
            let next = self.durable_seq + 1;
            if !self.uploaded.remove(&next) {
                break;
            }
            self.durable_seq += 1;
            let durable = self.durable_seq;
            if let Some(s) = self.sealed.remove(&durable) {
                self.release_buffered(s.cost_bytes);
                release_lpos = Some(s.span.end_lpos);
            }
        }
        release_lpos
    }
}

impl State {
    /// Counts `cost` more bytes in memory, here and in the server's budget.
    pub(crate) fn add_buffered(&mut self, cost: u64) {
        self.host.add(self.buffered_cost_bytes, cost);
        self.buffered_cost_bytes += cost;
    }

    /// Counts `freed` bytes uploaded, here and in the server's budget.
    pub(crate) fn release_buffered(&mut self, freed: u64) {
        self.buffered_cost_bytes -= freed;
        self.host.release(self.buffered_cost_bytes, freed);
    }

    /// Moves what the state holds into the server's budget `host`.
    pub(crate) fn attach_host_budget(&mut self, host: Arc<HostWriteBudget>) {
        let held = self.buffered_cost_bytes;
        self.host.release(0, held);
        host.add(0, held);
        self.host = host;
    }
}

impl Drop for State {
    /// A volume dropped with data in memory (failed, fenced) gives its
    /// share of the server's budget back.
    fn drop(&mut self) {
        self.host.release(0, self.buffered_cost_bytes);
    }
}

#[cfg(test)]
impl State {
    /// An empty state with segment `open_seq` open (unit tests).
    pub(crate) fn for_tests(open_seq: u64) -> State {
        State {
            map: ExtentMap::new(),
            open: OpenSegment::new(open_seq, Vec::new(), [1; 16]),
            sealed: BTreeMap::new(),
            settling: BTreeMap::new(),
            uploaded: BTreeSet::new(),
            stored: BTreeMap::new(),
            data_sizes: BTreeMap::new(),
            buffered_cost_bytes: 0,
            host: Arc::new(HostWriteBudget::unlimited()),
            durable_seq: open_seq - 1,
            segments_since_checkpoint: 0,
            last_sealed_span: JournalSpan::default(),
            checkpoint_requested_seq: 0,
            checkpoint_done_seq: 0,
            failed: None,
            pins: SnapshotPins::default(),
            resizing: false,
            changed: None,
            staged_unlink: BTreeMap::new(),
        }
    }
}

/// Bytes of the store a volume uses, by what still needs them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct SpaceUsage {
    /// Segment objects in the store.
    pub stored_bytes: u64,
    /// Bytes of those segments the extent map points at.
    pub live_bytes: u64,
    /// Stored bytes nothing points at: what garbage collection can reclaim.
    pub garbage_bytes: u64,
    /// Stored segments the map points at.
    pub live_segments: u64,
    pub stored_segments: u64,
}

impl State {
    /// What the volume's stored segments hold, live and not. O(segments).
    pub(crate) fn space_usage(&self) -> SpaceUsage {
        let usage = self.map.usage();
        let mut out = SpaceUsage {
            stored_segments: self.stored.len() as u64,
            ..SpaceUsage::default()
        };
        for (&seq, &bytes) in &self.stored {
            out.stored_bytes += bytes;
            let live = usage.live_bytes(seq);
            out.live_bytes += live;
            out.live_segments += u64::from(live > 0);
            // The object bytes nothing points at: for a compressed segment
            // (smaller than the data it holds) the live share of it.
            let data = self.data_bytes(seq, bytes).max(1);
            let live_stored = if bytes >= data {
                live
            } else {
                (u128::from(bytes) * u128::from(live.min(data)) / u128::from(data)) as u64
            };
            out.garbage_bytes += bytes - live_stored.min(bytes);
        }
        out
    }

    /// What segment `seq` (of `object_bytes` in the store) holds in
    /// logical bytes: its data size if known, else its object size (exact
    /// enough for version 1 segments, whose header is small).
    pub(crate) fn data_bytes(&self, seq: u64, object_bytes: u64) -> u64 {
        self.data_sizes.get(&seq).copied().unwrap_or(object_bytes)
    }

    /// Stored segments by the logical bytes they hold (see `data_bytes`):
    /// what garbage collection weighs live bytes against.
    pub(crate) fn gc_weights(&self) -> BTreeMap<u64, u64> {
        self.stored
            .iter()
            .map(|(&seq, &bytes)| (seq, self.data_bytes(seq, bytes)))
            .collect()
    }
}

/// Applies one logged operation to the open segment and the map (the write
/// path and journal replay share this).
#[allow(clippy::too_many_arguments)]
pub(crate) fn apply_op(
    st: &mut State,
    kind: RecordKind,
    offset: u64,
    len: u64,
    data: &[u8],
    chunk_crcs: &[u32],
    cost: u64,
    jseq: u64,
    end_lpos: u64,
) {
    let entry_kind = match kind {
        // Replay passes a placed write's bytes as a write's.
        RecordKind::Write | RecordKind::Placed => EntryKind::Write,
        RecordKind::Zero => EntryKind::Zero,
        RecordKind::Unmap | RecordKind::Wrap => EntryKind::Unmap,
    };
    let data_offset = st
        .open
        .push(entry_kind, offset, len, data, cost, jseq, end_lpos);
    if entry_kind == EntryKind::Write {
        st.open.note_chunk_crcs(data_offset, chunk_crcs);
    }
    let target = match entry_kind {
        EntryKind::Write => Some(Target::Data {
            seq: st.open.seq,
            offset: data_offset,
        }),
        EntryKind::Zero => Some(Target::Zero),
        EntryKind::Unmap => None,
    };
    if let Some(changed) = &mut st.changed {
        changed.mark(&st.map, offset, len, entry_kind == EntryKind::Write);
    }
    st.map.set(offset, len, target);
    st.add_buffered(cost);
}
