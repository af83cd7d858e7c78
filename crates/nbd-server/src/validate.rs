//! Request validation: everything the server checks before the device sees
//! a request, turning a valid header into an [`Op`] (command, flags, negotiated features, read-only, range, block
//! size alignment and limits). Pure functions, no I/O.

use nbd_proto::consts::*;
use nbd_proto::{Command, RequestHeader};

use crate::device::ZeroFlags;
use crate::execute::Op;
use crate::export::ExportParams;

/// Why a request is refused: the errno for the reply and a message for
/// structured error chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rejection {
    pub errno: u32,
    pub message: &'static str,
}

const fn reject(errno: u32, message: &'static str) -> Rejection {
    Rejection { errno, message }
}

/// Negotiated state validation depends on.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub params: ExportParams,
    pub has_meta_context: bool,
}

/// Validates one request header. NBD_CMD_DISC is the caller's business
/// (it has no reply); here it is refused like an unknown command.
pub(crate) fn check(limits: &Limits, header: &RequestHeader) -> Result<Op, Rejection> {
    let command = header
        .command()
        .filter(|&command| command != Command::Disc)
        .ok_or(reject(EINVAL, "unknown command"))?;
    check_flags(limits, command, header.flags)?;
    check_feature(limits, command)?;
    if command == Command::Flush {
        if header.offset_bytes != 0 || header.length_bytes != 0 {
            return Err(reject(EINVAL, "flush offset and length must be zero"));
        }
        return Ok(Op::Flush);
    }
    check_length_limit(limits, command, header)?;
    check_range(limits, command, header)?;
    Ok(op(command, header))
}

/// Flags must be documented for the command and offered by our
/// transmission flags (we never offer NBD_FLAG_SEND_DF).
fn check_flags(limits: &Limits, command: Command, flags: u16) -> Result<(), Rejection> {
    let advertised = limits.params.transmission_flags;
    let mut negotiable = CMD_FLAG_NO_HOLE | CMD_FLAG_REQ_ONE;
    if advertised & FLAG_SEND_FUA != 0 {
        negotiable |= CMD_FLAG_FUA;
    }
    if advertised & FLAG_SEND_FAST_ZERO != 0 {
        negotiable |= CMD_FLAG_FAST_ZERO;
    }
    if flags & !(command.documented_flags() & negotiable) != 0 {
        return Err(reject(
            EINVAL,
            "command flags not supported for this command",
        ));
    }
    Ok(())
}

fn check_feature(limits: &Limits, command: Command) -> Result<(), Rejection> {
    let writes = matches!(
        command,
        Command::Write | Command::Trim | Command::WriteZeroes
    );
    if writes && limits.params.read_only {
        return Err(reject(EPERM, "export is read-only"));
    }
    if command == Command::BlockStatus && !limits.has_meta_context {
        return Err(reject(EINVAL, "no metadata context was negotiated"));
    }
    Ok(())
}

/// The maximum block size bounds READ, WRITE, CACHE and WRITE_ZEROES
/// without FAST_ZERO (spec, "Block size constraints").
fn check_length_limit(
    limits: &Limits,
    command: Command,
    header: &RequestHeader,
) -> Result<(), Rejection> {
    let bounded = match command {
        Command::Read | Command::Write | Command::Cache => true,
        Command::WriteZeroes => header.flags & CMD_FLAG_FAST_ZERO == 0,
        _ => false,
    };
    if bounded && header.length_bytes > limits.params.block_sizes.maximum_bytes {
        return Err(reject(
            EINVAL,
            "request length exceeds the maximum block size",
        ));
    }
    if command == Command::BlockStatus && header.length_bytes == 0 {
        return Err(reject(EINVAL, "block status length must not be zero"));
    }
    Ok(())
}

fn check_range(limits: &Limits, command: Command, header: &RequestHeader) -> Result<(), Rejection> {
    let end = header
        .offset_bytes
        .checked_add(u64::from(header.length_bytes));
    if end.is_none_or(|end| end > limits.params.size_bytes) {
        return Err(match command {
            Command::Write | Command::WriteZeroes => {
                reject(ENOSPC, "request extends beyond the end of the export")
            }
            _ => reject(EINVAL, "request extends beyond the end of the export"),
        });
    }
    let minimum_bytes = u64::from(limits.params.block_sizes.minimum_bytes.max(1));
    let aligned = header.offset_bytes.is_multiple_of(minimum_bytes)
        && u64::from(header.length_bytes).is_multiple_of(minimum_bytes);
    if !aligned {
        return Err(reject(
            EINVAL,
            "request not aligned to the minimum block size",
        ));
    }
    Ok(())
}

/// The operation; a WRITE gets its data (still empty) read later.
fn op(command: Command, header: &RequestHeader) -> Op {
    let offset_bytes = header.offset_bytes;
    let length_bytes = header.length_bytes;
    let fua = header.flags & CMD_FLAG_FUA != 0;
    match command {
        Command::Read => Op::Read {
            offset_bytes,
            length_bytes,
        },
        Command::Write => Op::Write {
            offset_bytes,
            length_bytes,
            fua,
            data: Vec::new(),
        },
        Command::Trim => Op::Trim {
            offset_bytes,
            length_bytes,
            fua,
        },
        Command::Cache => Op::Cache {
            offset_bytes,
            length_bytes,
        },
        Command::WriteZeroes => Op::WriteZeroes {
            offset_bytes,
            length_bytes,
            flags: ZeroFlags {
                fua,
                no_hole: header.flags & CMD_FLAG_NO_HOLE != 0,
                fast_zero: header.flags & CMD_FLAG_FAST_ZERO != 0,
            },
        },
        Command::BlockStatus => Op::BlockStatus {
            offset_bytes,
            length_bytes,
            req_one: header.flags & CMD_FLAG_REQ_ONE != 0,
        },
        // Disc never gets here: `check` refuses it.
        Command::Flush | Command::Disc => Op::Flush,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::BlockSizes;
    use crate::export::transmission_flags;

    fn limits(read_only: bool, minimum_bytes: u32) -> Limits {
        Limits {
            params: ExportParams {
                size_bytes: 1 << 20,
                read_only,
                transmission_flags: transmission_flags(read_only),
                block_sizes: BlockSizes {
                    minimum_bytes,
                    preferred_bytes: 4096,
                    maximum_bytes: 65536,
                },
            },
            has_meta_context: true,
        }
    }

    fn header(
        command_type: u16,
        flags: u16,
        offset_bytes: u64,
        length_bytes: u32,
    ) -> RequestHeader {
        RequestHeader {
            flags,
            command_type,
            handle: 1,
            offset_bytes,
            length_bytes,
        }
    }

    fn errno(limits: &Limits, header: RequestHeader) -> u32 {
        check(limits, &header).unwrap_err().errno
    }

    #[test]
    fn accepts_valid_requests() {
        let l = limits(false, 1);
        assert_eq!(
            check(&l, &header(CMD_READ, 0, 0, 4096)),
            Ok(Op::Read {
                offset_bytes: 0,
                length_bytes: 4096
            })
        );
        assert!(check(&l, &header(CMD_WRITE, CMD_FLAG_FUA, (1 << 20) - 1, 1)).is_ok());
        assert!(check(&l, &header(CMD_READ, 0, 1 << 20, 0)).is_ok());
        assert_eq!(check(&l, &header(CMD_FLUSH, 0, 0, 0)), Ok(Op::Flush));
        assert_eq!(errno(&l, header(CMD_DISC, 0, 0, 0)), EINVAL);
        let zero_flags = CMD_FLAG_FUA | CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO;
        assert!(check(&l, &header(CMD_WRITE_ZEROES, zero_flags, 0, 1 << 20)).is_ok());
        assert!(check(&l, &header(CMD_TRIM, 0, 0, 1 << 20)).is_ok());
        assert!(check(&l, &header(CMD_BLOCK_STATUS, CMD_FLAG_REQ_ONE, 0, 1 << 20)).is_ok());
    }

    #[test]
    fn rejects_bad_commands_and_flags() {
        let l = limits(false, 1);
        assert_eq!(errno(&l, header(8, 0, 0, 1)), EINVAL);
        assert_eq!(errno(&l, header(0xffff, 0, 0, 1)), EINVAL);
        assert_eq!(errno(&l, header(CMD_READ, CMD_FLAG_DF, 0, 1)), EINVAL);
        assert_eq!(errno(&l, header(CMD_READ, 1 << 7, 0, 1)), EINVAL);
        assert_eq!(errno(&l, header(CMD_WRITE, CMD_FLAG_NO_HOLE, 0, 1)), EINVAL);
        assert_eq!(errno(&l, header(CMD_FLUSH, 0, 1, 0)), EINVAL);
        assert_eq!(errno(&l, header(CMD_BLOCK_STATUS, 0, 0, 0)), EINVAL);
        let mut no_context = l;
        no_context.has_meta_context = false;
        assert_eq!(
            errno(&no_context, header(CMD_BLOCK_STATUS, 0, 0, 1)),
            EINVAL
        );
    }

    #[test]
    fn rejects_out_of_range() {
        let l = limits(false, 1);
        assert_eq!(errno(&l, header(CMD_READ, 0, 1 << 20, 1)), EINVAL);
        assert_eq!(errno(&l, header(CMD_READ, 0, u64::MAX, 1)), EINVAL);
        assert_eq!(errno(&l, header(CMD_WRITE, 0, u64::MAX - 1, 4)), ENOSPC);
        assert_eq!(errno(&l, header(CMD_WRITE_ZEROES, 0, 1 << 20, 1)), ENOSPC);
        assert_eq!(errno(&l, header(CMD_TRIM, 0, 1, 1 << 20)), EINVAL);
        assert_eq!(errno(&l, header(CMD_BLOCK_STATUS, 0, 1 << 20, 1)), EINVAL);
        assert_eq!(errno(&l, header(CMD_READ, 0, 0, 65537)), EINVAL);
        assert_eq!(errno(&l, header(CMD_WRITE_ZEROES, 0, 0, 65537 + 1)), EINVAL);
    }

    #[test]
    fn enforces_alignment_and_read_only() {
        let l = limits(false, 512);
        assert_eq!(errno(&l, header(CMD_READ, 0, 1, 512)), EINVAL);
        assert_eq!(errno(&l, header(CMD_READ, 0, 512, 100)), EINVAL);
        assert!(check(&l, &header(CMD_READ, 0, 512, 1024)).is_ok());
        let ro = limits(true, 1);
        assert_eq!(errno(&ro, header(CMD_WRITE, 0, 0, 1)), EPERM);
        assert_eq!(errno(&ro, header(CMD_TRIM, 0, 0, 1)), EPERM);
        assert_eq!(errno(&ro, header(CMD_WRITE_ZEROES, 0, 0, 1)), EPERM);
        // FUA is not offered on a read-only export.
        assert_eq!(errno(&ro, header(CMD_READ, CMD_FLAG_FUA, 0, 1)), EINVAL);
        assert!(check(&ro, &header(CMD_READ, 0, 0, 1)).is_ok());
        assert!(check(&ro, &header(CMD_FLUSH, 0, 0, 0)).is_ok());
    }
}
