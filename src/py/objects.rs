//! Python objects made so that running out of memory raises `MemoryError`.
//!
//! pyo3's own constructors (`PyTuple::new`, `PyString::new`, integer and tuple
//! `into_pyobject`, `PyList::empty`) panic when CPython returns NULL, and a panic while memory
//! is exhausted ends in an abort (the panic machinery allocates too). The converters that
//! build results whose size grows with the data (statistics rows, raw traces, frames) use
//! these instead: each checks CPython's result and hands its `MemoryError` back as a `PyErr`.

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple};

/// A new reference from CPython, or the exception it set.
fn owned<'py>(py: Python<'py>, ptr: *mut ffi::PyObject) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: every caller passes the result of a CPython constructor, a new reference or
    // NULL with an exception set.
    unsafe { Bound::from_owned_ptr_or_err(py, ptr) }
}

/// A tuple of `items` (each gets a new reference).
pub(crate) fn tuple<'py>(
    py: Python<'py>,
    items: &[Bound<'py, PyAny>],
) -> PyResult<Bound<'py, PyTuple>> {
    // SAFETY: the GIL is held; a fresh tuple of exactly `items.len()` slots is filled once
    // each, with new references, before anything else can see it.
    unsafe {
        let t = owned(py, ffi::PyTuple_New(items.len() as ffi::Py_ssize_t))?;
        for (i, item) in items.iter().enumerate() {
            ffi::PyTuple_SET_ITEM(t.as_ptr(), i as ffi::Py_ssize_t, item.clone().into_ptr());
        }
        Ok(t.cast_into_unchecked())
    }
}

/// A list of `items` (each gets a new reference).
pub(crate) fn list<'py>(
    py: Python<'py>,
    items: &[Bound<'py, PyAny>],
) -> PyResult<Bound<'py, PyList>> {
    // SAFETY: as in `tuple`, with `PyList_SET_ITEM` on a fresh list.
    unsafe {
        let l = owned(py, ffi::PyList_New(items.len() as ffi::Py_ssize_t))?;
        for (i, item) in items.iter().enumerate() {
            ffi::PyList_SET_ITEM(l.as_ptr(), i as ffi::Py_ssize_t, item.clone().into_ptr());
        }
        Ok(l.cast_into_unchecked())
    }
}

/// An `int` from any unsigned value up to 128 bits.
pub(crate) fn uint(py: Python<'_>, v: u128) -> PyResult<Bound<'_, PyAny>> {
    match u64::try_from(v) {
        // SAFETY: the GIL is held.
        Ok(small) => owned(py, unsafe { ffi::PyLong_FromUnsignedLongLong(small) }),
        // Only hand-built snapshots with absurd sizes get here: (high << 64) | low.
        Err(_) => {
            let high = uint(py, v >> 64)?;
            let low = uint(py, v & u128::from(u64::MAX))?;
            high.lshift(64)?.bitor(low)
        }
    }
}

/// An `int` from any signed value up to 128 bits.
pub(crate) fn int(py: Python<'_>, v: i128) -> PyResult<Bound<'_, PyAny>> {
    match i64::try_from(v) {
        // SAFETY: the GIL is held.
        Ok(small) => owned(py, unsafe { ffi::PyLong_FromLongLong(small) }),
        Err(_) if v < 0 => uint(py, v.unsigned_abs())?.neg(),
        Err(_) => uint(py, v as u128),
    }
}

/// A `str` from UTF-8 text.
pub(crate) fn string<'py>(py: Python<'py>, s: &str) -> PyResult<Bound<'py, PyString>> {
    // SAFETY: the GIL is held; the pointer and length describe valid UTF-8.
    let s = owned(py, unsafe {
        ffi::PyUnicode_FromStringAndSize(s.as_ptr().cast(), s.len() as ffi::Py_ssize_t)
    })?;
    // SAFETY: PyUnicode_FromStringAndSize returns a str.
    Ok(unsafe { s.cast_into_unchecked() })
}

/// A `bytes` copy of `data`.
pub(crate) fn bytes<'py>(py: Python<'py>, data: &[u8]) -> PyResult<Bound<'py, PyBytes>> {
    // SAFETY: the GIL is held; the pointer and length describe `data`.
    let b = owned(py, unsafe {
        ffi::PyBytes_FromStringAndSize(data.as_ptr().cast(), data.len() as ffi::Py_ssize_t)
    })?;
    // SAFETY: PyBytes_FromStringAndSize returns bytes.
    Ok(unsafe { b.cast_into_unchecked() })
}
