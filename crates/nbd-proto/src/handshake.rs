//! The fixed-newstyle greeting, the client flags answering it, and the
//! reply that ends haggling after `NBD_OPT_EXPORT_NAME`.

use crate::consts::*;
use crate::error::ProtoError;
use crate::wire::Cursor;

/// What the server sends first: `NBDMAGIC`, `IHAVEOPT`, handshake flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Greeting {
    pub handshake_flags: u16,
}

impl Greeting {
    pub fn encode(&self) -> [u8; GREETING_BYTES] {
        let mut out = [0u8; GREETING_BYTES];
        out[0..8].copy_from_slice(&INIT_PASSWD.to_be_bytes());
        out[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
        out[16..18].copy_from_slice(&self.handshake_flags.to_be_bytes());
        out
    }

    /// Decodes the first [`GREETING_BYTES`] of `bytes`.
    pub fn decode(bytes: &[u8]) -> Result<Self, ProtoError> {
        let mut cursor = Cursor::new("greeting", bytes);
        expect_magic64(&mut cursor, "greeting", INIT_PASSWD)?;
        expect_magic64(&mut cursor, "greeting", IHAVEOPT)?;
        Ok(Greeting {
            handshake_flags: cursor.u16()?,
        })
    }
}

/// The client's answer to the greeting.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClientFlags {
    pub fixed_newstyle: bool,
    pub no_zeroes: bool,
}

impl ClientFlags {
    pub fn encode(&self) -> [u8; CLIENT_FLAGS_BYTES] {
        let mut flags = 0u32;
        if self.fixed_newstyle {
            flags |= FLAG_C_FIXED_NEWSTYLE;
        }
        if self.no_zeroes {
            flags |= FLAG_C_NO_ZEROES;
        }
        flags.to_be_bytes()
    }

    /// Decodes the first [`CLIENT_FLAGS_BYTES`] of `bytes`. The client may
    /// only set flags matching `offered_handshake_flags`; anything else is an
    /// error after which the server must drop the connection.
    pub fn decode(bytes: &[u8], offered_handshake_flags: u16) -> Result<Self, ProtoError> {
        let flags = Cursor::new("client flags", bytes).u32()?;
        let mut allowed = 0u32;
        if offered_handshake_flags & FLAG_FIXED_NEWSTYLE != 0 {
            allowed |= FLAG_C_FIXED_NEWSTYLE;
        }
        if offered_handshake_flags & FLAG_NO_ZEROES != 0 {
            allowed |= FLAG_C_NO_ZEROES;
        }
        if flags & !allowed != 0 {
            return Err(ProtoError::UnknownFlags {
                what: "client flags",
                flags: flags & !allowed,
            });
        }
        Ok(ClientFlags {
            fixed_newstyle: flags & FLAG_C_FIXED_NEWSTYLE != 0,
            no_zeroes: flags & FLAG_C_NO_ZEROES != 0,
        })
    }
}

/// The server's answer to `NBD_OPT_EXPORT_NAME`: size and transmission
/// flags, then 124 zero bytes unless the client set `NBD_FLAG_C_NO_ZEROES`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExportNameReply {
    pub size_bytes: u64,
    pub transmission_flags: u16,
}

impl ExportNameReply {
    pub fn encode(&self, no_zeroes: bool) -> Vec<u8> {
        let zeroes_bytes = if no_zeroes {
            0
        } else {
            EXPORT_NAME_REPLY_ZEROES_BYTES
        };
        let mut out = Vec::with_capacity(EXPORT_NAME_REPLY_SHORT_BYTES + zeroes_bytes);
        out.extend_from_slice(&self.size_bytes.to_be_bytes());
        out.extend_from_slice(&self.transmission_flags.to_be_bytes());
        out.resize(EXPORT_NAME_REPLY_SHORT_BYTES + zeroes_bytes, 0);
        out
    }

    /// Decodes the first [`EXPORT_NAME_REPLY_SHORT_BYTES`] of `bytes` (the
    /// caller skips the zeroes it asked for).
    pub fn decode(bytes: &[u8]) -> Result<Self, ProtoError> {
        let mut cursor = Cursor::new("export name reply", bytes);
        Ok(ExportNameReply {
            size_bytes: cursor.u64()?,
            transmission_flags: cursor.u16()?,
        })
    }
}

pub(crate) fn expect_magic64(
    cursor: &mut Cursor<'_>,
    what: &'static str,
    expected: u64,
) -> Result<(), ProtoError> {
    let got = cursor.u64()?;
    if got != expected {
        return Err(ProtoError::BadMagic {
            what,
            expected,
            got,
        });
    }
    Ok(())
}

pub(crate) fn expect_magic32(
    cursor: &mut Cursor<'_>,
    what: &'static str,
    expected: u32,
) -> Result<(), ProtoError> {
    let got = cursor.u32()?;
    if got != expected {
        return Err(ProtoError::BadMagic {
            what,
            expected: u64::from(expected),
            got: u64::from(got),
        });
    }
    Ok(())
}
