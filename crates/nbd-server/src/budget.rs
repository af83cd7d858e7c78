//! The in-flight bounds of requests: per connection a count of requests
//! and a share of data bytes, server-wide a budget of READ/WRITE data
//! bytes. A request takes its count permit before its header is read and,
//! for READ/WRITE data, its byte permits after validation, before the WRITE
//! payload is read or the READ reply buffer allocated: its connection's
//! share first, then the server-wide budget; always in that order, and only
//! the connection's reader waits. All go with the reply to the writer and
//! are released together once it is written (or dropped), so a request
//! holding permits never needs another to finish and the bounds cannot
//! deadlock. The share keeps one connection from holding the whole budget;
//! the reply stall timeout (see `writer`) returns what a client that stopped
//! reading holds.

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

/// A budget of request data bytes in flight, one permit per byte: the
/// server-wide one (cloning shares it) or a connection's share of it.
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

    /// Permits for `data_bytes` (not 0) of request data. The configuration
    /// keeps requests within the budget; one larger anyway (a device
    /// minimum block size above `max_request_bytes`) takes the whole
    /// budget.
    async fn acquire(&self, data_bytes: u32) -> Result<OwnedSemaphorePermit, AcquireError> {
        acquire(&self.semaphore, data_bytes.min(self.max_acquire_bytes)).await
    }

    /// Bytes not taken right now.
    #[cfg(test)]
    pub(crate) fn available_bytes(&self) -> usize {
        self.semaphore.available_permits()
    }
}

/// The byte permits of one request: of its connection's share and of the
/// server-wide budget.
pub(crate) struct BytePermits {
    _connection: OwnedSemaphorePermit,
    _server: OwnedSemaphorePermit,
}

/// Permits for `data_bytes` of request data (`None` for none): first of
/// the connection's share, then of the server-wide budget.
pub(crate) async fn acquire_bytes(
    connection: &ByteBudget,
    server: &ByteBudget,
    data_bytes: u32,
) -> Result<Option<BytePermits>, AcquireError> {
    if data_bytes == 0 {
        return Ok(None);
    }
    let connection = connection.acquire(data_bytes).await?;
    let server = server.acquire(data_bytes).await?;
    Ok(Some(BytePermits {
        _connection: connection,
        _server: server,
    }))
}

/// The permits of one request, released together when dropped.
pub(crate) struct Permits {
    pub _count: OwnedSemaphorePermit,
    pub _bytes: Option<BytePermits>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn budget_waits_and_releases() {
        let budget = ByteBudget::new(1000);
        let first = budget.acquire(600).await.unwrap();
        assert_eq!(budget.available_bytes(), 400);
        let waiting = tokio::spawn({
            let budget = budget.clone();
            async move { budget.acquire(600).await.is_ok() }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        drop(first);
        assert!(waiting.await.unwrap());
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
        assert!(huge.acquire(u32::MAX).await.is_ok());
    }

    #[tokio::test]
    async fn connection_share_bounds_before_the_server_budget() {
        let server = ByteBudget::new(1000);
        let share = ByteBudget::new(500);
        let other_share = ByteBudget::new(500);
        assert!(acquire_bytes(&share, &server, 0).await.unwrap().is_none());
        let first = acquire_bytes(&share, &server, 400).await.unwrap();
        assert_eq!(
            (share.available_bytes(), server.available_bytes()),
            (100, 600)
        );
        // Over the share: waits without touching the server budget.
        let waiting = tokio::spawn({
            let (share, server) = (share.clone(), server.clone());
            async move { acquire_bytes(&share, &server, 200).await.is_ok() }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        assert_eq!(server.available_bytes(), 600);
        // Another connection still gets its own share.
        let other = acquire_bytes(&other_share, &server, 500).await.unwrap();
        assert_eq!(server.available_bytes(), 100);
        drop(first);
        assert!(waiting.await.unwrap());
        drop(other);
        assert_eq!(
            (share.available_bytes(), server.available_bytes()),
            (500, 1000)
        );
    }
}
