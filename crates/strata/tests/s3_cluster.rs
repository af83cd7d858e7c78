//! strata on a 4-node erasure-coded MinIO cluster (EC 2+2, strata talks to
//! node 1): fio writes and verifies with crc32c while node 2 is killed and,
//! a few seconds later, started again. MinIO keeps read and write quorum
//! with one node down, so no error may reach the client; afterwards a new
//! host with empty caches verifies everything from the cluster.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::clients::{FioGroup, FioVerify};
use common::*;
use std::thread;
use std::time::{Duration, Instant};
use strata_testkit::MinioCluster;

#[test]
fn s3_fio_verify_passes_while_a_cluster_node_restarts() {
    let _serial = serial();
    let t = Instant::now();
    let cluster = MinioCluster::start();
    let tmp = tempfile::TempDir::new().unwrap();
    let store = S3Store::on_cluster(&cluster, "cluster");
    // No disk cache: fio's verification reads must go to the cluster (with
    // the cache they are local-disk hits and finish before the node dies).
    let mut server = Server::start(
        tmp.path(),
        Target::strata_s3(&store, &["--disk-cache-size", "0"]),
        &[("vol", 2 * GIB)],
    );
    let uri = server.vol_uri();
    // 4 jobs x (8 MiB of 4 KiB + 56 MiB of 64 KiB writes) = 256 MiB (random
    // 4 KiB blocks cost a store read each when verified cold: few of them).
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
                size: 56 * MIB,
            },
        ],
    };
    let (fio_took, killed_at, back_at) = thread::scope(|s| {
        let load = s.spawn(|| {
            let t0 = Instant::now();
            fio.write_and_verify(tmp.path(), &uri, Duration::from_secs(600));
            t0.elapsed()
        });
        let t0 = Instant::now();
        thread::sleep(Duration::from_secs(3));
        cluster.kill_node(2);
        let killed_at = t0.elapsed();
        eprintln!("killed MinIO node 2 at {killed_at:.1?}");
        thread::sleep(Duration::from_secs(4));
        cluster.restart_node(2);
        let back_at = t0.elapsed();
        eprintln!("MinIO node 2 back at {back_at:.1?}");
        let took = match load.join() {
            Ok(took) => took,
            Err(panic) => std::panic::resume_unwind(panic),
        };
        (took, killed_at, back_at)
    });
    eprintln!("fio took {fio_took:.1?}");
    assert!(
        fio_took > killed_at,
        "fio finished ({fio_took:.1?}) before node 2 was killed ({killed_at:.1?}): \
         the test did not test anything; make the workload bigger"
    );
    if fio_took < back_at {
        eprintln!("note: fio finished while node 2 was still down");
    }
    server.assert_alive();

    server.restart_on_new_host();
    let before = store.segments("vol");
    fio.verify_only(tmp.path(), &server.vol_uri(), Duration::from_secs(300));
    server.stop();
    // The cold verification only read (no new segment).
    assert_eq!(store.segments("vol"), before, "the verification wrote");
    drop(server);
    drop(cluster);
    eprintln!("s3 cluster: {:.1?}", t.elapsed());
}
