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

/// A position this close (in segments) to the previous one is near.
const NEAR_SEGMENTS: u64 = 4;
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
    /// hydration leads it now.
    pub fn note(&mut self, position: (u64, u64), fetches: usize) -> bool {
        match self.last {
            Some(last) if last == position => {}
            Some((seq, _)) => {
                let led = self
                    .regions
                    .iter()
                    .any(|&r| r != u64::MAX && position.0 >= r && position.0 - r < NEAR_SEGMENTS);
                let near = led || seq.abs_diff(position.0) <= NEAR_SEGMENTS;
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

    /// Notes a lead from segment `seq` on (`NEAR_SEGMENTS` segments).
    pub fn led(&mut self, seq: u64) {
        if !self.regions.contains(&seq) {
            self.regions[self.next_region] = seq;
            self.next_region = (self.next_region + 1) % REGIONS;
        }
    }
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
        let followed: Vec<bool> = positions.iter().map(|&p| walk.note(p, 1)).collect();
        // Five near moves (the repeat is not one) make it, a far jump
        // (to 40) among them only delays it.
        assert_eq!(
            followed,
            vec![false, false, false, false, false, false, false, true, true]
        );
        assert!(!walk.note((45, 0), 64), "a deep reader is not followed");
        assert!(walk.deep());
        // Back and forth between two regions, both led: followed.
        walk.led(44);
        walk.led(200);
        let both: Vec<bool> = [200, 46, 201, 45, 203, 44]
            .iter()
            .map(|&s| walk.note((s, 0), 1))
            .collect();
        assert_eq!(both, vec![true; 6]);
        // Far jumps in a row stop it.
        let far: Vec<bool> = [100, 300, 400, 500]
            .iter()
            .map(|&s| walk.note((s, 0), 1))
            .collect();
        assert_eq!(far, vec![true, true, true, false]);
        let mut random = Follow::default();
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut led = 0;
        for _ in 0..100_000 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            led += usize::from(random.note((rng % 512, rng >> 60), 1));
        }
        assert_eq!(led, 0, "a random reader was followed");
    }
}
