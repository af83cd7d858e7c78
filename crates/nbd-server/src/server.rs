//! The server: binds its listeners, accepts connections and runs each as
//! its own task, and shuts down in order (stop accepting, let in-flight
//! requests finish within the grace period, cut what remains, remove our
//! unix socket files).

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::task::{JoinError, JoinSet};

use crate::config::ServerConfig;
use crate::connection::{self, Shared};
use crate::device::ExportProvider;
use crate::listen::{self, Accepted, ListenAddr, Listener, SocketFile};

/// Pause after a failed accept (e.g. out of file descriptors).
const ACCEPT_RETRY_DELAY: Duration = Duration::from_millis(50);

/// An NBD server over the exports of `P`, bound and ready to [`run`](Server::run).
pub struct Server<P: ExportProvider> {
    provider: Arc<P>,
    config: ServerConfig,
    /// Each listener with its actual address.
    listeners: Vec<(Listener, ListenAddr)>,
    socket_files: Vec<SocketFile>,
}

impl<P: ExportProvider> Server<P> {
    /// Binds every address. A stale unix socket file (nobody listening) is
    /// replaced; a live one, or any other failure, is an error naming the
    /// address. On error nothing stays bound.
    pub async fn bind(
        provider: Arc<P>,
        addrs: &[ListenAddr],
        config: ServerConfig,
    ) -> io::Result<Self> {
        if addrs.is_empty() {
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
        Ok(server)
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
            stop,
        });
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
                    next_id += 1;
                    connections.spawn(connection::serve(Arc::clone(&shared), incoming, next_id));
                }
                Some(joined) = connections.join_next(), if !connections.is_empty() => log_join(joined),
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

fn log_join(joined: Result<(), JoinError>) {
    if let Err(error) = joined {
        if error.is_panic() {
            tracing::error!(%error, "connection task panicked");
        }
    }
}
