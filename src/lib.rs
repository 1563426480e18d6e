//! alloctrace: a fast, drop-in replacement for CPython's `tracemalloc`.
//!
//! Layout, by layer, lowest first: a module imports only from its own layer and the ones
//! before it (the exceptions, and why, are in `docs/design.md`, "Import circles").
//! - [`platform`] and [`error`]: the process and the operating system (the global allocator,
//!   fallible vectors, lock waits across `fork()`, RSS, the machine id, signal dispositions,
//!   SIGTERM retries, attach's bootstrap page), and the one internal error type.
//! - [`analysis`]: snapshots, grouping, diffing, filters, the file format and the exports, in
//!   plain Rust.
//! - The hook layer, everything an allocator hook runs: [`hooks`] (the PEP 445 hooks, their
//!   per-thread state, the sampler, the trace table and its counters, young and released
//!   blocks, traceback interning, the tracer's recording, the standard tracemalloc alongside,
//!   the memory limit's check), [`capture`] (reading the Python stack, one file per CPython
//!   version), [`freelist`] (objects reused from free lists), [`native`] (extensions' own
//!   `malloc`/`mmap`, opt-in) and [`tracked`] (`PyTraceMalloc_Track` domains).
//!   `hooks::tracer` also holds start/stop/clear and collects, resolves and builds the
//!   snapshots of the live state; `hooks::intern` also resolves lines, with the `str`
//!   conversions the pyo3 layer hands down at import (`intern::set_strings`).
//! - With the GIL, at snapshot time: [`heap`], the live object graph behind object kinds and
//!   retention paths, and [`snapshot`], snapshots with object kinds (the heap walk matched to
//!   what the tracer collected).
//! - [`py`]: the pyo3 wrappers; they convert and delegate, nothing more (`py::traces` makes
//!   the tuples of `_get_traces()` and `get_object_traceback()`).

pub mod analysis;
pub mod capture;
pub mod error;
pub mod freelist;
pub mod heap;
pub mod hooks;
pub mod native;
pub mod platform;
pub mod py;
pub mod snapshot;
pub mod tracked;

#[global_allocator]
static ALLOCATOR: platform::allocator::Allocator = platform::allocator::Allocator;
