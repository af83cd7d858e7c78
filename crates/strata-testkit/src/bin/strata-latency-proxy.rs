//! strata-latency-proxy: a TCP proxy on 127.0.0.1 that adds latency (see
//! `--help` and strata_testkit::LatencyProxy). Used by scripts/bench to put
//! a far-away store's latency between strata and a local MinIO.

use std::io::Write;
use std::net::SocketAddr;
use std::process::ExitCode;

use strata_testkit::{LatencyConfig, LatencyProxy, Split};

const USAGE: &str = "\
usage: strata-latency-proxy --upstream 127.0.0.1:PORT --latency-ms MS [--jitter-ms MS]
                            [--listen 127.0.0.1:PORT] [--seed N] [--split request|response|half]
                            [--connect-ms MS] [--queue-mib N]";

const HELP: &str = "\
A TCP proxy that adds latency between a client and a server on 127.0.0.1,
e.g. strata and a local MinIO: measured from outside strata's process, so
connection reuse, parallel connections and retries cost what they would
against a store that answers in MS milliseconds.

Every connection accepted on --listen is forwarded to --upstream through a
delay line per direction: a burst of bytes (what arrives while the line is
idle, and everything that follows while it is still busy) is delivered after
a delay drawn uniformly from [latency - jitter, latency + jitter], in order;
bandwidth is not limited (bytes in flight are pipelined). With --split
request (the default), the whole delay is on the way to the upstream: one
HTTP request/response costs one delay. Half-closes propagate (after the
delay); each direction queues at most --queue-mib before it stops reading.

Options:
  --upstream ADDR     where to forward (127.0.0.1:PORT), required
  --latency-ms MS     mean added delay per exchange, required
  --jitter-ms MS      +/- spread of the delay (default 0; at most --latency-ms)
  --listen ADDR       where to listen (default 127.0.0.1:0: a free port)
  --seed N            seed of the delay draws (default 0)
  --split WHICH       request (default), response, or half (each way)
  --connect-ms MS     extra delay before a new connection's first bytes (default 0)
  --queue-mib N       bytes queued per connection and direction, MiB (default 64)
  -h, --help          this text

Prints `listening 127.0.0.1:PORT` on stdout once bound, then runs until
SIGTERM or SIGINT, and prints its counters on stderr at exit. Loopback
addresses only.";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}\n\n{HELP}");
        return ExitCode::SUCCESS;
    }
    let (listen, upstream, cfg) = match parse(&args) {
        Ok(parsed) => parsed,
        Err(e) => {
            eprintln!("strata-latency-proxy: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    // Before any thread starts: every thread inherits the mask.
    if let Err(e) = strata_testkit::stop_signal::block_stop_signals() {
        eprintln!("strata-latency-proxy: {e}");
        return ExitCode::FAILURE;
    }
    let proxy = match LatencyProxy::start_on(listen, upstream, cfg) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("strata-latency-proxy: cannot listen on {listen}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut out = std::io::stdout();
    if writeln!(out, "listening {}", proxy.addr())
        .and_then(|()| out.flush())
        .is_err()
    {
        eprintln!("strata-latency-proxy: cannot write to stdout");
        return ExitCode::FAILURE;
    }
    let c = proxy.config();
    eprintln!(
        "strata-latency-proxy: {} -> {}, {} ms +/- {} ms ({:?} direction), seed {}",
        proxy.addr(),
        upstream,
        c.latency_ms,
        c.jitter_ms,
        c.split,
        c.seed
    );
    let sig = strata_testkit::stop_signal::wait_for_stop_signal();
    let s = proxy.stats();
    drop(proxy);
    eprintln!(
        "strata-latency-proxy: signal {sig}: stopping; connections {}, upstream connect errors {}, \
         bytes to upstream {}, bytes to clients {}",
        s.connections, s.upstream_connect_errors, s.bytes_to_upstream, s.bytes_to_client
    );
    ExitCode::SUCCESS
}

fn parse(args: &[String]) -> Result<(SocketAddr, SocketAddr, LatencyConfig), String> {
    let mut listen = SocketAddr::from(([127, 0, 0, 1], 0));
    let mut upstream = None;
    let mut latency = None;
    let mut cfg = LatencyConfig::default();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n, Some(v.to_owned())),
            _ => (arg.as_str(), None),
        };
        let known = [
            "--upstream",
            "--listen",
            "--latency-ms",
            "--jitter-ms",
            "--seed",
            "--split",
            "--connect-ms",
            "--queue-mib",
        ];
        if !known.contains(&name) {
            return Err(format!("unknown argument {arg:?}"));
        }
        let value = match inline.or_else(|| it.next().cloned()) {
            Some(v) => v,
            None => return Err(format!("{name} needs a value")),
        };
        match name {
            "--upstream" => upstream = Some(loopback(name, &value)?),
            "--listen" => listen = loopback(name, &value)?,
            "--latency-ms" => latency = Some(number(name, &value)?),
            "--jitter-ms" => cfg.jitter_ms = number(name, &value)?,
            "--seed" => cfg.seed = number(name, &value)?,
            "--connect-ms" => cfg.connect_ms = number(name, &value)?,
            "--queue-mib" => {
                let mib = number(name, &value)?;
                if mib == 0 || mib > 4096 {
                    return Err(format!("{name} {value}: give 1 to 4096"));
                }
                cfg.queue_bytes =
                    usize::try_from(mib << 20).map_err(|_| format!("{name} {value}: too large"))?;
            }
            _ => {
                cfg.split = match value.as_str() {
                    "request" => Split::Request,
                    "response" => Split::Response,
                    "half" => Split::Half,
                    _ => return Err(format!("--split {value:?}: give request, response or half")),
                }
            }
        }
    }
    let Some(upstream) = upstream else {
        return Err("--upstream 127.0.0.1:PORT is required".to_owned());
    };
    let Some(latency) = latency else {
        return Err("--latency-ms is required (0 for none)".to_owned());
    };
    cfg.latency_ms = latency;
    if cfg.jitter_ms > cfg.latency_ms {
        return Err(format!(
            "--jitter-ms {} exceeds --latency-ms {}: delays cannot be negative",
            cfg.jitter_ms, cfg.latency_ms
        ));
    }
    if cfg.latency_ms.saturating_add(cfg.jitter_ms) > 600_000 || cfg.connect_ms > 600_000 {
        return Err("delays are limited to 600000 ms".to_owned());
    }
    if upstream.port() == 0 {
        return Err(format!("--upstream {upstream}: give the server's port"));
    }
    Ok((listen, upstream, cfg))
}

fn loopback(name: &str, value: &str) -> Result<SocketAddr, String> {
    let addr: SocketAddr = value
        .parse()
        .map_err(|_| format!("{name} {value:?}: not IP:PORT (e.g. 127.0.0.1:9000)"))?;
    if !addr.ip().is_loopback() {
        return Err(format!(
            "{name} {value}: only loopback addresses (127.0.0.1) are allowed"
        ));
    }
    Ok(addr)
}

fn number(name: &str, value: &str) -> Result<u64, String> {
    value
        .parse()
        .map_err(|_| format!("{name} {value:?}: not a whole number"))
}
