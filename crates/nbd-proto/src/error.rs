//! The one error type of this crate: why some bytes are not a valid message.

use std::fmt;

/// A malformed or unrepresentable message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProtoError {
    /// Fewer bytes than the message needs.
    Truncated {
        what: &'static str,
        needed_bytes: usize,
        got_bytes: usize,
    },
    /// Bytes left over after a message whose length is known.
    TrailingBytes {
        what: &'static str,
        extra_bytes: usize,
    },
    /// A magic number is not the expected one.
    BadMagic {
        what: &'static str,
        expected: u64,
        got: u64,
    },
    /// A length field is out of range for this message.
    BadLength { what: &'static str, length: u64 },
    /// A string is not valid UTF-8.
    InvalidUtf8 { what: &'static str },
    /// A string contains a NUL byte, which the specification forbids.
    ContainsNul { what: &'static str },
    /// A string or list is longer than the specification allows.
    TooLong {
        what: &'static str,
        length: usize,
        max: usize,
    },
    /// Flags with bits this side does not know or did not offer.
    UnknownFlags { what: &'static str, flags: u32 },
}

impl fmt::Display for ProtoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProtoError::Truncated {
                what,
                needed_bytes,
                got_bytes,
            } => write!(f, "{what}: need {needed_bytes} bytes, got {got_bytes}"),
            ProtoError::TrailingBytes { what, extra_bytes } => {
                write!(f, "{what}: {extra_bytes} unexpected trailing bytes")
            }
            ProtoError::BadMagic {
                what,
                expected,
                got,
            } => write!(f, "{what}: bad magic {got:#x}, expected {expected:#x}"),
            ProtoError::BadLength { what, length } => write!(f, "{what}: bad length {length}"),
            ProtoError::InvalidUtf8 { what } => write!(f, "{what}: not valid UTF-8"),
            ProtoError::ContainsNul { what } => write!(f, "{what}: contains a NUL byte"),
            ProtoError::TooLong { what, length, max } => {
                write!(f, "{what}: length {length} exceeds maximum {max}")
            }
            ProtoError::UnknownFlags { what, flags } => {
                write!(f, "{what}: unknown flags {flags:#x}")
            }
        }
    }
}

impl std::error::Error for ProtoError {}
