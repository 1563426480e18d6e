//! Taking the locks that the fork handlers hold across `fork()` without ever sleeping in
//! `parking_lot_core`.
//!
//! The trace table's shard locks (dashmap's `RwLock`) and the tracked-domain locks
//! (`parking_lot::Mutex`) put a waiter that cannot get them to sleep ("park") in
//! `parking_lot_core`: a process-wide table of wait queues, each bucket guarded by a small
//! lock of its own, and a bit in the lock's word saying that someone is parked. Our
//! `pthread_atfork` handlers take these locks before `fork()` and hold them across it
//! (see `crate::hooks::tracer`'s and `crate::tracked`'s `before_fork`), so any other thread
//! that allocates in the meantime waits for them, and with a parking lock goes to sleep in
//! those queues. Two things then went wrong in the child, where only the forking thread
//! exists:
//!
//! - if `fork()` copied the memory while such a thread was inside a bucket's critical
//!   section (queuing itself), the child inherits that bucket locked by a thread that does
//!   not exist there;
//! - the lock's word says a waiter is parked, so releasing it in the child (`after_fork`)
//!   takes the slow path, `parking_lot_core::unpark_one`, which locks that bucket.
//!
//! The child then slept for ever in its `after_fork` handler, inside `os.fork()`
//! (`tests/test_native.py::test_fork_while_redirected` hung on CPython 3.13 once in a CI
//! rehearsal; with two threads churning `malloc`/`free` in native mode while the main thread
//! forked 200 times, a child hung in 7 runs of 40; 3.12 hangs the same way). Waiting here
//! spins, then yields, then sleeps briefly, and never parks: such a lock never has a parked
//! waiter, its release is one compare-and-swap, and neither process enters
//! `parking_lot_core` for it. Every user of these locks takes them through [`acquire`] (a
//! single parked waiter would bring the slow release back). The uncontended path is the same
//! single compare-and-swap as `lock()`.
//!
//! Nothing here allocates, takes a lock or calls Python: it runs inside allocator hooks.

use std::time::Duration;

/// Rounds of busy waiting (1, 2, 4, ... 32 pause instructions) before yielding.
const SPIN_ROUNDS: u32 = 6;
/// Rounds of `sched_yield` before sleeping between attempts.
const YIELD_ROUNDS: u32 = 64;
/// The sleep between attempts once the lock has been held for a while (a table being
/// copied or cleared, a library's import table being rewritten, a `fork()` in progress).
const NAP: Duration = Duration::from_micros(50);

/// The guard that `attempt` (a `try_lock`, `try_read` or `try_write`) returns, retrying
/// until it succeeds.
#[inline(always)]
pub fn acquire<G>(mut attempt: impl FnMut() -> Option<G>) -> G {
    match attempt() {
        Some(guard) => guard,
        None => acquire_slow(attempt),
    }
}

#[cold]
#[inline(never)]
fn acquire_slow<G>(mut attempt: impl FnMut() -> Option<G>) -> G {
    let mut round = 0u32;
    loop {
        if round < SPIN_ROUNDS {
            for _ in 0..1u32 << round {
                std::hint::spin_loop();
            }
        } else if round < SPIN_ROUNDS + YIELD_ROUNDS {
            std::thread::yield_now();
        } else {
            std::thread::sleep(NAP);
        }
        round = round.saturating_add(1);
        if let Some(guard) = attempt() {
            return guard;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
    use std::sync::Arc;

    /// Many threads incrementing under a lock taken only through `acquire` lose no update.
    #[test]
    fn mutual_exclusion_under_contention() {
        let lock = Arc::new(parking_lot::Mutex::new(0usize));
        let outside = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let lock = Arc::clone(&lock);
                let outside = Arc::clone(&outside);
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        let mut n = acquire(|| lock.try_lock());
                        *n += 1;
                        outside.fetch_add(1, Relaxed);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*lock.lock(), 80_000);
        assert_eq!(outside.load(Relaxed), 80_000);
    }

    /// A waiter gets a lock held for longer than the spinning and yielding last (it sleeps
    /// between attempts).
    #[test]
    fn a_long_hold_is_waited_out() {
        let lock = Arc::new(parking_lot::Mutex::new(()));
        let held = lock.lock();
        let waiter = {
            let lock = Arc::clone(&lock);
            std::thread::spawn(move || drop(acquire(|| lock.try_lock())))
        };
        std::thread::sleep(Duration::from_millis(30));
        assert!(!waiter.is_finished());
        drop(held);
        waiter.join().unwrap();
    }
}
