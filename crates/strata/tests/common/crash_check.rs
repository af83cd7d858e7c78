//! The crash checker of crash.rs and s3_crash.rs: a writer we control
//! (nbd_writer.py, libnbd's Python binding, 64 writes in flight) logs every
//! write it issues and every acknowledgement; after a kill -9 and restart,
//! every write logged as acknowledged must read back with its generation,
//! or with a later generation that was issued to that block (in flight at
//! the kill). Blocks must never be torn or foreign.

use super::*;
use std::collections::{HashMap, HashSet};

const WRITER: &str = include_str!("nbd_writer.py");
pub const VOL: u64 = 256 * MIB;
pub const BS: u64 = 4096;
/// Writer region: the first 32 MiB.
pub const NBLOCKS: u64 = 8192;
/// fio region: 64 MiB .. 256 MiB.
pub const FIO_OFF: u64 = 64 * MIB;
const MAGIC: u64 = 0x5354_5241_5441_4331;
const MIX: u64 = 0x9E37_79B9_7F4A_7C15;

#[derive(Default, Debug)]
pub struct WriterLog {
    /// Generations issued per block.
    pub issued: HashMap<u64, HashSet<u64>>,
    /// Latest acknowledged generation per block.
    pub acked: HashMap<u64, u64>,
    pub acks: usize,
    /// Number of acknowledgements logged before the FLUSH was acknowledged.
    pub acks_before_flush: Option<usize>,
    pub connected: bool,
    pub error: Option<String>,
    /// Writes that failed (modes race, race-fua).
    pub failed: usize,
    /// When the writer saw its first and its last acknowledgement
    /// (`time.monotonic_ns()`, one clock for the whole machine).
    pub first_ack_ns: Option<u64>,
    pub last_ack_ns: Option<u64>,
}

/// Parses the logs of consecutive writer runs (oldest first) into one view.
pub fn parse_logs(paths: &[PathBuf]) -> WriterLog {
    let mut log = WriterLog::default();
    for path in paths {
        parse_into(&mut log, path);
    }
    log
}

fn parse_into(log: &mut WriterLog, path: &Path) {
    let text = std::fs::read_to_string(path).unwrap();
    // Only complete lines count (the writer may be killed mid-line).
    for line in text.split_inclusive('\n').filter(|l| l.ends_with('\n')) {
        let mut it = line.split_whitespace();
        let kind = it.next().unwrap_or("");
        let mut num = || -> u64 { it.next().unwrap().parse().unwrap() };
        match kind {
            "S" => log.connected = true,
            "I" => {
                let (idx, gen) = (num(), num());
                log.issued.entry(idx).or_default().insert(gen);
            }
            "A" => {
                let (idx, gen) = (num(), num());
                assert!(
                    log.issued.get(&idx).is_some_and(|s| s.contains(&gen)),
                    "ack of a write never issued: {line}"
                );
                let e = log.acked.entry(idx).or_insert(gen);
                // One write in flight per block: acks come in issue order.
                assert!(gen >= *e, "acks out of order for block {idx}");
                *e = gen;
                log.acks += 1;
                if let Some(t) = it.next().and_then(|t| t.parse::<u64>().ok()) {
                    log.first_ack_ns.get_or_insert(t);
                    log.last_ack_ns = Some(t);
                }
            }
            "X" => log.failed += 1,
            "F" => log.acks_before_flush = Some(log.acks),
            "E" => log.error = Some(line.trim().to_string()),
            other => panic!("bad writer log line {other:?}: {line}"),
        }
    }
}

/// None = all zeros (never written); Some(gen) = an intact stamp for `idx`.
pub fn decode(idx: u64, block: &[u8]) -> Result<Option<u64>, String> {
    if block.iter().all(|b| *b == 0) {
        return Ok(None);
    }
    let rec = &block[..32];
    let f = |i: usize| u64::from_le_bytes(rec[i * 8..i * 8 + 8].try_into().unwrap());
    let (magic, bidx, gen, check) = (f(0), f(1), f(2), f(3));
    if magic != MAGIC || check != MAGIC ^ bidx ^ gen ^ MIX {
        return Err(format!("block {idx}: no valid stamp (garbage)"));
    }
    if bidx != idx {
        return Err(format!(
            "block {idx}: holds block {bidx}'s data (gen {gen})"
        ));
    }
    if block.chunks(32).any(|c| c != rec) {
        return Err(format!(
            "block {idx}: torn (stamp gen {gen} not in the whole block)"
        ));
    }
    Ok(Some(gen))
}

/// `python3 -c READ_REGION URI FILE OFFSET LENGTH`: copies LENGTH bytes of
/// the export at OFFSET into FILE with libnbd, 4 MiB per request.
const READ_REGION: &str = r#"
import sys
import nbd
uri, path, off, length = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
h = nbd.NBD()
h.connect_uri(uri)
with open(path, "wb") as f:
    end = off + length
    while off < end:
        n = min(4 << 20, end - off)
        f.write(h.pread(n, off))
        off += n
h.shutdown()
"#;

/// Reads the writer's region back and checks it against the log.
pub fn check_region(uri: &str, dir: &Path, log: &WriterLog, what: &str) {
    let dump = dir.join("readback.raw");
    let _ = std::fs::remove_file(&dump);
    // Only the writer's region: the rest holds the fio load's random 4 KiB
    // writes, which cost a store read each when read cold from S3.
    let t = Instant::now();
    run_ok(
        Command::new(python_with_nbd())
            .arg("-c")
            .arg(READ_REGION)
            .arg(uri)
            .arg(&dump)
            .arg("0")
            .arg((NBLOCKS * BS).to_string()),
        Duration::from_secs(300),
    );
    let data = std::fs::read(&dump).unwrap();
    assert_eq!(data.len() as u64, NBLOCKS * BS);
    eprintln!(
        "{what}: read the writer's region back in {:.1?}",
        t.elapsed()
    );
    let mut errors = Vec::new();
    let (mut ok_acked, mut newer) = (0usize, 0usize);
    for idx in 0..NBLOCKS {
        let block = &data[(idx * BS) as usize..((idx + 1) * BS) as usize];
        let issued = log.issued.get(&idx);
        let got = match decode(idx, block) {
            Ok(g) => g,
            Err(e) => {
                errors.push(e);
                continue;
            }
        };
        match (log.acked.get(&idx), got) {
            (Some(&a), Some(g)) if g == a => ok_acked += 1,
            (Some(&a), Some(g)) if g > a && issued.is_some_and(|s| s.contains(&g)) => newer += 1,
            (Some(&a), g) => errors.push(format!(
                "block {idx}: acknowledged gen {a} lost, reads {g:?}"
            )),
            (None, None) => {}
            (None, Some(g)) if issued.is_some_and(|s| s.contains(&g)) => newer += 1,
            (None, Some(g)) => errors.push(format!("block {idx}: gen {g} was never issued")),
        }
    }
    eprintln!(
        "{what}: {} blocks with acknowledged writes: {ok_acked} read back their last acked \
         generation, {newer} an in-flight newer one; {} errors",
        log.acked.len(),
        errors.len()
    );
    assert!(
        errors.is_empty(),
        "{what}: {} blocks wrong after kill -9 + restart, first: {:#?}",
        errors.len(),
        &errors[..errors.len().min(20)]
    );
}

pub fn spawn_writer(
    dir: &Path,
    uri: &str,
    mode: &str,
    seed: u64,
    round: usize,
    gen_base: u64,
) -> (BgProcess, PathBuf) {
    let log = dir.join(format!("writer-{mode}-{round}.log"));
    let p = writer_process(dir, uri, &log, mode, seed, gen_base, 300, 0..NBLOCKS);
    (p, log)
}

/// A writer (modes race, race-fua) of blocks `blocks` (of the region
/// [`check_region`] reads) that stops writing after `max_seconds`; its
/// log is named after its seed.
pub fn spawn_race_writer(
    dir: &Path,
    uri: &str,
    mode: &str,
    seed: u64,
    gen_base: u64,
    max_seconds: u64,
    blocks: std::ops::Range<u64>,
) -> (BgProcess, PathBuf) {
    assert!(mode.starts_with("race") && blocks.end <= NBLOCKS);
    let log = dir.join(format!("writer-{mode}-s{seed}.log"));
    let p = writer_process(dir, uri, &log, mode, seed, gen_base, max_seconds, blocks);
    (p, log)
}

#[allow(clippy::too_many_arguments)]
fn writer_process(
    dir: &Path,
    uri: &str,
    log: &Path,
    mode: &str,
    seed: u64,
    gen_base: u64,
    max_seconds: u64,
    blocks: std::ops::Range<u64>,
) -> BgProcess {
    let script = dir.join("nbd_writer.py");
    std::fs::write(&script, WRITER).unwrap();
    BgProcess::spawn(
        "nbd_writer.py",
        Command::new(python_with_nbd())
            .arg(&script)
            .arg(uri)
            .arg(log)
            .arg((blocks.start * BS).to_string())
            .arg((blocks.end - blocks.start).to_string())
            .arg(mode)
            .arg(seed.to_string())
            .arg(max_seconds.to_string())
            .arg(gen_base.to_string()),
    )
}

pub fn spawn_fio(dir: &Path, uri: &str) -> BgProcess {
    BgProcess::spawn(
        "fio",
        Command::new("fio")
            .current_dir(dir)
            .arg("--thread")
            .arg("--name=load")
            .arg("--ioengine=nbd")
            .arg(format!("--uri={uri}"))
            .args(["--rw=randwrite", "--bs=4k", "--iodepth=16", "--numjobs=2"])
            .arg(format!("--offset={FIO_OFF}"))
            .arg(format!("--size={}", (VOL - FIO_OFF) / 2))
            .arg(format!("--offset_increment={}", (VOL - FIO_OFF) / 2))
            .args(["--time_based", "--runtime=300"]),
    )
}

/// Waits until the writer log satisfies `cond` (the writer must stay alive).
pub fn wait_log(
    writer: &mut BgProcess,
    log: &Path,
    timeout: Duration,
    cond: impl Fn(&WriterLog) -> bool,
) -> WriterLog {
    let t0 = Instant::now();
    loop {
        if log.exists() {
            let l = parse_logs(&[log.to_path_buf()]);
            if cond(&l) {
                return l;
            }
        }
        if let Some(st) = writer.try_status() {
            panic!("writer exited early ({st}): {}", writer.stderr());
        }
        assert!(
            t0.elapsed() < timeout,
            "writer made too little progress in {timeout:?}"
        );
        thread::sleep(Duration::from_millis(100));
    }
}

/// How long to let the load run before the kill, per round.
pub enum KillAfter {
    /// At least this many acknowledged writes (in this round) and 2 s.
    Acks(usize),
    /// This long after the writer's first acknowledgement.
    Millis(u64),
    /// This many acknowledgements after the FLUSH was acknowledged.
    AcksAfterFlush(usize),
}

/// `strata serve` arguments of the crash tests: small segments, write
/// buffer and journal so that during the run segments are sealed and
/// uploaded and the journal ring wraps: recovery then has to combine store
/// and journal, not just replay a journal from its start.
/// Garbage collection runs often and deletes soon (grace 0.5 s) so that
/// crashes land in its passes too.
pub const CRASH_SERVE_ARGS: [&str; 10] = [
    "--segment-size",
    "8MiB",
    "--write-buffer",
    "64MiB",
    "--journal-size",
    "128MiB",
    "--gc-grace-ms",
    "500",
    "--gc-interval-ms",
    "200",
];

/// Kills the server with SIGKILL under load once per round (the writer and
/// an fio load on another region running), restarts it on the same data
/// dir and checks every acknowledged write of all rounds so far; finally a
/// crash without load changes nothing. Serves "vol" of [`VOL`] from `dir`.
/// Returns the running server and the writer logs of the rounds.
pub fn crash_under_load(
    dir: &Path,
    target: Target,
    mode: &str,
    seed: u64,
    rounds: &[KillAfter],
) -> (Server, Vec<PathBuf>) {
    require_tools(&["fio"]);
    let mut server = Server::start(dir, target, &[("vol", VOL)]);
    let uri = server.vol_uri();
    let mut logs = Vec::new();

    for (round, kill_after) in rounds.iter().enumerate() {
        let what = format!("{mode} round {}", round + 1);
        let mut fio = spawn_fio(dir, &uri);
        // Generations of later rounds are above those of earlier ones.
        let gen_base = round as u64 * 1_000_000_000;
        let (mut writer, log_path) =
            spawn_writer(dir, &uri, mode, seed + round as u64, round, gen_base);
        match *kill_after {
            KillAfter::Acks(n) => {
                thread::sleep(Duration::from_secs(2));
                wait_log(&mut writer, &log_path, Duration::from_secs(120), |l| {
                    l.acks > n
                });
            }
            KillAfter::Millis(ms) => {
                wait_log(&mut writer, &log_path, Duration::from_secs(60), |l| {
                    l.acks > 0
                });
                thread::sleep(Duration::from_millis(ms));
            }
            KillAfter::AcksAfterFlush(n) => {
                // Phase 1 done and flushed, then unflushed writes on top.
                let l = wait_log(&mut writer, &log_path, Duration::from_secs(240), |l| {
                    l.acks_before_flush.is_some()
                });
                let base = l.acks;
                wait_log(&mut writer, &log_path, Duration::from_secs(120), |l| {
                    l.acks > base + n
                });
            }
        }
        assert!(
            fio.try_status().is_none(),
            "fio load ended early: {}",
            fio.stderr()
        );
        server.assert_alive();

        // Crash.
        server.kill9();
        let kill_time = Instant::now();
        let st = writer.wait(Duration::from_secs(60));
        assert_eq!(
            st.code(),
            Some(3),
            "writer should fail with a connection error: {}",
            writer.stderr()
        );
        fio.kill();

        let this = parse_logs(std::slice::from_ref(&log_path));
        assert!(this.connected && this.error.is_some(), "{:?}", this.error);
        eprintln!(
            "{what}: {} writes acknowledged ({} blocks), {} before the flush, writer saw {:?} \
             {:.1?} after the kill",
            this.acks,
            this.acked.len(),
            this.acks_before_flush.map_or("-".into(), |n| n.to_string()),
            this.error,
            kill_time.elapsed()
        );
        if let KillAfter::AcksAfterFlush(_) = kill_after {
            assert!(this.acks_before_flush.unwrap() >= 4 * NBLOCKS as usize);
        }
        if round == 0 {
            // Most blocks of the region were acknowledged at least once.
            assert!(
                this.acked.len() as u64 > NBLOCKS * 9 / 10,
                "{}",
                this.acked.len()
            );
        }
        logs.push(log_path);

        if server.target.is_strata() {
            let out = server.cli(&["volume", "info", "vol", "--json"]);
            assert!(out.status.success(), "volume info: {}", stderr_str(&out));
            let info: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            eprintln!("{what}: volume info at the crash: {info}");
            if round == 0 {
                // The run was long enough for segments to reach the store,
                // so recovery combines store and journal.
                assert!(
                    info["segments"].as_u64().is_some_and(|n| n > 0),
                    "no segment in the store at the crash: {info}"
                );
            }
        }

        // Recover and check everything acknowledged in all rounds so far.
        server.start_again();
        check_region(&uri, dir, &parse_logs(&logs), &what);
    }

    // Recovery is idempotent: a crash without new writes changes nothing.
    server.crash_restart();
    check_region(
        &uri,
        dir,
        &parse_logs(&logs),
        &format!("{mode}, recovery without new writes"),
    );
    server.assert_alive();
    (server, logs)
}
