//! Snapshots of the live state, taken with the GIL: the one snapshot-time step of the tracer
//! that needs a layer above the hooks, the heap walk behind object kinds ([`crate::heap`]).
//! What it reads (the table, the interner, the resolver) stays in [`crate::hooks::tracer`],
//! which collects, resolves and builds; this module only asks it, so that the hook layer
//! imports nothing above it.

use pyo3::prelude::*;

use crate::analysis::snapshot::Snapshot;
use crate::error::{Error, Result};
use crate::hooks::tracer::{
    build_snapshot, collect, collect_peak, is_tracing, sweep_dead_code, traced_size,
};

/// A snapshot of every live trace, resolved and interned for analysis; with `objects`, also
/// the kind of each traced block (see [`crate::heap::kinds`]).
///
/// The heap is walked first, then the trace table is read at once: between the two only the
/// walk's type-name reads run, which allocate no object the walk saw, so every object in the
/// graph is still at its address when the traces are matched to it. Resolving tracebacks
/// (which runs Python code) comes after both.
///
/// With `peak`, the snapshot is of the moment the traced total last reached its peak: one
/// aggregate trace per traceback (see [`Snapshot::blocks`]), no addresses or object kinds
/// (`objects` must then be false).
pub fn take_snapshot(py: Python<'_>, objects: bool, peak: bool) -> Result<Snapshot> {
    if !is_tracing() {
        return Err(Error::State(
            "the tracemalloc module must be tracing memory allocations to take a snapshot".into(),
        ));
    }
    if peak && objects {
        return Err(Error::InvalidArgument(
            "a peak snapshot cannot record object kinds: the objects alive at the peak may be \
             gone (take_snapshot(peak=True) takes no objects=True)"
                .into(),
        ));
    }
    sweep_dead_code(py);
    let graph = if objects {
        Some(crate::heap::walk::walk(py, &[], traced_size)?)
    } else {
        None
    };
    let collected = if peak {
        collect_peak(py)?
    } else {
        collect(py, true, objects)?
    };
    let kinds = match graph {
        Some(graph) => Some(crate::heap::kinds::kinds_of(&graph, &collected.addresses)?),
        None => None,
    };
    build_snapshot(py, collected, kinds)
}
