//! Bounding the requests in flight to an object store.
//!
//! This module owns [`LimitedObjectStore`], which lets at most N calls into
//! the inner store run at once (a tokio semaphore, after object_store's
//! `LimitStore`), and its counters [`LimitStats`]. Callers beyond the limit
//! wait their turn instead of piling connections onto the store; how many
//! had to wait tells whether the limit is what slows the disk down.
//!
//! A permit is held for the whole of a call. For `get`/`get_opts` and
//! listings that includes reading the stream: the permit is released when
//! the stream ends or is dropped (a local-file body holds none, as it needs
//! no request). Each multipart part and the completion take a permit of
//! the same semaphore. `delete_stream` passes through unlimited, as in
//! `LimitStore`: the inner store batches it.

use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::{self, BoxStream, StreamExt};
use object_store::path::Path;
use object_store::{
    Error, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, PutMultipartOptions, PutOptions, PutPayload, PutResult, Result, UploadPart,
};
use serde::Serialize;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError};

/// Counters of one [`LimitedObjectStore`].
#[derive(Debug, Default)]
pub struct LimitStats {
    requests: AtomicU64,
    waited_requests: AtomicU64,
}

/// A point-in-time copy of [`LimitStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct LimitStatsSnapshot {
    /// Calls that took a permit.
    pub requests: u64,
    /// Of those, the calls that found no permit free and had to wait.
    pub waited_requests: u64,
}

impl LimitStats {
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    pub fn waited_requests(&self) -> u64 {
        self.waited_requests.load(Ordering::Relaxed)
    }

    pub fn snapshot(&self) -> LimitStatsSnapshot {
        LimitStatsSnapshot {
            requests: self.requests(),
            waited_requests: self.waited_requests(),
        }
    }
}

/// The permits and their counters, shared with streams and uploads.
#[derive(Debug)]
struct Permits {
    semaphore: Arc<Semaphore>,
    stats: Arc<LimitStats>,
}

impl Permits {
    /// A permit, counting whether it had to be waited for.
    async fn acquire(&self) -> Result<OwnedSemaphorePermit> {
        self.stats.requests.fetch_add(1, Ordering::Relaxed);
        let semaphore = Arc::clone(&self.semaphore);
        match Arc::clone(&semaphore).try_acquire_owned() {
            Ok(permit) => return Ok(permit),
            Err(TryAcquireError::NoPermits) => {}
            Err(TryAcquireError::Closed) => return Err(closed_error()),
        }
        self.stats.waited_requests.fetch_add(1, Ordering::Relaxed);
        semaphore.acquire_owned().await.map_err(|_| closed_error())
    }
}

/// Unreachable in practice: the semaphore is never closed.
fn closed_error() -> Error {
    Error::Generic {
        store: "limit",
        source: "request limiter closed".into(),
    }
}

/// Lets at most `max_in_flight_requests` calls run in the inner store at
/// once (see the module doc).
#[derive(Debug)]
pub struct LimitedObjectStore<T: ObjectStore> {
    // An `Arc` so a listing can call the store once its permit is granted.
    inner: Arc<T>,
    max_in_flight_requests: usize,
    permits: Arc<Permits>,
}

impl<T: ObjectStore> LimitedObjectStore<T> {
    /// `max_in_flight_requests` is raised to 1 if 0 (0 would deadlock).
    pub fn new(inner: T, max_in_flight_requests: usize) -> LimitedObjectStore<T> {
        let max_in_flight_requests = max_in_flight_requests.clamp(1, Semaphore::MAX_PERMITS);
        LimitedObjectStore {
            inner: Arc::new(inner),
            max_in_flight_requests,
            permits: Arc::new(Permits {
                semaphore: Arc::new(Semaphore::new(max_in_flight_requests)),
                stats: Arc::new(LimitStats::default()),
            }),
        }
    }

    pub fn stats(&self) -> &Arc<LimitStats> {
        &self.permits.stats
    }

    pub fn max_in_flight_requests(&self) -> usize {
        self.max_in_flight_requests
    }

    /// Calls running in the inner store now.
    pub fn in_flight_requests(&self) -> usize {
        self.max_in_flight_requests - self.permits.semaphore.available_permits()
    }

    /// A listing that starts once it has a permit and keeps it to the end.
    fn limited_listing<F>(&self, start: F) -> BoxStream<'static, Result<ObjectMeta>>
    where
        F: FnOnce(&T) -> BoxStream<'static, Result<ObjectMeta>> + Send + 'static,
    {
        let inner = Arc::clone(&self.inner);
        let permits = Arc::clone(&self.permits);
        stream::once(async move {
            match permits.acquire().await {
                Ok(permit) => hold_permit(start(&inner), permit),
                Err(error) => stream::once(async move { Err(error) }).boxed(),
            }
        })
        .flatten()
        .boxed()
    }
}

/// The stream, releasing `permit` when it ends or is dropped.
fn hold_permit<I: Send + 'static>(
    body: BoxStream<'static, I>,
    permit: OwnedSemaphorePermit,
) -> BoxStream<'static, I> {
    // The closure owns the permit; the stream owns the closure.
    body.map(move |item| {
        let _held = &permit;
        item
    })
    .boxed()
}

impl<T: ObjectStore> fmt::Display for LimitedObjectStore<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "LimitedObjectStore({}, {})",
            self.max_in_flight_requests, self.inner
        )
    }
}

#[async_trait]
impl<T: ObjectStore> ObjectStore for LimitedObjectStore<T> {
    async fn put(&self, location: &Path, payload: PutPayload) -> Result<PutResult> {
        let _permit = self.permits.acquire().await?;
        self.inner.put(location, payload).await
    }

    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        let _permit = self.permits.acquire().await?;
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart(&self, location: &Path) -> Result<Box<dyn MultipartUpload>> {
        self.put_multipart_opts(location, PutMultipartOptions::default())
            .await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        let upload = {
            let _permit = self.permits.acquire().await?;
            self.inner.put_multipart_opts(location, opts).await?
        };
        Ok(Box::new(LimitedUpload {
            inner: upload,
            permits: Arc::clone(&self.permits),
        }))
    }

    async fn get(&self, location: &Path) -> Result<GetResult> {
        self.get_opts(location, GetOptions::default()).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        let permit = self.permits.acquire().await?;
        let result = self.inner.get_opts(location, options).await?;
        let payload = match result.payload {
            GetResultPayload::Stream(body) => GetResultPayload::Stream(hold_permit(body, permit)),
            file @ GetResultPayload::File(..) => file,
        };
        Ok(GetResult { payload, ..result })
    }

    async fn get_range(&self, location: &Path, range: Range<u64>) -> Result<Bytes> {
        let _permit = self.permits.acquire().await?;
        self.inner.get_range(location, range).await
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        let _permit = self.permits.acquire().await?;
        self.inner.get_ranges(location, ranges).await
    }

    async fn head(&self, location: &Path) -> Result<ObjectMeta> {
        let _permit = self.permits.acquire().await?;
        self.inner.head(location).await
    }

    async fn delete(&self, location: &Path) -> Result<()> {
        let _permit = self.permits.acquire().await?;
        self.inner.delete(location).await
    }

    fn delete_stream<'a>(
        &'a self,
        locations: BoxStream<'a, Result<Path>>,
    ) -> BoxStream<'a, Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        let prefix = prefix.cloned();
        self.limited_listing(move |inner| inner.list(prefix.as_ref()))
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        let prefix = prefix.cloned();
        let offset = offset.clone();
        self.limited_listing(move |inner| inner.list_with_offset(prefix.as_ref(), &offset))
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        let _permit = self.permits.acquire().await?;
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy(&self, from: &Path, to: &Path) -> Result<()> {
        let _permit = self.permits.acquire().await?;
        self.inner.copy(from, to).await
    }

    async fn rename(&self, from: &Path, to: &Path) -> Result<()> {
        let _permit = self.permits.acquire().await?;
        self.inner.rename(from, to).await
    }

    async fn copy_if_not_exists(&self, from: &Path, to: &Path) -> Result<()> {
        let _permit = self.permits.acquire().await?;
        self.inner.copy_if_not_exists(from, to).await
    }

    async fn rename_if_not_exists(&self, from: &Path, to: &Path) -> Result<()> {
        let _permit = self.permits.acquire().await?;
        self.inner.rename_if_not_exists(from, to).await
    }
}

/// A multipart upload whose parts and completion share the store's limit.
#[derive(Debug)]
struct LimitedUpload {
    inner: Box<dyn MultipartUpload>,
    permits: Arc<Permits>,
}

#[async_trait]
impl MultipartUpload for LimitedUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        let part = self.inner.put_part(data);
        let permits = Arc::clone(&self.permits);
        Box::pin(async move {
            let _permit = permits.acquire().await?;
            part.await
        })
    }

    async fn complete(&mut self) -> Result<PutResult> {
        let _permit = self.permits.acquire().await?;
        self.inner.complete().await
    }

    async fn abort(&mut self) -> Result<()> {
        let _permit = self.permits.acquire().await?;
        self.inner.abort().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fault_config::FaultConfig;
    use crate::fault_injecting_object_store::FaultInjectingObjectStore;
    use crate::test_support::CountingObjectStore;
    use futures::TryStreamExt;
    use object_store::memory::InMemory;
    use std::time::Duration;

    /// Limit over a call counter over 20 ms of added latency.
    fn slow_limited(
        limit: usize,
    ) -> LimitedObjectStore<CountingObjectStore<FaultInjectingObjectStore<InMemory>>> {
        let slow = FaultInjectingObjectStore::new(
            InMemory::new(),
            FaultConfig::parse("latency_ms=20").unwrap(),
        );
        LimitedObjectStore::new(CountingObjectStore::new(slow), limit)
    }

    #[tokio::test]
    async fn never_more_than_the_limit_in_flight() {
        let store = slow_limited(2);
        let puts = (0..8).map(|i| {
            let store = &store;
            async move {
                let path = Path::from(format!("o{i}"));
                store.put(&path, PutPayload::from_static(b"x")).await
            }
        });
        for result in futures::future::join_all(puts).await {
            result.unwrap();
        }
        assert_eq!(store.inner.calls.load(Ordering::SeqCst), 8);
        assert_eq!(store.inner.max_in_flight.load(Ordering::SeqCst), 2);
        let stats = store.stats().snapshot();
        assert_eq!(stats.requests, 8);
        assert!(stats.waited_requests > 0, "{stats:?}");
        assert_eq!(store.in_flight_requests(), 0, "all permits returned");
    }

    #[tokio::test]
    async fn a_get_body_holds_its_permit_until_dropped() {
        let store = LimitedObjectStore::new(InMemory::new(), 1);
        let path = Path::from("o");
        store
            .put(&path, PutPayload::from_static(b"x"))
            .await
            .unwrap();
        let unread = store.get(&path).await.unwrap();
        assert_eq!(store.in_flight_requests(), 1);
        let blocked = tokio::time::timeout(Duration::from_millis(50), store.head(&path)).await;
        assert!(blocked.is_err(), "the body still holds the only permit");
        assert_eq!(unread.bytes().await.unwrap(), Bytes::from_static(b"x"));
        assert_eq!(store.in_flight_requests(), 0);
        store.head(&path).await.unwrap();
        assert_eq!(store.stats().waited_requests(), 1);
    }

    #[tokio::test]
    async fn a_listing_holds_its_permit_until_done() {
        let store = LimitedObjectStore::new(InMemory::new(), 1);
        store
            .put(&Path::from("o"), PutPayload::from_static(b"x"))
            .await
            .unwrap();
        let mut listing = store.list(None);
        listing.try_next().await.unwrap();
        let path = Path::from("o");
        let blocked = tokio::time::timeout(Duration::from_millis(50), store.head(&path)).await;
        assert!(blocked.is_err(), "the listing holds the only permit");
        drop(listing);
        let all = store.list(None).try_collect::<Vec<_>>().await.unwrap();
        assert_eq!(all.len(), 1);
        assert_eq!(store.in_flight_requests(), 0);
    }

    #[test]
    fn a_zero_limit_is_raised_to_one() {
        let store = LimitedObjectStore::new(InMemory::new(), 0);
        assert_eq!(store.max_in_flight_requests(), 1);
    }
}
