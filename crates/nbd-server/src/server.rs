//! The server: binds its listeners, accepts connections and runs each as
//! its own task (at most `max_connections`), and shuts down in order (stop
//! accepting, let in-flight requests finish within the grace period, cut
//! what remains, remove our unix socket files).
//!
//! Connections over `max_connections` are accepted and closed at once,
//! not left unaccepted. Left in the kernel's listen backlog, a client sees
//! its connect succeed and then hangs without a word (TCP clients beyond
//! the backlog retry SYNs for minutes), while the server logs nothing; when
//! a slot frees, it serves a backlog of connections whose clients may have
//! given up long ago. Closed at once, the client gets an immediate,
//! explicit failure (end of stream before the greeting) for its retry logic
//! (qemu `reconnect-delay`, `nbd-client -persist`) or its user, and the
//! operator a warning that names the limit. A refusal costs an accept and a
//! close: no task, no memory, and the warnings are rate-limited.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch, Semaphore};
use tokio::task::{JoinError, JoinSet};

use crate::budget::ByteBudget;
use crate::config::ServerConfig;
use crate::connection::{self, Shared};
use crate::device::ExportProvider;
use crate::listen::{self, Accepted, InheritedListener, ListenAddr, Listener, SocketFile};
use crate::metrics::NbdMetrics;
use crate::tls::Tls;

/// Pause after a failed accept (e.g. out of file descriptors).
const ACCEPT_RETRY_DELAY: Duration = Duration::from_millis(50);
/// Least time between two warnings about connections refused at the limit.
const REFUSAL_WARNING_INTERVAL: Duration = Duration::from_secs(10);

/// An NBD server over the exports of `P`, bound and ready to [`run`](Server::run).
pub struct Server<P: ExportProvider> {
    provider: Arc<P>,
    config: ServerConfig,
    /// Each listener with its actual address.
    listeners: Vec<(Listener, ListenAddr)>,
    socket_files: Vec<SocketFile>,
    tls: Option<Tls>,
    metrics: Arc<NbdMetrics>,
}

impl<P: ExportProvider> Server<P> {
    /// Binds every address. A stale unix socket file (nobody listening) is
    /// replaced; a live one, or any other failure, is an error naming the
    /// address. On error nothing stays bound. An invalid `config` (see
    /// [`ServerConfig::validate`]) is an `InvalidInput` error.
    pub async fn bind(
        provider: Arc<P>,
        addrs: &[ListenAddr],
        config: ServerConfig,
    ) -> io::Result<Self> {
        Self::bind_and_adopt(provider, addrs, Vec::new(), config).await
    }

    /// Like [`bind`](Server::bind), and also serves on listeners another
    /// process bound and passed to this one (systemd socket activation):
    /// those are never unlinked, so clients queue in their backlog while
    /// this server restarts. At least one address or listener is needed.
    pub async fn bind_and_adopt(
        provider: Arc<P>,
        addrs: &[ListenAddr],
        inherited: Vec<InheritedListener>,
        config: ServerConfig,
    ) -> io::Result<Self> {
        config.validate()?;
        if addrs.is_empty() && inherited.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "no listen address given",
            ));
        }
        let mut server = Server {
            provider,
            config,
            listeners: Vec::with_capacity(addrs.len()),
            socket_files: Vec::new(),
            tls: None,
            metrics: Arc::new(NbdMetrics::default()),
        };
        for addr in addrs {
            // On error `server` drops here, removing the files bound so far.
            let (listener, socket_file) = listen::bind(addr).await?;
            server.socket_files.extend(socket_file);
            let local = listener.local_addr(addr).map_err(|error| {
                io::Error::new(
                    error.kind(),
                    format!("cannot query address of {addr}: {error}"),
                )
            })?;
            tracing::info!(addr = %local, "listening");
            server.listeners.push((listener, local));
        }
        for listener in inherited {
            let (listener, local) = listen::adopt(listener).map_err(|error| {
                io::Error::new(
                    error.kind(),
                    format!("cannot use a listening socket passed by systemd: {error}"),
                )
            })?;
            tracing::info!(addr = %local, "listening (socket passed by systemd)");
            server.listeners.push((listener, local));
        }
        Ok(server)
    }

    /// Offers TLS (STARTTLS) on every connection, under `tls`'s policy.
    pub fn with_tls(mut self, tls: Tls) -> Self {
        tracing::info!(mode = ?tls.mode(), "TLS offered");
        self.tls = Some(tls);
        self
    }

    /// The server's counters (requests per command and export group,
    /// connections), for an exporter to read while it runs.
    pub fn metrics(&self) -> Arc<NbdMetrics> {
        Arc::clone(&self.metrics)
    }

    /// The bound addresses, TCP port 0 resolved to the actual port.
    pub fn local_addrs(&self) -> Vec<ListenAddr> {
        self.listeners
            .iter()
            .map(|(_, addr)| addr.clone())
            .collect()
    }

    /// Serves until `shutdown` completes; then stops accepting, lets
    /// in-flight requests finish (at most `shutdown_grace_ms`), closes every
    /// connection and removes the unix socket files.
    pub async fn run(mut self, shutdown: impl Future<Output = ()> + Send) -> io::Result<()> {
        let (stop_sender, stop) = watch::channel(false);
        let shared = Arc::new(Shared {
            provider: Arc::clone(&self.provider),
            config: self.config.clone(),
            byte_budget: ByteBudget::new(self.config.max_in_flight_bytes),
            stop,
            tls: self.tls.clone(),
            metrics: Arc::clone(&self.metrics),
        });
        let max_connections = self.config.max_connections.min(Semaphore::MAX_PERMITS);
        let slots = Arc::new(Semaphore::new(max_connections));
        let mut refusals = Refusals::default();
        let (accepted_sender, mut accepted) = mpsc::channel(64);
        let mut acceptors = JoinSet::new();
        for (listener, addr) in std::mem::take(&mut self.listeners) {
            acceptors.spawn(accept_loop(listener, addr, accepted_sender.clone()));
        }
        drop(accepted_sender);
        let mut connections = JoinSet::new();
        let mut next_id = 0u64;
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                incoming = accepted.recv() => {
                    let Some(incoming) = incoming else { break };
                    let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
                        // Dropping the stream closes the connection.
                        self.metrics.connection_refused();
                        refusals.refuse(incoming.peer(), max_connections);
                        continue;
                    };
                    next_id += 1;
                    let serve = connection::serve(Arc::clone(&shared), incoming, next_id);
                    let open = self.metrics.connection_accepted();
                    connections.spawn(async move {
                        serve.await;
                        // The slot frees as the connection ends, before it is joined.
                        drop(slot);
                        drop(open);
                    });
                }
                Some(joined) = connections.join_next(), if !connections.is_empty() => log_join(joined),
                () = sleep_until(refusals.report_due()), if refusals.report_due().is_some() => {
                    refusals.report(max_connections);
                }
            }
        }
        tracing::info!(connections = connections.len(), "shutting down");
        acceptors.shutdown().await;
        drop(accepted);
        // Receivers live in `shared`, so the send cannot fail.
        let _ = stop_sender.send(true);
        self.drain(&mut connections).await;
        Ok(())
    }

    /// Waits for the connections to finish, cutting them after the grace.
    async fn drain(&mut self, connections: &mut JoinSet<()>) {
        let grace = Duration::from_millis(self.config.shutdown_grace_ms);
        let finished = tokio::time::timeout(grace, async {
            while let Some(joined) = connections.join_next().await {
                log_join(joined);
            }
        })
        .await;
        if finished.is_err() {
            tracing::warn!(
                connections = connections.len(),
                grace_ms = self.config.shutdown_grace_ms,
                "connections still busy after the shutdown grace; closing them"
            );
            connections.shutdown().await;
        }
        for file in std::mem::take(&mut self.socket_files) {
            file.remove();
        }
        tracing::info!("server stopped");
    }
}

impl<P: ExportProvider> Drop for Server<P> {
    /// A server dropped without running (or a failed bind) leaves no files.
    fn drop(&mut self) {
        for file in &self.socket_files {
            file.remove();
        }
    }
}

async fn accept_loop(listener: Listener, addr: ListenAddr, sender: mpsc::Sender<Accepted>) {
    loop {
        match listener.accept().await {
            Ok(accepted) => {
                if sender.send(accepted).await.is_err() {
                    return;
                }
            }
            Err(error) => {
                tracing::warn!(%addr, %error, "accept failed");
                tokio::time::sleep(ACCEPT_RETRY_DELAY).await;
            }
        }
    }
}

/// Warnings about connections refused at the limit: the first at once,
/// then at most one per `REFUSAL_WARNING_INTERVAL` counting the refusals
/// since the previous one (the run loop calls `report` when it is due).
#[derive(Default)]
struct Refusals {
    last_warning: Option<Instant>,
    /// Refused since the last warning.
    unreported: u64,
}

impl Refusals {
    fn refuse(&mut self, peer: &str, max_connections: usize) {
        self.unreported += 1;
        tracing::debug!(peer, max_connections, "connection limit reached; closing");
        let now = Instant::now();
        let recent = self
            .last_warning
            .is_some_and(|last| now.duration_since(last) < REFUSAL_WARNING_INTERVAL);
        if !recent {
            tracing::warn!(
                peer,
                max_connections,
                "connection limit reached; closing new connections at once"
            );
            self.last_warning = Some(now);
            self.unreported = 0;
        }
    }

    /// When the pending count is to be reported, if any.
    fn report_due(&self) -> Option<Instant> {
        match self.unreported {
            0 => None,
            _ => self
                .last_warning
                .map(|last| last + REFUSAL_WARNING_INTERVAL),
        }
    }

    fn report(&mut self, max_connections: usize) {
        tracing::warn!(
            max_connections,
            refused = self.unreported,
            "connection limit reached; closed more connections since the warning {} s ago",
            REFUSAL_WARNING_INTERVAL.as_secs()
        );
        self.last_warning = Some(Instant::now());
        self.unreported = 0;
    }
}

/// Sleeps until `deadline`; forever without one.
async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline.into()).await,
        None => std::future::pending().await,
    }
}

fn log_join(joined: Result<(), JoinError>) {
    if let Err(error) = joined {
        if error.is_panic() {
            tracing::error!(%error, "connection task panicked");
        }
    }
}
