//! CPython 3.13: the current frame hangs directly from `tstate->current_frame`, the code slot
//! is `f_executable`, and `instr_ptr` points at the instruction being run.

use pyo3::ffi;

use super::{layout, read_ptr, Interpreter, RawFrame};
use crate::hooks::hook_thread::HookThread;

pub struct Python313;

/// `Py_TPFLAGS_MANAGED_DICT | Py_TPFLAGS_MANAGED_WEAKREF` (3.13).
const PREHEADER_FLAGS: std::os::raw::c_ulong = (1 << 4) | (1 << 3);

impl Interpreter for Python313 {
    const MINOR: u8 = 13;

    #[inline(always)]
    unsafe fn gil_thread_state(thread: &HookThread, _gil_held: bool) -> *mut ffi::PyThreadState {
        // The thread-local current state is set only while this thread holds the GIL.
        super::thread_state::current(thread)
    }

    #[inline(always)]
    unsafe fn walk(tstate: *mut ffi::PyThreadState, out: &mut [RawFrame]) -> (usize, u16) {
        let frame = read_ptr(tstate.cast(), layout::TSTATE_CURRENT_FRAME);
        super::walk_interpreter_frames(frame, out, true, super::depth::Counter::read(tstate))
    }

    unsafe fn walk_released(tstate: *mut ffi::PyThreadState, out: &mut [RawFrame]) -> (usize, u16) {
        let frame = read_ptr(tstate.cast(), layout::TSTATE_CURRENT_FRAME);
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
