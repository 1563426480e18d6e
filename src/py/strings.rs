//! Python `str` to and from the byte strings the model keeps (file names, type names, report
//! lines), as surrogatepass UTF-8, so any `str` (lone surrogates from `surrogateescape`-decoded
//! paths included) survives a round trip unchanged. Shared by every converter in `py/`, which
//! is why it is a module of its own rather than part of one of them.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};

/// A `str` as surrogatepass UTF-8.
///
/// Only an ASCII `str` is read in place: asking any other for its UTF-8 (`to_str`) makes
/// CPython cache a copy inside the `str` for as long as it lives, an allocation that, while
/// tracing, is charged to the line that read (code objects' names are resolved at every
/// reading) where `tracemalloc` allocates nothing. The others are encoded into a temporary.
pub(crate) fn str_bytes(s: &Bound<'_, PyString>) -> PyResult<Vec<u8>> {
    // SAFETY: `s` is a live, ready str (3.9-3.11 ready every str they hand out as such).
    if unsafe { pyo3::ffi::PyUnicode_IS_ASCII(s.as_ptr()) } != 0 {
        if let Ok(text) = s.to_str() {
            return Ok(text.as_bytes().to_vec());
        }
    }
    // SAFETY: `s` is a live str; the codec and error handler names are NUL-terminated.
    let encoded = unsafe {
        Bound::from_owned_ptr_or_err(
            s.py(),
            pyo3::ffi::PyUnicode_AsEncodedString(
                s.as_ptr(),
                c"utf-8".as_ptr(),
                c"surrogatepass".as_ptr(),
            ),
        )?
    };
    Ok(encoded.cast_into::<PyBytes>()?.as_bytes().to_vec())
}

/// surrogatepass UTF-8 back to a `str` (`MemoryError`, not a panic, when memory is out).
pub(crate) fn bytes_str<'py>(py: Python<'py>, b: &[u8]) -> PyResult<Bound<'py, PyString>> {
    match std::str::from_utf8(b) {
        Ok(s) => super::objects::string(py, s),
        // SAFETY: the GIL is held; pointer and length describe `b`; the error handler name
        // is NUL-terminated; the result is a new reference to a str or NULL with an error.
        Err(_) => unsafe {
            Ok(Bound::from_owned_ptr_or_err(
                py,
                pyo3::ffi::PyUnicode_DecodeUTF8(
                    b.as_ptr().cast(),
                    b.len() as pyo3::ffi::Py_ssize_t,
                    c"surrogatepass".as_ptr(),
                ),
            )?
            .cast_into_unchecked())
        },
    }
}
