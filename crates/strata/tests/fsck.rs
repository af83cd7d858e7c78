//! `strata fsck` as an operator runs it: on a volume a server is serving
//! (clean, exit 0, the JSON names the server), then after damage to its
//! store: exit 1, the human output naming the object, the volume's byte
//! range, the snapshot and the clone it affects, the same in `--json`
//! (parsed); `--quick` missing a flipped data bit but not a missing
//! segment; and exit 2 when it cannot check at all (no such volume or
//! snapshot, a bad name, an encrypted volume without its key).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use common::clients::qemu_io;
use common::*;

const VOL: u64 = 64 * MIB;
/// Plain segments: the test flips a byte of stored data.
const ARGS: [&str; 4] = ["--segment-size", "1MiB", "--compression", "none"];

fn fsck(server: &Server, args: &[&str]) -> Output {
    let mut all = vec!["fsck"];
    all.extend_from_slice(args);
    server.cli(&all)
}

fn code(out: &Output) -> i32 {
    out.status.code().expect("exited, not killed")
}

fn json(out: &Output) -> serde_json::Value {
    serde_json::from_str(&stdout_str(out))
        .unwrap_or_else(|e| panic!("not one JSON document ({e}):\n{}", stdout_str(out)))
}

/// The largest segment object of `vol` (the one 8 MiB write).
fn largest_segment(store: &Path) -> PathBuf {
    let dir = store.join("vol/segments");
    std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .max_by_key(|p| std::fs::metadata(p).unwrap().len())
        .unwrap()
}

#[test]
fn fsck_exit_status_json_and_what_damage_affects() {
    require_tools(&["qemu-io"]);
    let _serial = serial();
    let tmp = tempfile::TempDir::new().unwrap();
    let mut server = Server::start(tmp.path(), Target::strata_with(&ARGS), &[("vol", VOL)]);
    let write = |cmds: &[&str]| {
        let cmds: Vec<String> = cmds.iter().map(|c| c.to_string()).collect();
        let out = qemu_io(&server.vol_uri(), &cmds);
        assert!(out.status.success(), "{}", stderr_str(&out));
    };
    write(&["write -P 0x5a 0 8M", "flush"]);
    server.cli_ok(&["snapshot", "create", "vol@before"]);
    write(&["write -P 0x33 0 1M", "flush"]);
    server.cli_ok(&["volume", "clone", "vol@before", "copy"]);

    // While served: clean, read only, the server named.
    let out = fsck(&server, &["vol", "--json"]);
    assert_eq!(code(&out), 0, "{}{}", stdout_str(&out), stderr_str(&out));
    let r = json(&out);
    assert_eq!(r["clean"], true, "{r:#}");
    assert!(r["served_by"].is_string(), "{r:#}");
    assert!(r["checked"]["segments"].as_u64().unwrap() > 0, "{r:#}");
    assert_eq!(r["checked"]["snapshots"], 1, "{r:#}");
    let out = fsck(&server, &["vol"]);
    assert_eq!(code(&out), 0, "{}", stderr_str(&out));
    assert!(
        stdout_str(&out).contains("vol: clean"),
        "{}",
        stdout_str(&out)
    );
    server.stop();

    // A flipped bit in the middle of the 8 MiB write's data: about 4 MiB
    // into the volume, never overwritten, so the volume, the snapshot and
    // the clone read it.
    let segment = largest_segment(&server.store_dir());
    let original = std::fs::read(&segment).unwrap();
    let mut bad = original.clone();
    bad[original.len() / 2] ^= 0x01;
    std::fs::write(&segment, &bad).unwrap();
    let out = fsck(&server, &["vol", "--json"]);
    assert_eq!(code(&out), 1, "{}{}", stdout_str(&out), stderr_str(&out));
    let r = json(&out);
    assert_eq!(
        (r["clean"].clone(), r["errors"].clone()),
        (false.into(), 1.into()),
        "{r:#}"
    );
    let p = &r["problems"][0];
    assert_eq!(p["severity"], "error", "{p:#}");
    assert_eq!(p["kind"], "corrupt", "{p:#}");
    let name = segment.file_name().unwrap().to_str().unwrap();
    assert_eq!(p["object"], format!("vol/segments/{name}"), "{p:#}");
    let range = &p["affects"]["volume"]["ranges"][0];
    let (offset, length) = (
        range["offset"].as_u64().unwrap(),
        range["length"].as_u64().unwrap(),
    );
    assert!((MIB..8 * MIB).contains(&offset) && length == 4096, "{p:#}");
    let snapshot = &p["affects"]["snapshots"][0];
    assert_eq!(snapshot["snapshot"], "before", "{p:#}");
    assert_eq!(snapshot["ranges"][0]["offset"], offset, "{p:#}");
    assert_eq!(p["affects"]["clones"], serde_json::json!(["copy"]), "{p:#}");
    // The same in words.
    let out = fsck(&server, &["vol"]);
    assert_eq!(code(&out), 1);
    let text = stdout_str(&out);
    let bytes = format!("bytes {offset}..{}", offset + length);
    assert!(
        text.contains(&format!("ERROR (corrupt) vol/segments/{name}")),
        "{text}"
    );
    assert!(
        text.contains(&format!("affects volume vol: {bytes}")),
        "{text}"
    );
    assert!(
        text.contains(&format!("affects snapshot vol@before: {bytes}")),
        "{text}"
    );
    assert!(text.contains("affects clones: copy"), "{text}");
    assert!(text.contains("vol: 1 error"), "{text}");
    // The snapshot and the clone alone see it too; --quick reads no data.
    assert_eq!(code(&fsck(&server, &["vol@before"])), 1);
    let out = fsck(&server, &["copy", "--json"]);
    assert_eq!(code(&out), 1, "{}", stdout_str(&out));
    assert_eq!(json(&out)["clone_of"], "vol@before");
    let out = fsck(&server, &["vol", "--quick", "--json"]);
    assert_eq!(code(&out), 0, "{}", stdout_str(&out));
    assert_eq!(json(&out)["checked"]["data_bytes_verified"], 0);

    // The segment gone: --quick finds that.
    std::fs::remove_file(&segment).unwrap();
    let out = fsck(&server, &["vol", "--quick", "--json"]);
    assert_eq!(code(&out), 1, "{}", stdout_str(&out));
    assert_eq!(json(&out)["problems"][0]["kind"], "missing");
    std::fs::write(&segment, &original).unwrap();
    assert_eq!(code(&fsck(&server, &["vol"])), 0);

    // Could not check: exit 2, saying why.
    for (args, says) in [
        (&["nosuch"][..], "does not exist"),
        (&["vol@nosuch"][..], "no snapshot"),
        (&["bad/name"][..], "bad volume or snapshot"),
    ] {
        let out = fsck(&server, args);
        assert_eq!(code(&out), 2, "{args:?}: {}", stderr_str(&out));
        assert!(
            stderr_str(&out).contains(says),
            "{args:?}: {}",
            stderr_str(&out)
        );
    }
    let help = stdout_str(&server.cli(&["fsck", "--help"]));
    assert!(
        help.contains("Exit status: 0") && help.contains("2 the check could not run"),
        "{help}"
    );
}

#[test]
fn an_encrypted_volume_is_checked_with_its_key_only() {
    let _serial = serial();
    let tmp = tempfile::TempDir::new().unwrap();
    let (store, data) = (tmp.path().join("store"), tmp.path().join("data"));
    let key = tmp.path().join("key");
    run_ok(
        Command::new(strata_bin())
            .args(["key", "generate"])
            .arg(&key),
        Duration::from_secs(10),
    );
    let key = key.to_str().unwrap();
    let image = tmp.path().join("image");
    let mut bytes = vec![0u8; 3 * MIB as usize];
    Rng::new(9).fill(&mut bytes);
    std::fs::write(&image, &bytes).unwrap();
    let out = strata_cli(
        &store,
        &data,
        &[
            "--key-file",
            key,
            "volume",
            "import",
            image.to_str().unwrap(),
            "enc",
        ],
    );
    assert!(out.status.success(), "{}", stderr_str(&out));
    let out = strata_cli(&store, &data, &["fsck", "enc"]);
    assert_eq!(code(&out), 2, "{}", stdout_str(&out));
    assert!(
        stderr_str(&out).contains("is encrypted"),
        "{}",
        stderr_str(&out)
    );
    let out = strata_cli(&store, &data, &["--key-file", key, "fsck", "enc", "--json"]);
    assert_eq!(code(&out), 0, "{}{}", stdout_str(&out), stderr_str(&out));
    let verified = json(&out)["checked"]["data_bytes_verified"]
        .as_u64()
        .unwrap();
    assert!(verified >= 3 * MIB, "{verified}");
}
