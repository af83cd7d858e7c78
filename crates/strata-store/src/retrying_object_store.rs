//! Retrying transient object store failures.
//!
//! This module owns [`RetryingObjectStore`], the decision of which
//! `object_store::Error`s are transient ([`is_transient`]) and the retry
//! counters ([`RetryStats`]); the attempt limits and backoff schedule it
//! follows are a [`RetryPolicy`] (in `retry_policy`).
//!
//! Every call that returns a value is retried: `put*`, `get*`, `head`,
//! `delete`, `copy*`, `rename*`, `list_with_delimiter`. Streaming calls
//! (`list`, `list_with_offset`, `delete_stream`) and multipart uploads pass
//! straight through: a stream may fail after yielding items and a multipart
//! upload keeps state in the inner store, so neither can be replayed here.
//! For `get`/`get_opts` the call that yields the [`GetResult`] is retried;
//! an error while reading its body is not (the caller sees it).
//!
//! Backoff is exponential with full jitter: before retry `k` (1-based) the
//! store sleeps a uniform random time in `[0, min(max_delay, base * 2^(k-1))]`
//! so clients that failed together do not retry together. It stops after
//! `max_attempts` attempts, or when the next sleep would end past
//! `deadline_ms` from the first attempt, and returns the last error: as it
//! came when it is permanent (so `NotFound`, `AlreadyExists`, ... stay
//! matchable by the caller), and for a transient `Generic` one wrapped in
//! [`RetriesExhausted`], which says how many attempts over how long (still
//! `Generic`, from the same store). Retry messages go to the
//! [`RETRY_LOG_TARGET`] target.
//!
//! # Retried writes are at-least-once
//!
//! A write whose first attempt reached the store but whose reply was lost
//! (timeout, reset connection) is sent again. For plain overwrites and
//! deletes that is harmless. It is not for conditional writes:
//!
//! * a `PutMode::Create` retried after a lost reply fails with
//!   `AlreadyExists`, although it was this caller that created the object;
//! * a `PutMode::Update` retried after a lost reply fails with
//!   `Precondition`, although it was this caller's update that moved the
//!   version on;
//! * likewise `copy_if_not_exists`/`rename_if_not_exists` report
//!   `AlreadyExists`, and a retried `rename` whose delete step had landed
//!   reports `NotFound`.
//!
//! Callers using conditional writes must treat those errors as "maybe it was
//! me" and re-read the object to find out (the lease code does).

use std::fmt;
use std::future::Future;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    Error, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, Result,
};
use serde::Serialize;
use tokio::time::Instant;

use crate::env::{Entropy, Sleeper, SplitMixEntropy, TokioSleeper};
use crate::error_text::{error_text, ErrorText};
use crate::retry_policy::RetryPolicy;
use crate::store_failure::StoreFailure;

/// The `tracing` target of retry messages. A server logs each retry; a
/// one-shot command turns this target off (its final error says how many
/// attempts were made), so a failing command prints one line.
pub const RETRY_LOG_TARGET: &str = "strata_store::retries";

/// A transient error still there after the last attempt: the error as it
/// came, and how long strata kept trying.
#[derive(Debug)]
pub struct RetriesExhausted {
    pub attempts: u32,
    pub elapsed_ms: u64,
    pub last: Error,
}

impl fmt::Display for RetriesExhausted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({} attempts over {:.1} s)",
            error_text(&self.last),
            self.attempts,
            self.elapsed_ms as f64 / 1000.0
        )
    }
}

impl std::error::Error for RetriesExhausted {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.last)
    }
}

/// `error` after `attempts` attempts: a `Generic` one (what transient
/// errors are) says how many; other variants stay matchable as they came.
pub(crate) fn gave_up(error: Error, attempts: u32, elapsed_ms: u64) -> Error {
    if attempts <= 1 {
        return error;
    }
    match error {
        Error::Generic { store, .. } => Error::Generic {
            store,
            source: Box::new(RetriesExhausted {
                attempts,
                elapsed_ms,
                last: error,
            }),
        },
        other => other,
    }
}

/// Whether an error may go away if the same request is sent again.
///
/// An explained failure ([`StoreFailure`], from `ExplainingObjectStore`)
/// decides by its kind: an unreachable endpoint or a timeout may pass,
/// rejected credentials, a denied permission, a missing bucket or a full
/// disk do not, whatever variant carries them. Otherwise, errors that
/// describe the request or the object (missing, exists, failed
/// precondition, bad path, no permission, unsupported) will not change on a
/// retry. `Generic` is what object_store's HTTP clients report for 5xx
/// replies, timeouts and connection resets once their own retries are spent,
/// so it is retried, as is anything unknown (the enum is non-exhaustive).
pub fn is_transient(error: &Error) -> bool {
    if let Some(failure) = StoreFailure::find(error) {
        return failure.kind.is_transient();
    }
    !matches!(
        error,
        Error::NotFound { .. }
            | Error::AlreadyExists { .. }
            | Error::Precondition { .. }
            | Error::NotModified { .. }
            | Error::NotImplemented
            | Error::NotSupported { .. }
            | Error::InvalidPath { .. }
            | Error::PermissionDenied { .. }
            | Error::Unauthenticated { .. }
            | Error::UnknownConfigurationKey { .. }
            | Error::JoinError { .. }
    )
}

/// Counters of one [`RetryingObjectStore`], shared with whoever reports them.
#[derive(Debug, Default)]
pub struct RetryStats {
    retries: AtomicU64,
    gave_up: AtomicU64,
}

/// A point-in-time copy of [`RetryStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RetryStatsSnapshot {
    /// Attempts after the first, over all calls.
    pub retries: u64,
    /// Calls that failed with a transient error after the last attempt.
    pub gave_up: u64,
}

impl RetryStats {
    pub fn retries(&self) -> u64 {
        self.retries.load(Ordering::Relaxed)
    }

    pub fn gave_up(&self) -> u64 {
        self.gave_up.load(Ordering::Relaxed)
    }

    pub fn snapshot(&self) -> RetryStatsSnapshot {
        RetryStatsSnapshot {
            retries: self.retries(),
            gave_up: self.gave_up(),
        }
    }
}

/// Retries transient failures of the inner store (see the module doc).
#[derive(Debug)]
pub struct RetryingObjectStore<T: ObjectStore> {
    inner: T,
    policy: RetryPolicy,
    sleeper: Arc<dyn Sleeper>,
    entropy: Arc<dyn Entropy>,
    stats: Arc<RetryStats>,
}

impl<T: ObjectStore> RetryingObjectStore<T> {
    /// Sleeps on tokio, with jitter seeded from the clock.
    pub fn new(inner: T, policy: RetryPolicy) -> RetryingObjectStore<T> {
        RetryingObjectStore::with_env(
            inner,
            policy,
            Arc::new(TokioSleeper),
            Arc::new(SplitMixEntropy::from_clock()),
        )
    }

    /// With the given time and randomness (tests).
    pub fn with_env(
        inner: T,
        policy: RetryPolicy,
        sleeper: Arc<dyn Sleeper>,
        entropy: Arc<dyn Entropy>,
    ) -> RetryingObjectStore<T> {
        RetryingObjectStore {
            inner,
            policy,
            sleeper,
            entropy,
            stats: Arc::new(RetryStats::default()),
        }
    }

    pub fn stats(&self) -> &Arc<RetryStats> {
        &self.stats
    }

    pub fn policy(&self) -> &RetryPolicy {
        &self.policy
    }

    /// Runs `attempt` until it succeeds, fails for good, or the policy says
    /// stop; returns the last result. `operation` and `path` are for logs.
    async fn retry<R, F, Fut>(
        &self,
        operation: &'static str,
        path: &Path,
        mut attempt: F,
    ) -> Result<R>
    where
        F: FnMut() -> Fut + Send,
        Fut: Future<Output = Result<R>> + Send,
    {
        let started = Instant::now();
        let mut attempt_number: u32 = 1;
        loop {
            let error = match attempt().await {
                Ok(value) => return Ok(value),
                Err(error) if !is_transient(&error) => return Err(error),
                Err(error) => error,
            };
            let delay_ms = self
                .policy
                .backoff_delay_ms(attempt_number, self.entropy.as_ref());
            if self.must_stop(attempt_number, started, delay_ms) {
                self.log_give_up(operation, path, attempt_number, &error);
                let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
                return Err(gave_up(error, attempt_number, elapsed_ms));
            }
            self.stats.retries.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                target: RETRY_LOG_TARGET,
                operation,
                volume = %crate::names::volume_of(path),
                path = %path,
                attempt = attempt_number,
                delay_ms,
                error = %ErrorText(&error),
                "object store request failed; retrying"
            );
            self.sleeper.sleep(Duration::from_millis(delay_ms)).await;
            attempt_number = attempt_number.saturating_add(1);
        }
    }

    /// Whether the attempt just failed was the last one allowed.
    fn must_stop(&self, attempts_made: u32, started: Instant, next_delay_ms: u64) -> bool {
        if attempts_made >= self.policy.max_attempts.max(1) {
            return true;
        }
        let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        elapsed_ms.saturating_add(next_delay_ms) > self.policy.deadline_ms
    }

    /// Logs carry the object path and the error's text. object_store's
    /// errors describe a request by method and URL; credentials travel in
    /// signed headers, which they do not print.
    fn log_give_up(&self, operation: &'static str, path: &Path, attempts: u32, error: &Error) {
        self.stats.gave_up.fetch_add(1, Ordering::Relaxed);
        tracing::error!(
            target: RETRY_LOG_TARGET,
            operation,
            volume = %crate::names::volume_of(path),
            path = %path,
            attempts,
            error = %ErrorText(error),
            "object store request failed; giving up"
        );
    }
}

impl<T: ObjectStore> fmt::Display for RetryingObjectStore<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RetryingObjectStore({})", self.inner)
    }
}

#[async_trait]
impl<T: ObjectStore> ObjectStore for RetryingObjectStore<T> {
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
        // `PutPayload` is an `Arc` of chunks: cloning it per attempt is cheap.
        self.retry("put", location, || {
            self.inner.put_opts(location, payload.clone(), opts.clone())
        })
        .await
    }

    /// Not retried: the upload's state lives in the inner store.
    async fn put_multipart(&self, location: &Path) -> Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart(location).await
    }

    /// Not retried: the upload's state lives in the inner store.
    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get(&self, location: &Path) -> Result<GetResult> {
        self.get_opts(location, GetOptions::default()).await
    }

    /// Retries obtaining the result; errors while reading its body are the
    /// caller's (the body is a one-shot stream).
    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        let operation = if options.head { "head" } else { "get" };
        self.retry(operation, location, || {
            self.inner.get_opts(location, options.clone())
        })
        .await
    }

    async fn get_range(&self, location: &Path, range: Range<u64>) -> Result<Bytes> {
        self.retry("get_range", location, || {
            self.inner.get_range(location, range.clone())
        })
        .await
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        self.retry("get_ranges", location, || {
            self.inner.get_ranges(location, ranges)
        })
        .await
    }

    async fn head(&self, location: &Path) -> Result<ObjectMeta> {
        self.retry("head", location, || self.inner.head(location))
            .await
    }

    async fn delete(&self, location: &Path) -> Result<()> {
        self.retry("delete", location, || self.inner.delete(location))
            .await
    }

    /// Not retried: a stream cannot be replayed (the items carry errors).
    fn delete_stream<'a>(
        &'a self,
        locations: BoxStream<'a, Result<Path>>,
    ) -> BoxStream<'a, Result<Path>> {
        self.inner.delete_stream(locations)
    }

    /// Not retried: a listing may fail after yielding items.
    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    /// Not retried: a listing may fail after yielding items.
    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        let root = Path::default();
        let log_path = prefix.unwrap_or(&root);
        self.retry("list_with_delimiter", log_path, || {
            self.inner.list_with_delimiter(prefix)
        })
        .await
    }

    async fn copy(&self, from: &Path, to: &Path) -> Result<()> {
        self.retry("copy", from, || self.inner.copy(from, to)).await
    }

    async fn rename(&self, from: &Path, to: &Path) -> Result<()> {
        self.retry("rename", from, || self.inner.rename(from, to))
            .await
    }

    async fn copy_if_not_exists(&self, from: &Path, to: &Path) -> Result<()> {
        self.retry("copy_if_not_exists", from, || {
            self.inner.copy_if_not_exists(from, to)
        })
        .await
    }

    async fn rename_if_not_exists(&self, from: &Path, to: &Path) -> Result<()> {
        self.retry("rename_if_not_exists", from, || {
            self.inner.rename_if_not_exists(from, to)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::SplitMixEntropy;
    use crate::fault_config::FaultConfig;
    use crate::fault_injecting_object_store::FaultInjectingObjectStore;
    use crate::test_support::{CountingObjectStore, RecordingSleeper};
    use object_store::memory::InMemory;
    use object_store::PutMode;

    type Faulty = FaultInjectingObjectStore<Arc<dyn ObjectStore>>;

    fn faulty(memory: &Arc<dyn ObjectStore>, config: &str, seed: u64) -> Faulty {
        let config = FaultConfig::parse(config).unwrap();
        FaultInjectingObjectStore::with_env(
            Arc::clone(memory),
            config,
            Arc::new(RecordingSleeper::default()),
            Arc::new(SplitMixEntropy::seeded(seed)),
        )
    }

    fn retrying<T: ObjectStore>(
        inner: T,
        policy: RetryPolicy,
    ) -> (RetryingObjectStore<T>, Arc<RecordingSleeper>) {
        let sleeper = Arc::new(RecordingSleeper::default());
        let store = RetryingObjectStore::with_env(
            inner,
            policy,
            Arc::clone(&sleeper) as Arc<dyn Sleeper>,
            Arc::new(SplitMixEntropy::seeded(99)),
        );
        (store, sleeper)
    }

    fn memory() -> Arc<dyn ObjectStore> {
        Arc::new(InMemory::new())
    }

    #[tokio::test]
    async fn round_trips_survive_transient_faults() {
        let memory = memory();
        let (store, _) = retrying(faulty(&memory, "error_rate=0.3", 1), RetryPolicy::default());
        for i in 0..200u32 {
            let path = Path::from(format!("vol/obj-{i}"));
            let body = Bytes::from(format!("payload {i}").repeat(i as usize % 7 + 1));
            store.put(&path, body.clone().into()).await.unwrap();
            let read = store.get(&path).await.unwrap().bytes().await.unwrap();
            assert_eq!(read, body, "object {i}");
        }
        let stats = store.stats().snapshot();
        let injected = store.inner.stats().injected_errors();
        assert!(stats.retries > 0, "error_rate 0.3 must cause retries");
        assert_eq!(stats.gave_up, 0);
        // Every injected failure was answered by exactly one retry.
        assert_eq!(stats.retries, injected);
    }

    #[tokio::test]
    async fn gives_up_after_max_attempts_with_the_last_error() {
        let memory = memory();
        let (store, sleeper) = retrying(faulty(&memory, "error_rate=1", 1), RetryPolicy::default());
        let error = store
            .put(&Path::from("a"), Bytes::from_static(b"x").into())
            .await
            .unwrap_err();
        assert!(
            matches!(
                &error,
                Error::Generic {
                    store: "fault-injection",
                    ..
                }
            ),
            "{error}"
        );
        assert!(error.to_string().contains("injected"), "{error}");
        assert_eq!(store.inner.stats().calls(), 8, "max_attempts defaults to 8");
        assert_eq!(store.stats().retries(), 7);
        assert_eq!(store.stats().gave_up(), 1);
        assert_eq!(sleeper.slept.lock().len(), 7);
    }

    #[tokio::test]
    async fn permanent_errors_are_returned_at_once() {
        let counting = CountingObjectStore::new(InMemory::new());
        let calls = Arc::clone(&counting.calls);
        let (store, sleeper) = retrying(counting, RetryPolicy::default());
        let missing = Path::from("missing");
        let error = store.get(&missing).await.unwrap_err();
        assert!(matches!(error, Error::NotFound { .. }), "{error}");
        let error = store.head(&missing).await.unwrap_err();
        assert!(matches!(error, Error::NotFound { .. }), "{error}");
        assert_eq!(calls.load(Ordering::SeqCst), 2, "one call each");

        let create = PutOptions::from(PutMode::Create);
        let payload = PutPayload::from_static(b"x");
        store
            .put_opts(&missing, payload.clone(), create.clone())
            .await
            .unwrap();
        let error = store.put_opts(&missing, payload, create).await.unwrap_err();
        assert!(matches!(error, Error::AlreadyExists { .. }), "{error}");
        assert_eq!(calls.load(Ordering::SeqCst), 4);
        assert_eq!(store.stats().snapshot(), RetryStatsSnapshot::default());
        assert!(sleeper.slept.lock().is_empty());
    }

    #[tokio::test]
    async fn backoff_delays_stay_under_their_caps() {
        let policy = RetryPolicy {
            max_attempts: 12,
            base_delay_ms: 50,
            max_delay_ms: 400,
            deadline_ms: 3_600_000,
        };
        let caps: Vec<u64> = (1..=5).map(|retry| policy.delay_cap_ms(retry)).collect();
        assert_eq!(caps, [50, 100, 200, 400, 400]);
        let memory = memory();
        let (store, sleeper) = retrying(faulty(&memory, "error_rate=1", 1), policy.clone());
        store.head(&Path::from("a")).await.unwrap_err();
        let slept = sleeper.slept.lock().clone();
        assert_eq!(slept.len(), 11);
        for (i, delay) in slept.iter().enumerate() {
            let cap_ms = policy.delay_cap_ms(i as u32 + 1);
            assert!(
                delay.as_millis() as u64 <= cap_ms,
                "retry {}: {delay:?}",
                i + 1
            );
        }
        let distinct: std::collections::HashSet<_> = slept.iter().collect();
        assert!(
            distinct.len() > 5,
            "full jitter varies the delays: {slept:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn deadline_stops_retries_early() {
        let policy = RetryPolicy {
            max_attempts: 1_000,
            base_delay_ms: 1_000,
            max_delay_ms: 1_000,
            deadline_ms: 5_000,
        };
        let memory = memory();
        let store = RetryingObjectStore::with_env(
            faulty(&memory, "error_rate=1", 1),
            policy,
            Arc::new(TokioSleeper),
            Arc::new(SplitMixEntropy::seeded(3)),
        );
        let started = Instant::now();
        store.head(&Path::from("a")).await.unwrap_err();
        assert!(started.elapsed() <= Duration::from_millis(5_000));
        let calls = store.inner.stats().calls();
        assert!((2..1_000).contains(&calls), "{calls} attempts");
        assert_eq!(store.stats().gave_up(), 1);
    }

    /// The documented hazard: the first create landed but its reply was
    /// lost, so the retry finds the object and reports `AlreadyExists`.
    #[tokio::test]
    async fn create_retried_after_a_lost_reply_reports_already_exists() {
        let memory = memory();
        let (store, _) = retrying(
            faulty(&memory, "lost_reply_rate=1", 1),
            RetryPolicy::default(),
        );
        let path = Path::from("vol/lease");
        let payload = PutPayload::from_static(b"mine");
        let error = store
            .put_opts(&path, payload, PutMode::Create.into())
            .await
            .unwrap_err();
        assert!(matches!(error, Error::AlreadyExists { .. }), "{error}");
        assert_eq!(store.stats().retries(), 1);
        assert_eq!(store.inner.stats().lost_replies(), 1);
        let stored = memory.get(&path).await.unwrap().bytes().await.unwrap();
        assert_eq!(
            stored,
            Bytes::from_static(b"mine"),
            "the first attempt landed"
        );
    }

    #[test]
    fn only_generic_and_unknown_errors_are_transient() {
        let source = || -> Box<dyn std::error::Error + Send + Sync> { "x".into() };
        let path = || "p".to_string();
        assert!(is_transient(&Error::Generic {
            store: "S3",
            source: source()
        }));
        let permanent = [
            Error::NotFound {
                path: path(),
                source: source(),
            },
            Error::AlreadyExists {
                path: path(),
                source: source(),
            },
            Error::Precondition {
                path: path(),
                source: source(),
            },
            Error::NotModified {
                path: path(),
                source: source(),
            },
            Error::NotImplemented,
            Error::NotSupported { source: source() },
            Error::PermissionDenied {
                path: path(),
                source: source(),
            },
            Error::Unauthenticated {
                path: path(),
                source: source(),
            },
            Error::UnknownConfigurationKey {
                store: "S3",
                key: path(),
            },
        ];
        for error in &permanent {
            assert!(!is_transient(error), "{error}");
        }
    }
}
