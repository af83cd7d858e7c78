//! Test 4: fio through its libnbd engine, 4 jobs x iodepth 32 (one NBD
//! connection each, multi-conn), random 4 KiB then random 64 KiB writes, each
//! job in its own region, every block verified with crc32c after writing.
//! The workload is `common::clients::FioVerify` (the S3 tests run it too).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::clients::FioVerify;
use common::*;
use std::time::Duration;

#[test]
fn fio_random_writes_verify_crc32c() {
    let _serial = serial();
    let tmp = tempfile::TempDir::new().unwrap();
    let target = Target::under_test(Target::strata(), Target::NbdkitMemory);
    let mut server = Server::start(tmp.path(), target, &[("vol", 2 * GIB)]);
    FioVerify::standard().write_and_verify(tmp.path(), &server.vol_uri(), Duration::from_secs(600));
    server.assert_alive();
}
