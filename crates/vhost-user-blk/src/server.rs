//! Serving devices on unix sockets: one socket per device, one frontend
//! (QEMU, Cloud Hypervisor) at a time on each, its messages handled on a
//! thread of its own (the vhost crate's handler blocks on the socket), its
//! queues on the runtime.
//!
//! A frontend that disconnects leaves the socket listening for its
//! reconnect. Shutdown stops taking requests, returns every request taken
//! to its guest, then closes the connections: the frontend reconnects to
//! the next process, which finds nothing in flight, or, after a crash,
//! what the inflight area says to resubmit.

use std::io;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::{Arc, Mutex};

use tokio::sync::{oneshot, watch, Semaphore};
use tokio::task::JoinHandle;
use vhost::vhost_user::{BackendReqHandler, Error as VuError};

use crate::backend::{BlkBackend, DeviceConfig};
use crate::config_space::Limits;
use crate::device::{BlockDevice, DeviceProvider};
use crate::execute::budget;
use crate::metrics::VhostMetrics;

/// What every device of a server is offered with.
#[derive(Debug, Clone, Copy)]
pub struct ServerConfig {
    /// Queues offered (a frontend may use fewer).
    pub num_queues: u16,
    /// Data bytes of one read or write at most.
    pub max_request_bytes: u32,
    /// Bytes of request buffers alive at once, over all devices.
    pub max_inflight_bytes: u64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            num_queues: 16,
            max_request_bytes: 32 << 20,
            max_inflight_bytes: 256 << 20,
        }
    }
}

pub struct Server<P: DeviceProvider> {
    provider: Arc<P>,
    config: ServerConfig,
    budget: Arc<Semaphore>,
    stopping: watch::Sender<bool>,
    metrics: Arc<VhostMetrics>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl<P: DeviceProvider> Server<P> {
    pub fn new(provider: Arc<P>, config: ServerConfig) -> Arc<Self> {
        Arc::new(Server {
            provider,
            budget: budget(config.max_inflight_bytes, config.max_request_bytes),
            config,
            stopping: watch::channel(false).0,
            metrics: Arc::new(VhostMetrics::default()),
            tasks: Mutex::new(Vec::new()),
        })
    }

    /// The server's counters (per device, per request kind).
    pub fn metrics(&self) -> Arc<VhostMetrics> {
        self.metrics.clone()
    }

    /// Serves device `name` on `listener` until `shutdown`.
    pub fn serve(self: &Arc<Self>, name: &str, listener: UnixListener) -> io::Result<()> {
        listener.set_nonblocking(true)?;
        let listener = tokio::net::UnixListener::from_std(listener)?;
        let task = tokio::spawn(self.clone().accept_loop(name.to_string(), listener));
        if let Ok(mut tasks) = self.tasks.lock() {
            tasks.push(task);
        }
        Ok(())
    }

    /// Stops every connection (requests taken are returned to their
    /// guests first) and every socket.
    pub async fn shutdown(&self) {
        let _ = self.stopping.send(true);
        let tasks = self.tasks.lock().map(|mut t| std::mem::take(&mut *t));
        for task in tasks.unwrap_or_default() {
            let _ = task.await;
        }
    }

    async fn accept_loop(self: Arc<Self>, name: String, listener: tokio::net::UnixListener) {
        let mut stopping = self.stopping.subscribe();
        loop {
            let stream = tokio::select! {
                _ = wait_stopping(&mut stopping) => return,
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        tracing::warn!(volume = %name, error = %e, "vhost-user accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            let device = match self.provider.open(&name).await {
                Ok(d) => d,
                Err(e) => {
                    tracing::error!(volume = %name, error = %e, "vhost-user frontend refused: the device cannot be opened");
                    continue;
                }
            };
            let stream = match stream
                .into_std()
                .and_then(|s| s.set_nonblocking(false).map(|()| s))
            {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(volume = %name, error = %e, "vhost-user connection setup failed");
                    continue;
                }
            };
            if self.connection(&name, device, stream, &mut stopping).await {
                return;
            }
        }
    }

    /// Runs one frontend connection to its end; true when the server is
    /// stopping.
    async fn connection(
        &self,
        name: &str,
        device: Arc<P::Device>,
        stream: UnixStream,
        stopping: &mut watch::Receiver<bool>,
    ) -> bool {
        let closer = match stream.try_clone() {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(volume = %name, error = %e, "vhost-user connection setup failed");
                return false;
            }
        };
        let device_config = DeviceConfig {
            num_queues: self.config.num_queues,
            limits: Limits::new(128, self.config.max_request_bytes),
        };
        self.metrics.accepted();
        let device_metrics = self.metrics.device(name);
        device_metrics.connected(1);
        let backend = BlkBackend::new(
            name,
            device.clone(),
            device_config,
            (self.budget.clone(), device_metrics.clone()),
            tokio::runtime::Handle::current(),
        );
        let channel = Arc::new(parking_lot::Mutex::new(None));
        let backend = Arc::new(Mutex::new(backend));
        let resize = device
            .size_watch()
            .map(|watch| tokio::spawn(tell_resizes(name.to_string(), watch, channel.clone())));
        tracing::info!(volume = %name, "vhost-user frontend connected");
        let (done_tx, mut done_rx) = oneshot::channel();
        let thread = {
            let (backend, name) = (backend.clone(), name.to_string());
            std::thread::Builder::new()
                .name(format!("vhost-{name}"))
                .spawn(move || {
                    handle_messages(&name, stream, backend, channel);
                    let _ = done_tx.send(());
                })
        };
        if let Err(e) = thread {
            tracing::error!(volume = %name, error = %e, "cannot start the vhost-user connection thread");
            device_metrics.connected(-1);
            return false;
        }
        let stop = tokio::select! {
            _ = &mut done_rx => false,
            _ = wait_stopping(stopping) => true,
        };
        if stop {
            // Return every request taken, then close: the frontend
            // reconnects to the next process.
            let b = backend.clone();
            let _ = tokio::task::spawn_blocking(move || {
                if let Ok(mut b) = b.lock() {
                    b.stop_all();
                }
                let _ = closer.shutdown(std::net::Shutdown::Both);
            })
            .await;
            // The thread stops whatever started in between, and ends.
            let _ = done_rx.await;
        }
        if let Some(r) = resize {
            r.abort();
        }
        device_metrics.connected(-1);
        stop
    }
}

/// Resolves once the server is stopping (or its sender is gone).
async fn wait_stopping(stopping: &mut watch::Receiver<bool>) {
    let _ = stopping.wait_for(|s| *s).await.map(|_| ());
}

/// The connection thread: messages until the frontend goes, then every
/// ring stopped.
fn handle_messages<D: BlockDevice>(
    name: &str,
    stream: UnixStream,
    backend: Arc<Mutex<BlkBackend<D>>>,
    channel: Arc<parking_lot::Mutex<Option<UnixStream>>>,
) {
    let peek = stream.try_clone();
    let mut handler = BackendReqHandler::from_stream(stream, backend.clone());
    loop {
        if let Some(c) = peek
            .as_ref()
            .ok()
            .and_then(crate::backend_channel::peek_channel)
        {
            *channel.lock() = Some(c);
        }
        match handler.handle_request() {
            Ok(()) => {}
            Err(VuError::Disconnected) | Err(VuError::PartialMessage) => {
                tracing::info!(volume = %name, "vhost-user frontend disconnected");
                break;
            }
            Err(e) => {
                tracing::warn!(volume = %name, error = %e, "vhost-user message failed; closing the connection (the frontend may reconnect)");
                break;
            }
        }
    }
    if let Ok(mut b) = backend.lock() {
        b.stop_all();
    }
}

/// Tells the frontend each time the device's size changes
/// (VHOST_USER_BACKEND_CONFIG_CHANGE_MSG); it reads the new capacity and
/// tells the guest. Sent from a blocking task: the frontend answers with
/// a GET_CONFIG on the main channel, which the connection thread serves.
async fn tell_resizes(
    name: String,
    mut watch: watch::Receiver<u64>,
    channel: Arc<parking_lot::Mutex<Option<UnixStream>>>,
) {
    while watch.changed().await.is_ok() {
        let size = *watch.borrow_and_update();
        let Some(channel) = channel.lock().as_ref().and_then(|c| c.try_clone().ok()) else {
            tracing::warn!(volume = %name, size_bytes = size, "resized, but the frontend gave no backend channel (BACKEND_REQ): the guest sees the new size after a reconnect");
            continue;
        };
        let sent = tokio::task::spawn_blocking(move || {
            crate::backend_channel::send_config_change(&channel)
        })
        .await;
        match sent {
            Ok(Ok(_)) => {
                tracing::info!(volume = %name, size_bytes = size, "told the vhost-user frontend of the new size")
            }
            Ok(Err(e)) => {
                tracing::warn!(volume = %name, error = %e, "configuration change not delivered")
            }
            Err(e) => {
                tracing::warn!(volume = %name, error = %e, "configuration change not delivered")
            }
        }
    }
}

/// Binds a socket at `path`, replacing a stale one (a socket file nobody
/// listens on, left by a process that died); refuses a path where
/// something else is, or where a server still listens.
pub fn bind(path: &Path) -> io::Result<UnixListener> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            if UnixStream::connect(path).is_ok() {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!(
                        "{}: another server listens on this socket; stop it first",
                        path.display()
                    ),
                ));
            }
            std::fs::remove_file(path)?;
        }
        Ok(_) => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!(
                    "{} exists and is not a socket; remove it or choose another path",
                    path.display()
                ),
            ))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    UnixListener::bind(path)
}
