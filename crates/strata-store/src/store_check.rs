//! The verdict on a store's conditional writes, remembered in the store.
//!
//! This module owns the object `.strata-store-check` at the store's root
//! (under its prefix) and its content, [`StoreCheckRecord`]: the
//! [`ProbeReport`] of the last probe, with the strata version and the time
//! it ran. [`remembered_or_probed`] is what a command that writes volumes
//! calls before it writes: one small GET when the record exists, the probe
//! (and a PUT of the record) when it does not. Both verdicts are kept: a
//! store found lacking is refused again without probing again, until
//! `strata store check` ([`probe_and_record`]) probes it afresh (after an
//! upgrade of the store, say).
//!
//! The record is untrusted input: larger than [`MAX_RECORD_BYTES`],
//! unparsable, of another probe format, or made for another store (its
//! description differs: another endpoint, prefix or directory, e.g. a copy
//! of the bucket on another service), it is ignored and the store probed
//! again.

use bytes::Bytes;
use object_store::path::Path;
use object_store::{PutOptions, PutPayload};
use serde::{Deserialize, Serialize};

use crate::conditional_write_probe::{probe_conditional_writes, ProbeError, ProbeReport};
use crate::store::Store;

/// The record's name, under the store's prefix.
pub const STORE_CHECK_OBJECT: &str = ".strata-store-check";

/// Bumped when the probe changes what it verifies: older records are then
/// ignored and stores probed again.
pub const PROBE_FORMAT: u32 = 1;

/// A record larger than this is not read (it is a few hundred bytes).
pub const MAX_RECORD_BYTES: u64 = 64 * 1024;

/// The content of `.strata-store-check` (JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreCheckRecord {
    pub probe_format: u32,
    /// The strata that probed.
    pub strata_version: String,
    pub checked_unix_ms: u64,
    /// The same moment, UTC, for people.
    pub checked_at: String,
    pub report: ProbeReport,
}

/// Where a verdict came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VerdictSource {
    /// The probe ran now.
    Probed,
    /// Read from `.strata-store-check`.
    Remembered,
}

/// The record in the store if it is usable for `store` (see the module
/// doc), else the probe's, which is then recorded.
pub async fn remembered_or_probed(
    store: &Store,
) -> Result<(StoreCheckRecord, VerdictSource), ProbeError> {
    if let Some(record) = read_record(store).await? {
        return Ok((record, VerdictSource::Remembered));
    }
    Ok((probe_and_record(store).await?, VerdictSource::Probed))
}

/// Probes `store` and records the verdict in it. A record that cannot be
/// written is logged, not fatal: the verdict stands for this run and the
/// next start probes again.
pub async fn probe_and_record(store: &Store) -> Result<StoreCheckRecord, ProbeError> {
    let report = probe_conditional_writes(store).await?;
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let record = StoreCheckRecord {
        probe_format: PROBE_FORMAT,
        strata_version: env!("CARGO_PKG_VERSION").to_string(),
        checked_unix_ms: now_ms,
        checked_at: utc_timestamp(now_ms / 1000),
        report,
    };
    let path = Path::from(STORE_CHECK_OBJECT);
    let written = match serde_json::to_vec_pretty(&record) {
        Ok(json) => store
            .put_opts(
                &path,
                PutPayload::from(Bytes::from(json)),
                PutOptions::default(),
            )
            .await
            .map(|_| ())
            .map_err(|e| crate::error_text(&e)),
        Err(e) => Err(e.to_string()),
    };
    if let Err(e) = written {
        tracing::warn!(object = %path, error = %e, "cannot record the store check; the next start probes again");
    }
    Ok(record)
}

/// The usable record of `store`, if any (see the module doc). Store errors
/// other than "not found" are errors: a store that cannot be read cannot
/// be served either.
pub async fn read_record(store: &Store) -> Result<Option<StoreCheckRecord>, ProbeError> {
    let path = Path::from(STORE_CHECK_OBJECT);
    let error = |step, error| ProbeError::Store {
        store: store.description().to_string(),
        step,
        object: path.to_string(),
        error,
    };
    let got = match store.object_store().get(&path).await {
        Ok(got) => got,
        Err(object_store::Error::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(error("read the remembered verdict", e)),
    };
    if got.meta.size > MAX_RECORD_BYTES {
        tracing::warn!(object = %path, size_bytes = got.meta.size, "ignoring an oversized store check record; probing again");
        return Ok(None);
    }
    let bytes = got
        .bytes()
        .await
        .map_err(|e| error("read the remembered verdict", e))?;
    Ok(usable_record(store.description(), &bytes))
}

/// `bytes` as a record made by this probe format for the store described
/// as `store`, or `None` (logged) if it is not one.
fn usable_record(store: &str, bytes: &[u8]) -> Option<StoreCheckRecord> {
    let record: StoreCheckRecord = match serde_json::from_slice(bytes) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(object = STORE_CHECK_OBJECT, error = %crate::ErrorText(&e), "ignoring an unreadable store check record; probing again");
            return None;
        }
    };
    if record.probe_format != PROBE_FORMAT {
        tracing::info!(
            object = STORE_CHECK_OBJECT,
            format = record.probe_format,
            "store check record of another probe format; probing again"
        );
        return None;
    }
    if record.report.store != store {
        tracing::info!(object = STORE_CHECK_OBJECT, recorded_for = %record.report.store, "store check record made for another store; probing again");
        return None;
    }
    Some(record)
}

/// `unix_s` as `YYYY-MM-DDTHH:MM:SSZ` (UTC).
fn utc_timestamp(unix_s: u64) -> String {
    i64::try_from(unix_s)
        .ok()
        .and_then(|s| chrono::DateTime::from_timestamp(s, 0))
        .map_or_else(
            || format!("unix time {unix_s}"),
            |t| t.format("%Y-%m-%dT%H:%M:%SZ").to_string(),
        )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conditional_write_probe::{ConditionCheck, Verdict};

    #[test]
    fn timestamps_are_utc_calendar_dates() {
        assert_eq!(utc_timestamp(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc_timestamp(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc_timestamp(1_733_011_199), "2024-11-30T23:59:59Z");
    }

    #[test]
    fn only_records_of_this_format_for_this_store_are_used() {
        let check = ConditionCheck {
            verdict: Verdict::Enforced,
            detail: "x".into(),
        };
        let record = StoreCheckRecord {
            probe_format: PROBE_FORMAT,
            strata_version: "0".into(),
            checked_unix_ms: 1,
            checked_at: utc_timestamp(0),
            report: ProbeReport {
                store: "file:///s".into(),
                if_none_match: check.clone(),
                if_match: check,
            },
        };
        let json = serde_json::to_vec(&record).unwrap();
        assert_eq!(usable_record("file:///s", &json), Some(record.clone()));
        assert_eq!(usable_record("file:///other", &json), None);
        let other_format = StoreCheckRecord {
            probe_format: PROBE_FORMAT + 1,
            ..record
        };
        assert_eq!(
            usable_record("file:///s", &serde_json::to_vec(&other_format).unwrap()),
            None
        );
        assert_eq!(usable_record("file:///s", b"{\"probe_format\": 1"), None);
        assert_eq!(usable_record("file:///s", b"\xff\xfe"), None);
    }
}
