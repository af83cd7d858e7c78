//! The pass over segments: one job per segment some map points into or
//! recovery replays, `PARALLEL_SEGMENTS` checked at a time, each result
//! turned into problems (an error where a map reads the damaged bytes, a
//! warning where only garbage is damaged).

use std::collections::{BTreeMap, BTreeSet};

use futures::StreamExt;

use super::collected::Gone;
use super::findings::Reach;
use super::maps::Maps;
use super::report::{FsckProgress, ProblemKind, ProgressFn, Severity};
use super::scope::Scope;
use super::segments::{check_segment, SegmentJob, SegmentResult};
use super::state::State;
use crate::error::VolumeError;
use crate::objects::list_segments;

/// Segments checked at once.
const PARALLEL_SEGMENTS: usize = 4;

/// Checks every segment a map points into and every segment recovery
/// replays, `PARALLEL_SEGMENTS` at a time.
pub(crate) async fn check_segments(
    scope: &Scope,
    maps: &mut Maps,
    listed: &BTreeMap<u64, u64>,
    st: &mut State,
    progress: ProgressFn<'_>,
) -> Result<(), VolumeError> {
    let jobs = segment_jobs(scope, maps, listed).await?;
    let mut shown = FsckProgress {
        segments_total: jobs.len() as u64,
        bytes_total: jobs.iter().filter_map(|j| j.listed_bytes).sum(),
        ..FsckProgress::default()
    };
    progress(shown);
    let key = scope.data_key.as_ref();
    let checks = jobs
        .into_iter()
        .map(|job| check_segment(job, key, scope.quick));
    let mut results = futures::stream::iter(checks).buffer_unordered(PARALLEL_SEGMENTS);
    while let Some(result) = results.next().await {
        let result = result?;
        shown.segments_done += 1;
        shown.bytes_done += result.job.listed_bytes.unwrap_or(0);
        progress(shown);
        record_segment(maps, result, st);
    }
    Ok(())
}

/// One job per segment to check, with the places maps read in it and its
/// size as listed (an ancestor's listing for an inherited segment).
async fn segment_jobs(
    scope: &Scope,
    maps: &mut Maps,
    listed: &BTreeMap<u64, u64>,
) -> Result<Vec<SegmentJob>, VolumeError> {
    let mut seqs: BTreeSet<u64> = maps.places.seqs().into_iter().collect();
    seqs.extend(&maps.tail);
    let mut ancestors: BTreeMap<String, BTreeMap<u64, u64>> = BTreeMap::new();
    let mut jobs = Vec::with_capacity(seqs.len());
    for seq in seqs {
        let places = maps.places.take(seq);
        if scope.inherited_unreadable && seq <= scope.base_seq() {
            continue;
        }
        let owner = scope.owner(seq);
        let listed_bytes = if owner.ancestor {
            if !ancestors.contains_key(&owner.name) {
                let found = list_segments(&owner.store, &owner.names).await?;
                ancestors.insert(owner.name.clone(), found.into_iter().collect());
            }
            ancestors
                .get(&owner.name)
                .and_then(|l| l.get(&seq))
                .copied()
        } else {
            listed.get(&seq).copied()
        };
        jobs.push(SegmentJob {
            seq,
            entry_bound_bytes: scope.entry_bound_bytes(seq),
            owner,
            listed_bytes,
            places,
        });
    }
    Ok(jobs)
}

/// Turns what a segment's check found into problems.
fn record_segment(maps: &Maps, r: SegmentResult, st: &mut State) {
    let seq = r.job.seq;
    let c = &mut st.checked;
    c.bytes_read += r.bytes_read;
    c.data_bytes_verified += r.data_bytes_verified;
    if r.verified_header {
        c.segments += 1;
        c.ancestor_segments += u64::from(r.job.owner.ancestor);
    }
    if r.gone {
        st.gone.push(Gone::Segment(seq));
        return;
    }
    let object = r.job.owner.names.segment(seq).to_string();
    let whose = match r.job.owner.ancestor {
        true => format!("segment {seq} of {} (inherited): ", r.job.owner.name),
        false => String::new(),
    };
    for f in r.faults {
        let (severity, reach, note) = match f.damaged {
            None => (Severity::Warning, Reach::Nothing, ""),
            Some(range) => {
                let whole = range == (0..u64::MAX);
                let map_fault = matches!(
                    f.kind,
                    ProblemKind::MapPastEnd | ProblemKind::MapInconsistent
                );
                let read = r
                    .job
                    .places
                    .iter()
                    .any(|p| p.data_offset < range.end && range.start < p.end());
                if whole && maps.damaged_tail.contains(&seq) {
                    let note = " (recovery replays this segment: the volume cannot be opened)";
                    (Severity::Error, Reach::VolumeMap, note)
                } else if whole || map_fault || read {
                    (Severity::Error, Reach::Segment { seq, range }, "")
                } else {
                    let note = " (no map reads these bytes: damaged garbage)";
                    (Severity::Warning, Reach::Nothing, note)
                }
            }
        };
        let detail = format!("{whose}{}{note}", f.detail);
        st.findings
            .add(severity, f.kind, object.clone(), detail, reach);
    }
}
