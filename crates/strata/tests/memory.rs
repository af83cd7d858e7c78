//! Test 8: memory is bounded by configuration, not by the data written. An
//! 8 GiB volume served with a 64 MiB write buffer and a 64 MiB cache takes
//! 4 GiB of random 4 KiB writes (fio, 4 jobs x iodepth 32); the server's
//! resident set is sampled during the run and must stay under 512 MiB.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::*;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

const LIMIT: u64 = 512 * MIB;

#[test]
fn rss_stays_bounded_under_4gib_of_random_writes() {
    let _serial = serial();
    require_tools(&["fio"]);
    let tmp = tempfile::TempDir::new().unwrap();
    let target = Target::under_test(
        Target::strata_with(&["--write-buffer", "64MiB", "--cache-size", "64MiB"]),
        Target::NbdkitFile,
    );
    let server = Server::start(tmp.path(), target, &[("vol", 8 * GIB)]);
    let pid = server.pid();
    let (rss0, _) = rss_hwm(pid).expect("server /proc status");

    let stop = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(AtomicU64::new(rss0));
    let samples = Arc::new(AtomicU64::new(0));
    let sampler = {
        let (stop, peak, samples) = (stop.clone(), peak.clone(), samples.clone());
        thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if let Some((rss, _)) = rss_hwm(pid) {
                    peak.fetch_max(rss, Ordering::Relaxed);
                    samples.fetch_add(1, Ordering::Relaxed);
                }
                thread::sleep(Duration::from_millis(100));
            }
        })
    };

    const JOBS: u64 = 4;
    let region = 8 * GIB / JOBS;
    let per_job = GIB; // 4 GiB in total
    let t0 = Instant::now();
    let jobs = fio_json(
        tmp.path(),
        &[
            "--name=randwrite".into(),
            "--ioengine=nbd".into(),
            format!("--uri={}", server.vol_uri()),
            "--rw=randwrite".into(),
            "--bs=4k".into(),
            "--iodepth=32".into(),
            format!("--numjobs={JOBS}"),
            format!("--size={region}"),
            format!("--offset_increment={region}"),
            format!("--io_size={per_job}"),
            "--norandommap".into(),
            "--randrepeat=0".into(),
            "--group_reporting=0".into(),
        ],
        Duration::from_secs(900),
    );
    let elapsed = t0.elapsed();
    stop.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    let (rss_end, hwm) = rss_hwm(pid).expect("server still running");

    let written: u64 = jobs
        .iter()
        .map(|j| j["write"]["io_bytes"].as_u64().unwrap())
        .sum();
    let iops: f64 = jobs
        .iter()
        .map(|j| j["write"]["iops"].as_f64().unwrap_or(0.0))
        .sum();
    assert_eq!(written, JOBS * per_job, "fio wrote {written} bytes");
    let sampled = peak.load(Ordering::Relaxed);
    let peak_rss = sampled.max(hwm);
    eprintln!(
        "memory: {} GiB of random 4 KiB writes in {elapsed:.1?} ({iops:.0} IOPS); server RSS at \
         start {} MiB, sampled peak {} MiB ({} samples), VmHWM {} MiB, at end {} MiB (limit {} MiB)",
        written / GIB,
        rss0 / MIB,
        sampled / MIB,
        samples.load(Ordering::Relaxed),
        hwm / MIB,
        rss_end / MIB,
        LIMIT / MIB
    );
    assert!(samples.load(Ordering::Relaxed) > 10, "too few RSS samples");
    assert!(
        peak_rss < LIMIT,
        "server peak RSS {} MiB >= {} MiB",
        peak_rss / MIB,
        LIMIT / MIB
    );
}
