//! Test 3: bulk copies with qemu-img convert and nbdcopy. A 1 GiB sparse raw
//! image (deterministic random 1 MiB chunks and holes) goes into the volume and
//! back out byte-identical; `nbdinfo --map` shows the image's holes as holes,
//! including where a second image turns previously written data into holes
//! (the copy tools zero/trim those ranges and the server must unmap them).
//! The body is `common::clients::copy_round_trip` (s3_clients.rs runs it on
//! MinIO).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::clients::copy_round_trip;
use common::*;

#[test]
fn qemu_img_and_nbdcopy_round_trip_a_sparse_1gib_image() {
    let _serial = serial();
    let tmp = tempfile::TempDir::new().unwrap();
    let work = tempfile::TempDir::new().unwrap();
    let target = Target::under_test(Target::strata(), Target::NbdkitMemory);
    copy_round_trip(tmp.path(), work.path(), target, GIB);
}
