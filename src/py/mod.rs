//! The pyo3 layer of `alloctrace._native`: argument conversion, exception mapping and class
//! wrappers. Logic lives in the plain-Rust modules; what is here only translates.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::error::Error;

pub mod bootstrap_page;
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
pub mod traces;

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

/// An exception of type `T` with message `msg`, made now as [`raised`] makes them: pyo3's
/// `T::new_err(msg)` would make the message's `str` only when the exception is raised, and
/// panic there (`PyObject pointer is null`) if that allocation fails. Here the failure is the
/// `MemoryError` it is.
pub(crate) fn error<T: pyo3::PyTypeInfo>(msg: impl AsRef<str>) -> PyErr {
    Python::attach(|py| {
        let msg = msg.as_ref();
        // SAFETY: the GIL is held; the new reference is checked for NULL (an exception is
        // then set) and released once the exception holds it.
        unsafe {
            let text = new_str(msg);
            if !text.is_null() {
                pyo3::ffi::PyErr_SetObject(T::type_object_raw(py).cast(), text);
                pyo3::ffi::Py_DECREF(text);
            }
        }
        fetched(py)
    })
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
    crate::platform::allocator::arm();
    crate::hooks::intern::prepare_names(m.py());
    crate::hooks::intern::set_strings(crate::hooks::intern::Strings {
        str_bytes: strings::str_bytes,
        bytes_str: strings::bytes_str,
    });
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
    bootstrap_page::register(m)?;
    Ok(())
}

/// A function's result converted with the interpreter's own functions, each checked: pyo3's
/// conversions of ints, floats, strs and tuples panic (`PyObject pointer is null`) when the
/// object cannot be allocated, where `MemoryError` is the answer (issue 61).
pub(crate) struct Checked<T>(pub T);

/// `(rss, anon, file, shmem, peak_rss)` in bytes, as Python sees a process's memory.
pub(crate) type MemoryFigures = (u64, u64, u64, u64, u64);

/// What [`Checked`] converts.
pub(crate) trait ToChecked {
    fn to_checked<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>>;
}

/// `ptr`, a new reference or NULL with an exception set.
fn owned(py: Python<'_>, ptr: *mut pyo3::ffi::PyObject) -> PyResult<Bound<'_, PyAny>> {
    if ptr.is_null() {
        Err(fetched(py))
    } else {
        // SAFETY: a new, non-NULL reference handed over to the Bound.
        Ok(unsafe { Bound::from_owned_ptr(py, ptr) })
    }
}

impl ToChecked for u64 {
    fn to_checked<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        // SAFETY: the GIL is held (`py`).
        owned(py, unsafe { pyo3::ffi::PyLong_FromUnsignedLongLong(*self) })
    }
}

impl ToChecked for usize {
    fn to_checked<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        (*self as u64).to_checked(py)
    }
}

impl ToChecked for u32 {
    fn to_checked<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        u64::from(*self).to_checked(py)
    }
}

impl ToChecked for String {
    fn to_checked<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        // SAFETY: the GIL is held (`py`).
        owned(py, unsafe { new_str(self) })
    }
}

impl<T: ToChecked> ToChecked for Option<T> {
    fn to_checked<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        match self {
            Some(v) => v.to_checked(py),
            None => Ok(py.None().into_bound(py)),
        }
    }
}

/// A tuple of `items`, made and filled with checked calls.
fn checked_tuple<'py>(py: Python<'py>, items: &[&dyn ToChecked]) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: the GIL is held; the tuple is new and each slot is set once with a new reference
    // (PyTuple_SET_ITEM steals it); on failure the partly filled tuple is released (its empty
    // slots are NULL, which tuple deallocation skips).
    unsafe {
        let tuple = owned(
            py,
            pyo3::ffi::PyTuple_New(items.len() as pyo3::ffi::Py_ssize_t),
        )?;
        for (i, item) in items.iter().enumerate() {
            let value = item.to_checked(py)?;
            pyo3::ffi::PyTuple_SET_ITEM(
                tuple.as_ptr(),
                i as pyo3::ffi::Py_ssize_t,
                value.into_ptr(),
            );
        }
        Ok(tuple)
    }
}

impl<A: ToChecked, B: ToChecked> ToChecked for (A, B) {
    fn to_checked<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        checked_tuple(py, &[&self.0, &self.1])
    }
}

impl<A: ToChecked, B: ToChecked, C: ToChecked> ToChecked for (A, B, C) {
    fn to_checked<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        checked_tuple(py, &[&self.0, &self.1, &self.2])
    }
}

impl<A: ToChecked, B: ToChecked, C: ToChecked, D: ToChecked, E: ToChecked> ToChecked
    for (A, B, C, D, E)
{
    fn to_checked<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        checked_tuple(py, &[&self.0, &self.1, &self.2, &self.3, &self.4])
    }
}

impl<'py, T: ToChecked> IntoPyObject<'py> for Checked<T> {
    type Target = PyAny;
    type Output = Bound<'py, PyAny>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.0.to_checked(py)
    }
}

impl ToChecked for Py<PyAny> {
    fn to_checked<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(self.clone_ref(py).into_bound(py))
    }
}

impl ToChecked for u8 {
    fn to_checked<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        u64::from(*self).to_checked(py)
    }
}

impl ToChecked for f64 {
    fn to_checked<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        // SAFETY: the GIL is held (`py`).
        owned(py, unsafe { pyo3::ffi::PyFloat_FromDouble(*self) })
    }
}

impl ToChecked for Vec<String> {
    fn to_checked<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        // SAFETY: as for `checked_tuple`: a new list, each slot set once with a new reference.
        unsafe {
            let list = owned(
                py,
                pyo3::ffi::PyList_New(self.len() as pyo3::ffi::Py_ssize_t),
            )?;
            for (i, item) in self.iter().enumerate() {
                let value = item.to_checked(py)?;
                pyo3::ffi::PyList_SET_ITEM(
                    list.as_ptr(),
                    i as pyo3::ffi::Py_ssize_t,
                    value.into_ptr(),
                );
            }
            Ok(list)
        }
    }
}

/// A dict of `items` (str keys), made with checked calls.
pub(crate) fn checked_dict<'py>(
    py: Python<'py>,
    items: &[(&str, &dyn ToChecked)],
) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: the GIL is held; every new reference is checked, and PyDict_SetItem takes its
    // own references to key and value.
    unsafe {
        let dict = owned(py, pyo3::ffi::PyDict_New())?;
        for (key, value) in items {
            let key = owned(py, new_str(key))?;
            let value = value.to_checked(py)?;
            if pyo3::ffi::PyDict_SetItem(dict.as_ptr(), key.as_ptr(), value.as_ptr()) != 0 {
                return Err(fetched(py));
            }
        }
        Ok(dict)
    }
}
