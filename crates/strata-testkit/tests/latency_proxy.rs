//! The latency proxy: bytes pass unchanged both ways, every round trip pays
//! at least the configured delay (lower bounds only: a loaded machine may
//! always be slower), many connections at once, half-close, closing on
//! drop, the binary's arguments, and a real S3 request through it to MinIO.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use strata_testkit::{LatencyConfig, LatencyProxy, MinioServer, Split};

/// A deterministic byte stream: `n` bytes of generator `seed`.
struct Stream {
    x: u64,
}

impl Stream {
    fn new(seed: u64) -> Stream {
        Stream {
            x: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
        }
    }

    fn fill(&mut self, buf: &mut [u8]) {
        for b in buf {
            // xorshift64*
            self.x ^= self.x >> 12;
            self.x ^= self.x << 25;
            self.x ^= self.x >> 27;
            *b = (self.x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 56) as u8;
        }
    }
}

/// FNV-1a over a byte stream.
struct Hash(u64);

impl Hash {
    fn new() -> Hash {
        Hash(0xcbf2_9ce4_8422_2325)
    }

    fn update(&mut self, data: &[u8]) {
        for b in data {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// Sends `len` bytes of stream `seed` to `w` in pieces of varying size;
/// returns their hash.
fn send_stream(mut w: &TcpStream, seed: u64, len: usize) -> u64 {
    let mut s = Stream::new(seed);
    let mut h = Hash::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut left = len;
    let mut piece = 1usize;
    while left > 0 {
        // 1 B up to 1 MiB: small writes and large ones.
        piece = (piece * 7 + 13) % (1 << 20) + 1;
        let n = piece.min(left);
        s.fill(&mut buf[..n]);
        h.update(&buf[..n]);
        w.write_all(&buf[..n]).unwrap();
        left -= n;
    }
    h.0
}

/// Reads `r` to its end; returns (bytes, hash).
fn drain(mut r: &TcpStream) -> (usize, u64) {
    let mut h = Hash::new();
    let mut buf = vec![0u8; 256 << 10];
    let mut total = 0;
    loop {
        let n = r.read(&mut buf).unwrap();
        if n == 0 {
            return (total, h.0);
        }
        h.update(&buf[..n]);
        total += n;
    }
}

/// A server that accepts connections and runs `f` on each in a thread.
fn serve<F>(f: F) -> SocketAddr
where
    F: Fn(TcpStream) + Send + Sync + Clone + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { return };
            let f = f.clone();
            thread::spawn(move || f(conn));
        }
    });
    addr
}

/// An echo server: writes back what it reads, closes after the client's EOF.
fn echo_server() -> SocketAddr {
    serve(|mut c| {
        let mut buf = [0u8; 64 << 10];
        loop {
            match c.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if c.write_all(&buf[..n]).is_err() {
                        return;
                    }
                }
            }
        }
    })
}

fn wait_until(what: &str, mut pred: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !pred() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "{what}: not after 30 s"
        );
        thread::sleep(Duration::from_millis(10));
    }
}

const BIG: usize = 64 << 20;

#[test]
fn a_large_transfer_passes_unchanged_both_ways_at_once() {
    // Upstream: hashes what it receives, meanwhile sends its own stream;
    // reports (received bytes, hash) once the client half-closed.
    let (tx, rx) = std::sync::mpsc::channel();
    let upstream = serve(move |c| {
        let c2 = c.try_clone().unwrap();
        let sender = thread::spawn(move || {
            let h = send_stream(&c2, 2, BIG);
            c2.shutdown(Shutdown::Write).unwrap();
            h
        });
        let got = drain(&c);
        let sent = sender.join().unwrap();
        tx.send((got, sent)).unwrap();
    });
    let proxy = LatencyProxy::start(upstream, LatencyConfig::new(20, 10)).unwrap();
    let client = TcpStream::connect(proxy.addr()).unwrap();
    let c2 = client.try_clone().unwrap();
    let t0 = Instant::now();
    let sender = thread::spawn(move || {
        let h = send_stream(&c2, 1, BIG);
        c2.shutdown(Shutdown::Write).unwrap();
        h
    });
    let (down_len, down_hash) = drain(&client);
    let up_hash = sender.join().unwrap();
    let elapsed = t0.elapsed();
    let ((up_len, up_got), down_sent) = rx.recv_timeout(Duration::from_secs(120)).unwrap();
    assert_eq!(up_len, BIG, "bytes the upstream received");
    assert_eq!(up_got, up_hash, "the upstream received other bytes");
    assert_eq!(down_len, BIG, "bytes the client received");
    assert_eq!(down_hash, down_sent, "the client received other bytes");
    let s = proxy.stats();
    assert_eq!(s.bytes_to_upstream, BIG as u64);
    assert_eq!(s.bytes_to_client, BIG as u64);
    assert_eq!(s.connections, 1);
    // Informative only: bandwidth is not limited, so this is far above
    // "one 256 KiB read per 20 ms" (12.5 MiB/s).
    eprintln!(
        "2 x {} MiB through 20 ± 10 ms in {elapsed:.2?} ({:.0} MiB/s each way)",
        BIG >> 20,
        (BIG >> 20) as f64 / elapsed.as_secs_f64()
    );
}

/// `n` round trips of `size` bytes through `proxy` to an echo server; the
/// duration of each.
fn ping_pong(proxy: &LatencyProxy, n: usize, size: usize) -> Vec<Duration> {
    let mut c = TcpStream::connect(proxy.addr()).unwrap();
    c.set_nodelay(true).unwrap();
    let msg: Vec<u8> = (0..size).map(|i| i as u8).collect();
    let mut back = vec![0u8; size];
    (0..n)
        .map(|_| {
            let t0 = Instant::now();
            c.write_all(&msg).unwrap();
            c.read_exact(&mut back).unwrap();
            let dt = t0.elapsed();
            assert_eq!(back, msg);
            dt
        })
        .collect()
}

#[test]
fn every_round_trip_pays_at_least_latency_minus_jitter() {
    let upstream = echo_server();
    for (split, slack) in [
        (Split::Request, Duration::ZERO),
        (Split::Response, Duration::ZERO),
        // Two halves, each rounded down to a microsecond.
        (Split::Half, Duration::from_micros(2)),
    ] {
        let cfg = LatencyConfig {
            split,
            seed: 42,
            ..LatencyConfig::new(30, 10)
        };
        let proxy = LatencyProxy::start(upstream, cfg).unwrap();
        // Small messages, and ones that take several reads.
        for size in [1, 100, 1 << 20] {
            let rtts = ping_pong(&proxy, 10, size);
            for rtt in &rtts {
                assert!(
                    *rtt + slack >= Duration::from_millis(20),
                    "{split:?}, {size} B: a round trip took {rtt:?} < 30 - 10 ms"
                );
            }
            eprintln!("{split:?} {size} B round trips: {rtts:?}");
        }
    }
}

#[test]
fn no_latency_is_a_plain_relay() {
    let upstream = echo_server();
    let proxy = LatencyProxy::start(upstream, LatencyConfig::new(0, 0)).unwrap();
    let rtts = ping_pong(&proxy, 100, 10);
    assert_eq!(rtts.len(), 100);
}

#[test]
fn many_connections_at_once() {
    let upstream = echo_server();
    let proxy = LatencyProxy::start(upstream, LatencyConfig::new(10, 5)).unwrap();
    let addr = proxy.addr();
    let clients: Vec<_> = (0..64u64)
        .map(|i| {
            thread::spawn(move || {
                let c = TcpStream::connect(addr).unwrap();
                let c2 = c.try_clone().unwrap();
                let len = (i as usize + 1) * 37_000;
                let sender = thread::spawn(move || {
                    let h = send_stream(&c2, i, len);
                    c2.shutdown(Shutdown::Write).unwrap();
                    h
                });
                let (got_len, got_hash) = drain(&c);
                assert_eq!(got_len, len, "connection {i}: echoed bytes");
                assert_eq!(got_hash, sender.join().unwrap(), "connection {i}");
                len as u64
            })
        })
        .collect();
    let total: u64 = clients.into_iter().map(|t| t.join().unwrap()).sum();
    let s = proxy.stats();
    assert_eq!(s.connections, 64);
    assert_eq!(s.bytes_to_upstream, total);
    assert_eq!(s.bytes_to_client, total);
    // Each connection is unregistered once both directions ended.
    wait_until("every connection closed", || proxy.stats().open == 0);
}

#[test]
fn half_close_propagates_and_the_other_direction_stays_open() {
    // The upstream reads until the client's EOF, then answers and closes.
    let upstream = serve(|mut c| {
        let mut got = Vec::new();
        c.read_to_end(&mut got).unwrap();
        thread::sleep(Duration::from_millis(50));
        c.write_all(format!("got {} bytes", got.len()).as_bytes())
            .unwrap();
    });
    let proxy = LatencyProxy::start(upstream, LatencyConfig::new(20, 0)).unwrap();
    let mut c = TcpStream::connect(proxy.addr()).unwrap();
    c.write_all(b"hello").unwrap();
    let t0 = Instant::now();
    c.shutdown(Shutdown::Write).unwrap();
    let mut answer = String::new();
    c.read_to_string(&mut answer).unwrap();
    assert_eq!(answer, "got 5 bytes");
    // The EOF went through the delay line too.
    assert!(
        t0.elapsed() >= Duration::from_millis(20),
        "{:?}",
        t0.elapsed()
    );

    // And the other way: the upstream half-closes first, the client can
    // still send.
    let upstream = serve(|mut c| {
        c.write_all(b"first").unwrap();
        c.shutdown(Shutdown::Write).unwrap();
        let mut got = Vec::new();
        c.read_to_end(&mut got).unwrap();
        assert_eq!(got, b"after your EOF");
    });
    let proxy2 = LatencyProxy::start(upstream, LatencyConfig::new(5, 0)).unwrap();
    let mut c = TcpStream::connect(proxy2.addr()).unwrap();
    let mut first = Vec::new();
    c.read_to_end(&mut first).unwrap();
    assert_eq!(first, b"first");
    c.write_all(b"after your EOF").unwrap();
    c.shutdown(Shutdown::Write).unwrap();
    wait_until("the connection closed", || proxy2.stats().open == 0);
    assert_eq!(proxy2.stats().bytes_to_upstream, 14);
}

#[test]
fn a_refused_upstream_closes_the_client_connection() {
    // A port nobody listens on: bind, note, close.
    let dead = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let proxy = LatencyProxy::start(dead, LatencyConfig::new(5, 0)).unwrap();
    let mut c = TcpStream::connect(proxy.addr()).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut buf = [0u8; 16];
    let n = c.read(&mut buf).unwrap_or(0);
    assert_eq!(n, 0, "expected the connection closed");
    assert_eq!(proxy.stats().upstream_connect_errors, 1);
}

#[test]
fn dropping_the_proxy_closes_its_connections_and_stops_listening() {
    let upstream = echo_server();
    let proxy = LatencyProxy::start(upstream, LatencyConfig::new(5, 0)).unwrap();
    let addr = proxy.addr();
    let mut c = TcpStream::connect(addr).unwrap();
    c.write_all(b"x").unwrap();
    let mut one = [0u8; 1];
    c.read_exact(&mut one).unwrap();
    drop(proxy);
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(c.read(&mut buf).unwrap_or(0), 0, "connection still open");
    assert!(TcpStream::connect(addr).is_err(), "the proxy still accepts");
}

#[test]
fn only_loopback_addresses() {
    let upstream: SocketAddr = "10.0.0.1:9000".parse().unwrap();
    let err = LatencyProxy::start(upstream, LatencyConfig::new(1, 0))
        .err()
        .expect("a non-loopback upstream is refused");
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
}

fn proxy_bin() -> &'static str {
    env!("CARGO_BIN_EXE_strata-latency-proxy")
}

#[test]
fn the_binary_prints_its_address_relays_and_stops_on_sigterm() {
    let upstream = echo_server();
    let mut child = Command::new(proxy_bin())
        .args(["--upstream", &upstream.to_string()])
        .args(["--latency-ms", "20", "--jitter-ms", "10", "--seed", "3"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while out.read(&mut byte).unwrap() == 1 && byte[0] != b'\n' {
        line.push(byte[0]);
    }
    let line = String::from_utf8(line).unwrap();
    let addr: SocketAddr = line
        .strip_prefix("listening ")
        .unwrap_or_else(|| panic!("first line {line:?}"))
        .parse()
        .unwrap();
    let mut c = TcpStream::connect(addr).unwrap();
    let t0 = Instant::now();
    c.write_all(b"ping").unwrap();
    let mut back = [0u8; 4];
    c.read_exact(&mut back).unwrap();
    assert_eq!(&back, b"ping");
    assert!(t0.elapsed() >= Duration::from_millis(10));
    drop(c);
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {}: {err}", out.status);
    assert!(err.contains("connections 1"), "{err}");
}

#[test]
fn the_binary_refuses_bad_arguments_in_one_line() {
    for (args, expect) in [
        (
            vec!["--latency-ms", "20"],
            "--upstream 127.0.0.1:PORT is required",
        ),
        (
            vec!["--upstream", "127.0.0.1:9000"],
            "--latency-ms is required",
        ),
        (
            vec!["--upstream", "10.1.2.3:9000", "--latency-ms", "1"],
            "only loopback addresses",
        ),
        (
            vec!["--upstream", "localhost:9000", "--latency-ms", "1"],
            "not IP:PORT",
        ),
        (
            vec!["--upstream", "127.0.0.1:9000", "--latency-ms", "x"],
            "not a whole number",
        ),
        (
            vec![
                "--upstream",
                "127.0.0.1:9000",
                "--latency-ms",
                "5",
                "--jitter-ms",
                "6",
            ],
            "exceeds --latency-ms",
        ),
        (vec!["--frobnicate"], "unknown argument"),
        (vec!["--upstream"], "--upstream needs a value"),
    ] {
        let out = Command::new(proxy_bin()).args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        let first = err.lines().next().unwrap_or("");
        assert!(
            first.starts_with("strata-latency-proxy: ") && first.contains(expect),
            "{args:?}: {err}"
        );
    }
    let help = Command::new(proxy_bin()).arg("--help").output().unwrap();
    assert!(help.status.success());
    assert!(String::from_utf8_lossy(&help.stdout).contains("--jitter-ms"));
}

/// curl, signed for the test MinIO, against `endpoint`; (status, body).
fn s3_curl(endpoint: &str, method: &str, path: &str, body: Option<&[u8]>) -> (bool, Vec<u8>) {
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "--fail-with-body", "--max-time", "60", "-X", method])
        .arg("--aws-sigv4")
        .arg("aws:amz:us-east-1:s3")
        .arg("--user")
        .arg(format!(
            "{}:{}",
            strata_testkit::ACCESS_KEY,
            strata_testkit::SECRET_KEY
        ));
    if body.is_some() {
        cmd.args([
            "--data-binary",
            "@-",
            "-H",
            "x-amz-content-sha256: UNSIGNED-PAYLOAD",
        ]);
    }
    let mut child = cmd
        .arg(format!("{endpoint}/{path}"))
        .stdin(if body.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let (Some(b), Some(mut stdin)) = (body, child.stdin.take()) {
        stdin.write_all(b).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    if !out.status.success() {
        eprintln!("curl: {}", String::from_utf8_lossy(&out.stderr));
    }
    (out.status.success(), out.stdout)
}

#[test]
fn s3_requests_to_minio_work_through_the_proxy() {
    let minio = MinioServer::shared();
    let bucket = minio.fresh_bucket();
    let upstream: SocketAddr = format!("127.0.0.1:{}", minio.port()).parse().unwrap();
    let proxy = LatencyProxy::start(upstream, LatencyConfig::new(20, 10)).unwrap();
    let endpoint = proxy.http_endpoint();

    // A raw HTTP/1.1 request: the health probe, keep-alive, twice on one
    // connection, each paying the delay.
    let mut c = TcpStream::connect(proxy.addr()).unwrap();
    for _ in 0..2 {
        let t0 = Instant::now();
        write!(
            c,
            "GET /minio/health/live HTTP/1.1\r\nHost: {}\r\n\r\n",
            proxy.addr()
        )
        .unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            assert_eq!(c.read(&mut byte).unwrap(), 1, "connection closed early");
            head.push(byte[0]);
        }
        let head = String::from_utf8_lossy(&head).to_string();
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        let len: usize = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length:")
                    .map(|v| v.trim().parse().unwrap())
            })
            .unwrap_or(0);
        let mut body = vec![0u8; len];
        c.read_exact(&mut body).unwrap();
        assert!(
            t0.elapsed() >= Duration::from_millis(10),
            "{:?}",
            t0.elapsed()
        );
    }
    drop(c);

    // Signed S3 requests (curl --aws-sigv4): a PUT through the proxy, read
    // back through the proxy and directly.
    let data: Vec<u8> = {
        let mut d = vec![0u8; 3 << 20];
        Stream::new(9).fill(&mut d);
        d
    };
    let t0 = Instant::now();
    let (ok, _) = s3_curl(
        &endpoint,
        "PUT",
        &format!("{bucket}/through/proxy"),
        Some(&data),
    );
    assert!(ok, "PUT through the proxy failed");
    let (ok, back) = s3_curl(&endpoint, "GET", &format!("{bucket}/through/proxy"), None);
    assert!(ok, "GET through the proxy failed");
    assert!(back == data, "GET through the proxy returned other bytes");
    assert!(
        t0.elapsed() >= Duration::from_millis(20),
        "{:?}",
        t0.elapsed()
    );
    assert!(minio.get_object(&bucket, "through/proxy") == data);
    let s = proxy.stats();
    assert!(s.connections >= 3, "{s:?}");
    assert!(s.bytes_to_upstream >= data.len() as u64, "{s:?}");
    assert!(s.bytes_to_client >= data.len() as u64, "{s:?}");
}

#[test]
fn the_connect_delay_comes_before_the_first_burst_only() {
    let upstream = echo_server();
    let cfg = LatencyConfig {
        connect_ms: 60,
        ..LatencyConfig::new(20, 0)
    };
    let proxy = LatencyProxy::start(upstream, cfg).unwrap();
    let rtts = ping_pong(&proxy, 3, 10);
    assert!(rtts[0] >= Duration::from_millis(80), "{rtts:?}");
    assert!(
        rtts[1..].iter().all(|r| *r >= Duration::from_millis(20)),
        "{rtts:?}"
    );
}

#[test]
fn a_stalled_receiver_stops_the_sender_without_losing_bytes() {
    // The upstream reads nothing until told, then everything.
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let go_rx = std::sync::Arc::new(std::sync::Mutex::new(go_rx));
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let upstream = serve(move |c| {
        go_rx.lock().unwrap().recv().unwrap();
        done_tx.send(drain(&c)).unwrap();
    });
    let cfg = LatencyConfig {
        queue_bytes: 1 << 20,
        ..LatencyConfig::new(1, 0)
    };
    let proxy = LatencyProxy::start(upstream, cfg).unwrap();
    let mut c = TcpStream::connect(proxy.addr()).unwrap();
    c.set_nonblocking(true).unwrap();
    let chunk = vec![7u8; 64 << 10];
    let mut sent = 0usize;
    let mut blocked_since: Option<Instant> = None;
    // Write until the writes have been refused for half a second.
    loop {
        match c.write(&chunk) {
            Ok(n) => {
                sent += n;
                blocked_since = None;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                let since = *blocked_since.get_or_insert_with(Instant::now);
                if since.elapsed() > Duration::from_millis(500) {
                    break;
                }
                thread::sleep(Duration::from_millis(5));
            }
            Err(e) => panic!("write: {e}"),
        }
        assert!(sent < 256 << 20, "no back pressure: {sent} bytes accepted");
    }
    // The 1 MiB queue plus the kernel's socket buffers on both hops; far
    // below what an unbounded queue would have taken.
    assert!(sent < 64 << 20, "{sent} bytes accepted while nobody read");
    go_tx.send(()).unwrap();
    c.set_nonblocking(false).unwrap();
    c.shutdown(Shutdown::Write).unwrap();
    let (got, _) = done_rx.recv_timeout(Duration::from_secs(60)).unwrap();
    assert_eq!(got, sent, "bytes lost");
}
