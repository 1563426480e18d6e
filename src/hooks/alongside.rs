//! Tracing alongside the standard `tracemalloc`, started while alloctrace traces.
//!
//! Code under `alloctrace run` (or `ALLOCTRACE=`) may call `tracemalloc.start()` itself: test
//! suites that check their own tracemalloc support do, and so do debugging endpoints. Both
//! tracers then see every allocation, each with its own answers, as if the other were absent:
//!
//! - **Order of the hooks.** tracemalloc allocates its own tables through the allocator it
//!   wraps, so ours must not be beneath its hooks recording, or those tables would be charged
//!   to the program's lines. The standard module wraps whatever is in place when it starts,
//!   and puts that back when it stops, so (with the GIL held throughout):
//!   1. [`before_start`]: our hooks, outermost, are swapped for gated versions of themselves
//!      (`hooks::lend_beneath`), which still record;
//!   2. `tracemalloc.start()` wraps them;
//!   3. [`after_start`]: our usual hooks go in above tracemalloc's, and the gated ones beneath
//!      turn inert (forward only). A block allocated through both layers is recorded once
//!      (the layer beneath is nested, and nested hooks never record), and at no moment is
//!      an allocation seen by neither.
//!
//!   On `tracemalloc.stop()` the steps run backwards: [`before_stop`] makes the gated hooks
//!   record again, tracemalloc puts them back, [`after_stop`] swaps them for the usual ones.
//! - **Objects from free lists** are re-attributed in both tables: on 3.9–3.12 the patched
//!   `_Py_NewReference` also calls the standard module's function while its flag is set
//!   (`freelist::patch`); on 3.13 `tracemalloc.start()` takes the one `PyRefTracer` slot, and
//!   [`after_start`] chains ours in front of its tracer again, as [`after_stop`] reinstalls
//!   ours in the slot its stop empties.
//! - **`PyTraceMalloc_Track`/`Untrack`** (numpy's array data), which alloctrace redirects, are
//!   passed on to CPython's functions too ([`tracemalloc_traces_too`]).
//!
//! The Python package calls these around the standard module's `start` and `stop` (it wraps
//! `_tracemalloc.start` and `_tracemalloc.stop`).
//!
//! - **The reverse order**, alloctrace started while tracemalloc traces (`python -X
//!   tracemalloc`, `PYTHONTRACEMALLOC`, a program that started it first): tracemalloc's stop
//!   will put back the allocators it found, which would cut hooks merely installed above its
//!   own out of the chain. So [`start_above`] first writes inert functions of ours (the gated
//!   ones' twins) into the allocators tracemalloc keeps to put back (`hooks::slip_beneath`),
//!   and then our usual hooks go in above tracemalloc's: the same layers as in the first
//!   order, and the same steps at tracemalloc's stop.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use crate::error::{Error, Result};
use crate::hooks::{self, sampler, tracer};

/// Set from [`after_start`] to [`after_stop`] (and so left set if tracemalloc is stopped
/// another way, at interpreter exit: CPython's functions then do nothing).
static TRACEMALLOC_TRACES_TOO: AtomicBool = AtomicBool::new(false);

/// Whether the standard module traces alongside: tracked blocks are passed on to it.
pub fn tracemalloc_traces_too() -> bool {
    TRACEMALLOC_TRACES_TOO.load(Relaxed)
}

/// Step 1, before `tracemalloc.start()` (only while alloctrace traces and it does not).
///
/// # Safety
/// The GIL is held.
pub unsafe fn before_start() -> Result<()> {
    if hooks::lend_beneath() {
        Ok(())
    } else {
        Err(Error::State(
            "tracemalloc cannot start alongside alloctrace: another allocator hook was \
             installed over alloctrace's since it started (stop alloctrace, or that other \
             tool, first)"
                .into(),
        ))
    }
}

/// Step 3, after `tracemalloc.start()` returned or raised. If it installed nothing (it
/// raised), our usual hooks simply replace the gated ones.
///
/// # Safety
/// The GIL is held, and [`before_start`] succeeded.
pub unsafe fn after_start() {
    let started = !hooks::outermost();
    hooks::install(sampler::interval().is_some());
    if started {
        hooks::set_beneath_inert(true);
        TRACEMALLOC_TRACES_TOO.store(true, Relaxed);
        if tracer::is_reattributing() {
            crate::freelist::reclaim();
        }
    }
}

/// `start()` while the standard tracemalloc traces, before our hooks are installed (which
/// then wrap tracemalloc's): inert hooks of ours go beneath its hooks (see the module docs).
///
/// # Safety
/// The GIL is held, the standard tracemalloc traces, and alloctrace is starting.
pub unsafe fn start_above() -> Result<()> {
    if !hooks::slip_beneath() {
        return Err(Error::State(
            "alloctrace cannot start while tracemalloc traces here: the allocator hooks in \
             place are not tracemalloc's alone (another tool's hook over them?); call \
             tracemalloc.stop() first, or stop that tool"
                .into(),
        ));
    }
    TRACEMALLOC_TRACES_TOO.store(true, Relaxed);
    Ok(())
}

/// Before `tracemalloc.stop()`: `true` if tracemalloc traces alongside, and [`after_stop`]
/// is to be called after it.
///
/// # Safety
/// The GIL is held.
pub unsafe fn before_stop() -> bool {
    if !tracer::is_tracing() || !TRACEMALLOC_TRACES_TOO.load(Relaxed) {
        return false;
    }
    hooks::set_beneath_inert(false);
    true
}

/// After `tracemalloc.stop()` (which put the gated hooks back, recording).
///
/// # Safety
/// The GIL is held, and [`before_stop`] returned `true`.
pub unsafe fn after_stop() {
    TRACEMALLOC_TRACES_TOO.store(false, Relaxed);
    hooks::install(sampler::interval().is_some());
    if tracer::is_reattributing() {
        crate::freelist::reclaim();
    }
}

/// A fresh tracing session: whatever tracemalloc did before is not alongside it.
pub fn reset() {
    TRACEMALLOC_TRACES_TOO.store(false, Relaxed);
}
