//! alloctrace: a fast, drop-in replacement for CPython's `tracemalloc`.
//!
//! Layout, one module per job:
//! - [`hooks`]: the PEP 445 allocator hooks (the hot path) and their installation.
//! - [`capture`]: reading the Python stack from a hook, one file per CPython version.
//! - [`sampler`]: the per-thread byte countdown of sampled mode.
//! - [`freelist`]: re-attributing objects CPython reuses from its free lists.
//! - [`table`]: the live-trace table, keyed by block address, and the memory counters.
//! - [`intern`]: traceback interning and the lazy (code, offset) → line resolution.
//! - [`tracked`]: blocks extensions report with `PyTraceMalloc_Track`, in their domains.
//! - [`alongside`]: the standard `tracemalloc` started while alloctrace traces.
//! - [`memory_limit`]: noticing that traced memory or RSS crossed `ALLOCTRACE_MEMORY_LIMIT`.
//! - [`native`]: extensions' own `malloc`/`mmap` calls, in the native domain (opt-in).
//! - [`machine`]: the (hashed) machine id snapshots record, so readers know where they came from.
//! - [`process_memory`]: the process's RSS as the kernel splits it, beside the traced total.
//! - [`sigterm_retry`]: sends SIGTERM again until the exit-dump handler has run.
//! - [`tracer`]: start/stop/clear and snapshots of the live state, tying the above together.
//! - [`heap`]: the live object graph behind object kinds and retention paths.
//! - [`allocator`]: the global allocator; a failed small allocation becomes `MemoryError`.
//! - [`fallible`]: vectors reserved so that running out of memory is `MemoryError`.
//! - [`analysis`]: snapshots, grouping, diffing, filters and the file format (plain Rust).
//! - [`py`]: the pyo3 wrappers; they convert and delegate, nothing more.

pub mod analysis;
pub mod capture;
pub mod error;
pub mod freelist;
pub mod heap;
pub mod hooks;
pub mod native;
pub mod platform;
pub mod py;
pub mod tracked;

#[global_allocator]
static ALLOCATOR: platform::allocator::Allocator = platform::allocator::Allocator;
