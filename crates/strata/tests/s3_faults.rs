//! Store faults on S3 (MinIO): strata's store requests fail at random
//! (`--inject-faults error_rate=0.05`, plus 5..10 ms of latency each) and
//! are retried; no error may reach an NBD client. fio writes and verifies
//! with crc32c (exit 0, no verify error), then a new host with empty
//! caches verifies everything again from MinIO, still under faults.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::clients::FioVerify;
use common::*;
use std::time::{Duration, Instant};

const FAULTS: &str = "error_rate=0.05,latency_ms=5,jitter_ms=5,seed=4242";

/// Injected store errors the server logged as retried ("object store
/// request failed; retrying" with the fault injector's error).
fn retried_faults(log: &str) -> usize {
    log.lines()
        .filter(|l| {
            l.contains("object store request failed; retrying") && l.contains("injected fault")
        })
        .count()
}

/// Store errors a retry gave up on, which would reach the volume.
fn gave_up(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| l.contains("ERROR") && l.contains("injected fault"))
        .collect()
}

/// The injected-error count of the stats file, if the server wrote one.
fn stats_injected(path: &std::path::Path) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    fn find(v: &serde_json::Value) -> Option<u64> {
        match v {
            serde_json::Value::Object(m) => m.iter().find_map(|(k, x)| {
                if k == "injected_errors" {
                    x.as_u64()
                } else {
                    find(x)
                }
            }),
            serde_json::Value::Array(a) => a.iter().find_map(find),
            _ => None,
        }
    }
    find(&v)
}

#[test]
fn s3_fio_verify_passes_under_injected_store_faults() {
    let _serial = serial();
    let t = Instant::now();
    let tmp = tempfile::TempDir::new().unwrap();
    let store = S3Store::on_shared("faults");
    let stats = tmp.path().join("stats.json");
    let stats_arg = stats.display().to_string();
    let target = Target::strata_s3(
        &store,
        &[
            "--inject-faults",
            FAULTS,
            "--stats-file",
            &stats_arg,
            "--stats-interval-ms",
            "500",
        ],
    );
    let mut server = Server::start(tmp.path(), target, &[("vol", 2 * GIB)]);
    let fio = FioVerify::scaled(4);
    fio.write_and_verify(tmp.path(), &server.vol_uri(), Duration::from_secs(300));
    server.assert_alive();
    // The clean stop uploads the rest, under faults too.
    server.stop();
    let log = server.stderr();
    let retried = retried_faults(&log);
    eprintln!("writing: {retried} injected store errors retried");
    assert!(
        log.contains("injecting store faults"),
        "the server did not say it injects faults"
    );
    assert!(
        retried > 0,
        "no injected store fault was retried while writing {} MiB: were faults injected?",
        fio.total_bytes() / MIB
    );
    assert!(gave_up(&log).is_empty(), "{:#?}", gave_up(&log));
    let injected = stats_injected(&stats).unwrap_or_else(|| {
        panic!(
            "no stats file (or no fault counters) at {}",
            stats.display()
        )
    });
    eprintln!("stats file: {injected} injected errors");
    assert!(injected > 0, "the stats file counts no injected error");
    let text = std::fs::read_to_string(&stats).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        v["store"]["layers"]["retries"]["gave_up"].as_u64(),
        Some(0),
        "a store request gave up: {text}"
    );

    // Another host, empty caches: every block comes from MinIO, through
    // the faulty store.
    server.restart_on_new_host();
    let before = store.segments("vol");
    fio.verify_only(tmp.path(), &server.vol_uri(), Duration::from_secs(300));
    server.assert_alive();
    let cold = server.last_stderr();
    let retried_cold = retried_faults(&cold);
    eprintln!("cold verify: {retried_cold} injected store errors retried");
    assert!(
        retried_cold > 0,
        "no injected fault was retried while reading {} MiB cold",
        fio.total_bytes() / MIB
    );
    assert!(gave_up(&cold).is_empty(), "{:#?}", gave_up(&cold));
    server.stop();
    // The cold verification only read (no new segment).
    assert_eq!(store.segments("vol"), before, "the verification wrote");
    eprintln!("s3 faults: {:.1?}", t.elapsed());
}
