//! Sets a signal's action in the kernel to ignore or default, ahead of `signal.signal`.
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
    fn sets_the_kernels_action() {
        // SIGWINCH: its default action is to do nothing, so this test cannot end the process.
        set(libc::SIGWINCH, true).unwrap();
        assert_eq!(current(libc::SIGWINCH), libc::SIG_IGN);
        set(libc::SIGWINCH, false).unwrap();
        assert_eq!(current(libc::SIGWINCH), libc::SIG_DFL);
    }
}
