//! The CSI endpoint: a unix socket, given as kubelet and the sidecars give
//! it (`unix:///csi/csi.sock`, `unix:/csi/csi.sock` or a plain path).
//!
//! A socket left by a process that died is replaced; a path that is
//! something else (a file, a directory) is refused, never removed.

use std::fmt;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use tokio::net::UnixListener;

/// A unix socket path to listen on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    path: PathBuf,
}

impl Endpoint {
    /// Parses `unix:///PATH`, `unix:/PATH` or `/PATH`.
    pub fn parse(spec: &str) -> Result<Endpoint, String> {
        let path = if let Some(rest) = spec.strip_prefix("unix://") {
            rest
        } else if let Some(rest) = spec.strip_prefix("unix:") {
            rest
        } else if spec.contains("://") {
            return Err(format!(
                "endpoint {spec:?}: only unix sockets are served (unix:///PATH), as kubelet and the sidecars expect"
            ));
        } else {
            spec
        };
        if !path.starts_with('/') {
            return Err(format!(
                "endpoint {spec:?}: the socket path must be absolute (unix:///csi/csi.sock)"
            ));
        }
        Ok(Endpoint {
            path: PathBuf::from(path),
        })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Listens: the parent directory is made if missing, and a stale
    /// socket replaced.
    pub(crate) fn bind(&self) -> anyhow::Result<UnixListener> {
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("create the endpoint's directory {}", dir.display()))?;
        }
        match std::fs::symlink_metadata(&self.path) {
            Ok(meta) if meta.file_type().is_socket() => {
                std::fs::remove_file(&self.path)
                    .with_context(|| format!("remove the stale socket {}", self.path.display()))?;
            }
            Ok(_) => bail!(
                "endpoint {} exists and is not a socket: remove it or choose another --endpoint",
                self.path.display()
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(e).with_context(|| format!("look at {}", self.path.display()));
            }
        }
        UnixListener::bind(&self.path).with_context(|| format!("listen on {}", self.path.display()))
    }

    /// Removes the socket (at exit).
    pub(crate) fn remove(&self) {
        if let Ok(meta) = std::fs::symlink_metadata(&self.path) {
            if meta.file_type().is_socket() {
                let _ = std::fs::remove_file(&self.path);
            }
        }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unix://{}", self.path.display())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_forms_kubelet_uses_parse_to_a_path() {
        for spec in [
            "unix:///csi/csi.sock",
            "unix:/csi/csi.sock",
            "/csi/csi.sock",
        ] {
            assert_eq!(
                Endpoint::parse(spec).map(|e| e.path),
                Ok(PathBuf::from("/csi/csi.sock")),
                "{spec}"
            );
        }
    }

    #[test]
    fn tcp_and_relative_paths_are_refused_with_the_form_to_use() {
        let e = Endpoint::parse("tcp://127.0.0.1:10000").unwrap_err();
        assert!(e.contains("unix:///PATH"), "{e}");
        let e = Endpoint::parse("unix://csi.sock").unwrap_err();
        assert!(e.contains("absolute"), "{e}");
    }

    #[tokio::test]
    async fn a_stale_socket_is_replaced_and_a_file_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("csi.sock");
        let ep = Endpoint::parse(path.to_str().unwrap()).unwrap();
        drop(ep.bind().unwrap());
        assert!(path.exists(), "the first listener's socket stays");
        drop(ep.bind().unwrap());
        ep.remove();
        std::fs::write(&path, b"not a socket").unwrap();
        let e = ep.bind().unwrap_err().to_string();
        assert!(e.contains("is not a socket"), "{e}");
        assert_eq!(std::fs::read(&path).unwrap(), b"not a socket");
    }
}
