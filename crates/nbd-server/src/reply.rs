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

    /// Whether this reply reports an error: a simple reply with a non-zero
    /// error field, or a structured chunk of an error type.
    pub(crate) fn is_error(&self) -> bool {
        let bytes = self.as_bytes();
        let word = |at: usize| bytes.get(at..at + 4).map(|b| [b[0], b[1], b[2], b[3]]);
        match word(0).map(u32::from_be_bytes) {
            Some(SIMPLE_REPLY_MAGIC) => word(4).is_some_and(|e| e != [0; 4]),
            Some(STRUCTURED_REPLY_MAGIC) => word(4)
                .is_some_and(|w| u16::from_be_bytes([w[2], w[3]]) & REPLY_TYPE_FLAG_ERROR != 0),
            _ => false,
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
    fn tells_error_replies() {
        assert!(!Reply::ok(7).is_error());
        assert!(Reply::error(false, 7, EIO, "").is_error());
        assert!(Reply::error(true, 7, EIO, "failed").is_error());
        let read = nbd_proto::encode_none_chunk(7).to_vec();
        assert!(!Reply::Bytes(read).is_error());
        assert!(!Reply::Bytes(Vec::new()).is_error());
    }

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
