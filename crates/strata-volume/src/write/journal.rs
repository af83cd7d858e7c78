//! The local journal of one volume: where a write is durable before it
//! reaches the store.
//!
//! Owns the open journal file and the append path. A write is appended
//! (copied into a pending buffer under the caller's lock, so journal order is
//! map order) and acknowledged once the batch that holds it has been
//! `pwrite`n (`journal_commit.rs`): that survives `kill -9`. FLUSH and FUA
//! wait for the sync thread's `fdatasync`. Many writes share one `pwrite`
//! and one `fdatasync`; nothing is written per block. Space before the
//! position the store has made safe is released for reuse (`release_to`).
//! Byte layout: `format/journal.rs`; creation and the recovery scan:
//! `journal_file.rs`.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};
use tokio::sync::Notify;

use super::journal_commit::{fail, push_record, write_pending, writer_loop, AppendState, Shared};
use super::journal_file::{io_err, Position};
use crate::error::JournalError;
use crate::format::journal::{record_bytes, RecordKind, Superblock, RECORD_HEADER_BYTES};

/// An open journal with its writer thread.
pub struct Journal {
    path: PathBuf,
    file: Arc<File>,
    sb: Superblock,
    shared: Arc<Shared>,
    writer: Mutex<Option<JoinHandle<()>>>,
    /// Stopped by `stop(false)`: later stops do not sync either.
    stopped_unsynced: AtomicBool,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Journal({})", self.path.display())
    }
}

impl Journal {
    /// Opens `path` for appending at `head` (the end of the scan), with
    /// everything before `tail_lpos` already safe in the store.
    /// `punch_min_bytes`: see `JournalDisk::before_sync`.
    pub fn open(
        path: &Path,
        sb: Superblock,
        head: Position,
        tail_lpos: u64,
        punch_min_bytes: u64,
    ) -> Result<Journal, JournalError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(io_err(path, "open for writing"))?;
        // Everything before `head` counts as synced from here on (a FLUSH
        // with no new write returns at once), so make it so: the records
        // replayed may have been written by a process killed before its
        // fdatasync, and a client re-sends that FLUSH after reconnecting.
        file.sync_data().map_err(io_err(path, "fdatasync"))?;
        let file = Arc::new(file);
        let shared = Arc::new(Shared {
            path: path.to_path_buf(),
            state: Mutex::new(AppendState {
                head_lpos: head.lpos,
                tail_lpos,
                next_jseq: head.jseq,
                pending: Vec::new(),
                runs: Vec::new(),
                sync_requested_jseq: 0,
                shutdown: false,
                spare: Vec::new(),
                last_append: std::time::Instant::now(),
                punched: false,
            }),
            write_lock: Mutex::new(()),
            wake_writer: Condvar::new(),
            written_jseq: AtomicU64::new(head.jseq - 1),
            synced_jseq: AtomicU64::new(head.jseq - 1),
            synced_lpos: AtomicU64::new(head.lpos),
            failed: AtomicBool::new(false),
            failure: Mutex::new(None),
            progress: Notify::new(),
            // Not known: zeroed again from the head on.
            disk: Mutex::new(super::journal_disk::JournalDisk::at(
                head.lpos,
                punch_min_bytes.min(sb.ring_bytes / 8),
            )),
        });
        let writer = {
            let (file, shared, ring) = (file.clone(), shared.clone(), sb.ring_bytes);
            std::thread::Builder::new()
                .name("strata-journal".into())
                .spawn(move || writer_loop(&file, &shared, ring))
                .map_err(io_err(path, "start writer thread"))?
        };
        Ok(Journal {
            path: path.to_path_buf(),
            file,
            sb,
            shared,
            writer: Mutex::new(Some(writer)),
            stopped_unsynced: AtomicBool::new(false),
        })
    }

    /// Appends a record; returns its jseq and the logical position after
    /// it, or `None` when the ring has no room (wait for `release_to`).
    #[cfg(test)]
    pub fn try_append(
        &self,
        kind: RecordKind,
        offset: u64,
        len: u64,
        payload: &[u8],
    ) -> Option<(u64, u64)> {
        self.try_append_with(kind, offset, len, payload, None)
    }

    /// `try_append`, given the CRCs of the payload's whole 4 KiB chunks
    /// (`format/chunk_crcs.rs`): the record's CRC is combined from them.
    pub fn try_append_with(
        &self,
        kind: RecordKind,
        offset: u64,
        len: u64,
        payload: &[u8],
        chunk_crcs: Option<&[u32]>,
    ) -> Option<(u64, u64)> {
        let ring = self.sb.ring_bytes;
        let rec = record_bytes(payload.len());
        let mut st = self.shared.state.lock();
        let phys = st.head_lpos % ring;
        let waste = if ring - phys < rec { ring - phys } else { 0 };
        if st.head_lpos + waste + rec - st.tail_lpos > ring {
            return None;
        }
        let jseq = st.next_jseq;
        if waste > 0 {
            if waste >= RECORD_HEADER_BYTES {
                push_record(
                    &mut st,
                    phys,
                    &self.sb.journal_id,
                    RecordKind::Wrap,
                    jseq,
                    0,
                    0,
                    &[],
                    None,
                );
            }
            st.head_lpos += waste;
            let at = st.pending.len();
            st.runs.push((0, at));
        }
        let phys = st.head_lpos % ring;
        push_record(
            &mut st,
            phys,
            &self.sb.journal_id,
            kind,
            jseq,
            offset,
            len,
            payload,
            chunk_crcs,
        );
        st.head_lpos += rec;
        st.next_jseq += 1;
        st.last_append = std::time::Instant::now();
        st.punched = false;
        let end = st.head_lpos;
        drop(st);
        Some((jseq, end))
    }

    /// Everything before `lpos` is safe in the store: its space may be reused.
    pub fn release_to(&self, lpos: u64) {
        let mut st = self.shared.state.lock();
        debug_assert!(lpos <= st.head_lpos);
        if lpos > st.tail_lpos {
            st.tail_lpos = lpos;
        }
    }

    /// Gives the ring's disk space back to the filesystem when it holds
    /// nothing the store lacks (tail at head) and nothing was appended for
    /// `idle_ms`: an idle volume's journal takes its superblock's 4 KiB.
    /// Not on every release: writes into punched space allocate blocks,
    /// which a FLUSH's `fdatasync` must then commit, so a busy volume keeps
    /// its ring. Returns whether it punched.
    pub fn punch_if_idle(&self, idle_ms: u64) -> bool {
        // The state lock is held across the call: no append can land in
        // the ring while it is being punched.
        let mut st = self.shared.state.lock();
        let idle = st.last_append.elapsed().as_millis() >= u128::from(idle_ms);
        if st.punched || !idle || st.tail_lpos != st.head_lpos || !st.pending.is_empty() {
            return false;
        }
        match super::journal_file::punch_hole(&self.file, 0, self.sb.ring_bytes) {
            Ok(()) => {
                st.punched = true;
                self.shared.disk.lock().punched(st.head_lpos);
                // Buffers are allocated again by the next write.
                st.pending = Vec::new();
                st.spare = Vec::new();
                true
            }
            Err(e) => {
                // A filesystem without hole punching keeps the space.
                tracing::debug!(path = %self.path.display(), error = %e, "journal space not given back");
                st.punched = true;
                false
            }
        }
    }

    /// How long until `punch_if_idle(idle_ms)` could punch: `None` when
    /// there is nothing to give back (punched, nothing written since).
    pub fn until_idle(&self, idle_ms: u64) -> Option<std::time::Duration> {
        let st = self.shared.state.lock();
        if st.punched {
            return None;
        }
        let idle = std::time::Duration::from_millis(idle_ms);
        Some(idle.saturating_sub(st.last_append.elapsed()))
    }

    /// The error that stopped the writer thread, if it stopped.
    pub fn failure_detail(&self) -> Option<String> {
        if self.shared.failed.load(Ordering::Acquire) {
            return Some(self.shared.failure.lock().clone().unwrap_or_default());
        }
        None
    }

    /// Bytes of the ring in use (appended, not yet safe in the store),
    /// and the ring's size.
    pub fn usage_bytes(&self) -> (u64, u64) {
        let st = self.shared.state.lock();
        (st.head_lpos - st.tail_lpos, self.sb.ring_bytes)
    }

    /// Bytes appended since the last `fdatasync` began that the store does
    /// not hold yet: what a FLUSH would sync in the ring. Never waits for the
    /// writer's `disk` lock (held across a batch's `pwrite`); an idle punch
    /// leaves `synced_lpos` behind, but only with the tail at the head.
    pub fn unsynced_unreleased_bytes(&self) -> u64 {
        let synced_lpos = self.shared.synced_lpos.load(Ordering::Acquire);
        let st = self.shared.state.lock();
        st.head_lpos.saturating_sub(st.tail_lpos.max(synced_lpos))
    }

    /// jseq of the newest record appended so far (0 if none).
    pub fn last_appended_jseq(&self) -> u64 {
        self.shared.state.lock().next_jseq - 1
    }

    /// Waits until record `jseq` is in the file (survives `kill -9`).
    ///
    /// Group commit without a thread hop: the first waiter that finds no
    /// batch being written becomes the leader and `pwrite`s everything
    /// pending (its own record and all appended since) on its own thread;
    /// the others wait for its notification. A page-cache write of a batch
    /// takes microseconds; a wake-up of a writer thread per batch cost more.
    pub async fn wait_written(&self, jseq: u64) -> Result<(), JournalError> {
        loop {
            let notified = self.shared.progress.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.shared.written_jseq.load(Ordering::Acquire) >= jseq {
                return Ok(());
            }
            if self.shared.failed.load(Ordering::Acquire) {
                return Err(self.failure());
            }
            if let Some(guard) = self.shared.write_lock.try_lock() {
                let result = write_pending(&self.file, &self.shared, self.sb.ring_bytes);
                drop(guard);
                if let Err(e) = result {
                    fail(&self.shared, &e);
                }
                self.shared.progress.notify_waiters();
                continue;
            }
            notified.await;
        }
    }

    /// Waits until every record up to `jseq` is on stable storage.
    pub async fn sync(&self, jseq: u64) -> Result<(), JournalError> {
        if self.shared.synced_jseq.load(Ordering::Acquire) >= jseq {
            return Ok(());
        }
        {
            let mut st = self.shared.state.lock();
            st.sync_requested_jseq = st.sync_requested_jseq.max(jseq);
        }
        self.shared.wake_writer.notify_one();
        self.wait_for(&self.shared.synced_jseq, jseq).await
    }

    async fn wait_for(&self, counter: &AtomicU64, jseq: u64) -> Result<(), JournalError> {
        loop {
            let notified = self.shared.progress.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if counter.load(Ordering::Acquire) >= jseq {
                return Ok(());
            }
            if self.shared.failed.load(Ordering::Acquire) {
                return Err(self.failure());
            }
            notified.await;
        }
    }

    fn failure(&self) -> JournalError {
        let detail = self.shared.failure.lock().clone().unwrap_or_default();
        JournalError::Failed {
            path: self.path.clone(),
            detail,
        }
    }

    /// Stops the writer thread after it has written what is pending.
    pub fn shutdown(&self) {
        self.stop(true);
    }

    /// Stops the writer thread; `sync`: and makes what it wrote durable.
    /// A clean close whose every record is in the store passes false: the
    /// journal holds nothing a restart needs, and an fdatasync of what
    /// remote durability never synced (tens of MB after large writes)
    /// would hold up a handover for nothing.
    pub fn stop(&self, sync: bool) {
        self.shared.state.lock().shutdown = true;
        self.shared.wake_writer.notify_one();
        if let Some(handle) = self.writer.lock().take() {
            if handle.join().is_err() {
                tracing::error!(path = %self.path.display(), "journal writer thread panicked");
            }
        }
        if !sync {
            self.stopped_unsynced.store(true, Ordering::Release);
            return;
        }
        // Stopped unsynced before: its owner said nothing in it is needed
        // (the shutdown of `Drop` comes here too).
        if !self.stopped_unsynced.load(Ordering::Acquire) {
            let _ = self.file.sync_data();
        }
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::journal::{MIN_RING_BYTES, SUPERBLOCK_BYTES};
    use crate::write::journal_file::{create, read_superblock, Scanner};
    use std::os::unix::fs::FileExt;

    fn sb(ring: u64) -> Superblock {
        Superblock {
            volume_uuid: [1; 16],
            journal_id: [2; 16],
            ring_bytes: ring,
            start_jseq: 1,
        }
    }

    #[tokio::test]
    async fn records_survive_reopen_and_wrap_the_ring() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.journal");
        let ring = MIN_RING_BYTES;
        create(&path, sb(ring)).unwrap();
        let j = Journal::open(&path, sb(ring), Position { lpos: 0, jseq: 1 }, 0, 1 << 20).unwrap();
        // Fill ~2.5 laps, releasing as we go, so the ring wraps twice.
        let mut released = 0u64;
        let mut last = (0, 0);
        let mut all: Vec<(u64, u64, usize)> = Vec::new();
        for i in 0..700u64 {
            let payload = vec![(i % 251) as u8; 3000 + (i as usize % 7) * 100];
            let r = loop {
                if let Some(r) =
                    j.try_append(RecordKind::Write, i * 512, payload.len() as u64, &payload)
                {
                    break r;
                }
                j.wait_written(last.0).await.unwrap();
                released = all[all.len() - 50].1;
                j.release_to(released);
            };
            last = r;
            all.push((r.0, r.1, payload.len()));
        }
        j.sync(last.0).await.unwrap();
        drop(j);
        // Scan from the release point: every later record, in order.
        let start_idx = all
            .iter()
            .position(|&(_, end, _)| end == released)
            .map_or(0, |i| i + 1);
        let start = if start_idx == 0 {
            Position { lpos: 0, jseq: 1 }
        } else {
            Position {
                lpos: all[start_idx - 1].1,
                jseq: all[start_idx].0,
            }
        };
        let mut s = Scanner::open(&path, sb(ring), start).unwrap();
        let mut n = 0;
        while let Some(r) = s.next_record().unwrap() {
            let (jseq, end, len) = all[start_idx + n];
            assert_eq!((r.jseq, r.end_lpos, r.payload.len()), (jseq, end, len));
            assert!(r.payload.iter().all(|&b| b == ((jseq - 1) % 251) as u8));
            n += 1;
        }
        assert_eq!(start_idx + n, all.len());
        assert!(all.last().unwrap().1 > 2 * ring, "test must wrap the ring");
    }

    #[tokio::test]
    async fn released_bytes_are_punched_before_a_sync_not_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.journal");
        let ring = 4 * MIN_RING_BYTES;
        create(&path, sb(ring)).unwrap();
        let j = Journal::open(&path, sb(ring), Position { lpos: 0, jseq: 1 }, 0, 1 << 20).unwrap();
        let payload = vec![7u8; 64 << 10];
        let mut ends = Vec::new();
        for i in 0..48u64 {
            ends.push(
                j.try_append(RecordKind::Write, i << 16, 64 << 10, &payload)
                    .unwrap(),
            );
        }
        j.wait_written(ends[47].0).await.unwrap();
        // The first 30 records are in the store: released, never synced.
        let released = ends[29].1;
        j.release_to(released);
        j.sync(ends[47].0).await.unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let read = |at: u64, len: usize| {
            let mut b = vec![0u8; len];
            file.read_exact_at(&mut b, SUPERBLOCK_BYTES + at).unwrap();
            b
        };
        // Whole pages before the release point read as zeros: punched.
        let punched_until = released / 4096 * 4096;
        assert!(punched_until >= 1 << 20, "{punched_until}");
        assert!(read(0, punched_until as usize).iter().all(|&b| b == 0));
        // Every record after it is intact and replays, in order.
        let mut scan = Scanner::open(
            &path,
            sb(ring),
            Position {
                lpos: released,
                jseq: ends[30].0,
            },
        )
        .unwrap();
        let mut n = 0;
        while let Some(r) = scan.next_record().unwrap() {
            assert_eq!((r.jseq, r.end_lpos), ends[30 + n]);
            assert!(r.payload.iter().all(|&b| b == 7));
            n += 1;
        }
        assert_eq!(n, 18);
    }

    #[tokio::test]
    async fn a_journal_takes_disk_only_while_it_holds_what_the_store_lacks() {
        let allocated_bytes = |p: &Path| -> std::io::Result<u64> {
            use std::os::unix::fs::MetadataExt;
            Ok(std::fs::metadata(p)?.blocks() * 512)
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.journal");
        let ring = 4 * MIN_RING_BYTES;
        create(&path, sb(ring)).unwrap();
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            SUPERBLOCK_BYTES + ring
        );
        assert!(
            allocated_bytes(&path).unwrap() <= 64 << 10,
            "created sparse"
        );
        let j = Journal::open(&path, sb(ring), Position { lpos: 0, jseq: 1 }, 0, 1 << 20).unwrap();
        let payload = vec![7u8; 64 << 10];
        let mut last = (0, 0);
        for i in 0..32u64 {
            last = j
                .try_append(RecordKind::Write, i << 16, 64 << 10, &payload)
                .unwrap();
        }
        j.sync(last.0).await.unwrap();
        assert!(allocated_bytes(&path).unwrap() >= 2 << 20, "written");
        // Not while records are unreleased, nor before the idle time.
        assert!(!j.punch_if_idle(0));
        j.release_to(last.1);
        assert!(!j.punch_if_idle(60_000));
        assert!(j.punch_if_idle(0));
        assert!(allocated_bytes(&path).unwrap() <= 64 << 10, "punched");
        assert!(!j.punch_if_idle(0), "once");
        // Appending goes on after a punch, and a scan from the release
        // point finds exactly what came after it (the hole reads as zeros).
        let r = j
            .try_append(RecordKind::Write, 0, 4096, &[9u8; 4096])
            .unwrap();
        j.sync(r.0).await.unwrap();
        drop(j);
        let start = Position {
            lpos: last.1,
            jseq: last.0 + 1,
        };
        let mut s = Scanner::open(&path, sb(ring), start).unwrap();
        let rec = s
            .next_record()
            .unwrap()
            .expect("the record after the punch");
        assert_eq!((rec.jseq, rec.payload.len()), (r.0, 4096));
        assert!(s.next_record().unwrap().is_none());
    }

    #[test]
    fn foreign_or_corrupt_records_end_the_scan() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.journal");
        let ring = MIN_RING_BYTES;
        create(&path, sb(ring)).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let j = Journal::open(&path, sb(ring), Position { lpos: 0, jseq: 1 }, 0, 1 << 20).unwrap();
        for i in 0..3u64 {
            j.try_append(RecordKind::Write, i, 8, &[7u8; 8]).unwrap();
        }
        j.try_append(RecordKind::Unmap, 0, 1 << 40, &[]).unwrap();
        rt.block_on(j.sync(4)).unwrap();
        drop(j);
        let count = |sbk: Superblock| {
            let mut s = Scanner::open(&path, sbk, Position { lpos: 0, jseq: 1 }).unwrap();
            let mut n = 0;
            while s.next_record().unwrap().is_some() {
                n += 1;
            }
            n
        };
        assert_eq!(count(sb(ring)), 4);
        let mut other = sb(ring);
        other.journal_id = [3; 16];
        assert_eq!(
            count(other),
            0,
            "another journal instance's records must not replay"
        );
        // Flip one payload byte of record 2: the scan stops before it.
        let f = OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all_at(&[0xff], SUPERBLOCK_BYTES + record_bytes(8) + 41)
            .unwrap();
        assert_eq!(count(sb(ring)), 1);
        assert!(read_superblock(&path).unwrap().is_some());
        f.write_all_at(&[0xff], 20).unwrap();
        assert!(read_superblock(&path).is_err());
    }
}
