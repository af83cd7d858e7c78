//! Injecting failures and latency into an object store, for tests.
//!
//! This module owns [`FaultInjectingObjectStore`], which applies a
//! [`FaultConfig`] (defined, with its `key=value,...` syntax, in
//! `fault_config`) to the calls it passes on, and its counters
//! [`FaultStats`].
//!
//! Each trait method call is one "call" (numbered from 1 in arrival order).
//! A call first sleeps the added latency (plus jitter), then fails with an
//! injected error if it is the `fail_nth` call or with probability
//! `error_rate`; otherwise it reaches the inner store. Mutating calls (put,
//! delete, copy, rename and their variants) that the inner store performed
//! may then still report an injected error with probability
//! `lost_reply_rate`: the object changed but the caller was told it failed,
//! like a reply lost after the server acted.
//!
//! While `partition_file` exists every call fails at once with an injected
//! error, as if the network to the store were cut (checked per call).
//!
//! Injected errors are `Error::Generic { store: "fault-injection", .. }`,
//! which the retry layer treats as transient, as it would a 5xx.
//!
//! With `ignore_if_none_match` / `ignore_if_match`, conditional PUTs
//! (`PutMode::Create` / `PutMode::Update`) reach the inner store as plain
//! overwrites and succeed whatever is there: a store that accepts the
//! headers and ignores them (Garage, some Ceph RGW versions). Counted in
//! [`FaultStats`] as `conditions_ignored`.
//!
//! Streams: `list`/`list_with_offset` fail as a whole (a one-error stream);
//! `delete_stream` goes through [`ObjectStore::delete`] per path so each
//! path is a call. Multipart uploads only see faults when they are created;
//! their parts and completion pass through.

use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::{self, BoxStream, StreamExt};
use object_store::path::Path;
use object_store::{
    Error, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore, PutMode,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, Result,
};
use serde::Serialize;

use crate::env::{unit_interval, up_to_inclusive, Entropy, Sleeper, SplitMixEntropy, TokioSleeper};
use crate::fault_config::FaultConfig;

/// The `store` field of injected `Error::Generic`s.
pub const FAULT_INJECTION_STORE: &str = "fault-injection";

/// Counters of one [`FaultInjectingObjectStore`].
#[derive(Debug, Default)]
pub struct FaultStats {
    calls: AtomicU64,
    injected_errors: AtomicU64,
    lost_replies: AtomicU64,
    conditions_ignored: AtomicU64,
}

/// A point-in-time copy of [`FaultStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct FaultStatsSnapshot {
    pub calls: u64,
    /// Calls failed before reaching the inner store.
    pub injected_errors: u64,
    /// Calls the inner store performed but that were reported as failed.
    pub lost_replies: u64,
    /// Conditional PUTs passed on as plain overwrites.
    pub conditions_ignored: u64,
}

impl FaultStats {
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    pub fn injected_errors(&self) -> u64 {
        self.injected_errors.load(Ordering::Relaxed)
    }

    pub fn lost_replies(&self) -> u64 {
        self.lost_replies.load(Ordering::Relaxed)
    }

    pub fn conditions_ignored(&self) -> u64 {
        self.conditions_ignored.load(Ordering::Relaxed)
    }

    pub fn snapshot(&self) -> FaultStatsSnapshot {
        FaultStatsSnapshot {
            calls: self.calls(),
            injected_errors: self.injected_errors(),
            lost_replies: self.lost_replies(),
            conditions_ignored: self.conditions_ignored(),
        }
    }
}

/// Fails, delays and loses the replies of calls to the inner store (see the
/// module doc).
#[derive(Debug)]
pub struct FaultInjectingObjectStore<T: ObjectStore> {
    inner: T,
    config: FaultConfig,
    sleeper: Arc<dyn Sleeper>,
    entropy: Arc<dyn Entropy>,
    stats: Arc<FaultStats>,
}

impl<T: ObjectStore> FaultInjectingObjectStore<T> {
    /// Sleeps on tokio; draws from `config.seed` or, without one, the clock.
    pub fn new(inner: T, config: FaultConfig) -> FaultInjectingObjectStore<T> {
        let entropy = match config.seed {
            Some(seed) => SplitMixEntropy::seeded(seed),
            None => SplitMixEntropy::from_clock(),
        };
        FaultInjectingObjectStore::with_env(
            inner,
            config,
            Arc::new(TokioSleeper),
            Arc::new(entropy),
        )
    }

    /// With the given time and randomness (tests); `config.seed` is ignored.
    pub fn with_env(
        inner: T,
        config: FaultConfig,
        sleeper: Arc<dyn Sleeper>,
        entropy: Arc<dyn Entropy>,
    ) -> FaultInjectingObjectStore<T> {
        FaultInjectingObjectStore {
            inner,
            config,
            sleeper,
            entropy,
            stats: Arc::new(FaultStats::default()),
        }
    }

    pub fn stats(&self) -> &Arc<FaultStats> {
        &self.stats
    }

    pub fn config(&self) -> &FaultConfig {
        &self.config
    }

    /// Counts a call, sleeps its latency and fails it if so decided.
    /// Returns the call number.
    async fn before_call(&self, operation: &'static str, path: &Path) -> Result<u64> {
        let decision = self.decide(operation, path);
        if !decision.latency.is_zero() {
            self.sleeper.sleep(decision.latency).await;
        }
        match decision.error {
            Some(error) => Err(error),
            None => Ok(decision.call_number),
        }
    }

    /// Numbers a call and draws its latency and whether it fails.
    fn decide(&self, operation: &'static str, path: &Path) -> CallDecision {
        let call_number = self.stats.calls.fetch_add(1, Ordering::Relaxed) + 1;
        let jitter_ms = match self.config.latency_jitter_ms {
            0 => 0,
            max_ms => up_to_inclusive(self.entropy.as_ref(), max_ms),
        };
        let slow_ms = if self.draw(self.config.slow_rate) {
            self.config.slow_ms
        } else {
            0
        };
        let latency_ms = self
            .config
            .added_latency_ms
            .saturating_add(jitter_ms)
            .saturating_add(slow_ms);
        let is_nth = self.config.fail_nth == Some(call_number);
        let partitioned = self
            .config
            .partition_file
            .as_ref()
            .is_some_and(|p| p.exists());
        let error = (partitioned || is_nth || self.draw(self.config.error_rate)).then(|| {
            self.stats.injected_errors.fetch_add(1, Ordering::Relaxed);
            let why = if partitioned { " (partitioned)" } else { "" };
            injected_error(format!(
                "{operation} {path} failed (call {call_number}){why}"
            ))
        });
        CallDecision {
            call_number,
            latency: Duration::from_millis(latency_ms),
            error,
        }
    }

    /// Passes on the inner store's result of a mutating call, or loses the
    /// reply of a success.
    fn after_mutation<R>(
        &self,
        operation: &'static str,
        path: &Path,
        call_number: u64,
        result: Result<R>,
    ) -> Result<R> {
        if result.is_err() || !self.draw(self.config.lost_reply_rate) {
            return result;
        }
        self.stats.lost_replies.fetch_add(1, Ordering::Relaxed);
        let what = format!(
            "reply to {operation} {path} lost after the store performed it (call {call_number})"
        );
        Err(injected_error(what))
    }

    /// `opts` with its condition dropped if this store is to ignore it.
    fn apply_ignored_conditions(&self, mut opts: PutOptions) -> PutOptions {
        let ignore = match opts.mode {
            PutMode::Create => self.config.ignore_if_none_match,
            PutMode::Update(_) => self.config.ignore_if_match,
            PutMode::Overwrite => false,
        };
        if ignore {
            self.stats
                .conditions_ignored
                .fetch_add(1, Ordering::Relaxed);
            opts.mode = PutMode::Overwrite;
        }
        opts
    }

    /// True with probability `rate`; draws nothing when `rate` is 0 so a
    /// fault-free configuration leaves the sequence alone.
    fn draw(&self, rate: f64) -> bool {
        rate > 0.0 && unit_interval(self.entropy.as_ref()) < rate
    }
}

fn injected_error(what: String) -> Error {
    Error::Generic {
        store: FAULT_INJECTION_STORE,
        source: format!("injected fault: {what}").into(),
    }
}

impl<T: ObjectStore> fmt::Display for FaultInjectingObjectStore<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "FaultInjectingObjectStore({}, {})",
            self.config, self.inner
        )
    }
}

#[async_trait]
impl<T: ObjectStore> ObjectStore for FaultInjectingObjectStore<T> {
    async fn put(&self, location: &Path, payload: PutPayload) -> Result<PutResult> {
        let call = self.before_call("put", location).await?;
        let result = self.inner.put(location, payload).await;
        self.after_mutation("put", location, call, result)
    }

    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        let call = self.before_call("put", location).await?;
        let opts = self.apply_ignored_conditions(opts);
        let result = self.inner.put_opts(location, payload, opts).await;
        self.after_mutation("put", location, call, result)
    }

    async fn put_multipart(&self, location: &Path) -> Result<Box<dyn MultipartUpload>> {
        self.before_call("put_multipart", location).await?;
        self.inner.put_multipart(location).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.before_call("put_multipart", location).await?;
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get(&self, location: &Path) -> Result<GetResult> {
        self.before_call("get", location).await?;
        self.inner.get(location).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        self.before_call("get", location).await?;
        self.inner.get_opts(location, options).await
    }

    async fn get_range(&self, location: &Path, range: Range<u64>) -> Result<Bytes> {
        self.before_call("get_range", location).await?;
        self.inner.get_range(location, range).await
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        self.before_call("get_ranges", location).await?;
        self.inner.get_ranges(location, ranges).await
    }

    async fn head(&self, location: &Path) -> Result<ObjectMeta> {
        self.before_call("head", location).await?;
        self.inner.head(location).await
    }

    async fn delete(&self, location: &Path) -> Result<()> {
        let call = self.before_call("delete", location).await?;
        let result = self.inner.delete(location).await;
        self.after_mutation("delete", location, call, result)
    }

    /// One call per path, through [`Self::delete`], ten at a time (the
    /// trait's default), so each path can fail on its own.
    fn delete_stream<'a>(
        &'a self,
        locations: BoxStream<'a, Result<Path>>,
    ) -> BoxStream<'a, Result<Path>> {
        locations
            .map(move |location| async move {
                let location = location?;
                self.delete(&location).await?;
                Ok(location)
            })
            .buffered(10)
            .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        let listing = self.inner.list(prefix);
        self.faulty_listing(prefix, listing)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        let listing = self.inner.list_with_offset(prefix, offset);
        self.faulty_listing(prefix, listing)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        let root = Path::default();
        self.before_call("list_with_delimiter", prefix.unwrap_or(&root))
            .await?;
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy(&self, from: &Path, to: &Path) -> Result<()> {
        let call = self.before_call("copy", from).await?;
        let result = self.inner.copy(from, to).await;
        self.after_mutation("copy", from, call, result)
    }

    async fn rename(&self, from: &Path, to: &Path) -> Result<()> {
        let call = self.before_call("rename", from).await?;
        let result = self.inner.rename(from, to).await;
        self.after_mutation("rename", from, call, result)
    }

    async fn copy_if_not_exists(&self, from: &Path, to: &Path) -> Result<()> {
        let call = self.before_call("copy_if_not_exists", from).await?;
        let result = self.inner.copy_if_not_exists(from, to).await;
        self.after_mutation("copy_if_not_exists", from, call, result)
    }

    async fn rename_if_not_exists(&self, from: &Path, to: &Path) -> Result<()> {
        let call = self.before_call("rename_if_not_exists", from).await?;
        let result = self.inner.rename_if_not_exists(from, to).await;
        self.after_mutation("rename_if_not_exists", from, call, result)
    }
}

/// What happens to one call, drawn when it arrives.
struct CallDecision {
    call_number: u64,
    latency: Duration,
    error: Option<Error>,
}

impl<T: ObjectStore> FaultInjectingObjectStore<T> {
    /// The listing, or a one-error stream if the call is failed. The call is
    /// counted and decided now; its latency is slept before the first item.
    fn faulty_listing(
        &self,
        prefix: Option<&Path>,
        listing: BoxStream<'static, Result<ObjectMeta>>,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        let root = Path::default();
        let decision = self.decide("list", prefix.unwrap_or(&root));
        let latency = decision.latency;
        // Made lazily: a tokio timer needs a runtime, which `list` may lack.
        let sleeper = Arc::clone(&self.sleeper);
        let body = match decision.error {
            Some(error) => stream::once(async move { Err(error) }).boxed(),
            None => listing,
        };
        let delay_first = stream::once(async move {
            if !latency.is_zero() {
                sleeper.sleep(latency).await;
            }
        })
        .filter_map(|()| async { None });
        delay_first.chain(body).boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::RecordingSleeper;
    use futures::TryStreamExt;
    use object_store::memory::InMemory;

    type Faulty = FaultInjectingObjectStore<Arc<dyn ObjectStore>>;

    /// The faulty store, the memory store under it, and its sleeper.
    fn faulty(config: &str) -> (Faulty, Arc<dyn ObjectStore>, Arc<RecordingSleeper>) {
        let memory: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let sleeper = Arc::new(RecordingSleeper::default());
        let store = FaultInjectingObjectStore::with_env(
            Arc::clone(&memory),
            FaultConfig::parse(config).unwrap(),
            Arc::clone(&sleeper) as Arc<dyn Sleeper>,
            Arc::new(SplitMixEntropy::seeded(5)),
        );
        (store, memory, sleeper)
    }

    fn is_injected(error: &Error) -> bool {
        matches!(error, Error::Generic { store, .. } if *store == FAULT_INJECTION_STORE)
            && error.to_string().contains("injected fault")
    }

    #[tokio::test]
    async fn fail_nth_fails_exactly_that_call() {
        let (store, _, _) = faulty("fail_nth=3");
        let mut failed = Vec::new();
        for i in 1..=6u64 {
            let path = Path::from(format!("o{i}"));
            if let Err(error) = store.put(&path, PutPayload::from_static(b"x")).await {
                assert!(is_injected(&error), "{error}");
                failed.push(i);
            }
        }
        assert_eq!(failed, [3]);
        assert_eq!(store.stats().snapshot().calls, 6);
        assert_eq!(store.stats().snapshot().injected_errors, 1);
    }

    #[tokio::test]
    async fn lost_replies_apply_only_to_mutations_that_happened() {
        let (store, memory, _) = faulty("lost_reply_rate=1");
        let path = Path::from("vol/segment");
        let error = store
            .put(&path, PutPayload::from_static(b"data"))
            .await
            .unwrap_err();
        assert!(is_injected(&error), "{error}");
        let stored = memory.get(&path).await.unwrap().bytes().await.unwrap();
        assert_eq!(stored, Bytes::from_static(b"data"), "the put happened");

        let read = store.get_range(&path, 0..2).await.unwrap();
        assert_eq!(read, Bytes::from_static(b"da"), "reads are not affected");

        store
            .copy(&path, &Path::from("vol/copy"))
            .await
            .unwrap_err();
        memory.head(&Path::from("vol/copy")).await.unwrap();
        store.delete(&path).await.unwrap_err();
        let gone = memory.head(&path).await.unwrap_err();
        assert!(
            matches!(gone, Error::NotFound { .. }),
            "the delete happened"
        );

        // A mutation the store refused is reported as the store said.
        let error = store.copy(&path, &Path::from("x")).await.unwrap_err();
        assert!(matches!(error, Error::NotFound { .. }), "{error}");
        assert_eq!(store.stats().lost_replies(), 3);
        assert_eq!(store.stats().injected_errors(), 0);
    }

    #[tokio::test]
    async fn error_rate_is_roughly_honoured() {
        let (store, memory, _) = faulty("error_rate=0.25");
        memory
            .put(&Path::from("o"), PutPayload::from_static(b"x"))
            .await
            .unwrap();
        let mut failures = 0;
        for _ in 0..4_000 {
            if store.head(&Path::from("o")).await.is_err() {
                failures += 1;
            }
        }
        assert!((800..1_200).contains(&failures), "{failures} of 4000");
        assert_eq!(store.stats().injected_errors(), failures);
    }

    #[tokio::test]
    async fn latency_is_added_within_the_jitter() {
        let (store, _, sleeper) = faulty("latency_ms=20,jitter_ms=10");
        for _ in 0..50 {
            store.head(&Path::from("missing")).await.unwrap_err();
        }
        let _ = store.list(None).try_collect::<Vec<_>>().await.unwrap();
        let slept = sleeper.slept.lock().clone();
        assert_eq!(slept.len(), 51, "every call, listings included, sleeps");
        for delay in &slept {
            let ms = delay.as_millis();
            assert!((20..=30).contains(&ms), "{delay:?}");
        }
        assert!(slept.iter().any(|d| d.as_millis() != 20), "jitter varies");
    }

    #[tokio::test]
    async fn ignored_conditions_become_overwrites_each_on_its_own() {
        let path = Path::from("lease");
        let body = |s: &'static str| PutPayload::from_static(s.as_bytes());
        let (store, _, _) = faulty("ignore_if_none_match=1");
        let v1 = store
            .put_opts(&path, body("a"), PutMode::Create.into())
            .await
            .unwrap();
        store
            .put_opts(&path, body("b"), PutMode::Create.into())
            .await
            .unwrap();
        let stale = PutMode::Update(v1.into());
        let error = store
            .put_opts(&path, body("c"), stale.into())
            .await
            .unwrap_err();
        assert!(matches!(error, Error::Precondition { .. }), "{error}");
        assert_eq!(store.stats().conditions_ignored(), 2);

        let (store, _, _) = faulty("ignore_if_match=1");
        let v1 = store
            .put_opts(&path, body("a"), PutMode::Create.into())
            .await
            .unwrap();
        let error = store
            .put_opts(&path, body("b"), PutMode::Create.into())
            .await
            .unwrap_err();
        assert!(matches!(error, Error::AlreadyExists { .. }), "{error}");
        store
            .put_opts(&path, body("c"), PutMode::Update(v1.clone().into()).into())
            .await
            .unwrap();
        store
            .put_opts(&path, body("d"), PutMode::Update(v1.into()).into())
            .await
            .unwrap();
        let got = store.get(&path).await.unwrap().bytes().await.unwrap();
        assert_eq!(got, Bytes::from_static(b"d"));
        assert_eq!(store.stats().snapshot().conditions_ignored, 2);
    }

    #[tokio::test]
    async fn listings_and_delete_streams_fail_like_calls() {
        let (store, memory, _) = faulty("fail_nth=2");
        for name in ["a", "b", "c"] {
            memory
                .put(&Path::from(name), PutPayload::from_static(b"x"))
                .await
                .unwrap();
        }
        assert_eq!(
            store
                .list(None)
                .try_collect::<Vec<_>>()
                .await
                .unwrap()
                .len(),
            3
        );
        let error = store.list(None).try_collect::<Vec<_>>().await.unwrap_err();
        assert!(is_injected(&error), "{error}");

        let paths = futures::stream::iter(["a", "b", "c"].map(|p| Ok(Path::from(p))));
        let results: Vec<_> = store.delete_stream(paths.boxed()).collect().await;
        assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 3);
        assert_eq!(store.stats().calls(), 5, "two listings, three deletes");
    }

    #[tokio::test]
    async fn a_partition_fails_every_call_while_its_file_exists() {
        let dir = tempfile::TempDir::new().unwrap();
        let cut = dir.path().join("cut");
        let (store, _, _) = faulty(&format!("partition_file={}", cut.display()));
        let path = Path::from("obj");
        store
            .put(&path, PutPayload::from_static(b"x"))
            .await
            .unwrap();
        std::fs::write(&cut, b"").unwrap();
        let error = store.get(&path).await.unwrap_err();
        assert!(
            is_injected(&error) && error.to_string().contains("partitioned"),
            "{error}"
        );
        let error = store
            .put(&path, PutPayload::from_static(b"y"))
            .await
            .unwrap_err();
        assert!(is_injected(&error), "{error}");
        std::fs::remove_file(&cut).unwrap();
        let got = store.get(&path).await.unwrap().bytes().await.unwrap();
        assert_eq!(
            got,
            Bytes::from_static(b"x"),
            "the put during the partition reached the store"
        );
        assert_eq!(store.stats().snapshot().injected_errors, 2);
    }
}
