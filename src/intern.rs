//! Traceback interning, and the lazy resolution of raw frames to `(filename, lineno)`.
//!
//! A million blocks allocated from one line share one interned traceback: the trace table
//! stores a 32-bit id, not frames. Tracebacks are interned by their raw frames (code object
//! address, byte offset), hashed as plain words, so the hook never computes a line number.
//!
//! Raw frames name code objects by address, and an address is only meaningful while the object
//! lives. So interning a traceback takes a strong reference to each code object it names (the
//! "pins"); they are released together with the tracebacks, by `clear_traces()` or `stop()`.
//! The cost is that code objects created and dropped while tracing (e.g. by `exec` in a loop)
//! stay alive until then.
//!
//! All of this is GIL-protected state: only a thread holding the main interpreter's GIL may
//! intern (threads without it record the `<unknown>` traceback), exactly as `tracemalloc`
//! protects its own traceback table.

use std::collections::HashMap;

use hashbrown::HashTable;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};

use crate::capture::RawFrame;
use crate::table::{BuildAddressHasher, TracebackId};

/// The id of the `('<unknown>', 0)` traceback, used where no stack could be read.
pub const UNKNOWN_TRACEBACK: TracebackId = 0;

struct Stack {
    start: u32,
    len: u16,
    total_nframe: u16,
    hash: u64,
    /// The trace-time filters' verdict on this stack, valid while the filter set's generation
    /// is `verdict_generation` (0: never judged).
    keep: bool,
    verdict_generation: u32,
}

/// One folded 128-bit multiply per frame (a single `mul` on x86-64): code addresses are
/// 16-byte aligned heap pointers below 2^48 and offsets are small, so `code ^ offset << 48`
/// keeps both, and the fold spreads every input bit over both ends of the hash (hashbrown
/// takes buckets from the low bits and tags from the high ones).
#[inline]
fn hash_stack(frames: &[RawFrame], total_nframe: u16) -> u64 {
    let mut h = u64::from(total_nframe);
    for frame in frames {
        let word = frame.code as u64 ^ (u64::from(frame.offset as u32) << 48);
        let product = u128::from(h ^ word) * 0x9E37_79B9_7F4A_7C15_u128;
        h = (product as u64) ^ ((product >> 64) as u64);
    }
    h
}

pub struct Interner {
    /// Every interned traceback's frames, back to back.
    frames: Vec<RawFrame>,
    stacks: Vec<Stack>,
    index: HashTable<TracebackId>,
    /// Code objects we hold a strong reference to.
    pinned: hashbrown::HashSet<usize, BuildAddressHasher>,
    /// The last stack interned or found: a loop allocating on one line repeats it, and
    /// comparing a few frames is cheaper than hashing and probing.
    last: TracebackId,
}

impl Default for Interner {
    fn default() -> Self {
        Self::new()
    }
}

impl Interner {
    pub fn new() -> Self {
        let mut interner = Self {
            frames: Vec::new(),
            stacks: Vec::new(),
            index: HashTable::new(),
            pinned: hashbrown::HashSet::with_hasher(BuildAddressHasher),
            last: UNKNOWN_TRACEBACK,
        };
        // tracemalloc reports an unreadable stack as one unknown frame out of one.
        let id = interner.insert_new(&[RawFrame::UNKNOWN], 1, hash_stack(&[RawFrame::UNKNOWN], 1));
        debug_assert_eq!(id, UNKNOWN_TRACEBACK);
        interner
    }

    /// The id of this stack, interning it (and pinning its code objects) if it is new; `None`
    /// if it is new and the interner cannot get memory to store it. Called from allocator
    /// hooks, so every growth is a fallible reservation made before anything changes: a
    /// failure leaves the interner as it was and the caller drops the trace.
    ///
    /// # Safety
    /// The GIL is held, and every non-zero `code` in `frames` is a live code object.
    #[inline]
    pub unsafe fn intern(&mut self, frames: &[RawFrame], total_nframe: u16) -> Option<TracebackId> {
        if self.get(self.last) == (frames, total_nframe) {
            return Some(self.last);
        }
        let id = self.lookup_or_insert(frames, total_nframe)?;
        self.last = id;
        Some(id)
    }

    /// # Safety
    /// As [`Interner::intern`].
    unsafe fn lookup_or_insert(
        &mut self,
        frames: &[RawFrame],
        total_nframe: u16,
    ) -> Option<TracebackId> {
        let hash = hash_stack(frames, total_nframe);
        let Self {
            frames: arena,
            stacks,
            index,
            ..
        } = self;
        let found = index.find(hash, |&id| {
            let stack = &stacks[id as usize];
            stack.hash == hash
                && stack.total_nframe == total_nframe
                && &arena[stack.start as usize..][..stack.len as usize] == frames
        });
        if let Some(&id) = found {
            return Some(id);
        }
        self.reserve_for(frames.len())?;
        for frame in frames {
            if frame.code != 0 && self.pinned.insert(frame.code) {
                ffi::Py_INCREF(frame.code as *mut ffi::PyObject);
            }
        }
        Some(self.insert_new(frames, total_nframe, hash))
    }

    /// Makes room for one more stack of `nframe` frames, so that storing it cannot allocate.
    fn reserve_for(&mut self, nframe: usize) -> Option<()> {
        self.frames.try_reserve(nframe).ok()?;
        self.stacks.try_reserve(1).ok()?;
        let stacks = &self.stacks;
        self.index
            .try_reserve(1, |&other| stacks[other as usize].hash)
            .ok()?;
        self.pinned.try_reserve(nframe).ok()
    }

    /// Stores a stack known to be new. Infallible only after [`Interner::reserve_for`]
    /// succeeded for it (or outside a hook, where allocation failure may abort).
    fn insert_new(&mut self, frames: &[RawFrame], total_nframe: u16, hash: u64) -> TracebackId {
        let id = self.stacks.len() as TracebackId;
        self.stacks.push(Stack {
            start: self.frames.len() as u32,
            len: frames.len() as u16,
            total_nframe,
            hash,
            keep: true,
            verdict_generation: 0,
        });
        self.frames.extend_from_slice(frames);
        let stacks = &self.stacks;
        self.index
            .insert_unique(hash, id, |&other| stacks[other as usize].hash);
        id
    }

    /// The frames (most recent first) and full stack depth of an interned traceback.
    pub fn get(&self, id: TracebackId) -> (&[RawFrame], u16) {
        let stack = &self.stacks[id as usize];
        (
            &self.frames[stack.start as usize..][..stack.len as usize],
            stack.total_nframe,
        )
    }

    /// The cached filter verdict for a stack, if judged under filter generation `generation`.
    #[inline]
    pub fn verdict(&self, id: TracebackId, generation: u32) -> Option<bool> {
        let stack = &self.stacks[id as usize];
        (stack.verdict_generation == generation).then_some(stack.keep)
    }

    pub fn set_verdict(&mut self, id: TracebackId, generation: u32, keep: bool) {
        let stack = &mut self.stacks[id as usize];
        stack.keep = keep;
        stack.verdict_generation = generation;
    }

    pub fn len(&self) -> usize {
        self.stacks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.stacks.is_empty()
    }

    /// Hands over the pinned code objects, for the caller to release once it no longer holds
    /// any borrow of tracer state (releasing may run arbitrary code through weakref callbacks).
    pub fn take_pins(&mut self) -> Vec<usize> {
        self.pinned.drain().collect()
    }

    pub fn memory_usage(&self) -> usize {
        self.frames.capacity() * std::mem::size_of::<RawFrame>()
            + self.stacks.capacity() * std::mem::size_of::<Stack>()
            + self.index.capacity() * (std::mem::size_of::<TracebackId>() + 1)
            + self.pinned.capacity() * (std::mem::size_of::<usize>() + 1)
    }
}

/// A filename as both the `str` Python gave us and its lossless bytes (see
/// [`crate::analysis::snapshot::Filename`]).
pub struct ResolvedFilename {
    pub object: Py<PyString>,
    pub bytes: Box<[u8]>,
}

/// The function a code object belongs to, for snapshots: `co_qualname` where the
/// interpreter has it (3.11+), else `co_name`, as surrogatepass UTF-8, and `co_firstlineno`.
pub struct ResolvedFunction {
    pub name: Box<[u8]>,
    pub first_lineno: u32,
}

/// Maps raw frames to `(filename, lineno)`, once per distinct (code, offset), when someone
/// looks: a snapshot, `_get_traces()`, `get_object_traceback()`; and code objects to their
/// function, for snapshots only. Only called from Python-facing functions, never from a hook,
/// so it may use the Python API freely.
pub struct Resolver {
    filenames: Vec<ResolvedFilename>,
    /// Per code object: its filename's index, and its function's index in `functions`
    /// (`None` where its name could not be read).
    by_code: HashMap<usize, (u32, Option<u32>)>,
    lines: HashMap<RawFrame, u32>,
    functions: Vec<ResolvedFunction>,
}

impl Resolver {
    pub fn new(py: Python<'_>) -> Self {
        let mut resolver = Self {
            filenames: Vec::new(),
            by_code: HashMap::new(),
            lines: HashMap::new(),
            functions: Vec::new(),
        };
        resolver.push_filename(
            PyString::new(py, "<unknown>").unbind(),
            b"<unknown>".as_slice(),
        );
        resolver
    }

    fn push_filename(&mut self, object: Py<PyString>, bytes: &[u8]) -> u32 {
        self.filenames.push(ResolvedFilename {
            object,
            bytes: bytes.into(),
        });
        (self.filenames.len() - 1) as u32
    }

    pub fn filename(&self, index: u32) -> &ResolvedFilename {
        &self.filenames[index as usize]
    }

    /// `(filename index, lineno)` of a raw frame, as `tracemalloc` would have reported it: a
    /// filename that is not a `str` is `<unknown>`, a line that cannot be found is 0.
    ///
    /// # Safety
    /// `frame.code` is 0 or a code object pinned by the live interner.
    pub unsafe fn resolve(&mut self, py: Python<'_>, frame: RawFrame) -> (u32, u32) {
        let (filename, lineno, _) = self.resolve_with_function(py, frame);
        (filename, lineno)
    }

    /// As [`Resolver::resolve`], plus the function (index for [`Resolver::function`]) of the
    /// frame's code object: `None` for the unknown frame and for a code object whose name is
    /// not a `str`. Both come from one lookup by code object, so snapshots pay little extra.
    ///
    /// # Safety
    /// As [`Resolver::resolve`].
    pub unsafe fn resolve_with_function(
        &mut self,
        py: Python<'_>,
        frame: RawFrame,
    ) -> (u32, u32, Option<u32>) {
        if frame.code == 0 {
            return (0, 0, None);
        }
        let (filename, function) = match self.by_code.get(&frame.code) {
            Some(&found) => found,
            None => {
                let found = (
                    self.resolve_filename(py, frame.code),
                    self.resolve_function(py, frame.code),
                );
                self.by_code.insert(frame.code, found);
                found
            }
        };
        let lineno = *self.lines.entry(frame).or_insert_with(|| {
            let line = ffi::PyCode_Addr2Line(frame.code as *mut ffi::PyCodeObject, frame.offset);
            line.max(0) as u32
        });
        (filename, lineno, function)
    }

    pub fn function(&self, index: u32) -> &ResolvedFunction {
        &self.functions[index as usize]
    }

    unsafe fn resolve_function(&mut self, py: Python<'_>, code: usize) -> Option<u32> {
        let code = Bound::from_borrowed_ptr(py, code as *mut ffi::PyObject);
        let name = code
            .getattr("co_qualname")
            .or_else(|_| code.getattr("co_name"))
            .ok()
            .and_then(|name| name.cast_into::<PyString>().ok())
            .and_then(|name| name.call_method1("encode", ("utf-8", "surrogatepass")).ok())
            .and_then(|b| b.cast_into::<PyBytes>().ok());
        let first_lineno = code
            .getattr("co_firstlineno")
            .and_then(|n| n.extract::<u32>())
            .unwrap_or(0);
        name.map(|name| {
            self.functions.push(ResolvedFunction {
                name: name.as_bytes().into(),
                first_lineno,
            });
            (self.functions.len() - 1) as u32
        })
    }

    unsafe fn resolve_filename(&mut self, py: Python<'_>, code: usize) -> u32 {
        let code = Bound::from_borrowed_ptr(py, code as *mut ffi::PyObject);
        let name = code
            .getattr("co_filename")
            .ok()
            .and_then(|name| name.cast_into::<PyString>().ok());
        let Some(name) = name else {
            return 0;
        };
        let bytes = name
            .call_method1("encode", ("utf-8", "surrogatepass"))
            .ok()
            .and_then(|b| b.cast_into::<PyBytes>().ok());
        match bytes {
            Some(bytes) => {
                let bytes = bytes.as_bytes().to_vec();
                self.push_filename(name.unbind(), &bytes)
            }
            None => 0,
        }
    }

    pub fn memory_usage(&self) -> usize {
        self.filenames
            .iter()
            .map(|f| f.bytes.len() + std::mem::size_of::<ResolvedFilename>())
            .sum::<usize>()
            + self.by_code.capacity() * 24
            + self.lines.capacity() * 24
            + self
                .functions
                .iter()
                .map(|f| f.name.len() + std::mem::size_of::<ResolvedFunction>())
                .sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(code: usize, offset: i32) -> RawFrame {
        RawFrame { code, offset }
    }

    #[test]
    fn equal_stacks_share_an_id_and_different_ones_do_not() {
        let mut interner = Interner::new();
        // Code address 0 only: no pinning (no interpreter needed).
        let cases: &[(&[RawFrame], u16)] = &[
            (&[f(0, 2), f(0, 4)], 3),
            (&[f(0, 2), f(0, 4)], 4), // same frames, other depth
            (&[f(0, 4), f(0, 2)], 3), // other order
            (&[f(0, 2)], 1),
        ];
        let ids: Vec<_> = cases
            .iter()
            .map(|(frames, total)| unsafe { interner.intern(frames, *total) }.unwrap())
            .collect();
        let again: Vec<_> = cases
            .iter()
            .map(|(frames, total)| unsafe { interner.intern(frames, *total) }.unwrap())
            .collect();
        assert_eq!(ids, again);
        let distinct: std::collections::HashSet<_> = ids.iter().collect();
        assert_eq!(distinct.len(), cases.len());
        assert!(!ids.contains(&UNKNOWN_TRACEBACK));
        for ((frames, total), id) in cases.iter().zip(&ids) {
            assert_eq!(interner.get(*id), (*frames, *total));
        }
        assert_eq!(
            interner.get(UNKNOWN_TRACEBACK),
            (&[RawFrame::UNKNOWN][..], 1)
        );
    }
}
