//! What `--store s3://bucket/prefix` means: parsing, credentials, client.
//!
//! Owns the translation from what a user typed and has in their environment
//! into an `object_store` S3 client:
//!
//! - URL: `s3://BUCKET[/PREFIX][?endpoint=URL&region=REGION&addressing=path|virtual]`.
//!   Query parameters carry only non-secret settings; a credential in the
//!   URL is refused (process arguments are visible to every local user).
//! - Endpoint: `endpoint=`, `AWS_ENDPOINT_URL` or object_store's
//!   `AWS_ENDPOINT`; none means AWS S3. An
//!   `http://` endpoint allows plain HTTP (the user typed it).
//! - Region: `region=`, `AWS_REGION`, `AWS_DEFAULT_REGION`, else us-east-1.
//! - Addressing: path-style when an endpoint is given (MinIO, Ceph RGW,
//!   Garage), virtual-hosted for AWS; `addressing=` overrides.
//! - Credentials, first found (`credential_source.rs`): the environment,
//!   the shared credentials file, web identity, the instance's role from
//!   the instance metadata service when it is to be asked
//!   (`instance_metadata.rs`; whatever the endpoint, e.g. an S3 VPC
//!   endpoint). None found is an error at once that says where strata
//!   looked. They are never logged: [`S3Config`]'s `Debug` and description
//!   omit them.
//! - TLS: `AWS_CA_BUNDLE` names a PEM file of extra trusted certificates.
//! - HTTP version: `http=auto` (default), `http=1.1` or `http=2`.
//! - Payload signing: `payload=auto` (default: signed over `http://`,
//!   unsigned over `https://`), `payload=signed` or `payload=unsigned`.
//!   SigV4 with a signed payload hashes every byte uploaded (SHA-256: 9-10%
//!   of the server's CPU under a random-write load on MinIO, and the server
//!   hashes it again to check). Over TLS the body's integrity in transit is
//!   TLS's job, so `auto` leaves it unsigned there, as the AWS SDKs do;
//!   over plain HTTP the signature is the only thing that checks it.
//!   Either way every chunk is checked against its segment's CRC when read.
//!
//! The client reuses connections (a pool per host) and has connect and
//! request timeouts. HTTP/2 is used when the server offers it: servers that
//! offer both in TLS ALPN may still pick HTTP/1.1 by their own preference
//! order (MinIO does), so `auto` first probes an `https://` endpoint with
//! HTTP/2 alone and keeps it if a response came back over HTTP/2, else
//! falls back to HTTP/1.1 (AWS S3 has no HTTP/2). Plain `http://` is
//! HTTP/1.1: no S3 server tested speaks cleartext HTTP/2. Every response's
//! version is counted (`counting_http_connector.rs`), so this is verified,
//! not assumed. Retries are left to the retry layer
//! (`retrying_object_store.rs`), one policy for every backend.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use object_store::aws::AmazonS3Builder;
use object_store::{Certificate, ClientOptions, ObjectStore, RetryConfig};

use crate::counting_http_connector::{CountingHttpConnector, HttpVersionCounts};
use crate::credential_source::{not_found, read_bounded, CredentialSource};
use crate::explaining_object_store::StorePlace;
use crate::instance_metadata::{looks_like_ec2, InstanceMetadata};

/// How long establishing a TCP (+TLS) connection may take.
const CONNECT_TIMEOUT_MS: u64 = 5_000;
/// How long one request may take, body included (a 16 MiB segment PUT at
/// 10 MB/s fits).
const REQUEST_TIMEOUT_MS: u64 = 60_000;
const MAX_CA_BUNDLE_BYTES: u64 = 4 << 20;

/// A parsed `s3://` store specification.
#[derive(Clone, PartialEq, Eq)]
pub struct S3Config {
    pub bucket: String,
    /// Object name prefix inside the bucket, without slashes at either end.
    pub prefix: String,
    pub endpoint: Option<String>,
    pub region: String,
    pub virtual_hosted: bool,
    pub credentials: CredentialSource,
    pub ca_bundle: Option<PathBuf>,
    pub http: HttpMode,
    /// `Some(true)`: sign the payload; `None`: unsigned over https only.
    pub payload_signed: Option<bool>,
}

/// Which HTTP version the client speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HttpMode {
    /// HTTP/2 if an `https://` server answers it, else HTTP/1.1.
    Auto,
    Http1,
    Http2,
}

impl fmt::Debug for S3Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}

impl S3Config {
    /// Parses `spec` (an `s3://` URL), reading settings from `env`.
    pub fn parse(spec: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<S3Config, String> {
        let url = url::Url::parse(spec).map_err(|e| format!("not a valid URL: {e}"))?;
        let bucket = url.host_str().unwrap_or_default().to_string();
        validate_bucket(&bucket)?;
        let prefix = url.path().trim_matches('/').to_string();
        // The AWS SDKs' name first, then object_store's: a user who set
        // either expects it to be used, not a silent fall-back to AWS.
        let mut endpoint = ["AWS_ENDPOINT_URL", "AWS_ENDPOINT"]
            .iter()
            .find_map(|k| env(k).filter(|s| !s.is_empty()));
        let mut region = env("AWS_REGION")
            .or_else(|| env("AWS_DEFAULT_REGION"))
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "us-east-1".to_string());
        let mut addressing: Option<bool> = None;
        let mut http = HttpMode::Auto;
        let mut payload_signed = None;
        for (key, value) in url.query_pairs() {
            match key.as_ref() {
                "endpoint" => endpoint = Some(value.into_owned()),
                "region" => region = value.into_owned(),
                "addressing" => addressing = Some(parse_addressing(&value)?),
                "http" => http = parse_http(&value)?,
                "payload" => payload_signed = parse_payload(&value)?,
                k if is_secret_key(k) => {
                    return Err(format!(
                        "credentials are not accepted in the store URL ({k}=...): process arguments are visible to every user of this machine; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the environment or write them to ~/.aws/credentials"
                    ))
                }
                k => {
                    return Err(format!(
                        "unknown parameter {k:?} in the store URL; known: endpoint, region, addressing, http, payload"
                    ))
                }
            }
        }
        if let Some(e) = &endpoint {
            validate_endpoint(e)?;
        }
        let credentials = CredentialSource::find(env, &looks_like_ec2)?;
        Ok(S3Config {
            bucket,
            prefix,
            virtual_hosted: addressing.unwrap_or(endpoint.is_none()),
            endpoint,
            region,
            credentials,
            ca_bundle: env("AWS_CA_BUNDLE")
                .filter(|s| !s.is_empty())
                .map(PathBuf::from),
            http,
            payload_signed,
        })
    }

    /// Whether uploads sign their payload (`payload=`; auto: over plain
    /// HTTP only).
    pub fn signs_payload(&self) -> bool {
        self.payload_signed.unwrap_or(!self.is_https())
    }

    /// A description for messages: never contains credentials.
    pub fn describe(&self) -> String {
        let mut s = format!("s3://{}", self.bucket);
        if !self.prefix.is_empty() {
            s.push('/');
            s.push_str(&self.prefix);
        }
        match &self.endpoint {
            Some(e) => s.push_str(&format!(" (endpoint {e}, region {})", self.region)),
            None => s.push_str(&format!(" (AWS, region {})", self.region)),
        }
        s
    }

    fn is_https(&self) -> bool {
        self.endpoint
            .as_deref()
            .is_none_or(|e| e.starts_with("https://"))
    }

    /// The endpoint as a person would recognise it (AWS's when none is
    /// given), for messages.
    pub fn endpoint_for_messages(&self) -> String {
        match (&self.endpoint, self.virtual_hosted) {
            (Some(e), _) => e.clone(),
            (None, true) => format!("https://{}.s3.{}.amazonaws.com", self.bucket, self.region),
            (None, false) => format!("https://s3.{}.amazonaws.com", self.region),
        }
    }

    /// Where this store is, for the messages of its failures.
    pub fn place(&self) -> StorePlace {
        let endpoint_hint = match &self.endpoint {
            Some(_) => "check the endpoint (endpoint= in the store URL, or AWS_ENDPOINT_URL) and that the S3 service runs there".to_string(),
            None => "check this machine's network access to AWS S3 over HTTPS".to_string(),
        };
        StorePlace::S3 {
            endpoint: self.endpoint_for_messages(),
            bucket: self.bucket.clone(),
            region: self.region.clone(),
            credentials: self.credentials.describe(),
            endpoint_hint,
        }
    }

    /// Builds the S3 client (the bucket root; the prefix is applied by the
    /// caller), choosing the HTTP version as the module doc says. Returns
    /// the client and whether it speaks HTTP/2. With the instance role as
    /// credentials, first checks that the metadata service has one to give
    /// (`instance_metadata.rs`).
    pub async fn connect(
        &self,
        counts: Arc<HttpVersionCounts>,
    ) -> Result<(Arc<dyn ObjectStore>, bool), String> {
        if let CredentialSource::InstanceRole { endpoint, looked } = &self.credentials {
            if let Err(why) = InstanceMetadata::role(endpoint).await {
                let mut looked = looked.clone();
                looked.push(format!("instance metadata ({why})"));
                return Err(not_found(&looked));
            }
        }
        let try_h2 = match self.http {
            HttpMode::Http1 => false,
            HttpMode::Http2 => return Ok((self.build(counts, true)?, true)),
            HttpMode::Auto => self.is_https(),
        };
        if try_h2 {
            let probe_counts = Arc::new(HttpVersionCounts::default());
            let probe = self.build(probe_counts.clone(), true)?;
            let path = object_store::path::Path::from("strata-http2-probe");
            let outcome = probe.head(&path).await;
            if probe_counts.snapshot().http2_responses > 0 {
                tracing::info!(store = %self.describe(), "the S3 endpoint speaks HTTP/2; using it");
                return Ok((self.build(counts, true)?, true));
            }
            let why = outcome
                .err()
                .map(|e| crate::error_text(&e))
                .unwrap_or_default();
            tracing::info!(store = %self.describe(), reason = %why, "the S3 endpoint did not answer HTTP/2; using HTTP/1.1");
        }
        Ok((self.build(counts, false)?, false))
    }

    fn build(
        &self,
        counts: Arc<HttpVersionCounts>,
        http2_only: bool,
    ) -> Result<Arc<dyn ObjectStore>, String> {
        let mut options = ClientOptions::new();
        options = if http2_only {
            options.with_http2_only()
        } else {
            options.with_http1_only()
        };
        let mut options = options
            .with_connect_timeout(Duration::from_millis(CONNECT_TIMEOUT_MS))
            .with_timeout(Duration::from_millis(REQUEST_TIMEOUT_MS))
            .with_pool_idle_timeout(Duration::from_secs(60));
        if let Some(path) = &self.ca_bundle {
            for cert in read_ca_bundle(path)? {
                options = options.with_root_certificate(cert);
            }
        }
        let allow_http = self
            .endpoint
            .as_deref()
            .is_some_and(|e| e.starts_with("http://"));
        let mut builder = AmazonS3Builder::new()
            .with_bucket_name(&self.bucket)
            .with_region(&self.region)
            .with_virtual_hosted_style_request(self.virtual_hosted)
            .with_client_options(options.with_allow_http(allow_http))
            .with_http_connector(CountingHttpConnector::new(counts))
            .with_unsigned_payload(!self.signs_payload())
            // One retry policy for every backend: the retry layer's.
            .with_retry(RetryConfig {
                max_retries: 0,
                ..RetryConfig::default()
            });
        if let Some(e) = &self.endpoint {
            builder = builder.with_endpoint(e);
        }
        match &self.credentials {
            CredentialSource::Keys(c) => {
                builder = builder
                    .with_access_key_id(&c.access_key_id)
                    .with_secret_access_key(&c.secret_access_key);
                if let Some(t) = &c.session_token {
                    builder = builder.with_token(t);
                }
            }
            // object_store reads AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN.
            CredentialSource::WebIdentity => {}
            CredentialSource::InstanceRole { endpoint, .. } => {
                builder = builder.with_metadata_endpoint(endpoint);
            }
        }
        let s3 = builder
            .build()
            .map_err(|e| format!("cannot configure the S3 client: {e}"))?;
        Ok(Arc::new(s3))
    }
}

/// `spec` with the values of credential-like query parameters replaced
/// by "...", for messages (a refused URL is still shown).
pub(crate) fn redact_secrets(spec: &str) -> String {
    let Some((base, query)) = spec.split_once('?') else {
        return spec.to_string();
    };
    let pairs: Vec<String> = query
        .split('&')
        .map(|pair| {
            // Judged by the key as `parse` sees it: percent-decoded.
            let secret = url::form_urlencoded::parse(pair.as_bytes())
                .next()
                .is_some_and(|(k, _)| is_secret_key(&k));
            match (secret, pair.split_once('=')) {
                (true, Some((k, _))) => format!("{k}=..."),
                _ => pair.to_string(),
            }
        })
        .collect();
    format!("{base}?{}", pairs.join("&"))
}

fn is_secret_key(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    ["key", "secret", "token", "password", "credential"]
        .iter()
        .any(|s| k.contains(s))
}

fn parse_http(value: &str) -> Result<HttpMode, String> {
    match value {
        "auto" => Ok(HttpMode::Auto),
        "1.1" | "1" => Ok(HttpMode::Http1),
        "2" => Ok(HttpMode::Http2),
        v => Err(format!("http must be auto, 1.1 or 2 (got {v:?})")),
    }
}

fn parse_payload(value: &str) -> Result<Option<bool>, String> {
    match value {
        "auto" => Ok(None),
        "signed" => Ok(Some(true)),
        "unsigned" => Ok(Some(false)),
        v => Err(format!(
            "payload must be auto, signed or unsigned (got {v:?})"
        )),
    }
}

fn parse_addressing(value: &str) -> Result<bool, String> {
    match value {
        "path" => Ok(false),
        "virtual" => Ok(true),
        v => Err(format!(
            "addressing must be \"path\" or \"virtual\" (got {v:?})"
        )),
    }
}

/// S3 bucket naming rules (the subset that matters for a URL host).
fn validate_bucket(bucket: &str) -> Result<(), String> {
    let ok_chars = bucket
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
    if bucket.len() < 3 || bucket.len() > 63 || !ok_chars {
        return Err(format!(
            "bucket name {bucket:?} is not valid: 3 to 63 characters of a-z, 0-9, '-' and '.' (use s3://BUCKET/PREFIX)"
        ));
    }
    Ok(())
}

fn validate_endpoint(endpoint: &str) -> Result<(), String> {
    let url = url::Url::parse(endpoint)
        .map_err(|e| format!("S3 endpoint {endpoint:?} is not a URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(format!(
            "S3 endpoint {endpoint:?} must be http://HOST[:PORT] or https://HOST[:PORT]"
        ));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err("credentials are not accepted in the S3 endpoint URL; use AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY".into());
    }
    Ok(())
}

fn read_ca_bundle(path: &std::path::Path) -> Result<Vec<Certificate>, String> {
    let pem = read_bounded(path, MAX_CA_BUNDLE_BYTES)
        .map_err(|e| format!("cannot read AWS_CA_BUNDLE {}: {e}", path.display()))?;
    let certs = Certificate::from_pem_bundle(&pem)
        .map_err(|e| format!("AWS_CA_BUNDLE {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "AWS_CA_BUNDLE {} holds no PEM certificate",
            path.display()
        ));
    }
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::env_of;

    const KEYS: [(&str, &str); 2] = [
        ("AWS_ACCESS_KEY_ID", "AKID"),
        ("AWS_SECRET_ACCESS_KEY", "s3cr3t"),
    ];

    #[test]
    fn parses_bucket_prefix_endpoint_and_region() {
        let env = env_of(&KEYS);
        let c = S3Config::parse(
            "s3://vols/a/b/?endpoint=http://127.0.0.1:9000&region=eu-1",
            &env,
        )
        .unwrap();
        assert_eq!(c.bucket, "vols");
        assert_eq!(c.prefix, "a/b");
        assert_eq!(c.endpoint.as_deref(), Some("http://127.0.0.1:9000"));
        assert_eq!(c.region, "eu-1");
        assert!(!c.virtual_hosted, "path-style with an endpoint");
        assert_eq!(c.credentials.describe(), "the environment");
        let d = c.describe();
        assert!(!d.contains("s3cr3t") && !d.contains("AKID"), "{d}");
        assert!(!format!("{c:?}").contains("s3cr3t"));
        assert!(
            c.signs_payload(),
            "plain HTTP: the signature checks the body"
        );
        for name in ["AWS_ENDPOINT_URL", "AWS_ENDPOINT"] {
            let mut vars = KEYS.to_vec();
            vars.push((name, "http://127.0.0.1:9001"));
            let c = S3Config::parse("s3://vols", &env_of(&vars)).unwrap();
            assert_eq!(
                c.endpoint.as_deref(),
                Some("http://127.0.0.1:9001"),
                "{name}"
            );
        }
        let aws = S3Config::parse("s3://vols", &env).unwrap();
        assert!(aws.virtual_hosted && aws.prefix.is_empty());
        assert_eq!(aws.region, "us-east-1");
        assert!(!aws.signs_payload(), "TLS: unsigned, as the AWS SDKs do");
        let forced = S3Config::parse("s3://vols?payload=signed", &env).unwrap();
        assert!(forced.signs_payload());
        let spec = "s3://vols?endpoint=http://127.0.0.1:9000&payload=unsigned";
        assert!(!S3Config::parse(spec, &env).unwrap().signs_payload());
    }

    #[test]
    fn refuses_secrets_in_arguments_and_bad_input() {
        let env = env_of(&KEYS);
        assert_eq!(
            redact_secrets("s3://vols?region=r&secret_access_key=hunter2"),
            "s3://vols?region=r&secret_access_key=..."
        );
        assert_eq!(
            redact_secrets("s3://vols?%73ecret_access_key=hunter2"),
            "s3://vols?%73ecret_access_key=..."
        );
        for (spec, want) in [
            ("s3://vols?secret_access_key=x", "not accepted"),
            ("s3://vols?access_key_id=x", "not accepted"),
            ("s3://vols?endpoint=http://u:p@h:9000", "not accepted"),
            ("s3://vols?colour=blue", "unknown parameter"),
            ("s3://Vols_1", "not valid"),
            ("s3://vols?addressing=sideways", "addressing"),
            ("s3://vols?http=3", "http must be"),
            ("s3://vols?payload=maybe", "payload must be"),
            ("s3://vols?endpoint=ftp://h", "must be http"),
        ] {
            let err = S3Config::parse(spec, &env).unwrap_err();
            assert!(err.contains(want), "{spec}: {err}");
        }
        let half = env_of(&[("AWS_ACCESS_KEY_ID", "x")]);
        assert!(S3Config::parse("s3://vols", &half).is_err());
        // Never asks 169.254.169.254 from a test, on EC2 or not.
        let none = env_of(&[
            ("AWS_ENDPOINT_URL", "http://h:1"),
            ("AWS_EC2_METADATA_DISABLED", "true"),
        ]);
        let err = S3Config::parse("s3://vols", &none).unwrap_err();
        assert!(err.contains("no S3 credentials found"), "{err}");
    }

    #[test]
    fn reads_the_shared_credentials_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("credentials");
        std::fs::write(
            &file,
            "[default]\naws_access_key_id = D\naws_secret_access_key = DS\n\n[ci]\n# c\naws_access_key_id=C\naws_secret_access_key=CS\naws_session_token=T\n",
        )
        .unwrap();
        let f = file.to_str().unwrap();
        let env = env_of(&[
            ("AWS_SHARED_CREDENTIALS_FILE", f),
            ("AWS_PROFILE", "ci"),
            ("AWS_ENDPOINT_URL", "http://h:1"),
        ]);
        let c = S3Config::parse("s3://vols", &env).unwrap();
        let CredentialSource::Keys(cred) = c.credentials else {
            panic!("{:?}", c.credentials)
        };
        assert_eq!(
            (cred.access_key_id.as_str(), cred.secret_access_key.as_str()),
            ("C", "CS")
        );
        assert_eq!(cred.session_token.as_deref(), Some("T"));
        let env = env_of(&[
            ("HOME", dir.path().to_str().unwrap()),
            ("AWS_EC2_METADATA_DISABLED", "true"),
        ]);
        let err = S3Config::parse("s3://vols", &env).unwrap_err();
        assert!(err.contains("credentials (no such file)"), "{err}");
        let env = env_of(&[("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/creds")]);
        assert!(S3Config::parse("s3://vols", &env).is_err());
    }
}
