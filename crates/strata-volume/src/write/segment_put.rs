//! Getting an object of the log into the store: PUTs retried until they
//! work (a store outage back-pressures writers; the journal still holds the
//! data), each attempt only while the lease is valid, and segments written
//! with If-None-Match so they are never overwritten.

use bytes::Bytes;
use object_store::{PutMode, PutOptions, PutPayload};
use strata_store::Store;

use crate::backoff::Backoff;
use crate::format::segment::{FixedHeader, FIXED_HEADER_BYTES};
use crate::ownership::{Ownership, WriteRefused};

/// Why a store write gave up.
pub(crate) enum PutError {
    /// A conditional write found the object changed or present.
    Conflict(object_store::Error),
    /// The volume was fenced while waiting.
    Fenced(String),
}

impl std::fmt::Display for PutError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PutError::Conflict(e) => write!(f, "conflict: {e}"),
            PutError::Fenced(d) => f.write_str(d),
        }
    }
}

/// Writes a segment object with If-None-Match: segments are never
/// overwritten, so a writer that lost its lease cannot clobber the new
/// holder's. An existing object with our exact bytes is our own earlier
/// attempt (a reply lost after the write landed).
pub(crate) async fn put_segment(
    store: &Store,
    ownership: &Ownership,
    volume: &str,
    path: &object_store::path::Path,
    header: &Bytes,
    data: &Bytes,
) -> Result<(), WriteRefused> {
    let payload = || PutPayload::from_iter([header.clone(), data.clone()]);
    let mut leftovers_deleted = 0;
    loop {
        let written =
            put_with_retry(store, ownership, volume, path, &payload, PutMode::Create).await;
        match written {
            Ok(()) => return Ok(()),
            Err(PutError::Fenced(d)) => return Err(WriteRefused::Fenced(d)),
            Err(PutError::Conflict(_)) => {}
        }
        let len = (header.len() + data.len()) as u64;
        let same = store.get_range(path, 0..len).await.is_ok_and(|got| {
            got.len() as u64 == len
                && got[..header.len()] == header[..]
                && got[header.len()..] == data[..]
        });
        // Ours; an earlier attempt may have stopped before its sync.
        if same && store.make_durable(path).await.is_ok() {
            return Ok(());
        }
        if same {
            return Err(WriteRefused::Fenced(format!(
                "segment {path} was written but could not be synced to disk (a failed sync is not retried: the page cache may have dropped the data); check the disk"
            )));
        }
        if leftovers_deleted < MAX_LEFTOVERS_DELETED
            && written_by_our_journal(store, path, header).await
        {
            tracing::warn!(volume = %volume, object = %path, "deleting a segment a killed process of this volume uploaded after recovery had passed it (its writes are in the journal); uploading again");
            store.delete(path).await.map_err(|e| {
                WriteRefused::Fenced(format!(
                    "could not delete the leftover segment {path}: {}",
                    strata_store::error_text(&e)
                ))
            })?;
            leftovers_deleted += 1;
            continue;
        }
        return Err(WriteRefused::TakenOver(format!(
            "segment {path} already exists with other content: another server wrote it after taking the volume over"
        )));
    }
}

/// Leftovers replaced per upload: one is the case this exists for (a
/// killed process's PUT landing late); more means something else writes.
const MAX_LEFTOVERS_DELETED: u32 = 2;

/// Whether the segment in the way was written at the same position by a
/// process of this volume's own journal: a process killed with the PUT in
/// flight, whose PUT the store finished after recovery had listed the
/// segments (seen on SeaweedFS). Recovery did not apply it, nothing points
/// at it, and its writes are in the journal this process replayed. A
/// segment of any other journal is another server's: the caller fences.
async fn written_by_our_journal(
    store: &Store,
    path: &object_store::path::Path,
    header: &Bytes,
) -> bool {
    let Ok(ours) = FixedHeader::decode(header) else {
        return false;
    };
    let Ok(theirs) = store.get_range(path, 0..FIXED_HEADER_BYTES as u64).await else {
        return false;
    };
    FixedHeader::decode(&theirs).is_ok_and(|theirs| {
        theirs.seq == ours.seq
            && theirs.volume_uuid == ours.volume_uuid
            && theirs.span.journal_id == ours.span.journal_id
    })
}

/// PUTs until it works. Each attempt waits for a valid lease; a
/// conditional write's conflict is returned.
pub(crate) async fn put_with_retry(
    store: &Store,
    ownership: &Ownership,
    volume: &str,
    path: &object_store::path::Path,
    payload: &impl Fn() -> PutPayload,
    mode: PutMode,
) -> Result<(), PutError> {
    let mut backoff = Backoff::new();
    loop {
        ownership.wait_valid().await.map_err(PutError::Fenced)?;
        let opts = PutOptions {
            mode: mode.clone(),
            ..PutOptions::default()
        };
        let result = match store.put_opts(path, payload(), opts).await {
            // Durable once acknowledged (`Store::put_opts`).
            Ok(_) => Ok(()),
            Err(
                e @ (object_store::Error::AlreadyExists { .. }
                | object_store::Error::Precondition { .. }),
            ) => return Err(PutError::Conflict(e)),
            Err(e) => Err(strata_store::error_text(&e)),
        };
        match result {
            Ok(()) => return Ok(()),
            Err(e) => {
                tracing::warn!(volume = %volume, object = %path, error = %e, retry_in_ms = backoff.delay_ms(), "store write failed; retrying");
                backoff.wait().await;
            }
        }
    }
}
