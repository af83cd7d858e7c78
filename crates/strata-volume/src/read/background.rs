//! Background work of the read path (read-ahead windows, disk-tier
//! writes), counted so that `SharedCaches::settle` can wait for it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;

/// Units of background work in progress.
#[derive(Default)]
pub(crate) struct Background {
    pub(crate) pending: AtomicU64,
    pub(crate) idle: Notify,
}

/// One unit of background work; finishing (or dropping) it is counted.
pub(crate) struct BackgroundJob(Arc<Background>);

impl Background {
    pub(crate) fn start(self: &Arc<Self>) -> BackgroundJob {
        self.pending.fetch_add(1, Ordering::AcqRel);
        BackgroundJob(self.clone())
    }

    /// Waits until no unit of work is in progress.
    pub(crate) async fn settle(&self) {
        loop {
            let idle = self.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if self.pending.load(Ordering::Acquire) == 0 {
                return;
            }
            idle.await;
        }
    }
}

impl Drop for BackgroundJob {
    fn drop(&mut self) {
        if self.0.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}
