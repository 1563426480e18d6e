//! The live-trace table: one entry per traced block, keyed by address, and the current and
//! peak totals.
//!
//! Hooks run on every allocating thread, and RAW-domain ones may run without the GIL, so the
//! table is a lock-sharded map (dashmap): a hook takes exactly one shard lock. The totals are
//! updated while that shard lock is held, and [`TraceTable::clear`] holds every shard lock while
//! it empties the map and zeroes the totals; together that keeps "current == sum of the live
//! traces' sizes" exact whenever no hook is half-way through.
//!
//! The table is created once and never freed (it lives in a `static`): `stop()` may race with a
//! hook still running on another thread, and that hook must find valid memory.

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use dashmap::mapref::entry::Entry as MapEntry;
use dashmap::DashMap;

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

pub struct TraceTable {
    map: DashMap<usize, Trace, BuildAddressHasher>,
    current: AtomicUsize,
    peak: AtomicUsize,
}

impl Default for TraceTable {
    fn default() -> Self {
        Self::new()
    }
}

impl TraceTable {
    pub fn new() -> Self {
        Self {
            map: DashMap::with_hasher(BuildAddressHasher),
            current: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
        }
    }

    /// Records a new block. An entry already at that address (a block freed behind our back,
    /// e.g. by an allocator installed over ours) is replaced, keeping the totals exact.
    #[inline]
    pub fn insert(&self, address: usize, trace: Trace) {
        match self.map.entry(address) {
            MapEntry::Occupied(mut occupied) => {
                let old = occupied.insert(trace);
                self.sub(old.size);
                self.add(trace.size);
            }
            MapEntry::Vacant(vacant) => {
                let _held = vacant.insert(trace);
                self.add(trace.size);
            }
        }
    }

    /// Forgets a block, returning what was recorded for it.
    #[inline]
    pub fn remove(&self, address: usize) -> Option<Trace> {
        match self.map.entry(address) {
            MapEntry::Occupied(occupied) => {
                self.sub(occupied.get().size);
                Some(occupied.remove())
            }
            MapEntry::Vacant(_) => None,
        }
    }

    pub fn get(&self, address: usize) -> Option<Trace> {
        self.map.get(&address).map(|entry| *entry)
    }

    /// `(current, peak)` in bytes.
    pub fn totals(&self) -> (usize, usize) {
        (self.current.load(Relaxed), self.peak.load(Relaxed))
    }

    pub fn reset_peak(&self) {
        self.peak.store(self.current.load(Relaxed), Relaxed);
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Copies every live trace out, shard by shard. Never calls back into Python, so it is
    /// safe to run while hooks on other threads insert and remove.
    pub fn collect(&self) -> Vec<(usize, Trace)> {
        let mut out = Vec::with_capacity(self.map.len() + 64);
        for shard in self.map.shards() {
            let shard = shard.read();
            // SAFETY: the shard's read lock is held for the whole iteration.
            unsafe {
                for bucket in shard.iter() {
                    let (address, value) = bucket.as_ref();
                    out.push((*address, *value.get()));
                }
            }
        }
        out
    }

    /// Empties the table and zeroes both totals, atomically with respect to hooks.
    pub fn clear(&self) {
        let mut guards: Vec<_> = self.map.shards().iter().map(|s| s.write()).collect();
        for guard in guards.iter_mut() {
            guard.clear();
        }
        self.current.store(0, Relaxed);
        self.peak.store(0, Relaxed);
        drop(guards);
        // Release the memory of a large table: a cleared tracer should cost nothing.
        self.map.shrink_to_fit();
    }

    /// Bytes the table itself holds (buckets of every shard, plus the shard array).
    pub fn memory_usage(&self) -> usize {
        let bucket = std::mem::size_of::<(usize, dashmap::SharedValue<Trace>)>() + 1;
        self.map.capacity() * bucket + std::mem::size_of_val(self.map.shards())
    }

    /// Takes every shard's write lock and keeps it: called just before `fork()` so that the
    /// child never inherits a lock held by a thread that does not exist there.
    pub fn lock_all(&self) {
        for shard in self.map.shards() {
            std::mem::forget(shard.write());
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

    #[inline]
    fn add(&self, size: usize) {
        let now = self.current.fetch_add(size, Relaxed).wrapping_add(size);
        if now > self.peak.load(Relaxed) {
            self.peak.fetch_max(now, Relaxed);
        }
    }

    #[inline]
    fn sub(&self, size: usize) {
        self.current.fetch_sub(size, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(size: usize, traceback: u32) -> Trace {
        Trace { size, traceback }
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
                "insert" => table.insert(address, t(size, 1)),
                _ => {
                    table.remove(address);
                }
            }
            assert_eq!(table.totals(), (current, peak), "after {op} {address:#x}");
        }
        let sum: usize = table.collect().iter().map(|(_, t)| t.size).sum();
        assert_eq!(sum, table.totals().0);
        table.reset_peak();
        assert_eq!(table.totals(), (210, 210));
        table.clear();
        assert_eq!(table.totals(), (0, 0));
        assert!(table.is_empty());
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
                        table.insert(address, t(i % 97 + 1, 0));
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
        let sum: usize = table.collect().iter().map(|(_, t)| t.size).sum();
        assert_eq!(sum, table.totals().0);
        assert_eq!(table.len(), 4 * (20_000_usize).div_ceil(3));
    }

    #[test]
    fn lock_all_then_unlock_all_leaves_table_usable() {
        let table = TraceTable::new();
        table.insert(16, t(1, 0));
        table.lock_all();
        unsafe { table.unlock_all() };
        table.insert(32, t(2, 0));
        assert_eq!(table.totals().0, 3);
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
