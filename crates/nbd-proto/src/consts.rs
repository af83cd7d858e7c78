//! Every number the protocol fixes: magics, flags, option and reply codes,
//! command types, errno values and fixed message sizes.
//!
//! Names follow the NBD specification (`doc/proto.md`) without the `NBD_`
//! prefix. Flag values are bit masks in host order; they travel big-endian.

// ---- Magics ----------------------------------------------------------------

/// `NBDMAGIC`: first eight bytes the server sends.
pub const INIT_PASSWD: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`: newstyle greeting magic and option request magic.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Magic of every fixed-newstyle option reply.
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// Magic of a transmission request.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// Magic of a simple reply.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// Magic of a structured reply chunk.
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

// ---- Handshake flags (server, 16 bits) -------------------------------------

pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;

// ---- Client flags (32 bits) ------------------------------------------------

pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

// ---- Transmission flags (16 bits) ------------------------------------------

pub const FLAG_HAS_FLAGS: u16 = 1 << 0;
pub const FLAG_READ_ONLY: u16 = 1 << 1;
pub const FLAG_SEND_FLUSH: u16 = 1 << 2;
pub const FLAG_SEND_FUA: u16 = 1 << 3;
pub const FLAG_ROTATIONAL: u16 = 1 << 4;
pub const FLAG_SEND_TRIM: u16 = 1 << 5;
pub const FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const FLAG_SEND_DF: u16 = 1 << 7;
pub const FLAG_CAN_MULTI_CONN: u16 = 1 << 8;
pub const FLAG_SEND_RESIZE: u16 = 1 << 9;
pub const FLAG_SEND_CACHE: u16 = 1 << 10;
pub const FLAG_SEND_FAST_ZERO: u16 = 1 << 11;

// ---- Option types ----------------------------------------------------------

pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_PEEK_EXPORT: u32 = 4;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;
pub const OPT_EXTENDED_HEADERS: u32 = 11;

// ---- Option reply types ----------------------------------------------------

pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_META_CONTEXT: u32 = 4;
/// Bit 31 marks an error reply.
pub const REP_FLAG_ERROR: u32 = 1 << 31;
pub const REP_ERR_UNSUP: u32 = REP_FLAG_ERROR | 1;
pub const REP_ERR_POLICY: u32 = REP_FLAG_ERROR | 2;
pub const REP_ERR_INVALID: u32 = REP_FLAG_ERROR | 3;
pub const REP_ERR_PLATFORM: u32 = REP_FLAG_ERROR | 4;
pub const REP_ERR_TLS_REQD: u32 = REP_FLAG_ERROR | 5;
pub const REP_ERR_UNKNOWN: u32 = REP_FLAG_ERROR | 6;
pub const REP_ERR_SHUTDOWN: u32 = REP_FLAG_ERROR | 7;
pub const REP_ERR_BLOCK_SIZE_REQD: u32 = REP_FLAG_ERROR | 8;
pub const REP_ERR_TOO_BIG: u32 = REP_FLAG_ERROR | 9;

// ---- Info types (NBD_REP_INFO / NBD_OPT_INFO, NBD_OPT_GO) ------------------

pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

// ---- Commands --------------------------------------------------------------

pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_CACHE: u16 = 5;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_BLOCK_STATUS: u16 = 7;

// ---- Command flags ---------------------------------------------------------

pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const CMD_FLAG_DF: u16 = 1 << 2;
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;

// ---- Structured replies ----------------------------------------------------

pub const REPLY_FLAG_DONE: u16 = 1 << 0;
pub const REPLY_TYPE_NONE: u16 = 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_OFFSET_HOLE: u16 = 2;
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
/// Bit 15 marks an error chunk.
pub const REPLY_TYPE_FLAG_ERROR: u16 = 1 << 15;
pub const REPLY_TYPE_ERROR: u16 = REPLY_TYPE_FLAG_ERROR | 1;
pub const REPLY_TYPE_ERROR_OFFSET: u16 = REPLY_TYPE_FLAG_ERROR | 2;

// ---- base:allocation state flags -------------------------------------------

pub const STATE_HOLE: u32 = 1 << 0;
pub const STATE_ZERO: u32 = 1 << 1;
/// Name of the one metadata context this crate knows.
pub const CONTEXT_BASE_ALLOCATION: &str = "base:allocation";

// ---- Error values (the reply "error" field) --------------------------------

pub const EPERM: u32 = 1;
pub const EIO: u32 = 5;
pub const ENOMEM: u32 = 12;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const EOVERFLOW: u32 = 75;
pub const ENOTSUP: u32 = 95;
pub const ESHUTDOWN: u32 = 108;

// ---- Sizes -----------------------------------------------------------------

/// Server greeting: INIT_PASSWD, IHAVEOPT, handshake flags.
pub const GREETING_BYTES: usize = 18;
/// Client flags after the greeting.
pub const CLIENT_FLAGS_BYTES: usize = 4;
/// Option request header: IHAVEOPT, option, length.
pub const OPTION_HEADER_BYTES: usize = 16;
/// Option reply header: magic, option, reply type, length.
pub const OPTION_REPLY_HEADER_BYTES: usize = 20;
/// Reply to NBD_OPT_EXPORT_NAME without the 124 zero bytes.
pub const EXPORT_NAME_REPLY_SHORT_BYTES: usize = 10;
/// The reserved zeroes after an NBD_OPT_EXPORT_NAME reply.
pub const EXPORT_NAME_REPLY_ZEROES_BYTES: usize = 124;
/// Transmission request header.
pub const REQUEST_HEADER_BYTES: usize = 28;
/// Simple reply header.
pub const SIMPLE_REPLY_HEADER_BYTES: usize = 16;
/// Structured reply chunk header.
pub const STRUCTURED_REPLY_HEADER_BYTES: usize = 20;
/// Offset field at the start of an OFFSET_DATA payload.
pub const OFFSET_DATA_PREFIX_BYTES: usize = 8;
/// Longest string the specification allows (names, messages).
pub const MAX_STRING_BYTES: usize = 4096;
