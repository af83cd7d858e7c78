//! Reading a segment's live pieces from the store for compaction.
//!
//! Ranged GETs of whole 4 KiB chunks, neighbouring pieces coalesced (gaps
//! up to `MAX_GAP_CHUNKS` are read through rather than split into another
//! request), every chunk verified against the segment's CRC table before a
//! byte is copied: a corrupt segment is reported, never rewritten into a
//! new one. Goes around the read caches on purpose: data about to be moved
//! would only evict what clients read.

use strata_store::{ObjectNames, Store};

use super::live_pieces::LivePiece;
use crate::error::VolumeError;
use crate::format::segment::{SegmentIndex, CHUNK_BYTES};
use crate::objects::store_error;

/// Chunks of dead data read through to keep one GET instead of two.
const MAX_GAP_CHUNKS: u64 = 16;

/// The bytes of `pieces` (in order, concatenated) of segment `seq`.
pub(crate) async fn read_live_data(
    store: &Store,
    names: &ObjectNames,
    seq: u64,
    idx: &SegmentIndex,
    pieces: &[LivePiece],
) -> Result<Vec<u8>, VolumeError> {
    let path = names.segment(seq);
    let total: u64 = pieces.iter().map(|p| p.len).sum();
    let mut out = Vec::with_capacity(total as usize);
    let mut i = 0;
    while i < pieces.len() {
        // One run: pieces whose chunks are near each other.
        let first_chunk = pieces[i].segment_offset / CHUNK_BYTES;
        let mut last_chunk = (pieces[i].segment_offset + pieces[i].len - 1) / CHUNK_BYTES;
        let mut j = i + 1;
        while j < pieces.len()
            && pieces[j].segment_offset / CHUNK_BYTES <= last_chunk + MAX_GAP_CHUNKS
        {
            last_chunk =
                last_chunk.max((pieces[j].segment_offset + pieces[j].len - 1) / CHUNK_BYTES);
            j += 1;
        }
        let range = idx.chunk_range(first_chunk, last_chunk);
        let bytes = store
            .get_range(&path, range)
            .await
            .map_err(store_error(store, "read", &path))?;
        let bytes = idx
            .decode_run(first_chunk, &bytes)
            .map_err(|detail| VolumeError::Corrupt {
                path: path.to_string(),
                detail,
            })?;
        let base = first_chunk * CHUNK_BYTES;
        for p in &pieces[i..j] {
            let at = (p.segment_offset - base) as usize;
            let piece = bytes
                .get(at..at + p.len as usize)
                .ok_or_else(|| VolumeError::Corrupt {
                    path: path.to_string(),
                    detail: format!(
                        "data area ends before bytes {}..{}",
                        p.segment_offset,
                        p.segment_offset + p.len
                    ),
                })?;
            out.extend_from_slice(piece);
        }
        i = j;
    }
    Ok(out)
}
