//! The pyo3 layer of `alloctrace._native`: argument conversion, exception mapping and class
//! wrappers. Logic lives in the plain-Rust modules; what is here only translates.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::error::Error;

pub mod heap_walk;
pub mod memory_limit;
pub mod objects;
pub mod retention;
pub mod signal_disposition;
pub mod sigterm_retry;
pub mod site_reports;
pub mod snapshot;
pub mod strings;
pub mod tracer;

pyo3::create_exception!(
    alloctrace,
    SnapshotFormatError,
    PyValueError,
    "A file is not a readable alloctrace snapshot: truncated, corrupted, of another format or \
     of an unsupported format version. The message names the file and the problem."
);

impl From<Error> for PyErr {
    fn from(err: Error) -> PyErr {
        Python::attach(|py| raised(py, err))
    }
}

/// The exception for `err`, made now with the interpreter's own functions, which raise
/// `MemoryError` when they cannot allocate. pyo3's lazily made exceptions build their
/// arguments when raised and panic if that allocation fails (`PyObject pointer is null`),
/// and a panic there, while the panic itself is being turned into an exception, aborts the
/// process: an error path has to survive the allocation failure it may be reporting.
fn raised(py: Python<'_>, err: Error) -> PyErr {
    use pyo3::ffi;

    let msg = err.to_string();
    // SAFETY: plain C API calls with the GIL held; every new reference is checked for NULL
    // (an exception is then set) and released once the exception holds what it needs.
    unsafe {
        let kind: *mut ffi::PyObject = match &err {
            Error::InvalidArgument(_) => ffi::PyExc_ValueError,
            Error::WrongType(_) => ffi::PyExc_TypeError,
            Error::State(_) => ffi::PyExc_RuntimeError,
            Error::OutOfMemory => {
                ffi::PyErr_NoMemory();
                return fetched(py);
            }
            // Only reached if a caller lost the handler's exception; Ctrl-C's is the likely one.
            Error::Interrupted => {
                ffi::PyErr_SetNone(ffi::PyExc_KeyboardInterrupt);
                return fetched(py);
            }
            Error::Format { .. } => py.get_type::<SnapshotFormatError>().as_ptr(),
            Error::Io { .. } => ffi::PyExc_OSError,
        };
        let text = new_str(&msg);
        if text.is_null() {
            return fetched(py);
        }
        let value = match &err {
            Error::Io { path, source, .. } if source.raw_os_error().is_some() => {
                // OSError(errno, message, filename) picks the subclass (FileNotFoundError...).
                let errno = ffi::PyLong_FromLong(source.raw_os_error().unwrap_or(0).into());
                let filename = new_str(&path.display().to_string());
                let args = if errno.is_null() || filename.is_null() {
                    std::ptr::null_mut()
                } else {
                    ffi::PyTuple_Pack(3, errno, text, filename)
                };
                ffi::Py_XDECREF(errno);
                ffi::Py_XDECREF(filename);
                ffi::Py_DECREF(text);
                if args.is_null() {
                    return fetched(py);
                }
                args
            }
            _ => text,
        };
        ffi::PyErr_SetObject(kind, value);
        ffi::Py_DECREF(value);
    }
    fetched(py)
}

/// A new `str` from UTF-8 text (NULL with an exception set when it cannot be made).
unsafe fn new_str(text: &str) -> *mut pyo3::ffi::PyObject {
    pyo3::ffi::PyUnicode_FromStringAndSize(
        text.as_ptr().cast(),
        text.len() as pyo3::ffi::Py_ssize_t,
    )
}

/// A path argument (`str`, `bytes` or `os.PathLike`), converted as `open()` converts it.
/// pyo3's own conversion of a `PathBuf` argument reports a failure through a message it
/// formats with an allocation that panics when none can be had; this raises the interpreter's
/// exception (`MemoryError`, `TypeError`) instead.
pub(crate) fn path_arg(arg: &Bound<'_, PyAny>) -> PyResult<std::path::PathBuf> {
    use pyo3::ffi;
    use std::os::unix::ffi::OsStrExt;

    let mut converted: *mut ffi::PyObject = std::ptr::null_mut();
    // SAFETY: the GIL is held (`arg`); on success `converted` is a new `bytes` reference,
    // read while held and then released.
    unsafe {
        if ffi::PyUnicode_FSConverter(arg.as_ptr(), (&raw mut converted).cast()) == 0
            || converted.is_null()
        {
            return Err(fetched(arg.py()));
        }
        let data = ffi::PyBytes_AsString(converted);
        let len = ffi::PyBytes_Size(converted);
        let path = if data.is_null() || len < 0 {
            None
        } else {
            let bytes = std::slice::from_raw_parts(data.cast::<u8>(), len as usize);
            Some(std::path::PathBuf::from(std::ffi::OsStr::from_bytes(bytes)))
        };
        ffi::Py_DECREF(converted);
        path.ok_or_else(|| fetched(arg.py()))
    }
}

/// The exception just set; `MemoryError` if setting it failed without one.
fn fetched(py: Python<'_>) -> PyErr {
    PyErr::take(py).unwrap_or_else(|| {
        // SAFETY: the GIL is held; PyErr_NoMemory sets the preallocated MemoryError.
        unsafe { pyo3::ffi::PyErr_NoMemory() };
        PyErr::fetch(py)
    })
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // The reserve behind `MemoryError` on small allocations (see `allocator`); if it cannot
    // be mapped now, the first guarded operation tries again.
    crate::allocator::arm();
    crate::intern::prepare_names(m.py());
    m.add(
        "SnapshotFormatError",
        m.py().get_type::<SnapshotFormatError>(),
    )?;
    retention::register(m)?;
    snapshot::register(m)?;
    tracer::register(m)?;
    heap_walk::register(m)?;
    sigterm_retry::register(m)?;
    signal_disposition::register(m)?;
    memory_limit::register(m)?;
    Ok(())
}
