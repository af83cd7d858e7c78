//! One client connection from accept to close: the handshake (bounded by
//! the handshake timeout, abandoned on shutdown), then transmission, with
//! the connect/disconnect log lines.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::budget::ByteBudget;
use crate::config::ServerConfig;
use crate::device::ExportProvider;
use crate::handshake::{self, Outcome};
use crate::listen::{Accepted, SplitStream};
use crate::transmission::{self, End};

/// What every connection of a server shares.
pub(crate) struct Shared<P> {
    pub provider: Arc<P>,
    pub config: ServerConfig,
    /// The server-wide budget of READ/WRITE data in flight.
    pub byte_budget: ByteBudget,
    /// Turns true when the server shuts down.
    pub stop: watch::Receiver<bool>,
}

/// Serves one accepted connection to the end.
pub(crate) async fn serve<P: ExportProvider>(shared: Arc<Shared<P>>, accepted: Accepted, id: u64) {
    match accepted {
        Accepted::Unix(stream, peer) => serve_stream(&shared, stream, id, &peer).await,
        Accepted::Tcp(stream, peer) => serve_stream(&shared, stream, id, &peer).await,
    }
}

async fn serve_stream<P: ExportProvider, S: SplitStream>(
    shared: &Shared<P>,
    mut stream: S,
    id: u64,
    peer: &str,
) {
    tracing::info!(conn = id, peer, "client connected");
    let mut stop = shared.stop.clone();
    let timeout = Duration::from_millis(shared.config.handshake_timeout_ms);
    let negotiation = handshake::negotiate(&mut stream, &*shared.provider, &shared.config);
    let negotiated = tokio::select! {
        result = tokio::time::timeout(timeout, negotiation) => result,
        _ = stop.wait_for(|stopping| *stopping) => {
            tracing::info!(conn = id, peer, "closing in handshake: server shutting down");
            return;
        }
    };
    let export = match negotiated {
        Ok(Ok(Outcome::Transmission(export))) => export,
        Ok(Ok(Outcome::Aborted)) => {
            tracing::info!(conn = id, peer, "client aborted the handshake");
            return;
        }
        Ok(Err(error)) => return log_handshake_error(id, peer, &error),
        Err(_) => {
            let timeout_ms = shared.config.handshake_timeout_ms;
            tracing::warn!(conn = id, peer, timeout_ms, "handshake timed out; closing");
            return;
        }
    };
    let name = export.name.clone();
    let structured = export.structured_replies;
    tracing::info!(conn = id, peer, export = ?name, structured, "transmission started");
    let end = transmission::serve(
        stream,
        export,
        &shared.config,
        &shared.byte_budget,
        &mut stop,
    )
    .await;
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
        io::ErrorKind::InvalidData | io::ErrorKind::NotFound => {
            tracing::warn!(conn = id, peer, %error, "handshake failed; closing");
        }
        _ => tracing::info!(conn = id, peer, %error, "handshake failed; closing"),
    }
}
