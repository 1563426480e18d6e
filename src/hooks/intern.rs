//! Traceback interning, and the lazy resolution of raw frames to `(filename, lineno)`.
//!
//! A million blocks allocated from one line share one interned traceback: the trace table
//! stores a 32-bit id, not frames. Tracebacks are interned by their raw frames (code object
//! address, byte offset), hashed as plain words, so the hook never computes a line number.
//!
//! ## Offsets that share a line
//!
//! `tracemalloc` knows a frame by its line, and a line may hold several calls
//! (`return f(n - 1) + f(n - 2)`, `g(a(), b())`): stacks that pass through it at different
//! offsets are one traceback to `tracemalloc`, and would be several here. Under such a line
//! the distinct stacks multiply with every level: a recursion through one made a new traceback
//! for nearly every call (pyperformance's coroutines at 25 frames: a traceback per coroutine
//! created, 7 MB of tracer memory for twenty runs of `fib(20)` where `tracemalloc` kept a few
//! dozen). So a stack is stored with each offset replaced by its line's *canonical offset*,
//! the first offset of the code object with the same line: stacks equal line for line share
//! one traceback, and a snapshot still resolves every frame to the line it ran.
//!
//! This is not line-number computation on the hot path. A code object's line table is read
//! once, into runs of offsets that share a canonical offset, when a stack naming it first
//! misses the flat copies (below); an offset's run is then found by a binary search, and a
//! memo of the frames canonicalized last answers most of those in a few instructions. Only
//! stacks that miss the flat copies are canonicalized at all, and the flat copies keep both
//! kinds: raw stacks, so that a loop's stacks are found as they are walked, and canonical
//! ones, so that a program whose raw stacks are too many for them (that recursion) still
//! finds its few canonical stacks by comparing a copy.
//!
//! ## Stacks as a trie
//!
//! Deep programs make many distinct stacks that differ only near the top (recursion, a
//! framework's twenty frames around every call). Each interned stack is therefore a node of a
//! trie rooted at the outermost frame: a node is `(parent node, frame)`, and a traceback is its
//! innermost node plus the full depth. A new stack costs one node per frame not already shared
//! with an interned one, so memory grows with the number of distinct frames-in-context rather
//! than with depth times stacks (recursion to depth `d` costs `d` nodes, not `d²/2` frames).
//! Storage grows in fixed-size chunks ([`Chunked`]), so no doubling ever holds twice what is
//! used. The hook finds a known stack in flat copies of recent stacks first (a loop allocating
//! from a few lines compares a few words), and otherwise with one hash of its canonical frames
//! and one probe, the candidate compared by walking the trie.
//!
//! ## Code objects: pinned while running, buried when dead
//!
//! Raw frames name code objects by address, and an address is only meaningful while the object
//! lives: once freed, a new code object may be created at the same address, and a stored
//! `(address, offset)` would then match frames of that other code. So a node takes a strong
//! reference to its code object (the "pin") — taken in the hook, which only increments a
//! reference count.
//!
//! The line runs of a code object (above) are kept while it is pinned, and dropped with the pin.
//!
//! Pins must not keep code alive, or a program compiling code in a loop leaks under tracing
//! (jinja2 without its template cache grew 10 MiB per 400 renders). The sweep
//! ([`Interner::dying_codes`], [`Resolver::bury`], [`Interner::bury`]) finds code objects whose
//! only reference is ours, resolves what tracebacks need from them (filename, function, and the
//! line of each offset used), rewrites their nodes to a tag that no live frame can equal (an
//! odd number standing for the buried code, the resolved line in place of the offset) and then
//! drops the reference. The address is only released after no stored key holds it, so reuse
//! cannot confuse two code objects, and a traceback of a block allocated by dead code still
//! names its file, line and function.
//!
//! The sweep runs Python code (resolving reads attributes, dropping a code object runs its
//! weakref callbacks), so it never runs in a hook. It runs at safe points: before a snapshot
//! and the other reads of the traces, from every `get_traced_memory()` (a code object's last
//! other reference can go without anything new being pinned, e.g. in `gc.collect()`; the
//! check costs a reference-count read per pinned code object), and from a pending call (`Py_AddPendingCall`, which takes no Python lock and
//! does not allocate) that the hook schedules when the number of pins has grown by half since
//! the last sweep (at least [`SWEEP_MIN_PINS`]), so its cost, linear in the pins, is amortised
//! over the pins created. Between sweeps, dead code stays alive: that delay is bounded by the
//! same rule and never reaches a reading of the figures.
//!
//! ## Freed when nothing live names it
//!
//! A traceback that no live block, waiting block or peak names any more is freed at a sweep
//! ([`Interner::collect`], a slice at a time), with the trie nodes only it used (each node
//! counts its children and the stacks ending at it), the pin of a code object no node names
//! any more, and the resolver's record of a buried one; ids, nodes and records are reused.
//! Without this, code compiled and dropped in a loop grew the tracer by ~400 bytes per code
//! object for good (docs/tracer-memory.md).
//!
//! All of this is GIL-protected state: only a thread holding the main interpreter's GIL may
//! intern (threads without it record the `<unknown>` traceback), exactly as `tracemalloc`
//! protects its own traceback table.

use std::collections::HashMap;
use std::sync::OnceLock;

use hashbrown::HashTable;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::Interned;
use pyo3::types::PyString;

use crate::capture::{Current, Interpreter, RawFrame};
use crate::hooks::table::{BuildAddressHasher, TracebackId};

/// The id of the `('<unknown>', 0)` traceback, used where no stack could be read.
pub const UNKNOWN_TRACEBACK: TracebackId = 0;

/// The fewest new pins that make a sweep due (see the module docs).
pub const SWEEP_MIN_PINS: usize = 256;

/// The fewest stacks stored since the last complete collection that make a sweep due (see
/// [`Interner::collect`]); more once more stacks are live, so that collecting costs a bounded
/// share of storing.
pub const COLLECT_MIN_STACKS: usize = 4096;

/// Reads a code object's line runs ([`Interpreter::line_runs`]); an interner field so that a
/// test can stand in for the interpreter.
type ReadRuns = unsafe fn(usize, &mut Vec<(i32, i32)>) -> Option<()>;

/// [`ReadRuns`] from the interpreter's own line table.
///
/// # Safety
/// `code` is a live code object and the GIL is held.
unsafe fn read_runs(code: usize, out: &mut Vec<(i32, i32)>) -> Option<()> {
    Current::line_runs(code as *mut ffi::PyObject, out)
}

/// Turns a code object's line runs `(start offset, line)` into `(start offset, canonical
/// offset)`, a line's canonical offset being the start of its first run, and merges
/// neighbouring runs that end up with the same one. `order` is scratch. `None` if memory
/// cannot be had.
fn canonical_runs(runs: &mut Vec<(i32, i32)>, order: &mut Vec<u32>) -> Option<()> {
    order.clear();
    order.try_reserve(runs.len()).ok()?;
    order.extend(0..runs.len() as u32);
    // Grouped by line, each group in offset order: its first run gives the canonical offset.
    order.sort_unstable_by_key(|&i| (runs[i as usize].1, runs[i as usize].0));
    let mut group = None;
    let mut canonical = 0;
    for &i in order.iter() {
        let (start, line) = runs[i as usize];
        if group != Some(line) {
            group = Some(line);
            canonical = start;
        }
        runs[i as usize].1 = canonical;
    }
    runs.dedup_by_key(|run| run.1);
    Some(())
}

/// The canonical offset of `offset` in a code object's [`canonical_runs`]. An offset before
/// the first run (negative: a generator not yet started) stays as it is.
#[inline]
fn canonical_offset(runs: &[(i32, i32)], offset: i32) -> i32 {
    match runs.partition_point(|&(start, _)| start <= offset) {
        0 => offset,
        run => runs[run - 1].1,
    }
}

/// A cheap hash of a whole stack (a rotate and an exclusive or per frame), for the stacks that
/// missed their first set in [`Interner::deep`] (see [`Interner::intern_deep`]).
#[inline]
fn print_of(frames: &[RawFrame]) -> u64 {
    frames.iter().fold(0u64, |h, frame| {
        h.rotate_left(7) ^ frame_word(frame.code, frame.offset)
    })
}

/// A print in 16 bits, for [`Stack::first_print`]: equal stacks have equal prints, and
/// different ones rarely do, which is all that use needs (a collision only leaves out a flat
/// copy).
#[inline]
fn short_print(print: u64) -> u16 {
    let word = print ^ print >> 32;
    (word ^ word >> 16) as u16
}

/// Slots of [`Interner::canonical_memo`], 16 KiB.
const MEMO: usize = 1024;

/// A raw frame and its canonical offset (`code == 0`: an empty slot).
#[derive(Clone, Copy, Default)]
struct Memo {
    code: usize,
    offset: i32,
    canonical: i32,
}

/// The slot of a raw frame in [`Interner::canonical_memo`].
#[inline(always)]
fn memo_slot(frame: &RawFrame) -> usize {
    let word = frame_word(frame.code, frame.offset);
    (word.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - MEMO.trailing_zeros())) as usize
}

/// "No node": the parent of an outermost frame, the end of a code object's node chain.
const NO_NODE: u32 = u32::MAX;

/// Elements per storage chunk, as a power of two.
const CHUNK_SHIFT: u32 = 12;
const CHUNK: usize = 1 << CHUNK_SHIFT;

/// A vector that grows by fixed-size chunks: never more than one chunk unused, and growing
/// never copies (a doubling `Vec` holds up to twice what it uses, and both copies while
/// it grows). Every growth is a fallible reservation.
struct Chunked<T> {
    chunks: Vec<Vec<T>>,
    len: usize,
}

impl<T> Chunked<T> {
    const fn new() -> Self {
        Self {
            chunks: Vec::new(),
            len: 0,
        }
    }

    #[inline(always)]
    fn get(&self, i: u32) -> &T {
        &self.chunks[(i >> CHUNK_SHIFT) as usize][i as usize & (CHUNK - 1)]
    }

    #[inline(always)]
    fn get_mut(&mut self, i: u32) -> &mut T {
        &mut self.chunks[(i >> CHUNK_SHIFT) as usize][i as usize & (CHUNK - 1)]
    }

    /// Makes room for `additional` more elements, so that pushing them cannot allocate;
    /// `None` (and nothing changed that matters) if the memory cannot be had or the ids would
    /// no longer fit 32 bits.
    fn try_reserve(&mut self, additional: usize) -> Option<()> {
        let needed = self.len.checked_add(additional)?;
        if needed > NO_NODE as usize {
            return None;
        }
        while self.chunks.len() * CHUNK < needed {
            self.chunks.try_reserve(1).ok()?;
            let mut chunk = Vec::new();
            chunk.try_reserve_exact(CHUNK).ok()?;
            self.chunks.push(chunk);
        }
        Some(())
    }

    /// Appends after a successful [`Chunked::try_reserve`]; returns the new element's index.
    #[inline]
    fn push(&mut self, value: T) -> u32 {
        let i = self.len;
        self.chunks[i >> CHUNK_SHIFT].push(value);
        self.len += 1;
        i as u32
    }

    /// Writes element `i`: an existing one (an index taken from a free list), or the next
    /// one, after a successful [`Chunked::try_reserve`].
    #[inline]
    fn set(&mut self, i: u32, value: T) {
        if i as usize == self.len {
            self.push(value);
        } else {
            *self.get_mut(i) = value;
        }
    }

    fn len(&self) -> usize {
        self.len
    }

    fn memory_usage(&self) -> usize {
        self.chunks.len() * CHUNK * std::mem::size_of::<T>()
            + self.chunks.capacity() * std::mem::size_of::<Vec<T>>()
    }
}

/// One frame in the context of its callers: a trie node.
///
/// `code` is a live code object's address (pinned), 0 for the unknown frame, or, once the code
/// object is dead, an odd tag `(index of its buried record) << 1 | 1` that no live frame can
/// equal (objects are aligned); `offset` is then the resolved line, not a byte offset.
#[derive(Clone, Copy)]
struct Node {
    code: usize,
    offset: i32,
    parent: u32,
}

struct Stack {
    /// The innermost frame's node.
    leaf: u32,
    len: u16,
    total_nframe: u16,
    /// The trace-time filters' verdict on this stack, valid while the filter set's generation
    /// is `verdict_generation` (0: never judged).
    keep: bool,
    verdict_generation: u32,
    hash: u64,
    /// The [`short_print`] of the raw stack that stored it: another print seen later means the
    /// stack has several raw forms, and its canonical copy is then worth a flat slot (see
    /// [`Interner::intern_deep`]). Fits the padding: a stack is still 24 bytes.
    first_print: u16,
}

/// Mixes one word into a hash with one folded 128-bit multiply (a single `mul` on x86-64): the
/// fold spreads every input bit over both ends of the hash (hashbrown takes buckets from the
/// low bits and tags from the high ones).
#[inline(always)]
fn mix(h: u64, word: u64) -> u64 {
    let product = u128::from(h ^ word) * 0x9E37_79B9_7F4A_7C15_u128;
    (product as u64) ^ ((product >> 64) as u64)
}

/// Code addresses are aligned heap pointers below 2^48 and offsets are small, so
/// `code ^ offset << 48` keeps both in one word.
#[inline(always)]
fn frame_word(code: usize, offset: i32) -> u64 {
    code as u64 ^ (u64::from(offset as u32) << 48)
}

#[inline]
fn hash_stack(frames: &[RawFrame], total_nframe: u16) -> u64 {
    frames.iter().fold(u64::from(total_nframe), |h, frame| {
        mix(h, frame_word(frame.code, frame.offset))
    })
}

#[inline]
fn hash_node(parent: u32, code: usize, offset: i32) -> u64 {
    mix(u64::from(parent), frame_word(code, offset))
}

/// A code object only the interner still references, and the nodes that name it (found by
/// [`Interner::dying_codes`], to be resolved and then buried).
pub struct DyingCode {
    pub code: usize,
    /// `(node, byte offset)` for every node of this code object.
    nodes: Vec<(u32, i32)>,
}

impl DyingCode {
    pub fn offsets(&self) -> impl Iterator<Item = i32> + '_ {
        self.nodes.iter().map(|&(_, offset)| offset)
    }
}

pub struct Interner {
    nodes: Chunked<Node>,
    /// Per node, the next node naming the same code object (a chain per pinned code object,
    /// so burying one touches only its own nodes).
    same_code: Chunked<u32>,
    /// Per node, the previous node of its code object's chain ([`NO_NODE`] for the head), so
    /// that a freed node leaves its chain without a walk.
    same_code_prev: Chunked<u32>,
    /// Per node, what names it: its child nodes and the stacks whose innermost node it is.
    /// A node whose count falls to zero is freed (see [`Interner::collect`]).
    refs: Chunked<u32>,
    /// Freed nodes and stack ids, reused before the storage grows.
    free_nodes: Vec<u32>,
    free_stacks: Vec<u32>,
    /// Per buried record (a buried tag's index), how many nodes carry its tag: at zero the
    /// record is handed back to the resolver.
    buried_nodes: Vec<u32>,
    /// The id the next [`Interner::collect`] looks at first.
    collect_cursor: u32,
    /// Stacks stored since the last complete pass of [`Interner::collect`], and how many
    /// stacks were live after it.
    stacks_since_collect: usize,
    stacks_at_collect: usize,
    /// `(parent, frame)` -> node.
    node_index: HashTable<u32>,
    stacks: Chunked<Stack>,
    /// Whole raw stack -> traceback: the hook's one probe.
    index: HashTable<TracebackId>,
    /// Pinned code objects (we hold a strong reference), each with the head of its node chain.
    pins: hashbrown::HashMap<usize, u32, BuildAddressHasher>,
    /// Pins taken since the last sweep, and how many there were after it.
    pins_since_sweep: usize,
    pins_at_sweep: usize,
    /// The last stack of more than [`DEEP_MAX`] frames (or none) interned or found, flat: a
    /// loop allocating on one line repeats it, and comparing is cheaper than hashing and
    /// probing.
    last: Flat,
    /// One-frame stacks (the default `nframe`) recently interned or found, by frame and depth.
    /// With one frame, consecutive allocations of a loop body come from different lines, so
    /// one remembered stack rarely matches (objects re-attributed from free lists, a float per
    /// arithmetic operation, hit it 27% of the time in a float loop); any of the last few
    /// hundred (line, depth) pairs is found here with one comparison, without hashing the
    /// stack and walking the trie.
    recent: Box<[Recent; RECENT]>,
    /// Stacks of two to [`DEEP_MAX`] frames recently interned or found, flat, in
    /// [`DEEP_SETS`] sets of [`DEEP_WAYS`] (empty until the first such stack), the set chosen
    /// by the two innermost frames and the depth, most recently used first. At 25 frames a
    /// loop body's allocations come from several lines, each its own stack, so `last` rarely
    /// matches; finding a stack by hashing its frames and walking its nodes cost ~500
    /// instructions at 25 frames (a quarter of all the instructions of pyperformance's
    /// raytrace traced at 25 frames), comparing a flat copy a few dozen. Sets rather than
    /// single slots because stacks that share a slot evict each other on every pass of a
    /// loop: with 256 single slots, nbody (a few dozen float-making lines) missed on 22% of
    /// its allocations at 25 frames and raytrace on 30%; with 512 sets of 4, 0.3% and 0.7%
    /// (callgrind, one loop, CPython 3.11). At most 2048 flat copies, ~400 B each at 25
    /// frames, raw stacks and canonical ones (see the module docs) alike.
    deep: Vec<Flat>,
    /// Hits in a second set until the next one puts its stack back into its first set too
    /// (see [`Interner::intern_deep`]).
    second_hits: u32,
    /// The stack stored last, outermost frame first, each frame with its node. A new stack
    /// usually shares its outer frames with the one stored before it (a traversal's siblings,
    /// the next call of a recursion), and those nodes are taken from here instead of probing
    /// `node_index` once per frame, a cache miss each on a large trie: storing new stacks
    /// was a third of pyperformance's generators and coroutines at 25 frames.
    path: Vec<(RawFrame, u32)>,
    /// Per code object, its [`canonical_runs`], read when a stack naming it first reached
    /// [`Interner::lookup_or_insert`]. Only pinned code objects have an entry (an address is
    /// only meaningful while its object lives), and burying one drops it.
    same_line: hashbrown::HashMap<usize, Box<[(i32, i32)]>, BuildAddressHasher>,
    /// The runs in `same_line`, in all.
    same_line_runs: usize,
    /// Raw frames recently canonicalized, direct-mapped: a stack that misses the flat copies
    /// is mostly made of frames seen a moment ago, and finding one here is a few instructions
    /// where `same_line` costs a probe and a binary search (a recursion through a line with
    /// two calls, twenty `fib(20)` at 25 frames: 0.175 s without this memo, 0.129 s with it,
    /// untraced 0.032 s, before the flat copies kept canonical stacks).
    canonical_memo: Box<[Memo; MEMO]>,
    read_runs: ReadRuns,
    /// Scratch for reading runs, sorting them, and the canonical copy of a stack.
    runs: Vec<(i32, i32)>,
    order: Vec<u32>,
    canonical: Vec<RawFrame>,
}

/// Sets of [`Interner::deep`], each of [`DEEP_WAYS`] flat stacks.
const DEEP_SETS: usize = 512;
const DEEP_WAYS: usize = 4;
/// The deepest stack [`Interner::deep`] keeps (1 KiB a way); deeper ones use `last`.
const DEEP_MAX: usize = 64;
/// Every how many hits in a second set the stack found goes back into its first set. A stack
/// evicted from its first set once otherwise takes the detour (a hash of all its frames) for
/// ever: pyperformance's json_loads at 25 frames missed its first sets on 1.2M of 1.6M stacks.
/// Putting it back on every hit made stacks that overflow their first set (pyperformance's
/// logging) evict each other there again. Callgrind, 25 frames, CPython 3.11, never / every
/// 8th / every hit: json_loads 3,304M / 3,007M / 3,016M instructions, logging 1,249M /
/// 1,264M / 1,303M.
const PROMOTE_EVERY: u32 = 8;

/// A flat copy of a stack and its id (`total_nframe == 0`: none), compared in a few words.
#[derive(Default)]
struct Flat {
    frames: Vec<RawFrame>,
    total_nframe: u16,
    id: TracebackId,
}

impl Flat {
    #[inline(always)]
    fn find(&self, frames: &[RawFrame], total_nframe: u16) -> Option<TracebackId> {
        (self.total_nframe == total_nframe
            && RawFrame::words(&self.frames) == RawFrame::words(frames))
        .then_some(self.id)
    }

    /// Keeps a copy of `frames`. Called from hooks, so the memory is reserved fallibly;
    /// without it the copy is left empty.
    fn keep(&mut self, frames: &[RawFrame], total_nframe: u16, id: TracebackId) {
        self.frames.clear();
        if self.frames.try_reserve(frames.len()).is_ok() {
            self.frames.extend_from_slice(frames);
            self.total_nframe = total_nframe;
            self.id = id;
        } else {
            self.total_nframe = 0;
        }
    }

    /// Empties it (its code objects are being released), keeping the memory.
    fn forget(&mut self) {
        self.frames.clear();
        self.total_nframe = 0;
    }

    fn memory_usage(&self) -> usize {
        self.frames.capacity() * std::mem::size_of::<RawFrame>()
    }
}

/// The set of a stack of two or more frames in [`Interner::deep`]: the index of its first way.
#[inline(always)]
fn deep_slot(frames: &[RawFrame], total_nframe: u16) -> usize {
    let h = mix(
        u64::from(total_nframe) ^ frame_word(frames[1].code, frames[1].offset),
        frame_word(frames[0].code, frames[0].offset),
    );
    (h >> (64 - DEEP_SETS.trailing_zeros())) as usize * DEEP_WAYS
}

/// The second set of a stack in [`Interner::deep`], by the [`print_of`] of all its frames.
#[inline]
fn print_slot(print: u64, total_nframe: u16) -> usize {
    let h = mix(print, u64::from(total_nframe));
    (h >> (64 - DEEP_SETS.trailing_zeros())) as usize * DEEP_WAYS
}

/// Slots of [`Interner::recent`], 16 KiB. A recursive program allocates on the same line at
/// many depths, each its own stack: pyperformance's raytrace at one frame missed 128 slots
/// indexed by the frame alone on a third of its stacks (the depths of one line evicting each
/// other), 1024 slots indexed by frame and depth on 2% (callgrind, CPython 3.11).
const RECENT: usize = 1024;

/// A one-frame stack and its id, in 16 bytes: `key` is the code object's address (below
/// 2^48 in x86-64 user space; frames above are not kept here) with the depth in the top 16
/// bits. A key of 0 is an empty slot (a stack with a frame has a depth of at least one).
#[derive(Clone, Copy, Default)]
struct Recent {
    key: u64,
    offset: i32,
    id: TracebackId,
}

/// [`Recent::key`] of a one-frame stack, `None` if its code address does not fit.
#[inline(always)]
fn recent_key(frame: &RawFrame, total_nframe: u16) -> Option<u64> {
    let code = frame.code as u64;
    (code >> 48 == 0).then_some(code | u64::from(total_nframe) << 48)
}

/// The slot of a one-frame stack in [`Interner::recent`]: the multiply's top bits, over the
/// frame and the depth.
#[inline(always)]
fn recent_slot(key: u64, offset: i32) -> usize {
    let word = key ^ u64::from(offset as u32) << 20;
    (word.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - RECENT.trailing_zeros())) as usize
}

impl Default for Interner {
    fn default() -> Self {
        Self::new()
    }
}

impl Interner {
    pub fn new() -> Self {
        let mut interner = Self {
            nodes: Chunked::new(),
            same_code: Chunked::new(),
            same_code_prev: Chunked::new(),
            refs: Chunked::new(),
            free_nodes: Vec::new(),
            free_stacks: Vec::new(),
            buried_nodes: Vec::new(),
            collect_cursor: 0,
            stacks_since_collect: 0,
            stacks_at_collect: 0,
            node_index: HashTable::new(),
            stacks: Chunked::new(),
            index: HashTable::new(),
            pins: hashbrown::HashMap::with_hasher(BuildAddressHasher),
            pins_since_sweep: 0,
            pins_at_sweep: 0,
            last: Flat::default(),
            recent: Box::new([Recent::default(); RECENT]),
            deep: Vec::new(),
            second_hits: PROMOTE_EVERY,
            path: Vec::new(),
            same_line: hashbrown::HashMap::with_hasher(BuildAddressHasher),
            same_line_runs: 0,
            canonical_memo: Box::new([Memo::default(); MEMO]),
            read_runs,
            runs: Vec::new(),
            order: Vec::new(),
            canonical: Vec::new(),
        };
        // tracemalloc reports an unreadable stack as one unknown frame out of one.
        // SAFETY: the unknown frame names no code object.
        let id = unsafe { interner.lookup_or_insert(&[RawFrame::UNKNOWN], 1) };
        assert_eq!(id, Some(UNKNOWN_TRACEBACK));
        interner
    }

    /// The id of this stack, interning it (and pinning its code objects) if it is new; `None`
    /// if it is new and the interner cannot get memory to store it. Called from allocator
    /// hooks, so every growth is a fallible reservation made before anything changes: a
    /// failure leaves the interner as it was and the caller drops the trace.
    ///
    /// A one-frame stack seen recently is the common case: its check is inlined into the
    /// hooks and the rest is a call apart, which spares the hit a call and the registers
    /// saved around it (of ~45 instructions a hit cost, ~20 were that).
    ///
    /// # Safety
    /// The GIL is held, and every non-zero `code` in `frames` is a live code object.
    #[inline(always)]
    pub unsafe fn intern(&mut self, frames: &[RawFrame], total_nframe: u16) -> Option<TracebackId> {
        if let [frame] = frames {
            if let Some(key) = recent_key(frame, total_nframe) {
                let seen = self.recent[recent_slot(key, frame.offset)];
                if seen.key == key && seen.offset == frame.offset {
                    return Some(seen.id);
                }
            }
        }
        self.intern_slow(frames, total_nframe)
    }

    /// [`Interner::intern`] past its inlined check.
    ///
    /// # Safety
    /// As [`Interner::intern`].
    #[inline(never)]
    unsafe fn intern_slow(
        &mut self,
        frames: &[RawFrame],
        total_nframe: u16,
    ) -> Option<TracebackId> {
        if let [frame] = frames {
            let Some(key) = recent_key(frame, total_nframe) else {
                return self.lookup_or_insert(frames, total_nframe);
            };
            let slot = recent_slot(key, frame.offset);
            let id = self.lookup_or_insert(frames, total_nframe)?;
            self.recent[slot] = Recent {
                key,
                offset: frame.offset,
                id,
            };
            return Some(id);
        }
        if (2..=DEEP_MAX).contains(&frames.len()) {
            let slot = deep_slot(frames, total_nframe);
            if let Some(id) = self.find_deep(slot, frames, total_nframe) {
                return Some(id);
            }
            return self.intern_deep(slot, frames, total_nframe);
        }
        if let Some(id) = self.last.find(frames, total_nframe) {
            return Some(id);
        }
        let id = self.lookup_or_insert(frames, total_nframe)?;
        self.last.keep(frames, total_nframe, id);
        Some(id)
    }

    /// The id of a stack kept flat in [`Interner::deep`]'s set `slot`, which then puts it
    /// first.
    #[inline(always)]
    fn find_deep(&mut self, slot: usize, frames: &[RawFrame], total: u16) -> Option<TracebackId> {
        let set = self.deep.get_mut(slot..slot + DEEP_WAYS)?;
        if let Some(id) = set[0].find(frames, total) {
            return Some(id);
        }
        for way in 1..DEEP_WAYS {
            if let Some(id) = set[way].find(frames, total) {
                set[..=way].rotate_right(1);
                return Some(id);
            }
        }
        None
    }

    /// Keeps a flat copy of a stack first in [`Interner::deep`]'s set `slot`, in place of the
    /// least recently used one.
    fn keep_deep(&mut self, slot: usize, frames: &[RawFrame], total: u16, id: TracebackId) {
        if self.deep.is_empty() {
            if self.deep.try_reserve_exact(DEEP_SETS * DEEP_WAYS).is_err() {
                return;
            }
            self.deep.resize_with(DEEP_SETS * DEEP_WAYS, Flat::default);
        }
        let set = &mut self.deep[slot..slot + DEEP_WAYS];
        set.rotate_right(1);
        set[0].keep(frames, total, id);
    }

    /// [`Interner::intern`] for a stack not in its first [`Interner::deep`] set, which the two
    /// innermost frames choose (cheap, for the hit path). Stacks that differ only further out
    /// share that set: a loop calling one function from ten lines (pyperformance's logging)
    /// cycled ten stacks through its four ways and missed on 61% of its allocations at 25
    /// frames. So a miss looks next in a second set chosen by all the frames ([`print_of`]),
    /// where a stack found in the index after missing both is kept too (a stack seen for the
    /// first time is kept in its first set only, or every new stack would take two ways).
    /// Every [`PROMOTE_EVERY`]-th hit in a second set also puts its stack back into its first.
    /// Choosing the only set by all the frames instead cost the hit path a pass over them:
    /// nbody 6% slower at 25 frames.
    ///
    /// Then its canonical copy (see the module docs) is looked for in that copy's own first
    /// set: where the raw stacks are too many for the sets (a recursion through a line with
    /// two calls makes one per call) the canonical ones may fit, and comparing a flat copy is
    /// cheaper than hashing the stack and walking its nodes. Otherwise the stack is found or
    /// stored, and its canonical copy kept if the stack was stored from another raw form
    /// (keeping it for every miss doubles the copies of a program whose raw stacks already
    /// overflow the sets). The raw copy goes to its first set either way: a line that makes
    /// several objects (`x * x + y * y`) reaches one canonical stack from several raw ones,
    /// and each must find itself next time without being canonicalized (nbody at 25 frames:
    /// 0.196 s, 0.271 s when only the first raw stack of each canonical one was kept;
    /// untraced 0.059 s). Out of line, so that the hit path inlined into the hooks stays
    /// small.
    ///
    /// # Safety
    /// As [`Interner::intern`].
    #[inline(never)]
    unsafe fn intern_deep(
        &mut self,
        slot: usize,
        raw: &[RawFrame],
        total: u16,
    ) -> Option<TracebackId> {
        let print = print_of(raw);
        let second = print_slot(print, total);
        if second != slot {
            if let Some(id) = self.find_deep(second, raw, total) {
                self.second_hits -= 1;
                if self.second_hits == 0 {
                    self.second_hits = PROMOTE_EVERY;
                    self.keep_deep(slot, raw, total, id);
                }
                return Some(id);
            }
        }
        let print = short_print(print);
        self.canonically(raw, |interner, frames| {
            let canonical_slot = (frames != raw).then(|| deep_slot(frames, total));
            if let Some(id) = canonical_slot.and_then(|c| interner.find_deep(c, frames, total)) {
                interner.keep_deep(slot, raw, total, id);
                return Some(id);
            }
            let (id, first, stored) = interner.find_or_store(frames, total, print)?;
            if let (Some(canonical_slot), true) = (canonical_slot, first != print) {
                interner.keep_deep(canonical_slot, frames, total, id);
            }
            if !stored && second != slot {
                interner.keep_deep(second, raw, total, id);
            }
            interner.keep_deep(slot, raw, total, id);
            Some(id)
        })
    }

    /// Whether stack `id` is exactly `frames` out of `total_nframe`.
    #[inline]
    fn matches(&self, id: TracebackId, hash: u64, frames: &[RawFrame], total_nframe: u16) -> bool {
        let stack = self.stacks.get(id);
        if stack.hash != hash
            || stack.total_nframe != total_nframe
            || usize::from(stack.len) != frames.len()
        {
            return false;
        }
        let mut node = stack.leaf;
        for frame in frames {
            let n = self.nodes.get(node);
            if n.code != frame.code || n.offset != frame.offset {
                return false;
            }
            node = n.parent;
        }
        true
    }

    /// Finds or stores the stack `raw`, by its frames' canonical offsets.
    ///
    /// # Safety
    /// As [`Interner::intern`].
    unsafe fn lookup_or_insert(&mut self, raw: &[RawFrame], total: u16) -> Option<TracebackId> {
        self.canonically(raw, |interner, frames| {
            Some(
                interner
                    .find_or_store(frames, total, short_print(print_of(raw)))?
                    .0,
            )
        })
    }

    /// `find(self, canonical copy of raw)`, the copy made in the interner's scratch.
    ///
    /// # Safety
    /// As [`Interner::intern`].
    #[inline(always)]
    unsafe fn canonically(
        &mut self,
        raw: &[RawFrame],
        find: impl FnOnce(&mut Self, &[RawFrame]) -> Option<TracebackId>,
    ) -> Option<TracebackId> {
        let mut frames = std::mem::take(&mut self.canonical);
        let id = self
            .canonicalize(raw, &mut frames)
            .and_then(|()| find(self, &frames));
        self.canonical = frames;
        if id.is_none() {
            // Runs read for a code object that no stored stack names (so not pinned) would
            // outlive its meaning: the address may go to another code object.
            for frame in raw {
                if !self.pins.contains_key(&frame.code) {
                    self.forget_lines(frame.code);
                }
            }
            self.canonical_memo.fill(Memo::default());
        }
        id
    }

    /// Writes `raw` into `out` with each offset replaced by its canonical offset, reading
    /// the runs of code objects met for the first time. `None` if memory cannot be had.
    ///
    /// # Safety
    /// As [`Interner::intern`].
    unsafe fn canonicalize(&mut self, raw: &[RawFrame], out: &mut Vec<RawFrame>) -> Option<()> {
        out.clear();
        out.try_reserve(raw.len()).ok()?;
        for frame in raw {
            let slot = memo_slot(frame);
            let seen = self.canonical_memo[slot];
            let offset = if seen.code == frame.code && seen.offset == frame.offset {
                seen.canonical
            } else if frame.code == 0 {
                frame.offset
            } else {
                let canonical = match self.same_line.get(&frame.code) {
                    Some(runs) => canonical_offset(runs, frame.offset),
                    None => canonical_offset(self.learn_lines(frame.code)?, frame.offset),
                };
                self.canonical_memo[slot] = Memo {
                    code: frame.code,
                    offset: frame.offset,
                    canonical,
                };
                canonical
            };
            out.push(RawFrame::new(frame.code, offset));
        }
        Some(())
    }

    /// Reads the line runs of a code object not in `same_line` yet, and keeps them there.
    ///
    /// # Safety
    /// As [`Interner::intern`]; `code` is a live code object.
    #[cold]
    #[inline(never)]
    unsafe fn learn_lines(&mut self, code: usize) -> Option<&[(i32, i32)]> {
        (self.read_runs)(code, &mut self.runs)?;
        canonical_runs(&mut self.runs, &mut self.order)?;
        let mut runs = Vec::new();
        runs.try_reserve_exact(self.runs.len()).ok()?;
        runs.extend_from_slice(&self.runs);
        self.same_line.try_reserve(1).ok()?;
        self.same_line_runs += runs.len();
        Some(
            self.same_line
                .entry(code)
                .or_insert(runs.into_boxed_slice()),
        )
    }

    /// Drops a code object's line runs (it is being released, or was never pinned). The
    /// caller empties the memo.
    fn forget_lines(&mut self, code: usize) {
        if let Some(runs) = self.same_line.remove(&code) {
            self.same_line_runs -= runs.len();
        }
    }

    /// [`Interner::lookup_or_insert`] for a stack of canonical offsets, reached from a raw
    /// stack of [`short_print`] `print`. Returns its id, the print of the raw stack that
    /// stored it, and whether that is this one (the stack is new).
    ///
    /// # Safety
    /// As [`Interner::intern`].
    unsafe fn find_or_store(
        &mut self,
        frames: &[RawFrame],
        total_nframe: u16,
        print: u16,
    ) -> Option<(TracebackId, u16, bool)> {
        let hash = hash_stack(frames, total_nframe);
        if let Some(&id) = self
            .index
            .find(hash, |&id| self.matches(id, hash, frames, total_nframe))
        {
            return Some((id, self.stacks.get(id).first_print, false));
        }
        self.reserve_for(frames.len())?;
        let shared = self
            .path
            .iter()
            .zip(frames.iter().rev())
            .take_while(|((seen, _), frame)| seen == *frame)
            .count();
        self.path.truncate(shared);
        let mut parent = self.path.last().map_or(NO_NODE, |&(_, node)| node);
        for frame in frames[..frames.len() - shared].iter().rev() {
            parent = self.node(parent, *frame);
            self.path.push((*frame, parent));
        }
        *self.refs.get_mut(parent) += 1;
        let id = self
            .free_stacks
            .pop()
            .unwrap_or(self.stacks.len() as TracebackId);
        self.stacks.set(
            id,
            Stack {
                leaf: parent,
                len: frames.len() as u16,
                total_nframe,
                keep: true,
                verdict_generation: 0,
                hash,
                first_print: print,
            },
        );
        let stacks = &self.stacks;
        self.index
            .insert_unique(hash, id, |&other| stacks.get(other).hash);
        self.stacks_since_collect += 1;
        if self.pins_since_sweep >= SWEEP_MIN_PINS.max(self.pins_at_sweep / 2)
            || self.collect_due()
            || super::tracer::sweep_owed()
        {
            super::tracer::schedule_sweep();
        }
        Some((id, print, true))
    }

    /// The node of `frame` under `parent`, made (and its code object pinned) if new.
    /// Infallible only after [`Interner::reserve_for`] succeeded for the whole stack.
    ///
    /// # Safety
    /// As [`Interner::intern`].
    unsafe fn node(&mut self, parent: u32, frame: RawFrame) -> u32 {
        let hash = hash_node(parent, frame.code, frame.offset);
        let nodes = &self.nodes;
        let found = self.node_index.find(hash, |&id| {
            let n = nodes.get(id);
            n.parent == parent && n.code == frame.code && n.offset == frame.offset
        });
        if let Some(&id) = found {
            return id;
        }
        let id = self.free_nodes.pop().unwrap_or(self.nodes.len() as u32);
        self.nodes.set(
            id,
            Node {
                code: frame.code,
                offset: frame.offset,
                parent,
            },
        );
        self.refs.set(id, 0);
        if parent != NO_NODE {
            *self.refs.get_mut(parent) += 1;
        }
        let nodes = &self.nodes;
        self.node_index.insert_unique(hash, id, |&other| {
            let n = nodes.get(other);
            hash_node(n.parent, n.code, n.offset)
        });
        // The unknown frame and a buried (or located, see [`Interner::intern_located`])
        // one name no live code object: nothing to pin.
        let next = if frame.code == 0 || frame.code & 1 != 0 {
            NO_NODE
        } else {
            match self.pins.entry(frame.code) {
                hashbrown::hash_map::Entry::Occupied(mut head) => {
                    let next = std::mem::replace(head.get_mut(), id);
                    *self.same_code_prev.get_mut(next) = id;
                    next
                }
                hashbrown::hash_map::Entry::Vacant(slot) => {
                    ffi::Py_INCREF(frame.code as *mut ffi::PyObject);
                    slot.insert(id);
                    self.pins_since_sweep += 1;
                    NO_NODE
                }
            }
        };
        self.same_code.set(id, next);
        self.same_code_prev.set(id, NO_NODE);
        id
    }

    /// Makes room for one more stack of `nframe` frames, so that storing it cannot allocate.
    fn reserve_for(&mut self, nframe: usize) -> Option<()> {
        self.nodes.try_reserve(nframe)?;
        self.same_code.try_reserve(nframe)?;
        self.same_code_prev.try_reserve(nframe)?;
        self.refs.try_reserve(nframe)?;
        self.stacks.try_reserve(1)?;
        let nodes = &self.nodes;
        self.node_index
            .try_reserve(nframe, |&other| {
                let n = nodes.get(other);
                hash_node(n.parent, n.code, n.offset)
            })
            .ok()?;
        let stacks = &self.stacks;
        self.index
            .try_reserve(1, |&other| stacks.get(other).hash)
            .ok()?;
        self.pins.try_reserve(nframe).ok()?;
        // Capacity for `nframe` entries, whatever the path's length now.
        self.path
            .try_reserve(nframe.saturating_sub(self.path.len()))
            .ok()
    }

    /// The id of a stack whose frames were resolved where they were walked, by a thread
    /// without the GIL ([`super::released`]): each frame is a tag from
    /// [`Resolver::located_tag`] and its line, as the nodes of a buried code object are.
    /// Nothing is pinned and no line table read. `None` if memory cannot be had.
    ///
    /// # Safety
    /// The GIL is held; every `code` in `frames` is such a tag (odd).
    pub unsafe fn intern_located(
        &mut self,
        frames: &[RawFrame],
        total_nframe: u16,
    ) -> Option<TracebackId> {
        debug_assert!(frames.iter().all(|frame| frame.code & 1 != 0));
        Some(self.find_or_store(frames, total_nframe, 0)?.0)
    }

    /// Writes the frames (most recent first) of an interned traceback into `out`, which is
    /// cleared first, and returns the stack's full depth. `None` if `out` cannot grow.
    pub fn frames(&self, id: TracebackId, out: &mut Vec<RawFrame>) -> Option<u16> {
        let stack = self.stacks.get(id);
        out.clear();
        out.try_reserve_exact(usize::from(stack.len)).ok()?;
        let mut node = stack.leaf;
        while node != NO_NODE {
            let n = self.nodes.get(node);
            out.push(RawFrame::new(n.code, n.offset));
            node = n.parent;
        }
        Some(stack.total_nframe)
    }

    /// The cached filter verdict for a stack, if judged under filter generation `generation`.
    #[inline]
    pub fn verdict(&self, id: TracebackId, generation: u32) -> Option<bool> {
        let stack = self.stacks.get(id);
        (stack.verdict_generation == generation).then_some(stack.keep)
    }

    pub fn set_verdict(&mut self, id: TracebackId, generation: u32, keep: bool) {
        let stack = self.stacks.get_mut(id);
        stack.keep = keep;
        stack.verdict_generation = generation;
    }

    /// One more than the highest id in use (freed ids below it are reused first).
    pub fn len(&self) -> usize {
        self.stacks.len()
    }

    /// Whether a pass of [`Interner::collect`] is under way or due: enough stacks were
    /// stored since the last one ended.
    pub fn collect_due(&self) -> bool {
        self.collect_cursor != 0
            || self.stacks_since_collect >= COLLECT_MIN_STACKS.max(self.stacks_at_collect / 2)
    }

    /// How many code objects are pinned.
    pub fn pin_count(&self) -> usize {
        self.pins.len()
    }

    /// How many stacks are stored now (ids in use).
    pub fn live_stacks(&self) -> usize {
        self.stacks.len() - self.free_stacks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.stacks.len() == 0
    }

    /// How many trie nodes the interned stacks use.
    pub fn node_count(&self) -> usize {
        self.nodes.len() - self.free_nodes.len()
    }

    /// The pinned code objects that nothing but the interner references any more, at most
    /// `most` of them (burying and releasing each costs a few microseconds: the caller bounds
    /// a sweep's pause and leaves the rest to the next one), each with its nodes. Starts a new
    /// sweep period.
    ///
    /// # Safety
    /// The GIL is held.
    pub unsafe fn dying_codes(&mut self, most: usize) -> Vec<DyingCode> {
        self.pins_since_sweep = 0;
        let mut dying = Vec::new();
        for (&code, &head) in &self.pins {
            if dying.len() >= most {
                break;
            }
            if ffi::Py_REFCNT(code as *mut ffi::PyObject) != 1 {
                continue;
            }
            let mut nodes = Vec::new();
            let mut node = head;
            while node != NO_NODE {
                nodes.push((node, self.nodes.get(node).offset));
                node = *self.same_code.get(node);
            }
            dying.push(DyingCode { code, nodes });
        }
        self.pins_at_sweep = self.pins.len() - dying.len();
        dying
    }

    /// Rewrites the nodes of each dying code object to its buried record (`tags[i]`, from
    /// [`Resolver::bury`]) and resolved lines, and hands over the references to release
    /// (by the caller, once it holds no borrow of tracer state). A code object that was
    /// referenced again, or named by a new node, since [`Interner::dying_codes`] is skipped
    /// and stays pinned.
    ///
    /// # Safety
    /// The GIL is held; `dying` comes from this interner's last `dying_codes()`.
    pub unsafe fn bury(
        &mut self,
        dying: &[DyingCode],
        burials: &[Burial],
    ) -> (Vec<usize>, Vec<usize>) {
        let mut released = Vec::with_capacity(dying.len());
        let mut unused = Vec::new();
        for (code, burial) in dying.iter().zip(burials) {
            let head = code.nodes.first().map_or(NO_NODE, |&(node, _)| node);
            let record = burial.tag >> 1;
            if ffi::Py_REFCNT(code.code as *mut ffi::PyObject) != 1
                || self.pins.get(&code.code) != Some(&head)
                || (self.buried_nodes.len() <= record
                    && self
                        .buried_nodes
                        .try_reserve(record + 1 - self.buried_nodes.len())
                        .is_err())
            {
                unused.push(burial.tag);
                continue;
            }
            if self.buried_nodes.len() <= record {
                self.buried_nodes.resize(record + 1, 0);
            }
            self.buried_nodes[record] = code.nodes.len() as u32;
            for (&(node, _), &line) in code.nodes.iter().zip(&burial.lines) {
                let old = *self.nodes.get(node);
                let hash = hash_node(old.parent, old.code, old.offset);
                if let Ok(entry) = self.node_index.find_entry(hash, |&id| id == node) {
                    entry.remove();
                }
                let n = self.nodes.get_mut(node);
                n.code = burial.tag;
                n.offset = line as i32;
            }
            self.pins.remove(&code.code);
            self.forget_lines(code.code);
            released.push(code.code);
        }
        // The flat copies of recent stacks may name a code object being released.
        self.last.forget();
        self.path.clear();
        self.recent.fill(Recent::default());
        self.canonical_memo.fill(Memo::default());
        self.deep.iter_mut().for_each(Flat::forget);
        (released, unused)
    }

    /// Frees the stacks, among at most `budget` ids from where the last call stopped, that
    /// `idle` says nothing refers to any more (no live block, in any domain, now or at the
    /// peak), at most `most_freed` of them (freeing one and releasing what only it kept costs
    /// about half a microsecond: looking is cheaper than freeing, so a pause is bounded by
    /// both), with the nodes only they used; a code object none of the remaining nodes names
    /// is unpinned, and a buried record none of them carries is handed back. The freed ids
    /// and nodes are reused by the next stacks stored. Returns what the caller must release
    /// once it holds no borrow of tracer state: the unpinned code objects (references to drop
    /// after the resolver forgets them) and the buried tags no node carries any more.
    ///
    /// The caller guarantees that no id it frees is held anywhere else: the trace table, the
    /// young blocks and the peak are what `idle` reads; waiting re-attributions are settled
    /// first; a hook holding an id it took out of the table to put back (a reallocation
    /// without the GIL) makes the caller skip the collection. The flat copies and the memos
    /// are purged of what is freed here.
    ///
    /// `Collected::done` is whether this call ended a pass over every id.
    pub fn collect(
        &mut self,
        budget: usize,
        most_freed: usize,
        idle: impl Fn(TracebackId) -> bool,
        may_free: impl FnOnce() -> bool,
    ) -> Collected {
        let mut out = Collected::default();
        let len = self.stacks.len() as u32;
        let mut id = self.collect_cursor.min(len);
        let mut idle_ids = Vec::new();
        let mut looked = 0;
        while looked < budget && idle_ids.len() < most_freed {
            if id >= len {
                id = 0;
                out.done = true;
                break;
            }
            looked += 1;
            let stack = self.stacks.get(id);
            if id != UNKNOWN_TRACEBACK && stack.leaf != NO_NODE && idle(id) {
                if idle_ids.try_reserve(1).is_err() {
                    break;
                }
                idle_ids.push(id);
            }
            id += 1;
        }
        out.looked = looked;
        // Read after the counters: a hook that took a trace out to put it back raised it
        // before the count it took out fell to zero.
        if !may_free() {
            out.done = false;
            out.blocked = true;
            return out;
        }
        if self.free_stacks.try_reserve(idle_ids.len()).is_err() {
            out.done = false;
            return out;
        }
        for id in idle_ids {
            self.free_stack(id, &mut out);
        }
        self.collect_cursor = id;
        if out.done {
            self.stacks_since_collect = 0;
            self.stacks_at_collect = self.live_stacks();
        }
        if out.freed_stacks != 0 {
            self.purge_freed(!out.unpinned.is_empty());
        }
        out
    }

    /// Frees stack `id` and every node that only it kept.
    fn free_stack(&mut self, id: TracebackId, out: &mut Collected) {
        let stack = self.stacks.get_mut(id);
        let (hash, mut node) = (stack.hash, stack.leaf);
        stack.leaf = NO_NODE;
        if let Ok(entry) = self.index.find_entry(hash, |&other| other == id) {
            entry.remove();
        }
        self.free_stacks.push(id);
        out.freed_stacks += 1;
        // Its verdict and print must not pass to the stack that takes the id.
        debug_assert!(self.stacks.get(id).leaf == NO_NODE);
        while node != NO_NODE {
            let refs = self.refs.get_mut(node);
            *refs -= 1;
            if *refs != 0 || self.free_nodes.try_reserve(1).is_err() {
                break;
            }
            let n = *self.nodes.get(node);
            // A buried code object's nodes left the index when it was buried; a located
            // frame's (a tag made by a thread without the GIL, see `intern_located`) are in
            // it, like a live code object's, and must leave it with the node.
            let hash = hash_node(n.parent, n.code, n.offset);
            if let Ok(entry) = self.node_index.find_entry(hash, |&other| other == node) {
                entry.remove();
            }
            if n.code & 1 != 0 {
                // Only buried code objects count their nodes; a located tag is never released.
                let record = n.code >> 1;
                if let Some(count) = self.buried_nodes.get_mut(record).filter(|c| **c > 0) {
                    *count -= 1;
                    if *count == 0 {
                        out.freed_tags.push(n.code);
                    }
                }
            } else if n.code != 0 {
                self.unlink(node, n.code, out);
            }
            self.nodes.get_mut(node).parent = NO_NODE;
            self.free_nodes.push(node);
            node = n.parent;
        }
    }

    /// Takes a live code object's node out of its chain; the code object is unpinned when
    /// no node is left.
    fn unlink(&mut self, node: u32, code: usize, out: &mut Collected) {
        let next = *self.same_code.get(node);
        let prev = *self.same_code_prev.get(node);
        if next != NO_NODE {
            *self.same_code_prev.get_mut(next) = prev;
        }
        if prev != NO_NODE {
            *self.same_code.get_mut(prev) = next;
        } else if next != NO_NODE {
            self.pins.insert(code, next);
        } else {
            self.pins.remove(&code);
            self.forget_lines(code);
            out.unpinned.push(code);
        }
    }

    /// Empties the flat copies, the path and the memo of what [`Interner::collect`] freed: a
    /// freed id may be given to another stack, and a code object no longer pinned may die and
    /// leave its address to another.
    fn purge_freed(&mut self, unpinned: bool) {
        let stacks = &self.stacks;
        let freed = |id: TracebackId| stacks.get(id).leaf == NO_NODE;
        for slot in self.recent.iter_mut() {
            if slot.key != 0 && freed(slot.id) {
                *slot = Recent::default();
            }
        }
        for flat in self.deep.iter_mut().chain(std::iter::once(&mut self.last)) {
            if flat.total_nframe != 0 && freed(flat.id) {
                flat.forget();
            }
        }
        self.path.clear();
        if unpinned {
            self.canonical_memo.fill(Memo::default());
        }
    }

    /// Hands over the pinned code objects, for the caller to release once it no longer holds
    /// any borrow of tracer state (releasing may run arbitrary code through weakref callbacks).
    pub fn take_pins(&mut self) -> Vec<usize> {
        self.canonical_memo.fill(Memo::default());
        self.same_line.clear();
        self.same_line_runs = 0;
        self.pins.drain().map(|(code, _)| code).collect()
    }

    pub fn memory_usage(&self) -> usize {
        self.nodes.memory_usage()
            + self.same_code.memory_usage()
            + self.same_code_prev.memory_usage()
            + self.refs.memory_usage()
            + (self.free_nodes.capacity() + self.free_stacks.capacity()) * 4
            + self.buried_nodes.capacity() * 4
            + self.stacks.memory_usage()
            + self.node_index.capacity() * (std::mem::size_of::<u32>() + 1)
            + self.index.capacity() * (std::mem::size_of::<TracebackId>() + 1)
            + self.pins.capacity() * (std::mem::size_of::<(usize, u32)>() + 1)
            + self.last.memory_usage()
            + self.path.capacity() * std::mem::size_of::<(RawFrame, u32)>()
            + std::mem::size_of::<[Recent; RECENT]>()
            + std::mem::size_of::<[Memo; MEMO]>()
            + self.deep.capacity() * std::mem::size_of::<Flat>()
            + self.deep.iter().map(Flat::memory_usage).sum::<usize>()
            + self.same_line.capacity() * (std::mem::size_of::<(usize, Box<[(i32, i32)]>)>() + 1)
            + self.same_line_runs * std::mem::size_of::<(i32, i32)>()
            + self.runs.capacity() * std::mem::size_of::<(i32, i32)>()
            + self.order.capacity() * std::mem::size_of::<u32>()
            + self.canonical.capacity() * std::mem::size_of::<RawFrame>()
    }
}

/// What [`Interner::collect`] freed, and what its caller must release.
#[derive(Default)]
pub struct Collected {
    /// Ids looked at.
    pub looked: usize,
    pub freed_stacks: usize,
    /// Code objects no node names any more: the resolver forgets them, then their references
    /// are dropped.
    pub unpinned: Vec<usize>,
    /// Buried tags no node carries any more, for [`Resolver::release_buried`].
    pub freed_tags: Vec<usize>,
    pub done: bool,
    /// Nothing was freed because a hook may put an id back: the next sweep the program's
    /// own activity brings (a new stack, a reading) tries again.
    pub blocked: bool,
}

/// What a dead code object's nodes become: its record's tag and, per node, the line.
pub struct Burial {
    tag: usize,
    lines: Vec<u32>,
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

/// The code-object attributes the resolver reads, as interned strings made once, when the
/// module is imported ([`prepare_names`]). A name made afresh for each lookup would not only
/// cost an allocation: CPython's type attribute cache keeps a reference to the name it was
/// asked for, so a few such strings per snapshot stayed alive, traced and charged to the line
/// that took the snapshot (or the previous one), where `tracemalloc` charges nothing.
#[cfg(Py_3_11)]
static CODE_NAME: Interned = Interned::new("co_qualname");
/// 3.9 and 3.10 have no `co_qualname`: asking for it would raise (and allocate) every time.
#[cfg(not(Py_3_11))]
static CODE_NAME: Interned = Interned::new("co_name");
static CO_FIRSTLINENO: Interned = Interned::new("co_firstlineno");
static CO_FILENAME: Interned = Interned::new("co_filename");

/// How the resolver turns a `str` into the model's byte strings and back (surrogatepass
/// UTF-8). Those conversions belong to the pyo3 layer (`py::strings`, shared by every
/// converter), which hands them down when the module is imported ([`set_strings`]): this
/// module, whose interning runs in the hooks, imports nothing above the hook layer.
#[derive(Clone, Copy)]
pub struct Strings {
    pub str_bytes: fn(&Bound<'_, PyString>) -> PyResult<Vec<u8>>,
    pub bytes_str: for<'py> fn(Python<'py>, &[u8]) -> PyResult<Bound<'py, PyString>>,
}

static STRINGS: OnceLock<Strings> = OnceLock::new();

/// Gives the resolver its string conversions; called when the module is imported, before
/// anything is traced or resolved.
pub fn set_strings(strings: Strings) {
    let _ = STRINGS.set(strings);
}

fn strings() -> &'static Strings {
    STRINGS
        .get()
        .expect("the module's import gives the resolver its string conversions")
}

fn str_bytes(s: &Bound<'_, PyString>) -> PyResult<Vec<u8>> {
    (strings().str_bytes)(s)
}

fn bytes_str<'py>(py: Python<'py>, b: &[u8]) -> PyResult<Bound<'py, PyString>> {
    (strings().bytes_str)(py, b)
}

/// Makes the attribute names of [`CODE_NAME`] and its siblings; called when the module is
/// imported, before anything is traced.
pub fn prepare_names(py: Python<'_>) {
    for name in [&CODE_NAME, &CO_FIRSTLINENO, &CO_FILENAME] {
        name.get(py);
    }
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
    /// Per buried (dead) code object, what `by_code` held for it; its nodes' tags index this.
    buried: Vec<(u32, Option<u32>)>,
    /// The tags made for frames resolved without the GIL, by what they name, so that the same
    /// function gets one tag however often its frames are met ([`Resolver::located_tag`]).
    located: HashMap<LocatedCode, usize>,
    /// The tags in `located`, never released (see [`Resolver::release_buried`]).
    located_tags: std::collections::HashSet<usize>,
    /// Slots of `buried`, `filenames` and `functions` whose record was released (no node
    /// names it any more), reused first.
    free_buried: Vec<u32>,
    free_filenames: Vec<u32>,
    free_functions: Vec<u32>,
}

/// A code object known only by what a snapshot shows of it: its filename, and its function's
/// name and first line (see [`Resolver::located_tag`]).
type LocatedCode = (Box<[u8]>, Option<(Box<[u8]>, u32)>);

impl Resolver {
    /// `Err(OutOfMemory)` when the interpreter cannot make the `<unknown>` name: pyo3's
    /// `PyString::new` would panic there, and `start()` must raise `MemoryError`.
    pub fn new(py: Python<'_>) -> crate::error::Result<Self> {
        let mut resolver = Self {
            filenames: Vec::new(),
            by_code: HashMap::new(),
            lines: HashMap::new(),
            functions: Vec::new(),
            buried: Vec::new(),
            located: HashMap::new(),
            located_tags: std::collections::HashSet::new(),
            free_buried: Vec::new(),
            free_filenames: Vec::new(),
            free_functions: Vec::new(),
        };
        const UNKNOWN: &str = "<unknown>";
        // SAFETY: the GIL is held (`py`); the result is a new reference or NULL.
        let name = unsafe {
            let ptr = pyo3::ffi::PyUnicode_FromStringAndSize(
                UNKNOWN.as_ptr().cast(),
                UNKNOWN.len() as pyo3::ffi::Py_ssize_t,
            );
            Bound::from_owned_ptr_or_opt(py, ptr)
        };
        let Some(name) = name else {
            // The MemoryError set is raised again from the error returned.
            drop(PyErr::take(py));
            return Err(crate::error::Error::OutOfMemory);
        };
        // SAFETY: PyUnicode_FromStringAndSize made a str.
        let name = unsafe { name.cast_into_unchecked::<PyString>() };
        resolver.push_filename(name.unbind(), UNKNOWN.as_bytes());
        Ok(resolver)
    }

    fn push_filename(&mut self, object: Py<PyString>, bytes: &[u8]) -> u32 {
        let filename = ResolvedFilename {
            object,
            bytes: bytes.into(),
        };
        match self.free_filenames.pop() {
            Some(index) => {
                self.filenames[index as usize] = filename;
                index
            }
            None => {
                self.filenames.push(filename);
                (self.filenames.len() - 1) as u32
            }
        }
    }

    /// Releases a code object's record: its filename (unless `<unknown>`) and function slots,
    /// each its own (they are made per code object), go to the free lists.
    fn release_record(&mut self, py: Python<'_>, (filename, function): (u32, Option<u32>)) {
        if filename != 0 {
            let unknown = self.filenames[0].object.clone_ref(py);
            self.filenames[filename as usize] = ResolvedFilename {
                object: unknown,
                bytes: Box::default(),
            };
            self.free_filenames.push(filename);
        }
        if let Some(function) = function {
            self.functions[function as usize].name = Box::default();
            self.free_functions.push(function);
        }
    }

    /// Forgets live code objects that the interner no longer pins (no stored stack names
    /// them): their address may go to another code object once they die.
    pub fn forget_codes(&mut self, py: Python<'_>, codes: &[usize]) {
        let mut resolved = false;
        for code in codes {
            if let Some(record) = self.by_code.remove(code) {
                self.release_record(py, record);
                resolved = true;
            }
        }
        if resolved {
            let codes: std::collections::HashSet<usize> = codes.iter().copied().collect();
            self.lines.retain(|frame, _| !codes.contains(&frame.code));
        }
    }

    /// Releases the records of buried code objects whose tags no node carries any more (from
    /// [`Interner::collect`], or unused by [`Interner::bury`]).
    pub fn release_buried(&mut self, py: Python<'_>, tags: &[usize]) {
        for &tag in tags {
            // A located tag stays: `located` hands it out again for the same file and function.
            if self.located_tags.contains(&tag) {
                continue;
            }
            let index = tag >> 1;
            let record = std::mem::take(&mut self.buried[index]);
            self.release_record(py, record);
            self.free_buried.push(index as u32);
        }
    }

    pub fn filename(&self, index: u32) -> &ResolvedFilename {
        &self.filenames[index as usize]
    }

    /// `(filename index, lineno, function index)` of a raw frame, as `tracemalloc` would
    /// have reported it: a filename that is not a `str` is `<unknown>`, a line that cannot be
    /// found is 0; the function (index for [`Resolver::function`]) is `None` for the unknown
    /// frame and for a code object whose name is not a `str`. All come from one lookup by
    /// code object, so snapshots pay little extra for the function.
    ///
    /// # Safety
    /// `frame` comes from the live interner (0, a pinned code object, or a buried one's tag).
    pub unsafe fn resolve_with_function(
        &mut self,
        py: Python<'_>,
        frame: RawFrame,
    ) -> (u32, u32, Option<u32>) {
        if frame.code == 0 {
            return (0, 0, None);
        }
        if frame.code & 1 != 0 {
            // A buried code object: the node holds the line it resolved to.
            let (filename, function) = self.buried[frame.code >> 1];
            return (filename, frame.offset as u32, function);
        }
        let (filename, function) = self.code(py, frame.code);
        (filename, self.line(frame), function)
    }

    /// The filename and function indexes of a live code object, resolved once.
    ///
    /// # Safety
    /// `code` is a live code object and the GIL is held.
    unsafe fn code(&mut self, py: Python<'_>, code: usize) -> (u32, Option<u32>) {
        if let Some(&found) = self.by_code.get(&code) {
            return found;
        }
        let found = (
            self.resolve_filename(py, code),
            self.resolve_function(py, code),
        );
        self.by_code.insert(code, found);
        found
    }

    /// # Safety
    /// `frame.code` is a live code object and the GIL is held.
    unsafe fn line(&mut self, frame: RawFrame) -> u32 {
        if !self.lines.contains_key(&frame) {
            self.cache_lines(vec![frame]);
        }
        self.lines[&frame]
    }

    /// Whether `frame` names a live code object whose line at that offset is not known yet.
    pub fn wants_line(&self, frame: &RawFrame) -> bool {
        frame.code != 0 && frame.code & 1 == 0 && !self.lines.contains_key(frame)
    }

    /// Resolves and keeps the lines of `frames` (live code objects only), reading each code
    /// object's line table once for all its offsets rather than once per offset (see
    /// [`crate::capture::Interpreter::lines`]).
    ///
    /// # Safety
    /// Every code object `frames` names is alive and the GIL is held.
    pub unsafe fn cache_lines(&mut self, mut frames: Vec<RawFrame>) {
        frames.sort_unstable_by_key(|frame| (frame.code, frame.offset));
        frames.dedup();
        let mut offsets = Vec::new();
        let mut lines = Vec::new();
        for group in frames.chunk_by(|a, b| a.code == b.code) {
            offsets.clear();
            offsets.extend(group.iter().map(|frame| frame.offset));
            lines.clear();
            Current::lines(group[0].code as *mut ffi::PyObject, &offsets, &mut lines);
            for (&frame, &line) in group.iter().zip(&lines) {
                self.lines.insert(frame, line.max(0) as u32);
            }
        }
    }

    /// Resolves everything the interner's nodes need from each dying code object (filename,
    /// function, the line of each offset used), records it under a tag for
    /// [`Interner::bury`], and forgets the caches keyed by its address, which a new code
    /// object may take once this one is released.
    ///
    /// # Safety
    /// The GIL is held and every code object in `dying` is still alive.
    pub unsafe fn bury(&mut self, py: Python<'_>, dying: &[DyingCode]) -> Vec<Burial> {
        dying
            .iter()
            .map(|dying| {
                let record = self.code(py, dying.code);
                let frames: Vec<RawFrame> = dying
                    .offsets()
                    .map(|offset| RawFrame::new(dying.code, offset))
                    .collect();
                self.cache_lines(frames.clone());
                let lines = frames.iter().map(|&frame| self.line(frame)).collect();
                for frame in &frames {
                    self.lines.remove(frame);
                }
                self.by_code.remove(&dying.code);
                let index = match self.free_buried.pop() {
                    Some(index) => {
                        self.buried[index as usize] = record;
                        index as usize
                    }
                    None => {
                        self.buried.push(record);
                        self.buried.len() - 1
                    }
                };
                Burial {
                    tag: index << 1 | 1,
                    lines,
                }
            })
            .collect()
    }

    /// The tag of a code object known only by its filename and function (name and first
    /// line): a frame resolved by a thread without the GIL ([`super::released`]), which a
    /// node then names as a buried code object, with its line in place of the offset.
    pub fn located_tag(
        &mut self,
        py: Python<'_>,
        filename: &[u8],
        function: Option<(&[u8], u32)>,
    ) -> usize {
        let key = (
            Box::from(filename),
            function.map(|(name, first)| (Box::from(name), first)),
        );
        if let Some(&tag) = self.located.get(&key) {
            return tag;
        }
        let filename_index = if filename == b"<unknown>" {
            0
        } else {
            match bytes_str(py, filename) {
                Ok(object) => self.push_filename(object.unbind(), filename),
                Err(_) => 0,
            }
        };
        let function_index = function.map(|(name, first_lineno)| {
            self.functions.push(ResolvedFunction {
                name: Box::from(name),
                first_lineno,
            });
            (self.functions.len() - 1) as u32
        });
        self.buried.push((filename_index, function_index));
        let tag = (self.buried.len() - 1) << 1 | 1;
        self.located.insert(key, tag);
        self.located_tags.insert(tag);
        tag
    }

    pub fn function(&self, index: u32) -> &ResolvedFunction {
        &self.functions[index as usize]
    }

    unsafe fn resolve_function(&mut self, py: Python<'_>, code: usize) -> Option<u32> {
        let code = Bound::from_borrowed_ptr(py, code as *mut ffi::PyObject);
        let name = code
            .getattr(CODE_NAME.get(py))
            .ok()
            .and_then(|name| name.cast_into::<PyString>().ok())
            .and_then(|name| str_bytes(&name).ok());
        let first_lineno = code
            .getattr(CO_FIRSTLINENO.get(py))
            .and_then(|n| n.extract::<u32>())
            .unwrap_or(0);
        name.map(|name| {
            let function = ResolvedFunction {
                name: name.into_boxed_slice(),
                first_lineno,
            };
            match self.free_functions.pop() {
                Some(index) => {
                    self.functions[index as usize] = function;
                    index
                }
                None => {
                    self.functions.push(function);
                    (self.functions.len() - 1) as u32
                }
            }
        })
    }

    unsafe fn resolve_filename(&mut self, py: Python<'_>, code: usize) -> u32 {
        let code = Bound::from_borrowed_ptr(py, code as *mut ffi::PyObject);
        let name = code
            .getattr(CO_FILENAME.get(py))
            .ok()
            .and_then(|name| name.cast_into::<PyString>().ok());
        let Some(name) = name else {
            return 0;
        };
        match str_bytes(&name) {
            Ok(bytes) => self.push_filename(name.unbind(), &bytes),
            Err(_) => 0,
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
            + self.buried.capacity() * std::mem::size_of::<(u32, Option<u32>)>()
            + (self.free_buried.capacity()
                + self.free_filenames.capacity()
                + self.free_functions.capacity())
                * 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(code: usize, offset: i32) -> RawFrame {
        RawFrame::new(code, offset)
    }

    fn frames_of(interner: &Interner, id: TracebackId) -> (Vec<RawFrame>, u16) {
        let mut out = Vec::new();
        let total = interner.frames(id, &mut out).unwrap();
        (out, total)
    }

    // Code address 0 only: no pinning (no interpreter needed).

    #[test]
    fn equal_stacks_share_an_id_and_different_ones_do_not() {
        let mut interner = Interner::new();
        let cases: &[(&[RawFrame], u16)] = &[
            (&[f(0, 2), f(0, 4)], 3),
            (&[f(0, 2), f(0, 4)], 4), // same frames, other depth
            (&[f(0, 4), f(0, 2)], 3), // other order
            (&[f(0, 2)], 1),
            (&[f(0, 4)], 1),          // a prefix of the third, as a stack of its own
            (&[f(0, 6), f(0, 4)], 2), // shares its outer frame with the first
        ];
        let ids: Vec<_> = cases
            .iter()
            .map(|(frames, total)| unsafe { interner.intern(frames, *total) }.unwrap())
            .collect();
        let again: Vec<_> = cases
            .iter()
            .rev()
            .map(|(frames, total)| unsafe { interner.intern(frames, *total) }.unwrap())
            .collect();
        assert_eq!(ids, again.into_iter().rev().collect::<Vec<_>>());
        let distinct: std::collections::HashSet<_> = ids.iter().collect();
        assert_eq!(distinct.len(), cases.len());
        assert!(!ids.contains(&UNKNOWN_TRACEBACK));
        for ((frames, total), id) in cases.iter().zip(&ids) {
            assert_eq!(frames_of(&interner, *id), (frames.to_vec(), *total));
        }
        assert_eq!(
            frames_of(&interner, UNKNOWN_TRACEBACK),
            (vec![RawFrame::UNKNOWN], 1)
        );
    }

    /// One-frame stacks go through the direct-mapped recent slots: far more lines than slots
    /// (so slots are shared and overwritten), each line at two depths, found again in another
    /// order, must keep their ids.
    #[test]
    fn one_frame_stacks_keep_their_ids_past_the_recent_slots() {
        let mut interner = Interner::new();
        let stacks: Vec<(RawFrame, u16)> = (0..4 * RECENT as i32)
            .flat_map(|i| [(f(0, 2 * i), 1), (f(0, 2 * i), 7)])
            .collect();
        let ids: Vec<_> = stacks
            .iter()
            .map(|(frame, total)| unsafe { interner.intern(&[*frame], *total) }.unwrap())
            .collect();
        let distinct: std::collections::HashSet<_> = ids.iter().collect();
        assert_eq!(distinct.len(), stacks.len());
        for round in 0..3 {
            for (i, (frame, total)) in stacks.iter().enumerate().rev().step_by(round + 1) {
                let id = unsafe { interner.intern(&[*frame], *total) }.unwrap();
                assert_eq!(id, ids[i], "{frame:?} of {total}, round {round}");
                assert_eq!(frames_of(&interner, id), (vec![*frame], *total));
            }
        }
    }

    /// The recent slots' key keeps the code address and the depth apart, and refuses an
    /// address that would overlap the depth (such a frame is interned without the slots).
    #[test]
    fn recent_keys_hold_code_and_depth() {
        assert_eq!(std::mem::size_of::<Recent>(), 16);
        // (code address, depth, key)
        let cases: [(usize, u16, Option<u64>); 5] = [
            (0x7f12_3456_7890, 1, Some(0x0001_7f12_3456_7890)),
            (0x7f12_3456_7890, 2, Some(0x0002_7f12_3456_7890)),
            (0x0000_ffff_ffff_fff0, u16::MAX, Some(0xffff_ffff_ffff_fff0)),
            (1 << 48, 1, None),
            (usize::MAX, 1, None),
        ];
        for (code, depth, key) in cases {
            assert_eq!(recent_key(&f(code, 0), depth), key, "{code:#x} at {depth}");
        }
    }

    /// Stacks of 2 to `DEEP_MAX` frames go through the flat slots: far more stacks than slots,
    /// many sharing their two innermost frames (and so a slot) and differing further out or
    /// in depth, found again in other orders, must keep their ids; stacks just past
    /// `DEEP_MAX` (through `last`) too.
    #[test]
    fn deep_stacks_keep_their_ids_past_the_flat_slots() {
        let mut interner = Interner::new();
        let mut stacks: Vec<(Vec<RawFrame>, u16)> = Vec::new();
        for i in 0..3 * (DEEP_SETS * DEEP_WAYS) as i32 {
            for len in [2, 3, 25, DEEP_MAX, DEEP_MAX + 1] {
                let mut frames: Vec<RawFrame> = (0..len as i32).map(|k| f(0, 2 * k)).collect();
                frames[0] = f(0, 1000 + 2 * (i % 8));
                frames[len - 1] = f(0, 5000 + 2 * i);
                stacks.push((frames.clone(), len as u16));
                stacks.push((frames, len as u16 + 1));
            }
        }
        let ids: Vec<_> = stacks
            .iter()
            .map(|(frames, total)| unsafe { interner.intern(frames, *total) }.unwrap())
            .collect();
        let distinct: std::collections::HashSet<_> = ids.iter().collect();
        assert_eq!(distinct.len(), stacks.len());
        for round in 0..3 {
            for (i, (frames, total)) in stacks.iter().enumerate().rev().step_by(round + 1) {
                let id = unsafe { interner.intern(frames, *total) }.unwrap();
                assert_eq!(id, ids[i], "stack {i} of {total}, round {round}");
                assert_eq!(frames_of(&interner, id), (frames.clone(), *total));
            }
        }
        // The same frames at two depths that share a slot are still two stacks.
        let frames = &stacks[0].0;
        let first = deep_slot(frames, 2);
        let other = (3..u16::MAX)
            .find(|&total| deep_slot(frames, total) == first)
            .unwrap();
        for _ in 0..2 {
            for total in [2, other] {
                let id = unsafe { interner.intern(frames, total) }.unwrap();
                assert_eq!(frames_of(&interner, id), (frames.clone(), total));
            }
        }
    }

    /// A new stack takes the nodes of the outer frames it shares with the stack stored before
    /// it from [`Interner::path`], and finds or makes the rest: each stack adds one node per
    /// frame not already in the trie under the same callers, whichever stack was stored last.
    #[test]
    fn new_stacks_add_only_the_nodes_the_trie_lacks() {
        let (a, b, c, d, e, q, x) = (2, 4, 6, 8, 10, 12, 14);
        // (frames outermost first, depth, nodes the stack adds)
        let cases: &[(&[i32], u16, usize)] = &[
            (&[a, b, c], 3, 3),
            (&[a, b, d], 3, 1),    // shares a, b with the last
            (&[a, e, c], 3, 2),    // shares a
            (&[a, b, c, x], 4, 1), // a, b, c are in the trie, but not all on the last path
            (&[a, b], 2, 0),       // a prefix of stored stacks: nodes exist
            (&[q, b, c], 3, 3),    // another outermost frame: nothing shared
            (&[a, b, d], 5, 0),    // the frames of the second at another depth
            (&[a, b, d], 3, 0),    // the second again
        ];
        let mut interner = Interner::new();
        let mut ids = Vec::new();
        for (i, &(outer_first, total, added)) in cases.iter().enumerate() {
            let frames: Vec<RawFrame> = outer_first.iter().rev().map(|&o| f(0, o)).collect();
            let before = interner.node_count();
            let id = unsafe { interner.intern(&frames, total) }.unwrap();
            assert_eq!(interner.node_count() - before, added, "case {i}");
            assert_eq!(frames_of(&interner, id), (frames, total), "case {i}");
            ids.push(id);
        }
        assert_eq!(ids[1], ids[7]);
        let distinct: std::collections::HashSet<_> = ids.iter().collect();
        assert_eq!(distinct.len(), cases.len() - 1);
    }

    /// The ways of a set hold its most recently used stacks: stacks that share a set are all
    /// found flat while no more of them than ways are in use, and the next one evicts the
    /// least recently used.
    #[test]
    fn a_deep_set_keeps_its_most_recently_used_stacks() {
        let mut interner = Interner::new();
        let frames = vec![f(0, 2), f(0, 4), f(0, 6)];
        let set = deep_slot(&frames, 3);
        let totals: Vec<u16> = (3..u16::MAX)
            .filter(|&total| deep_slot(&frames, total) == set)
            .take(DEEP_WAYS + 1)
            .collect();
        let cached = |interner: &Interner| -> Vec<u16> {
            interner.deep[set..set + DEEP_WAYS]
                .iter()
                .map(|way| way.total_nframe)
                .collect()
        };
        let ids: Vec<_> = totals
            .iter()
            .map(|&total| unsafe { interner.intern(&frames, total) }.unwrap())
            .collect();
        // Most recent first; the first stack was evicted by the last.
        let expected: Vec<u16> = totals[1..].iter().rev().copied().collect();
        assert_eq!(cached(&interner), expected);
        // A hit in a later way moves it first, keeping the others' order.
        let oldest = totals[1];
        assert_eq!(unsafe { interner.intern(&frames, oldest) }, Some(ids[1]));
        let mut expected: Vec<u16> = vec![oldest];
        expected.extend(totals[2..].iter().rev());
        assert_eq!(cached(&interner), expected);
        // The evicted stack is still found (through the index), and takes the first way.
        assert_eq!(unsafe { interner.intern(&frames, totals[0]) }, Some(ids[0]));
        assert_eq!(cached(&interner)[0], totals[0]);
        assert_eq!(frames_of(&interner, ids[0]), (frames.clone(), totals[0]));
    }

    /// Recursion: each level's stack is the previous one plus a frame. Stored whole, that is
    /// depth²/2 frames; as a trie, one node per level.
    #[test]
    fn deep_recursion_costs_memory_linear_in_depth() {
        let mut interner = Interner::new();
        let depth: usize = 3000;
        let mut stack: Vec<RawFrame> = Vec::new();
        for level in 0..depth {
            stack.insert(0, f(0, 10 + 2 * (level % 3) as i32));
            unsafe { interner.intern(&stack, stack.len() as u16) }.unwrap();
        }
        assert_eq!(interner.len(), depth + 1);
        assert_eq!(interner.node_count(), depth + 1);
        // 16-byte nodes and 24-byte stacks plus tables: far below the ~72 MB of whole copies.
        assert!(
            interner.memory_usage() < 1 << 20,
            "{}",
            interner.memory_usage()
        );
        let top = unsafe { interner.intern(&stack, depth as u16) }.unwrap();
        assert_eq!(frames_of(&interner, top), (stack, depth as u16));
    }

    #[test]
    fn chunked_storage_indexes_across_chunks() {
        let mut chunked: Chunked<u32> = Chunked::new();
        let n = 3 * CHUNK + 5;
        chunked.try_reserve(n).unwrap();
        for i in 0..n {
            assert_eq!(chunked.push(i as u32 * 7), i as u32);
        }
        for i in [0, CHUNK - 1, CHUNK, 2 * CHUNK + 1, n - 1] {
            assert_eq!(*chunked.get(i as u32), i as u32 * 7);
        }
        assert_eq!(chunked.memory_usage() / CHUNK / 4, 4);
    }

    #[test]
    fn a_stack_takes_24_bytes() {
        assert_eq!(std::mem::size_of::<Stack>(), 24);
    }

    #[test]
    fn runs_map_each_line_to_its_first_offset() {
        type Runs = &'static [(i32, i32)];
        // (runs as (start, line), the same runs as (start, canonical offset))
        let cases: &[(Runs, Runs)] = &[
            (&[], &[]),
            (&[(0, 5)], &[(0, 0)]),
            // A line split by another: its second run takes the first run's start.
            (
                &[(0, 5), (4, 6), (10, 5), (14, 7)],
                &[(0, 0), (4, 4), (10, 0), (14, 14)],
            ),
            // Neighbours with one line (or one canonical offset) merge.
            (&[(0, 5), (2, 5), (6, 6), (8, 5)], &[(0, 0), (6, 6), (8, 0)]),
            // No line (-1): those runs share one canonical offset too, past-the-end included.
            (
                &[(0, 3), (6, -1), (8, 4), (12, -1)],
                &[(0, 0), (6, 6), (8, 8), (12, 6)],
            ),
            // Lines need not ascend.
            (
                &[(0, 9), (4, 2), (8, 9), (12, 2)],
                &[(0, 0), (4, 4), (8, 0), (12, 4)],
            ),
        ];
        for &(runs, expected) in cases {
            let mut runs = runs.to_vec();
            canonical_runs(&mut runs, &mut Vec::new()).unwrap();
            assert_eq!(runs, expected);
        }
    }

    #[test]
    fn offsets_take_the_canonical_offset_of_their_run() {
        let runs = [(0, 0), (4, 4), (10, 0), (14, 14)];
        // (offset, canonical offset)
        let cases = [
            (-2, -2),
            (0, 0),
            (2, 0),
            (4, 4),
            (8, 4),
            (10, 0),
            (12, 0),
            (14, 14),
            (90, 14),
        ];
        for (offset, expected) in cases {
            assert_eq!(canonical_offset(&runs, offset), expected, "offset {offset}");
        }
        assert_eq!(canonical_offset(&[], 6), 6);
    }

    /// Stands in for a code object's line table: offsets 0-5 and 10-13 on one line, 6-9 on
    /// another, 14 on a third.
    unsafe fn fake_runs(_code: usize, out: &mut Vec<(i32, i32)>) -> Option<()> {
        out.clear();
        out.extend_from_slice(&[(0, 20), (6, 21), (10, 20), (14, 22)]);
        Some(())
    }

    /// Something `Py_INCREF` may count on: a reference count of 1, leaked.
    fn fake_code() -> usize {
        Box::leak(Box::new([1usize, 0, 0, 0])) as *mut _ as usize
    }

    #[test]
    fn stacks_equal_line_for_line_share_a_traceback() {
        let mut interner = Interner::new();
        interner.read_runs = fake_runs;
        let (a, b) = (fake_code(), fake_code());
        // (stack, total depth, which traceback: equal numbers, equal ids)
        let cases: &[(&[RawFrame], u16, u32)] = &[
            (&[f(a, 2), f(b, 6)], 2, 0),
            (&[f(a, 12), f(b, 8)], 2, 0), // both frames on the same lines as the first
            (&[f(a, 4), f(b, 0)], 2, 1),  // the outer frame on another line
            (&[f(a, 8), f(b, 6)], 2, 2),
            (&[f(a, 12)], 1, 3),
            (&[f(a, 0)], 1, 3),
            (&[f(a, 12)], 2, 4), // other depth
            (&[f(b, 40), f(b, 14), f(a, 2)], 5, 5),
            (&[f(b, 14), f(b, 15), f(a, 13)], 5, 5),
            (&[f(a, -2)], 1, 6), // a generator not yet started keeps its offset
        ];
        let ids: Vec<_> = cases
            .iter()
            .map(|(frames, total, _)| unsafe { interner.intern(frames, *total) }.unwrap())
            .collect();
        for (i, (frames, total, group)) in cases.iter().enumerate() {
            for (j, (_, _, other)) in cases.iter().enumerate() {
                assert_eq!(ids[i] == ids[j], group == other, "cases {i} and {j}");
            }
            // Found again raw, past the flat copies, and stored by canonical offsets.
            assert_eq!(
                unsafe { interner.lookup_or_insert(frames, *total) },
                Some(ids[i])
            );
            let canonical: Vec<_> = frames
                .iter()
                .map(|frame| {
                    f(
                        frame.code,
                        canonical_offset(&[(0, 0), (6, 6), (10, 0), (14, 14)], frame.offset),
                    )
                })
                .collect();
            assert_eq!(frames_of(&interner, ids[i]), (canonical, *total));
        }
        assert_eq!(interner.len(), 8);
        assert_eq!(interner.same_line.len(), 2);
        // Releasing the pins forgets the runs read under those addresses.
        assert_eq!(interner.take_pins().len(), 2);
        assert_eq!((interner.same_line.len(), interner.same_line_runs), (0, 0));
    }

    /// Tracebacks nothing refers to are freed with the nodes only they used; what is left
    /// still reads as before, a code object no node names is unpinned, and the ids and nodes
    /// are reused by the next stacks stored.
    #[test]
    fn idle_tracebacks_are_freed_and_their_ids_and_nodes_reused() {
        let mut interner = Interner::new();
        interner.read_runs = fake_runs;
        let (a, b, c) = (fake_code(), fake_code(), fake_code());
        // Innermost frame first.
        let stacks: Vec<(Vec<RawFrame>, u16)> = vec![
            (vec![f(b, 6), f(a, 0)], 2),           // 0
            (vec![f(c, 14), f(b, 6), f(a, 0)], 3), // 1: under 0
            (vec![f(c, 0), f(a, 0)], 2),           // 2: shares a
            (vec![f(b, 6), f(a, 0)], 4),           // 3: 0's frames at another depth
        ];
        let ids: Vec<TracebackId> = stacks
            .iter()
            .map(|(frames, total)| unsafe { interner.intern(frames, *total) }.unwrap())
            .collect();
        assert_eq!(interner.node_count(), 1 + 4);
        let nodes = interner.node_count();
        let idle = |set: Vec<TracebackId>| move |id: TracebackId| set.contains(&id);

        // 1 and 2 go: c's nodes go with them, and c is no longer pinned.
        let out = interner.collect(usize::MAX, usize::MAX, idle(vec![ids[1], ids[2]]), || true);
        assert!(out.done);
        assert_eq!(out.freed_stacks, 2);
        assert_eq!(out.unpinned, vec![c]);
        assert_eq!(interner.node_count(), nodes - 2);
        assert_eq!(interner.live_stacks(), 1 + 2);
        for i in [0, 3] {
            assert_eq!(frames_of(&interner, ids[i]), stacks[i].clone());
            assert_eq!(
                unsafe { interner.intern(&stacks[i].0, stacks[i].1) },
                Some(ids[i])
            );
        }
        // 3 goes: 0 still holds every node, so none is freed.
        let out = interner.collect(usize::MAX, usize::MAX, idle(vec![ids[3]]), || true);
        assert_eq!((out.freed_stacks, out.unpinned.len()), (1, 0));
        assert_eq!(interner.node_count(), nodes - 2);

        // New stacks take the freed ids and nodes before the storage grows.
        let len = interner.len();
        let again = unsafe { interner.intern(&stacks[1].0, 3) }.unwrap();
        let other = unsafe { interner.intern(&[f(c, 8), f(a, 0)], 2) }.unwrap();
        assert_eq!(interner.len(), len);
        assert!([ids[1], ids[2], ids[3]].contains(&again));
        assert!([ids[1], ids[2], ids[3]].contains(&other) && other != again);
        assert_eq!(frames_of(&interner, again), stacks[1].clone());
        assert_eq!(frames_of(&interner, other), (vec![f(c, 6), f(a, 0)], 2));

        // Nothing is freed while a hook may put an id back, nor the unknown traceback ever.
        let live = interner.live_stacks();
        let out = interner.collect(usize::MAX, usize::MAX, |_| true, || false);
        assert_eq!((out.freed_stacks, out.done, out.blocked), (0, false, true));
        let out = interner.collect(usize::MAX, usize::MAX, |_| true, || true);
        assert_eq!(out.freed_stacks, live - 1);
        assert_eq!(interner.node_count(), 1);
        let mut unpinned = out.unpinned;
        unpinned.sort_unstable();
        let mut expected = vec![a, b, c];
        expected.sort_unstable();
        assert_eq!(unpinned, expected);
        assert!(interner.pins.is_empty() && interner.same_line.is_empty());
        assert_eq!(
            frames_of(&interner, UNKNOWN_TRACEBACK),
            (vec![RawFrame::UNKNOWN], 1)
        );
    }

    /// A collection looks at most at its budget of ids per call, resuming where it stopped.
    #[test]
    fn collection_goes_by_slices() {
        let mut interner = Interner::new();
        let ids: Vec<TracebackId> = (0..10)
            .map(|i| unsafe { interner.intern(&[f(0, 2 + 2 * i)], 1) }.unwrap())
            .collect();
        let mut freed = 0;
        let mut calls = 0;
        loop {
            let out = interner.collect(3, usize::MAX, |id| ids.contains(&id), || true);
            freed += out.freed_stacks;
            calls += 1;
            if out.done {
                break;
            }
        }
        assert_eq!((freed, calls), (10, 4));
        assert_eq!(interner.live_stacks(), 1);
    }

    /// A collection frees at most its budget of stacks per call, even where it may look at
    /// more (the sweep's pause is in what it frees), and the next call goes on from there.
    #[test]
    fn collection_frees_at_most_its_budget() {
        let mut interner = Interner::new();
        let ids: Vec<TracebackId> = (0..10)
            .map(|i| unsafe { interner.intern(&[f(0, 2 + 2 * i)], 1) }.unwrap())
            .collect();
        // Every other one is idle: 5 to free, 4 at most per call.
        let idle = |id: TracebackId| ids.iter().step_by(2).any(|&i| i == id);
        let first = interner.collect(usize::MAX, 4, idle, || true);
        assert_eq!((first.freed_stacks, first.done), (4, false));
        assert!(first.looked < ids.len());
        let second = interner.collect(usize::MAX, 4, idle, || true);
        assert_eq!((second.freed_stacks, second.done), (1, true));
        assert_eq!(interner.live_stacks(), 1 + 5);
    }
}
