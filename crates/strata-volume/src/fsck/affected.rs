//! Which ranges of the volume and of each snapshot, and which clones, a
//! problem affects. Each map is walked once against the damaged segment
//! bytes of every problem (O(extents)), so the caller holds one map at a
//! time.

use std::collections::BTreeMap;
use std::ops::Range;

use super::findings::{Findings, Reach};
use super::report::{AffectedRanges, Affects, SnapshotRanges};
use crate::map::{ExtentMap, Target};

pub(crate) struct Attribution {
    /// Damaged bytes by segment: `(problem, range of its data area)`.
    damaged: BTreeMap<u64, Vec<(usize, Range<u64>)>>,
    /// Problems reaching every segment up to a number: `(problem, seq)`.
    inherited: Vec<(usize, u64)>,
    reach: Vec<Reach>,
    affects: Vec<Affects>,
}

impl Attribution {
    pub fn new(findings: &Findings) -> Attribution {
        let inherited = findings.reach().iter().enumerate();
        let inherited = inherited.filter_map(|(i, r)| match r {
            Reach::Inherited(upto) => Some((i, *upto)),
            _ => None,
        });
        Attribution {
            inherited: inherited.collect(),
            damaged: findings.damaged_segments(),
            reach: findings.reach().to_vec(),
            affects: vec![Affects::default(); findings.reach().len()],
        }
    }

    /// The volume's map; `None` when it could not be read (then any
    /// damaged segment may affect any of its bytes).
    pub fn volume_map(&mut self, map: Option<&ExtentMap>) {
        let mut found = self.ranges_in(map);
        for (i, reach) in self.reach.iter().enumerate() {
            let in_segments = matches!(reach, Reach::Segment { .. } | Reach::Inherited(_));
            let whole = matches!(reach, Reach::VolumeMap) || (map.is_none() && in_segments);
            self.affects[i].volume = if whole {
                Some(AffectedRanges::whole())
            } else {
                found.remove(&i).and_then(AffectedRanges::of)
            };
        }
    }

    /// Snapshot `name`'s map (`None`: it could not be read).
    pub fn snapshot_map(&mut self, name: &str, map: Option<&ExtentMap>) {
        let mut found = self.ranges_in(map);
        for (i, reach) in self.reach.iter().enumerate() {
            let ranges = match reach {
                Reach::SnapshotMap(n) if n == name => Some(AffectedRanges::whole()),
                _ => found.remove(&i).and_then(AffectedRanges::of),
            };
            if let Some(ranges) = ranges {
                self.affects[i].snapshots.push(SnapshotRanges {
                    snapshot: name.to_string(),
                    ranges,
                });
            }
        }
    }

    /// Clones made from snapshot `snapshot`: affected wherever it is.
    pub fn clones_of(&mut self, snapshot: &str, clones: &[String]) {
        for a in &mut self.affects {
            if a.snapshots.iter().any(|s| s.snapshot == snapshot) {
                a.clones.extend(clones.iter().cloned());
            }
        }
    }

    pub fn finish(mut self) -> Vec<Affects> {
        for a in &mut self.affects {
            a.clones.sort();
            a.clones.dedup();
        }
        self.affects
    }

    /// For each problem, the volume ranges of `map` that read its damaged
    /// bytes.
    fn ranges_in(&self, map: Option<&ExtentMap>) -> BTreeMap<usize, Vec<Range<u64>>> {
        let mut out: BTreeMap<usize, Vec<Range<u64>>> = BTreeMap::new();
        let Some(map) = map else { return out };
        if self.damaged.is_empty() && self.inherited.is_empty() {
            return out;
        }
        for e in map.iter() {
            let Target::Data { seq, offset } = e.target else {
                continue;
            };
            for (i, _) in self.inherited.iter().filter(|(_, upto)| seq <= *upto) {
                out.entry(*i).or_default().push(e.start..e.start + e.len);
            }
            let Some(damaged) = self.damaged.get(&seq) else {
                continue;
            };
            for (i, r) in damaged {
                let start = r.start.max(offset);
                let end = r.end.min(offset + e.len);
                if start < end {
                    let at = e.start + (start - offset);
                    out.entry(*i).or_default().push(at..at + (end - start));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::super::report::{ProblemKind, Severity};
    use super::*;

    #[test]
    fn damaged_bytes_map_to_volume_and_snapshot_ranges_and_clones() {
        let mut findings = Findings::default();
        let add = |f: &mut Findings, reach| {
            f.add(
                Severity::Error,
                ProblemKind::Corrupt,
                "o".into(),
                "d".into(),
                reach,
            )
        };
        add(
            &mut findings,
            Reach::Segment {
                seq: 3,
                range: 4096..8192,
            },
        );
        add(&mut findings, Reach::SnapshotMap("b".into()));
        add(&mut findings, Reach::Nothing);
        let mut volume = ExtentMap::new();
        // Segment 3's bytes 0..16384 at volume offset 1 MiB.
        volume.set(1 << 20, 16384, Some(Target::Data { seq: 3, offset: 0 }));
        let mut snap = ExtentMap::new();
        snap.set(
            0,
            4096,
            Some(Target::Data {
                seq: 3,
                offset: 6144,
            }),
        );
        let mut a = Attribution::new(&findings);
        a.volume_map(Some(&volume));
        a.snapshot_map("a", Some(&snap));
        a.snapshot_map("b", None);
        a.clones_of("a", &["c1".to_string()]);
        a.clones_of("b", &["c2".to_string()]);
        let affects = a.finish();
        let v = affects[0].volume.as_ref().unwrap();
        assert_eq!(
            (v.ranges[0].offset, v.ranges[0].length),
            (1 << 20 | 4096, 4096)
        );
        assert_eq!(affects[0].snapshots.len(), 1);
        assert_eq!(affects[0].snapshots[0].ranges.bytes, 2048);
        assert_eq!(affects[0].clones, vec!["c1".to_string()]);
        assert!(affects[1].snapshots[0].ranges.whole);
        assert_eq!(affects[1].clones, vec!["c2".to_string()]);
        assert!(affects[1].volume.is_none() && affects[2].is_empty());
    }
}
