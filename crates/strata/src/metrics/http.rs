//! The `/metrics` endpoint: a tiny HTTP/1.1 server (hyper, already in the
//! tree through the S3 client) answering `GET /metrics` and 404 to
//! anything else. One request per connection (no keep-alive), at most
//! [`MAX_CONNECTIONS`] at once (more are closed at once), each bounded by
//! [`CONNECTION_TIMEOUT`]: a slow or idle client cannot pin the server's
//! memory or tasks.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{ACCEPT, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use super::classic_text::{to_classic, CLASSIC_CONTENT_TYPE};

/// Scrapes served at once; Prometheus sends one at a time per target.
pub const MAX_CONNECTIONS: usize = 8;
/// Longest a connection may take, from accept to the response sent.
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(10);

const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Serves `registry` on `listener` until the task is aborted.
pub async fn serve(listener: TcpListener, registry: Arc<Registry>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                tracing::warn!(error = %strata_store::ErrorText(&e), "metrics endpoint: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            tracing::debug!("metrics endpoint: too many connections; closing one");
            continue;
        };
        let registry = Arc::clone(&registry);
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let registry = Arc::clone(&registry);
                async move { Ok::<_, Infallible>(answer(&request, &registry)) }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .keep_alive(false)
                .timer(TokioTimer::new())
                .header_read_timeout(CONNECTION_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            if let Ok(Err(e)) = tokio::time::timeout(CONNECTION_TIMEOUT, connection).await {
                tracing::debug!(error = %strata_store::ErrorText(&e), "metrics endpoint: connection failed");
            }
            drop(slot);
        });
    }
}

/// The response to one request.
fn answer(request: &Request<Incoming>, registry: &Registry) -> Response<Full<Bytes>> {
    if request.uri().path() != "/metrics" {
        return plain(
            StatusCode::NOT_FOUND,
            "not found: metrics are at /metrics\n",
        );
    }
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return plain(StatusCode::METHOD_NOT_ALLOWED, "use GET /metrics\n");
    }
    let mut text = String::with_capacity(64 * 1024);
    if let Err(e) = prometheus_client::encoding::text::encode(&mut text, registry) {
        tracing::warn!(error = %strata_store::ErrorText(&e), "metrics endpoint: cannot encode the metrics");
        return plain(
            StatusCode::INTERNAL_SERVER_ERROR,
            "cannot encode the metrics\n",
        );
    }
    let (content_type, body) = match wants_openmetrics(request) {
        true => (OPENMETRICS_CONTENT_TYPE, text),
        false => (CLASSIC_CONTENT_TYPE, to_classic(&text)),
    };
    response(StatusCode::OK, content_type, body)
}

/// Whether the client's Accept header asks for OpenMetrics (Prometheus
/// does); anyone else gets the classic text format.
fn wants_openmetrics(request: &Request<Incoming>) -> bool {
    request
        .headers()
        .get_all(ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("application/openmetrics-text"))
}

fn plain(status: StatusCode, text: &str) -> Response<Full<Bytes>> {
    response(status, "text/plain; charset=utf-8", text.to_string())
}

fn response(status: StatusCode, content_type: &str, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if let Ok(value) = content_type.parse() {
        response.headers_mut().insert(CONTENT_TYPE, value);
    }
    response
}
