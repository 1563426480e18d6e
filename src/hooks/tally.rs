//! Totals that every traced allocation and free changes (the traced total, the peak, each
//! traceback's bytes and blocks), kept so that the common update needs no locked instruction.
//!
//! A locked read-modify-write (`lock xadd`, `lock cmpxchg`) waits for the store buffer to
//! drain: on this project's machines six of them per allocation and free took about a third
//! of what tracing added to a loop of short-lived objects, far more than their share of the
//! instructions (`benches/loops.py churn`, see docs/benchmarks.md). Yet nearly every update
//! comes from a thread holding the main interpreter's GIL, which already orders those updates
//! one after another. So each total has two halves:
//!
//! - `serial`, changed only by a [`Writer`] that holds the main interpreter's GIL, with a
//!   plain load and store (the GIL hand-off orders one holder's stores before the next
//!   holder's loads);
//! - `shared`, changed by any other writer (RAW-domain hooks without the GIL, native mode's
//!   hooks, other interpreters' threads, `PyTraceMalloc_Track`) with atomic read-modify-write.
//!
//! The value is their wrapping sum: a block charged on one side and discharged on the other
//! leaves each half off by its size but the sum exact. The peak is the larger of the peaks
//! each side saw. Readers load both halves; a reader racing with writers sees each half at
//! some point of its own history, as it did with one atomic.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Who is changing a total: the proof that serial halves may be changed without atomics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Writer {
    serial: bool,
}

impl Writer {
    /// Any thread: atomic read-modify-write on the shared halves.
    pub const ANY: Writer = Writer { serial: false };

    /// A thread holding the main interpreter's GIL.
    ///
    /// # Safety
    /// The calling thread holds the main interpreter's GIL for as long as it uses the result
    /// (every serial writer does, so no two overlap).
    #[inline(always)]
    pub const unsafe fn holding_main_gil() -> Writer {
        Writer { serial: true }
    }

    /// One writer per test thread, for tests of the totals' arithmetic.
    #[cfg(test)]
    pub(crate) fn for_test(serial: bool) -> Writer {
        Writer { serial }
    }
}

/// A count in two halves (see the module's doc).
#[derive(Default)]
pub struct Tally {
    serial: AtomicU64,
    shared: AtomicU64,
}

impl Tally {
    pub const fn new() -> Self {
        Self::starting_at(0)
    }

    pub const fn starting_at(value: u64) -> Self {
        Self {
            serial: AtomicU64::new(value),
            shared: AtomicU64::new(0),
        }
    }

    #[inline(always)]
    pub fn add(&self, n: u64, by: Writer) {
        if by.serial {
            let serial = self.serial.load(Relaxed).wrapping_add(n);
            self.serial.store(serial, Relaxed);
        } else {
            self.shared.fetch_add(n, Relaxed);
        }
    }

    /// Adds `n` and returns the new value (as this writer sees it). Apart from [`Tally::add`]
    /// because the other half's load is not free on the hot path, and the compiler keeps an
    /// atomic load whose value goes unused.
    #[inline(always)]
    pub fn add_and_get(&self, n: u64, by: Writer) -> u64 {
        if by.serial {
            let serial = self.serial.load(Relaxed).wrapping_add(n);
            self.serial.store(serial, Relaxed);
            serial.wrapping_add(self.shared.load(Relaxed))
        } else {
            let shared = self.shared.fetch_add(n, Relaxed).wrapping_add(n);
            shared.wrapping_add(self.serial.load(Relaxed))
        }
    }

    /// Subtracts `n`: adds its two's complement, the halves' arithmetic being wrapping.
    #[inline(always)]
    pub fn sub(&self, n: u64, by: Writer) {
        self.add(n.wrapping_neg(), by);
    }

    #[inline(always)]
    pub fn get(&self) -> u64 {
        self.serial
            .load(Relaxed)
            .wrapping_add(self.shared.load(Relaxed))
    }

    /// Returns the value and starts again from zero, for a caller that holds the main
    /// interpreter's GIL (so no serial writer runs); a concurrent shared writer's addition
    /// lands either in the value taken or in the next one, never in neither.
    pub fn take(&self) -> u64 {
        self.serial
            .swap(0, Relaxed)
            .wrapping_add(self.shared.swap(0, Relaxed))
    }

    /// Sets the value, for a caller that holds the main interpreter's GIL and keeps the other
    /// writers out (the table's `clear` holds every shard lock).
    pub fn set(&self, value: u64) {
        self.serial.store(value, Relaxed);
        self.shared.store(0, Relaxed);
    }
}

/// The highest value a [`Tally`] reached, kept per side: each side raises its own half only,
/// so a serial raise cannot undo a higher one made at the same moment on the other side.
#[derive(Default)]
pub struct Peak {
    serial: AtomicU64,
    shared: AtomicU64,
}

impl Peak {
    pub const fn new() -> Self {
        Self {
            serial: AtomicU64::new(0),
            shared: AtomicU64::new(0),
        }
    }

    #[inline(always)]
    pub fn get(&self) -> u64 {
        self.serial.load(Relaxed).max(self.shared.load(Relaxed))
    }

    /// Raises the peak to `now` if it is higher; returns whether it was.
    #[inline(always)]
    pub fn raise(&self, now: u64, by: Writer) -> bool {
        if now <= self.get() {
            return false;
        }
        if by.serial {
            self.serial.store(now, Relaxed);
            true
        } else {
            self.shared.fetch_max(now, Relaxed) < now
        }
    }

    /// Sets the peak (`reset_peak()`, `clear`), as [`Tally::set`].
    pub fn set(&self, value: u64) {
        self.serial.store(value, Relaxed);
        self.shared.store(0, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halves_sum_to_the_value_whichever_side_charged_and_discharged() {
        let serial = Writer::for_test(true);
        // (writer of the add, writer of the sub, amount)
        let cases = [
            (serial, serial, 10),
            (serial, Writer::ANY, 20),
            (Writer::ANY, serial, 30),
            (Writer::ANY, Writer::ANY, 40),
        ];
        let tally = Tally::new();
        let mut expected = 0u64;
        for &(add, _, n) in &cases {
            expected += n;
            assert_eq!(tally.add_and_get(n, add), expected);
        }
        for &(_, sub, n) in &cases {
            tally.sub(n, sub);
            expected -= n;
            assert_eq!(tally.get(), expected);
        }
        tally.add(7, Writer::ANY);
        assert_eq!(tally.get(), 7);
        tally.set(3);
        assert_eq!(tally.get(), 3);
    }

    #[test]
    fn a_peak_is_the_highest_raise_of_either_side() {
        let serial = Writer::for_test(true);
        let peak = Peak::new();
        // (value, writer, raised?)
        let cases = [
            (5, serial, true),
            (9, Writer::ANY, true),
            (7, serial, false),
            (12, serial, true),
            (10, Writer::ANY, false),
            (15, Writer::ANY, true),
        ];
        for (step, &(value, by, raised)) in cases.iter().enumerate() {
            assert_eq!(peak.raise(value, by), raised, "step {step}");
        }
        assert_eq!(peak.get(), 15);
        peak.set(4);
        assert_eq!(peak.get(), 4);
    }

    #[test]
    fn one_serial_writer_beside_atomic_ones_loses_nothing() {
        let tally = Tally::new();
        std::thread::scope(|s| {
            s.spawn(|| {
                let serial = Writer::for_test(true);
                for i in 0..100_000 {
                    tally.add(i % 7 + 1, serial);
                    tally.sub(i % 7, serial);
                }
            });
            for _ in 0..3 {
                s.spawn(|| {
                    for i in 0..100_000 {
                        tally.add(i % 5 + 2, Writer::ANY);
                        tally.sub(i % 5, Writer::ANY);
                    }
                });
            }
        });
        assert_eq!(tally.get(), 100_000 + 3 * 200_000);
    }
}
