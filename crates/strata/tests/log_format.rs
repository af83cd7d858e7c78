//! `--log-format json`: every line a server writes on stderr is one JSON
//! object (timestamp, level, message, fields at the top level), errors
//! included, and volume lines name their volume.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

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
