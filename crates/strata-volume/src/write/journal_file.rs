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

/// Creates a new journal file (zero-filled, so later writes are overwrites
/// and `fdatasync` need not update extent metadata), replacing any old one.
pub fn create(path: &Path, sb: Superblock) -> Result<(), JournalError> {
    let tmp = path.with_extension("journal.tmp");
    let file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(&tmp)
        .map_err(io_err(&tmp, "create"))?;
    zero_fill(
        &file,
        &tmp,
        SUPERBLOCK_BYTES,
        SUPERBLOCK_BYTES + sb.ring_bytes,
    )?;
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

/// Writes zeros over `[start, end)`, with O_DIRECT where the filesystem
/// allows it: a 256 MiB journal written through the page cache cost seconds
/// of fresh-page faults on first open here, and evicted useful cache.
fn zero_fill(file: &File, path: &Path, start: u64, end: u64) -> Result<(), JournalError> {
    use std::os::unix::fs::OpenOptionsExt;
    const CHUNK: usize = 1 << 20;
    const ALIGN: usize = 4096;
    let direct = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .ok();
    let target = direct.as_ref().unwrap_or(file);
    // An aligned 1 MiB window inside a slightly larger zeroed buffer.
    let raw = vec![0u8; CHUNK + ALIGN];
    let skip = raw.as_ptr().align_offset(ALIGN).min(ALIGN);
    let zeros = &raw[skip..skip + CHUNK];
    let mut off = start;
    while off < end {
        let n = (end - off).min(CHUNK as u64) as usize;
        let result = target.write_all_at(&zeros[..n], off);
        if let Err(e) = result {
            if direct.is_some() && e.raw_os_error() == Some(libc::EINVAL) {
                // Unaligned tail or no O_DIRECT support: finish buffered.
                return zero_fill_buffered(file, path, off, end, zeros);
            }
            return Err(io_err(path, "zero-fill")(e));
        }
        off += n as u64;
    }
    Ok(())
}

fn zero_fill_buffered(
    file: &File,
    path: &Path,
    mut off: u64,
    end: u64,
    zeros: &[u8],
) -> Result<(), JournalError> {
    while off < end {
        let n = (end - off).min(zeros.len() as u64) as usize;
        file.write_all_at(&zeros[..n], off)
            .map_err(io_err(path, "zero-fill"))?;
        off += n as u64;
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
    file.read_exact_at(&mut b, 0)
        .map_err(io_err(path, "read superblock"))?;
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
