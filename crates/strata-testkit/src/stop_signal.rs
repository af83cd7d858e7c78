//! Waiting for SIGTERM or SIGINT in the test kit's long-running binaries
//! (`strata-latency-proxy`, `strata-test-store`).
//!
//! This module owns the stop-signal mask: blocked in the main thread before
//! any other thread starts (so every thread inherits the mask and none is
//! interrupted), then received by one `sigwait`.

/// Blocks SIGTERM and SIGINT in the calling thread (and every thread it
/// starts afterwards). Call first thing in `main`.
///
/// # Errors
/// When the mask cannot be set.
pub fn block_stop_signals() -> std::io::Result<()> {
    let set = stop_signals();
    // SAFETY: set is a valid, initialised sigset_t.
    if unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) } != 0 {
        return Err(std::io::Error::other("cannot block SIGTERM/SIGINT"));
    }
    Ok(())
}

/// Waits until SIGTERM or SIGINT arrives (after [`block_stop_signals`]),
/// and returns which.
pub fn wait_for_stop_signal() -> libc::c_int {
    let mut sig: libc::c_int = 0;
    loop {
        let set = stop_signals();
        // SAFETY: set and sig are valid for the call.
        if unsafe { libc::sigwait(&set, &mut sig) } == 0 {
            return sig;
        }
    }
}

fn stop_signals() -> libc::sigset_t {
    // SAFETY: sigemptyset initialises the set; sigaddset only adds to it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        set
    }
}
