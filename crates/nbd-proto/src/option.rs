//! Option haggling framing: the option request header, the option reply
//! header, and the small payloads of `NBD_OPT_EXPORT_NAME` and
//! `NBD_REP_SERVER`.

use crate::consts::*;
use crate::error::ProtoError;
use crate::handshake::expect_magic64;
use crate::wire::{check_string, length_u32, string_length, truncate_message, Cursor};

/// `IHAVEOPT`, option, length of the option data that follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionHeader {
    pub option: u32,
    pub length_bytes: u32,
}

impl OptionHeader {
    pub fn encode(&self) -> [u8; OPTION_HEADER_BYTES] {
        let mut out = [0u8; OPTION_HEADER_BYTES];
        out[0..8].copy_from_slice(&IHAVEOPT.to_be_bytes());
        out[8..12].copy_from_slice(&self.option.to_be_bytes());
        out[12..16].copy_from_slice(&self.length_bytes.to_be_bytes());
        out
    }

    /// Decodes the first [`OPTION_HEADER_BYTES`] of `bytes`.
    pub fn decode(bytes: &[u8]) -> Result<Self, ProtoError> {
        let mut cursor = Cursor::new("option header", bytes);
        expect_magic64(&mut cursor, "option header", IHAVEOPT)?;
        Ok(OptionHeader {
            option: cursor.u32()?,
            length_bytes: cursor.u32()?,
        })
    }
}

/// Magic, option being answered, reply type, length of the reply data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionReplyHeader {
    pub option: u32,
    pub reply_type: u32,
    pub length_bytes: u32,
}

impl OptionReplyHeader {
    pub fn encode(&self) -> [u8; OPTION_REPLY_HEADER_BYTES] {
        let mut out = [0u8; OPTION_REPLY_HEADER_BYTES];
        out[0..8].copy_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
        out[8..12].copy_from_slice(&self.option.to_be_bytes());
        out[12..16].copy_from_slice(&self.reply_type.to_be_bytes());
        out[16..20].copy_from_slice(&self.length_bytes.to_be_bytes());
        out
    }

    /// Decodes the first [`OPTION_REPLY_HEADER_BYTES`] of `bytes`.
    pub fn decode(bytes: &[u8]) -> Result<Self, ProtoError> {
        let mut cursor = Cursor::new("option reply header", bytes);
        expect_magic64(&mut cursor, "option reply header", OPTION_REPLY_MAGIC)?;
        Ok(OptionReplyHeader {
            option: cursor.u32()?,
            reply_type: cursor.u32()?,
            length_bytes: cursor.u32()?,
        })
    }

    /// Whether the reply type has the error bit set.
    pub fn is_error(&self) -> bool {
        self.reply_type & REP_FLAG_ERROR != 0
    }
}

/// Appends one complete option reply (header and `payload`) to `out`.
pub fn encode_option_reply_into(
    out: &mut Vec<u8>,
    option: u32,
    reply_type: u32,
    payload: &[u8],
) -> Result<(), ProtoError> {
    let header = OptionReplyHeader {
        option,
        reply_type,
        length_bytes: length_u32("option reply", payload.len())?,
    };
    out.extend_from_slice(&header.encode());
    out.extend_from_slice(payload);
    Ok(())
}

/// Appends an error option reply whose data is `message`, cut to the
/// longest string the specification allows. Never fails.
pub fn encode_option_error_into(out: &mut Vec<u8>, option: u32, reply_type: u32, message: &str) {
    let message = truncate_message(message, MAX_STRING_BYTES);
    let header = OptionReplyHeader {
        option,
        reply_type,
        // At most MAX_STRING_BYTES, so it fits.
        length_bytes: u32::try_from(message.len()).unwrap_or(0),
    };
    out.extend_from_slice(&header.encode());
    if header.length_bytes != 0 {
        out.extend_from_slice(message.as_bytes());
    }
}

/// The data of `NBD_OPT_EXPORT_NAME`: the whole option data is the name.
pub fn decode_export_name(data: &[u8]) -> Result<String, ProtoError> {
    if data.len() > MAX_STRING_BYTES {
        return Err(ProtoError::TooLong {
            what: "export name",
            length: data.len(),
            max: MAX_STRING_BYTES,
        });
    }
    Ok(check_string("export name", data)?.to_owned())
}

/// One export as `NBD_REP_SERVER` describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerEntry {
    pub name: String,
    pub description: String,
}

impl ServerEntry {
    /// The `NBD_REP_SERVER` payload: name length, name, description.
    pub fn encode(&self) -> Result<Vec<u8>, ProtoError> {
        let name_length = string_length("export name", &self.name)?;
        string_length("export description", &self.description)?;
        let mut out = Vec::with_capacity(4 + self.name.len() + self.description.len());
        out.extend_from_slice(&name_length.to_be_bytes());
        out.extend_from_slice(self.name.as_bytes());
        out.extend_from_slice(self.description.as_bytes());
        Ok(out)
    }

    pub fn decode(payload: &[u8]) -> Result<Self, ProtoError> {
        let mut cursor = Cursor::new("NBD_REP_SERVER", payload);
        let name = cursor.prefixed_string("export name")?.to_owned();
        let rest = cursor.rest();
        if rest.len() > MAX_STRING_BYTES {
            return Err(ProtoError::TooLong {
                what: "export description",
                length: rest.len(),
                max: MAX_STRING_BYTES,
            });
        }
        let description = check_string("export description", rest)?.to_owned();
        Ok(ServerEntry { name, description })
    }
}
