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
//! Each domain has counters of its own (a [`Space`]), all under the one epoch: domain 0's
//! inline for the hot path, the others' (native mode's, numpy's) made when first charged, so
//! a peak snapshot keeps every block in its domain.
//!
//! Threads: every field is atomic; current values and the epoch are [`Tally`]s, which a thread
//! holding the main interpreter's GIL changes without locked instructions. When updates are
//! serialised (one thread, or every traced allocation under the GIL), the peak read back is
//! exact. When RAW allocations run concurrently without the GIL, the
//! blocks in flight on other threads at the instant of the peak may be attributed on either
//! side of it: each counter stays exact, but the per-traceback values at peak may differ from
//! the peak total by those in-flight blocks.

use std::alloc::{alloc_zeroed, Layout};
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering::*};

use crate::hooks::tally::{Tally, Writer};

/// A counter key: an interned traceback id.
pub type Key = u32;

const BASE_BITS: u32 = 10;
const BASE: u64 = 1 << BASE_BITS;
/// Enough chunks for every `u32` key: `(2^32 - 1 + BASE) >> BASE_BITS < 2^(CHUNKS)`.
const CHUNKS: usize = (33 - BASE_BITS) as usize;

/// Distinct domains that can hold blocks between two clears: domain 0, native mode's and
/// those that extensions name in `PyTraceMalloc_Track` (numpy's one). A block in a domain
/// beyond these is left untraced and counted as dropped, as when its counters cannot be had.
pub const MAX_DOMAINS: usize = 64;

/// `spaces[i]` of a slot not yet given to a domain.
const FREE: u64 = u64::MAX;

/// One key's counters: bytes (estimated bytes when sampling) and blocks in
/// [`crate::analysis::sampling::COUNT_SCALE`] units, now and at the peak; and, while a
/// pusher asks for them (issue 59), what was allocated since they were last taken
/// ([`PeakCounters::take_allocated`]), in the same units.
#[derive(Default)]
pub struct Counter {
    bytes: Tally,
    blocks: Tally,
    saved_bytes: AtomicU64,
    saved_blocks: AtomicU64,
    stamp: AtomicU64,
    allocated_bytes: Tally,
    allocated_blocks: Tally,
}

/// The counters of one domain, keyed by traceback. All-zero bytes are an empty one.
struct Chunks([AtomicPtr<Counter>; CHUNKS]);

/// Which domain's counters a block is charged to: each domain has its own, so the peak
/// keeps every block in the domain it was in (numpy's arrays in numpy's, native blocks in
/// native mode's), as `tracemalloc` keeps them in its traces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Space(u16);

impl Space {
    /// Domain 0's: every block of the PEP 445 hooks, the hot path.
    pub const DEFAULT: Space = Space(0);
}

pub struct PeakCounters {
    /// Domain 0's counters, inline: the hot path follows no extra pointer.
    default: Chunks,
    /// The counters of `Space(i + 1)`, allocated when it is first charged, never freed.
    others: [AtomicPtr<Chunks>; MAX_DOMAINS - 1],
    /// The domain of each space, in the order they were claimed ([`FREE`] after the last);
    /// a slot, once claimed, never changes, so a reader needs no lock.
    spaces: [AtomicU64; MAX_DOMAINS],
    /// Starts at 1 so that a zeroed stamp is never current. A tally, so that each new peak
    /// makes it larger whichever side raises it.
    epoch: Tally,
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

/// A zeroed allocation of `T`'s layout, or null; all-zero bytes must be a valid `T`.
fn zeroed<T>(layout: Layout) -> *mut T {
    // SAFETY: every caller's layout has a non-zero size.
    unsafe { alloc_zeroed(layout) as *mut T }
}

impl Chunks {
    fn new() -> Self {
        Self(std::array::from_fn(
            |_| AtomicPtr::new(std::ptr::null_mut()),
        ))
    }

    /// The counter of `key` if its chunk exists.
    #[inline(always)]
    fn existing(&self, key: Key) -> Option<&Counter> {
        let (chunk, i) = locate(key);
        let base = self.0[chunk].load(Acquire);
        // SAFETY: a non-null chunk pointer points at `chunk_len(chunk)` counters that live as
        // long as `self` (chunks are never freed); `i` is below that length.
        (!base.is_null()).then(|| unsafe { &*base.add(i) })
    }

    /// The counter of `key`, allocating its chunk if needed; `None` if there is no memory
    /// for it (the caller then leaves the block untraced).
    #[inline(always)]
    fn counter(&self, key: Key) -> Option<&Counter> {
        match self.existing(key) {
            Some(counter) => Some(counter),
            None => self.grow(key),
        }
    }

    #[cold]
    fn grow(&self, key: Key) -> Option<&Counter> {
        let (chunk, _) = locate(key);
        let layout = Layout::array::<Counter>(chunk_len(chunk)).ok()?;
        let fresh = zeroed::<Counter>(layout);
        if fresh.is_null() {
            return None;
        }
        if let Err(_other) =
            self.0[chunk].compare_exchange(std::ptr::null_mut(), fresh, AcqRel, Acquire)
        {
            // Another thread installed this chunk first; ours was never shared.
            // SAFETY: allocated just above with this layout.
            unsafe { std::alloc::dealloc(fresh.cast(), layout) };
        }
        self.existing(key)
    }

    /// Every allocated counter with its key.
    fn each(&self) -> impl Iterator<Item = (Key, &Counter)> + '_ {
        (0..CHUNKS).flat_map(move |chunk| {
            let base = self.0[chunk].load(Acquire);
            let len = if base.is_null() { 0 } else { chunk_len(chunk) };
            (0..len).map(move |i| {
                // SAFETY: as in `existing`.
                let counter = unsafe { &*base.add(i) };
                (((BASE << chunk) + i as u64 - BASE) as Key, counter)
            })
        })
    }

    fn memory_usage(&self) -> usize {
        (0..CHUNKS)
            .filter(|&c| !self.0[c].load(Relaxed).is_null())
            .map(|c| chunk_len(c) * std::mem::size_of::<Counter>())
            .sum()
    }
}

impl PeakCounters {
    pub fn new() -> Self {
        Self {
            default: Chunks::new(),
            others: std::array::from_fn(|_| AtomicPtr::new(std::ptr::null_mut())),
            spaces: std::array::from_fn(|i| AtomicU64::new(if i == 0 { 0 } else { FREE })),
            epoch: Tally::starting_at(1),
        }
    }

    /// The space of `domain`, claiming the next free one the first time the domain is seen;
    /// `None` if all [`MAX_DOMAINS`] are taken by others. Lock-free: slots are claimed in
    /// order by compare-and-swap, so two threads seeing a new domain at once agree on one.
    pub fn space_of(&self, domain: u32) -> Option<Space> {
        let wanted = u64::from(domain);
        for (i, slot) in self.spaces.iter().enumerate() {
            let found = match slot.compare_exchange(FREE, wanted, AcqRel, Acquire) {
                Ok(_) => wanted,
                Err(taken) => taken,
            };
            if found == wanted {
                return Some(Space(i as u16));
            }
        }
        None
    }

    /// The counters of `space`, allocating them on its first use; `None` without memory.
    #[inline(always)]
    fn chunks(&self, space: Space) -> Option<&Chunks> {
        let Some(slot) = (space.0 as usize).checked_sub(1) else {
            return Some(&self.default);
        };
        let chunks = self.others[slot].load(Acquire);
        // SAFETY: a non-null pointer is a `Chunks` installed below, never freed.
        match unsafe { chunks.as_ref() } {
            Some(chunks) => Some(chunks),
            None => self.install(slot),
        }
    }

    #[cold]
    fn install(&self, slot: usize) -> Option<&Chunks> {
        let layout = Layout::new::<Chunks>();
        let fresh = zeroed::<Chunks>(layout);
        if fresh.is_null() {
            return None;
        }
        if self.others[slot]
            .compare_exchange(std::ptr::null_mut(), fresh, AcqRel, Acquire)
            .is_err()
        {
            // SAFETY: allocated just above with this layout, never shared.
            unsafe { std::alloc::dealloc(fresh.cast(), layout) };
        }
        // SAFETY: non-null from here on, pointing at a `Chunks` that is never freed.
        unsafe { self.others[slot].load(Acquire).as_ref() }
    }

    /// The counters of `space` if they exist (without allocating).
    fn existing_chunks(&self, space: Space) -> Option<&Chunks> {
        match (space.0 as usize).checked_sub(1) {
            None => Some(&self.default),
            // SAFETY: as in `chunks`.
            Some(slot) => unsafe { self.others[slot].load(Acquire).as_ref() },
        }
    }

    /// The counter of `key` in `space`, allocating if needed; `None` if there is no memory
    /// for it (the caller then leaves the block untraced).
    #[inline(always)]
    pub fn counter(&self, space: Space, key: Key) -> Option<&Counter> {
        self.chunks(space)?.counter(key)
    }

    /// Saves `counter`'s value as its value at the peak unless it already did this epoch.
    #[inline(always)]
    fn touch(&self, counter: &Counter) {
        let epoch = self.epoch.get();
        if counter.stamp.load(Relaxed) != epoch {
            counter.saved_bytes.store(counter.bytes.get(), Relaxed);
            counter.saved_blocks.store(counter.blocks.get(), Relaxed);
            counter.stamp.store(epoch, Release);
        }
    }

    /// `bytes` and `blocks` (count units) enter `counter`.
    #[inline(always)]
    pub fn enter(&self, counter: &Counter, bytes: u64, blocks: u64, by: Writer) {
        self.touch(counter);
        counter.bytes.add(bytes, by);
        counter.blocks.add(blocks, by);
    }

    /// `bytes` and `blocks` (count units) were allocated under `counter`'s traceback.
    #[inline(always)]
    pub fn allocated(&self, counter: &Counter, bytes: u64, blocks: u64, by: Writer) {
        counter.allocated_bytes.add(bytes, by);
        counter.allocated_blocks.add(blocks, by);
    }

    /// An allocation counted under `key` in `space` belongs to `to` instead (a block that a
    /// thread without the GIL recorded under the placeholder traceback, see
    /// [`crate::hooks::released`]), or to no traceback (`None`: the filters reject its stack).
    pub fn move_allocated(
        &self,
        space: Space,
        key: Key,
        to: Option<&Counter>,
        bytes: u64,
        blocks: u64,
        by: Writer,
    ) {
        if let Some(counter) = self.existing_chunks(space).and_then(|c| c.existing(key)) {
            counter.allocated_bytes.sub(bytes, by);
            counter.allocated_blocks.sub(blocks, by);
        }
        if let Some(to) = to {
            self.allocated(to, bytes, blocks, by);
        }
    }

    /// `(domain, key, bytes, blocks in count units)` allocated since the last call, for every
    /// key below `keys` that allocated anything, each counter starting again from zero;
    /// domain 0's first. The caller holds the main interpreter's GIL. A key that gave away
    /// more than it took since the last call (a placeholder whose blocks were counted in the
    /// last call and moved since) reports nothing rather than a negative figure.
    pub fn take_allocated(&self, keys: usize) -> Vec<(u32, Key, u64, u64)> {
        let mut out = Vec::new();
        for (domain, chunks) in self.each_space() {
            for (key, counter) in chunks.each() {
                if key as usize >= keys {
                    break;
                }
                let bytes = counter.allocated_bytes.take() as i64;
                let blocks = counter.allocated_blocks.take() as i64;
                if bytes > 0 || blocks > 0 {
                    out.push((domain, key, bytes.max(0) as u64, blocks.max(0) as u64));
                }
            }
        }
        out
    }

    /// Forgets what was allocated (the pusher stopped, or a forked child starts its own
    /// count); the caller holds the main interpreter's GIL.
    pub fn forget_allocated(&self) {
        for (_, chunks) in self.each_space() {
            for (_, counter) in chunks.each() {
                counter.allocated_bytes.take();
                counter.allocated_blocks.take();
            }
        }
    }

    /// `bytes` and `blocks` leave the counter of `key` in `space` (which entered it earlier).
    #[inline(always)]
    pub fn leave(&self, space: Space, key: Key, bytes: u64, blocks: u64, by: Writer) {
        if let Some(counter) = self.existing_chunks(space).and_then(|c| c.existing(key)) {
            self.touch(counter);
            counter.bytes.sub(bytes, by);
            counter.blocks.sub(blocks, by);
        }
    }

    /// The total just reached a new peak (or the peak was reset to the current total): every
    /// counter's value at peak is now its current value.
    #[inline(always)]
    pub fn new_peak(&self, by: Writer) {
        self.epoch.add(1, by);
    }

    /// Every space with counters and its domain, domain 0's first.
    fn each_space(&self) -> impl Iterator<Item = (u32, &Chunks)> + '_ {
        self.spaces
            .iter()
            .map(|slot| slot.load(Acquire))
            .take_while(|&domain| domain != FREE)
            .enumerate()
            .filter_map(|(i, domain)| {
                let chunks = self.existing_chunks(Space(i as u16))?;
                Some((domain as u32, chunks))
            })
    }

    /// `(domain, key, bytes, blocks in count units)` at the peak, for every key below `keys`
    /// that held anything then: domain 0's first, then the others' in the order they were
    /// first charged.
    pub fn at_peak(&self, keys: usize) -> Vec<(u32, Key, u64, u64)> {
        let epoch = self.epoch.get();
        let mut out = Vec::new();
        for (domain, chunks) in self.each_space() {
            for (key, counter) in chunks.each() {
                if key as usize >= keys {
                    break;
                }
                let (bytes, blocks) = if counter.stamp.load(Acquire) == epoch {
                    (
                        counter.saved_bytes.load(Relaxed),
                        counter.saved_blocks.load(Relaxed),
                    )
                } else {
                    (counter.bytes.get(), counter.blocks.get())
                };
                if bytes != 0 || blocks != 0 {
                    out.push((domain, key, bytes, blocks));
                }
            }
        }
        out
    }

    /// Whether `key` holds nothing in any space, now or at the peak, and has no allocation
    /// waiting to be taken: nothing a snapshot (of now, of the peak, or of what was
    /// allocated) can name it for. Its id may then be given to another traceback:
    /// its counters are zero, and a stamp of this epoch with zero saved values says what the
    /// new traceback held at the peak, nothing.
    pub fn idle(&self, key: Key) -> bool {
        let epoch = self.epoch.get();
        self.each_space().all(|(_, chunks)| {
            chunks.existing(key).is_none_or(|counter| {
                counter.bytes.get() == 0
                    && counter.blocks.get() == 0
                    && counter.allocated_bytes.get() == 0
                    && counter.allocated_blocks.get() == 0
                    && (counter.stamp.load(Acquire) != epoch
                        || (counter.saved_bytes.load(Relaxed) == 0
                            && counter.saved_blocks.load(Relaxed) == 0))
            })
        })
    }

    /// `(bytes, blocks)` of `key` in `space` now (for tests and checks).
    pub fn current(&self, space: Space, key: Key) -> (u64, u64) {
        self.existing_chunks(space)
            .and_then(|c| c.existing(key))
            .map_or((0, 0), |c| (c.bytes.get(), c.blocks.get()))
    }

    /// Zeroes every counter (the caller holds every shard lock, so no hook is updating) and
    /// frees the spaces after `keep` for other domains: with no block left, no domain needs
    /// one, and the caller also keeps [`PeakCounters::space_of`] from running meanwhile.
    pub fn clear(&self, keep: Space) {
        for (_, chunks) in self.each_space() {
            for (_, counter) in chunks.each() {
                counter.bytes.set(0);
                counter.blocks.set(0);
                counter.saved_bytes.store(0, Relaxed);
                counter.saved_blocks.store(0, Relaxed);
                counter.stamp.store(0, Relaxed);
                counter.allocated_bytes.set(0);
                counter.allocated_blocks.set(0);
            }
        }
        for slot in &self.spaces[usize::from(keep.0) + 1..] {
            slot.store(FREE, Release);
        }
        self.new_peak(Writer::ANY);
    }

    /// Bytes held by the allocated counters.
    pub fn memory_usage(&self) -> usize {
        let installed = self.others.iter().filter(|c| !c.load(Relaxed).is_null());
        installed.count() * std::mem::size_of::<Chunks>()
            + self
                .each_space()
                .map(|(_, c)| c.memory_usage())
                .sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: Writer = Writer::ANY;

    /// A traceback whose allocations wait to be taken is not idle (the sweep keeps it); once
    /// taken it is; a placeholder that gave away more than it took since reports nothing.
    #[test]
    fn waiting_allocations_keep_a_key_from_being_idle() {
        let c = PeakCounters::new();
        let d = Space::DEFAULT;
        c.allocated(c.counter(d, 5).unwrap(), 64, 2, W);
        assert!(!c.idle(5));
        assert_eq!(c.take_allocated(16), vec![(0, 5, 64, 2)]);
        assert!(c.idle(5));
        // The placeholder's 10 bytes were taken, then its block moved to key 3.
        c.allocated(c.counter(d, 0).unwrap(), 10, 1, W);
        assert_eq!(c.take_allocated(16), vec![(0, 0, 10, 1)]);
        c.move_allocated(d, 0, Some(c.counter(d, 3).unwrap()), 10, 1, W);
        assert_eq!(c.take_allocated(16), vec![(0, 3, 10, 1)]);
        assert!(c.take_allocated(16).is_empty());
        // Keys at or beyond `keys` are not read; forgetting empties them all.
        c.allocated(c.counter(d, 2000).unwrap(), 1, 1, W);
        assert!(c.take_allocated(16).is_empty());
        assert!(!c.idle(2000));
        c.forget_allocated();
        assert!(c.idle(2000));
        assert!(c.take_allocated(4096).is_empty());
    }

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
        let d = Space::DEFAULT;
        let a = c.counter(d, 0).unwrap() as *const Counter;
        let counter = |k| c.counter(d, k).unwrap();
        // Serial and atomic updates mix as the hooks mix them: the figures do not depend on
        // which side made each one.
        let s = Writer::for_test(true);
        c.enter(counter(0), 100, 1, s);
        c.enter(counter(5000), 50, 2, W);
        c.new_peak(s); // peak: {0: 100, 5000: 50}
        c.leave(d, 0, 100, 1, W);
        c.enter(counter(7), 30, 1, s);
        assert_eq!(c.at_peak(10_000), vec![(0, 0, 100, 1), (0, 5000, 50, 2)]);
        c.enter(counter(7), 200, 1, W);
        c.new_peak(W); // peak: {5000: 50, 7: 230}
        c.leave(d, 5000, 50, 2, s);
        assert_eq!(c.at_peak(10_000), vec![(0, 7, 230, 2), (0, 5000, 50, 2)]);
        assert_eq!(
            c.at_peak(5000),
            vec![(0, 7, 230, 2)],
            "keys below 5000 only"
        );
        assert_eq!(c.current(d, 5000), (0, 0));
        assert!(std::ptr::eq(a, counter(0)), "chunks are never moved");
        c.clear(Space::DEFAULT);
        assert!(c.at_peak(10_000).is_empty());
        assert_eq!(
            c.memory_usage(),
            std::mem::size_of::<Counter>() * (1024 + 4096),
            "chunks 0 and 2 only"
        );
    }

    #[test]
    fn each_domain_keeps_its_own_counters_under_one_epoch() {
        let c = PeakCounters::new();
        assert_eq!(c.space_of(0), Some(Space::DEFAULT));
        let numpy = c.space_of(389_047).unwrap();
        let native = c.space_of(0x4E41_5456).unwrap();
        // (domain, expected space): known domains keep theirs, new ones take the next.
        let cases = [
            (389_047, numpy),
            (0, Space(0)),
            (0x4E41_5456, native),
            (7, Space(3)),
        ];
        for (domain, space) in cases {
            assert_eq!(c.space_of(domain), Some(space), "domain {domain}");
        }
        assert_eq!((numpy, native), (Space(1), Space(2)));
        // Same traceback in three domains.
        c.enter(c.counter(Space::DEFAULT, 4).unwrap(), 10, 1, W);
        c.enter(c.counter(numpy, 4).unwrap(), 1000, 1, W);
        c.enter(c.counter(native, 4).unwrap(), 300, 3, W);
        c.new_peak(W);
        c.leave(numpy, 4, 1000, 1, W);
        c.enter(c.counter(native, 4).unwrap(), 5, 1, W);
        assert_eq!(
            c.at_peak(10),
            vec![
                (0, 4, 10, 1),
                (389_047, 4, 1000, 1),
                (0x4E41_5456, 4, 300, 3)
            ]
        );
        assert_eq!(c.current(numpy, 4), (0, 0));
        assert_eq!(c.current(native, 4), (305, 4));
        assert_eq!(c.current(Space(3), 4), (0, 0), "never charged: no counters");
        // Leaving a space never charged changes nothing and allocates nothing.
        c.leave(Space(3), 4, 1, 1, W);
        assert_eq!(
            c.memory_usage(),
            3 * std::mem::size_of::<Counter>() * 1024 + 2 * std::mem::size_of::<Chunks>()
        );
        c.clear(numpy);
        assert!(c.at_peak(10).is_empty());
        assert_eq!(c.space_of(389_047), Some(numpy), "kept");
        assert_eq!(c.space_of(5), Some(native), "freed: the next domain's");
        c.enter(c.counter(native, 4).unwrap(), 9, 1, W);
        c.new_peak(W);
        assert_eq!(c.at_peak(10), vec![(5, 4, 9, 1)], "zeroed before reuse");
    }

    #[test]
    fn domains_beyond_the_limit_get_no_space() {
        let c = PeakCounters::new();
        for domain in 1..MAX_DOMAINS as u32 {
            assert_eq!(c.space_of(domain), Some(Space(domain as u16)));
        }
        assert_eq!(c.space_of(1_000_000), None);
        assert_eq!(c.space_of(5), Some(Space(5)), "known ones still found");
        c.clear(Space(1));
        assert_eq!(c.space_of(1_000_000), Some(Space(2)));
    }

    #[test]
    fn threads_claiming_new_domains_at_once_agree() {
        let c = PeakCounters::new();
        let seen: Vec<Vec<Option<Space>>> = std::thread::scope(|s| {
            let workers: Vec<_> = (0..4)
                .map(|_| s.spawn(|| (0..40).map(|d| c.space_of(100 + d)).collect()))
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).collect()
        });
        for other in &seen[1..] {
            assert_eq!(other, &seen[0]);
        }
        let mut spaces: Vec<_> = seen[0].iter().map(|s| s.unwrap().0).collect();
        spaces.sort_unstable();
        spaces.dedup();
        assert_eq!(spaces.len(), 40, "one space per domain");
    }
}
