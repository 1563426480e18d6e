//! `_native._sigterm_retry_arm()` and `_native._sigterm_retry_acknowledge()`: the exit-dump
//! handler's guard against a SIGTERM recorded but never acted on (see
//! [`crate::platform::sigterm_retry`]).

use pyo3::prelude::*;

use crate::platform::sigterm_retry;

/// Wraps CPython's SIGTERM handler so that the signal is sent again to the main thread until
/// the Python handler starts. Call from the main thread right after installing the handler.
#[pyfunction]
fn _sigterm_retry_arm() -> bool {
    sigterm_retry::arm()
}

/// Called first thing by the Python handler: no more retries; with `deadline` seconds above
/// 0, the process dies of SIGTERM if it still runs that long from the first call.
#[pyfunction]
#[pyo3(signature = (deadline=0.0))]
fn _sigterm_retry_acknowledge(deadline: f64) {
    let ms = if deadline.is_finite() && deadline > 0.0 {
        (deadline * 1000.0).min(i64::MAX as f64 / 2.0).ceil() as i64
    } else {
        0
    };
    sigterm_retry::acknowledge(ms)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_sigterm_retry_arm, m)?)?;
    m.add_function(wrap_pyfunction!(_sigterm_retry_acknowledge, m)?)?;
    Ok(())
}
