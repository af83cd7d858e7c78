//! A snapshot served read-only (`VOL@SNAP`): the map of its checkpoint,
//! looked up without a lock (it never changes), and the volume's read path
//! (same caches, same segments). It needs no lease: while the snapshot
//! exists, garbage collection moves and deletes none of its segments,
//! whoever holds the volume.
//!
//! Deleting the snapshot while it is served makes its segments deletable
//! after the grace period; reads after that fail (the store has no object)
//! rather than return other data.

use std::ops::Range;
use std::sync::Arc;

use super::lineage::Lineage;
use crate::error::VolumeError;
use crate::format::manifest::SnapshotRecord;
use crate::map::{Allocation, ExtentMap, Target};
use crate::read::{
    start_readahead, stored_pieces_in, SharedCaches, VolumeReader, MAX_WINDOW_PIECES,
};

pub struct SnapshotView {
    volume: String,
    record: SnapshotRecord,
    map: ExtentMap,
    caches: Arc<SharedCaches>,
    reader: Arc<VolumeReader>,
    /// A snapshot of a clone reads its ancestors' segments too.
    lineage: Lineage,
}

impl std::fmt::Debug for SnapshotView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SnapshotView({}@{})", self.volume, self.record.name)
    }
}

impl SnapshotView {
    pub(crate) fn new(
        volume: &str,
        record: SnapshotRecord,
        map: ExtentMap,
        caches: Arc<SharedCaches>,
        reader: Arc<VolumeReader>,
        lineage: Lineage,
    ) -> SnapshotView {
        SnapshotView {
            volume: volume.to_string(),
            record,
            map,
            caches,
            reader,
            lineage,
        }
    }

    /// The map the view reads through.
    pub(crate) fn map(&self) -> &ExtentMap {
        &self.map
    }

    /// The same view through another map (a standby following its volume).
    pub(crate) fn with_map(&self, map: ExtentMap) -> Arc<SnapshotView> {
        Arc::new(SnapshotView {
            volume: self.volume.clone(),
            record: self.record.clone(),
            map,
            caches: self.caches.clone(),
            reader: self.reader.clone(),
            lineage: self.lineage.clone(),
        })
    }

    /// `VOL@SNAP`.
    pub fn export_name(&self) -> String {
        format!("{}@{}", self.volume, self.record.name)
    }

    pub fn record(&self) -> &SnapshotRecord {
        &self.record
    }

    pub fn size_bytes(&self) -> u64 {
        self.record.size_bytes
    }

    fn check_range(&self, offset: u64, len: u64) -> Result<(), VolumeError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.record.size_bytes => Ok(()),
            _ => Err(VolumeError::OutOfRange {
                offset,
                len,
                size: self.record.size_bytes,
            }),
        }
    }

    /// Reads `buf.len()` bytes at `offset`.
    pub async fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), VolumeError> {
        self.check_range(offset, buf.len() as u64)?;
        // (buffer offset, len, seq, segment offset) of the stored pieces.
        let mut stored: Vec<(usize, usize, u64, u64)> = Vec::new();
        self.map.lookup(offset, buf.len() as u64, |p| {
            let at = (p.start - offset) as usize;
            match p.target {
                None | Some(Target::Zero) => buf[at..at + p.len as usize].fill(0),
                Some(Target::Data { seq, offset: so }) => {
                    stored.push((at, p.len as usize, seq, so))
                }
            }
        });
        start_readahead(
            &self.caches,
            &self.reader,
            offset,
            buf.len() as u64,
            self.record.size_bytes,
            |window| self.stored_pieces(window),
            |seq| self.lineage.reader_for(&self.caches, &self.reader, seq),
        );
        if stored.is_empty() {
            return Ok(());
        }
        let pieces = stored_pieces_in(buf, stored.into_iter());
        self.lineage
            .read_pieces(&self.caches, &self.reader, pieces)
            .await
    }

    /// Allocation of `[offset, offset+len)` in at most `max_extents` runs.
    pub fn block_status(
        &self,
        offset: u64,
        len: u64,
        max_extents: usize,
    ) -> Result<Vec<(u64, Allocation)>, VolumeError> {
        self.check_range(offset, len)?;
        Ok(self.map.allocation(offset, len, max_extents))
    }

    /// The stored pieces of a range, inherited ones too (for read-ahead).
    fn stored_pieces(&self, range: Range<u64>) -> Vec<(u64, u64, u64)> {
        let mut out = Vec::new();
        self.map.lookup(range.start, range.end - range.start, |p| {
            if let Some(Target::Data { seq, offset }) = p.target {
                if out.len() < MAX_WINDOW_PIECES {
                    out.push((seq, offset, p.len));
                }
            }
        });
        out
    }
}
