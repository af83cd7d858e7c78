//! The read path of a volume: READ and BLOCK_STATUS.
//!
//! The extent map is looked up under the volume lock with no allocation
//! per piece; holes and allocated zeros are filled, data still in memory
//! (open or sealed segments) is copied, and the stored pieces are handed to
//! the read path (`read/`) after the lock is released, with disjoint slices
//! of the client's buffer as destinations (no extra copy).

use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{Allocation, Volume};
use crate::error::VolumeError;
use crate::gc::ReadPiece;
use crate::map::Target;
use crate::read::{start_readahead, stored_pieces_in, MAX_WINDOW_PIECES};

/// Reads of data moved by GC in the middle of a read (see `read`); each
/// retry follows a real deletion, so only a read slower than several GC
/// passes in a row (each after a grace period) runs out of them.
const MAX_READ_ATTEMPTS: u32 = 8;

impl Volume {
    /// Reads `buf.len()` bytes at `offset`.
    ///
    /// A read that looked a segment up just before garbage collection moved
    /// its data and deleted it (a GET delayed past the grace period) finds
    /// the object gone: it looks the map up again and reads where the data
    /// is now.
    pub async fn read(self: &Arc<Self>, offset: u64, buf: &mut [u8]) -> Result<(), VolumeError> {
        self.note_read_for_profile(offset, buf.len() as u64);
        self.hydration
            .client_read_bytes
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
        let mut attempt = 0;
        loop {
            let mut seqs = Vec::new();
            match self.read_once(offset, buf, &mut seqs).await {
                Err(e) if attempt < MAX_READ_ATTEMPTS && self.any_deleted(&seqs) => {
                    tracing::info!(volume = %self.name, offset, error = %strata_store::ErrorText(&e), "segment deleted while being read (data moved by GC); reading again");
                    attempt += 1;
                }
                result => return result,
            }
        }
    }

    /// Whether any of `seqs` is no longer stored (deleted by GC; an
    /// ancestor's segments are never deleted under a clone).
    pub(super) fn any_deleted(&self, seqs: &[u64]) -> bool {
        let base = self.lineage.base_seq();
        let st = self.state.lock();
        seqs.iter().any(|s| *s > base && !st.stored.contains_key(s))
    }

    async fn read_once(
        self: &Arc<Self>,
        offset: u64,
        buf: &mut [u8],
        seqs: &mut Vec<u64>,
    ) -> Result<(), VolumeError> {
        self.check_range(offset, buf.len() as u64)?;
        if let Some(detail) = self.ownership.fenced() {
            return Err(VolumeError::Failed {
                name: self.name.clone(),
                detail,
            });
        }
        let reader = self.reader();
        // Stored pieces, in address order (also what a rewrite of a
        // fragmented read moves).
        let mut misses: Vec<ReadPiece> = Vec::new();
        {
            let st = self.state.lock();
            st.map.lookup(offset, buf.len() as u64, |p| {
                let at = (p.start - offset) as usize;
                let dst = &mut buf[at..at + p.len as usize];
                match p.target {
                    None | Some(Target::Zero) => dst.fill(0),
                    Some(Target::Data { seq, offset: so }) => {
                        let so = so as usize;
                        if seq == st.open.seq {
                            dst.copy_from_slice(&st.open.data[so..so + dst.len()]);
                        } else if let Some(s) = st.sealed.get(&seq) {
                            dst.copy_from_slice(&s.data[so..so + dst.len()]);
                        } else if let Some(data) = st.settling.get(&seq) {
                            dst.copy_from_slice(&data[so..so + dst.len()]);
                        } else {
                            misses.push(ReadPiece {
                                volume_offset: p.start,
                                seq,
                                segment_offset: so as u64,
                                len: p.len,
                                buf_offset: at,
                            });
                        }
                    }
                }
            });
        }
        start_readahead(
            &self.caches,
            &reader,
            offset,
            buf.len() as u64,
            self.size_bytes(),
            |window| self.stored_pieces(window),
            |seq| self.lineage.reader_for(&self.caches, &reader, seq),
        );
        if misses.is_empty() {
            return Ok(());
        }
        seqs.extend(misses.iter().map(|m| m.seq));
        let pieces = stored_pieces_in(
            buf,
            misses
                .iter()
                .map(|m| (m.buf_offset, m.len as usize, m.seq, m.segment_offset)),
        );
        self.lineage
            .read_pieces(&self.caches, &reader, pieces)
            .await?;
        self.rewrite_fragmented_read(&misses, buf);
        Ok(())
    }

    /// Allocation of `[offset, offset+len)` in at most `max_extents` runs.
    pub fn block_status(
        &self,
        offset: u64,
        len: u64,
        max_extents: usize,
    ) -> Result<Vec<(u64, Allocation)>, VolumeError> {
        self.check_range(offset, len)?;
        Ok(self.state.lock().map.allocation(offset, len, max_extents))
    }

    /// Stored pieces `(seq, segment offset, len)` of a volume range, looked
    /// up under the volume lock (a clone's inherited ones too: read-ahead
    /// fetches them through their owner's reader).
    fn stored_pieces(&self, range: Range<u64>) -> Vec<(u64, u64, u64)> {
        let mut out = Vec::new();
        let st = self.state.lock();
        st.map.lookup(range.start, range.end - range.start, |p| {
            if let Some(Target::Data { seq, offset }) = p.target {
                if !st.in_memory(seq) && out.len() < MAX_WINDOW_PIECES {
                    out.push((seq, offset, p.len));
                }
            }
        });
        out
    }
}
