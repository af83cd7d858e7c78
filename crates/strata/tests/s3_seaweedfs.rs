//! strata on a SeaweedFS cluster (master, three volume servers with
//! replication 001, filer, S3 gateway): fio writes and verifies with crc32c
//! while a volume server is killed and, seconds later, started again. Every
//! chunk has a copy on another volume server, so reads go on; writes to
//! volumes that had a copy on the dead server fail until the master moves
//! them elsewhere, and strata's retries must hide that: no error reaches
//! the client, uploads go on while the server is down, and afterwards a new
//! host with empty caches verifies everything from the cluster. The same
//! shape as the MinIO node kill (`s3_cluster.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::clients::{FioGroup, FioVerify};
use common::*;
use std::thread;
use std::time::{Duration, Instant};
use strata_testkit::{SeaweedCluster, VOLUME_SERVERS};

/// `retries N gave_up M` of the final counters line strata prints at exit.
fn retries_and_gave_up(stderr: &str) -> (u64, u64) {
    let line = stderr
        .lines()
        .rev()
        .find(|l| l.contains("final counters"))
        .unwrap_or_else(|| panic!("no final counters line in:\n{stderr}"));
    let after = |word: &str| -> u64 {
        let rest = &line[line
            .find(word)
            .unwrap_or_else(|| panic!("no {word} in {line}"))
            + word.len()..];
        rest.split_whitespace()
            .next()
            .unwrap()
            .trim_end_matches(';')
            .parse()
            .unwrap()
    };
    (after("retries "), after("gave_up "))
}

#[test]
fn s3_fio_verify_passes_while_a_seaweedfs_volume_server_restarts() {
    let _serial = serial();
    let t = Instant::now();
    let cluster = SeaweedCluster::start();
    let tmp = tempfile::TempDir::new().unwrap();
    let store = S3Store::on_seaweed_cluster(&cluster, "seaweed");
    // No disk cache: fio's verification reads must go to the cluster.
    let mut server = Server::start(
        tmp.path(),
        Target::strata_s3(&store, &["--disk-cache-size", "0"]),
        &[("vol", 2 * GIB)],
    );
    let uri = server.vol_uri();
    let fio = FioVerify {
        jobs: 4,
        groups: vec![
            FioGroup {
                name: "rand4k",
                bs: "4k",
                offset: 0,
                size: 8 * MIB,
            },
            FioGroup {
                name: "rand64k",
                bs: "64k",
                offset: GIB,
                size: 192 * MIB,
            },
        ],
    };
    let (fio_took, killed_at, back_at, stored_at_kill, stored_at_back) = thread::scope(|s| {
        let load = s.spawn(|| {
            let t0 = Instant::now();
            fio.write_and_verify(tmp.path(), &uri, Duration::from_secs(600));
            t0.elapsed()
        });
        let t0 = Instant::now();
        thread::sleep(Duration::from_secs(2));
        cluster.kill_volume_server(2);
        let killed_at = t0.elapsed();
        let stored_at_kill = store.segments("vol");
        eprintln!("killed SeaweedFS volume server 2 at {killed_at:.1?}; stored {stored_at_kill:?}");
        thread::sleep(Duration::from_secs(6));
        let live = cluster.live_volume_servers();
        assert_eq!(
            live.len(),
            VOLUME_SERVERS - 1,
            "the master still lists the dead server: {live:?}"
        );
        let stored_at_back = store.segments("vol");
        cluster.restart_volume_server(2);
        let back_at = t0.elapsed();
        eprintln!("volume server 2 back at {back_at:.1?}; stored {stored_at_back:?}");
        let took = match load.join() {
            Ok(took) => took,
            Err(panic) => std::panic::resume_unwind(panic),
        };
        (took, killed_at, back_at, stored_at_kill, stored_at_back)
    });
    eprintln!("fio took {fio_took:.1?}");
    assert!(
        fio_took > killed_at,
        "fio finished ({fio_took:.1?}) before volume server 2 was killed ({killed_at:.1?}): \
         the test did not test anything; make the workload bigger"
    );
    // Writes went on with a server down: segments reached the cluster
    // between the kill and the restart.
    assert!(
        fio_took < back_at || stored_at_back.0 > stored_at_kill.0,
        "no segment was uploaded while volume server 2 was down ({stored_at_kill:?} -> {stored_at_back:?})"
    );
    server.assert_alive();
    server.stop();
    let (retries, gave_up) = retries_and_gave_up(&server.stderr());
    eprintln!("store retries {retries}, gave up {gave_up}");
    assert_eq!(
        gave_up,
        0,
        "a store request failed for good:\n{}",
        server.stderr()
    );

    server.restart_on_new_host();
    let before = store.segments("vol");
    fio.verify_only(tmp.path(), &server.vol_uri(), Duration::from_secs(300));
    server.stop();
    assert_eq!(store.segments("vol"), before, "the verification wrote");
    drop(server);
    drop(cluster);
    eprintln!("s3 seaweedfs: {:.1?}", t.elapsed());
}
