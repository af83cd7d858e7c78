//! Clients that stop reading their replies: closed after the reply stall
//! timeout with everything they held of the byte budget released, while
//! other connections go on; and clients that read slowly but steadily,
//! which are never cut.

// Test helpers outside #[test] functions unwrap too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::mem_device::{Exports, MemDevice};
use common::pipeline::{pattern, write_then_read, BLOCK, KIB, MIB};
use common::raw::{read_reply_from, HangUpWatch, RawClient, RawReply};
use common::{within, TestServer};
use nbd_proto::consts::*;
use nbd_server::ServerConfig;
use tokio::io::{AsyncRead, AsyncReadExt};

const STALL: Duration = Duration::from_millis(300);
/// The stall timeout of the slow readers: still far longer than the gaps
/// between the signs of progress they give.
const SLOW_READER_STALL: Duration = Duration::from_millis(500);
/// Size of the stuck client's READs.
const LARGE_READ: u64 = MIB;
/// READs the stuck client sends: far more reply data than socket buffers
/// and the byte budget hold.
const STUCK_READS: u64 = 64;
/// The other connection works on its own region above the stuck one's.
const OTHER_BASE: u64 = 8 * MIB;
const OTHER_BLOCKS: u64 = 8;

fn config(share: Option<u64>) -> ServerConfig {
    ServerConfig {
        max_request_bytes: LARGE_READ as u32,
        max_in_flight_bytes: 4 * MIB,
        max_in_flight_bytes_per_connection: share,
        reply_stall_timeout_ms: STALL.as_millis() as u64,
        ..ServerConfig::default()
    }
}

async fn start(config: ServerConfig) -> TestServer {
    let device = Arc::new(MemDevice::new(OTHER_BASE + OTHER_BLOCKS * BLOCK));
    let provider = Arc::new(Exports::new().with("", "", device));
    TestServer::start_with(provider, config).await
}

/// A client over unix (else TCP) that pipelines large READs and never
/// reads a reply, and the watch that tells when the server closed it.
async fn stuck_client(server: &TestServer, unix: bool) -> (RawClient, HangUpWatch) {
    let (mut client, watch) = match unix {
        true => RawClient::unix_watched(&server.unix_path()).await,
        false => RawClient::tcp_watched(server.tcp_addr()).await,
    };
    client.go("", false, false).await;
    for handle in 0..STUCK_READS {
        let offset_bytes = (handle % 8) * LARGE_READ;
        client
            .send_request(0, CMD_READ, handle, offset_bytes, LARGE_READ as u32)
            .await;
    }
    (client, watch)
}

/// A connection over the other transport than `unix`.
async fn other_client(server: &TestServer, unix: bool) -> RawClient {
    let mut client = match unix {
        true => RawClient::tcp(server.tcp_addr()).await,
        false => RawClient::unix(&server.unix_path()).await,
    };
    client.go("", true, false).await;
    client
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_replies_is_closed_while_others_go_on() {
    for unix in [true, false] {
        let server = start(config(None)).await;
        let (mut stuck, watch) = stuck_client(&server, unix).await;
        let sent = Instant::now();
        // Give the stuck connection time to take its share and fill the
        // socket buffers.
        tokio::time::sleep(Duration::from_millis(50)).await;
        // Its share is a quarter of the budget: the others go on.
        let other = other_client(&server, unix).await;
        let other = within(10, write_then_read(other, 1, OTHER_BASE, OTHER_BLOCKS, 0)).await;
        let worked_while_stuck = !watch.is_closed().await;
        within(10, watch.closed()).await;
        let closed_after = sent.elapsed();
        assert!(worked_while_stuck, "the stuck client was closed too early");
        assert!(closed_after >= STALL, "closed after {closed_after:?}");
        // And afterwards.
        let other = within(10, write_then_read(other, 1, OTHER_BASE, OTHER_BLOCKS, 1)).await;
        // What the stuck client gets: some replies, then end of stream.
        assert!(within(10, stuck.closed_by_server()).await);
        drop(other);
        server.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stall_timeout_returns_the_budget_a_stuck_client_held() {
    for unix in [true, false] {
        // A share of the whole budget: the stuck client takes all of it,
        // and only the stall timeout gives it back.
        let server = start(config(Some(4 * MIB))).await;
        let (mut stuck, watch) = stuck_client(&server, unix).await;
        let sent = Instant::now();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let other = other_client(&server, unix).await;
        let other = within(10, write_then_read(other, 1, OTHER_BASE, OTHER_BLOCKS, 0)).await;
        let waited = sent.elapsed();
        assert!(
            waited >= STALL,
            "done after {waited:?}, before the stall timeout"
        );
        within(5, watch.closed()).await;
        assert!(within(10, stuck.closed_by_server()).await);
        // The whole budget is back.
        let other = within(10, write_then_read(other, 1, OTHER_BASE, OTHER_BLOCKS, 1)).await;
        drop(other);
        server.stop().await;
    }
}

/// Reads `total_bytes` off `stream`, at most `chunk_bytes` every `pause`.
/// Panics if the server closes the connection first.
async fn read_slowly(
    stream: &mut (impl AsyncRead + Unpin + ?Sized),
    total_bytes: usize,
    chunk_bytes: usize,
    pause: Duration,
) -> Vec<u8> {
    let mut received = Vec::with_capacity(total_bytes);
    let mut chunk = vec![0u8; chunk_bytes];
    while received.len() < total_bytes {
        tokio::time::sleep(pause).await;
        let wanted = chunk_bytes.min(total_bytes - received.len());
        let read_bytes = stream.read(&mut chunk[..wanted]).await.unwrap();
        assert_ne!(read_bytes, 0, "closed after {} bytes", received.len());
        received.extend_from_slice(&chunk[..read_bytes]);
    }
    received
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_but_steady_reader_is_not_cut() {
    let device = Arc::new(MemDevice::new(16 * BLOCK));
    let provider = Arc::new(Exports::new().with("", "", Arc::clone(&device)));
    let config = ServerConfig {
        reply_stall_timeout_ms: SLOW_READER_STALL.as_millis() as u64,
        ..config(None)
    };
    let server = TestServer::start_with(provider, config).await;
    // Reading 16 KiB (TCP: 64 KiB) every 50 ms, more than the socket
    // buffers hold: the socket accepts more replies only every 0.6 s
    // (TCP: 1.5 s) or so, but its send queue shrinks at least every 0.2 s.
    for (unix, blocks, chunk_bytes) in [(true, 4, 16 * KIB), (false, 16, 64 * KIB)] {
        for block in 0..blocks {
            device.fill(block * BLOCK, &pattern(7, block, 0));
        }
        let mut client = match unix {
            true => RawClient::unix(&server.unix_path()).await,
            false => RawClient::tcp(server.tcp_addr()).await,
        };
        client.go("", false, false).await;
        for block in 0..blocks {
            client
                .send_request(0, CMD_READ, block, block * BLOCK, BLOCK as u32)
                .await;
        }
        let reply_bytes = (SIMPLE_REPLY_HEADER_BYTES as u64 + BLOCK) as usize;
        let total_bytes = blocks as usize * reply_bytes;
        let started = Instant::now();
        let pause = Duration::from_millis(50);
        let received = within(
            60,
            read_slowly(&mut client.stream, total_bytes, chunk_bytes as usize, pause),
        )
        .await;
        let elapsed = started.elapsed();
        assert!(
            elapsed > 3 * SLOW_READER_STALL,
            "read everything in {elapsed:?}"
        );
        let mut replies = &received[..];
        let mut handles = HashSet::new();
        while !replies.is_empty() {
            match read_reply_from(&mut replies, |_| BLOCK as usize).await {
                RawReply::Simple {
                    error: 0,
                    handle,
                    data,
                } => {
                    assert!(data == pattern(7, handle, 0), "block {handle}");
                    assert!(handles.insert(handle));
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(handles.len(), blocks as usize);
        // Still served.
        client.send_request(0, CMD_FLUSH, 99, 0, 0).await;
        let reply = within(5, client.read_reply(0)).await;
        assert_eq!((reply.handle(), reply.error()), (99, 0));
    }
    server.stop().await;
}
