//! Test doubles for the wrapper tests: a sleeper that records what it was
//! asked to sleep, a store wrapper that counts calls and how many run at
//! once, and an environment made of given variables.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, Result,
};
use parking_lot::Mutex;

use crate::env::Sleeper;

/// Records each requested sleep and returns at once.
#[derive(Debug, Default)]
pub struct RecordingSleeper {
    pub slept: Mutex<Vec<Duration>>,
}

impl Sleeper for RecordingSleeper {
    fn sleep(&self, duration: Duration) -> BoxFuture<'static, ()> {
        self.slept.lock().push(duration);
        Box::pin(async {})
    }
}

/// Counts calls of the required trait methods (the provided ones route
/// through them) and the most that were running at once.
#[derive(Debug)]
pub struct CountingObjectStore<T> {
    pub inner: T,
    pub calls: Arc<AtomicU64>,
    pub in_flight: Arc<AtomicUsize>,
    pub max_in_flight: Arc<AtomicUsize>,
}

impl<T> CountingObjectStore<T> {
    pub fn new(inner: T) -> CountingObjectStore<T> {
        CountingObjectStore {
            inner,
            calls: Arc::default(),
            in_flight: Arc::default(),
            max_in_flight: Arc::default(),
        }
    }

    async fn count<R>(&self, call: impl std::future::Future<Output = R>) -> R {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight.fetch_max(now, Ordering::SeqCst);
        let result = call.await;
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        result
    }
}

impl<T: fmt::Display> fmt::Display for CountingObjectStore<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CountingObjectStore({})", self.inner)
    }
}

#[async_trait]
impl<T: ObjectStore> ObjectStore for CountingObjectStore<T> {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        self.count(self.inner.put_opts(location, payload, opts))
            .await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.count(self.inner.put_multipart_opts(location, opts))
            .await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        self.count(self.inner.get_opts(location, options)).await
    }

    async fn delete(&self, location: &Path) -> Result<()> {
        self.count(self.inner.delete(location)).await
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.count(self.inner.list_with_delimiter(prefix)).await
    }

    async fn copy(&self, from: &Path, to: &Path) -> Result<()> {
        self.count(self.inner.copy(from, to)).await
    }

    async fn copy_if_not_exists(&self, from: &Path, to: &Path) -> Result<()> {
        self.count(self.inner.copy_if_not_exists(from, to)).await
    }
}

/// An environment (`env(name)`) holding only `pairs`, for the credential
/// and endpoint searches.
pub(crate) fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| map.get(k).cloned()
}
