//! `_native._release_bootstrap_page()`: the bootstrap lines of `alloctrace attach` give back
//! the page they were queued from (see [`crate::platform::bootstrap_page`]).

use pyo3::prelude::*;

use crate::platform::bootstrap_page;

/// Unmaps the page at `address` of `size` bytes if it is an anonymous read-write page whose
/// text starts with `prefix`; returns whether it did.
#[pyfunction]
fn _release_bootstrap_page(address: usize, size: usize, prefix: &[u8]) -> PyResult<bool> {
    Ok(bootstrap_page::release(address, size, prefix)?)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_release_bootstrap_page, m)?)?;
    Ok(())
}
