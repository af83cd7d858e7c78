//! A test PKI made with `openssl`: a CA, a server certificate it signs for
//! 127.0.0.1 and `localhost`, a client certificate it signs, and a second,
//! unrelated CA with a client certificate of its own (what a stranger
//! presents). P-256 keys: generated instantly, and every TLS stack
//! involved (rustls, GnuTLS in QEMU and libnbd, Go in MinIO) takes them.
//!
//! Files are also laid out as GnuTLS clients want them: a directory per
//! client identity with `ca-cert.pem`, `client-cert.pem` and
//! `client-key.pem` (QEMU's `tls-creds-x509,dir=`, libnbd's
//! `tls-certificates=`).

use std::path::{Path, PathBuf};
use std::process::Command;

/// OpenSSL config of the test PKI. Two certificates rather than one
/// self-signed: webpki (rustls) refuses a certificate marked CA as the
/// server's own, and OpenSSL marks self-signed ones CA by default.
const OPENSSL_CONFIG: &str = "\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = strata test CA
[ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
[server]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1, DNS:localhost
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
[client]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
";

/// The files of a test PKI (all PEM).
#[derive(Debug, Clone)]
pub struct TestPki {
    pub ca_cert: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    /// A GnuTLS client directory: our CA, a client certificate it signed.
    pub client_dir: PathBuf,
    /// Our CA only (a client with no certificate of its own).
    pub anonymous_dir: PathBuf,
    /// Our CA, and a client certificate from another CA.
    pub stranger_dir: PathBuf,
    /// A directory trusting only the other CA (the server looks forged).
    pub other_ca_dir: PathBuf,
}

impl TestPki {
    /// Generates everything under `dir` (created if missing). Panics with openssl's message if
    /// it fails (it is installed by `scripts/test`).
    pub fn generate(dir: &Path) -> TestPki {
        if let Err(e) = std::fs::create_dir_all(dir) {
            panic!("creating {}: {e}", dir.display());
        }
        let config = dir.join("openssl.cnf");
        write(&config, OPENSSL_CONFIG);
        let ca = Ca::new(dir, "ca", "/CN=strata test CA", &config);
        let other = Ca::new(dir, "other-ca", "/CN=someone else's CA", &config);
        let (server_cert, server_key) = ca.sign(dir, "server", "/CN=127.0.0.1", "server");
        let (client_cert, client_key) = ca.sign(dir, "client", "/CN=strata test client", "client");
        let (stranger_cert, stranger_key) = other.sign(dir, "stranger", "/CN=stranger", "client");
        let client_dir = gnutls_dir(dir, "client", &ca.cert, Some((&client_cert, &client_key)));
        let anonymous_dir = gnutls_dir(dir, "anonymous", &ca.cert, None);
        let stranger_dir = gnutls_dir(
            dir,
            "stranger",
            &ca.cert,
            Some((&stranger_cert, &stranger_key)),
        );
        let other_ca_dir = gnutls_dir(
            dir,
            "other-ca",
            &other.cert,
            Some((&client_cert, &client_key)),
        );
        TestPki {
            ca_cert: ca.cert,
            server_cert,
            server_key,
            client_dir,
            anonymous_dir,
            stranger_dir,
            other_ca_dir,
        }
    }
}

struct Ca {
    cert: PathBuf,
    key: PathBuf,
    config: PathBuf,
}

impl Ca {
    fn new(dir: &Path, name: &str, subject: &str, config: &Path) -> Ca {
        let cert = dir.join(format!("{name}.crt"));
        let key = dir.join(format!("{name}.key"));
        openssl(
            Command::new("openssl")
                .args([
                    "req",
                    "-x509",
                    "-extensions",
                    "ca",
                    "-days",
                    "30",
                    "-subj",
                    subject,
                ])
                .args(EC_KEY)
                .arg("-config")
                .arg(config)
                .arg("-keyout")
                .arg(&key)
                .arg("-out")
                .arg(&cert),
        );
        Ca {
            cert,
            key,
            config: config.to_path_buf(),
        }
    }

    /// A certificate for `subject` with the `extensions` section, signed
    /// by this CA: (certificate, key).
    fn sign(&self, dir: &Path, name: &str, subject: &str, extensions: &str) -> (PathBuf, PathBuf) {
        let key = dir.join(format!("{name}.key"));
        let csr = dir.join(format!("{name}.csr"));
        let cert = dir.join(format!("{name}.crt"));
        openssl(
            Command::new("openssl")
                .args(["req", "-new", "-subj", subject])
                .args(EC_KEY)
                .arg("-config")
                .arg(&self.config)
                .arg("-keyout")
                .arg(&key)
                .arg("-out")
                .arg(&csr),
        );
        openssl(
            Command::new("openssl")
                .args([
                    "x509",
                    "-req",
                    "-days",
                    "30",
                    "-set_serial",
                    "2",
                    "-extensions",
                    extensions,
                ])
                .arg("-extfile")
                .arg(&self.config)
                .arg("-in")
                .arg(&csr)
                .arg("-CA")
                .arg(&self.cert)
                .arg("-CAkey")
                .arg(&self.key)
                .arg("-out")
                .arg(&cert),
        );
        (cert, key)
    }
}

const EC_KEY: [&str; 5] = [
    "-newkey",
    "ec",
    "-pkeyopt",
    "ec_paramgen_curve:prime256v1",
    "-nodes",
];

/// `<dir>/<name>/` with `ca-cert.pem` and, if given, `client-cert.pem` +
/// `client-key.pem`.
fn gnutls_dir(dir: &Path, name: &str, ca: &Path, client: Option<(&PathBuf, &PathBuf)>) -> PathBuf {
    let out = dir.join(format!("{name}-dir"));
    if let Err(e) = std::fs::create_dir_all(&out) {
        panic!("creating {}: {e}", out.display());
    }
    copy(ca, &out.join("ca-cert.pem"));
    if let Some((cert, key)) = client {
        copy(cert, &out.join("client-cert.pem"));
        copy(key, &out.join("client-key.pem"));
    }
    out
}

fn write(path: &Path, text: &str) {
    if let Err(e) = std::fs::write(path, text) {
        panic!("writing {}: {e}", path.display());
    }
}

fn copy(from: &Path, to: &Path) {
    if let Err(e) = std::fs::copy(from, to) {
        panic!("copying {} to {}: {e}", from.display(), to.display());
    }
}

pub(crate) fn openssl(cmd: &mut Command) {
    match cmd.output() {
        Ok(out) if out.status.success() => {}
        Ok(out) => panic!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => panic!("cannot run openssl (scripts/test installs it): {e}"),
    }
}
