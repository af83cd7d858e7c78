//! A tiny HTTP/1.1 server on 127.0.0.1 that answers what a test tells it
//! and logs every request: it stands in where no real peer can run here,
//! the EC2 instance metadata service (169.254.169.254 is not ours to call
//! from a test machine), and an S3 service that refuses a request in a way
//! MinIO cannot be made to. The log is how tests count requests (retries).
//!
//! One request per connection (`Connection: close`); bodies are read by
//! `Content-Length` and discarded.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

/// A request as the stub saw it.
#[derive(Debug, Clone)]
pub struct StubRequest {
    pub method: String,
    /// Path and query.
    pub target: String,
    /// Header names lower-cased.
    pub headers: Vec<(String, String)>,
}

impl StubRequest {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// The answer to a request: status line's code and reason, body.
pub struct StubReply {
    pub status: u16,
    pub reason: &'static str,
    pub body: String,
}

impl StubReply {
    pub fn new(status: u16, reason: &'static str, body: &str) -> StubReply {
        StubReply {
            status,
            reason,
            body: body.to_string(),
        }
    }
}

type Handler = dyn Fn(&StubRequest) -> StubReply + Send + Sync;

/// The running stub. It stops accepting when dropped (the accept thread
/// ends at the next connection or with the test process).
pub struct HttpStub {
    pub port: u16,
    log: Arc<Mutex<Vec<StubRequest>>>,
}

impl HttpStub {
    pub fn start(handler: impl Fn(&StubRequest) -> StubReply + Send + Sync + 'static) -> HttpStub {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let port = listener.local_addr().expect("local addr").port();
        let log = Arc::new(Mutex::new(Vec::new()));
        let handler: Arc<Handler> = Arc::new(handler);
        let thread_log = log.clone();
        thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let (log, handler) = (thread_log.clone(), handler.clone());
                thread::spawn(move || {
                    let _ = answer(conn, &log, handler.as_ref());
                });
            }
        });
        HttpStub { port, log }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Every request so far, in arrival order.
    pub fn requests(&self) -> Vec<StubRequest> {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

fn answer(
    conn: TcpStream,
    log: &Mutex<Vec<StubRequest>>,
    handler: &Handler,
) -> std::io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut words = line.split_whitespace();
    let method = words.next().unwrap_or_default().to_string();
    let target = words.next().unwrap_or_default().to_string();
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    let request = StubRequest {
        method,
        target,
        headers,
    };
    let length: u64 = request
        .header("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    std::io::copy(&mut reader.by_ref().take(length), &mut std::io::sink())?;
    log.lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(request.clone());
    let reply = handler(&request);
    let mut conn = conn;
    write!(
        conn,
        "HTTP/1.1 {} {}\r\nContent-Length: {}\r\nContent-Type: application/xml\r\nConnection: close\r\n\r\n{}",
        reply.status,
        reply.reason,
        reply.body.len(),
        reply.body
    )?;
    conn.flush()
}

/// A port on 127.0.0.1 where nothing listens (bound, then released).
pub fn closed_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local addr").port()
}
