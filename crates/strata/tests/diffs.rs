//! Incremental diffs through real clients: `volume diff` lists what
//! changed between two snapshots (nothing after a GC pass that only moved
//! data), `export-diff` A->B applied with `import-diff` to a copy at A gives
//! an image identical to B (`qemu-img compare` over NBD), and a damaged or
//! misdirected diff file changes nothing. On the embedded store and MinIO.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::time::Duration;

use common::clients::qemu_io;
use common::*;

const VOL: u64 = 32 * MIB;
const ARGS: [&str; 4] = ["--segment-size", "1MiB", "--gc-grace-ms", "0"];

fn io(server: &Server, export: &str, cmds: &[&str]) {
    let mut all: Vec<String> = cmds.iter().map(|c| c.to_string()).collect();
    all.push("flush".into());
    let out = qemu_io(&server.uri(export), &all);
    assert!(out.status.success(), "{export}: {}", stderr_str(&out));
}

fn same_image(server: &Server, a: &str, b: &str) -> bool {
    let out = run_timeout(
        std::process::Command::new("qemu-img")
            .args(["compare", "-f", "raw", "-F", "raw"])
            .arg(server.uri(a))
            .arg(server.uri(b)),
        Duration::from_secs(120),
    );
    match out.status.code() {
        Some(0) => true,
        Some(1) => false,
        _ => panic!("qemu-img compare {a} {b}: {}", stderr_str(&out)),
    }
}

fn changes(server: &Server, from: &str, to: &str) -> Vec<serde_json::Value> {
    let json = server.cli_ok(&["volume", "diff", from, to, "--json"]);
    serde_json::from_str::<serde_json::Value>(&json)
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

fn diff_round_trip(target: Target) {
    require_tools(&["qemu-io", "qemu-img"]);
    let _serial = serial();
    let tmp = tempfile::TempDir::new().unwrap();
    let mut server = Server::start(tmp.path(), target, &[("vol", VOL)]);
    io(
        &server,
        "vol",
        &["write -P 0x11 0 8M", "write -P 0x12 16M 2M"],
    );
    server.cli_ok(&["snapshot", "create", "vol@a"]);
    // The copy at A: a clone with a snapshot of the same name.
    server.cli_ok(&["volume", "clone", "vol@a", "copy"]);
    server.cli_ok(&["snapshot", "create", "copy@a"]);
    server.cli_ok(&["volume", "clone", "vol@a", "spare"]);
    server.cli_ok(&["snapshot", "create", "spare@a"]);
    io(
        &server,
        "vol",
        &[
            "write -P 0x21 1M 1M",
            "write -P 0x22 3000 5000",
            "write -z 4M 1M",
            "discard 16M 1M",
            "write -P 0x23 24M 512k",
        ],
    );
    server.cli_ok(&["snapshot", "create", "vol@b"]);
    let diff = changes(&server, "vol@a", "vol@b");
    let covered: u64 = diff.iter().map(|c| c["length"].as_u64().unwrap()).sum();
    let zeros = diff.iter().filter(|c| c["kind"] == "zero").count();
    assert!(
        (2 * MIB + 512 * KIB + 5000 + MIB..=5 * MIB).contains(&covered) && zeros >= 2,
        "diff: {diff:?}"
    );

    let file = tmp.path().join("a-b.diff");
    let file_arg = file.to_str().unwrap();
    server.cli_ok(&["volume", "export-diff", "vol@a", "vol@b", file_arg]);
    let said = server.cli_ok(&["volume", "import-diff", file_arg, "copy"]);
    assert!(said.contains("applied"), "{said}");
    assert!(
        same_image(&server, "vol@b", "copy@b"),
        "copy@b differs from vol@b"
    );
    assert!(
        same_image(&server, "vol@b", "copy"),
        "copy differs from vol@b"
    );
    assert!(
        !same_image(&server, "vol@a", "copy@b"),
        "the diff changed nothing"
    );

    // GC that only moves data: no change between snapshots around it.
    io(
        &server,
        "vol",
        &["write -P 0x31 8M 4M", "write -P 0x32 8M 3M"],
    );
    server.cli_ok(&["snapshot", "create", "vol@c"]);
    server.cli_ok(&["volume", "gc", "vol", "--wait"]);
    server.cli_ok(&["snapshot", "create", "vol@d"]);
    let none = changes(&server, "vol@c", "vol@d");
    assert!(none.is_empty(), "a GC pass made a diff: {none:?}");

    // A damaged file changes nothing; a misdirected one is refused.
    let mut bytes = std::fs::read(&file).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    let bad = tmp.path().join("bad.diff");
    std::fs::write(&bad, &bytes).unwrap();
    let err = server.cli_err(&["volume", "import-diff", bad.to_str().unwrap(), "spare"]);
    assert!(err.contains("checksum") || err.contains("corrupt"), "{err}");
    assert!(
        same_image(&server, "vol@a", "spare"),
        "a damaged diff changed spare"
    );
    let err = server.cli_err(&["volume", "import-diff", file_arg, "copy"]);
    assert!(err.contains("already has snapshot \"b\""), "{err}");
    let err = server.cli_err(&["volume", "import-diff", file_arg, "vol"]);
    assert!(err.contains("already has snapshot \"b\""), "{err}");
    let err = server.cli_err(&["volume", "diff", "vol@b", "vol@a"]);
    assert!(err.contains("give the older one first"), "{err}");
    server.stop();
}

#[test]
fn export_diff_applied_to_a_copy_gives_an_identical_image_embedded() {
    diff_round_trip(Target::strata_with(&ARGS));
}

#[test]
fn export_diff_applied_to_a_copy_gives_an_identical_image_s3() {
    let store = S3Store::on_shared("diffs");
    diff_round_trip(Target::strata_s3(&store, &ARGS));
}

/// Whole images: a snapshot exported to a sparse file and to standard
/// output (the same bytes), imported into new volumes from the file and
/// from standard input: each compares equal to the snapshot.
#[test]
fn export_and_import_of_whole_images_round_trip() {
    require_tools(&["qemu-io", "qemu-img"]);
    let _serial = serial();
    let tmp = tempfile::TempDir::new().unwrap();
    let server = Server::start(tmp.path(), Target::strata_with(&ARGS), &[("vol", VOL)]);
    io(
        &server,
        "vol",
        &["write -P 0x11 1M 3M", "write -P 0x12 20M 100k"],
    );
    server.cli_ok(&["snapshot", "create", "vol@s"]);
    let image = tmp.path().join("s.img");
    server.cli_ok(&["volume", "export", "vol@s", image.to_str().unwrap()]);
    let meta = std::fs::metadata(&image).unwrap();
    assert_eq!(meta.len(), VOL);
    use std::os::unix::fs::MetadataExt;
    assert!(
        meta.blocks() * 512 < 8 * MIB,
        "the image is not sparse: {} blocks",
        meta.blocks()
    );
    let out = server.cli(&["volume", "export", "vol@s", "-"]);
    assert!(out.status.success(), "{}", stderr_str(&out));
    assert!(
        out.stdout == std::fs::read(&image).unwrap(),
        "stdout and file exports differ"
    );

    let said = server.cli_ok(&["volume", "import", image.to_str().unwrap(), "restored"]);
    assert!(said.contains("imported"), "{said}");
    let mut c = strata_command(None, &[]);
    c.arg("--store")
        .arg(server.store_dir())
        .arg("--data-dir")
        .arg(server.data_dir())
        .args(["volume", "import", "-", "piped", "--size", "32MiB"]);
    let stdin = std::fs::File::open(&image).unwrap().into();
    let out = run_timeout_from(&mut c, stdin, Duration::from_secs(120));
    assert!(out.status.success(), "{}", stderr_str(&out));
    assert!(
        stdout_str(&out).contains("8 MiB of data stored"),
        "{}",
        stdout_str(&out)
    );
    for copy in ["restored", "piped"] {
        assert!(
            same_image(&server, "vol@s", copy),
            "{copy} differs from vol@s"
        );
    }
    let err = server.cli_err(&["volume", "import", "-", "new-one"]);
    assert!(err.contains("needs --size"), "{err}");
}
