//! The backend-to-frontend channel (VHOST_USER_SET_BACKEND_REQ_FD), for
//! VHOST_USER_BACKEND_CONFIG_CHANGE_MSG.
//!
//! The vhost crate hands the channel over as its `Backend`, which cannot
//! send that message (its `handle_config_change` is the trait's default:
//! ENOSYS) and does not give its socket out. So the connection thread
//! keeps its own copy of the channel: before the vhost crate reads each
//! message, it peeks at it (MSG_PEEK on a unix socket hands over copies
//! of the descriptors the message carries, which stay queued for the real
//! read), keeps the copy of SET_BACKEND_REQ_FD's, and closes the others.

use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

/// VHOST_USER_SET_BACKEND_REQ_FD.
const SET_BACKEND_REQ_FD: u32 = 21;
/// VHOST_USER_BACKEND_CONFIG_CHANGE_MSG.
const CONFIG_CHANGE_MSG: u32 = 2;
/// Message flags: protocol version 1, no reply asked (REPLY_ACK is not
/// offered).
const VERSION_1: u32 = 0x1;

/// Waits for the next message on the frontend's connection and peeks at
/// it: a copy of the channel when it is SET_BACKEND_REQ_FD. Nothing is
/// consumed; on an error or end of stream, `None` (the read that follows
/// reports it).
pub fn peek_channel(stream: &UnixStream) -> Option<UnixStream> {
    let mut header = [0u8; 12];
    // Room for the 8 descriptors a message may carry (u64s: aligned).
    let mut control = [0u64; 16];
    let mut iov = libc::iovec {
        iov_base: header.as_mut_ptr().cast(),
        iov_len: header.len(),
    };
    // SAFETY: a zeroed msghdr is valid; its pointers are set to buffers
    // that outlive the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    let read = loop {
        // SAFETY: recvmsg writes into the buffers `msg` points at, within
        // their lengths.
        let n = unsafe {
            libc::recvmsg(
                stream.as_raw_fd(),
                &mut msg,
                libc::MSG_PEEK | libc::MSG_CMSG_CLOEXEC,
            )
        };
        if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            continue;
        }
        break n;
    };
    let mut fds = Vec::new();
    // SAFETY: the CMSG_* macros walk the control data recvmsg wrote; each
    // SCM_RIGHTS descriptor is new in this process and owned from here.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg).cast::<libc::c_int>();
                let bytes = (*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                for i in 0..bytes / std::mem::size_of::<libc::c_int>() {
                    fds.push(OwnedFd::from_raw_fd(data.add(i).read_unaligned()));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    let request = u32::from_ne_bytes([header[0], header[1], header[2], header[3]]);
    match (read >= 4, request, fds.len()) {
        (true, SET_BACKEND_REQ_FD, 1) => fds.pop().map(UnixStream::from),
        // Other messages' copies close here.
        _ => None,
    }
}

/// Sends VHOST_USER_BACKEND_CONFIG_CHANGE_MSG (no payload): the frontend
/// reads the configuration space again and tells the guest.
pub fn send_config_change(channel: &UnixStream) -> io::Result<()> {
    let mut message = [0u8; 12];
    message[0..4].copy_from_slice(&CONFIG_CHANGE_MSG.to_ne_bytes());
    message[4..8].copy_from_slice(&VERSION_1.to_ne_bytes());
    (&*channel).write_all(&message)
}
