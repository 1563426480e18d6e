//! The pyo3 layer of `alloctrace._native`: argument conversion, exception mapping and class
//! wrappers. Logic lives in the plain-Rust modules; what is here only translates.

use pyo3::exceptions::{
    PyKeyboardInterrupt, PyMemoryError, PyOSError, PyRuntimeError, PyTypeError, PyValueError,
};
use pyo3::prelude::*;

use crate::error::Error;

pub mod heap_walk;
pub mod memory_limit;
pub mod objects;
pub mod retention;
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
        let msg = err.to_string();
        match err {
            Error::InvalidArgument(_) => PyValueError::new_err(msg),
            Error::WrongType(_) => PyTypeError::new_err(msg),
            Error::State(_) => PyRuntimeError::new_err(msg),
            Error::OutOfMemory => PyMemoryError::new_err(()),
            // Only reached if a caller lost the handler's exception; Ctrl-C's is the likely one.
            Error::Interrupted => PyKeyboardInterrupt::new_err(()),
            Error::Format { .. } => SnapshotFormatError::new_err(msg),
            Error::Io { path, source, .. } => match source.raw_os_error() {
                Some(errno) => PyOSError::new_err((errno, msg, path.display().to_string())),
                None => PyOSError::new_err(msg),
            },
        }
    }
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
    memory_limit::register(m)?;
    Ok(())
}
