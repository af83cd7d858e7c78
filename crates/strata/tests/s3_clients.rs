//! The real-client tests of the foundation (qemu_io.rs, copy.rs,
//! fio_verify.rs, filesystem.rs: the same bodies, from `common::clients`)
//! with the volume on S3: a MinIO server of strata-testkit, one fresh
//! bucket per test. After each, the server is stopped cleanly and started
//! again with a new, empty data dir (another host: no journal, and a new
//! process, so empty caches): every byte it then serves comes from MinIO,
//! and the data is verified again, cold.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::clients::*;
use common::*;
use std::time::{Duration, Instant};

/// Asserts that the volume's segments really are in the bucket (strata did
/// not fall back to some local store).
fn assert_segments_in_bucket(store: &S3Store, volume: &str) {
    let segments = store.list(&format!("{volume}/segments/"));
    let bytes: u64 = segments.iter().map(|(_, size)| size).sum();
    eprintln!(
        "{}: {} segments, {} MiB under {volume}/segments/",
        store.url(),
        segments.len(),
        bytes / MIB
    );
    assert!(
        !segments.is_empty(),
        "no segment of volume {volume} in {}",
        store.url()
    );
}

#[test]
fn s3_qemu_io_unaligned_patterns_then_cold_read() {
    let _serial = serial();
    let t = Instant::now();
    let tmp = tempfile::TempDir::new().unwrap();
    let store = S3Store::on_shared("qemu-io");
    let (mut server, reads) = qemu_io_patterns(tmp.path(), Target::strata_s3(&store, &[]));
    assert_segments_in_bucket(&store, "vol");
    server.restart_on_new_host();
    qemu_io_verify(&server.vol_uri(), &reads, "cold, on a new host");
    server.stop();
    eprintln!("s3 qemu-io: {:.1?}", t.elapsed());
}

#[test]
fn s3_qemu_img_and_nbdcopy_round_trip_then_cold_read() {
    let _serial = serial();
    let t = Instant::now();
    let tmp = tempfile::TempDir::new().unwrap();
    let work = tempfile::TempDir::new().unwrap();
    let store = S3Store::on_shared("copy");
    // Half of copy.rs's 1 GiB: the same chunk mix, half the upload time.
    let (mut server, image) = copy_round_trip(
        tmp.path(),
        work.path(),
        Target::strata_s3(&store, &[]),
        512 * MIB,
    );
    server.restart_on_new_host();
    assert_segments_in_bucket(&store, "vol");
    image.assert_export_equals(&server.vol_uri(), work.path(), "cold, on a new host");
    server.stop();
    eprintln!("s3 copy: {:.1?}", t.elapsed());
}

#[test]
fn s3_fio_random_writes_verify_crc32c_then_cold_verify() {
    let _serial = serial();
    let t = Instant::now();
    let tmp = tempfile::TempDir::new().unwrap();
    let store = S3Store::on_shared("fio");
    let mut server = Server::start(
        tmp.path(),
        Target::strata_s3(&store, &[]),
        &[("vol", 2 * GIB), ("empty", 2 * GIB)],
    );
    // A quarter of fio_verify.rs's regions: 256 MiB written and verified.
    let fio = FioVerify::scaled(4);
    fio.write_and_verify(tmp.path(), &server.vol_uri(), Duration::from_secs(300));
    server.assert_alive();
    server.restart_on_new_host();
    assert_segments_in_bucket(&store, "vol");
    let before = store.segments("vol");
    fio.verify_only(tmp.path(), &server.vol_uri(), Duration::from_secs(300));
    // The check can fail: the same verification of a never written volume.
    fio.verify_only_fails(tmp.path(), &server.uri("empty"));
    server.stop();
    // The cold verification only read: had it written the data again, it
    // would have verified its own writes (and they would be new segments).
    assert_eq!(store.segments("vol"), before, "the verification wrote");
    eprintln!("s3 fio: {:.1?}", t.elapsed());
}

#[test]
fn s3_ext4_on_nbdfuse_loop_then_cold_fsck_and_files() {
    let _serial = serial();
    let t = Instant::now();
    let tmp = tempfile::TempDir::new().unwrap();
    let store = S3Store::on_shared("ext4");
    let (mut server, contents) = ext4_survives_restart(tmp.path(), Target::strata_s3(&store, &[]));
    server.restart_on_new_host();
    assert_segments_in_bucket(&store, "vol");
    ext4_check(&server, &contents);
    server.stop();
    eprintln!("s3 ext4: {:.1?}", t.elapsed());
}
