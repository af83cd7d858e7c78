//! Prometheus metrics: `strata serve --metrics-listen ADDR` serves
//! `/metrics` over HTTP.
//!
//! - `collector`: what is exported (server-wide families), read at scrape
//!   time from counters the server keeps anyway;
//! - `volume_families`: the families of each open volume;
//! - `families`: writing one family (name, HELP, unit, samples);
//! - `latency`: log2 latency histograms as Prometheus buckets;
//! - `classic_text`: the Prometheus text format for clients that do not
//!   ask for OpenMetrics;
//! - `http`: the endpoint.
//!
//! Encoding is prometheus-client's (the Prometheus project's Rust client):
//! its custom `Collector` lets a scrape read existing atomics instead of
//! mirroring every counter into registry metrics on the I/O path.

mod classic_text;
mod collector;
mod families;
mod http;
mod latency;
mod volume_families;

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use nbd_server::NbdMetrics;
use prometheus_client::registry::Registry;
use strata_volume::Engine;

/// Binds `addr` (`IP:PORT`; port 0 picks one) and serves `/metrics` there
/// until the returned task is aborted. Returns the bound address.
pub async fn start(
    addr: &str,
    engine: Arc<Engine>,
    nbd: Arc<NbdMetrics>,
    vhost: Option<Arc<vhost_user_blk::VhostMetrics>>,
) -> anyhow::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let addr: SocketAddr = addr.parse().with_context(|| {
        format!("--metrics-listen {addr:?}: expected IP:PORT, e.g. 127.0.0.1:9187")
    })?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr} for metrics"))?;
    let bound = listener.local_addr().context("metrics listener address")?;
    let mut registry = Registry::default();
    registry.register_collector(Box::new(collector::StrataCollector::new(
        engine, nbd, vhost,
    )));
    let task = tokio::spawn(http::serve(listener, Arc::new(registry)));
    tracing::info!(addr = %bound, "serving metrics at /metrics");
    Ok((bound, task))
}
