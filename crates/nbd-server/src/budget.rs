//! The in-flight bounds of requests: per connection a count of requests,
//! server-wide a budget of READ/WRITE data bytes. A request takes its count
//! permit before its header is read and, for READ/WRITE data, its byte
//! permit after validation, before the WRITE payload is read or the READ
//! reply buffer allocated: always in that order, and only the connection's
//! reader waits. Both go with the reply to the writer and are released once
//! it is written (or dropped), so a request holding permits never needs
//! another to finish and the budget cannot deadlock.

use std::sync::Arc;

use tokio::sync::{AcquireError, OwnedSemaphorePermit, Semaphore, TryAcquireError};

/// Takes `count` permits, without queueing when they are free (no future,
/// no cooperative-scheduling budget spent), else waiting in FIFO order.
pub(crate) async fn acquire(
    semaphore: &Arc<Semaphore>,
    count: u32,
) -> Result<OwnedSemaphorePermit, AcquireError> {
    match Arc::clone(semaphore).try_acquire_many_owned(count) {
        Ok(permit) => Ok(permit),
        // Waiting on a closed semaphore reports it closed, as we should.
        Err(TryAcquireError::NoPermits | TryAcquireError::Closed) => {
            Arc::clone(semaphore).acquire_many_owned(count).await
        }
    }
}

/// The server-wide budget of request data bytes in flight, one permit per
/// byte. Cloning shares the budget.
#[derive(Clone)]
pub(crate) struct ByteBudget {
    semaphore: Arc<Semaphore>,
    /// The whole budget as the largest single acquisition: a request never
    /// asks for more than exists, so none can wait forever.
    max_acquire_bytes: u32,
}

impl ByteBudget {
    pub(crate) fn new(bytes: u64) -> ByteBudget {
        let permits = usize::try_from(bytes)
            .unwrap_or(usize::MAX)
            .min(Semaphore::MAX_PERMITS);
        ByteBudget {
            semaphore: Arc::new(Semaphore::new(permits)),
            max_acquire_bytes: u32::try_from(permits).unwrap_or(u32::MAX),
        }
    }

    /// Permits for `data_bytes` of request data (`None` for none). The
    /// configuration keeps requests within the budget; one larger anyway
    /// (a device minimum block size above `max_request_bytes`) takes the
    /// whole budget.
    pub(crate) async fn acquire(
        &self,
        data_bytes: u32,
    ) -> Result<Option<OwnedSemaphorePermit>, AcquireError> {
        if data_bytes == 0 {
            return Ok(None);
        }
        acquire(&self.semaphore, data_bytes.min(self.max_acquire_bytes))
            .await
            .map(Some)
    }

    /// Bytes not taken right now.
    #[cfg(test)]
    pub(crate) fn available_bytes(&self) -> usize {
        self.semaphore.available_permits()
    }
}

/// The permits of one request, released when dropped.
pub(crate) struct Permits {
    pub _count: OwnedSemaphorePermit,
    pub _bytes: Option<OwnedSemaphorePermit>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn budget_waits_and_releases() {
        let budget = ByteBudget::new(1000);
        assert!(budget.acquire(0).await.unwrap().is_none());
        let first = budget.acquire(600).await.unwrap();
        assert_eq!(budget.available_bytes(), 400);
        let waiting = tokio::spawn({
            let budget = budget.clone();
            async move { budget.acquire(600).await.map(|permit| permit.is_some()) }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        drop(first);
        assert!(waiting.await.unwrap().unwrap());
        assert_eq!(budget.available_bytes(), 1000);
    }

    #[tokio::test]
    async fn oversized_request_takes_the_whole_budget() {
        let budget = ByteBudget::new(100);
        let permit = budget.acquire(512).await.unwrap();
        assert_eq!(budget.available_bytes(), 0);
        drop(permit);
        assert_eq!(budget.available_bytes(), 100);
        let huge = ByteBudget::new(u64::MAX);
        assert!(huge.acquire(u32::MAX).await.unwrap().is_some());
    }
}
