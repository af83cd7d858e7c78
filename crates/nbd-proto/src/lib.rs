//! NBD wire protocol: encoding and decoding only. No I/O, no runtime, no
//! dependencies. Every decoder takes a byte slice and returns
//! `Result<_, ProtoError>`; none panics on any input (see the randomized
//! tests and the `fuzz/` targets).
//!
//! Modules: [`consts`] (all numbers), [`handshake`] (greeting, client flags,
//! EXPORT_NAME reply), [`option`] (option framing, LIST entries),
//! [`info`] (INFO/GO data and NBD_REP_INFO), [`meta`] (metadata context
//! options), [`request`] (transmission requests), [`reply`] (simple and
//! structured replies), [`error`] (`ProtoError`).
//!
//! # Byte layouts
//!
//! All integers are big-endian. `S:` server to client, `C:` client to server.
//!
//! ```text
//! Greeting (S, 18)          u64 NBDMAGIC 0x4e42444d41474943
//!                           u64 IHAVEOPT 0x49484156454F5054
//!                           u16 handshake flags (FIXED_NEWSTYLE=1, NO_ZEROES=2)
//! Client flags (C, 4)       u32 (C_FIXED_NEWSTYLE=1, C_NO_ZEROES=2)
//!
//! Option request (C, 16+n)  u64 IHAVEOPT | u32 option | u32 n | n bytes data
//! Option reply (S, 20+n)    u64 0x0003e889045565a9 | u32 option
//!                           u32 reply type (bit 31 = error) | u32 n | n bytes
//! EXPORT_NAME data          the whole data is the name (UTF-8, no NUL, <= 4096)
//! EXPORT_NAME reply (S)     u64 size | u16 transmission flags
//!                           [124 zero bytes unless C_NO_ZEROES]
//! NBD_REP_SERVER data       u32 name length | name | description (rest)
//! INFO / GO data            u32 name length | name | u16 count | count x u16 info type
//! NBD_REP_INFO data         u16 info type | payload:
//!     INFO_EXPORT (0)         u64 size | u16 transmission flags       (12 bytes total)
//!     INFO_NAME (1)           name (rest)
//!     INFO_DESCRIPTION (2)    description (rest)
//!     INFO_BLOCK_SIZE (3)     u32 minimum | u32 preferred | u32 maximum (14 bytes total)
//! LIST/SET_META_CONTEXT     u32 name length | name | u32 query count
//!                           count x (u32 query length | query)
//! NBD_REP_META_CONTEXT      u32 context id | context name (rest)
//!
//! Request (C, 28[+n])       u32 0x25609513 | u16 command flags | u16 type
//!                           u64 handle | u64 offset | u32 length n
//!                           [n bytes data for NBD_CMD_WRITE]
//! Simple reply (S, 16[+n])  u32 0x67446698 | u32 error | u64 handle
//!                           [n bytes data for a successful NBD_CMD_READ]
//! Structured chunk (S, 20+n) u32 0x668e33ef | u16 flags (DONE=1) | u16 type
//!                           u64 handle | u32 n | n bytes payload:
//!     NONE (0)                empty
//!     OFFSET_DATA (1)         u64 offset | data (>= 1 byte)
//!     OFFSET_HOLE (2)         u64 offset | u32 hole size (nonzero)
//!     BLOCK_STATUS (5)        u32 context id | k >= 1 x (u32 length != 0 | u32 flags)
//!     ERROR (0x8001)          u32 error | u16 message length m | m bytes message
//!     ERROR_OFFSET (0x8002)   u32 error | u16 m | m bytes message | u64 offset
//! ```
//!
//! Decoders of fixed-size headers read the first bytes of the slice they are
//! given and ignore the rest (framing is the caller's job); decoders of
//! payloads whose length is known reject trailing bytes.

pub mod consts;
pub mod error;
pub mod handshake;
pub mod info;
pub mod meta;
pub mod option;
pub mod reply;
pub mod request;
mod wire;

#[doc(hidden)]
pub mod fuzzing;

#[cfg(test)]
mod tests;

#[cfg(test)]
mod random_tests;

pub use error::ProtoError;
pub use handshake::{ClientFlags, ExportNameReply, Greeting};
pub use info::{InfoReply, InfoRequest};
pub use meta::{MetaContextReply, MetaContextRequest};
pub use option::{
    decode_export_name, encode_option_error_into, encode_option_reply_into, OptionHeader,
    OptionReplyHeader, ServerEntry,
};
pub use reply::{
    decode_block_status_payload, decode_offset_data_payload, decode_offset_hole_payload,
    encode_block_status_chunk, encode_error_chunk, encode_none_chunk,
    encode_offset_data_header_into, BlockDescriptor, ErrorChunk, ReplyKind, SimpleReplyHeader,
    StructuredReplyHeader, OFFSET_DATA_HEADER_BYTES,
};
pub use request::{Command, RequestHeader};
