//! The PEP 445 allocator hooks: the hot path.
//!
//! This folder is the hook layer's core: what a hook runs, and nothing it must not (see
//! `docs/design.md`, "Source map"). Beside these hooks: their per-thread state
//! ([`hook_thread`]), sampled mode's countdown ([`sampler`]), the trace table ([`table`]) and
//! its totals and counters ([`tally`], [`peak`]), blocks not yet filed ([`young`]) or
//! allocated without the GIL ([`released`]), traceback interning ([`intern`]), the recording
//! the hooks call ([`tracer`], which also holds start/stop and snapshots), the standard
//! tracemalloc alongside ([`alongside`]) and the memory limit's one comparison
//! ([`memory_limit`]). The hooks' other entry points and the stack reading are the
//! `capture`, `freelist`, `native` and `tracked` folders beside this one.
//!
//! Each hook forwards to the allocator it wrapped, then tells the tracer what happened; in
//! sampled mode the allocation hooks ask the tracer first whether the block is to be recorded
//! (see [`SAMPLED`]). They do the least work possible: no Python API call, no line number, one
//! shard lock (see [`tracer`] for what is recorded).
//!
//! Installation wraps whatever allocators are in place at `start()`. The wrapped allocator is
//! kept in a `Hook` that is never freed: a RAW-domain hook may still be running on another
//! thread (without the GIL) after `stop()` restored the allocators, and it must still find
//! the allocator it forwards to.
//!
//! While the standard `tracemalloc` traces alongside, our hooks sit both above its hooks and
//! beneath them, the ones beneath inert ([`lend_beneath`] when it starts second,
//! [`slip_beneath`] when it was first, [`set_beneath_inert`]; the order of the steps is in
//! [`alongside`]).

pub mod alongside;
pub mod hook_thread;
pub mod intern;
pub mod memory_limit;
pub mod peak;
pub mod released;
pub mod sampler;
pub mod table;
pub mod tally;
pub mod tracer;
pub mod young;

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};

use pyo3::ffi::{self, PyMemAllocatorDomain, PyMemAllocatorEx};

struct Hook {
    original: PyMemAllocatorEx,
    /// The RAW domain may be called without the GIL; MEM and OBJ never are.
    gil_held: bool,
    /// Read by the gated functions only (`gated_malloc` and its kin): forward without
    /// recording. Set on the hook that the standard tracemalloc wraps, once ours wrap it in
    /// turn (see [`crate::hooks::alongside`]).
    inert: AtomicBool,
}

const DOMAINS: [PyMemAllocatorDomain; 3] = [
    PyMemAllocatorDomain::PYMEM_DOMAIN_RAW,
    PyMemAllocatorDomain::PYMEM_DOMAIN_MEM,
    PyMemAllocatorDomain::PYMEM_DOMAIN_OBJ,
];

/// The last two `Hook`s made for each domain, the newer first; one is reused while the
/// allocator it wraps is in place again, so that repeated start/stop cycles do not leak, nor
/// do cycles of the standard tracemalloc starting and stopping between ours and the
/// interpreter's allocator (two allocators to wrap, in turn).
static HOOKS: [[AtomicPtr<Hook>; 2]; 3] =
    [const { [const { AtomicPtr::new(std::ptr::null_mut()) }; 2] }; 3];

/// The hooks the standard tracemalloc wraps while it traces alongside (null: none).
static BENEATH: [AtomicPtr<Hook>; 3] = [const { AtomicPtr::new(std::ptr::null_mut()) }; 3];

/// The hooks of the slipped functions ([`slip_beneath`]), one per domain, set once: the
/// functions find their `Hook` here, since their context is the wrapped allocator's own.
static SLIPPED: [AtomicPtr<Hook>; 3] = [const { AtomicPtr::new(std::ptr::null_mut()) }; 3];

#[inline(always)]
unsafe fn hook<'a>(ctx: *mut c_void) -> &'a Hook {
    &*(ctx as *const Hook)
}

extern "C" fn hook_malloc(ctx: *mut c_void, size: usize) -> *mut c_void {
    // SAFETY: `ctx` is the `Hook` we registered with this function, never freed.
    unsafe {
        let hook = hook(ctx);
        let orig = &hook.original;
        let scope = sampler::Scope::enter();
        let ptr = (orig.malloc.unwrap_unchecked())(orig.ctx, size);
        if !ptr.is_null() {
            tracer::on_alloc(ptr as usize, size, hook.gil_held, &scope);
        }
        ptr
    }
}

extern "C" fn hook_calloc(ctx: *mut c_void, nelem: usize, elsize: usize) -> *mut c_void {
    // SAFETY: `ctx` is the `Hook` we registered with this function, never freed.
    unsafe {
        let hook = hook(ctx);
        let orig = &hook.original;
        let scope = sampler::Scope::enter();
        let ptr = (orig.calloc.unwrap_unchecked())(orig.ctx, nelem, elsize);
        if !ptr.is_null() {
            // The allocator refuses products that overflow, so a non-null block means it fits.
            let size = nelem.wrapping_mul(elsize);
            tracer::on_alloc(ptr as usize, size, hook.gil_held, &scope);
        }
        ptr
    }
}

// Sampled mode's allocation hooks ([`SAMPLED`]). Most allocations are not recorded, so these
// decide before calling the wrapped allocator ([`tracer::will_record`]): one that is not costs a
// thread-local lookup, a few loads and the call, with three registers saved, where the hooks
// above save six and set up a stack frame for the recording inlined in them. The recording is a
// call apart here. Exact mode, where every allocation is recorded, keeps the hooks above: the
// call apart cost it more than it saved sampled mode. Either pair is correct in either mode (a
// RAW-domain hook may still be running one after `start()` installed the other).

extern "C" fn malloc_sampled(ctx: *mut c_void, size: usize) -> *mut c_void {
    // SAFETY: `ctx` is the `Hook` we registered with this function, never freed.
    unsafe {
        let hook = hook(ctx);
        let scope = sampler::Scope::enter();
        if tracer::will_record(size, &scope) {
            return malloc_recorded(hook, size, scope);
        }
        let orig = &hook.original;
        (orig.malloc.unwrap_unchecked())(orig.ctx, size)
    }
}

#[inline(never)]
unsafe fn malloc_recorded(hook: &Hook, size: usize, scope: sampler::Scope) -> *mut c_void {
    let orig = &hook.original;
    let ptr = (orig.malloc.unwrap_unchecked())(orig.ctx, size);
    if !ptr.is_null() {
        tracer::on_recorded_alloc(ptr as usize, size, hook.gil_held, &scope);
    }
    ptr
}

extern "C" fn calloc_sampled(ctx: *mut c_void, nelem: usize, elsize: usize) -> *mut c_void {
    // SAFETY: `ctx` is the `Hook` we registered with this function, never freed.
    unsafe {
        let hook = hook(ctx);
        let scope = sampler::Scope::enter();
        // A product that overflows is refused by the allocator; saturated, it is charged as
        // the largest request.
        if tracer::will_record(nelem.saturating_mul(elsize), &scope) {
            return calloc_recorded(hook, nelem, elsize, scope);
        }
        let orig = &hook.original;
        (orig.calloc.unwrap_unchecked())(orig.ctx, nelem, elsize)
    }
}

#[inline(never)]
unsafe fn calloc_recorded(
    hook: &Hook,
    nelem: usize,
    elsize: usize,
    scope: sampler::Scope,
) -> *mut c_void {
    let orig = &hook.original;
    let ptr = (orig.calloc.unwrap_unchecked())(orig.ctx, nelem, elsize);
    if !ptr.is_null() {
        // The allocator refuses products that overflow, so a non-null block means it fits.
        tracer::on_recorded_alloc(
            ptr as usize,
            nelem.wrapping_mul(elsize),
            hook.gil_held,
            &scope,
        );
    }
    ptr
}

extern "C" fn hook_realloc(ctx: *mut c_void, ptr: *mut c_void, size: usize) -> *mut c_void {
    // SAFETY: `ctx` is the `Hook` we registered with this function, never freed.
    unsafe {
        let hook = hook(ctx);
        let orig = &hook.original;
        // The old trace is removed before the block can be freed by realloc: once freed, another
        // thread may get the same address and record it, and removing afterwards would delete
        // that thread's trace.
        let scope = sampler::Scope::enter();
        let old = tracer::on_realloc_start(ptr as usize, hook.gil_held, &scope);
        let new = (orig.realloc.unwrap_unchecked())(orig.ctx, ptr, size);
        tracer::on_realloc_end(ptr as usize, new as usize, size, old, hook.gil_held, &scope);
        new
    }
}

extern "C" fn hook_free(ctx: *mut c_void, ptr: *mut c_void) {
    // SAFETY: `ctx` is the `Hook` we registered with this function, never freed.
    unsafe {
        let hook = hook(ctx);
        if !ptr.is_null() && tracer::may_trace_free(ptr as usize) {
            return free_traced(hook, ptr);
        }
        let orig = &hook.original;
        (orig.free.unwrap_unchecked())(orig.ctx, ptr)
    }
}

/// The free of a block that may be traced, apart from [`hook_free`]: with the tracer's work
/// inlined, the hook saved six registers and set up a stack frame on every call, while in
/// sampled mode most frees need none of it (the block was not sampled). Apart, that case is
/// a few loads and a jump to the wrapped allocator, and this one is reached by a jump too
/// (`extern "C"` like the hook, so that the compiler makes the call a jump).
#[inline(never)]
unsafe extern "C" fn free_traced(hook: &Hook, ptr: *mut c_void) {
    // Forget before freeing, for the same reason as in realloc.
    tracer::on_free(ptr as usize, hook.gil_held);
    let orig = &hook.original;
    (orig.free.unwrap_unchecked())(orig.ctx, ptr)
}

// The hooks the standard tracemalloc wraps while it traces alongside. Until ours are in place
// above its hooks they record, as the hooks above do (either pair will do); then they only
// forward, so that the blocks tracemalloc allocates for its own tables are not counted (and
// a block allocated through both layers is recorded once). A scope is entered all the same:
// native mode must not see the interpreter's allocations as the extension's own.

extern "C" fn gated_malloc(ctx: *mut c_void, size: usize) -> *mut c_void {
    // SAFETY: `ctx` is the `Hook` we registered with this function, never freed.
    unsafe {
        let hook = hook(ctx);
        if !hook.inert.load(Ordering::Acquire) {
            return hook_malloc(ctx, size);
        }
        let _scope = sampler::Scope::enter();
        let orig = &hook.original;
        (orig.malloc.unwrap_unchecked())(orig.ctx, size)
    }
}

extern "C" fn gated_calloc(ctx: *mut c_void, nelem: usize, elsize: usize) -> *mut c_void {
    // SAFETY: `ctx` is the `Hook` we registered with this function, never freed.
    unsafe {
        let hook = hook(ctx);
        if !hook.inert.load(Ordering::Acquire) {
            return hook_calloc(ctx, nelem, elsize);
        }
        let _scope = sampler::Scope::enter();
        let orig = &hook.original;
        (orig.calloc.unwrap_unchecked())(orig.ctx, nelem, elsize)
    }
}

extern "C" fn gated_realloc(ctx: *mut c_void, ptr: *mut c_void, size: usize) -> *mut c_void {
    // SAFETY: `ctx` is the `Hook` we registered with this function, never freed.
    unsafe {
        let hook = hook(ctx);
        if !hook.inert.load(Ordering::Acquire) {
            return hook_realloc(ctx, ptr, size);
        }
        let _scope = sampler::Scope::enter();
        let orig = &hook.original;
        (orig.realloc.unwrap_unchecked())(orig.ctx, ptr, size)
    }
}

extern "C" fn gated_free(ctx: *mut c_void, ptr: *mut c_void) {
    // SAFETY: `ctx` is the `Hook` we registered with this function, never freed.
    unsafe {
        let hook = hook(ctx);
        if !hook.inert.load(Ordering::Acquire) {
            return hook_free(ctx, ptr);
        }
        let orig = &hook.original;
        (orig.free.unwrap_unchecked())(orig.ctx, ptr)
    }
}

// The gated functions' twins for the reverse order (alloctrace started while tracemalloc
// traces, [`slip_beneath`]): written into the allocator that tracemalloc keeps to put back at
// its stop, beside the context already there, so they find their `Hook` in `SLIPPED[D]`, one
// per domain, rather than in their context argument.

/// # Safety
/// `SLIPPED[D]` is set: these functions are written only after it is, and it never changes.
#[inline(always)]
unsafe fn slipped<const D: usize>() -> *mut c_void {
    SLIPPED[D].load(Ordering::Acquire).cast()
}

extern "C" fn slipped_malloc<const D: usize>(_ctx: *mut c_void, size: usize) -> *mut c_void {
    // SAFETY: see `slipped`.
    unsafe { gated_malloc(slipped::<D>(), size) }
}

extern "C" fn slipped_calloc<const D: usize>(
    _ctx: *mut c_void,
    nelem: usize,
    elsize: usize,
) -> *mut c_void {
    // SAFETY: see `slipped`.
    unsafe { gated_calloc(slipped::<D>(), nelem, elsize) }
}

extern "C" fn slipped_realloc<const D: usize>(
    _ctx: *mut c_void,
    ptr: *mut c_void,
    size: usize,
) -> *mut c_void {
    // SAFETY: see `slipped`.
    unsafe { gated_realloc(slipped::<D>(), ptr, size) }
}

extern "C" fn slipped_free<const D: usize>(_ctx: *mut c_void, ptr: *mut c_void) {
    // SAFETY: see `slipped`.
    unsafe { gated_free(slipped::<D>(), ptr) }
}

/// The slipped functions of domain `i` (an index into [`DOMAINS`]), as words.
fn slipped_functions(i: usize) -> [usize; 4] {
    fn words<const D: usize>() -> [usize; 4] {
        [
            slipped_malloc::<D> as Malloc as usize,
            slipped_calloc::<D> as Calloc as usize,
            slipped_realloc::<D> as Realloc as usize,
            slipped_free::<D> as Free as usize,
        ]
    }
    match i {
        0 => words::<0>(),
        1 => words::<1>(),
        _ => words::<2>(),
    }
}

/// Function identity by address: our hooks are plain functions of this one library (the
/// slipped ones one instance per domain), so each has a single address.
fn address<F: Copy>(f: Option<F>) -> usize {
    match f {
        // SAFETY: `F` is always one of the allocator function-pointer types.
        Some(f) => unsafe { std::mem::transmute_copy::<F, usize>(&f) },
        None => 0,
    }
}

type Malloc = extern "C" fn(*mut c_void, usize) -> *mut c_void;
type Calloc = extern "C" fn(*mut c_void, usize, usize) -> *mut c_void;
type Realloc = extern "C" fn(*mut c_void, *mut c_void, usize) -> *mut c_void;
type Free = extern "C" fn(*mut c_void, *mut c_void);

/// The allocation hooks of one mode; realloc and free are the same in both.
#[derive(Clone, Copy)]
struct Allocating {
    malloc: Malloc,
    calloc: Calloc,
}

const EXACT: Allocating = Allocating {
    malloc: hook_malloc,
    calloc: hook_calloc,
};

const SAMPLED: Allocating = Allocating {
    malloc: malloc_sampled,
    calloc: calloc_sampled,
};

fn is_ours(allocator: &PyMemAllocatorEx) -> bool {
    let malloc = address(allocator.malloc);
    [EXACT, SAMPLED]
        .iter()
        .any(|hooks| malloc == address(Some(hooks.malloc)))
        || malloc == address(Some(gated_malloc as Malloc))
        || slipped_domain(allocator).is_some()
}

/// The domain whose slipped functions `allocator` has, if it has some.
fn slipped_domain(allocator: &PyMemAllocatorEx) -> Option<usize> {
    let malloc = address(allocator.malloc);
    (0..DOMAINS.len()).find(|&i| malloc == slipped_functions(i)[0])
}

/// The `Hook` behind one of our allocators: its context, or for the slipped functions (whose
/// context is the wrapped allocator's) `SLIPPED`.
fn hook_of(ours: &PyMemAllocatorEx) -> *mut Hook {
    match slipped_domain(ours) {
        Some(i) => SLIPPED[i].load(Ordering::Acquire),
        None => ours.ctx.cast(),
    }
}

fn allocator(hook: *mut Hook, hooks: Allocating) -> PyMemAllocatorEx {
    PyMemAllocatorEx {
        ctx: hook.cast(),
        malloc: Some(hooks.malloc),
        calloc: Some(hooks.calloc),
        realloc: Some(hook_realloc),
        free: Some(hook_free),
    }
}

fn gated(hook: *mut Hook) -> PyMemAllocatorEx {
    PyMemAllocatorEx {
        ctx: hook.cast(),
        malloc: Some(gated_malloc),
        calloc: Some(gated_calloc),
        realloc: Some(gated_realloc),
        free: Some(gated_free),
    }
}

/// A `Hook` wrapping `original` for `domain`: one of the last two made for it if one wraps
/// the same allocator, else a new one (never freed; see the module docs).
unsafe fn hook_for(domain: usize, original: &PyMemAllocatorEx) -> *mut Hook {
    let [newer, older] = &HOOKS[domain];
    for slot in [newer, older] {
        let hook = slot.load(Ordering::Acquire);
        if !hook.is_null() && same_allocator(&(*hook).original, original) {
            return hook;
        }
    }
    let hook = Box::into_raw(Box::new(Hook {
        original: *original,
        gil_held: !matches!(DOMAINS[domain], PyMemAllocatorDomain::PYMEM_DOMAIN_RAW),
        inert: AtomicBool::new(false),
    }));
    older.store(newer.load(Ordering::Acquire), Ordering::Release);
    newer.store(hook, Ordering::Release);
    hook
}

/// The allocator in place for `domain`.
unsafe fn current(domain: PyMemAllocatorDomain) -> PyMemAllocatorEx {
    let mut current = std::mem::zeroed::<PyMemAllocatorEx>();
    ffi::PyMem_GetAllocator(domain, &mut current);
    current
}

/// Installs the hooks on the three domains, those of sampled mode if `sampling`. A domain
/// whose current allocator is already our hook (left in place by an earlier `stop()`, see
/// [`uninstall`], or the one the standard tracemalloc wrapped and put back) keeps its `Hook`,
/// with this mode's functions.
///
/// # Safety
/// The GIL is held.
pub unsafe fn install(sampling: bool) {
    let hooks = if sampling { SAMPLED } else { EXACT };
    for (i, domain) in DOMAINS.into_iter().enumerate() {
        let current = current(domain);
        if is_ours(&current) {
            if address(current.malloc) != address(Some(hooks.malloc)) {
                ffi::PyMem_SetAllocator(domain, &mut allocator(hook_of(&current), hooks));
            }
            continue;
        }
        let hook = hook_for(i, &current);
        ffi::PyMem_SetAllocator(domain, &mut allocator(hook, hooks));
    }
}

/// Restores the wrapped allocators where our hook is the outermost one. Where someone
/// installed another hook over ours, ours stays in the chain (inert, since the tracer is off)
/// rather than cutting that other hook out.
///
/// # Safety
/// The GIL is held.
pub unsafe fn uninstall() {
    for domain in DOMAINS {
        let current = current(domain);
        if is_ours(&current) {
            // SAFETY: behind our functions there is always one of our `Hook`s.
            let mut original = (*hook_of(&current)).original;
            ffi::PyMem_SetAllocator(domain, &mut original);
        }
    }
}

/// Before the standard tracemalloc wraps the allocators: our hooks, outermost on every
/// domain, are swapped for their gated versions (recording still, see `gated_malloc`), which
/// it will find and wrap. `false`, changing nothing, if some domain's outermost hook is not
/// ours: tracemalloc would wrap that other hook, and ours beneath would count its tables.
///
/// # Safety
/// The GIL is held.
pub unsafe fn lend_beneath() -> bool {
    let currents = DOMAINS.map(|domain| current(domain));
    if !currents.iter().all(is_ours) {
        return false;
    }
    for ((domain, current), beneath) in DOMAINS.into_iter().zip(currents).zip(&BENEATH) {
        let hook = hook_of(&current);
        (*hook).inert.store(false, Ordering::Release);
        beneath.store(hook, Ordering::Release);
        ffi::PyMem_SetAllocator(domain, &mut gated(hook));
    }
    true
}

/// The reverse order: alloctrace starts while the standard tracemalloc traces, whose stop will
/// put back the allocators it found. tracemalloc installs its three hooks with the addresses
/// of those saved allocators as their contexts (`mem`, `raw` and `obj`, in that order in one
/// struct, in every version 3.9-3.13), and its hooks and its own tables call through them.
/// Into each go our slipped functions in place of the allocator's own, inert, with its context
/// left as it is: each function pointer is one aligned word, written whole, so a RAW-domain
/// call on another thread reads the old function or ours, and either works with the context
/// it finds. tracemalloc's stop then puts ours back, recording again ([`set_beneath_inert`]),
/// as [`lend_beneath`]'s are in the other order. The caller then installs our usual hooks
/// above tracemalloc's ([`install`]).
///
/// `false`, with nothing changed, if the allocators in place do not have that shape (another
/// tool's hook over tracemalloc's), or if the slipped functions, made for one allocator per
/// domain, would have to wrap another one (possible only once another tool's hooks came and
/// went between tracemalloc's sessions).
///
/// # Safety
/// The GIL is held, and the standard tracemalloc traces.
pub unsafe fn slip_beneath() -> bool {
    let currents = DOMAINS.map(|domain| current(domain));
    let [raw, mem, obj] = &currents;
    let size = std::mem::size_of::<PyMemAllocatorEx>();
    let shaped = !currents.iter().any(is_ours)
        && !mem.ctx.is_null()
        && raw.ctx as usize == mem.ctx as usize + size
        && obj.ctx as usize == mem.ctx as usize + 2 * size
        && address(mem.malloc) == address(obj.malloc)
        && address(mem.free) == address(obj.free);
    if !shaped {
        return false;
    }
    let saved = currents.map(|current| current.ctx.cast::<PyMemAllocatorEx>());
    // Per domain: the allocator a slipped function is to wrap, or `None` where the one saved
    // is ours already (an earlier start while this tracemalloc traced, or its start while we
    // traced). Decided for all three before anything is written.
    let mut plan = [None; 3];
    for (i, &saved) in saved.iter().enumerate() {
        let original = std::ptr::read(saved);
        if is_ours(&original) {
            continue;
        }
        let there = SLIPPED[i].load(Ordering::Acquire);
        if !there.is_null() && !same_allocator(&(*there).original, &original) {
            return false;
        }
        plan[i] = Some(original);
    }
    for (i, (&saved, original)) in saved.iter().zip(plan).enumerate() {
        let Some(original) = original else {
            BENEATH[i].store(hook_of(&std::ptr::read(saved)), Ordering::Release);
            continue;
        };
        if SLIPPED[i].load(Ordering::Acquire).is_null() {
            SLIPPED[i].store(hook_for(i, &original), Ordering::Release);
        }
        BENEATH[i].store(SLIPPED[i].load(Ordering::Acquire), Ordering::Release);
        // SAFETY: `saved` is tracemalloc's allocator for this domain, five aligned words
        // (context, then the four functions) that its hooks read one at a time.
        let words = saved.cast::<AtomicUsize>();
        for (f, function) in slipped_functions(i).into_iter().enumerate() {
            (*words.add(1 + f)).store(function, Ordering::Release);
        }
    }
    set_beneath_inert(true);
    true
}

/// Whether the hooks lent by [`lend_beneath`] only forward (`true`, once ours are installed
/// above the standard module's) or record (`false`, before it restores them at its stop).
///
/// # Safety
/// The GIL is held.
pub unsafe fn set_beneath_inert(inert: bool) {
    for beneath in &BENEATH {
        let hook = beneath.load(Ordering::Acquire);
        if !hook.is_null() {
            (*hook).inert.store(inert, Ordering::Release);
        }
    }
}

/// Whether every domain's outermost allocator is one of our hooks.
///
/// # Safety
/// The GIL is held.
pub unsafe fn outermost() -> bool {
    DOMAINS.into_iter().all(|domain| is_ours(&current(domain)))
}

fn same_allocator(a: &PyMemAllocatorEx, b: &PyMemAllocatorEx) -> bool {
    a.ctx == b.ctx
        && address(a.malloc) == address(b.malloc)
        && address(a.calloc) == address(b.calloc)
        && address(a.realloc) == address(b.realloc)
        && address(a.free) == address(b.free)
}
