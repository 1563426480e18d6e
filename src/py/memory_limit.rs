//! `alloctrace._native`'s side of the memory limit (see [`crate::hooks::memory_limit`]):
//! arming the traced limit and the watcher's check.

use pyo3::exceptions::PyOSError;
use pyo3::prelude::*;

use crate::hooks::memory_limit::{self, Crossing};
use crate::hooks::tracer;

/// Sets the traced-memory limit in bytes (`None`: none) and forgets an earlier crossing.
#[pyfunction]
#[pyo3(signature = (traced))]
fn _memory_limit_arm(traced: Option<u64>) {
    memory_limit::arm(traced);
}

/// Whether the traced limit or `rss` (peak RSS in bytes; `None`: not watched) has been
/// crossed: `("traced" | "rss", bytes)`, or `None`. OSError if the RSS cannot be read.
#[pyfunction]
#[pyo3(signature = (rss))]
fn _memory_limit_check(rss: Option<u64>) -> PyResult<Option<(&'static str, u64)>> {
    let traced_peak = || tracer::traced_memory().1;
    let crossing = memory_limit::check(rss, traced_peak).map_err(PyOSError::new_err)?;
    Ok(crossing.map(|c| match c {
        Crossing::Traced(n) => ("traced", n),
        Crossing::Rss(n) => ("rss", n),
    }))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_memory_limit_arm, m)?)?;
    m.add_function(wrap_pyfunction!(_memory_limit_check, m)?)?;
    Ok(())
}
