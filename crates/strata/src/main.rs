//! The `strata` binary: volume administration and the NBD server.

mod cli;
mod control;
mod csi_cmd;
mod fsck_cmd;
mod loop_serve;
mod metrics;
mod nbd_volume;
mod progress;
mod qos_spec;
mod serve;
mod size;
mod snapshot_cmd;
mod socket_activation;
mod store_cmd;
mod vhost_serve;
mod vhost_volume;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::Parser;
use strata_store::{ErrorText, FaultConfig, LayerConfig, RetryPolicy, Store, StoreError};
use strata_volume::{
    Durability, Engine, GcConfig, GcPassReport, HydrateConfig, HydrateMode, VolumeConfig,
    GC_GRACE_EMBEDDED_MS, GC_GRACE_REMOTE_MS,
};

use crate::cli::{
    Cli, Command, DurabilityArg, GcArgs, KeyCommand, LogFormat, OnOff, OnOffAuto, ServeArgs,
    StandbyArg, StoreCommand, VolumeCommand,
};
use crate::size::{approx_size, format_size, size_option};

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    init_logging(
        cli.log_format,
        matches!(cli.command, Command::Serve(_) | Command::Csi(_)),
    );
    // Before the runtime's threads start: this clears LISTEN_* variables.
    let inherited = match &cli.command {
        Command::Serve(_) => socket_activation::take_inherited_listeners(),
        _ => Ok(Vec::new()),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("strata: error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let log_format = cli.log_format;
    // fsck tells "problems found" (1) from "could not check" (2).
    let failed = match cli.command {
        Command::Fsck(_) => ExitCode::from(fsck_cmd::EXIT_NOT_RUN),
        _ => ExitCode::FAILURE,
    };
    match runtime.block_on(run(cli, inherited)) {
        Ok(code) => code,
        Err(e) if log_format == LogFormat::Json => {
            // A shipper parses every line: the last one too.
            tracing::error!(error = %ErrorText(e.as_ref()), "strata: error");
            failed
        }
        Err(e) => {
            eprintln!("strata: error: {}", ErrorText(e.as_ref()));
            failed
        }
    }
}

/// A command line clap refuses: one line like every other error (what is
/// wrong, clap's tip if any, the usage), exit 2 as clap's. Help, version
/// and a bare `strata` print as clap prints them.
fn usage_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(
        e.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        e.exit()
    }
    eprintln!("strata: error: {}", one_line_usage(&e.render().to_string()));
    ExitCode::from(2)
}

/// clap's multi-line message as one line: "error: " and "For more
/// information" dropped, the items listed under a line ending in ':'
/// joined with ", ", the other lines with "; ".
fn one_line_usage(rendered: &str) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut listing = false;
    for raw in rendered.lines() {
        let line = raw.trim();
        if line.is_empty() {
            listing = false;
            continue;
        }
        if line.starts_with("For more information") {
            continue;
        }
        if let (true, true, Some(last)) = (listing, raw.starts_with(' '), parts.last_mut()) {
            let separator = if last.ends_with(':') { " " } else { ", " };
            last.push_str(separator);
            last.push_str(line);
            continue;
        }
        let line = line.strip_prefix("error: ").unwrap_or(line);
        listing = line.ends_with(':');
        parts.push(match line.strip_prefix("Usage: ") {
            Some(usage) => format!("usage: {usage} (--help explains)"),
            None => line.to_string(),
        });
    }
    parts.join("; ")
}

/// Logs on stderr, at STRATA_LOG's levels. By default a server logs from
/// info up, each store retry included. A one-shot command logs warnings
/// and errors only, without the store's retry messages: what it did is
/// its output, and its final error says what failed, after how many
/// attempts, so a failing command prints one line.
fn init_logging(format: LogFormat, server: bool) {
    let default = if server {
        "info".to_string()
    } else {
        format!("warn,{}=off", strata_store::RETRY_LOG_TARGET)
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("STRATA_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        // One JSON object per line (timestamp, level, target, message and
        // every field at the top level), for log shippers.
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .init(),
    }
}

fn default_data_dir() -> anyhow::Result<PathBuf> {
    if let Some(x) = std::env::var_os("XDG_DATA_HOME").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(x).join("strata"));
    }
    let Some(home) = std::env::var_os("HOME").filter(|v| !v.is_empty()) else {
        bail!("neither --data-dir, STRATA_DATA_DIR, XDG_DATA_HOME nor HOME is set: say where local state goes with --data-dir DIR");
    };
    Ok(PathBuf::from(home).join(".local/share/strata"))
}

/// The store layers the command line asks for.
fn layer_config(cli: &Cli) -> anyhow::Result<LayerConfig> {
    if cli.max_store_requests == 0 || cli.store_attempts == 0 {
        bail!("--max-store-requests and --store-attempts must be at least 1");
    }
    let faults = match &cli.inject_faults {
        Some(spec) if !spec.is_empty() => {
            let f = FaultConfig::parse(spec)
                .map_err(|e| anyhow::anyhow!("--inject-faults / STRATA_FAULTS: {e}"))?;
            tracing::warn!(faults = %f, "injecting store faults (testing only)");
            Some(f)
        }
        _ => None,
    };
    Ok(LayerConfig {
        retry: RetryPolicy {
            max_attempts: cli.store_attempts,
            ..RetryPolicy::default()
        },
        max_in_flight_requests: cli.max_store_requests,
        faults,
        recycle_bytes: size_option("--recycle-size", &cli.recycle_size)?,
        recycle_min_bytes: size_option("--recycle-min-size", &cli.recycle_min_size)?,
    })
}

/// The user's key: --key-file (or STRATA_KEY_FILE), else STRATA_KEY.
fn user_key(cli: &Cli) -> anyhow::Result<Option<strata_volume::Key>> {
    match &cli.key_file {
        Some(path) => Ok(Some(strata_volume::load_key_file(path)?)),
        None => Ok(strata_volume::key_from_env()?),
    }
}

fn key_command(cli: &Cli, cmd: &KeyCommand) -> anyhow::Result<()> {
    match cmd {
        KeyCommand::Generate { file } => {
            let key = strata_volume::generate_key_file(file)?;
            println!(
                "wrote a new key to {} (fingerprint {}); keep a copy in a safe place: without it, volumes encrypted under it cannot be read",
                file.display(),
                key.fingerprint()
            );
        }
        KeyCommand::Fingerprint => match user_key(cli)? {
            Some(key) => println!("{}", key.fingerprint()),
            None => anyhow::bail!("no key given: use --key-file FILE or STRATA_KEY"),
        },
    }
    Ok(())
}

fn data_dir(cli: &Cli) -> anyhow::Result<PathBuf> {
    match &cli.data_dir {
        Some(d) => Ok(d.clone()),
        None => default_data_dir(),
    }
}

/// Opens the store `spec` names, else --store's, else <data-dir>/store.
async fn open_store(cli: &Cli, spec: Option<&str>) -> anyhow::Result<Store> {
    let given = spec.or(cli.store.as_deref());
    let spec = match given {
        Some(s) => {
            refuse_missing_directory(s, &cli.command)?;
            s.to_string()
        }
        None => data_dir(cli)?.join("store").to_string_lossy().into_owned(),
    };
    match Store::open(&spec, &layer_config(cli)?).await {
        Ok(store) => Ok(store),
        // The user named no store: the data directory is what to fix.
        Err(StoreError::Unusable { reason, .. }) if given.is_none() => bail!(
            "cannot open the default store {spec} (--store not given): {reason}; give --data-dir (or STRATA_DATA_DIR) a writable directory, or --store"
        ),
        Err(e) => Err(anyhow::Error::from(e).context("cannot open the store")),
    }
}

/// The directory of the store when it is a local one (`None` for S3).
fn local_store_dir(cli: &Cli) -> anyhow::Result<Option<PathBuf>> {
    let spec = match &cli.store {
        Some(s) => s.clone(),
        None => data_dir(cli)?.join("store").to_string_lossy().into_owned(),
    };
    Ok(Store::local_dir(&spec).map(PathBuf::from))
}

/// A local store given by the user that does not exist is a typo more
/// often than a wish for a new one: only the commands that put a first
/// volume in a store (or check it) create its directory; the others say
/// it is missing instead of answering for an empty store made on the spot.
fn refuse_missing_directory(spec: &str, command: &Command) -> anyhow::Result<()> {
    let creates = match command {
        Command::Serve(_) | Command::Csi(_) | Command::Store(_) => true,
        Command::Volume(v) => matches!(
            v,
            VolumeCommand::Create { .. } | VolumeCommand::Import { .. }
        ),
        _ => false,
    };
    let Some(path) = Store::local_dir(spec) else {
        return Ok(());
    };
    if creates || path.is_empty() || std::path::Path::new(path).exists() {
        return Ok(());
    }
    bail!("store {path} does not exist: check --store (or STRATA_STORE); `strata volume create NAME --size SIZE` makes a new store there")
}

/// Resolves data dir and store, and builds the engine. A command that
/// writes volumes first makes sure the store enforces conditional writes.
async fn engine(cli: &Cli, serve: Option<&ServeArgs>) -> anyhow::Result<Engine> {
    let data_dir = data_dir(cli)?;
    // A key file with loose permissions or a malformed STRATA_KEY is the
    // user's to fix first, whatever the store.
    let key = user_key(cli)?.map(std::sync::Arc::new);
    let writes = store_cmd::writes_volumes(&cli.command);
    if writes {
        // Journals, leases' holder id and locks live there: say so now
        // rather than name a file deep inside it.
        std::fs::create_dir_all(&data_dir).map_err(|e| {
            anyhow::anyhow!(
                "cannot create the data directory {}: {e}; give --data-dir (or STRATA_DATA_DIR) a writable directory",
                data_dir.display()
            )
        })?;
    }
    let store = open_store(cli, None).await?;
    if writes {
        store_cmd::require_conditional_writes(&store, cli.unsafe_single_host).await?;
    }
    let mut config = VolumeConfig::new(data_dir);
    config.key = key;
    if let Some(args) = serve {
        config.compression = args
            .compression
            .parse()
            .map_err(|e: String| anyhow::anyhow!("--compression: {e}"))?;
        config.durability = match args.durability {
            DurabilityArg::Local => Durability::Local,
            DurabilityArg::Remote => Durability::Remote,
        };
        config.standby = match args.standby {
            StandbyArg::Auto => strata_volume::StandbyPolicy::Auto,
            StandbyArg::Explicit => strata_volume::StandbyPolicy::Explicit,
            StandbyArg::Off => strata_volume::StandbyPolicy::Off,
        };
        config.standby_wait_ms = args.standby_wait_ms;
        config.lease_ttl_ms = args.lease_ttl_ms;
        config.control_socket = Some(crate::control::socket_path(&config.data_dir));
        let b = &args.budgets;
        config.segment_bytes = size_option("--segment-size", &b.segment_size)?;
        config.segment_max_age_ms = b.segment_age_ms;
        config.write_buffer_bytes = size_option("--write-buffer", &b.write_buffer)?;
        config.write_buffer_total_bytes =
            size_option("--write-buffer-total", &b.write_buffer_total)?;
        config.journal_bytes = size_option("--journal-size", &b.journal_size)?;
        config.journal_punch_min_bytes =
            size_option("--journal-punch-min-size", &b.journal_punch_min_size)?;
        config.flush_seal_min_bytes = size_option("--flush-seal-min-size", &b.flush_seal_min_size)?;
        config.bulk_write_min_bytes = size_option("--bulk-write-min-size", &b.bulk_write_min_size)?;
        config.cache_bytes = size_option("--cache-size", &b.cache_size)?;
        config.max_parallel_uploads = b.parallel_uploads;
        config.max_parallel_uploads_total = b.parallel_uploads_total;
        config.max_gets_total = cli.max_store_requests;
        let remote = !store.is_local();
        let auto_disk_cache = strata_volume::auto_disk_cache_bytes(&config.data_dir);
        config.disk_cache_bytes = auto_size(
            "--disk-cache-size",
            &b.disk_cache_size,
            remote,
            auto_disk_cache,
        )?;
        config.readahead_max_bytes = auto_size("--readahead", &b.readahead, remote, 8 * MIB)?;
        config.gc = gc_config(&args.gc, remote)?;
        config.hydrate = HydrateConfig {
            mode: match b.hydrate {
                OnOffAuto::On => HydrateMode::On,
                OnOffAuto::Off => HydrateMode::Off,
                OnOffAuto::Auto => HydrateMode::Auto,
            },
            rate_bytes_per_sec: size_option("--hydrate-rate", &b.hydrate_rate)?,
        };
        config.hedge_reads = b.hedge_reads == OnOff::On;
        config.profile_record = b.profile_record == OnOff::On;
        config.profile_prefetch = b.profile_prefetch == OnOff::On;
    }
    if let Command::Volume(VolumeCommand::Gc { gc_grace_ms, .. }) = &cli.command {
        config.gc.grace_ms = *gc_grace_ms;
    }
    Engine::new(store, config).context("invalid configuration")
}

fn gc_config(a: &GcArgs, remote: bool) -> anyhow::Result<GcConfig> {
    Ok(GcConfig {
        enabled: a.gc == OnOff::On,
        live_threshold_percent: a.gc_live_threshold,
        space_target_percent: a.gc_space_target,
        grace_ms: a.gc_grace_ms.unwrap_or(if remote {
            GC_GRACE_REMOTE_MS
        } else {
            GC_GRACE_EMBEDDED_MS
        }),
        interval_ms: a.gc_interval_ms,
        rate_bytes_per_sec: size_option("--gc-rate", &a.gc_rate)?,
        rewrite_fragmented_reads: match a.gc_rewrite_reads {
            OnOffAuto::On => true,
            OnOffAuto::Off => false,
            OnOffAuto::Auto => !remote,
        },
    })
}

const MIB: u64 = 1 << 20;

/// A size option that may be `auto`: `remote_default` for remote stores,
/// 0 for the embedded one.
fn auto_size(option: &str, value: &str, remote: bool, remote_default: u64) -> anyhow::Result<u64> {
    if value == "auto" {
        return Ok(if remote { remote_default } else { 0 });
    }
    size_option(option, value)
}

async fn run(
    cli: Cli,
    inherited: anyhow::Result<Vec<nbd_server::InheritedListener>>,
) -> anyhow::Result<ExitCode> {
    match &cli.command {
        Command::Volume(cmd) => volume_command(&engine(&cli, None).await?, cmd).await?,
        Command::Snapshot(cmd) => snapshot_cmd::run(&engine(&cli, None).await?, cmd).await?,
        Command::Serve(args) => {
            let inherited = inherited?;
            let engine = std::sync::Arc::new(engine(&cli, Some(args)).await?);
            serve::serve(engine, args, inherited, serve::OpenAtStart::All).await?
        }
        Command::Csi(args) => {
            let engine = engine(&cli, Some(&args.serve)).await?;
            let local_store = local_store_dir(&cli)?;
            csi_cmd::run(engine, args, local_store).await?
        }
        Command::Key(cmd) => key_command(&cli, cmd)?,
        Command::Fsck(args) => return fsck_cmd::run(&engine(&cli, None).await?, args).await,
        Command::Store(StoreCommand::Check { url, json }) => {
            store_cmd::check(&open_store(&cli, url.as_deref()).await?, *json).await?
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn volume_command(engine: &Engine, cmd: &VolumeCommand) -> anyhow::Result<()> {
    match cmd {
        VolumeCommand::Create {
            name,
            size,
            compression,
            qos,
        } => {
            let size = size_option("--size", size)?;
            let compression = compression
                .parse()
                .map_err(|e: String| anyhow::anyhow!("--compression: {e}"))?;
            let limits = match qos {
                Some(spec) => {
                    qos_spec::parse_qos(spec).map_err(|e| anyhow::anyhow!("--qos: {e}"))?
                }
                None => strata_volume::QosLimits::default(),
            };
            let m = engine
                .create_volume_limited(name, size, compression, limits)
                .await?;
            let encrypted = match &m.encryption {
                Some(e) => format!(", encrypted (key {})", e.key_fingerprint),
                None => String::new(),
            };
            println!(
                "created volume {} ({}, {} bytes, compression {compression}{encrypted}) in {}",
                m.name,
                format_size(m.size_bytes),
                m.size_bytes,
                engine.store().description()
            );
        }
        VolumeCommand::SetQos { name, spec } => {
            let limits = qos_spec::parse_qos(spec).map_err(|e| anyhow::anyhow!("{e}"))?;
            let req = control::Request::SetQos {
                volume: name.clone(),
                qos: limits.clone(),
            };
            let what = format!("set the QoS limits of {name:?}");
            let command = format!("strata volume set-qos {name} {spec}");
            let previous =
                match control::on_serving_server(engine, name, &req, &what, &command).await? {
                    Some(v) => serde_json::from_value(v).unwrap_or_default(),
                    None => engine.set_volume_qos(name, limits.clone()).await?,
                };
            println!(
                "{name}: QoS {} -> {}",
                qos_spec::format_qos(&previous),
                qos_spec::format_qos(&limits)
            );
        }
        VolumeCommand::SetCompression { name, compression } => {
            let parsed: strata_volume::Compression = compression
                .parse()
                .map_err(|e: String| anyhow::anyhow!("{e}"))?;
            let req = control::Request::SetCompression {
                volume: name.clone(),
                compression: parsed.to_string(),
            };
            let what = format!("set the compression of {name:?}");
            let command = format!("strata volume set-compression {name} {compression}");
            let previous =
                match control::on_serving_server(engine, name, &req, &what, &command).await? {
                    Some(v) => v.as_str().unwrap_or("?").to_string(),
                    None => engine
                        .set_volume_compression(name, parsed)
                        .await?
                        .to_string(),
                };
            println!("{name}: compression {previous} -> {parsed} (new data from now on)");
        }
        VolumeCommand::Rekey { name, new_key_file } => {
            let new_key = strata_volume::load_key_file(new_key_file)?;
            if engine.config().key.is_none() {
                anyhow::bail!(
                    "rekey needs the volume's current key too: give it with --key-file or STRATA_KEY"
                );
            }
            let path = std::fs::canonicalize(new_key_file)
                .with_context(|| format!("key file {}", new_key_file.display()))?;
            let req = control::Request::Rekey {
                volume: name.clone(),
                new_key_file: path,
            };
            let what = format!("rekey {name:?}");
            let command = format!("strata volume rekey {name} --new-key-file FILE");
            let fingerprint =
                match control::on_serving_server(engine, name, &req, &what, &command).await? {
                    Some(v) => v.as_str().unwrap_or("?").to_string(),
                    None => engine.rekey_volume(name, &new_key).await?,
                };
            println!(
                "{name}: data key now wrapped by key {fingerprint}; the old key no longer opens it"
            );
        }
        VolumeCommand::List { json } => {
            let volumes = engine.list_volumes().await?;
            if *json {
                println!("{}", serde_json::to_string_pretty(&volumes)?);
            } else if volumes.is_empty() {
                println!("no volumes in {}", engine.store().description());
            } else {
                println!(
                    "{:<32} {:>12} {:>9} {:>12}",
                    "NAME", "SIZE", "SEGMENTS", "STORED"
                );
                for v in volumes {
                    println!(
                        "{:<32} {:>12} {:>9} {:>12}",
                        v.name,
                        format_size(v.size_bytes),
                        v.segments,
                        format_size(v.stored_bytes)
                    );
                }
            }
        }
        VolumeCommand::Info { name, json } => {
            let v = volume_info(engine, name).await?;
            if *json {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                println!("name:        {}", v.name);
                println!(
                    "size:        {} ({} bytes)",
                    format_size(v.size_bytes),
                    v.size_bytes
                );
                println!("uuid:        {}", v.uuid);
                println!("compression: {}", v.compression);
                match &v.encryption_key_fingerprint {
                    Some(fp) => println!("encryption:  aes-256-gcm, key fingerprint {fp}"),
                    None => println!("encryption:  none"),
                }
                println!("segments:    {}", v.segments);
                println!(
                    "stored:      {} ({} bytes)",
                    format_size(v.stored_bytes),
                    v.stored_bytes
                );
                let ckpt = v
                    .checkpoint_seq
                    .map_or("none".to_string(), |s| s.to_string());
                println!("checkpoint:  {ckpt}");
                println!("epoch:       {}", v.epoch);
                println!(
                    "served by:   {}",
                    v.served_by.as_deref().unwrap_or("nobody")
                );
                print_space_info(&v);
                print_hydration_info(&v);
                print_qos_info(&v);
                print_history_info(&v);
            }
        }
        VolumeCommand::Flatten { name } => {
            let req = control::Request::Flatten {
                volume: name.clone(),
            };
            let what = format!("flatten {name:?}");
            let command = format!("strata volume flatten {name}");
            let copied =
                match control::on_serving_server(engine, name, &req, &what, &command).await? {
                    Some(v) => v.as_u64().unwrap_or(0),
                    None => engine.flatten_volume(name).await?,
                };
            println!(
                "flattened {name}: copied {} from its parent; it is no longer a clone",
                format_size(copied)
            );
        }
        VolumeCommand::Resize {
            name,
            size,
            allow_shrink,
        } => {
            let size_bytes = size_option("--size", size)?;
            let req = control::Request::Resize {
                volume: name.clone(),
                size_bytes,
                allow_shrink: *allow_shrink,
            };
            let what = format!("resize {name:?}");
            let command = format!("strata volume resize {name} --size {size}");
            let old = match control::on_serving_server(engine, name, &req, &what, &command).await? {
                Some(v) => v.as_u64().unwrap_or(0),
                None => {
                    engine
                        .resize_volume(name, size_bytes, *allow_shrink)
                        .await?
                }
            };
            println!(
                "resized {name} from {} to {} ({size_bytes} bytes)",
                format_size(old),
                format_size(size_bytes)
            );
        }
        VolumeCommand::Diff { .. }
        | VolumeCommand::ExportDiff { .. }
        | VolumeCommand::ImportDiff { .. }
        | VolumeCommand::Export { .. }
        | VolumeCommand::Import { .. } => snapshot_cmd::data_command(engine, cmd).await?,
        VolumeCommand::Clone {
            source,
            name,
            parent_prefix,
        } => {
            let (parent, snapshot) = snapshot_cmd::split_target(source)?;
            let prefix = parent_prefix.as_deref();
            let m = engine.create_clone(prefix, parent, snapshot, name).await?;
            println!(
                "created volume {name} ({}), a clone of {parent}@{snapshot}",
                format_size(m.size_bytes)
            );
        }
        VolumeCommand::Delete { name } => {
            engine.delete_volume(name).await?;
            println!("deleted volume {name}");
        }
        VolumeCommand::Handover {
            name,
            timeout_ms,
            json,
        } => {
            let timeout = std::time::Duration::from_millis(*timeout_ms);
            if take_through_own_server(engine, name, *timeout_ms, *json).await? {
                return Ok(());
            }
            let outcome = engine.request_handover(name, timeout).await?;
            if *json {
                println!("{}", serde_json::to_string_pretty(&outcome)?);
            } else {
                match (&outcome.holder, &outcome.report) {
                    (None, _) => println!("volume {name} is not held by any server: nothing to hand over"),
                    (Some(holder), Some(r)) => println!(
                        "volume {name} released by {holder} in {} ms through its control socket ({} uploaded first)",
                        outcome.elapsed_ms,
                        format_size(r.bytes_uploaded)
                    ),
                    (Some(holder), None) => println!(
                        "volume {name} released by {holder} in {} ms (asked through the store)",
                        outcome.elapsed_ms
                    ),
                }
            }
        }
        VolumeCommand::Gc {
            name, wait, json, ..
        } => {
            let report = gc_command(engine, name, *wait).await?;
            if *json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print_gc_report(name, &report, *wait);
            }
        }
    }
    Ok(())
}

/// `volume handover` run on the data dir of a running server: that server
/// takes the volume (its standby switches over). `Ok(false)`: no server
/// runs there.
async fn take_through_own_server(
    engine: &Engine,
    name: &str,
    timeout_ms: u64,
    json: bool,
) -> anyhow::Result<bool> {
    let req = control::Request::Take {
        volume: name.to_string(),
        timeout_ms,
    };
    let data_dir = &engine.config().data_dir;
    let Some(reply) = control::ask(data_dir, &req).await? else {
        return Ok(false);
    };
    let taken = match reply {
        control::Reply::Ok(v) => v,
        control::Reply::Error { error, .. } => anyhow::bail!(
            "the server on {} could not take volume {name:?}: {error}",
            data_dir.display()
        ),
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&taken)?);
        return Ok(true);
    }
    let ms = taken["elapsed_ms"].as_u64().unwrap_or(0);
    if taken["already_held"] == true {
        println!("volume {name} is held by the server on this data dir already");
    } else if taken["standby"] == true {
        println!("volume {name} taken over by this host's standby of it in {ms} ms");
    } else {
        println!("volume {name} handed over to the server on this data dir in {ms} ms");
    }
    Ok(true)
}

/// `volume info`: live bytes from the server on this host that has the
/// volume open (exact; the checkpoint is then not read), else from the
/// volume's checkpoint.
async fn volume_info(engine: &Engine, name: &str) -> anyhow::Result<strata_volume::VolumeInfo> {
    let req = control::Request::Stats {
        volume: name.to_string(),
    };
    let stats = match control::ask(&engine.config().data_dir, &req).await {
        Ok(Some(control::Reply::Ok(stats))) => Some(stats),
        _ => None,
    };
    let served_here = stats.as_ref().and_then(|s| {
        s["space"]["live_bytes"]
            .as_u64()
            .zip(s["space"]["garbage_bytes"].as_u64())
    });
    let mut v = engine.volume_info_with(name, served_here.is_none()).await?;
    v.hydration = stats
        .as_ref()
        .and_then(|s| serde_json::from_value(s["hydration"].clone()).ok());
    v.qos_stats = stats.and_then(|s| serde_json::from_value(s["qos"].clone()).ok());
    if let Some((live, garbage)) = served_here {
        v.live_bytes = Some(live);
        v.live_as_of = "the serving server".into();
        v.garbage_bytes = Some(garbage);
    }
    Ok(v)
}

/// The space lines of `volume info`.
fn print_space_info(v: &strata_volume::VolumeInfo) {
    match (v.live_bytes, v.garbage_bytes) {
        (Some(live), Some(garbage)) => {
            println!(
                "live:        {} ({live} bytes, as of {})",
                format_size(live),
                v.live_as_of
            );
            println!("garbage:     {} ({garbage} bytes)", format_size(garbage));
        }
        (Some(live), None) => {
            println!(
                "live:        {} ({live} bytes, as of {})",
                format_size(live),
                v.live_as_of
            );
            println!("garbage:     known while the volume is served (compressed segments)");
        }
        _ => println!("live:        {}", v.live_as_of),
    }
    println!(
        "pending:     {} objects ({}) to delete after the grace period",
        v.pending_deletions,
        format_size(v.pending_bytes)
    );
    match &v.last_gc {
        Some(g) => println!(
            "last GC:     {} s ago: rewrote {} segments ({} copied), deleted {} objects ({})",
            now_unix_ms().saturating_sub(g.finished_unix_ms) / 1000,
            g.segments_rewritten,
            format_size(g.bytes_copied),
            g.objects_deleted,
            format_size(g.bytes_reclaimed)
        ),
        None => println!("last GC:     none yet"),
    }
}

/// The hydration line of `volume info` (a volume served on this host).
fn print_hydration_info(v: &strata_volume::VolumeInfo) {
    use strata_volume::HydrationState as S;
    let Some(h) = &v.hydration else { return };
    let percent = (h.local_bytes * 100)
        .checked_div(h.total_bytes)
        .unwrap_or(100);
    let local = format!(
        "{} of {} local ({percent}%)",
        approx_size(h.local_bytes),
        approx_size(h.total_bytes)
    );
    let line = match h.state {
        S::Off => format!("off ({})", h.mode),
        S::Scanning => "measuring what to fetch".to_string(),
        S::Running => format!(
            "{local}, {}/s, {} to go",
            approx_size(h.rate_bytes_per_sec),
            h.eta_seconds
                .map_or("?".to_string(), |s| format!("about {s} s"))
        ),
        S::Done => format!(
            "done: {local}, {} fetched in {} GETs, {:.1} s",
            approx_size(h.fetched_bytes),
            h.gets,
            h.elapsed_ms as f64 / 1000.0
        ),
        S::CacheFull => format!("stopped, the disk cache is full: {local}"),
        S::Failed => format!("stopped by store errors: {local} (tried again at the next open)"),
    };
    println!("hydration:   {line}");
    if !h.profile.is_empty() {
        println!("profile:     {}", h.profile);
    }
}

/// The QoS line of `volume info`: the limits, and (served here) what
/// they held back.
fn print_qos_info(v: &strata_volume::VolumeInfo) {
    let limits = v.qos.clone().unwrap_or_default();
    let mut line = qos_spec::format_qos(&limits);
    if let Some(s) = &v.qos_stats {
        if !limits.is_unlimited() {
            line.push_str(&format!(
                " ({} requests held back, {:.1} s waited in all)",
                s.throttled_requests,
                s.wait_ms as f64 / 1000.0
            ));
        }
    }
    println!("qos:         {line}");
}

/// The snapshot lines of `volume info`.
fn print_history_info(v: &strata_volume::VolumeInfo) {
    if let Some(p) = &v.parent {
        println!("clone of:    {}@{}", p.volume, p.snapshot);
    }
    let names: Vec<&str> = v.snapshots.iter().map(|s| s.name.as_str()).collect();
    match names.len() {
        0 => println!("snapshots:   none"),
        n => println!("snapshots:   {n} ({})", names.join(", ")),
    }
    if let Some(r) = &v.last_rollback {
        println!(
            "rollback:    to snapshot {} {} s ago (checkpoint {})",
            r.snapshot,
            now_unix_ms().saturating_sub(r.unix_ms) / 1000,
            r.checkpoint_seq
        );
    }
}

fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// `volume gc`: through the local server that has the volume open, or
/// (nobody serves it) a pass run here under the volume's lease.
async fn gc_command(engine: &Engine, name: &str, wait: bool) -> anyhow::Result<GcPassReport> {
    if wait {
        eprintln!("strata: collecting garbage of {name}; waiting for deletions after the grace period (Ctrl-C stops waiting; the server finishes later)");
    }
    let req = control::Request::Gc {
        volume: name.to_string(),
        wait,
    };
    let what = format!("collect garbage of {name:?}");
    let command = format!("strata volume gc {name}");
    match control::on_serving_server(engine, name, &req, &what, &command).await? {
        Some(v) => Ok(serde_json::from_value(v)?),
        None => Ok(engine.gc_volume(name, wait).await?),
    }
}

fn print_gc_report(name: &str, r: &GcPassReport, wait: bool) {
    println!(
        "{name}: rewrote {} segments ({} copied), deleted {} objects ({} reclaimed)",
        r.segments_rewritten,
        format_size(r.bytes_copied),
        r.objects_deleted,
        format_size(r.bytes_reclaimed)
    );
    if r.pending_deletions > 0 {
        let when = if wait {
            ""
        } else {
            " (deleted after the grace period; --wait waits for it)"
        };
        println!(
            "{name}: {} objects ({}) pending deletion{when}",
            r.pending_deletions,
            format_size(r.pending_bytes)
        );
    }
    let ratio = if r.live_bytes > 0 {
        r.stored_bytes as f64 / r.live_bytes as f64
    } else {
        0.0
    };
    println!(
        "{name}: stored {}, live {} ({ratio:.2}x)",
        format_size(r.stored_bytes),
        format_size(r.live_bytes)
    );
}
