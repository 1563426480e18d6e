//! Re-attributions waiting to reach the trace table.
//!
//! A float loop creates an object per arithmetic operation, and CPython hands it one of the few
//! blocks on its float free list, over and over: the same handful of blocks change traceback
//! millions of times, and only the last change before anyone looks matters. Writing each change
//! into the table costs a shard lock, a probe and four atomic counter updates: about a third of
//! the time tracing added to such a loop (CPython 3.11, one frame). So a re-attribution is kept
//! here instead, one slot per block (a later one for the same block overwrites it), and written
//! to the table when the slot has been wanted by other blocks twice (the first time makes it
//! the [`PENDING`] one) or when someone may look:
//!
//! - before traces are read ([`settle`]: snapshots, `get_object_traceback`, the per-line
//!   object sites), and before the peak is reset;
//! - before a thread holding the GIL records a block that may make a new peak
//!   ([`before_insert`]), so that the per-traceback values at the peak (see [`crate::hooks::peak`])
//!   include every re-attribution made before it;
//! - never after the traces were cleared: [`discard`] empties the slots with the table.
//!
//! A block recorded anew at an address (allocated again after a free) must not inherit a
//! waiting re-attribution of the block that was there before: every insert first calls
//! [`forget`]. A block freed while its re-attribution waits leaves the table with its older
//! traceback, which charges the counters exactly as moving it first and then removing it would.
//!
//! Threads: [`defer`], [`settle`] and [`discard`] run with the main interpreter's GIL (the
//! slots' occupancy list is guarded by it); [`forget`] may run on any thread, inside any hook.
//! It only writes a slot that holds its own address, and no other thread can be re-attributing
//! that block at the same time (a block being allocated is not on a free list, and a block on a
//! free list is not free to be allocated), so the slots' fields are atomics read and written
//! relaxed, without read-modify-write. A peak made by a thread without the GIL (RAW-domain or
//! native allocations) may come while re-attributions wait: those blocks are then counted under
//! their older tracebacks in `take_snapshot(peak=True)`, like the blocks in flight on other
//! threads that [`crate::hooks::peak`] already describes; the peak total is exact.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering::Relaxed};

use crate::hooks::table::{TraceTable, TracebackId};
use crate::hooks::tally::Writer;
use crate::hooks::tracer::{table, GilCell};

/// Slots, 8 KiB: the blocks a hot loop cycles through (CPython 3.11 keeps at most 100 floats
/// on its free list) land in different slots most of the time.
const SLOTS: usize = 512;

struct Slot {
    /// The block's address, 0 for an empty slot.
    block: AtomicUsize,
    traceback: AtomicU32,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Slot = Slot {
    block: AtomicUsize::new(0),
    traceback: AtomicU32::new(0),
};

static WAITING: [Slot; SLOTS] = [EMPTY; SLOTS];

/// The re-attribution a slot gave up last, written into the table only when the next one is
/// given up (or when all are settled): the table's lines for its block, asked for by
/// [`prefetch_evictee`] before the stack walk that preceded its eviction, then have until the
/// next eviction to arrive (as [`crate::hooks::young`]'s pending block). Found by [`take`] as the
/// slots are.
static PENDING: Slot = EMPTY;

/// Slots filled since the last [`settle`] (a slot emptied by [`forget`] meanwhile stays
/// listed), so that settling visits only those.
struct Filled {
    slots: [u16; SLOTS],
    len: usize,
}

static FILLED: GilCell<Filled> = GilCell::new(Filled {
    slots: [0; SLOTS],
    len: 0,
});

/// Whether any slot may be filled: lets [`forget`] and [`before_insert`] return after one load
/// when nothing waits (untraced programs, sampled mode between re-attributions). Written only
/// with the GIL held; read anywhere.
static ANY: AtomicUsize = AtomicUsize::new(0);

#[inline(always)]
fn slot_of(block: usize) -> usize {
    ((block as u64 >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - SLOTS.trailing_zeros()))
        as usize
}

/// The slots and their occupancy list, counted in the tracer's own memory (they are static).
pub const MEMORY_USAGE: usize =
    std::mem::size_of::<[Slot; SLOTS + 1]>() + std::mem::size_of::<Filled>();

/// Writes one waiting re-attribution into the table, or into the block's slot among the
/// [`crate::hooks::young`] blocks if it waits there. A block no longer traced (freed, or never
/// traced) is left alone.
///
/// # Safety
/// The main interpreter's GIL is held, inside the reentrancy guard or outside any hook.
#[inline(always)]
unsafe fn apply(block: usize, traceback: TracebackId) {
    let table = table();
    if let Err(retrace) = crate::hooks::young::retrace(table, block, |_| Some(traceback)) {
        // SAFETY: the main interpreter's GIL is held (this function's contract).
        table.retrace(block, Writer::holding_main_gil(), retrace);
    }
}

/// `block` (an object's block, reused from a free list) now belongs to `traceback`; the
/// table learns it later. The block's slot, if another block's re-attribution waits there,
/// makes that one the pending one, writing the one pending before it.
///
/// # Safety
/// The main interpreter's GIL is held, inside the tracer's reentrancy guard.
#[inline(always)]
pub unsafe fn defer(block: usize, traceback: TracebackId) {
    let slot = &WAITING[slot_of(block)];
    let there = slot.block.load(Relaxed);
    if there != block {
        if PENDING.block.load(Relaxed) == block {
            // Superseded: only the block's last re-attribution is to reach the table, and the
            // block must wait in one place only.
            PENDING.block.store(0, Relaxed);
        }
        if there != 0 {
            let pending = PENDING.block.load(Relaxed);
            if pending != 0 {
                apply(pending, PENDING.traceback.load(Relaxed));
            }
            PENDING.block.store(there, Relaxed);
            PENDING
                .traceback
                .store(slot.traceback.load(Relaxed), Relaxed);
        } else {
            // SAFETY: the GIL is held (caller) and no other borrow of the cell is live.
            let filled = FILLED.get();
            if filled.len == SLOTS {
                settle_filled(filled);
            }
            filled.slots[filled.len] = slot_of(block) as u16;
            filled.len += 1;
            ANY.store(1, Relaxed);
        }
        slot.block.store(block, Relaxed);
    }
    slot.traceback.store(traceback, Relaxed);
}

/// `block` is about to be re-attributed (a stack walk away): if its slot holds another
/// block's re-attribution, which [`defer`] will make the pending one (written at the next
/// eviction), the table starts bringing that block's lines into the cache now (see
/// [`TraceTable::prefetch`]). Any thread holding the main interpreter's GIL.
#[inline(always)]
pub fn prefetch_evictee(table: &TraceTable, block: usize) {
    let there = WAITING[slot_of(block)].block.load(Relaxed);
    if there != 0 && there != block {
        table.prefetch(there);
    }
}

/// A new block is about to be recorded at `address`: a re-attribution still waiting for the
/// block that was there before is dropped. Any thread, any hook.
#[inline(always)]
pub fn forget(address: usize) {
    take(address);
}

/// Writes every waiting re-attribution into the table, before traces are read or the peak is
/// reset.
///
/// # Safety
/// The main interpreter's GIL is held, inside the reentrancy guard or outside any hook.
pub unsafe fn settle() {
    if ANY.load(Relaxed) == 0 {
        return;
    }
    // SAFETY: the GIL is held (caller) and no other borrow of the cell is live.
    settle_filled(FILLED.get());
}

/// A thread holding the main interpreter's GIL is about to record a block of `size` bytes:
/// if that may make a new peak, waiting re-attributions go to the table first.
///
/// # Safety
/// As [`settle`], inside the reentrancy guard.
#[inline(always)]
pub unsafe fn before_insert(size: usize) {
    if ANY.load(Relaxed) != 0 && table().may_reach_peak(size) {
        settle();
    }
}

/// # Safety
/// As [`settle`].
#[inline(never)]
unsafe fn settle_filled(filled: &mut Filled) {
    let pending = PENDING.block.load(Relaxed);
    if pending != 0 {
        apply(pending, PENDING.traceback.load(Relaxed));
        PENDING.block.store(0, Relaxed);
    }
    for &index in &filled.slots[..filled.len] {
        let slot = &WAITING[usize::from(index)];
        let block = slot.block.load(Relaxed);
        if block != 0 {
            apply(block, slot.traceback.load(Relaxed));
            slot.block.store(0, Relaxed);
        }
    }
    filled.len = 0;
    ANY.store(0, Relaxed);
}

/// Drops every waiting re-attribution: the traces (and the tracebacks their ids name) were
/// just cleared.
///
/// # Safety
/// The GIL is held and no other borrow of the occupancy list is live.
pub unsafe fn discard() {
    for slot in WAITING.iter().chain([&PENDING]) {
        slot.block.store(0, Relaxed);
    }
    FILLED.get().len = 0;
    ANY.store(0, Relaxed);
}

/// Takes the re-attribution waiting for the block at `address`, which is leaving the table
/// (reallocated). Any thread, any hook, as [`forget`].
#[inline(always)]
pub fn take(address: usize) -> Option<TracebackId> {
    if ANY.load(Relaxed) == 0 {
        return None;
    }
    let mut slot = &WAITING[slot_of(address)];
    if slot.block.load(Relaxed) != address {
        slot = &PENDING;
        if slot.block.load(Relaxed) != address {
            return None;
        }
    }
    slot.block.store(0, Relaxed);
    Some(slot.traceback.load(Relaxed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hooks::table::Trace;

    /// A re-attribution reaches the table when its slot is wanted twice over (once to become
    /// the pending one, once to be written) or at a settle, never twice and never after its
    /// block was taken. The blocks share a slot; the addresses are this test's own (the table
    /// is the process's).
    #[test]
    fn a_reattribution_reaches_the_table_once_and_in_order() {
        let first = 0x7f00_0000_0000_usize;
        let mut blocks = (1..1 << 20)
            .map(|k| first + 16 * k)
            .filter(|&a| slot_of(a) == slot_of(first));
        let (a, b, c) = (first, blocks.next().unwrap(), blocks.next().unwrap());
        enum Op {
            Defer(usize, TracebackId),
            Take(usize, Option<TracebackId>),
            Settle,
        }
        use Op::*;
        // (operation, the tracebacks of a, b and c in the table after it)
        let steps = [
            (Defer(a, 2), [1, 1, 1]),
            (Defer(b, 3), [1, 1, 1]),      // a pending
            (Defer(c, 4), [2, 1, 1]),      // b pending, a written
            (Defer(b, 5), [2, 1, 1]),      // b's pending 3 superseded, c pending
            (Take(c, Some(4)), [2, 1, 1]), // taken while pending
            (Take(c, None), [2, 1, 1]),
            (Settle, [2, 5, 1]),
            (Defer(a, 6), [2, 5, 1]),
            (Defer(b, 7), [2, 5, 1]), // a pending
            (Settle, [6, 7, 1]),
        ];
        let table = table();
        for block in [a, b, c] {
            assert!(table.insert(
                block,
                Trace {
                    size: 32,
                    traceback: 1
                },
                Writer::ANY
            ));
        }
        for (i, (op, tracebacks)) in steps.into_iter().enumerate() {
            // SAFETY: this is the only test using the slots, on one thread.
            unsafe {
                match op {
                    Defer(block, traceback) => defer(block, traceback),
                    Take(block, expected) => assert_eq!(take(block), expected, "step {i}"),
                    Settle => settle(),
                }
            }
            let found = [a, b, c].map(|block| table.get(block).unwrap().traceback);
            assert_eq!(found, tracebacks, "step {i}");
        }
        for block in [a, b, c] {
            table.remove(block, Writer::ANY);
        }
    }
}
