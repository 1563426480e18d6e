//! The live-trace table: one entry per traced block, keyed by address, and the current and
//! peak totals.
//!
//! Hooks run on every allocating thread, and RAW-domain ones may run without the GIL, so the table
//! is a lock-sharded map (dashmap): a hook takes exactly one shard lock. Shard locks are only ever
//! taken through [`write`] and [`read`], which never park the waiting thread (see
//! [`crate::platform::nopark`]: the fork handlers hold every shard lock across `fork()`), never
//! through dashmap's own `write()`/`read()` or the map's methods that lock shards. The totals are
//! updated while that shard lock is held, and [`TraceTable::clear`] holds every shard lock while it
//! empties the map and zeroes the totals; together that keeps "current == sum of the live traces'
//! sizes" exact whenever no hook is half-way through. Every change to the totals says who makes it
//! (a [`Writer`]): a thread holding the main interpreter's GIL changes them without locked
//! instructions (see [`crate::hooks::tally`]).
//!
//! Beside the totals, per-traceback counters remember what each traceback held at the peak
//! (see [`crate::hooks::peak`]); [`TraceTable::account`] is the one place a trace's size enters or
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

use std::cell::UnsafeCell;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{
    AtomicBool, AtomicPtr, AtomicU64, AtomicU8, AtomicUsize, Ordering::Relaxed,
};
use std::sync::OnceLock;

use crate::analysis::sampling::{Weights, COUNT_SCALE};
use crate::hooks::peak::{Counter, PeakCounters, Space};
use crate::hooks::tally::{Peak, Tally, Writer};
use crate::platform::nopark;

use dashmap::{DashMap, RwLock, RwLockReadGuard, RwLockWriteGuard, SharedValue};
use hashbrown::HashMap;

/// A shard's write lock, waited for without parking (see [`crate::platform::nopark`]).
#[inline(always)]
fn write<T>(shard: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    nopark::acquire(|| shard.try_write())
}

/// After a burst of large blocks, the big sizes of a shard rebuilt at twice their entries
/// (as [`TraceTable::shrink_shard`] does for the shard), if the memory can be had.
#[cold]
#[inline(never)]
fn shrink_big(big: &mut HashMap<u64, usize, BuildAddressHasher>) {
    let mut smaller = HashMap::with_hasher(BuildAddressHasher);
    if smaller.try_reserve(big.len() * 2).is_ok() {
        smaller.extend(big.drain());
        *big = smaller;
    }
}

/// A shard's read lock, waited for without parking (see [`crate::platform::nopark`]).
#[inline(always)]
fn read<T>(shard: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    nopark::acquire(|| shard.try_read())
}

/// Interned traceback id (see [`crate::hooks::intern`]).
pub type TracebackId = u32;

/// What the table keeps per live block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Trace {
    pub size: usize,
    pub traceback: TracebackId,
}

/// Hashes a block address, keeping neighbours together. Allocators hand out consecutive
/// blocks in runs (pymalloc carves each pool into equal blocks, in address order), and with a
/// hash that scatters every address, each allocation and each free of a large heap missed the
/// cache twice in the table (control byte, then entry): the table's insert and remove, mostly
/// waiting on those loads, took two thirds of a traced loop keeping a million `str` objects
/// alive. So the address is split into a
/// 256-byte granule, scrambled (a folded 128-bit multiply, whose bits spread over both ends:
/// hashbrown indexes buckets with the low bits, dashmap picks shards with the high ones), and
/// the block's 16-byte slot within it, which becomes the bucket's offset in a run of 32
/// (every other bucket, leaving room for a colliding granule's blocks in the same group). The
/// blocks of a granule share a shard, a control-byte group and a few cache lines of entries.
/// The slot also goes into the top bits, which hashbrown compares as a tag, so that the blocks
/// of one granule do not all match each other's tag.
#[derive(Default, Clone, Copy)]
pub struct AddressHasher(u64);

/// The folded multiply: spreads a word over both ends of the result.
#[inline(always)]
fn fold(word: u64) -> u64 {
    let product = u128::from(word) * 0x9E37_79B9_7F4A_7C15_u128;
    (product as u64) ^ ((product >> 64) as u64)
}

impl Hasher for AddressHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = fold(self.0 ^ u64::from(b));
        }
    }
    #[inline]
    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
    #[inline]
    fn write_u64(&mut self, n: u64) {
        let granule = fold((n >> 8) ^ self.0);
        let slot = (n >> 4) & 15;
        self.0 = ((granule << 5) | (slot << 1)) ^ (slot << 59);
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

/// A table entry, 12 bytes: `([low, high], traceback id)`, 4-byte aligned, where `high:low`
/// is the block's address in its low 47 bits (x86-64 user space is below 2^47) and its size
/// in the 17 bits above. Twelve bytes rather than the 24 an address, a `usize` size and an id
/// take with padding (or 16 for a packed pair of `u64`s): the entries are most of the
/// tracer's memory, one per live block.
///
/// A size of [`SIZE_ELSEWHERE`] bytes or more (128 KiB) does not fit: its field holds that
/// value and the size itself is kept in the shard's [`BigSizes`]. Such blocks are few (a heap
/// of small objects has none), and each costs far more to allocate than the second lookup.
///
/// Lookups hash and compare the address bits only. A block above 2^47 is not stored and is
/// counted as dropped, never recorded wrongly.
type Packed = (Key, SharedValue<TracebackId>);
/// One shard of the map, as dashmap keeps it under its lock.
type Shard = dashmap_hashbrown::raw::RawTable<Packed>;
type Key = [u32; 2];

const ADDRESS_BITS: u32 = 47;
const ADDRESS_MASK: u64 = (1 << ADDRESS_BITS) - 1;
/// The size field's largest value, meaning "see [`BigSizes`]".
const SIZE_ELSEWHERE: u64 = (1 << (64 - ADDRESS_BITS)) - 1;

/// hashbrown's bucket count for a table of `capacity`: a power of two, filled to 7/8 at most
/// (to all but one bucket below 8).
pub(crate) fn buckets_for_capacity(capacity: usize) -> usize {
    match capacity {
        0 => 0,
        1..=7 => (capacity + 1).next_power_of_two(),
        _ => (capacity / 7 * 8).next_power_of_two(),
    }
}

/// The entry of a block, `None` if its address does not fit.
#[inline(always)]
fn pack(address: usize, trace: Trace) -> Option<Packed> {
    let address = address as u64;
    if address > ADDRESS_MASK {
        return None;
    }
    let bits = address | (trace.size as u64).min(SIZE_ELSEWHERE) << ADDRESS_BITS;
    Some((
        [bits as u32, (bits >> 32) as u32],
        SharedValue::new(trace.traceback),
    ))
}

#[inline(always)]
fn key_bits(key: &Key) -> u64 {
    u64::from(key[1]) << 32 | u64::from(key[0])
}

#[inline(always)]
fn address_of(key: &Key) -> u64 {
    key_bits(key) & ADDRESS_MASK
}

/// The entry's size, if it is kept in the entry (else it is in [`BigSizes`]).
#[inline(always)]
fn inline_size(key: &Key) -> Option<usize> {
    let field = key_bits(key) >> ADDRESS_BITS;
    (field != SIZE_ELSEWHERE).then_some(field as usize)
}

/// Sizes that do not fit an entry, by address: one map per shard, only ever touched while
/// that shard's lock is held (read to read, write to change), so it needs no lock of its own
/// and the fork handlers' locking covers it.
struct BigSizes(UnsafeCell<HashMap<u64, usize, BuildAddressHasher>>);

// SAFETY: every access goes through `TraceTable::big`/`big_mut`, whose callers hold the
// matching shard's lock, which serialises writers against everyone else.
unsafe impl Sync for BigSizes {}

/// Number of shards: fixed rather than dashmap's (four per core), so that the tracer's
/// memory for a given heap is the same on every machine, and enough for the staggering
/// below to average out.
const SHARDS: usize = 64;
/// Resolution of the shard choice (see [`TraceTable::locate`]).
const SHARD_CHOICE_BITS: u32 = 10;

/// Which shard each value of a hash's choice bits goes to: shard `i` gets a share of the
/// blocks proportional to 2^(i/SHARDS). hashbrown doubles a table when it is 7/8 full, so a
/// shard's load cycles between 7/16 and 7/8 as blocks are added; with equal shards they all
/// double at once, and right after that every entry costs twice its size (1M blocks was
/// 35.7 bytes each with 16-byte entries). Shares spread over one doubling keep shards at
/// every phase of that cycle at any heap size, so the table as a whole stays near the
/// average load (~0.63): 20-23 bytes per block at any count (see docs/tracer-memory.md).
fn shard_choices() -> [u8; 1 << SHARD_CHOICE_BITS] {
    let weights: Vec<f64> = (0..SHARDS)
        .map(|i| (i as f64 / SHARDS as f64).exp2())
        .collect();
    let total: f64 = weights.iter().sum();
    let slots = 1usize << SHARD_CHOICE_BITS;
    let mut choices = Vec::with_capacity(slots);
    let mut cumulative = 0.0;
    for (shard, weight) in weights.iter().enumerate() {
        cumulative += weight / total;
        let end = if shard + 1 == SHARDS {
            slots
        } else {
            (cumulative * slots as f64).round() as usize
        };
        choices.resize(end.max(choices.len()), shard as u8);
    }
    choices
        .try_into()
        .expect("one choice per value of the choice bits")
}

/// Where a shard's buckets are, for [`TraceTable::prefetch`], which reads it without the
/// shard's lock: the shard's `data_end` (its control bytes start there, its entries end there)
/// and bucket mask, written under the lock whenever they may have changed. A value that is
/// stale by the time it is used (the shard grew meanwhile) costs one useless prefetch: a
/// prefetch never faults, whatever the address.
#[derive(Default)]
struct Whereabouts {
    data_end: AtomicUsize,
    mask: AtomicUsize,
}

/// A shard of this many buckets (26 KiB) makes the table large (see [`TraceTable::is_large`]):
/// with 64 shards of staggered sizes, a table of some 2 MiB and 100,000 entries, which no
/// longer fits the second-level cache beside the program's own objects.
const LARGE_SHARD_BUCKETS: usize = 2048;

/// Asks the CPU to start loading the cache line at `at`.
#[inline(always)]
fn prefetch_line(at: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is only a hint; it reads nothing and never faults, whatever the
    // address.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(at as *const i8);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}

/// Presence filter slots: 2^16 one-byte counters, 64 KiB, allocated the first time sampling is
/// on. At the default interval a large heap holds a few thousand samples, so most slots are
/// zero.
const PRESENCE_BITS: u32 = 16;

/// The 16-byte slots of one 4 KiB page share 256 consecutive counters (four cache lines), and
/// pages are scattered over the 256 such runs. A program frees neighbours one after another
/// (pymalloc carves a pool into equal blocks, and a dying container frees its items), so with
/// every address scattered, most unsampled frees missed the first-level cache on their one
/// load: in `benches/loops.py points 300000` at the default interval, 1.43M of the 2.08M data
/// cache misses sampling added (cachegrind, 3.11).
#[inline(always)]
fn presence_slot(address: usize) -> usize {
    neighbourly_index(address, 8, PRESENCE_BITS - 8)
}

/// An index below `2^(within_bits + group_bits)` for a 16-byte aligned block that keeps
/// neighbours together: the `2^within_bits` blocks of one run of addresses get consecutive
/// indices in address order, and runs are scattered over the `2^group_bits` groups by a
/// Fibonacci hash. For per-block side arrays read on the hot path (the presence filter, the
/// young blocks' slots): a program allocates and frees neighbours one after another, so they
/// share cache lines.
#[inline(always)]
pub(crate) fn neighbourly_index(address: usize, within_bits: u32, group_bits: u32) -> usize {
    let address = address as u64;
    let group =
        (address >> (4 + within_bits)).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - group_bits);
    ((group << within_bits) | ((address >> 4) & ((1 << within_bits) - 1))) as usize
}

/// A shard is shrunk when fewer than 1/`SHRINK_BELOW` of its capacity is in use, to twice its
/// entries: after a spike of short-lived blocks the table gives its memory back as the blocks
/// are freed (2M entries are ~70 MB of buckets), not only at `clear_traces()`. The rebuild
/// costs one pass over the shard, paid for by the 7/8 of its capacity freed before it, so the
/// free path stays one comparison more on average, and the factor between the shrink
/// threshold and the new size keeps a table hovering at one size from rebuilding over again.
const SHRINK_BELOW: usize = 8;
/// Shards this small (1024 buckets, 13 KB; 850 KB over all shards) are left alone.
const SHRINK_MIN: usize = 1024;
/// Big sizes' maps this small (~1 KB) are left alone.
const BIG_SHRINK_MIN: usize = 56;

/// Where [`TraceTable::rehome`] left a block.
pub enum Rehomed {
    /// Under this traceback (the new one, or the old one without memory for the new one's
    /// counter).
    Stays(TracebackId),
    /// Out of the totals: the trace-time filters rejected its new stack.
    Leaves,
}

pub struct TraceTable {
    map: DashMap<Key, TracebackId, BuildAddressHasher>,
    /// Per shard, the sizes its entries cannot hold.
    big: Box<[BigSizes; SHARDS]>,
    /// Per shard, where its buckets are (see [`TraceTable::prefetch`]).
    whereabouts: [Whereabouts; SHARDS],
    /// Shards of [`LARGE_SHARD_BUCKETS`] or more (see [`TraceTable::is_large`]).
    large_shards: AtomicUsize,
    /// See [`shard_choices`]; in place, being read on every hook.
    shard_of: [u8; 1 << SHARD_CHOICE_BITS],
    current: Tally,
    peak: Peak,
    /// Per domain and traceback, bytes and blocks now and at the peak (see [`crate::hooks::peak`]).
    counters: PeakCounters,
    /// The counters' space of native blocks (odd keys, see [`TraceTable::space`]).
    native: Space,
    /// The sampling interval (0: exact), for the estimated totals.
    interval: AtomicU64,
    /// Whether each new block is also counted as allocated under its traceback (while a
    /// pusher sends `alloc_*` figures, see [`TraceTable::set_counting_allocations`]).
    counting: AtomicBool,
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
            map: DashMap::with_hasher_and_shard_amount(BuildAddressHasher, SHARDS),
            big: Box::new(std::array::from_fn(|_| {
                BigSizes(UnsafeCell::new(HashMap::with_hasher(BuildAddressHasher)))
            })),
            whereabouts: std::array::from_fn(|_| Whereabouts::default()),
            large_shards: AtomicUsize::new(0),
            shard_of: shard_choices(),
            current: Tally::new(),
            peak: Peak::new(),
            counters,
            native,
            interval: AtomicU64::new(0),
            counting: AtomicBool::new(false),
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
    /// their address with the low bit set (`crate::hooks::tracer::native_key`), which no block of
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
    fn weigh(&self, size: usize) -> (usize, u64) {
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
    fn account(
        &self,
        space: Space,
        trace: Trace,
        entering: Option<&Counter>,
        allocated: bool,
        by: Writer,
    ) {
        let (bytes, blocks) = self.weigh(trace.size);
        let bytes = bytes as u64;
        if let Some(counter) = entering {
            self.counters.enter(counter, bytes, blocks, by);
            if allocated && self.counting.load(Relaxed) {
                self.counters.allocated(counter, bytes, blocks, by);
            }
            let now = self.current.add_and_get(bytes, by);
            if self.peak.raise(now, by) {
                self.counters.new_peak(by);
                crate::hooks::memory_limit::note_peak(now as usize);
            }
        } else {
            self.counters
                .leave(space, trace.traceback, bytes, blocks, by);
            self.current.sub(bytes, by);
        }
    }

    /// A live block moves from `trace`'s traceback to the one whose counter is `to` (see
    /// [`TraceTable::retrace`]), with the shard lock held: the totals do not change, so neither
    /// can the peak, and only the two counters are charged. Objects reused from free lists
    /// come here once per object created, so the two atomic operations on the total saved
    /// are worth a second entry point.
    #[inline(always)]
    fn account_move(&self, space: Space, trace: Trace, to: &Counter, allocation: bool, by: Writer) {
        let (bytes, blocks) = self.weigh(trace.size);
        self.counters
            .leave(space, trace.traceback, bytes as u64, blocks, by);
        self.counters.enter(to, bytes as u64, blocks, by);
        if allocation && self.counting.load(Relaxed) {
            self.counters.move_allocated(
                space,
                trace.traceback,
                Some(to),
                bytes as u64,
                blocks,
                by,
            );
        }
    }

    /// A block's `(estimated bytes, estimated blocks in count units)`, as counted.
    pub fn weighed(&self, size: usize) -> (u64, u64) {
        let (bytes, blocks) = self.weigh(size);
        (bytes as u64, blocks)
    }

    /// Allocations counted under `from`, the placeholder traceback, of a freed block (see
    /// [`crate::hooks::released`]) go to `to`, or to no traceback (the filters reject its stack).
    pub fn move_allocated(
        &self,
        native: bool,
        from: TracebackId,
        (bytes, blocks): (u64, u64),
        to: Option<TracebackId>,
    ) {
        let space = if native { self.native } else { Space::DEFAULT };
        // Without memory for the new counter, they stay the placeholder's.
        let to = match to {
            Some(id) => match self.counters.counter(space, id) {
                Some(counter) => Some(counter),
                None => return,
            },
            None => None,
        };
        self.counters
            .move_allocated(space, from, to, bytes, blocks, Writer::ANY);
    }

    /// Starts or stops counting allocations per traceback (see [`crate::hooks::peak::Counter`]);
    /// stopping forgets what was counted. Called with the main interpreter's GIL held.
    pub fn set_counting_allocations(&self, on: bool) {
        self.counting.store(on, Relaxed);
        if !on {
            self.counters.forget_allocated();
        }
    }

    pub fn is_counting_allocations(&self) -> bool {
        self.counting.load(Relaxed)
    }

    /// What was allocated since the last call, per domain and traceback below `tracebacks`:
    /// `(domain, traceback, estimated bytes, estimated blocks in count units)`.
    pub fn take_allocated(&self, tracebacks: usize) -> Vec<(u32, TracebackId, u64, u64)> {
        self.counters.take_allocated(tracebacks)
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
    pub fn insert(&self, address: usize, trace: Trace, by: Writer) -> bool {
        // Its counter must exist before the trace enters (the only step that may allocate
        // besides the map's and the big sizes' own growth).
        let Some(counter) = self.counters.counter(self.space(address), trace.traceback) else {
            return false;
        };
        self.put(address, trace, Some(counter), true, by)
    }

    /// [`TraceTable::insert`] for a trace that was taken out and is put back (a reallocation
    /// that failed, what is left of a mapping partly unmapped, a block moved while recording
    /// is disabled): the same totals, but not counted as allocated again (the pusher's
    /// `alloc_*` figures).
    #[must_use = "a `false` insert is a dropped trace, to be counted"]
    pub fn restore(&self, address: usize, trace: Trace, by: Writer) -> bool {
        let Some(counter) = self.counters.counter(self.space(address), trace.traceback) else {
            return false;
        };
        self.put(address, trace, Some(counter), false, by)
    }

    /// Files a trace that [`TraceTable::charge`] already counted in the totals (a block that
    /// waited in [`crate::hooks::young`]). Returns `false`, leaving the map unchanged, when the map
    /// cannot get memory to grow: the caller then takes the charge back.
    #[must_use = "a `false` file is a dropped trace, whose charge is to be taken back"]
    pub fn file_charged(&self, address: usize, trace: Trace, by: Writer) -> bool {
        self.put(address, trace, None, false, by)
    }

    /// [`TraceTable::insert`]'s work once the counter is had: `entering` is `None` for a trace
    /// already charged. A replaced entry's charge leaves either way.
    #[inline(always)]
    fn put(
        &self,
        address: usize,
        trace: Trace,
        entering: Option<&Counter>,
        allocated: bool,
        by: Writer,
    ) -> bool {
        let Some(entry) = pack(address, trace) else {
            return false;
        };
        let space = self.space(address);
        let (index, hash) = self.locate(address as u64);
        let mut shard = write(&self.map.shards()[index]);
        // SAFETY (of every use of the big sizes below): the shard's write lock is held until
        // the end.
        let is_big = inline_size(&entry.0).is_none();
        if is_big && unsafe { self.big_mut(index) }.try_reserve(1).is_err() {
            return false;
        }
        let address = address as u64;
        let rehash = |e: &Packed| self.locate(address_of(&e.0)).1;
        let eq = |e: &Packed| address_of(&e.0) == address;
        // Room first, so that one probe finds the entry or the free bucket for it (blocks
        // of a granule are neighbours, see `AddressHasher`: probing twice cost a run of them
        // twice). Without room, an entry already there can still be replaced.
        let found = if shard.try_reserve(1, rehash).is_ok() {
            // Growth was reserved just above: `find_or_find_insert_slot`'s own reserve is a
            // no-op and cannot abort.
            shard.find_or_find_insert_slot(hash, eq, rehash)
        } else {
            match shard.find(hash, eq) {
                Some(bucket) => Ok(bucket),
                None => return false,
            }
        };
        // The reserve above may have moved the buckets.
        self.note_whereabouts(index, &shard);
        let slot = match found {
            Ok(bucket) => {
                // SAFETY: the bucket was just found in this shard, whose write lock is held.
                let slot = unsafe { bucket.as_mut() };
                let old = unsafe { self.trace_of(index, slot, true) };
                *slot = entry;
                if is_big {
                    // Room reserved above: does not allocate.
                    unsafe { self.big_mut(index) }.insert(address, trace.size);
                }
                self.account(space, old, None, false, by);
                if entering.is_some() {
                    self.account(space, trace, entering, allocated, by);
                }
                return true;
            }
            Err(slot) => slot,
        };
        // SAFETY: the slot was found for this hash under the same lock, with room reserved.
        unsafe { shard.insert_in_slot(hash, slot, entry) };
        if is_big {
            unsafe { self.big_mut(index) }.insert(address, trace.size);
        }
        self.presence_add(address as usize);
        if entering.is_some() {
            self.account(space, trace, entering, allocated, by);
        }
        true
    }

    /// Counts a trace in the totals and its traceback's counter without filing it in the map
    /// (see [`crate::hooks::young`]); `false`, changing nothing, without memory for the counter.
    #[inline(always)]
    pub fn charge(&self, address: usize, trace: Trace, by: Writer) -> bool {
        let space = self.space(address);
        match self.counters.counter(space, trace.traceback) {
            Some(counter) => {
                self.account(space, trace, Some(counter), true, by);
                true
            }
            None => false,
        }
    }

    /// Takes back what [`TraceTable::charge`] counted, for a block that leaves without having
    /// been filed.
    #[inline(always)]
    pub fn discharge(&self, address: usize, trace: Trace, by: Writer) {
        self.account(self.space(address), trace, None, false, by);
    }

    /// The trace of an entry of shard `index`. A large block's size is read from the shard's
    /// big sizes, and taken out of them if the entry is `leaving` the table (it must not be
    /// for an entry that stays).
    ///
    /// # Safety
    /// The caller holds that shard's lock: the write lock if `leaving`.
    #[inline(always)]
    unsafe fn trace_of(&self, index: usize, entry: &Packed, leaving: bool) -> Trace {
        let size = match inline_size(&entry.0) {
            Some(size) => Some(size),
            None if leaving => self.big_mut(index).remove(&address_of(&entry.0)),
            None => self.big(index).get(&address_of(&entry.0)).copied(),
        }
        .unwrap_or(0);
        Trace {
            size,
            traceback: *entry.1.get(),
        }
    }

    /// The big sizes of shard `index`, to read.
    ///
    /// # Safety
    /// The caller holds that shard's read or write lock for as long as it uses the result.
    #[inline(always)]
    unsafe fn big(&self, index: usize) -> &HashMap<u64, usize, BuildAddressHasher> {
        &*self.big[index & (SHARDS - 1)].0.get()
    }

    /// The big sizes of shard `index`, to change.
    ///
    /// # Safety
    /// The caller holds that shard's write lock for as long as it uses the result.
    #[allow(clippy::mut_from_ref)]
    #[inline(always)]
    unsafe fn big_mut(&self, index: usize) -> &mut HashMap<u64, usize, BuildAddressHasher> {
        &mut *self.big[index & (SHARDS - 1)].0.get()
    }

    /// Forgets a block, returning what was recorded for it. Never allocates (dashmap's
    /// `entry()` would reserve room for an insert first, and abort if that failed). Inlined
    /// into its few callers, the free hook first: one call and one set of saved registers
    /// less on every free.
    #[inline(always)]
    pub fn remove(&self, address: usize, by: Writer) -> Option<Trace> {
        let (index, hash) = self.locate(address as u64);
        let mut shard = write(&self.map.shards()[index]);
        let bucket = shard.find(hash, |e| address_of(&e.0) == address as u64)?;
        // SAFETY: the bucket was just found in this shard, whose write lock is held (until
        // the end, for the big sizes too).
        let (entry, _) = unsafe { shard.remove(bucket) };
        let trace = unsafe { self.trace_of(index, &entry, true) };
        if inline_size(&entry.0).is_none() {
            let big = unsafe { self.big_mut(index) };
            if big.len() < big.capacity() / SHRINK_BELOW && big.capacity() > BIG_SHRINK_MIN {
                shrink_big(big);
            }
        }
        self.presence_remove(address);
        self.account(self.space(address), trace, None, false, by);
        if shard.len() < shard.capacity() / SHRINK_BELOW && shard.capacity() > SHRINK_MIN {
            self.shrink_shard(index, &mut shard);
        }
        Some(trace)
    }

    /// Rebuilds a shard that [`TraceTable::remove`] left mostly empty at twice its entries,
    /// or leaves it as it is if the smaller table cannot be had: a free hook must not fail,
    /// nor abort for memory (hashbrown's own `shrink_to` aborts on a failed allocation).
    /// Entries are copied as they are. Out of line and cold, so that `remove`, run on every
    /// free, keeps its code small (the saved registers are the same).
    #[cold]
    #[inline(never)]
    fn shrink_shard(&self, index: usize, shard: &mut Shard) {
        let rehash = |e: &Packed| self.locate(address_of(&e.0)).1;
        let old = std::mem::take(shard);
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
        self.note_whereabouts(index, shard);
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
        by: Writer,
        traceback: impl FnOnce(Trace) -> Option<TracebackId>,
    ) -> bool {
        self.retrace_counted(address, by, false, traceback)
    }

    /// [`TraceTable::retrace`] for a block whose allocation was counted under its old
    /// traceback, a placeholder (see [`crate::hooks::released`]): the allocation moves with it.
    pub fn retrace_allocation(
        &self,
        address: usize,
        by: Writer,
        traceback: impl FnOnce(Trace) -> Option<TracebackId>,
    ) -> bool {
        self.retrace_counted(address, by, true, traceback)
    }

    #[inline(always)]
    fn retrace_counted(
        &self,
        address: usize,
        by: Writer,
        allocation: bool,
        traceback: impl FnOnce(Trace) -> Option<TracebackId>,
    ) -> bool {
        let (index, hash) = self.locate(address as u64);
        let mut shard = write(&self.map.shards()[index]);
        let Some(bucket) = shard.find(hash, |e| address_of(&e.0) == address as u64) else {
            return false;
        };
        // SAFETY: the bucket was just found in this shard, whose write lock is held (until
        // the end, for the big sizes too).
        let entry = unsafe { bucket.as_mut() };
        let old = unsafe { self.trace_of(index, entry, false) };
        match self.rehome_counted(address, old, traceback(old), allocation, by) {
            // Same address and size: only the id changes.
            Rehomed::Stays(id) => *entry.1.get_mut() = id,
            Rehomed::Leaves => {
                // SAFETY: as above; the bucket is not used after its removal.
                let (entry, _) = unsafe { shard.remove(bucket) };
                unsafe { self.trace_of(index, &entry, true) };
                self.presence_remove(address);
            }
        }
        true
    }

    /// Moves a live block's charge from `old`'s traceback to `new`, or out of the totals if
    /// `new` is `None`, and says where the block now belongs; the caller (the table's
    /// [`TraceTable::retrace`], or a slot of [`crate::hooks::young`]) stores that. Without memory
    /// for the new traceback's counter, the block keeps its traceback.
    #[inline(always)]
    pub fn rehome(
        &self,
        address: usize,
        old: Trace,
        new: Option<TracebackId>,
        by: Writer,
    ) -> Rehomed {
        self.rehome_counted(address, old, new, false, by)
    }

    /// [`TraceTable::rehome`]; with `allocation`, the block's counted allocation moves too.
    #[inline(always)]
    fn rehome_counted(
        &self,
        address: usize,
        old: Trace,
        new: Option<TracebackId>,
        allocation: bool,
        by: Writer,
    ) -> Rehomed {
        let space = self.space(address);
        match new {
            Some(id) if id == old.traceback => Rehomed::Stays(id),
            Some(id) => match self.counters.counter(space, id) {
                Some(counter) => {
                    self.account_move(space, old, counter, allocation, by);
                    Rehomed::Stays(id)
                }
                None => Rehomed::Stays(old.traceback),
            },
            None => {
                if allocation && self.counting.load(Relaxed) {
                    let (bytes, blocks) = self.weigh(old.size);
                    self.counters.move_allocated(
                        space,
                        old.traceback,
                        None,
                        bytes as u64,
                        blocks,
                        by,
                    );
                }
                self.account(space, old, None, false, by);
                Rehomed::Leaves
            }
        }
    }

    /// Charges the totals for a block of `domain` kept outside the map (an extension's block
    /// in another domain, see `crate::tracked`): `removed` leaves them, `added` joins them.
    /// The one place where traces outside the map meet the table's accounting.
    ///
    /// Returns `false`, changing nothing, if the added trace's counter cannot be had (no
    /// memory, or [`crate::hooks::peak::MAX_DOMAINS`] other domains hold blocks): the caller leaves
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
            self.account(space, trace, None, false, Writer::ANY);
        }
        if let Some((trace, counter)) = counter {
            self.account(space, trace, Some(counter), true, Writer::ANY);
        }
        true
    }

    pub fn get(&self, address: usize) -> Option<Trace> {
        let (index, hash) = self.locate(address as u64);
        let shard = read(&self.map.shards()[index]);
        let bucket = shard.find(hash, |e| address_of(&e.0) == address as u64)?;
        // SAFETY: the bucket was just found in this shard, whose read lock is held (as long
        // as the big sizes are read too).
        let entry = unsafe { bucket.as_ref() };
        Some(unsafe { self.trace_of(index, entry, false) })
    }

    /// The shard of a block's address and the hash its shard files it under. The shard is
    /// picked from bits of the hash that hashbrown does not use at these table sizes (it
    /// takes buckets from the low bits and tags from the top seven), unevenly: see
    /// [`shard_choices`].
    #[inline(always)]
    fn locate(&self, address: u64) -> (usize, u64) {
        let hash = self.map.hash_usize(&address) as u64;
        let choice = (hash >> 40) as usize & ((1 << SHARD_CHOICE_BITS) - 1);
        (usize::from(self.shard_of[choice]), hash)
    }

    /// Starts bringing into the cache what a lookup of `address` will read first: its
    /// shard's control bytes and the entry where its probe starts. Called ahead of a lookup
    /// that other work (a stack walk) will precede, to overlap that work with the cache
    /// misses of a table of every live block: a lookup of a block not touched for a while
    /// waits on two loads from memory, the most of what filing a block or re-attributing a
    /// reused float costs on a large heap. Without the shard's lock: see [`Whereabouts`].
    #[inline(always)]
    pub fn prefetch(&self, address: usize) {
        let (index, hash) = self.locate(address as u64);
        let whereabouts = &self.whereabouts[index & (SHARDS - 1)];
        let data_end = whereabouts.data_end.load(Relaxed);
        let pos = hash as usize & whereabouts.mask.load(Relaxed);
        prefetch_line(data_end.wrapping_add(pos));
        prefetch_line(data_end.wrapping_sub((pos + 1) * std::mem::size_of::<Packed>()));
    }

    /// Whether the table is large enough that a lookup of a block not touched for a while is
    /// likely to miss the cache, and [`TraceTable::prefetch`] worth its dozen instructions
    /// (on a small table they are all cost: nbody ran 4.5% more instructions with them).
    /// One load: some shard has [`LARGE_SHARD_BUCKETS`] or more.
    #[inline(always)]
    pub fn is_large(&self) -> bool {
        self.large_shards.load(Relaxed) != 0
    }

    /// Publishes where shard `index`'s buckets are now, for [`TraceTable::prefetch`]; called
    /// with its write lock held after anything that may have moved them.
    #[inline(always)]
    fn note_whereabouts(&self, index: usize, shard: &Shard) {
        let whereabouts = &self.whereabouts[index & (SHARDS - 1)];
        let data_end = shard.data_end().as_ptr() as usize;
        let mask = shard.buckets() - 1;
        let old_mask = whereabouts.mask.load(Relaxed);
        if whereabouts.data_end.load(Relaxed) != data_end || old_mask != mask {
            whereabouts.data_end.store(data_end, Relaxed);
            whereabouts.mask.store(mask, Relaxed);
            let large = |mask: usize| mask >= LARGE_SHARD_BUCKETS - 1;
            match (large(old_mask), large(mask)) {
                (false, true) => self.large_shards.fetch_add(1, Relaxed),
                (true, false) => self.large_shards.fetch_sub(1, Relaxed),
                _ => 0,
            };
        }
    }

    /// `(current, peak)` in bytes.
    pub fn totals(&self) -> (usize, usize) {
        (self.current.get() as usize, self.peak.get() as usize)
    }

    /// Whether recording `size` more bytes may make a new peak (always when sampling, where a
    /// trace is charged its estimate). A hint: other threads may change the total meanwhile.
    #[inline(always)]
    pub fn may_reach_peak(&self, size: usize) -> bool {
        self.interval.load(Relaxed) != 0
            || self.current.get().saturating_add(size as u64) > self.peak.get()
    }

    pub fn reset_peak(&self) {
        self.peak.set(self.current.get());
        self.counters.new_peak(Writer::ANY);
    }

    /// Per domain and traceback below `tracebacks` that held anything at the peak:
    /// `(domain, traceback, bytes, blocks in count units)` then, domain 0's first. Bytes and
    /// blocks are estimates when sampling (charged as the totals are).
    /// Whether no live block, in any domain, and nothing at the peak has traceback `id` (see
    /// [`PeakCounters::idle`]).
    pub fn traceback_idle(&self, id: TracebackId) -> bool {
        self.counters.idle(id)
    }

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
        for (index, shard) in self.map.shards().iter().enumerate() {
            let shard = read(shard);
            out.try_reserve(shard.len()).ok()?;
            // SAFETY: the shard's read lock is held for the whole iteration.
            unsafe {
                for bucket in shard.iter() {
                    let entry = bucket.as_ref();
                    out.push((
                        address_of(&entry.0) as usize,
                        self.trace_of(index, entry, false),
                    ));
                }
            }
        }
        Some(out)
    }

    /// Empties the table and zeroes both totals, atomically with respect to hooks.
    pub fn clear(&self) {
        let mut guards: Vec<_> = self.map.shards().iter().map(|shard| write(shard)).collect();
        for (index, guard) in guards.iter_mut().enumerate() {
            guard.clear();
            // SAFETY: every shard's write lock is held.
            unsafe { *self.big_mut(index) = HashMap::with_hasher(BuildAddressHasher) };
        }
        self.current.set(0);
        self.peak.set(0);
        self.counters.clear(self.native);
        if let Some(storage) = self.presence_storage.get() {
            for counter in storage.iter() {
                counter.store(0, Relaxed);
            }
        }
        // Release the memory of a large table: a cleared tracer should cost nothing (each
        // shard is empty: nothing to rehash).
        for (index, guard) in guards.iter_mut().enumerate() {
            guard.shrink_to(0, |e: &Packed| self.locate(address_of(&e.0)).1);
            self.note_whereabouts(index, guard);
        }
    }

    /// Bytes the table itself holds: every bucket of every shard (12-byte entry + 1 control
    /// byte, empty or not), the big sizes' buckets, the shard array and the presence filter.
    pub fn memory_usage(&self) -> usize {
        let mut bytes = 0;
        for (index, shard) in self.map.shards().iter().enumerate() {
            let shard = read(shard);
            // SAFETY: the shard's read lock is held.
            let big = unsafe { self.big(index) };
            bytes += buckets_for_capacity(shard.capacity()) * (std::mem::size_of::<Packed>() + 1)
                + buckets_for_capacity(big.capacity()) * (std::mem::size_of::<(u64, usize)>() + 1);
        }
        let presence = match self.presence.load(Relaxed).is_null() {
            true => 0,
            false => (1 << PRESENCE_BITS) * std::mem::size_of::<AtomicU8>(),
        };
        bytes
            + std::mem::size_of_val(self.map.shards())
            + std::mem::size_of_val(&*self.big)
            + std::mem::size_of_val(&self.whereabouts)
            + self.shard_of.len()
            + presence
            + self.counters.memory_usage()
    }

    /// Takes every shard's write lock and keeps it: called just before `fork()` so that the
    /// child never inherits a lock held by a thread that does not exist there. Threads that
    /// want a shard meanwhile wait without parking (see [`crate::platform::nopark`]), so
    /// releasing the locks after `fork()` needs nothing from `parking_lot_core`.
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

    const W: Writer = Writer::ANY;

    fn t(size: usize, traceback: u32) -> Trace {
        Trace { size, traceback }
    }

    /// The presence filter's layout: a page's 16-byte blocks on consecutive counters, pages
    /// spread over every run of 256, and every address inside the filter.
    #[test]
    fn presence_slots_keep_a_page_together_and_spread_pages() {
        for page in [0x7f00_1234_5000_usize, 0x10_0000, 0x5555_5555_5000] {
            let first = presence_slot(page);
            assert_eq!(first % 256, 0, "a page starts a run");
            for block in 0..256 {
                assert_eq!(presence_slot(page + block * 16), first + block);
                // The alignment bits below 16 do not matter.
                assert_eq!(presence_slot(page + block * 16 + 8), first + block);
            }
        }
        let runs: std::collections::HashSet<usize> = (0..4096usize)
            .map(|i| presence_slot(0x7f00_0000_0000 + i * 4096) / 256)
            .collect();
        assert_eq!(runs.len(), 256, "4096 consecutive pages use every run");
        let top = (0..64).map(|b| presence_slot(usize::MAX - b * 4096)).max();
        assert!(top < Some(1 << PRESENCE_BITS));
    }

    /// After a spike the table gives its memory back as the blocks are freed, and the
    /// totals and the surviving entries are untouched by the rebuilds.
    #[test]
    fn a_spike_freed_gives_the_memory_back() {
        let table = TraceTable::new();
        let empty = table.memory_usage();
        let n = 400_000;
        for i in 0..n {
            assert!(table.insert(0x10_0000 + i * 16, t(i, 1), W));
        }
        let spiked = table.memory_usage();
        for i in 0..n - 100 {
            table.remove(0x10_0000 + i * 16, W);
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
                "insert" => assert!(table.insert(address, t(size, 1), W)),
                _ => {
                    table.remove(address, W);
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

    /// What each step leaves to take: `(domain, traceback, bytes, blocks)`, blocks in count
    /// units. Counting is off until asked for; frees, traces put back and in-use moves never
    /// change what was allocated; a placeholder's allocation moves with its block (or leaves with it); taking
    /// starts every count again from zero.
    #[test]
    fn allocations_are_counted_while_asked_and_taken_once() {
        use crate::analysis::sampling::COUNT_SCALE as U;
        let table = TraceTable::new();
        // (step, address, size, traceback, what `take_allocated` returns after it)
        type Step = (
            &'static str,
            usize,
            usize,
            u32,
            &'static [(u32, u32, u64, u64)],
        );
        let steps: &[Step] = &[
            ("insert", 0x1000, 100, 1, &[]), // not counting yet
            ("count", 0, 0, 0, &[]),
            ("insert", 0x2000, 50, 1, &[(0, 1, 50, U)]),
            ("insert", 0x3000, 30, 2, &[(0, 2, 30, U)]),
            ("insert", 0x3000, 20, 2, &[(0, 2, 20, U)]), // a replaced entry: a new block
            ("remove", 0x2000, 0, 0, &[]),
            // Taken out and put back (a failed realloc, the rest of an unmapping): in use again,
            // not allocated again.
            ("restore", 0x2000, 50, 1, &[]),
            ("retrace", 0x1000, 0, 5, &[]), // a reused object: in use moves, not allocation
            ("insert", 0x4000, 70, 0, &[(0, 0, 70, U)]),
            ("insert", 0x5000, 40, 0, &[]),
            ("placeholder", 0x5000, 0, 6, &[(0, 6, 40, U)]),
            ("insert", 0x6000, 10, 0, &[]),
            ("placeholder-rejected", 0x6000, 0, 0, &[]),
            ("insert", 0x7000, 8, 3, &[]),
            ("stop", 0, 0, 0, &[]), // forgets the 8 bytes
            ("insert", 0x8000, 9, 3, &[]),
        ];
        for &(op, address, size, traceback, expected) in steps {
            let mut take = true;
            match op {
                "insert" => {
                    assert!(table.insert(address, t(size, traceback), W));
                    take = !matches!(address, 0x5000 | 0x6000 | 0x7000);
                }
                "remove" => assert!(table.remove(address, W).is_some()),
                "restore" => {
                    assert!(table.restore(address, t(size, traceback), W));
                    assert_eq!(table.get(address), Some(t(size, traceback)));
                }
                "retrace" => assert!(table.retrace(address, W, |_| Some(traceback))),
                "placeholder" => {
                    assert!(table.retrace_allocation(address, W, |_| Some(traceback)))
                }
                "placeholder-rejected" => assert!(table.retrace_allocation(address, W, |_| None)),
                "count" => table.set_counting_allocations(true),
                "stop" => table.set_counting_allocations(false),
                _ => unreachable!(),
            }
            if take {
                assert_eq!(
                    table.take_allocated(16),
                    expected,
                    "after {op} {address:#x}"
                );
                assert!(table.take_allocated(16).is_empty(), "taken twice: {op}");
            }
        }
        assert!(!table.is_counting_allocations());
    }

    #[test]
    fn retrace_changes_traceback_only_or_forgets() {
        let table = TraceTable::new();
        assert!(table.insert(0x1000, t(100, 1), W));
        assert!(table.insert(0x2000, t(50, 2), W));
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
            let found = table.retrace(address, W, |old| {
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
                    // One thread stands for the main interpreter's GIL holder (serial
                    // updates of the totals), the others for threads without it.
                    let by = Writer::for_test(k == 0);
                    for i in 0..20_000usize {
                        let address = (k << 40) | (i << 4);
                        assert!(table.insert(address, t(i % 97 + 1, 0), by));
                        if i % 3 != 0 {
                            table.remove(address, by);
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
    fn entries_are_12_bytes_and_sizes_round_trip() {
        assert_eq!(std::mem::size_of::<Packed>(), 12);
        let big = SIZE_ELSEWHERE as usize;
        // (address, size, traceback, fits)
        let cases: &[(usize, usize, u32, bool)] = &[
            (0x7fff_ffff_fff0, 1, 0, true),
            (0x7fff_ffff_ffff, 0, 1000, true),
            (16, 0, 999, true),
            (0x5555_0000_0011, big - 1, 7, true),
            (0x5555_0000_0020, big, 7, true),
            (0x5555_0000_0030, big + 1, 7, true),
            (0x5555_0000_0040, 0xffff_ffff, 7, true),
            (0x5555_0000_0050, 5 << 40, 3, true),
            (0x5555_0000_0060, 1 << 50, 3, true),
            (1 << 47, 8, 3, false),
        ];
        assert!(pack(16, t(0, u32::MAX)).is_some());
        let table = TraceTable::new();
        for &(address, size, traceback, fits) in cases {
            let trace = t(size, traceback);
            assert_eq!(pack(address, trace).is_some(), fits, "{address:#x}");
            assert_eq!(table.insert(address, trace, W), fits, "{address:#x}");
            if fits {
                assert_eq!(table.get(address), Some(trace), "{address:#x} {size:#x}");
            }
        }
        let mut all = table.collect().unwrap();
        all.sort_by_key(|&(address, _)| address);
        let want: Vec<_> = {
            let mut want: Vec<_> = cases
                .iter()
                .filter(|case| case.3)
                .map(|&(address, size, traceback, _)| (address, t(size, traceback)))
                .collect();
            want.sort_by_key(|&(address, _)| address);
            want
        };
        assert_eq!(all, want);
    }

    #[test]
    fn big_sizes_follow_replacement_retrace_and_removal() {
        let table = TraceTable::new();
        let big = SIZE_ELSEWHERE as usize;
        let (a, b) = (0x1000, 0x2000);
        assert!(table.insert(a, t(big * 3, 1), W));
        assert!(table.insert(b, t(big * 5, 2), W));
        // Replaced by a small block, then by a big one again.
        assert!(table.insert(a, t(10, 1), W));
        assert_eq!(table.get(a), Some(t(10, 1)));
        assert!(table.insert(a, t(big * 7, 4), W));
        // Retraced: the size stays.
        assert!(table.retrace(b, W, |_| Some(9)));
        assert_eq!(table.get(b), Some(t(big * 5, 9)));
        assert_eq!(table.totals().0, big * 12);
        assert_eq!(table.remove(a, W), Some(t(big * 7, 4)));
        // Retraced away (a trace-time filter rejects the new stack).
        assert!(table.retrace(b, W, |_| None));
        assert_eq!(table.get(b), None);
        assert_eq!(table.totals().0, 0);
        for index in 0..SHARDS {
            assert!(unsafe { table.big(index) }.is_empty(), "shard {index}");
        }
        // Many big blocks, freed: their sizes' map is given back.
        for i in 0..10_000 {
            assert!(table.insert(0x10_0000 + i * 16, t(big + i, 1), W));
        }
        for i in 0..10_000 {
            assert_eq!(table.remove(0x10_0000 + i * 16, W), Some(t(big + i, 1)));
        }
        for index in 0..SHARDS {
            let capacity = unsafe { table.big(index) }.capacity();
            assert!(capacity <= BIG_SHRINK_MIN, "shard {index}: {capacity}");
        }
    }

    #[test]
    fn shard_choices_spread_one_doubling_over_the_shards() {
        let choices = shard_choices();
        assert_eq!(choices.len(), 1 << SHARD_CHOICE_BITS);
        let mut counts = [0usize; SHARDS];
        for &shard in choices.iter() {
            counts[usize::from(shard)] += 1;
        }
        assert!(choices.windows(2).all(|w| w[0] <= w[1]));
        assert!(counts.iter().all(|&n| n > 0), "{counts:?}");
        // The last shard gets about twice the first's share.
        let ratio = counts[SHARDS - 1] as f64 / counts[0] as f64;
        assert!((1.6..2.5).contains(&ratio), "{counts:?}");
    }

    #[test]
    fn memory_per_block_stays_near_the_average_load() {
        // 12-byte entries plus a control byte at hashbrown's load (7/16 to 7/8): without the
        // staggered shards, 29.7 bytes per block just after the shards double.
        let table = TraceTable::new();
        let mut worst: f64 = 0.0;
        let mut address = 0x7f00_0000_0000usize;
        for count in 1..=1_200_000usize {
            assert!(table.insert(address, t(32, 1), W));
            address += 16;
            if count >= 100_000 && count % 25_000 == 0 {
                let per_block = table.memory_usage() as f64 / count as f64;
                worst = worst.max(per_block);
            }
        }
        assert!(worst < 24.0, "{worst:.1} bytes per block");
    }

    #[test]
    fn lock_all_then_unlock_all_leaves_table_usable() {
        let table = TraceTable::new();
        assert!(table.insert(16, t(1, 0), W));
        table.lock_all();
        unsafe { table.unlock_all() };
        assert!(table.insert(32, t(2, 0), W));
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
        assert!(table.insert(0x1000, t(100, 1), W));
        assert!(table.may_contain(0x1000));
        assert!(table.insert(0x2000, t(5000, 1), W));
        assert_eq!(table.totals().0, estimate(100) + estimate(5000));
        // Replacing an entry keeps one presence count for the address.
        assert!(table.insert(0x1000, t(10, 1), W));
        assert_eq!(table.totals().0, estimate(10) + estimate(5000));
        assert_eq!(table.remove(0x1000, W), Some(t(10, 1)));
        assert!(
            !table.may_contain(0x1000),
            "count back to zero after one remove"
        );
        // Many addresses: none that was removed is still reported present unless it
        // shares a slot with a live one.
        let live: Vec<usize> = (1..2000).map(|i| 0x10_0000 + i * 4096).collect();
        for &a in &live {
            assert!(table.insert(a, t(64, 2), W));
        }
        for &a in &live[..1000] {
            table.remove(a, W);
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
        assert!(table.insert(0x1000, t(100, 1), W));
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
                            assert!(table.insert(address, trace, W));
                            live.insert(address, trace);
                        }
                        (45..=79, Some(address)) => {
                            assert_eq!(table.remove(address, W), live.remove(&address));
                        }
                        (80..=91, Some(address)) => {
                            // realloc: the old trace out, the new block in.
                            assert_eq!(table.remove(address, W), live.remove(&address));
                            let new = 16 * (1 + rand(1 << 20) as usize) + rand(2) as usize;
                            check(&table, &live, &mut peak_total, &mut at_peak, &sums);
                            assert!(table.insert(new, t(size, tb), W));
                            live.insert(new, t(size, tb));
                        }
                        (92..=96, Some(address)) => {
                            // A block replaced behind our back.
                            assert!(table.insert(address, t(size, tb), W));
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
        assert!(table.insert(0x1000, t(100, 1), W));
        assert!(table.account_outside(389_047, None, Some(t(5000, 1))));
        assert!(table.insert(crate::hooks::tracer::native_key(0x2000), t(70, 2), W));
        let peak = table.at_peak(10);
        table.remove(0x1000, W);
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
        for domain in 1..=crate::hooks::peak::MAX_DOMAINS as u32 {
            if !table.account_outside(domain, None, Some(t(1, 3))) {
                refused += 1;
            }
        }
        assert_eq!(refused, taken);
        assert_eq!(
            table.totals().0,
            70 + crate::hooks::peak::MAX_DOMAINS - taken
        );
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
        assert!(table.insert(crate::hooks::tracer::native_key(0x2000), t(70, 2), W));
        assert_eq!(
            table.at_peak(10)[0].0,
            crate::native::DOMAIN,
            "native's kept"
        );
    }

    /// Neighbours stay together: the 16 blocks of a 256-byte granule land in one run of 32
    /// buckets, in order, in one shard, with 16 different tags. Granules spread: 4096
    /// consecutive ones take most of 65536 runs, and their shard choices most of the 1024.
    #[test]
    fn address_hash_keeps_granules_together_and_spreads_them() {
        let build = BuildAddressHasher;
        let mut runs = std::collections::HashSet::new();
        let mut choices = std::collections::HashSet::new();
        for granule in 0..4096usize {
            let base = 0x7f12_3400_0000 + granule * 256;
            let first = build.hash_one(base);
            let mut tags = std::collections::HashSet::new();
            for slot in 0..16u64 {
                let hash = build.hash_one(base + slot as usize * 16);
                assert_eq!(hash & 31, slot * 2, "{granule} {slot}");
                assert_eq!(hash >> 5 & 0xffff, first >> 5 & 0xffff, "{granule} {slot}");
                assert_eq!(hash >> 40 & 1023, first >> 40 & 1023, "{granule} {slot}");
                tags.insert(hash >> 57);
            }
            assert_eq!(tags.len(), 16, "granule {granule}");
            runs.insert(first >> 5 & 0xffff);
            choices.insert(first >> 40 & 1023);
        }
        assert!(runs.len() > 3900, "runs collide: {} distinct", runs.len());
        assert!(
            choices.len() > 1000,
            "shard choices collide: {}",
            choices.len()
        );
    }
}
