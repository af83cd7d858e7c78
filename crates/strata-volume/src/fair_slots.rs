//! Store requests in flight, a budget of the server shared fairly by its
//! volumes: segment uploads (`--parallel-uploads-total`, next to each
//! volume's own cap `--parallel-uploads`) and data GETs (the store's
//! `--max-store-requests`).
//!
//! Fairness as for the write budget (`write/host_budget.rs`): a volume may
//! always have its share in flight (the total divided by the volumes
//! using slots, itself included, at least one), and more while the total
//! has room; one at or above its share waits when the total is reached,
//! never one below it. So a volume being hydrated, or read ahead in 8 MiB
//! windows, cannot keep another volume's one read miss queued behind its
//! GETs, nor one busy writer the others' PUTs. What a slot covers is the
//! caller's: uploads count the PUT only (handing data to the disk cache
//! after holds the volume's own slot only), reads the GET (with its hedge).

use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;
use tokio::sync::Notify;

#[derive(Debug)]
pub(crate) struct FairSlots {
    /// 0: no server-wide limit.
    total: usize,
    state: Mutex<InFlight>,
    freed: Notify,
}

#[derive(Debug, Default)]
struct InFlight {
    slots: usize,
    /// Volumes holding a slot.
    volumes: usize,
}

/// One request's place in flight; given back on drop.
pub(crate) struct FairSlot<'a> {
    host: &'a FairSlots,
    mine: &'a AtomicUsize,
}

impl FairSlots {
    pub fn new(total: usize) -> FairSlots {
        FairSlots {
            total,
            state: Mutex::new(InFlight::default()),
            freed: Notify::new(),
        }
    }

    /// Waits for a place for one more request of a volume that has `mine`
    /// in flight (its counter, kept here).
    pub async fn acquire<'a>(&'a self, mine: &'a AtomicUsize) -> FairSlot<'a> {
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if self.try_take(mine) {
                return FairSlot { host: self, mine };
            }
            freed.await;
        }
    }

    fn try_take(&self, mine: &AtomicUsize) -> bool {
        let mut s = self.state.lock();
        let held = mine.load(Ordering::Acquire);
        let volumes = s.volumes + usize::from(held == 0);
        let share = (self.total / volumes.max(1)).max(1);
        if self.total != 0 && held >= share && s.slots >= self.total {
            return false;
        }
        s.slots += 1;
        if held == 0 {
            s.volumes += 1;
        }
        mine.store(held + 1, Ordering::Release);
        true
    }
}

impl Drop for FairSlot<'_> {
    fn drop(&mut self) {
        {
            let mut s = self.host.state.lock();
            s.slots -= 1;
            let left = self.mine.load(Ordering::Acquire) - 1;
            self.mine.store(left, Ordering::Release);
            if left == 0 {
                s.volumes -= 1;
            }
        }
        self.host.freed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_volume_under_its_share_gets_a_place_when_the_total_is_taken() {
        let host = FairSlots::new(4);
        let (a, b) = (AtomicUsize::new(0), AtomicUsize::new(0));
        // Alone, a volume takes all 4.
        let mut of_a = Vec::new();
        for _ in 0..4 {
            of_a.push(host.acquire(&a).await);
        }
        assert!(!host.try_take(&a), "the total");
        // A second volume gets its share (2) although the total is taken,
        // then waits like the first.
        let b1 = host.acquire(&b).await;
        let b2 = host.acquire(&b).await;
        assert!(!host.try_take(&b));
        // The first gives places back until the total has room again.
        of_a.truncate(1);
        let b3 = host.acquire(&b).await;
        assert_eq!(
            (a.load(Ordering::Acquire), b.load(Ordering::Acquire)),
            (1, 3)
        );
        drop((b1, b2, b3, of_a));
        let s = host.state.lock();
        assert_eq!((s.slots, s.volumes), (0, 0));
        drop(s);
        // Unlimited: always.
        let free = FairSlots::new(0);
        let c = AtomicUsize::new(0);
        assert!((0..100).all(|_| free.try_take(&c)));
    }
}
