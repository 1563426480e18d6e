//! Counts the snapshot-request signal (`ALLOCTRACE_SIGNAL`) as it arrives, in a wrapper around
//! CPython's C handler, so that a request is answered even when its Python handler never runs.
//!
//! CPython's C handler only records a signal; the Python handler (`_startup.Dumper._on_request`,
//! which wakes the snapshot thread) runs when the main thread next checks. A main thread that
//! had just checked and then entered a blocking system call (the next `read` of stdin, in a
//! service waiting for input), or that waits in native code that retries after a signal (a
//! mutex, a C library's own loop), does not check again until that call returns: the request
//! waited, in CI up to the test's 120 s. The snapshot thread does not need the main thread:
//! it also wakes at an interval (`_startup.REQUEST_POLL`) and answers the requests counted
//! here that no byte from the Python handler has answered yet.
//!
//! The wrapper only adds to an atomic counter and calls CPython's handler: both are
//! async-signal-safe. Installing a handler of its own (the program's `signal.signal`, or
//! `SIG_IGN` at exit and at detach) replaces the wrapper along with CPython's handler, and
//! the counting stops with it.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// CPython's C handler, called by the wrapper (0: none saved).
static PREVIOUS: AtomicUsize = AtomicUsize::new(0);
/// Request signals received since the module was loaded (a forked child inherits the count).
static COUNT: AtomicU64 = AtomicU64::new(0);

extern "C" fn on_request(signum: libc::c_int) {
    // SAFETY: errno is thread-local; saved and restored around the handler we call.
    let errno = unsafe { *libc::__errno_location() };
    COUNT.fetch_add(1, Ordering::AcqRel);
    let previous = PREVIOUS.load(Ordering::Acquire);
    if previous != 0 {
        // SAFETY: saved from sigaction as a plain `void (*)(int)` handler (no SA_SIGINFO).
        let handler: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(previous) };
        handler(signum);
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// Wraps the handler of `signum` (CPython's, installed by `signal.signal` just before) with
/// the counting one, keeping its flags and mask. Returns whether the wrapper is in place: not
/// for a signal ignored, left to its default action, or handled with `SA_SIGINFO`.
pub fn arm(signum: libc::c_int) -> bool {
    // SAFETY: plain sigaction calls on a zeroed, then filled, structure.
    unsafe {
        let mut current: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(signum, std::ptr::null(), &mut current) != 0 {
            return false;
        }
        let ours = on_request as extern "C" fn(libc::c_int) as libc::sighandler_t;
        if current.sa_sigaction == ours {
            return true;
        }
        if current.sa_flags & libc::SA_SIGINFO != 0
            || current.sa_sigaction == libc::SIG_DFL
            || current.sa_sigaction == libc::SIG_IGN
        {
            return false;
        }
        PREVIOUS.store(current.sa_sigaction, Ordering::Release);
        let mut wrapped = current;
        wrapped.sa_sigaction = ours;
        libc::sigaction(signum, &wrapped, std::ptr::null_mut()) == 0
    }
}

/// Request signals counted so far.
pub fn count() -> u64 {
    COUNT.load(Ordering::Acquire)
}
