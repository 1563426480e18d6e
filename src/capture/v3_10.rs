//! CPython 3.10: the 3.9 frame objects, but `f_lasti` counts 2-byte code units (and is -1
//! before the first instruction, which `PyCode_Addr2Line` maps to the first line).

use pyo3::ffi;

use super::{Interpreter, RawFrame};
use crate::hooks::hook_thread::HookThread;

pub struct Python310;

impl Interpreter for Python310 {
    const MINOR: u8 = 10;

    unsafe fn gil_thread_state(_thread: &HookThread, gil_held: bool) -> *mut ffi::PyThreadState {
        super::gil_holder_if_this_thread(gil_held)
    }

    #[inline(always)]
    unsafe fn walk(tstate: *mut ffi::PyThreadState, out: &mut [RawFrame]) -> (usize, u16) {
        super::walk_frame_objects(tstate, out, 2)
    }

    unsafe fn walk_released(tstate: *mut ffi::PyThreadState, out: &mut [RawFrame]) -> (usize, u16) {
        super::walk_frame_objects_released(tstate, out, 2)
    }

    unsafe fn object_block(obj: *mut ffi::PyObject) -> usize {
        obj as usize - super::preheader_size(obj, 0)
    }

    unsafe fn lines(code: *mut ffi::PyObject, offsets: &[i32], out: &mut Vec<i32>) {
        super::lines::by_address_ranges(code, offsets, out)
    }

    unsafe fn line_runs(code: *mut ffi::PyObject, out: &mut Vec<(i32, i32)>) -> Option<()> {
        super::lines::runs_by_address_ranges(code, out)
    }
}
