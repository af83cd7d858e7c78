//! `strata serve`: the NBD server over the engine's volumes.

use std::collections::HashSet;
use std::sync::Arc;

use anyhow::{bail, Context};
use nbd_server::{InheritedListener, ListenAddr, Server, ServerConfig, Tls, TlsMode};
use strata_store::{error_text, ErrorText};
use strata_volume::{Engine, EngineStats, VolumeError, VolumeInfo};

use crate::cli::{ServeArgs, TlsArgs, TlsModeArg};
use crate::nbd_volume::VolumeExports;
use crate::size::{parse_size, size_option};

/// Serves until SIGTERM or SIGINT, on `--listen` addresses and on the
/// listening sockets systemd passed (`inherited`; the default address is
/// only used when there are neither).
///
/// The control socket is taken first: a second server on the same data
/// directory stops before it opens, lists or prints anything.
pub async fn serve(
    engine: Arc<Engine>,
    args: &ServeArgs,
    inherited: Vec<InheritedListener>,
    open: OpenAtStart,
) -> anyhow::Result<()> {
    for spec in &args.create {
        create_if_missing(&engine, spec).await?;
    }
    let control_task = crate::control::listen(engine.clone()).await?;
    // This host's liveness record, before any volume: another server asks
    // it for a volume through the store even while it serves none.
    engine.set_serving();
    let requests_task = tokio::spawn(engine.clone().answer_store_requests());
    let result = serve_volumes(&engine, args, inherited, open).await;
    requests_task.abort();
    control_task.abort();
    let _ = std::fs::remove_file(crate::control::socket_path(&engine.config().data_dir));
    result
}

/// Which volumes open before clients ask for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenAtStart {
    /// The `--volume`s, or every volume of the store when none is named
    /// (`strata serve`).
    All,
    /// None: each opens when a client connects to it (`strata csi`: a
    /// node opens what is staged on it, and a store shared by many nodes
    /// is not opened whole by each).
    OnDemand,
}

/// Opens the `--volume`s (an error stops here), listens, opens every
/// volume when none was named (unless `open` is `OnDemand`), prints what
/// is served and `ready`, and serves until a signal.
async fn serve_volumes(
    engine: &Arc<Engine>,
    args: &ServeArgs,
    inherited: Vec<InheritedListener>,
    open: OpenAtStart,
) -> anyhow::Result<()> {
    let (vhost_inherited, inherited) = crate::vhost_serve::take_inherited(&args.vhost, inherited);
    let addrs = listen_addrs(engine, args, !inherited.is_empty())?;
    let config = ServerConfig {
        max_in_flight_per_connection: args.max_in_flight.max(1),
        max_in_flight_bytes: size_option("--max-in-flight-bytes", &args.max_in_flight_bytes)?,
        max_connections: args.max_connections,
        reply_stall_timeout_ms: args.reply_stall_timeout_ms,
        ..ServerConfig::default()
    };
    let tls = tls_settings(&args.tls)?;
    let only = open_named(engine, &args.volumes).await?;
    let exports = Arc::new(VolumeExports {
        engine: engine.clone(),
        max_request_bytes: config.max_request_bytes,
        only: only.clone(),
    });
    crate::vhost_serve::check(&exports, &args.vhost).await?;
    let stop = shutdown_signal();
    // Bound before the volumes open: clients restarting with the server
    // wait in the listen backlog, not on a refused connection.
    // Its errors name the address (or the setting) and the reason.
    let mut server = Server::bind_and_adopt(exports.clone(), &addrs, inherited, config).await?;
    let tls_on = tls.is_some();
    if let Some(tls) = tls {
        server = server.with_tls(tls);
    }
    let served = match (&only, open) {
        (Some(_), _) => OpenOutcome::all(args.volumes.clone()),
        (None, OpenAtStart::OnDemand) => OpenOutcome::all(Vec::new()),
        (None, OpenAtStart::All) => open_all(engine, engine.list_volumes().await?).await,
    };
    let vhost =
        crate::vhost_serve::start(exports, &args.vhost, &served.served, vhost_inherited).await?;
    let loops = match &args.loop_dir {
        Some(dir) => Some(crate::loop_serve::start(engine, dir, &served.served).await?),
        None => None,
    };
    let metrics_task = match &args.metrics_listen {
        Some(addr) => {
            let vhost_metrics = vhost.as_ref().map(|v| v.metrics());
            let (bound, task) =
                crate::metrics::start(addr, engine.clone(), server.metrics(), vhost_metrics)
                    .await?;
            println!("metrics http://{bound}/metrics");
            Some(task)
        }
        None => None,
    };
    print_uris(&served, &server.local_addrs(), tls_on)?;
    let stats_task = start_stats(engine, args);
    crate::socket_activation::notify_ready();
    let (stopping, stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        stop.await;
        let _ = stopping.send(true);
    });
    let wait = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let vhost_stop = wait(stopped.clone());
    // Both frontends stop together: each returns what it took before the
    // volumes close.
    let (result, ()) = tokio::join!(server.run(wait(stopped)), async move {
        if let Some(vhost) = vhost {
            vhost_stop.await;
            vhost.shutdown().await;
        }
    });
    crate::socket_activation::notify_stopping();
    if let Some(loops) = loops {
        loops.shutdown().await;
    }
    tracing::info!("shutting down: making every volume durable in the store");
    let closed = engine.close_all().await;
    stats_task.abort();
    if let Some(task) = metrics_task {
        task.abort();
    }
    let last = engine.stats();
    tracing::info!(stats = %summary(&last), "final counters");
    if let Some(path) = &args.stats_file {
        if let Err(e) = write_stats(path, &last) {
            tracing::warn!(file = %path.display(), error = %ErrorText(e.as_ref()), "cannot write the stats file");
        }
    }
    result.context("server failed")?;
    closed.context(
        "clean shutdown failed (the journal still holds the data; the next start recovers it)",
    )?;
    Ok(())
}

/// Writes the counters to `--stats-file` every interval and logs a summary
/// at debug level (`RUST_LOG=strata=debug`).
fn start_stats(engine: &Arc<Engine>, args: &ServeArgs) -> tokio::task::JoinHandle<()> {
    let engine = engine.clone();
    let path = args.stats_file.clone();
    let period = std::time::Duration::from_millis(args.stats_interval_ms.max(100));
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(period);
        loop {
            tick.tick().await;
            let stats = engine.stats();
            tracing::debug!(stats = %summary(&stats), "counters");
            if let Some(path) = &path {
                if let Err(e) = write_stats(path, &stats) {
                    tracing::warn!(file = %path.display(), error = %ErrorText(e.as_ref()), "cannot write the stats file");
                }
            }
        }
    })
}

/// One line: store requests and errors, cache hit rates.
fn summary(s: &EngineStats) -> String {
    let r = &s.store.layers;
    let (ram, disk) = (&s.read_path.ram_chunks, &s.read_path.disk_cache);
    let mut line = format!(
        "store requests {} errors {} (not found {}) retries {} gave_up {}; RAM cache hits {} misses {} ({} of {} bytes); disk cache hits {} misses {} ({} of {} bytes); read-ahead {} bytes",
        r.requests.total_requests(),
        r.requests.total_errors(),
        r.requests.total_not_found(),
        r.retries.retries,
        r.retries.gave_up,
        ram.hits,
        ram.misses,
        ram.used_bytes,
        ram.budget_bytes,
        disk.hits,
        disk.misses,
        disk.used_bytes,
        disk.budget_bytes,
        s.read_path.readahead.bytes_prefetched,
    );
    if let Some(f) = &r.faults {
        line.push_str(&format!("; injected faults {}", f.injected_errors));
    }
    if let Some(h) = &s.store.http {
        line.push_str(&format!(
            "; responses HTTP/1.x {} HTTP/2 {}",
            h.http1_responses, h.http2_responses
        ));
    }
    if let Some(r) = &s.store.recycle {
        line.push_str(&format!(
            "; segment files recycled {} new {} (pool {} files, {} bytes)",
            r.reused_files, r.new_files, r.pool_files, r.pool_bytes
        ));
    }
    line
}

/// Writes the stats JSON atomically (temporary file, then rename).
fn write_stats(path: &std::path::Path, stats: &EngineStats) -> anyhow::Result<()> {
    let json = serde_json::to_vec_pretty(stats)?;
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, json).with_context(|| format!("write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("rename to {}", path.display()))?;
    Ok(())
}

/// Opens the volumes named by `--volume` before serving: a volume that
/// cannot be opened (another server holds it, it does not exist, its key
/// is missing) stops the server with the reason. `None` when no volume was
/// named.
async fn open_named(
    engine: &Arc<Engine>,
    names: &[String],
) -> anyhow::Result<Option<HashSet<String>>> {
    if names.is_empty() {
        return Ok(None);
    }
    for name in names {
        if let Err(e) = engine.open_volume(name).await {
            bail!("{}", cannot_serve(name, &e));
        }
    }
    Ok(Some(names.iter().cloned().collect()))
}

/// "cannot serve volume "v": REASON", the volume named once: an engine
/// error that names it already ("volume "v" is being served by ...",
/// "volume "v": no key given") is not prefixed with the name again.
fn cannot_serve(name: &str, e: &VolumeError) -> String {
    let text = error_text(e);
    match text.strip_prefix(&format!("volume {name:?}")) {
        Some(rest) if rest.starts_with(": ") => format!("cannot serve {text}"),
        Some(rest) if rest.starts_with(' ') => format!("cannot serve: {text}"),
        _ => format!("cannot serve volume {name:?}: {text}"),
    }
}

/// How long `serve` without `--volume` waits for its volumes to open
/// before it prints what it serves. Opening recovers a volume (replays its
/// journal, reads its checkpoint): seconds, unless a journal is large and
/// the store slow; one such volume must not keep the others unserved.
const OPEN_WAIT_MS: u64 = 30_000;

/// What `serve` opened: the volumes it serves (listed with URIs), and
/// those it could not open or that were still opening, with the reason.
struct OpenOutcome {
    served: Vec<String>,
    /// How many were not: each named on stderr with the reason as found.
    not_served: usize,
}

impl OpenOutcome {
    fn all(served: Vec<String>) -> OpenOutcome {
        OpenOutcome {
            served,
            not_served: 0,
        }
    }
}

/// Opens (recovers) every volume of the store, all at once, before `ready`
/// is printed, so `ready` and the URIs mean "served", journals are
/// replayed and uploaded promptly, and a volume that cannot be opened is
/// named with its reason at start rather than at its first client. A
/// volume still opening after [`OPEN_WAIT_MS`] goes on opening in the
/// background (its clients wait for it) and is named as such. A volume
/// that could not be opened is tried again at its next client's connection
/// (the server holding it may have stopped).
async fn open_all(engine: &Arc<Engine>, volumes: Vec<VolumeInfo>) -> OpenOutcome {
    let mut opening = Vec::new();
    for v in volumes {
        // Known as opening from now on: the control socket waits for it
        // rather than say the volume is not served here.
        engine.will_open(&v.name);
        let engine = engine.clone();
        let name = v.name.clone();
        let task = tokio::spawn(async move { engine.open_volume(&name).await.map(|_| ()) });
        opening.push((v.name, task));
    }
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_millis(OPEN_WAIT_MS);
    let mut outcome = OpenOutcome::all(Vec::new());
    for (name, task) in opening {
        let why = match tokio::time::timeout_at(deadline, task).await {
            Ok(Ok(Ok(()))) => {
                outcome.served.push(name);
                continue;
            }
            Ok(Ok(Err(e))) => cannot_serve(&name, &e),
            Ok(Err(e)) => format!("cannot serve volume {name:?}: opening it failed: {e}"),
            Err(_) => format!(
                "not serving volume {name:?} yet: still opening after {} s (a long journal to replay?); it is served once open",
                OPEN_WAIT_MS / 1000
            ),
        };
        tracing::error!(volume = %name, "{why}");
        outcome.not_served += 1;
    }
    outcome
}

async fn create_if_missing(engine: &Engine, spec: &str) -> anyhow::Result<()> {
    let Some((name, size)) = spec.split_once('=') else {
        bail!("--create {spec:?}: expected NAME=SIZE, e.g. vm1=10GiB");
    };
    let size = parse_size(size).map_err(anyhow::Error::msg)?;
    match engine.create_volume(name, size).await {
        Ok(_) => tracing::info!(volume = name, size, "created volume"),
        Err(VolumeError::AlreadyExists(_)) => {
            let info = engine.volume_info(name).await?;
            if info.size_bytes != size {
                tracing::warn!(
                    volume = name,
                    existing = info.size_bytes,
                    asked = size,
                    "volume exists with another size; serving it as it is"
                );
            }
        }
        Err(e) => return Err(e.into()),
    }
    Ok(())
}

fn listen_addrs(
    engine: &Engine,
    args: &ServeArgs,
    socket_activated: bool,
) -> anyhow::Result<Vec<ListenAddr>> {
    if args.listen.is_empty() && socket_activated {
        return Ok(Vec::new());
    }
    if args.listen.is_empty() {
        // The data directory exists: `engine()` made it for `serve`.
        let dir = &engine.config().data_dir;
        return Ok(vec![ListenAddr::Unix(dir.join("strata.sock"))]);
    }
    args.listen
        .iter()
        .map(|s| s.parse::<ListenAddr>().map_err(anyhow::Error::from))
        .collect()
}

/// The server's TLS from `--tls*`, the files read and checked now (a bad
/// one stops the start with the reason).
fn tls_settings(args: &TlsArgs) -> anyhow::Result<Option<Tls>> {
    let mode = match (args.tls, &args.tls_cert) {
        (Some(TlsModeArg::Off), _) | (None, None) => return Ok(None),
        (Some(TlsModeArg::Optional), _) => TlsMode::Optional,
        (Some(TlsModeArg::Require), _) | (None, Some(_)) => TlsMode::Require,
    };
    let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) else {
        bail!("--tls needs --tls-cert FILE and --tls-key FILE (the server's certificate and private key, PEM)");
    };
    let tls = Tls::from_pem_files(cert, key, args.tls_ca.as_deref(), mode)?;
    Ok(Some(tls))
}

/// Prints the URI of each volume served at each address, then `ready`.
/// Volumes not served were named on stderr by [`open_all`].
fn print_uris(outcome: &OpenOutcome, addrs: &[ListenAddr], tls: bool) -> anyhow::Result<()> {
    let s = if tls { "s" } else { "" };
    for addr in addrs {
        for name in &outcome.served {
            match addr {
                ListenAddr::Unix(path) => {
                    println!("nbd{s}+unix:///{name}?socket={}", path.display())
                }
                ListenAddr::Tcp(sa) => println!("nbd{s}://{sa}/{name}"),
            }
        }
        match (outcome.served.is_empty(), outcome.not_served) {
            (false, _) => {}
            (true, 0) => println!(
                "listening on {addr} (no volumes yet: strata volume create NAME --size SIZE)"
            ),
            (true, n) => println!(
                "listening on {addr} (none of the {n} volumes could be opened yet: see the errors above)"
            ),
        }
    }
    println!("ready");
    use std::io::Write;
    std::io::stdout().flush().context("stdout")?;
    Ok(())
}

/// Installs the SIGTERM / SIGINT handlers now (before `ready` is printed:
/// a stop right after it must be a clean one) and resolves on either.
pub(crate) fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    async move { wait_for_signals(term, int).await }
}

async fn wait_for_signals(
    term: std::io::Result<tokio::signal::unix::Signal>,
    int: std::io::Result<tokio::signal::unix::Signal>,
) {
    match (term, int) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => {
            tracing::error!(
                "cannot install signal handlers; stop the server with kill -9 only after a FLUSH"
            );
            std::future::pending::<()>().await;
        }
    }
}
