//! CPython 3.13: object creations through the public `PyRefTracer` slot.
//!
//! The slot holds one tracer. We keep the one installed before us and pass it every event
//! (creations and destructions), so that it keeps working while we trace. On `stop()` the
//! slot goes back to that tracer only if it still holds ours: whoever replaced us keeps the
//! slot. Someone who replaced us without chaining (the standard `tracemalloc.start()` does
//! so) would end our re-attribution, so the package wraps that function and puts ours back
//! in front ([`super::reclaim`]); someone who chained to us keeps calling [`tracer`] after our
//! `stop()`, which then only forwards.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering::Relaxed};

use pyo3::ffi;

pub const NAME: &str = "reftracer";

/// `PyRefTracerEvent`.
const CREATE: c_int = 0;

type RefTracer = unsafe extern "C" fn(*mut ffi::PyObject, c_int, *mut c_void) -> c_int;

extern "C" {
    fn PyRefTracer_SetTracer(tracer: Option<RefTracer>, data: *mut c_void) -> c_int;
    fn PyRefTracer_GetTracer(data: *mut *mut c_void) -> Option<RefTracer>;
}

/// The tracer that held the slot before ours (0: none) and its data. Written with the GIL
/// held, before our tracer can be called; never cleared, since a tracer that chained to ours
/// may keep calling it.
static PREVIOUS: AtomicUsize = AtomicUsize::new(0);
static PREVIOUS_DATA: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

unsafe extern "C" fn tracer(op: *mut ffi::PyObject, event: c_int, _data: *mut c_void) -> c_int {
    if PREVIOUS.load(Relaxed) != 0 {
        return chained(op, event);
    }
    if event == CREATE {
        return super::on_new_object(op);
    }
    0
}

/// A tracer held the slot before ours: it sees every event after we have.
#[cold]
#[inline(never)]
unsafe fn chained(op: *mut ffi::PyObject, event: c_int) -> c_int {
    if event == CREATE {
        super::on_new_object(op);
    }
    // SAFETY: a non-zero PREVIOUS is a `RefTracer` we read from the slot.
    std::mem::transmute::<usize, RefTracer>(PREVIOUS.load(Relaxed))(
        op,
        event,
        PREVIOUS_DATA.load(Relaxed),
    )
}

fn ours() -> usize {
    tracer as RefTracer as usize
}

pub fn available() -> bool {
    true
}

pub unsafe fn install() -> bool {
    let mut data = std::ptr::null_mut();
    let current = PyRefTracer_GetTracer(&mut data).map_or(0, |f| f as usize);
    if current == ours() {
        return true;
    }
    PREVIOUS.store(current, Relaxed);
    PREVIOUS_DATA.store(data, Relaxed);
    PyRefTracer_SetTracer(Some(tracer), std::ptr::null_mut()) == 0
}

pub unsafe fn uninstall() {
    let mut data = std::ptr::null_mut();
    let current = PyRefTracer_GetTracer(&mut data).map_or(0, |f| f as usize);
    if current != ours() {
        return;
    }
    let previous = match PREVIOUS.load(Relaxed) {
        0 => None,
        // SAFETY: as in `tracer`.
        previous => Some(std::mem::transmute::<usize, RefTracer>(previous)),
    };
    PyRefTracer_SetTracer(previous, PREVIOUS_DATA.load(Relaxed));
}
