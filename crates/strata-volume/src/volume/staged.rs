//! Bulk writes straight into the open segment's file (embedded store):
//! placing a write's bytes there under the volume lock, syncing those
//! files for a FLUSH, publishing a sealed segment's file as its object,
//! and removing staging names once their segments are durable. The rules
//! (order, why a power cut breaks nothing) are `write/staged_segment.rs`.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;

use super::Volume;
use crate::config::Durability;
use crate::crash_point::crash_point;
use crate::error::VolumeError;
use crate::format::chunk_crcs::append_with_chunk_crcs;
use crate::format::journal::Placed;
use crate::format::segment::{pad_header, CHUNK_BYTES};
use crate::ownership::WriteRefused;
use crate::write::open_segment::SealedSegment;
use crate::write::staged_segment::{
    gaps, header_reserve_bytes, reserved_entries, PendingPlace, StagedSegment,
};
use crate::write::state::State;

/// How an upload from a staged file ended.
pub(crate) enum Published {
    /// The object is in the store: its (padded) header.
    Stored(Bytes, tokio::sync::OwnedSemaphorePermit),
    /// Not published (no room for the header, compression turned on, an
    /// I/O error, the object there already): upload it as any other.
    Fallback,
    /// The volume was fenced.
    Refused,
}

impl Volume {
    /// Whether a write of `len` bytes goes straight into its segment's
    /// file: the embedded store (without fault injection), local
    /// durability, no frames (compression, encryption), large enough, and
    /// no larger than a segment (the header's reserve is sized for that).
    pub(crate) fn places(&self, len: usize) -> bool {
        let min = self.config.bulk_write_min_bytes;
        min > 0
            && len as u64 >= min
            && len as u64 <= self.config.segment_bytes
            && self.store.stages_files()
            && self.durability() == Durability::Local
            && !self.at_rest.writes_frames()
    }

    /// Under the volume lock: takes the place where `data` will land in
    /// the open segment's file (opening the file first if needed) and
    /// what its pointer record says. The bytes are written outside the
    /// lock (`write_placed`). `None`: no file could be made: the write's
    /// bytes go through the journal instead.
    pub(crate) fn place(
        self: &Arc<Self>,
        st: &mut State,
        data: &[u8],
        chunk_crcs: &[u32],
    ) -> Option<(Placed, Arc<StagedSegment>)> {
        // The data area never outgrows what the header's reserve covers.
        if !st.open.is_empty()
            && st.open.data.len() + data.len() > self.config.segment_bytes as usize
        {
            self.seal_locked(st, false);
        }
        let staged = match &st.open.staged {
            Some(s) => s.clone(),
            None => {
                let s = self.open_staged_file(st.open.seq)?;
                // What the segment holds already is written at the seal.
                st.open.staged = Some(s.clone());
                s
            }
        };
        let data_offset = st.open.data.len() as u64;
        let file_offset = staged.data_start + data_offset;
        let whole = data.len() / CHUNK_BYTES as usize;
        let data_crc = if chunk_crcs.len() == whole {
            append_with_chunk_crcs(0, data, chunk_crcs)
        } else {
            crc32c::crc32c(data)
        };
        let placed = Placed {
            seq: st.open.seq,
            tag: staged.tag,
            file_offset,
            data_crc,
        };
        Some((placed, staged))
    }

    /// After its record was appended as `jseq`: the placed write whose
    /// bytes the writer writes next (`write_placed`).
    pub(crate) fn begin_placed(
        &self,
        placed: &Placed,
        staged: &Arc<StagedSegment>,
        jseq: u64,
    ) -> PendingPlace {
        let data_offset = placed.file_offset - staged.data_start;
        staged.begin(
            placed.file_offset,
            data_offset,
            &self.placed_in_flight,
            jseq,
        )
    }

    /// Writes a placed write's bytes into its segment's file, outside the
    /// volume lock and before the write is acknowledged. A failure fails
    /// the volume for writes (as a journal that cannot write does): the
    /// record points at bytes that are not there, so the write must not be
    /// acknowledged; a restart replays what the journal holds.
    pub(crate) fn write_placed(
        &self,
        pending: PendingPlace,
        data: &[u8],
    ) -> Result<(), VolumeError> {
        crash_point("staged.before_bytes");
        let multi_thread = tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
        // A page-cache copy of up to a write's size: other tasks move to
        // another worker meanwhile.
        let written = if multi_thread {
            tokio::task::block_in_place(|| pending.write(data))
        } else {
            pending.write(data)
        };
        match written {
            Ok(()) => {
                self.placed_write_bytes
                    .fetch_add(data.len() as u64, Ordering::Relaxed);
                Ok(())
            }
            Err(source) => {
                let detail = format!(
                    "cannot write into a segment file: {}",
                    strata_store::ErrorText(&source)
                );
                tracing::error!(volume = %self.name, %detail, "writes stop; a restart replays the journal");
                self.state.lock().failed.get_or_insert(detail);
                self.space.notify_waiters();
                Err(VolumeError::Io {
                    what: "write into a segment file".into(),
                    source,
                })
            }
        }
    }

    /// Whether the open segment's header would outgrow its file's reserve
    /// with more entries: it is sealed now.
    pub(crate) fn staged_entries_full(&self, st: &State) -> bool {
        st.open.staged.is_some()
            && st.open.entries.len() as u64 >= reserved_entries(self.config.segment_bytes)
    }

    /// A new staged file for segment `seq`, or `None` (logged) if it
    /// cannot be made.
    fn open_staged_file(&self, seq: u64) -> Option<Arc<StagedSegment>> {
        let span = strata_store::TAG_MAX - strata_store::TAG_MIN + 1;
        let tag = strata_store::TAG_MIN + uuid::Uuid::new_v4().as_u64_pair().0 % span;
        let created = self.store.create_staged(&self.names.segment(seq), tag)?;
        let file = match created {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(volume = %self.name, segment = seq, error = %strata_store::ErrorText(&e), "cannot create a segment's file; bulk writes go through the journal");
                return None;
            }
        };
        let reserve = header_reserve_bytes(self.config.segment_bytes);
        Some(Arc::new(StagedSegment::new(file, tag, reserve)))
    }

    /// Makes the bytes of every placed write up to `jseq` survive power
    /// loss: waits for those still being written, then syncs the staged
    /// files that have unsynced writes (before the journal's sync, which
    /// makes their records durable).
    pub(crate) async fn sync_staged(&self, jseq: u64) -> Result<(), VolumeError> {
        // Placed writes up to `jseq` have their bytes in their files first:
        // the journal's sync that follows covers their records.
        self.placed_in_flight.wait_below(jseq + 1).await;
        self.check_failed()?;
        let files: Vec<Arc<StagedSegment>> = {
            let st = self.state.lock();
            let sealed = st.sealed.values().filter_map(|s| s.staged.clone());
            st.open
                .staged
                .clone()
                .into_iter()
                .chain(sealed)
                .filter(|s| s.needs_sync())
                .collect()
        };
        if files.is_empty() {
            return Ok(());
        }
        let synced = tokio::task::spawn_blocking(move || {
            files.iter().try_for_each(|f| {
                f.sync()
                    .map_err(|e| (f.file.staging_path().display().to_string(), e))
            })
        })
        .await
        .map_err(|e| VolumeError::Invalid(format!("syncing segment files failed (a bug): {e}")))?;
        if let Err((path, source)) = synced {
            // A failed sync may have dropped the bytes from the page cache:
            // writes stop, and a restart replays what the journal holds.
            let detail = format!("cannot sync segment file {path}: {source}");
            self.state.lock().failed.get_or_insert(detail);
            return Err(VolumeError::Io {
                what: format!("sync segment file {path}"),
                source,
            });
        }
        Ok(())
    }

    /// Publishes a sealed segment from its staged file: the bytes not in
    /// it yet, the padded header at offset 0, then synced and linked under
    /// the segment's name (`StagedFile::publish`).
    pub(crate) async fn publish_staged(
        self: &Arc<Self>,
        sealed: &Arc<SealedSegment>,
        staged: &Arc<StagedSegment>,
    ) -> Published {
        if self.at_rest.writes_frames() {
            return Published::Fallback;
        }
        let mut header = sealed.encode_header(&self.uuid);
        let Ok(reserve) = u32::try_from(staged.data_start) else {
            return Published::Fallback;
        };
        if !pad_header(&mut header, reserve) {
            return Published::Fallback;
        }
        let Ok(permit) = self.upload_slots.clone().acquire_owned().await else {
            return Published::Refused;
        };
        let _host_slot = self
            .host_writes
            .uploads
            .acquire(&self.uploads_in_flight)
            .await;
        if let Err(detail) = self.ownership.wait_valid().await {
            let detail = self.refused(WriteRefused::Fenced(detail));
            tracing::error!(volume = %self.name, segment = sealed.seq, %detail, "segment not uploaded");
            return Published::Refused;
        }
        // Sealed: no new write is placed in it; those in flight finish.
        staged.wait_idle().await;
        let header = Bytes::from(header);
        let (s, f, h) = (sealed.clone(), staged.clone(), header.clone());
        let done = tokio::task::spawn_blocking(move || write_and_publish(&s, &f, &h)).await;
        match done {
            Ok(Ok(true)) => {
                self.staged_segments_published
                    .fetch_add(1, Ordering::Relaxed);
                Published::Stored(header, permit)
            }
            Ok(Ok(false)) => {
                tracing::warn!(volume = %self.name, segment = sealed.seq, "segment object exists already; uploading it as a PUT would (which sorts out whose it is)");
                Published::Fallback
            }
            Ok(Err(e)) => {
                tracing::warn!(volume = %self.name, segment = sealed.seq, error = %strata_store::ErrorText(&e), "cannot publish a segment from its file; uploading it from memory");
                Published::Fallback
            }
            Err(e) => {
                tracing::warn!(volume = %self.name, segment = sealed.seq, error = %e, "publishing a segment failed (a bug); uploading it from memory");
                Published::Fallback
            }
        }
    }

    /// Removes the staging names of segments that are durable now.
    pub(crate) fn remove_durable_staging_names(&self) {
        let paths = self.state.lock().take_staged_unlinks();
        for path in paths {
            if let Err(e) = strata_store::remove_staged_path(&path) {
                tracing::warn!(volume = %self.name, file = %path.display(), error = %strata_store::ErrorText(&e), "cannot remove a segment file's staging name; the next open removes it");
            }
        }
    }
}

/// The blocking part of `publish_staged`. `Ok(false)`: the object exists.
fn write_and_publish(
    sealed: &SealedSegment,
    staged: &StagedSegment,
    header: &[u8],
) -> std::io::Result<bool> {
    let data = &sealed.data[..];
    for (off, len) in gaps(&staged.written_ranges(), data.len() as u64) {
        let bytes = &data[off as usize..(off + len) as usize];
        staged.file.write_all_at(bytes, staged.data_start + off)?;
    }
    staged.file.write_all_at(header, 0)?;
    crash_point("staged.before_publish");
    let linked = staged.file.publish(staged.data_start + data.len() as u64)?;
    crash_point("staged.after_publish");
    Ok(linked)
}
