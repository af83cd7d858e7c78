//! `--log-format json`: every line a server writes on stderr is one JSON
//! object (timestamp, level, message, fields at the top level), errors
//! included, and volume lines name their volume.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::process::Command;
use std::time::Duration;

use common::*;

fn json_lines(text: &str) -> Vec<serde_json::Value> {
    text.lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with("==="))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

#[test]
fn json_logs_are_one_object_per_line() {
    require_tools(&["nbdinfo"]);
    let _serial = serial();
    let tmp = tempfile::TempDir::new().unwrap();
    let mut server = Server::start(
        tmp.path(),
        Target::strata_with(&["--log-format", "json"]),
        &[("vol", 64 * MIB)],
    );
    run_ok(
        Command::new("nbdinfo").arg(server.vol_uri()),
        Duration::from_secs(30),
    );
    server.stop();
    let lines = json_lines(&server.last_stderr());
    assert!(lines.len() >= 3, "{lines:?}");
    for l in &lines {
        for field in ["timestamp", "level", "message", "target"] {
            assert!(l.get(field).is_some(), "no {field}: {l}");
        }
    }
    let open = lines
        .iter()
        .find(|l| l["message"] == "volume open")
        .expect("a volume open line");
    assert_eq!(open["volume"], "vol");
    // A failing command: its error is a JSON line too.
    let err = server.cli_err(&["--log-format", "json", "volume", "info", "nope"]);
    let lines = json_lines(&err);
    let last = lines.last().expect("an error line");
    assert_eq!(last["level"], "ERROR", "{last}");
    assert!(
        last["error"].as_str().unwrap().contains("does not exist"),
        "{last}"
    );
}

/// Every warning and error line about a volume names the volume and the
/// object, journal or range it concerns (a store failing half of its
/// requests makes plenty of them); a store request for no volume's object
/// (listing volumes) names its path with volume `-`.
#[test]
fn warnings_and_errors_name_the_volume_and_the_object() {
    require_tools(&["qemu-io"]);
    let _serial = serial();
    let tmp = tempfile::TempDir::new().unwrap();
    let mut server = Server::start(
        tmp.path(),
        Target::strata_with(&[
            "--log-format",
            "json",
            "--inject-faults",
            "error_rate=0.3,seed=7",
            "--segment-age-ms",
            "100",
        ]),
        &[("vol", 64 * MIB)],
    );
    let writes: Vec<String> = (0..8)
        .map(|i| format!("write -P {} {}M 1M", i + 1, i * 4))
        .collect();
    let out = common::clients::qemu_io(&server.vol_uri(), &writes);
    assert!(out.status.success(), "{}", stderr_str(&out));
    std::thread::sleep(Duration::from_millis(1500));
    server.stop();
    let lines = json_lines(&server.last_stderr());
    let serious: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|l| l["level"] == "WARN" || l["level"] == "ERROR")
        .collect();
    assert!(
        serious.iter().filter(|l| l.get("volume").is_some()).count() >= 3,
        "the faults made too few warnings to check: {serious:#?}"
    );
    let server_level = ["injecting store faults (testing only)"];
    for line in serious {
        let message = line["message"].as_str().unwrap_or_default();
        if server_level.contains(&message) {
            continue;
        }
        let volume = line.get("volume").or_else(|| line.get("export"));
        assert!(volume.is_some(), "names no volume: {line}");
        // A request for no volume's object (listing the volumes) says so.
        let store_wide = line["volume"] == "-" && line.get("path").is_some();
        assert!(
            store_wide || volume.is_some_and(|v| v.as_str().is_some_and(|v| !v.is_empty())),
            "names no volume: {line}"
        );
        let what = [
            "object",
            "path",
            "journal",
            "offset_bytes",
            "marker",
            "snapshot",
        ];
        assert!(
            what.iter().any(|f| line.get(*f).is_some()),
            "names no object, journal or range: {line}"
        );
    }
}
