//! Which reads served from the disk cache get its read-ahead: the recent
//! streams through a volume's segments (`DiskStreams`, one per volume
//! reader, `disk_fill.rs` asks it before each piece).
//!
//! The disk cache places a segment's 64 KiB blocks by hash, so the
//! kernel's own read-ahead cannot know which slot holds a segment's next
//! block: strata asks for it (`POSIX_FADV_WILLNEED`, `block_cache.rs`).
//! That pays for data stored together and read together (an image's
//! files, a sequential reader of sequentially written data). It costs
//! for data written randomly and read sequentially (a backup of an aged
//! volume): a 1 MiB read there is ~256 pieces of 4 KiB from dozens of
//! segments, and asking for the 8 blocks after every one of them cost
//! 2,048 `fadvise` calls per MiB, each walking the page cache over pages
//! that were mostly there already: half the CPU of such a read on MinIO
//! (`xas_load`, `page_cache_ra_unbounded`), at 378 MB/s against 3.6 GB/s
//! on the embedded store.
//!
//! So a piece gets read-ahead only when it looks sequential in its
//! segment: it spans a whole block or more, or it starts where the last
//! piece read from that segment ended. Each stream also remembers how far
//! ahead it has asked, so a reader going on in small steps asks for each
//! block once.

/// Streams remembered per volume reader (most recent segments read).
const STREAMS: usize = 8;

/// One segment's stream: where its last piece read ended (bytes in the
/// segment's data area) and the block up to which the kernel was asked
/// to read.
#[derive(Debug, Clone, Copy)]
struct DiskStream {
    seq: u64,
    end_bytes: u64,
    ahead_until_block: u64,
}

/// The recent streams of one volume reader. See the module doc.
#[derive(Debug)]
pub(crate) struct DiskStreams {
    slots: [Option<DiskStream>; STREAMS],
    /// The slot a new stream takes (round-robin: the oldest one).
    next: usize,
}

impl Default for DiskStreams {
    fn default() -> Self {
        DiskStreams {
            slots: [None; STREAMS],
            next: 0,
        }
    }
}

/// A piece read from the disk cache: bytes `[offset_bytes, end_bytes)` of
/// segment `seq`'s data area (not empty).
#[derive(Debug, Clone, Copy)]
pub(crate) struct DiskPiece {
    pub seq: u64,
    pub offset_bytes: u64,
    pub end_bytes: u64,
}

impl DiskStreams {
    /// Notes `piece` and returns the blocks `[from, until)` of its segment
    /// (blocks of `block_bytes`) to read ahead, if any: up to
    /// `ahead_blocks` after its last block, below `blocks` (the
    /// segment's), each asked for once per stream.
    pub fn note(
        &mut self,
        piece: DiskPiece,
        block_bytes: u64,
        ahead_blocks: u64,
        blocks: u64,
    ) -> Option<(u64, u64)> {
        assert!(piece.offset_bytes < piece.end_bytes);
        let whole = piece.end_bytes - piece.offset_bytes >= block_bytes;
        let last_block = (piece.end_bytes - 1) / block_bytes;
        let until = (last_block + 1 + ahead_blocks).min(blocks);
        let slot = match self
            .slots
            .iter()
            .position(|s| s.is_some_and(|s| s.seq == piece.seq))
        {
            Some(i) => i,
            None => {
                let i = self.next;
                self.next = (self.next + 1) % STREAMS;
                self.slots[i] = Some(DiskStream {
                    seq: piece.seq,
                    end_bytes: u64::MAX,
                    ahead_until_block: 0,
                });
                i
            }
        };
        let s = self.slots[slot].as_mut()?;
        let follows = s.end_bytes == piece.offset_bytes;
        s.end_bytes = piece.end_bytes;
        if !(whole || follows) {
            return None;
        }
        // Blocks already asked for (by this stream, not behind the piece)
        // are not asked for again.
        let from = if s.ahead_until_block > last_block && s.ahead_until_block <= until {
            s.ahead_until_block
        } else {
            last_block + 1
        };
        if from >= until {
            return None;
        }
        s.ahead_until_block = until;
        Some((from, until))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BLOCK: u64 = 64 << 10;
    const AHEAD: u64 = 8;

    fn piece(seq: u64, offset: u64, len: u64) -> DiskPiece {
        DiskPiece {
            seq,
            offset_bytes: offset,
            end_bytes: offset + len,
        }
    }

    #[test]
    fn a_whole_block_reads_ahead_and_a_sequential_reader_asks_each_block_once() {
        let mut s = DiskStreams::default();
        assert_eq!(
            s.note(piece(7, 0, 1 << 20), BLOCK, AHEAD, 256),
            Some((16, 24))
        );
        // The next 1 MiB: only what is past the last ask.
        assert_eq!(
            s.note(piece(7, 1 << 20, 1 << 20), BLOCK, AHEAD, 256),
            Some((32, 40))
        );
        // Small steps through a block already asked for: nothing more.
        let mut s = DiskStreams::default();
        assert_eq!(s.note(piece(3, 0, 4096), BLOCK, AHEAD, 256), None);
        assert_eq!(
            s.note(piece(3, 4096, 4096), BLOCK, AHEAD, 256),
            Some((1, 9))
        );
        for i in 2..16 {
            assert_eq!(s.note(piece(3, i * 4096, 4096), BLOCK, AHEAD, 256), None);
        }
        // Into block 1: one more block ahead.
        assert_eq!(
            s.note(piece(3, BLOCK, 4096), BLOCK, AHEAD, 256),
            Some((9, 10))
        );
    }

    #[test]
    fn scattered_small_pieces_never_read_ahead() {
        let mut s = DiskStreams::default();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut asked = 0;
        for _ in 0..100_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let seq = x % 75;
            let offset = (x >> 8) % 4096 * 4096;
            if s.note(piece(seq, offset, 4096), BLOCK, AHEAD, 256)
                .is_some()
            {
                asked += 1;
            }
        }
        // Only a piece that lands right after its segment's last one (by
        // chance: 1 in 4,096 here) reads ahead.
        assert!(
            asked < 50,
            "{asked} read-aheads for 100,000 scattered pieces"
        );
    }

    #[test]
    fn never_past_the_segments_last_block() {
        let mut s = DiskStreams::default();
        assert_eq!(
            s.note(piece(1, 0, 2 * BLOCK), BLOCK, AHEAD, 4),
            Some((2, 4))
        );
        assert_eq!(
            s.note(piece(1, 2 * BLOCK, 2 * BLOCK), BLOCK, AHEAD, 4),
            None
        );
    }
}
