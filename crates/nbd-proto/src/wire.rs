//! Bounds-checked big-endian reading and writing shared by the decoders and
//! encoders. Nothing here can panic: every access is checked.

use crate::consts::MAX_STRING_BYTES;
use crate::error::ProtoError;

/// A forward-only reader over a byte slice.
pub(crate) struct Cursor<'a> {
    what: &'static str,
    bytes: &'a [u8],
    position: usize,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(what: &'static str, bytes: &'a [u8]) -> Self {
        Cursor {
            what,
            bytes,
            position: 0,
        }
    }

    pub(crate) fn remaining_bytes(&self) -> usize {
        self.bytes.len().saturating_sub(self.position)
    }

    pub(crate) fn take(&mut self, count: usize) -> Result<&'a [u8], ProtoError> {
        let end = self.position.checked_add(count);
        match end.and_then(|end| self.bytes.get(self.position..end)) {
            Some(slice) => {
                self.position += count;
                Ok(slice)
            }
            None => Err(ProtoError::Truncated {
                what: self.what,
                needed_bytes: self.position.saturating_add(count),
                got_bytes: self.bytes.len(),
            }),
        }
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], ProtoError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    pub(crate) fn u16(&mut self) -> Result<u16, ProtoError> {
        Ok(u16::from_be_bytes(self.array()?))
    }

    pub(crate) fn u32(&mut self) -> Result<u32, ProtoError> {
        Ok(u32::from_be_bytes(self.array()?))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, ProtoError> {
        Ok(u64::from_be_bytes(self.array()?))
    }

    /// The rest of the input.
    pub(crate) fn rest(&mut self) -> &'a [u8] {
        let rest = self.bytes.get(self.position..).unwrap_or(&[]);
        self.position = self.bytes.len();
        rest
    }

    /// A string of `length_bytes` bytes, checked as an NBD string.
    pub(crate) fn string(
        &mut self,
        what: &'static str,
        length_bytes: usize,
    ) -> Result<&'a str, ProtoError> {
        if length_bytes > MAX_STRING_BYTES {
            return Err(ProtoError::TooLong {
                what,
                length: length_bytes,
                max: MAX_STRING_BYTES,
            });
        }
        check_string(what, self.take(length_bytes)?)
    }

    /// A string prefixed by its 32-bit length.
    pub(crate) fn prefixed_string(&mut self, what: &'static str) -> Result<&'a str, ProtoError> {
        let length_bytes = self.u32()?;
        let length_bytes = usize::try_from(length_bytes).map_err(|_| ProtoError::BadLength {
            what,
            length: u64::from(length_bytes),
        })?;
        if length_bytes > self.remaining_bytes() {
            return Err(ProtoError::BadLength {
                what,
                length: length_bytes as u64,
            });
        }
        self.string(what, length_bytes)
    }

    /// Fails unless every byte was consumed.
    pub(crate) fn finish(self) -> Result<(), ProtoError> {
        match self.remaining_bytes() {
            0 => Ok(()),
            extra_bytes => Err(ProtoError::TrailingBytes {
                what: self.what,
                extra_bytes,
            }),
        }
    }
}

/// Checks the rules for NBD strings: UTF-8, no NUL.
pub(crate) fn check_string<'a>(what: &'static str, bytes: &'a [u8]) -> Result<&'a str, ProtoError> {
    let text = std::str::from_utf8(bytes).map_err(|_| ProtoError::InvalidUtf8 { what })?;
    if text.contains('\0') {
        return Err(ProtoError::ContainsNul { what });
    }
    Ok(text)
}

/// Checks a string about to be encoded; returns its length as u32.
pub(crate) fn string_length(what: &'static str, text: &str) -> Result<u32, ProtoError> {
    if text.len() > MAX_STRING_BYTES {
        return Err(ProtoError::TooLong {
            what,
            length: text.len(),
            max: MAX_STRING_BYTES,
        });
    }
    if text.contains('\0') {
        return Err(ProtoError::ContainsNul { what });
    }
    u32::try_from(text.len()).map_err(|_| ProtoError::TooLong {
        what,
        length: text.len(),
        max: MAX_STRING_BYTES,
    })
}

/// The longest prefix of `text` that is at most `max_bytes` long and ends
/// on a character boundary, with NUL bytes not allowed: cut at the first NUL.
pub(crate) fn truncate_message(text: &str, max_bytes: usize) -> &str {
    let text = text.split('\0').next().unwrap_or("");
    if text.len() <= max_bytes {
        return text;
    }
    let mut end = max_bytes;
    while end > 0 && !text.is_char_boundary(end) {
        end -= 1;
    }
    text.get(..end).unwrap_or("")
}

/// Converts a payload length to the u32 a length field holds.
pub(crate) fn length_u32(what: &'static str, length_bytes: usize) -> Result<u32, ProtoError> {
    u32::try_from(length_bytes).map_err(|_| ProtoError::BadLength {
        what,
        length: length_bytes as u64,
    })
}
