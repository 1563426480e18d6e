//! Per-traceback counters that remember what each traceback held when the traced total last
//! reached its peak, so that `take_snapshot(peak=True)` is exact at O(1) cost per operation.
//!
//! Copying the live state at every new peak would cost O(tracebacks) on the hot path of a
//! growing program (every allocation there is a new peak). Instead each traceback keeps its
//! current bytes and blocks, a saved pair and an epoch stamp; a global epoch starts afresh at
//! each new peak. Before a counter changes, if its stamp is not the current epoch, its value
//! is saved (that value is what it held when the epoch began, i.e. at the peak) and stamped.
//! A new peak bumps the epoch, which makes every traceback's "value at peak" its current one
//! without touching it. Reading the peak: saved value for stamped counters, current for the
//! others.
//!
//! Counters live in chunks of doubling size (chunk `k` holds `BASE << k` counters), found by
//! one leading-zero count; chunks are allocated when a new key first appears and never freed,
//! so a hook (RAW ones may run without the GIL, on any thread) never sees freed memory, and
//! memory is bounded by the largest key used (keys are dense interned traceback ids).
//!
//! Threads: every field is atomic, updates hold the block's shard lock but not one common
//! lock. When updates are serialised (one thread, or every traced allocation under the GIL),
//! the peak read back is exact. When RAW allocations run concurrently without the GIL, the
//! blocks in flight on other threads at the instant of the peak may be attributed on either
//! side of it: each counter stays exact, but the per-traceback values at peak may differ from
//! the peak total by those in-flight blocks.

use std::alloc::{alloc_zeroed, Layout};
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering::*};

/// A counter key: an interned traceback id today. A `(domain, traceback)` pair can be mapped
/// to a dense key of its own and use the same counters.
pub type Key = u32;

const BASE_BITS: u32 = 10;
const BASE: u64 = 1 << BASE_BITS;
/// Enough chunks for every `u32` key: `(2^32 - 1 + BASE) >> BASE_BITS < 2^(CHUNKS)`.
const CHUNKS: usize = (33 - BASE_BITS) as usize;

/// One key's counters: bytes (estimated bytes when sampling) and blocks in
/// [`crate::analysis::sampling::COUNT_SCALE`] units, now and at the peak.
#[derive(Default)]
pub struct Counter {
    bytes: AtomicU64,
    blocks: AtomicU64,
    saved_bytes: AtomicU64,
    saved_blocks: AtomicU64,
    stamp: AtomicU64,
}

pub struct PeakCounters {
    chunks: [AtomicPtr<Counter>; CHUNKS],
    /// Starts at 1 so that a zeroed stamp is never current.
    epoch: AtomicU64,
}

impl Default for PeakCounters {
    fn default() -> Self {
        Self::new()
    }
}

/// `(chunk, index in chunk)` of a key.
#[inline(always)]
fn locate(key: Key) -> (usize, usize) {
    let n = u64::from(key) + BASE;
    let chunk = (63 - n.leading_zeros() - BASE_BITS) as usize;
    (chunk, (n - (BASE << chunk)) as usize)
}

fn chunk_len(chunk: usize) -> usize {
    (BASE as usize) << chunk
}

impl PeakCounters {
    pub fn new() -> Self {
        Self {
            chunks: std::array::from_fn(|_| AtomicPtr::new(std::ptr::null_mut())),
            epoch: AtomicU64::new(1),
        }
    }

    /// The counter of `key` if its chunk exists.
    #[inline(always)]
    fn existing(&self, key: Key) -> Option<&Counter> {
        let (chunk, i) = locate(key);
        let base = self.chunks[chunk].load(Acquire);
        // SAFETY: a non-null chunk pointer points at `chunk_len(chunk)` counters that live as
        // long as `self` (chunks are never freed); `i` is below that length.
        (!base.is_null()).then(|| unsafe { &*base.add(i) })
    }

    /// The counter of `key`, allocating its chunk if needed; `None` if there is no memory
    /// for it (the caller then leaves the block untraced).
    #[inline(always)]
    pub fn counter(&self, key: Key) -> Option<&Counter> {
        match self.existing(key) {
            Some(counter) => Some(counter),
            None => self.grow(key),
        }
    }

    #[cold]
    fn grow(&self, key: Key) -> Option<&Counter> {
        let (chunk, _) = locate(key);
        let layout = Layout::array::<Counter>(chunk_len(chunk)).ok()?;
        // SAFETY: the layout is non-zero; all-zero bytes are valid atomics (a zeroed counter).
        let fresh = unsafe { alloc_zeroed(layout) } as *mut Counter;
        if fresh.is_null() {
            return None;
        }
        if let Err(_other) =
            self.chunks[chunk].compare_exchange(std::ptr::null_mut(), fresh, AcqRel, Acquire)
        {
            // Another thread installed this chunk first; ours was never shared.
            // SAFETY: allocated just above with this layout.
            unsafe { std::alloc::dealloc(fresh.cast(), layout) };
        }
        self.existing(key)
    }

    /// Saves `counter`'s value as its value at the peak unless it already did this epoch.
    #[inline(always)]
    fn touch(&self, counter: &Counter) {
        let epoch = self.epoch.load(Relaxed);
        if counter.stamp.load(Relaxed) != epoch {
            counter
                .saved_bytes
                .store(counter.bytes.load(Relaxed), Relaxed);
            counter
                .saved_blocks
                .store(counter.blocks.load(Relaxed), Relaxed);
            counter.stamp.store(epoch, Release);
        }
    }

    /// `bytes` and `blocks` (count units) enter `counter`.
    #[inline(always)]
    pub fn enter(&self, counter: &Counter, bytes: u64, blocks: u64) {
        self.touch(counter);
        counter.bytes.fetch_add(bytes, Relaxed);
        counter.blocks.fetch_add(blocks, Relaxed);
    }

    /// `bytes` and `blocks` leave the counter of `key` (which entered it earlier).
    #[inline(always)]
    pub fn leave(&self, key: Key, bytes: u64, blocks: u64) {
        if let Some(counter) = self.existing(key) {
            self.touch(counter);
            counter.bytes.fetch_sub(bytes, Relaxed);
            counter.blocks.fetch_sub(blocks, Relaxed);
        }
    }

    /// The total just reached a new peak (or the peak was reset to the current total): every
    /// counter's value at peak is now its current value.
    #[inline(always)]
    pub fn new_peak(&self) {
        self.epoch.fetch_add(1, Release);
    }

    /// `(key, bytes, blocks in count units)` at the peak, for every key below `keys` that
    /// held anything then.
    pub fn at_peak(&self, keys: usize) -> Vec<(Key, u64, u64)> {
        let epoch = self.epoch.load(Acquire);
        let mut out = Vec::new();
        for key in 0..keys.min(1 << 32) as u64 {
            let Some(counter) = self.existing(key as Key) else {
                continue;
            };
            let (bytes, blocks) = if counter.stamp.load(Acquire) == epoch {
                (
                    counter.saved_bytes.load(Relaxed),
                    counter.saved_blocks.load(Relaxed),
                )
            } else {
                (counter.bytes.load(Relaxed), counter.blocks.load(Relaxed))
            };
            if bytes != 0 || blocks != 0 {
                out.push((key as Key, bytes, blocks));
            }
        }
        out
    }

    /// `(bytes, blocks)` of `key` now (for tests and checks).
    pub fn current(&self, key: Key) -> (u64, u64) {
        self.existing(key)
            .map_or((0, 0), |c| (c.bytes.load(Relaxed), c.blocks.load(Relaxed)))
    }

    /// Zeroes every counter (the caller holds every shard lock, so no hook is updating).
    pub fn clear(&self) {
        for chunk in 0..CHUNKS {
            let base = self.chunks[chunk].load(Acquire);
            if base.is_null() {
                continue;
            }
            for i in 0..chunk_len(chunk) {
                // SAFETY: as in `existing`.
                let counter = unsafe { &*base.add(i) };
                counter.bytes.store(0, Relaxed);
                counter.blocks.store(0, Relaxed);
                counter.saved_bytes.store(0, Relaxed);
                counter.saved_blocks.store(0, Relaxed);
                counter.stamp.store(0, Relaxed);
            }
        }
        self.new_peak();
    }

    /// Bytes held by the allocated chunks.
    pub fn memory_usage(&self) -> usize {
        (0..CHUNKS)
            .filter(|&c| !self.chunks[c].load(Relaxed).is_null())
            .map(|c| chunk_len(c) * std::mem::size_of::<Counter>())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_map_to_distinct_slots_in_doubling_chunks() {
        // (key, chunk, index)
        let cases: &[(Key, usize, usize)] = &[
            (0, 0, 0),
            (1023, 0, 1023),
            (1024, 1, 0),
            (3071, 1, 2047),
            (3072, 2, 0),
            (
                u32::MAX,
                CHUNKS - 1,
                (u64::from(u32::MAX) + BASE - (BASE << 22)) as usize,
            ),
        ];
        for &(key, chunk, index) in cases {
            assert_eq!(locate(key), (chunk, index), "key {key}");
            assert!(index < chunk_len(chunk));
        }
        assert_eq!(CHUNKS, 23);
    }

    #[test]
    fn saved_values_are_the_values_at_the_last_new_peak() {
        let c = PeakCounters::new();
        let a = c.counter(0).unwrap() as *const Counter;
        let counter = |k| c.counter(k).unwrap();
        c.enter(counter(0), 100, 1);
        c.enter(counter(5000), 50, 2);
        c.new_peak(); // peak: {0: 100, 5000: 50}
        c.leave(0, 100, 1);
        c.enter(counter(7), 30, 1);
        assert_eq!(c.at_peak(10_000), vec![(0, 100, 1), (5000, 50, 2)]);
        c.enter(counter(7), 200, 1);
        c.new_peak(); // peak: {5000: 50, 7: 230}
        c.leave(5000, 50, 2);
        assert_eq!(c.at_peak(10_000), vec![(7, 230, 2), (5000, 50, 2)]);
        assert_eq!(c.current(5000), (0, 0));
        assert!(std::ptr::eq(a, counter(0)), "chunks are never moved");
        c.clear();
        assert!(c.at_peak(10_000).is_empty());
        assert_eq!(c.memory_usage(), 40 * (1024 + 4096), "chunks 0 and 2 only");
    }
}
