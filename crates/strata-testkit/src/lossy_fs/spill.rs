//! The spill file: the bytes of every unsynced data write, kept on disk so a
//! test may write hundreds of MiB between two syncs without holding them in
//! RAM. The model keeps only `(offset, length)` into it per write.
//!
//! Append-only while writes are pending. A write's bytes are released (the
//! range punched out, best effort) once the write is synced or dropped, and
//! the whole file is truncated to zero whenever nothing is pending any more
//! (after every power cut at the latest), so its disk use follows what is
//! unsynced, not everything ever written.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Where a pending write's bytes live in the spill file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SpillRange {
    pub(crate) offset_bytes: u64,
    pub(crate) len_bytes: u64,
}

#[derive(Debug)]
pub(crate) struct Spill {
    file: File,
    end_bytes: u64,
}

impl Spill {
    /// Creates (or empties) the spill file at `path`.
    pub(crate) fn create(path: &Path) -> io::Result<Spill> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?;
        Ok(Spill { file, end_bytes: 0 })
    }

    /// Stores `data` at the end; returns where.
    pub(crate) fn append(&mut self, data: &[u8]) -> io::Result<SpillRange> {
        let offset_bytes = self.end_bytes;
        self.file.write_all_at(data, offset_bytes)?;
        self.end_bytes += data.len() as u64;
        Ok(SpillRange {
            offset_bytes,
            len_bytes: data.len() as u64,
        })
    }

    /// Reads `buf.len()` bytes starting `skip_bytes` into `range`.
    pub(crate) fn read(
        &self,
        range: SpillRange,
        skip_bytes: u64,
        buf: &mut [u8],
    ) -> io::Result<()> {
        if skip_bytes + buf.len() as u64 > range.len_bytes {
            return Err(io::Error::other("read past the end of a spill range"));
        }
        self.file
            .read_exact_at(buf, range.offset_bytes + skip_bytes)
    }

    /// The range is no longer needed: gives its blocks back (best effort,
    /// whole 4 KiB blocks inside it only, so neighbours are never touched).
    pub(crate) fn release(&mut self, range: SpillRange) {
        let start = range.offset_bytes.div_ceil(4096) * 4096;
        let end = (range.offset_bytes + range.len_bytes) / 4096 * 4096;
        if end > start {
            let _ = punch_hole(&self.file, start, end - start);
        }
    }

    /// Nothing is pending: forgets everything.
    pub(crate) fn reset(&mut self) -> io::Result<()> {
        self.file.set_len(0)?;
        self.end_bytes = 0;
        Ok(())
    }
}

/// `fallocate(PUNCH_HOLE | KEEP_SIZE)`: the range reads as zeros afterwards
/// and its blocks are freed.
pub(crate) fn punch_hole(file: &File, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let (Ok(offset), Ok(len)) = (
        libc::off_t::try_from(offset_bytes),
        libc::off_t::try_from(len_bytes),
    ) else {
        return Err(io::Error::from_raw_os_error(libc::EFBIG));
    };
    // SAFETY: fallocate only reads its integer arguments; the descriptor is
    // owned by `file`, which outlives the call.
    let rc = unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset,
            len,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn append_read_release_reset() {
        let dir = tempfile::tempdir().unwrap();
        let mut spill = Spill::create(&dir.path().join("spill")).unwrap();
        let a = spill.append(&[1u8; 10_000]).unwrap();
        let b = spill.append(b"hello").unwrap();
        assert_eq!(b.offset_bytes, 10_000);
        let mut buf = [0u8; 3];
        spill.read(b, 1, &mut buf).unwrap();
        assert_eq!(&buf, b"ell");
        assert!(spill.read(b, 4, &mut buf).is_err());
        spill.release(a);
        spill.read(b, 0, &mut [0u8; 5]).unwrap();
        spill.reset().unwrap();
        assert_eq!(spill.append(b"x").unwrap().offset_bytes, 0);
    }
}
