//! Blocks that extension modules report with `PyTraceMalloc_Track(domain, ptr, size)` and
//! `PyTraceMalloc_Untrack(domain, ptr)` (numpy's array data, in domain 389047), recorded as
//! the standard module records them.
//!
//! Those two functions belong to CPython's own tracemalloc, which ignores them unless *it* is
//! tracing. While alloctrace traces, the calls of every loaded extension are redirected to
//! [`track`] and [`untrack`] here by rewriting the extensions' import-table slots (see
//! [`got`]); `dlopen` is redirected the same way in every object that imports it, so that
//! an extension loaded later is rewritten as soon as it is loaded, before it can run. `stop()`
//! puts every slot back.
//!
//! Semantics are tracemalloc's: a trace is keyed by `(domain, ptr)`; tracking a key already
//! present replaces its trace; untracking an unknown key does nothing. Domain 0 *is* the
//! PEP 445 hooks' domain, so `Track(0, ..)`/`Untrack(0, ..)` act on the main table. numpy 2.5
//! relies on that on 3.12+: it allocates array data with `PyMem_RawMalloc` (which our RAW
//! hook records in domain 0), then calls `Untrack(0, ptr)` and `Track(389047, ptr, size)`,
//! so each buffer is counted once, in numpy's domain.
//!
//! Other domains are kept here, in a small map under one mutex (tracked blocks are few and
//! their calls rare next to allocations), charged to the table's totals through
//! [`TraceTable::account`] so that `get_traced_memory()`, the peak and snapshots include
//! them. The hooks' hot path is unchanged.
//!
//! Neither the standard module's tracing flag nor its tables are used. The calls are passed
//! on to CPython's functions when alloctrace is not tracing (a call racing with `stop()`, or a
//! slot that could not be restored), and, after our own recording, while the standard module
//! traces alongside (see [`crate::hooks::alongside`]): it keeps working either way.
//!
//! Threads: `Track` takes the GIL as CPython's does (`PyGILState_Ensure`), so the traceback
//! is the calling thread's Python stack even when the extension had released the GIL, and
//! `start()`/`stop()` (which hold the GIL) never interleave with it. `Untrack` needs no
//! stack and takes no GIL, like CPython's on 3.9-3.11.
//!
//! What cannot be seen: calls made through a pointer obtained with `dlsym` (not through the
//! import table), and extensions linked statically into the executable.

pub mod got;

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Once, OnceLock};

use parking_lot::{Mutex, MutexGuard};
use pyo3::ffi;

use crate::hooks::table::{buckets_for_capacity, Trace, TraceTable};
use crate::hooks::tracer;

/// tracemalloc's default domain, where the PEP 445 hooks record.
const DEFAULT_DOMAIN: u32 = 0;

extern "C" {
    fn PyTraceMalloc_Track(domain: c_uint, ptr: usize, size: usize) -> c_int;
    fn PyTraceMalloc_Untrack(domain: c_uint, ptr: usize) -> c_int;
}

/// The traces of every domain but 0, by `(domain, address)`.
fn store_lock() -> &'static Mutex<HashMap<(u32, usize), Trace>> {
    static STORE: OnceLock<Mutex<HashMap<(u32, usize), Trace>>> = OnceLock::new();
    STORE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// [`store_lock`], locked (see [`lock`]).
fn store() -> MutexGuard<'static, HashMap<(u32, usize), Trace>> {
    lock(store_lock())
}

/// Both locks here are held across `fork()` by [`before_fork`], so they are only ever taken
/// without parking (see [`crate::platform::nopark`]): a thread parked on one at the fork would make the
/// child's release wait for `parking_lot_core` state that a thread of the parent held.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    crate::platform::nopark::acquire(|| mutex.try_lock())
}

/// Serialises rewriting (start, stop, and `dlopen` on any thread); `true` while the slots
/// are to be redirected. Changed only under this lock, so a `dlopen` that finishes after
/// `stop()` cannot redirect the library it loaded.
static PATCHING: Mutex<bool> = Mutex::new(false);

/// Whether `stop()` left some slot redirected (one it could not write back); only a
/// diagnostic for tests.
static LEFT_BEHIND: AtomicBool = AtomicBool::new(false);

/// `PyTraceMalloc_Track` as extensions see it while alloctrace traces.
///
/// Returns 0 when recorded (or filtered out), -1 when the tracer is out of memory, and, not
/// tracing, whatever CPython's function returns (-2 unless the standard module traces).
unsafe extern "C" fn track_hook(domain: c_uint, ptr: usize, size: usize) -> c_int {
    if !tracer::is_tracing() {
        return PyTraceMalloc_Track(domain, ptr, size);
    }
    let gil = ffi::PyGILState_Ensure();
    // Re-checked with the GIL: stop() may have run while this thread waited for it.
    let ours = tracer::is_tracing().then(|| track(domain, ptr, size));
    ffi::PyGILState_Release(gil);
    match ours {
        // Not tracing after all: as above.
        None => PyTraceMalloc_Track(domain, ptr, size),
        Some(result) => {
            if crate::hooks::alongside::tracemalloc_traces_too() {
                PyTraceMalloc_Track(domain, ptr, size);
            }
            result
        }
    }
}

/// `PyTraceMalloc_Untrack` as extensions see it while alloctrace traces.
unsafe extern "C" fn untrack_hook(domain: c_uint, ptr: usize) -> c_int {
    if !tracer::is_tracing() {
        return PyTraceMalloc_Untrack(domain, ptr);
    }
    untrack(domain, ptr);
    if crate::hooks::alongside::tracemalloc_traces_too() {
        PyTraceMalloc_Untrack(domain, ptr);
    }
    0
}

/// `dlopen` as seen by every object that imports it while alloctrace traces: the library is
/// loaded, then redirected before the caller gets its handle (an extension module's init
/// function runs only after `dlopen` returns).
///
/// The loader now sees this library as the caller: a relative name is searched without the
/// real caller's `DT_RPATH`/`DT_RUNPATH` (Python's own imports pass full paths).
unsafe extern "C" fn dlopen_hook(filename: *const c_char, flags: c_int) -> *mut c_void {
    let handle = libc::dlopen(filename, flags);
    if !handle.is_null() {
        let on = lock(&PATCHING);
        if *on {
            redirect();
        }
    }
    handle
}

/// Records one tracked block with the current traceback; `0`, or `-1` if out of memory.
///
/// # Safety
/// The calling thread holds the GIL and alloctrace is tracing.
unsafe fn track(domain: u32, ptr: usize, size: usize) -> c_int {
    let traceback = match tracer::tracked_traceback(domain, size) {
        Ok(Some(traceback)) => traceback,
        Ok(None) => return 0,
        Err(()) => return -1,
    };
    let trace = Trace { size, traceback };
    if crate::native::enabled() {
        // A block the extension allocated with its own `malloc` leaves the native domain for
        // the one it names (see crate::native): counted once.
        tracer::forget_tracked(tracer::native_key(ptr));
    }
    if domain == DEFAULT_DOMAIN {
        return if tracer::record_tracked(ptr, trace) {
            0
        } else {
            -1
        };
    }
    let mut map = store();
    if map.try_reserve(1).is_err() {
        return -1;
    }
    let old = map.get(&(domain, ptr)).copied();
    if !tracer::account_tracked(domain, old, trace) {
        return -1;
    }
    map.insert((domain, ptr), trace);
    0
}

/// Forgets one tracked block; unknown blocks are ignored.
fn untrack(domain: u32, ptr: usize) {
    if domain == DEFAULT_DOMAIN {
        tracer::forget_tracked(ptr);
        return;
    }
    let mut map = store();
    if let Some(old) = map.remove(&(domain, ptr)) {
        // Nothing is added, so this cannot fail.
        let _ = tracer::table().account_outside(domain, Some(old), None);
    }
}

/// Empties the table (with `clear`) and the tracked blocks together, so that no tracked
/// block is charged to totals that `clear` then zeroes.
pub fn clear_with(table: &TraceTable, clear: impl FnOnce(&TraceTable)) {
    let mut map = store();
    clear(table);
    map.clear();
    map.shrink_to_fit();
}

/// Every tracked block outside domain 0: `(domain, address, trace)`.
pub fn collect() -> Vec<(u32, usize, Trace)> {
    store()
        .iter()
        .map(|(&(domain, address), &trace)| (domain, address, trace))
        .collect()
}

/// Bytes the map of tracked blocks holds (every bucket, empty or not, as the trace table
/// counts its own), for `get_tracemalloc_memory()`: numpy can track many blocks at once.
pub fn memory_usage() -> usize {
    let buckets = buckets_for_capacity(store().capacity());
    buckets * (std::mem::size_of::<((u32, usize), Trace)>() + 1)
}

/// Whether some redirected slot could not be put back by the last `stop()`.
pub fn left_behind() -> bool {
    LEFT_BEHIND.load(Relaxed)
}

/// The address of the code that really implements `symbol` for the process.
fn resolve(symbol: &CStr) -> usize {
    // SAFETY: dlsym with a NUL-terminated name.
    unsafe { libc::dlsym(libc::RTLD_DEFAULT, symbol.as_ptr()) as usize }
}

const TRACK: &CStr = c"PyTraceMalloc_Track";
const UNTRACK: &CStr = c"PyTraceMalloc_Untrack";
const DLOPEN: &CStr = c"dlopen";

/// The three redirections, as `(symbol, ours, the real function)`.
fn redirections() -> [(&'static CStr, usize, usize); 3] {
    [
        (
            TRACK,
            track_hook as *const () as usize,
            PyTraceMalloc_Track as *const () as usize,
        ),
        (
            UNTRACK,
            untrack_hook as *const () as usize,
            PyTraceMalloc_Untrack as *const () as usize,
        ),
        (DLOPEN, dlopen_hook as *const () as usize, resolve(DLOPEN)),
    ]
}

/// Points every extension's slots at ours. Caller holds [`PATCHING`].
fn redirect() {
    let ours = track_hook as *const () as usize;
    let mut rules = Vec::new();
    let skips: Vec<[usize; 2]> = redirections()
        .iter()
        .map(|&(_, _, real)| [ours, real])
        .collect();
    for ((symbol, to, _), skip) in redirections().into_iter().zip(&skips) {
        if skip[1] == 0 {
            continue; // not resolvable: nothing to redirect
        }
        // Import slots only: a rule with no `from` rewrites whatever a word holds, safe for
        // a slot the loader bound but not for a variable the library may have changed.
        rules.push(got::Rule {
            symbol,
            from: None,
            to,
            skip,
            lazy: false,
            data: false,
        });
    }
    // SAFETY: each replacement has the ABI of the symbol it replaces.
    unsafe { got::rewrite(&rules) };
    if crate::native::enabled() {
        crate::native::redirect();
    }
}

/// Puts back every slot that still points at ours. Caller holds [`PATCHING`].
fn restore() {
    let ours = track_hook as *const () as usize;
    let rules: Vec<got::Rule> = redirections()
        .into_iter()
        .filter(|&(_, _, real)| real != 0)
        .map(|(symbol, hook, real)| got::Rule {
            symbol,
            from: Some(hook),
            to: real,
            skip: std::slice::from_ref(&ours),
            lazy: false,
            data: false,
        })
        .collect();
    // SAFETY: each rule writes back the real function's address.
    unsafe { got::rewrite(&rules) };
    if crate::native::enabled() {
        crate::native::restore();
    }
    let left: Vec<got::Rule> = redirections()
        .into_iter()
        .map(|(symbol, hook, _)| got::Rule {
            symbol,
            from: Some(hook),
            to: hook,
            skip: std::slice::from_ref(&ours),
            lazy: false,
            data: false,
        })
        .collect();
    // A rule whose `to` equals `from` rewrites a slot with its own value: this only counts.
    // SAFETY: the value stored is the one already there.
    LEFT_BEHIND.store(unsafe { got::rewrite(&left) } != 0, Relaxed);
}

/// Starts redirecting (from `start()`, GIL held).
pub fn enable() {
    register_fork_handlers();
    let mut on = lock(&PATCHING);
    *on = true;
    redirect();
}

/// Stops redirecting (from `stop()`, GIL held). A thread already inside one of our functions
/// finishes in them: they stay loaded, and find tracing off.
pub fn disable() {
    let mut on = lock(&PATCHING);
    if *on {
        *on = false;
        restore();
    }
}

/// A fork while another thread holds one of our locks would leave the child a lock nobody
/// can release: the forking thread takes both first, and both processes release them. Other
/// threads wait for them meanwhile without parking (see [`lock`]), so the release is a plain
/// compare-and-swap in both processes.
fn register_fork_handlers() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: the handlers only touch process-lifetime statics.
        unsafe { libc::pthread_atfork(Some(before_fork), Some(after_fork), Some(after_fork)) };
    });
}

extern "C" fn before_fork() {
    std::mem::forget(lock(&PATCHING));
    std::mem::forget(store());
}

extern "C" fn after_fork() {
    // SAFETY: `before_fork` locked both on this (the forking) thread.
    unsafe {
        store_lock().force_unlock();
        PATCHING.force_unlock();
    }
}
