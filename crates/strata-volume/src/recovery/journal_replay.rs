//! Recovery from the local journal: which journal to replay (or a fresh
//! one), and replaying its records after the store's position into the
//! open segment, sealing as it fills.

use std::collections::hash_map::Entry;
use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::os::unix::fs::FileExt;

use crate::config::VolumeConfig;
use crate::error::{JournalError, VolumeError};
use crate::format::journal::{record_bytes, Placed, RecordKind, Superblock};
use crate::format::segment::JournalSpan;
use crate::write::journal_file::{self, Position};
use crate::write::state::{apply_op, State};

/// Picks the journal to replay, or makes a fresh one.
pub(crate) fn choose_journal(
    path: &std::path::Path,
    config: &VolumeConfig,
    uuid: [u8; 16],
    span: Option<JournalSpan>,
    last_opened_here: bool,
) -> Result<(Superblock, Position), VolumeError> {
    let existing = match journal_file::read_superblock(path) {
        Ok(sb) => sb,
        // Its content is not a journal of this format: nothing to replay.
        Err(e @ JournalError::Invalid { .. }) => {
            tracing::warn!(journal = %path.display(), error = %strata_store::ErrorText(&e), "unreadable journal; starting a new one");
            None
        }
        // The file could not be read (permissions, too many open files, an
        // I/O error): it may hold acknowledged writes, so the volume does
        // not open rather than replace it.
        Err(e) => {
            return Err(VolumeError::Invalid(format!(
                "{e}; the journal may hold acknowledged writes, so the volume was not opened: fix the cause and open it again"
            )))
        }
    };
    if let Some(sb) = existing.filter(|sb| sb.volume_uuid == uuid) {
        match span {
            Some(s) if s.journal_id == sb.journal_id => {
                return Ok((
                    sb,
                    Position {
                        lpos: s.end_lpos,
                        jseq: s.last_jseq + 1,
                    },
                ));
            }
            // A journal begun here right after the store's last write, of
            // which nothing is stored yet (a volume moved here, written,
            // crashed before its first upload), while no other server
            // opened the volume since: its records are the volume's next
            // writes. Without this, FLUSHed writes of a moved volume were
            // dropped by a crash in its first seconds here.
            Some(s) if last_opened_here && sb.start_jseq == s.last_jseq + 1 => {
                return Ok((
                    sb,
                    Position {
                        lpos: 0,
                        jseq: sb.start_jseq,
                    },
                ));
            }
            None => {
                return Ok((
                    sb,
                    Position {
                        lpos: 0,
                        jseq: sb.start_jseq,
                    },
                ))
            }
            Some(_) => {
                tracing::warn!(journal = %path.display(), "journal is older than the store's state (volume was served elsewhere); starting a new one")
            }
        }
    }
    let start_jseq = span.map_or(1, |s| s.last_jseq + 1);
    let sb = Superblock {
        volume_uuid: uuid,
        journal_id: *uuid::Uuid::new_v4().as_bytes(),
        ring_bytes: config.journal_bytes,
        start_jseq,
    };
    journal_file::create(path, sb)?;
    Ok((
        sb,
        Position {
            lpos: 0,
            jseq: start_jseq,
        },
    ))
}

/// Opens the staged file of segment `seq` with `tag` for reading (`None`:
/// the store has no files).
pub(crate) type OpenStaged<'a> = &'a dyn Fn(u64, u64) -> Option<std::io::Result<File>>;

/// Largest placed write replay reads back (bounds what a record, CRC
/// checked but untrusted, makes it allocate).
const MAX_PLACED_BYTES: u64 = 1 << 30;

/// What a replay ended with.
pub(crate) struct Replayed {
    /// Where the journal continues: after the last record applied.
    pub head: Position,
    pub records: u64,
    /// Staged files (segment seq, tag) the applied records point into.
    pub staged_files: BTreeSet<(u64, u64)>,
}

/// Replays journal records into the open segment (sealing as it fills).
/// A placed write's bytes are read back from its staged file and checked;
/// one whose bytes are not there ends the replay, as a bad record does.
pub(crate) fn replay_journal(
    path: &std::path::Path,
    sb: Superblock,
    start: Position,
    st: &mut State,
    config: &VolumeConfig,
    size: u64,
    open_staged: OpenStaged<'_>,
) -> Result<Replayed, VolumeError> {
    let mut scanner = journal_file::Scanner::open(path, sb, start)?;
    let mut out = Replayed {
        head: start,
        records: 0,
        staged_files: BTreeSet::new(),
    };
    let mut files: HashMap<(u64, u64), File> = HashMap::new();
    loop {
        let before = scanner.position();
        let rec = scanner.next_record().map_err(|source| VolumeError::Io {
            what: format!("replay journal {}", path.display()),
            source,
        })?;
        let Some(rec) = rec else { break };
        if rec.offset.checked_add(rec.len).is_none_or(|end| end > size) {
            tracing::warn!(journal = %path.display(), jseq = rec.jseq, "journal record beyond the volume's end; replay stops there");
            out.head = before;
            return Ok(out);
        }
        let (kind, payload) = match rec.kind {
            RecordKind::Placed => match read_placed(&rec.payload, rec.len, open_staged, &mut files)
            {
                Ok((data, file)) => {
                    out.staged_files.insert(file);
                    (RecordKind::Write, data)
                }
                // Its bytes never reached the file (the process died
                // between its record and its `pwrite`, or a power cut took
                // bytes no FLUSH had synced): a write not acknowledged, or
                // not FLUSHed, and so is every one after it
                // (`PlacedInFlight`): replay stops there, as at a bad record.
                Err(why) => {
                    tracing::warn!(journal = %path.display(), jseq = rec.jseq, %why, "a placed write's bytes are not in its segment file (a write no FLUSH covered, cut by a crash); replay stops there");
                    out.head = before;
                    return Ok(out);
                }
            },
            kind => (kind, rec.payload),
        };
        let cost = record_bytes(payload.len());
        apply_op(
            st,
            kind,
            rec.offset,
            rec.len,
            &payload,
            &[],
            cost,
            rec.jseq,
            rec.end_lpos,
        );
        out.records += 1;
        if st.open.cost_bytes >= config.segment_bytes {
            st.seal_open(Vec::new());
        }
    }
    out.head = scanner.position();
    Ok(out)
}

/// A placed write's bytes, read from its staged file and checked against
/// the record's CRC, and which file they came from.
fn read_placed(
    payload: &[u8],
    len: u64,
    open_staged: OpenStaged<'_>,
    files: &mut HashMap<(u64, u64), File>,
) -> Result<(Vec<u8>, (u64, u64)), String> {
    let p = Placed::decode(payload)?;
    if len > MAX_PLACED_BYTES {
        return Err(format!("placed write of {len} bytes is implausible"));
    }
    let key = (p.seq, p.tag);
    let file = match files.entry(key) {
        Entry::Occupied(e) => e.into_mut(),
        Entry::Vacant(e) => match open_staged(p.seq, p.tag) {
            Some(Ok(f)) => e.insert(f),
            Some(Err(err)) => {
                return Err(format!(
                    "segment {} file #{}: {}",
                    p.seq,
                    p.tag,
                    strata_store::ErrorText(&err)
                ))
            }
            None => return Err("the store keeps no segment files".into()),
        },
    };
    let mut data = vec![0u8; len as usize];
    file.read_exact_at(&mut data, p.file_offset).map_err(|e| {
        format!(
            "segment {} file #{}: {}",
            p.seq,
            p.tag,
            strata_store::ErrorText(&e)
        )
    })?;
    if crc32c::crc32c(&data) != p.data_crc {
        return Err(format!(
            "segment {} file #{}: the bytes at {} do not match the record's CRC",
            p.seq, p.tag, p.file_offset
        ));
    }
    Ok((data, key))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A journal that cannot be read is never replaced: it may hold
    /// acknowledged writes. One whose content is no journal is.
    #[test]
    fn an_unreadable_journal_stops_the_open_and_a_foreign_file_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let config = VolumeConfig::new(dir.path().to_path_buf());
        let uuid = [7u8; 16];
        // A directory where the journal should be: open works, read fails.
        let path = dir.path().join("v.journal");
        std::fs::create_dir(&path).unwrap();
        let err = choose_journal(&path, &config, uuid, None, false).unwrap_err();
        assert!(
            err.to_string().contains("may hold acknowledged writes"),
            "{err}"
        );
        assert!(path.is_dir(), "left as it was");
        // A short file of garbage is no journal: a new one replaces it.
        let path = dir.path().join("w.journal");
        std::fs::write(&path, b"not a journal").unwrap();
        let (sb, start) = choose_journal(&path, &config, uuid, None, false).unwrap();
        assert_eq!((sb.volume_uuid, start.lpos, start.jseq), (uuid, 0, 1));
    }
}
