//! The crate's global allocator: the system allocator, plus a reserve of address space that
//! turns a failed small allocation into `MemoryError` rather than an abort.
//!
//! Rust aborts the process when an allocation fails (`handle_alloc_error`), and stable Rust
//! offers no way to make that a panic or an error. `tracemalloc` raises `MemoryError` where
//! memory runs out, and the program goes on; a tracer that kills the program it watches when
//! memory is short defeats its purpose. Two mechanisms together give the same behaviour:
//!
//! - Allocations that grow with the data (tables per trace, per traceback, per frame) are
//!   reserved fallibly ([`crate::platform::fallible`], `try_reserve`): a failure is an error value.
//! - The many small allocations around them (a traceback's frames, a file name, a formatted
//!   message) cannot all be written that way. When one of them fails, the allocator gives up
//!   a reserve mapped in advance ([`RESERVE`] bytes) and tries again, which succeeds; every
//!   failure is counted, and [`guarded`] turns an operation during which a failure happened
//!   into [`Error::OutOfMemory`], dropping its result. The reserve is mapped again at the
//!   start of the next guarded operation.
//!
//! The reserve is address space only (its pages are never touched): it shows in the virtual
//! size of the process, not in its resident memory. A failed allocation larger than
//! [`RESCUED`] bytes is not retried: those are the fallible ones, and spending the reserve on
//! one would leave nothing for the small allocations that follow. The hot path pays one
//! null check per allocation.

use std::alloc::{GlobalAlloc, Layout, System};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};

use crate::error::Error;

/// Address space held back for the small allocations that follow a failure.
const RESERVE: usize = 16 << 20;
/// Failed allocations up to this size are retried after the reserve is released.
const RESCUED: usize = 1 << 20;

static RESERVE_AT: AtomicPtr<libc::c_void> = AtomicPtr::new(null_mut());
/// Set when a failure took the reserve, cleared when [`arm`] maps a new one.
static SPENT: AtomicBool = AtomicBool::new(false);
/// Allocations that failed since the process started (retried or not).
static FAILURES: AtomicU64 = AtomicU64::new(0);

/// The system allocator with the failure handling described in the module documentation.
pub struct Allocator;

// SAFETY: every method forwards to `System` with the caller's arguments; the failure path
// only adds a counter update, an `munmap` of a mapping this module owns, and a retry.
unsafe impl GlobalAlloc for Allocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if p.is_null() {
            return rescue(layout.size(), || System.alloc(layout));
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc_zeroed(layout);
        if p.is_null() {
            return rescue(layout.size(), || System.alloc_zeroed(layout));
        }
        p
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = System.realloc(ptr, layout, new_size);
        if p.is_null() {
            return rescue(new_size, || System.realloc(ptr, layout, new_size));
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
}

/// Counts a failure and, for a small request, releases the reserve (once) and retries.
#[cold]
fn rescue(size: usize, retry: impl FnOnce() -> *mut u8) -> *mut u8 {
    FAILURES.fetch_add(1, Ordering::Relaxed);
    if size > RESCUED {
        return null_mut();
    }
    let reserve = RESERVE_AT.swap(null_mut(), Ordering::AcqRel);
    if reserve.is_null() {
        return null_mut();
    }
    SPENT.store(true, Ordering::Relaxed);
    // SAFETY: the swap made this thread the only owner of the mapping made in `arm`.
    unsafe { libc::munmap(reserve, RESERVE) };
    retry()
}

/// Maps the reserve if it is not in place (it was used, or never mapped); false if it
/// could not be, memory being that short.
pub fn arm() -> bool {
    if !RESERVE_AT.load(Ordering::Acquire).is_null() {
        return true;
    }
    // SAFETY: a fresh private anonymous mapping, owned by this module from here on.
    let p = unsafe {
        libc::mmap(
            null_mut(),
            RESERVE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return false;
    }
    if RESERVE_AT
        .compare_exchange(null_mut(), p, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        // Another thread armed it meanwhile.
        // SAFETY: `p` was never published.
        unsafe { libc::munmap(p, RESERVE) };
    }
    SPENT.store(false, Ordering::Relaxed);
    true
}

/// True from a failure that took the reserve until the next [`arm`]: memory is short, and
/// the fallible helpers refuse at once, so that a long loop of small allocations stops
/// while what is left of the reserve lasts instead of running into a second failure.
pub fn spent() -> bool {
    SPENT.load(Ordering::Relaxed)
}

/// Allocations that failed so far.
fn failures() -> u64 {
    FAILURES.load(Ordering::Relaxed)
}

/// Runs `operation`; if an allocation failed while it ran (in any thread: the operation's
/// own helper threads included), its result is dropped and the answer is
/// [`Error::OutOfMemory`]. Memory is short for everyone then, so a failure in another thread
/// counts too. Without a reserve in place (it could not be mapped again after a failure),
/// the operation does not start: a small allocation failing in it would abort.
pub fn guarded<T, E: From<Error>>(
    operation: impl FnOnce() -> std::result::Result<T, E>,
) -> std::result::Result<T, E> {
    if !arm() {
        return Err(Error::OutOfMemory.into());
    }
    let before = failures();
    let result = operation();
    if failures() != before {
        drop(result);
        return Err(Error::OutOfMemory.into());
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Result;

    #[test]
    fn a_failure_inside_a_guarded_operation_is_out_of_memory() {
        let ok: Result<u32> = guarded(|| Ok(7));
        assert_eq!(ok.unwrap(), 7);
        let failed: Result<Vec<u8>> = guarded(|| {
            // A request no address space holds, made through the allocator (not refused by
            // a capacity check first): counted, not retried.
            let layout = Layout::from_size_align(isize::MAX as usize / 2, 1).unwrap();
            // SAFETY: a valid layout; the result is null, checked below.
            let p = unsafe { Allocator.alloc(layout) };
            assert!(p.is_null());
            Ok(vec![1, 2, 3])
        });
        assert!(matches!(failed, Err(Error::OutOfMemory)));
    }
}
