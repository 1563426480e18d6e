//! The live traces as the tuples `_tracemalloc._get_traces()` and `get_object_traceback()`
//! return: the tracer collects and resolves them ([`crate::hooks::tracer`]), this module makes
//! the Python objects, with the checked constructors of [`super::objects`].

use pyo3::prelude::*;

use crate::capture::{Current, Interpreter};
use crate::hooks::intern::Resolver;
use crate::hooks::tracer::{
    collect, is_tracing, resolve_stacks, settle, sweep_dead_code, table, with_resolver,
};
use crate::platform::fallible;
use crate::py::objects;

/// Python-facing raw traces, as `_tracemalloc._get_traces()` returns them.
pub struct RawTraces<'py> {
    /// `(domain, size, index into frames)` per trace.
    pub traces: Vec<(u32, usize, u32)>,
    /// Frames tuple per distinct traceback, shared by every trace that uses it.
    pub frames: Vec<(Bound<'py, pyo3::types::PyTuple>, u16)>,
}

fn frames_tuple<'py>(
    py: Python<'py>,
    resolver: &Resolver,
    frames: &[(u32, u32)],
) -> PyResult<Bound<'py, pyo3::types::PyTuple>> {
    let mut items = fallible::with_capacity(frames.len())?;
    for &(filename, lineno) in frames {
        let name = resolver
            .filename(filename)
            .object
            .clone_ref(py)
            .into_bound(py);
        let frame = [name.into_any(), objects::uint(py, lineno.into())?];
        items.push(objects::tuple(py, &frame)?.into_any());
    }
    objects::tuple(py, &items)
}

pub fn raw_traces(py: Python<'_>) -> PyResult<RawTraces<'_>> {
    if !is_tracing() {
        return Ok(RawTraces {
            traces: Vec::new(),
            frames: Vec::new(),
        });
    }
    sweep_dead_code(py);
    let collected = collect(py, false, false)?;
    let frames = with_resolver(|resolver| {
        let mut frames = fallible::with_capacity(collected.stacks.len())?;
        for ((stack, total), _) in &collected.stacks {
            frames.push((frames_tuple(py, resolver, stack)?, *total));
        }
        Ok::<_, PyErr>(frames)
    })
    .transpose()?
    .unwrap_or_default();
    let traces = (0..collected.traces.len()).map(|i| {
        let (size, stack) = collected.traces[i];
        (collected.domain(i), size, stack)
    });
    Ok(RawTraces {
        traces: fallible::collect_n(traces, collected.traces.len())?,
        frames,
    })
}

/// The frames (most recent first) of the traceback where `obj` was allocated, if traced.
pub fn object_traceback<'py>(
    py: Python<'py>,
    obj: &Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, pyo3::types::PyTuple>>> {
    if !is_tracing() {
        return Ok(None);
    }
    // SAFETY: `obj` is alive for the call and the GIL is held.
    let address = unsafe { Current::object_block(obj.as_ptr()) };
    // SAFETY: the GIL is held (`py`), outside any hook.
    unsafe { settle() };
    let Some(trace) = table().get(address) else {
        return Ok(None);
    };
    let stacks = resolve_stacks(py, &[trace.traceback], false)?;
    let Some(((frames, _), _)) = stacks.first() else {
        return Ok(None);
    };
    with_resolver(|resolver| frames_tuple(py, resolver, frames)).transpose()
}
