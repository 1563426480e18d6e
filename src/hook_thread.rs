//! What each thread keeps for the allocation hooks, in one thread-local.
//!
//! In a shared library every thread-local lookup is a call into the dynamic loader
//! (`__tls_get_addr`, about a dozen instructions). An allocating hook needs the sampler's
//! nesting depth and countdown ([`crate::sampler`]) and, when it records, the tracer's
//! reentrancy flag ([`crate::tracer`]). With the two in separate thread-locals every traced
//! allocation paid two lookups; here they share one, and the hook's [`crate::sampler::Scope`]
//! carries it to the tracer.
//!
//! Const-initialised and without a destructor, so touching it never allocates and it stays
//! readable while the thread exits.

use std::cell::Cell;

use crate::sampler;

pub struct HookThread {
    /// Set while this thread is inside the tracer, so nothing the tracer does is traced and no
    /// hook re-enters tracer state it already holds (e.g. a shard lock held across `fork()`).
    pub(crate) in_tracer: Cell<bool>,
    pub(crate) sampler: sampler::State,
    /// Where this thread's interpreter keeps its current thread state (3.12 and later; see
    /// [`crate::capture::thread_state`]).
    #[cfg(Py_3_12)]
    pub(crate) tstate_slot: Cell<usize>,
}

thread_local! {
    static THIS: HookThread = const {
        HookThread {
            in_tracer: Cell::new(false),
            sampler: sampler::State::new(),
            #[cfg(Py_3_12)]
            tstate_slot: Cell::new(crate::capture::thread_state::NOT_LOOKED_UP),
        }
    };
}

/// This thread's state, or null if it cannot be reached (never expected of a const
/// thread-local without a destructor, but a hook must not panic). The pointer stays valid for
/// as long as the thread runs, and must not leave it.
#[inline(always)]
pub(crate) fn this() -> *const HookThread {
    THIS.try_with(|t| t as *const HookThread)
        .unwrap_or(std::ptr::null())
}

/// Marks this thread as inside the tracer, or no longer, outside any hook's guard (the fork
/// handlers hold the table's locks across `fork()`).
pub(crate) fn set_in_tracer(inside: bool) {
    let thread = this();
    if !thread.is_null() {
        // SAFETY: this thread's own state.
        unsafe { (*thread).in_tracer.set(inside) };
    }
}
