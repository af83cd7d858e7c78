//! The user's key (the key-encryption key that wraps each encrypted
//! volume's data key): from a key file that only its owner may read, or
//! from the environment. Never from a command-line argument, which any
//! user of the host can see in the process list.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use super::random::random_array;
use crate::error::VolumeError;
use crate::format::key_wrap::{Key, KEY_BYTES};

/// The environment variable that may hold the key (64 hex digits).
pub const KEY_ENV: &str = "STRATA_KEY";

/// Largest key file read (a key is 64 hex digits and a newline).
const MAX_KEY_FILE_BYTES: u64 = 4096;

/// The key in `path`: 64 hex digits, in a file no one but its owner may
/// read or write (mode 0600 or 0400).
pub fn load_key_file(path: &Path) -> Result<Key, VolumeError> {
    let shown = path.display();
    let meta = std::fs::metadata(path).map_err(|source| VolumeError::Io {
        what: format!("key file {shown}"),
        source,
    })?;
    if !meta.is_file() || meta.len() > MAX_KEY_FILE_BYTES {
        return Err(VolumeError::Invalid(format!(
            "key file {shown} is not a key file (make one with `strata key generate {shown}`)"
        )));
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(VolumeError::Invalid(format!(
            "key file {shown} may be read by others (mode {mode:o}): run `chmod 600 {shown}`"
        )));
    }
    let text = std::fs::read_to_string(path).map_err(|source| VolumeError::Io {
        what: format!("read key file {shown}"),
        source,
    })?;
    Key::from_hex(&text).map_err(|e| VolumeError::Invalid(format!("key file {shown}: {e}")))
}

/// The key in `STRATA_KEY`, if set.
pub fn key_from_env() -> Result<Option<Key>, VolumeError> {
    match std::env::var(KEY_ENV) {
        Ok(text) => Key::from_hex(&text)
            .map(Some)
            .map_err(|e| VolumeError::Invalid(format!("{KEY_ENV}: {e}"))),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => Err(VolumeError::Invalid(format!(
            "{KEY_ENV} is not text: it must hold 64 hex digits"
        ))),
    }
}

/// Writes a new random key to `path` (created, mode 0600; an existing
/// file is never overwritten: it may be the only copy of a key).
pub fn generate_key_file(path: &Path) -> Result<Key, VolumeError> {
    let key = Key::from_bytes(random_array::<KEY_BYTES>()?);
    let shown = path.display();
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|source| match source.kind() {
            std::io::ErrorKind::AlreadyExists => VolumeError::Invalid(format!(
                "key file {shown} already exists: strata never overwrites a file that may hold the only copy of a key; give another file name"
            )),
            _ => VolumeError::Io {
                what: format!("create key file {shown}"),
                source,
            },
        })?;
    let written = file
        .write_all(format!("{}\n", key.to_hex()).as_bytes())
        .and_then(|()| file.sync_all());
    written.map_err(|source| VolumeError::Io {
        what: format!("write key file {shown}"),
        source,
    })?;
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_files_are_private_hex_and_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        let key = generate_key_file(&path).unwrap();
        assert_eq!(load_key_file(&path).unwrap(), key);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert!(generate_key_file(&path).is_err(), "overwrote a key file");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = load_key_file(&path).unwrap_err().to_string();
        assert!(e.contains("chmod 600"), "{e}");
        let bad = dir.path().join("bad");
        std::fs::write(&bad, "not a key").unwrap();
        std::fs::set_permissions(&bad, std::fs::Permissions::from_mode(0o600)).unwrap();
        let e = load_key_file(&bad).unwrap_err().to_string();
        assert!(e.contains("64 hex digits"), "{e}");
        let e = load_key_file(&dir.path().join("missing"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing"), "{e}");
    }
}
