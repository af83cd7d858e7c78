//! `strata serve --tls*`: a volume served over NBD with TLS to real
//! clients (nbdcopy in and out over `nbds://` and `nbds+unix://`, qemu-io
//! through `tls-creds-x509`), the URIs the server prints, and the errors
//! for bad TLS arguments. The protocol's policy (refusals before TLS,
//! client certificates) is tested against the server core in
//! `crates/nbd-server/tests/tls.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::process::Command;

use common::*;
use strata_testkit::TestPki;

const VOL: u64 = 64 * MIB;

#[test]
fn a_volume_is_served_over_tls_to_nbdcopy_and_qemu() {
    require_tools(&["nbdcopy", "nbdinfo", "qemu-io", "openssl"]);
    let _serial = serial();
    let tmp = tempfile::TempDir::new().unwrap();
    let pki = TestPki::generate(&tmp.path().join("pki"));
    let port = free_tcp_port();
    let tcp = format!("tcp:127.0.0.1:{port}");
    let args = [
        "--tls-cert",
        pki.server_cert.to_str().unwrap(),
        "--tls-key",
        pki.server_key.to_str().unwrap(),
        "--tls-ca",
        pki.ca_cert.to_str().unwrap(),
        "--listen",
        &tcp,
    ];
    let mut server = Server::start(
        &tmp.path().join("srv"),
        Target::strata_with(&args),
        &[("vol", VOL)],
    );
    let banner = server.banner.join("\n");
    assert!(
        banner.contains("nbds+unix:///vol?socket=")
            && banner.contains(&format!("nbds://127.0.0.1:{port}/vol")),
        "{banner}"
    );
    let certs = pki.client_dir.display();
    let over_tcp = format!("nbds://127.0.0.1:{port}/vol?tls-certificates={certs}");
    let over_unix = format!(
        "nbds+unix:///vol?socket={}&tls-certificates={certs}",
        server.socket.display()
    );
    let src = tmp.path().join("src.img");
    let back = tmp.path().join("back.img");
    let mut data = vec![0u8; 8 * MIB as usize];
    Rng::new(11).fill(&mut data);
    std::fs::write(&src, &data).unwrap();
    run_ok(
        Command::new("nbdcopy").arg(&src).arg(&over_tcp),
        std::time::Duration::from_secs(60),
    );
    run_ok(
        Command::new("nbdcopy").arg(&over_unix).arg(&back),
        std::time::Duration::from_secs(60),
    );
    let back = std::fs::read(&back).unwrap();
    assert!(
        back[..data.len()] == data[..],
        "nbdcopy round trip over TLS"
    );
    assert!(back[data.len()..].iter().all(|&b| b == 0));
    let out = run_timeout(
        Command::new("qemu-io")
            .arg("--object")
            .arg(format!("tls-creds-x509,id=tls0,dir={certs},endpoint=client"))
            .arg("--image-opts")
            .arg(format!(
                "driver=nbd,server.type=unix,server.path={},tls-hostname=localhost,export=vol,tls-creds=tls0",
                server.socket.display()
            ))
            .args(["-c", "read -P 0 8M 1M", "-c", "write -P 0x3c 9M 64k", "-c", "read -P 0x3c 9M 64k"]),
        std::time::Duration::from_secs(60),
    );
    let stdout = stdout_str(&out);
    assert!(
        out.status.success() && !stdout.contains("verification failed"),
        "{stdout}{}",
        stderr_str(&out)
    );
    // Plaintext is refused, with the server's reason.
    let out = run_timeout(
        Command::new("nbdinfo").arg(server.vol_uri()),
        std::time::Duration::from_secs(30),
    );
    assert!(!out.status.success(), "plaintext nbdinfo was served");
    let log = server.stderr();
    assert!(
        log.contains("plaintext client refused: TLS is required"),
        "{log}"
    );
    server.stop();
}

#[test]
fn bad_tls_arguments_stop_the_start_with_the_reason() {
    let _serial = serial();
    let tmp = tempfile::TempDir::new().unwrap();
    let pki = TestPki::generate(&tmp.path().join("pki"));
    let cert = pki.server_cert.to_str().unwrap();
    let ca = pki.ca_cert.to_str().unwrap();
    let missing = tmp.path().join("nope.pem");
    let missing = missing.to_str().unwrap();
    let cases: [(&[&str], &str); 4] = [
        (&["--tls", "require"], "--tls needs --tls-cert"),
        (&["--tls-cert", missing, "--tls-key", cert], "nope.pem"),
        (&["--tls-cert", cert, "--tls-key", cert], "--tls-key"),
        (&["--tls-cert", cert, "--tls-key", ca], "--tls-key"),
    ];
    for (i, (args, want)) in cases.iter().enumerate() {
        let dir = tmp.path().join(format!("case{i}"));
        match Server::try_start(&dir, Target::strata_with(args), &[("vol", VOL)]) {
            Ok(mut s) => {
                s.stop();
                panic!("{args:?}: the server started");
            }
            Err((_, stderr)) => assert!(stderr.contains(want), "{args:?}: {stderr}"),
        }
    }
}
