//! A TCP proxy on 127.0.0.1 that adds latency, for measuring strata against
//! a store that is far away (S3 answers in 10-30 ms; the test MinIO in 0).
//!
//! This module owns [`LatencyProxy`]: it accepts connections on 127.0.0.1,
//! opens one connection to the upstream per client connection, and moves
//! bytes both ways through a *delay line* per direction: a reader thread
//! stamps each chunk it reads with the time it is due, a writer thread
//! sleeps until then and writes it on. Everything strata does over its
//! connections (reusing them, opening more in parallel, retrying) is thus
//! measured as it would be against a real remote store, from outside
//! strata's process.
//!
//! Timing model, per connection and direction:
//! - a *burst* starts when bytes arrive on an idle line (everything queued
//!   before has been delivered); it gets a delay drawn uniformly from
//!   `[latency - jitter, latency + jitter]` (the share of it this direction
//!   carries, see [`Split`]); bytes that arrive while the line is still busy
//!   belong to the same burst and get the same delay. So a request, or a
//!   16 MiB body streamed in many reads, costs its one delay, not one per
//!   read, and a stream is never slowed to "one delay per chunk": bytes in
//!   flight are pipelined, bandwidth is not limited.
//! - a chunk is due at `max(previous due, arrival + delay)`: delivery order
//!   is preserved and due times never go backwards.
//! - end of stream (a half-close) travels through the line like data: the
//!   far side's write half is shut down when it is due. A reset or a write
//!   error closes both sockets of the connection at once.
//!
//! With the default [`Split::Request`], one HTTP request/response on an
//! idle keep-alive connection costs one delay in total: the request reaches
//! the store late, as if the store took that long to answer, and the answer
//! streams back at once. Opening a connection costs nothing extra unless
//! [`LatencyConfig::connect_ms`] says so.
//!
//! Memory is bounded: each direction of each connection queues at most
//! [`LatencyConfig::queue_bytes`] (plus one read); beyond it the reader
//! stops reading, and TCP flow control pushes back on the sender.
//!
//! Dropping the proxy stops accepting and closes every connection.

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// Size of one read from a socket (the most one chunk holds).
const READ_SIZE: usize = 256 << 10;
/// Stack of the per-connection threads (their buffers are on the heap).
const THREAD_STACK: usize = 256 << 10;
/// How long connecting to the upstream may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Delays are capped at an hour (no overflow of `Instant + Duration`).
const MAX_DELAY_MS: u64 = 3_600_000;
/// How often the accept loop looks at the stop flag.
const ACCEPT_POLL_MS: i32 = 50;

/// Which direction carries the delay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    /// All of it on client -> upstream: the store sees each request late,
    /// its answers come back at once.
    Request,
    /// All of it on upstream -> client: the store's answers come back late.
    Response,
    /// Half each way, like a network round trip (the round trip's delay is
    /// then the sum of two draws: still within `latency ± jitter`).
    Half,
}

/// How much latency the proxy adds.
#[derive(Clone, Debug)]
pub struct LatencyConfig {
    /// Mean delay of one request/response exchange, in milliseconds.
    pub latency_ms: u64,
    /// Each burst's delay is drawn uniformly from
    /// `[latency_ms - jitter_ms, latency_ms + jitter_ms]` (at least 0).
    pub jitter_ms: u64,
    /// Seed of the draws; connection `n` draws from `seed` mixed with `n`,
    /// so a run with one connection at a time is reproducible.
    pub seed: u64,
    /// Which direction carries the delay.
    pub split: Split,
    /// Extra delay before the first bytes of a new connection go either way
    /// (a TCP handshake's round trip to a far store). 0 by default.
    pub connect_ms: u64,
    /// Most bytes queued per connection and direction before the reader
    /// stops reading.
    pub queue_bytes: usize,
}

impl Default for LatencyConfig {
    fn default() -> LatencyConfig {
        LatencyConfig {
            latency_ms: 0,
            jitter_ms: 0,
            seed: 0,
            split: Split::Request,
            connect_ms: 0,
            queue_bytes: 64 << 20,
        }
    }
}

impl LatencyConfig {
    /// `latency_ms ± jitter_ms` on the request direction, seed 0, 64 MiB
    /// queues.
    pub fn new(latency_ms: u64, jitter_ms: u64) -> LatencyConfig {
        LatencyConfig {
            latency_ms,
            jitter_ms,
            ..LatencyConfig::default()
        }
    }
}

/// Counters of a proxy since it started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProxyStats {
    /// Client connections accepted.
    pub connections: u64,
    /// Connections open now (both sides).
    pub open: u64,
    /// Client connections closed at once because the upstream refused.
    pub upstream_connect_errors: u64,
    /// Bytes delivered from clients to the upstream.
    pub bytes_to_upstream: u64,
    /// Bytes delivered from the upstream to clients.
    pub bytes_to_client: u64,
}

/// A running proxy; stops (and closes its connections) when dropped.
pub struct LatencyProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

impl LatencyProxy {
    /// Listens on 127.0.0.1 (a free port) and forwards every connection to
    /// `upstream` through delay lines.
    ///
    /// # Errors
    /// When `upstream` is not a loopback address, or binding fails.
    pub fn start(upstream: SocketAddr, cfg: LatencyConfig) -> io::Result<LatencyProxy> {
        LatencyProxy::start_on(SocketAddr::from(([127, 0, 0, 1], 0)), upstream, cfg)
    }

    /// As [`LatencyProxy::start`], listening on `listen` (a loopback
    /// address; port 0 picks a free one).
    ///
    /// # Errors
    /// When either address is not loopback, or binding fails.
    pub fn start_on(
        listen: SocketAddr,
        upstream: SocketAddr,
        cfg: LatencyConfig,
    ) -> io::Result<LatencyProxy> {
        for (what, a) in [("listen", listen), ("upstream", upstream)] {
            if !a.ip().is_loopback() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{what} address {a} is not a loopback address (127.0.0.1 only)"),
                ));
            }
        }
        let listener = TcpListener::bind(listen)?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            upstream,
            cfg,
            stop: AtomicBool::new(false),
            next_id: AtomicU64::new(0),
            counters: Counters::default(),
            conns: Mutex::new(HashMap::new()),
        });
        let s = shared.clone();
        let acceptor = thread::Builder::new()
            .name("latency-proxy-accept".to_owned())
            .spawn(move || accept_loop(&listener, &s))?;
        Ok(LatencyProxy {
            addr,
            shared,
            acceptor: Some(acceptor),
        })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`: the proxy as an HTTP endpoint.
    pub fn http_endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The configuration it runs with.
    pub fn config(&self) -> &LatencyConfig {
        &self.shared.cfg
    }

    /// Counters so far.
    pub fn stats(&self) -> ProxyStats {
        let c = &self.shared.counters;
        ProxyStats {
            connections: c.connections.load(Ordering::Relaxed),
            open: c.open.load(Ordering::Relaxed),
            upstream_connect_errors: c.connect_errors.load(Ordering::Relaxed),
            bytes_to_upstream: c.to_upstream.load(Ordering::Relaxed),
            bytes_to_client: c.to_client.load(Ordering::Relaxed),
        }
    }
}

impl Drop for LatencyProxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
        // No new connection registers after the acceptor ended; shutting the
        // sockets down ends every reader, and so every writer.
        for (client, upstream) in lock(&self.shared.conns).values() {
            let _ = client.shutdown(Shutdown::Both);
            let _ = upstream.shutdown(Shutdown::Both);
        }
    }
}

#[derive(Default)]
struct Counters {
    connections: AtomicU64,
    open: AtomicU64,
    connect_errors: AtomicU64,
    to_upstream: AtomicU64,
    to_client: AtomicU64,
}

/// A connection's client and upstream sockets.
type Sockets = (Arc<TcpStream>, Arc<TcpStream>);

struct Shared {
    upstream: SocketAddr,
    cfg: LatencyConfig,
    stop: AtomicBool,
    next_id: AtomicU64,
    counters: Counters,
    /// Both sockets of every open connection, to close them on drop.
    conns: Mutex<HashMap<u64, Sockets>>,
}

/// A poisoned lock still holds consistent data here (every critical section
/// only moves whole values).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
    while !shared.stop.load(Ordering::SeqCst) {
        let mut pfd = libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for a socket this thread borrows.
        let n = unsafe { libc::poll(&mut pfd, 1, ACCEPT_POLL_MS) };
        if n <= 0 {
            continue; // timeout, or EINTR
        }
        let client = match listener.accept() {
            Ok((client, _)) => client,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                // EMFILE and the like: wait for connections to close.
                eprintln!("latency proxy: accept failed: {e}");
                thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        let accepted = Instant::now();
        shared.counters.connections.fetch_add(1, Ordering::Relaxed);
        let s = shared.clone();
        let spawned = thread::Builder::new()
            .name("latency-proxy-conn".to_owned())
            .stack_size(THREAD_STACK)
            .spawn(move || connect_and_relay(client, accepted, &s));
        if let Err(e) = spawned {
            eprintln!("latency proxy: cannot start a connection thread: {e}");
        }
    }
}

/// Connects to the upstream and starts the two delay lines of one client
/// connection (four threads; the last one to finish unregisters it).
fn connect_and_relay(client: TcpStream, accepted: Instant, shared: &Arc<Shared>) {
    let upstream = match TcpStream::connect_timeout(&shared.upstream, CONNECT_TIMEOUT) {
        Ok(u) => u,
        Err(e) => {
            shared
                .counters
                .connect_errors
                .fetch_add(1, Ordering::Relaxed);
            eprintln!(
                "latency proxy: cannot connect to the upstream {}: {e}",
                shared.upstream
            );
            return; // dropping `client` closes it
        }
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    let client = Arc::new(client);
    let upstream = Arc::new(upstream);
    shared.counters.open.fetch_add(1, Ordering::Relaxed);
    lock(&shared.conns).insert(id, (client.clone(), upstream.clone()));
    let guard = Arc::new(ConnGuard {
        id,
        shared: shared.clone(),
    });
    if shared.stop.load(Ordering::SeqCst) {
        // The proxy is being dropped and may have closed the others already.
        let _ = client.shutdown(Shutdown::Both);
        let _ = upstream.shutdown(Shutdown::Both);
        return;
    }
    let cfg = &shared.cfg;
    let start = accepted + Duration::from_millis(cfg.connect_ms.min(MAX_DELAY_MS));
    let (up_share, down_share) = match cfg.split {
        Split::Request => (Share::All, Share::None),
        Split::Response => (Share::None, Share::All),
        Split::Half => (Share::Half, Share::Half),
    };
    let delays = |share, rng| Delays {
        lo_us: cfg
            .latency_ms
            .saturating_sub(cfg.jitter_ms)
            .min(MAX_DELAY_MS)
            * 1000,
        hi_us: cfg
            .latency_ms
            .saturating_add(cfg.jitter_ms)
            .min(MAX_DELAY_MS)
            * 1000,
        share,
        rng,
    };
    let seed = mix(cfg.seed ^ mix(id.wrapping_add(1)));
    let directions = [
        Direction {
            to_upstream: true,
            from: client.clone(),
            to: upstream.clone(),
            delays: delays(up_share, seed),
        },
        Direction {
            to_upstream: false,
            from: upstream.clone(),
            to: client.clone(),
            delays: delays(down_share, mix(seed)),
        },
    ];
    for d in directions {
        if let Err(e) = d.start(start, cfg.queue_bytes.max(1), &guard) {
            eprintln!("latency proxy: cannot start a relay thread: {e}");
            let _ = client.shutdown(Shutdown::Both);
            let _ = upstream.shutdown(Shutdown::Both);
        }
    }
}

/// One direction of a connection, before its threads start.
struct Direction {
    to_upstream: bool,
    from: Arc<TcpStream>,
    to: Arc<TcpStream>,
    delays: Delays,
}

impl Direction {
    /// Starts the reader and the writer of this direction's delay line.
    fn start(self, start: Instant, cap: usize, guard: &Arc<ConnGuard>) -> io::Result<()> {
        let name = if self.to_upstream { "up" } else { "down" };
        let line = Arc::new(Line {
            state: Mutex::new(LineState {
                queue: VecDeque::new(),
                bytes: 0,
                dead: false,
            }),
            changed: Condvar::new(),
            cap,
        });
        // The writer first: once it runs, an Abort ends it if the reader
        // cannot start.
        let writer = {
            let (line, from, to, guard) = (
                line.clone(),
                self.from.clone(),
                self.to.clone(),
                guard.clone(),
            );
            let to_upstream = self.to_upstream;
            move || {
                let c = &guard.shared.counters;
                let counter = if to_upstream {
                    &c.to_upstream
                } else {
                    &c.to_client
                };
                write_side(&line, &from, &to, counter, &guard);
            }
        };
        thread::Builder::new()
            .name(format!("latency-proxy-{name}-write"))
            .stack_size(THREAD_STACK)
            .spawn(writer)?;
        let reader = {
            let (line, guard, delays) = (line.clone(), guard.clone(), self.delays);
            move || read_side(&line, &self.from, &self.to, delays, start, &guard)
        };
        let spawned = thread::Builder::new()
            .name(format!("latency-proxy-{name}-read"))
            .stack_size(THREAD_STACK)
            .spawn(reader);
        if let Err(e) = spawned {
            line.push(Chunk {
                due: Instant::now(),
                item: Item::Abort,
            });
            return Err(e);
        }
        Ok(())
    }
}

/// Unregisters a connection when its last thread ends.
struct ConnGuard {
    id: u64,
    shared: Arc<Shared>,
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        lock(&self.shared.conns).remove(&self.id);
        self.shared.counters.open.fetch_sub(1, Ordering::Relaxed);
    }
}

#[derive(Clone, Copy)]
enum Share {
    All,
    Half,
    None,
}

/// The delay draws of one direction.
#[derive(Clone, Copy)]
struct Delays {
    lo_us: u64,
    hi_us: u64,
    share: Share,
    rng: u64,
}

impl Delays {
    fn draw(&mut self) -> Duration {
        let total = match self.share {
            Share::None => return Duration::ZERO,
            _ if self.hi_us == self.lo_us => self.lo_us,
            _ => {
                self.rng = mix(self.rng);
                self.lo_us + self.rng % (self.hi_us - self.lo_us + 1)
            }
        };
        let us = match self.share {
            Share::Half => total / 2,
            _ => total,
        };
        Duration::from_micros(us)
    }
}

/// splitmix64's finaliser: a good enough generator for delays.
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

enum Item {
    Data(Vec<u8>),
    /// The source half-closed: shut the destination's write half down.
    Eof,
    /// The source failed (reset): close both sockets.
    Abort,
}

struct Chunk {
    due: Instant,
    item: Item,
}

struct LineState {
    queue: VecDeque<Chunk>,
    bytes: usize,
    /// The writer gave up (destination gone): the reader stops too.
    dead: bool,
}

/// One direction of one connection: chunks waiting for their due time.
struct Line {
    state: Mutex<LineState>,
    changed: Condvar,
    cap: usize,
}

impl Line {
    /// Queues a chunk; waits while the queue is full. False when the writer
    /// gave up.
    fn push(&self, chunk: Chunk) -> bool {
        let len = match &chunk.item {
            Item::Data(d) => d.len(),
            _ => 0,
        };
        let mut st = lock(&self.state);
        while !st.dead && st.bytes > 0 && st.bytes + len > self.cap {
            st = self
                .changed
                .wait(st)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
        if st.dead {
            return false;
        }
        st.bytes += len;
        st.queue.push_back(chunk);
        self.changed.notify_all();
        true
    }

    /// The next chunk, once it is due.
    fn pop_due(&self) -> Chunk {
        let mut st = lock(&self.state);
        loop {
            match st.queue.front() {
                None => {
                    st = self
                        .changed
                        .wait(st)
                        .unwrap_or_else(|poisoned| poisoned.into_inner());
                }
                Some(head) => {
                    let now = Instant::now();
                    if head.due <= now {
                        if let Some(chunk) = st.queue.pop_front() {
                            if let Item::Data(d) = &chunk.item {
                                st.bytes -= d.len();
                            }
                            self.changed.notify_all();
                            return chunk;
                        }
                    } else {
                        let wait = head.due - now;
                        st = self
                            .changed
                            .wait_timeout(st, wait)
                            .unwrap_or_else(|poisoned| poisoned.into_inner())
                            .0;
                    }
                }
            }
        }
    }

    fn kill(&self) {
        let mut st = lock(&self.state);
        st.dead = true;
        st.queue.clear();
        st.bytes = 0;
        self.changed.notify_all();
    }
}

/// Reads `from` and stamps each chunk with its due time.
fn read_side(
    line: &Line,
    from: &TcpStream,
    to: &TcpStream,
    mut delays: Delays,
    start: Instant,
    _guard: &ConnGuard,
) {
    let mut buf = vec![0u8; READ_SIZE];
    // Due time of the last chunk queued (none yet), and the delay of the
    // current burst.
    let mut last_due: Option<Instant> = None;
    let mut delay = Duration::ZERO;
    loop {
        let (item, n) = match (&*from).read(&mut buf) {
            Ok(0) => (Item::Eof, 0),
            Ok(n) => (Item::Data(buf[..n].to_vec()), n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => (Item::Abort, 0),
        };
        let now = Instant::now();
        let due = match last_due {
            // The line is still busy: the same burst, after what is queued.
            Some(prev) if now < prev => prev.max(now + delay),
            // The line is idle: a new burst, a new delay (the first one
            // after the connection's set-up delay).
            _ => {
                delay = delays.draw();
                now.max(start) + delay
            }
        };
        last_due = Some(due);
        let end = n == 0;
        if !line.push(Chunk { due, item }) {
            // The writer failed and closed both sockets.
            let _ = to.shutdown(Shutdown::Both);
            return;
        }
        if end {
            return;
        }
    }
}

/// Writes each chunk to `to` when it is due.
fn write_side(
    line: &Line,
    from: &TcpStream,
    to: &TcpStream,
    counter: &AtomicU64,
    _guard: &ConnGuard,
) {
    loop {
        let chunk = line.pop_due();
        match chunk.item {
            Item::Data(d) => {
                if (&*to).write_all(&d).is_err() {
                    line.kill();
                    let _ = to.shutdown(Shutdown::Both);
                    let _ = from.shutdown(Shutdown::Both);
                    return;
                }
                counter.fetch_add(d.len() as u64, Ordering::Relaxed);
            }
            Item::Eof => {
                let _ = to.shutdown(Shutdown::Write);
                return;
            }
            Item::Abort => {
                line.kill();
                let _ = to.shutdown(Shutdown::Both);
                let _ = from.shutdown(Shutdown::Both);
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_stay_within_latency_plus_minus_jitter() {
        let mut d = Delays {
            lo_us: 10_000,
            hi_us: 30_000,
            share: Share::All,
            rng: 7,
        };
        let draws: Vec<Duration> = (0..10_000).map(|_| d.draw()).collect();
        assert!(draws.iter().all(|x| *x >= Duration::from_millis(10)));
        assert!(draws.iter().all(|x| *x <= Duration::from_millis(30)));
        let mean = draws.iter().sum::<Duration>() / draws.len() as u32;
        assert!(
            mean > Duration::from_millis(19) && mean < Duration::from_millis(21),
            "mean {mean:?}"
        );
        let mut half = Delays {
            share: Share::Half,
            ..d
        };
        assert!(half.draw() <= Duration::from_millis(15));
        let mut none = Delays {
            share: Share::None,
            ..d
        };
        assert_eq!(none.draw(), Duration::ZERO);
    }
}
