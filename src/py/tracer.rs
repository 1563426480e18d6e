//! Module functions of `alloctrace._native` for the live tracer. Each one converts arguments,
//! refuses what tracemalloc refuses, and delegates to [`crate::hooks::tracer`].

use pyo3::exceptions::{PyOverflowError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt, PyList, PyTuple};

use crate::capture::MAX_NFRAME;
use crate::hooks::tracer;
use crate::platform::{allocator, fallible};
use crate::py::objects;
use crate::py::snapshot::PySnapshotData;
use crate::py::traces;
use crate::py::Checked;
use crate::snapshot;

/// Whether the standard `tracemalloc` traces: then alloctrace starts beneath and above its
/// hooks, so that its `stop()` cannot cut ours out of the chain (see [`crate::hooks::alongside`]).
///
/// The module is taken from `sys.modules` (the package imports it), not imported:
/// `PyImport_Import` makes and drops a list, which lands on the list free list just before the
/// hooks go in, untraced; the program's next list then reuses it and is missing from the
/// traces where `tracemalloc.start()` leaves no such list behind.
///
/// Made of the C API's own calls, each checked: pyo3's interned names and conversions panic
/// when the interpreter cannot allocate, and `start()` must raise `MemoryError` then. An
/// error here (out of memory) is taken to mean "not tracing"; what follows raises it again.
fn tracemalloc_is_tracing(py: Python<'_>) -> bool {
    use pyo3::ffi;

    // SAFETY: the GIL is held; every new reference is checked for NULL and released.
    let tracing = unsafe {
        let name = ffi::PyUnicode_FromString(c"_tracemalloc".as_ptr());
        let mut module = std::ptr::null_mut();
        if !name.is_null() {
            module = ffi::PyImport_GetModule(name);
            if module.is_null() {
                // Not imported (or sys.modules replaced): importing is the only way to ask.
                PyErr::take(py);
                module = ffi::PyImport_Import(name);
            }
            ffi::Py_DECREF(name);
        }
        let function = if module.is_null() {
            std::ptr::null_mut()
        } else {
            let function = ffi::PyObject_GetAttrString(module, c"is_tracing".as_ptr());
            ffi::Py_DECREF(module);
            function
        };
        let result = if function.is_null() {
            std::ptr::null_mut()
        } else {
            let result = ffi::compat::PyObject_CallNoArgs(function);
            ffi::Py_DECREF(function);
            result
        };
        let tracing = !result.is_null() && ffi::PyObject_IsTrue(result) == 1;
        ffi::Py_XDECREF(result);
        tracing
    };
    PyErr::take(py);
    tracing
}

/// Refuses calls from a sub-interpreter. The tracer's state belongs to the main interpreter:
/// it is guarded by the main GIL (a sub-interpreter may have its own, 3.12+) and holds that
/// interpreter's objects (filenames, code objects), which another interpreter must not get.
fn require_main_interpreter(what: &str) -> PyResult<()> {
    // SAFETY: the caller holds its interpreter's GIL; reading the pointers has no effect.
    let main =
        unsafe { pyo3::ffi::PyInterpreterState_Get() == pyo3::ffi::PyInterpreterState_Main() };
    if main {
        Ok(())
    } else {
        Err(crate::py::error::<PyRuntimeError>(format!(
            "alloctrace.{what}() can only be called from the main interpreter (tracing belongs \
             to it; allocations of sub-interpreters are traced with an unknown traceback)"
        )))
    }
}

/// A frame count: any int, so that one too large for a C integer gets the same
/// "must be in range" ValueError as any other out-of-range count, not an OverflowError about C
/// types. Extracting it never fails: the error is kept for the function's body to return,
/// because pyo3 wraps an argument's extraction error in a message it makes with an allocation
/// that panics when none can be had (issue 61).
struct FrameCount(PyResult<i64>);

impl<'py> FromPyObject<'_, 'py> for FrameCount {
    type Error = PyErr;

    fn extract(obj: Borrowed<'_, 'py, PyAny>) -> PyResult<Self> {
        Ok(FrameCount(match obj.extract::<i64>() {
            Ok(n) => Ok(n),
            Err(err) if err.is_instance_of::<PyOverflowError>(obj.py()) => {
                // str() itself, not Display: Display reports a failed str() as unraisable.
                Err(obj.str().map_or_else(
                    |failed| failed,
                    |shown| {
                        crate::py::error::<PyValueError>(format!(
                            "the number of frames must be in range [1; {MAX_NFRAME}], got {shown}"
                        ))
                    },
                ))
            }
            Err(err) => Err(err),
        }))
    }
}

/// An int keyword argument in `0..=u64::MAX`: a clear ValueError naming `what` for a
/// negative or too large one, a TypeError for anything but an int (bool included).
fn byte_count(obj: Option<&Bound<'_, PyAny>>, what: &str) -> PyResult<Option<u64>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(None);
    };
    if obj.is_instance_of::<PyBool>() || !obj.is_instance_of::<PyInt>() {
        return Err(crate::py::error::<PyTypeError>(format!(
            "{what} must be an int or None, not {}",
            obj.get_type().name()?
        )));
    }
    match obj.extract::<u64>() {
        Ok(n) => Ok(Some(n)),
        Err(_) => Err(crate::py::error::<PyValueError>(format!(
            "{what} must be in range [0; {}], got {}",
            u64::MAX,
            // str() itself, not Display: Display reports a failed str() as unraisable.
            obj.str()?
        ))),
    }
}

#[pyfunction]
#[pyo3(
    signature = (nframe = FrameCount(Ok(1)), *, sample_interval = None, sample_seed = None, native = None, reattribute = None),
    text_signature = "(nframe=1, *, sample_interval=None, sample_seed=None, native=None, reattribute=None)"
)]
fn start(
    py: Python<'_>,
    nframe: FrameCount,
    sample_interval: Option<&Bound<'_, PyAny>>,
    sample_seed: Option<&Bound<'_, PyAny>>,
    native: Option<bool>,
    reattribute: Option<bool>,
) -> PyResult<()> {
    let nframe = nframe.0?;
    let sampling = tracer::Sampling {
        interval: byte_count(sample_interval, "sample_interval")?,
        seed: byte_count(sample_seed, "sample_seed")?,
    };
    require_main_interpreter("start")?;
    let tracemalloc_tracing = !tracer::is_tracing() && tracemalloc_is_tracing(py);
    Ok(tracer::start(
        py,
        nframe,
        sampling,
        native,
        reattribute,
        tracemalloc_tracing,
    )?)
}

/// The sampling interval in bytes while tracing in sampled mode; None when tracing exactly
/// or not tracing.
#[pyfunction]
fn get_sample_interval() -> Checked<Option<u64>> {
    Checked(tracer::sample_interval())
}

#[pyfunction]
fn stop(py: Python<'_>) -> PyResult<()> {
    require_main_interpreter("stop")?;
    tracer::stop(py);
    Ok(())
}

#[pyfunction]
fn is_tracing() -> bool {
    tracer::is_tracing()
}

#[pyfunction]
fn clear_traces(py: Python<'_>) -> PyResult<()> {
    require_main_interpreter("clear_traces")?;
    Ok(tracer::clear_traces(py)?)
}

#[pyfunction]
fn get_traceback_limit() -> PyResult<Checked<usize>> {
    require_main_interpreter("get_traceback_limit")?;
    Ok(Checked(tracer::traceback_limit()))
}

#[pyfunction]
fn set_traceback_limit(nframe: FrameCount) -> PyResult<()> {
    let nframe = nframe.0?;
    require_main_interpreter("set_traceback_limit")?;
    Ok(tracer::set_traceback_limit(nframe)?)
}

/// Code objects that died since the last reading are released first, so that their memory
/// is not counted (see `crate::hooks::intern`).
#[pyfunction]
fn get_traced_memory(py: Python<'_>) -> Checked<(usize, usize)> {
    tracer::sweep_dead_code(py);
    Checked(tracer::traced_memory())
}

/// `(rss, anon, file, shmem, peak_rss)` of the process now, in bytes (see
/// `crate::platform::process_memory`); OSError where the kernel's figures cannot be read.
#[pyfunction]
fn get_process_memory() -> PyResult<Checked<crate::py::MemoryFigures>> {
    let pm = crate::platform::process_memory::ProcessMemory::current()
        .map_err(pyo3::exceptions::PyOSError::new_err)?;
    Ok(Checked((pm.rss, pm.anon, pm.file, pm.shmem, pm.peak_rss)))
}

#[pyfunction]
fn reset_peak() {
    tracer::reset_peak()
}

#[pyfunction]
fn get_tracemalloc_memory() -> PyResult<Checked<usize>> {
    require_main_interpreter("get_tracemalloc_memory")?;
    Ok(Checked(tracer::tracer_memory()))
}

/// Blocks allocated while tracing that the tracer left untraced because it could not get
/// memory for their trace; 0 unless memory ran out. Reset by `start()` and `clear_traces()`.
#[pyfunction]
fn get_dropped_traces() -> Checked<usize> {
    Checked(tracer::dropped_traces())
}

/// `(ids looked at, stacks freed, most freed by one sweep, pins looked at, code objects
/// buried, most buried by one pending-call sweep)`: the sweeps' work in counts, which a test
/// can compare between rounds on a loaded machine (private, for tests and benchmarks).
#[pyfunction]
fn _sweep_work() -> (u64, u64, u64, u64, u64, u64) {
    tracer::sweep_work()
}

/// `(sweeps, total seconds, longest seconds, longest in CPU seconds, live tracebacks, trie
/// nodes, pinned code objects)`: what the sweeps of the tracer's own memory cost and what it
/// holds (private, for benchmarks).
#[pyfunction]
fn _sweep_stats() -> (u64, f64, f64, f64, usize, usize, usize) {
    let (sweeps, total, longest, longest_cpu, stacks, nodes, pins) = tracer::sweep_stats();
    (
        sweeps,
        total as f64 / 1e9,
        longest as f64 / 1e9,
        longest_cpu as f64 / 1e9,
        stacks,
        nodes,
        pins,
    )
}

/// One sweep's figures for Python: `(wall seconds, CPU seconds, code objects buried,
/// tracebacks freed, (CPU seconds collecting tracebacks, finding dead code, burying it,
/// releasing it), page faults)`.
type PauseFigures = (f64, f64, u64, u64, (f64, f64, f64, f64), u64);

/// `(the longest sweep a pending call ran, the longest a reading ran, (sweeps over 1, 2, 5 and
/// 10 ms of CPU))`, each sweep as [`PauseFigures`] (private, for the soak benchmark: which
/// kind of sweep paused longest, on what, and how often sweeps are long).
#[pyfunction]
fn _sweep_pauses() -> (PauseFigures, PauseFigures, [u64; 4]) {
    let seconds = |ns: u64| ns as f64 / 1e9;
    let figures = |f: tracer::SweepFigures| {
        let [collect, find, bury, release] = f.phases.map(seconds);
        (
            seconds(f.wall),
            seconds(f.cpu),
            f.buried,
            f.freed,
            (collect, find, bury, release),
            f.page_faults,
        )
    };
    let (pending, reading, over) = tracer::sweep_pauses();
    (figures(pending), figures(reading), over)
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
    require_main_interpreter("get_object_traceback")?;
    traces::object_traceback(py, obj)
}

#[pyfunction]
fn get_traces(py: Python<'_>) -> PyResult<Bound<'_, PyList>> {
    require_main_interpreter("_get_traces")?;
    allocator::guarded(|| {
        let raw = traces::raw_traces(py)?;
        let mut items = fallible::with_capacity(raw.traces.len())?;
        for &(domain, size, stack) in &raw.traces {
            let (frames, total) = &raw.frames[stack as usize];
            let trace = [
                objects::uint(py, domain.into())?,
                objects::uint(py, size as u128)?,
                frames.clone().into_any(),
                objects::uint(py, u128::from(*total))?,
            ];
            items.push(objects::tuple(py, &trace)?.into_any());
        }
        objects::list(py, &items)
    })
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
#[pyo3(signature = (objects = false, peak = false))]
fn take_snapshot(py: Python<'_>, objects: bool, peak: bool) -> PyResult<PySnapshotData> {
    require_main_interpreter("take_snapshot")?;
    allocator::guarded(|| {
        Ok(PySnapshotData::new(snapshot::take_snapshot(
            py, objects, peak,
        )?))
    })
}

/// What was allocated since the last call (or since counting started), as an aggregate
/// snapshot: the `alloc_*` figures of a pushed profile. The counts start again from zero.
#[pyfunction]
fn _take_allocated_snapshot(py: Python<'_>) -> PyResult<PySnapshotData> {
    require_main_interpreter("take_snapshot")?;
    allocator::guarded(|| Ok(PySnapshotData::new(tracer::take_allocated_snapshot(py)?)))
}

/// Starts (`True`) or stops counting allocations per traceback for pushed profiles; stopping
/// forgets what was counted.
#[pyfunction]
fn _set_counting_allocations(on: bool) {
    tracer::set_counting_allocations(on);
}

#[pyfunction]
fn _is_counting_allocations() -> bool {
    tracer::is_counting_allocations()
}

/// Whether the running session records native allocations (`start(native=True)`).
#[pyfunction]
fn is_tracing_native() -> bool {
    tracer::is_tracing() && crate::native::enabled()
}

/// True while tracing with objects reused from CPython's free lists re-attributed to the
/// traceback of their creation: asked for (`start(reattribute=...)`, on by default) and
/// possible on this interpreter.
#[pyfunction]
fn is_reattributing() -> bool {
    tracer::is_reattributing()
}

/// How many import-table slots point at the native hooks now (for tests: 0 after `stop()`).
#[pyfunction]
fn _native_redirected_slots() -> usize {
    crate::native::redirected_slots()
}

/// How this interpreter lets alloctrace re-attribute objects reused from free lists
/// (`"reftracer"`, `"patched"`), or `None` where it cannot (see docs/freelists.md).
#[pyfunction]
fn _freelist_mechanism() -> Option<&'static str> {
    crate::freelist::mechanism()
}

/// Whether the stack depth comes from CPython's recursion counter (3.12+), how many times that
/// counter was checked against a walk and how many of those it disagreed; `check_every`
/// changes how often it is checked (1: on every use). For tests.
#[pyfunction]
#[pyo3(signature = (check_every=None))]
fn _depth_counter(check_every: Option<u32>) -> (bool, u64, u64) {
    crate::capture::depth::state(check_every)
}

/// Called by the package's `tracemalloc.start()` just before the standard one, while
/// alloctrace traces and tracemalloc does not (see [`crate::hooks::alongside`]). RuntimeError if
/// tracemalloc cannot trace alongside.
#[pyfunction]
fn _tracemalloc_starting() -> PyResult<()> {
    require_main_interpreter("start")?;
    // SAFETY: the GIL is held.
    Ok(unsafe { crate::hooks::alongside::before_start() }?)
}

/// Called after the standard `tracemalloc.start()` returned or raised, when
/// `_tracemalloc_starting()` succeeded.
#[pyfunction]
fn _tracemalloc_started() {
    // SAFETY: the GIL is held.
    unsafe { crate::hooks::alongside::after_start() }
}

/// Called just before the standard `tracemalloc.stop()`; true if `_tracemalloc_stopped()` is
/// to be called after it.
#[pyfunction]
fn _tracemalloc_stopping() -> bool {
    // SAFETY: the GIL is held.
    unsafe { crate::hooks::alongside::before_stop() }
}

#[pyfunction]
fn _tracemalloc_stopped() {
    // SAFETY: the GIL is held.
    unsafe { crate::hooks::alongside::after_stop() }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_tracemalloc_starting, m)?)?;
    m.add_function(wrap_pyfunction!(_tracemalloc_started, m)?)?;
    m.add_function(wrap_pyfunction!(_tracemalloc_stopping, m)?)?;
    m.add_function(wrap_pyfunction!(_tracemalloc_stopped, m)?)?;
    m.add_function(wrap_pyfunction!(_freelist_mechanism, m)?)?;
    m.add_function(wrap_pyfunction!(_depth_counter, m)?)?;
    m.add_function(wrap_pyfunction!(is_tracing_native, m)?)?;
    m.add_function(wrap_pyfunction!(_take_allocated_snapshot, m)?)?;
    m.add_function(wrap_pyfunction!(_set_counting_allocations, m)?)?;
    m.add_function(wrap_pyfunction!(_is_counting_allocations, m)?)?;
    m.add_function(wrap_pyfunction!(is_reattributing, m)?)?;
    m.add_function(wrap_pyfunction!(_native_redirected_slots, m)?)?;
    m.add("NATIVE_DOMAIN", crate::native::DOMAIN)?;
    m.add("NATIVE_DOMAIN_NAME", crate::native::NAME)?;
    m.add_function(wrap_pyfunction!(start, m)?)?;
    m.add_function(wrap_pyfunction!(stop, m)?)?;
    m.add_function(wrap_pyfunction!(get_sample_interval, m)?)?;
    m.add_function(wrap_pyfunction!(is_tracing, m)?)?;
    m.add_function(wrap_pyfunction!(clear_traces, m)?)?;
    m.add_function(wrap_pyfunction!(get_traceback_limit, m)?)?;
    m.add_function(wrap_pyfunction!(set_traceback_limit, m)?)?;
    m.add_function(wrap_pyfunction!(get_traced_memory, m)?)?;
    m.add_function(wrap_pyfunction!(reset_peak, m)?)?;
    m.add_function(wrap_pyfunction!(get_process_memory, m)?)?;
    m.add_function(wrap_pyfunction!(get_tracemalloc_memory, m)?)?;
    m.add_function(wrap_pyfunction!(get_dropped_traces, m)?)?;
    m.add_function(wrap_pyfunction!(_sweep_stats, m)?)?;
    m.add_function(wrap_pyfunction!(_sweep_pauses, m)?)?;
    m.add_function(wrap_pyfunction!(_sweep_work, m)?)?;
    m.add_function(wrap_pyfunction!(enable, m)?)?;
    m.add_function(wrap_pyfunction!(disable, m)?)?;
    m.add_function(wrap_pyfunction!(is_enabled, m)?)?;
    m.add_function(wrap_pyfunction!(get_object_traceback, m)?)?;
    m.add_function(wrap_pyfunction!(get_traces, m)?)?;
    m.add_function(wrap_pyfunction!(take_snapshot, m)?)?;
    m.add_function(wrap_pyfunction!(set_trace_filters, m)?)?;
    Ok(())
}
