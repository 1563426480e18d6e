//! `_native._sigterm_retry_arm()` and `_native._sigterm_retry_acknowledge()`: the exit-dump
//! handler's guard against a SIGTERM recorded but never acted on (see
//! [`crate::sigterm_retry`]).

use pyo3::prelude::*;

use crate::sigterm_retry;

/// Wraps CPython's SIGTERM handler so that the signal is sent again to the main thread until
/// the Python handler starts. Call from the main thread right after installing the handler.
#[pyfunction]
fn _sigterm_retry_arm() -> bool {
    sigterm_retry::arm()
}

/// Called first thing by the Python handler: no more retries.
#[pyfunction]
fn _sigterm_retry_acknowledge() {
    sigterm_retry::acknowledge()
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_sigterm_retry_arm, m)?)?;
    m.add_function(wrap_pyfunction!(_sigterm_retry_acknowledge, m)?)?;
    Ok(())
}
