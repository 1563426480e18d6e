//! `_native._set_signal_disposition()`: the kernel-side half of changing a handler to
//! `SIG_IGN` or `SIG_DFL` without CPython's race (see [`crate::platform::signal_disposition`]);
//! and the snapshot-request signal's pipe byte and count (see
//! [`crate::platform::request_count`]).

use pyo3::prelude::*;

use crate::platform::{request_count, signal_disposition};

/// Sets the kernel's action for `signum` to ignore (`ignore=True`) or to the default action;
/// call `signal.signal` with the same choice right after.
#[pyfunction]
fn _set_signal_disposition(signum: i32, ignore: bool) -> PyResult<()> {
    Ok(signal_disposition::set(signum, ignore)?)
}

/// Writes one snapshot request byte to the pipe `fd`, keeping the GIL (see
/// [`signal_disposition::write_request`]).
#[pyfunction]
fn _write_request(fd: i32) -> PyResult<()> {
    Ok(signal_disposition::write_request(fd)?)
}

/// Wraps the C handler of the snapshot-request signal `signum` with one that counts it (see
/// [`request_count`]); call right after `signal.signal` installed the Python handler.
/// Returns whether the wrapper is in place.
#[pyfunction]
fn _request_count_arm(signum: i32) -> bool {
    request_count::arm(signum)
}

/// Snapshot-request signals received so far, whether or not their Python handler ran.
#[pyfunction]
fn _request_count() -> u64 {
    request_count::count()
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_request_count_arm, m)?)?;
    m.add_function(wrap_pyfunction!(_request_count, m)?)?;
    m.add_function(wrap_pyfunction!(_set_signal_disposition, m)?)?;
    m.add_function(wrap_pyfunction!(_write_request, m)?)?;
    Ok(())
}
