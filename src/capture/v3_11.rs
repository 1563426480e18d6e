//! CPython 3.11: frames are `_PyInterpreterFrame`s reached through `tstate->cframe`, with
//! `prev_instr` pointing at the last instruction run; objects with a managed `__dict__` carry
//! two extra pointers before the GC link.

use pyo3::ffi;

use super::{layout, read_ptr, Interpreter, RawFrame};
use crate::hooks::hook_thread::HookThread;

pub struct Python311;

/// `Py_TPFLAGS_MANAGED_DICT` (3.11).
const MANAGED_DICT: std::os::raw::c_ulong = 1 << 4;

impl Interpreter for Python311 {
    const MINOR: u8 = 11;

    unsafe fn gil_thread_state(_thread: &HookThread, gil_held: bool) -> *mut ffi::PyThreadState {
        super::gil_holder_if_this_thread(gil_held)
    }

    #[inline(always)]
    unsafe fn walk(tstate: *mut ffi::PyThreadState, out: &mut [RawFrame]) -> (usize, u16) {
        let cframe = read_ptr(tstate.cast(), layout::TSTATE_CFRAME);
        if cframe.is_null() {
            return (0, 0);
        }
        let frame = read_ptr(cframe, layout::CFRAME_CURRENT_FRAME);
        super::walk_interpreter_frames(frame, out, false, super::depth::Counter::read(tstate))
    }

    unsafe fn walk_released(tstate: *mut ffi::PyThreadState, out: &mut [RawFrame]) -> (usize, u16) {
        let cframe = read_ptr(tstate.cast(), layout::TSTATE_CFRAME);
        if cframe.is_null() {
            return (0, 0);
        }
        let frame = read_ptr(cframe, layout::CFRAME_CURRENT_FRAME);
        super::walk_and_count(frame, out, false, super::depth::Counter::NONE)
    }

    unsafe fn object_block(obj: *mut ffi::PyObject) -> usize {
        obj as usize - super::preheader_size(obj, MANAGED_DICT)
    }

    unsafe fn lines(code: *mut ffi::PyObject, offsets: &[i32], out: &mut Vec<i32>) {
        super::lines::by_address_ranges(code, offsets, out)
    }

    unsafe fn line_runs(code: *mut ffi::PyObject, out: &mut Vec<(i32, i32)>) -> Option<()> {
        super::lines::runs_by_address_ranges(code, out)
    }
}
