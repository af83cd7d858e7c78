//! Protocol edge cases over raw sockets, each followed by a check that a
//! fresh connection still works.

// Test helpers outside #[test] functions unwrap too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::mem_device::{Exports, MemDevice};
use common::raw::{RawClient, RawReply};
use common::{within, TestServer};
use nbd_proto::consts::*;
use nbd_proto::*;
use nbd_server::{ExportInfo, ExportProvider, ServerConfig};
use tokio::io::AsyncWriteExt;

const MIB: u64 = 1024 * 1024;
const SIZE: u64 = 4 * MIB;

fn provider(device: Arc<MemDevice>) -> Arc<Exports<MemDevice>> {
    Arc::new(Exports::new().with("", "default", device).with(
        "ro",
        "read-only",
        Arc::new(MemDevice::new(MIB).read_only()),
    ))
}

async fn start() -> (TestServer, Arc<MemDevice>) {
    let device = Arc::new(MemDevice::new(SIZE));
    (
        TestServer::start(provider(Arc::clone(&device))).await,
        device,
    )
}

/// A full structured connection over tcp does a write and a read.
async fn still_works(server: &TestServer) {
    within(10, async {
        let mut client = RawClient::tcp(server.tcp_addr()).await;
        client.go("", true, true).await;
        client.send_write(1, 512, b"alive").await;
        assert_eq!(client.read_reply(0).await.error(), 0);
        client.send_request(0, CMD_READ, 2, 512, 5).await;
        match client.read_reply(0).await {
            RawReply::Chunk { header, payload } => {
                assert_eq!(header.reply_type, REPLY_TYPE_OFFSET_DATA);
                assert_eq!(
                    decode_offset_data_payload(&payload).unwrap(),
                    (512, &b"alive"[..])
                );
            }
            other => panic!("{other:?}"),
        }
        client.send_request(0, CMD_DISC, 3, 0, 0).await;
        assert!(client.closed_by_server().await);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_with_unknown_export_gets_err_unknown_and_haggling_continues() {
    let (server, _) = start().await;
    let mut client = RawClient::unix(&server.unix_path()).await;
    client.greet().await;
    let request = InfoRequest {
        export_name: "nope".into(),
        info_types: vec![],
    };
    client.send_option(OPT_GO, &request.encode().unwrap()).await;
    let (header, message) = client.read_option_reply().await;
    assert_eq!(header.reply_type, REP_ERR_UNKNOWN);
    assert!(String::from_utf8(message).unwrap().contains("nope"));
    client
        .send_option(OPT_INFO, &request.encode().unwrap())
        .await;
    assert_eq!(
        client.read_option_reply().await.0.reply_type,
        REP_ERR_UNKNOWN
    );
    // The same connection can still pick a real export.
    let request = InfoRequest {
        export_name: String::new(),
        info_types: vec![INFO_NAME, INFO_DESCRIPTION],
    };
    client.send_option(OPT_GO, &request.encode().unwrap()).await;
    let replies = client.read_option_replies().await;
    let infos: Vec<InfoReply> = replies[..replies.len() - 1]
        .iter()
        .map(|(header, payload)| {
            assert_eq!(header.reply_type, REP_INFO);
            InfoReply::decode(payload).unwrap()
        })
        .collect();
    assert!(infos.contains(&InfoReply::Export {
        size_bytes: SIZE,
        transmission_flags: 0x0d6d
    }));
    assert!(infos.contains(&InfoReply::Name(String::new())));
    assert!(infos.contains(&InfoReply::Description("default".into())));
    assert!(infos
        .iter()
        .any(|info| matches!(info, InfoReply::BlockSize { .. })));
    assert_eq!(replies.last().unwrap().0.reply_type, REP_ACK);
    // Transmission with simple replies.
    client.send_request(0, CMD_READ, 7, 0, 16).await;
    match client.read_reply(16).await {
        RawReply::Simple {
            error: 0,
            handle: 7,
            data,
        } => assert_eq!(data, vec![0; 16]),
        other => panic!("{other:?}"),
    }
    still_works(&server).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_name_unknown_closes_and_known_enters_transmission() {
    let (server, device) = start().await;
    let mut client = RawClient::tcp(server.tcp_addr()).await;
    client.greet().await;
    client.send_option(OPT_EXPORT_NAME, b"nope").await;
    assert!(within(5, client.closed_by_server()).await);

    device.fill(100, b"hello");
    let mut client = RawClient::unix(&server.unix_path()).await;
    client.greet().await;
    client.send_option(OPT_EXPORT_NAME, b"").await;
    let mut reply = [0u8; EXPORT_NAME_REPLY_SHORT_BYTES];
    tokio::io::AsyncReadExt::read_exact(&mut client.stream, &mut reply)
        .await
        .unwrap();
    let reply = ExportNameReply::decode(&reply).unwrap();
    assert_eq!(reply.size_bytes, SIZE);
    client.send_request(0, CMD_READ, 1, 100, 5).await;
    match client.read_reply(5).await {
        RawReply::Simple { error: 0, data, .. } => assert_eq!(data, b"hello"),
        other => panic!("{other:?}"),
    }
    still_works(&server).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn options_list_abort_unsupported_and_invalid() {
    let (server, _) = start().await;
    let mut client = RawClient::unix(&server.unix_path()).await;
    client.greet().await;

    client.send_option(OPT_LIST, &[]).await;
    let replies = client.read_option_replies().await;
    let entries: Vec<ServerEntry> = replies[..2]
        .iter()
        .map(|(_, p)| ServerEntry::decode(p).unwrap())
        .collect();
    assert_eq!(
        entries[1],
        ServerEntry {
            name: "ro".into(),
            description: "read-only".into()
        }
    );
    assert_eq!(replies[2].0.reply_type, REP_ACK);

    for (option, data, expected) in [
        (OPT_LIST, &b"x"[..], REP_ERR_INVALID),
        (OPT_STARTTLS, &[][..], REP_ERR_UNSUP),
        (OPT_EXTENDED_HEADERS, &[][..], REP_ERR_UNSUP),
        (OPT_PEEK_EXPORT, &[][..], REP_ERR_UNSUP),
        (0xdead_beef, &b"ignored data"[..], REP_ERR_UNSUP),
        (OPT_STRUCTURED_REPLY, &b"x"[..], REP_ERR_INVALID),
        (
            OPT_SET_META_CONTEXT,
            &[0, 0, 0, 0, 0, 0, 0, 0][..],
            REP_ERR_INVALID,
        ),
        (OPT_GO, &[0, 0, 0, 9][..], REP_ERR_INVALID),
    ] {
        client.send_option(option, data).await;
        let (header, _) = client.read_option_reply().await;
        assert_eq!((header.option, header.reply_type), (option, expected));
    }

    client.send_option(OPT_STRUCTURED_REPLY, &[]).await;
    assert_eq!(client.read_option_reply().await.0.reply_type, REP_ACK);
    for queries in [
        vec![],
        vec!["base:".to_owned()],
        vec!["base:allocation".to_owned(), "x-other:thing".to_owned()],
    ] {
        let request = MetaContextRequest {
            export_name: String::new(),
            queries,
        };
        client
            .send_option(OPT_LIST_META_CONTEXT, &request.encode().unwrap())
            .await;
        let replies = client.read_option_replies().await;
        assert_eq!(replies.len(), 2);
        let context = MetaContextReply::decode(&replies[0].1).unwrap();
        assert_eq!(context.name, CONTEXT_BASE_ALLOCATION);
    }
    let request = MetaContextRequest {
        export_name: String::new(),
        queries: vec!["qemu:dirty-bitmap:x".into()],
    };
    client
        .send_option(OPT_SET_META_CONTEXT, &request.encode().unwrap())
        .await;
    assert_eq!(
        client.read_option_replies().await.len(),
        1,
        "nothing selected, just the ACK"
    );
    client.send_option(OPT_SET_META_CONTEXT, &[1, 2, 3]).await;
    assert_eq!(
        client.read_option_reply().await.0.reply_type,
        REP_ERR_INVALID
    );

    client.send_option(OPT_ABORT, &[]).await;
    assert_eq!(client.read_option_reply().await.0.reply_type, REP_ACK);
    assert!(within(5, client.closed_by_server()).await);
    still_works(&server).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_past_the_end_oversized_and_unknown_get_errors() {
    let (server, device) = start().await;
    let mut client = RawClient::unix(&server.unix_path()).await;
    client.go("", true, false).await;
    let mut handle = 0;
    let cases: Vec<(u16, u16, u64, u32, u32)> = vec![
        (CMD_READ, 0, SIZE, 1, EINVAL),
        (CMD_READ, 0, u64::MAX, 2, EINVAL),
        (CMD_READ, 0, 0, 64 * MIB as u32, EINVAL),
        (CMD_TRIM, 0, SIZE - 1, 2, EINVAL),
        (CMD_WRITE_ZEROES, 0, SIZE, 1, ENOSPC),
        (CMD_CACHE, 0, SIZE, 1, EINVAL),
        (99, 0, 0, 1, EINVAL),
        (CMD_READ, 1 << 9, 0, 1, EINVAL),
        (CMD_READ, CMD_FLAG_DF, 0, 1, EINVAL),
        (CMD_BLOCK_STATUS, 0, 0, 512, EINVAL),
        (CMD_FLUSH, 0, 1, 0, EINVAL),
    ];
    for (command_type, flags, offset_bytes, length_bytes, errno) in cases {
        handle += 1;
        client
            .send_request(flags, command_type, handle, offset_bytes, length_bytes)
            .await;
        let reply = client.read_reply(0).await;
        assert_eq!(reply.handle(), handle);
        assert_eq!(reply.error(), errno, "command {command_type} {reply:?}");
        match reply {
            RawReply::Chunk { header, payload } => {
                assert!(header.is_done());
                assert!(!ErrorChunk::decode(header.reply_type, &payload)
                    .unwrap()
                    .message
                    .is_empty());
            }
            other => panic!("structured errors expected: {other:?}"),
        }
    }
    // A write past the end: ENOSPC, payload skipped, connection fine.
    client.send_write(100, SIZE - 2, b"four").await;
    assert_eq!(client.read_reply(0).await.error(), ENOSPC);
    // An oversized write within what we skip: EINVAL, payload skipped.
    let big = vec![0x5a; 32 * MIB as usize + 4096];
    client.send_write(101, 0, &big).await;
    assert_eq!(client.read_reply(0).await.error(), EINVAL);
    assert_eq!(device.snapshot(0, 4), vec![0; 4]);
    client.send_write(102, 0, b"ok").await;
    assert_eq!(client.read_reply(0).await.error(), 0);
    assert_eq!(device.snapshot(0, 2), b"ok");
    // Read-only export: writes get EPERM.
    let mut read_only = RawClient::tcp(server.tcp_addr()).await;
    read_only.go("ro", false, false).await;
    read_only.send_write(1, 0, b"nope").await;
    assert_eq!(read_only.read_reply(0).await.error(), EPERM);
    read_only.send_request(0, CMD_TRIM, 2, 0, 512).await;
    assert_eq!(read_only.read_reply(0).await.error(), EPERM);
    read_only.send_request(0, CMD_READ, 3, 0, 4).await;
    assert_eq!(read_only.read_reply(4).await.error(), 0);
    still_works(&server).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_write_and_bad_request_magic_close_the_connection() {
    let (server, _) = start().await;
    let mut client = RawClient::unix(&server.unix_path()).await;
    client.go("", true, false).await;
    client.send_request(0, CMD_WRITE, 1, 0, u32::MAX).await;
    // The server may already have hung up.
    let _ = client.stream.write_all(&[0u8; 4096]).await;
    assert!(within(5, client.closed_by_server()).await);
    still_works(&server).await;

    let mut client = RawClient::tcp(server.tcp_addr()).await;
    client.go("", false, false).await;
    client
        .stream
        .write_all(&[0x42; REQUEST_HEADER_BYTES])
        .await
        .unwrap();
    assert!(within(5, client.closed_by_server()).await);
    still_works(&server).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_handshakes_are_dropped() {
    let (server, _) = start().await;
    let mut garbage: Vec<Vec<u8>> = vec![
        // Unknown client flags.
        vec![0, 0, 0, 0xff],
        // Bad option magic.
        [&[0, 0, 0, 3][..], b"NOTMAGIC\0\0\0\x01\0\0\0\0"].concat(),
        // Huge option length.
        [
            &[0, 0, 0, 3][..],
            &OptionHeader {
                option: OPT_GO,
                length_bytes: 1 << 30,
            }
            .encode(),
        ]
        .concat(),
        // Text.
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
    ];
    garbage.push(
        (0..4096u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect(),
    );
    for bytes in garbage {
        let mut client = RawClient::tcp(server.tcp_addr()).await;
        let mut greeting = [0u8; GREETING_BYTES];
        tokio::io::AsyncReadExt::read_exact(&mut client.stream, &mut greeting)
            .await
            .unwrap();
        let _ = client.stream.write_all(&bytes).await;
        assert!(within(5, client.closed_by_server()).await);
    }
    still_works(&server).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_vanishing_mid_request_do_not_hurt_others() {
    let (server, _) = start().await;
    // Mid header.
    let mut client = RawClient::unix(&server.unix_path()).await;
    client.go("", true, true).await;
    client
        .stream
        .write_all(
            &RequestHeader {
                flags: 0,
                command_type: CMD_READ,
                handle: 1,
                offset_bytes: 0,
                length_bytes: 512,
            }
            .encode()[..10],
        )
        .await
        .unwrap();
    drop(client);
    // Mid payload.
    let mut client = RawClient::tcp(server.tcp_addr()).await;
    client.go("", true, true).await;
    client.send_request(0, CMD_WRITE, 1, 0, 65536).await;
    client.stream.write_all(&[1u8; 1000]).await.unwrap();
    drop(client);
    // Mid handshake.
    let mut client = RawClient::tcp(server.tcp_addr()).await;
    client.greet().await;
    client
        .stream
        .write_all(&IHAVEOPT.to_be_bytes())
        .await
        .unwrap();
    drop(client);
    // With requests in flight and replies unread.
    let mut client = RawClient::unix(&server.unix_path()).await;
    client.go("", true, true).await;
    for handle in 0..64 {
        client.send_request(0, CMD_READ, handle, 0, 65536).await;
    }
    drop(client);
    tokio::time::sleep(Duration::from_millis(100)).await;
    still_works(&server).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshake_timeout_closes_silent_clients() {
    let config = ServerConfig {
        handshake_timeout_ms: 300,
        ..ServerConfig::default()
    };
    let server = TestServer::start_with(provider(Arc::new(MemDevice::new(MIB))), config).await;
    let mut client = RawClient::tcp(server.tcp_addr()).await;
    let started = std::time::Instant::now();
    assert!(within(5, client.closed_by_server()).await);
    assert!(started.elapsed() >= Duration::from_millis(250));
    still_works(&server).await;
    server.stop().await;
}

/// A provider whose `open` takes its time (a strata standby registering
/// with its holder through the store takes seconds).
struct SlowOpen {
    inner: Arc<Exports<MemDevice>>,
    delay: Duration,
}

impl ExportProvider for SlowOpen {
    type Device = MemDevice;

    async fn list(&self) -> std::io::Result<Vec<ExportInfo>> {
        self.inner.list().await
    }

    async fn open(&self, name: &str) -> std::io::Result<Arc<MemDevice>> {
        tokio::time::sleep(self.delay).await;
        self.inner.open(name).await
    }
}

/// The handshake timeout bounds the client, not the provider's open: an
/// open three times longer than the timeout still lets the client in,
/// and a client silent after it is still cut off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshake_timeout_leaves_out_the_time_the_export_takes_to_open() {
    let config = ServerConfig {
        handshake_timeout_ms: 300,
        ..ServerConfig::default()
    };
    let slow = Arc::new(SlowOpen {
        inner: provider(Arc::new(MemDevice::new(MIB))),
        delay: Duration::from_millis(900),
    });
    let server = TestServer::start_with(slow, config).await;
    let mut client = RawClient::tcp(server.tcp_addr()).await;
    let started = std::time::Instant::now();
    let (size_bytes, _) = client.go("", true, true).await;
    assert_eq!(size_bytes, MIB);
    assert!(started.elapsed() >= Duration::from_millis(900));
    drop(client);
    let mut silent = RawClient::tcp(server.tcp_addr()).await;
    assert!(within(5, silent.closed_by_server()).await);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn block_status_needs_context_for_the_same_export() {
    let (server, device) = start().await;
    device.fill(0, &[1; 1024]);
    // Context negotiated for another export name: EINVAL.
    let mut client = RawClient::unix(&server.unix_path()).await;
    client.greet().await;
    client.send_option(OPT_STRUCTURED_REPLY, &[]).await;
    client.read_option_reply().await;
    let request = MetaContextRequest {
        export_name: "ro".into(),
        queries: vec![CONTEXT_BASE_ALLOCATION.into()],
    };
    client
        .send_option(OPT_SET_META_CONTEXT, &request.encode().unwrap())
        .await;
    client.read_option_replies().await;
    let go = InfoRequest {
        export_name: String::new(),
        info_types: vec![],
    };
    client.send_option(OPT_GO, &go.encode().unwrap()).await;
    client.read_option_replies().await;
    client.send_request(0, CMD_BLOCK_STATUS, 1, 0, 4096).await;
    assert_eq!(client.read_reply(0).await.error(), EINVAL);

    let mut client = RawClient::tcp(server.tcp_addr()).await;
    client.go("", true, true).await;
    client.send_request(0, CMD_BLOCK_STATUS, 2, 512, 4096).await;
    match client.read_reply(0).await {
        RawReply::Chunk { header, payload } => {
            assert_eq!(header.reply_type, REPLY_TYPE_BLOCK_STATUS);
            let (context_id, descriptors) = decode_block_status_payload(&payload).unwrap();
            assert_ne!(context_id, 0);
            let pairs: Vec<(u32, u32)> = descriptors
                .iter()
                .map(|d| (d.length_bytes, d.status_flags))
                .collect();
            assert_eq!(pairs, vec![(512, 0), (3584, 3)]);
        }
        other => panic!("{other:?}"),
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnect_answers_outstanding_requests_first() {
    let (server, _) = start().await;
    let mut client = RawClient::unix(&server.unix_path()).await;
    client.go("", true, false).await;
    for handle in 1..=20 {
        client.send_request(0, CMD_READ, handle, 0, 4096).await;
    }
    client.send_request(0, CMD_DISC, 21, 0, 0).await;
    let mut handles = Vec::new();
    for _ in 1..=20 {
        handles.push(client.read_reply(0).await.handle());
    }
    handles.sort();
    assert_eq!(handles, (1..=20).collect::<Vec<_>>());
    assert!(within(5, client.closed_by_server()).await);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_name_without_no_zeroes_sends_the_124_zero_bytes() {
    let (server, _) = start().await;
    let mut client = RawClient::tcp(server.tcp_addr()).await;
    let mut greeting = [0u8; GREETING_BYTES];
    tokio::io::AsyncReadExt::read_exact(&mut client.stream, &mut greeting)
        .await
        .unwrap();
    let flags = ClientFlags {
        fixed_newstyle: true,
        no_zeroes: false,
    };
    client.stream.write_all(&flags.encode()).await.unwrap();
    client.send_option(OPT_EXPORT_NAME, b"").await;
    let mut reply = [0xffu8; EXPORT_NAME_REPLY_SHORT_BYTES + EXPORT_NAME_REPLY_ZEROES_BYTES];
    tokio::io::AsyncReadExt::read_exact(&mut client.stream, &mut reply)
        .await
        .unwrap();
    assert_eq!(ExportNameReply::decode(&reply).unwrap().size_bytes, SIZE);
    assert!(reply[EXPORT_NAME_REPLY_SHORT_BYTES..]
        .iter()
        .all(|&b| b == 0));
    client.send_request(0, CMD_READ, 1, 0, 8).await;
    assert_eq!(client.read_reply(8).await.error(), 0);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_replies_is_dropped() {
    let (server, _) = start().await;
    let socket = std::os::unix::net::UnixStream::connect(server.unix_path()).unwrap();
    socket.set_nonblocking(true).unwrap();
    let control = socket.try_clone().unwrap();
    let mut client = RawClient {
        stream: Box::pin(tokio::net::UnixStream::from_std(socket).unwrap()),
    };
    client.go("", true, false).await;
    control.shutdown(std::net::Shutdown::Read).unwrap();
    let dropped = within(10, async {
        for handle in 0.. {
            let header = RequestHeader {
                flags: 0,
                command_type: CMD_READ,
                handle,
                offset_bytes: 0,
                length_bytes: 65536,
            };
            if client.stream.write_all(&header.encode()).await.is_err() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        false
    })
    .await;
    assert!(dropped);
    still_works(&server).await;
    server.stop().await;
}
