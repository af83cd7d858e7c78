//! Reply messages as the writer sends them, and how errors become NBD
//! errnos and replies (simple, or a structured error chunk with a message
//! when structured replies were negotiated).

use std::io;

use nbd_proto::consts::*;
use nbd_proto::{encode_error_chunk, SimpleReplyHeader};

/// The bytes of one complete reply.
pub(crate) enum Reply {
    /// A simple reply without data (the common case, no allocation).
    Simple([u8; SIMPLE_REPLY_HEADER_BYTES]),
    /// Anything longer: READ data, structured chunks.
    Bytes(Vec<u8>),
}

impl Reply {
    pub(crate) fn as_bytes(&self) -> &[u8] {
        match self {
            Reply::Simple(header) => header,
            Reply::Bytes(bytes) => bytes,
        }
    }

    /// A successful simple reply without data.
    pub(crate) fn ok(handle: u64) -> Reply {
        Reply::Simple(SimpleReplyHeader { error: 0, handle }.encode())
    }

    /// An error reply: a structured error chunk carrying `message` when
    /// structured replies were negotiated, else a simple reply.
    pub(crate) fn error(structured: bool, handle: u64, errno: u32, message: &str) -> Reply {
        if structured {
            Reply::Bytes(encode_error_chunk(handle, errno, message))
        } else {
            Reply::Simple(
                SimpleReplyHeader {
                    error: errno,
                    handle,
                }
                .encode(),
            )
        }
    }

    /// An error reply for a failed device call.
    pub(crate) fn io_error(structured: bool, handle: u64, error: &io::Error) -> Reply {
        let errno = errno_of(error);
        if structured {
            Reply::error(true, handle, errno, &error.to_string())
        } else {
            Reply::error(false, handle, errno, "")
        }
    }
}

/// Maps a device error to an NBD errno, as `device.rs` documents.
pub(crate) fn errno_of(error: &io::Error) -> u32 {
    use io::ErrorKind as Kind;
    match error.kind() {
        Kind::InvalidInput => EINVAL,
        Kind::StorageFull | Kind::QuotaExceeded | Kind::FileTooLarge => ENOSPC,
        Kind::Unsupported => ENOTSUP,
        Kind::PermissionDenied | Kind::ReadOnlyFilesystem => EPERM,
        _ => EIO,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_error_kinds() {
        let cases = [
            (io::ErrorKind::InvalidInput, EINVAL),
            (io::ErrorKind::StorageFull, ENOSPC),
            (io::ErrorKind::Unsupported, ENOTSUP),
            (io::ErrorKind::PermissionDenied, EPERM),
            (io::ErrorKind::ReadOnlyFilesystem, EPERM),
            (io::ErrorKind::NotFound, EIO),
            (io::ErrorKind::Other, EIO),
        ];
        for (kind, errno) in cases {
            assert_eq!(errno_of(&io::Error::from(kind)), errno, "{kind:?}");
        }
        assert_eq!(errno_of(&io::Error::from_raw_os_error(28)), ENOSPC);
    }
}
