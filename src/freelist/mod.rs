//! Re-attributing objects that CPython takes from its free lists.
//!
//! Lists, dicts, tuples, floats (and more, per version) are recycled through free lists: a
//! new object may reuse the block of a dead one without calling the allocator, so a PEP 445
//! hook never sees it, and the block keeps the traceback of its first allocation. The standard
//! module re-attributes such a block when the object is created, through a call CPython makes
//! from `_Py_NewReference`; this module gets the same call, per version:
//!
//! - 3.13: the public `PyRefTracer` slot ([`reftracer`]), chained to whatever tracer was
//!   installed before us.
//! - 3.9–3.12 (shared libpython): no public hook. `_Py_NewReference` calls
//!   `_PyTraceMalloc_NewReference` only while tracemalloc's own tracing flag is set, and that
//!   flag has many other readers (`tracemalloc.is_tracing()`, `PyTraceMalloc_Track`,
//!   finalization). So instead of setting it, [`patch`] rewrites the two operands of
//!   `_Py_NewReference` itself: the flag load reads a word that is always 1, and the call goes
//!   to us. Nothing else in the interpreter sees a difference.
//!
//!   A libpython linked statically with link-time optimisation (Debian's and Ubuntu's
//!   `/usr/bin/python3.11`) has `_Py_NewReference` copied into some 200 callers: on 3.11 and
//!   3.12 [`inlined`] finds every copy and [`patch`] rewrites the same two operands in each.
//!
//! Where none applies, [`mechanism`] is `None` and reused blocks keep their first traceback;
//! see docs/freelists.md.
//!
//! The call comes for every object created, not only reused ones. Most objects were just
//! allocated by this very thread, with the same stack, and need nothing: the allocation hook
//! notes the last block it recorded while holding the GIL ([`note_allocated`]), and an object
//! in that block costs one comparison here.

use std::ffi::c_int;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use pyo3::ffi;

use crate::capture::{Current, Interpreter};

pub(crate) mod deferred;
// Plain code analysis, tested on every build; used by `patch` on 3.11 and 3.12.
#[cfg_attr(any(not(Py_3_11), Py_3_13), allow(dead_code))]
mod inlined;
#[cfg(not(Py_3_13))]
mod patch;
#[cfg(Py_3_13)]
mod reftracer;

#[cfg(not(Py_3_13))]
use patch as active;
#[cfg(Py_3_13)]
use reftracer as active;

/// The block the allocation hooks last saw allocated by a thread holding the GIL (0: none, or
/// already claimed by its object). Only threads holding the GIL read or write it, so it acts
/// as a per-thread value without a thread-local lookup; a sub-interpreter with its own GIL
/// (3.12+) may race on it, which costs at most a needless table lookup (two threads never
/// hold the same block).
static JUST_ALLOCATED: AtomicUsize = AtomicUsize::new(0);

/// Called by the allocation hooks (GIL held) for each block they allocate.
#[inline(always)]
pub fn note_allocated(address: usize) {
    JUST_ALLOCATED.store(address, Relaxed);
}

/// Whether `block` is the one just allocated (claiming it, so that a later reuse of the same
/// block from a free list is not mistaken for it).
#[inline(always)]
fn claim_just_allocated(block: usize) -> bool {
    if JUST_ALLOCATED.load(Relaxed) == block {
        JUST_ALLOCATED.store(0, Relaxed);
        true
    } else {
        false
    }
}

/// An object is being created (`_Py_NewReference`), with the GIL held. Returns 0, what the
/// interpreter expects of its tracemalloc call and of a `PyRefTracer`.
///
/// The checks that dismiss most objects (just allocated; in sampled mode, not sampled) are
/// inlined into the caller and the rest is a call apart, so the caller saves one register
/// instead of seven (in sampled mode, a quarter of the 52 instructions an object cost here).
///
/// # Safety
/// `op` is the object being initialised: its type is set, and the GIL is held.
#[inline(always)]
unsafe fn on_new_object(op: *mut ffi::PyObject) -> c_int {
    if !crate::hooks::tracer::is_tracing() {
        return 0;
    }
    let block = Current::object_block(op);
    if claim_just_allocated(block) || !crate::hooks::tracer::may_be_reused_traced(block) {
        return 0;
    }
    reused(block)
}

/// The part of [`on_new_object`] for a block that may be traced, out of line.
#[inline(never)]
unsafe fn reused(block: usize) -> c_int {
    crate::hooks::tracer::on_reused_block(block);
    0
}

/// Starts receiving object creations (from `start()`, GIL held). `false` if this interpreter
/// offers no way (see [`mechanism`]).
///
/// # Safety
/// The GIL is held.
pub unsafe fn install() -> bool {
    JUST_ALLOCATED.store(0, Relaxed);
    active::install()
}

/// Stops receiving them (from `stop()`, GIL held), giving back what [`install`] took.
///
/// # Safety
/// The GIL is held.
pub unsafe fn uninstall() {
    active::uninstall()
}

/// The standard tracemalloc started or stopped alongside (see [`crate::hooks::alongside`]): on 3.13
/// it took the `PyRefTracer` slot for its own tracer, or emptied it, and ours goes back in,
/// chained to whatever the slot holds now. On 3.9–3.12 nothing moved: the patched call
/// forwards to the standard module by itself while its flag is set.
///
/// # Safety
/// The GIL is held, and [`install`] succeeded for the tracing session.
pub unsafe fn reclaim() {
    #[cfg(Py_3_13)]
    active::install();
}

/// How this interpreter lets the tracer see object creations: `"reftracer"` (3.13),
/// `"patched"` (3.9–3.12 with the expected `_Py_NewReference`, or 3.11–3.12 with its copies
/// all found in a static libpython), or `None` if it cannot (reused
/// blocks then keep their first traceback). Probes without changing anything.
pub fn mechanism() -> Option<&'static str> {
    active::available().then_some(active::NAME)
}
