//! Recovery: rebuilding a volume's write-side state from manifest,
//! checkpoint, later segments and the journal.
//!
//! Owns the order of recovery (ownership is taken before, by
//! `ownership/take_ownership.rs`; `volume/open.rs` sequences both). It is idempotent: a crash during recovery
//! leaves what the next one needs (nothing is deleted that the journal does
//! not also hold), and applying a segment twice changes nothing.
//!
//! 1. manifest -> latest checkpoint (extent map as of segment S); a clone
//!    with no checkpoint of its own starts from its parent snapshot's map,
//!    S being that snapshot's checkpoint
//! 2. segments S+1, S+2, ... while contiguous; a segment after a gap was
//!    uploaded while an earlier one was not: it is deleted (its writes are
//!    in the journal, whose replay starts before the gap) so numbering stays
//!    contiguous for the next recovery
//! 3. the journal, from the position the last applied segment (or the
//!    checkpoint) recorded, if it is the same journal instance
//! 4. everything replayed sits in the open segment and sealed segments that
//!    are uploaded as usual
//!
//! Files: `store_replay.rs` (steps 1-2), `journal_replay.rs` (step 3).
//! Reads the store, writes nothing to it but the deletion of step 2; never
//! touches the read caches.

mod journal_replay;
mod store_replay;

use std::collections::{BTreeMap, BTreeSet};

use strata_store::{ObjectNames, Store};

use crate::config::VolumeConfig;
use crate::error::VolumeError;
use crate::format::key_wrap::Key;
use crate::format::manifest::Manifest;
use crate::map::ExtentMap;
use crate::snapshot::SnapshotPins;
use crate::write::journal::Journal;
use crate::write::open_segment::OpenSegment;
use crate::write::state::State;
use journal_replay::{choose_journal, replay_journal};
pub(crate) use store_replay::apply_entries;
use store_replay::{recover_from_store, Recovered};

/// A volume's write-side state after recovery, and its open journal.
pub(crate) struct RecoveredVolume {
    pub state: State,
    pub journal: Journal,
    /// Journal records replayed (now in the open and sealed segments).
    pub replayed_records: u64,
}

/// Recovers volume `name` (instance `uuid`), which this server owns now.
/// `last_opened_here`: no other server opened it since this one last did
/// (`choose_journal`).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn recover(
    store: &Store,
    config: &VolumeConfig,
    name: &str,
    manifest: &Manifest,
    uuid: [u8; 16],
    base_map: Option<(ExtentMap, u64)>,
    data_key: Option<&Key>,
    last_opened_here: bool,
) -> Result<RecoveredVolume, VolumeError> {
    let names = ObjectNames::new(name);
    let started = std::time::Instant::now();
    let rec = recover_from_store(store, &names, manifest, uuid, base_map, data_key).await?;
    tracing::debug!(volume = %name, elapsed_ms = started.elapsed().as_millis() as u64, segments_listed = rec.stored.len(), segments_applied = rec.data_sizes.len(), "recovered from the store");
    let jpath = config.journal_path(name, &uuid);
    let (sb, start) = choose_journal(&jpath, config, uuid, rec.span, last_opened_here)?;
    let mut state = initial_state(rec, sb.journal_id, config.segment_bytes);
    let open_staged = |seq: u64, tag: u64| store.open_staged(&names.segment(seq), tag);
    let replayed = replay_journal(
        &jpath,
        sb,
        start,
        &mut state,
        config,
        manifest.size_bytes,
        &open_staged,
    )?;
    keep_replayed_staged_files(store, &names, &mut state, &replayed.staged_files);
    let journal = Journal::open(
        &jpath,
        sb,
        replayed.head,
        start.lpos,
        config.journal_punch_min_bytes,
    )?;
    Ok(RecoveredVolume {
        state,
        journal,
        replayed_records: replayed.records,
    })
}

/// The volume's staged segment files (`write/staged_segment.rs`): those
/// the replayed records point into stay until every segment replay filled
/// is durable (a crash before then replays them again); the others are
/// left over from segments now durable, or from records replay dropped,
/// and go now.
fn keep_replayed_staged_files(
    store: &Store,
    names: &ObjectNames,
    state: &mut State,
    referenced: &BTreeSet<(u64, u64)>,
) {
    let listed = match store.list_staged(&names.segments_prefix()) {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(store = %store.description(), error = %strata_store::ErrorText(&e), "cannot list segment files left by an earlier process; they stay");
            return;
        }
    };
    for (object, tag, path) in listed {
        let seq = u64::from_str_radix(&object, 16).ok();
        if seq.is_some_and(|seq| referenced.contains(&(seq, tag))) {
            // The last segment replay put records in.
            let last = state.open.seq - u64::from(state.open.is_empty());
            state.staged_unlink.entry(last).or_default().push(path);
        } else if let Err(e) = strata_store::remove_staged_path(&path) {
            tracing::warn!(file = %path.display(), error = %strata_store::ErrorText(&e), "cannot remove a segment file left by an earlier process");
        }
    }
}

/// The state the store alone describes: its map, everything durable, the
/// next segment open.
fn initial_state(rec: Recovered, journal_id: [u8; 16], segment_bytes: u64) -> State {
    State {
        map: rec.map,
        open: OpenSegment {
            // No buffer until the first write (`OpenSegment::before_entry`).
            reserve_bytes: segment_bytes as usize,
            ..OpenSegment::new(rec.next_seq, Vec::new(), journal_id)
        },
        sealed: BTreeMap::new(),
        settling: BTreeMap::new(),
        uploaded: BTreeSet::new(),
        stored: rec.stored,
        data_sizes: rec.data_sizes,
        buffered_cost_bytes: 0,
        host: std::sync::Arc::new(crate::write::host_budget::HostWriteBudget::unlimited()),
        durable_seq: rec.next_seq - 1,
        segments_since_checkpoint: rec.next_seq - 1 - rec.checkpoint_seq,
        last_sealed_span: rec.span.unwrap_or_default(),
        checkpoint_requested_seq: rec.checkpoint_seq,
        checkpoint_done_seq: rec.checkpoint_seq,
        failed: None,
        pins: SnapshotPins::default(),
        resizing: false,
        changed: None,
        staged_unlink: BTreeMap::new(),
    }
}
