//! TLS for NBD connections: the STARTTLS option upgrades a connection in
//! the handshake (rustls), after which options and transmission run inside
//! TLS. The policy (`TlsMode`) says whether a client may stay in
//! plaintext; certificates and keys come from PEM files.
//!
//! rustls rather than OpenSSL or GnuTLS bindings: memory-safe, no system
//! library to match, already what the S3 client uses. It has no external
//! pre-shared keys (TLS-PSK, as qemu-nbd and nbdkit offer through GnuTLS):
//! rustls/rustls#174 is open, and the client-side PR #2524 was closed
//! unmerged in 2025; so strata serves X.509 certificates only.

use std::io;
use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;
use tokio_rustls::TlsAcceptor;

/// Whether clients must use TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsMode {
    /// Clients may negotiate TLS or stay in plaintext.
    Optional,
    /// Every option but STARTTLS and ABORT is refused before TLS
    /// (`NBD_REP_ERR_TLS_REQD`; NBD_OPT_EXPORT_NAME closes the connection),
    /// so a client cannot be talked into plaintext.
    Require,
}

/// A server's TLS: its acceptor (certificate, key, client verification)
/// and its policy.
#[derive(Clone)]
pub struct Tls {
    pub(crate) acceptor: TlsAcceptor,
    pub(crate) mode: TlsMode,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").field("mode", &self.mode).finish()
    }
}

impl Tls {
    /// TLS from an existing rustls configuration.
    pub fn new(config: Arc<rustls::ServerConfig>, mode: TlsMode) -> Tls {
        Tls {
            acceptor: TlsAcceptor::from(config),
            mode,
        }
    }

    /// TLS from PEM files: the server's certificate chain and private key
    /// and, if given, the CA whose certificates clients must present.
    /// Errors name the file and what is wrong with it.
    pub fn from_pem_files(
        cert: &Path,
        key: &Path,
        client_ca: Option<&Path>,
        mode: TlsMode,
    ) -> io::Result<Tls> {
        let chain = read_certs(cert, "--tls-cert")?;
        let key = PrivateKeyDer::from_pem_file(key).map_err(|e| {
            invalid(format!(
                "--tls-key {}: no private key read ({e}); give a PEM file with a PKCS#8, RSA or EC private key",
                key.display()
            ))
        })?;
        let provider = Arc::new(provider_preferring_aes128());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| invalid(format!("TLS protocol versions: {e}")))?;
        let builder = match client_ca {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let mut roots = RootCertStore::empty();
                for c in read_certs(ca, "--tls-ca")? {
                    roots.add(c).map_err(|e| {
                        invalid(format!(
                            "--tls-ca {}: not a CA certificate: {e}",
                            ca.display()
                        ))
                    })?;
                }
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                        .build()
                        .map_err(|e| invalid(format!("--tls-ca {}: {e}", ca.display())))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut config = builder.with_single_cert(chain, key).map_err(|e| {
            invalid(format!(
                "--tls-cert {} and --tls-key: {e} (do they belong together?)",
                cert.display()
            ))
        })?;
        config.ignore_client_order = true;
        Ok(Tls::new(Arc::new(config), mode))
    }

    pub fn mode(&self) -> TlsMode {
        self.mode
    }
}

/// ring's suites with AES-128-GCM first, which the server then picks
/// over the client's order: clients (GnuTLS in QEMU and libnbd) ask for
/// AES-256-GCM first, and a single connection's sequential reads are
/// bound by the client's decryption on small machines; AES-128 is what
/// TLS 1.3 mandates and is secure.
fn provider_preferring_aes128() -> rustls::crypto::CryptoProvider {
    let mut provider = rustls::crypto::ring::default_provider();
    let rank = |suite: &rustls::SupportedCipherSuite| {
        let name = format!("{:?}", suite.suite());
        (!name.contains("AES_128_GCM"), !name.starts_with("TLS13"))
    };
    provider.cipher_suites.sort_by_key(rank);
    provider
}

fn read_certs(path: &Path, flag: &str) -> io::Result<Vec<CertificateDer<'static>>> {
    let certs: Result<Vec<_>, _> = CertificateDer::pem_file_iter(path)
        .map_err(|e| invalid(format!("{flag} {}: {e}", path.display())))?
        .collect();
    let certs = certs.map_err(|e| invalid(format!("{flag} {}: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(invalid(format!(
            "{flag} {}: no certificate in it (a PEM file with \"-----BEGIN CERTIFICATE-----\")",
            path.display()
        )));
    }
    Ok(certs)
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, message)
}
