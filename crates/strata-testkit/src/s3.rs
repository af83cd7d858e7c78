//! The few HTTP requests the harness itself makes: health probes and signed
//! S3 bucket and object requests.
//!
//! This module owns talking to the test stores (MinIO, SeaweedFS) from the harness. It shells out to curl
//! (SigV4 through `--aws-sigv4`, TLS through `--cacert`) rather than pulling
//! an HTTP client, TLS stack and signer into the test dependencies: the
//! harness makes a handful of requests per test, and curl is how a person
//! would reproduce them by hand.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use crate::{ACCESS_KEY, REGION, SECRET_KEY};

/// Seconds one S3 request may take. Generous: right after a cluster node is
/// killed, MinIO may wait on it for a while before marking it offline.
const REQUEST_TIMEOUT_SECS: &str = "120";

/// HTTP status of `GET url`, or `None` when nothing answered (refused,
/// timed out, TLS failure).
pub(crate) fn http_status(url: &str, ca: Option<&Path>) -> Option<u16> {
    let mut cmd = Command::new("curl");
    cmd.args([
        "-sS",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "--max-time",
        "2",
    ]);
    if let Some(ca) = ca {
        cmd.arg("--cacert").arg(ca);
    }
    let out = cmd
        .arg(url)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    // curl prints 000 when it got no response at all.
    match String::from_utf8_lossy(&out.stdout).trim().parse::<u16>() {
        Ok(0) | Err(_) => None,
        Ok(code) => Some(code),
    }
}

/// The body of `GET url` when it answers 200, `None` otherwise (unsigned:
/// for admin endpoints such as SeaweedFS's master status).
pub(crate) fn http_body(url: &str, ca: Option<&Path>) -> Option<String> {
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "--fail", "--max-time", "5"]);
    if let Some(ca) = ca {
        cmd.arg("--cacert").arg(ca);
    }
    let out = cmd
        .arg(url)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A signed S3 request with curl; the response body on a 2xx answer, else a
/// message with curl's error and MinIO's error body.
pub(crate) fn request(
    endpoint: &str,
    ca: Option<&Path>,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
) -> Result<Vec<u8>, String> {
    let url = format!("{endpoint}/{path}");
    let mut cmd = Command::new("curl");
    cmd.args([
        "-sS",
        "--fail-with-body",
        "--max-time",
        REQUEST_TIMEOUT_SECS,
    ])
    .arg("--aws-sigv4")
    .arg(format!("aws:amz:{REGION}:s3"))
    .arg("--user")
    .arg(format!("{ACCESS_KEY}:{SECRET_KEY}"))
    .arg("-X")
    .arg(method);
    if let Some(ca) = ca {
        cmd.arg("--cacert").arg(ca);
    }
    // curl 7.88 signs a body's hash without sending it as
    // x-amz-content-sha256, which MinIO then rejects (SignatureDoesNotMatch)
    // and versitygw refuses even without a body ("Missing required header");
    // declaring the payload unsigned is what S3 clients do over TLS, and
    // GET-after-PUT compares bytes anyway.
    cmd.args(["-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD"]);
    if body.is_some() {
        // --data-binary, not -T: it sends a Content-Length, which an S3 PUT
        // needs.
        cmd.args([
            "--data-binary",
            "@-",
            "-H",
            "Content-Type: application/octet-stream",
        ]);
    }
    cmd.arg(&url)
        .stdin(if body.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|e| format!("cannot run curl: {e}"))?;
    if let (Some(body), Some(mut stdin)) = (body, child.stdin.take()) {
        // Written before reading the output: curl reads all of @- before it
        // sends anything, so this cannot deadlock on a full pipe.
        stdin
            .write_all(body)
            .map_err(|e| format!("{method} {url}: writing the body to curl: {e}"))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("{method} {url}: waiting for curl: {e}"))?;
    if out.status.success() {
        Ok(out.stdout)
    } else {
        Err(format!(
            "{method} {url} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim(),
            String::from_utf8_lossy(&out.stdout)
        ))
    }
}

/// Creates `bucket`, panicking with MinIO's answer on failure.
pub(crate) fn create_bucket(endpoint: &str, ca: Option<&Path>, bucket: &str) {
    if let Err(e) = request(endpoint, ca, "PUT", bucket, None) {
        panic!("creating bucket {bucket:?}: {e}");
    }
}

/// Attempts of an object request that MinIO answers 503 (SlowDown while a
/// node of a cluster is down or back, as any S3 client retries it).
const SLOW_DOWN_ATTEMPTS: u32 = 40;
const SLOW_DOWN_DELAY: std::time::Duration = std::time::Duration::from_millis(250);

/// `request`, retried while the answer is a 503 (at most ~10 s).
fn request_retrying(
    endpoint: &str,
    ca: Option<&Path>,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
) -> Result<Vec<u8>, String> {
    let mut attempt = 1;
    loop {
        match request(endpoint, ca, method, path, body) {
            Err(e) if e.contains("error: 503") && attempt < SLOW_DOWN_ATTEMPTS => {
                attempt += 1;
                std::thread::sleep(SLOW_DOWN_DELAY);
            }
            result => return result,
        }
    }
}

/// Stores `data` at `bucket/key`, panicking with MinIO's answer on failure.
pub(crate) fn put_object(endpoint: &str, ca: Option<&Path>, bucket: &str, key: &str, data: &[u8]) {
    if let Err(e) = request_retrying(endpoint, ca, "PUT", &format!("{bucket}/{key}"), Some(data)) {
        panic!("putting object {bucket}/{key}: {e}");
    }
}

/// The bytes at `bucket/key`, panicking with MinIO's answer on failure.
pub(crate) fn get_object(endpoint: &str, ca: Option<&Path>, bucket: &str, key: &str) -> Vec<u8> {
    match request_retrying(endpoint, ca, "GET", &format!("{bucket}/{key}"), None) {
        Ok(data) => data,
        Err(e) => panic!("getting object {bucket}/{key}: {e}"),
    }
}
