//! The places maps point at, per segment, and the check that each lies
//! inside its segment's data and is held by a write entry that wrote it at
//! the volume offset the map says (the rule garbage collection relies on
//! to find live data: `gc/live_pieces.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

use crate::format::segment::{Entry, EntryKind};
use crate::map::{ExtentMap, Target};

/// Faults one segment's places report at most (merged when adjacent).
const MAX_FAULTS_PER_SEGMENT: usize = 16;

/// `len` bytes at `data_offset` of a segment's data area, which a map
/// reads at `volume_offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Place {
    pub data_offset: u64,
    pub len: u64,
    pub volume_offset: u64,
}

impl Place {
    pub fn end(&self) -> u64 {
        self.data_offset + self.len
    }

    /// Volume offset minus data offset: the same for every byte of one
    /// write entry, so places of several maps merge when it agrees.
    fn shift(&self) -> i128 {
        i128::from(self.volume_offset) - i128::from(self.data_offset)
    }
}

/// Every place some map points at, per segment. Places of several maps
/// (a volume and its snapshots share most of theirs) that overlap or touch
/// at the same shift are merged: memory follows the distinct places, not
/// the number of maps.
#[derive(Debug, Default)]
pub(crate) struct Places {
    by_seq: BTreeMap<u64, Vec<Place>>,
    extents: u64,
}

impl Places {
    /// Adds the data extents of `map`.
    pub fn add_map(&mut self, map: &ExtentMap) {
        let mut touched = BTreeSet::new();
        for e in map.iter() {
            let Target::Data { seq, offset } = e.target else {
                continue;
            };
            self.by_seq.entry(seq).or_default().push(Place {
                data_offset: offset,
                len: e.len,
                volume_offset: e.start,
            });
            touched.insert(seq);
            self.extents += 1;
        }
        for seq in touched {
            if let Some(places) = self.by_seq.get_mut(&seq) {
                merge(places);
            }
        }
    }

    /// Segments some map points into, ascending.
    pub fn seqs(&self) -> Vec<u64> {
        self.by_seq.keys().copied().collect()
    }

    /// The places of segment `seq`, sorted by data offset (taken out).
    pub fn take(&mut self, seq: u64) -> Vec<Place> {
        self.by_seq.remove(&seq).unwrap_or_default()
    }

    /// Map extents added (of every map).
    pub fn extents(&self) -> u64 {
        self.extents
    }

    /// Bytes the places cover.
    pub fn bytes(&self) -> u64 {
        self.by_seq.values().flatten().map(|p| p.len).sum()
    }
}

/// Merges places that overlap or touch at the same shift; leaves them
/// sorted by data offset.
fn merge(places: &mut Vec<Place>) {
    places.sort_unstable_by_key(|p| (p.shift(), p.data_offset));
    let mut out: Vec<Place> = Vec::with_capacity(places.len());
    for p in places.drain(..) {
        match out.last_mut() {
            Some(last) if last.shift() == p.shift() && p.data_offset <= last.end() => {
                let end = last.end().max(p.end());
                last.len = end - last.data_offset;
            }
            _ => out.push(p),
        }
    }
    out.sort_unstable_by_key(|p| p.data_offset);
    *places = out;
}

/// Bytes of a segment's data area that a map points at wrongly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PlaceFault {
    /// Past the end of the segment's data (else: no write entry holds
    /// them as the map says).
    pub past_end: bool,
    pub range: Range<u64>,
    pub detail: String,
}

/// Checks `places` (sorted by data offset) against a segment's `entries`
/// and its logical data size.
pub(crate) fn check_places(
    places: &[Place],
    entries: &[Entry],
    data_bytes: u64,
) -> Vec<PlaceFault> {
    let mut writes: Vec<&Entry> = entries
        .iter()
        .filter(|e| e.kind == EntryKind::Write)
        .collect();
    writes.sort_unstable_by_key(|e| e.data_offset);
    let mut faults = Vec::new();
    for p in places {
        if p.end() > data_bytes {
            let start = p.data_offset.max(data_bytes);
            let detail = format!(
                "the map reads bytes {start}..{} of the segment's data at volume offset {}, past its end ({data_bytes} bytes)",
                p.end(),
                p.volume_offset + (start - p.data_offset)
            );
            push_fault(&mut faults, true, start..p.end(), detail);
        }
        check_held(p, &writes, p.end().min(data_bytes), &mut faults);
    }
    faults
}

/// Checks that write entries hold `p`'s bytes before `end`, written at the
/// volume offsets the map reads them at.
fn check_held(p: &Place, writes: &[&Entry], end: u64, faults: &mut Vec<PlaceFault>) {
    let mut at = p.data_offset;
    let mut i = writes.partition_point(|w| w.data_offset + w.len <= at);
    while at < end {
        let mapped_at = p.volume_offset + (at - p.data_offset);
        match writes.get(i) {
            Some(w) if w.data_offset <= at => {
                let stop = end.min(w.data_offset + w.len);
                let written_at = w.offset + (at - w.data_offset);
                if written_at != mapped_at {
                    let detail = format!(
                        "bytes {at}..{stop} of the segment's data were written at volume offset {written_at}; the map reads them at {mapped_at}"
                    );
                    push_fault(faults, false, at..stop, detail);
                }
                at = stop;
                i += 1;
            }
            next => {
                let stop = next.map_or(end, |w| w.data_offset.min(end));
                let detail = format!(
                    "the map reads bytes {at}..{stop} of the segment's data at volume offset {mapped_at}; no write entry holds them"
                );
                push_fault(faults, false, at..stop, detail);
                at = stop;
            }
        }
    }
}

/// Adds a fault, merged into the previous one when of the same kind and
/// adjacent; at most `MAX_FAULTS_PER_SEGMENT` (the last one grows).
fn push_fault(faults: &mut Vec<PlaceFault>, past_end: bool, range: Range<u64>, detail: String) {
    let full = faults.len() >= MAX_FAULTS_PER_SEGMENT;
    if let Some(last) = faults.last_mut() {
        let adjacent = last.past_end == past_end && last.range.end >= range.start;
        if adjacent || full {
            last.range.start = last.range.start.min(range.start);
            last.range.end = last.range.end.max(range.end);
            return;
        }
    }
    faults.push(PlaceFault {
        past_end,
        range,
        detail,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(offset: u64, len: u64, data_offset: u64) -> Entry {
        Entry {
            kind: EntryKind::Write,
            offset,
            len,
            data_offset,
        }
    }

    fn place(data_offset: u64, len: u64, volume_offset: u64) -> Place {
        Place {
            data_offset,
            len,
            volume_offset,
        }
    }

    #[test]
    fn places_of_several_maps_merge_at_the_same_shift() {
        let mut a = ExtentMap::new();
        a.set(0, 8192, Some(Target::Data { seq: 3, offset: 0 }));
        a.set(1 << 20, 4096, Some(Target::Data { seq: 4, offset: 0 }));
        let mut b = ExtentMap::new();
        // A later write split the snapshot's extent; the rest agrees.
        b.set(0, 4096, Some(Target::Data { seq: 3, offset: 0 }));
        b.set(4096, 4096, Some(Target::Data { seq: 5, offset: 0 }));
        // Same segment bytes at another volume offset: kept apart.
        b.set(
            1 << 21,
            4096,
            Some(Target::Data {
                seq: 3,
                offset: 4096,
            }),
        );
        let mut places = Places::default();
        places.add_map(&a);
        places.add_map(&b);
        assert_eq!(places.seqs(), vec![3, 4, 5]);
        assert_eq!(places.extents(), 5);
        assert_eq!(
            places.take(3),
            vec![place(0, 8192, 0), place(4096, 4096, 1 << 21)]
        );
    }

    #[test]
    fn places_must_lie_in_the_data_and_in_write_entries_at_their_offset() {
        let entries = [
            write(4096, 4096, 0),
            Entry {
                kind: EntryKind::Zero,
                offset: 0,
                len: 1 << 20,
                data_offset: 4096,
            },
            write(65536, 4096, 4096),
        ];
        // Both entries at once, as a merged extent of the map holds them.
        let good = [place(1024, 2048, 5120), place(4096, 4096, 65536)];
        assert_eq!(check_places(&good, &entries, 8192), vec![]);
        let past = check_places(&[place(4096, 8192, 65536)], &entries, 8192);
        assert_eq!(past.len(), 1);
        assert!(past[0].past_end && past[0].range == (8192..12288));
        assert!(past[0].detail.contains("past its end"), "{past:?}");
        let moved = check_places(&[place(0, 4096, 0)], &entries, 8192);
        assert_eq!(moved.len(), 1);
        assert!(!moved[0].past_end && moved[0].range == (0..4096));
        assert!(moved[0].detail.contains("written at volume offset 4096"));
        // Bytes no entry holds.
        let entries = [write(0, 100, 0), write(200, 100, 200)];
        let hole = check_places(&[place(0, 300, 0)], &entries, 300);
        assert_eq!(hole.len(), 1);
        assert_eq!(hole[0].range, 100..200);
        assert!(hole[0].detail.contains("no write entry"), "{hole:?}");
    }
}
