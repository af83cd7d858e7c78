//! NBD over TLS (STARTTLS): the policy a raw client sees before TLS (no
//! option but STARTTLS and ABORT is answered under `require`, so nothing
//! can be listed or served in plaintext), a whole connection inside TLS,
//! and real clients: nbdinfo and nbdcopy (libnbd, GnuTLS) with
//! `nbds+unix://` and `nbds://` URIs and `tls-certificates=`, qemu-img and
//! qemu-io through `--object tls-creds-x509`; refusals of plaintext
//! clients, of clients that do not trust the server, and (with a client
//! CA) of clients without a certificate or with one from another CA.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::sync::Arc;

use common::mem_device::{Exports, MemDevice};
use common::raw::RawClient;
use common::{run, run_ok, within, TestServer};
use nbd_proto::consts::*;
use nbd_proto::*;
use nbd_server::{Tls, TlsMode};
use strata_testkit::TestPki;

const MIB: u64 = 1024 * 1024;

struct Setup {
    server: TestServer,
    pki: TestPki,
    _dir: tempfile::TempDir,
}

async fn start(mode: TlsMode, client_ca: bool) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let pki = TestPki::generate(dir.path());
    let ca = client_ca.then_some(pki.ca_cert.as_path());
    let tls = Tls::from_pem_files(&pki.server_cert, &pki.server_key, ca, mode).unwrap();
    let device = Arc::new(MemDevice::new(4 * MIB));
    let provider = Arc::new(Exports::new().with("mem", "memory", device));
    let server = TestServer::start_tls(provider, tls).await;
    Setup {
        server,
        pki,
        _dir: dir,
    }
}

fn tls_unix_uri(s: &Setup, certs: &std::path::Path) -> String {
    format!(
        "nbds+unix:///mem?socket={}&tls-certificates={}",
        s.server.unix_path().display(),
        certs.display()
    )
}

fn tls_tcp_uri(s: &Setup, certs: &std::path::Path) -> String {
    format!(
        "nbds://{}/mem?tls-certificates={}",
        s.server.tcp_addr(),
        certs.display()
    )
}

/// QEMU's arguments for the export over TLS with the credentials in `dir`.
fn qemu_tls(s: &Setup, dir: &std::path::Path, tcp: bool) -> Vec<String> {
    let server = if tcp {
        let a = s.server.tcp_addr();
        format!(
            "server.type=inet,server.host={},server.port={}",
            a.ip(),
            a.port()
        )
    } else {
        // A unix socket has no host name to check the certificate against.
        format!(
            "server.type=unix,server.path={},tls-hostname=localhost",
            s.server.unix_path().display()
        )
    };
    vec![
        "--object".into(),
        format!(
            "tls-creds-x509,id=tls0,dir={},endpoint=client",
            dir.display()
        ),
        "--image-opts".into(),
        format!("driver=nbd,{server},export=mem,tls-creds=tls0"),
    ]
}

async fn run_args(program: &str, args: &[String]) -> std::process::Output {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    run(program, &args).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_answers_nothing_but_starttls_before_tls() {
    let s = start(TlsMode::Require, false).await;
    let mut client = RawClient::unix(&s.server.unix_path()).await;
    client.greet().await;
    let info = InfoRequest {
        export_name: "mem".into(),
        info_types: vec![],
    }
    .encode()
    .unwrap();
    for (option, data) in [
        (OPT_LIST, &[][..]),
        (OPT_INFO, &info[..]),
        (OPT_GO, &info[..]),
        (OPT_STRUCTURED_REPLY, &[][..]),
        (OPT_LIST_META_CONTEXT, &[][..]),
        (0xdead_beef, &b"x"[..]),
    ] {
        client.send_option(option, data).await;
        let (header, _) = client.read_option_reply().await;
        assert_eq!(
            (header.option, header.reply_type),
            (option, REP_ERR_TLS_REQD),
            "option {option:#x} before TLS"
        );
    }
    client.send_option(OPT_STARTTLS, b"x").await;
    assert_eq!(
        client.read_option_reply().await.0.reply_type,
        REP_ERR_INVALID
    );
    client.send_option(OPT_ABORT, &[]).await;
    assert_eq!(client.read_option_reply().await.0.reply_type, REP_ACK);

    // EXPORT_NAME cannot be refused with a reply: the connection closes.
    let mut client = RawClient::tcp(s.server.tcp_addr()).await;
    client.greet().await;
    client.send_option(OPT_EXPORT_NAME, b"mem").await;
    assert!(within(5, client.closed_by_server()).await);

    // STARTTLS, then everything works inside TLS, and STARTTLS again does not.
    let mut client = RawClient::tcp(s.server.tcp_addr()).await;
    client.greet().await;
    client.send_option(OPT_STARTTLS, &[]).await;
    let (header, _) = client.read_option_reply().await;
    assert_eq!((header.option, header.reply_type), (OPT_STARTTLS, REP_ACK));
    client.upgrade_tls(&s.pki.ca_cert, None).await.unwrap();
    client.send_option(OPT_STARTTLS, &[]).await;
    assert_eq!(
        client.read_option_reply().await.0.reply_type,
        REP_ERR_INVALID
    );
    client.send_option(OPT_LIST, &[]).await;
    let replies = client.read_option_replies().await;
    assert_eq!(ServerEntry::decode(&replies[0].1).unwrap().name, "mem");
    let (size, _) = client.go_greeted("mem", true, true).await;
    assert_eq!(size, 4 * MIB);
    client.send_write(1, 4096, b"inside TLS").await;
    assert_eq!(client.read_reply(0).await.error(), 0);
    client.send_request(0, CMD_DISC, 2, 0, 0).await;
    assert!(within(5, client.closed_by_server()).await);
    s.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn libnbd_and_qemu_clients_read_and_write_over_tls_and_plaintext_is_refused() {
    let s = start(TlsMode::Require, false).await;
    let certs = &s.pki.anonymous_dir;
    for uri in [tls_unix_uri(&s, certs), tls_tcp_uri(&s, certs)] {
        let json = run_ok("nbdinfo", &["--json", &uri]).await;
        let info: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(info["exports"][0]["export-size"], 4 * MIB, "{uri}");
    }
    // nbdcopy writes 1 MiB in over TCP and reads it back over unix.
    let dir = tempfile::tempdir().unwrap();
    let (src, back) = (dir.path().join("src"), dir.path().join("back"));
    let data: Vec<u8> = (0..MIB as usize)
        .map(|i| (i * 7 + i / 4096) as u8)
        .collect();
    std::fs::write(&src, &data).unwrap();
    run_ok("nbdcopy", &[src.to_str().unwrap(), &tls_tcp_uri(&s, certs)]).await;
    run_ok(
        "nbdcopy",
        &[&tls_unix_uri(&s, certs), back.to_str().unwrap()],
    )
    .await;
    let back = std::fs::read(&back).unwrap();
    assert!(
        back[..MIB as usize] == data[..],
        "nbdcopy round trip over TLS"
    );
    // qemu-io writes a pattern over unix, reads it back over TCP; qemu-img
    // sees the size.
    let mut args = qemu_tls(&s, certs, false);
    args.extend(["-c".into(), "write -P 0xab 2M 64k".into()]);
    let out = run_args("qemu-io", &args).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut args = qemu_tls(&s, certs, true);
    args.extend(["-c".into(), "read -P 0xab 2M 64k".into()]);
    let out = run_args("qemu-io", &args).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && !stdout.contains("Pattern verification failed"),
        "{stdout}"
    );
    let mut args = vec!["info".to_string()];
    args.extend(qemu_tls(&s, certs, true));
    let out = run_args("qemu-img", &args).await;
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("4 MiB"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Plaintext clients are refused, whatever they ask.
    let plain = s.server.unix_uri("mem");
    let out = run("nbdinfo", &[&plain]).await;
    assert!(!out.status.success(), "plaintext nbdinfo was served");
    let out = run("nbdinfo", &["--list", &plain]).await;
    assert!(
        !out.status.success(),
        "plaintext nbdinfo --list was answered"
    );
    let out = run("qemu-img", &["info", &s.server.tcp_uri("mem")]).await;
    assert!(!out.status.success(), "plaintext qemu-img was served");
    // A client that does not trust our CA refuses the server. (libnbd
    // 1.14 checks the server's certificate over TCP only: over a unix
    // socket it has no host name and skips the check; QEMU checks both.)
    let out = run("nbdinfo", &[&tls_tcp_uri(&s, &s.pki.other_ca_dir)]).await;
    assert!(
        !out.status.success(),
        "nbdinfo trusting another CA connected"
    );
    for tcp in [false, true] {
        let mut args = vec!["info".to_string()];
        args.extend(qemu_tls(&s, &s.pki.other_ca_dir, tcp));
        let out = run_args("qemu-img", &args).await;
        assert!(
            !out.status.success(),
            "qemu-img trusting another CA connected (tcp: {tcp})"
        );
    }
    s.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_client_ca_only_its_certificates_get_in() {
    let s = start(TlsMode::Require, true).await;
    let json = run_ok("nbdinfo", &["--json", &tls_unix_uri(&s, &s.pki.client_dir)]).await;
    assert!(json.contains("\"export-size\": 4194304"), "{json}");
    let mut args = qemu_tls(&s, &s.pki.client_dir, true);
    args.extend([
        "-c".into(),
        "write -P 0x5c 0 4k".into(),
        "-c".into(),
        "read -P 0x5c 0 4k".into(),
    ]);
    let out = run_args("qemu-io", &args).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (who, dir) in [
        ("no certificate", &s.pki.anonymous_dir),
        ("another CA's certificate", &s.pki.stranger_dir),
    ] {
        let out = run("nbdinfo", &[&tls_unix_uri(&s, dir)]).await;
        assert!(!out.status.success(), "a client with {who} got in");
        let mut args = vec!["info".to_string()];
        args.extend(qemu_tls(&s, dir, true));
        let out = run_args("qemu-img", &args).await;
        assert!(!out.status.success(), "qemu-img with {who} got in");
    }
    // The raw client: the refusal surfaces on the first read after the
    // handshake (TLS 1.3) or in it; either way no option is answered.
    let mut client = RawClient::tcp(s.server.tcp_addr()).await;
    client.greet().await;
    client.send_option(OPT_STARTTLS, &[]).await;
    client.read_option_reply().await;
    if client.upgrade_tls(&s.pki.ca_cert, None).await.is_ok() {
        client.send_option(OPT_LIST, &[]).await;
        assert!(within(5, client.closed_by_server()).await);
    }
    s.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn optional_serves_plaintext_and_tls_clients() {
    let s = start(TlsMode::Optional, false).await;
    run_ok("nbdinfo", &[&s.server.unix_uri("mem")]).await;
    run_ok("nbdinfo", &[&tls_tcp_uri(&s, &s.pki.anonymous_dir)]).await;
    s.server.stop().await;
}

/// A TLS client that keeps sending large READs and never reads a reply is
/// closed after the reply stall timeout (the writer sees the socket's send
/// queue under TLS too), and the server goes on serving others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_client_that_stops_reading_replies_is_closed() {
    let dir = tempfile::tempdir().unwrap();
    let pki = TestPki::generate(dir.path());
    let tls =
        Tls::from_pem_files(&pki.server_cert, &pki.server_key, None, TlsMode::Require).unwrap();
    let device = Arc::new(MemDevice::new(8 * MIB));
    let provider = Arc::new(Exports::new().with("mem", "memory", device));
    let config = nbd_server::ServerConfig {
        max_request_bytes: MIB as u32,
        max_in_flight_bytes: 4 * MIB,
        reply_stall_timeout_ms: 300,
        ..nbd_server::ServerConfig::default()
    };
    let server = TestServer::start_tls_with(provider, tls, config).await;
    let mut client = RawClient::tcp(server.tcp_addr()).await;
    client.greet().await;
    client.send_option(OPT_STARTTLS, &[]).await;
    client.read_option_reply().await;
    client.upgrade_tls(&pki.ca_cert, None).await.unwrap();
    client.go_greeted("mem", false, false).await;
    let closed = within(20, async {
        for handle in 0u64.. {
            let header = RequestHeader {
                flags: 0,
                command_type: CMD_READ,
                handle,
                offset_bytes: (handle % 8) * MIB,
                length_bytes: MIB as u32,
            };
            let sent =
                tokio::io::AsyncWriteExt::write_all(&mut client.stream, &header.encode()).await;
            let flushed = match sent {
                Ok(()) => tokio::io::AsyncWriteExt::flush(&mut client.stream).await,
                Err(e) => Err(e),
            };
            if flushed.is_err() {
                return true;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        false
    })
    .await;
    assert!(closed, "the stuck TLS client was never closed");
    let s = Setup {
        server,
        pki,
        _dir: dir,
    };
    run_ok("nbdinfo", &[&tls_tcp_uri(&s, &s.pki.anonymous_dir)]).await;
    s.server.stop().await;
}
