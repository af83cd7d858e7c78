//! Test 7: bad input. The CLI rejects what it cannot do with a non-zero exit
//! and a one-line error (no panic, no backtrace); the server rejects bad
//! requests (unknown export, garbage bytes, out-of-range I/O) and keeps
//! serving. Also checks the admin commands' happy path (create, list, info,
//! delete, sizes) since the error cases are defined relative to it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::http_stub::{closed_port, HttpStub, StubReply, StubRequest};
use common::*;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

fn assert_one_line_error(out: &Output, what: &str) -> String {
    let err = stderr_str(out);
    assert!(
        !out.status.success(),
        "{what}: expected a failure, got success\nstdout: {}\nstderr: {err}",
        stdout_str(out)
    );
    assert_ne!(
        out.status.code(),
        Some(101),
        "{what}: exit code 101 means a Rust panic:\n{err}"
    );
    let msg = err.trim();
    assert!(!msg.is_empty(), "{what}: failed without an error message");
    assert!(
        !msg.contains("panicked") && !msg.contains("RUST_BACKTRACE"),
        "{what}: panicked instead of reporting an error:\n{msg}"
    );
    assert_eq!(
        msg.lines().count(),
        1,
        "{what}: the error is not one line:\n{msg}"
    );
    assert_no_cause_twice(msg, what);
    eprintln!("{what}: {msg}");
    msg.to_string()
}

/// Each cause of an error chain is printed once: no part of the line
/// between ": " separators (of some length) appears twice in it.
fn assert_no_cause_twice(msg: &str, what: &str) {
    for part in msg.split(": ").map(str::trim).filter(|p| p.len() >= 12) {
        assert_eq!(
            msg.matches(part).count(),
            1,
            "{what}: {part:?} is printed more than once:\n{msg}"
        );
    }
}

fn ok(out: &Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}{}",
        out.status,
        stdout_str(out),
        stderr_str(out)
    );
    stdout_str(out)
}

fn json(out: &Output, what: &str) -> serde_json::Value {
    let s = ok(out, what);
    serde_json::from_str(&s).unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {s}"))
}

#[test]
fn cli_volume_admin_and_its_errors() {
    let tmp = tempfile::TempDir::new().unwrap();
    let store = tmp.path().join("store");
    let data = tmp.path().join("data");
    let cli = |args: &[&str]| strata_cli(&store, &data, args);

    // Happy path, with every documented size syntax.
    let sizes = [
        ("ten", "10GiB", 10 * GIB),
        ("half", "512M", 512 * MIB),
        ("tera", "1T", 1024 * GIB),
        ("tiny", "4096", 4096),
    ];
    for (name, size, _) in sizes {
        ok(
            &cli(&["volume", "create", name, "--size", size]),
            &format!("create {name} {size}"),
        );
    }
    let list = json(&cli(&["volume", "list", "--json"]), "volume list --json");
    let list = list.as_array().expect("volume list --json is an array");
    let mut uuids = Vec::new();
    for (name, size, bytes) in sizes {
        let entry = list
            .iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("{name} missing from volume list: {list:?}"));
        assert_eq!(
            entry["size_bytes"].as_u64(),
            Some(bytes),
            "{name} ({size}) in list: {entry}"
        );
        let info = json(
            &cli(&["volume", "info", name, "--json"]),
            "volume info --json",
        );
        assert_eq!(info["name"], name, "{info}");
        assert_eq!(
            info["size_bytes"].as_u64(),
            Some(bytes),
            "{name} ({size}): {info}"
        );
        let uuid = info["uuid"]
            .as_str()
            .unwrap_or_else(|| panic!("no uuid: {info}"));
        assert!(uuid.len() >= 32, "uuid {uuid:?}");
        uuids.push(uuid.to_string());
    }
    uuids.sort();
    uuids.dedup();
    assert_eq!(uuids.len(), sizes.len(), "volume uuids are not unique");
    // Human-readable list mentions every volume.
    let human = ok(&cli(&["volume", "list"]), "volume list");
    for (name, _, _) in sizes {
        assert!(
            human.contains(name),
            "{name} not in `volume list`:\n{human}"
        );
    }

    // Errors.
    let e = assert_one_line_error(
        &cli(&["volume", "create", "ten", "--size", "1GiB"]),
        "create of an existing volume",
    );
    assert!(e.contains("ten"), "error does not name the volume: {e}");
    // `--size=VALUE` so that values like "-5" reach the size parser.
    for bad in [
        "12XB",
        "abc",
        "",
        "-5",
        "0x10",
        "1.5.5G",
        "99999999999999999999",
        "20000000T",
    ] {
        assert_one_line_error(
            &cli(&["volume", "create", "badsize", &format!("--size={bad}")]),
            &format!("create with size {bad:?}"),
        );
    }
    let e = assert_one_line_error(
        &cli(&["volume", "info", "missing"]),
        "info of a missing volume",
    );
    assert!(e.contains("missing"), "error does not name the volume: {e}");
    // The failed creates left nothing behind, the existing volume is intact.
    assert_one_line_error(
        &cli(&["volume", "info", "badsize"]),
        "info after failed create",
    );
    let info = json(&cli(&["volume", "info", "ten", "--json"]), "info ten");
    assert_eq!(info["size_bytes"].as_u64(), Some(10 * GIB));

    // Delete.
    ok(&cli(&["volume", "delete", "tiny"]), "delete tiny");
    assert_one_line_error(
        &cli(&["volume", "info", "tiny"]),
        "info of a deleted volume",
    );
    let list = json(&cli(&["volume", "list", "--json"]), "list after delete");
    assert!(
        !list.as_array().unwrap().iter().any(|v| v["name"] == "tiny"),
        "deleted volume still listed: {list}"
    );
    assert_one_line_error(
        &cli(&["volume", "delete", "tiny"]),
        "delete of a missing volume",
    );

    // --store and --data-dir from the environment.
    let out = run_timeout(
        Command::new(strata_bin())
            .env("STRATA_STORE", &store)
            .env("STRATA_DATA_DIR", &data)
            .args(["volume", "info", "half", "--json"]),
        Duration::from_secs(60),
    );
    assert_eq!(
        json(&out, "info via env")["size_bytes"].as_u64(),
        Some(512 * MIB)
    );
}

fn unusable_stores(tmp: &Path) -> Vec<(String, String)> {
    let file = tmp.join("not-a-dir");
    std::fs::write(&file, b"I am a file").unwrap();
    vec![
        (file.display().to_string(), "a regular file".into()),
        (
            format!("file://{}", file.display()),
            "file:// URL of a regular file".into(),
        ),
        (
            tmp.join("not-a-dir/below").display().to_string(),
            "a path below a regular file".into(),
        ),
        (
            "nosuchscheme://bucket/prefix".into(),
            "an unsupported URL scheme".into(),
        ),
    ]
}

#[test]
fn unusable_store_is_a_one_line_error() {
    let tmp = tempfile::TempDir::new().unwrap();
    let data = tmp.path().join("data");
    for (store, what) in unusable_stores(tmp.path()) {
        let s = Path::new(&store);
        assert_one_line_error(
            &strata_cli(s, &data, &["volume", "list"]),
            &format!("list, store is {what}"),
        );
        assert_one_line_error(
            &strata_cli(s, &data, &["volume", "create", "v", "--size", "1GiB"]),
            &format!("create, store is {what}"),
        );
        // serve must fail too (without printing `ready`), not hang.
        let sock = tmp.path().join("never.sock");
        let out = strata_cli(
            s,
            &data,
            &[
                "serve",
                "--listen",
                &format!("unix:{}", sock.display()),
                "--create",
                "v=1GiB",
            ],
        );
        assert_one_line_error(&out, &format!("serve, store is {what}"));
        assert!(
            !stdout_str(&out).lines().any(|l| l.trim() == "ready"),
            "serve printed ready with a bad store"
        );
    }
}

/// libnbd with strict mode off, so requests the client library would refuse
/// reach the server.
const PY_OUT_OF_RANGE: &str = r#"
import nbd, sys
h = nbd.NBD()
h.set_strict_mode(0)
h.connect_uri(sys.argv[1])
size = h.get_size()
def attempt(name, f):
    try:
        f()
        print(name, "ACCEPTED")
    except nbd.Error as e:
        print(name, "REJECTED", e.errno)
attempt("read-past-end", lambda: h.pread(4096, size))
attempt("read-across-end", lambda: h.pread(8192, size - 4096))
attempt("write-past-end", lambda: h.pwrite(b"x" * 4096, size))
attempt("write-across-end", lambda: h.pwrite(b"x" * 8192, size - 4096))
attempt("zero-past-end", lambda: h.zero(4096, size))
attempt("trim-past-end", lambda: h.trim(4096, size + 4096))
h.pwrite(b"\xab" * 4096, size - 4096)
assert h.pread(4096, size - 4096) == b"\xab" * 4096
print("connection still works")
h.shutdown()
"#;

#[test]
fn server_rejects_bad_requests_and_keeps_serving() {
    let _serial = serial();
    require_tools(&["nbdinfo", "qemu-io"]);
    let tmp = tempfile::TempDir::new().unwrap();
    let mut server = Server::start(
        tmp.path(),
        Target::strata(),
        &[("vol", 256 * MIB), ("other", 64 * MIB)],
    );

    // Unknown export: a clear failure on the client, nothing else affected.
    // With LIBNBD_DEBUG=1 libnbd shows the server's own error message, which
    // must name the export.
    let out = run_timeout(
        Command::new("nbdinfo")
            .env("LIBNBD_DEBUG", "1")
            .arg(server.uri("nosuchvolume")),
        Duration::from_secs(60),
    );
    assert!(
        !out.status.success(),
        "nbdinfo of an unknown export succeeded: {}",
        stdout_str(&out)
    );
    let err = stderr_str(&out);
    let server_msg = err
        .lines()
        .find(|l| l.contains("server error message"))
        .unwrap_or_else(|| panic!("no error message from the server:\n{err}"));
    eprintln!("nbdinfo unknown export: {server_msg}");
    assert!(
        server_msg.contains("nosuchvolume"),
        "the server's error does not name the export: {server_msg}"
    );
    server.assert_alive();
    assert_eq!(
        nbdinfo_json(&server.uri("other"))["export-size"].as_u64(),
        Some(64 * MIB)
    );

    // Garbage and rude clients.
    for garbage in [
        &b""[..],
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        &[0xffu8; 4096][..],
        b"IHAVEOPT\x00\x00\x00\x00",
    ] {
        let mut s = UnixStream::connect(&server.socket).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut hello = [0u8; 18];
        s.read_exact(&mut hello).expect("server greeting");
        assert_eq!(&hello[..8], b"NBDMAGIC", "not an NBD greeting");
        let _ = s.write_all(garbage);
        let _ = s.shutdown(std::net::Shutdown::Write);
        // The server may answer or hang up, but must not crash.
        let mut sink = Vec::new();
        let _ = s.read_to_end(&mut sink);
    }
    server.assert_alive();

    // Out-of-range requests fail with an error and the connection survives.
    let out = run_ok(
        Command::new(python_with_nbd())
            .args(["-c", PY_OUT_OF_RANGE])
            .arg(server.uri("other")),
        Duration::from_secs(60),
    );
    let so = stdout_str(&out);
    eprintln!("{so}");
    for req in [
        "read-past-end",
        "read-across-end",
        "write-past-end",
        "write-across-end",
        "zero-past-end",
        "trim-past-end",
    ] {
        assert!(
            so.lines()
                .any(|l| l.starts_with(&format!("{req} REJECTED"))),
            "{req} was not rejected:\n{so}"
        );
    }
    assert!(so.contains("connection still works"), "{so}");

    // Admin errors against the store while the server is running.
    let cli = |args: &[&str]| strata_cli(&server.store_dir(), &server.data_dir(), args);
    assert_one_line_error(
        &cli(&["volume", "create", "vol", "--size", "1GiB"]),
        "create existing (served)",
    );
    assert_one_line_error(&cli(&["volume", "info", "nope"]), "info missing (served)");
    let info = json(
        &cli(&["volume", "info", "vol", "--json"]),
        "info vol (served)",
    );
    assert_eq!(info["size_bytes"].as_u64(), Some(256 * MIB));

    // Still serving: data goes in and comes back.
    server.assert_alive();
    let out = run_ok(
        Command::new("qemu-io")
            .args(["-f", "raw"])
            .arg(server.uri("vol"))
            .args([
                "-c",
                "write -P 0x5e 12345 6789",
                "-c",
                "read -P 0x5e 12345 6789",
            ]),
        Duration::from_secs(60),
    );
    assert!(!stdout_str(&out).contains("fail"), "{}", stdout_str(&out));
    assert_eq!(
        nbdinfo_json(&server.uri("vol"))["export-size"].as_u64(),
        Some(256 * MIB)
    );
    server.stop();
}

/// DESIGN.md: "One writer per volume: opening a volume takes a lease ...; a
/// second server is refused with a clear message". Two servers writing one
/// volume would silently corrupt it, so a second `strata serve` on the same
/// store must not serve a volume that is already being served: it either
/// exits non-zero with a one-line error, or it runs and refuses the export.
/// (`--standby off`: by default the second server serves the export as a
/// standby, which writes only once the first hands the volume over:
/// standby.rs.)
#[test]
fn second_server_on_a_served_volume_is_refused() {
    let _serial = serial();
    require_tools(&["nbdinfo"]);
    let tmp = tempfile::TempDir::new().unwrap();
    let mut first = Server::start(tmp.path(), Target::strata(), &[("vol", 64 * MIB)]);
    let sock2 = tmp.path().join("second.sock");
    let mut second = BgProcess::spawn(
        "second strata serve",
        Command::new(strata_bin())
            .arg("--store")
            .arg(first.store_dir())
            .arg("--data-dir")
            .arg(tmp.path().join("data-of-second-host"))
            .arg("serve")
            .args(["--standby", "off"])
            .arg("--listen")
            .arg(format!("unix:{}", sock2.display())),
    );
    // Wait for `ready` or an exit.
    let t0 = std::time::Instant::now();
    let exited = loop {
        if let Some(st) = second.try_status() {
            break Some(st);
        }
        if second.stdout().lines().any(|l| l.trim() == "ready") {
            break None;
        }
        assert!(
            t0.elapsed() < READY_TIMEOUT,
            "second server neither ready nor exited: {}",
            second.stderr()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    match exited {
        Some(st) => {
            assert!(!st.success(), "second server exited 0");
            eprintln!("second server refused: {}", second.stderr().trim());
        }
        None => {
            let out = run_timeout(
                Command::new("nbdinfo").arg(nbd_uri(&sock2, "vol")),
                Duration::from_secs(60),
            );
            assert!(
                !out.status.success(),
                "a second server serves volume `vol` while the first one does \
                 (no lease): {}",
                stdout_str(&out)
            );
            eprintln!(
                "second server refuses the export: {}",
                stderr_str(&out).trim()
            );
        }
    }
    second.kill();
    // The first server is unaffected.
    first.assert_alive();
    assert_eq!(
        nbdinfo_json(&first.uri("vol"))["export-size"].as_u64(),
        Some(64 * MIB)
    );
    first.stop();
}

// ---------------------------------------------------------------------------
// First use: credentials, S3 refusals, unreachable stores, serve, every
// subcommand's error paths (issue 14). Every request goes to 127.0.0.1.
// ---------------------------------------------------------------------------

/// `strata --store STORE ARGS` with no credentials from the caller (no
/// AWS_* keys, HOME an empty directory, so no ~/.aws/credentials), instance
/// metadata off unless `env` turns it on, then `env`.
fn s3_cli(home: &Path, store: &str, env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut c = strata_command(None, &[]);
    for k in [
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT",
        "AWS_SHARED_CREDENTIALS_FILE",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_ROLE_ARN",
        "STRATA_LOG",
    ] {
        c.env_remove(k);
    }
    c.env("HOME", home)
        .envs(env.iter().copied())
        .arg("--store")
        .arg(store)
        .arg("--data-dir")
        .arg(home.join("data"))
        .args(args);
    run_timeout(&mut c, Duration::from_secs(60))
}

fn targets(requests: &[StubRequest]) -> Vec<String> {
    requests
        .iter()
        .map(|r| format!("{} {}", r.method, r.target))
        .collect()
}

/// No credentials anywhere: one line at once naming each place strata
/// looked, whether the store is AWS's or another endpoint. Instance
/// metadata is asked only where told (a stub on 127.0.0.1 here), once,
/// never again after a refusal, and not at all when disabled.
#[test]
fn no_s3_credentials_is_one_line_at_once() {
    let home = tempfile::TempDir::new().unwrap();
    let imds = HttpStub::start(|_| StubReply::new(403, "Forbidden", ""));
    let list = ["volume", "list"];
    let imds_url = imds.url();
    for store in ["s3://vols/x", "s3://vols/x?endpoint=http://127.0.0.1:9"] {
        let disabled = [
            ("AWS_EC2_METADATA_DISABLED", "true"),
            ("AWS_METADATA_ENDPOINT", imds_url.as_str()),
        ];
        let out = s3_cli(home.path(), store, &disabled, &list);
        let e = assert_one_line_error(&out, &format!("no credentials, {store}"));
        for says in [
            "no S3 credentials found",
            "the environment (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are not set)",
            "/.aws/credentials (no such file)",
            "instance metadata (not asked: AWS_EC2_METADATA_DISABLED=true)",
            "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
        ] {
            assert!(e.contains(says), "{store}: no {says:?} in: {e}");
        }
        assert!(
            imds.requests().is_empty(),
            "{:?}",
            targets(&imds.requests())
        );
    }

    // Told where the metadata service is; it refuses: asked once, no retry.
    let asked = [
        ("AWS_EC2_METADATA_DISABLED", "false"),
        ("AWS_METADATA_ENDPOINT", imds_url.as_str()),
    ];
    let e = assert_one_line_error(
        &s3_cli(home.path(), "s3://vols/x", &asked, &list),
        "no credentials, metadata refuses",
    );
    assert!(
        e.contains(&format!("no token from {}: it answered 403", imds.url())),
        "{e}"
    );
    assert_eq!(
        targets(&imds.requests()),
        ["PUT /latest/api/token"],
        "one request, no retry"
    );

    // Nothing listens there.
    let gone = format!("http://127.0.0.1:{}", closed_port());
    let env = [
        ("AWS_EC2_METADATA_DISABLED", "false"),
        ("AWS_METADATA_ENDPOINT", gone.as_str()),
    ];
    let e = assert_one_line_error(
        &s3_cli(home.path(), "s3://vols/x", &env, &list),
        "no credentials, no metadata service",
    );
    assert!(
        e.contains(&gone) && e.to_lowercase().contains("connection refused"),
        "{e}"
    );
}

/// The instance metadata stub of an instance whose role has MinIO's keys.
fn instance_with_role(key: String, secret: String) -> HttpStub {
    HttpStub::start(move |r| {
        const ROLES: &str = "/latest/meta-data/iam/security-credentials/";
        match (r.method.as_str(), r.target.as_str()) {
            ("PUT", "/latest/api/token") => StubReply::new(200, "OK", "stub-token"),
            (_, _) if r.header("x-aws-ec2-metadata-token") != Some("stub-token") => {
                StubReply::new(401, "Unauthorized", "")
            }
            ("GET", ROLES) => StubReply::new(200, "OK", "strata-test-role"),
            ("GET", t) if t == format!("{ROLES}strata-test-role") => {
                let creds = serde_json::json!({
                    "Code": "Success",
                    "AccessKeyId": key,
                    "SecretAccessKey": secret,
                    "Token": "",
                    "Expiration": "2099-01-01T00:00:00Z",
                });
                StubReply::new(200, "OK", &creds.to_string())
            }
            _ => StubReply::new(404, "Not Found", ""),
        }
    })
}

/// With no keys but an instance role, strata uses the role's credentials
/// from the metadata service it was told of (object_store fetches them
/// from the same endpoint after strata's check).
#[test]
fn the_instance_role_is_used_when_there_are_no_keys() {
    let s3 = S3Store::on_shared("role");
    let env: std::collections::HashMap<_, _> = s3.env.iter().cloned().collect();
    let imds = instance_with_role(
        env["AWS_ACCESS_KEY_ID"].clone(),
        env["AWS_SECRET_ACCESS_KEY"].clone(),
    );
    let home = tempfile::TempDir::new().unwrap();
    let store = format!("{}?endpoint={}", s3.url(), s3.endpoint);
    let imds_url = imds.url();
    let metadata = [
        ("AWS_EC2_METADATA_DISABLED", "false"),
        ("AWS_METADATA_ENDPOINT", imds_url.as_str()),
        ("AWS_REGION", "us-east-1"),
    ];
    let out = s3_cli(
        home.path(),
        &store,
        &metadata,
        &["volume", "create", "v", "--size", "1MiB"],
    );
    ok(&out, "volume create with the instance role");
    let listed = ok(
        &s3_cli(home.path(), &store, &metadata, &["volume", "list"]),
        "list",
    );
    assert!(listed.contains('v'), "{listed}");
    let asked = targets(&imds.requests());
    assert!(
        asked
            .iter()
            .any(|t| t.ends_with("security-credentials/strata-test-role")),
        "object_store did not fetch the role's credentials from the stub: {asked:?}"
    );
}

/// A key S3 does not know, a wrong secret, a missing bucket: one line that
/// says which, and no retry (STRATA_LOG=warn shows every retry as a line,
/// so one line means none).
#[test]
fn s3_refusals_are_one_line_and_never_retried() {
    let s3 = S3Store::on_shared("refusals");
    let env: std::collections::HashMap<_, _> = s3.env.iter().cloned().collect();
    let home = tempfile::TempDir::new().unwrap();
    let store = format!("{}?endpoint={}", s3.url(), s3.endpoint);
    let key = env["AWS_ACCESS_KEY_ID"].as_str();
    let secret = env["AWS_SECRET_ACCESS_KEY"].as_str();
    let cases = [
        (
            key,
            "not-the-secret",
            store.clone(),
            "does not belong to its access key ID",
        ),
        (
            "NOSUCHKEY",
            secret,
            store.clone(),
            "does not know the access key ID",
        ),
        (
            key,
            secret,
            format!("s3://no-such-bucket-14?endpoint={}", s3.endpoint),
            "bucket \"no-such-bucket-14\" does not exist",
        ),
    ];
    for (key, secret, store, says) in cases {
        let env = [
            ("AWS_ACCESS_KEY_ID", key),
            ("AWS_SECRET_ACCESS_KEY", secret),
            ("AWS_REGION", "us-east-1"),
            ("STRATA_LOG", "warn"),
        ];
        for args in [
            &["volume", "list"][..],
            &["volume", "info", "v"],
            &["volume", "create", "v", "--size", "1MiB"],
        ] {
            let what = format!("{says} ({})", args.join(" "));
            let e = assert_one_line_error(&s3_cli(home.path(), &store, &env, args), &what);
            assert!(e.contains(says), "{what}: {e}");
            assert!(!e.contains("attempts over"), "{what}: retried: {e}");
        }
    }
}

/// An S3 service that denies everything (a stub: MinIO's root user is
/// allowed everything): the request log shows each command sent one
/// request. One that answers 503 is retried, up to --store-attempts.
#[test]
fn a_denied_request_is_sent_once_and_a_busy_store_is_retried() {
    const DENIED: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>AccessDenied</Code><Message>Access Denied.</Message></Error>";
    let denying = HttpStub::start(|_| StubReply::new(403, "Forbidden", DENIED));
    let home = tempfile::TempDir::new().unwrap();
    let keys = [
        ("AWS_ACCESS_KEY_ID", "strata-e2e"),
        ("AWS_SECRET_ACCESS_KEY", "strata-e2e"),
    ];
    let store = format!("s3://vols/x?endpoint={}", denying.url());
    for args in [&["volume", "list"][..], &["volume", "info", "v"]] {
        let before = denying.requests().len();
        let e = assert_one_line_error(
            &s3_cli(home.path(), &store, &keys, args),
            &format!("denied {}", args.join(" ")),
        );
        assert!(
            e.contains("denies the credentials from the environment access to bucket \"vols\"")
                && e.contains("403 AccessDenied: Access Denied."),
            "{e}"
        );
        let sent = &denying.requests()[before..];
        assert_eq!(sent.len(), 1, "retried: {:?}", targets(sent));
    }

    const SLOW_DOWN: &str =
        "<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>";
    let busy = HttpStub::start(|_| StubReply::new(503, "Service Unavailable", SLOW_DOWN));
    let store = format!("s3://vols/x?endpoint={}", busy.url());
    let e = assert_one_line_error(
        &s3_cli(
            home.path(),
            &store,
            &keys,
            &["--store-attempts", "3", "volume", "list"],
        ),
        "busy store",
    );
    assert!(
        e.contains(&format!(
            "{} (bucket \"vols\") answered 503 Service Unavailable",
            busy.url()
        )) && e.contains("3 attempts over"),
        "{e}"
    );
    assert_eq!(busy.requests().len(), 3, "{:?}", targets(&busy.requests()));
}

/// Nothing listens at the endpoint: after the retries, one line naming the
/// endpoint and the bucket.
#[test]
fn an_unreachable_endpoint_is_one_line_after_the_retries() {
    let home = tempfile::TempDir::new().unwrap();
    let endpoint = format!("http://127.0.0.1:{}", closed_port());
    let store = format!("s3://vols/x?endpoint={endpoint}");
    let keys = [
        ("AWS_ACCESS_KEY_ID", "strata-e2e"),
        ("AWS_SECRET_ACCESS_KEY", "strata-e2e"),
    ];
    for args in [
        &["--store-attempts", "3", "volume", "list"][..],
        &["--store-attempts", "3", "volume", "info", "v"],
    ] {
        let e = assert_one_line_error(
            &s3_cli(home.path(), &store, &keys, args),
            &format!("unreachable, {}", args.join(" ")),
        );
        assert!(
            e.contains(&format!("cannot connect to {endpoint} (bucket \"vols\")")),
            "{e}"
        );
        assert!(e.contains("3 attempts over"), "{e}");
    }
}

/// Waits until `p` printed `ready` (`true`) or exited (`false`).
fn ready_or_exit(p: &mut BgProcess) -> bool {
    let t0 = std::time::Instant::now();
    loop {
        if p.stdout().lines().any(|l| l.trim() == "ready") {
            return true;
        }
        if p.try_status().is_some() {
            return false;
        }
        assert!(
            t0.elapsed() < READY_TIMEOUT,
            "{}: neither ready nor exited: {}",
            p.name,
            p.stderr()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `strata serve` on a store where another host serves one volume: its
/// URI lines and `ready` list only the volume it serves, the other is
/// named with the reason; `serve --volume` of the held one, a second
/// server on the same data directory and an encrypted volume without its
/// key exit non-zero with one line, the volume named once.
#[test]
fn serve_lists_only_what_it_serves() {
    let _serial = serial();
    require_tools(&["nbdinfo"]);
    let tmp = tempfile::TempDir::new().unwrap();
    let mut first = Server::start(tmp.path(), Target::strata(), &[("held", 64 * MIB)]);
    let store = first.store_dir();
    let admin = tmp.path().join("admin-host");
    let cli = |args: &[&str]| strata_cli(&store, &admin, args);
    ok(
        &cli(&["volume", "create", "free", "--size", "32MiB"]),
        "create free",
    );

    let sock = tmp.path().join("second.sock");
    let serve_args = |data_dir: &Path, extra: &[&str]| {
        let mut c = strata_command(None, &[]);
        c.arg("--store")
            .arg(&store)
            .arg("--data-dir")
            .arg(data_dir)
            .arg("serve")
            .arg("--listen")
            .arg(format!("unix:{}", sock.display()))
            .args(extra);
        c
    };
    let mut second = BgProcess::spawn(
        "second host",
        &mut serve_args(&tmp.path().join("second-host"), &[]),
    );
    assert!(ready_or_exit(&mut second), "{}", second.stderr());
    let printed = second.stdout();
    assert_eq!(
        printed.lines().collect::<Vec<_>>(),
        [nbd_uri(&sock, "free").as_str(), "ready"],
        "stdout lists only what is served"
    );
    let err = second.stderr();
    assert!(
        err.contains("cannot serve: volume \"held\" is being served by"),
        "the held volume is not named with the reason:\n{err}"
    );
    assert_eq!(
        nbdinfo_json(&nbd_uri(&sock, "free"))["export-size"].as_u64(),
        Some(32 * MIB)
    );
    second.kill();

    // --volume of the held volume: no `ready`, one line.
    let out = run_timeout(
        &mut serve_args(&tmp.path().join("third-host"), &["--volume", "held"]),
        Duration::from_secs(60),
    );
    let e = assert_one_line_error(&out, "serve --volume of a volume held elsewhere");
    assert!(e.contains("is being served by"), "{e}");
    assert_eq!(e.matches("\"held\"").count(), 1, "{e}");
    assert!(!stdout_str(&out).contains("ready"), "{}", stdout_str(&out));

    // A second server on the first one's data directory.
    let out = run_timeout(
        &mut serve_args(&first.data_dir(), &[]),
        Duration::from_secs(60),
    );
    let e = assert_one_line_error(&out, "serve on a data directory in use");
    assert!(
        e.contains("another strata server uses the data directory"),
        "{e}"
    );
    assert!(stdout_str(&out).is_empty(), "{}", stdout_str(&out));

    // Deleting a volume another host serves.
    let e = assert_one_line_error(&cli(&["volume", "delete", "held"]), "delete a held volume");
    assert!(e.contains("is being served by"), "{e}");
    first.stop();

    // An encrypted volume served without its key.
    let key = "7".repeat(64);
    let mut c = strata_command(None, &[("STRATA_KEY".into(), key)]);
    c.arg("--store").arg(&store).arg("--data-dir").arg(&admin);
    ok(
        &run_timeout(
            c.args(["volume", "create", "secret", "--size", "1MiB"]),
            Duration::from_secs(60),
        ),
        "create an encrypted volume",
    );
    let out = run_timeout(
        &mut serve_args(&tmp.path().join("fourth-host"), &["--volume", "secret"]),
        Duration::from_secs(60),
    );
    let e = assert_one_line_error(&out, "serve an encrypted volume without its key");
    assert_eq!(e.matches("\"secret\"").count(), 1, "{e}");
    assert!(e.contains("fingerprint"), "{e}");
}

/// Every subcommand's usual mistakes: one line each, saying what failed
/// and what to do, the exit non-zero.
#[test]
fn every_subcommand_error_is_one_line() {
    let tmp = tempfile::TempDir::new().unwrap();
    let store = tmp.path().join("store");
    let data = tmp.path().join("data");
    let file = tmp.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let cli = |args: &[&str]| strata_cli(&store, &data, args);
    ok(
        &cli(&["volume", "create", "v", "--size", "64MiB"]),
        "create v",
    );
    let f = file.display().to_string();
    let below_file = format!("{f}/below");
    let typo = tmp.path().join("stroe").display().to_string();
    let long = "x".repeat(300);
    let cases: Vec<(Vec<&str>, &str)> = vec![
        // missing volumes and snapshots
        (
            vec!["volume", "info", "nope"],
            "volume \"nope\" does not exist",
        ),
        (vec!["volume", "delete", "nope"], "does not exist"),
        (
            vec!["volume", "resize", "nope", "--size", "1GiB"],
            "does not exist",
        ),
        (vec!["volume", "flatten", "nope"], "does not exist"),
        (vec!["volume", "gc", "nope"], "does not exist"),
        (vec!["volume", "export", "nope", "-"], "does not exist"),
        (
            vec!["volume", "set-compression", "nope", "lz4"],
            "does not exist",
        ),
        (vec!["snapshot", "create", "nope@s"], "does not exist"),
        (vec!["snapshot", "list", "nope"], "does not exist"),
        (
            vec!["snapshot", "delete", "v@nosnap"],
            "has no snapshot \"nosnap\"",
        ),
        (
            vec!["snapshot", "rollback", "v@nosnap"],
            "has no snapshot \"nosnap\"",
        ),
        (
            vec!["volume", "diff", "v@a", "v@b"],
            "has no snapshot \"a\"",
        ),
        (vec!["volume", "clone", "v@nosnap", "c"], "has no snapshot"),
        (vec!["fsck", "nope"], "does not exist"),
        // bad names, sizes, values
        (
            vec!["volume", "create", "bad/name", "--size", "1GiB"],
            "may only contain",
        ),
        (
            vec!["volume", "create", "", "--size", "1GiB"],
            "1 to 64 bytes",
        ),
        (
            vec!["volume", "create", &long, "--size", "1GiB"],
            "1 to 64 bytes",
        ),
        (
            vec!["volume", "create", "z", "--size", "0"],
            "positive multiple of 512",
        ),
        (vec!["volume", "create", "z", "--size=1X"], "invalid size"),
        (
            vec!["volume", "resize", "v", "--size", "32MiB"],
            "--allow-shrink",
        ),
        (
            vec![
                "volume",
                "create",
                "z",
                "--size",
                "1GiB",
                "--compression",
                "bogus",
            ],
            "use none, lz4, zstd",
        ),
        (vec!["volume", "clone", "v", "c"], "give VOLUME@SNAPSHOT"),
        (vec!["snapshot", "create", "v"], "give VOLUME@SNAPSHOT"),
        (vec!["serve", "--create", "x"], "expected NAME=SIZE"),
        (
            vec!["serve", "--vhost-user-socket", "nope"],
            "expected EXPORT=PATH",
        ),
        (
            vec!["serve", "--vhost-user-socket", "ghost=/nonexistent/g.sock"],
            "no volume \"ghost\"",
        ),
        (
            vec!["serve", "--vhost-user-socket", "v@nope=/nonexistent/g.sock"],
            "has no snapshot \"nope\"",
        ),
        // command lines clap refuses: one line too, with the usage
        (
            vec!["snapshot", "create", "v", "s"],
            "unexpected argument 's' found; usage: strata snapshot create",
        ),
        (
            vec!["volume", "create", "--size", "1GiB"],
            "required arguments were not provided: <NAME>",
        ),
        (
            vec![
                "volume",
                "create",
                "z",
                "--size",
                "1GiB",
                "--compresion",
                "lz4",
            ],
            "a similar argument exists: '--compression'",
        ),
        (
            vec!["--log-format", "xml", "volume", "list"],
            "[possible values: text, json]",
        ),
        (
            vec!["serve", "--listen", "bogus:addr"],
            "expected unix:PATH or [tcp:]IP:PORT",
        ),
        (
            vec!["serve", "--volume", "nope"],
            "volume \"nope\" does not exist",
        ),
        // files
        (
            vec!["volume", "import", "/nonexistent/file", "w"],
            "/nonexistent/file",
        ),
        (
            vec!["volume", "import-diff", "/nonexistent/file", "v"],
            "/nonexistent/file",
        ),
        (
            vec!["volume", "export", "v", "/nonexistent/dir/out"],
            "/nonexistent/dir/out",
        ),
        (
            vec!["key", "fingerprint"],
            "use --key-file FILE or STRATA_KEY",
        ),
        (vec!["key", "generate", &f], "already exists"),
        (
            vec!["volume", "rekey", "v", "--new-key-file", "/nonexistent/key"],
            "/nonexistent/key",
        ),
        // stores: missing, not a directory, bad URLs
        (
            vec!["--store", &typo, "volume", "list"],
            "does not exist: check --store",
        ),
        (
            vec!["--store", &typo, "volume", "info", "v"],
            "does not exist: check --store",
        ),
        (vec!["--store", &f, "volume", "list"], "is not a directory"),
        (vec!["store", "check", &f], "is not a directory"),
        (
            vec!["--store", "s3://Bad_Bucket", "volume", "list"],
            "bucket name \"Bad_Bucket\" is not valid",
        ),
        (vec!["--store", "s3://", "volume", "list"], "is not valid"),
        (
            vec!["--store", "s3://vols?colour=x", "volume", "list"],
            "unknown parameter \"colour\"",
        ),
        (
            vec!["--store", "s3://vols?endpoint=ftp://h", "volume", "list"],
            "must be http://HOST",
        ),
        (
            vec![
                "--store",
                "s3://vols?secret_access_key=hunter2",
                "volume",
                "list",
            ],
            "not accepted",
        ),
        (
            vec!["--store", "nosuch://x", "volume", "list"],
            "scheme is not supported",
        ),
        // data directory under a regular file
        (
            vec!["--data-dir", &below_file, "serve", "--volume", "v"],
            "give --data-dir",
        ),
        (
            vec!["--data-dir", &below_file, "volume", "gc", "v"],
            "give --data-dir",
        ),
    ];
    let run = |args: &[&str]| match args.first() {
        Some(&"--store") => {
            let mut c = strata_command(None, &[]);
            c.arg("--data-dir").arg(&data).args(args);
            run_timeout(&mut c, Duration::from_secs(60))
        }
        Some(&"--data-dir") => {
            let mut c = strata_command(None, &[]);
            c.arg("--store").arg(&store).args(args);
            run_timeout(&mut c, Duration::from_secs(60))
        }
        _ => cli(args),
    };
    for (args, says) in cases {
        let what = format!("strata {}", args.join(" "));
        let e = assert_one_line_error(&run(&args), &what);
        assert!(e.contains(says), "{what}: no {says:?} in: {e}");
        assert!(!e.contains("hunter2"), "{what}: a secret is echoed: {e}");
    }
    assert!(
        !tmp.path().join("stroe").exists(),
        "a read command created the mistyped store"
    );
    // No --store: the default store is in the data directory, so a data
    // directory that cannot hold one is what the line asks to fix.
    let mut c = strata_command(None, &[]);
    c.arg("--data-dir")
        .arg(&below_file)
        .args(["volume", "list"]);
    let e = assert_one_line_error(
        &run_timeout(&mut c, Duration::from_secs(60)),
        "volume list, default store under a regular file",
    );
    assert!(
        e.contains("cannot open the default store") && e.contains("give --data-dir"),
        "{e}"
    );
}

/// A command inside a new mount namespace where `dir` is a tmpfs mounted
/// with `options` (and filled up when `fill`): a full or read-only disk
/// without root's help (`unshare -Urm`).
fn on_tmpfs(dir: &Path, options: &str, fill: bool, cmd: &Command) -> Output {
    const SCRIPT: &str = r#"mount -t tmpfs -o "$1" none "$2" || exit 97
if [ "$3" = fill ]; then dd if=/dev/zero of="$2/fill" bs=64k 2>/dev/null; fi
shift 3; exec "$@""#;
    let mut c = Command::new("unshare");
    c.args(["-Urm", "sh", "-c", SCRIPT, "sh", options])
        .arg(dir)
        .arg(if fill { "fill" } else { "-" })
        .arg(cmd.get_program())
        .args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    let out = run_timeout(&mut c, Duration::from_secs(60));
    assert_ne!(
        out.status.code(),
        Some(97),
        "cannot mount a tmpfs in a user namespace here (`unshare -Urm` + mount); this test needs it: {}",
        stderr_str(&out)
    );
    out
}

/// A full disk and a read-only one, under the store and under the data
/// directory: one line naming the directory, and what to do.
#[test]
fn full_and_read_only_disks_are_one_line() {
    require_tools(&["unshare"]);
    let tmp = tempfile::TempDir::new().unwrap();
    let store = tmp.path().join("store");
    let mnt = tmp.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let data = tmp.path().join("data");
    ok(
        &strata_cli(&store, &data, &["volume", "create", "v", "--size", "64MiB"]),
        "create v",
    );
    let command = |store: &Path, data: &Path, args: &[&str]| {
        let mut c = strata_command(None, &[]);
        c.arg("--store")
            .arg(store)
            .arg("--data-dir")
            .arg(data)
            .args(args);
        c
    };
    let create = ["volume", "create", "w", "--size", "64MiB"];
    let serve = [
        "serve",
        "--volume",
        "v",
        "--listen",
        "unix:/nonexistent/never.sock",
    ];
    let m = mnt.display().to_string();
    for (what, options, fill, cmd, says) in [
        (
            "store on a full disk",
            "size=1m",
            true,
            command(&mnt, &data, &create),
            format!("the disk holding the store {m} is full"),
        ),
        (
            "store on a read-only disk",
            "ro",
            false,
            command(&mnt, &data, &create),
            format!("cannot write the store {m}"),
        ),
        (
            "data directory on a full disk",
            "size=1m",
            true,
            command(&store, &mnt, &serve),
            "the disk is full: free space on it".to_string(),
        ),
        (
            "data directory on a read-only disk",
            "ro",
            false,
            command(&store, &mnt, &serve),
            format!("the data directory {m} is not writable"),
        ),
    ] {
        let e = assert_one_line_error(&on_tmpfs(&mnt, options, fill, &cmd), what);
        assert!(e.contains(&says), "{what}: no {says:?} in: {e}");
    }
}
