//! Request metrics for an object store.
//!
//! This module owns [`InstrumentedObjectStore`], which counts what goes
//! through it into a shared [`StoreMetrics`], and the plain
//! [`StoreMetricsSnapshot`] read from it (serialisable, for the JSON stats
//! file, and displayable, for log lines).
//!
//! Per operation kind ([`StoreOp`]) it keeps requests, errors, bytes read,
//! bytes written, and latency in a fixed log2 histogram of microseconds:
//! 40 counters whatever the traffic, from which p50/p99 are estimated to
//! within a factor of two (each estimate is the top of its bucket, clamped
//! to the largest latency seen).
//!
//! What counts as what:
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
//! * multipart parts count as `put`; creating, completing and aborting an
//!   upload count as `other`; `rename*` counts as `copy`.

use std::fmt;
use std::future::Future;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::{BoxStream, StreamExt};
use object_store::path::Path;
use object_store::{
    GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, Result, UploadPart,
};
use serde::Serialize;

/// The kinds of request metrics are kept for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreOp {
    Get,
    GetRange,
    Put,
    Delete,
    Head,
    List,
    Copy,
    Other,
}

impl StoreOp {
    pub const ALL: [StoreOp; 8] = [
        StoreOp::Get,
        StoreOp::GetRange,
        StoreOp::Put,
        StoreOp::Delete,
        StoreOp::Head,
        StoreOp::List,
        StoreOp::Copy,
        StoreOp::Other,
    ];

    pub fn name(self) -> &'static str {
        match self {
            StoreOp::Get => "get",
            StoreOp::GetRange => "get_range",
            StoreOp::Put => "put",
            StoreOp::Delete => "delete",
            StoreOp::Head => "head",
            StoreOp::List => "list",
            StoreOp::Copy => "copy",
            StoreOp::Other => "other",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Number of latency buckets. Bucket 0 holds 0 µs, bucket `i` holds
/// `[2^(i-1), 2^i)` µs; the last one also holds everything longer
/// (2^38 µs is over three days).
const LATENCY_BUCKETS: usize = 40;

/// A log2 histogram of latencies in microseconds.
#[derive(Debug)]
struct LatencyHistogram {
    counts: [AtomicU64; LATENCY_BUCKETS],
    max_us: AtomicU64,
}

impl Default for LatencyHistogram {
    fn default() -> LatencyHistogram {
        LatencyHistogram {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            max_us: AtomicU64::new(0),
        }
    }
}

impl LatencyHistogram {
    fn record_us(&self, latency_us: u64) {
        let bucket = (u64::BITS - latency_us.leading_zeros()) as usize;
        self.counts[bucket.min(LATENCY_BUCKETS - 1)].fetch_add(1, Ordering::Relaxed);
        self.max_us.fetch_max(latency_us, Ordering::Relaxed);
    }

    fn max_us(&self) -> u64 {
        self.max_us.load(Ordering::Relaxed)
    }

    /// The latency `quantile` (in `[0, 1]`) of the samples fall under,
    /// rounded up to the top of its bucket; 0 without samples.
    fn quantile_us(&self, quantile: f64) -> u64 {
        let counts: Vec<u64> = self
            .counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return 0;
        }
        let rank = ((quantile * total as f64).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (bucket, count) in counts.iter().enumerate() {
            seen += count;
            if seen >= rank {
                return bucket_top_us(bucket).min(self.max_us());
            }
        }
        self.max_us()
    }
}

/// The largest latency bucket `bucket` holds.
fn bucket_top_us(bucket: usize) -> u64 {
    if bucket + 1 >= LATENCY_BUCKETS {
        return u64::MAX;
    }
    (1u64 << bucket) - 1
}

/// The counters of one [`StoreOp`].
#[derive(Debug, Default)]
struct OpMetrics {
    requests: AtomicU64,
    errors: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    latency: LatencyHistogram,
}

impl OpMetrics {
    /// One finished request; `latency` is `None` when it is not known.
    fn record(&self, latency: Option<Duration>, succeeded: bool) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        if !succeeded {
            self.add_error();
        }
        if let Some(latency) = latency {
            let latency_us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
            self.latency.record_us(latency_us);
        }
    }

    fn add_error(&self) {
        self.errors.fetch_add(1, Ordering::Relaxed);
    }

    fn add_bytes_read(&self, size_bytes: u64) {
        self.bytes_read.fetch_add(size_bytes, Ordering::Relaxed);
    }

    fn add_bytes_written(&self, size_bytes: u64) {
        self.bytes_written.fetch_add(size_bytes, Ordering::Relaxed);
    }

    fn snapshot(&self) -> OpMetricsSnapshot {
        OpMetricsSnapshot {
            requests: self.requests.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            bytes_read: self.bytes_read.load(Ordering::Relaxed),
            bytes_written: self.bytes_written.load(Ordering::Relaxed),
            latency_p50_us: self.latency.quantile_us(0.50),
            latency_p99_us: self.latency.quantile_us(0.99),
            latency_max_us: self.latency.max_us(),
        }
    }
}

/// Request metrics of one store, shared (`Arc`) between the instrumented
/// store and whoever reports them.
#[derive(Debug, Default)]
pub struct StoreMetrics {
    ops: [OpMetrics; StoreOp::ALL.len()],
}

impl StoreMetrics {
    pub fn new() -> StoreMetrics {
        StoreMetrics::default()
    }

    fn op(&self, op: StoreOp) -> &OpMetrics {
        &self.ops[op.index()]
    }

    pub fn snapshot(&self) -> StoreMetricsSnapshot {
        let s = |op| self.op(op).snapshot();
        StoreMetricsSnapshot {
            get: s(StoreOp::Get),
            get_range: s(StoreOp::GetRange),
            put: s(StoreOp::Put),
            delete: s(StoreOp::Delete),
            head: s(StoreOp::Head),
            list: s(StoreOp::List),
            copy: s(StoreOp::Copy),
            other: s(StoreOp::Other),
        }
    }
}

/// A point-in-time copy of one operation's metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct OpMetricsSnapshot {
    pub requests: u64,
    /// Failed requests (and failed body reads of successful `get`s).
    pub errors: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// Estimated median latency (top of its log2 bucket).
    pub latency_p50_us: u64,
    /// Estimated 99th percentile latency (top of its log2 bucket).
    pub latency_p99_us: u64,
    /// Exact largest latency seen.
    pub latency_max_us: u64,
}

/// A point-in-time copy of [`StoreMetrics`], one field per [`StoreOp`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct StoreMetricsSnapshot {
    pub get: OpMetricsSnapshot,
    pub get_range: OpMetricsSnapshot,
    pub put: OpMetricsSnapshot,
    pub delete: OpMetricsSnapshot,
    pub head: OpMetricsSnapshot,
    pub list: OpMetricsSnapshot,
    pub copy: OpMetricsSnapshot,
    pub other: OpMetricsSnapshot,
}

impl StoreMetricsSnapshot {
    /// Each operation with its metrics, in [`StoreOp::ALL`] order.
    pub fn ops(&self) -> [(StoreOp, &OpMetricsSnapshot); 8] {
        [
            (StoreOp::Get, &self.get),
            (StoreOp::GetRange, &self.get_range),
            (StoreOp::Put, &self.put),
            (StoreOp::Delete, &self.delete),
            (StoreOp::Head, &self.head),
            (StoreOp::List, &self.list),
            (StoreOp::Copy, &self.copy),
            (StoreOp::Other, &self.other),
        ]
    }

    pub fn total_requests(&self) -> u64 {
        self.ops().iter().map(|(_, m)| m.requests).sum()
    }

    pub fn total_errors(&self) -> u64 {
        self.ops().iter().map(|(_, m)| m.errors).sum()
    }
}

/// One log line: the operations that saw requests, e.g.
/// `put 12 req 0 err 0 B read 3145728 B written p50 511us p99 2047us max 1900us`.
impl fmt::Display for StoreMetricsSnapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for (op, m) in self.ops().iter().filter(|(_, m)| m.requests > 0) {
            if !first {
                f.write_str("; ")?;
            }
            first = false;
            write!(
                f,
                "{} {} req {} err {} B read {} B written p50 {}us p99 {}us max {}us",
                op.name(),
                m.requests,
                m.errors,
                m.bytes_read,
                m.bytes_written,
                m.latency_p50_us,
                m.latency_p99_us,
                m.latency_max_us
            )?;
        }
        if first {
            f.write_str("no requests")?;
        }
        Ok(())
    }
}

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
        self.metrics.op(self.op).record(Some(latency), !self.failed);
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
        .record(Some(started.elapsed()), result.is_ok());
    result
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
                self.op(StoreOp::Delete).record(None, deleted.is_ok());
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
        assert_eq!(counts(&s.put), (3, 0, 0, 600));
        assert_eq!(counts(&s.get), (2, 1, 300, 0));
        assert_eq!(counts(&s.get_range), (2, 0, 50 + 70, 0));
        assert_eq!(counts(&s.head), (2, 1, 0, 0));
        assert_eq!(counts(&s.copy), (2, 0, 0, 0));
        assert_eq!(counts(&s.delete), (1, 0, 0, 0));
        assert_eq!(counts(&s.list), (2, 0, 0, 0));
        assert_eq!(counts(&s.other), (0, 0, 0, 0));
        assert_eq!(s.total_requests(), 14);
        assert_eq!(s.total_errors(), 2);
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

    #[test]
    fn histogram_percentiles_are_within_a_factor_of_two() {
        let histogram = LatencyHistogram::default();
        assert_eq!(histogram.quantile_us(0.5), 0, "empty");
        for latency_us in 1..=1000 {
            histogram.record_us(latency_us);
        }
        let p50 = histogram.quantile_us(0.5);
        let p99 = histogram.quantile_us(0.99);
        assert!((500..1000).contains(&p50), "p50 {p50}");
        assert!((990..=1000).contains(&p99), "p99 {p99}");
        assert_eq!(histogram.max_us(), 1000);
        assert_eq!(histogram.quantile_us(1.0), 1000, "clamped to the max");
        assert_eq!(histogram.quantile_us(0.0), 1, "the smallest bucket");
    }

    #[test]
    fn histogram_separates_fast_from_slow() {
        let histogram = LatencyHistogram::default();
        for _ in 0..98 {
            histogram.record_us(100);
        }
        histogram.record_us(50_000);
        histogram.record_us(u64::MAX);
        assert_eq!(histogram.quantile_us(0.5), 127);
        assert_eq!(histogram.quantile_us(0.98), 127);
        assert_eq!(histogram.quantile_us(0.99), 65_535);
        assert_eq!(histogram.max_us(), u64::MAX, "no overflow at the top");
    }

    #[tokio::test]
    async fn snapshot_serialises_and_displays() {
        let store = instrumented();
        store.put(&Path::from("a"), payload(10)).await.unwrap();
        let snapshot = store.metrics().snapshot();
        let json = serde_json::to_value(snapshot).unwrap();
        assert_eq!(json["put"]["requests"], 1);
        assert_eq!(json["put"]["bytes_written"], 10);
        assert!(json["get"]["latency_p99_us"].is_u64());
        let line = snapshot.to_string();
        assert!(
            line.starts_with("put 1 req 0 err 0 B read 10 B written"),
            "{line}"
        );
        assert!(
            !line.contains("get"),
            "idle operations are left out: {line}"
        );
        assert_eq!(StoreMetricsSnapshot::default().to_string(), "no requests");
    }
}
