//! Opening a store from a path or URL.
//!
//! Accepted forms: a filesystem path or `file:///abs/path` (the embedded
//! local-directory store, created if missing), `memory://` (in-memory, for
//! tests; gone when the process exits) and `s3://bucket/prefix` (any
//! S3-compatible service; see `s3_config.rs`).

use std::fmt;
use std::ops::Range;
use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use object_store::path::Path;
use object_store::{PutMode, PutOptions, PutPayload, PutResult, UpdateVersion};

use crate::counting_http_connector::{HttpVersionCounts, HttpVersionSnapshot};
use crate::env::SplitMixEntropy;
use crate::error_text::{error_text, ErrorText};
use crate::explaining_object_store::{ExplainingObjectStore, StorePlace};
use crate::layered_object_store::{layer, LayerConfig, Layered, LayeredSnapshot};
use crate::local_reader::{LocalFile, LocalReader};
use crate::recycled_files::{RecycleSnapshot, RecycledFiles, RECYCLE_DIR};
use crate::retry_policy::RetryPolicy;
use crate::retrying_object_store::{gave_up, is_transient, RETRY_LOG_TARGET};
use crate::s3_config::S3Config;
use futures::TryStreamExt;
use object_store::prefix::PrefixStore;
use object_store::ObjectMeta;
use serde::Serialize;

use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::ObjectStore;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store {spec:?}: {reason}")]
    Unusable { spec: String, reason: String },
}

/// A handle on an object store, cheap to clone. Reads, writes and deletes
/// of objects go through its methods (so the embedded store's fast paths
/// stay coherent); listing goes to [`Store::object_store`].
#[derive(Clone)]
pub struct Store {
    inner: Arc<dyn ObjectStore>,
    description: String,
    /// The embedded store's fast paths (and its root directory).
    local_reader: Option<Arc<LocalReader>>,
    /// The embedded store's recycled segment files (for their counters).
    recycle: Option<Arc<RecycledFiles>>,
    /// Responses by HTTP version (S3 stores).
    http_versions: Option<Arc<HttpVersionCounts>>,
    /// The layers' counters.
    layered: Arc<Layered>,
    /// The retry layer's policy (for listings, which it cannot replay).
    retry: RetryPolicy,
    /// For an S3 store: the bucket root and what opening a sibling needs.
    bucket: Option<Arc<Bucket>>,
    /// The embedded store without fault injection: objects may be staged
    /// in files (`staged_files.rs`), written outside the layers.
    stages_files: bool,
}

/// What an S3 store keeps to open the same bucket under another prefix.
struct Bucket {
    root: Arc<dyn ObjectStore>,
    config: S3Config,
    layers: LayerConfig,
}

/// What a store's layers counted.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct StoreStats {
    pub layers: LayeredSnapshot,
    pub http: Option<HttpVersionSnapshot>,
    /// The embedded store's recycled segment files.
    pub recycle: Option<RecycleSnapshot>,
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.description)
    }
}

impl Store {
    /// Opens the store that `spec` names (see the module doc), wrapped in
    /// the layers of `layers` (retries, metrics, a request limit, faults).
    pub async fn open(spec: &str, layers: &LayerConfig) -> Result<Store, StoreError> {
        let unusable = |reason: String| StoreError::Unusable {
            spec: crate::s3_config::redact_secrets(spec),
            reason,
        };
        if spec == "memory://" || spec == "memory:" {
            return Ok(Store::in_memory_with(layers));
        }
        if spec.starts_with("s3://") {
            let env = |k: &str| std::env::var(k).ok();
            return Store::s3(spec, &env, layers).await.map_err(unusable);
        }
        match Store::local_dir(spec) {
            Some(dir) if spec.starts_with("file://") && !dir.starts_with('/') => {
                Err(unusable("a file:// URL needs an absolute path".into()))
            }
            Some(dir) => Store::local_with(FsPath::new(dir), layers).map_err(unusable),
            None => {
                let scheme = spec.split_once("://").map_or(spec, |(scheme, _)| scheme);
                Err(unusable(format!(
                    "the {scheme}:// scheme is not supported; use a directory path, \
                     file:///path, s3://bucket/prefix or memory://"
                )))
            }
        }
    }

    /// The directory `spec` names when it is a local store (a path, or
    /// file:///path); `None` for the other stores.
    pub fn local_dir(spec: &str) -> Option<&str> {
        if spec == "memory://" || spec == "memory:" {
            return None;
        }
        match spec.strip_prefix("file://") {
            Some(dir) => Some(dir),
            None if spec.contains("://") => None,
            None => Some(spec),
        }
    }

    /// An in-memory store (tests), with the default layers.
    pub fn in_memory() -> Store {
        Store::in_memory_with(&LayerConfig::default())
    }

    pub fn in_memory_with(layers: &LayerConfig) -> Store {
        Store::from_object_store(Arc::new(InMemory::new()), "memory://".to_string(), layers)
    }

    /// An S3-compatible store; `env` supplies the environment (see
    /// `s3_config.rs` for what is read). Probes the HTTP version.
    pub async fn s3(
        spec: &str,
        env: &dyn Fn(&str) -> Option<String>,
        layers: &LayerConfig,
    ) -> Result<Store, String> {
        let config = S3Config::parse(spec, env)?;
        let counts = Arc::new(HttpVersionCounts::default());
        let (raw_root, _http2) = config.connect(counts.clone()).await?;
        let bucket_root: Arc<dyn ObjectStore> =
            Arc::new(ExplainingObjectStore::new(raw_root, config.place()));
        let bucket = Arc::new(Bucket {
            root: bucket_root,
            config,
            layers: layers.clone(),
        });
        let mut store = Store::in_bucket(&bucket);
        store.http_versions = Some(counts);
        Ok(store)
    }

    /// The store of `bucket` under its configured prefix.
    fn in_bucket(bucket: &Arc<Bucket>) -> Store {
        let prefix = bucket.config.prefix.as_str();
        let inner: Arc<dyn ObjectStore> = if prefix.is_empty() {
            bucket.root.clone()
        } else {
            Arc::new(PrefixStore::new(bucket.root.clone(), prefix))
        };
        let mut store = Store::from_object_store(inner, bucket.config.describe(), &bucket.layers);
        store.bucket = Some(bucket.clone());
        store
    }

    /// The prefix of an S3 store inside its bucket (`""`: the bucket's
    /// root); `None` for other stores.
    pub fn bucket_prefix(&self) -> Option<&str> {
        self.bucket.as_ref().map(|b| b.config.prefix.as_str())
    }

    /// The same bucket under `prefix` (an S3 store only): where a clone's
    /// parent lives when it is under another prefix.
    pub fn sibling(&self, prefix: &str) -> Result<Store, String> {
        let Some(bucket) = &self.bucket else {
            return Err(format!(
                "{} is not an S3 store: only S3 volumes can have a parent under another prefix",
                self.description
            ));
        };
        let prefix = prefix.trim_matches('/');
        if prefix == bucket.config.prefix {
            return Ok(self.clone());
        }
        let mut config = bucket.config.clone();
        config.prefix = prefix.to_string();
        let other = Arc::new(Bucket {
            root: bucket.root.clone(),
            config,
            layers: bucket.layers.clone(),
        });
        let mut store = Store::in_bucket(&other);
        store.http_versions = self.http_versions.clone();
        Ok(store)
    }

    /// The embedded store: a local directory, created if missing, with the
    /// default layers.
    pub fn local(dir: &FsPath) -> Result<Store, String> {
        Store::local_with(dir, &LayerConfig::default())
    }

    /// The embedded store with `layers`. Its reads bypass them (see
    /// `local_reader.rs`): faults are injected into writes only.
    pub fn local_with(dir: &FsPath, layers: &LayerConfig) -> Result<Store, String> {
        let dir = absolute(dir)?;
        if dir.exists() && !dir.is_dir() {
            return Err(format!(
                "{} exists and is not a directory: give --store a directory (created if missing), file:///path or s3://bucket/prefix",
                dir.display()
            ));
        }
        std::fs::create_dir_all(&dir).map_err(|e| {
            format!(
                "cannot create directory {}: {}",
                dir.display(),
                error_text(&e)
            )
        })?;
        let fs = LocalFileSystem::new_with_prefix(&dir).map_err(|e| {
            format!(
                "cannot open directory {}: {}",
                dir.display(),
                error_text(&e)
            )
        })?;
        let place = StorePlace::Local { root: dir.clone() };
        // Recycling is an optimisation: a pool that cannot be opened (a
        // read-only store, a full disk) leaves the store as it was.
        let recycle = RecycledFiles::open(&dir, layers.recycle_bytes, layers.recycle_min_bytes)
            .unwrap_or_else(|e| {
                // A read-only or full store fails its writes with their own
                // clear error; a line about the pool would only add noise.
                let quiet = matches!(
                    e.raw_os_error(),
                    Some(libc::EROFS | libc::EACCES | libc::EPERM | libc::ENOSPC)
                );
                if quiet {
                    tracing::debug!(store = %dir.display(), error = %error_text(&e), "cannot open {RECYCLE_DIR}: deleted segments' files are unlinked, not recycled");
                } else {
                    tracing::warn!(store = %dir.display(), error = %error_text(&e), "cannot open {RECYCLE_DIR}: deleted segments' files are unlinked, not recycled");
                }
                None
            });
        let mut fs = crate::durable_local_store::DurableLocalStore::new(Arc::new(fs), dir.clone());
        if let Some(r) = &recycle {
            fs = fs.with_recycling(r.clone());
        }
        let fs: Arc<dyn ObjectStore> = Arc::new(ExplainingObjectStore::new(fs, place));
        let mut store = Store::from_object_store(fs, format!("file://{}", dir.display()), layers);
        store.local_reader = Some(Arc::new(LocalReader::new(dir)));
        store.recycle = recycle;
        // Staged files are written outside the layers: a store that
        // injects faults into writes keeps every write going through them.
        store.stages_files = layers.faults.is_none();
        Ok(store)
    }

    /// Wraps an object store in `layers` (any backend).
    pub fn from_object_store(
        inner: Arc<dyn ObjectStore>,
        description: String,
        layers: &LayerConfig,
    ) -> Store {
        let layered = layer(inner, layers);
        Store {
            retry: layers.retry.clone(),
            inner: layered.store.clone(),
            description,
            local_reader: None,
            recycle: None,
            http_versions: None,
            layered: Arc::new(layered),
            bucket: None,
            stages_files: false,
        }
    }

    /// Counters of every layer, and responses by HTTP version.
    pub fn stats(&self) -> StoreStats {
        StoreStats {
            layers: self.layered.snapshot(),
            http: self.http_versions(),
            recycle: self.recycle.as_ref().map(|r| r.snapshot()),
        }
    }

    /// Reads `range` of an object (a `pread` for the embedded store). An
    /// empty range is empty bytes, with no request, on every backend: S3
    /// clients and the in-memory store refuse a GET of zero bytes, and a
    /// segment sealed empty has zero bytes of tables.
    pub async fn get_range(
        &self,
        location: &Path,
        range: Range<u64>,
    ) -> object_store::Result<Bytes> {
        if range.is_empty() {
            return Ok(Bytes::new());
        }
        match &self.local_reader {
            Some(r) => r.read_range(location, range),
            None => self.inner.get_range(location, range).await,
        }
    }

    /// For the embedded store: the object, open (a cached descriptor) for
    /// a reader that `pread`s runs of it into its own buffers (no
    /// allocation per read); `None` for other stores. Errors as
    /// `get_range`'s.
    pub fn local_file(&self, location: &Path) -> Option<object_store::Result<LocalFile>> {
        self.local_reader.as_ref().map(|r| r.open(location))
    }

    /// Writes an object. Acknowledged means durable, on every store: S3
    /// acknowledges durable writes, and the embedded store syncs the bytes
    /// before the name and the name before it answers
    /// (`durable_local_store.rs`).
    pub async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        let result = self.inner.put_opts(location, payload, opts).await;
        if let Some(r) = &self.local_reader {
            r.invalidate(location);
        }
        result
    }

    /// Reads a whole object and its version (`None` if it does not exist),
    /// for a later [`Store::put_if`].
    pub async fn get_versioned(
        &self,
        location: &Path,
    ) -> object_store::Result<Option<(Bytes, UpdateVersion)>> {
        let got = match self.inner.get(location).await {
            Ok(g) => g,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        let version = UpdateVersion {
            e_tag: got.meta.e_tag.clone(),
            version: got.meta.version.clone(),
        };
        Ok(Some((got.bytes().await?, version)))
    }

    /// Writes an object only if it is still as the caller last saw it:
    /// absent (`expected` = `None`, an If-None-Match PUT) or at version
    /// `expected` (an If-Match PUT). A conflict is
    /// `object_store::Error::AlreadyExists` or `Precondition`. Returns the
    /// new version.
    ///
    /// The embedded store's filesystem cannot compare-and-swap; there the
    /// swap runs under an exclusive `flock` on `<root>/.strata-cas.lock`,
    /// which every strata process using that directory takes.
    pub async fn put_if(
        &self,
        location: &Path,
        payload: PutPayload,
        expected: Option<&UpdateVersion>,
    ) -> object_store::Result<UpdateVersion> {
        let (Some(reader), Some(version)) = (&self.local_reader, expected) else {
            let mode = match expected {
                None => PutMode::Create,
                Some(v) => PutMode::Update(v.clone()),
            };
            let opts = PutOptions {
                mode,
                ..PutOptions::default()
            };
            return self.put_opts(location, payload, opts).await.map(Into::into);
        };
        let _lock = reader
            .cas_lock()
            .await
            .map_err(|e| object_store::Error::Generic {
                store: "LocalFileSystem",
                source: Box::new(e),
            })?;
        let current = match self.inner.head(location).await {
            Ok(meta) => meta.e_tag,
            Err(object_store::Error::NotFound { .. }) => None,
            Err(e) => return Err(e),
        };
        if current.is_none() || current != version.e_tag {
            return Err(object_store::Error::Precondition {
                path: location.to_string(),
                source: "the object changed since it was read".into(),
            });
        }
        self.put_opts(location, payload, PutOptions::default())
            .await
            .map(Into::into)
    }

    /// Lists every object under `prefix`. A listing is a stream the retry
    /// layer cannot replay, so the whole listing is retried here on a
    /// transient error (same policy).
    pub async fn list_all(&self, prefix: &Path) -> object_store::Result<Vec<ObjectMeta>> {
        self.list_between(prefix, None, None).await
    }

    /// Lists the objects under `prefix` whose location is after `after`
    /// (everything when `None`) and before `before` (no bound when
    /// `None`), in location order for the stores that list in order (S3:
    /// the listing stops paging at `before`). Retried like `list_all`.
    pub async fn list_between(
        &self,
        prefix: &Path,
        after: Option<&Path>,
        before: Option<&Path>,
    ) -> object_store::Result<Vec<ObjectMeta>> {
        let entropy = SplitMixEntropy::from_clock();
        let started = std::time::Instant::now();
        let mut attempt = 1u32;
        let below = |m: &ObjectMeta| before.is_none_or(|b| m.location.as_ref() < b.as_ref());
        loop {
            let stream = match after {
                Some(a) => self.inner.list_with_offset(Some(prefix), a),
                None => self.inner.list(Some(prefix)),
            };
            // Unordered listings (a local directory) are filtered whole.
            let ordered = !self.is_local();
            let listed: object_store::Result<Vec<ObjectMeta>> = if ordered {
                stream
                    .try_take_while(|m| futures::future::ready(Ok(below(m))))
                    .try_collect()
                    .await
            } else {
                stream
                    .try_filter(|m| futures::future::ready(below(m)))
                    .try_collect()
                    .await
            };
            let e = match listed {
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            let elapsed_ms = started.elapsed().as_millis() as u64;
            if !is_transient(&e) {
                return Err(e);
            }
            if attempt >= self.retry.max_attempts || elapsed_ms >= self.retry.deadline_ms {
                return Err(gave_up(e, attempt, elapsed_ms));
            }
            let delay_ms = self.retry.backoff_delay_ms(attempt, &entropy);
            tracing::warn!(target: RETRY_LOG_TARGET, volume = %crate::names::volume_of(prefix), path = %prefix, attempt, delay_ms, error = %ErrorText(&e), "store list failed; retrying");
            tokio::time::sleep(std::time::Duration::from_millis(delay_ms)).await;
            attempt += 1;
        }
    }

    /// Deletes an object.
    pub async fn delete(&self, location: &Path) -> object_store::Result<()> {
        if let Some(r) = &self.local_reader {
            r.invalidate(location);
        }
        self.inner.delete(location).await
    }

    /// Makes an object survive power loss. The local filesystem store of
    /// `object_store` renames (or hard-links) a staging file into place
    /// without `fsync`; strata releases journal space once an object is
    /// stored, so for the embedded store it syncs the file and its directory
    /// ([`Store::put_opts`] writes durably itself; recovery and retries that
    /// find an object already there, perhaps left by a process killed
    /// before it synced, call this for it). Remote stores acknowledge
    /// durable writes; nothing to do there.
    pub async fn make_durable(&self, location: &Path) -> std::io::Result<()> {
        let Some(reader) = &self.local_reader else {
            return Ok(());
        };
        let file = reader.root().join(location.as_ref());
        tokio::task::spawn_blocking(move || {
            std::fs::File::open(&file)?.sync_all()?;
            if let Some(dir) = file.parent() {
                std::fs::File::open(dir)?.sync_all()?;
            }
            Ok(())
        })
        .await
        .map_err(std::io::Error::other)?
    }

    /// Whether objects can be staged in files (`staged_files.rs`): the
    /// embedded store, when no layer injects faults into writes.
    pub fn stages_files(&self) -> bool {
        self.stages_files
    }

    /// Creates the staged file of the object at `location` (`None` when
    /// the store does not stage files). Blocking.
    pub fn create_staged(
        &self,
        location: &Path,
        tag: u64,
    ) -> Option<std::io::Result<crate::StagedFile>> {
        let reader = self.local_reader.as_ref().filter(|_| self.stages_files)?;
        Some(crate::StagedFile::create(
            reader,
            self.recycle.as_deref(),
            location,
            tag,
        ))
    }

    /// Opens the staged file of `location` with `tag` for reading
    /// (`None` for a store without files). Blocking.
    pub fn open_staged(&self, location: &Path, tag: u64) -> Option<std::io::Result<std::fs::File>> {
        let reader = self.local_reader.as_ref()?;
        Some(crate::staged_files::open_staged(
            reader.root(),
            location,
            tag,
        ))
    }

    /// The staged files under `prefix` (a directory): object name, tag and
    /// staging path; empty for a store without files. Blocking.
    pub fn list_staged(
        &self,
        prefix: &Path,
    ) -> std::io::Result<Vec<(String, u64, std::path::PathBuf)>> {
        match &self.local_reader {
            Some(r) => crate::staged_files::list_staged(&r.root().join(prefix.as_ref())),
            None => Ok(Vec::new()),
        }
    }

    /// The underlying object store.
    pub fn object_store(&self) -> &Arc<dyn ObjectStore> {
        &self.inner
    }

    /// Responses received by HTTP version, for stores that speak HTTP.
    pub fn http_versions(&self) -> Option<HttpVersionSnapshot> {
        self.http_versions.as_ref().map(|c| c.snapshot())
    }

    /// Whether this is the embedded local-directory store (whose reads are
    /// page-cache `pread`s: read-ahead and a disk cache tier buy nothing).
    pub fn is_local(&self) -> bool {
        self.local_reader.is_some()
    }

    /// What the store is, for messages (never contains credentials).
    pub fn description(&self) -> &str {
        &self.description
    }
}

fn absolute(dir: &FsPath) -> Result<PathBuf, String> {
    if dir.as_os_str().is_empty() {
        return Err(
            "empty store path: give --store a directory, file:///path or s3://bucket/prefix"
                .to_string(),
        );
    }
    std::path::absolute(dir).map_err(|e| format!("cannot resolve {}: {e}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn opens_paths_and_rejects_what_it_cannot_use() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("store");
        let l = LayerConfig::default();
        let s = Store::open(dir.to_str().unwrap(), &l).await.unwrap();
        assert!(dir.is_dir());
        assert!(s.description().starts_with("file:///"));
        let url = format!("file://{}", dir.display());
        assert!(Store::open(&url, &l).await.is_ok());
        let file = tmp.path().join("f");
        std::fs::write(&file, b"x").unwrap();
        let err = Store::open(file.to_str().unwrap(), &l)
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a directory"), "{err}");
        let err = Store::open("gopher://x/y", &l)
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("not supported"), "{err}");
        assert!(Store::open("memory://", &l).await.is_ok());
    }
}
