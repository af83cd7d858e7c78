//! The EC2 instance metadata service (IMDS): whether to ask it for S3
//! credentials, and asking once whether it has a role to give.
//!
//! This module owns [`InstanceMetadata`]: the endpoint to ask (object_store's
//! `AWS_METADATA_ENDPOINT`, the SDKs' `AWS_EC2_METADATA_SERVICE_ENDPOINT`,
//! else `http://169.254.169.254`), the decision to ask at all, and the check
//! made before the S3 client is built.
//!
//! Why decide: on a machine that is not an EC2 instance nothing answers at
//! 169.254.169.254, and asking costs a timeout (packets to a link-local
//! address are often dropped, not refused) before the user learns that no
//! credentials were found. So strata asks only when told where
//! (`AWS_METADATA_ENDPOINT`) or when the machine says it is an EC2 instance
//! (DMI vendor "Amazon EC2", or a Xen `/sys/hypervisor/uuid` starting with
//! "ec2"), and never when `AWS_EC2_METADATA_DISABLED=true` (as the AWS
//! SDKs). Why check first: object_store fetches the role's credentials at
//! the first request and would report a refusal as a store error per
//! request; one token request and one role listing (IMDSv2, no retry,
//! 1 s timeouts) tell at once what is missing. object_store then fetches
//! and refreshes the credentials from the same endpoint.

use std::time::Duration;

use object_store::client::{HttpClient, HttpConnector, HttpRequestBody, ReqwestConnector};
use object_store::ClientOptions;

const DEFAULT_ENDPOINT: &str = "http://169.254.169.254";
const TIMEOUT_MS: u64 = 1_000;
/// A token or a role name is short; a longer reply is not the IMDS.
const MAX_REPLY_BYTES: usize = 4_096;

/// Where and whether to ask the instance metadata service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InstanceMetadata {
    /// Ask at this endpoint (no trailing slash).
    Ask(String),
    /// Do not ask; the reason, for the "no credentials" message.
    Skip(String),
}

impl InstanceMetadata {
    /// Decides from the environment and, unless told, the machine.
    pub fn from_env(
        env: &dyn Fn(&str) -> Option<String>,
        on_ec2: &dyn Fn() -> bool,
    ) -> Result<InstanceMetadata, String> {
        let disabled = env("AWS_EC2_METADATA_DISABLED");
        if disabled.is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            return Ok(InstanceMetadata::Skip(
                "instance metadata (not asked: AWS_EC2_METADATA_DISABLED=true)".into(),
            ));
        }
        let given = ["AWS_METADATA_ENDPOINT", "AWS_EC2_METADATA_SERVICE_ENDPOINT"]
            .iter()
            .find_map(|k| env(k).filter(|v| !v.is_empty()).map(|v| (*k, v)));
        if let Some((key, endpoint)) = given {
            return Ok(InstanceMetadata::Ask(validate(key, &endpoint)?));
        }
        if on_ec2() {
            return Ok(InstanceMetadata::Ask(DEFAULT_ENDPOINT.into()));
        }
        Ok(InstanceMetadata::Skip(
            "instance metadata (not asked: this machine is not an EC2 instance; AWS_METADATA_ENDPOINT=URL asks one)".into(),
        ))
    }

    /// Asks the service at `endpoint` for a token and the instance's role.
    /// `Ok(role)`, or what went wrong, said for people.
    pub async fn role(endpoint: &str) -> Result<String, String> {
        let client = client()?;
        let token = request(
            &client,
            http::Method::PUT,
            endpoint,
            "/latest/api/token",
            None,
        )
        .await
        .map_err(|e| format!("no token from {endpoint}: {e}"))?;
        let roles = request(
            &client,
            http::Method::GET,
            endpoint,
            "/latest/meta-data/iam/security-credentials/",
            Some(&token),
        )
        .await
        .map_err(|e| match e {
            Failed::Status(http::StatusCode::NOT_FOUND) => {
                format!("{endpoint} says this instance has no IAM role (instance profile) attached")
            }
            e => format!("no role from {endpoint}: {e}"),
        })?;
        let role = roles.lines().next().unwrap_or_default().trim().to_string();
        if role.is_empty() {
            return Err(format!("{endpoint} lists no IAM role for this instance"));
        }
        Ok(role)
    }
}

fn validate(key: &str, endpoint: &str) -> Result<String, String> {
    let url = url::Url::parse(endpoint).map_err(|e| format!("{key} {endpoint:?}: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(format!(
            "{key} {endpoint:?} must be http://HOST[:PORT] (the instance metadata service)"
        ));
    }
    Ok(endpoint.trim_end_matches('/').to_string())
}

fn client() -> Result<HttpClient, String> {
    let options = ClientOptions::new()
        .with_allow_http(true)
        .with_connect_timeout(Duration::from_millis(TIMEOUT_MS))
        .with_timeout(Duration::from_millis(TIMEOUT_MS));
    ReqwestConnector::default()
        .connect(&options)
        .map_err(|e| format!("cannot build an HTTP client: {e}"))
}

/// Why a request got no usable reply: its status, or what happened.
enum Failed {
    Status(http::StatusCode),
    Other(String),
}

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failed::Status(status) => write!(f, "it answered {status}"),
            Failed::Other(what) => f.write_str(what),
        }
    }
}

/// One IMDSv2 request; the reply's text, or what happened.
async fn request(
    client: &HttpClient,
    method: http::Method,
    endpoint: &str,
    path: &str,
    token: Option<&str>,
) -> Result<String, Failed> {
    let other = Failed::Other;
    let mut builder = http::Request::builder()
        .method(method)
        .uri(format!("{endpoint}{path}"));
    builder = match token {
        Some(t) => builder.header("X-aws-ec2-metadata-token", t),
        None => builder.header("X-aws-ec2-metadata-token-ttl-seconds", "21600"),
    };
    let req = builder
        .body(HttpRequestBody::empty())
        .map_err(|e| other(format!("bad request: {e}")))?;
    let reply = client
        .execute(req)
        .await
        .map_err(|e| other(crate::store_failure::root_cause(&e)))?;
    let status = reply.status();
    if !status.is_success() {
        return Err(Failed::Status(status));
    }
    let body = reply
        .into_body()
        .bytes()
        .await
        .map_err(|e| other(crate::store_failure::root_cause(&e)))?;
    if body.len() > MAX_REPLY_BYTES {
        return Err(other(format!(
            "its reply is larger than {MAX_REPLY_BYTES} bytes"
        )));
    }
    String::from_utf8(body.to_vec()).map_err(|_| other("its reply is not text".into()))
}

/// Whether this machine says it is an EC2 instance (DMI, or Xen's uuid).
pub fn looks_like_ec2() -> bool {
    let read = |path: &str| -> Option<String> {
        use std::io::Read;
        let mut text = String::new();
        std::fs::File::open(path)
            .ok()?
            .take(256)
            .read_to_string(&mut text)
            .ok()?;
        Some(text)
    };
    is_ec2(&read)
}

fn is_ec2(read: &dyn Fn(&str) -> Option<String>) -> bool {
    let vendor_files = [
        "/sys/class/dmi/id/sys_vendor",
        "/sys/class/dmi/id/board_vendor",
        "/sys/class/dmi/id/bios_vendor",
    ];
    let dmi = vendor_files
        .iter()
        .filter_map(|f| read(f))
        .any(|v| v.trim().starts_with("Amazon EC2"));
    let xen = read("/sys/hypervisor/uuid").is_some_and(|u| u.trim().starts_with("ec2"));
    dmi || xen
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::env_of;

    #[test]
    fn asks_only_when_told_or_on_ec2_and_never_when_disabled() {
        let yes = || true;
        let no = || false;
        let none = env_of(&[]);
        assert!(
            matches!(InstanceMetadata::from_env(&none, &no), Ok(InstanceMetadata::Skip(r)) if r.contains("not an EC2 instance"))
        );
        assert_eq!(
            InstanceMetadata::from_env(&none, &yes),
            Ok(InstanceMetadata::Ask(DEFAULT_ENDPOINT.into()))
        );
        let told = env_of(&[("AWS_METADATA_ENDPOINT", "http://127.0.0.1:8/")]);
        assert_eq!(
            InstanceMetadata::from_env(&told, &no),
            Ok(InstanceMetadata::Ask("http://127.0.0.1:8".into()))
        );
        let off = env_of(&[
            ("AWS_EC2_METADATA_DISABLED", "TRUE"),
            ("AWS_METADATA_ENDPOINT", "http://127.0.0.1:8"),
        ]);
        assert!(
            matches!(InstanceMetadata::from_env(&off, &yes), Ok(InstanceMetadata::Skip(r)) if r.contains("DISABLED"))
        );
        let bad = env_of(&[("AWS_METADATA_ENDPOINT", "ftp://x")]);
        assert!(InstanceMetadata::from_env(&bad, &no).is_err());
    }

    #[test]
    fn recognises_ec2_by_dmi_or_xen_uuid() {
        let files = |pairs: &'static [(&'static str, &'static str)]| {
            move |p: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == p)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert!(is_ec2(&files(&[(
            "/sys/class/dmi/id/sys_vendor",
            "Amazon EC2\n"
        )])));
        assert!(is_ec2(&files(&[(
            "/sys/hypervisor/uuid",
            "ec2e1916-9099-7caf-fd21-012345abcdef\n"
        )])));
        assert!(!is_ec2(&files(&[(
            "/sys/class/dmi/id/sys_vendor",
            "QEMU\n"
        )])));
        assert!(!is_ec2(&files(&[])));
    }
}
