//! Whether hydration follows a client reader: fetches the region it reads
//! ahead of it (`hydrate.rs`, `LiveBlocks::take_lead`). Worth it for a
//! reader that stays in a region (a boot walking files, a copy); harmful
//! for one that reads at random (each lead would fetch whole segments it
//! never comes back to, beside its own reads: measured, a QD4 random
//! reader's p99 went from 75 ms to 359 ms at 20 ms a request).
//!
//! So a reader is followed while most of its recent reads landed near the
//! one before: of the last `HISTORY` new positions (the segment and block
//! of its last read, sampled by hydration's scheduler), at least `NEAR_OF`
//! within `NEAR_SEGMENTS` segments of the previous one or in the segments
//! one of its last `REGIONS` leads covered (`led`). A boot goes back and
//! forth between its files and the inode tables and directories, far
//! apart; once both are led it stays followed. A random reader lands near
//! by chance only (9 in 512 segments in the test below; five such chances
//! out of eight is about one in ten million). Tried and measured: a score
//! up and down by one per position let a random reader be led a tenth of
//! the time (its p99 doubled), as did three near of eight; five of eight
//! without the leads' regions left the boot unfollowed too often (1.44x
//! local at 20 ms against 1.18x with every reader led). A reader with
//! many fetches at the store (`deep`) is not followed whatever its
//! history.
//!
//! "Near" narrows with the number of segments the volume's positions
//! spread over (`near_segments`): within `NEAR_SEGMENTS` either way is 9
//! of 512 segments, but 9 of a 2 GiB volume's ~50 (64 MiB writes make
//! segments of up to 64 MiB): a QD4 random reader was then followed in a
//! third of the runs of `tests/hydration.rs`'s p99 test, and its p99
//! went from ~70 to 175-225 ms. A random reader now lands near by chance
//! at most about 1 in 18: the same segment or the next (a reader walking
//! forward) on a small volume, wider as segments add up.

/// A position this close (in segments) to the previous one is near, on
/// a volume of `NEAR_SPREAD_PER_SEGMENT * (2 * NEAR_SEGMENTS + 1)`
/// segments or more (`near_segments`).
const NEAR_SEGMENTS: u64 = 4;
/// Segments per segment of the near window: a random reader lands near
/// the one before by chance at most 1 in this many (~2.8%: five near of
/// eight by chance, about one sample in a million).
const NEAR_SPREAD_PER_SEGMENT: u64 = 36;
/// Positions remembered (bits of `Follow::near`) ...
const HISTORY: u32 = 8;
/// ... of which this many near ones make a reader followed.
const NEAR_OF: u32 = 5;
/// Leads remembered per reader: a position in the segments one of them
/// covered is near too.
const REGIONS: usize = 8;
/// Samples a reader stays deep after it was last seen deep (about a
/// second of the scheduler's 20 ms ticks): a deep reader whose reads turn
/// into cache hits as hydration goes on has few fetches out at a time.
const DEEP_SAMPLES: u8 = 50;
/// A reader with more fetches at the store than this is not followed ...
const FOLLOW_MAX_FETCHES: usize = 16;
/// ... and with more than this it is deep (reading for throughput).
const DEEP_FETCHES: usize = 32;

/// One reader's locality, as hydration's scheduler sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Follow {
    last: Option<(u64, u64)>,
    /// Bit i: the i-th latest new position was near the one before.
    near: u8,
    /// First segments of the last leads (`u64::MAX`: none), a ring.
    regions: [u64; REGIONS],
    next_region: usize,
    /// Samples left until a reader seen deep counts as shallow again.
    deep_left: u8,
}

impl Default for Follow {
    fn default() -> Follow {
        Follow {
            last: None,
            near: 0,
            regions: [u64::MAX; REGIONS],
            next_region: 0,
            deep_left: 0,
        }
    }
}

const _: () = assert!(HISTORY == u8::BITS && NEAR_OF <= HISTORY);

impl Follow {
    /// Notes the reader's position `(seq, block)` (the same one again is
    /// not a new read) and its fetches at the store now; whether
    /// hydration leads it now. `reach`: `near_segments` of the volume.
    pub fn note(&mut self, position: (u64, u64), fetches: usize, reach: u64) -> bool {
        match self.last {
            Some(last) if last == position => {}
            Some((seq, _)) => {
                // A lead covers its first segment and the next ones.
                let width = (reach + 2).min(NEAR_SEGMENTS);
                let led = self
                    .regions
                    .iter()
                    .any(|&r| r != u64::MAX && position.0 >= r && position.0 - r < width);
                let forward = position.0 == seq.saturating_add(1);
                let near = led || forward || seq.abs_diff(position.0) <= reach;
                self.near = (self.near << 1) | u8::from(near);
            }
            None => {}
        }
        self.last = Some(position);
        self.deep_left = if fetches > DEEP_FETCHES {
            DEEP_SAMPLES
        } else {
            self.deep_left.saturating_sub(1)
        };
        fetches <= FOLLOW_MAX_FETCHES && self.near.count_ones() >= NEAR_OF
    }

    /// Whether the reader had many fetches at the store within its last
    /// `DEEP_SAMPLES` samples: reading for throughput, not one thing at a
    /// time.
    pub fn deep(&self) -> bool {
        self.deep_left > 0
    }

    /// Notes a lead from segment `seq` on.
    pub fn led(&mut self, seq: u64) {
        if !self.regions.contains(&seq) {
            self.regions[self.next_region] = seq;
            self.next_region = (self.next_region + 1) % REGIONS;
        }
    }
}

/// How far (in segments, either way) a position may be from the one
/// before and still be near, among `segments` segments: `NEAR_SEGMENTS`
/// where a window that wide is at most 1 in `NEAR_SPREAD_PER_SEGMENT` of
/// them, narrower on fewer (0: the same segment, or the next one).
pub(crate) fn near_segments(segments: usize) -> u64 {
    let window = segments as u64 / NEAR_SPREAD_PER_SEGMENT;
    (window.saturating_sub(1) / 2).min(NEAR_SEGMENTS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reader_in_a_region_is_followed_one_at_random_is_not() {
        let mut walk = Follow::default();
        let positions = [
            (10, 0),
            (10, 3),
            (11, 0),
            (13, 2),
            (13, 2),
            (40, 0),
            (41, 0),
            (42, 5),
            (44, 0),
        ];
        let followed: Vec<bool> = positions
            .iter()
            .map(|&p| walk.note(p, 1, NEAR_SEGMENTS))
            .collect();
        // Five near moves (the repeat is not one) make it, a far jump
        // (to 40) among them only delays it.
        assert_eq!(
            followed,
            vec![false, false, false, false, false, false, false, true, true]
        );
        assert!(
            !walk.note((45, 0), 64, NEAR_SEGMENTS),
            "a deep reader is not followed"
        );
        assert!(walk.deep());
        // Back and forth between two regions, both led: followed.
        walk.led(44);
        walk.led(200);
        let both: Vec<bool> = [200, 46, 201, 45, 203, 44]
            .iter()
            .map(|&s| walk.note((s, 0), 1, NEAR_SEGMENTS))
            .collect();
        assert_eq!(both, vec![true; 6]);
        // Far jumps in a row stop it.
        let far: Vec<bool> = [100, 300, 400, 500]
            .iter()
            .map(|&s| walk.note((s, 0), 1, NEAR_SEGMENTS))
            .collect();
        assert_eq!(far, vec![true, true, true, false]);
        assert_eq!(random_reader_followed(512), 0);
    }

    /// Samples of 100,000 in which a random reader over `segments`
    /// segments is followed.
    fn random_reader_followed(segments: u64) -> usize {
        let near = near_segments(segments as usize);
        let mut random = Follow::default();
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut led = 0;
        for _ in 0..100_000 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let followed = random.note((rng % segments, rng >> 60), 1, near);
            if followed {
                random.led(rng % segments);
            }
            led += usize::from(followed);
        }
        led
    }

    #[test]
    fn near_narrows_on_fewer_segments() {
        assert_eq!(near_segments(512), NEAR_SEGMENTS);
        assert_eq!(near_segments(324), NEAR_SEGMENTS);
        assert_eq!(near_segments(323), 3);
        assert_eq!(near_segments(128), 1);
        assert_eq!(near_segments(50), 0);
        assert_eq!(near_segments(0), 0);
        // The p99 test's volume (2 GiB in ~50 segments), a coldclone
        // image's (~40) and coldboot-big's (~350): never followed.
        for segments in [40, 50, 128, 350] {
            assert_eq!(random_reader_followed(segments), 0, "{segments} segments");
        }
        // A reader walking forward through a small volume still is.
        let mut walk = Follow::default();
        let followed = (0..8u64).map(|s| walk.note((s, 0), 1, near_segments(40)));
        assert_eq!(followed.last(), Some(true));
    }
}
