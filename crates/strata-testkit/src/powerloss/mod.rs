//! The power-loss loop: `strata serve` on a disk that loses what was not
//! synced ([`crate::lossy_fs`]), a client that records what was
//! acknowledged, and after every cut a restart and a check that nothing
//! FLUSHed was lost and that the volume is a prefix state.
//!
//! One cycle: the client writes, trims and FLUSHes (and asks for
//! snapshots) until, after a seeded number of requests, the server is
//! killed with SIGKILL; the disk is unmounted (the host is down), loses its
//! unsynced state in the cycle's mode, is mounted again, and a new server
//! starts on what is left, with no repair step. Then:
//! - the client reads the volume back: every write acknowledged before a
//!   completed FLUSH, and every FUA write, is there, and the volume is the
//!   state after some prefix of the requests sent;
//! - every snapshot whose creation was acknowledged reads as the volume did
//!   then (and a clone of one, as the snapshot);
//! - `strata fsck` is clean (every `fsck_every` cycles and at the end).
//!
//! Used by `crates/strata/tests/powerloss.rs` (CI sizes) and by the bench
//! harness's soak (`scripts/bench --workloads powerloss --cycles N`, through
//! the `strata-powerloss` binary). Every cycle prints its seed; a run is
//! reproduced from its base seed (the requests and the losses; the moment
//! of the kill within a request is the scheduler's).

mod client;
mod strata_process;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::lossy_fs::{LossMode, LossyFs, LossyMount};
use client::Client;
use strata_process::{Server, Strata};

/// Where the loop's volumes are stored.
#[derive(Debug, Clone)]
pub enum LoopStore {
    /// The embedded store, in a directory on the lossy disk.
    Embedded,
    /// An S3 store (MinIO): `url` (`s3://bucket?endpoint=...`), and the
    /// environment with its credentials. Only the data dir (journals,
    /// disk cache) is on the lossy disk.
    S3 {
        url: String,
        env: Vec<(String, String)>,
    },
}

/// What one run of the loop does.
#[derive(Debug, Clone)]
pub struct LoopConfig {
    /// The `strata` binary.
    pub strata: PathBuf,
    /// A fresh directory on a real disk: backing files, mount point, logs.
    pub work_dir: PathBuf,
    pub cycles: u64,
    pub seed: u64,
    /// Used in turn, one per cycle.
    pub modes: Vec<LossMode>,
    pub store: LoopStore,
    /// Snapshots asked for by the client, deleted after a few cycles; a
    /// clone of one every few cycles; background GC at a short interval.
    pub extras: bool,
    /// `strata fsck` every this many cycles (and after the last); 0: only
    /// after the last.
    pub fsck_every: u64,
    /// Requests before the kill: drawn from `[1, max_requests]`.
    pub max_requests: u64,
}

/// What a run saw.
#[derive(Debug, Clone, Default)]
pub struct LoopSummary {
    pub cycles: u64,
    pub requests_sent: u64,
    /// Requests that were durable (before a completed FLUSH, or FUA) when
    /// the power went, all read back.
    pub durable_checked: u64,
    /// Requests acknowledged but not durable that were lost, as allowed.
    pub undurable_lost: u64,
    pub snapshots_checked: u64,
    pub clones_checked: u64,
    pub fscks: u64,
    pub elapsed: Duration,
}

const VOLUME: &str = "v";
const VOLUME_BYTES: u64 = 64 << 20;
/// The client writes the first 16 MiB: many overwrites per cycle.
const REGION_BLOCKS: u64 = 4096;
/// Snapshots kept at once (older ones are deleted).
const MAX_SNAPSHOTS: usize = 3;
/// A clone every this many cycles (extras) ...
const CLONE_EVERY: u64 = 7;
/// ... up to this many.
const MAX_CLONES: usize = 2;

/// Runs the loop; `progress` gets one line per cycle. Err: what failed, with
/// the cycle, its mode and seed, and the server's log tail.
pub fn run(cfg: &LoopConfig, progress: &mut dyn FnMut(&str)) -> Result<LoopSummary, String> {
    let started = Instant::now();
    let mut l = Loop::new(cfg)?;
    progress(&format!(
        "power-loss loop: {} cycles, base seed {}, modes {}, store {}, extras {}",
        cfg.cycles,
        cfg.seed,
        cfg.modes
            .iter()
            .map(|m| m.to_string())
            .collect::<Vec<_>>()
            .join(","),
        match cfg.store {
            LoopStore::Embedded => "embedded",
            LoopStore::S3 { .. } => "s3",
        },
        if cfg.extras { "on" } else { "off" },
    ));
    for cycle in 0..cfg.cycles {
        let mode = cfg.modes[(cycle as usize) % cfg.modes.len().max(1)];
        let seed = cycle_seed(cfg.seed, cycle);
        let line = l.cycle(cycle, mode, seed).map_err(|e| {
            let kept = l.keep_evidence();
            // Every failure quotes the server's log: a client only hears
            // what NBD lets a server say ("no such export"), the log why.
            let tail = strata_process::log_tail(&l.strata.log);
            format!(
                "cycle {cycle} (mode {mode}, seed {seed}): {e}\n{kept}\nserver log tail:\n{tail}"
            )
        })?;
        progress(&format!("cycle {cycle} mode {mode} seed {seed}: {line}"));
    }
    l.fsck().map_err(|e| format!("after the last cycle: {e}"))?;
    l.finish()?;
    l.summary.cycles = cfg.cycles;
    l.summary.elapsed = started.elapsed();
    Ok(l.summary)
}

/// A cycle's seed from the base seed (SplitMix64 of base + cycle).
pub fn cycle_seed(base: u64, cycle: u64) -> u64 {
    let mut z = base.wrapping_add(cycle.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) >> 1
}

struct Loop<'a> {
    cfg: &'a LoopConfig,
    fs: LossyFs,
    mountpoint: PathBuf,
    mount: Option<LossyMount>,
    strata: Strata,
    socket: PathBuf,
    serve_args: Vec<String>,
    server: Option<Server>,
    client: Client,
    /// Snapshots alive, oldest first.
    snapshots: Vec<String>,
    /// Clones alive: (clone volume, snapshot it was made of).
    clones: Vec<(String, String)>,
    summary: LoopSummary,
}

impl<'a> Loop<'a> {
    fn new(cfg: &'a LoopConfig) -> Result<Loop<'a>, String> {
        let dir = &cfg.work_dir;
        let mountpoint = dir.join("mnt");
        let backing = dir.join("backing");
        for d in [&mountpoint, &backing] {
            std::fs::create_dir_all(d).map_err(|e| format!("mkdir {}: {e}", d.display()))?;
        }
        let fs = LossyFs::new(&backing).map_err(|e| format!("lossy fs: {e}"))?;
        let mount = fs
            .mount(&mountpoint)
            .map_err(|e| format!("mount the lossy fs at {}: {e}", mountpoint.display()))?;
        let (store, mut env) = match &cfg.store {
            LoopStore::Embedded => (mountpoint.join("store").display().to_string(), vec![]),
            LoopStore::S3 { url, env } => (url.clone(), env.clone()),
        };
        // The caller's levels if it set any (STRATA_LOG=strata_volume=debug
        // shows each FLUSH that sealed), else info.
        let levels = std::env::var("STRATA_LOG").unwrap_or_else(|_| "info".into());
        env.push(("STRATA_LOG".into(), levels));
        let strata = Strata {
            bin: cfg.strata.clone(),
            store,
            data_dir: mountpoint.join("data"),
            env,
            log: dir.join("strata.log"),
        };
        // With extras the volume is plain: its writes of two blocks or
        // more are placed in their segment's file (`serve_args`), which
        // compressed volumes never do; without, it is lz4 (the default).
        let size = VOLUME_BYTES.to_string();
        let mut create = vec!["volume", "create", VOLUME, "--size", &size];
        if cfg.extras {
            create.extend(["--compression", "none"]);
        }
        strata.run(&create)?;
        let client = Client::start(dir, REGION_BLOCKS)?;
        let mut l = Loop {
            cfg,
            fs,
            mountpoint,
            mount: Some(mount),
            socket: dir.join("nbd.sock"),
            serve_args: serve_args(cfg.extras),
            strata,
            server: None,
            client,
            snapshots: Vec::new(),
            clones: Vec::new(),
            summary: LoopSummary::default(),
        };
        l.start_server()?;
        Ok(l)
    }

    fn uri(&self, export: &str) -> String {
        format!("nbd+unix:///{export}?socket={}", self.socket.display())
    }

    fn start_server(&mut self) -> Result<(), String> {
        let _ = std::fs::remove_file(&self.socket);
        self.server = Some(self.strata.serve(&self.socket, &self.serve_args)?);
        Ok(())
    }

    /// One cycle; returns its summary line.
    fn cycle(&mut self, cycle: u64, mode: LossMode, seed: u64) -> Result<String, String> {
        let kill_after = kill_point(seed, self.cfg.max_requests);
        let worked = self.work(seed, kill_after)?;
        let cut = self.power_cut(mode, seed)?;
        self.start_server()?;
        let verified = self.client.ask(&format!("verify {}", self.uri(VOLUME)))?;
        if !verified.starts_with("ok") {
            return Err(format!("{verified}\n(work: {worked}; cut: {cut})"));
        }
        self.account(&worked, &verified);
        self.check_snapshots()
            .map_err(|e| format!("{e}\n(work: {worked}; cut: {cut})"))?;
        if self.cfg.extras {
            self.churn(cycle)?;
        }
        if self.cfg.fsck_every > 0 && (cycle + 1).is_multiple_of(self.cfg.fsck_every) {
            self.fsck()?;
        }
        Ok(format!("{verified}; {cut}"))
    }

    /// The client's requests until the server is killed.
    fn work(&mut self, seed: u64, kill_after: u64) -> Result<String, String> {
        self.client.send(&format!(
            "work {} {seed} {kill_after} {}",
            self.uri(VOLUME),
            u8::from(self.cfg.extras)
        ))?;
        loop {
            let line = self.client.answer()?;
            if line == "kill" {
                if let Some(mut s) = self.server.take() {
                    s.kill();
                }
            } else if let Some(name) = line.strip_prefix("snap ") {
                let taken = self
                    .strata
                    .run(&["snapshot", "create", &format!("{VOLUME}@{name}")]);
                match taken {
                    Ok(_) => {
                        self.client.send("go")?;
                        self.snapshots.push(name.to_string());
                    }
                    Err(e) => {
                        self.client.send("skip")?;
                        return Err(format!("snapshot {name} failed on a live server: {e}"));
                    }
                }
            } else if line.starts_with("worked") {
                if self.server.is_some() {
                    return Err(format!(
                        "the client's connection failed before the kill ({line}); log tail:\n{}",
                        strata_process::log_tail(&self.strata.log)
                    ));
                }
                return Ok(line);
            } else {
                return Err(format!("client: {line}"));
            }
        }
    }

    /// Host down: unmount, lose the unsynced state, mount again.
    fn power_cut(&mut self, mode: LossMode, seed: u64) -> Result<String, String> {
        if let Some(mut s) = self.server.take() {
            s.kill();
        }
        if let Some(m) = self.mount.take() {
            m.unmount().map_err(|e| format!("unmount: {e}"))?;
        }
        let report = self
            .fs
            .power_cut(mode, seed)
            .map_err(|e| format!("power cut: {e}"))?;
        self.mount = Some(
            self.fs
                .mount(&self.mountpoint)
                .map_err(|e| format!("mount again: {e}"))?,
        );
        let torn = match &report.torn {
            Some((path, off, kept, of)) => format!(", torn {path}@{off} {kept}/{of} bytes"),
            None => String::new(),
        };
        Ok(format!(
            "disk kept {} of {} unsynced writes, {} of {} namespace changes{torn}",
            report.data_ops_kept,
            report.data_ops_kept + report.data_ops_lost,
            report.namespace_ops_kept,
            report.namespace_ops_kept + report.namespace_ops_lost
        ))
    }

    fn account(&mut self, worked: &str, verified: &str) {
        let field = |line: &str, key: &str| -> u64 {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(key))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        let s = &mut self.summary;
        s.requests_sent += field(worked, "sent=");
        s.durable_checked += field(verified, "durable=");
        s.undurable_lost += field(worked, "acked=").saturating_sub(field(verified, "prefix="));
    }

    /// Every live snapshot, and every clone, reads as it was taken.
    fn check_snapshots(&mut self) -> Result<(), String> {
        for name in self.snapshots.clone() {
            let uri = self.uri(&format!("{VOLUME}@{name}"));
            let answer = self.client.ask(&format!("verify-snap {uri} {name}"))?;
            if answer != "ok" {
                return Err(answer);
            }
            self.summary.snapshots_checked += 1;
        }
        for (clone, snap) in self.clones.clone() {
            let answer = self
                .client
                .ask(&format!("verify-snap {} {snap}", self.uri(&clone)))?;
            if answer != "ok" {
                return Err(format!("clone {clone} of {snap}: {answer}"));
            }
            self.summary.clones_checked += 1;
        }
        Ok(())
    }

    /// Extras, through the live server: a clone now and then (at most
    /// `MAX_CLONES`, kept: a served clone cannot be deleted), old snapshots
    /// deleted (not those a clone keeps).
    fn churn(&mut self, cycle: u64) -> Result<(), String> {
        if cycle % CLONE_EVERY == CLONE_EVERY - 1 && self.clones.len() < MAX_CLONES {
            if let Some(snap) = self.snapshots.last().cloned() {
                let clone = format!("c{cycle}");
                self.strata
                    .run(&["volume", "clone", &format!("{VOLUME}@{snap}"), &clone])?;
                self.clones.push((clone, snap));
            }
        }
        let cloned =
            |name: &String, clones: &[(String, String)]| clones.iter().any(|(_, s)| s == name);
        while self
            .snapshots
            .iter()
            .filter(|s| !cloned(s, &self.clones))
            .count()
            > MAX_SNAPSHOTS
        {
            let Some(i) = self.snapshots.iter().position(|s| !cloned(s, &self.clones)) else {
                break;
            };
            let name = self.snapshots.remove(i);
            self.strata
                .run(&["snapshot", "delete", &format!("{VOLUME}@{name}")])?;
            self.client.ask(&format!("forget-snap {name}"))?;
        }
        Ok(())
    }

    /// Copies what the disk holds now (data dir and embedded store) next
    /// to the work dir, for a person to look at after a failure.
    fn keep_evidence(&self) -> String {
        let to = self.cfg.work_dir.join("at-failure");
        let copied = std::process::Command::new("cp")
            .arg("-a")
            .arg(&self.mountpoint)
            .arg(&to)
            .status();
        match copied {
            Ok(s) if s.success() => format!("the disk as it was: {}", to.display()),
            other => format!("could not copy the disk to {}: {other:?}", to.display()),
        }
    }

    fn fsck(&mut self) -> Result<(), String> {
        let mut targets = vec![VOLUME.to_string()];
        targets.extend(self.clones.iter().map(|(c, _)| c.clone()));
        for t in targets {
            self.strata
                .run(&["fsck", &t])
                .map_err(|e| format!("fsck {t}: {e}"))?;
            self.summary.fscks += 1;
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<(), String> {
        if let Some(mut s) = self.server.take() {
            s.stop()?;
        }
        if let Some(m) = self.mount.take() {
            m.unmount().map_err(|e| format!("unmount: {e}"))?;
        }
        Ok(())
    }
}

/// The server's options: small segments and a short age, so segments are
/// sealed, uploaded and made durable many times a cycle, and the smallest
/// journal allowed (it wraps every few cycles); with extras, GC every 200 ms with no grace,
/// every deleted segment's file recycled, and FLUSHes that seal and upload.
fn serve_args(extras: bool) -> Vec<String> {
    let mut a: Vec<String> = [
        "--segment-size",
        "1MiB",
        "--segment-age-ms",
        "100",
        "--write-buffer",
        "34MiB",
        "--journal-size",
        "98MiB",
        "--lease-ttl-ms",
        "2000",
        // Released journal bytes are punched before each FLUSH's sync
        // (8 MiB by default; a cycle writes less): under the power cuts.
        "--journal-punch-min-size",
        "4KiB",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if extras {
        a.extend(
            [
                "--gc-interval-ms",
                "200",
                "--gc-grace-ms",
                "0",
                "--gc-live-threshold",
                "90",
                // Its segments are a few KiB: recycle them all, so deleted
                // segments' files are overwritten under the power cuts.
                "--recycle-min-size",
                "1",
                // A FLUSH after a few writes seals and uploads them rather
                // than syncing them in the journal (8 MiB by default): on
                // the embedded store, under the power cuts. Without extras
                // every FLUSH syncs the journal, as small-write ones do.
                "--flush-seal-min-size",
                "16KiB",
                // Writes of two blocks or more go straight into their
                // segment's file, the journal recording where (64 KiB by
                // default: only this loop's larger writes): pointer
                // records, staged files and their syncs under the cuts,
                // next to one-block writes through the journal.
                "--bulk-write-min-size",
                "8KiB",
            ]
            .iter()
            .map(|s| s.to_string()),
        );
    }
    a
}

/// Requests before the kill: mostly spread over `[1, max]`, one cycle in
/// eight right after the restart (1-4 requests).
fn kill_point(seed: u64, max: u64) -> u64 {
    let r = cycle_seed(seed, 1);
    if r.is_multiple_of(8) {
        1 + (r >> 8) % 4
    } else {
        1 + (r >> 8) % max.max(1)
    }
}
