//! Replies out of order, the in-flight bound, many connections at once.

// Test helpers outside #[test] functions unwrap too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use common::hook_device::HookDevice;
use common::mem_device::{Exports, MemDevice};
use common::raw::{RawClient, RawReply};
use common::{within, TestServer};
use nbd_proto::consts::*;
use nbd_server::ServerConfig;
use tokio::sync::Semaphore;

const MIB: u64 = 1024 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_request_overtakes_a_slow_one() {
    let mut device = HookDevice::new(MemDevice::new(MIB));
    device.slow_read = Some((0, Duration::from_millis(400)));
    let server = TestServer::start(Arc::new(Exports::new().with("", "", Arc::new(device)))).await;
    for structured in [false, true] {
        let mut client = RawClient::unix(&server.unix_path()).await;
        client.go("", structured, false).await;
        client.send_request(0, CMD_READ, 1, 0, 4096).await;
        client.send_request(0, CMD_READ, 2, 4096, 4096).await;
        client.send_write(3, 8192, b"quick").await;
        let order: Vec<u64> = within(5, async {
            let mut order = Vec::new();
            for _ in 0..3 {
                let length = |handle| if handle == 3 { 0 } else { 4096 };
                order.push(client.read_reply_with(length).await.handle());
            }
            order
        })
        .await;
        assert_eq!(
            order.last(),
            Some(&1),
            "the slow read must finish last: {order:?}"
        );
    }
    server.stop().await;
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
async fn in_flight_requests_are_bounded_per_connection() {
    let gate = Arc::new(Semaphore::new(0));
    let device = Arc::new(HookDevice::gated(MemDevice::new(MIB), Arc::clone(&gate)));
    let config = ServerConfig {
        max_in_flight_per_connection: 4,
        ..ServerConfig::default()
    };
    let provider = Arc::new(Exports::new().with("", "", Arc::clone(&device)));
    let server = TestServer::start_with(provider, config).await;
    let mut client = RawClient::tcp(server.tcp_addr()).await;
    client.go("", true, false).await;
    for handle in 0..10 {
        client
            .send_request(0, CMD_READ, handle, handle * 512, 512)
            .await;
    }
    wait_for_reads(&device, 4).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(device.reads_in_device.load(Ordering::SeqCst), 4);
    // A second connection has its own budget.
    let mut other = RawClient::unix(&server.unix_path()).await;
    other.go("", true, false).await;
    other.send_request(0, CMD_READ, 99, 0, 512).await;
    wait_for_reads(&device, 5).await;
    gate.add_permits(1000);
    let mut handles: Vec<u64> = within(5, async {
        let mut handles = Vec::new();
        for _ in 0..10 {
            let reply = client.read_reply(0).await;
            assert!(matches!(reply, RawReply::Chunk { .. }));
            assert_eq!(reply.error(), 0);
            handles.push(reply.handle());
        }
        handles
    })
    .await;
    handles.sort();
    assert_eq!(handles, (0..10).collect::<Vec<_>>());
    assert_eq!(within(5, other.read_reply(0)).await.handle(), 99);
    assert_eq!(device.max_reads_in_device.load(Ordering::SeqCst), 5);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_connections_write_and_verify_concurrently() {
    let device = Arc::new(MemDevice::new(16 * MIB));
    let provider = Arc::new(Exports::new().with("", "", Arc::clone(&device)));
    let server = TestServer::start(provider).await;
    let mut tasks = Vec::new();
    for connection in 0..8u64 {
        let unix = server.unix_path();
        let tcp = server.tcp_addr();
        tasks.push(tokio::spawn(async move {
            let mut client = match connection % 2 {
                0 => RawClient::unix(&unix).await,
                _ => RawClient::tcp(tcp).await,
            };
            client.go("", connection % 4 < 2, false).await;
            let base = connection * 2 * MIB;
            let pattern = |block: u64| vec![(connection * 31 + block) as u8; 4096];
            for block in 0..256 {
                client
                    .send_write(block, base + block * 4096, &pattern(block))
                    .await;
            }
            for _ in 0..256 {
                assert_eq!(client.read_reply(0).await.error(), 0);
            }
            for block in 0..256 {
                client
                    .send_request(0, CMD_READ, block, base + block * 4096, 4096)
                    .await;
            }
            for _ in 0..256 {
                let (handle, data) = match client.read_reply(4096).await {
                    RawReply::Simple {
                        error: 0,
                        handle,
                        data,
                    } => (handle, data),
                    RawReply::Chunk { header, payload } => (header.handle, payload[8..].to_vec()),
                    other => panic!("{other:?}"),
                };
                assert_eq!(data, pattern(handle));
            }
        }));
    }
    for task in tasks {
        within(30, task).await.unwrap();
    }
    server.stop().await;
}
