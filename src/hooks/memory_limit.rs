//! The memory limit behind `ALLOCTRACE_MEMORY_LIMIT`: noticing, off the hot path, that the
//! traced total or the process's resident memory has crossed a limit, so that a snapshot can
//! be written before the kernel's OOM killer ends the process.
//!
//! The hooks do one comparison, and only where the traced total sets a new peak (a branch
//! they take anyway): at or above the traced limit, a sticky flag is set. Nothing else runs
//! in a hook: no wake-up, no system call, since a hook may run inside any allocation of any
//! thread. A watcher (a Python daemon thread in `alloctrace._memory_limit`) calls [`check`]
//! every few milliseconds and writes the snapshot, with the GIL held, once it says a limit was
//! crossed: a safe point, like the interval dumps. The watcher sleeps in Python, not here: a
//! native sleep without the GIL would have to take the GIL back in Rust code while the
//! interpreter finalizes, which ends such threads by unwinding them.
//!
//! Both measures are high-water marks, so a crossing between two polls is never missed, only
//! seen up to one poll late: the flag is set at the allocation that crosses (a later
//! `reset_peak()` does not clear it), and the kernel's `VmHWM` keeps the highest RSS the
//! process reached.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use crate::platform::process_memory::ProcessMemory;

/// The traced-memory limit in bytes (as the totals count them: estimates when sampling);
/// `usize::MAX` when none is set, so the hooks' comparison never fires.
static TRACED_LIMIT: AtomicUsize = AtomicUsize::new(usize::MAX);
/// The latest new peak a hook saw at or above [`TRACED_LIMIT`] (0: none yet); cleared only
/// by [`arm`].
static CROSSED_AT: AtomicUsize = AtomicUsize::new(0);

/// Called by the table when the traced total sets a new peak.
#[inline(always)]
pub fn note_peak(total: usize) {
    if total >= TRACED_LIMIT.load(Relaxed) {
        CROSSED_AT.store(total, Relaxed);
    }
}

/// Sets (or with `None` removes) the traced-memory limit and forgets an earlier crossing
/// (a forked child watches for its own). A total already at or above the new limit counts
/// as a crossing at the next [`check`].
pub fn arm(traced: Option<u64>) {
    let limit = traced.map_or(usize::MAX, |n| usize::try_from(n).unwrap_or(usize::MAX));
    CROSSED_AT.store(0, Relaxed);
    TRACED_LIMIT.store(limit, Relaxed);
}

/// Which limit was crossed, with the figure that crossed it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Crossing {
    /// The traced peak, in bytes, as last seen at or above the limit (the peak so far when
    /// the watcher looks; or the table's peak, if the limit was armed when it was already
    /// above).
    Traced(u64),
    /// The process's peak RSS (`VmHWM`), in bytes.
    Rss(u64),
}

/// Which limit, if any, has been crossed: the traced one (armed with [`arm`]) when a hook saw
/// the total reach it or the traced peak (`traced_peak`, asked only then) is at or above it,
/// else the RSS one when the peak RSS is. The caller passes the traced peak so that this
/// module, which the table calls, does not call the tracer above it.
pub fn check(
    rss_limit: Option<u64>,
    traced_peak: impl FnOnce() -> usize,
) -> Result<Option<Crossing>, String> {
    let limit = TRACED_LIMIT.load(Relaxed);
    if limit != usize::MAX {
        let crossed_at = match CROSSED_AT.load(Relaxed) {
            0 => traced_peak(),
            total => total,
        };
        if crossed_at >= limit {
            return Ok(Some(Crossing::Traced(crossed_at as u64)));
        }
    }
    if let Some(rss_limit) = rss_limit {
        let peak_rss = ProcessMemory::current()?.peak_rss;
        if peak_rss >= rss_limit {
            return Ok(Some(Crossing::Rss(peak_rss)));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One test for the whole module: it drives process-wide state.
    #[test]
    fn crossings_are_sticky_and_rearmed() {
        arm(Some(100));
        // (peak the table reports, crossed afterwards?)
        let steps = [(50, None), (99, None), (120, Some(120)), (20, Some(120))];
        for (peak, crossed_at) in steps {
            note_peak(peak);
            let want = crossed_at.map(Crossing::Traced);
            assert_eq!(check(None, || 0).unwrap(), want, "after a peak of {peak}");
        }
        arm(Some(100));
        assert_eq!(
            check(None, || 0).unwrap(),
            None,
            "arming forgets the crossing"
        );
        arm(None);
        note_peak(usize::MAX - 1);
        assert_eq!(check(None, || 0).unwrap(), None, "no limit, no crossing");
        // This process's peak RSS is above one byte and far below 2^60.
        assert!(matches!(check(Some(1), || 0).unwrap(), Some(Crossing::Rss(n)) if n > 1));
        assert_eq!(check(Some(1 << 60), || 0).unwrap(), None);
    }
}
