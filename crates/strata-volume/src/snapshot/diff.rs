//! What changed between two maps of one volume (two snapshots): ranges
//! whose data differs, and ranges that became zeros.
//!
//! Exact, not a guess: data written before snapshot A never moves while A
//! exists (GC neither moves nor deletes what a snapshot's map points at,
//! `snapshot_pins.rs`), so a range whose `(segment, offset)` is the same in
//! both maps holds the same bytes, and a range whose place differs was
//! written after A (a GC pass that only moves data changes nothing here).
//! Holes and allocated zeros read the same and count as equal. One merge
//! pass over both maps' extents: O(extents), never O(volume size).

use serde::Serialize;

use crate::map::{ExtentMap, Target};

/// What a changed range holds in the newer map.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    /// New data: read it from the newer snapshot.
    Data,
    /// Zeros now (trimmed, zeroed, or never written there).
    Zero,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Change {
    pub offset: u64,
    pub length: u64,
    pub kind: ChangeKind,
}

/// A run of one map covering `[start, end)`: data at `(seq, offset)` at
/// `start`, or zeros (`None`: a hole or allocated zeros).
#[derive(Debug, Clone, Copy)]
struct Run {
    start: u64,
    end: u64,
    data: Option<(u64, u64)>,
}

impl Run {
    fn at(&self, pos: u64) -> Option<(u64, u64)> {
        self.data
            .map(|(seq, offset)| (seq, offset + (pos - self.start)))
    }
}

/// The runs of `map` over `[0, size)`, holes included.
fn runs(map: &ExtentMap, size: u64) -> impl Iterator<Item = Run> + '_ {
    let mut pos = 0u64;
    let mut extents = map.iter().filter(move |e| e.start < size).peekable();
    std::iter::from_fn(move || {
        if pos >= size {
            return None;
        }
        let run = match extents.peek() {
            Some(e) if e.start > pos => Run {
                start: pos,
                end: e.start,
                data: None,
            },
            Some(e) => {
                let data = match e.target {
                    Target::Data { seq, offset } => Some((seq, offset)),
                    Target::Zero => None,
                };
                let run = Run {
                    start: e.start,
                    end: (e.start + e.len).min(size),
                    data,
                };
                extents.next();
                run
            }
            None => Run {
                start: pos,
                end: size,
                data: None,
            },
        };
        pos = run.end;
        Some(run)
    })
}

/// The ranges of `[0, size)` where `newer` differs from `older`, in order,
/// adjacent ranges of one kind merged.
pub fn diff_maps(older: &ExtentMap, newer: &ExtentMap, size: u64) -> Vec<Change> {
    let mut out: Vec<Change> = Vec::new();
    differing(older, newer, size, |start, end, _, after| {
        let kind = if after.is_some() {
            ChangeKind::Data
        } else {
            ChangeKind::Zero
        };
        push_change(&mut out, start, end - start, kind);
    });
    out
}

/// Appends a change, merged with the last one when they touch and are of
/// one kind.
pub(crate) fn push_change(out: &mut Vec<Change>, offset: u64, length: u64, kind: ChangeKind) {
    match out.last_mut() {
        Some(last) if last.kind == kind && last.offset + last.length == offset => {
            last.length += length;
        }
        _ => out.push(Change {
            offset,
            length,
            kind,
        }),
    }
}

/// Where a run's data lives, `(seq, offset)` at its start; `None` for
/// zeros (a hole or allocated zeros: they read the same).
pub(crate) type Place = Option<(u64, u64)>;

/// Calls `f(start, end, older_place, newer_place)` for each run of
/// `[0, size)` where the maps differ, in order.
pub(crate) fn differing(
    older: &ExtentMap,
    newer: &ExtentMap,
    size: u64,
    mut f: impl FnMut(u64, u64, Place, Place),
) {
    let mut a = runs(older, size);
    let mut b = runs(newer, size);
    let (Some(mut ra), Some(mut rb)) = (a.next(), b.next()) else {
        return;
    };
    let mut pos = 0u64;
    while pos < size {
        let end = ra.end.min(rb.end);
        let (ta, tb) = (ra.at(pos), rb.at(pos));
        if ta != tb {
            f(pos, end, ta, tb);
        }
        pos = end;
        if ra.end == end {
            match a.next() {
                Some(r) => ra = r,
                None => break,
            }
        }
        if rb.end == end {
            match b.next() {
                Some(r) => rb = r,
                None => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(seq: u64, offset: u64) -> Option<Target> {
        Some(Target::Data { seq, offset })
    }

    #[test]
    fn reports_new_data_and_new_zeros_and_nothing_else() {
        let mut a = ExtentMap::new();
        a.set(0, 100, data(1, 0));
        a.set(200, 100, data(1, 100));
        a.set(400, 50, Some(Target::Zero));
        let mut b = a.clone();
        assert!(diff_maps(&a, &b, 1000).is_empty());
        b.set(50, 20, data(2, 0)); // overwritten
        b.set(250, 100, None); // trimmed, partly over a hole
        b.set(600, 10, data(2, 20)); // written where nothing was
        b.set(420, 10, None); // zeros to hole: reads the same
        let d = diff_maps(&a, &b, 1000);
        assert_eq!(
            d,
            vec![
                Change {
                    offset: 50,
                    length: 20,
                    kind: ChangeKind::Data
                },
                Change {
                    offset: 250,
                    length: 50,
                    kind: ChangeKind::Zero
                },
                Change {
                    offset: 600,
                    length: 10,
                    kind: ChangeKind::Data
                },
            ]
        );
    }

    #[test]
    fn the_same_bytes_at_another_place_are_a_change() {
        let mut a = ExtentMap::new();
        a.set(0, 4096, data(1, 0));
        let mut b = ExtentMap::new();
        b.set(0, 4096, data(3, 0));
        let d = diff_maps(&a, &b, 8192);
        assert_eq!(
            d,
            vec![Change {
                offset: 0,
                length: 4096,
                kind: ChangeKind::Data
            }]
        );
    }
}
