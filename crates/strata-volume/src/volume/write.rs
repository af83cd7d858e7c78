//! The write path of a volume: WRITE, TRIM, WRITE_ZEROES and FLUSH.
//!
//! A write is appended to the journal and the open segment under the volume
//! lock (so journal order is map order), then waits, outside the lock, for
//! the journal's group commit to have it in the file (FUA: on stable
//! storage; with remote durability: in the store). Writers wait, never
//! fail, while the write buffer or the journal is full or the lease may
//! have lapsed. A full or old open segment is sealed and its upload started.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use super::counters::{FlushSeal, WaitFor};
use super::Volume;
use crate::config::Durability;
use crate::error::VolumeError;
use crate::format::journal::{record_bytes, RecordKind};
use crate::write::staged_segment::PendingPlace;
use crate::write::state::{apply_op, State};

impl Volume {
    /// Writes `data` at `offset`. Returns once the write survives a crash of
    /// this process; with `fua`, once it survives loss of power. Data that
    /// is all zeros is recorded as a hole (it reads the same and costs no
    /// storage), whatever the volume's compression.
    pub async fn write(
        self: &Arc<Self>,
        offset: u64,
        data: &[u8],
        fua: bool,
    ) -> Result<(), VolumeError> {
        if data.len() as u64 > self.config.max_write_bytes {
            return Err(VolumeError::Invalid(format!(
                "write of {} bytes exceeds the maximum of {}",
                data.len(),
                self.config.max_write_bytes
            )));
        }
        if is_all_zeros(data) {
            let len = data.len() as u64;
            self.log_op(RecordKind::Unmap, offset, len, &[], fua)
                .await?;
            self.zero_write_bytes_elided
                .fetch_add(len, std::sync::atomic::Ordering::Relaxed);
            return Ok(());
        }
        // Once per write, before the lock: the journal record's CRC and the
        // segment's chunk table both come from these.
        let chunk_crcs = crate::format::chunk_crcs::whole_chunk_crcs(data);
        self.log_op_with(
            RecordKind::Write,
            offset,
            data.len() as u64,
            data,
            &chunk_crcs,
            fua,
        )
        .await
    }

    /// Unmaps a range: it reads as zeros and costs no storage.
    pub async fn trim(
        self: &Arc<Self>,
        offset: u64,
        len: u64,
        fua: bool,
    ) -> Result<(), VolumeError> {
        self.log_op(RecordKind::Unmap, offset, len, &[], fua).await
    }

    /// Makes a range read as zeros; with `keep_allocated` it stays allocated
    /// (NBD's NO_HOLE), otherwise it is unmapped like a trim.
    pub async fn write_zeroes(
        self: &Arc<Self>,
        offset: u64,
        len: u64,
        keep_allocated: bool,
        fua: bool,
    ) -> Result<(), VolumeError> {
        let kind = if keep_allocated {
            RecordKind::Zero
        } else {
            RecordKind::Unmap
        };
        self.log_op(kind, offset, len, &[], fua).await
    }

    /// Makes every write completed before this call durable: in the local
    /// journal (survives loss of power), or with `Durability::Remote` in the
    /// store (survives loss of the host).
    pub async fn flush(self: &Arc<Self>) -> Result<(), VolumeError> {
        if self.closed_cleanly.load(Ordering::Acquire) {
            // Closed (handed over): every write acknowledged is in the
            // store. A migrating QEMU flushes its inactivated disk after
            // the switchover's handover.
            return Ok(());
        }
        self.check_failed()?;
        match self.durability() {
            Durability::Local => {
                let jseq = self.journal.last_appended_jseq();
                if self.flush_seals() {
                    self.flush_bulk_to_store().await;
                }
                // Placed writes' bytes before the records that point at them.
                self.sync_staged(jseq).await?;
                crate::crash_point::crash_point("staged.between_syncs");
                self.journal.sync(jseq).await?;
            }
            Durability::Remote => self.flush_to_store().await?,
        }
        self.last_flush_unix_ms
            .store(crate::clock::now_ms(), Ordering::Relaxed);
        Ok(())
    }

    /// Whether this FLUSH makes its bulk data durable as segments rather
    /// than in the ring: on the embedded store (an upload there is a local
    /// file's write and `fsync`), when at least `flush_seal_min_bytes` were
    /// appended since the journal's last sync and are not in the store yet.
    /// Synced in the ring, those bytes would reach the disk twice: there
    /// now, and in their segment at its upload (measured: 1.35x the
    /// client's bytes under 1 MiB writes with a FLUSH every 64, after the
    /// released part is punched). Small-write workloads never have that
    /// much unsynced and keep the ring's ~130 µs FLUSH.
    fn flush_seals(&self) -> bool {
        let min = self.config.flush_seal_min_bytes;
        min > 0 && self.store.is_local() && self.journal.unsynced_unreleased_bytes() >= min
    }

    /// Seals the open segment and waits, at most `flush_seal_wait_ms`, for
    /// every segment up to it to be in the store. The journal's sync that
    /// follows then punches their released records out of the ring
    /// (`write/journal_disk.rs`) instead of writing them. Durability never
    /// depends on this: the sync after it covers whatever is not stored
    /// yet (an upload retrying a full disk, a wait cut short), as a FLUSH
    /// did before it existed; only the disk bytes saved are lost then.
    async fn flush_bulk_to_store(self: &Arc<Self>) {
        let wait = std::time::Duration::from_millis(self.config.flush_seal_wait_ms);
        let outcome = match tokio::time::timeout(wait, self.seal_and_wait_stored()).await {
            Ok(()) => FlushSeal::Stored,
            Err(_) => FlushSeal::TimedOut,
        };
        tracing::debug!(volume = %self.name, ?outcome, "FLUSH sealed its bulk data");
        self.counters.flush_sealed(outcome);
    }

    /// Seals what is open and waits until every segment up to it is stored.
    pub(crate) async fn flush_to_store(self: &Arc<Self>) -> Result<(), VolumeError> {
        self.seal_and_wait_stored().await;
        self.check_failed()
    }

    /// Seals the open segment and waits until every segment up to it is in
    /// the store, or the volume failed.
    async fn seal_and_wait_stored(self: &Arc<Self>) {
        let target_seq = {
            let mut st = self.state.lock();
            self.seal_locked(&mut st, false);
            st.open.seq - 1
        };
        self.wait_until(|st| st.durable_seq >= target_seq || st.failed.is_some())
            .await;
    }

    async fn log_op(
        self: &Arc<Self>,
        kind: RecordKind,
        offset: u64,
        len: u64,
        data: &[u8],
        fua: bool,
    ) -> Result<(), VolumeError> {
        self.log_op_with(kind, offset, len, data, &[], fua).await
    }

    /// `log_op` with the CRCs of `data`'s whole 4 KiB chunks.
    async fn log_op_with(
        self: &Arc<Self>,
        kind: RecordKind,
        offset: u64,
        len: u64,
        data: &[u8],
        chunk_crcs: &[u32],
        fua: bool,
    ) -> Result<(), VolumeError> {
        self.check_range(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        if self.closed.load(Ordering::Acquire) {
            return Err(VolumeError::Closed(self.name.clone()));
        }
        // Back-pressure is counted only when a writer waits: the clock is
        // read at the first wait, never on the common path.
        let mut waiting: Option<(WaitFor, Instant)> = None;
        let (jseq, pending) = loop {
            let notified = self.space.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let reason = match self.try_log_op(kind, offset, len, data, chunk_crcs)? {
                Ok(appended) => break appended,
                Err(reason) => reason,
            };
            waiting.get_or_insert_with(|| (reason, Instant::now()));
            if reason == WaitFor::HostBuffer {
                // Other volumes' uploads may make room in the server's
                // budget too. Armed only now (the server-wide notifier is
                // not touched by writes that fit): a release missed in
                // between is made good by this volume's own upload, which
                // the refusal started (`try_log_op` sealed its segment).
                let freed = self.host_writes.freed();
                tokio::select! {
                    () = &mut notified => {}
                    () = freed => {}
                }
                continue;
            }
            if reason == WaitFor::Lease {
                // The host's renewal (or a re-claim) makes it valid again;
                // fencing ends the wait too (the next try fails).
                tokio::select! {
                    () = &mut notified => {}
                    _ = self.ownership.wait_valid() => {}
                }
                continue;
            }
            notified.await;
        };
        if let Some((reason, since)) = waiting {
            self.counters.waited(reason, since.elapsed());
        }
        if let Some(pending) = pending {
            self.write_placed(pending, data)?;
        }
        match (fua, self.durability()) {
            (false, _) => {
                self.journal.wait_written(jseq).await?;
                // No acknowledged write behind a placed one whose bytes
                // are still on their way (replay would stop there).
                self.placed_in_flight.wait_below(jseq).await;
                self.check_failed()?;
            }
            (true, Durability::Local) => {
                self.sync_staged(jseq).await?;
                self.journal.sync(jseq).await?
            }
            (true, Durability::Remote) => {
                self.journal.wait_written(jseq).await?;
                self.flush_to_store().await?;
            }
        }
        Ok(())
    }

    /// Appends to journal and open segment if the budgets allow; `Err`
    /// says what to wait for. A placed write (`volume/staged.rs`) comes
    /// back with the file write still to do.
    fn try_log_op(
        self: &Arc<Self>,
        kind: RecordKind,
        offset: u64,
        len: u64,
        data: &[u8],
        chunk_crcs: &[u32],
    ) -> Result<Result<(u64, Option<PendingPlace>), WaitFor>, VolumeError> {
        let cost = record_bytes(data.len());
        let mut st = self.state.lock();
        if st.failed.is_none() {
            // A journal that cannot write fails the volume for writes at once
            // (its records would otherwise queue until the ring is full).
            st.failed = self
                .journal
                .failure_detail()
                .map(|d| format!("journal write failed: {d}"));
        }
        if let Some(detail) = &st.failed {
            return Err(VolumeError::Failed {
                name: self.name.clone(),
                detail: detail.clone(),
            });
        }
        if st.resizing {
            return Ok(Err(WaitFor::Resize));
        }
        // Again under the lock: a resize may have shrunk the volume while
        // this write waited.
        self.check_range(offset, len)?;
        if st.buffered_cost_bytes > 0
            && st.buffered_cost_bytes + cost > self.config.write_buffer_bytes
        {
            return Ok(Err(WaitFor::WriteBuffer));
        }
        if !st.host.admits(st.buffered_cost_bytes, cost) {
            // What this volume holds drains only by uploads: its open
            // segment goes now rather than when full or old (with many
            // volumes, a fair share is smaller than a segment).
            self.seal_locked(&mut st, false);
            return Ok(Err(WaitFor::HostBuffer));
        }
        if !self.ownership.is_valid() {
            // The host's liveness may have expired: another server may own
            // the volume now. Wait for a renewal (or fencing) before
            // acknowledging.
            return Ok(Err(WaitFor::Lease));
        }
        // A bulk write's bytes go into its segment's file first; the
        // journal then records where (`write/staged_segment.rs`).
        let placed = if kind == RecordKind::Write && self.places(data.len()) {
            self.place(&mut st, data, chunk_crcs)
        } else {
            None
        };
        let appended = match &placed {
            Some((p, _)) => {
                self.journal
                    .try_append_with(RecordKind::Placed, offset, len, &p.encode(), None)
            }
            None => {
                let crcs = (!chunk_crcs.is_empty()).then_some(chunk_crcs);
                self.journal.try_append_with(kind, offset, len, data, crcs)
            }
        };
        let Some((jseq, end_lpos)) = appended else {
            return Ok(Err(WaitFor::Journal));
        };
        let pending = placed.map(|(p, staged)| self.begin_placed(&p, &staged, jseq));
        let was_empty = st.open.is_empty();
        apply_op(
            &mut st, kind, offset, len, data, chunk_crcs, cost, jseq, end_lpos,
        );
        if was_empty {
            // Its age counts from now: housekeeping seals it when due.
            self.housekeeping.notify_one();
        }
        if st.open.cost_bytes >= self.config.segment_bytes || self.staged_entries_full(&st) {
            self.seal_locked(&mut st, false);
        }
        Ok(Ok((jseq, pending)))
    }

    /// Seals the open segment (if not empty) and starts its upload; takes a
    /// checkpoint at the seal point every N segments or when `checkpoint`.
    pub(crate) fn seal_locked(self: &Arc<Self>, st: &mut State, checkpoint: bool) {
        if st.open.is_empty() {
            return;
        }
        let sealed = st.seal_open(self.take_buffer());
        let take_checkpoint =
            checkpoint || st.segments_since_checkpoint >= self.config.checkpoint_every_segments;
        let ckpt = take_checkpoint.then(|| {
            st.segments_since_checkpoint = 0;
            st.checkpoint_requested_seq = sealed.seq;
            self.encode_checkpoint(st, sealed.seq, sealed.span)
        });
        self.spawn_tracked(|vol| async move { vol.upload(sealed, ckpt).await });
    }

    /// An empty segment buffer (`HostWriteBudget::take_buffer`).
    pub(crate) fn take_buffer(&self) -> Vec<u8> {
        self.host_writes.take_buffer()
    }

    /// An idle volume's memory back to the allocator: the open segment's
    /// buffer while it is empty.
    pub(crate) fn release_idle_buffers(&self) {
        let mut st = self.state.lock();
        if st.open.is_empty() && st.open.data.capacity() > 0 {
            st.open.data = Vec::new();
        }
    }

    /// Keeps an uploaded segment's buffer for reuse (server-wide, a few).
    pub(crate) fn recycle_buffer(&self, buffer: Vec<u8>) {
        let max = 2 * self.config.segment_bytes as usize;
        self.host_writes.recycle_buffer(buffer, max);
    }

    /// Seals the open segment if it is older than the configured age.
    pub(crate) fn seal_if_old(self: &Arc<Self>) {
        let mut st = self.state.lock();
        let age_ms = st.open.opened_at.elapsed().as_millis() as u64;
        if !st.open.is_empty() && age_ms >= self.segment_max_age_ms() {
            self.seal_locked(&mut st, false);
        }
    }
}

/// Whether every byte of `data` is zero: 64 bytes at a time (the compiler
/// vectorises the inner fold), stopping at the first block that is not.
fn is_all_zeros(data: &[u8]) -> bool {
    let mut blocks = data.chunks_exact(64);
    let all = blocks
        .by_ref()
        .all(|b| b.iter().fold(0u8, |acc, &x| acc | x) == 0);
    all && blocks.remainder().iter().all(|&x| x == 0)
}

#[cfg(test)]
mod zero_tests {
    use super::is_all_zeros;

    #[test]
    fn only_all_zero_data_is_zeros() {
        for len in [0usize, 1, 63, 64, 65, 4096, 4097] {
            let mut d = vec![0u8; len];
            assert!(is_all_zeros(&d), "{len}");
            for at in [0, len / 2, len.saturating_sub(1)] {
                if len > 0 {
                    d[at] = 1;
                    assert!(!is_all_zeros(&d), "{len} at {at}");
                    d[at] = 0;
                }
            }
        }
    }
}
