//! Binding (errors, stale and live unix sockets, port 0), and shutdown
//! (in-flight requests finish, the grace period cuts the rest, socket
//! files are removed).

// Test helpers outside #[test] functions unwrap too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::io::ErrorKind;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::hook_device::HookDevice;
use common::mem_device::{Exports, MemDevice};
use common::raw::RawClient;
use common::within;
use nbd_proto::consts::*;
use nbd_server::{InheritedListener, ListenAddr, Server, ServerConfig};
use tokio::sync::{oneshot, Semaphore};

fn provider() -> Arc<Exports<MemDevice>> {
    Arc::new(Exports::new().with("", "", Arc::new(MemDevice::new(1 << 20))))
}

#[tokio::test]
async fn bind_errors_name_the_address() {
    common::init_logging();
    let dir = tempfile::tempdir().unwrap();
    let missing = ListenAddr::Unix(dir.path().join("no/such/dir/x.sock"));
    let error = Server::bind(
        provider(),
        std::slice::from_ref(&missing),
        ServerConfig::default(),
    )
    .await
    .err()
    .unwrap();
    assert!(error.to_string().contains(&missing.to_string()), "{error}");

    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken: ListenAddr = format!("tcp:{}", taken.local_addr().unwrap())
        .parse()
        .unwrap();
    let good = ListenAddr::Unix(dir.path().join("good.sock"));
    let error = Server::bind(
        provider(),
        &[good.clone(), taken.clone()],
        ServerConfig::default(),
    )
    .await
    .err()
    .unwrap();
    assert_eq!(error.kind(), ErrorKind::AddrInUse);
    assert!(error.to_string().contains(&taken.to_string()), "{error}");
    assert!(
        !dir.path().join("good.sock").exists(),
        "failed bind leaves no socket file"
    );

    let file = dir.path().join("plain-file");
    std::fs::write(&file, b"keep me").unwrap();
    let error = Server::bind(
        provider(),
        &[ListenAddr::Unix(file.clone())],
        ServerConfig::default(),
    )
    .await
    .err()
    .unwrap();
    assert!(error.to_string().contains("not a socket"), "{error}");
    assert_eq!(std::fs::read(&file).unwrap(), b"keep me");
    assert!(Server::bind(provider(), &[], ServerConfig::default())
        .await
        .is_err());
}

#[tokio::test]
async fn stale_socket_is_replaced_and_live_one_refused() {
    common::init_logging();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nbd.sock");
    // A stale socket file: bound, then the listener is gone.
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    assert!(path.exists());
    let addr = ListenAddr::Unix(path.clone());
    let server = Server::bind(
        provider(),
        std::slice::from_ref(&addr),
        ServerConfig::default(),
    )
    .await
    .unwrap();
    // Now it is live: a second server must not steal it.
    let error = Server::bind(
        provider(),
        std::slice::from_ref(&addr),
        ServerConfig::default(),
    )
    .await
    .err()
    .unwrap();
    assert_eq!(error.kind(), ErrorKind::AddrInUse, "{error}");
    assert!(path.exists());
    drop(server);
    assert!(!path.exists(), "a dropped server removes its socket file");
}

#[tokio::test]
async fn local_addrs_resolve_port_zero() {
    common::init_logging();
    let addrs: Vec<ListenAddr> = vec![
        "tcp:127.0.0.1:0".parse().unwrap(),
        "tcp:[::1]:0".parse().unwrap(),
    ];
    let server = match Server::bind(provider(), &addrs, ServerConfig::default()).await {
        Ok(server) => server,
        // No IPv6 loopback here: check IPv4 alone.
        Err(_) => Server::bind(provider(), &addrs[..1], ServerConfig::default())
            .await
            .unwrap(),
    };
    for addr in server.local_addrs() {
        match addr {
            ListenAddr::Tcp(socket) => {
                assert_ne!(socket.port(), 0);
                assert!(socket.ip().is_loopback());
            }
            other => panic!("{other}"),
        }
    }
}

struct Running {
    dir: tempfile::TempDir,
    device: Arc<HookDevice>,
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

async fn run_gated(gate: Arc<Semaphore>, config: ServerConfig) -> Running {
    common::init_logging();
    let dir = tempfile::tempdir().unwrap();
    let device = Arc::new(HookDevice::gated(MemDevice::new(1 << 20), gate));
    let provider = Arc::new(Exports::new().with("", "", Arc::clone(&device)));
    let addr = ListenAddr::Unix(dir.path().join("nbd.sock"));
    let server = Server::bind(provider, &[addr], config).await.unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(server.run(async {
        let _ = stopped.await;
    }));
    Running {
        dir,
        device,
        stop,
        task,
    }
}

async fn wait_for_read(device: &HookDevice) {
    within(10, async {
        while device
            .reads_in_device
            .load(std::sync::atomic::Ordering::SeqCst)
            == 0
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_in_flight_requests_finish() {
    let gate = Arc::new(Semaphore::new(0));
    let config = ServerConfig {
        shutdown_grace_ms: 5_000,
        ..ServerConfig::default()
    };
    let running = run_gated(Arc::clone(&gate), config).await;
    let path = running.dir.path().join("nbd.sock");
    let mut busy = RawClient::unix(&path).await;
    busy.go("", true, false).await;
    busy.send_request(0, CMD_READ, 1, 0, 512).await;
    let mut idle = RawClient::unix(&path).await;
    idle.go("", false, false).await;
    let mut haggling = RawClient::unix(&path).await;
    haggling.greet().await;
    wait_for_read(&running.device).await;

    running.stop.send(()).unwrap();
    assert!(within(5, idle.closed_by_server()).await);
    assert!(within(5, haggling.closed_by_server()).await);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!running.task.is_finished(), "waits for the in-flight read");
    gate.add_permits(10);
    let reply = within(5, busy.read_reply(0)).await;
    assert_eq!((reply.handle(), reply.error()), (1, 0));
    assert!(within(5, busy.closed_by_server()).await);
    within(5, running.task).await.unwrap().unwrap();
    assert!(!path.exists(), "socket file removed");
    assert!(std::os::unix::net::UnixStream::connect(&path).is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_grace_cuts_stuck_requests() {
    let gate = Arc::new(Semaphore::new(0));
    let config = ServerConfig {
        shutdown_grace_ms: 300,
        ..ServerConfig::default()
    };
    let mut running = run_gated(gate, config).await;
    let path = running.dir.path().join("nbd.sock");
    let mut stuck = RawClient::unix(&path).await;
    stuck.go("", true, false).await;
    stuck.send_request(0, CMD_READ, 1, 0, 512).await;
    wait_for_read(&running.device).await;
    let started = Instant::now();
    running.stop.send(()).unwrap();
    within(5, &mut running.task).await.unwrap().unwrap();
    let elapsed = started.elapsed();
    assert!(elapsed >= Duration::from_millis(250), "{elapsed:?}");
    assert!(within(5, stuck.closed_by_server()).await);
    assert!(!path.exists());
    // The stuck read was cancelled, not left running.
    within(5, async {
        while running
            .device
            .reads_in_device
            .load(std::sync::atomic::Ordering::SeqCst)
            > 0
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

/// Socket activation: a listener bound by someone else (systemd) is served,
/// left in place at shutdown, and a client that connects while no server
/// runs waits in its backlog and is served by the next server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adopted_listener_outlives_the_server_and_queues_clients() {
    common::init_logging();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("held.sock");
    let held = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let expected = vec![ListenAddr::Unix(path.clone())];
    let expected = &expected;
    let start = |listener: std::os::unix::net::UnixListener| async move {
        let server = Server::bind_and_adopt(
            provider(),
            &[],
            vec![InheritedListener::Unix(listener)],
            ServerConfig::default(),
        )
        .await
        .unwrap();
        assert_eq!(
            &server.local_addrs(),
            expected,
            "the adopted socket's path is reported"
        );
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(server.run(async {
            let _ = stopped.await;
        }));
        (stop, task)
    };

    let (stop, task) = start(held.try_clone().unwrap()).await;
    let mut first = RawClient::unix(&path).await;
    first.go("", false, false).await;
    stop.send(()).unwrap();
    assert!(within(5, first.closed_by_server()).await);
    within(5, task).await.unwrap().unwrap();
    assert!(
        path.exists(),
        "the adopted socket's file is its owner's to remove"
    );

    // No server runs: the connection waits in the held socket's backlog.
    let mut queued = RawClient::unix(&path).await;
    let (stop, task) = start(held.try_clone().unwrap()).await;
    queued.go("", false, false).await;
    queued.send_request(0, CMD_READ, 7, 0, 512).await;
    let reply = within(5, queued.read_reply(512)).await;
    assert_eq!((reply.handle(), reply.error()), (7, 0));
    stop.send(()).unwrap();
    within(5, task).await.unwrap().unwrap();
    assert!(path.exists());
}
