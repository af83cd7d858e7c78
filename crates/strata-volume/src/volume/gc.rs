//! Garbage collection passes of a volume: the background task and the
//! explicit pass `strata volume gc` asks for. The steps are in `gc/`; this
//! file orders them and holds what they need (lock, store, ownership):
//!
//! 1. compaction: victims' live pieces read, then repointed into the open
//!    segment under the lock (`gc.after_repoint`); the open segment is
//!    sealed and stored as usual (`gc.after_copy_put`);
//! 2. a checkpoint lists what is unreferenced as pending deletions in the
//!    manifest (`volume/checkpoint.rs`, `gc.after_checkpoint`);
//! 3. after the grace period the pending objects are deleted
//!    (`gc.between_deletions`) and removed from the manifest
//!    (`gc.after_deletions` comes before that write);
//! 4. now and then, a listing sweep deletes orphans.
//!
//! User I/O keeps priority: a copy waits while the write buffer is more
//! than half full or the lease may have lapsed, and copying is paced to
//! `--gc-rate`. A fenced volume deletes nothing.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::Volume;

/// Segment headers a GC pass reads at most to learn sizes (`learn_data_sizes`).
const MAX_SIZE_LOOKUPS_PER_PASS: usize = 64;
/// The shortest wait between background passes that found work.
const MIN_BUSY_INTERVAL_MS: u64 = 100;
use crate::clock::now_ms;
use crate::config::MAX_VOLUME_BYTES;
use crate::crash_point::{crash_point, READ_REWRITE_CRASH_POINT};
use crate::error::VolumeError;
use crate::format::manifest::{GcPassRecord, Manifest, ObjectKind, PendingDeletion};
use crate::gc::{
    deletion_candidates, due_deletions, find_orphans, in_address_order, is_fragmented, live_pieces,
    pending_keys, pick_victims, read_live_data, remove_deleted, repoint, repoint_read,
    rewrite_cost_bytes, GcCounters, GcPassReport, LivePiece, OrphanView, ReadPiece, VictimPolicy,
};
use crate::objects::{fetch_fixed_header, fetch_segment_header, store_error};

/// Live bytes read and repointed at once (memory of a copy in flight).
const COPY_BATCH_BYTES: u64 = 4 << 20;
/// Background passes between two orphan sweeps (a listing each).
const SWEEP_EVERY_PASSES: u64 = 30;
/// Compaction time of a background pass before its deletions run.
const MAX_COMPACT_TIME: Duration = Duration::from_secs(2);
/// Deletions in flight at once.
const PARALLEL_DELETES: usize = 16;
/// How long a copy waits for room in the write buffer before the pass
/// moves on to its deletions.
const MAX_ROOM_WAIT: Duration = Duration::from_secs(1);
/// Live bytes a background pass copies at most (then it yields).
const BACKGROUND_PASS_COPY_BYTES: u64 = 256 << 20;

/// Why a pass stopped early (not an error: the volume is closing or was
/// fenced, and whoever holds it next carries on).
struct Stopped;

impl Volume {
    /// The bytes of a victim's live pieces: from the disk cache when all
    /// their blocks are there (data written on this host usually is; no
    /// GET, no RAM-cache traffic), else by ranged GETs (`read_live_data`).
    async fn read_live(
        &self,
        seq: u64,
        idx: &crate::format::segment::SegmentIndex,
        pieces: &[LivePiece],
    ) -> Result<Vec<u8>, VolumeError> {
        if self.caches.disk_enabled() {
            let total: u64 = pieces.iter().map(|p| p.len).sum();
            let mut out = vec![0u8; total as usize];
            let mut stored = Vec::with_capacity(pieces.len());
            let mut rest = &mut out[..];
            for p in pieces {
                let (dst, tail) = rest.split_at_mut(p.len as usize);
                stored.push(crate::read::StoredPiece {
                    seq,
                    offset: p.segment_offset,
                    dst,
                });
                rest = tail;
            }
            let missed = self
                .reader()
                .serve_from_disk(&self.caches, idx, seq, stored);
            if missed.is_empty() {
                return Ok(out);
            }
        }
        read_live_data(&self.store, &self.names, seq, idx, pieces).await
    }

    /// After a read served `pieces` from the store into `buf`: if they are
    /// scattered (`gc/read_rewrite.rs`), appends them contiguously to the
    /// open segment. Only while the write buffer is at most half full (as
    /// compaction's copies) and never waits: a read is not slowed by more
    /// than the copy.
    pub(crate) fn rewrite_fragmented_read(self: &Arc<Self>, pieces: &[ReadPiece], buf: &[u8]) {
        let gc = &self.config.gc;
        if !gc.enabled || !gc.rewrite_fragmented_reads {
            return;
        }
        if !is_fragmented(buf.len() as u64, pieces)
            || self.gc_should_stop()
            || !self.ownership.is_valid()
        {
            return;
        }
        let cost = rewrite_cost_bytes(pieces);
        let outcome = {
            let mut st = self.state.lock();
            // Data a snapshot keeps stays where it is (a diff compares
            // places: moved data would look changed).
            if st.failed.is_some()
                || self.closed.load(Ordering::Acquire)
                || st.buffered_cost_bytes + cost > self.config.write_buffer_bytes / 2
                || pieces.iter().any(|p| st.pins.is_pinned(p.seq))
            {
                return;
            }
            let outcome = repoint_read(&mut st, pieces, buf);
            if st.open.cost_bytes >= self.config.segment_bytes {
                self.seal_locked(&mut st, false);
            }
            outcome
        };
        self.housekeeping.notify_one();
        crash_point(READ_REWRITE_CRASH_POINT);
        GcCounters::add(&self.gc.read_rewrites, 1);
        GcCounters::add(&self.gc.bytes_rewritten_on_read, outcome.copied_bytes);
        GcCounters::add(&self.gc.bytes_superseded, outcome.superseded_bytes);
    }

    /// Starts the background garbage collector (if enabled).
    pub(crate) fn start_gc(self: &Arc<Self>) {
        if !self.config.gc.enabled {
            return;
        }
        let weak = Arc::downgrade(self);
        let wake = self.gc_wake.clone();
        let interval = Duration::from_millis(self.config.gc.interval_ms);
        tokio::spawn(async move {
            let mut passes = 0u64;
            let mut quiet = false;
            let mut sweep_next = false;
            // Uploads counted at the last orphan sweep.
            let mut swept_at = u64::MAX;
            let mut wait = interval;
            loop {
                let notified = wake.notified();
                if quiet {
                    // Nothing to do until a segment is uploaded or a
                    // snapshot changes (both wake it): an idle volume runs
                    // no pass, and lists nothing.
                    notified.await;
                } else {
                    let _ = tokio::time::timeout(wait, notified).await;
                }
                let Some(vol) = weak.upgrade() else { return };
                vol.gc_quiet.store(false, Ordering::Release);
                if vol.gc_should_stop() {
                    return;
                }
                if vol.standby.is_on() {
                    // A standby waits to take the volume (live migration):
                    // passes would rewrite the small segments standby mode
                    // makes, and the handover would wait for the pass in
                    // flight. The next holder collects them.
                    wait = interval;
                    continue;
                }
                let uploads = vol.segments_uploaded.load(Ordering::Acquire);
                let sweep = passes.is_multiple_of(SWEEP_EVERY_PASSES) || sweep_next;
                let busy = vol.background_pass(sweep).await;
                // While passes find work (a volume overwritten at disk
                // speed), they come 4x as often: deletions then come in
                // small steady batches, whose files the next segments
                // overwrite (strata-store `recycled_files.rs`), rather
                // than one burst larger than the pool every interval.
                wait = if busy {
                    (interval / 4).max(Duration::from_millis(MIN_BUSY_INTERVAL_MS))
                } else {
                    interval
                };
                if sweep {
                    swept_at = uploads;
                }
                passes += 1;
                let idle = !busy && vol.gc_pending.lock().0 == 0;
                // Orphans come from uploads: one sweep after the last of
                // them before going quiet.
                let unswept = vol.segments_uploaded.load(Ordering::Acquire) != swept_at;
                sweep_next = idle && unswept;
                quiet = idle && !unswept;
                if quiet {
                    vol.gc_quiet.store(true, Ordering::Release);
                    // An upload that finished meanwhile must not be missed.
                    if vol.segments_uploaded.load(Ordering::Acquire) != swept_at {
                        quiet = false;
                    }
                }
            }
        });
    }

    /// Wakes a quiet collector (`start_gc`) after an upload.
    pub(crate) fn wake_quiet_gc(&self) {
        if self.gc_quiet.swap(false, Ordering::AcqRel) {
            self.gc_wake.notify_one();
        }
    }

    fn gc_should_stop(&self) -> bool {
        self.closed.load(Ordering::Acquire) || self.ownership.fenced().is_some()
    }

    /// One background pass; true if it copied or deleted anything.
    async fn background_pass(self: &Arc<Self>, sweep: bool) -> bool {
        let _pass = self.gc_pass.lock().await;
        let policy = VictimPolicy {
            live_threshold_percent: self.config.gc.live_threshold_percent,
            space_target_percent: self.config.gc.space_target_percent,
            small_segment_bytes: self.config.segment_bytes / 4,
            max_copy_bytes: BACKGROUND_PASS_COPY_BYTES,
        };
        let mut report = GcPassReport::default();
        let result = self.run_steps(&policy, false, sweep, &mut report).await;
        let busy = result.is_ok() && (report.bytes_copied > 0 || report.objects_deleted > 0);
        self.finish_pass(result, &report).await;
        // Copies may wait in the open segment: housekeeping seals them.
        self.housekeeping.notify_one();
        busy
    }

    /// One pass now, compacting every segment below 90% live. With `wait`,
    /// returns once what it made unreferenced is deleted (after the grace
    /// period); otherwise once it is pending.
    pub async fn gc_now(self: &Arc<Self>, wait: bool) -> Result<GcPassReport, VolumeError> {
        self.check_failed()?;
        let _pass = self.gc_pass.lock().await;
        let policy = VictimPolicy {
            live_threshold_percent: 90,
            space_target_percent: 110,
            small_segment_bytes: self.config.segment_bytes / 4,
            max_copy_bytes: u64::MAX,
        };
        let mut report = GcPassReport::default();
        let result = self.run_steps(&policy, true, true, &mut report).await;
        if result.is_ok() && wait {
            self.wait_for_deletions(&mut report).await;
        }
        self.finish_pass(result, &report).await;
        self.check_failed()?;
        let st = self.state.lock().space_usage();
        let (pending, pending_bytes) = *self.gc_pending.lock();
        Ok(GcPassReport {
            pending_deletions: pending,
            pending_bytes,
            stored_bytes: st.stored_bytes,
            live_bytes: st.live_bytes,
            ..report
        })
    }

    async fn run_steps(
        self: &Arc<Self>,
        policy: &VictimPolicy,
        explicit: bool,
        sweep: bool,
        report: &mut GcPassReport,
    ) -> Result<(), Stopped> {
        // Deletions first too: a long compaction must not hold them up.
        self.delete_due(report).await?;
        self.compact(policy, report).await?;
        self.checkpoint_for_garbage(explicit).await?;
        self.delete_due(report).await?;
        if sweep {
            self.sweep_orphans(report).await?;
        }
        Ok(())
    }

    async fn finish_pass(&self, result: Result<(), Stopped>, report: &GcPassReport) {
        GcCounters::add(&self.gc.passes, 1);
        if result.is_err() || (report.segments_rewritten == 0 && report.objects_deleted == 0) {
            return;
        }
        tracing::info!(volume = %self.name, segments_rewritten = report.segments_rewritten, bytes_copied = report.bytes_copied, objects_deleted = report.objects_deleted, bytes_reclaimed = report.bytes_reclaimed, "garbage collection pass");
    }

    /// Step 1: rewrites the victims' live data into the open segment.
    async fn compact(
        self: &Arc<Self>,
        policy: &VictimPolicy,
        report: &mut GcPassReport,
    ) -> Result<(), Stopped> {
        self.learn_data_sizes().await;
        let victims = {
            let st = self.state.lock();
            pick_victims(&st.gc_weights(), st.map.usage(), &st.pins, policy)
        };
        let started = std::time::Instant::now();
        for v in victims {
            // A background pass hands over to its checkpoint and deletions
            // after a while (segments emptied meanwhile need only those);
            // the next pass starts at once and picks up here.
            if policy.max_copy_bytes != u64::MAX && started.elapsed() > MAX_COMPACT_TIME {
                break;
            }
            match self.compact_segment(v.seq, report).await {
                Ok(()) => {}
                Err(CompactError::Stopped) => return Err(Stopped),
                // Writers keep the buffer full: the rest of the pass (and
                // the next) goes on; this one's deletions need not wait.
                Err(CompactError::Busy) => return Ok(()),
                Err(CompactError::Failed(e)) => {
                    GcCounters::add(&self.gc.errors, 1);
                    tracing::warn!(volume = %self.name, seq = v.seq, error = %strata_store::ErrorText(&e), "garbage collection could not rewrite a segment; it stays as it is");
                }
            }
        }
        Ok(())
    }

    async fn compact_segment(
        self: &Arc<Self>,
        seq: u64,
        report: &mut GcPassReport,
    ) -> Result<(), CompactError> {
        let (idx, entries) = fetch_segment_header(
            &self.store,
            &self.names,
            seq,
            self.uuid,
            MAX_VOLUME_BYTES,
            self.at_rest.data_key().map(|k| &**k),
        )
        .await?;
        let pieces = live_pieces(&self.state.lock().map, seq, &entries);
        for batch in batches(&pieces) {
            let bytes: u64 = batch.iter().map(|p| p.len).sum();
            let urgent = self.space_is_urgent();
            self.wait_for_copy_room(bytes, urgent).await?;
            let started = std::time::Instant::now();
            let data = self.read_live(seq, &idx, batch).await?;
            // Read in segment order (fewer, larger GETs), appended in volume
            // address order (old volumes become contiguous again).
            let (batch, data) = in_address_order(batch, &data);
            let outcome = {
                let mut st = self.state.lock();
                if st.failed.is_some() || self.closed.load(Ordering::Acquire) {
                    return Err(CompactError::Stopped);
                }
                let outcome = repoint(&mut st, seq, &batch, &data);
                if st.open.cost_bytes >= self.config.segment_bytes {
                    self.seal_locked(&mut st, false);
                }
                outcome
            };
            crash_point("gc.after_repoint");
            report.bytes_copied += outcome.copied_bytes;
            report.bytes_superseded += outcome.superseded_bytes;
            GcCounters::add(&self.gc.bytes_copied, outcome.copied_bytes);
            GcCounters::add(&self.gc.bytes_superseded, outcome.superseded_bytes);
            if !urgent {
                self.pace(bytes, started).await;
            }
        }
        report.segments_rewritten += 1;
        GcCounters::add(&self.gc.segments_rewritten, 1);
        Ok(())
    }

    /// Learns the logical size of live, unpinned stored segments whose size
    /// this process does not know yet (stored before it opened the volume:
    /// a compressed one would otherwise look fuller than it is), a bounded
    /// number per pass, one small GET each. A failed GET leaves the segment
    /// weighed by its object size, as before.
    async fn learn_data_sizes(&self) {
        let unknown: Vec<u64> = {
            let st = self.state.lock();
            let usage = st.map.usage();
            st.stored
                .keys()
                .copied()
                .filter(|&seq| {
                    !st.data_sizes.contains_key(&seq)
                        && !st.pins.is_pinned(seq)
                        && usage.live_bytes(seq) > 0
                })
                .take(MAX_SIZE_LOOKUPS_PER_PASS)
                .collect()
        };
        for seq in unknown {
            match fetch_fixed_header(&self.store, &self.names, seq).await {
                Ok(fixed) => {
                    self.state.lock().data_sizes.insert(seq, fixed.data_bytes);
                }
                Err(e) => {
                    tracing::debug!(volume = %self.name, seq, error = %strata_store::ErrorText(&e), "segment size not learned");
                    return;
                }
            }
        }
    }

    /// Whether stored bytes exceed live bytes by more than the space target
    /// plus 100% (2.4x by default): then GC stops yielding to writers, or
    /// sustained writes would grow the store without bound.
    /// Only segments with live data count: dead ones (pending deletion or
    /// waiting for a checkpoint) go without copying anything, so copying
    /// harder would not bring them back sooner.
    fn space_is_urgent(&self) -> bool {
        let st = self.state.lock();
        let usage = st.map.usage();
        let (mut stored, mut live) = (0u128, 0u128);
        for (&seq, &bytes) in &st.stored {
            let l = usage.live_bytes(seq);
            if l > 0 {
                stored += u128::from(st.data_bytes(seq, bytes));
                live += u128::from(l);
            }
        }
        stored * 100 > live * u128::from(self.config.gc.space_target_percent + 100)
    }

    /// Waits until a copy of `bytes` fits in half the write buffer and the
    /// lease is valid: user writes go first. When `urgent`, a copy goes in
    /// whenever the buffer is not over its budget, overshooting it by at
    /// most one batch (`COPY_BATCH_BYTES`), so writers that keep the
    /// buffer full cannot starve GC.
    async fn wait_for_copy_room(&self, bytes: u64, urgent: bool) -> Result<(), CompactError> {
        let started = std::time::Instant::now();
        loop {
            if started.elapsed() > MAX_ROOM_WAIT {
                return Err(CompactError::Busy);
            }
            {
                let st = self.state.lock();
                if st.failed.is_some() || self.gc_should_stop() {
                    return Err(CompactError::Stopped);
                }
                let budget = self.config.write_buffer_bytes;
                let room = if urgent {
                    st.buffered_cost_bytes <= budget
                } else {
                    st.buffered_cost_bytes + bytes <= budget / 2
                };
                if room && self.ownership.is_valid() {
                    return Ok(());
                }
            }
            let notified = self.space.notified();
            let _ = tokio::time::timeout(Duration::from_millis(100), notified).await;
        }
    }

    /// Keeps copying at `--gc-rate` on average.
    async fn pace(&self, bytes: u64, started: std::time::Instant) {
        let due = Duration::from_secs_f64(bytes as f64 / self.config.gc.rate_bytes_per_sec as f64);
        if let Some(rest) = due.checked_sub(started.elapsed()) {
            tokio::time::sleep(rest).await;
        }
    }

    /// Step 2: a checkpoint, if stored segments are unreferenced and not yet
    /// pending deletion (at least a segment's worth, or any when explicit),
    /// so they can become pending. Waits for it.
    async fn checkpoint_for_garbage(self: &Arc<Self>, explicit: bool) -> Result<(), Stopped> {
        if explicit {
            // Everything written so far in the store first: a segment still
            // uploading cannot be listed as unreferenced yet.
            let target = {
                let mut st = self.state.lock();
                self.seal_locked(&mut st, false);
                st.open.seq - 1
            };
            self.wait_until(|st| {
                (st.durable_seq >= target && st.checkpoint_done_seq >= st.checkpoint_requested_seq)
                    || st.failed.is_some()
            })
            .await;
        }
        let pending = pending_keys(&self.manifest.current().await.pending_deletions);
        let seq = {
            let mut st = self.state.lock();
            let candidates = deletion_candidates(&st.stored, st.map.usage(), &st.pins, u64::MAX);
            // In logical bytes: a compressed segment's object is small,
            // and a segment's worth of them is worth a checkpoint.
            let new_bytes: u64 = candidates
                .segments
                .iter()
                .filter(|(seq, _)| !pending.contains(&(ObjectKind::Segment, *seq)))
                .map(|&(seq, bytes)| st.data_bytes(seq, bytes))
                .sum();
            let worth = new_bytes > 0 && (explicit || new_bytes >= self.config.segment_bytes);
            let idle = st.checkpoint_done_seq >= st.checkpoint_requested_seq;
            if !worth || (!idle && !explicit) {
                return Ok(());
            }
            match self.checkpoint_locked(&mut st) {
                Some(seq) => Some(seq),
                // Garbage with no new segment to checkpoint (a snapshot
                // was deleted): a seal point of its own.
                None if idle => {
                    let job = self.seal_for_history_locked(&mut st, None, self.size_bytes());
                    let seq = job.seq;
                    self.spawn_tracked(|vol| async move { vol.store_checkpoint(job).await });
                    Some(seq)
                }
                None => None,
            }
        };
        if let Some(seq) = seq {
            self.wait_until(|st| st.checkpoint_done_seq >= seq || st.failed.is_some())
                .await;
        }
        if self.state.lock().failed.is_some() {
            return Err(Stopped);
        }
        Ok(())
    }

    /// Step 3: deletes the pending deletions whose grace period passed, then
    /// drops them from the manifest.
    async fn delete_due(&self, report: &mut GcPassReport) -> Result<(), Stopped> {
        let manifest = self.manifest.current().await;
        self.note_pending(&manifest);
        let due = due_deletions(&manifest, now_ms(), self.config.gc.grace_ms);
        let due: Vec<PendingDeletion> = due
            .into_iter()
            .filter(|p| self.still_unreferenced(&manifest, p))
            .collect();
        let mut done: Vec<PendingDeletion> = Vec::new();
        for batch in due.chunks(PARALLEL_DELETES) {
            // A fenced server (or one whose lease may have lapsed) deletes
            // nothing; the holder inherits the list.
            if !self.ownership.is_valid() || self.ownership.fenced().is_some() {
                break;
            }
            if !done.is_empty() {
                crash_point("gc.between_deletions");
            }
            // Out of `stored` before the delete is sent: a read that finds
            // the object gone must see that GC took it, and look again.
            let taken = self.unstore(batch);
            let deletes = batch.iter().map(|p| self.delete_object(p));
            let results = futures::future::join_all(deletes).await;
            let mut failed = false;
            for ((p, ok), bytes) in batch.iter().zip(results).zip(taken) {
                failed |= !ok;
                if !ok {
                    if let Some(bytes) = bytes {
                        self.state.lock().stored.insert(p.seq, bytes);
                    }
                    continue;
                }
                report.objects_deleted += 1;
                report.bytes_reclaimed += p.bytes;
                GcCounters::add(&self.gc.objects_deleted, 1);
                GcCounters::add(&self.gc.bytes_reclaimed, p.bytes);
                done.push(*p);
            }
            if failed {
                break;
            }
        }
        if done.is_empty() {
            return Ok(());
        }
        crash_point("gc.after_deletions");
        let record = self.pass_record(report);
        let change = |m: &Manifest| {
            let mut next = remove_deleted(m, &done);
            next.last_gc = Some(record);
            Some(next)
        };
        match self
            .manifest
            .update(&self.store, &self.ownership, change)
            .await
        {
            Ok(_) => {
                self.note_pending(&self.manifest.current().await);
                Ok(())
            }
            Err(refused) => {
                let detail = self.refused(refused);
                tracing::warn!(volume = %self.name, %detail, "deleted objects not removed from the manifest; the next holder deletes them again");
                Err(Stopped)
            }
        }
    }

    /// Takes the segments of `batch` out of `stored`; their object bytes.
    fn unstore(&self, batch: &[PendingDeletion]) -> Vec<Option<u64>> {
        let mut st = self.state.lock();
        batch
            .iter()
            .map(|p| match p.kind {
                ObjectKind::Segment => {
                    st.data_sizes.remove(&p.seq);
                    st.stored.remove(&p.seq)
                }
                ObjectKind::Checkpoint => None,
            })
            .collect()
    }

    /// Deletes one pending object; a missing one counts as deleted (a
    /// repeat after a crash). False (logged) on a store error.
    async fn delete_object(&self, p: &PendingDeletion) -> bool {
        let path = match p.kind {
            ObjectKind::Segment => self.names.segment(p.seq),
            ObjectKind::Checkpoint => self.names.checkpoint(p.seq),
        };
        match self.store.delete(&path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => true,
            Err(e) => {
                GcCounters::add(&self.gc.errors, 1);
                tracing::warn!(volume = %self.name, object = %path, error = %strata_store::ErrorText(&e), "cannot delete an unreferenced object; retrying at the next pass");
                false
            }
        }
    }

    /// A last check before a delete (an invariant, not a decision): the
    /// map does not point into the segment, no snapshot keeps it, and the
    /// manifest's checkpoint is at or past it; neither the named checkpoint
    /// nor a snapshot's is ever deleted.
    fn still_unreferenced(&self, manifest: &Manifest, p: &PendingDeletion) -> bool {
        let ok = match p.kind {
            ObjectKind::Segment => {
                let st = self.state.lock();
                let live = st.map.usage().live_bytes(p.seq);
                live == 0
                    && !st.pins.is_pinned(p.seq)
                    && manifest.checkpoint_seq.is_some_and(|c| c >= p.seq)
            }
            ObjectKind::Checkpoint => {
                manifest.checkpoint_seq != Some(p.seq) && !manifest.snapshot_keeps_checkpoint(p.seq)
            }
        };
        if !ok {
            tracing::error!(volume = %self.name, ?p, "BUG: a pending deletion is still referenced; not deleting it");
        }
        ok
    }

    fn note_pending(&self, m: &Manifest) {
        let bytes = m.pending_deletions.iter().map(|p| p.bytes).sum();
        *self.gc_pending.lock() = (m.pending_deletions.len() as u64, bytes);
    }

    fn pass_record(&self, report: &GcPassReport) -> GcPassRecord {
        let space = self.state.lock().space_usage();
        GcPassRecord {
            finished_unix_ms: now_ms(),
            segments_rewritten: report.segments_rewritten,
            bytes_copied: report.bytes_copied,
            objects_deleted: report.objects_deleted,
            bytes_reclaimed: report.bytes_reclaimed,
            stored_bytes: space.stored_bytes,
            live_bytes: space.live_bytes,
        }
    }

    /// For `gc_now(wait)`: deletes what was pending when it was called as
    /// grace periods pass, until none of it is (later additions are the
    /// next pass's).
    async fn wait_for_deletions(&self, report: &mut GcPassReport) {
        let horizon_ms = now_ms();
        loop {
            let manifest = self.manifest.current().await;
            let waiting = manifest.pending_deletions.iter().map(|p| p.since_unix_ms);
            let Some(first) = waiting.filter(|&t| t <= horizon_ms).min() else {
                return;
            };
            let due_ms = first.saturating_add(self.config.gc.grace_ms);
            let wait_ms = due_ms.saturating_sub(now_ms());
            tokio::time::sleep(Duration::from_millis(wait_ms.min(1000))).await;
            if self.delete_due(report).await.is_err() || self.gc_should_stop() {
                return;
            }
        }
    }

    /// Step 4: deletes objects nothing references, older than the grace
    /// period.
    async fn sweep_orphans(&self, report: &mut GcPassReport) -> Result<(), Stopped> {
        let prefix = self.names.volume_prefix();
        let listing = match self.store.list_all(&prefix).await {
            Ok(l) => l,
            Err(e) => {
                GcCounters::add(&self.gc.errors, 1);
                tracing::warn!(volume = %self.name, error = %store_error(&self.store, "list", &prefix)(e), "orphan sweep skipped");
                return Ok(());
            }
        };
        let manifest = self.manifest.current().await;
        let orphans = {
            let st = self.state.lock();
            let view = OrphanView {
                stored: &st.stored,
                durable_seq: st.durable_seq,
                open_seq: st.open.seq,
                manifest_checkpoint: manifest.checkpoint_seq,
                pending: &manifest.pending_deletions,
                kept_checkpoints: &manifest
                    .snapshots
                    .iter()
                    .map(|s| s.checkpoint_seq)
                    .collect(),
                named_deltas: &manifest
                    .snapshots
                    .iter()
                    .filter_map(|s| s.delta.map(|d| (s.checkpoint_seq, d.from_checkpoint_seq)))
                    .collect(),
            };
            find_orphans(
                &self.names,
                &listing,
                &view,
                now_ms(),
                self.config.gc.grace_ms,
            )
        };
        for o in orphans {
            if !self.ownership.is_valid() || self.ownership.fenced().is_some() {
                return Err(Stopped);
            }
            tracing::info!(volume = %self.name, object = %o.location, bytes = o.size, "deleting an orphan (nothing references it)");
            match self.store.delete(&o.location).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {
                    GcCounters::add(&self.gc.orphans_deleted, 1);
                    GcCounters::add(&self.gc.bytes_reclaimed, o.size);
                    report.objects_deleted += 1;
                    report.bytes_reclaimed += o.size;
                }
                Err(e) => {
                    GcCounters::add(&self.gc.errors, 1);
                    tracing::warn!(volume = %self.name, object = %o.location, error = %strata_store::ErrorText(&e), "cannot delete an orphan");
                }
            }
        }
        Ok(())
    }
}

/// Splits pieces into batches of about `COPY_BATCH_BYTES` (a piece longer
/// than that is a batch of its own; pieces are at most one write long).
fn batches(pieces: &[LivePiece]) -> Vec<&[LivePiece]> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut bytes = 0u64;
    for (i, p) in pieces.iter().enumerate() {
        if bytes > 0 && bytes + p.len > COPY_BATCH_BYTES {
            out.push(&pieces[start..i]);
            start = i;
            bytes = 0;
        }
        bytes += p.len;
    }
    if start < pieces.len() {
        out.push(&pieces[start..]);
    }
    out
}

enum CompactError {
    Stopped,
    /// No room for a copy for `MAX_ROOM_WAIT`.
    Busy,
    Failed(VolumeError),
}

impl From<VolumeError> for CompactError {
    fn from(e: VolumeError) -> Self {
        CompactError::Failed(e)
    }
}
