//! The PEP 445 allocator hooks: the hot path.
//!
//! Each hook forwards to the allocator it wrapped, then tells the tracer what happened; in
//! sampled mode the allocation hooks ask the tracer first whether the block is to be recorded
//! (see [`SAMPLED`]). They do the least work possible: no Python API call, no line number, one
//! shard lock (see [`crate::tracer`] for what is recorded).
//!
//! Installation wraps whatever allocators are in place at `start()`. The wrapped allocator is
//! kept in a `Hook` that is never freed: a RAW-domain hook may still be running on another
//! thread (without the GIL) after `stop()` restored the allocators, and it must still find
//! the allocator it forwards to.
//!
//! While the standard `tracemalloc` traces alongside, our hooks sit both above its hooks and
//! beneath them, the ones beneath inert ([`lend_beneath`], [`set_beneath_inert`]; the order
//! of the steps is in [`crate::alongside`]).

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};

use pyo3::ffi::{self, PyMemAllocatorDomain, PyMemAllocatorEx};

use crate::{sampler, tracer};

struct Hook {
    original: PyMemAllocatorEx,
    /// The RAW domain may be called without the GIL; MEM and OBJ never are.
    gil_held: bool,
    /// Read by the gated functions only (`gated_malloc` and its kin): forward without
    /// recording. Set on the hook that the standard tracemalloc wraps, once ours wrap it in
    /// turn (see [`crate::alongside`]).
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

/// Function identity by address: our hooks are plain non-generic functions of this one
/// library, so each has a single address.
fn address<F: Copy>(f: Option<F>) -> usize {
    match f {
        // SAFETY: `F` is always one of the allocator function-pointer types.
        Some(f) => unsafe { std::mem::transmute_copy::<F, usize>(&f) },
        None => 0,
    }
}

type Malloc = extern "C" fn(*mut c_void, usize) -> *mut c_void;
type Calloc = extern "C" fn(*mut c_void, usize, usize) -> *mut c_void;

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
                ffi::PyMem_SetAllocator(domain, &mut allocator(current.ctx.cast(), hooks));
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
            // SAFETY: the context of our functions is always one of our `Hook`s.
            let mut original = (*current.ctx.cast::<Hook>()).original;
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
        let hook = current.ctx.cast::<Hook>();
        (*hook).inert.store(false, Ordering::Release);
        beneath.store(hook, Ordering::Release);
        ffi::PyMem_SetAllocator(domain, &mut gated(hook));
    }
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
