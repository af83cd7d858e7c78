//! Transmission replies: the simple reply header, the structured reply
//! chunk header, and the payloads of the chunk types this crate knows.

use crate::consts::*;
use crate::error::ProtoError;
use crate::handshake::expect_magic32;
use crate::wire::{check_string, length_u32, truncate_message, Cursor};

/// Magic, error, handle. A successful READ reply is followed by the data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimpleReplyHeader {
    pub error: u32,
    pub handle: u64,
}

impl SimpleReplyHeader {
    pub fn encode(&self) -> [u8; SIMPLE_REPLY_HEADER_BYTES] {
        let mut out = [0u8; SIMPLE_REPLY_HEADER_BYTES];
        out[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
        out[4..8].copy_from_slice(&self.error.to_be_bytes());
        out[8..16].copy_from_slice(&self.handle.to_be_bytes());
        out
    }

    /// Writes the header into the first bytes of `out`.
    pub fn encode_into(&self, out: &mut [u8]) -> Result<(), ProtoError> {
        write_prefix("simple reply header", out, &self.encode())
    }

    /// Decodes the first [`SIMPLE_REPLY_HEADER_BYTES`] of `bytes`.
    pub fn decode(bytes: &[u8]) -> Result<Self, ProtoError> {
        let mut cursor = Cursor::new("simple reply header", bytes);
        expect_magic32(&mut cursor, "simple reply header", SIMPLE_REPLY_MAGIC)?;
        Ok(SimpleReplyHeader {
            error: cursor.u32()?,
            handle: cursor.u64()?,
        })
    }
}

/// Magic, flags, type, handle, payload length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StructuredReplyHeader {
    pub flags: u16,
    pub reply_type: u16,
    pub handle: u64,
    pub length_bytes: u32,
}

impl StructuredReplyHeader {
    pub fn encode(&self) -> [u8; STRUCTURED_REPLY_HEADER_BYTES] {
        let mut out = [0u8; STRUCTURED_REPLY_HEADER_BYTES];
        out[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
        out[4..6].copy_from_slice(&self.flags.to_be_bytes());
        out[6..8].copy_from_slice(&self.reply_type.to_be_bytes());
        out[8..16].copy_from_slice(&self.handle.to_be_bytes());
        out[16..20].copy_from_slice(&self.length_bytes.to_be_bytes());
        out
    }

    /// Decodes the first [`STRUCTURED_REPLY_HEADER_BYTES`] of `bytes`.
    pub fn decode(bytes: &[u8]) -> Result<Self, ProtoError> {
        let mut cursor = Cursor::new("structured reply header", bytes);
        expect_magic32(
            &mut cursor,
            "structured reply header",
            STRUCTURED_REPLY_MAGIC,
        )?;
        Ok(StructuredReplyHeader {
            flags: cursor.u16()?,
            reply_type: cursor.u16()?,
            handle: cursor.u64()?,
            length_bytes: cursor.u32()?,
        })
    }

    pub fn is_done(&self) -> bool {
        self.flags & REPLY_FLAG_DONE != 0
    }

    pub fn is_error(&self) -> bool {
        self.reply_type & REPLY_TYPE_FLAG_ERROR != 0
    }
}

/// Which reply magic starts `bytes` (first four bytes), if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyKind {
    Simple,
    Structured,
}

impl ReplyKind {
    pub fn detect(bytes: &[u8]) -> Result<Self, ProtoError> {
        let magic = Cursor::new("reply magic", bytes).u32()?;
        match magic {
            SIMPLE_REPLY_MAGIC => Ok(ReplyKind::Simple),
            STRUCTURED_REPLY_MAGIC => Ok(ReplyKind::Structured),
            got => Err(ProtoError::BadMagic {
                what: "reply",
                expected: u64::from(SIMPLE_REPLY_MAGIC),
                got: u64::from(got),
            }),
        }
    }
}

/// Length of the header written by [`encode_offset_data_header_into`].
pub const OFFSET_DATA_HEADER_BYTES: usize =
    STRUCTURED_REPLY_HEADER_BYTES + OFFSET_DATA_PREFIX_BYTES;

/// Writes, into the first [`OFFSET_DATA_HEADER_BYTES`] of `out`, the header of
/// a final (`NBD_REPLY_FLAG_DONE`) `NBD_REPLY_TYPE_OFFSET_DATA` chunk
/// carrying `data_length_bytes` bytes read at `offset_bytes`. The data
/// follows in the same buffer.
pub fn encode_offset_data_header_into(
    out: &mut [u8],
    handle: u64,
    offset_bytes: u64,
    data_length_bytes: u32,
) -> Result<(), ProtoError> {
    let payload_length = data_length_bytes
        .checked_add(OFFSET_DATA_PREFIX_BYTES as u32)
        .filter(|_| data_length_bytes > 0)
        .ok_or(ProtoError::BadLength {
            what: "offset data chunk",
            length: u64::from(data_length_bytes),
        })?;
    let header = StructuredReplyHeader {
        flags: REPLY_FLAG_DONE,
        reply_type: REPLY_TYPE_OFFSET_DATA,
        handle,
        length_bytes: payload_length,
    };
    let mut prefix = [0u8; OFFSET_DATA_HEADER_BYTES];
    prefix[..STRUCTURED_REPLY_HEADER_BYTES].copy_from_slice(&header.encode());
    prefix[STRUCTURED_REPLY_HEADER_BYTES..].copy_from_slice(&offset_bytes.to_be_bytes());
    write_prefix("offset data header", out, &prefix)
}

/// `NBD_REPLY_TYPE_OFFSET_DATA` payload: offset, then at least one byte.
pub fn decode_offset_data_payload(payload: &[u8]) -> Result<(u64, &[u8]), ProtoError> {
    let mut cursor = Cursor::new("offset data chunk", payload);
    let offset_bytes = cursor.u64()?;
    let data = cursor.rest();
    if data.is_empty() {
        return Err(ProtoError::BadLength {
            what: "offset data chunk",
            length: payload.len() as u64,
        });
    }
    Ok((offset_bytes, data))
}

/// `NBD_REPLY_TYPE_OFFSET_HOLE` payload: offset and nonzero hole size.
pub fn decode_offset_hole_payload(payload: &[u8]) -> Result<(u64, u32), ProtoError> {
    let mut cursor = Cursor::new("offset hole chunk", payload);
    let offset_bytes = cursor.u64()?;
    let hole_bytes = cursor.u32()?;
    cursor.finish()?;
    if hole_bytes == 0 {
        return Err(ProtoError::BadLength {
            what: "offset hole chunk",
            length: 0,
        });
    }
    Ok((offset_bytes, hole_bytes))
}

/// A complete final `NBD_REPLY_TYPE_NONE` chunk.
pub fn encode_none_chunk(handle: u64) -> [u8; STRUCTURED_REPLY_HEADER_BYTES] {
    StructuredReplyHeader {
        flags: REPLY_FLAG_DONE,
        reply_type: REPLY_TYPE_NONE,
        handle,
        length_bytes: 0,
    }
    .encode()
}

/// A complete final `NBD_REPLY_TYPE_ERROR` chunk. `message` is cut to the
/// longest string the specification allows; never fails.
pub fn encode_error_chunk(handle: u64, error: u32, message: &str) -> Vec<u8> {
    let message = truncate_message(message, MAX_STRING_BYTES);
    // At most MAX_STRING_BYTES (4096), so both conversions succeed.
    let message_length = u16::try_from(message.len()).unwrap_or(0);
    let message = message.get(..usize::from(message_length)).unwrap_or("");
    let header = StructuredReplyHeader {
        flags: REPLY_FLAG_DONE,
        reply_type: REPLY_TYPE_ERROR,
        handle,
        length_bytes: 6 + u32::from(message_length),
    };
    let mut out = Vec::with_capacity(STRUCTURED_REPLY_HEADER_BYTES + 6 + message.len());
    out.extend_from_slice(&header.encode());
    out.extend_from_slice(&error.to_be_bytes());
    out.extend_from_slice(&message_length.to_be_bytes());
    out.extend_from_slice(message.as_bytes());
    out
}

/// Payload of an error chunk (`NBD_REPLY_TYPE_ERROR`, `_ERROR_OFFSET`, or
/// an unknown type with bit 15 set).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorChunk {
    pub error: u32,
    pub message: String,
    /// Present for `NBD_REPLY_TYPE_ERROR_OFFSET`.
    pub offset_bytes: Option<u64>,
}

impl ErrorChunk {
    pub fn decode(reply_type: u16, payload: &[u8]) -> Result<Self, ProtoError> {
        let mut cursor = Cursor::new("error chunk", payload);
        let error = cursor.u32()?;
        let message_length = cursor.u16()?;
        let message = cursor.take(usize::from(message_length))?;
        if usize::from(message_length) > MAX_STRING_BYTES {
            return Err(ProtoError::TooLong {
                what: "error message",
                length: usize::from(message_length),
                max: MAX_STRING_BYTES,
            });
        }
        let message = check_string("error message", message)?.to_owned();
        let offset_bytes = match reply_type {
            REPLY_TYPE_ERROR_OFFSET => Some(cursor.u64()?),
            REPLY_TYPE_ERROR => None,
            // Unknown error types carry more fields we do not understand.
            _ => {
                cursor.rest();
                None
            }
        };
        cursor.finish()?;
        if error == 0 {
            return Err(ProtoError::BadLength {
                what: "error chunk error value",
                length: 0,
            });
        }
        Ok(ErrorChunk {
            error,
            message,
            offset_bytes,
        })
    }
}

/// One `base:allocation`-style extent descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockDescriptor {
    pub length_bytes: u32,
    pub status_flags: u32,
}

/// A complete final `NBD_REPLY_TYPE_BLOCK_STATUS` chunk.
pub fn encode_block_status_chunk(
    handle: u64,
    context_id: u32,
    descriptors: &[BlockDescriptor],
) -> Result<Vec<u8>, ProtoError> {
    if descriptors.is_empty() || descriptors.iter().any(|d| d.length_bytes == 0) {
        return Err(ProtoError::BadLength {
            what: "block status descriptors",
            length: descriptors.len() as u64,
        });
    }
    let payload_bytes = descriptors
        .len()
        .checked_mul(8)
        .and_then(|bytes| bytes.checked_add(4))
        .ok_or(ProtoError::BadLength {
            what: "block status chunk",
            length: descriptors.len() as u64,
        })?;
    let header = StructuredReplyHeader {
        flags: REPLY_FLAG_DONE,
        reply_type: REPLY_TYPE_BLOCK_STATUS,
        handle,
        length_bytes: length_u32("block status chunk", payload_bytes)?,
    };
    let mut out = Vec::with_capacity(STRUCTURED_REPLY_HEADER_BYTES + payload_bytes);
    out.extend_from_slice(&header.encode());
    out.extend_from_slice(&context_id.to_be_bytes());
    for descriptor in descriptors {
        out.extend_from_slice(&descriptor.length_bytes.to_be_bytes());
        out.extend_from_slice(&descriptor.status_flags.to_be_bytes());
    }
    Ok(out)
}

/// `NBD_REPLY_TYPE_BLOCK_STATUS` payload: context id and one or more
/// descriptors with nonzero lengths.
pub fn decode_block_status_payload(
    payload: &[u8],
) -> Result<(u32, Vec<BlockDescriptor>), ProtoError> {
    let mut cursor = Cursor::new("block status chunk", payload);
    let context_id = cursor.u32()?;
    let remaining_bytes = cursor.remaining_bytes();
    if remaining_bytes == 0 || !remaining_bytes.is_multiple_of(8) {
        return Err(ProtoError::BadLength {
            what: "block status chunk",
            length: payload.len() as u64,
        });
    }
    let mut descriptors = Vec::with_capacity(remaining_bytes / 8);
    while cursor.remaining_bytes() > 0 {
        let descriptor = BlockDescriptor {
            length_bytes: cursor.u32()?,
            status_flags: cursor.u32()?,
        };
        if descriptor.length_bytes == 0 {
            return Err(ProtoError::BadLength {
                what: "block status descriptor",
                length: 0,
            });
        }
        descriptors.push(descriptor);
    }
    Ok((context_id, descriptors))
}

fn write_prefix(what: &'static str, out: &mut [u8], prefix: &[u8]) -> Result<(), ProtoError> {
    match out.get_mut(..prefix.len()) {
        Some(target) => {
            target.copy_from_slice(prefix);
            Ok(())
        }
        None => Err(ProtoError::Truncated {
            what,
            needed_bytes: prefix.len(),
            got_bytes: out.len(),
        }),
    }
}
