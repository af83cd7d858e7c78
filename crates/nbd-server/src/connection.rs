//! One client connection from accept to close: the handshake (bounded by
//! the handshake timeout, abandoned on shutdown; with STARTTLS, the TLS
//! handshake and the options after it too), then transmission, in
//! plaintext or inside TLS, with the connect/disconnect log lines.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::budget::ByteBudget;
use crate::config::ServerConfig;
use crate::device::ExportProvider;
use crate::export::Export;
use crate::handshake::{self, HandshakeClock, Outcome, Security};
use crate::listen::{Accepted, SplitStream};
use crate::metrics::NbdMetrics;
use crate::tls::Tls;
use crate::transmission::{self, End};

/// What every connection of a server shares.
pub(crate) struct Shared<P> {
    pub provider: Arc<P>,
    pub config: ServerConfig,
    /// The server-wide budget of READ/WRITE data in flight.
    pub byte_budget: ByteBudget,
    /// Turns true when the server shuts down.
    pub stop: watch::Receiver<bool>,
    pub tls: Option<Tls>,
    pub metrics: Arc<NbdMetrics>,
}

/// How a handshake ended.
enum Negotiated<S, D> {
    Plain(S, Export<D>),
    Tls(Box<tokio_rustls::server::TlsStream<S>>, Export<D>),
    Aborted,
}

/// Serves one accepted connection to the end.
pub(crate) async fn serve<P: ExportProvider>(shared: Arc<Shared<P>>, accepted: Accepted, id: u64) {
    match accepted {
        Accepted::Unix(stream, peer) => serve_stream(&shared, stream, id, &peer).await,
        Accepted::Tcp(stream, peer) => serve_stream(&shared, stream, id, &peer).await,
    }
}

async fn serve_stream<P, S>(shared: &Shared<P>, stream: S, id: u64, peer: &str)
where
    P: ExportProvider,
    S: SplitStream,
{
    tracing::info!(conn = id, peer, "client connected");
    let mut stop = shared.stop.clone();
    let timeout = Duration::from_millis(shared.config.handshake_timeout_ms);
    let clock = HandshakeClock::default();
    let negotiation = handshake_all(shared, stream, &clock);
    tokio::pin!(negotiation);
    let started = tokio::time::Instant::now();
    // The deadline bounds the client: time in the provider's open (which
    // bounds itself) moves it on.
    let deadline = || started + timeout + Duration::from_millis(clock.provider_ms());
    let negotiated = {
        let stopping = async {
            let _ = stop.wait_for(|stopping| *stopping).await;
        };
        tokio::pin!(stopping);
        loop {
            // In the provider: look again in a moment (its time is added
            // to the deadline once the call ends).
            let wake_at = if clock.in_provider() {
                tokio::time::Instant::now() + Duration::from_millis(100)
            } else {
                deadline()
            };
            tokio::select! {
                result = &mut negotiation => break Ok(result),
                () = tokio::time::sleep_until(wake_at) => {
                    if !clock.in_provider() && tokio::time::Instant::now() >= deadline() {
                        break Err(());
                    }
                }
                () = &mut stopping => {
                    tracing::info!(conn = id, peer, "closing in handshake: server shutting down");
                    return;
                }
            }
        }
    };
    match negotiated {
        Ok(Ok(Negotiated::Plain(stream, export))) => {
            transmit(shared, stream, export, &mut stop, id, peer, false).await
        }
        Ok(Ok(Negotiated::Tls(stream, export))) => {
            transmit(shared, *stream, export, &mut stop, id, peer, true).await
        }
        Ok(Ok(Negotiated::Aborted)) => {
            tracing::info!(conn = id, peer, "client aborted the handshake");
        }
        Ok(Err(error)) => log_handshake_error(id, peer, &error),
        Err(_) => {
            let timeout_ms = shared.config.handshake_timeout_ms;
            tracing::warn!(conn = id, peer, timeout_ms, "handshake timed out; closing");
        }
    }
}

/// The handshake, and after STARTTLS the TLS handshake and the options
/// inside TLS.
async fn handshake_all<P, S>(
    shared: &Shared<P>,
    mut stream: S,
    clock: &HandshakeClock,
) -> io::Result<Negotiated<S, P::Device>>
where
    P: ExportProvider,
    S: SplitStream,
{
    let provider = &*shared.provider;
    let security = match &shared.tls {
        None => Security::NoTls,
        Some(tls) => Security::Offered(tls.mode),
    };
    let negotiated = handshake::negotiate(&mut stream, provider, &shared.config, security, clock);
    let flags = match negotiated.await? {
        Outcome::Transmission(export) => return Ok(Negotiated::Plain(stream, export)),
        Outcome::Aborted => return Ok(Negotiated::Aborted),
        Outcome::StartTls(flags) => flags,
    };
    let Some(tls) = &shared.tls else {
        return Err(io::Error::other(
            "STARTTLS acknowledged without TLS (a bug)",
        ));
    };
    let mut stream = tls.acceptor.accept(stream).await.map_err(|error| {
        io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("TLS handshake failed: {error}"),
        )
    })?;
    let haggled = handshake::haggle(
        &mut stream,
        provider,
        &shared.config,
        flags,
        Security::Encrypted,
        clock,
    );
    match haggled.await? {
        Outcome::Transmission(export) => Ok(Negotiated::Tls(Box::new(stream), export)),
        Outcome::Aborted => Ok(Negotiated::Aborted),
        Outcome::StartTls(_) => Err(io::Error::other("STARTTLS inside TLS (a bug)")),
    }
}

async fn transmit<P: ExportProvider, S: SplitStream>(
    shared: &Shared<P>,
    stream: S,
    export: Export<P::Device>,
    stop: &mut watch::Receiver<bool>,
    id: u64,
    peer: &str,
    tls: bool,
) {
    let name = export.name.clone();
    let structured = export.structured_replies;
    tracing::info!(conn = id, peer, export = ?name, structured, tls, "transmission started");
    let counters = shared.metrics.group(&shared.provider.metrics_group(&name));
    let _open = shared.metrics.transmitting();
    let budget = &shared.byte_budget;
    let end = transmission::serve(stream, export, counters, &shared.config, budget, stop).await;
    if let End::RepliesStalled(_) = end {
        tracing::warn!(conn = id, peer, export = ?name, "{end}");
    } else if end.is_fault() {
        tracing::warn!(conn = id, peer, export = ?name, "connection closed: {end}");
    } else {
        tracing::info!(conn = id, peer, export = ?name, "connection closed: {end}");
    }
}

fn log_handshake_error(id: u64, peer: &str, error: &io::Error) {
    match error.kind() {
        io::ErrorKind::UnexpectedEof => {
            tracing::info!(conn = id, peer, "client left during the handshake");
        }
        io::ErrorKind::InvalidData | io::ErrorKind::NotFound | io::ErrorKind::PermissionDenied => {
            tracing::warn!(conn = id, peer, %error, "handshake failed; closing");
        }
        _ => tracing::info!(conn = id, peer, %error, "handshake failed; closing"),
    }
}
