//! Counting the requests that go through an object store.
//!
//! This module owns [`InstrumentedObjectStore`], the `ObjectStore` wrapper
//! that counts what goes through it into a shared [`StoreMetrics`] (the
//! metrics model, its snapshot and histogram live in `store_metrics`), and
//! the rules of what counts as what:
//! * latency is the time until the call returns. For `get`/`get_opts` that
//!   is when the [`GetResult`] (the reply headers) arrives, not the end of
//!   the body; for listings it is until the stream ends or is dropped.
//! * bytes read are counted as a `get` body is read (the stream is wrapped),
//!   so a body dropped half-read counts half; a local-file body (no stream)
//!   counts its `GetResult::range` at once. Body errors count as errors.
//! * bytes written count payloads the store acknowledged (failed puts are
//!   not counted).
//! * `delete_stream` counts each path as a `delete` request, without a
//!   latency sample (the inner store may batch them).
//! * a conditional write the store refused (`Precondition`,
//!   `AlreadyExists`, `NotModified`) and a "no such object" (`NotFound`)
//!   are answers, not errors: leases, manifests and the store probe ask
//!   such questions on purpose (every fresh start GETs a lease and a
//!   manifest that do not exist yet), and an error counter that moves with
//!   every start or lease race would page someone for nothing. They are
//!   counted apart (`not_found`, `condition_failed`), so a store that
//!   loses objects still shows.
//! * multipart parts count as `put`; creating, completing and aborting an
//!   upload count as `other`; `rename*` counts as `copy`.

use std::fmt;
use std::future::Future;
use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::{BoxStream, StreamExt};
use object_store::path::Path;
use object_store::{
    GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, Result, UploadPart,
};

use crate::store_metrics::{OpMetrics, Outcome, StoreMetrics, StoreOp};

/// Records a request when dropped: for streams, whose end is not awaited
/// by the store (dropping before the end still counts the request).
struct PendingRequest {
    metrics: Arc<StoreMetrics>,
    op: StoreOp,
    started: Instant,
    failed: bool,
}

impl Drop for PendingRequest {
    fn drop(&mut self) {
        let latency = self.started.elapsed();
        let outcome = if self.failed {
            Outcome::Failed
        } else {
            Outcome::Done
        };
        self.metrics.op(self.op).record(Some(latency), outcome);
    }
}

/// Counts requests, errors, bytes and latency of the inner store into a
/// [`StoreMetrics`] (see the module doc for what counts as what).
#[derive(Debug)]
pub struct InstrumentedObjectStore<T: ObjectStore> {
    inner: T,
    metrics: Arc<StoreMetrics>,
}

impl<T: ObjectStore> InstrumentedObjectStore<T> {
    pub fn new(inner: T, metrics: Arc<StoreMetrics>) -> InstrumentedObjectStore<T> {
        InstrumentedObjectStore { inner, metrics }
    }

    pub fn metrics(&self) -> &Arc<StoreMetrics> {
        &self.metrics
    }

    fn op(&self, op: StoreOp) -> &OpMetrics {
        self.metrics.op(op)
    }

    /// Awaits one request and records it.
    async fn measure<R>(&self, op: StoreOp, request: impl Future<Output = Result<R>>) -> Result<R> {
        measure(&self.metrics, op, request).await
    }

    /// Wraps a listing so its items' errors and its duration are recorded.
    fn measure_listing(
        &self,
        listing: BoxStream<'static, Result<ObjectMeta>>,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        let mut pending = PendingRequest {
            metrics: Arc::clone(&self.metrics),
            op: StoreOp::List,
            started: Instant::now(),
            failed: false,
        };
        listing
            .map(move |item| {
                // Borrow the whole guard so the closure owns it (edition
                // 2021 closures would otherwise capture just the flag).
                let pending = &mut pending;
                pending.failed |= item.is_err();
                item
            })
            .boxed()
    }

    /// Arranges for the body's bytes to be counted as they are read.
    fn measure_body(&self, op: StoreOp, result: GetResult) -> GetResult {
        let payload = match result.payload {
            GetResultPayload::Stream(body) => {
                let metrics = Arc::clone(&self.metrics);
                let counted = body.map(move |chunk| {
                    match &chunk {
                        Ok(bytes) => metrics.op(op).add_bytes_read(bytes.len() as u64),
                        Err(_) => metrics.op(op).add_error(),
                    }
                    chunk
                });
                GetResultPayload::Stream(counted.boxed())
            }
            file @ GetResultPayload::File(..) => {
                let size_bytes = result.range.end.saturating_sub(result.range.start);
                self.op(op).add_bytes_read(size_bytes);
                file
            }
        };
        GetResult { payload, ..result }
    }
}

/// Awaits one request and records its outcome and latency under `op`.
async fn measure<R>(
    metrics: &StoreMetrics,
    op: StoreOp,
    request: impl Future<Output = Result<R>>,
) -> Result<R> {
    let started = Instant::now();
    let result = request.await;
    metrics
        .op(op)
        .record(Some(started.elapsed()), outcome(&result));
    result
}

/// How the request ended (see the module doc: a refused condition and a
/// missing object are answers).
fn outcome<R>(result: &Result<R>) -> Outcome {
    match result {
        Ok(_) => Outcome::Done,
        Err(object_store::Error::NotFound { .. }) => Outcome::NotFound,
        Err(
            object_store::Error::Precondition { .. }
            | object_store::Error::AlreadyExists { .. }
            | object_store::Error::NotModified { .. },
        ) => Outcome::ConditionFailed,
        Err(_) => Outcome::Failed,
    }
}

impl<T: ObjectStore> fmt::Display for InstrumentedObjectStore<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "InstrumentedObjectStore({})", self.inner)
    }
}

#[async_trait]
impl<T: ObjectStore> ObjectStore for InstrumentedObjectStore<T> {
    async fn put(&self, location: &Path, payload: PutPayload) -> Result<PutResult> {
        self.put_opts(location, payload, PutOptions::default())
            .await
    }

    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        let size_bytes = payload.content_length() as u64;
        let request = self.inner.put_opts(location, payload, opts);
        self.measure(StoreOp::Put, request)
            .await
            .inspect(|_| self.op(StoreOp::Put).add_bytes_written(size_bytes))
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
        let request = self.inner.put_multipart_opts(location, opts);
        let upload = self.measure(StoreOp::Other, request).await?;
        Ok(Box::new(InstrumentedUpload {
            inner: upload,
            metrics: Arc::clone(&self.metrics),
        }))
    }

    async fn get(&self, location: &Path) -> Result<GetResult> {
        self.get_opts(location, GetOptions::default()).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        let op = if options.head {
            StoreOp::Head
        } else {
            StoreOp::Get
        };
        let result = self
            .measure(op, self.inner.get_opts(location, options))
            .await?;
        Ok(self.measure_body(op, result))
    }

    async fn get_range(&self, location: &Path, range: Range<u64>) -> Result<Bytes> {
        self.measure(StoreOp::GetRange, self.inner.get_range(location, range))
            .await
            .inspect(|bytes| {
                self.op(StoreOp::GetRange)
                    .add_bytes_read(bytes.len() as u64)
            })
    }

    /// One request, whatever the inner store makes of it.
    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        let request = self.inner.get_ranges(location, ranges);
        self.measure(StoreOp::GetRange, request)
            .await
            .inspect(|parts| {
                let size_bytes: usize = parts.iter().map(Bytes::len).sum();
                self.op(StoreOp::GetRange).add_bytes_read(size_bytes as u64);
            })
    }

    async fn head(&self, location: &Path) -> Result<ObjectMeta> {
        self.measure(StoreOp::Head, self.inner.head(location)).await
    }

    async fn delete(&self, location: &Path) -> Result<()> {
        self.measure(StoreOp::Delete, self.inner.delete(location))
            .await
    }

    fn delete_stream<'a>(
        &'a self,
        locations: BoxStream<'a, Result<Path>>,
    ) -> BoxStream<'a, Result<Path>> {
        self.inner
            .delete_stream(locations)
            .map(move |deleted| {
                self.op(StoreOp::Delete).record(None, outcome(&deleted));
                deleted
            })
            .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.measure_listing(self.inner.list(prefix))
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        self.measure_listing(self.inner.list_with_offset(prefix, offset))
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        let request = self.inner.list_with_delimiter(prefix);
        self.measure(StoreOp::List, request).await
    }

    async fn copy(&self, from: &Path, to: &Path) -> Result<()> {
        self.measure(StoreOp::Copy, self.inner.copy(from, to)).await
    }

    async fn rename(&self, from: &Path, to: &Path) -> Result<()> {
        self.measure(StoreOp::Copy, self.inner.rename(from, to))
            .await
    }

    async fn copy_if_not_exists(&self, from: &Path, to: &Path) -> Result<()> {
        let request = self.inner.copy_if_not_exists(from, to);
        self.measure(StoreOp::Copy, request).await
    }

    async fn rename_if_not_exists(&self, from: &Path, to: &Path) -> Result<()> {
        let request = self.inner.rename_if_not_exists(from, to);
        self.measure(StoreOp::Copy, request).await
    }
}

/// A multipart upload whose parts count as `put`s.
#[derive(Debug)]
struct InstrumentedUpload {
    inner: Box<dyn MultipartUpload>,
    metrics: Arc<StoreMetrics>,
}

#[async_trait]
impl MultipartUpload for InstrumentedUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        let size_bytes = data.content_length() as u64;
        let part = self.inner.put_part(data);
        let metrics = Arc::clone(&self.metrics);
        Box::pin(async move {
            measure(&metrics, StoreOp::Put, part)
                .await
                .inspect(|_| metrics.op(StoreOp::Put).add_bytes_written(size_bytes))
        })
    }

    async fn complete(&mut self) -> Result<PutResult> {
        measure(&self.metrics, StoreOp::Other, self.inner.complete()).await
    }

    async fn abort(&mut self) -> Result<()> {
        measure(&self.metrics, StoreOp::Other, self.inner.abort()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store_metrics::OpMetricsSnapshot;
    use futures::TryStreamExt;
    use object_store::memory::InMemory;

    fn instrumented() -> InstrumentedObjectStore<InMemory> {
        InstrumentedObjectStore::new(InMemory::new(), Arc::new(StoreMetrics::new()))
    }

    fn payload(size_bytes: usize) -> PutPayload {
        PutPayload::from(vec![7u8; size_bytes])
    }

    #[tokio::test]
    async fn counts_and_bytes_match_what_was_done() {
        let store = instrumented();
        for (name, size) in [("a", 100), ("b", 200), ("c", 300)] {
            store.put(&Path::from(name), payload(size)).await.unwrap();
        }
        let body = store
            .get(&Path::from("c"))
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        assert_eq!(body.len(), 300);
        store.get(&Path::from("nope")).await.unwrap_err();
        store.get_range(&Path::from("b"), 10..60).await.unwrap();
        store
            .get_ranges(&Path::from("b"), &[0..10, 20..80])
            .await
            .unwrap();
        store.head(&Path::from("a")).await.unwrap();
        store.head(&Path::from("nope")).await.unwrap_err();
        // A refused create-only write: counted, not an error.
        store
            .put_opts(
                &Path::from("a"),
                PutPayload::from_static(b"x"),
                object_store::PutMode::Create.into(),
            )
            .await
            .unwrap_err();
        store
            .copy(&Path::from("a"), &Path::from("d"))
            .await
            .unwrap();
        store
            .rename(&Path::from("d"), &Path::from("e"))
            .await
            .unwrap();
        store.delete(&Path::from("e")).await.unwrap();
        let listed = store.list(None).try_collect::<Vec<_>>().await.unwrap();
        assert_eq!(listed.len(), 3);
        store.list_with_delimiter(None).await.unwrap();

        let s = store.metrics().snapshot();
        let counts = |m: &OpMetricsSnapshot| (m.requests, m.errors, m.bytes_read, m.bytes_written);
        assert_eq!(counts(&s.put), (4, 0, 0, 600));
        assert_eq!(counts(&s.get), (2, 0, 300, 0));
        assert_eq!(counts(&s.get_range), (2, 0, 50 + 70, 0));
        assert_eq!(counts(&s.head), (2, 0, 0, 0));
        assert_eq!(counts(&s.copy), (2, 0, 0, 0));
        assert_eq!(counts(&s.delete), (1, 0, 0, 0));
        assert_eq!(counts(&s.list), (2, 0, 0, 0));
        assert_eq!(counts(&s.other), (0, 0, 0, 0));
        assert_eq!(s.total_requests(), 15);
        // The two GET/HEAD of a missing object and the refused create are
        // answers, counted apart, not errors.
        assert_eq!(s.total_errors(), 0);
        assert_eq!((s.get.not_found, s.head.not_found), (1, 1));
        assert_eq!(s.put.condition_failed, 1);
        for (op, m) in s.ops() {
            assert!(m.latency_p50_us <= m.latency_p99_us, "{op:?}");
            assert!(m.latency_p99_us <= m.latency_max_us, "{op:?}");
        }
    }

    #[tokio::test]
    async fn multipart_parts_count_as_puts() {
        let store = instrumented();
        let mut upload = store.put_multipart(&Path::from("big")).await.unwrap();
        upload.put_part(payload(1000)).await.unwrap();
        upload.put_part(payload(24)).await.unwrap();
        upload.complete().await.unwrap();
        let s = store.metrics().snapshot();
        assert_eq!((s.put.requests, s.put.bytes_written), (2, 1024));
        assert_eq!(s.other.requests, 2, "create and complete");
        let read = store
            .get(&Path::from("big"))
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        assert_eq!(read.len(), 1024);
    }

    #[tokio::test]
    async fn a_listing_counts_when_it_ends_or_is_dropped() {
        let store = instrumented();
        store.put(&Path::from("a"), payload(1)).await.unwrap();
        let listing = store.list(None);
        assert_eq!(
            store.metrics().snapshot().list.requests,
            0,
            "not yet finished"
        );
        drop(listing);
        assert_eq!(store.metrics().snapshot().list.requests, 1);
    }
}
