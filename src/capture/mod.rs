//! Reading the Python stack from inside an allocator hook.
//!
//! A hook cannot call the Python API (it may allocate, run the GC, or take the GIL), so it reads
//! the interpreter's own frame chain directly. That chain is private and changes shape between
//! minor versions, hence one file per version behind the small [`Interpreter`] trait, and one
//! dispatch point ([`Current`]) chosen at build time: a build of alloctrace targets exactly one
//! interpreter (maturin builds one wheel per interpreter), and the field offsets come from that
//! interpreter's headers (`layout.c`, compiled and run by `build.rs`).
//!
//! The walker records raw frames — a code object and a byte offset into its bytecode — and
//! never computes a line number: that is what makes the standard module slow, and it can wait
//! until someone looks at a snapshot (see [`crate::hooks::intern`]).

use std::ffi::c_void;

use pyo3::ffi;

use crate::hooks::hook_thread::HookThread;

#[allow(dead_code)]
pub(crate) mod layout {
    include!(concat!(env!("OUT_DIR"), "/layout.rs"));
}

// Unused on 3.9 and 3.10, which remember depths per frame object instead.
#[cfg_attr(not(Py_3_11), allow(dead_code))]
pub(crate) mod depth;
#[cfg(not(Py_3_11))]
pub(crate) mod frame_depths;
mod lines;
// Compiled on every version so that its tests of the code reading run wherever cargo test
// does; only 3.12 and later read the thread state through it.
#[cfg_attr(not(Py_3_12), allow(dead_code))]
pub(crate) mod thread_state;
#[cfg(all(Py_3_10, not(Py_3_11)))]
mod v3_10;
#[cfg(all(Py_3_11, not(Py_3_12)))]
mod v3_11;
#[cfg(all(Py_3_12, not(Py_3_13)))]
mod v3_12;
#[cfg(all(Py_3_13, not(Py_3_14)))]
mod v3_13;
#[cfg(not(Py_3_10))]
mod v3_9;

/// The one dispatch point: the interpreter this build targets.
#[cfg(not(Py_3_10))]
pub type Current = v3_9::Python39;
#[cfg(all(Py_3_10, not(Py_3_11)))]
pub type Current = v3_10::Python310;
#[cfg(all(Py_3_11, not(Py_3_12)))]
pub type Current = v3_11::Python311;
#[cfg(all(Py_3_12, not(Py_3_13)))]
pub type Current = v3_12::Python312;
#[cfg(all(Py_3_13, not(Py_3_14)))]
pub type Current = v3_13::Python313;

// pyo3's cfgs and the headers build.rs compiled against must agree on the minor version.
const _: () = assert!(layout::PY_VERSION_HEX >> 16 == (Current::MINOR as u32) | 0x0300);

/// The most frames a traceback may hold, as in `tracemalloc` (its frame count is 16-bit).
pub const MAX_NFRAME: usize = u16::MAX as usize;

/// A frame as the hook sees it: which code object, and where in its bytecode.
///
/// `offset` is the byte offset `PyCode_Addr2Line` expects. `code == 0` is the placeholder frame
/// `('<unknown>', 0)` that stands for a stack that could not be read.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct RawFrame {
    pub code: usize,
    pub offset: i32,
    /// Always zero: the padding after `offset`, made a field so that every byte of a frame is
    /// set and a stack can be compared as words ([`RawFrame::words`]).
    zero: u32,
}

impl RawFrame {
    pub const UNKNOWN: RawFrame = RawFrame::new(0, 0);

    #[inline(always)]
    pub const fn new(code: usize, offset: i32) -> RawFrame {
        RawFrame {
            code,
            offset,
            zero: 0,
        }
    }

    /// Points this frame at `code` and `offset`. The walkers write their frames this way, two
    /// stores a frame: `zero` is already zero in every `RawFrame` (no other value can be
    /// made), so it is not stored again.
    #[inline(always)]
    pub fn set(&mut self, code: usize, offset: i32) {
        self.code = code;
        self.offset = offset;
    }

    /// A stack as the words it is made of, two a frame: equal words, equal frames. Comparing
    /// those is a `memcmp`, where the derived equality of frames tests each field with a
    /// branch of its own (eight instructions a frame under callgrind).
    #[inline(always)]
    pub fn words(frames: &[RawFrame]) -> &[u64] {
        const _: () = assert!(std::mem::size_of::<RawFrame>() == 16);
        // SAFETY: `RawFrame` is `repr(C)`, 16 bytes with no padding (two words, the second
        // `offset` and `zero`) and 8-byte aligned, so its memory is initialised `u64`s.
        unsafe { std::slice::from_raw_parts(frames.as_ptr().cast(), frames.len() * 2) }
    }
}

/// What differs between CPython versions, and nothing else.
pub trait Interpreter {
    /// The minor version (`9` for 3.9) this implementation reads.
    const MINOR: u8;

    /// The calling thread's state if — and only if — this thread holds the GIL, so that its
    /// frames cannot change under us and GIL-protected tracer state may be touched. Null for
    /// a thread without a Python thread state or one that released the GIL.
    ///
    /// `gil_held` says the caller already knows the GIL is held (the MEM and OBJ domains
    /// require it, and pymalloc is not thread-safe without it), which saves the check where
    /// it costs a thread-specific-data lookup.
    ///
    /// `thread` is this thread's hook state, where 3.12 and later keep the address of the
    /// interpreter's thread-local current state ([`thread_state`]).
    ///
    /// # Safety
    /// Callable from any thread, with or without the GIL; must not allocate (on 3.12 and
    /// later a thread's first call asks the dynamic loader where the interpreter's
    /// thread-local is, as the interpreter's own accessor does on every call).
    unsafe fn gil_thread_state(thread: &HookThread, gil_held: bool) -> *mut ffi::PyThreadState;

    /// Writes up to `out.len()` frames of `tstate`'s stack into `out`, most recent first,
    /// skipping incomplete frames as `tracemalloc` does. Returns how many were written and the
    /// stack's full depth (capped at [`MAX_NFRAME`]).
    ///
    /// Implementations are `#[inline(always)]`: the allocation hook is its one hot caller,
    /// and a call there cost a set of saved registers on every allocation.
    ///
    /// # Safety
    /// `tstate` comes from [`Interpreter::gil_thread_state`] on this thread, and the GIL is
    /// still held.
    unsafe fn walk(tstate: *mut ffi::PyThreadState, out: &mut [RawFrame]) -> (usize, u16);

    /// [`Interpreter::walk`] for a thread that released the GIL: the same frames, and the
    /// full depth counted by walking to the bottom, without the per-thread or per-frame depth
    /// caches that only a GIL holder may touch (see [`crate::hooks::released`]).
    ///
    /// # Safety
    /// `tstate` is this thread's own state ([`this_thread_state`]), which this thread is not
    /// running Python code with right now: only this thread links or unlinks its frames, so
    /// they and the code objects they hold stay put while it is in the hook.
    unsafe fn walk_released(tstate: *mut ffi::PyThreadState, out: &mut [RawFrame]) -> (usize, u16);

    /// The address of the memory block that holds `obj`: objects tracked by the GC (and, from
    /// 3.11, objects with a managed dict or weak-reference slot) start after a pre-header.
    ///
    /// # Safety
    /// `obj` is a live object and the GIL is held.
    unsafe fn object_block(obj: *mut ffi::PyObject) -> usize;

    /// Appends to `out` the line of each byte offset in `offsets` of the code object `code`,
    /// as `PyCode_Addr2Line` gives it (-1 where there is none). Offsets in ascending order
    /// are answered in one reading of the line table ([`lines`] says why that matters).
    ///
    /// # Safety
    /// `code` is a live code object and the GIL is held.
    unsafe fn lines(code: *mut ffi::PyObject, offsets: &[i32], out: &mut Vec<i32>);

    /// Replaces `out` with the code object's line table as runs `(first byte offset, line)`,
    /// ascending: every offset from a run's start to the next run's has the run's line, as
    /// [`Interpreter::lines`] gives it, and the last run holds for every offset past it. For
    /// hooks: `None`, and nothing allocated, if `out` cannot grow.
    ///
    /// # Safety
    /// `code` is a live code object and the GIL is held.
    unsafe fn line_runs(code: *mut ffi::PyObject, out: &mut Vec<(i32, i32)>) -> Option<()>;
}

/// The interpreter a thread state belongs to (to tell the main interpreter's threads apart).
///
/// # Safety
/// `tstate` is a live thread state.
pub unsafe fn interpreter_of(tstate: *mut ffi::PyThreadState) -> *mut c_void {
    read_ptr(tstate.cast(), layout::TSTATE_INTERP)
}

/// Whether a frame's code slot holds a code object. In 3.11 and 3.12 the slot is typed
/// `PyCodeObject *` and set before the frame is linked into the chain, so only 3.13's
/// `f_executable` (`None` in the C-stack shim frames, which are skipped before this test) is
/// checked, by its type pointer alone (no API call): one load and compare fewer per frame
/// where it cannot fail.
///
/// # Safety
/// `obj` is null or a live object.
#[cfg(Py_3_11)]
#[inline(always)]
unsafe fn is_code(obj: *mut c_void) -> bool {
    #[cfg(not(Py_3_13))]
    return !obj.is_null();
    #[cfg(Py_3_13)]
    return !obj.is_null()
        && (*(obj as *mut ffi::PyObject)).ob_type == std::ptr::addr_of_mut!(ffi::PyCode_Type);
}

/// Reads the pointer stored `offset` bytes into `base`.
///
/// # Safety
/// `base + offset` is a readable, aligned pointer field.
#[inline(always)]
unsafe fn read_ptr(base: *const c_void, offset: usize) -> *mut c_void {
    *(base.cast::<u8>().add(offset) as *const *mut c_void)
}

/// `gil_thread_state` before 3.12: the "current" thread state is the GIL holder's, whichever
/// thread that is; it is ours only if it is also the state bound to this OS thread.
///
/// The holder is read where `_PyThreadState_UncheckedGet` reads it, a field of the runtime
/// state (its offset from the interpreter's own headers, as every other offset here): a
/// load instead of a call into libpython on every hook.
///
/// # Safety
/// As [`Interpreter::gil_thread_state`].
#[cfg(not(Py_3_12))]
#[inline(always)]
unsafe fn gil_holder_if_this_thread(gil_held: bool) -> *mut ffi::PyThreadState {
    use std::sync::atomic::{AtomicPtr, Ordering::Relaxed};
    extern "C" {
        fn _PyThreadState_UncheckedGet() -> *mut ffi::PyThreadState;
        /// `_PyRuntimeState`, of which only the address is used.
        static _PyRuntime: u8;
    }
    let holder = match layout::RUNTIME_TSTATE_CURRENT {
        Some(offset) => {
            let current = (&raw const _PyRuntime).add(offset);
            (*current.cast::<AtomicPtr<ffi::PyThreadState>>()).load(Relaxed)
        }
        None => _PyThreadState_UncheckedGet(),
    };
    if gil_held {
        return holder;
    }
    if holder.is_null() || holder != ffi::PyGILState_GetThisThreadState() {
        return std::ptr::null_mut();
    }
    holder
}

/// The frame-object walk of 3.9 and 3.10: `PyFrameObject`s linked by `f_back`, hung from
/// `tstate->frame`; `lasti_unit` converts `f_lasti` to bytes.
///
/// # Safety
/// As [`Interpreter::walk`].
#[cfg(not(Py_3_11))]
#[inline(always)]
unsafe fn walk_frame_objects(
    tstate: *mut ffi::PyThreadState,
    out: &mut [RawFrame],
    lasti_unit: i32,
) -> (usize, u16) {
    let mut frame = read_ptr(tstate.cast(), layout::TSTATE_FRAME);
    // By pointer, as in `walk_and_count`.
    let first_out = out.as_mut_ptr();
    let end = first_out.add(out.len());
    let mut next_out = first_out;
    while !frame.is_null() && next_out < end {
        let lasti = *(frame.cast::<u8>().add(layout::FRAME_LASTI) as *const i32);
        (*next_out).set(
            read_ptr(frame, layout::FRAME_CODE) as usize,
            lasti.wrapping_mul(lasti_unit),
        );
        next_out = next_out.add(1);
        frame = read_ptr(frame, layout::FRAME_BACK);
    }
    let n = next_out.offset_from(first_out) as usize;
    let below = if frame.is_null() {
        0
    } else {
        frame_depths::depth(frame, frame_depths::FRAME_OBJECTS)
    };
    (n, total_nframe(n, below))
}

/// [`walk_frame_objects`] without the depths remembered per frame object (a GIL holder's
/// cache): the frames below the captured ones are counted one by one.
///
/// # Safety
/// As [`Interpreter::walk_released`].
#[cfg(not(Py_3_11))]
unsafe fn walk_frame_objects_released(
    tstate: *mut ffi::PyThreadState,
    out: &mut [RawFrame],
    lasti_unit: i32,
) -> (usize, u16) {
    let mut frame = read_ptr(tstate.cast(), layout::TSTATE_FRAME);
    let mut n = 0;
    while !frame.is_null() && n < out.len() {
        let lasti = *(frame.cast::<u8>().add(layout::FRAME_LASTI) as *const i32);
        out[n].set(
            read_ptr(frame, layout::FRAME_CODE) as usize,
            lasti.wrapping_mul(lasti_unit),
        );
        n += 1;
        frame = read_ptr(frame, layout::FRAME_BACK);
    }
    let mut below = 0;
    while !frame.is_null() && below < MAX_NFRAME {
        below += 1;
        frame = read_ptr(frame, layout::FRAME_BACK);
    }
    (n, total_nframe(n, below))
}

/// This OS thread's own thread state, GIL or no GIL: the one `PyGILState_GetThisThreadState`
/// answers (a thread-specific-data read, no lock, no allocation, on 3.9-3.13), whose frames
/// `tracemalloc` walks for a RAW-domain block allocated without the GIL. Null for a thread
/// that never had one (started in C and never called into Python).
///
/// # Safety
/// Callable from any thread.
#[inline]
pub unsafe fn this_thread_state() -> *mut ffi::PyThreadState {
    ffi::PyGILState_GetThisThreadState()
}

/// Whether the main interpreter is finalizing, when the threads of a finalizing interpreter
/// may have their states freed by another thread (daemon threads).
///
/// # Safety
/// Callable from any thread (reads one field of the runtime).
pub unsafe fn finalizing() -> bool {
    extern "C" {
        #[cfg_attr(not(Py_3_13), link_name = "_Py_IsFinalizing")]
        #[cfg_attr(Py_3_13, link_name = "Py_IsFinalizing")]
        fn is_finalizing() -> std::os::raw::c_int;
    }
    is_finalizing() != 0
}

/// A frame resolved where it was walked, by a thread without the GIL: what a snapshot shows
/// for it, so that it no longer depends on its code object (see [`crate::hooks::released`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LocatedFrame {
    pub filename: Box<[u8]>,
    pub line: u32,
    /// The function's name and first line, if its name is a `str`.
    pub function: Option<(Box<[u8]>, u32)>,
}

/// Resolves `frame` without the GIL: its code object's filename and name are read as the
/// immutable `str`s they are, and its line from its line table ([`Interpreter::lines`],
/// which only reads the table's bytes). `None` if memory cannot be had.
///
/// # Safety
/// `frame.code` is a live code object that stays alive during the call (held by a frame of
/// the calling thread, which does not hold the GIL).
pub unsafe fn locate_released(frame: RawFrame) -> Option<LocatedFrame> {
    let code = frame.code as *mut c_void;
    let text = |offset: usize| -> Option<Option<Box<[u8]>>> {
        let s = read_ptr(code, offset) as *mut ffi::PyObject;
        if s.is_null() || ffi::PyUnicode_Check(s) == 0 {
            return Some(None);
        }
        Some(Some(str_bytes(s)?.into_boxed_slice()))
    };
    let filename = match text(layout::CODE_FILENAME)? {
        Some(name) => name,
        None => Box::from(&b"<unknown>"[..]),
    };
    let mut lines = Vec::new();
    lines.try_reserve_exact(1).ok()?;
    Current::lines(code.cast(), &[frame.offset], &mut lines);
    let line = lines.first().map_or(0, |&line| line.max(0) as u32);
    let first_lineno = *(code.cast::<u8>().add(layout::CODE_FIRSTLINENO) as *const i32);
    let function = text(layout::CODE_NAME)?.map(|name| (name, first_lineno.max(0) as u32));
    Some(LocatedFrame {
        filename,
        line,
        function,
    })
}

/// `total_nframe` of `n` captured frames and `below` more: tracemalloc stops counting at
/// `u16::MAX`. Clamped once here rather than on every frame of the walk's tail loop, which
/// then is a load, an add and a branch per frame.
#[inline(always)]
fn total_nframe(n: usize, below: usize) -> u16 {
    // No overflow: both count frames in memory.
    (n + below).min(usize::from(u16::MAX)) as u16
}

/// Where a raw frame points, read straight from the code object: its filename as lossless
/// UTF-8 (see [`crate::analysis::snapshot::Filename`]) and its line, as `tracemalloc` reports
/// them (`<unknown>` for a filename that is not a `str`, 0 for a line it cannot find).
///
/// For trace-time filters, which must decide inside a hook: no Python API call that could
/// allocate, raise or run the GC. `PyCode_Addr2Line` only reads the line table.
///
/// # Safety
/// `frame.code` is 0 or a live code object, and the GIL is held.
///
/// `None` if the memory for the filename cannot be had: this runs inside a hook, where an
/// allocation failure must not abort the process.
pub unsafe fn locate(frame: RawFrame) -> Option<(Vec<u8>, u32)> {
    let unknown = || {
        let mut name = Vec::new();
        name.try_reserve_exact(9).ok()?;
        name.extend_from_slice(b"<unknown>");
        Some(name)
    };
    if frame.code == 0 {
        return Some((unknown()?, 0));
    }
    let code = frame.code as *mut c_void;
    let name = read_ptr(code, layout::CODE_FILENAME) as *mut ffi::PyObject;
    let filename = if !name.is_null() && ffi::PyUnicode_Check(name) != 0 {
        str_bytes(name)?
    } else {
        unknown()?
    };
    let line = ffi::PyCode_Addr2Line(code as *mut ffi::PyCodeObject, frame.offset);
    Some((filename, line.max(0) as u32))
}

/// The code points of a (ready, as every code object's filename is) `str`, encoded as UTF-8
/// with lone surrogates passed through, without asking the interpreter for anything.
///
/// # Safety
/// `s` is a live `str` and the GIL is held.
unsafe fn str_bytes(s: *mut ffi::PyObject) -> Option<Vec<u8>> {
    let len = ffi::PyUnicode_GET_LENGTH(s) as usize;
    let data = ffi::PyUnicode_DATA(s);
    let kind = ffi::PyUnicode_KIND(s);
    // Four bytes per code point at most, reserved up front so the loop never grows it.
    let mut out = Vec::new();
    out.try_reserve_exact(len.checked_mul(4)?).ok()?;
    for i in 0..len {
        let cp = match kind {
            ffi::PyUnicode_1BYTE_KIND => u32::from(*data.cast::<u8>().add(i)),
            ffi::PyUnicode_2BYTE_KIND => u32::from(*data.cast::<u16>().add(i)),
            _ => *data.cast::<u32>().add(i),
        };
        push_code_point(&mut out, cp);
    }
    Some(out)
}

/// UTF-8 encoding that also accepts surrogates (Python's `surrogatepass`).
fn push_code_point(out: &mut Vec<u8>, cp: u32) {
    match cp {
        0..=0x7f => out.push(cp as u8),
        0x80..=0x7ff => out.extend_from_slice(&[0xc0 | (cp >> 6) as u8, 0x80 | (cp & 0x3f) as u8]),
        0x800..=0xffff => out.extend_from_slice(&[
            0xe0 | (cp >> 12) as u8,
            0x80 | ((cp >> 6) & 0x3f) as u8,
            0x80 | (cp & 0x3f) as u8,
        ]),
        _ => out.extend_from_slice(&[
            0xf0 | (cp >> 18) as u8,
            0x80 | ((cp >> 12) & 0x3f) as u8,
            0x80 | ((cp >> 6) & 0x3f) as u8,
            0x80 | (cp & 0x3f) as u8,
        ]),
    }
}

/// Pre-header size of objects of `obj`'s type, shared by the 3.11+ layouts.
///
/// # Safety
/// `obj` is a live object; `extra_flags` are the type flags that add two pointers.
#[allow(dead_code)]
#[inline]
unsafe fn preheader_size(obj: *mut ffi::PyObject, extra_flags: std::os::raw::c_ulong) -> usize {
    // The field itself: `PyType_GetFlags` is a call into libpython, once per object created.
    let flags = (*(*obj).ob_type).tp_flags;
    let mut size = 0;
    if flags & ffi::Py_TPFLAGS_HAVE_GC != 0 {
        size += layout::GC_HEAD_SIZE;
    }
    if flags & extra_flags != 0 {
        size += 2 * std::mem::size_of::<*mut c_void>();
    }
    size
}

/// The frame walk shared by 3.11–3.13, where frames are `_PyInterpreterFrame`s linked by
/// `previous`. `skips_cstack` is whether the version has shim frames owned by the C stack
/// (3.12+), which are always incomplete. `counter` is what CPython's own count of the thread's
/// frames says ([`depth`]).
///
/// `tracemalloc` reports the stack's full depth, so once `out` is full the rest of the stack
/// is still counted: by the counter when it counts every frame passed so far (each of them is
/// then a captured frame or one in its prologue that the counter is known to count, see
/// [`counted_in_prologue`]), otherwise frame by frame. That count does not touch the frames'
/// code objects: shim frames are skipped (and 3.13's `__init__` trampolines, see
/// [`is_trampoline`]), but the "not yet at its first traceable instruction" test is not
/// repeated. That test only matters for the frame being set up, which is at the top of the
/// stack, inside the limit; a frame below it can be in its prologue only if a finalizer ran
/// Python code during that prologue (then `total_nframe` counts that frame, where tracemalloc
/// would not; so does the counter).
///
/// # Safety
/// As [`Interpreter::walk`]; `frame` is the thread's current interpreter frame.
#[cfg(Py_3_11)]
#[inline(always)]
unsafe fn walk_interpreter_frames(
    frame: *mut c_void,
    out: &mut [RawFrame],
    skips_cstack: bool,
    counter: depth::Counter,
) -> (usize, u16) {
    let walked = walk_and_count(frame, out, skips_cstack, counter);
    if calls_init(frame) {
        counter.calling_init();
    }
    walked
}

/// 3.13: whether `frame` (the top one) is running the specialized class call that pushes an
/// `__init__` trampoline ([`is_trampoline`]) once it has allocated the object.
///
/// # Safety
/// `frame` is null or a live interpreter frame, and the GIL is held.
#[cfg(Py_3_11)]
#[inline(always)]
unsafe fn calls_init(_frame: *mut c_void) -> bool {
    // The instruction's first byte is its opcode (`_Py_CODEUNIT`); a C-stack shim's points at
    // CPython's static trampoline instructions, readable too.
    #[cfg(Py_3_13)]
    return !_frame.is_null()
        && *(read_ptr(_frame, layout::IFRAME_INSTR) as *const u8)
            == layout::CALL_ALLOC_AND_ENTER_INIT;
    #[cfg(not(Py_3_13))]
    return false;
}

/// [`walk_interpreter_frames`], less the note of a trampoline about to be pushed.
///
/// # Safety
/// As [`walk_interpreter_frames`].
#[cfg(Py_3_11)]
#[inline(always)]
unsafe fn walk_and_count(
    mut frame: *mut c_void,
    out: &mut [RawFrame],
    skips_cstack: bool,
    counter: depth::Counter,
) -> (usize, u16) {
    #[cfg(not(Py_3_12))]
    let _ = skips_cstack;
    let is_shim = |_owner: u8| {
        #[cfg(Py_3_12)]
        return skips_cstack && _owner == layout::OWNED_BY_CSTACK;
        #[cfg(not(Py_3_12))]
        return false;
    };
    // The next frame to write, by pointer rather than index: a shift and a register fewer a
    // frame in this loop, which every captured frame of every allocation runs.
    let first_out = out.as_mut_ptr();
    let end = first_out.add(out.len());
    let mut next_out = first_out;
    // Whether the counter counts every frame passed (shims aside): each was complete, and so
    // captured, or is in its prologue and counted ...
    let mut all_counted = true;
    // ... which these many were: the counter's figure less them is tracemalloc's.
    let mut in_prologue = 0;
    while !frame.is_null() && next_out < end {
        let owner = *(frame.cast::<u8>().add(layout::IFRAME_OWNER));
        let next = read_ptr(frame, layout::IFRAME_PREVIOUS);
        let code = read_ptr(frame, layout::IFRAME_CODE);
        if !is_shim(owner) {
            let mut counted = false;
            if is_code(code) {
                let start = code as usize + layout::CODE_ADAPTIVE;
                let instr = read_ptr(frame, layout::IFRAME_INSTR) as usize;
                // `_PyFrame_IsIncomplete`: a frame that has not yet reached its first
                // traceable instruction (still setting up cells and the like), unless a
                // generator owns it.
                let first = *(code.cast::<u8>().add(layout::CODE_FIRSTTRACEABLE) as *const i32);
                if owner == layout::OWNED_BY_GENERATOR || instr >= start + 2 * first as usize {
                    (*next_out).set(code as usize, instr.wrapping_sub(start) as isize as i32);
                    next_out = next_out.add(1);
                    counted = true;
                } else if counted_in_prologue(instr, start, next) {
                    in_prologue += 1;
                    counted = true;
                }
            }
            all_counted &= counted;
        }
        frame = next;
    }
    let n = next_out.offset_from(first_out) as usize;
    let counter = counter.less(in_prologue);
    if frame.is_null() {
        if all_counted {
            counter.whole(n);
        }
        return (n, total_nframe(n, 0));
    }
    if all_counted {
        if let Some(depth) = counter.depth(n) {
            return (n, total_nframe(depth, 0));
        }
    }
    let mut below = 0usize;
    // 3.13's trampolines passed, which the counter counts, and how many frames of either kind
    // had been passed at the last of them.
    let mut trampolines = 0usize;
    let mut at_lowest = 0usize;
    while !frame.is_null() {
        let owner = *(frame.cast::<u8>().add(layout::IFRAME_OWNER));
        if !is_shim(owner) {
            if is_trampoline(frame) {
                trampolines += 1;
                at_lowest = below + trampolines;
            } else {
                below += 1;
            }
        }
        frame = read_ptr(frame, layout::IFRAME_PREVIOUS);
    }
    if all_counted {
        // The frames under the lowest trampoline: the depth of the frame that called it.
        let floor = if trampolines == 0 {
            usize::MAX
        } else {
            below + trampolines - at_lowest
        };
        counter.walked(n + below + trampolines, floor);
    }
    (n, total_nframe(n, below))
}

/// Whether CPython's frame counter ([`depth`]) already counts a frame still in its prologue
/// (3.12 and 3.13; 3.11 has no counter). The prologue allocates (a generator or coroutine made
/// by `RETURN_GENERATOR`, the cells of `MAKE_CELL`), so without this every generator created
/// made the walk go to the bottom.
///
/// A frame is counted once it has run an instruction: it got there through `start_frame`,
/// which counts the frame before its first instruction, or (3.13) `_PUSH_FRAME`, which counts
/// it as it links it. 3.12's `prev_instr` is then at or past the first instruction. 3.13's
/// `instr_ptr` is the instruction being run, so a frame running its first one (a coroutine's
/// `RETURN_GENERATOR`) has the same `instr_ptr` as one not started; but the only frame linked
/// and not yet counted is one that the interpreter's entry linked above its C-stack shim, for
/// as long as it checks the C recursion limit (its `RecursionError`). Every other frame got to
/// `start_frame` (or `_PUSH_FRAME`) without allocating on the way: so a 3.13 frame at its
/// first instruction above anything else than a shim (`previous`) is counted. Where neither
/// rule settles it, the walk decides.
///
/// # Safety
/// `previous` is null or a live interpreter frame, and the GIL is held.
#[cfg(Py_3_11)]
#[inline(always)]
unsafe fn counted_in_prologue(_instr: usize, _start: usize, _previous: *mut c_void) -> bool {
    #[cfg(all(Py_3_12, not(Py_3_13)))]
    return _instr >= _start;
    #[cfg(Py_3_13)]
    return _instr > _start
        || (!_previous.is_null()
            && *(_previous.cast::<u8>().add(layout::IFRAME_OWNER)) != layout::OWNED_BY_CSTACK);
    #[cfg(not(Py_3_12))]
    return false;
}

/// 3.13: whether a frame is an `__init__` trampoline. A call of a class whose `__init__` is a
/// Python function, once specialized (`CALL_ALLOC_AND_ENTER_INIT`), pushes a frame of CPython's
/// own `_Py_InitCleanup` code under the `__init__` frame, to check what `__init__` returns; it
/// stays before its first traceable instruction, so `tracemalloc` never counts it. Such frames
/// are the only ones without a function (`f_funcobj` is `None`) that the count passes: the
/// C-stack shims, the other kind, are skipped by their owner.
///
/// # Safety
/// `frame` is a live interpreter frame and the GIL is held.
#[cfg(Py_3_11)]
#[inline(always)]
unsafe fn is_trampoline(_frame: *mut c_void) -> bool {
    #[cfg(Py_3_13)]
    return read_ptr(_frame, layout::IFRAME_FUNCOBJ) == ffi::Py_None().cast();
    #[cfg(not(Py_3_13))]
    return false;
}

#[cfg(test)]
mod tests {
    use super::{push_code_point, RawFrame};

    #[test]
    fn stacks_compare_as_words_as_they_do_frame_by_frame() {
        let f = RawFrame::new;
        let base = [f(0x7f00_1000, 6), f(0x7f00_2000, 42), f(0x7f00_3000, -1)];
        // (other stack, what derived equality says)
        let cases: [(&[RawFrame], bool); 7] = [
            (&base, true),
            (&base[..2], false),
            (
                &[f(0x7f00_1000, 6), f(0x7f00_2000, 42), f(0x7f00_3000, 1)],
                false,
            ),
            (
                &[f(0x7f00_1000, 6), f(0x7f00_2008, 42), f(0x7f00_3000, -1)],
                false,
            ),
            (
                &[f(0x7f00_1000, 7), f(0x7f00_2000, 42), f(0x7f00_3000, -1)],
                false,
            ),
            // An offset whose bits reach into the upper half of its word.
            (
                &[
                    f(0x7f00_1000, i32::MIN),
                    f(0x7f00_2000, 42),
                    f(0x7f00_3000, -1),
                ],
                false,
            ),
            (&[], false),
        ];
        for (other, equal) in cases {
            assert_eq!(base.as_slice() == other, equal, "{other:?}");
            assert_eq!(
                RawFrame::words(&base) == RawFrame::words(other),
                equal,
                "{other:?}"
            );
        }
        assert_eq!(RawFrame::words(&[RawFrame::UNKNOWN]), &[0, 0]);
    }

    #[test]
    fn total_nframe_stops_at_u16_max() {
        // (captured, below, tracemalloc's total_nframe)
        let cases = [
            (0, 0, 0),
            (1, 0, 1),
            (1, 24, 25),
            (25, 65_510, 65_535),
            (25, 65_511, 65_535),
            (1, 1 << 40, 65_535),
        ];
        for (n, below, expected) in cases {
            assert_eq!(super::total_nframe(n, below), expected, "{n} + {below}");
        }
    }

    #[test]
    fn code_points_encode_like_surrogatepass() {
        // (code point, Python's "…".encode("utf-8", "surrogatepass"))
        let cases: &[(u32, &[u8])] = &[
            (0x41, b"A"),
            (0xe9, "\u{e9}".as_bytes()),
            (0x20ac, "\u{20ac}".as_bytes()),
            (0x1f600, "\u{1f600}".as_bytes()),
            (0xdc80, &[0xed, 0xb2, 0x80]),
        ];
        for &(cp, expected) in cases {
            let mut out = Vec::new();
            push_code_point(&mut out, cp);
            assert_eq!(out, expected, "U+{cp:04X}");
        }
    }
}
