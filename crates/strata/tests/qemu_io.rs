//! Test 2: qemu-io writes byte patterns at unaligned, scattered offsets with
//! sub-4 KiB lengths (including overlapping rewrites and the last bytes of the
//! volume) and reads every byte of the touched areas back: before and after a
//! clean restart, after a crash restart, and from the store alone (fresh data
//! dir) after a clean SIGINT shutdown. The body is
//! `common::clients::qemu_io_patterns` (s3_clients.rs runs it on MinIO).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::clients::qemu_io_patterns;
use common::*;

#[test]
fn unaligned_pattern_writes_read_back_across_restarts() {
    let _serial = serial();
    let tmp = tempfile::TempDir::new().unwrap();
    let target = Target::under_test(Target::strata(), Target::NbdkitFile);
    qemu_io_patterns(tmp.path(), target);
}
