//! The server's segment uploads in flight, shared by its volumes
//! (`--parallel-uploads-total`), next to each volume's own cap
//! (`--parallel-uploads`).
//!
//! Fairness as for the write budget (`host_budget.rs`): a volume may
//! always have its share in flight (the total divided by the volumes
//! uploading, itself included, at least one), and more while the total
//! has room; one at or above its share waits when the total is reached,
//! never one below it. Only the PUT is counted: what an upload does after
//! (handing data to the disk cache) holds the volume's own slot only.

use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;
use tokio::sync::Notify;

#[derive(Debug)]
pub(crate) struct HostUploads {
    /// 0: no server-wide limit.
    total: usize,
    state: Mutex<InFlight>,
    freed: Notify,
}

#[derive(Debug, Default)]
struct InFlight {
    uploads: usize,
    /// Volumes with an upload in flight.
    volumes: usize,
}

/// One upload's place in flight; given back on drop.
pub(crate) struct UploadSlot<'a> {
    host: &'a HostUploads,
    mine: &'a AtomicUsize,
}

impl HostUploads {
    pub fn new(total: usize) -> HostUploads {
        HostUploads {
            total,
            state: Mutex::new(InFlight::default()),
            freed: Notify::new(),
        }
    }

    /// Waits for a place for one more upload of a volume that has `mine`
    /// in flight (its counter, kept here).
    pub async fn acquire<'a>(&'a self, mine: &'a AtomicUsize) -> UploadSlot<'a> {
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if self.try_take(mine) {
                return UploadSlot { host: self, mine };
            }
            freed.await;
        }
    }

    fn try_take(&self, mine: &AtomicUsize) -> bool {
        let mut s = self.state.lock();
        let held = mine.load(Ordering::Acquire);
        let volumes = s.volumes + usize::from(held == 0);
        let share = (self.total / volumes.max(1)).max(1);
        if self.total != 0 && held >= share && s.uploads >= self.total {
            return false;
        }
        s.uploads += 1;
        if held == 0 {
            s.volumes += 1;
        }
        mine.store(held + 1, Ordering::Release);
        true
    }
}

impl Drop for UploadSlot<'_> {
    fn drop(&mut self) {
        {
            let mut s = self.host.state.lock();
            s.uploads -= 1;
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
        let host = HostUploads::new(4);
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
        assert_eq!((s.uploads, s.volumes), (0, 0));
        drop(s);
        // Unlimited: always.
        let free = HostUploads::new(0);
        let c = AtomicUsize::new(0);
        assert!((0..100).all(|_| free.try_take(&c)));
    }
}
