//! The journal file on disk: creating it, reading its superblock, and the
//! recovery scan that reads records back after a crash.
//!
//! Owns file-level I/O outside the append path (which is `journal.rs` and
//! `journal_commit.rs`); the byte layout is `format/journal.rs`.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::error::JournalError;
use crate::format::journal::{
    RecordHeader, RecordKind, Superblock, RECORD_HEADER_BYTES, SUPERBLOCK_BYTES,
    SUPERBLOCK_USED_BYTES,
};

/// A record found by the recovery scan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub kind: RecordKind,
    pub jseq: u64,
    pub offset: u64,
    pub len: u64,
    pub payload: Vec<u8>,
    /// Logical position just after this record.
    pub end_lpos: u64,
}

/// Where a scan starts: a logical position and the jseq expected there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    pub lpos: u64,
    pub jseq: u64,
}

pub(crate) fn io_err<'a>(
    path: &'a Path,
    what: &'static str,
) -> impl FnOnce(io::Error) -> JournalError + 'a {
    move |source| JournalError::Io {
        path: path.to_path_buf(),
        what,
        source,
    }
}

/// Creates a new journal file, sparse: its ring takes no disk until
/// written (a volume that is never written costs its superblock's 4 KiB,
/// and `serve` does not write gigabytes of zeros for a host's volumes
/// before it is ready). A hole reads as zeros, which no record header
/// verifies, so a scan stops there as at any stale byte. Replaces any old
/// file.
pub fn create(path: &Path, sb: Superblock) -> Result<(), JournalError> {
    let tmp = path.with_extension("journal.tmp");
    let file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(&tmp)
        .map_err(io_err(&tmp, "create"))?;
    file.set_len(SUPERBLOCK_BYTES + sb.ring_bytes)
        .map_err(io_err(&tmp, "set the ring's size"))?;
    file.write_all_at(&sb.encode(), 0)
        .map_err(io_err(&tmp, "write superblock"))?;
    file.sync_all().map_err(io_err(&tmp, "fsync"))?;
    std::fs::rename(&tmp, path).map_err(io_err(path, "rename into place"))?;
    if let Some(dir) = path.parent() {
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io_err(dir, "fsync directory"))?;
    }
    Ok(())
}

/// Writes zeros over ring bytes `[start, end)` (ring offsets) and waits
/// until they are on disk (`write_back`), so the blocks are allocated and
/// written before records overwrite them.
pub(crate) fn write_zeros(file: &File, start: u64, end: u64) -> io::Result<()> {
    static ZEROS: [u8; 64 << 10] = [0u8; 64 << 10];
    let mut at = start;
    while at < end {
        let n = (end - at).min(ZEROS.len() as u64) as usize;
        file.write_all_at(&ZEROS[..n], SUPERBLOCK_BYTES + at)?;
        at += n as u64;
    }
    write_back(file, start, end)
}

/// Starts the writeback of ring bytes `[start, end)` (ring offsets) and
/// waits until they are on disk (`strata_store::write_back`: pacing, not
/// durability).
pub(crate) fn write_back(file: &File, start: u64, end: u64) -> io::Result<()> {
    strata_store::write_back(file, SUPERBLOCK_BYTES + start, end - start)
}

/// Gives the disk space of ring bytes `[start, end)` (ring offsets) back to
/// the filesystem; they read as zeros after. Only for bytes before the
/// journal's tail (safe in the store): nothing there is replayed.
pub(crate) fn punch_hole(file: &File, start: u64, end: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    if end <= start {
        return Ok(());
    }
    let (offset, len) = (SUPERBLOCK_BYTES + start, end - start);
    let (Ok(offset), Ok(len)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    };
    let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    // SAFETY: fallocate on a file descriptor this `File` owns; no memory is
    // passed.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), mode, offset, len) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Reads the superblock of an existing journal; `Ok(None)` if absent.
pub fn read_superblock(path: &Path) -> Result<Option<Superblock>, JournalError> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err(path, "open")(e)),
    };
    let mut b = vec![0u8; SUPERBLOCK_USED_BYTES];
    match file.read_exact_at(&mut b, 0) {
        Ok(()) => {}
        // Shorter than a superblock: not a journal (one is created whole,
        // then renamed into place).
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
            return Err(JournalError::Invalid {
                path: path.to_path_buf(),
                detail: "shorter than a superblock".into(),
            })
        }
        Err(e) => return Err(io_err(path, "read superblock")(e)),
    }
    let sb = Superblock::decode(&b).map_err(|detail| JournalError::Invalid {
        path: path.to_path_buf(),
        detail,
    })?;
    let len = file.metadata().map_err(io_err(path, "stat"))?.len();
    if len < SUPERBLOCK_BYTES + sb.ring_bytes {
        return Err(JournalError::Invalid {
            path: path.to_path_buf(),
            detail: format!("file is {len} bytes, shorter than its ring"),
        });
    }
    Ok(Some(sb))
}

/// Reads records one by one from `start` (recovery).
pub struct Scanner {
    file: File,
    sb: Superblock,
    pos: Position,
}

impl Scanner {
    pub fn open(path: &Path, sb: Superblock, start: Position) -> Result<Scanner, JournalError> {
        let file = File::open(path).map_err(io_err(path, "open for replay"))?;
        Ok(Scanner {
            file,
            sb,
            pos: start,
        })
    }

    /// Where the next record would be: after the last valid one.
    pub fn position(&self) -> Position {
        self.pos
    }

    /// The next valid record, or `None` at the end of the log.
    pub fn next_record(&mut self) -> io::Result<Option<Record>> {
        let ring = self.sb.ring_bytes;
        for _hop in 0..2 {
            let phys = self.pos.lpos % ring;
            if ring - phys < RECORD_HEADER_BYTES {
                self.pos.lpos += ring - phys;
                continue;
            }
            let mut raw = [0u8; RECORD_HEADER_BYTES as usize];
            self.file.read_exact_at(&mut raw, SUPERBLOCK_BYTES + phys)?;
            let Some(h) = RecordHeader::decode(&raw).filter(|h| h.jseq == self.pos.jseq) else {
                return Ok(None);
            };
            // Bounded by the ring: a record never crosses its end.
            let rec = h.record_bytes();
            if rec > ring - phys {
                return Ok(None);
            }
            let mut payload = vec![0u8; h.payload_bytes as usize];
            self.file
                .read_exact_at(&mut payload, SUPERBLOCK_BYTES + phys + RECORD_HEADER_BYTES)?;
            if !h.verify(&self.sb.journal_id, &raw, &payload) {
                return Ok(None);
            }
            if h.kind == RecordKind::Wrap {
                self.pos.lpos += ring - phys;
                continue;
            }
            self.pos.lpos += rec;
            self.pos.jseq += 1;
            return Ok(Some(Record {
                kind: h.kind,
                jseq: h.jseq,
                offset: h.offset,
                len: h.len,
                payload,
                end_lpos: self.pos.lpos,
            }));
        }
        Ok(None)
    }
}
