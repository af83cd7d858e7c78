//! Transmission requests: the 28-byte header and the command types.

use crate::consts::*;
use crate::error::ProtoError;
use crate::handshake::expect_magic32;
use crate::wire::Cursor;

/// The commands this crate knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Command {
    Read,
    Write,
    Disc,
    Flush,
    Trim,
    Cache,
    WriteZeroes,
    BlockStatus,
}

impl Command {
    /// The command for a wire type, `None` if unknown.
    pub fn from_wire(command_type: u16) -> Option<Self> {
        Some(match command_type {
            CMD_READ => Command::Read,
            CMD_WRITE => Command::Write,
            CMD_DISC => Command::Disc,
            CMD_FLUSH => Command::Flush,
            CMD_TRIM => Command::Trim,
            CMD_CACHE => Command::Cache,
            CMD_WRITE_ZEROES => Command::WriteZeroes,
            CMD_BLOCK_STATUS => Command::BlockStatus,
            _ => return None,
        })
    }

    pub fn to_wire(self) -> u16 {
        match self {
            Command::Read => CMD_READ,
            Command::Write => CMD_WRITE,
            Command::Disc => CMD_DISC,
            Command::Flush => CMD_FLUSH,
            Command::Trim => CMD_TRIM,
            Command::Cache => CMD_CACHE,
            Command::WriteZeroes => CMD_WRITE_ZEROES,
            Command::BlockStatus => CMD_BLOCK_STATUS,
        }
    }

    /// Command flags the specification documents for this command.
    pub fn documented_flags(self) -> u16 {
        match self {
            Command::Read => CMD_FLAG_FUA | CMD_FLAG_DF,
            Command::WriteZeroes => CMD_FLAG_FUA | CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
            Command::BlockStatus => CMD_FLAG_FUA | CMD_FLAG_REQ_ONE,
            _ => CMD_FLAG_FUA,
        }
    }
}

/// Magic, command flags, type, handle, offset, length. For `NBD_CMD_WRITE`
/// `length_bytes` of data follow the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHeader {
    pub flags: u16,
    /// Raw command type; see [`Command::from_wire`].
    pub command_type: u16,
    pub handle: u64,
    pub offset_bytes: u64,
    pub length_bytes: u32,
}

impl RequestHeader {
    pub fn encode(&self) -> [u8; REQUEST_HEADER_BYTES] {
        let mut out = [0u8; REQUEST_HEADER_BYTES];
        out[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        out[4..6].copy_from_slice(&self.flags.to_be_bytes());
        out[6..8].copy_from_slice(&self.command_type.to_be_bytes());
        out[8..16].copy_from_slice(&self.handle.to_be_bytes());
        out[16..24].copy_from_slice(&self.offset_bytes.to_be_bytes());
        out[24..28].copy_from_slice(&self.length_bytes.to_be_bytes());
        out
    }

    /// Decodes the first [`REQUEST_HEADER_BYTES`] of `bytes`.
    pub fn decode(bytes: &[u8]) -> Result<Self, ProtoError> {
        let mut cursor = Cursor::new("request header", bytes);
        expect_magic32(&mut cursor, "request header", REQUEST_MAGIC)?;
        Ok(RequestHeader {
            flags: cursor.u16()?,
            command_type: cursor.u16()?,
            handle: cursor.u64()?,
            offset_bytes: cursor.u64()?,
            length_bytes: cursor.u32()?,
        })
    }

    pub fn command(&self) -> Option<Command> {
        Command::from_wire(self.command_type)
    }
}
