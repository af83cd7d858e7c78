//! `NBD_OPT_INFO` / `NBD_OPT_GO` request data and the `NBD_REP_INFO`
//! payloads answering them.

use crate::consts::*;
use crate::error::ProtoError;
use crate::wire::{check_string, string_length, Cursor};

/// Data of `NBD_OPT_INFO` and `NBD_OPT_GO`: export name and the information
/// types the client asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InfoRequest {
    pub export_name: String,
    pub info_types: Vec<u16>,
}

impl InfoRequest {
    pub fn encode(&self) -> Result<Vec<u8>, ProtoError> {
        let name_length = string_length("export name", &self.export_name)?;
        let count = u16::try_from(self.info_types.len()).map_err(|_| ProtoError::TooLong {
            what: "information requests",
            length: self.info_types.len(),
            max: usize::from(u16::MAX),
        })?;
        let mut out = Vec::with_capacity(6 + self.export_name.len() + 2 * self.info_types.len());
        out.extend_from_slice(&name_length.to_be_bytes());
        out.extend_from_slice(self.export_name.as_bytes());
        out.extend_from_slice(&count.to_be_bytes());
        for info_type in &self.info_types {
            out.extend_from_slice(&info_type.to_be_bytes());
        }
        Ok(out)
    }

    /// Decodes the whole option data; trailing bytes are an error.
    pub fn decode(data: &[u8]) -> Result<Self, ProtoError> {
        let mut cursor = Cursor::new("NBD_OPT_INFO/GO data", data);
        let export_name = cursor.prefixed_string("export name")?.to_owned();
        let count = cursor.u16()?;
        let needed_bytes = usize::from(count) * 2;
        if needed_bytes != cursor.remaining_bytes() {
            return Err(ProtoError::BadLength {
                what: "information request count",
                length: u64::from(count),
            });
        }
        let mut info_types = Vec::with_capacity(usize::from(count));
        for _ in 0..count {
            info_types.push(cursor.u16()?);
        }
        cursor.finish()?;
        Ok(InfoRequest {
            export_name,
            info_types,
        })
    }
}

/// One `NBD_REP_INFO` payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InfoReply {
    /// `NBD_INFO_EXPORT`: size and transmission flags.
    Export {
        size_bytes: u64,
        transmission_flags: u16,
    },
    /// `NBD_INFO_NAME`: canonical export name.
    Name(String),
    /// `NBD_INFO_DESCRIPTION`: human readable description.
    Description(String),
    /// `NBD_INFO_BLOCK_SIZE`: block size constraints.
    BlockSize {
        minimum_bytes: u32,
        preferred_bytes: u32,
        maximum_bytes: u32,
    },
    /// A type this crate does not know; clients must ignore it.
    Unknown { info_type: u16, data: Vec<u8> },
}

impl InfoReply {
    pub fn encode(&self) -> Result<Vec<u8>, ProtoError> {
        let mut out = Vec::with_capacity(14);
        match self {
            InfoReply::Export {
                size_bytes,
                transmission_flags,
            } => {
                out.extend_from_slice(&INFO_EXPORT.to_be_bytes());
                out.extend_from_slice(&size_bytes.to_be_bytes());
                out.extend_from_slice(&transmission_flags.to_be_bytes());
            }
            InfoReply::Name(name) => {
                string_length("export name", name)?;
                out.extend_from_slice(&INFO_NAME.to_be_bytes());
                out.extend_from_slice(name.as_bytes());
            }
            InfoReply::Description(text) => {
                string_length("export description", text)?;
                out.extend_from_slice(&INFO_DESCRIPTION.to_be_bytes());
                out.extend_from_slice(text.as_bytes());
            }
            InfoReply::BlockSize {
                minimum_bytes,
                preferred_bytes,
                maximum_bytes,
            } => {
                out.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
                out.extend_from_slice(&minimum_bytes.to_be_bytes());
                out.extend_from_slice(&preferred_bytes.to_be_bytes());
                out.extend_from_slice(&maximum_bytes.to_be_bytes());
            }
            InfoReply::Unknown { info_type, data } => {
                out.extend_from_slice(&info_type.to_be_bytes());
                out.extend_from_slice(data);
            }
        }
        Ok(out)
    }

    /// Decodes one whole `NBD_REP_INFO` payload.
    pub fn decode(payload: &[u8]) -> Result<Self, ProtoError> {
        let mut cursor = Cursor::new("NBD_REP_INFO", payload);
        let info_type = cursor.u16()?;
        let reply = match info_type {
            INFO_EXPORT => InfoReply::Export {
                size_bytes: cursor.u64()?,
                transmission_flags: cursor.u16()?,
            },
            INFO_NAME => InfoReply::Name(decode_text("export name", cursor.rest())?),
            INFO_DESCRIPTION => {
                InfoReply::Description(decode_text("export description", cursor.rest())?)
            }
            INFO_BLOCK_SIZE => InfoReply::BlockSize {
                minimum_bytes: cursor.u32()?,
                preferred_bytes: cursor.u32()?,
                maximum_bytes: cursor.u32()?,
            },
            _ => InfoReply::Unknown {
                info_type,
                data: cursor.rest().to_vec(),
            },
        };
        cursor.finish()?;
        Ok(reply)
    }
}

fn decode_text(what: &'static str, bytes: &[u8]) -> Result<String, ProtoError> {
    if bytes.len() > MAX_STRING_BYTES {
        return Err(ProtoError::TooLong {
            what,
            length: bytes.len(),
            max: MAX_STRING_BYTES,
        });
    }
    Ok(check_string(what, bytes)?.to_owned())
}
