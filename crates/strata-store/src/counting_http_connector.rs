//! An HTTP connector that counts responses by HTTP version.
//!
//! Owns the proof that connections to an S3 service are what we think they
//! are: the seeds lost 84% of their CPU to a TLS handshake per request, and
//! HTTP/2 (one multiplexed connection) must be used when the server offers
//! it. Rather than assume, strata counts the protocol version of every
//! response the S3 client receives and exports the counts.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpRequest, HttpResponse, HttpService, ReqwestConnector,
};
use object_store::ClientOptions;
use serde::Serialize;

/// Responses received, by HTTP version.
#[derive(Debug, Default)]
pub struct HttpVersionCounts {
    http1: AtomicU64,
    http2: AtomicU64,
    other: AtomicU64,
}

/// A snapshot of [`HttpVersionCounts`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct HttpVersionSnapshot {
    pub http1_responses: u64,
    pub http2_responses: u64,
    pub other_responses: u64,
}

impl HttpVersionCounts {
    fn record(&self, version: http::Version) {
        let counter = match version {
            http::Version::HTTP_10 | http::Version::HTTP_11 => &self.http1,
            http::Version::HTTP_2 => &self.http2,
            _ => &self.other,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> HttpVersionSnapshot {
        HttpVersionSnapshot {
            http1_responses: self.http1.load(Ordering::Relaxed),
            http2_responses: self.http2.load(Ordering::Relaxed),
            other_responses: self.other.load(Ordering::Relaxed),
        }
    }
}

/// Builds object_store's reqwest client and wraps it with the counter.
#[derive(Debug, Default)]
pub struct CountingHttpConnector {
    counts: Arc<HttpVersionCounts>,
}

impl CountingHttpConnector {
    pub fn new(counts: Arc<HttpVersionCounts>) -> Self {
        CountingHttpConnector { counts }
    }
}

impl HttpConnector for CountingHttpConnector {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        let inner = ReqwestConnector::default().connect(options)?;
        Ok(HttpClient::new(CountingService {
            inner,
            counts: self.counts.clone(),
        }))
    }
}

#[derive(Debug)]
struct CountingService {
    inner: HttpClient,
    counts: Arc<HttpVersionCounts>,
}

#[async_trait::async_trait]
impl HttpService for CountingService {
    async fn call(&self, req: HttpRequest) -> Result<HttpResponse, HttpError> {
        let response = self.inner.execute(req).await?;
        self.counts.record(response.version());
        Ok(response)
    }
}
