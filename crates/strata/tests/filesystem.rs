//! Test 5: a real ext4 filesystem on the export. nbdfuse exposes the export
//! as a file, a loop device turns it into a block device, mkfs.ext4 + mount +
//! files; then everything is torn down, the server restarted, and the files
//! must be identical and `fsck.ext4 -fn` clean. The body is
//! `common::clients::ext4_survives_restart` (s3_clients.rs runs it on MinIO).
//!
//! Needs root (loop devices, mount) and /dev/fuse, which CI has.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::clients::ext4_survives_restart;
use common::*;

#[test]
fn ext4_on_nbdfuse_loop_survives_restart() {
    let _serial = serial();
    let tmp = tempfile::TempDir::new().unwrap();
    let target = Target::under_test(Target::strata(), Target::NbdkitFile);
    let (mut server, _) = ext4_survives_restart(tmp.path(), target);
    server.assert_alive();
}
