//! Young blocks: traces not yet filed in the trace table.
//!
//! Most blocks a Python program allocates die young: a temporary string, a match object, the
//! list a comprehension builds before `join` consumes it. pymalloc hands a freed block to the
//! next request of its size class, so a loop cycles through a few addresses. Filing each such
//! block in the table and taking it out again costs two shard locks, two hashed probes into a
//! table of every live block, and the cache misses that go with them. So a block allocated by
//! a thread holding the main interpreter's GIL waits here, in a slot chosen by its address,
//! and is filed only when another block wants the slot, or when someone may look:
//!
//! - its size counts in the totals, the peak and its traceback's counter at once
//!   ([`TraceTable::charge`]): `get_traced_memory()` and the per-traceback values at the peak
//!   are exact whether a block waits here or not;
//! - a block freed (or reallocated) while it waits leaves from here, without touching the
//!   table;
//! - before the table's entries are read (snapshots, `get_object_traceback`, the per-line
//!   object sites) every waiting block is filed ([`file_all`]); a re-attribution of a waiting
//!   block (an object reused from a free list) changes it here ([`retrace`]);
//! - [`discard`] empties the slots when the traces are cleared.
//!
//! Threads: only a thread holding the main interpreter's GIL fills, files or changes a slot,
//! and only for a block of the MEM or OBJ domains, which CPython requires to be freed with
//! the GIL held too; so a slot is touched by one thread at a time, and its fields are atomics
//! read and written relaxed, without read-modify-write (as [`crate::freelist::deferred`]'s). A
//! free hook of another thread, or of the RAW domain, finds a slot holding another address and
//! leaves it alone. Sampled mode does not use the slots: its few recorded blocks gain little.
//!
//! The same reasoning lets every charge made from here be a serial one ([`SERIAL`], see
//! [`crate::hooks::tally`]).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering::Relaxed};

use crate::hooks::table::{neighbourly_index, Rehomed, Trace, TraceTable, TracebackId};
use crate::hooks::tally::Writer;

/// Slots, 4 KiB: enough that the blocks a loop cycles through rarely share one (a loop making
/// a string, a dict, a list and a tuple per iteration: 1,468, 1,465 and 1,464 million
/// instructions with 128, 256 and 512 slots), few enough to stay out of the program's way in
/// the L1 data cache (`benches/loops.py points`, 300,000 objects kept, cachegrind, 3.11: 29.4
/// million L1 misses without the slots, 32.0 million with 512 slots of 24 bytes scattered block
/// by block, 30.7 million with these; untraced 19.7 million).
const SLOTS: usize = 256;

struct Slot {
    /// The block's address, 0 for an empty slot.
    block: AtomicUsize,
    /// Blocks of 4 GiB or more go to the table at once, so that a slot takes 16 bytes.
    size: AtomicU32,
    traceback: AtomicU32,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Slot = Slot {
    block: AtomicUsize::new(0),
    size: AtomicU32::new(0),
    traceback: AtomicU32::new(0),
};

static WAITING: [Slot; SLOTS] = [EMPTY; SLOTS];

/// The block a slot gave up last, filed only when the next one is given up (or when every
/// block is filed). Filing a block not touched for a while waits on the table's cache lines
/// for it; [`prefetch_evictee`] asks for them before the stack walk of the allocation that
/// evicts it, and waiting here gives them until the next eviction to arrive, instead of the
/// few dozen instructions of one walk (`benches/loops.py points 1000000`, 3.11: see
/// docs/benchmarks.md). A block here is found by every lookup the slots answer.
static PENDING: Slot = EMPTY;

/// How this module changes the totals: every caller holds the main interpreter's GIL (see the
/// module's doc), so without locked instructions.
// SAFETY: the functions of this module that charge or discharge run only on a thread holding
// the main interpreter's GIL, as each states.
const SERIAL: Writer = unsafe { Writer::holding_main_gil() };

/// Whether new blocks may wait here: exact mode only, set by `start()`.
static ENABLED: AtomicBool = AtomicBool::new(false);

/// The slots, counted in the tracer's own memory (they are static).
pub const MEMORY_USAGE: usize = std::mem::size_of::<[Slot; SLOTS + 1]>();

/// Blocks of one 256-byte granule, 16-byte aligned as pymalloc's are.
const GRANULE_SLOTS: usize = 16;

/// A block's slot: a 256-byte granule's blocks have neighbouring slots, in address order, and
/// granules are scattered over the groups of 16 slots. A pool being filled block by block then
/// takes over a group slot by slot, filing another granule's blocks in address order too, and
/// the table keeps a granule's entries together (see `AddressHasher` in `crate::hooks::table`).
#[inline(always)]
fn slot_of(block: usize) -> &'static Slot {
    const GROUPS: usize = SLOTS / GRANULE_SLOTS;
    &WAITING[neighbourly_index(
        block,
        GRANULE_SLOTS.trailing_zeros(),
        GROUPS.trailing_zeros(),
    )]
}

#[inline(always)]
fn trace_in(slot: &Slot) -> Trace {
    Trace {
        size: slot.size.load(Relaxed) as usize,
        traceback: slot.traceback.load(Relaxed),
    }
}

/// Lets blocks wait here (exact mode) or not (sampled mode, where `may_contain` must find
/// every recorded block in the table). Called by `start()` with the GIL held, on empty slots.
pub fn set_enabled(on: bool) {
    ENABLED.store(on, Relaxed);
}

/// Records a block allocated in the MEM or OBJ domain by a thread holding the main
/// interpreter's GIL. Returns `false`, changing nothing, without memory for its traceback's
/// counter (the caller counts the trace as dropped). Without slots (sampled mode) the block
/// goes to the table directly.
///
/// # Safety
/// The main interpreter's GIL is held, inside the tracer's reentrancy guard.
#[inline(always)]
pub unsafe fn record(table: &TraceTable, address: usize, trace: Trace) -> bool {
    if !ENABLED.load(Relaxed) {
        return table.insert(address, trace, SERIAL);
    }
    let Ok(size) = u32::try_from(trace.size) else {
        take(table, address);
        return table.insert(address, trace, SERIAL);
    };
    if !table.charge(address, trace, SERIAL) {
        return false;
    }
    if PENDING.block.load(Relaxed) == address {
        // Freed unseen while it waited to be filed (see `make_room`).
        PENDING.block.store(0, Relaxed);
        table.discharge(address, trace_in(&PENDING), SERIAL);
    }
    let slot = slot_of(address);
    let there = slot.block.load(Relaxed);
    if there != 0 {
        make_room(table, slot, there, address);
    }
    slot.block.store(address, Relaxed);
    slot.size.store(size, Relaxed);
    slot.traceback.store(trace.traceback, Relaxed);
    true
}

/// The slot `address` wants holds the block `there`: moved to [`PENDING`] (filing the block
/// pending before it), or, if it is the same address (a block freed without our free hook
/// seeing it, e.g. by an allocator installed over ours), forgotten as the table forgets an
/// entry it replaces. Called by [`record`], with the main interpreter's GIL.
#[inline(never)]
fn make_room(table: &TraceTable, slot: &Slot, there: usize, address: usize) {
    let old = trace_in(slot);
    if there == address {
        table.discharge(there, old, SERIAL);
        return;
    }
    let pending = PENDING.block.load(Relaxed);
    if pending != 0 {
        file(table, pending, trace_in(&PENDING));
    }
    PENDING.block.store(there, Relaxed);
    PENDING.size.store(old.size as u32, Relaxed);
    PENDING.traceback.store(old.traceback, Relaxed);
}

/// Where the block at `address` waits, if it does: its slot, or [`PENDING`].
#[inline(always)]
fn find(address: usize) -> Option<&'static Slot> {
    let slot = slot_of(address);
    if slot.block.load(Relaxed) == address {
        Some(slot)
    } else if PENDING.block.load(Relaxed) == address {
        Some(&PENDING)
    } else {
        None
    }
}

/// Files a waiting block; without memory for the table's growth, the block is left untraced
/// and counted as dropped, as a block the table could not take when it was allocated. Called
/// by [`make_room`] and [`file_all`], with the main interpreter's GIL.
fn file(table: &TraceTable, block: usize, trace: Trace) {
    if !table.file_charged(block, trace, SERIAL) {
        table.discharge(block, trace, SERIAL);
        crate::hooks::tracer::count_dropped();
    }
}

/// A block is about to be recorded at `address` (a stack walk away): if its slot holds
/// another block, which recording will make the pending one (filed at the next eviction),
/// the table starts bringing that block's lines into the cache now (see
/// [`TraceTable::prefetch`]).
#[inline(always)]
pub fn prefetch_evictee(table: &TraceTable, address: usize) {
    if !ENABLED.load(Relaxed) {
        return;
    }
    let there = slot_of(address).block.load(Relaxed);
    if there != 0 && there != address {
        table.prefetch(there);
    }
}

/// Whether the block at `address` may wait here, without the reentrancy guard: in sampled
/// mode one load of a flag (the slots stay out of the cache), in exact mode one of its slot
/// and, if it is not there, one of the pending block.
#[inline(always)]
pub fn holds(address: usize) -> bool {
    ENABLED.load(Relaxed) && find(address).is_some()
}

/// The trace of the block at `address` if it waits here, for a reader that looks a few blocks
/// up (the heap walk sizes every object it finds) rather than filing every slot first.
///
/// # Safety
/// The main interpreter's GIL is held.
pub unsafe fn get(address: usize) -> Option<Trace> {
    if !ENABLED.load(Relaxed) {
        return None;
    }
    find(address).map(trace_in)
}

/// Takes out the block at `address` if it waits here, for a free or a reallocation; its
/// charge is taken back.
///
/// # Safety
/// The main interpreter's GIL is held, inside the reentrancy guard: the caller is a hook of
/// the MEM or OBJ domains (a free of a block that waits here comes with that GIL, see the
/// module's doc), or has checked.
#[inline(always)]
pub unsafe fn take(table: &TraceTable, address: usize) -> Option<Trace> {
    let slot = find(address)?;
    slot.block.store(0, Relaxed);
    let trace = trace_in(slot);
    table.discharge(address, trace, SERIAL);
    Some(trace)
}

/// Gives `block`, if it waits here, the traceback `traceback` returns for its trace, or takes
/// it out if that is `None` (as [`TraceTable::retrace`]). Gives `traceback` back if the block
/// does not wait here, for the caller to try the table.
///
/// # Safety
/// The main interpreter's GIL is held, inside the reentrancy guard.
pub unsafe fn retrace<F>(table: &TraceTable, block: usize, traceback: F) -> Result<(), F>
where
    F: FnOnce(Trace) -> Option<TracebackId>,
{
    let Some(slot) = find(block) else {
        return Err(traceback);
    };
    let old = trace_in(slot);
    match table.rehome(block, old, traceback(old), SERIAL) {
        Rehomed::Stays(id) => slot.traceback.store(id, Relaxed),
        Rehomed::Leaves => slot.block.store(0, Relaxed),
    }
    Ok(())
}

/// Files every waiting block, before the table's entries are read.
///
/// # Safety
/// The main interpreter's GIL is held, inside the reentrancy guard or outside any hook.
pub unsafe fn file_all(table: &TraceTable) {
    for slot in WAITING.iter().chain([&PENDING]) {
        let block = slot.block.load(Relaxed);
        if block != 0 {
            slot.block.store(0, Relaxed);
            file(table, block, trace_in(slot));
        }
    }
}

/// Empties every slot without filing: the traces (and the totals that counted them) were just
/// cleared.
///
/// # Safety
/// The GIL is held.
pub unsafe fn discard() {
    for slot in WAITING.iter().chain([&PENDING]) {
        slot.block.store(0, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(size: usize, traceback: TracebackId) -> Trace {
        Trace { size, traceback }
    }

    /// Every step changes the totals at once and the table's entries only when filed: a
    /// block a slot gives up waits as the pending one, and is filed when the next is given up.
    #[test]
    fn waiting_blocks_count_at_once_and_reach_the_table_when_filed() {
        // An address, above `above`, whose slot is `address`'s.
        let collider = |address: usize, above: usize| {
            (1..1 << 20)
                .map(|k| above + 16 * k)
                .find(|&a| std::ptr::eq(slot_of(a), slot_of(address)))
                .unwrap()
        };
        let a = collider(0x1000, 0x10_0000);
        let b = collider(0x3000, 0x20_0000);
        let c = collider(0x4000, 0x30_0000);
        enum Op {
            Record(usize, usize, TracebackId),
            Take(usize),
            Retrace(usize, Option<TracebackId>),
            FileAll,
        }
        use Op::*;
        // (operation, current total after, the table's entries after)
        type Step = (Op, usize, Vec<(usize, Trace)>);
        // What the table holds once every waiting block is filed, near the end.
        let filed = vec![
            (0x1000, t(100, 8)),
            (0x4000, t(4, 9)),
            (b, t(1, 6)),
            (c, t(3, 8)),
        ];
        let steps: Vec<Step> = vec![
            (Record(0x1000, 100, 1), 100, vec![]),
            (Record(0x2000, 50, 2), 150, vec![]),
            (Take(0x2000), 100, vec![]),
            (Take(0x2000), 100, vec![]), // no longer waits: nothing taken
            (Retrace(0x1000, Some(7)), 100, vec![]),
            (Record(a, 10, 3), 110, vec![]),         // 0x1000 pending
            (Retrace(0x1000, Some(8)), 110, vec![]), // found pending
            (Record(a, 20, 4), 120, vec![]),         // freed unseen
            (Retrace(a, None), 100, vec![]),
            (Record(0x3000, 5, 5), 105, vec![]),
            // 0x3000 pending, 0x1000 filed.
            (Record(b, 1, 6), 106, vec![(0x1000, t(100, 8))]),
            (Take(0x3000), 101, vec![(0x1000, t(100, 8))]), // taken while pending
            (Record(0x4000, 2, 7), 103, vec![(0x1000, t(100, 8))]),
            (Record(c, 3, 8), 106, vec![(0x1000, t(100, 8))]), // 0x4000 pending
            (Record(0x4000, 4, 9), 108, vec![(0x1000, t(100, 8))]), // freed unseen pending
            (FileAll, 108, filed.clone()),
            (Take(b), 108, filed.clone()), // filed
            // 8 GiB: too big for a slot, filed at once.
            (
                Record(0x5000, 1 << 33, 6),
                108 + (1 << 33),
                [filed.clone(), vec![(0x5000, t(1 << 33, 6))]].concat(),
            ),
        ];
        let table = TraceTable::new();
        // SAFETY: this is the only test touching the slots, and it runs on one thread.
        unsafe { discard() };
        set_enabled(true);
        for (i, (op, current, mut entries)) in steps.into_iter().enumerate() {
            // SAFETY: as above.
            unsafe {
                match op {
                    Record(address, size, tb) => {
                        assert!(record(&table, address, t(size, tb)));
                        // Found where it waits; a block too big for a slot is in the table.
                        let waiting = (size <= u32::MAX as usize).then(|| t(size, tb));
                        assert_eq!(get(address), waiting, "step {i}");
                    }
                    Take(address) => {
                        take(&table, address);
                    }
                    Retrace(address, to) => assert!(retrace(&table, address, |_| to).is_ok()),
                    FileAll => file_all(&table),
                }
            }
            let mut found = table.collect().unwrap();
            found.sort_unstable_by_key(|&(address, _)| address);
            entries.sort_unstable_by_key(|&(address, _)| address);
            assert_eq!(table.totals().0, current, "step {i}");
            assert_eq!(found, entries, "step {i}");
        }
        assert!(!holds(0x1000));
        set_enabled(false);
    }
}
