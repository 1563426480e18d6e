//! The tracer: what the hooks record, and the runtime API (`start`, `stop`, `clear_traces`,
//! snapshots) over the live state. What needs a layer above the hooks is done there, over
//! what this module collects and resolves: snapshots with object kinds in [`crate::snapshot`],
//! the tuples of `_get_traces()` and `get_object_traceback()` in [`crate::py::traces`].
//!
//! State and who may touch it:
//! - flags and the trace table: any thread, any time (atomics, and one shard lock per hook);
//! - the interner and the frame scratch buffer: only a thread holding the main interpreter's
//!   GIL ([`GilCell`]). A hook decides that from the interpreter's own thread state; threads
//!   without the GIL record the `<unknown>` traceback instead of waiting for it (taking the GIL
//!   in a hook has deadlocked the standard module);
//! - the resolver: only the Python-facing functions (here and in the modules above), never a
//!   hook.
//!
//! Nothing a hook can reach is ever freed: the table and hook records are process-lifetime, and
//! `stop()` empties them instead.
//!
//! Sampled mode (`start(.., sample_interval=R)`): the allocation hook asks its
//! [`sampler::Scope`]
//! first, so an unsampled allocation costs a countdown subtraction and nothing else; frees
//! ask the table's lock-free presence filter before taking the guard or a shard lock.
//!
//! Nor does a hook abort for lack of memory (Rust's default on a failed allocation): the table
//! and the interner grow only through fallible reservations, and a block whose trace cannot
//! be stored is left untraced and counted in [`dropped_traces`].

use std::cell::UnsafeCell;
use std::collections::{HashMap, HashSet};
use std::ffi::c_void;
use std::sync::atomic::{
    AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst,
};
use std::sync::{Once, OnceLock};

use pyo3::ffi;
use pyo3::prelude::*;

use crate::analysis::filter::{FilterSet, FilterSpec};
use crate::analysis::sampling::{count_from_units, MAX_INTERVAL};
use crate::analysis::snapshot::{FrameId, Metadata, Snapshot, SnapshotBuilder};
use crate::capture::{self, Current, Interpreter, RawFrame, MAX_NFRAME};
use crate::error::{Error, Result};
use crate::freelist::deferred;
use crate::hooks;
use crate::hooks::hook_thread::{self, HookThread};
use crate::hooks::intern::{DyingCode, Interner, Resolver, UNKNOWN_TRACEBACK};
use crate::hooks::sampler;
use crate::hooks::table::{Trace, TraceTable, TracebackId};
use crate::hooks::tally::Writer;
use crate::hooks::young;
use crate::platform::fallible;
use crate::platform::process_memory::ProcessMemory;
use crate::tracked;

/// All PEP 445 allocations land in tracemalloc's default domain 0.
pub const DEFAULT_DOMAIN: u32 = 0;

static TRACING: AtomicBool = AtomicBool::new(false);
/// Cleared by `disable()`: new blocks are not recorded, frees still are.
static RECORDING: AtomicBool = AtomicBool::new(true);
/// Whether the running session was asked to re-attribute objects reused from free lists
/// (`start(reattribute=...)`): what a later `start()` must not contradict.
static REATTRIBUTE_ASKED: AtomicBool = AtomicBool::new(true);
/// Whether it does: asked, and the interpreter offered a way ([`crate::freelist::install`]);
/// also what `stop()` has to take out.
static REATTRIBUTING: AtomicBool = AtomicBool::new(false);
static TABLE: OnceLock<TraceTable> = OnceLock::new();
static MAIN_INTERPRETER: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
/// Blocks allocated while tracing but left untraced because the tracer could not get memory
/// for their trace (or a new traceback); reset with the traces. Such a block is invisible to
/// the totals and snapshots, and its free is a no-op for the table.
static DROPPED: AtomicUsize = AtomicUsize::new(0);

/// State only a thread holding the main interpreter's GIL may touch.
///
/// The GIL is the lock: this is how the standard module protects its traceback table too, and
/// it lets the hook intern without a second lock. Every access goes through [`GilCell::get`],
/// whose callers state why the GIL is held and why no other borrow is live.
pub struct GilCell<T>(UnsafeCell<T>);

// SAFETY: access is serialised by the GIL, per the contract of `GilCell::get`.
unsafe impl<T> Sync for GilCell<T> {}

impl<T> GilCell<T> {
    pub const fn new(value: T) -> Self {
        Self(UnsafeCell::new(value))
    }

    /// # Safety
    /// The calling thread holds the main interpreter's GIL and no other borrow of this cell
    /// is live (no re-entry while the returned reference is used).
    #[allow(clippy::mut_from_ref)]
    #[inline(always)]
    pub unsafe fn get(&self) -> &mut T {
        &mut *self.0.get()
    }
}

struct Live {
    interner: Interner,
    /// Room for `traceback_limit` frames: the walk writes here, then interns.
    scratch: Vec<RawFrame>,
}

static LIVE: GilCell<Option<Live>> = GilCell::new(None);
static RESOLVER: GilCell<Option<Resolver>> = GilCell::new(None);
/// Trace-time filters (`add_filter()`): allocations whose traceback they reject are never
/// stored. Each change bumps `generation`, which invalidates the verdicts cached per interned
/// traceback, so a filtered hook does no pattern matching for a stack it has judged before.
struct TraceFilters {
    set: Option<FilterSet>,
    generation: u32,
}

static FILTERS: GilCell<TraceFilters> = GilCell::new(TraceFilters {
    set: None,
    generation: 1,
});
/// The filters' verdict on the `<unknown>` traceback, for threads without the GIL.
static KEEP_UNKNOWN: AtomicBool = AtomicBool::new(true);
/// The same verdict in the native domain (a `DomainFilter` may tell them apart).
static KEEP_UNKNOWN_NATIVE: AtomicBool = AtomicBool::new(true);

/// The traceback limit: kept after `stop()` so `get_traceback_limit()` answers as tracemalloc.
static LIMIT: GilCell<usize> = GilCell::new(1);

/// Marks this thread as inside the tracer (its [`HookThread::in_tracer`] flag); `None` if it
/// already is.
///
/// Holds this thread's [`HookThread`] so that leaving, and reading the thread state on 3.12
/// and later ([`Current::gil_thread_state`]), cost no second thread-local lookup (each is a
/// call into the dynamic loader, see [`super::hook_thread`]).
struct ReentrancyGuard(&'static HookThread);

impl ReentrancyGuard {
    #[inline(always)]
    fn enter() -> Option<Self> {
        Self::on(hook_thread::this())
    }

    /// Enters with the thread state an allocating hook's scope already looked up.
    #[inline(always)]
    fn within(scope: &sampler::Scope) -> Option<Self> {
        Self::on(scope.thread())
    }

    #[inline(always)]
    fn on(thread: &'static HookThread) -> Option<Self> {
        let inside = &thread.in_tracer;
        if inside.get() {
            return None;
        }
        inside.set(true);
        Some(ReentrancyGuard(thread))
    }

    /// This thread's hook state.
    #[inline(always)]
    fn thread(&self) -> &HookThread {
        self.0
    }
}

impl Drop for ReentrancyGuard {
    #[inline(always)]
    fn drop(&mut self) {
        self.thread().in_tracer.set(false);
    }
}

#[inline(always)]
pub(crate) fn table() -> &'static TraceTable {
    TABLE.get_or_init(TraceTable::new)
}

/// The interned traceback of the calling thread's current stack, for a block of `size` bytes
/// about to be recorded: `Ok(None)` if the trace-time filters reject it, `Err(OutOfMemory)`
/// if it is new and there is no memory to intern it. On a thread holding the main
/// interpreter's GIL, re-attributions still waiting ([`deferred`]) reach the table first if
/// that block may make a new peak.
///
/// # Safety
/// Called from a hook, inside a [`ReentrancyGuard`].
#[inline(always)]
unsafe fn current_traceback(
    thread: &HookThread,
    gil_held: bool,
    domain: u32,
    key: Option<usize>,
    size: usize,
) -> std::result::Result<Option<TracebackId>, OutOfMemory> {
    let tstate = Current::gil_thread_state(thread, gil_held);
    if !is_main(tstate) {
        return match key {
            // No GIL: the thread's own stack, as it stood when the GIL was released.
            Some(key) if tstate.is_null() => released_traceback(key, domain, size),
            _ => Ok(unknown_traceback(domain)),
        };
    }
    deferred::before_insert(size);
    traceback_of(tstate, domain)
}

/// [`current_traceback`] on a thread that holds no GIL (see [`super::released`]): the block
/// is recorded there under `key` (then `Ok(None)`, nothing left to do), or gets the
/// `<unknown>` traceback if the thread has no Python frames of the main interpreter.
///
/// # Safety
/// As [`current_traceback`], on a thread holding no GIL.
#[cold]
#[inline(never)]
unsafe fn released_traceback(
    key: usize,
    domain: u32,
    size: usize,
) -> std::result::Result<Option<TracebackId>, OutOfMemory> {
    let native = domain == crate::native::DOMAIN;
    let record = |traceback| {
        deferred::forget(key);
        table().insert(key, Trace { size, traceback }, Writer::ANY)
    };
    match super::released::charge(key, native, MAIN_INTERPRETER.load(Relaxed), record) {
        super::released::Charge::Recorded | super::released::Charge::Rejected => Ok(None),
        super::released::Charge::Unknown => Ok(unknown_traceback(domain)),
        super::released::Charge::OutOfMemory => Err(OutOfMemory),
    }
}

/// Moves the blocks that threads without the GIL recorded with a placeholder to their
/// stacks' tracebacks, interning those stacks (see [`super::released`]).
///
/// # Safety
/// The main interpreter's GIL is held, outside any hook, and no borrow of the tracer's cells
/// is live.
unsafe fn settle_released() {
    use crate::hooks::released::{self, Interned};
    if !released::any_waiting() {
        return;
    }
    let py = Python::assume_attached();
    let mut done = Vec::new();
    for (index, (frames, total)) in released::to_intern() {
        // Tags first: making a filename's `str` allocates, and the hooks of this thread
        // intern meanwhile (the resolver is no hook's business).
        let Some(resolver) = RESOLVER.get().as_mut() else {
            return;
        };
        let raw: Vec<RawFrame> = frames
            .iter()
            .map(|frame| {
                let function = frame
                    .function
                    .as_ref()
                    .map(|(name, first)| (&name[..], *first));
                RawFrame::new(
                    resolver.located_tag(py, &frame.filename, function),
                    frame.line.min(i32::MAX as u32) as i32,
                )
            })
            .collect();
        let (keep, keep_native) = match &FILTERS.get().set {
            None => (true, true),
            Some(set) => {
                let located: Vec<(&[u8], u32)> = frames
                    .iter()
                    .map(|frame| (&frame.filename[..], frame.line))
                    .collect();
                (
                    set.keep(DEFAULT_DOMAIN, &located),
                    set.keep(crate::native::DOMAIN, &located),
                )
            }
        };
        let Some(live) = LIVE.get().as_mut() else {
            return;
        };
        // Without memory for it, its blocks wait for the next settle.
        if let Some(id) = live.interner.intern_located(&raw, total) {
            done.push((
                index,
                Interned {
                    id,
                    keep,
                    keep_native,
                },
            ));
        }
    }
    let table = table();
    let moved = |native: bool, allocated, traceback| {
        table.move_allocated(native, UNKNOWN_TRACEBACK, allocated, traceback);
    };
    released::finish(
        &done,
        |key, traceback| {
            // Unless the block was freed and its address given to a block with a real traceback.
            // Its allocation, counted under the placeholder, moves with it.
            table.retrace_allocation(key, Writer::ANY, |old| {
                if old.traceback == UNKNOWN_TRACEBACK {
                    traceback
                } else {
                    Some(old.traceback)
                }
            });
        },
        moved,
    );
}

/// Whether `tstate` (this thread's, if it holds a GIL: see [`Current::gil_thread_state`]) is
/// one of the main interpreter's, the one whose stacks the tracer reads.
///
/// # Safety
/// `tstate` is null or a live thread state.
#[inline(always)]
unsafe fn is_main(tstate: *mut ffi::PyThreadState) -> bool {
    !tstate.is_null() && capture::interpreter_of(tstate) == MAIN_INTERPRETER.load(Relaxed)
}

/// What a block of `domain` gets when the stack cannot be read: the `<unknown>` traceback,
/// unless the filters reject it.
#[inline(always)]
fn unknown_traceback(domain: u32) -> Option<TracebackId> {
    let keep_unknown = match domain {
        crate::native::DOMAIN => &KEEP_UNKNOWN_NATIVE,
        _ => &KEEP_UNKNOWN,
    };
    keep_unknown.load(Relaxed).then_some(UNKNOWN_TRACEBACK)
}

/// [`current_traceback`] for a caller that already has the thread state (re-attribution
/// looks it up first, to leave blocks of other interpreters alone).
///
/// # Safety
/// As [`current_traceback`]; `tstate` is this thread's, it holds the main interpreter's GIL.
#[inline(always)]
unsafe fn traceback_of(
    tstate: *mut ffi::PyThreadState,
    domain: u32,
) -> std::result::Result<Option<TracebackId>, OutOfMemory> {
    let unknown = || Ok(unknown_traceback(domain));
    // SAFETY: this thread holds the main interpreter's GIL (the caller checked), and the
    // reentrancy guard rules out another borrow on this thread.
    let Some(live) = LIVE.get() else {
        return unknown();
    };
    let (n, total) = Current::walk(tstate, &mut live.scratch);
    if n == 0 {
        return unknown();
    }
    let id = live
        .interner
        .intern(&live.scratch[..n], total)
        .ok_or(OutOfMemory)?;
    // SAFETY: as above.
    let filters = FILTERS.get();
    Ok(match &filters.set {
        None => Some(id),
        // Verdicts are cached for domain 0 only: other domains come from tracked blocks,
        // which are few (see crate::tracked).
        Some(set) if domain != DEFAULT_DOMAIN => judge(set, &live.scratch[..n], domain)
            .ok_or(OutOfMemory)?
            .then_some(id),
        Some(set) => {
            let keep = match live.interner.verdict(id, filters.generation) {
                Some(keep) => keep,
                None => {
                    let keep = judge(set, &live.scratch[..n], DEFAULT_DOMAIN).ok_or(OutOfMemory)?;
                    live.interner.set_verdict(id, filters.generation, keep);
                    keep
                }
            };
            keep.then_some(id)
        }
    })
}

/// Runs the filters on one stack (once per distinct stack and filter set); `None` if the
/// memory to hold the located frames cannot be had (the hook then drops the trace).
///
/// # Safety
/// As [`capture::locate`].
#[cold]
unsafe fn judge(set: &FilterSet, frames: &[RawFrame], domain: u32) -> Option<bool> {
    let mut located: Vec<(Vec<u8>, u32)> = Vec::new();
    located.try_reserve_exact(frames.len()).ok()?;
    for &frame in frames {
        located.push(capture::locate(frame)?);
    }
    let mut refs: Vec<(&[u8], u32)> = Vec::new();
    refs.try_reserve_exact(located.len()).ok()?;
    refs.extend(located.iter().map(|(f, l)| (f.as_slice(), *l)));
    Some(set.keep(domain, &refs))
}

/// Replaces the trace-time filters. They apply to allocations made from now on; traces
/// already stored stay.
pub fn set_trace_filters(specs: &[FilterSpec]) -> Result<()> {
    let set = FilterSet::new(specs)?;
    KEEP_UNKNOWN.store(set.keep(DEFAULT_DOMAIN, &[(b"<unknown>", 0)]), Relaxed);
    KEEP_UNKNOWN_NATIVE.store(
        set.keep(crate::native::DOMAIN, &[(b"<unknown>", 0)]),
        Relaxed,
    );
    // SAFETY: called with the GIL held, from Python; no hook borrow is live on this thread.
    let filters = unsafe { FILTERS.get() };
    filters.set = (!set.is_empty()).then_some(set);
    filters.generation = filters.generation.wrapping_add(1).max(1);
    super::released::forget_verdicts();
    Ok(())
}

/// Brings the table up to date before its entries are read: waiting re-attributions
/// ([`deferred`]) and young blocks ([`young`]) are written to it.
///
/// # Safety
/// The main interpreter's GIL is held, outside any hook.
pub(crate) unsafe fn settle() {
    settle_released();
    deferred::settle();
    young::file_all(table());
}

/// The tracer could not get memory for a trace or a new traceback.
struct OutOfMemory;

/// Records a trace, or counts it as dropped when the tracer is out of memory: the program's
/// own allocation already succeeded and must not fail (or abort) because ours did.
#[inline(always)]
fn record(address: usize, trace: Trace) {
    deferred::forget(address);
    if !table().insert(address, trace, Writer::ANY) {
        count_dropped();
    }
}

/// Puts back a trace that a hook took out (see [`TraceTable::restore`]): not a new allocation.
fn put_back(address: usize, trace: Trace) {
    deferred::forget(address);
    if !table().restore(address, trace, Writer::ANY) {
        count_dropped();
    }
}

/// Counts a block left untraced for lack of memory (see [`DROPPED`]).
pub(crate) fn count_dropped() {
    DROPPED.fetch_add(1, Relaxed);
}

/// Records a block with the current traceback, unless the trace-time filters reject it. A
/// block of the MEM or OBJ domains whose stack was read (so the thread holds the main
/// interpreter's GIL) waits among the [`young`] blocks; others go to the table at once.
///
/// # Safety
/// Called from a hook, inside a [`ReentrancyGuard`].
#[inline(always)]
unsafe fn record_current(thread: &HookThread, address: usize, size: usize, gil_held: bool) {
    let table = table();
    if gil_held && table.is_large() {
        young::prefetch_evictee(table, address);
    }
    match current_traceback(thread, gil_held, DEFAULT_DOMAIN, Some(address), size) {
        Ok(Some(traceback)) if gil_held && traceback != UNKNOWN_TRACEBACK => {
            deferred::forget(address);
            if !young::record(table, address, Trace { size, traceback }) {
                count_dropped();
            }
        }
        Ok(Some(traceback)) => record(address, Trace { size, traceback }),
        Ok(None) => {}
        Err(OutOfMemory) => {
            count_dropped();
        }
    }
}

/// A block was allocated.
///
/// # Safety
/// Called from a hook with the block just returned by the wrapped allocator.
#[inline(always)]
pub unsafe fn on_alloc(address: usize, size: usize, gil_held: bool, scope: &sampler::Scope) {
    if will_record(size, scope) {
        on_recorded_alloc(address, size, gil_held, scope);
    }
}

/// Whether an allocation of `size` bytes in `scope` is to be recorded: tracing, recording,
/// the outermost hook on the thread and, when sampling, the allocation that crosses the
/// countdown (which this call moves on). In sampled mode the hooks ask before calling the
/// wrapped allocator (see [`crate::hooks`]): an allocation that then fails has still been
/// charged, which only moves the next sample by one draw.
#[inline(always)]
pub fn will_record(size: usize, scope: &sampler::Scope) -> bool {
    TRACING.load(Relaxed) && RECORDING.load(Relaxed) && scope.keep(size)
}

/// A block was allocated that [`will_record`] said is to be recorded.
///
/// # Safety
/// As [`on_alloc`].
#[inline(always)]
pub unsafe fn on_recorded_alloc(
    address: usize,
    size: usize,
    gil_held: bool,
    scope: &sampler::Scope,
) {
    let Some(guard) = ReentrancyGuard::within(scope) else {
        return;
    };
    record_current(guard.thread(), address, size, gil_held);
    if gil_held {
        crate::freelist::note_allocated(address);
    }
}

/// An object is being created in `block`, which this thread did not just allocate: a block
/// reused from a free list (or one allocated before tracing, or not sampled). If traced, it
/// gets the current traceback, as the standard module's `_PyTraceMalloc_NewReference` does;
/// a stack the trace-time filters reject forgets it, as if it were allocated there. While
/// recording is disabled it keeps its traceback, since no new block is recorded then.
///
/// # Safety
/// Called from [`crate::freelist`] with the GIL held, for a block that
/// [`may_be_reused_traced`] (a check apart, for callers to inline).
#[inline]
pub unsafe fn on_reused_block(block: usize) {
    let table = table();
    let Some(guard) = ReentrancyGuard::enter() else {
        return;
    };
    let tstate = Current::gil_thread_state(guard.thread(), true);
    if !is_main(tstate) {
        return;
    }
    // SAFETY: the GIL is held and no other borrow of the cell is live.
    if FILTERS.get().set.is_none() {
        // Without filters every stack is kept (`Ok(None)` does not happen); without memory
        // for a new traceback the block keeps the one it has.
        if table.is_large() {
            deferred::prefetch_evictee(table, block);
        }
        if let Ok(Some(new)) = traceback_of(tstate, DEFAULT_DOMAIN) {
            deferred::defer(block, new);
        }
        return;
    }
    // The filters may reject the new stack, and forget the block: decided now, in the table
    // (or among the young blocks), replacing any re-attribution still waiting for this block.
    deferred::forget(block);
    let retrace = |old: Trace| match traceback_of(tstate, DEFAULT_DOMAIN) {
        Ok(new) => new,
        // No memory for a new traceback: the block keeps the one it has.
        Err(OutOfMemory) => Some(old.traceback),
    };
    if let Err(retrace) = young::retrace(table, block, retrace) {
        // SAFETY: this thread holds the GIL (the caller's contract) of the main interpreter
        // (checked above).
        table.retrace(block, unsafe { Writer::holding_main_gil() }, retrace);
    }
}

/// Whether [`on_reused_block`] may have something to do for `block`: false while recording
/// is disabled and for a block certainly not traced (sampled mode; one load).
#[inline(always)]
pub fn may_be_reused_traced(block: usize) -> bool {
    // No table yet: nothing was ever traced (and no call to create one on this path).
    RECORDING.load(Relaxed) && TABLE.get().is_some_and(|table| table.may_contain(block))
}

/// Whether a block about to be freed (or reallocated) may have a trace ([`on_free`] forgets
/// it, [`on_realloc_start`] takes it out): false while not tracing and, in sampled mode, for
/// a block the presence filter says was not sampled (most of them). Lock-free, and apart from
/// [`on_free`] so that the free hook's common case in sampled mode saves no registers (see
/// [`crate::hooks`]). In exact mode it is true at once: the caller then looks among the
/// [`young`] blocks and in the table. Blocks wait among the young ones in exact mode only
/// (`start()` enables the slots when the interval is 0 and empties them either way), so the
/// filter never hides one.
#[inline(always)]
pub fn may_trace_free(address: usize) -> bool {
    // No table yet: nothing was ever traced, not even among the young blocks (and no call to
    // create one on this path).
    TRACING.load(Relaxed) && TABLE.get().is_some_and(|table| table.may_contain(address))
}

/// A block that [`may_trace_free`] is about to be freed: its trace, if any, is forgotten.
/// `gil_held` for the MEM and OBJ domains, whose blocks may be among the [`young`] ones.
#[inline(always)]
pub fn on_free(address: usize, gil_held: bool) {
    let table = table();
    let young = gil_held && young::holds(address);
    if let Some(guard) = ReentrancyGuard::enter() {
        // SAFETY: a hook of the MEM or OBJ domains (`gil_held`) runs with the GIL held.
        if young && unsafe { young::take(table, address) }.is_some() {
            return;
        }
        if table.may_contain(address) {
            let removed = table.remove(address, hook_writer(guard.thread(), gil_held));
            forget_released(address, removed);
        }
    }
}

/// A block whose trace `removed` was just taken out of the table stops waiting for its
/// stack's traceback, if it was (see [`super::released`]): before the block is freed, so
/// that its address cannot go to another block meanwhile.
#[inline(always)]
fn forget_released(key: usize, removed: Option<Trace>) {
    if let Some(trace) = removed.filter(|trace| trace.traceback == UNKNOWN_TRACEBACK) {
        let table = table();
        let allocated = table
            .is_counting_allocations()
            .then(|| table.weighed(trace.size));
        super::released::forget(key, allocated);
    }
}

/// How a hook changes the totals ([`super::tally`]): serially if it holds the main
/// interpreter's GIL, else with atomic updates. A hook of the MEM or OBJ domains (`gil_held`)
/// holds a GIL; before 3.12 every interpreter shares the one GIL, from 3.12 the thread must
/// be one of the main interpreter's (a sub-interpreter may have a GIL of its own), which
/// costs a read of the thread state, well under the locked instructions it saves.
#[inline(always)]
fn hook_writer(thread: &HookThread, gil_held: bool) -> Writer {
    // SAFETY: reading this thread's state and its interpreter has no effect; `gil_held` says
    // this thread holds a GIL, the version or `is_main` that it is the main interpreter's.
    unsafe {
        if gil_held && (Current::MINOR < 12 || is_main(Current::gil_thread_state(thread, true))) {
            Writer::holding_main_gil()
        } else {
            Writer::ANY
        }
    }
}

/// A block is about to be reallocated: its trace is taken out (see the hook for why).
#[inline(always)]
pub fn on_realloc_start(address: usize, gil_held: bool, scope: &sampler::Scope) -> Option<Trace> {
    if address == 0 || !may_trace_free(address) {
        return None;
    }
    let table = table();
    let young = gil_held && young::holds(address);
    let guard = ReentrancyGuard::within(scope)?;
    // Without the GIL, a sweep may run until the trace is put back (see PUTTING_BACK);
    // raised iff a trace is returned, and `on_realloc_end` lowers it.
    if !gil_held {
        begin_putting_back();
    }
    // SAFETY: as in `on_free`.
    let taken = match young
        .then(|| unsafe { young::take(table, address) })
        .flatten()
    {
        Some(trace) => Some(trace),
        None => {
            let removed = table.remove(address, hook_writer(guard.thread(), gil_held));
            forget_released(address, removed);
            removed
        }
    };
    let Some(mut trace) = taken else {
        if !gil_held {
            end_putting_back();
        }
        return None;
    };
    // `_PyTuple_Resize` reallocates an object's block: a re-attribution still waiting for it
    // goes with its trace (kept if the realloc fails, or while recording is disabled).
    if let Some(traceback) = deferred::take(address) {
        trace.traceback = traceback;
    }
    Some(trace)
}

/// A reallocation finished: `new` is null if it failed, in which case the old block is intact
/// and gets its trace back. Otherwise the new block is traced like a new allocation (with the
/// current traceback, as tracemalloc does), or keeps its old traceback while recording is
/// disabled, since it is still the same live block. When sampling, the new block is a new
/// allocation for the sampler too: recorded if its size crosses the countdown, whether or not
/// the old block was sampled.
///
/// # Safety
/// Called from the realloc hook.
#[inline(always)]
pub unsafe fn on_realloc_end(
    old_address: usize,
    new: usize,
    size: usize,
    old: Option<Trace>,
    gil_held: bool,
    scope: &sampler::Scope,
) {
    let putting_back = !gil_held && old.is_some();
    realloc_end(old_address, new, size, old, gil_held, scope);
    if putting_back {
        end_putting_back();
    }
}

/// [`on_realloc_end`] but for the end of [`PUTTING_BACK`].
///
/// # Safety
/// As [`on_realloc_end`].
#[inline(always)]
unsafe fn realloc_end(
    old_address: usize,
    new: usize,
    size: usize,
    old: Option<Trace>,
    gil_held: bool,
    scope: &sampler::Scope,
) {
    if !TRACING.load(Relaxed) {
        return;
    }
    let Some(guard) = ReentrancyGuard::within(scope) else {
        return;
    };
    if new == 0 {
        if let Some(old) = old {
            put_back(old_address, old);
        }
    } else if RECORDING.load(Relaxed) {
        if scope.keep(size) {
            record_current(guard.thread(), new, size, gil_held);
            if gil_held {
                // `_PyTuple_Resize` creates the object again in the resized block.
                crate::freelist::note_allocated(new);
            }
        }
    } else if let Some(old) = old {
        put_back(new, Trace { size, ..old });
    }
}

/// The table key of a block in the native domain (see [`crate::native`]): its address with
/// the low bit set. Blocks are at least 2-byte aligned, so a key never equals another block's
/// address, and both domains share the table, its locks and its totals.
#[inline(always)]
pub(crate) fn native_key(address: usize) -> usize {
    address | 1
}

/// A block was allocated by an extension's own `malloc` (or `mmap`) call.
///
/// # Safety
/// Called from a native hook with the block just returned by the real allocator.
#[inline(always)]
pub(crate) unsafe fn on_native_alloc(address: usize, size: usize, scope: &sampler::Scope) {
    if !TRACING.load(Relaxed) || !RECORDING.load(Relaxed) || !scope.keep(size) {
        return;
    }
    let Some(guard) = ReentrancyGuard::within(scope) else {
        return;
    };
    record_native(guard.thread(), native_key(address), size);
}

/// # Safety
/// Inside a [`ReentrancyGuard`].
#[inline(always)]
unsafe fn record_native(thread: &HookThread, key: usize, size: usize) {
    match current_traceback(thread, false, crate::native::DOMAIN, Some(key), size) {
        Ok(Some(traceback)) => record(key, Trace { size, traceback }),
        Ok(None) => {}
        Err(OutOfMemory) => {
            count_dropped();
        }
    }
}

/// A block is about to be freed (or unmapped) by an extension: its native trace is taken out,
/// or, if it has none, its domain-0 trace (a `PyMem_RawMalloc` block given back with `free`
/// is freed all the same). Returns the trace removed.
#[inline(always)]
pub(crate) fn on_native_free(address: usize) -> Option<Trace> {
    if address == 0 || !TRACING.load(Relaxed) {
        return None;
    }
    let table = table();
    let _guard = ReentrancyGuard::enter()?;
    let key = native_key(address);
    if table.may_contain(key) {
        if let Some(trace) = table.remove(key, Writer::ANY) {
            forget_released(key, Some(trace));
            return Some(trace);
        }
    }
    if table.may_contain(address) {
        let removed = table.remove(address, Writer::ANY);
        forget_released(address, removed);
    }
    None
}

/// A native reallocation (`realloc`, `mremap`) finished; `old` is what [`on_native_free`]
/// took out. A failed one puts the old trace back; a successful one records the new block
/// with the current traceback (as tracemalloc does for `PyMem_Realloc`), or keeps the old
/// traceback while recording is disabled. With `untracked_too` false, a block that had no
/// trace stays untraced (a file mapping moved by `mremap`).
///
/// # Safety
/// Called from a native hook.
#[inline(always)]
pub(crate) unsafe fn on_native_realloc_end(
    old_address: usize,
    new: Option<usize>,
    size: usize,
    old: Option<Trace>,
    untracked_too: bool,
    scope: &sampler::Scope,
) {
    if !TRACING.load(Relaxed) {
        return;
    }
    let Some(guard) = ReentrancyGuard::within(scope) else {
        return;
    };
    match new {
        None => {
            if let Some(old) = old {
                put_back(native_key(old_address), old);
            }
        }
        Some(_) if old.is_none() && !untracked_too => {}
        Some(new) if RECORDING.load(Relaxed) => {
            if scope.keep(size) {
                record_native(guard.thread(), native_key(new), size);
            }
        }
        Some(new) => {
            if let Some(old) = old {
                put_back(native_key(new), Trace { size, ..old });
            }
        }
    }
}

/// Puts back the trace of what is left of a mapping partly unmapped from its start.
pub(crate) fn on_native_unmap_rest(address: usize, trace: Trace) {
    if !TRACING.load(Relaxed) {
        return;
    }
    if let Some(_guard) = ReentrancyGuard::enter() {
        put_back(native_key(address), trace);
    }
}

/// The traceback to record for a block an extension reports with `PyTraceMalloc_Track`
/// (see [`crate::tracked`]): `Ok(None)` when it is not to be recorded (recording disabled,
/// not sampled, rejected by the trace-time filters), `Err` when out of memory.
///
/// # Safety
/// The calling thread holds the GIL.
pub(crate) unsafe fn tracked_traceback(
    domain: u32,
    size: usize,
) -> std::result::Result<Option<TracebackId>, ()> {
    if !TRACING.load(Relaxed) || !RECORDING.load(Relaxed) {
        return Ok(None);
    }
    let scope = sampler::Scope::enter();
    if !scope.keep(size) {
        return Ok(None);
    }
    let Some(guard) = ReentrancyGuard::within(&scope) else {
        return Ok(None);
    };
    current_traceback(guard.thread(), true, domain, None, size).map_err(|OutOfMemory| {
        count_dropped();
    })
}

/// Records a block an extension tracks in domain 0 (replacing the hook's trace of it, if
/// any); `false` if out of memory.
pub(crate) fn record_tracked(address: usize, trace: Trace) -> bool {
    let Some(guard) = ReentrancyGuard::enter() else {
        return true;
    };
    deferred::forget(address);
    let table = table();
    take_young_if_gil(guard.thread(), table, address);
    let stored = table.insert(address, trace, Writer::ANY);
    if !stored {
        count_dropped();
    }
    stored
}

/// Takes a block out of the [`young`] ones, for a caller that may run without the GIL (an
/// extension's `PyTraceMalloc_Track` and `_Untrack` calls): only a thread holding the main
/// interpreter's GIL may touch the slots, and only such a thread can have put the block there.
///
/// Called inside the reentrancy guard.
fn take_young_if_gil(thread: &HookThread, table: &TraceTable, address: usize) {
    if !young::holds(address) {
        return;
    }
    // SAFETY: reading this thread's state, and its interpreter, has no effect; `take` runs
    // only if this thread holds the main interpreter's GIL (checked), inside the guard.
    unsafe {
        if is_main(Current::gil_thread_state(thread, false)) {
            young::take(table, address);
        }
    }
}

/// Charges a block an extension tracks outside domain 0 (kept in `crate::tracked`'s map),
/// replacing `old`; `false`, counted as dropped, if it cannot be (see
/// [`TraceTable::account_outside`]).
pub(crate) fn account_tracked(domain: u32, old: Option<Trace>, trace: Trace) -> bool {
    let stored = table().account_outside(domain, old, Some(trace));
    if !stored {
        count_dropped();
    }
    stored
}

/// Forgets a block an extension untracks in domain 0.
pub(crate) fn forget_tracked(address: usize) {
    if let Some(guard) = ReentrancyGuard::enter() {
        let table = table();
        take_young_if_gil(guard.thread(), table, address);
        table.remove(address, Writer::ANY);
    }
}

fn check_nframe(nframe: i64) -> Result<usize> {
    if nframe < 1 || nframe > MAX_NFRAME as i64 {
        return Err(Error::InvalidArgument(format!(
            "the number of frames must be in range [1; {MAX_NFRAME}], got {nframe}"
        )));
    }
    Ok(nframe as usize)
}

/// The size of the traced block at `address`, while tracing (the heap walk sizes objects and
/// their buffers by their traced blocks where it can). A block still waiting among the
/// [`young`] ones is found there. Called with the GIL held (the walk's contract).
pub fn traced_size(address: usize) -> Option<usize> {
    if !is_tracing() {
        return None;
    }
    // SAFETY: the heap walk holds the main interpreter's GIL and runs no Python code.
    if let Some(trace) = unsafe { young::get(address) } {
        return Some(trace.size);
    }
    TABLE.get()?.get(address).map(|trace| trace.size)
}

pub fn is_tracing() -> bool {
    TRACING.load(Relaxed)
}

/// How `start()` should sample.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sampling {
    /// Mean bytes between samples; `None` (or 0) for exact tracing, `None` also meaning
    /// "whatever is running" when `start()` is called while tracing.
    pub interval: Option<u64>,
    /// Seed of the sampler's generators; `None` for a fresh one.
    pub seed: Option<u64>,
}

fn check_interval(interval: u64) -> Result<u64> {
    if interval > MAX_INTERVAL {
        return Err(Error::InvalidArgument(format!(
            "the sampling interval must be in range [0; {MAX_INTERVAL}] bytes (0: exact \
             tracing), got {interval}"
        )));
    }
    Ok(interval)
}

/// Whether objects reused from free lists are being re-attributed: tracing, asked to
/// (`start`'s `reattribute`), and this interpreter offers a way ([`crate::freelist::mechanism`]).
pub fn is_reattributing() -> bool {
    is_tracing() && REATTRIBUTING.load(Relaxed)
}

/// The sampling interval of the running session; `None` when exact or not tracing.
pub fn sample_interval() -> Option<u64> {
    if is_tracing() {
        sampler::interval()
    } else {
        None
    }
}

/// Starts tracing with tracebacks of at most `nframe` frames, exactly or sampled. A no-op
/// while tracing, as in tracemalloc (the limit then stays what it was), except that asking
/// for another sampling mode or a seed then is an error rather than silently ignored.
///
/// With `native` (`None` meaning off, or whatever is running), extensions' own `malloc`/`mmap`
/// calls are recorded too, in the native domain (see [`crate::native`]).
///
/// With `tracemalloc_tracing` (the standard module traces already), our hooks go in beneath
/// and above its hooks, and both trace ([`super::alongside`]).
///
/// With `reattribute` (`None` meaning on, or whatever is running), an object that CPython
/// builds in a block taken from one of its free lists moves that block to the object's
/// traceback, as `tracemalloc` does ([`crate::freelist`]). Off, such a block keeps the
/// traceback of its first allocation, and no object creation reaches the tracer: the
/// callback that every object CPython creates otherwise makes is most of what sampled mode
/// costs on a program that allocates little but creates many objects (docs/sampling.md).
pub fn start(
    py: Python<'_>,
    nframe: i64,
    sampling: Sampling,
    native: Option<bool>,
    reattribute: Option<bool>,
    tracemalloc_tracing: bool,
) -> Result<()> {
    let nframe = check_nframe(nframe)?;
    let interval = sampling.interval.map(check_interval).transpose()?;
    if is_tracing() {
        let running = REATTRIBUTE_ASKED.load(Relaxed);
        if reattribute.is_some_and(|r| r != running) {
            let mode = if running { "with" } else { "without" };
            return Err(Error::State(format!(
                "alloctrace is already tracing {mode} re-attribution of reused objects: call \
                 stop() before start() to change reattribute"
            )));
        }
        let running = crate::native::enabled();
        if native.is_some_and(|n| n != running) {
            let mode = if running { "with" } else { "without" };
            return Err(Error::State(format!(
                "alloctrace is already tracing {mode} native allocations: call stop() before \
                 start() to change native"
            )));
        }
        let running = sampler::interval().unwrap_or(0);
        if interval.is_some_and(|i| i != running) || sampling.seed.is_some() {
            let mode = match running {
                0 => "exactly".to_string(),
                r => format!("with sample_interval={r}"),
            };
            return Err(Error::State(format!(
                "alloctrace is already tracing {mode}: call stop() before start() to change \
                 sample_interval or sample_seed"
            )));
        }
        return Ok(());
    }
    // SAFETY: `py` proves the GIL is held; reading the interpreter pointers has no effect.
    let here = unsafe { ffi::PyInterpreterState_Get() };
    if here != unsafe { ffi::PyInterpreterState_Main() } {
        return Err(Error::State(
            "alloctrace can only be started from the main interpreter".into(),
        ));
    }
    register_fork_handlers();
    tracked::clear_with(table(), TraceTable::clear);
    // First, so that running out of memory for it leaves nothing half set up.
    let resolver = Resolver::new(py)?;
    // SAFETY: the GIL is held.
    unsafe {
        deferred::discard();
        young::discard();
    }
    let interval = interval.unwrap_or(0);
    table().set_sampling(interval);
    young::set_enabled(interval == 0);
    sampler::configure(interval, sampling.seed);
    DROPPED.store(0, Relaxed);
    // SAFETY: the GIL is held and no hook is recording yet (TRACING is false), so nothing else
    // borrows these cells.
    unsafe {
        *LIVE.get() = Some(Live {
            interner: Interner::new(),
            scratch: vec![RawFrame::UNKNOWN; nframe],
        });
        *RESOLVER.get() = Some(resolver);
        *LIMIT.get() = nframe;
    }
    super::released::reset(nframe, true);
    // Before anything may read a thread state (a thread's first read keeps what it found).
    // SAFETY: the GIL is held.
    #[cfg(Py_3_12)]
    unsafe {
        capture::thread_state::prepare();
    }
    MAIN_INTERPRETER.store(here.cast(), Relaxed);
    // No allocation was seen before: the stacks may hold trampolines already.
    capture::depth::forget_trampolines();
    super::alongside::reset();
    if tracemalloc_tracing {
        // SAFETY: the GIL is held, the standard module traces, and nothing is installed yet.
        unsafe { super::alongside::start_above()? };
    }
    RECORDING.store(true, Relaxed);
    TRACING.store(true, Relaxed);
    // SAFETY: the GIL is held.
    unsafe {
        hooks::install(interval != 0);
        let reattribute = reattribute.unwrap_or(true);
        REATTRIBUTE_ASKED.store(reattribute, Relaxed);
        REATTRIBUTING.store(reattribute && crate::freelist::install(), Relaxed);
    }
    crate::native::set_enabled(native.unwrap_or(false));
    tracked::enable();
    Ok(())
}

/// Stops tracing and forgets every trace. Hooks still running on other threads only find an
/// empty, still-valid table.
pub fn stop(py: Python<'_>) {
    if !is_tracing() {
        return;
    }
    TRACING.store(false, Relaxed);
    // SAFETY: the GIL is held.
    unsafe {
        // Only what `start` installed: working out how to (a page mapped, a static
        // libpython's copies searched) is not free.
        if REATTRIBUTING.swap(false, Relaxed) {
            crate::freelist::uninstall();
        }
        hooks::uninstall();
    }
    tracked::disable();
    crate::native::set_enabled(false);
    // Before the table is emptied: no thread without the GIL records after it.
    super::released::reset(1, false);
    tracked::clear_with(table(), TraceTable::clear);
    // SAFETY: the GIL is held.
    unsafe {
        deferred::discard();
        young::discard();
    }
    // SAFETY: the GIL is held; hooks on this thread are off (TRACING is false) and no borrow
    // of the cells is live here.
    let (live, resolver) = unsafe { (LIVE.get().take(), RESOLVER.get().take()) };
    release(py, live, resolver);
}

/// Forgets every trace but keeps tracing; `Err(OutOfMemory)`, with nothing forgotten, when
/// the new state cannot be made.
pub fn clear_traces(py: Python<'_>) -> Result<()> {
    if !is_tracing() {
        return Ok(());
    }
    // The new state is built first: building it allocates (a Python string), and what is
    // allocated after the table is emptied would count as traced memory.
    let fresh_resolver = Resolver::new(py)?;
    let fresh_live = Live {
        interner: Interner::new(),
        scratch: vec![RawFrame::UNKNOWN; traceback_limit()],
    };
    // SAFETY: the GIL is held, so no hook is interning concurrently, and nothing between the
    // borrows and the swaps calls Python code.
    let (live, resolver) = unsafe {
        let live = LIVE.get().replace(fresh_live);
        let resolver = RESOLVER.get().replace(fresh_resolver);
        // Before the table is emptied, so that no block recorded with a traceback of the old
        // interner stays in it.
        super::released::reset(traceback_limit(), true);
        tracked::clear_with(table(), TraceTable::clear);
        deferred::discard();
        young::discard();
        DROPPED.store(0, Relaxed);
        (live, resolver)
    };
    release(py, live, resolver);
    Ok(())
}

/// Drops the references the old state held. Last, because dropping a code object can run
/// arbitrary Python code (weakref callbacks), which may call back into alloctrace.
fn release(_py: Python<'_>, live: Option<Live>, resolver: Option<Resolver>) {
    drop(resolver);
    if let Some(mut live) = live {
        for code in live.interner.take_pins() {
            // SAFETY: the GIL is held and each pin is a strong reference we took.
            unsafe { ffi::Py_DECREF(code as *mut ffi::PyObject) };
        }
    }
}

/// Whether a sweep is queued as a pending call.
static SWEEP_SCHEDULED: AtomicBool = AtomicBool::new(false);
/// Set while a sweep runs: releasing code objects can run Python code that reads the traces.
static SWEEPING: AtomicBool = AtomicBool::new(false);
/// Set when a sweep stopped at its budget with work left: the next stack stored schedules the
/// next sweep (see [`sweep_owed`]).
static SWEEP_OWED: AtomicBool = AtomicBool::new(false);

/// Whether a sweep stopped at its budget with work left. The next sweep is scheduled by the
/// next stack stored, not by the sweep itself: CPython runs the pending calls added while it
/// runs pending calls in the same pass (up to 32), so a sweep that scheduled its own
/// continuation ran its slices back to back, one pause as long as all of them.
pub fn sweep_owed() -> bool {
    SWEEP_OWED.load(Relaxed)
}

/// Queues a sweep of dead code objects for the interpreter's next safe point. Called from the
/// interning path of a hook: `Py_AddPendingCall` neither allocates nor needs the GIL.
pub fn schedule_sweep() {
    extern "C" fn run(_: *mut c_void) -> std::os::raw::c_int {
        SWEEP_SCHEDULED.store(false, Relaxed);
        // SAFETY: pending calls run in the main thread with the GIL held, between bytecodes,
        // so no borrow of tracer state is live.
        sweep(unsafe { Python::assume_attached() }, BURY_BUDGET);
        0
    }
    // Not tracing: nothing to sweep (and no interpreter under the interner's Rust tests).
    // During a sweep (a stack stored by what it runs): the condition that asked holds after
    // it, and a call added now would run right after it, in the same pause (see
    // `sweep_owed`).
    if TRACING.load(Relaxed) && !SWEEPING.load(Relaxed) && !SWEEP_SCHEDULED.swap(true, Relaxed) {
        // SAFETY: a plain function and no argument; callable from any thread.
        if unsafe { ffi::Py_AddPendingCall(Some(run), std::ptr::null_mut()) } != 0 {
            SWEEP_SCHEDULED.store(false, Relaxed);
        }
    }
}

/// Releases the code objects only the interner still references, after resolving what their
/// tracebacks need (see [`super::intern`]), all of them: a reading (a snapshot,
/// `get_traced_memory()`) counts a dead code object kept alive by us as traced memory, so it
/// sweeps first, whatever it costs; the sweeps the program did not ask for are bounded
/// ([`BURY_BUDGET`]).
pub fn sweep_dead_code(py: Python<'_>) {
    sweep(py, usize::MAX);
}

/// A sweep that buries at most `bury_budget` dead code objects. Each phase borrows tracer
/// state only between Python calls: resolving allocates (hooks intern meanwhile), releasing
/// runs arbitrary code.
fn sweep(py: Python<'_>, bury_budget: usize) {
    // SAFETY: `py` proves the GIL is held; reading the interpreter pointer has no effect.
    let here = unsafe { ffi::PyInterpreterState_Get() };
    if !is_tracing() || here.cast() != MAIN_INTERPRETER.load(Relaxed) {
        return;
    }
    if SWEEPING.swap(true, Relaxed) {
        return;
    }
    SWEEP_OWED.store(false, Relaxed);
    let began = std::time::Instant::now();
    let began_cpu = thread_cpu_nanos();
    let began_faults = thread_page_faults();
    let freed_before = SWEEP_WORK.stacks_freed.load(Relaxed);
    let mut phases = Phases::new(began_cpu);
    let mut unfinished = collect_tracebacks(py);
    phases.lap(Phase::Collect);
    // Releasing a code object releases the code objects in its constants (a module's
    // functions), which only then become ours alone: sweep again until none is released, or
    // until the budget is spent (then the sweep is owed: see `sweep_owed`).
    let deadline = (bury_budget == BURY_BUDGET).then(|| began + BURY_PAUSE);
    let mut buried = 0;
    'sweep: loop {
        let most = bury_budget - buried;
        if most == 0 {
            unfinished = true;
            break;
        }
        // SAFETY (each block): the main interpreter's GIL is held and no other borrow of the
        // cell is live; the phases are separated so that no borrow spans a Python call.
        let dying = unsafe {
            LIVE.get().as_mut().map(|live| {
                SWEEP_WORK
                    .pins_looked
                    .fetch_add(live.interner.pin_count() as u64, Relaxed);
                live.interner.dying_codes(most)
            })
        };
        let dying = dying.unwrap_or_default();
        phases.lap(Phase::Find);
        let mut released_any = false;
        for chunk in dying.chunks(BURY_CHUNK) {
            // At least one chunk a sweep, so that dead code is buried even when looking for
            // idle tracebacks took the whole pause; the rest stay pinned for the next sweep.
            if buried > 0 && deadline.is_some_and(|at| std::time::Instant::now() >= at) {
                unfinished = true;
                break 'sweep;
            }
            buried += chunk.len();
            released_any |= bury_chunk(py, chunk, &mut phases);
        }
        if !released_any {
            break;
        }
    }
    let took = began.elapsed().as_nanos() as u64;
    let took_cpu = thread_cpu_nanos().saturating_sub(began_cpu);
    SWEEP_WORK.codes_buried.fetch_add(buried as u64, Relaxed);
    let longest = if bury_budget == BURY_BUDGET {
        SWEEP_WORK.most_buried.fetch_max(buried as u64, Relaxed);
        &LONGEST_PENDING
    } else {
        &LONGEST_READING
    };
    longest.offer(SweepFigures {
        wall: took,
        cpu: took_cpu,
        buried: buried as u64,
        freed: SWEEP_WORK.stacks_freed.load(Relaxed) - freed_before,
        phases: phases.spent,
        page_faults: thread_page_faults().saturating_sub(began_faults),
    });
    SWEEPS.fetch_add(1, Relaxed);
    SWEEP_NANOS.fetch_add(took, Relaxed);
    LONGEST_SWEEP_NANOS.fetch_max(took, Relaxed);
    LONGEST_SWEEP_CPU_NANOS.fetch_max(took_cpu, Relaxed);
    for (count, ms) in PAUSES_OVER.iter().zip(PAUSE_THRESHOLDS_MS) {
        if took_cpu > ms * 1_000_000 {
            count.fetch_add(1, Relaxed);
        }
    }
    SWEEPING.store(false, Relaxed);
    if unfinished {
        SWEEP_OWED.store(true, Relaxed);
    }
}

/// Buries `dying` (resolves what their nodes need, rewrites the nodes) and releases the code
/// objects that were still ours alone; returns whether any was released.
fn bury_chunk(py: Python<'_>, dying: &[DyingCode], phases: &mut Phases) -> bool {
    // SAFETY (each block): as in `sweep`; no borrow spans a Python call.
    let burials = unsafe { RESOLVER.get().as_mut().map(|r| r.bury(py, dying)) };
    let (released, unused) = match (burials, unsafe { LIVE.get().as_mut() }) {
        (Some(burials), Some(live)) => unsafe { live.interner.bury(dying, &burials) },
        _ => (Vec::new(), Vec::new()),
    };
    if !unused.is_empty() {
        if let Some(resolver) = unsafe { RESOLVER.get().as_mut() } {
            resolver.release_buried(py, &unused);
        }
    }
    phases.lap(Phase::Bury);
    for &code in &released {
        // SAFETY: the GIL is held and each is a strong reference the interner took.
        unsafe { ffi::Py_DECREF(code as *mut ffi::PyObject) };
    }
    phases.lap(Phase::Release);
    !released.is_empty()
}

/// The parts of a sweep whose CPU time is kept for the longest sweeps (`_sweep_pauses()`),
/// so that a long pause says what it was spent on.
#[derive(Clone, Copy)]
enum Phase {
    /// Looking for idle tracebacks, freeing them and releasing what only they kept.
    Collect = 0,
    /// Looking through the pins for dead code objects.
    Find = 1,
    /// Resolving what dead code objects' nodes need and rewriting the nodes.
    Bury = 2,
    /// Releasing the dead code objects (CPython deallocates them and their constants).
    Release = 3,
}

/// CPU nanoseconds spent in each [`Phase`] of one sweep.
struct Phases {
    spent: [u64; 4],
    since: u64,
}

impl Phases {
    fn new(now: u64) -> Self {
        Phases {
            spent: [0; 4],
            since: now,
        }
    }

    /// Charges the CPU time since the last lap to `phase`.
    fn lap(&mut self, phase: Phase) {
        let now = thread_cpu_nanos();
        self.spent[phase as usize] += now.saturating_sub(self.since);
        self.since = now;
    }
}

/// Sweeps run since the module was loaded, their total and their longest time: what the
/// program waited for them (`_sweep_stats()`, for the soak benchmark and the docs' figures).
static SWEEPS: AtomicU64 = AtomicU64::new(0);
static SWEEP_NANOS: AtomicU64 = AtomicU64::new(0);
static LONGEST_SWEEP_NANOS: AtomicU64 = AtomicU64::new(0);
/// The longest sweep in this thread's CPU time: on a busy machine a sweep's wall time also
/// counts the time other processes ran.
static LONGEST_SWEEP_CPU_NANOS: AtomicU64 = AtomicU64::new(0);

/// One sweep's figures: wall and CPU nanoseconds, code objects buried, tracebacks freed, CPU
/// nanoseconds per [`Phase`], and the page faults it took (the kernel's time in them counts
/// as its CPU time).
#[derive(Clone, Copy)]
pub struct SweepFigures {
    pub wall: u64,
    pub cpu: u64,
    pub buried: u64,
    pub freed: u64,
    pub phases: [u64; 4],
    pub page_faults: u64,
}

/// The longest sweep (in CPU time) of one kind and what it did, so that a long pause can be
/// told apart: a pending call's (bounded) or a reading's (buries every dead code object).
/// Only sweeps write it, one at a time under the GIL; `_sweep_pauses()` reads it under the
/// GIL too.
struct LongestSweep(GilCell<SweepFigures>);

impl LongestSweep {
    const fn new() -> Self {
        LongestSweep(GilCell::new(SweepFigures {
            wall: 0,
            cpu: 0,
            buried: 0,
            freed: 0,
            phases: [0; 4],
            page_faults: 0,
        }))
    }

    /// Keeps this sweep's figures if it is the longest yet.
    fn offer(&self, figures: SweepFigures) {
        // SAFETY: called by a sweep, with the GIL held and no other borrow of the cell live.
        let longest = unsafe { self.0.get() };
        if figures.cpu >= longest.cpu {
            *longest = figures;
        }
    }

    fn get(&self) -> SweepFigures {
        // SAFETY: read with the GIL held (see `offer`).
        unsafe { *self.0.get() }
    }
}

static LONGEST_PENDING: LongestSweep = LongestSweep::new();
static LONGEST_READING: LongestSweep = LongestSweep::new();

/// Sweeps whose CPU time exceeded each of [`PAUSE_THRESHOLDS_MS`]: how often a long pause
/// comes, which the longest alone does not say.
static PAUSES_OVER: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];
pub const PAUSE_THRESHOLDS_MS: [u64; 4] = [1, 2, 5, 10];

/// `(wall ns, CPU ns, code objects buried, tracebacks freed)` of the longest pending-call
/// sweep and of the longest reading's sweep, and the counts of sweeps over each of
/// [`PAUSE_THRESHOLDS_MS`] of CPU.
pub fn sweep_pauses() -> (SweepFigures, SweepFigures, [u64; 4]) {
    (
        LONGEST_PENDING.get(),
        LONGEST_READING.get(),
        std::array::from_fn(|i| PAUSES_OVER[i].load(Relaxed)),
    )
}

/// Page faults this thread has taken (minor and major).
fn thread_page_faults() -> u64 {
    // SAFETY: a zeroed rusage filled by getrusage for the calling thread.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) } != 0 {
        return 0;
    }
    (usage.ru_minflt + usage.ru_majflt) as u64
}

/// This thread's CPU time, in nanoseconds.
fn thread_cpu_nanos() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

/// `(sweeps, total ns, longest ns, longest in CPU ns, live tracebacks, live trie nodes,
/// pinned code objects)`; the counts are 0 when not tracing.
pub fn sweep_stats() -> (u64, u64, u64, u64, usize, usize, usize) {
    // SAFETY: called from Python with the GIL held; no borrow is live.
    let (stacks, nodes, pins) = unsafe { LIVE.get().as_ref() }.map_or((0, 0, 0), |live| {
        (
            live.interner.live_stacks(),
            live.interner.node_count(),
            live.interner.pin_count(),
        )
    });
    (
        SWEEPS.load(Relaxed),
        SWEEP_NANOS.load(Relaxed),
        LONGEST_SWEEP_NANOS.load(Relaxed),
        LONGEST_SWEEP_CPU_NANOS.load(Relaxed),
        stacks,
        nodes,
        pins,
    )
}

/// Tracebacks a sweep looks at, at most: the longest pause it adds (see
/// [`Interner::collect`]; measured in docs/tracer-memory.md).
const COLLECT_BUDGET: usize = 32_768;
/// Tracebacks a sweep frees, at most: freeing one with its nodes costs ~0.9 us, and
/// releasing the resolver's records only it kept (about two a traceback in the churn soak)
/// ~0.5 us each, looking at one ~20 ns. With 2,048 a sweep took 6 ms of CPU in the soak (1.85
/// ms freeing, 2.1 ms releasing 4,316 records).
const FREE_BUDGET: usize = 512;
/// Dead code objects a sweep the program did not ask for (a pending call) buries and
/// releases, at most: ~6 us each (resolving its names and lines, deallocating it and its
/// constants); one that found hundreds at once took milliseconds. The rest wait for the next
/// sweep (see [`sweep_owed`]), or for a reading, which buries them all.
const BURY_BUDGET: usize = 256;
/// Wall time after which a sweep the program did not ask for stops burying: a burial usually
/// costs ~6 us, but some cost several times that (a table of the resolver growing, the
/// allocator returning pages to the system as code objects are freed), and 256 of them were
/// seen to take 5-8 ms of CPU. Checked between chunks of [`BURY_CHUNK`].
const BURY_PAUSE: std::time::Duration = std::time::Duration::from_millis(2);
/// Dead code objects buried between two looks at the clock.
const BURY_CHUNK: usize = 32;

/// What the sweeps did, in all and at most in one (`_sweep_work()`): counts, not times, so
/// that a test can check that the work per sweep stays bounded and the work per unit of
/// program work stays flat on a loaded machine.
struct SweepWork {
    /// Traceback ids looked at, and freed.
    ids_looked: AtomicU64,
    stacks_freed: AtomicU64,
    most_freed: AtomicU64,
    /// Pins looked at for dead code (the table's size at each look), code objects buried, and
    /// the most buried by one sweep the program did not ask for (a reading buries them all).
    pins_looked: AtomicU64,
    codes_buried: AtomicU64,
    most_buried: AtomicU64,
}

static SWEEP_WORK: SweepWork = SweepWork {
    ids_looked: AtomicU64::new(0),
    stacks_freed: AtomicU64::new(0),
    most_freed: AtomicU64::new(0),
    pins_looked: AtomicU64::new(0),
    codes_buried: AtomicU64::new(0),
    most_buried: AtomicU64::new(0),
};

/// `(ids looked at, stacks freed, most freed by one sweep, pins looked at, code objects
/// buried, most buried by one pending-call sweep)` since the module was loaded.
pub fn sweep_work() -> (u64, u64, u64, u64, u64, u64) {
    let w = &SWEEP_WORK;
    (
        w.ids_looked.load(Relaxed),
        w.stacks_freed.load(Relaxed),
        w.most_freed.load(Relaxed),
        w.pins_looked.load(Relaxed),
        w.codes_buried.load(Relaxed),
        w.most_buried.load(Relaxed),
    )
}

/// Hooks running without the GIL that took a trace out of the table and may put it back
/// with its traceback id (a reallocation that fails or while recording is disabled, the
/// rest of a partial `munmap`): while any does, no traceback is freed, since the count that
/// made its id look unused is about to come back. Raised before the trace is taken out.
static PUTTING_BACK: AtomicUsize = AtomicUsize::new(0);

/// Marks the start of a take-out-and-maybe-put-back ([`PUTTING_BACK`]); `end_putting_back`
/// ends it.
#[inline]
pub(crate) fn begin_putting_back() {
    PUTTING_BACK.fetch_add(1, SeqCst);
}

#[inline]
pub(crate) fn end_putting_back() {
    PUTTING_BACK.fetch_sub(1, SeqCst);
}

/// Frees a slice of the interned tracebacks nothing refers to any more, and what only they
/// kept (trie nodes, pins of live code objects, buried records; see [`Interner::collect`]).
/// Returns whether the pass over all tracebacks is unfinished (the caller schedules another
/// sweep).
fn collect_tracebacks(py: Python<'_>) -> bool {
    // Waiting re-attributions name tracebacks whose counters do not count them yet.
    // SAFETY: the GIL is held, outside any hook.
    unsafe { deferred::settle() };
    let table = table();
    // SAFETY: the main interpreter's GIL is held and no other borrow of the cell is live; no
    // Python code runs while it is borrowed.
    let Some(collected) = (unsafe { LIVE.get().as_mut() })
        .filter(|live| live.interner.collect_due())
        .map(|live| {
            // Tracebacks that threads without the GIL record with directly stay (see
            // `released::with_interned`).
            super::released::with_interned(|held| {
                live.interner.collect(
                    COLLECT_BUDGET,
                    FREE_BUDGET,
                    |id| table.traceback_idle(id) && !held(id),
                    || {
                        std::sync::atomic::fence(SeqCst);
                        PUTTING_BACK.load(SeqCst) == 0
                    },
                )
            })
        })
    else {
        return false;
    };
    SWEEP_WORK
        .ids_looked
        .fetch_add(collected.looked as u64, Relaxed);
    SWEEP_WORK
        .stacks_freed
        .fetch_add(collected.freed_stacks as u64, Relaxed);
    SWEEP_WORK
        .most_freed
        .fetch_max(collected.freed_stacks as u64, Relaxed);
    // SAFETY: as above.
    if let Some(resolver) = unsafe { RESOLVER.get().as_mut() } {
        resolver.forget_codes(py, &collected.unpinned);
        resolver.release_buried(py, &collected.freed_tags);
    }
    for &code in &collected.unpinned {
        // SAFETY: the GIL is held and each is a strong reference the interner took; no borrow
        // of tracer state is live (dropping it may run Python code).
        unsafe { ffi::Py_DECREF(code as *mut ffi::PyObject) };
    }
    // A blocked collection is not retried at once: the hook putting a trace back may take a
    // while, and each try looks at a full budget of tracebacks.
    !collected.done && !collected.blocked
}

pub fn traceback_limit() -> usize {
    // SAFETY: called from Python-facing functions only, with the GIL held.
    unsafe { *LIMIT.get() }
}

/// Changes the traceback limit while tracing (or for the next `start()`).
pub fn set_traceback_limit(nframe: i64) -> Result<()> {
    let nframe = check_nframe(nframe)?;
    // SAFETY: the GIL is held; a hook on this thread cannot run while we hold these borrows
    // (no Python call in between).
    unsafe {
        *LIMIT.get() = nframe;
        if let Some(live) = LIVE.get() {
            live.scratch = vec![RawFrame::UNKNOWN; nframe];
        }
    }
    Ok(())
}

pub fn set_recording(on: bool) {
    if on {
        // Allocations made while not recording were not walked (see capture::depth).
        capture::depth::forget_trampolines();
    }
    RECORDING.store(on, Relaxed);
}

pub fn is_recording() -> bool {
    RECORDING.load(Relaxed)
}

/// `(current, peak)` traced bytes; `(0, 0)` when not tracing.
pub fn traced_memory() -> (usize, usize) {
    if is_tracing() {
        table().totals()
    } else {
        (0, 0)
    }
}

/// Blocks left untraced since the traces were last cleared because the tracer was out of
/// memory (see [`DROPPED`]).
pub fn dropped_traces() -> usize {
    DROPPED.load(Relaxed)
}

pub fn reset_peak() {
    if is_tracing() {
        // SAFETY: called from Python with the GIL held, outside any hook.
        unsafe { deferred::settle() };
        table().reset_peak();
    }
}

/// Bytes the tracer itself uses: the table, the tracked-domain map, the interned tracebacks
/// and the resolution caches.
pub fn tracer_memory() -> usize {
    let mut total = table().memory_usage()
        + crate::tracked::memory_usage()
        + deferred::MEMORY_USAGE
        + young::MEMORY_USAGE
        + super::released::memory_usage();
    // SAFETY: the GIL is held and no borrow is live.
    unsafe {
        if let Some(live) = LIVE.get() {
            total += live.interner.memory_usage()
                + live.scratch.capacity() * std::mem::size_of::<RawFrame>();
        }
        if let Some(resolver) = RESOLVER.get() {
            total += resolver.memory_usage();
        }
    }
    total
}

/// A resolved traceback: `(filename index in the resolver, lineno)` per frame, most recent
/// first, and the stack's full depth.
type ResolvedStack = (Vec<(u32, u32)>, u16);

/// Per frame of a [`ResolvedStack`], its function's index in the resolver where known; empty
/// when functions were not asked for.
type ResolvedFunctions = Vec<Option<u32>>;

/// Resolves the given interned tracebacks, and with `functions` each frame's function too
/// (only snapshots record them). Copies the raw frames out of the interner first, because
/// resolving calls Python code, which may allocate and so intern on this thread.
pub(crate) fn resolve_stacks(
    py: Python<'_>,
    ids: &[TracebackId],
    functions: bool,
) -> Result<Vec<(ResolvedStack, ResolvedFunctions)>> {
    let mut out = Vec::new();
    out.try_reserve_exact(ids.len())?;
    let mut frames = Vec::new();
    // Lines first, for all the stacks at once, so that each code object's line table is read
    // once however many of its offsets the stacks use.
    let mut wanted = HashSet::new();
    for &id in ids {
        // SAFETY: the GIL is held; neither borrow outlives this block, which calls no Python.
        let (Some(live), Some(resolver)) = (unsafe { LIVE.get() }, unsafe { RESOLVER.get() })
        else {
            return Ok(Vec::new());
        };
        live.interner
            .frames(id, &mut frames)
            .ok_or(Error::OutOfMemory)?;
        wanted.extend(frames.iter().filter(|frame| resolver.wants_line(frame)));
    }
    if let Some(resolver) = unsafe { RESOLVER.get() } {
        // SAFETY: every live code object named by the live interner is pinned.
        unsafe { resolver.cache_lines(wanted.into_iter().collect()) };
    }
    for &id in ids {
        // SAFETY: the GIL is held; the interner borrow ends before any Python call.
        let total = match unsafe { LIVE.get() } {
            Some(live) => live
                .interner
                .frames(id, &mut frames)
                .ok_or(Error::OutOfMemory)?,
            None => return Ok(Vec::new()),
        };
        // SAFETY: the resolver is only used from here, the sweep and the Python-facing
        // functions; it is not re-entered because resolving runs no code that calls back into
        // alloctrace (it reads attributes of code objects and encodes strings).
        let Some(resolver) = (unsafe { RESOLVER.get() }) else {
            return Ok(Vec::new());
        };
        let mut resolved = Vec::new();
        resolved.try_reserve_exact(frames.len())?;
        let mut names = Vec::new();
        if functions {
            names.try_reserve_exact(frames.len())?;
        }
        for &frame in &frames {
            // SAFETY: every live code object named by the live interner is pinned.
            let (filename, lineno, function) = unsafe { resolver.resolve_with_function(py, frame) };
            resolved.push((filename, lineno));
            if functions {
                names.push(function);
            }
        }
        out.push(((resolved, total), names));
    }
    Ok(out)
}

/// Runs `f` with the resolver (for turning filename indexes into objects or bytes).
pub(crate) fn with_resolver<R>(f: impl FnOnce(&Resolver) -> R) -> Option<R> {
    // SAFETY: the GIL is held by the Python-facing caller and no other borrow is live.
    unsafe { RESOLVER.get().as_ref().map(f) }
}

/// The live traces and the distinct tracebacks they use, with ids densely renumbered.
pub(crate) struct Collected {
    /// `(size, index into stacks)` per live block: domain 0's, then the other domains'.
    pub(crate) traces: Vec<(usize, u32)>,
    /// The domain of each trace after domain 0's (blocks tracked by extensions), in order:
    /// `traces[traces.len() - tracked_domains.len()..]` are theirs.
    tracked_domains: Vec<u32>,
    /// Each live block's address, in the order of `traces` (only when asked for).
    pub(crate) addresses: Vec<usize>,
    /// For the peak: per trace (one per traceback), the blocks it stands for.
    blocks: Option<Vec<u64>>,
    pub(crate) stacks: Vec<(ResolvedStack, ResolvedFunctions)>,
}

impl Collected {
    /// The domain of trace `i`.
    pub(crate) fn domain(&self, i: usize) -> u32 {
        let first_tracked = self.traces.len() - self.tracked_domains.len();
        match i.checked_sub(first_tracked) {
            Some(k) => self.tracked_domains[k],
            None => DEFAULT_DOMAIN,
        }
    }
}

/// Distinct traceback ids in order of first use, each numbered densely: what a snapshot keeps
/// of the interner's ids (their stacks are resolved once each, in that order).
#[derive(Default)]
struct DenseIds {
    index: HashMap<TracebackId, u32>,
    ids: Vec<TracebackId>,
}

impl DenseIds {
    /// The dense number of `id`, numbering it if new; out of memory if it cannot be stored.
    fn number(&mut self, id: TracebackId) -> Result<u32> {
        fallible::map_room_for_one(&mut self.index)?;
        fallible::room_for_one(&mut self.ids)?;
        let ids = &mut self.ids;
        Ok(*self.index.entry(id).or_insert_with(|| {
            ids.push(id);
            ids.len() as u32 - 1
        }))
    }
}

pub(crate) fn collect(py: Python<'_>, functions: bool, addresses: bool) -> Result<Collected> {
    // SAFETY: the GIL is held (`py`), outside any hook.
    unsafe { settle() };
    let mut live = table().collect().ok_or(Error::OutOfMemory)?;
    // Tracked-domain traces go last: `Collected::domain` finds their domains by position.
    let mut tracked = tracked::collect();
    crate::native::split(&mut live, &mut tracked)?;
    let tracked_domains = tracked.iter().map(|&(domain, _, _)| domain).collect();
    live.try_reserve_exact(tracked.len())?;
    live.extend(
        tracked
            .into_iter()
            .map(|(_, address, trace)| (address, trace)),
    );
    let mut out = Collected {
        traces: Vec::new(),
        tracked_domains,
        addresses: Vec::new(),
        blocks: None,
        stacks: Vec::new(),
    };
    if addresses {
        out.addresses.try_reserve_exact(live.len())?;
        out.addresses
            .extend(live.iter().map(|&(address, _)| address));
    }
    out.traces.try_reserve_exact(live.len())?;
    let mut dense = DenseIds::default();
    for (_, trace) in &live {
        out.traces
            .push((trace.size, dense.number(trace.traceback)?));
    }
    drop(live);
    out.stacks = resolve_stacks(py, &dense.ids, functions)?;
    Ok(out)
}

/// What each traceback held in each domain when the traced total last reached its peak (see
/// [`super::peak`]): one aggregate trace per domain and traceback.
pub(crate) fn collect_peak(py: Python<'_>) -> Result<Collected> {
    // Re-attributions made since the peak (any made before it were settled then) change the
    // current values only, as they would have when made.
    // SAFETY: the GIL is held (`py`), outside any hook.
    unsafe { deferred::settle() };
    // SAFETY: the GIL is held and no borrow of the cell is live.
    let interned = unsafe { LIVE.get().as_ref().map_or(0, |live| live.interner.len()) };
    aggregates(py, &table().at_peak(interned))
}

/// One aggregate trace per `(domain, traceback, bytes, units)` row, as the table gives them
/// for the peak and for what was allocated (domain 0's first, as `Collected::domain`
/// expects), with the blocks each stands for.
fn aggregates(py: Python<'_>, rows: &[(u32, TracebackId, u64, u64)]) -> Result<Collected> {
    let mut dense = DenseIds::default();
    let mut traces = fallible::with_capacity(rows.len())?;
    for &(_, traceback, bytes, _) in rows {
        traces.push((bytes as usize, dense.number(traceback)?));
    }
    Ok(Collected {
        traces,
        tracked_domains: rows
            .iter()
            .map(|&(domain, ..)| domain)
            .filter(|&domain| domain != DEFAULT_DOMAIN)
            .collect(),
        addresses: Vec::new(),
        blocks: Some(
            rows.iter()
                .map(|&(.., units)| count_from_units(units))
                .collect(),
        ),
        stacks: resolve_stacks(py, &dense.ids, true)?,
    })
}

/// What was allocated since the last call, per traceback and domain (see
/// [`TraceTable::take_allocated`]): one aggregate trace per domain and traceback, as in a peak.
fn collect_allocated(py: Python<'_>) -> Result<Collected> {
    // Blocks that threads without the GIL recorded under the placeholder move, with their
    // allocations, to their own tracebacks first.
    // SAFETY: the GIL is held (`py`), outside any hook.
    unsafe { settle() };
    // SAFETY: the GIL is held and no borrow of the cell is live.
    let interned = unsafe { LIVE.get().as_ref().map_or(0, |live| live.interner.len()) };
    aggregates(py, &table().take_allocated(interned))
}

/// Starts or stops counting what is allocated per traceback, for the `alloc_*` figures of
/// pushed profiles (see [`take_allocated_snapshot`]). Off, the hooks pay one load of a flag.
pub fn set_counting_allocations(on: bool) {
    table().set_counting_allocations(on);
}

pub fn is_counting_allocations() -> bool {
    table().is_counting_allocations()
}

/// An aggregate snapshot (one trace per traceback and domain, like a peak snapshot) of what
/// was allocated since the previous call, or since counting started
/// ([`set_counting_allocations`]); the counts start again from zero. Estimates when sampling,
/// weighted as the live traces are.
pub fn take_allocated_snapshot(py: Python<'_>) -> Result<Snapshot> {
    if !is_tracing() {
        return Err(Error::State(
            "the tracemalloc module must be tracing memory allocations to take a snapshot".into(),
        ));
    }
    let collected = collect_allocated(py)?;
    build_snapshot(py, collected, None)
}

/// The snapshot of `collected`, its stacks resolved into the snapshot's own tables.
pub(crate) fn build_snapshot(
    py: Python<'_>,
    collected: Collected,
    kinds: Option<crate::analysis::snapshot::Kinds>,
) -> Result<Snapshot> {
    let limit = traceback_limit() as u32;
    let snapshot = with_resolver(|resolver| -> Result<Snapshot> {
        let mut builder = SnapshotBuilder::new(limit);
        builder.sample_interval(sampler::interval());
        let mut filename_ids: HashMap<u32, u32> = HashMap::new();
        // Resolver function index -> builder function id (u32::MAX: not interned yet).
        let mut function_ids: Vec<u32> = Vec::new();
        let mut tracebacks = Vec::new();
        tracebacks.try_reserve_exact(collected.stacks.len())?;
        let mut ids: Vec<FrameId> = Vec::new();
        let mut known = Vec::new();
        for ((frames, total), functions) in &collected.stacks {
            ids.clear();
            ids.try_reserve(frames.len())?;
            for &(filename, lineno) in frames {
                let id = *filename_ids
                    .entry(filename)
                    .or_insert_with(|| builder.filename(&resolver.filename(filename).bytes));
                ids.push(builder.frame(id, lineno));
            }
            let traceback = builder.try_traceback(&ids, Some(u32::from(*total)))?;
            known.clear();
            known.try_reserve(functions.len())?;
            for &f in functions {
                known.push(f.map(|f| {
                    if function_ids.len() <= f as usize {
                        function_ids.resize(f as usize + 1, u32::MAX);
                    }
                    if function_ids[f as usize] == u32::MAX {
                        let function = resolver.function(f);
                        function_ids[f as usize] =
                            builder.function(&function.name, function.first_lineno);
                    }
                    function_ids[f as usize]
                }));
            }
            if known.iter().any(Option::is_some) {
                builder.try_traceback_functions(traceback, &known)?;
            }
            tracebacks.push(traceback);
        }
        builder.try_reserve_traces(collected.traces.len())?;
        match &collected.blocks {
            None => {
                for (i, &(size, stack)) in collected.traces.iter().enumerate() {
                    builder.trace(collected.domain(i), size as u64, tracebacks[stack as usize]);
                }
            }
            Some(blocks) => {
                for (i, (&(size, stack), &n)) in collected.traces.iter().zip(blocks).enumerate() {
                    let traceback = tracebacks[stack as usize];
                    builder.aggregate(collected.domain(i), size as u64, n, traceback);
                }
                builder.aggregates();
            }
        }
        builder.metadata(metadata(py));
        builder.kinds(kinds);
        Ok(builder.finish())
    });
    snapshot.transpose().map(Option::unwrap_or_default)
}

fn metadata(py: Python<'_>) -> Metadata {
    let version = py.version_info();
    // Straight from the sys module's dict: importing `sys` and looking its attribute up would
    // take a list off the free list and leave a fresh name string in CPython's type attribute
    // cache, both traced and charged to the line that took the snapshot.
    // SAFETY: the GIL is held; the name is NUL-terminated; the result is borrowed or null
    // (without an exception set).
    let argv = unsafe { ffi::PySys_GetObject(c"argv".as_ptr()) };
    let argv = if argv.is_null() {
        Vec::new()
    } else {
        // SAFETY: a borrowed, non-null reference the sys module's dict keeps alive.
        unsafe { Bound::from_borrowed_ptr(py, argv) }
            .extract::<Vec<String>>()
            .unwrap_or_default()
    };
    Metadata {
        python_version: Some((version.major, version.minor, version.patch)),
        timestamp: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .ok()
            .map(|d| d.as_secs_f64()),
        pid: Some(std::process::id()),
        argv,
        // Read last, after the traces were collected: as close to them as possible.
        process_memory: ProcessMemory::current().ok(),
        machine: crate::platform::machine::current(),
    }
}

fn register_fork_handlers() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: the handlers are plain functions that only touch process-lifetime statics.
        unsafe {
            libc::pthread_atfork(Some(before_fork), Some(after_fork), Some(after_fork_child));
        }
    });
}

/// Whether `before_fork` took the table's locks (so the matching handler releases them).
static LOCKED_FOR_FORK: AtomicBool = AtomicBool::new(false);

/// Takes every shard lock so that the child never inherits one held mid-update by a thread
/// that does not exist in the child. The guard keeps hooks on this thread (from other fork
/// handlers' allocations) away from the locks we now hold. Hooks on other threads wait for
/// the locks until [`after_fork`] without parking (see [`crate::platform::nopark`]): a thread parked on
/// a shard at the fork left the child a lock whose release went through `parking_lot_core`'s
/// wait queue, locked in the child's copy by that thread, and the child hung in
/// [`after_fork_child`].
extern "C" fn before_fork() {
    let Some(table) = TABLE.get() else {
        return;
    };
    hook_thread::set_in_tracer(true);
    // This module's lock first, as a thread without the GIL takes them.
    super::released::lock_for_fork();
    table.lock_all();
    LOCKED_FOR_FORK.store(true, Relaxed);
}

/// The child also reseeds the sampler, so that it does not sample the same allocations as
/// its parent.
extern "C" fn after_fork_child() {
    after_fork();
    sampler::reseed_after_fork();
}

extern "C" fn after_fork() {
    if LOCKED_FOR_FORK.swap(false, Relaxed) {
        if let Some(table) = TABLE.get() {
            // SAFETY: `before_fork` locked every shard on this (the forking) thread.
            unsafe {
                table.unlock_all();
                super::released::unlock_after_fork();
            }
        }
        hook_thread::set_in_tracer(false);
    }
}

/// An allocation site: filename (surrogatepass UTF-8) and line.
pub type Site = (Box<[u8]>, u32);

/// Where each object was allocated, for retention reports: per address the index of its
/// allocation site (the most recent frame, as `(filename, lineno)`) in the returned table, or
/// `None` where the object's block is not traced.
///
/// Every block is looked up before anything is resolved, because resolving line numbers
/// reads code objects through the C API, which may allocate.
///
/// # Safety
/// The GIL is held and every address is a live object.
pub unsafe fn object_sites(py: Python<'_>, addrs: &[usize]) -> (Vec<Option<u32>>, Vec<Site>) {
    if !is_tracing() {
        return (vec![None; addrs.len()], Vec::new());
    }
    settle();
    let table = table();
    let mut dense = DenseIds::default();
    let per_object: Vec<Option<u32>> = addrs
        .iter()
        .map(|&addr| {
            let trace = table.get(Current::object_block(addr as *mut ffi::PyObject))?;
            dense.number(trace.traceback).ok()
        })
        .collect();
    let stacks = resolve_stacks(py, &dense.ids, false).unwrap_or_default();
    let mut sites: Vec<Site> = Vec::new();
    // The resolver numbers filenames per code object: a comprehension or nested function
    // (its own code object) gets another number for the same file. A site is the file's
    // name and the line, so the numbers are merged by name first.
    let mut files: HashMap<Box<[u8]>, u32> = HashMap::new();
    let mut site_ids: HashMap<(u32, u32), u32> = HashMap::new();
    let stack_site: Vec<Option<u32>> = with_resolver(|resolver| {
        stacks
            .iter()
            .map(|((frames, _), _)| {
                let &(filename, lineno) = frames.first()?;
                let name = &resolver.filename(filename).bytes;
                let file = match files.get(name) {
                    Some(&file) => file,
                    None => {
                        let file = files.len() as u32;
                        files.insert(name.clone(), file);
                        file
                    }
                };
                Some(*site_ids.entry((file, lineno)).or_insert_with(|| {
                    sites.push((name.clone(), lineno));
                    sites.len() as u32 - 1
                }))
            })
            .collect()
    })
    .unwrap_or_default();
    let per_object = per_object
        .into_iter()
        .map(|s| stack_site.get(s? as usize).copied().flatten())
        .collect();
    (per_object, sites)
}
