//! CPython 3.9: frames are `PyFrameObject`s hung from `tstate->frame`; `f_lasti` is already a
//! byte offset; only GC-tracked objects have a pre-header (the GC link).

use pyo3::ffi;

use super::{Interpreter, RawFrame};
use crate::hooks::hook_thread::HookThread;

pub struct Python39;

impl Interpreter for Python39 {
    const MINOR: u8 = 9;

    unsafe fn gil_thread_state(_thread: &HookThread, gil_held: bool) -> *mut ffi::PyThreadState {
        super::gil_holder_if_this_thread(gil_held)
    }

    #[inline(always)]
    unsafe fn walk(tstate: *mut ffi::PyThreadState, out: &mut [RawFrame]) -> (usize, u16) {
        super::walk_frame_objects(tstate, out, 1)
    }

    unsafe fn walk_released(tstate: *mut ffi::PyThreadState, out: &mut [RawFrame]) -> (usize, u16) {
        super::walk_frame_objects_released(tstate, out, 1)
    }

    unsafe fn object_block(obj: *mut ffi::PyObject) -> usize {
        obj as usize - super::preheader_size(obj, 0)
    }

    unsafe fn lines(code: *mut ffi::PyObject, offsets: &[i32], out: &mut Vec<i32>) {
        super::lines::by_lnotab(code, offsets, out)
    }

    unsafe fn line_runs(code: *mut ffi::PyObject, out: &mut Vec<(i32, i32)>) -> Option<()> {
        super::lines::runs_by_lnotab(code, out)
    }
}
