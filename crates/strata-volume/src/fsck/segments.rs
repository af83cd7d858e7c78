//! Checking one segment object: its fixed header (checksum, that it is the
//! segment of this volume at this position), its tables (checksum,
//! authentication when encrypted, entries within bounds), its size against
//! what the header says, the places maps read in it against its entries,
//! and (unless quick) every chunk of its data: frame checksum,
//! authentication, decoding, and the logical chunk checksum, through the
//! same `SegmentIndex::decode_run` every read uses.
//!
//! Memory: the header's tables and one run of at most `RUN_BYTES` of data
//! per segment in flight.

use std::ops::Range;

use object_store::path::Path;

use super::places::{check_places, Place};
use super::report::ProblemKind;
use super::scope::Owner;
use crate::error::VolumeError;
use crate::format::key_wrap::Key;
use crate::format::segment::{FixedHeader, SegmentIndex, CHUNK_BYTES, FIXED_HEADER_BYTES};
use crate::objects::store_error;

/// Stored bytes one ranged GET of data reads at most.
const RUN_BYTES: u64 = 4 << 20;

/// One segment to check.
pub(crate) struct SegmentJob {
    pub seq: u64,
    pub owner: Owner,
    /// Object bytes as listed; `None`: not in the listing.
    pub listed_bytes: Option<u64>,
    /// What its entries are checked against (`Scope::entry_bound_bytes`).
    pub entry_bound_bytes: u64,
    /// The places maps read in it, sorted by data offset.
    pub places: Vec<Place>,
}

/// Something wrong with a segment.
#[derive(Debug)]
pub(crate) struct SegmentFault {
    pub kind: ProblemKind,
    pub detail: String,
    /// The bytes of its data area it takes away (`0..u64::MAX`: all);
    /// `None`: none (the object is longer than its header says).
    pub damaged: Option<Range<u64>>,
}

/// What checking a segment found.
pub(crate) struct SegmentResult {
    pub job: SegmentJob,
    /// Not in the store (not listed, or deleted while it was read).
    pub gone: bool,
    pub faults: Vec<SegmentFault>,
    /// The header and tables were read and verified.
    pub verified_header: bool,
    pub bytes_read: u64,
    pub data_bytes_verified: u64,
}

impl SegmentResult {
    fn fault(&mut self, kind: ProblemKind, detail: String, damaged: Option<Range<u64>>) {
        self.faults.push(SegmentFault {
            kind,
            detail,
            damaged,
        });
    }

    fn whole(&mut self, kind: ProblemKind, detail: String) {
        self.fault(kind, detail, Some(0..u64::MAX));
    }
}

/// A store read that either returned bytes, found the object gone, or
/// failed (an error the check cannot go past).
enum Got {
    Bytes(bytes::Bytes),
    Gone,
}

async fn get(owner: &Owner, path: &Path, range: Range<u64>) -> Result<Got, VolumeError> {
    match owner.store.get_range(path, range).await {
        Ok(b) => Ok(Got::Bytes(b)),
        Err(object_store::Error::NotFound { .. }) => Ok(Got::Gone),
        Err(e) => Err(store_error(&owner.store, "read", path)(e)),
    }
}

/// Checks segment `job.seq`; `Err` only when the store fails.
pub(crate) async fn check_segment(
    job: SegmentJob,
    data_key: Option<&Key>,
    quick: bool,
) -> Result<SegmentResult, VolumeError> {
    let mut r = SegmentResult {
        job,
        gone: false,
        faults: Vec::new(),
        verified_header: false,
        bytes_read: 0,
        data_bytes_verified: 0,
    };
    let Some(size) = r.job.listed_bytes else {
        r.gone = true;
        return Ok(r);
    };
    let path = r.job.owner.names.segment(r.job.seq);
    let Some((idx, entries)) = read_index(&mut r, &path, size, data_key).await? else {
        return Ok(r);
    };
    r.verified_header = true;
    let data_bytes = idx.fixed.data_bytes;
    let cut = check_size(&mut r, &idx, size);
    for f in check_places(&r.job.places, &entries, data_bytes) {
        let kind = if f.past_end {
            ProblemKind::MapPastEnd
        } else {
            ProblemKind::MapInconsistent
        };
        r.fault(kind, f.detail, Some(f.range));
    }
    if !quick {
        verify_data(&mut r, &path, &idx, cut).await?;
    }
    if r.gone {
        r.faults.clear();
    }
    Ok(r)
}

/// Reads and verifies the header and tables; `None` when there is nothing
/// more to check (gone, or a fault recorded).
async fn read_index(
    r: &mut SegmentResult,
    path: &Path,
    size: u64,
    data_key: Option<&Key>,
) -> Result<Option<(SegmentIndex, Vec<crate::format::segment::Entry>)>, VolumeError> {
    let head_end = (FIXED_HEADER_BYTES as u64).min(size);
    let head = match get(&r.job.owner, path, 0..head_end).await? {
        Got::Bytes(b) => b,
        Got::Gone => {
            r.gone = true;
            return Ok(None);
        }
    };
    r.bytes_read += head.len() as u64;
    let fixed = match FixedHeader::decode(&head) {
        Ok(f) => f,
        Err(detail) => {
            let kind = if size < FIXED_HEADER_BYTES as u64 {
                ProblemKind::Truncated
            } else {
                ProblemKind::Corrupt
            };
            r.whole(kind, format!("header: {detail}"));
            return Ok(None);
        }
    };
    if fixed.seq != r.job.seq || fixed.volume_uuid != r.job.owner.uuid {
        let detail = format!(
            "header names segment {} of volume {}, not segment {} of {:?}",
            fixed.seq,
            uuid::Uuid::from_bytes(fixed.volume_uuid).simple(),
            r.job.seq,
            r.job.owner.name
        );
        r.whole(ProblemKind::Mismatch, detail);
        return Ok(None);
    }
    let header_bytes = u64::from(fixed.header_bytes);
    if size < header_bytes {
        let detail =
            format!("the object is {size} bytes; its header and tables alone take {header_bytes}");
        r.whole(ProblemKind::Truncated, detail);
        return Ok(None);
    }
    let tables_end = fixed.tables_end();
    // Empty for a segment sealed empty: no request (`Store::get_range`).
    let tables = match get(&r.job.owner, path, FIXED_HEADER_BYTES as u64..tables_end).await? {
        Got::Bytes(b) => b,
        Got::Gone => {
            r.gone = true;
            return Ok(None);
        }
    };
    r.bytes_read += tables.len() as u64;
    let bound = r.job.entry_bound_bytes;
    match SegmentIndex::decode_tables(fixed, &tables, bound, data_key.map(Key::bytes)) {
        Ok(decoded) => Ok(Some(decoded)),
        Err(detail) => {
            r.whole(ProblemKind::Corrupt, format!("tables: {detail}"));
            Ok(None)
        }
    }
}

/// Compares the object's size with its header's; returns the first chunk
/// the object does not wholly hold (`chunk_count` if none).
fn check_size(r: &mut SegmentResult, idx: &SegmentIndex, size: u64) -> u64 {
    let chunks = u64::from(idx.fixed.chunk_count);
    let expected = u64::from(idx.fixed.header_bytes) + idx.stored_data_bytes();
    if size > expected {
        let detail = format!("the object is {size} bytes; its header says {expected}");
        r.fault(ProblemKind::Mismatch, detail, None);
    }
    if size >= expected {
        return chunks;
    }
    // Chunk ends grow with the chunk index: the first one past the end.
    let (mut first, mut past) = (0u64, chunks);
    while first < past {
        let mid = first + (past - first) / 2;
        if idx.chunk_range(mid, mid).end <= size {
            first = mid + 1;
        } else {
            past = mid;
        }
    }
    let from = first * CHUNK_BYTES;
    let detail = format!(
        "the object is {size} bytes; its header says {expected}: data from byte {from} of {} is gone",
        idx.fixed.data_bytes
    );
    r.fault(ProblemKind::Truncated, detail, Some(from..u64::MAX));
    first
}

/// Reads chunks `0..end` in runs of at most `RUN_BYTES` stored bytes and
/// verifies each run; a run that fails is verified chunk by chunk, so each
/// fault names exactly the chunks that are damaged.
async fn verify_data(
    r: &mut SegmentResult,
    path: &Path,
    idx: &SegmentIndex,
    end: u64,
) -> Result<(), VolumeError> {
    let mut first = 0u64;
    while first < end {
        let mut last = first;
        while last + 1 < end && span(idx, first, last + 1) <= RUN_BYTES {
            last += 1;
        }
        let range = idx.chunk_range(first, last);
        let stored = match get(&r.job.owner, path, range.clone()).await? {
            Got::Bytes(b) => b,
            Got::Gone => {
                r.gone = true;
                return Ok(());
            }
        };
        r.bytes_read += stored.len() as u64;
        match idx.decode_run(first, &stored) {
            Ok(plain) => r.data_bytes_verified += plain.len() as u64,
            Err(_) => narrow_down(r, idx, first, last, range.start, &stored),
        }
        first = last + 1;
    }
    Ok(())
}

fn span(idx: &SegmentIndex, first: u64, last: u64) -> u64 {
    let r = idx.chunk_range(first, last);
    r.end - r.start
}

/// Verifies chunks `first..=last` (stored from object offset `base` in
/// `stored`) one by one; consecutive damaged chunks make one fault.
fn narrow_down(
    r: &mut SegmentResult,
    idx: &SegmentIndex,
    first: u64,
    last: u64,
    base: u64,
    stored: &[u8],
) {
    let data_bytes = idx.fixed.data_bytes;
    let mut bad: Option<(u64, u64, String)> = None;
    for c in first..=last {
        let cr = idx.chunk_range(c, c);
        let slice = &stored[(cr.start - base) as usize..(cr.end - base) as usize];
        match idx.decode_run(c, slice) {
            Ok(plain) => {
                r.data_bytes_verified += plain.len() as u64;
                if let Some(b) = bad.take() {
                    damaged_chunks(r, b, data_bytes);
                }
            }
            Err(e) => match &mut bad {
                Some((_, to, _)) => *to = c,
                None => bad = Some((c, c, e)),
            },
        }
    }
    if let Some(b) = bad {
        damaged_chunks(r, b, data_bytes);
    }
}

fn damaged_chunks(r: &mut SegmentResult, (from, to, error): (u64, u64, String), data_bytes: u64) {
    let range = from * CHUNK_BYTES..((to + 1) * CHUNK_BYTES).min(data_bytes);
    let chunks = if from == to {
        format!("chunk {from}")
    } else {
        format!("chunks {from}..={to}")
    };
    let detail = format!(
        "{chunks} (data bytes {}..{}): {error}",
        range.start, range.end
    );
    r.fault(ProblemKind::Corrupt, detail, Some(range));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::segment::empty_segment_header;
    use strata_store::{ObjectNames, Store};

    /// An empty segment (sealed with no entries: no tables, no data) is
    /// checked with one read, its header's, and is clean: no read of zero
    /// bytes, which S3 clients and the in-memory store refuse.
    #[tokio::test]
    async fn an_empty_segment_is_clean() {
        let uuid = [5u8; 16];
        let header = empty_segment_header(7, &uuid);
        let store = Store::in_memory();
        let names = ObjectNames::new("v");
        let path = names.segment(7);
        let object = bytes::Bytes::from(header);
        let size = object.len() as u64;
        store
            .object_store()
            .put(&path, object.into())
            .await
            .unwrap();
        let job = SegmentJob {
            seq: 7,
            owner: Owner {
                name: "v".into(),
                uuid,
                store: store.clone(),
                names,
                ancestor: false,
            },
            listed_bytes: Some(size),
            entry_bound_bytes: 1 << 30,
            places: Vec::new(),
        };
        let before = store.stats().layers.requests.get_range.requests;
        let r = check_segment(job, None, false).await.unwrap();
        let reads = store.stats().layers.requests.get_range.requests - before;
        assert_eq!(reads, 1, "the header only");
        assert!(r.verified_header && !r.gone, "not checked");
        assert!(r.faults.is_empty(), "{:?}", r.faults);
        assert_eq!(r.bytes_read, size);
    }
}
