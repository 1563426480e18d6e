//! CPython 3.12: as 3.11, plus shim frames owned by the C stack (always incomplete), a
//! thread-local current thread state that is non-null only while this thread holds the GIL,
//! and a pre-header for managed weak references too.

use pyo3::ffi;

use super::{layout, read_ptr, Interpreter, RawFrame};
use crate::hooks::hook_thread::HookThread;

pub struct Python312;

/// `Py_TPFLAGS_MANAGED_DICT | Py_TPFLAGS_MANAGED_WEAKREF` (3.12).
const PREHEADER_FLAGS: std::os::raw::c_ulong = (1 << 4) | (1 << 3);

impl Interpreter for Python312 {
    const MINOR: u8 = 12;

    #[inline(always)]
    unsafe fn gil_thread_state(thread: &HookThread, _gil_held: bool) -> *mut ffi::PyThreadState {
        // The thread-local current state is set only while this thread holds the GIL.
        super::thread_state::current(thread)
    }

    #[inline(always)]
    unsafe fn walk(tstate: *mut ffi::PyThreadState, out: &mut [RawFrame]) -> (usize, u16) {
        let cframe = read_ptr(tstate.cast(), layout::TSTATE_CFRAME);
        if cframe.is_null() {
            return (0, 0);
        }
        let frame = read_ptr(cframe, layout::CFRAME_CURRENT_FRAME);
        super::walk_interpreter_frames(frame, out, true, super::depth::Counter::read(tstate))
    }

    unsafe fn walk_released(tstate: *mut ffi::PyThreadState, out: &mut [RawFrame]) -> (usize, u16) {
        let cframe = read_ptr(tstate.cast(), layout::TSTATE_CFRAME);
        if cframe.is_null() {
            return (0, 0);
        }
        let frame = read_ptr(cframe, layout::CFRAME_CURRENT_FRAME);
        super::walk_and_count(frame, out, true, super::depth::Counter::NONE)
    }

    unsafe fn object_block(obj: *mut ffi::PyObject) -> usize {
        obj as usize - super::preheader_size(obj, PREHEADER_FLAGS)
    }

    unsafe fn lines(code: *mut ffi::PyObject, offsets: &[i32], out: &mut Vec<i32>) {
        super::lines::by_address_ranges(code, offsets, out)
    }

    unsafe fn line_runs(code: *mut ffi::PyObject, out: &mut Vec<(i32, i32)>) -> Option<()> {
        super::lines::runs_by_address_ranges(code, out)
    }
}
