//! Single-node MinIO over https with the harness's test CA.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use strata_testkit::MinioServer;

#[test]
fn tls_server_round_trips_an_object() {
    let server = MinioServer::start_tls();
    assert_eq!(
        server.endpoint(),
        format!("https://127.0.0.1:{}", server.port())
    );
    let ca = server.ca_cert().expect("TLS server has a CA").to_path_buf();

    let env: std::collections::HashMap<String, String> = server.client_env().into_iter().collect();
    assert_eq!(
        env.get("AWS_CA_BUNDLE").map(String::as_str),
        Some(ca.to_str().unwrap())
    );
    assert_eq!(env["AWS_ENDPOINT_URL"], server.endpoint());

    let bucket = server.fresh_bucket();
    let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    server.put_object(&bucket, "tls/object", &data);
    assert!(
        server.get_object(&bucket, "tls/object") == data,
        "object changed over https"
    );
}

#[test]
fn tls_certificate_verifies_only_with_the_test_ca() {
    let server = MinioServer::start_tls();
    let ca = server.ca_cert().unwrap();
    let url = format!("{}/minio/health/cluster", server.endpoint());
    let status = |extra: &[&str]| {
        let out = Command::new("curl")
            .args([
                "-sS",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "--max-time",
                "10",
            ])
            .args(extra)
            .arg(&url)
            .output()
            .unwrap();
        (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = status(&["--cacert", ca.to_str().unwrap()]);
    assert_eq!(code, "200", "health over https with the CA: {err}");
    // Also by name: the certificate covers localhost.
    let by_name = url.replace("127.0.0.1", "localhost");
    let out = Command::new("curl")
        .args([
            "-sS",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "10",
            "--cacert",
        ])
        .arg(ca)
        .arg(&by_name)
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "200",
        "{by_name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Without it the system trust store must refuse the certificate.
    let (code, err) = status(&["--cacert", "/etc/ssl/certs/ca-certificates.crt"]);
    assert_eq!(
        code, "000",
        "certificate accepted without the test CA: {err}"
    );
}

/// What a client's ALPN offer gets from this MinIO: it lists http/1.1 before
/// h2 and Go picks by the server's order, so a client offering both gets
/// HTTP/1.1 and only an h2-only offer (reqwest's `http2_prior_knowledge`)
/// gets HTTP/2. Pinned here because client tests that expect HTTP/2 over TLS
/// depend on it.
#[test]
fn tls_server_negotiates_h2_only_when_offered_alone() {
    let server = MinioServer::start_tls();
    let ca = server.ca_cert().unwrap();
    let alpn = |offer: &str| {
        let out = Command::new("openssl")
            .args([
                "s_client",
                "-connect",
                &format!("127.0.0.1:{}", server.port()),
                "-alpn",
                offer,
            ])
            .arg("-CAfile")
            .arg(ca)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            text.contains("Verify return code: 0 (ok)"),
            "TLS handshake failed for ALPN {offer}:\n{text}"
        );
        text.lines()
            .find_map(|l| l.strip_prefix("ALPN protocol: "))
            .map(str::to_owned)
            .unwrap_or_else(|| panic!("no ALPN protocol selected for offer {offer}:\n{text}"))
    };
    assert_eq!(alpn("h2"), "h2");
    assert_eq!(alpn("h2,http/1.1"), "http/1.1");
}
