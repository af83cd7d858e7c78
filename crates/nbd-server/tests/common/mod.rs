//! Shared test helpers: a server on a unix socket in a tempdir and on
//! tcp 127.0.0.1:0, external client runners, and a raw protocol client
//! built on nbd-proto.

#![allow(dead_code)]

pub mod hook_device;
pub mod mem_device;
pub mod pipeline;
pub mod raw;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Output;
use std::sync::{Arc, Once};
use std::time::Duration;

use nbd_server::{ExportProvider, ListenAddr, Server, ServerConfig, Tls};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Logs to the test output (visible with --nocapture), once per process.
pub fn init_logging() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "nbd_server=info".into()),
            )
            .with_test_writer()
            .try_init();
    });
}

pub struct TestServer {
    pub dir: tempfile::TempDir,
    pub addrs: Vec<ListenAddr>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<std::io::Result<()>>>,
}

impl TestServer {
    pub async fn start<P: ExportProvider>(provider: Arc<P>) -> TestServer {
        Self::start_with(provider, ServerConfig::default()).await
    }

    pub async fn start_with<P: ExportProvider>(
        provider: Arc<P>,
        config: ServerConfig,
    ) -> TestServer {
        Self::start_full(provider, config, None).await
    }

    /// A server offering TLS.
    pub async fn start_tls<P: ExportProvider>(provider: Arc<P>, tls: Tls) -> TestServer {
        Self::start_full(provider, ServerConfig::default(), Some(tls)).await
    }

    /// A server offering TLS, with `config`.
    pub async fn start_tls_with<P: ExportProvider>(
        provider: Arc<P>,
        tls: Tls,
        config: ServerConfig,
    ) -> TestServer {
        Self::start_full(provider, config, Some(tls)).await
    }

    async fn start_full<P: ExportProvider>(
        provider: Arc<P>,
        config: ServerConfig,
        tls: Option<Tls>,
    ) -> TestServer {
        init_logging();
        let dir = tempfile::tempdir().unwrap();
        let requested = [
            ListenAddr::Unix(dir.path().join("nbd.sock")),
            "tcp:127.0.0.1:0".parse().unwrap(),
        ];
        let mut server = Server::bind(provider, &requested, config).await.unwrap();
        if let Some(tls) = tls {
            server = server.with_tls(tls);
        }
        let addrs = server.local_addrs();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(server.run(async {
            let _ = stopped.await;
        }));
        TestServer {
            dir,
            addrs,
            stop: Some(stop),
            task: Some(task),
        }
    }

    pub fn unix_path(&self) -> PathBuf {
        match &self.addrs[0] {
            ListenAddr::Unix(path) => path.clone(),
            other => panic!("not unix: {other}"),
        }
    }

    pub fn tcp_addr(&self) -> SocketAddr {
        match &self.addrs[1] {
            ListenAddr::Tcp(addr) => *addr,
            other => panic!("not tcp: {other}"),
        }
    }

    pub fn unix_uri(&self, export: &str) -> String {
        format!("nbd+unix:///{export}?socket={}", self.unix_path().display())
    }

    pub fn tcp_uri(&self, export: &str) -> String {
        format!("nbd://{}/{export}", self.tcp_addr())
    }

    /// Both URIs, to run a client against each listener.
    pub fn uris(&self, export: &str) -> [String; 2] {
        [self.unix_uri(export), self.tcp_uri(export)]
    }

    /// Shuts the server down and checks it stopped cleanly and removed its socket.
    pub async fn stop(mut self) {
        let path = self.unix_path();
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let result = tokio::time::timeout(Duration::from_secs(20), task).await;
            result.expect("server did not stop").unwrap().unwrap();
        }
        assert!(!path.exists(), "socket file left behind");
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// Runs an external program (60 s limit) and returns its output.
pub async fn run(program: &str, args: &[&str]) -> Output {
    let child = tokio::process::Command::new(program)
        .args(args)
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(60), child)
        .await
        .unwrap_or_else(|_| panic!("{program} {args:?} timed out"))
        .unwrap_or_else(|error| panic!("cannot run {program}: {error}"));
    output
}

/// Runs a program that must succeed; returns its stdout.
pub async fn run_ok(program: &str, args: &[&str]) -> String {
    let output = run(program, args).await;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{program} {args:?} failed: {}\nstdout: {stdout}\nstderr: {stderr}",
        output.status
    );
    stdout
}

/// Fails the test if `future` takes longer than `seconds`.
pub async fn within<T>(seconds: u64, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(seconds), future)
        .await
        .expect("timed out")
}
