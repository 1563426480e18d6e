//! What the Python-level signal handlers need done below Python: a signal's action set in
//! the kernel ahead of `signal.signal` (below), and the snapshot request written without
//! giving up the GIL ([`write_request`]).
//!
//! Setting a signal's action in the kernel to ignore or default, ahead of `signal.signal`:
//!
//! CPython's `signal.signal(n, SIG_IGN)` (or `SIG_DFL`) first runs the Python handlers of
//! signals already recorded, then changes the kernel's action, then its own table. A signal
//! that comes between the first two steps is recorded by the C handler while the table says
//! "ignore": the next check prints `OSError: Signal n ignored due to race condition` on stderr
//! (bpo-43406), and under `SIG_DFL` the signal is lost instead of ending the process. Setting
//! the kernel's action first closes that window: from then on the kernel ignores the signal
//! (or applies its default action) itself, and whatever was recorded before is run by
//! `signal.signal`'s first step, by the handler that was in place when it came.

use crate::error::{Error, Result};
use std::path::PathBuf;

/// Writes the byte that asks the snapshot thread for a snapshot to `fd` (a non-blocking pipe),
/// without giving up the GIL: each time a handler gives it up (`os.write` does), CPython may
/// run the handler of the next signal of a storm inside it on taking it back (the Python
/// handler also refuses to nest). A full pipe already holds requests enough.
pub fn write_request(fd: i32) -> Result<()> {
    loop {
        // SAFETY: a one-byte write from a static buffer; `fd` is the caller's pipe.
        if unsafe { libc::write(fd, b"r".as_ptr().cast(), 1) } == 1 {
            return Ok(());
        }
        let source = std::io::Error::last_os_error();
        match source.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EAGAIN) => return Ok(()),
            _ => {
                return Err(Error::Io {
                    path: PathBuf::from(format!("file descriptor {fd}")),
                    action: "write a snapshot request to",
                    source,
                })
            }
        }
    }
}

/// Sets the kernel's action for `signum` to ignore (`ignore`) or to the default action.
pub fn set(signum: i32, ignore: bool) -> Result<()> {
    let action = if ignore { libc::SIG_IGN } else { libc::SIG_DFL };
    // SAFETY: `signal` with SIG_IGN or SIG_DFL installs no code of ours; the kernel refuses
    // numbers that are out of range or cannot be caught (SIGKILL, SIGSTOP) with EINVAL.
    if unsafe { libc::signal(signum, action) } == libc::SIG_ERR {
        return Err(Error::InvalidArgument(format!(
            "cannot set the action of signal {signum}: {}",
            std::io::Error::last_os_error()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_signals_that_cannot_be_changed() {
        for signum in [0, libc::SIGKILL, libc::SIGSTOP, 100_000] {
            let err = set(signum, true).unwrap_err().to_string();
            assert!(err.contains(&format!("signal {signum}")), "{err}");
        }
    }

    fn current(signum: i32) -> libc::sighandler_t {
        // SAFETY: a query only (no new action), into a zeroed structure.
        unsafe {
            let mut now: libc::sigaction = std::mem::zeroed();
            assert_eq!(libc::sigaction(signum, std::ptr::null(), &mut now), 0);
            now.sa_sigaction
        }
    }

    #[test]
    fn a_request_is_one_byte_and_a_full_pipe_is_no_error() {
        let mut fds = [0; 2];
        // SAFETY: a pipe into a two-int array; both ends closed below.
        assert_eq!(
            unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK) },
            0
        );
        write_request(fds[1]).unwrap();
        let mut buf = [0u8; 8];
        // SAFETY: reading into a local buffer of its length.
        assert_eq!(unsafe { libc::read(fds[0], buf.as_mut_ptr().cast(), 8) }, 1);
        assert_eq!(buf[0], b'r');
        // Filled up: further requests are already answered by those pending.
        while unsafe { libc::write(fds[1], b"x".as_ptr().cast(), 1) } == 1 {}
        write_request(fds[1]).unwrap();
        // SAFETY: both ends are ours.
        unsafe {
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
        let err = write_request(fds[1]).unwrap_err().to_string();
        assert!(
            err.contains(&format!("file descriptor {}", fds[1])),
            "{err}"
        );
    }

    #[test]
    fn sets_the_kernels_action() {
        // SIGWINCH: its default action is to do nothing, so this test cannot end the process.
        set(libc::SIGWINCH, true).unwrap();
        assert_eq!(current(libc::SIGWINCH), libc::SIG_IGN);
        set(libc::SIGWINCH, false).unwrap();
        assert_eq!(current(libc::SIGWINCH), libc::SIG_DFL);
    }
}
