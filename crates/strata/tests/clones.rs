//! Writable clones through real clients: clones of one snapshot read its
//! data and write their own (qemu-io), survive the parent being
//! overwritten and collected, clones of clones, kill -9; the snapshot and
//! the parent cannot be deleted while clones live (the message names
//! them); deleting the clones frees them. On the embedded store and on
//! MinIO. Also: the depth limit, and a clone's creation killed after each
//! of its steps.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::clients::{qemu_io, qemu_io_verify};
use common::*;

const VOL: u64 = 32 * MIB;
const ARGS: [&str; 4] = ["--segment-size", "1MiB", "--gc-grace-ms", "0"];

fn write(server: &Server, export: &str, cmds: &[&str]) {
    let mut all: Vec<String> = cmds.iter().map(|c| c.to_string()).collect();
    all.push("flush".into());
    let out = qemu_io(&server.uri(export), &all);
    assert!(out.status.success(), "{export}: {}", stderr_str(&out));
}

fn verify(server: &Server, export: &str, reads: &[&str], when: &str) {
    let reads: Vec<String> = reads.iter().map(|r| r.to_string()).collect();
    qemu_io_verify(&server.uri(export), &reads, &format!("{export} {when}"));
}

fn check_all(server: &Server, when: &str) {
    verify(server, "base", &["read -P 0x22 0 8M"], when);
    verify(
        server,
        "c1",
        &["read -P 0x33 0 1M", "read -P 0x11 1M 7M"],
        when,
    );
    verify(
        server,
        "c2",
        &["read -P 0x11 0 8M", "read -P 0x44 8M 1M"],
        when,
    );
    verify(
        server,
        "c3",
        &[
            "read -P 0x33 0 1M",
            "read -P 0x55 1M 1M",
            "read -P 0x11 2M 6M",
        ],
        when,
    );
}

fn clones_share_a_snapshot_and_write_independently(target: Target) {
    require_tools(&["qemu-io"]);
    let _serial = serial();
    let tmp = tempfile::TempDir::new().unwrap();
    let mut server = Server::start(tmp.path(), target, &[("base", VOL)]);
    write(&server, "base", &["write -P 0x11 0 8M"]);
    server.cli_ok(&["snapshot", "create", "base@gold"]);
    let said = server.cli_ok(&["volume", "clone", "base@gold", "c1"]);
    assert!(said.contains("a clone of base@gold"), "{said}");
    server.cli_ok(&["volume", "clone", "base@gold", "c2"]);
    write(&server, "c1", &["write -P 0x33 0 1M"]);
    write(&server, "c2", &["write -P 0x44 8M 1M"]);
    // A clone of a clone.
    server.cli_ok(&["snapshot", "create", "c1@s1"]);
    server.cli_ok(&["volume", "clone", "c1@s1", "c3"]);
    write(&server, "c3", &["write -P 0x55 1M 1M"]);
    // The parent moves on and collects garbage: the clones keep the
    // snapshot's data.
    write(&server, "base", &["write -P 0x22 0 8M"]);
    server.cli_ok(&["volume", "gc", "base", "--wait"]);
    check_all(&server, "after the parent was overwritten and collected");
    let info = server.cli_ok(&["volume", "info", "c3"]);
    assert!(info.contains("clone of:    c1@s1"), "{info}");

    server.kill9();
    server.start_again();
    check_all(&server, "after kill -9");

    let err = server.cli_err(&["snapshot", "delete", "base@gold"]);
    assert!(
        err.contains("has clones") && err.contains("c1") && err.contains("c2"),
        "{err}"
    );
    server.stop();
    let err = server.cli_err(&["volume", "delete", "base"]);
    assert!(err.contains("has clones"), "{err}");
    let err = server.cli_err(&["volume", "delete", "c1"]);
    assert!(err.contains("has clones: c3"), "{err}");
    server.start_again();
    check_all(&server, "after refused deletions");
    server.stop();

    // c1 has a snapshot that reads from base: it cannot be flattened.
    let err = server.cli_err(&["volume", "flatten", "c1"]);
    assert!(err.contains("read from its parent (s1)"), "{err}");
    // c2 can: it keeps its data and stops being a clone.
    let said = server.cli_ok(&["volume", "flatten", "c2"]);
    assert!(said.contains("copied 8 MiB"), "{said}");
    let info = server.cli_ok(&["volume", "info", "c2"]);
    assert!(!info.contains("clone of"), "{info}");
    server.cli_ok(&["volume", "delete", "c3"]);
    let err = server.cli_err(&["snapshot", "delete", "base@gold"]);
    assert!(
        err.contains("has clones: c1") && !err.contains("c2"),
        "{err}"
    );
    server.cli_ok(&["volume", "delete", "c1"]);
    server.cli_ok(&["snapshot", "delete", "base@gold"]);
    server.cli_ok(&["volume", "gc", "base", "--wait", "--gc-grace-ms", "0"]);
    server.volumes.retain(|(n, _)| n == "base");
    server.start_again();
    verify(
        &server,
        "base",
        &["read -P 0x22 0 8M"],
        "after the clones went",
    );
    verify(
        &server,
        "c2",
        &["read -P 0x11 0 8M", "read -P 0x44 8M 1M"],
        "flattened, after its parent snapshot was deleted and collected",
    );
    server.stop();
}

#[test]
fn clones_share_a_snapshot_and_write_independently_embedded() {
    clones_share_a_snapshot_and_write_independently(Target::strata_with(&ARGS));
}

#[test]
fn clones_share_a_snapshot_and_write_independently_s3() {
    let store = S3Store::on_shared("clones");
    clones_share_a_snapshot_and_write_independently(Target::strata_s3(&store, &ARGS));
}

/// Clones of clones nest 16 deep; the 17th is refused, saying so.
#[test]
fn clone_depth_is_limited_with_a_clear_error() {
    let _serial = serial();
    let tmp = tempfile::TempDir::new().unwrap();
    let mut server = Server::start(tmp.path(), Target::strata_with(&ARGS), &[("v0", VOL)]);
    server.stop();
    for depth in 1..=strata_volume::MAX_CLONE_DEPTH {
        let parent = format!("v{}", depth - 1);
        server.cli_ok(&["snapshot", "create", &format!("{parent}@s")]);
        server.cli_ok(&[
            "volume",
            "clone",
            &format!("{parent}@s"),
            &format!("v{depth}"),
        ]);
    }
    let last = format!("v{}", strata_volume::MAX_CLONE_DEPTH);
    server.cli_ok(&["snapshot", "create", &format!("{last}@s")]);
    let err = server.cli_err(&["volume", "clone", &format!("{last}@s"), "too-deep"]);
    assert!(err.contains("clones may nest 16 deep"), "{err}");
}

/// A flatten killed before and after its manifest write: still a clone,
/// or flat; the data reads back either way and the next flatten works.
#[test]
fn a_flatten_killed_before_or_after_its_write_is_done_or_not() {
    require_tools(&["qemu-io"]);
    let _serial = serial();
    let tmp = tempfile::TempDir::new().unwrap();
    for (point, flat) in [
        ("flatten.before_manifest", false),
        ("flatten.after_manifest", true),
    ] {
        let dir = tmp.path().join(point.replace('.', "-"));
        let mut server = Server::start(&dir, Target::strata_with(&ARGS), &[("base", VOL)]);
        write(&server, "base", &["write -P 0x11 0 8M"]);
        server.cli_ok(&["snapshot", "create", "base@gold"]);
        server.cli_ok(&["volume", "clone", "base@gold", "c"]);
        write(&server, "c", &["write -P 0x33 1M 1M"]);
        server.stop();
        server.target = Target::strata_with(&ARGS).with_env("STRATA_CRASH_AT", point);
        let err = server.cli_err(&["volume", "flatten", "c"]);
        assert!(err.contains(&format!("STRATA_CRASH_AT={point}")), "{err}");
        server.target = Target::strata_with(&ARGS);
        let info = server.cli_ok(&["volume", "info", "c"]);
        assert_eq!(info.contains("clone of"), !flat, "{point}: {info}");
        server.start_again();
        let reads = [
            "read -P 0x11 0 1M",
            "read -P 0x33 1M 1M",
            "read -P 0x11 2M 6M",
        ];
        verify(&server, "c", &reads, point);
        server.stop();
        if !flat {
            server.cli_ok(&["volume", "flatten", "c"]);
        }
        server.cli_ok(&["snapshot", "delete", "base@gold"]);
        server.start_again();
        verify(
            &server,
            "c",
            &reads,
            &format!("{point}: flat, parent snapshot gone"),
        );
        server.stop();
    }
}

/// A clone's creation killed after its marker (no clone; the snapshot can
/// still be deleted) and after its manifest (a clone that works, and keeps
/// its snapshot).
#[test]
fn a_clone_killed_after_each_step_exists_or_not() {
    require_tools(&["qemu-io"]);
    let _serial = serial();
    let tmp = tempfile::TempDir::new().unwrap();
    for (point, exists) in [
        ("clone.after_marker", false),
        ("clone.after_manifest", true),
    ] {
        let dir = tmp.path().join(point.replace('.', "-"));
        let mut server = Server::start(&dir, Target::strata_with(&ARGS), &[("base", VOL)]);
        write(&server, "base", &["write -P 0x11 0 8M"]);
        server.stop();
        server.cli_ok(&["snapshot", "create", "base@gold"]);
        server.target = Target::strata_with(&ARGS).with_env("STRATA_CRASH_AT", point);
        let err = server.cli_err(&["volume", "clone", "base@gold", "c"]);
        assert!(err.contains(&format!("STRATA_CRASH_AT={point}")), "{err}");
        server.target = Target::strata_with(&ARGS);
        let list = server.cli_ok(&["volume", "list"]);
        assert_eq!(list.contains("\nc "), exists, "{point}: {list}");
        if exists {
            server.start_again();
            verify(
                &server,
                "c",
                &["read -P 0x11 0 8M"],
                &format!("after {point}"),
            );
            server.stop();
            let err = server.cli_err(&["snapshot", "delete", "base@gold"]);
            assert!(err.contains("has clones: c"), "{point}: {err}");
        } else {
            server.cli_ok(&["snapshot", "delete", "base@gold"]);
        }
    }
}

/// A clone rolled back to its own snapshot: the inherited data and the
/// clone's writes before the snapshot come back.
#[test]
fn a_clone_rolls_back_to_its_own_snapshot() {
    require_tools(&["qemu-io"]);
    let _serial = serial();
    let tmp = tempfile::TempDir::new().unwrap();
    let mut server = Server::start(tmp.path(), Target::strata_with(&ARGS), &[("base", VOL)]);
    write(&server, "base", &["write -P 0x11 0 8M"]);
    server.cli_ok(&["snapshot", "create", "base@gold"]);
    server.cli_ok(&["volume", "clone", "base@gold", "c"]);
    write(&server, "c", &["write -P 0x33 1M 1M"]);
    server.cli_ok(&["snapshot", "create", "c@one"]);
    write(&server, "c", &["write -P 0x55 0 8M"]);
    server.stop();
    server.cli_ok(&["snapshot", "rollback", "c@one"]);
    server.start_again();
    let reads = [
        "read -P 0x11 0 1M",
        "read -P 0x33 1M 1M",
        "read -P 0x11 2M 6M",
    ];
    verify(&server, "c", &reads, "after the clone's rollback");
    server.stop();
}

/// A clone under another prefix of the same bucket: the image under
/// `images/`, its clone under `vms/` served by another server. The clone
/// reads the image's data and writes its own; the image's snapshot cannot
/// be deleted while the clone lives (the image's CLI names it); deleting
/// the clone frees the snapshot.
#[test]
fn a_clone_lives_under_another_prefix_of_the_bucket() {
    require_tools(&["qemu-io"]);
    let _serial = serial();
    let tmp = tempfile::TempDir::new().unwrap();
    let images = S3Store::on_shared("images");
    let vms = S3Store {
        prefix: "vms".into(),
        ..images.clone()
    };
    let mut image_server = Server::start(
        &tmp.path().join("images"),
        Target::strata_s3(&images, &ARGS),
        &[("base", VOL)],
    );
    write(&image_server, "base", &["write -P 0x11 0 8M"]);
    image_server.cli_ok(&["snapshot", "create", "base@gold"]);
    let mut vm_server = Server::start(&tmp.path().join("vms"), Target::strata_s3(&vms, &ARGS), &[]);
    let said = vm_server.cli_ok(&[
        "volume",
        "clone",
        "base@gold",
        "vm1",
        "--parent-prefix",
        "images",
    ]);
    assert!(said.contains("a clone of base@gold"), "{said}");
    write(&vm_server, "vm1", &["write -P 0x22 1M 1M"]);
    let reads = [
        "read -P 0x11 0 1M",
        "read -P 0x22 1M 1M",
        "read -P 0x11 2M 6M",
    ];
    verify(&vm_server, "vm1", &reads, "a clone under another prefix");
    // The image moves on and collects garbage; the clone keeps its data.
    write(&image_server, "base", &["write -P 0x33 0 8M"]);
    image_server.cli_ok(&["volume", "gc", "base", "--wait"]);
    vm_server.kill9();
    vm_server.start_again();
    verify(
        &vm_server,
        "vm1",
        &reads,
        "after the image was overwritten, collected, and kill -9",
    );
    let err = image_server.cli_err(&["snapshot", "delete", "base@gold"]);
    assert!(err.contains("has clones: vm1"), "{err}");
    vm_server.stop();
    vm_server.cli_ok(&["volume", "delete", "vm1"]);
    image_server.cli_ok(&["snapshot", "delete", "base@gold"]);
    image_server.stop();
}
