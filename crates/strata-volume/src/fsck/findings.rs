//! The problems found so far and what each reaches: damaged bytes of a
//! segment, a lost map, or nothing a reader needs. The affected ranges
//! are computed from the reach once every problem is known
//! (`affected.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

use super::report::{Affects, Problem, ProblemKind, Severity};

/// What a problem takes away from readers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reach {
    /// These bytes of segment `seq`'s data area (`u64::MAX` as the end:
    /// to its end; `0..u64::MAX`: all of it).
    Segment { seq: u64, range: Range<u64> },
    /// The volume's map: every byte of the volume.
    VolumeMap,
    /// Snapshot `name`'s map: every byte of it, and its clones.
    SnapshotMap(String),
    /// Every segment up to this number: a clone's ancestors (its parent
    /// or the snapshot it was made from is gone).
    Inherited(u64),
    /// Nothing a reader needs (space, a warning, a delta).
    Nothing,
}

impl Reach {
    pub fn whole_segment(seq: u64) -> Reach {
        Reach::Segment {
            seq,
            range: 0..u64::MAX,
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct Findings {
    problems: Vec<Problem>,
    /// One per problem.
    reach: Vec<Reach>,
    /// Segments found gone, or damaged, that the volume no longer needs
    /// when the manifest is read again (GC collected them meanwhile).
    pub collected: u64,
}

impl Findings {
    pub fn add(
        &mut self,
        severity: Severity,
        kind: ProblemKind,
        object: String,
        detail: String,
        reach: Reach,
    ) {
        self.problems.push(Problem {
            severity,
            kind,
            object,
            detail,
            affects: Affects::default(),
        });
        self.reach.push(reach);
    }

    /// Damaged segment bytes, by segment: `(problem index, range)`.
    pub fn damaged_segments(&self) -> BTreeMap<u64, Vec<(usize, Range<u64>)>> {
        let mut out: BTreeMap<u64, Vec<(usize, Range<u64>)>> = BTreeMap::new();
        for (i, r) in self.reach.iter().enumerate() {
            if let Reach::Segment { seq, range } = r {
                out.entry(*seq).or_default().push((i, range.clone()));
            }
        }
        out
    }

    /// Drops the problems reaching bytes of segments `seqs`.
    pub fn forget_segments(&mut self, seqs: &BTreeSet<u64>) {
        // `reach[i]` is where `problems[i]` lies: both are pushed together.
        debug_assert_eq!(self.reach.len(), self.problems.len());
        (self.reach, self.problems) = std::mem::take(&mut self.reach)
            .into_iter()
            .zip(std::mem::take(&mut self.problems))
            .filter(|(r, _)| !matches!(r, Reach::Segment { seq, .. } if seqs.contains(seq)))
            .unzip();
    }

    pub fn reach(&self) -> &[Reach] {
        &self.reach
    }

    /// Whether some map could not be read (then no segment can be called
    /// unreferenced).
    pub fn maps_lost(&self) -> bool {
        let lost = |r: &Reach| {
            matches!(
                r,
                Reach::VolumeMap | Reach::SnapshotMap(_) | Reach::Inherited(_)
            )
        };
        self.reach.iter().any(lost)
    }

    /// Whether some problem reaches bytes of segments (then the maps are
    /// walked to find which ranges).
    pub fn reaches_segments(&self) -> bool {
        let in_segments = |r: &Reach| matches!(r, Reach::Segment { .. } | Reach::Inherited(_));
        self.reach.iter().any(in_segments)
    }

    /// The problems, each with `affects[i]`.
    pub fn into_problems(self, affects: Vec<Affects>) -> Vec<Problem> {
        let mut problems = self.problems;
        for (p, a) in problems.iter_mut().zip(affects) {
            p.affects = a;
        }
        problems
    }
}

/// How a read that failed is reported.
pub(crate) enum ReadFailure {
    /// The object is not in the store: deleted by GC meanwhile, or lost
    /// (the recheck of `collected.rs` decides).
    Gone,
    /// It is there but does not verify: a problem.
    Damaged(String),
    /// The store failed (after its retries): the check cannot go on.
    Failed(crate::error::VolumeError),
}

impl ReadFailure {
    pub fn of(e: crate::error::VolumeError) -> ReadFailure {
        if crate::objects::is_not_found(&e) {
            return ReadFailure::Gone;
        }
        match e {
            crate::error::VolumeError::Corrupt { detail, .. } => ReadFailure::Damaged(detail),
            e => ReadFailure::Failed(e),
        }
    }
}
