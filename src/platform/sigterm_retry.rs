//! Makes sure the exit-dump SIGTERM handler (Python code, `_startup.Dumper._on_sigterm`) gets
//! to run, so that a SIGTERM can never leave the process hanging.
//!
//! CPython's C handler only records a signal; the Python handler runs later, when the main
//! thread next checks. A main thread that had just checked and was about to block (a
//! `multiprocessing` worker entering `sem_wait` for its queue's lock as `Pool.terminate()`
//! signals it) blocks with the signal recorded and no system call left to interrupt: it never
//! runs the handler, and waits forever. Without our handler SIGTERM's default action would have
//! killed it. Seen in a hung worker: CPython's `is_tripped` and `Handlers[SIGTERM].tripped`
//! were 1, the main thread in `futex_wait`.
//!
//! So [`arm`] wraps CPython's C handler for SIGTERM. The wrapper calls it, then starts a
//! one-shot timer that sends SIGTERM again to the main thread after [`RETRY`], which interrupts
//! whatever it blocks in (`EINTR`, then CPython runs the Python handler). The Python handler
//! calls [`acknowledge`] first thing, which disarms the timer. If it has not started after
//! [`MAX_RETRIES`] retries (the main thread in a long computation that never checks), the
//! default action is restored and the signal raised again: the process dies of SIGTERM as it
//! would have without tracing, only without its snapshot.
//!
//! Once the Python handler has started, [`acknowledge`] gives it a deadline instead: the timer
//! is set to it, and a SIGTERM that finds the deadline passed (the timer's, or any other)
//! restores the default action and raises the signal again. A handler that cannot finish
//! (a snapshot waiting on something the interrupted program holds) still lets the process die
//! of SIGTERM, without its snapshot, as it would have without tracing.
//!
//! Everything the wrapper does is async-signal-safe: atomics, `getpid`, `timer_settime`,
//! `signal`, `raise`. A program that installs its own SIGTERM handler replaces the wrapper
//! along with CPython's handler: nothing of this runs then.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering};

/// Delay before SIGTERM is sent again to a main thread that did not run the handler.
pub const RETRY_MS: i64 = 200;
/// Retries before the default action is restored (so about 5 s of [`RETRY_MS`]).
pub const MAX_RETRIES: u32 = 25;

/// CPython's C handler for SIGTERM, called by the wrapper (0: none saved).
static PREVIOUS: AtomicUsize = AtomicUsize::new(0);
/// The timer aimed at the main thread, valid in the process [`TIMER_PID`] only (timers are
/// not inherited by a forked child).
static TIMER: AtomicUsize = AtomicUsize::new(0);
static TIMER_PID: AtomicI32 = AtomicI32::new(0);
/// Set once the Python handler has started: no more retries.
static ACKNOWLEDGED: AtomicBool = AtomicBool::new(false);
static RETRIES: AtomicU32 = AtomicU32::new(0);
/// `CLOCK_MONOTONIC` nanoseconds by which the started handler must have ended the process
/// (0: no deadline).
static DEADLINE_NS: AtomicU64 = AtomicU64::new(0);

fn monotonic_ns() -> u64 {
    // SAFETY: clock_gettime is async-signal-safe; the structure is ours.
    let mut now: libc::timespec = unsafe { std::mem::zeroed() };
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    (now.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(now.tv_nsec as u64)
}

/// Restores SIGTERM's default action and raises it: the process dies of the signal.
fn die(signum: libc::c_int) {
    // SAFETY: signal and raise are async-signal-safe.
    unsafe {
        libc::signal(signum, libc::SIG_DFL);
        libc::raise(signum);
    }
}

extern "C" fn on_sigterm(signum: libc::c_int) {
    // SAFETY: errno is thread-local; saved and restored around calls that may set it.
    let errno = unsafe { *libc::__errno_location() };
    let previous = PREVIOUS.load(Ordering::Acquire);
    if previous != 0 {
        // SAFETY: saved from sigaction as a plain `void (*)(int)` handler (no SA_SIGINFO).
        let handler: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(previous) };
        handler(signum);
    }
    // SAFETY: getpid is async-signal-safe.
    let here = unsafe { libc::getpid() } == TIMER_PID.load(Ordering::Acquire);
    let deadline = DEADLINE_NS.load(Ordering::Acquire);
    if here && deadline != 0 && monotonic_ns() >= deadline {
        die(signum);
    } else if here && !ACKNOWLEDGED.load(Ordering::Acquire) {
        if RETRIES.fetch_add(1, Ordering::AcqRel) >= MAX_RETRIES {
            die(signum);
        } else {
            set_timer(RETRY_MS);
        }
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

fn set_timer(ms: i64) {
    let spec = libc::itimerspec {
        it_interval: libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        },
        it_value: libc::timespec {
            tv_sec: ms / 1000,
            tv_nsec: (ms % 1000) * 1_000_000,
        },
    };
    let timer = TIMER.load(Ordering::Acquire) as libc::timer_t;
    // SAFETY: a timer created by `arm` in this process; timer_settime is async-signal-safe.
    unsafe { libc::timer_settime(timer, 0, &spec, std::ptr::null_mut()) };
}

/// Wraps CPython's SIGTERM handler (if SIGTERM has one, as a plain handler) and creates this
/// process's retry timer, aimed at the calling thread, which must be the main thread. Called
/// each time our Python handler is (re)installed, and in a forked child. Returns whether the
/// wrapper is in place.
pub fn arm() -> bool {
    // SAFETY: plain sigaction/timer_create calls on zeroed, then filled, structures.
    unsafe {
        let pid = libc::getpid();
        if TIMER_PID.load(Ordering::Acquire) != pid {
            let mut event: libc::sigevent = std::mem::zeroed();
            event.sigev_notify = libc::SIGEV_THREAD_ID;
            event.sigev_signo = libc::SIGTERM;
            event.sigev_notify_thread_id = libc::gettid();
            let mut timer: libc::timer_t = std::ptr::null_mut();
            if libc::timer_create(libc::CLOCK_MONOTONIC, &mut event, &mut timer) != 0 {
                return false;
            }
            TIMER.store(timer as usize, Ordering::Release);
            TIMER_PID.store(pid, Ordering::Release);
            // A forked child's handler has not started: the parent's deadline is not its own.
            DEADLINE_NS.store(0, Ordering::Release);
        }
        ACKNOWLEDGED.store(false, Ordering::Release);
        RETRIES.store(0, Ordering::Release);
        let mut current: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGTERM, std::ptr::null(), &mut current) != 0 {
            return false;
        }
        let ours = on_sigterm as extern "C" fn(libc::c_int) as libc::sighandler_t;
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
        libc::sigaction(libc::SIGTERM, &wrapped, std::ptr::null_mut()) == 0
    }
}

/// The Python handler has started: stop retrying. With `deadline_ms` above 0, and no
/// deadline set yet, the process dies of SIGTERM if it still runs that long from now; the
/// timer is aimed at the deadline set (a retry may have moved it).
pub fn acknowledge(deadline_ms: i64) {
    ACKNOWLEDGED.store(true, Ordering::Release);
    // SAFETY: getpid has no preconditions.
    if TIMER_PID.load(Ordering::Acquire) != unsafe { libc::getpid() } {
        return;
    }
    let now = monotonic_ns();
    if deadline_ms > 0 {
        let at = now.saturating_add((deadline_ms as u64).saturating_mul(1_000_000));
        // The first handler's deadline holds: a second SIGTERM does not push it back.
        let _ = DEADLINE_NS.compare_exchange(0, at, Ordering::AcqRel, Ordering::Acquire);
    }
    match DEADLINE_NS.load(Ordering::Acquire) {
        0 => set_timer(0),
        at => set_timer((at.saturating_sub(now) / 1_000_000).clamp(1, i64::MAX as u64) as i64),
    }
}
