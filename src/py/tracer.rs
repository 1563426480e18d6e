//! Module functions of `alloctrace._native` for the live tracer. Each one converts arguments,
//! refuses what tracemalloc refuses, and delegates to [`crate::tracer`].

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

use crate::py::snapshot::PySnapshotData;
use crate::tracer;

/// Refuses to start while the standard `tracemalloc` traces: both would wrap the same
/// allocators and each would corrupt the other's view when it stops.
fn refuse_if_tracemalloc_is_tracing(py: Python<'_>) -> PyResult<()> {
    let tracing = py
        .import("_tracemalloc")
        .and_then(|m| m.call_method0("is_tracing"))
        .and_then(|r| r.extract::<bool>())
        .unwrap_or(false);
    if tracing {
        return Err(PyRuntimeError::new_err(
            "the standard tracemalloc module is tracing: call tracemalloc.stop() before \
             alloctrace.start() (the two cannot trace at the same time)",
        ));
    }
    Ok(())
}

#[pyfunction]
#[pyo3(signature = (nframe = 1))]
fn start(py: Python<'_>, nframe: i64) -> PyResult<()> {
    if !tracer::is_tracing() {
        refuse_if_tracemalloc_is_tracing(py)?;
    }
    Ok(tracer::start(py, nframe)?)
}

#[pyfunction]
fn stop(py: Python<'_>) {
    tracer::stop(py)
}

#[pyfunction]
fn is_tracing() -> bool {
    tracer::is_tracing()
}

#[pyfunction]
fn clear_traces(py: Python<'_>) {
    tracer::clear_traces(py)
}

#[pyfunction]
fn get_traceback_limit() -> usize {
    tracer::traceback_limit()
}

#[pyfunction]
fn set_traceback_limit(nframe: i64) -> PyResult<()> {
    Ok(tracer::set_traceback_limit(nframe)?)
}

#[pyfunction]
fn get_traced_memory() -> (usize, usize) {
    tracer::traced_memory()
}

#[pyfunction]
fn reset_peak() {
    tracer::reset_peak()
}

#[pyfunction]
fn get_tracemalloc_memory() -> usize {
    tracer::tracer_memory()
}

#[pyfunction]
fn enable() {
    tracer::set_recording(true)
}

#[pyfunction]
fn disable() {
    tracer::set_recording(false)
}

#[pyfunction]
fn is_enabled() -> bool {
    tracer::is_recording()
}

#[pyfunction]
fn get_object_traceback<'py>(
    py: Python<'py>,
    obj: &Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, PyTuple>>> {
    tracer::object_traceback(py, obj)
}

#[pyfunction]
fn get_traces(py: Python<'_>) -> PyResult<Bound<'_, PyList>> {
    let raw = tracer::raw_traces(py)?;
    let items = raw
        .traces
        .iter()
        .map(|&(size, stack)| {
            let (frames, total) = &raw.frames[stack as usize];
            (tracer::DEFAULT_DOMAIN, size, frames, *total).into_pyobject(py)
        })
        .collect::<PyResult<Vec<_>>>()?;
    PyList::new(py, items)
}

/// Replaces the trace-time filters with these `Filter`/`DomainFilter` specs (the tuples their
/// `_spec()` methods build).
#[pyfunction]
fn set_trace_filters(specs: Vec<Bound<'_, PyAny>>) -> PyResult<()> {
    let specs = specs
        .iter()
        .enumerate()
        .map(|(i, spec)| crate::py::snapshot::spec_from_tuple(spec, i))
        .collect::<PyResult<Vec<_>>>()?;
    Ok(tracer::set_trace_filters(&specs)?)
}

#[pyfunction]
fn take_snapshot(py: Python<'_>) -> PyResult<PySnapshotData> {
    Ok(PySnapshotData::new(tracer::take_snapshot(py)?))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(start, m)?)?;
    m.add_function(wrap_pyfunction!(stop, m)?)?;
    m.add_function(wrap_pyfunction!(is_tracing, m)?)?;
    m.add_function(wrap_pyfunction!(clear_traces, m)?)?;
    m.add_function(wrap_pyfunction!(get_traceback_limit, m)?)?;
    m.add_function(wrap_pyfunction!(set_traceback_limit, m)?)?;
    m.add_function(wrap_pyfunction!(get_traced_memory, m)?)?;
    m.add_function(wrap_pyfunction!(reset_peak, m)?)?;
    m.add_function(wrap_pyfunction!(get_tracemalloc_memory, m)?)?;
    m.add_function(wrap_pyfunction!(enable, m)?)?;
    m.add_function(wrap_pyfunction!(disable, m)?)?;
    m.add_function(wrap_pyfunction!(is_enabled, m)?)?;
    m.add_function(wrap_pyfunction!(get_object_traceback, m)?)?;
    m.add_function(wrap_pyfunction!(get_traces, m)?)?;
    m.add_function(wrap_pyfunction!(take_snapshot, m)?)?;
    m.add_function(wrap_pyfunction!(set_trace_filters, m)?)?;
    Ok(())
}
