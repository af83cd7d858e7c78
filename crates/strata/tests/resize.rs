//! Online resize through real clients: a served volume grows (new
//! connections see the new size, nbdinfo says so, data past the old end
//! survives kill -9), a snapshot keeps its size, shrinking is refused
//! unless asked for and then really drops the cut range; a resize killed
//! before or after its manifest write leaves the old size or the new one.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::time::Duration;

use common::clients::{qemu_io, qemu_io_verify};
use common::*;

const VOL: u64 = 32 * MIB;
const ARGS: [&str; 4] = ["--segment-size", "1MiB", "--gc-grace-ms", "0"];

fn export_size(server: &Server, export: &str) -> u64 {
    let out = run_ok(
        std::process::Command::new("nbdinfo")
            .arg("--size")
            .arg(server.uri(export)),
        Duration::from_secs(30),
    );
    stdout_str(&out).trim().parse().unwrap()
}

fn io(server: &Server, cmds: &[&str]) {
    let mut all: Vec<String> = cmds.iter().map(|c| c.to_string()).collect();
    all.push("flush".into());
    let out = qemu_io(&server.vol_uri(), &all);
    assert!(out.status.success(), "{}", stderr_str(&out));
}

fn verify(server: &Server, export: &str, reads: &[&str], when: &str) {
    let reads: Vec<String> = reads.iter().map(|r| r.to_string()).collect();
    qemu_io_verify(&server.uri(export), &reads, when);
}

fn grow_and_shrink(target: Target) {
    require_tools(&["qemu-io", "nbdinfo"]);
    let _serial = serial();
    let tmp = tempfile::TempDir::new().unwrap();
    let mut server = Server::start(tmp.path(), target, &[("vol", VOL)]);
    io(&server, &["write -P 0x11 0 32M"]);
    server.cli_ok(&["snapshot", "create", "vol@small"]);
    // Grown by the serving server.
    let said = server.cli_ok(&["volume", "resize", "vol", "--size", "64MiB"]);
    assert!(said.contains("resized vol from 32 MiB to 64 MiB"), "{said}");
    assert_eq!(export_size(&server, "vol"), 64 * MIB);
    assert_eq!(export_size(&server, "vol@small"), 32 * MIB);
    io(&server, &["write -P 0x22 40M 8M"]);
    verify(
        &server,
        "vol",
        &[
            "read -P 0x11 0 32M",
            "read -P 0 32M 8M",
            "read -P 0x22 40M 8M",
            "read -P 0 48M 16M",
        ],
        "after growing",
    );
    server.kill9();
    server.start_again();
    assert_eq!(export_size(&server, "vol"), 64 * MIB);
    verify(
        &server,
        "vol",
        &["read -P 0x22 40M 8M"],
        "after growing and kill -9",
    );

    let refused = server.cli(&["volume", "resize", "vol", "--size", "16MiB"]);
    assert!(
        !refused.status.success() && stderr_str(&refused).contains("--allow-shrink"),
        "{}",
        stderr_str(&refused)
    );
    server.cli_ok(&[
        "volume",
        "resize",
        "vol",
        "--size",
        "16MiB",
        "--allow-shrink",
    ]);
    assert_eq!(export_size(&server, "vol"), 16 * MIB);
    server.cli_ok(&["volume", "resize", "vol", "--size", "32MiB"]);
    verify(
        &server,
        "vol",
        &["read -P 0x11 0 16M", "read -P 0 16M 16M"],
        "after shrinking and growing again (the cut range is gone)",
    );
    verify(
        &server,
        "vol@small",
        &["read -P 0x11 0 32M"],
        "the snapshot",
    );
    server.stop();
    server.start_again();
    assert_eq!(export_size(&server, "vol"), 32 * MIB);
    verify(
        &server,
        "vol",
        &["read -P 0x11 0 16M", "read -P 0 16M 16M"],
        "after a restart",
    );
    server.stop();
}

#[test]
fn a_served_volume_grows_and_shrinks_when_asked_embedded() {
    grow_and_shrink(Target::strata_with(&ARGS));
}

#[test]
fn a_served_volume_grows_and_shrinks_when_asked_s3() {
    let store = S3Store::on_shared("resize");
    grow_and_shrink(Target::strata_s3(&store, &ARGS));
}

#[test]
fn a_resize_killed_before_or_after_its_write_has_the_old_size_or_the_new() {
    require_tools(&["qemu-io", "nbdinfo"]);
    let _serial = serial();
    let tmp = tempfile::TempDir::new().unwrap();
    for (point, size) in [
        ("resize.before_manifest", VOL),
        ("resize.after_manifest", 2 * VOL),
    ] {
        let dir = tmp.path().join(point.replace('.', "-"));
        let crashing = Target::strata_with(&ARGS).with_env("STRATA_CRASH_AT", point);
        let mut server = Server::start(&dir, crashing, &[("vol", VOL)]);
        io(&server, &["write -P 0x11 0 32M"]);
        server.expect_crash(point, &["volume", "resize", "vol", "--size", "64MiB"]);
        server.target = Target::strata_with(&ARGS);
        server.start_again();
        assert_eq!(export_size(&server, "vol"), size, "{point}");
        verify(&server, "vol", &["read -P 0x11 0 32M"], point);
        io(&server, &["write -P 0x22 0 1M"]);
        server.stop();
    }
}
