//! One regular file's contents: the current view, the durable view, and the
//! log of unsynced data ops between them.
//!
//! Both views are real files in the backing directory (`<ino>.cur`,
//! `<ino>.dur`), so a file may be as large as the backing disk allows. Every
//! data op is applied to the current file at once (reads are served from it)
//! and logged, with a write's bytes in the [`Spill`]. `fsync` replays the log
//! onto the durable file; a power cut replays only what the loss mode keeps
//! (maybe part of one write), then makes the current file equal to the
//! durable one again by copying back only the ranges the log could have made
//! different (each op records that range when it is logged), so a cut costs
//! what was pending, not the file's size.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::spill::{punch_hole, Spill, SpillRange};

/// What an unsynced data op did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DataOpKind {
    /// `pwrite`: the bytes are in the spill.
    Write {
        offset_bytes: u64,
        spill: SpillRange,
    },
    /// truncate / extend (setattr size, or fallocate growing the file).
    SetLen { size_bytes: u64 },
    /// fallocate `PUNCH_HOLE` (`keep_size`) or `ZERO_RANGE`: the range reads
    /// as zeros; without `keep_size` the file grows to cover it.
    Zero {
        offset_bytes: u64,
        len_bytes: u64,
        keep_size: bool,
    },
}

/// A logged data op.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DataOp {
    /// Global order of data ops (over all files), for the cut's decisions.
    pub(crate) seq: u64,
    pub(crate) kind: DataOpKind,
    /// From this offset to `dirty_end_bytes`, applying this op (or not) may
    /// make the current and durable files differ.
    dirty_start_bytes: u64,
    dirty_end_bytes: u64,
}

/// How much of a pending op a power cut keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Keep {
    All,
    Nothing,
    /// The first this-many bytes of a write.
    Prefix(u64),
}

/// One regular file's two views and its pending log.
#[derive(Debug)]
pub(crate) struct FileData {
    cur: File,
    dur: File,
    cur_path: PathBuf,
    dur_path: PathBuf,
    cur_size_bytes: u64,
    dur_size_bytes: u64,
    log: Vec<DataOp>,
}

/// Chunk size for copying between backing files.
const COPY_CHUNK_BYTES: usize = 1 << 20;

impl FileData {
    /// An empty file whose views live in `dir` under names made from `ino`.
    pub(crate) fn create(dir: &Path, ino: u64) -> io::Result<FileData> {
        let cur_path = dir.join(format!("{ino}.cur"));
        let dur_path = dir.join(format!("{ino}.dur"));
        Ok(FileData {
            cur: open_new(&cur_path)?,
            dur: open_new(&dur_path)?,
            cur_path,
            dur_path,
            cur_size_bytes: 0,
            dur_size_bytes: 0,
            log: Vec::new(),
        })
    }

    pub(crate) fn size_bytes(&self) -> u64 {
        self.cur_size_bytes
    }

    pub(crate) fn log(&self) -> &[DataOp] {
        &self.log
    }

    /// Up to `len_bytes` from `offset_bytes` of the current view.
    pub(crate) fn read(&self, offset_bytes: u64, len_bytes: u32) -> io::Result<Vec<u8>> {
        let end = self
            .cur_size_bytes
            .min(offset_bytes.saturating_add(u64::from(len_bytes)));
        let mut buf = vec![0u8; end.saturating_sub(offset_bytes) as usize];
        self.cur.read_exact_at(&mut buf, offset_bytes)?;
        Ok(buf)
    }

    pub(crate) fn write(
        &mut self,
        seq: u64,
        offset_bytes: u64,
        data: &[u8],
        spill: &mut Spill,
    ) -> io::Result<()> {
        let end = offset_bytes
            .checked_add(data.len() as u64)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EFBIG))?;
        self.cur.write_all_at(data, offset_bytes)?;
        let range = spill.append(data)?;
        self.push_op(
            seq,
            DataOpKind::Write {
                offset_bytes,
                spill: range,
            },
            offset_bytes,
            end,
        );
        self.cur_size_bytes = self.cur_size_bytes.max(end);
        Ok(())
    }

    pub(crate) fn set_len(&mut self, seq: u64, size_bytes: u64) -> io::Result<()> {
        self.cur.set_len(size_bytes)?;
        self.push_op(seq, DataOpKind::SetLen { size_bytes }, size_bytes, u64::MAX);
        self.cur_size_bytes = size_bytes;
        Ok(())
    }

    pub(crate) fn zero(
        &mut self,
        seq: u64,
        offset_bytes: u64,
        len_bytes: u64,
        keep_size: bool,
    ) -> io::Result<()> {
        let end = offset_bytes
            .checked_add(len_bytes)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EFBIG))?;
        let mut size = self.cur_size_bytes;
        zero_range(&self.cur, &mut size, offset_bytes, len_bytes, keep_size)?;
        let kind = DataOpKind::Zero {
            offset_bytes,
            len_bytes,
            keep_size,
        };
        self.push_op(seq, kind, offset_bytes, end);
        self.cur_size_bytes = size;
        Ok(())
    }

    /// Logs an op applied to the current view, whose size before it was
    /// `self.cur_size_bytes`.
    fn push_op(&mut self, seq: u64, kind: DataOpKind, start: u64, end: u64) {
        self.log.push(DataOp {
            seq,
            kind,
            dirty_start_bytes: start.min(self.cur_size_bytes),
            dirty_end_bytes: end,
        });
    }

    /// fsync/fdatasync: the whole log reaches the durable view. Returns the
    /// number of ops synced.
    pub(crate) fn sync(&mut self, spill: &mut Spill) -> io::Result<usize> {
        let log = std::mem::take(&mut self.log);
        for op in &log {
            apply(
                &self.dur,
                &mut self.dur_size_bytes,
                op.kind,
                Keep::All,
                spill,
            )?;
            release(op, spill);
        }
        Ok(log.len())
    }

    /// The power cut: each pending op reaches the durable view as `keep`
    /// says, then the current view becomes the durable one.
    pub(crate) fn cut(
        &mut self,
        keep: impl Fn(&DataOp) -> Keep,
        spill: &mut Spill,
    ) -> io::Result<()> {
        let log = std::mem::take(&mut self.log);
        for op in &log {
            apply(
                &self.dur,
                &mut self.dur_size_bytes,
                op.kind,
                keep(op),
                spill,
            )?;
            release(op, spill);
        }
        for (start, end) in dirty_ranges(&log) {
            let end = end.min(self.dur_size_bytes);
            if start < end {
                copy_range(&self.dur, &self.cur, start, end)?;
            }
        }
        self.cur.set_len(self.dur_size_bytes)?;
        self.cur_size_bytes = self.dur_size_bytes;
        Ok(())
    }

    /// The inode is gone: forgets its log and deletes its backing files.
    pub(crate) fn remove(self, spill: &mut Spill) {
        for op in &self.log {
            release(op, spill);
        }
        let _ = std::fs::remove_file(&self.cur_path);
        let _ = std::fs::remove_file(&self.dur_path);
    }
}

fn open_new(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
}

fn release(op: &DataOp, spill: &mut Spill) {
    if let DataOpKind::Write { spill: range, .. } = op.kind {
        spill.release(range);
    }
}

/// Applies `kind` (as much as `keep` says) to `file` of size `size`.
fn apply(
    file: &File,
    size: &mut u64,
    kind: DataOpKind,
    keep: Keep,
    spill: &Spill,
) -> io::Result<()> {
    if keep == Keep::Nothing {
        return Ok(());
    }
    match kind {
        DataOpKind::Write {
            offset_bytes,
            spill: range,
        } => {
            let len = match keep {
                Keep::Prefix(n) => n.min(range.len_bytes),
                _ => range.len_bytes,
            };
            copy_from_spill(file, offset_bytes, spill, range, len)?;
            if len > 0 {
                *size = (*size).max(offset_bytes + len);
            }
        }
        DataOpKind::SetLen { size_bytes } => {
            file.set_len(size_bytes)?;
            *size = size_bytes;
        }
        DataOpKind::Zero {
            offset_bytes,
            len_bytes,
            keep_size,
        } => zero_range(file, size, offset_bytes, len_bytes, keep_size)?,
    }
    Ok(())
}

fn copy_from_spill(
    file: &File,
    offset_bytes: u64,
    spill: &Spill,
    range: SpillRange,
    len_bytes: u64,
) -> io::Result<()> {
    let mut buf = vec![0u8; COPY_CHUNK_BYTES.min(len_bytes as usize)];
    let mut done = 0u64;
    while done < len_bytes {
        let n = (len_bytes - done).min(buf.len() as u64) as usize;
        spill.read(range, done, &mut buf[..n])?;
        file.write_all_at(&buf[..n], offset_bytes + done)?;
        done += n as u64;
    }
    Ok(())
}

/// Zeros `[offset, offset + len)` (clipped to the size when `keep_size`),
/// growing the file to cover it otherwise.
fn zero_range(
    file: &File,
    size: &mut u64,
    offset_bytes: u64,
    len_bytes: u64,
    keep_size: bool,
) -> io::Result<()> {
    let end = offset_bytes.saturating_add(len_bytes);
    let zero_end = end.min(*size);
    if offset_bytes < zero_end && punch_hole(file, offset_bytes, zero_end - offset_bytes).is_err() {
        write_zeros(file, offset_bytes, zero_end)?;
    }
    if !keep_size && end > *size {
        file.set_len(end)?;
        *size = end;
    }
    Ok(())
}

fn write_zeros(file: &File, start: u64, end: u64) -> io::Result<()> {
    let zeros = vec![0u8; COPY_CHUNK_BYTES.min((end - start) as usize)];
    let mut at = start;
    while at < end {
        let n = (end - at).min(zeros.len() as u64) as usize;
        file.write_all_at(&zeros[..n], at)?;
        at += n as u64;
    }
    Ok(())
}

fn copy_range(from: &File, to: &File, start: u64, end: u64) -> io::Result<()> {
    let mut buf = vec![0u8; COPY_CHUNK_BYTES.min((end - start) as usize)];
    let mut at = start;
    while at < end {
        let n = (end - at).min(buf.len() as u64) as usize;
        from.read_exact_at(&mut buf[..n], at)?;
        to.write_all_at(&buf[..n], at)?;
        at += n as u64;
    }
    Ok(())
}

/// The union of the ops' dirty ranges, sorted and merged.
fn dirty_ranges(log: &[DataOp]) -> Vec<(u64, u64)> {
    let mut ranges: Vec<(u64, u64)> = log
        .iter()
        .map(|op| (op.dirty_start_bytes, op.dirty_end_bytes))
        .collect();
    ranges.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for (start, end) in ranges {
        match merged.last_mut() {
            Some(last) if start <= last.1 => last.1 = last.1.max(end),
            _ => merged.push((start, end)),
        }
    }
    merged
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> (tempfile::TempDir, Spill, FileData) {
        let dir = tempfile::tempdir().unwrap();
        let spill = Spill::create(&dir.path().join("spill")).unwrap();
        let data = FileData::create(dir.path(), 2).unwrap();
        (dir, spill, data)
    }

    fn current(data: &FileData) -> Vec<u8> {
        data.read(0, u32::MAX).unwrap()
    }

    #[test]
    fn sync_makes_the_durable_view_equal() {
        let (_dir, mut spill, mut data) = setup();
        data.write(0, 0, &[1u8; 10_000], &mut spill).unwrap();
        data.set_len(1, 6000).unwrap();
        data.zero(2, 100, 200, true).unwrap();
        data.write(3, 8000, b"tail", &mut spill).unwrap();
        assert_eq!(data.sync(&mut spill).unwrap(), 4);
        let before = current(&data);
        data.cut(|_| Keep::Nothing, &mut spill).unwrap();
        assert_eq!(current(&data), before);
        assert_eq!(before.len(), 8004);
        assert!(before[100..300].iter().all(|b| *b == 0));
        assert!(before[6000..8000].iter().all(|b| *b == 0));
    }

    #[test]
    fn cut_keeps_the_chosen_ops_in_order() {
        let (_dir, mut spill, mut data) = setup();
        data.write(0, 0, &[1u8; 100], &mut spill).unwrap();
        data.sync(&mut spill).unwrap();
        data.set_len(1, 10).unwrap(); // lost
        data.write(2, 50, &[2u8; 100], &mut spill).unwrap(); // kept
        data.write(3, 0, &[3u8; 4096 + 512], &mut spill).unwrap(); // torn at 4096
        data.cut(
            |op| match op.seq {
                1 => Keep::Nothing,
                3 => Keep::Prefix(4096),
                _ => Keep::All,
            },
            &mut spill,
        )
        .unwrap();
        let got = current(&data);
        assert_eq!(got.len(), 4096);
        assert!(got.iter().all(|b| *b == 3));
        assert!(data.log().is_empty());
    }

    #[test]
    fn cut_restores_the_shrunk_and_grown_tail() {
        let (_dir, mut spill, mut data) = setup();
        data.write(0, 0, &[7u8; 300], &mut spill).unwrap();
        data.sync(&mut spill).unwrap();
        data.set_len(1, 100).unwrap();
        data.set_len(2, 200).unwrap();
        data.zero(3, 400, 100, false).unwrap();
        assert_eq!(data.size_bytes(), 500);
        data.cut(|_| Keep::Nothing, &mut spill).unwrap();
        assert_eq!(current(&data), vec![7u8; 300]);
    }
}
