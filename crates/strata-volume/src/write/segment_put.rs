//! Getting an object of the log into the store: PUTs retried until they
//! work (a store outage back-pressures writers; the journal still holds the
//! data), each attempt only while the lease is valid, and segments written
//! with If-None-Match so they are never overwritten.

use bytes::Bytes;
use object_store::{PutMode, PutOptions, PutPayload};
use strata_store::Store;

use crate::backoff::Backoff;
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
    let written = put_with_retry(store, ownership, volume, path, &payload, PutMode::Create).await;
    match written {
        Ok(()) => Ok(()),
        Err(PutError::Fenced(d)) => Err(WriteRefused::Fenced(d)),
        Err(PutError::Conflict(_)) => {
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
            Err(WriteRefused::TakenOver(format!(
                "segment {path} already exists with other content: another server wrote it after taking the volume over"
            )))
        }
    }
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
