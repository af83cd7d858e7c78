//! Memory bounds: the server-wide byte budget of READ/WRITE data in flight
//! (held across connections, never exceeded, no deadlock, config checked
//! at bind), each connection's share of it, and the connection limit.
//! (Clients that stop reading their replies: `stalls.rs`.)

// Test helpers outside #[test] functions unwrap too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::io::ErrorKind;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use common::hook_device::HookDevice;
use common::mem_device::{Exports, MemDevice};
use common::pipeline::{pattern, pipeline, request, write_then_read, Step, BLOCK, MIB};
use common::raw::{RawClient, RawReply};
use common::{within, TestServer};
use nbd_proto::consts::*;
use nbd_server::{ListenAddr, Server, ServerConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

/// The request size of the budget tests (`BLOCK`) is the configured maximum.
fn small_budget() -> ServerConfig {
    ServerConfig {
        max_request_bytes: BLOCK as u32,
        max_in_flight_bytes: MIB,
        ..ServerConfig::default()
    }
}

/// Connections writing and reading 256 KiB blocks at once, each in its own
/// 2 MiB region, pipelined: all of it written, then reads of the first
/// round mixed with writes of a second, then all of it read back. Returns
/// the most data bytes the (slow) device held at once.
async fn large_requests_from_many_connections(config: ServerConfig) -> usize {
    const CONNECTIONS: u64 = 6;
    const BLOCKS: u64 = 8;
    let device = Arc::new(HookDevice::slow(
        MemDevice::new(CONNECTIONS * BLOCKS * BLOCK),
        Duration::from_millis(5),
    ));
    let provider = Arc::new(Exports::new().with("", "", Arc::clone(&device)));
    let server = TestServer::start_with(provider, config).await;
    let mut tasks = Vec::new();
    for connection in 0..CONNECTIONS {
        let unix = server.unix_path();
        let tcp = server.tcp_addr();
        tasks.push(tokio::spawn(async move {
            let mut client = match connection % 2 {
                0 => RawClient::unix(&unix).await,
                _ => RawClient::tcp(tcp).await,
            };
            client.go("", connection % 4 < 2, false).await;
            let base = connection * BLOCKS * BLOCK;
            let all = |step: fn(u64) -> Step| (0..BLOCKS).map(step).collect();
            let first = all(|block| Step::Write { block, round: 0 });
            let client = pipeline(client, connection, base, first).await;
            let mixed = all(|block| match block % 2 {
                0 => Step::Write { block, round: 1 },
                _ => Step::Read { block, round: 0 },
            });
            let client = pipeline(client, connection, base, mixed).await;
            let last = all(|block| Step::Read {
                block,
                round: 1 - block % 2,
            });
            pipeline(client, connection, base, last).await
        }));
    }
    for task in tasks {
        within(60, task).await.unwrap();
    }
    server.stop().await;
    assert_eq!(device.bytes_in_device.load(Ordering::SeqCst), 0);
    device.max_bytes_in_device.load(Ordering::SeqCst)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_in_flight_stays_within_the_byte_budget() {
    let budget = small_budget().max_in_flight_bytes as usize;
    let max_bytes = large_requests_from_many_connections(small_budget()).await;
    assert!(
        max_bytes <= budget,
        "{max_bytes} bytes in the device at once"
    );
    assert!(
        max_bytes >= 2 * BLOCK as usize,
        "requests should have run concurrently: at most {max_bytes} bytes at once"
    );
    // The same load without the budget holds more than it: the bound above
    // is the budget's doing.
    let unbounded = ServerConfig {
        max_in_flight_bytes: 256 * MIB,
        ..small_budget()
    };
    let max_bytes = large_requests_from_many_connections(unbounded).await;
    assert!(max_bytes > budget, "only {max_bytes} bytes at once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_waits_for_budget_held_by_another_and_stops_reading() {
    let gate = Arc::new(Semaphore::new(0));
    let device = Arc::new(HookDevice::gated(MemDevice::new(MIB), Arc::clone(&gate)));
    let config = ServerConfig {
        max_in_flight_bytes: BLOCK,
        ..small_budget()
    };
    let provider = Arc::new(Exports::new().with("", "", Arc::clone(&device)));
    let server = TestServer::start_with(provider, config).await;
    let mut holder = RawClient::unix(&server.unix_path()).await;
    holder.go("", false, false).await;
    holder.send_request(0, CMD_READ, 1, 0, BLOCK as u32).await;
    device.wait_for_reads(1).await;

    let mut waiter = RawClient::tcp(server.tcp_addr()).await;
    waiter.go("", false, false).await;
    waiter.send_request(0, CMD_READ, 2, BLOCK, 4096).await;
    // Needs no budget, but the reader stopped before it.
    waiter.send_request(0, CMD_FLUSH, 3, 0, 0).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(device.reads_in_device.load(Ordering::SeqCst), 1);
    assert_eq!(device.inner.flushes.load(Ordering::Relaxed), 0);

    gate.add_permits(1000);
    let reply = within(5, holder.read_reply(BLOCK as usize)).await;
    assert_eq!((reply.handle(), reply.error()), (1, 0));
    let mut handles = Vec::new();
    for _ in 0..2 {
        let reply = within(5, waiter.read_reply_with(|h| (h == 2) as usize * 4096)).await;
        assert_eq!(reply.error(), 0);
        handles.push(reply.handle());
    }
    handles.sort();
    assert_eq!(handles, [2, 3]);
    assert_eq!(device.max_reads_in_device.load(Ordering::SeqCst), 1);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_while_waiting_for_budget() {
    let gate = Arc::new(Semaphore::new(0));
    let device = Arc::new(HookDevice::gated(MemDevice::new(MIB), Arc::clone(&gate)));
    let config = ServerConfig {
        max_in_flight_bytes: BLOCK,
        shutdown_grace_ms: 200,
        ..small_budget()
    };
    let provider = Arc::new(Exports::new().with("", "", Arc::clone(&device)));
    let server = TestServer::start_with(provider, config).await;
    let mut holder = RawClient::unix(&server.unix_path()).await;
    holder.go("", false, false).await;
    holder.send_request(0, CMD_READ, 1, 0, BLOCK as u32).await;
    device.wait_for_reads(1).await;
    let mut waiter = RawClient::tcp(server.tcp_addr()).await;
    waiter.go("", false, false).await;
    let mut payload = request(CMD_WRITE, 2, BLOCK, BLOCK);
    payload.extend_from_slice(&vec![7u8; BLOCK as usize]);
    waiter.stream.write_all(&payload).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    within(10, server.stop()).await;
    assert!(within(5, waiter.closed_by_server()).await);
    assert!(within(5, holder.closed_by_server()).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_holds_at_most_its_share_of_the_budget() {
    const GREEDY_READS: u64 = 16;
    // The default share (a quarter of the budget), then a share of the
    // whole budget: what the bound is without it.
    for share in [None, Some(4 * MIB)] {
        let config = ServerConfig {
            max_request_bytes: BLOCK as u32,
            max_in_flight_bytes: 4 * MIB,
            max_in_flight_bytes_per_connection: share,
            ..ServerConfig::default()
        };
        let share_bytes = config.in_flight_bytes_per_connection();
        let share_blocks = (share_bytes / BLOCK) as usize;
        assert_eq!(share_blocks, if share.is_none() { 4 } else { 16 });
        // The greedy connection's READs stay in the device until the gate
        // opens: it holds all the budget it can get.
        let gate = Arc::new(Semaphore::new(0));
        let greedy_device = Arc::new(HookDevice::gated(
            MemDevice::new(GREEDY_READS * BLOCK),
            Arc::clone(&gate),
        ));
        for block in 0..GREEDY_READS {
            greedy_device
                .inner
                .fill(block * BLOCK, &pattern(5, block, 0));
        }
        let other_device = Arc::new(HookDevice::slow(
            MemDevice::new(8 * BLOCK),
            Duration::from_millis(5),
        ));
        let provider = Arc::new(
            Exports::new()
                .with("greedy", "", Arc::clone(&greedy_device))
                .with("", "", Arc::clone(&other_device)),
        );
        let server = TestServer::start_with(provider, config).await;
        let mut greedy = RawClient::unix(&server.unix_path()).await;
        greedy.go("greedy", false, false).await;
        for block in 0..GREEDY_READS {
            greedy
                .send_request(0, CMD_READ, block, block * BLOCK, BLOCK as u32)
                .await;
        }
        greedy_device.wait_for_reads(share_blocks).await;
        let mut other = RawClient::tcp(server.tcp_addr()).await;
        other.go("", true, false).await;
        if share.is_none() {
            // The other connection writes and reads back its data meanwhile.
            other = within(10, write_then_read(other, 1, 0, 8, 0)).await;
            let other_max_bytes = other_device.max_bytes_in_device.load(Ordering::SeqCst);
            assert!(other_max_bytes > 0 && other_max_bytes as u64 <= share_bytes);
        } else {
            // The greedy connection took the whole budget: the other waits.
            other.send_write(1, 0, &pattern(1, 0, 0)).await;
            let waited = tokio::time::timeout(Duration::from_millis(300), other.read_reply(0));
            assert!(
                waited.await.is_err(),
                "the write did not wait for the budget"
            );
            assert_eq!(other_device.max_bytes_in_device.load(Ordering::SeqCst), 0);
        }
        let held = greedy_device.reads_in_device.load(Ordering::SeqCst);
        assert!(held <= share_blocks, "{held} reads in the device");
        gate.add_permits(1000);
        for _ in 0..GREEDY_READS {
            match within(10, greedy.read_reply(BLOCK as usize)).await {
                RawReply::Simple {
                    error: 0,
                    handle,
                    data,
                } => assert!(data == pattern(5, handle, 0), "block {handle}"),
                other => panic!("{other:?}"),
            }
        }
        let max_held = greedy_device.max_reads_in_device.load(Ordering::SeqCst);
        assert_eq!(max_held, share_blocks);
        if share.is_some() {
            // The budget came back with the greedy connection's replies.
            let reply = within(10, other.read_reply(0)).await;
            assert_eq!((reply.handle(), reply.error()), (1, 0));
        }
        server.stop().await;
    }
}

#[tokio::test]
async fn bind_rejects_a_connection_share_smaller_than_a_request() {
    common::init_logging();
    let dir = tempfile::tempdir().unwrap();
    let addr = ListenAddr::Unix(dir.path().join("x.sock"));
    let provider = Arc::new(Exports::new().with("", "", Arc::new(MemDevice::new(MIB))));
    let config = ServerConfig {
        max_request_bytes: 32 << 20,
        max_in_flight_bytes_per_connection: Some((32 << 20) - 1),
        ..ServerConfig::default()
    };
    let error = Server::bind(Arc::clone(&provider), std::slice::from_ref(&addr), config)
        .await
        .err()
        .unwrap();
    assert_eq!(error.kind(), ErrorKind::InvalidInput);
    let message = error.to_string();
    assert!(
        message.contains("max_in_flight_bytes_per_connection")
            && message.contains("max_request_bytes"),
        "{message}"
    );
    assert!(!dir.path().join("x.sock").exists());
    let config = ServerConfig {
        reply_stall_timeout_ms: 0,
        ..ServerConfig::default()
    };
    let error = Server::bind(Arc::clone(&provider), std::slice::from_ref(&addr), config)
        .await
        .err()
        .unwrap();
    assert_eq!(error.kind(), ErrorKind::InvalidInput);
    // Equal is enough; the default is valid with any valid budget.
    let config = ServerConfig {
        max_in_flight_bytes_per_connection: Some(32 << 20),
        ..ServerConfig::default()
    };
    assert!(config.validate().is_ok());
    let config = ServerConfig {
        max_in_flight_bytes: 32 << 20,
        ..ServerConfig::default()
    };
    assert_eq!(config.in_flight_bytes_per_connection(), 32 << 20);
    assert!(Server::bind(provider, &[addr], config).await.is_ok());
}

#[tokio::test]
async fn bind_rejects_a_budget_smaller_than_a_request() {
    common::init_logging();
    let dir = tempfile::tempdir().unwrap();
    let addr = ListenAddr::Unix(dir.path().join("x.sock"));
    let provider = Arc::new(Exports::new().with("", "", Arc::new(MemDevice::new(MIB))));
    let config = ServerConfig {
        max_request_bytes: 32 << 20,
        max_in_flight_bytes: (32 << 20) - 1,
        ..ServerConfig::default()
    };
    let error = Server::bind(Arc::clone(&provider), std::slice::from_ref(&addr), config)
        .await
        .err()
        .unwrap();
    assert_eq!(error.kind(), ErrorKind::InvalidInput);
    let message = error.to_string();
    assert!(
        message.contains("max_in_flight_bytes") && message.contains("max_request_bytes"),
        "{message}"
    );
    assert!(!dir.path().join("x.sock").exists());
    let config = ServerConfig {
        max_connections: 0,
        ..ServerConfig::default()
    };
    let error = Server::bind(Arc::clone(&provider), std::slice::from_ref(&addr), config)
        .await
        .err()
        .unwrap();
    assert_eq!(error.kind(), ErrorKind::InvalidInput);
    // Equal is enough.
    let config = ServerConfig {
        max_in_flight_bytes: 32 << 20,
        ..ServerConfig::default()
    };
    assert!(Server::bind(provider, &[addr], config).await.is_ok());
}

/// Whether the server closes a fresh connection without a greeting.
async fn refused(stream: &mut (impl AsyncReadExt + Unpin)) -> bool {
    let mut byte = [0u8; 1];
    match within(5, stream.read(&mut byte)).await {
        Ok(0) => true,
        Ok(_) => false,
        Err(error) => error.kind() == ErrorKind::ConnectionReset,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_limit_are_closed_at_once() {
    let config = ServerConfig {
        max_connections: 2,
        ..ServerConfig::default()
    };
    let device = Arc::new(MemDevice::new(MIB));
    device.fill(0, b"still served");
    let provider = Arc::new(Exports::new().with("", "", device));
    let server = TestServer::start_with(provider, config).await;
    let mut first = RawClient::unix(&server.unix_path()).await;
    first.go("", false, false).await;
    let mut second = RawClient::tcp(server.tcp_addr()).await;
    second.go("", true, false).await;

    // Over the limit, on either listener, many times: closed at once.
    for _ in 0..20 {
        let mut unix = tokio::net::UnixStream::connect(server.unix_path())
            .await
            .unwrap();
        assert!(refused(&mut unix).await, "unix connection not refused");
        let mut tcp = TcpStream::connect(server.tcp_addr()).await.unwrap();
        assert!(refused(&mut tcp).await, "tcp connection not refused");
    }
    // The admitted ones are unaffected.
    second.send_request(0, CMD_READ, 7, 0, 12).await;
    match within(5, second.read_reply(12)).await {
        RawReply::Chunk { payload, .. } => assert_eq!(&payload[8..], b"still served"),
        other => panic!("{other:?}"),
    }

    // Once one leaves, a new connection gets its slot (the server notices
    // the departure asynchronously: retry until admitted).
    first.send_request(0, CMD_DISC, 0, 0, 0).await;
    assert!(within(5, first.closed_by_server()).await);
    let third = within(10, async {
        loop {
            let stream = TcpStream::connect(server.tcp_addr()).await.unwrap();
            let mut byte = [0u8; 1];
            if matches!(stream.peek(&mut byte).await, Ok(1)) {
                break stream;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    third.set_nodelay(true).unwrap();
    let mut third = RawClient {
        stream: Box::pin(third),
    };
    third.go("", false, false).await;
    third.send_request(0, CMD_READ, 8, 0, 12).await;
    match within(5, third.read_reply(12)).await {
        RawReply::Simple { error: 0, data, .. } => assert_eq!(data, b"still served"),
        other => panic!("{other:?}"),
    }
    // And the limit holds again.
    let mut fourth = TcpStream::connect(server.tcp_addr()).await.unwrap();
    assert!(refused(&mut fourth).await);
    server.stop().await;
}
