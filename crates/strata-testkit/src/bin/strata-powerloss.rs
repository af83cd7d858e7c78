//! strata-powerloss: the power-loss loop (strata_testkit::powerloss) from
//! the command line, for long soak runs (`scripts/bench --workloads
//! powerloss --cycles N`). See `--help`.

use std::path::PathBuf;
use std::process::ExitCode;

use strata_testkit::lossy_fs::{LossMode, LOSS_MODES};
use strata_testkit::powerloss::{run, LoopConfig, LoopStore};

const USAGE: &str = "\
usage: strata-powerloss --strata PATH --work-dir DIR [--cycles N] [--seed N]
                        [--modes drop,subset,torn,all] [--extras] [--fsck-every N]
                        [--max-requests N] [--s3 URL]";

const HELP: &str = "\
Runs `strata serve` on a FUSE disk that loses what was not synced
(strata_testkit::lossy_fs), kills it with SIGKILL after a seeded number of
client requests, cuts the power (the disk keeps its durable state, and per
mode: nothing else, a random subset of the rest, all but a torn last
write, or everything), restarts it, and checks that every FLUSHed and FUA
write reads back and that the volume is the state after some prefix of the
requests; with --extras, snapshots (each must read as it was taken), a
clone now and then, and GC every 200 ms. Prints one line per cycle with its
seed; exits 1 at the first failure, with the cycle, mode and seed.

Options:
  --strata PATH       the strata binary, required
  --work-dir DIR      a new or empty directory on a real disk, required
  --cycles N          cycles to run (default 100)
  --seed N            base seed (default: from the clock; printed)
  --modes LIST        loss modes used in turn (default drop,subset,torn,all)
  --extras            snapshots, clones and GC during the loop
  --fsck-every N      strata fsck every N cycles (default 10; 0: at the end only)
  --max-requests N    at most this many requests before a kill (default 300)
  --s3 URL            store on S3 (credentials from the environment); the
                      data dir stays on the lossy disk
  -h, --help          this text

Needs /dev/fuse, fusermount3 and python3-libnbd (/usr/bin/python3).";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}\n\n{HELP}");
        return ExitCode::SUCCESS;
    }
    let cfg = match parse(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("strata-powerloss: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(&cfg, &mut |line| println!("{line}")) {
        Ok(s) => {
            println!(
                "passed: {} cycles in {:.1} s, {} requests sent, {} durable ones read back, \
                 {} unflushed ones lost (allowed), {} snapshot and {} clone checks, {} fscks; \
                 base seed {}",
                s.cycles,
                s.elapsed.as_secs_f64(),
                s.requests_sent,
                s.durable_checked,
                s.undurable_lost,
                s.snapshots_checked,
                s.clones_checked,
                s.fscks,
                cfg.seed
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("strata-powerloss: FAILED (base seed {}): {e}", cfg.seed);
            ExitCode::from(1)
        }
    }
}

fn parse(args: &[String]) -> Result<LoopConfig, String> {
    let mut cfg = LoopConfig {
        strata: PathBuf::new(),
        work_dir: PathBuf::new(),
        cycles: 100,
        seed: clock_seed(),
        modes: LOSS_MODES.to_vec(),
        store: LoopStore::Embedded,
        extras: false,
        fsck_every: 10,
        max_requests: 300,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--strata" => cfg.strata = PathBuf::from(value()?),
            "--work-dir" => cfg.work_dir = PathBuf::from(value()?),
            "--cycles" => cfg.cycles = number(a, value()?)?,
            "--seed" => cfg.seed = number(a, value()?)?,
            "--fsck-every" => cfg.fsck_every = number(a, value()?)?,
            "--max-requests" => cfg.max_requests = number(a, value()?)?.max(1),
            "--extras" => cfg.extras = true,
            // The strata processes inherit this environment (credentials,
            // endpoint).
            "--s3" => {
                cfg.store = LoopStore::S3 {
                    url: value()?.clone(),
                    env: Vec::new(),
                }
            }
            "--modes" => {
                cfg.modes = value()?
                    .split(',')
                    .map(|m| m.parse::<LossMode>().map_err(|e| e.to_string()))
                    .collect::<Result<_, _>>()?;
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if cfg.strata.as_os_str().is_empty() || cfg.work_dir.as_os_str().is_empty() {
        return Err("--strata and --work-dir are required".into());
    }
    if cfg.modes.is_empty() {
        return Err("--modes: at least one".into());
    }
    Ok(cfg)
}

fn number(flag: &str, v: &str) -> Result<u64, String> {
    v.parse()
        .map_err(|_| format!("{flag}: {v:?} is not a non-negative integer"))
}

fn clock_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64 & 0xFFFF_FFFF)
        .unwrap_or(1)
}
