//! The live-trace table: one entry per traced block, keyed by address, and the current and
//! peak totals.
//!
//! Hooks run on every allocating thread, and RAW-domain ones may run without the GIL, so the
//! table is a lock-sharded map (dashmap): a hook takes exactly one shard lock. Shard locks are
//! only ever taken through [`write`] and [`read`], which never park the waiting thread (see
//! [`crate::nopark`]: the fork handlers hold every shard lock across `fork()`), never through
//! dashmap's own `write()`/`read()` or the map's methods that lock shards. The totals are
//! updated while that shard lock is held, and [`TraceTable::clear`] holds every shard lock while
//! it empties the map and zeroes the totals; together that keeps "current == sum of the live
//! traces' sizes" exact whenever no hook is half-way through.
//!
//! Beside the totals, per-traceback counters remember what each traceback held at the peak
//! (see [`crate::peak`]); [`TraceTable::account`] is the one place a trace's size enters or
//! leaves the totals and those counters.
//!
//! An entry is 16 bytes (see [`Packed`]): the trace table is most of the tracer's memory, one
//! entry per live block.
//!
//! The table is created once and never freed (it lives in a `static`): `stop()` may race with a
//! hook still running on another thread, and that hook must find valid memory.
//!
//! In sampled mode ([`TraceTable::set_sampling`]) the table holds only the sampled blocks and
//! its totals are estimates (each trace charged its estimated bytes, see
//! `crate::analysis::sampling`). Most frees are then of blocks that were never recorded, so a
//! presence filter answers "certainly not here" without a lock: one 8-bit counter per slot,
//! indexed by a hash of the address, counting the entries that hash there. A free whose
//! counter is zero is done after one atomic load; a non-zero one (a collision, or the block)
//! takes the normal shard-locked path. A counter that reaches its maximum stays there (only
//! costs false positives) until the table is cleared.

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicU8, AtomicUsize, Ordering::Relaxed};
use std::sync::OnceLock;

use crate::analysis::sampling::{Weights, COUNT_SCALE};
use crate::nopark;
use crate::peak::{Counter, PeakCounters, Space};

use dashmap::{DashMap, RwLock, RwLockReadGuard, RwLockWriteGuard, SharedValue};

/// A shard's write lock, waited for without parking (see [`crate::nopark`]).
#[inline(always)]
fn write<T>(shard: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    nopark::acquire(|| shard.try_write())
}

/// A shard's read lock, waited for without parking (see [`crate::nopark`]).
#[inline(always)]
fn read<T>(shard: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    nopark::acquire(|| shard.try_read())
}

/// Interned traceback id (see [`crate::intern`]).
pub type TracebackId = u32;

/// What the table keeps per live block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Trace {
    pub size: usize,
    pub traceback: TracebackId,
}

/// Hashes a block address. Addresses are 16-byte aligned, so the low bits carry nothing; a
/// folded 128-bit multiply spreads the rest over both ends of the hash (hashbrown indexes
/// buckets with the low bits, dashmap picks shards with the high ones).
#[derive(Default, Clone, Copy)]
pub struct AddressHasher(u64);

impl Hasher for AddressHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(self.0 ^ u64::from(b));
        }
    }
    #[inline]
    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
    #[inline]
    fn write_u64(&mut self, n: u64) {
        let product = u128::from(n ^ self.0) * 0x9E37_79B9_7F4A_7C15_u128;
        self.0 = (product as u64) ^ ((product >> 64) as u64);
    }
}

#[derive(Default, Clone, Copy)]
pub struct BuildAddressHasher;

impl BuildHasher for BuildAddressHasher {
    type Hasher = AddressHasher;
    fn build_hasher(&self) -> AddressHasher {
        AddressHasher::default()
    }
}

/// A table entry: `(key, value)`, 16 bytes instead of the 24 an address, a `usize` size and a
/// 32-bit id would take with padding.
///
/// - `key`: the block's address in the low 48 bits (x86-64 user space is below 2^47), the high
///   16 bits of its size above it;
/// - `value`: the low 32 bits of its size, then the traceback id.
///
/// Lookups hash and compare the address bits only. A block whose address or size does not fit
/// (an address above 2^48, a block of 256 TiB) is not stored and is counted as dropped, never
/// recorded wrongly.
type Packed = (u64, SharedValue<u64>);

const ADDRESS_MASK: u64 = (1 << 48) - 1;

/// hashbrown's bucket count for a table of `capacity`: a power of two, filled to 7/8 at most
/// (to all but one bucket below 8).
pub(crate) fn buckets_for_capacity(capacity: usize) -> usize {
    match capacity {
        0 => 0,
        1..=7 => (capacity + 1).next_power_of_two(),
        _ => (capacity / 7 * 8).next_power_of_two(),
    }
}

#[inline(always)]
fn pack(address: usize, trace: Trace) -> Option<(u64, u64)> {
    let (address, size) = (address as u64, trace.size as u64);
    if address > ADDRESS_MASK || size >> 48 != 0 {
        return None;
    }
    let key = address | (size >> 32) << 48;
    let value = (size & 0xffff_ffff) | u64::from(trace.traceback) << 32;
    Some((key, value))
}

#[inline(always)]
fn unpack(key: u64, value: u64) -> (usize, Trace) {
    let size = (key >> 48) << 32 | (value & 0xffff_ffff);
    let trace = Trace {
        size: size as usize,
        traceback: (value >> 32) as TracebackId,
    };
    ((key & ADDRESS_MASK) as usize, trace)
}

/// Presence filter slots: 2^16 one-byte counters, 64 KiB (small enough to stay in cache on
/// the free path), allocated the first time sampling is on. At the default interval a large
/// heap holds a few thousand samples, so most slots are zero.
const PRESENCE_BITS: u32 = 16;

#[inline(always)]
fn presence_slot(address: usize) -> usize {
    // Drop the alignment bits, then take the top bits of a Fibonacci hash.
    ((address as u64 >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - PRESENCE_BITS)) as usize
}

/// A shard is shrunk when fewer than 1/`SHRINK_BELOW` of its capacity is in use, to twice its
/// entries: after a spike of short-lived blocks the table gives its memory back as the blocks
/// are freed (2M entries are ~70 MB of buckets), not only at `clear_traces()`. The rebuild
/// costs one pass over the shard, paid for by the 7/8 of its capacity freed before it, so the
/// free path stays one comparison more on average, and the factor between the shrink
/// threshold and the new size keeps a table hovering at one size from rebuilding over again.
const SHRINK_BELOW: usize = 8;
/// Shards this small (~70 KB of buckets) are left alone.
const SHRINK_MIN: usize = 4096;

pub struct TraceTable {
    map: DashMap<u64, u64, BuildAddressHasher>,
    current: AtomicUsize,
    peak: AtomicUsize,
    /// Per domain and traceback, bytes and blocks now and at the peak (see [`crate::peak`]).
    counters: PeakCounters,
    /// The counters' space of native blocks (odd keys, see [`TraceTable::space`]).
    native: Space,
    /// The sampling interval (0: exact), for the estimated totals.
    interval: AtomicU64,
    /// The presence filter's counters while sampling, null while exact (every address may
    /// then be present). Points into `presence_storage`, which is never freed once made.
    presence: AtomicPtr<AtomicU8>,
    presence_storage: OnceLock<Box<[AtomicU8]>>,
}

impl Default for TraceTable {
    fn default() -> Self {
        Self::new()
    }
}

impl TraceTable {
    pub fn new() -> Self {
        let counters = PeakCounters::new();
        let native = counters
            .space_of(crate::native::DOMAIN)
            .expect("new counters have room for a second domain");
        Self {
            map: DashMap::with_hasher(BuildAddressHasher),
            current: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            counters,
            native,
            interval: AtomicU64::new(0),
            presence: AtomicPtr::new(std::ptr::null_mut()),
            presence_storage: OnceLock::new(),
        }
    }

    /// Switches between exact (`interval` 0) and sampled mode. Only on an empty table with
    /// no hook recording (`start()`), since entries and totals are kept per mode.
    pub fn set_sampling(&self, interval: u64) {
        self.interval.store(interval, Relaxed);
        let presence = if interval == 0 {
            std::ptr::null_mut()
        } else {
            let storage = self.presence_storage.get_or_init(|| {
                (0..1usize << PRESENCE_BITS)
                    .map(|_| AtomicU8::new(0))
                    .collect()
            });
            storage.as_ptr() as *mut AtomicU8
        };
        self.presence.store(presence, Relaxed);
    }

    /// The counter of `address`'s slot, while sampling.
    #[inline(always)]
    fn presence_counter(&self, address: usize) -> Option<&AtomicU8> {
        let presence = self.presence.load(Relaxed);
        // SAFETY: a non-null pointer points at the 2^PRESENCE_BITS counters of
        // `presence_storage`, which live as long as the table.
        (!presence.is_null()).then(|| unsafe { &*presence.add(presence_slot(address)) })
    }

    /// False only if `address` is certainly not in the table (sampled mode, slot empty):
    /// lock-free, so frees of unsampled blocks cost one load.
    #[inline(always)]
    pub fn may_contain(&self, address: usize) -> bool {
        self.presence_counter(address)
            .is_none_or(|counter| counter.load(Relaxed) != 0)
    }

    fn presence_add(&self, address: usize) {
        if let Some(counter) = self.presence_counter(address) {
            let _ = counter.fetch_update(Relaxed, Relaxed, |n| n.checked_add(1));
        }
    }

    fn presence_remove(&self, address: usize) {
        if let Some(counter) = self.presence_counter(address) {
            let _ = counter.fetch_update(Relaxed, Relaxed, |n| {
                (n != 0 && n != u8::MAX).then(|| n - 1)
            });
        }
    }

    /// The domain whose counters a key's block is charged to: native blocks are kept under
    /// their address with the low bit set (`crate::tracer::native_key`), which no block of
    /// the PEP 445 allocators has (they are at least 8-byte aligned).
    #[inline(always)]
    fn space(&self, key: usize) -> Space {
        if key & 1 == 1 {
            self.native
        } else {
            Space::DEFAULT
        }
    }

    /// What a trace of `size` adds to the totals: its size and one block, or its estimated
    /// bytes and blocks (count units) when sampling.
    #[inline(always)]
    fn charge(&self, size: usize) -> (usize, u64) {
        match self.interval.load(Relaxed) {
            0 => (size, COUNT_SCALE),
            interval => {
                let weights = Weights::Sampled { interval };
                (
                    weights.bytes(size as u64) as usize,
                    weights.count_units(size as u64),
                )
            }
        }
    }

    /// The one place where a trace's size enters (`entering`: its traceback's counter) or
    /// leaves (`None`) the totals and its traceback's counters in `space`; called with the shard lock of
    /// the trace's block held. Anything that adds or removes a live block (or adds traces
    /// under other keys) goes through here, and a block that only changes traceback through
    /// [`TraceTable::account_move`], so the current total, the peak and the
    /// per-traceback values at the peak stay in step. An entering trace comes with its
    /// traceback's counter, which the caller got (allocating if need be) before changing
    /// anything.
    #[inline(always)]
    fn account(&self, space: Space, trace: Trace, entering: Option<&Counter>) {
        let (bytes, blocks) = self.charge(trace.size);
        if let Some(counter) = entering {
            self.counters.enter(counter, bytes as u64, blocks);
            let now = self.current.fetch_add(bytes, Relaxed).wrapping_add(bytes);
            if now > self.peak.load(Relaxed) && self.peak.fetch_max(now, Relaxed) < now {
                self.counters.new_peak();
                crate::memory_limit::note_peak(now);
            }
        } else {
            self.counters
                .leave(space, trace.traceback, bytes as u64, blocks);
            self.current.fetch_sub(bytes, Relaxed);
        }
    }

    /// A live block moves from `trace`'s traceback to the one whose counter is `to` (see
    /// [`TraceTable::retrace`]), with the shard lock held: the totals do not change, so neither
    /// can the peak, and only the two counters are charged. Objects reused from free lists
    /// come here once per object created, so the two atomic operations on the total saved
    /// are worth a second entry point.
    #[inline(always)]
    fn account_move(&self, space: Space, trace: Trace, to: &Counter) {
        let (bytes, blocks) = self.charge(trace.size);
        self.counters
            .leave(space, trace.traceback, bytes as u64, blocks);
        self.counters.enter(to, bytes as u64, blocks);
    }

    /// Records a new block. An entry already at that address (a block freed behind our back,
    /// e.g. by an allocator installed over ours) is replaced, keeping the totals exact.
    ///
    /// Returns `false`, leaving the table and totals unchanged, when the table is full and
    /// cannot get memory to grow: this runs inside an allocator hook, where the process must
    /// see its own allocation succeed rather than be aborted by ours failing. Growth is only
    /// attempted when the shard is full, so the common insert costs one comparison more.
    #[inline]
    #[must_use = "a `false` insert is a dropped trace, to be counted"]
    pub fn insert(&self, address: usize, trace: Trace) -> bool {
        let Some((key, value)) = pack(address, trace) else {
            return false;
        };
        // Its counter must exist before the trace enters (the only step that may allocate
        // besides the map's own growth).
        let space = self.space(address);
        let Some(counter) = self.counters.counter(space, trace.traceback) else {
            return false;
        };
        let hash = self.hash(address as u64);
        let shard = &self.map.shards()[self.map.determine_shard(hash as usize)];
        let mut shard = write(shard);
        if let Some(bucket) = shard.find(hash, |entry| entry.0 & ADDRESS_MASK == address as u64) {
            // SAFETY: the bucket was just found in this shard, whose write lock is held.
            let entry = unsafe { bucket.as_mut() };
            let (_, old) = unpack(entry.0, *entry.1.get());
            *entry = (key, SharedValue::new(value));
            self.account(space, old, None);
            self.account(space, trace, Some(counter));
            return true;
        }
        let rehash = |entry: &Packed| self.hash(entry.0 & ADDRESS_MASK);
        if shard.try_reserve(1, rehash).is_err() {
            return false;
        }
        // SAFETY: room for one more entry was reserved just above, under the same lock.
        unsafe { shard.insert_no_grow(hash, (key, SharedValue::new(value))) };
        self.presence_add(address);
        self.account(space, trace, Some(counter));
        true
    }

    /// Forgets a block, returning what was recorded for it. Never allocates (dashmap's
    /// `entry()` would reserve room for an insert first, and abort if that failed).
    #[inline]
    pub fn remove(&self, address: usize) -> Option<Trace> {
        let hash = self.hash(address as u64);
        let shard = &self.map.shards()[self.map.determine_shard(hash as usize)];
        let mut shard = write(shard);
        let bucket = shard.find(hash, |entry| entry.0 & ADDRESS_MASK == address as u64)?;
        // SAFETY: the bucket was just found in this shard, whose write lock is held.
        let ((key, value), _) = unsafe { shard.remove(bucket) };
        let (_, trace) = unpack(key, value.into_inner());
        self.presence_remove(address);
        self.account(self.space(address), trace, None);
        if shard.len() < shard.capacity() / SHRINK_BELOW && shard.capacity() > SHRINK_MIN {
            // Rebuilt at twice its entries, or left as it is if the smaller table cannot be
            // had: a free hook must not fail, nor abort for memory (hashbrown's own
            // `shrink_to` aborts on a failed allocation). Entries are copied as they are.
            let rehash = |entry: &Packed| self.hash(entry.0 & ADDRESS_MASK);
            let old = std::mem::take(&mut *shard);
            if shard.try_reserve(old.len() * 2, rehash).is_ok() {
                // SAFETY: iterating a table we own; room for every entry was reserved above.
                unsafe {
                    for bucket in old.iter() {
                        let (key, value) = bucket.as_ref();
                        let entry = (*key, SharedValue::new(*value.get()));
                        shard.insert_no_grow(rehash(&entry), entry);
                    }
                }
            } else {
                *shard = old;
            }
        }
        Some(trace)
    }

    /// Gives the block at `address`, if traced, a new traceback: `traceback` is called with
    /// its trace (under the shard's write lock, so nothing frees or replaces the block in
    /// between) and returns the new id, or `None` to forget the block (trace-time filters
    /// reject its new stack). Returns whether the block was traced.
    ///
    /// This is the one place a live block changes traceback (an object reused from a CPython
    /// free list, see [`crate::freelist`]), so per-traceback accounting belongs here too.
    #[inline]
    pub fn retrace(
        &self,
        address: usize,
        traceback: impl FnOnce(Trace) -> Option<TracebackId>,
    ) -> bool {
        let hash = self.hash(address as u64);
        let shard = &self.map.shards()[self.map.determine_shard(hash as usize)];
        let mut shard = write(shard);
        let Some(bucket) = shard.find(hash, |entry| entry.0 & ADDRESS_MASK == address as u64)
        else {
            return false;
        };
        // SAFETY: the bucket was just found in this shard, whose write lock is held.
        let entry = unsafe { bucket.as_mut() };
        let (_, old) = unpack(entry.0, *entry.1.get());
        let space = self.space(address);
        match traceback(old) {
            Some(id) if id == old.traceback => {}
            Some(id) => {
                // Without memory for the new traceback's counter, the block keeps its
                // traceback.
                if let Some(counter) = self.counters.counter(space, id) {
                    // Same address and size: only the traceback half of the value changes.
                    *entry.1.get_mut() = (*entry.1.get() & 0xffff_ffff) | u64::from(id) << 32;
                    self.account_move(space, old, counter);
                }
            }
            None => {
                // SAFETY: as above; the bucket is not used after its removal.
                unsafe { shard.remove(bucket) };
                self.presence_remove(address);
                self.account(space, old, None);
            }
        }
        true
    }

    /// Charges the totals for a block of `domain` kept outside the map (an extension's block
    /// in another domain, see `crate::tracked`): `removed` leaves them, `added` joins them.
    /// The one place where traces outside the map meet the table's accounting.
    ///
    /// Returns `false`, changing nothing, if the added trace's counter cannot be had (no
    /// memory, or [`crate::peak::MAX_DOMAINS`] other domains hold blocks): the caller leaves
    /// that block untraced.
    #[must_use = "a `false` is a trace that was not added, to be counted as dropped"]
    pub fn account_outside(
        &self,
        domain: u32,
        removed: Option<Trace>,
        added: Option<Trace>,
    ) -> bool {
        let Some(space) = self.counters.space_of(domain) else {
            // No space: nothing of this domain was ever added.
            return removed.is_none() && added.is_none();
        };
        let counter = match added {
            Some(trace) => match self.counters.counter(space, trace.traceback) {
                Some(counter) => Some((trace, counter)),
                None => return false,
            },
            None => None,
        };
        if let Some(trace) = removed {
            self.account(space, trace, None);
        }
        if let Some((trace, counter)) = counter {
            self.account(space, trace, Some(counter));
        }
        true
    }

    pub fn get(&self, address: usize) -> Option<Trace> {
        let hash = self.hash(address as u64);
        let shard = &self.map.shards()[self.map.determine_shard(hash as usize)];
        let shard = read(shard);
        let bucket = shard.find(hash, |entry| entry.0 & ADDRESS_MASK == address as u64)?;
        // SAFETY: the bucket was just found in this shard, whose read lock is held.
        let entry = unsafe { bucket.as_ref() };
        Some(unpack(entry.0, *entry.1.get()).1)
    }

    #[inline(always)]
    fn hash(&self, address: u64) -> u64 {
        self.map.hash_usize(&address) as u64
    }

    /// `(current, peak)` in bytes.
    pub fn totals(&self) -> (usize, usize) {
        (self.current.load(Relaxed), self.peak.load(Relaxed))
    }

    pub fn reset_peak(&self) {
        self.peak.store(self.current.load(Relaxed), Relaxed);
        self.counters.new_peak();
    }

    /// Per domain and traceback below `tracebacks` that held anything at the peak:
    /// `(domain, traceback, bytes, blocks in count units)` then, domain 0's first. Bytes and
    /// blocks are estimates when sampling (charged as the totals are).
    pub fn at_peak(&self, tracebacks: usize) -> Vec<(u32, TracebackId, u64, u64)> {
        self.counters.at_peak(tracebacks)
    }

    pub fn len(&self) -> usize {
        self.map
            .shards()
            .iter()
            .map(|shard| read(shard).len())
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.map.shards().iter().all(|shard| read(shard).is_empty())
    }

    /// Copies every live trace out, shard by shard. Never calls back into Python, so it is
    /// safe to run while hooks on other threads insert and remove. `None` if the memory for
    /// the copy cannot be had (the caller raises `MemoryError`).
    pub fn collect(&self) -> Option<Vec<(usize, Trace)>> {
        let mut out = Vec::new();
        out.try_reserve_exact(self.len() + 64).ok()?;
        for shard in self.map.shards() {
            let shard = read(shard);
            out.try_reserve(shard.len()).ok()?;
            // SAFETY: the shard's read lock is held for the whole iteration.
            unsafe {
                for bucket in shard.iter() {
                    let (key, value) = bucket.as_ref();
                    out.push(unpack(*key, *value.get()));
                }
            }
        }
        Some(out)
    }

    /// Empties the table and zeroes both totals, atomically with respect to hooks.
    pub fn clear(&self) {
        let mut guards: Vec<_> = self.map.shards().iter().map(|shard| write(shard)).collect();
        for guard in guards.iter_mut() {
            guard.clear();
        }
        self.current.store(0, Relaxed);
        self.peak.store(0, Relaxed);
        self.counters.clear(self.native);
        if let Some(storage) = self.presence_storage.get() {
            for counter in storage.iter() {
                counter.store(0, Relaxed);
            }
        }
        // Release the memory of a large table: a cleared tracer should cost nothing (each
        // shard is empty: nothing to rehash).
        for guard in guards.iter_mut() {
            guard.shrink_to(0, |entry: &Packed| self.hash(entry.0 & ADDRESS_MASK));
        }
    }

    /// Bytes the table itself holds: every bucket of every shard (16-byte entry + 1 control
    /// byte, empty or not), plus the shard array.
    pub fn memory_usage(&self) -> usize {
        let buckets: usize = self
            .map
            .shards()
            .iter()
            .map(|shard| buckets_for_capacity(read(shard).capacity()))
            .sum();
        let presence = match self.presence.load(Relaxed).is_null() {
            true => 0,
            false => (1 << PRESENCE_BITS) * std::mem::size_of::<AtomicU8>(),
        };
        buckets * (std::mem::size_of::<Packed>() + 1)
            + std::mem::size_of_val(self.map.shards())
            + presence
            + self.counters.memory_usage()
    }

    /// Takes every shard's write lock and keeps it: called just before `fork()` so that the
    /// child never inherits a lock held by a thread that does not exist there. Threads that
    /// want a shard meanwhile wait without parking (see [`crate::nopark`]), so releasing the
    /// locks after `fork()` needs nothing from `parking_lot_core`.
    pub fn lock_all(&self) {
        for shard in self.map.shards() {
            std::mem::forget(write(shard));
        }
    }

    /// Undoes [`TraceTable::lock_all`] (in the parent and in the child after `fork()`).
    ///
    /// # Safety
    /// Only after `lock_all` on this thread (or on the forking thread, in the child).
    pub unsafe fn unlock_all(&self) {
        for shard in self.map.shards() {
            shard.force_unlock_write();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(size: usize, traceback: u32) -> Trace {
        Trace { size, traceback }
    }

    /// After a spike the table gives its memory back as the blocks are freed, and the
    /// totals and the surviving entries are untouched by the rebuilds.
    #[test]
    fn a_spike_freed_gives_the_memory_back() {
        let table = TraceTable::new();
        let empty = table.memory_usage();
        let n = 400_000;
        for i in 0..n {
            assert!(table.insert(0x10_0000 + i * 16, t(i, 1)));
        }
        let spiked = table.memory_usage();
        for i in 0..n - 100 {
            table.remove(0x10_0000 + i * 16);
        }
        let after = table.memory_usage();
        // Shards below SHRINK_MIN entries are left alone: a few hundred KB at most.
        assert!(
            after < empty + spiked / 10,
            "{after} bytes kept after freeing (spike {spiked}, empty {empty})"
        );
        assert_eq!(table.len(), 100);
        let kept: usize = (n - 100..n).sum();
        assert_eq!(table.totals().0, kept);
        for i in n - 100..n {
            assert_eq!(table.get(0x10_0000 + i * 16), Some(t(i, 1)));
        }
    }

    #[test]
    fn totals_follow_inserts_removes_and_replacements() {
        let table = TraceTable::new();
        // (operation, address, size, expected current, expected peak)
        let steps: &[(&str, usize, usize, usize, usize)] = &[
            ("insert", 0x1000, 100, 100, 100),
            ("insert", 0x2000, 50, 150, 150),
            ("remove", 0x1000, 0, 50, 150),
            ("remove", 0x1000, 0, 50, 150), // unknown address: no change
            ("insert", 0x2000, 10, 10, 150), // replaced in place
            ("insert", 0x3000, 200, 210, 210),
        ];
        for &(op, address, size, current, peak) in steps {
            match op {
                "insert" => assert!(table.insert(address, t(size, 1))),
                _ => {
                    table.remove(address);
                }
            }
            assert_eq!(table.totals(), (current, peak), "after {op} {address:#x}");
        }
        let sum: usize = table.collect().unwrap().iter().map(|(_, t)| t.size).sum();
        assert_eq!(sum, table.totals().0);
        table.reset_peak();
        assert_eq!(table.totals(), (210, 210));
        table.clear();
        assert_eq!(table.totals(), (0, 0));
        assert!(table.is_empty());
    }

    #[test]
    fn retrace_changes_traceback_only_or_forgets() {
        let table = TraceTable::new();
        assert!(table.insert(0x1000, t(100, 1)));
        assert!(table.insert(0x2000, t(50, 2)));
        // (address, new traceback or None to forget, was traced, trace after, current after)
        type Step = (usize, Option<u32>, bool, Option<Trace>, usize);
        let steps: &[Step] = &[
            (0x1000, Some(7), true, Some(t(100, 7)), 150),
            (0x3000, Some(7), false, None, 150),
            (0x2000, None, true, None, 100),
            (0x2000, Some(1), false, None, 100),
        ];
        for &(address, new, traced, after, current) in steps {
            let mut seen = None;
            let found = table.retrace(address, |old| {
                seen = Some(old);
                new
            });
            assert_eq!(found, traced, "{address:#x}");
            assert_eq!(seen.is_some(), traced, "callback only for a traced block");
            assert_eq!(table.get(address), after, "{address:#x}");
            assert_eq!(table.totals().0, current, "{address:#x}");
        }
        assert_eq!(table.totals().1, 150, "retracing never raises the peak");
    }

    #[test]
    fn concurrent_updates_keep_current_equal_to_sum() {
        let table = std::sync::Arc::new(TraceTable::new());
        let threads: Vec<_> = (0..4)
            .map(|k| {
                let table = table.clone();
                std::thread::spawn(move || {
                    for i in 0..20_000usize {
                        let address = (k << 40) | (i << 4);
                        assert!(table.insert(address, t(i % 97 + 1, 0)));
                        if i % 3 != 0 {
                            table.remove(address);
                        }
                    }
                })
            })
            .collect();
        for th in threads {
            th.join().unwrap();
        }
        let sum: usize = table.collect().unwrap().iter().map(|(_, t)| t.size).sum();
        assert_eq!(sum, table.totals().0);
        assert_eq!(table.len(), 4 * (20_000_usize).div_ceil(3));
    }

    #[test]
    fn bucket_counts_match_hashbrown() {
        for wanted in [0usize, 1, 3, 7, 8, 14, 15, 100, 1000, 114_689, 1 << 20] {
            let table: hashbrown::HashTable<u64> = hashbrown::HashTable::with_capacity(wanted);
            let buckets = buckets_for_capacity(table.capacity());
            assert!(buckets.is_power_of_two() || buckets == 0, "{wanted}");
            assert!(buckets >= table.capacity(), "{wanted}");
            assert!(buckets <= (table.capacity() * 8 / 7).max(1) * 2, "{wanted}");
        }
    }

    #[test]
    fn entries_are_16_bytes_and_pack_round_trips() {
        assert_eq!(std::mem::size_of::<Packed>(), 16);
        // (address, size, traceback, fits)
        let cases: &[(usize, usize, u32, bool)] = &[
            (0x7fff_ffff_fff0, 1, 0, true),
            (16, 0, u32::MAX, true),
            (0x5555_0000_0010, 0xffff_ffff, 7, true),
            (0x5555_0000_0010, 0x1_0000_0000, 7, true),
            (0x5555_0000_0010, (1 << 48) - 1, 3, true),
            (0x5555_0000_0010, 1 << 48, 3, false),
            (1 << 48, 8, 3, false),
        ];
        for &(address, size, traceback, fits) in cases {
            let trace = t(size, traceback);
            match pack(address, trace) {
                Some((key, value)) => {
                    assert!(fits, "{address:#x} {size:#x} should not fit");
                    assert_eq!(unpack(key, value), (address, trace));
                }
                None => assert!(!fits, "{address:#x} {size:#x} should fit"),
            }
        }
        let table = TraceTable::new();
        assert!(table.insert(0x1000, t(5 << 40, 9)));
        assert_eq!(table.get(0x1000), Some(t(5 << 40, 9)));
        assert!(
            !table.insert(0x2000, t(1 << 50, 9)),
            "oversized blocks are dropped"
        );
        assert_eq!(table.totals().0, 5 << 40);
    }

    #[test]
    fn lock_all_then_unlock_all_leaves_table_usable() {
        let table = TraceTable::new();
        assert!(table.insert(16, t(1, 0)));
        table.lock_all();
        unsafe { table.unlock_all() };
        assert!(table.insert(32, t(2, 0)));
        assert_eq!(table.totals().0, 3);
    }

    #[test]
    fn sampled_mode_charges_estimates_and_filters_frees() {
        let table = TraceTable::new();
        table.set_sampling(1024);
        let w = Weights::Sampled { interval: 1024 };
        let estimate = |size: usize| w.bytes(size as u64) as usize;
        // (operation, address, size): every insert/remove keeps current == Σ estimates.
        assert!(!table.may_contain(0x1000));
        assert!(table.insert(0x1000, t(100, 1)));
        assert!(table.may_contain(0x1000));
        assert!(table.insert(0x2000, t(5000, 1)));
        assert_eq!(table.totals().0, estimate(100) + estimate(5000));
        // Replacing an entry keeps one presence count for the address.
        assert!(table.insert(0x1000, t(10, 1)));
        assert_eq!(table.totals().0, estimate(10) + estimate(5000));
        assert_eq!(table.remove(0x1000), Some(t(10, 1)));
        assert!(
            !table.may_contain(0x1000),
            "count back to zero after one remove"
        );
        // Many addresses: none that was removed is still reported present unless it
        // shares a slot with a live one.
        let live: Vec<usize> = (1..2000).map(|i| 0x10_0000 + i * 4096).collect();
        for &a in &live {
            assert!(table.insert(a, t(64, 2)));
        }
        for &a in &live[..1000] {
            table.remove(a);
        }
        for &a in &live[1000..] {
            assert!(table.may_contain(a), "a live entry is never filtered out");
        }
        let live_slots: std::collections::HashSet<usize> =
            live[1000..].iter().map(|&a| presence_slot(a)).collect();
        let stale = live[..1000]
            .iter()
            .filter(|&&a| table.may_contain(a) && !live_slots.contains(&presence_slot(a)))
            .count();
        assert_eq!(stale, 0);
        let sum: usize = table
            .collect()
            .unwrap()
            .iter()
            .map(|(_, t)| estimate(t.size))
            .sum();
        assert_eq!(sum, table.totals().0);
        table.clear();
        assert!(live.iter().all(|&a| !table.may_contain(a)));
        // Back to exact: every address may be present, totals are sizes.
        table.set_sampling(0);
        assert!(table.may_contain(0x1000));
        assert!(table.insert(0x1000, t(100, 1)));
        assert_eq!(table.totals().0, 100);
    }

    /// Replays random alloc/free/realloc/replace/reset/clear sequences against a naive
    /// model that copies every traceback's sums at each new peak, exactly and sampled.
    #[test]
    fn values_at_peak_match_a_brute_force_replay() {
        use std::collections::BTreeMap;
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut rand = move |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        for interval in [0u64, 4096] {
            let weights = Weights::new(Some(interval));
            let charge =
                |size: usize| (weights.bytes(size as u64), weights.count_units(size as u64));
            for round in 0..20 {
                let table = TraceTable::new();
                table.set_sampling(interval);
                let mut live: BTreeMap<usize, Trace> = BTreeMap::new();
                let mut peak_total = 0u64;
                let mut at_peak: PerTraceback = BTreeMap::new();
                // Odd keys are native blocks, in their own domain at the peak.
                let domain = |address: usize| match address & 1 {
                    0 => 0,
                    _ => crate::native::DOMAIN,
                };
                let sums = |live: &BTreeMap<usize, Trace>| {
                    let mut out: PerTraceback = BTreeMap::new();
                    for (&address, t) in live {
                        let (b, u) = charge(t.size);
                        let e = out.entry((domain(address), t.traceback)).or_default();
                        e.0 += b;
                        e.1 += u;
                    }
                    out
                };
                // Tracebacks spread over two chunks of counters.
                let tracebacks = [0u32, 1, 2, 7, 1500, 3000];
                for step in 0..2000 {
                    let op = rand(100);
                    let size = match rand(4) {
                        0 => rand(8) as usize,
                        1 => rand(20_000) as usize,
                        _ => rand(300) as usize,
                    };
                    let tb = tracebacks[rand(tracebacks.len() as u64) as usize];
                    let existing = (!live.is_empty())
                        .then(|| *live.keys().nth(rand(live.len() as u64) as usize).unwrap());
                    match (op, existing) {
                        (0..=44, _) | (_, None) => {
                            let address = 16 * (1 + rand(1 << 20) as usize) + rand(2) as usize;
                            let trace = t(size, tb);
                            assert!(table.insert(address, trace));
                            live.insert(address, trace);
                        }
                        (45..=79, Some(address)) => {
                            assert_eq!(table.remove(address), live.remove(&address));
                        }
                        (80..=91, Some(address)) => {
                            // realloc: the old trace out, the new block in.
                            assert_eq!(table.remove(address), live.remove(&address));
                            let new = 16 * (1 + rand(1 << 20) as usize) + rand(2) as usize;
                            check(&table, &live, &mut peak_total, &mut at_peak, &sums);
                            assert!(table.insert(new, t(size, tb)));
                            live.insert(new, t(size, tb));
                        }
                        (92..=96, Some(address)) => {
                            // A block replaced behind our back.
                            assert!(table.insert(address, t(size, tb)));
                            live.insert(address, t(size, tb));
                        }
                        (97..=98, _) => {
                            table.reset_peak();
                            peak_total = live.values().map(|t| charge(t.size).0).sum();
                            at_peak = sums(&live);
                        }
                        _ => {
                            table.clear();
                            live.clear();
                            peak_total = 0;
                            at_peak.clear();
                        }
                    }
                    check(&table, &live, &mut peak_total, &mut at_peak, &sums);
                    let got: PerTraceback = table
                        .at_peak(4000)
                        .into_iter()
                        .map(|(d, k, b, u)| ((d, k), (b, u)))
                        .collect();
                    let want: PerTraceback = at_peak
                        .iter()
                        .filter(|(_, &v)| v != (0, 0))
                        .map(|(&k, &v)| (k, v))
                        .collect();
                    assert_eq!(got, want, "interval {interval} round {round} step {step}");
                    let sum: u64 = got.values().map(|v| v.0).sum();
                    assert_eq!(sum as usize, table.totals().1);
                }
            }
        }

        /// `(bytes, count units)` per domain and traceback.
        type PerTraceback = BTreeMap<(u32, u32), (u64, u64)>;

        /// The model's side of every operation: a new peak copies every traceback's sums.
        fn check(
            table: &TraceTable,
            live: &BTreeMap<usize, Trace>,
            peak_total: &mut u64,
            at_peak: &mut PerTraceback,
            sums: &dyn Fn(&BTreeMap<usize, Trace>) -> PerTraceback,
        ) {
            let sums_now = sums(live);
            let total: u64 = sums_now.values().map(|v| v.0).sum();
            if total > *peak_total {
                *peak_total = total;
                *at_peak = sums_now;
            }
            assert_eq!(table.totals(), (total as usize, *peak_total as usize));
        }
    }

    #[test]
    fn blocks_outside_the_map_keep_their_domain_at_the_peak() {
        let table = TraceTable::new();
        assert!(table.insert(0x1000, t(100, 1)));
        assert!(table.account_outside(389_047, None, Some(t(5000, 1))));
        assert!(table.insert(crate::tracer::native_key(0x2000), t(70, 2)));
        let peak = table.at_peak(10);
        table.remove(0x1000);
        assert!(table.account_outside(389_047, Some(t(5000, 1)), None));
        assert_eq!(table.totals(), (70, 5170));
        assert_eq!(table.at_peak(10), peak);
        // Native mode's space is the table's second, whether used or not.
        assert_eq!(
            peak,
            vec![
                (0, 1, 100, COUNT_SCALE),
                (crate::native::DOMAIN, 2, 70, COUNT_SCALE),
                (389_047, 1, 5000, COUNT_SCALE),
            ]
        );
        // Domains past the limit are refused, changing nothing; known ones still work.
        let taken = 3; // by 0, native's and 389047
        let mut refused = 0;
        for domain in 1..=crate::peak::MAX_DOMAINS as u32 {
            if !table.account_outside(domain, None, Some(t(1, 3))) {
                refused += 1;
            }
        }
        assert_eq!(refused, taken);
        assert_eq!(table.totals().0, 70 + crate::peak::MAX_DOMAINS - taken);
        assert!(table.account_outside(389_047, None, Some(t(1, 3))));
        assert!(
            table.account_outside(1_000_000, None, None),
            "nothing to charge"
        );
        table.clear();
        assert!(
            table.account_outside(1_000_000, None, Some(t(1, 3))),
            "spaces given back"
        );
        assert!(table.insert(crate::tracer::native_key(0x2000), t(70, 2)));
        assert_eq!(
            table.at_peak(10)[0].0,
            crate::native::DOMAIN,
            "native's kept"
        );
    }

    #[test]
    fn address_hash_spreads_aligned_addresses() {
        let build = BuildAddressHasher;
        let mut low = std::collections::HashSet::new();
        for i in 0..1024usize {
            low.insert(build.hash_one(0x7f00_0000_0000 + i * 16) & 1023);
        }
        assert!(low.len() > 600, "low bits collide: {} distinct", low.len());
    }
}
