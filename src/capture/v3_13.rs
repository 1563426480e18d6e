//! CPython 3.13: the current frame hangs directly from `tstate->current_frame`, the code slot
//! is `f_executable`, and `instr_ptr` points at the instruction being run.

use std::ffi::c_void;

use pyo3::ffi;

use super::{layout, read_ptr, Interpreter, RawFrame};

pub struct Python313;

/// `Py_TPFLAGS_MANAGED_DICT | Py_TPFLAGS_MANAGED_WEAKREF` (3.13).
const PREHEADER_FLAGS: std::os::raw::c_ulong = (1 << 4) | (1 << 3);

extern "C" {
    fn PyThreadState_GetUnchecked() -> *mut ffi::PyThreadState;
}

unsafe fn is_incomplete(frame: *mut c_void) -> bool {
    *(frame.cast::<u8>().add(layout::IFRAME_OWNER)) == layout::OWNED_BY_CSTACK
        || super::before_first_traceable(frame)
}

impl Interpreter for Python313 {
    const MINOR: u8 = 13;

    unsafe fn gil_thread_state() -> *mut ffi::PyThreadState {
        PyThreadState_GetUnchecked()
    }

    unsafe fn walk(tstate: *mut ffi::PyThreadState, out: &mut [RawFrame]) -> (usize, u16) {
        let frame = read_ptr(tstate.cast(), layout::TSTATE_CURRENT_FRAME);
        super::walk_interpreter_frames(frame, out, is_incomplete)
    }

    unsafe fn object_block(obj: *mut ffi::PyObject) -> usize {
        obj as usize - super::preheader_size(obj, PREHEADER_FLAGS)
    }
}
