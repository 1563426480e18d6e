//! This thread's current thread state on CPython 3.12 and later, read without a call into
//! libpython.
//!
//! From 3.12 the current thread state is a thread-local variable of libpython
//! (`_Py_tss_tstate`), set only while the thread holds a GIL. A shared libpython reaches it with
//! the general-dynamic TLS model, so its accessor (`_PyThreadState_UncheckedGet`,
//! `PyThreadState_GetUnchecked` on 3.13) is a call that makes a second call, to the dynamic
//! loader's `__tls_get_addr`: about twenty instructions, on every traced allocation and every
//! object reused from a free list (callgrind, raytrace on 3.12: 7.5 million calls, 1.3% of all
//! the run's instructions, with the hooks' own thread-local lookups beside them).
//!
//! The variable's address in a given thread never changes, so each thread asks
//! `__tls_get_addr` for it once, with the descriptor (module id, offset) the accessor itself
//! passes, and keeps it in its [`HookThread`], which every hook has at hand: a read of the
//! state is then two loads. The descriptor is read from the accessor's machine code, which
//! must be the canonical general-dynamic sequence, byte for byte (the linker rewrites that
//! sequence whenever it can do better, so anything else means another access model); the
//! address it gives is then checked against the accessor's own answer, at `start()` on a
//! thread holding the GIL and again on each thread's first look-up. Anything unexpected (a
//! static libpython, a build with TLS descriptors, an accessor the compiler laid out otherwise)
//! leaves that thread, or every thread, calling the accessor as before.

#[cfg(Py_3_12)]
use std::cell::Cell;
#[cfg(Py_3_12)]
use std::ffi::c_void;
#[cfg(Py_3_12)]
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

#[cfg(Py_3_12)]
use pyo3::ffi;

#[cfg(Py_3_12)]
use crate::hooks::hook_thread::HookThread;

/// A thread's `HookThread::tstate_slot` before its first look-up.
pub(crate) const NOT_LOOKED_UP: usize = 0;
/// A thread's slot when it calls the accessor every time.
const USE_ACCESSOR: usize = 1;

/// The accessor's `tls_index` (its address), or 0 while unknown or unusable.
#[cfg(Py_3_12)]
static DESCRIPTOR: AtomicUsize = AtomicUsize::new(0);

/// The x86-64 ELF `tls_index` that `__tls_get_addr` takes.
#[cfg(Py_3_12)]
#[repr(C)]
struct TlsIndex {
    module: usize,
    offset: usize,
}

#[cfg(Py_3_12)]
extern "C" {
    #[cfg_attr(not(Py_3_13), link_name = "_PyThreadState_UncheckedGet")]
    #[cfg_attr(Py_3_13, link_name = "PyThreadState_GetUnchecked")]
    fn accessor() -> *mut ffi::PyThreadState;
    fn __tls_get_addr(index: *const TlsIndex) -> *mut c_void;
}

/// `data16 lea disp32(%rip), %rdi`: the general-dynamic sequence's first instruction.
const LEA: [u8; 4] = [0x66, 0x48, 0x8d, 0x3d];
/// `data16 data16 rex.W call rel32`: its second, the call to `__tls_get_addr`.
const CALL: [u8; 4] = [0x66, 0x66, 0x48, 0xe8];
/// `mov (%rax), %rax`: the accessor reads the variable at the address returned.
const LOAD: [u8; 3] = [0x48, 0x8b, 0x00];
/// What may come before the sequence: nothing, `endbr64` (CET builds), and/or the stack
/// alignment (`sub $8, %rsp` or `push %rax`).
const PROLOGUES: [&[u8]; 6] = [
    &[],
    &[0x48, 0x83, 0xec, 0x08],
    &[0x50],
    &[0xf3, 0x0f, 0x1e, 0xfa],
    &[0xf3, 0x0f, 0x1e, 0xfa, 0x48, 0x83, 0xec, 0x08],
    &[0xf3, 0x0f, 0x1e, 0xfa, 0x50],
];

/// Where the accessor whose first bytes are `code`, found at address `at`, keeps its
/// `tls_index`: `None` unless `code` is a prologue, the general-dynamic sequence and the load.
fn descriptor_in(code: &[u8], at: usize) -> Option<usize> {
    PROLOGUES.iter().find_map(|prologue| {
        let rest = code.strip_prefix(*prologue)?;
        let lea_end = prologue.len() + 8;
        if rest.get(..4)? != LEA || rest.get(8..12)? != CALL || rest.get(16..19)? != LOAD {
            return None;
        }
        let disp = i32::from_le_bytes(rest[4..8].try_into().ok()?);
        Some((at + lea_end).wrapping_add_signed(disp as isize))
    })
}

/// Reads the accessor's descriptor and checks it on this thread. Called by `start()` with the
/// GIL held (the accessor then answers a live state); a later call finds the same.
///
/// # Safety
/// The GIL is held.
#[cfg(Py_3_12)]
pub(crate) unsafe fn prepare() {
    let at = accessor as *const () as usize;
    // SAFETY: the accessor's code is mapped and at least this long (the sequence alone is 16
    // bytes, the function returns after it).
    let code = std::slice::from_raw_parts(at as *const u8, 8 + 16 + 3);
    let Some(descriptor) = descriptor_in(code, at) else {
        return;
    };
    let now = accessor();
    if !now.is_null() && checked_slot(descriptor, now).is_some() {
        DESCRIPTOR.store(descriptor, Relaxed);
    }
}

/// This thread's address of the variable the accessor reads, found with `descriptor`, if it
/// holds `now` (what the accessor just answered on this thread).
///
/// # Safety
/// `descriptor` is the accessor's own (see [`descriptor_in`]), which it passes to
/// `__tls_get_addr`: the variable exists in every thread (for a libpython loaded at startup
/// its block is in place already, else this call makes it, as the accessor's own would).
#[cfg(Py_3_12)]
unsafe fn checked_slot(descriptor: usize, now: *mut ffi::PyThreadState) -> Option<usize> {
    let slot = __tls_get_addr(descriptor as *const TlsIndex) as *const *mut ffi::PyThreadState;
    (!slot.is_null() && slot.is_aligned() && *slot == now).then_some(slot as usize)
}

/// This thread's current thread state: the accessor's answer, read where it keeps it.
///
/// # Safety
/// `thread` is this thread's [`HookThread`].
#[cfg(Py_3_12)]
#[inline(always)]
pub(crate) unsafe fn current(thread: &HookThread) -> *mut ffi::PyThreadState {
    let slot = thread.tstate_slot.get();
    if slot > USE_ACCESSOR {
        // SAFETY: this thread's `_Py_tss_tstate`, checked on its first look-up.
        return *(slot as *const *mut ffi::PyThreadState);
    }
    look_up(&thread.tstate_slot)
}

/// A thread's first read (and every read of one that calls the accessor).
#[cfg(Py_3_12)]
#[cold]
#[inline(never)]
unsafe fn look_up(slot: &Cell<usize>) -> *mut ffi::PyThreadState {
    let now = accessor();
    if slot.get() == NOT_LOOKED_UP {
        slot.set(USE_ACCESSOR);
        let descriptor = DESCRIPTOR.load(Relaxed);
        if descriptor != 0 {
            if let Some(found) = checked_slot(descriptor, now) {
                slot.set(found);
            }
        }
    }
    now
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The general-dynamic sequence after each prologue, with the displacement 0x10 and the
    /// function at 0x1000: the descriptor is 0x10 past the `lea`'s end.
    fn accessor_code(prologue: &[u8]) -> Vec<u8> {
        let mut code = prologue.to_vec();
        code.extend_from_slice(&LEA);
        code.extend_from_slice(&0x10i32.to_le_bytes());
        code.extend_from_slice(&CALL);
        code.extend_from_slice(&[0xdc, 0x10, 0xe3, 0xff]);
        code.extend_from_slice(&LOAD);
        code.extend_from_slice(&[0x48, 0x83, 0xc4, 0x08, 0xc3]);
        code
    }

    #[test]
    fn descriptor_from_code() {
        for prologue in PROLOGUES {
            let code = accessor_code(prologue);
            let lea_end = 0x1000 + prologue.len() + 8;
            assert_eq!(
                descriptor_in(&code, 0x1000),
                Some(lea_end + 0x10),
                "{prologue:x?}"
            );
        }
        // A negative displacement.
        let mut code = accessor_code(&[0x48, 0x83, 0xec, 0x08]);
        code[8..12].copy_from_slice(&(-0x20i32).to_le_bytes());
        assert_eq!(descriptor_in(&code, 0x1000), Some(0x1000 + 12 - 0x20));
    }

    #[test]
    fn other_code_is_refused() {
        let sub = [0x48, 0x83, 0xec, 0x08];
        let mut cases: Vec<(&str, Vec<u8>)> = vec![
            // A static build's local-exec read: `mov %fs:disp32, %rax; ret`.
            (
                "local-exec",
                vec![0x64, 0x48, 0x8b, 0x04, 0x25, 0xf8, 0xff, 0xff, 0xff, 0xc3],
            ),
            ("empty", vec![]),
            ("cut short", accessor_code(&sub)[..18].to_vec()),
        ];
        let mut no_prefix = accessor_code(&sub);
        no_prefix[4] = 0x90; // the lea's data16 prefix
        cases.push(("lea without its prefix", no_prefix));
        let mut other_call = accessor_code(&sub);
        other_call[15] = 0xff; // an indirect call: TLS descriptors
        cases.push(("other call", other_call));
        let mut no_load = accessor_code(&sub);
        no_load[22] = 0x01; // mov (%rcx): not the returned address
        cases.push(("other load", no_load));
        let mut unknown_prologue = accessor_code(&[]);
        unknown_prologue.insert(0, 0x55); // push %rbp
        cases.push(("unknown prologue", unknown_prologue));
        for (case, code) in cases {
            assert_eq!(descriptor_in(&code, 0x1000), None, "{case}");
        }
    }
}
