//! Turning a store's raw errors into [`StoreFailure`]s a person can act on.
//!
//! This module owns [`ExplainingObjectStore`], the innermost wrapper of a
//! store, and the rules that read an object_store error and say what it
//! means for this store ([`StorePlace`]: the S3 endpoint, bucket and where
//! the credentials came from, or the local directory):
//!
//! * no connection -> "cannot connect to ENDPOINT (bucket B): connection
//!   refused; check ...", transient (retried);
//! * 401/403 -> which of key ID, secret, session token or permission is
//!   wrong, and where the credentials came from; never retried;
//! * 404 NoSuchBucket -> the bucket does not exist (also for a GET, which
//!   object_store reports as an object not found); never retried;
//! * a wrong region, another 4xx -> said with S3's code; never retried;
//! * 5xx, 429 -> the service is overloaded or failing, transient;
//! * the local disk full or not writable -> said with the directory.
//!
//! Conditional-write answers (412, 409, 304) and a missing object (404)
//! pass unchanged: callers match them. An explained error keeps object_store's
//! variant where callers match it (`PermissionDenied`, `Unauthenticated`);
//! others become `Generic` with the failure as source. object_store's own
//! text goes to the debug log.

use std::fmt;
use std::ops::Range;
use std::path::PathBuf;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::{BoxStream, StreamExt};
use object_store::client::HttpErrorKind;
use object_store::path::Path;
use object_store::{
    Error, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, Result,
};

use crate::store_failure::{
    failed_request, http_reply, io_kind, root_cause, transport_kind, FailureKind, HttpReply,
    StoreFailure,
};

/// Where a store is, for messages.
#[derive(Debug, Clone)]
pub enum StorePlace {
    S3 {
        /// The endpoint URL as a person would recognise it.
        endpoint: String,
        bucket: String,
        region: String,
        /// Where the credentials came from ("environment", a file, ...).
        credentials: String,
        /// What to check when it cannot be reached.
        endpoint_hint: String,
    },
    Local {
        root: PathBuf,
    },
}

/// Explains the inner store's errors (see the module doc).
#[derive(Debug)]
pub struct ExplainingObjectStore<T: ObjectStore> {
    inner: T,
    place: StorePlace,
}

impl<T: ObjectStore> ExplainingObjectStore<T> {
    pub fn new(inner: T, place: StorePlace) -> ExplainingObjectStore<T> {
        ExplainingObjectStore { inner, place }
    }

    fn explain(&self, error: Error, location: &str) -> Error {
        explain(&self.place, error, location)
    }

    fn explain_listing(
        &self,
        listing: BoxStream<'static, Result<ObjectMeta>>,
        prefix: Option<&Path>,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        let place = self.place.clone();
        let prefix = prefix.map(|p| p.to_string()).unwrap_or_default();
        listing
            .map(move |item| item.map_err(|e| explain(&place, e, &prefix)))
            .boxed()
    }
}

/// `error` explained for `place`, or unchanged if it needs no words.
pub fn explain(place: &StorePlace, error: Error, location: &str) -> Error {
    // Answers callers ask for (a conditional write refused) or handle (an
    // object missing from a local store) need no words: they are frequent
    // (lease and manifest races, cache misses), so return before any text
    // is made. An S3 404 is read on: it may say the bucket is missing.
    let expected = match &error {
        Error::AlreadyExists { .. } | Error::Precondition { .. } | Error::NotModified { .. } => {
            true
        }
        Error::NotFound { .. } => matches!(place, StorePlace::Local { .. }),
        _ => false,
    };
    if expected {
        return error;
    }
    let failure = match place {
        StorePlace::S3 { .. } => explain_s3(place, &error),
        StorePlace::Local { root } => explain_local(root, &error),
    };
    let Some(failure) = failure else {
        return error;
    };
    tracing::debug!(error = %error, explained = %failure, "store error");
    let path = path_of(&error).unwrap_or(location).to_string();
    let store = match (&error, place) {
        (Error::Generic { store, .. }, _) => store,
        (_, StorePlace::S3 { .. }) => "S3",
        (_, StorePlace::Local { .. }) => "LocalFileSystem",
    };
    let source = Box::new(failure);
    match source.kind {
        FailureKind::Unauthenticated => Error::Unauthenticated { path, source },
        FailureKind::Denied | FailureKind::NotWritable => Error::PermissionDenied { path, source },
        _ => Error::Generic { store, source },
    }
}

fn path_of(error: &Error) -> Option<&str> {
    match error {
        Error::NotFound { path, .. }
        | Error::AlreadyExists { path, .. }
        | Error::Precondition { path, .. }
        | Error::NotModified { path, .. }
        | Error::PermissionDenied { path, .. }
        | Error::Unauthenticated { path, .. } => Some(path),
        _ => None,
    }
}

fn explain_s3(place: &StorePlace, error: &Error) -> Option<StoreFailure> {
    let StorePlace::S3 {
        endpoint,
        bucket,
        endpoint_hint,
        ..
    } = place
    else {
        return None;
    };
    if let Some((_, url)) = failed_request(error).filter(|(_, u)| is_metadata_url(u)) {
        return metadata_failure(error, &url, error.to_string());
    }
    if let Some(reply) = http_reply(error) {
        let (kind, message) = s3_reply(place, &reply)?;
        return Some(StoreFailure::new(kind, message, error.to_string()));
    }
    let transport = transport_kind(error)?;
    let cause = root_cause(error);
    let (kind, message) = match transport {
        HttpErrorKind::Connect => (
            FailureKind::Unreachable,
            format!("cannot connect to {endpoint} (bucket {bucket:?}): {cause}; {endpoint_hint}"),
        ),
        HttpErrorKind::Timeout => (
            FailureKind::TimedOut,
            format!(
                "no answer in time from {endpoint} (bucket {bucket:?}): {cause}; {endpoint_hint}"
            ),
        ),
        _ => return None,
    };
    Some(StoreFailure::new(kind, message, error.to_string()))
}

/// The instance metadata service (IMDS) of EC2: where a role's credentials
/// are fetched (and refreshed) from.
fn is_metadata_url(url: &str) -> bool {
    url.contains("/latest/api/token") || url.contains("/latest/meta-data/")
}

fn metadata_failure(error: &Error, url: &str, detail: String) -> Option<StoreFailure> {
    let base = url.split("/latest/").next().unwrap_or(url);
    let advice =
        "attach an IAM role to the instance, or set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY";
    let (kind, what) = match (http_reply(error), transport_kind(error)) {
        (Some(r), _) if (400..500).contains(&r.status) => (
            FailureKind::Unauthenticated,
            format!("it answered {}", r.status),
        ),
        (Some(r), _) => (FailureKind::TimedOut, format!("it answered {}", r.status)),
        (None, Some(HttpErrorKind::Connect)) => (FailureKind::Unreachable, root_cause(error)),
        (None, _) => (FailureKind::TimedOut, root_cause(error)),
    };
    Some(StoreFailure::new(
        kind,
        format!("cannot get S3 credentials from the instance metadata at {base}: {what}; {advice}"),
        detail,
    ))
}

/// What an S3 error reply means; `None` for replies callers handle (404 of
/// an object, 409, 412, 304) and S3's 400 RequestTimeout (retried as it is).
fn s3_reply(place: &StorePlace, reply: &HttpReply) -> Option<(FailureKind, String)> {
    let StorePlace::S3 {
        endpoint,
        bucket,
        region,
        credentials,
        ..
    } = place
    else {
        return None;
    };
    let code = reply.code.as_deref().unwrap_or("");
    let said = match (&reply.code, &reply.message) {
        (Some(c), Some(m)) => format!("{} {c}: {m}", reply.status),
        (Some(c), None) => format!("{} {c}", reply.status),
        _ => reply.status.to_string(),
    };
    let region_advice = format!(
        "the bucket is not in region {region}: set region= in the store URL or AWS_REGION ({said})"
    );
    Some(match (reply.status, code) {
        (401 | 403, "InvalidAccessKeyId") => (
            FailureKind::Unauthenticated,
            format!("{endpoint} does not know the access key ID from {credentials} ({said}): check AWS_ACCESS_KEY_ID or the profile's aws_access_key_id"),
        ),
        (401 | 403, "SignatureDoesNotMatch") => (
            FailureKind::Unauthenticated,
            format!("{endpoint} rejects the request signature ({said}): the secret access key from {credentials} does not belong to its access key ID; check AWS_SECRET_ACCESS_KEY or the profile's aws_secret_access_key"),
        ),
        (401 | 403, "ExpiredToken" | "TokenRefreshRequired" | "InvalidToken") => (
            FailureKind::Unauthenticated,
            format!("the session token from {credentials} is expired or not valid ({said}): get new credentials"),
        ),
        (401, _) => (
            FailureKind::Unauthenticated,
            format!("{endpoint} does not accept the credentials from {credentials} ({said}): check them"),
        ),
        (403, _) => (
            FailureKind::Denied,
            format!("{endpoint} denies the credentials from {credentials} access to bucket {bucket:?} ({said}): allow them s3:ListBucket on the bucket and s3:GetObject, s3:PutObject and s3:DeleteObject on its objects"),
        ),
        (404, "NoSuchBucket") => (
            FailureKind::NoSuchBucket,
            format!("bucket {bucket:?} does not exist at {endpoint}: create it (e.g. `aws s3 mb s3://{bucket}` or `mc mb ALIAS/{bucket}`) or correct the store URL"),
        ),
        (301 | 307, _) | (400, "AuthorizationHeaderMalformed" | "IllegalLocationConstraintException") => {
            (FailureKind::Rejected, region_advice)
        }
        (400, "RequestTimeout") => return None,
        (429 | 500..=599, _) => (
            FailureKind::ServerError,
            format!("{endpoint} (bucket {bucket:?}) answered {}{}: the service is overloaded or failing; try again later, or look at the service", status_text(reply.status), s3_code(reply)),
        ),
        (400, _) => (
            FailureKind::Rejected,
            format!("{endpoint} rejects the request ({said})"),
        ),
        _ => return None,
    })
}

/// " (CODE: MESSAGE)" of an S3 error reply, or nothing.
fn s3_code(reply: &HttpReply) -> String {
    match (&reply.code, &reply.message) {
        (Some(c), Some(m)) => format!(" ({c}: {m})"),
        (Some(c), None) => format!(" ({c})"),
        _ => String::new(),
    }
}

/// "503 Service Unavailable".
fn status_text(status: u16) -> String {
    match http::StatusCode::from_u16(status) {
        Ok(s) => s.to_string(),
        Err(_) => status.to_string(),
    }
}

fn explain_local(root: &std::path::Path, error: &Error) -> Option<StoreFailure> {
    let root = root.display();
    let kind = io_kind(error)?;
    let cause = root_cause(error);
    let (kind, message) = match kind {
        std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded => (
            FailureKind::DiskFull,
            format!("the disk holding the store {root} is full ({cause}): free space there, or use a store on another disk"),
        ),
        std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem => (
            FailureKind::NotWritable,
            format!("cannot write the store {root} ({cause}): make it writable by this user, or give another --store"),
        ),
        _ => return None,
    };
    Some(StoreFailure::new(kind, message, error.to_string()))
}

impl<T: ObjectStore> fmt::Display for ExplainingObjectStore<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ExplainingObjectStore({})", self.inner)
    }
}

#[async_trait]
impl<T: ObjectStore> ObjectStore for ExplainingObjectStore<T> {
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
        let result = self.inner.put_opts(location, payload, opts).await;
        result.map_err(|e| self.explain(e, location.as_ref()))
    }

    async fn put_multipart(&self, location: &Path) -> Result<Box<dyn MultipartUpload>> {
        let result = self.inner.put_multipart(location).await;
        result.map_err(|e| self.explain(e, location.as_ref()))
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        let result = self.inner.put_multipart_opts(location, opts).await;
        result.map_err(|e| self.explain(e, location.as_ref()))
    }

    async fn get(&self, location: &Path) -> Result<GetResult> {
        self.get_opts(location, GetOptions::default()).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        let result = self.inner.get_opts(location, options).await;
        result.map_err(|e| self.explain(e, location.as_ref()))
    }

    async fn get_range(&self, location: &Path, range: Range<u64>) -> Result<Bytes> {
        let result = self.inner.get_range(location, range).await;
        result.map_err(|e| self.explain(e, location.as_ref()))
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        let result = self.inner.get_ranges(location, ranges).await;
        result.map_err(|e| self.explain(e, location.as_ref()))
    }

    async fn head(&self, location: &Path) -> Result<ObjectMeta> {
        let result = self.inner.head(location).await;
        result.map_err(|e| self.explain(e, location.as_ref()))
    }

    async fn delete(&self, location: &Path) -> Result<()> {
        let result = self.inner.delete(location).await;
        result.map_err(|e| self.explain(e, location.as_ref()))
    }

    fn delete_stream<'a>(
        &'a self,
        locations: BoxStream<'a, Result<Path>>,
    ) -> BoxStream<'a, Result<Path>> {
        self.inner
            .delete_stream(locations)
            .map(move |item| item.map_err(|e| self.explain(e, "")))
            .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.explain_listing(self.inner.list(prefix), prefix)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        self.explain_listing(self.inner.list_with_offset(prefix, offset), prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        let result = self.inner.list_with_delimiter(prefix).await;
        let location = prefix.map(|p| p.to_string()).unwrap_or_default();
        result.map_err(|e| self.explain(e, &location))
    }

    async fn copy(&self, from: &Path, to: &Path) -> Result<()> {
        let result = self.inner.copy(from, to).await;
        result.map_err(|e| self.explain(e, to.as_ref()))
    }

    async fn rename(&self, from: &Path, to: &Path) -> Result<()> {
        let result = self.inner.rename(from, to).await;
        result.map_err(|e| self.explain(e, to.as_ref()))
    }

    async fn copy_if_not_exists(&self, from: &Path, to: &Path) -> Result<()> {
        let result = self.inner.copy_if_not_exists(from, to).await;
        result.map_err(|e| self.explain(e, to.as_ref()))
    }

    async fn rename_if_not_exists(&self, from: &Path, to: &Path) -> Result<()> {
        let result = self.inner.rename_if_not_exists(from, to).await;
        result.map_err(|e| self.explain(e, to.as_ref()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s3_place() -> StorePlace {
        StorePlace::S3 {
            endpoint: "http://127.0.0.1:9".into(),
            bucket: "vols".into(),
            region: "us-east-1".into(),
            credentials: "environment".into(),
            endpoint_hint: "check the endpoint".into(),
        }
    }

    fn reply(status: u16, code: Option<&str>) -> HttpReply {
        HttpReply {
            status,
            code: code.map(String::from),
            message: None,
        }
    }

    #[test]
    fn auth_and_bucket_replies_are_explained_and_permanent() {
        let p = s3_place();
        for (status, code, kind, says) in [
            (
                403,
                Some("InvalidAccessKeyId"),
                FailureKind::Unauthenticated,
                "access key ID from environment",
            ),
            (
                403,
                Some("SignatureDoesNotMatch"),
                FailureKind::Unauthenticated,
                "secret access key",
            ),
            (
                403,
                Some("AccessDenied"),
                FailureKind::Denied,
                "s3:ListBucket",
            ),
            (403, None, FailureKind::Denied, "denies"),
            (401, None, FailureKind::Unauthenticated, "does not accept"),
            (
                404,
                Some("NoSuchBucket"),
                FailureKind::NoSuchBucket,
                "bucket \"vols\" does not exist",
            ),
            (301, None, FailureKind::Rejected, "region"),
            (
                400,
                Some("InvalidArgument"),
                FailureKind::Rejected,
                "400 InvalidArgument",
            ),
            (
                503,
                Some("SlowDown"),
                FailureKind::ServerError,
                "503 Service Unavailable (SlowDown)",
            ),
            (500, None, FailureKind::ServerError, "overloaded or failing"),
        ] {
            let (k, message) = s3_reply(&p, &reply(status, code)).unwrap();
            assert_eq!(k, kind, "{status} {code:?}");
            assert_eq!(k.is_transient(), status >= 500, "{status}");
            assert!(message.contains(says), "{status} {code:?}: {message}");
        }
        for (status, code) in [
            (404, Some("NoSuchKey")),
            (412, None),
            (409, None),
            (400, Some("RequestTimeout")),
        ] {
            assert!(s3_reply(&p, &reply(status, code)).is_none(), "{status}");
        }
    }

    #[test]
    fn a_full_local_disk_is_said_with_the_directory() {
        let place = StorePlace::Local {
            root: PathBuf::from("/srv/store"),
        };
        let e = Error::Generic {
            store: "LocalFileSystem",
            source: Box::new(std::io::Error::from(std::io::ErrorKind::StorageFull)),
        };
        let explained = explain(&place, e, "v/manifest");
        let text = explained.to_string();
        assert!(
            text.contains("/srv/store") && text.contains("full"),
            "{text}"
        );
        assert_eq!(
            StoreFailure::find(&explained).map(|f| f.kind),
            Some(FailureKind::DiskFull)
        );
    }
}
