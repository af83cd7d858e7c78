//! Where strata finds S3 credentials, and saying where it looked.
//!
//! This module owns [`CredentialSource`] and the search for it, first found
//! wins:
//!
//! 1. the environment: `AWS_ACCESS_KEY_ID` + `AWS_SECRET_ACCESS_KEY`
//!    (+ `AWS_SESSION_TOKEN`);
//! 2. the shared credentials file (`AWS_SHARED_CREDENTIALS_FILE` or
//!    `~/.aws/credentials`), profile `AWS_PROFILE` or `default`;
//! 3. web identity (`AWS_WEB_IDENTITY_TOKEN_FILE` + `AWS_ROLE_ARN`, as on
//!    EKS), which object_store exchanges with STS;
//! 4. the instance's role, from the instance metadata service, when it is
//!    to be asked (`instance_metadata.rs` decides; checked before use).
//!
//! When none is found the error says, in one line, each place looked at and
//! what was there, and what to do. Keys are never printed: [`Credentials`]'
//! `Debug` shows only where they came from.

use std::fmt;
use std::path::PathBuf;

use crate::instance_metadata::InstanceMetadata;

const MAX_CREDENTIALS_FILE_BYTES: u64 = 1 << 20;

/// Keys found in the environment or a credentials file.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
    /// Where they came from, for messages.
    pub source: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Credentials from {}", self.source)
    }
}

/// Where the S3 client gets its credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CredentialSource {
    Keys(Credentials),
    /// object_store's web identity provider reads the variables itself.
    WebIdentity,
    /// The instance's role, from the metadata service at `endpoint`;
    /// `looked` is where else strata looked (for the message if the
    /// service has no role to give).
    InstanceRole {
        endpoint: String,
        looked: Vec<String>,
    },
}

impl CredentialSource {
    /// Where the credentials come from, for messages.
    pub fn describe(&self) -> String {
        match self {
            CredentialSource::Keys(c) => c.source.clone(),
            CredentialSource::WebIdentity => "web identity (AWS_WEB_IDENTITY_TOKEN_FILE)".into(),
            CredentialSource::InstanceRole { endpoint, .. } => {
                format!("the instance role (instance metadata at {endpoint})")
            }
        }
    }

    /// Searches as the module doc says; `on_ec2` is asked only when the
    /// instance metadata service is the last place left.
    pub fn find(
        env: &dyn Fn(&str) -> Option<String>,
        on_ec2: &dyn Fn() -> bool,
    ) -> Result<CredentialSource, String> {
        let mut looked = Vec::new();
        if let Some(keys) = from_env(env)? {
            return Ok(CredentialSource::Keys(keys));
        }
        looked.push(
            "the environment (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are not set)".into(),
        );
        let (keys, file_note) = from_file(env)?;
        if let Some(keys) = keys {
            return Ok(CredentialSource::Keys(keys));
        }
        looked.push(file_note);
        let web = ["AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN"];
        if web.iter().all(|k| env(k).is_some_and(|v| !v.is_empty())) {
            return Ok(CredentialSource::WebIdentity);
        }
        match InstanceMetadata::from_env(env, on_ec2)? {
            InstanceMetadata::Ask(endpoint) => {
                Ok(CredentialSource::InstanceRole { endpoint, looked })
            }
            InstanceMetadata::Skip(why) => {
                looked.push(why);
                Err(not_found(&looked))
            }
        }
    }
}

/// "no S3 credentials found: looked in A, B, C; set ..." (one line).
pub fn not_found(looked: &[String]) -> String {
    format!(
        "no S3 credentials found: looked in {}; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or write them to ~/.aws/credentials (AWS_PROFILE picks a profile)",
        looked.join(", ")
    )
}

fn from_env(env: &dyn Fn(&str) -> Option<String>) -> Result<Option<Credentials>, String> {
    let key = env("AWS_ACCESS_KEY_ID").filter(|s| !s.is_empty());
    let secret = env("AWS_SECRET_ACCESS_KEY").filter(|s| !s.is_empty());
    match (key, secret) {
        (Some(access_key_id), Some(secret_access_key)) => Ok(Some(Credentials {
            access_key_id,
            secret_access_key,
            session_token: env("AWS_SESSION_TOKEN").filter(|s| !s.is_empty()),
            source: "the environment".into(),
        })),
        (Some(_), None) => Err(
            "AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not: set both, or neither"
                .into(),
        ),
        (None, Some(_)) => Err(
            "AWS_SECRET_ACCESS_KEY is set but AWS_ACCESS_KEY_ID is not: set both, or neither"
                .into(),
        ),
        (None, None) => Ok(None),
    }
}

/// The keys of the shared credentials file, or a note of what was there.
fn from_file(
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(Option<Credentials>, String), String> {
    let explicit = env("AWS_SHARED_CREDENTIALS_FILE").filter(|s| !s.is_empty());
    let path = match (&explicit, env("HOME").filter(|h| !h.is_empty())) {
        (Some(p), _) => PathBuf::from(p),
        (None, Some(home)) => PathBuf::from(home).join(".aws").join("credentials"),
        (None, None) => return Ok((None, "no credentials file (HOME is not set)".into())),
    };
    let profile = env("AWS_PROFILE")
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "default".into());
    let text = match read_bounded(&path, MAX_CREDENTIALS_FILE_BYTES) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && explicit.is_none() => {
            return Ok((None, format!("{} (no such file)", path.display())))
        }
        Err(e) => {
            return Err(format!(
                "cannot read the credentials file {}: {e}",
                path.display()
            ))
        }
    };
    let text = String::from_utf8(text)
        .map_err(|_| format!("credentials file {} is not UTF-8", path.display()))?;
    let file = path.display().to_string();
    let keys = parse_credentials_file(&text, &profile, &file)?;
    let note = format!("{file} (no keys in profile [{profile}])");
    Ok((keys, note))
}

/// Reads profile `profile` of an AWS shared credentials file (INI).
fn parse_credentials_file(
    text: &str,
    profile: &str,
    file: &str,
) -> Result<Option<Credentials>, String> {
    let mut in_profile = false;
    let (mut key, mut secret, mut token) = (None, None, None);
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(section) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            in_profile = section.trim() == profile;
            continue;
        }
        if !in_profile {
            continue;
        }
        if let Some((k, v)) = line.split_once('=') {
            let v = Some(v.trim().to_string());
            match k.trim() {
                "aws_access_key_id" => key = v,
                "aws_secret_access_key" => secret = v,
                "aws_session_token" => token = v,
                _ => {}
            }
        }
    }
    match (key, secret) {
        (Some(access_key_id), Some(secret_access_key)) => Ok(Some(Credentials {
            access_key_id,
            secret_access_key,
            session_token: token,
            source: format!("{file} [{profile}]"),
        })),
        (None, None) => Ok(None),
        _ => Err(format!(
            "profile [{profile}] of {file} needs both aws_access_key_id and aws_secret_access_key"
        )),
    }
}

/// Reads at most `max_bytes` of a file (more is an error).
pub(crate) fn read_bounded(path: &std::path::Path, max_bytes: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut buf = Vec::new();
    std::fs::File::open(path)?
        .take(max_bytes + 1)
        .read_to_end(&mut buf)?;
    if buf.len() as u64 > max_bytes {
        return Err(std::io::Error::other(format!(
            "larger than {max_bytes} bytes"
        )));
    }
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::env_of;

    fn not_ec2() -> bool {
        false
    }

    #[test]
    fn no_credentials_names_every_place_looked_at() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().to_str().unwrap();
        let env = env_of(&[("HOME", home)]);
        let err = CredentialSource::find(&env, &not_ec2).unwrap_err();
        assert!(err.starts_with("no S3 credentials found"), "{err}");
        for place in [
            "environment",
            &format!("{home}/.aws/credentials (no such file)"),
            "not an EC2 instance",
            "AWS_ACCESS_KEY_ID",
        ] {
            assert!(err.contains(place), "{place}: {err}");
        }
        assert_eq!(err.lines().count(), 1);
        let off = env_of(&[("HOME", home), ("AWS_EC2_METADATA_DISABLED", "true")]);
        let err = CredentialSource::find(&off, &|| true).unwrap_err();
        assert!(err.contains("AWS_EC2_METADATA_DISABLED=true"), "{err}");
    }

    #[test]
    fn the_instance_role_is_the_last_resort_when_metadata_is_to_be_asked() {
        let env = env_of(&[("AWS_METADATA_ENDPOINT", "http://127.0.0.1:7")]);
        match CredentialSource::find(&env, &not_ec2).unwrap() {
            CredentialSource::InstanceRole { endpoint, looked } => {
                assert_eq!(endpoint, "http://127.0.0.1:7");
                assert_eq!(looked.len(), 2, "{looked:?}");
            }
            other => panic!("{other:?}"),
        }
        let with_keys = env_of(&[
            ("AWS_METADATA_ENDPOINT", "http://127.0.0.1:7"),
            ("AWS_ACCESS_KEY_ID", "AKIDX"),
            ("AWS_SECRET_ACCESS_KEY", "SECRETX"),
        ]);
        let found = CredentialSource::find(&with_keys, &|| panic!("not asked")).unwrap();
        assert!(matches!(found, CredentialSource::Keys(_)));
        let debug = format!("{found:?}");
        assert!(
            !debug.contains("SECRETX") && !debug.contains("AKIDX"),
            "{debug}"
        );
        let web = env_of(&[
            ("AWS_WEB_IDENTITY_TOKEN_FILE", "/t"),
            ("AWS_ROLE_ARN", "arn:aws:iam::1:role/r"),
        ]);
        assert_eq!(
            CredentialSource::find(&web, &not_ec2),
            Ok(CredentialSource::WebIdentity)
        );
    }

    #[test]
    fn half_set_keys_are_refused() {
        let half = env_of(&[("AWS_ACCESS_KEY_ID", "x")]);
        let err = CredentialSource::find(&half, &not_ec2).unwrap_err();
        assert!(err.contains("AWS_SECRET_ACCESS_KEY is not"), "{err}");
    }
}
