//! Native allocations (opt-in, `start(native=True)`): the `malloc` family and anonymous
//! `mmap`/`munmap`/`mremap` called by extension modules and the libraries they load, recorded
//! in a domain of their own, [`DOMAIN`].
//!
//! The calls are redirected the way [`crate::tracked`] redirects `PyTraceMalloc_Track`: by
//! rewriting import-table slots ([`crate::tracked::got`]), in every loaded object but four:
//! alloctrace itself (its own allocations are the tracer's), the definer of each function
//! (libc, and a preloaded `malloc` such as jemalloc, whose `mmap` calls are its arenas), the
//! interpreter (libpython, or the executable when it is linked statically: the
//! PEP 445 hooks already see what it allocates, so counting its `malloc` calls too would count
//! blocks twice) and the dynamic loader. Libraries loaded later are rewritten by the `dlopen`
//! redirection before their code runs. Only slots that hold the process's own function (or a
//! lazily bound stub that would resolve to it) are rewritten, so an object bound to another
//! allocator keeps it: a block is always freed by the allocator that made it.
//!
//! The same rules rewrite the pointer variables that the loader filled with these functions'
//! addresses (data relocations, see [`crate::tracked::got`]): a library that keeps its
//! allocator in variables (libxml2's `xmlMalloc`/`xmlRealloc`/`xmlFree`, linked statically
//! into lxml's wheel) never calls `malloc` through its import table, and would be invisible
//! otherwise. Only words still holding the process's function are rewritten, and `stop()`
//! restores only words still holding our hook: a library that installed its own allocator in
//! between keeps it. A block may thus cross the switch (allocated by the real function and
//! freed through a hook, or the reverse): the first is a harmless miss like any block from
//! before `start()`, the second leaves the table, which `stop()` clears anyway. The same
//! pointer read through the import table and through a variable stays equal, since both
//! change together.
//!
//! Each hook calls the real function (through alloctrace's own, never rewritten, slots), then
//! records the block in the main trace table under [`crate::hooks::tracer::native_key`] (its address
//! with the low bit set): the same shard locks, totals, peak and snapshots as the PEP 445
//! hooks, one shard lock per call. Blocks are forgotten before they are freed, as in the
//! PEP 445 hooks, so that a concurrent allocation reusing the address is never lost. Blocks
//! allocated before `start()` are unknown and their frees, reallocations and unmappings are
//! harmless misses.
//!
//! Tracebacks are the calling thread's Python stack when it holds the GIL; a thread that
//! released it (or never had a Python frame) gets `<unknown>`, as RAW-domain allocations do:
//! reading another thread's Python state without the GIL is not safe.
//!
//! A block an extension also reports with `PyTraceMalloc_Track` (numpy's array data on 3.9-
//! 3.11, which it allocates with plain `malloc`) leaves this domain for the tracked one when
//! reported, so it is counted once, in the domain the extension names.

use std::ffi::{c_int, c_void, CStr};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use crate::error::Result;
use crate::hooks::sampler::Scope;
use crate::hooks::table::Trace;
use crate::hooks::tracer;
use crate::tracked::got;

pub mod mappings;

use mappings::page_round;

extern "C" {
    /// Not declared by the libc crate; glibc has it (page-aligned malloc).
    fn valloc(size: usize) -> *mut c_void;
}

/// The domain of native blocks in traces, snapshots and dumps: "NATV" in ASCII. tracemalloc
/// uses 0 and numpy 389047; a number this far from both (and from small integers an
/// extension might pick) is unlikely to be anyone's `PyTraceMalloc_Track` domain.
pub const DOMAIN: u32 = 0x4E41_5456;

/// The name the Python API and the CLI give [`DOMAIN`].
pub const NAME: &str = "native";

/// Whether the running session records native allocations; changed only by `start()` and
/// `stop()`, with the GIL held.
static ENABLED: AtomicBool = AtomicBool::new(false);

pub fn enabled() -> bool {
    ENABLED.load(Relaxed)
}

/// Set before the slots are redirected and cleared after they are restored (see
/// [`crate::hooks::tracer::start`]).
pub fn set_enabled(on: bool) {
    ENABLED.store(on, Relaxed);
}

unsafe extern "C" fn malloc_hook(size: usize) -> *mut c_void {
    let scope = Scope::enter();
    let ptr = libc::malloc(size);
    if !ptr.is_null() {
        tracer::on_native_alloc(ptr as usize, size, &scope);
    }
    ptr
}

unsafe extern "C" fn calloc_hook(nelem: usize, elsize: usize) -> *mut c_void {
    let scope = Scope::enter();
    let ptr = libc::calloc(nelem, elsize);
    if !ptr.is_null() {
        // calloc refuses products that overflow: a block means the product fits.
        tracer::on_native_alloc(ptr as usize, nelem.wrapping_mul(elsize), &scope);
    }
    ptr
}

unsafe extern "C" fn realloc_hook(ptr: *mut c_void, size: usize) -> *mut c_void {
    // Forgotten before realloc can free it (see the module docs); the trace may be put back,
    // so no sweep frees its traceback meanwhile.
    tracer::begin_putting_back();
    let old = tracer::on_native_free(ptr as usize);
    let scope = Scope::enter();
    let new = libc::realloc(ptr, size);
    // glibc's realloc(ptr, 0) frees the block and returns null: nothing to put back.
    let freed = new.is_null() && size == 0 && !ptr.is_null();
    if !freed {
        let new = (!new.is_null()).then_some(new as usize);
        tracer::on_native_realloc_end(ptr as usize, new, size, old, true, &scope);
    }
    tracer::end_putting_back();
    new
}

unsafe extern "C" fn free_hook(ptr: *mut c_void) {
    tracer::on_native_free(ptr as usize);
    libc::free(ptr)
}

unsafe extern "C" fn posix_memalign_hook(
    out: *mut *mut c_void,
    alignment: usize,
    size: usize,
) -> c_int {
    let scope = Scope::enter();
    let rc = libc::posix_memalign(out, alignment, size);
    if rc == 0 && !(*out).is_null() {
        tracer::on_native_alloc(*out as usize, size, &scope);
    }
    rc
}

unsafe extern "C" fn aligned_alloc_hook(alignment: usize, size: usize) -> *mut c_void {
    let scope = Scope::enter();
    let ptr = libc::aligned_alloc(alignment, size);
    if !ptr.is_null() {
        tracer::on_native_alloc(ptr as usize, size, &scope);
    }
    ptr
}

unsafe extern "C" fn memalign_hook(alignment: usize, size: usize) -> *mut c_void {
    let scope = Scope::enter();
    let ptr = libc::memalign(alignment, size);
    if !ptr.is_null() {
        tracer::on_native_alloc(ptr as usize, size, &scope);
    }
    ptr
}

unsafe extern "C" fn valloc_hook(size: usize) -> *mut c_void {
    let scope = Scope::enter();
    let ptr = valloc(size);
    if !ptr.is_null() {
        tracer::on_native_alloc(ptr as usize, size, &scope);
    }
    ptr
}

unsafe extern "C" fn mmap_hook(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    offset: libc::off_t,
) -> *mut c_void {
    let scope = Scope::enter();
    let ptr = libc::mmap(addr, len, prot, flags, fd, offset);
    if ptr != libc::MAP_FAILED {
        // A MAP_FIXED mapping replaces what was there: as if that range had been unmapped.
        unmapping(ptr as usize, len);
        // File mappings are the page cache's memory, not the program's allocations.
        if flags & libc::MAP_ANONYMOUS != 0 {
            mappings::lock().add(ptr as usize, len);
            tracer::on_native_alloc(ptr as usize, len, &scope);
        }
    }
    ptr
}

unsafe extern "C" fn munmap_hook(addr: *mut c_void, len: usize) -> c_int {
    unmapping(addr as usize, len);
    libc::munmap(addr, len)
}

/// `[addr, addr + len)` is about to be unmapped: each traced mapping it overlaps loses its
/// trace, and the pieces of it left mapped are traced in its place, with its traceback (see
/// [`mappings`]). Returns the trace of the mapping that started at `addr` (with its full
/// size), if there was one.
///
/// Traces are taken out and pieces put back with their traceback: under
/// [`tracer::begin_putting_back`], so that no sweep frees that traceback meanwhile.
fn unmapping(addr: usize, len: usize) -> Option<Trace> {
    tracer::begin_putting_back();
    let _putting_back = PuttingBack;
    let mut cuts = Vec::new();
    mappings::lock().cut(addr, len, &mut cuts);
    if cuts.is_empty() {
        // A mapping made before start(), or a block of another kind: only an exact match.
        return tracer::on_native_free(addr);
    }
    let mut at_addr = None;
    for cut in cuts {
        let Some(trace) = tracer::on_native_free(cut.start) else {
            continue;
        };
        // The trace's size is the length asked for, which may end inside the last page.
        let traced_end = cut.start.saturating_add(trace.size);
        let piece = |start: usize, len: usize| {
            let size = traced_end.min(start + len).saturating_sub(start);
            if size > 0 {
                tracer::on_native_unmap_rest(start, Trace { size, ..trace });
            }
        };
        if let Some((start, len)) = cut.head {
            piece(start, len);
        }
        if let Some((start, len)) = cut.tail {
            piece(start, len);
        }
        if cut.start == addr {
            at_addr = Some(trace);
        }
    }
    at_addr
}

/// `mremap` is variadic: the fifth argument (the new address) is only read with
/// `MREMAP_FIXED`. On x86-64 a variadic callee receives its arguments exactly as a fixed
/// one does, so this reads the fifth register and passes it on either way.
unsafe extern "C" fn mremap_hook(
    old: *mut c_void,
    old_len: usize,
    new_len: usize,
    flags: c_int,
    new_address: *mut c_void,
) -> *mut c_void {
    // The moved part leaves its mapping (pieces of it outside `old_len` stay traced); its
    // trace is put back at the new address with its traceback (see `unmapping`).
    tracer::begin_putting_back();
    let _putting_back = PuttingBack;
    let whole = unmapping(old as usize, old_len);
    let moved = whole.map(|trace| Trace {
        size: trace.size.min(page_round(old_len)),
        ..trace
    });
    let scope = Scope::enter();
    let ptr = libc::mremap(old, old_len, new_len, flags, new_address);
    let new = (ptr != libc::MAP_FAILED).then_some(ptr as usize);
    if moved.is_some() {
        // Only anonymous mappings are traced: a file mapping moved stays unknown here.
        let (start, len) = new.map_or((old as usize, old_len), |p| (p, new_len));
        mappings::lock().add(start, len);
    }
    tracer::on_native_realloc_end(old as usize, new, new_len, moved, false, &scope);
    ptr
}

/// Ends a [`tracer::begin_putting_back`] when dropped (after the hook's last use of the trace
/// it took out).
struct PuttingBack;

impl Drop for PuttingBack {
    fn drop(&mut self) {
        tracer::end_putting_back();
    }
}

/// The redirected functions: `(symbol, our hook)`.
fn hooks() -> [(&'static CStr, usize); 12] {
    [
        (c"malloc", malloc_hook as *const () as usize),
        (c"calloc", calloc_hook as *const () as usize),
        (c"realloc", realloc_hook as *const () as usize),
        (c"free", free_hook as *const () as usize),
        (c"posix_memalign", posix_memalign_hook as *const () as usize),
        (c"aligned_alloc", aligned_alloc_hook as *const () as usize),
        (c"memalign", memalign_hook as *const () as usize),
        (c"valloc", valloc_hook as *const () as usize),
        (c"mmap", mmap_hook as *const () as usize),
        // glibc's 64-bit-offset name for the same function on x86-64.
        (c"mmap64", mmap_hook as *const () as usize),
        (c"munmap", munmap_hook as *const () as usize),
        (c"mremap", mremap_hook as *const () as usize),
    ]
}

/// The address of the code that really implements `symbol` for the process.
fn resolve(symbol: &CStr) -> usize {
    // SAFETY: dlsym with a NUL-terminated name.
    unsafe { libc::dlsym(libc::RTLD_DEFAULT, symbol.as_ptr()) as usize }
}

/// An address inside each object whose calls are never redirected (besides the definer of
/// each function and the process's allocator): alloctrace, the interpreter, the executable
/// and the dynamic loader.
fn never_redirected() -> [usize; 4] {
    extern "C" {
        fn PyTraceMalloc_Track(domain: std::ffi::c_uint, ptr: usize, size: usize) -> c_int;
    }
    // SAFETY: getauxval has no preconditions (0 for an entry the kernel did not give).
    let (entry, loader) = unsafe {
        (
            libc::getauxval(libc::AT_ENTRY) as usize,
            libc::getauxval(libc::AT_BASE) as usize,
        )
    };
    [
        malloc_hook as *const () as usize,
        PyTraceMalloc_Track as *const () as usize,
        entry,
        loader,
    ]
}

/// The addresses a slot bound to `symbol`'s process-wide definition may hold: what `dlsym`
/// finds, and, when that is a stub in a non-PIE executable (the "canonical" address such an
/// executable gives a function it calls), the address that stub jumps to, which the loader
/// writes into shared objects' `JUMP_SLOT`s instead. All of them reach the same function.
fn bindings(symbol: &CStr, entry: usize) -> Vec<usize> {
    let canonical = resolve(symbol);
    if canonical == 0 {
        return Vec::new();
    }
    let mut all = vec![canonical];
    // SAFETY: only reads the executable's import table.
    if let Some(target) = unsafe { got::import_value(symbol, entry) } {
        if target != 0 && target != canonical {
            all.push(target);
        }
    }
    all
}

/// Points every eligible slot at our hooks. Called with [`crate::tracked`]'s patching lock
/// held (at `start()` and after each `dlopen`), while [`enabled`].
pub fn redirect() {
    let never = never_redirected();
    let entry = never[2];
    // The process's `malloc` may come from a preloaded allocator (jemalloc, tcmalloc) whose
    // own `mmap` calls are its arenas: the blocks it hands out from them are counted by the
    // malloc hooks already, so its object is left alone for every function, as libc is.
    let mut skipped = never.to_vec();
    skipped.extend(bindings(c"malloc", entry));
    let mut plan: Vec<(&CStr, usize, usize, Vec<usize>)> = Vec::new();
    for (symbol, hook) in hooks() {
        for bound in bindings(symbol, entry) {
            let mut skip = skipped.clone();
            skip.push(bound);
            plan.push((symbol, hook, bound, skip));
        }
    }
    let rules: Vec<got::Rule> = plan
        .iter()
        .map(|(symbol, hook, bound, skip)| got::Rule {
            symbol,
            from: Some(*bound),
            to: *hook,
            skip,
            lazy: true,
            data: true,
        })
        .collect();
    // SAFETY: each hook has the ABI of the function it replaces and calls that function.
    unsafe { got::rewrite(&rules) };
}

/// Puts back every slot that holds one of our hooks. Called with [`crate::tracked`]'s
/// patching lock held, at `stop()`.
pub fn restore() {
    let ours = [malloc_hook as *const () as usize];
    let plan: Vec<(&CStr, usize, usize)> = hooks()
        .into_iter()
        .map(|(symbol, hook)| (symbol, hook, resolve(symbol)))
        .filter(|&(_, _, real)| real != 0)
        .collect();
    let rules: Vec<got::Rule> = plan
        .iter()
        .map(|&(symbol, hook, real)| got::Rule {
            symbol,
            from: Some(hook),
            to: real,
            skip: &ours,
            lazy: false,
            data: true,
        })
        .collect();
    // SAFETY: each rule writes back the real function's address.
    unsafe { got::rewrite(&rules) };
    // Mappings made from now on are unknown; the next session starts afresh.
    mappings::lock().clear();
}

/// How many slots hold one of our hooks now (a diagnostic for tests).
pub fn redirected_slots() -> usize {
    let ours = [malloc_hook as *const () as usize];
    let rules: Vec<got::Rule> = hooks()
        .into_iter()
        .map(|(symbol, hook)| got::Rule {
            symbol,
            from: Some(hook),
            to: hook,
            skip: &ours,
            lazy: false,
            data: true,
        })
        .collect();
    // A rule whose `to` equals `from` rewrites a slot with its own value: this only counts.
    // SAFETY: the value stored is the one already there.
    unsafe { got::rewrite(&rules) }
}

/// Moves the native entries of `live` (the main table's, keyed by
/// [`tracer::native_key`]) to `tracked`, with their real addresses and [`DOMAIN`].
pub fn split(live: &mut Vec<(usize, Trace)>, tracked: &mut Vec<(u32, usize, Trace)>) -> Result<()> {
    let native = live.iter().filter(|(key, _)| key & 1 == 1).count();
    if native == 0 {
        return Ok(());
    }
    tracked.try_reserve_exact(native)?;
    live.retain(|&(key, trace)| {
        if key & 1 == 1 {
            tracked.push((DOMAIN, key & !1, trace));
            false
        } else {
            true
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_moves_tagged_keys_only() {
        let t = |size| Trace { size, traceback: 7 };
        let mut live = vec![
            (0x1000, t(1)),
            (0x2001, t(2)),
            (0x3000, t(3)),
            (0x4001, t(4)),
        ];
        let mut tracked = vec![(389047, 0x5000, t(5))];
        split(&mut live, &mut tracked).unwrap();
        assert_eq!(live, vec![(0x1000, t(1)), (0x3000, t(3))]);
        assert_eq!(
            tracked,
            vec![
                (389047, 0x5000, t(5)),
                (DOMAIN, 0x2000, t(2)),
                (DOMAIN, 0x4000, t(4))
            ]
        );
    }

    #[test]
    fn page_round_cases() {
        for (len, want) in [
            (0, 0),
            (1, 4096),
            (4096, 4096),
            (4097, 8192),
            (usize::MAX, usize::MAX & !4095),
        ] {
            assert_eq!(page_round(len), want, "{len}");
        }
    }

    #[test]
    fn domain_is_neither_tracemallocs_nor_numpys() {
        assert_ne!(DOMAIN, 0);
        assert_ne!(DOMAIN, 389047);
        assert_eq!(&DOMAIN.to_be_bytes(), b"NATV");
    }
}
