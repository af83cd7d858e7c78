//! Memory bounds: the server-wide byte budget of READ/WRITE data in flight
//! (held across connections, never exceeded, no deadlock, config checked
//! at bind) and the connection limit.

// Test helpers outside #[test] functions unwrap too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::ErrorKind;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use common::hook_device::HookDevice;
use common::mem_device::{Exports, MemDevice};
use common::raw::{read_reply_from, RawClient, RawReply};
use common::{within, TestServer};
use nbd_proto::consts::*;
use nbd_proto::RequestHeader;
use nbd_server::{ListenAddr, Server, ServerConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;
/// Request size of the budget tests: the configured maximum.
const BLOCK: u64 = 256 * KIB;

fn small_budget() -> ServerConfig {
    ServerConfig {
        max_request_bytes: BLOCK as u32,
        max_in_flight_bytes: MIB,
        ..ServerConfig::default()
    }
}

fn request(command_type: u16, handle: u64, offset_bytes: u64, length_bytes: u64) -> Vec<u8> {
    RequestHeader {
        flags: 0,
        command_type,
        handle,
        offset_bytes,
        length_bytes: length_bytes as u32,
    }
    .encode()
    .to_vec()
}

/// The bytes block `block` of connection `connection` holds after `round`.
fn pattern(connection: u64, block: u64, round: u64) -> Vec<u8> {
    let seed = (connection * 64 + block * 4 + round) as u8;
    (0..BLOCK as usize)
        .map(|i| seed.wrapping_add((i / 4096) as u8))
        .collect()
}

/// One request of a pipeline, with what its reply must carry.
enum Step {
    Write { block: u64, round: u64 },
    Read { block: u64, round: u64 },
}

/// Sends `steps` on a pipelined connection while reading the replies
/// concurrently (as real clients do), checking every reply and READ data.
async fn pipeline(client: RawClient, connection: u64, base: u64, steps: Vec<Step>) -> RawClient {
    let (mut read_half, mut write_half) = tokio::io::split(client.stream);
    let count = steps.len();
    let steps = Arc::new(steps);
    let sender = {
        let steps = Arc::clone(&steps);
        async move {
            for (handle, step) in steps.iter().enumerate() {
                let handle = handle as u64;
                let bytes = match *step {
                    Step::Write { block, round } => {
                        let mut bytes = request(CMD_WRITE, handle, base + block * BLOCK, BLOCK);
                        bytes.extend_from_slice(&pattern(connection, block, round));
                        bytes
                    }
                    Step::Read { block, .. } => {
                        request(CMD_READ, handle, base + block * BLOCK, BLOCK)
                    }
                };
                write_half.write_all(&bytes).await.unwrap();
            }
            write_half
        }
    };
    let receiver = async {
        let mut answered = vec![false; count];
        for _ in 0..count {
            let length = |handle: u64| match steps[handle as usize] {
                Step::Read { .. } => BLOCK as usize,
                Step::Write { .. } => 0,
            };
            let reply = read_reply_from(&mut read_half, length).await;
            assert_eq!(reply.error(), 0, "{reply:?}");
            let handle = reply.handle();
            let data = match reply {
                RawReply::Simple { data, .. } => data,
                RawReply::Chunk { header, payload } => {
                    assert_ne!(header.flags & REPLY_FLAG_DONE, 0);
                    payload.get(8..).unwrap_or_default().to_vec()
                }
            };
            match steps[handle as usize] {
                Step::Read { block, round } => {
                    assert!(data == pattern(connection, block, round), "block {block}");
                }
                Step::Write { .. } => assert!(data.is_empty()),
            }
            assert!(!std::mem::replace(&mut answered[handle as usize], true));
        }
    };
    let (write_half, ()) = tokio::join!(sender, receiver);
    RawClient {
        stream: Box::pin(read_half.unsplit(write_half)),
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

/// Waits until `count` reads are inside the device.
async fn wait_for_reads(device: &HookDevice, count: usize) {
    within(10, async {
        while device.reads_in_device.load(Ordering::SeqCst) < count {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
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
    wait_for_reads(&device, 1).await;

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
    wait_for_reads(&device, 1).await;
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
