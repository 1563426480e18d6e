//! Blocks allocated by a thread that released the GIL (compression, `sqlite3`, any C code
//! between `Py_BEGIN_ALLOW_THREADS` and `Py_END_ALLOW_THREADS`): charged to that thread's
//! Python stack as it stood when it let the GIL go, as `tracemalloc` charges them.
//!
//! The interner is the GIL's (see [`crate::hooks::tracer`]), and taking the GIL in a hook is what
//! deadlocked the standard module, so such a thread cannot intern its stack. Nor may it pin
//! the code objects its frames name: a pin is a reference count, which only a GIL holder may
//! change. What it can do safely is read: its own thread state (the one
//! `PyGILState_GetThisThreadState` answers), its own frames (only the thread itself links or
//! unlinks them, and it is inside this hook), and the code objects they hold, which stay alive
//! at least as long as those frames do. So it resolves each frame there and then, into what a
//! snapshot shows (filename, line, function; [`crate::capture::locate_released`]), which no
//! longer depends on the code object, and records the block in the table with the
//! `<unknown>` traceback as a placeholder, noting it here with its stack. The next time a
//! thread holding the GIL reads the traces ([`crate::hooks::tracer`]'s settle, before every
//! snapshot), the stacks are interned, as the frames of buried code objects are (a tag and a
//! line), and the waiting blocks moved to them. A stack interned once is known by its
//! resolved frames from then on, and later blocks of the same stack go straight to its
//! traceback. The whole reasoning, per CPython version, is in docs/design.md.
//!
//! One lock guards all of this; only threads without the GIL take it in a hook, and a GIL
//! holder only outside hooks (settling) and on freeing a block that is still waiting, so it
//! is never held while waiting for the GIL. Lock order: this lock, then a table shard.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};

use parking_lot::{Mutex, MutexGuard};

use crate::capture::{self, Current, Interpreter, LocatedFrame, RawFrame};
use crate::hooks::intern::UNKNOWN_TRACEBACK;
use crate::hooks::table::TracebackId;

/// A stack resolved without the GIL: its frames, most recent first, and its full depth.
pub type LocatedStack = (Box<[LocatedFrame]>, u16);

/// What became of a located stack once a GIL holder interned it: its traceback, and whether
/// the trace-time filters keep it in domain 0 and in the native domain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Interned {
    pub id: TracebackId,
    pub keep: bool,
    pub keep_native: bool,
}

impl Interned {
    /// The traceback a block of this domain goes under, or `None` where the trace-time
    /// filters drop it.
    fn kept(&self, native: bool) -> Option<TracebackId> {
        let keep = if native { self.keep_native } else { self.keep };
        keep.then_some(self.id)
    }
}

#[derive(Default)]
pub struct Pending {
    /// The walk's scratch, `nframe` long.
    scratch: Vec<RawFrame>,
    /// Every distinct located stack met, with its index in `stacks`.
    index: HashMap<LocatedStack, u32>,
    stacks: Vec<LocatedStack>,
    /// Per stack, what a GIL holder made of it (`None`: not interned yet).
    interned: Vec<Option<Interned>>,
    /// Blocks in the table with the placeholder traceback, by table key: their stack, and
    /// whether they are native-domain blocks (for the filters' verdict).
    waiting: HashMap<usize, (u32, bool)>,
    /// Allocations counted under the placeholder (while a pusher counts them, see
    /// [`crate::hooks::peak::Counter`]) of waiting blocks freed before their stack was interned:
    /// per stack and nativeness, `(bytes, blocks in count units)`, moved to the stack's
    /// traceback when it is.
    gone: HashMap<(u32, bool), (u64, u64)>,
}

static PENDING: Mutex<Option<Pending>> = parking_lot::const_mutex(None);
/// How many blocks are waiting: frees of blocks with the placeholder traceback take the lock
/// only when some are.
static WAITING: AtomicUsize = AtomicUsize::new(0);
/// `Pending::gone`'s length.
static GONE: AtomicUsize = AtomicUsize::new(0);
/// The traceback limit, for threads that cannot read the GIL-protected one.
static NFRAME: AtomicUsize = AtomicUsize::new(1);
/// Whether the main interpreter is the one whose threads' stacks are read; off until
/// `start()` and after `stop()`.
static ENABLED: AtomicBool = AtomicBool::new(false);

/// Takes the lock without parking (see [`crate::platform::nopark`]: it is held across `fork()`).
fn lock() -> MutexGuard<'static, Option<Pending>> {
    crate::platform::nopark::acquire(|| PENDING.try_lock())
}

/// Forgets every stack and waiting block, and sets the traceback limit: at `start()`,
/// `clear_traces()` and `stop()` (with `enabled` false), when the interner is replaced.
pub fn reset(nframe: usize, enabled: bool) {
    let mut pending = lock();
    *pending = None;
    WAITING.store(0, Relaxed);
    GONE.store(0, Relaxed);
    NFRAME.store(nframe.max(1), Relaxed);
    ENABLED.store(enabled, Relaxed);
}

/// The trace-time filters changed: every stack is judged again when next settled, and until
/// then its blocks wait.
pub fn forget_verdicts() {
    if let Some(pending) = lock().as_mut() {
        pending.interned.fill(None);
    }
}

/// What a thread without the GIL did with a block.
pub enum Charge {
    /// Recorded: with its stack's traceback if a GIL holder interned that stack before,
    /// else with the placeholder, waiting.
    Recorded,
    /// The trace-time filters reject its stack: not recorded.
    Rejected,
    /// No Python frame to charge (no thread state, another interpreter's, no frames): for
    /// the caller to record with the `<unknown>` traceback, as `tracemalloc` does.
    Unknown,
    /// No memory to resolve or keep the stack, or to record the block.
    OutOfMemory,
}

/// Charges a block of this thread, which holds no GIL, to its stack. `record(traceback)`
/// stores the block in the table under `key` (`false` if out of memory). It is called under
/// this module's lock, so that a settle sees a waiting block and its note together, and so
/// that no traceback of an interner that `clear_traces()` replaced meanwhile is recorded
/// ([`reset`] takes the lock before the table is emptied).
///
/// # Safety
/// Called from a hook, inside the tracer's reentrancy guard, by a thread that holds no GIL;
/// `main` is the main interpreter.
#[cold]
#[inline(never)]
pub unsafe fn charge(
    key: usize,
    native: bool,
    main: *mut std::ffi::c_void,
    record: impl FnOnce(TracebackId) -> bool,
) -> Charge {
    if !ENABLED.load(Relaxed) {
        return Charge::Unknown;
    }
    let tstate = capture::this_thread_state();
    // A finalizing interpreter frees the states of its daemon threads from another thread.
    if tstate.is_null() || capture::interpreter_of(tstate) != main || capture::finalizing() {
        return Charge::Unknown;
    }
    let mut guard = lock();
    // Checked again under the lock: `stop()` turns it off there before emptying the table.
    if !ENABLED.load(Relaxed) {
        return Charge::Unknown;
    }
    let pending = guard.get_or_insert_with(Pending::default);
    let nframe = NFRAME.load(Relaxed);
    if pending.scratch.len() != nframe {
        pending.scratch.clear();
        if pending.scratch.try_reserve_exact(nframe).is_err() {
            return Charge::OutOfMemory;
        }
        pending.scratch.resize(nframe, RawFrame::UNKNOWN);
    }
    // SAFETY: this thread's own state, and it holds no GIL (the caller's contract).
    let (n, total) = Current::walk_released(tstate, &mut pending.scratch);
    if n == 0 {
        return Charge::Unknown;
    }
    let Some(stack) = locate(&pending.scratch[..n], total) else {
        return Charge::OutOfMemory;
    };
    let index = match pending.index.get(&stack) {
        Some(&index) => index,
        None => {
            if pending.index.try_reserve(1).is_err()
                || pending.stacks.try_reserve(1).is_err()
                || pending.interned.try_reserve(1).is_err()
            {
                return Charge::OutOfMemory;
            }
            let index = pending.stacks.len() as u32;
            pending.stacks.push(stack.clone());
            pending.interned.push(None);
            pending.index.insert(stack, index);
            index
        }
    };
    match pending.interned[index as usize] {
        Some(interned) if interned.kept(native).is_some() => {
            if record(interned.id) {
                Charge::Recorded
            } else {
                Charge::OutOfMemory
            }
        }
        Some(_) => Charge::Rejected,
        None => {
            if pending.waiting.try_reserve(1).is_err() || !record(UNKNOWN_TRACEBACK) {
                return Charge::OutOfMemory;
            }
            if pending.waiting.insert(key, (index, native)).is_none() {
                WAITING.fetch_add(1, Relaxed);
            }
            Charge::Recorded
        }
    }
}

/// Resolves walked frames (see [`capture::locate_released`]).
///
/// # Safety
/// As [`charge`]: the frames are this thread's, walked just now.
unsafe fn locate(frames: &[RawFrame], total: u16) -> Option<LocatedStack> {
    let mut located = Vec::new();
    located.try_reserve_exact(frames.len()).ok()?;
    for &frame in frames {
        located.push(capture::locate_released(frame)?);
    }
    Some((located.into_boxed_slice(), total))
}

/// A block with the placeholder traceback is being freed (its trace was just taken out of
/// the table): it no longer waits. `allocated`: the `(bytes, blocks in count units)` its
/// allocation was counted with under the placeholder, if counted, which its stack's
/// traceback takes over once interned.
#[inline]
pub fn forget(key: usize, allocated: Option<(u64, u64)>) {
    if WAITING.load(Relaxed) == 0 {
        return;
    }
    if let Some(pending) = lock().as_mut() {
        if let Some((index, native)) = pending.waiting.remove(&key) {
            WAITING.fetch_sub(1, Relaxed);
            if let Some((bytes, blocks)) = allocated {
                // Without memory it stays the placeholder's.
                if pending.gone.try_reserve(1).is_ok() {
                    let sum = pending.gone.entry((index, native)).or_insert((0, 0));
                    sum.0 = sum.0.wrapping_add(bytes);
                    sum.1 = sum.1.wrapping_add(blocks);
                    GONE.store(pending.gone.len(), Relaxed);
                }
            }
        }
    }
}

/// Whether any block, or any allocation of a freed one, waits for a GIL holder.
pub fn any_waiting() -> bool {
    WAITING.load(Relaxed) != 0 || GONE.load(Relaxed) != 0
}

/// The stacks that waiting blocks need and no GIL holder has interned yet, with their
/// indexes (copied: interning them calls Python, without this lock).
pub fn to_intern() -> Vec<(u32, LocatedStack)> {
    let guard = lock();
    let Some(pending) = guard.as_ref() else {
        return Vec::new();
    };
    let mut needed: Vec<u32> = pending
        .waiting
        .values()
        .map(|&(index, _)| index)
        .chain(pending.gone.keys().map(|&(index, _)| index))
        .filter(|&index| pending.interned[index as usize].is_none())
        .collect();
    needed.sort_unstable();
    needed.dedup();
    needed
        .into_iter()
        .map(|index| (index, pending.stacks[index as usize].clone()))
        .collect()
}

/// Records what the stacks `done` became, then hands every waiting block whose stack is
/// interned to `settle(key, traceback or None to forget it)`, under the lock (a block
/// cannot be freed, nor its address reused, meanwhile), and the counted allocations of
/// freed ones to `moved(native, (bytes, blocks), traceback or None)`.
pub fn finish(
    done: &[(u32, Interned)],
    mut settle: impl FnMut(usize, Option<TracebackId>),
    mut moved: impl FnMut(bool, (u64, u64), Option<TracebackId>),
) {
    let mut guard = lock();
    let Some(pending) = guard.as_mut() else {
        return;
    };
    for &(index, interned) in done {
        if let Some(slot) = pending.interned.get_mut(index as usize) {
            *slot = Some(interned);
        }
    }
    let interned = &pending.interned;
    pending.waiting.retain(|&key, &mut (index, native)| {
        let Some(found) = interned[index as usize] else {
            return true;
        };
        settle(key, found.kept(native));
        false
    });
    WAITING.store(pending.waiting.len(), Relaxed);
    pending.gone.retain(|&(index, native), &mut allocated| {
        let Some(found) = interned[index as usize] else {
            return true;
        };
        moved(native, allocated, found.kept(native));
        false
    });
    GONE.store(pending.gone.len(), Relaxed);
}

/// Runs `f` with a test of whether a traceback is one that threads without the GIL record
/// blocks with directly (a stack a GIL holder interned for them), holding this module's lock
/// throughout: the tracer's sweep frees no such traceback, and no thread can take one up or
/// be halfway through recording with one (that happens under the lock) while it decides.
/// Lock order as everywhere: this lock, then a table shard.
pub fn with_interned<R>(f: impl FnOnce(&dyn Fn(TracebackId) -> bool) -> R) -> R {
    let guard = lock();
    let ids: std::collections::HashSet<TracebackId> = guard
        .as_ref()
        .map(|pending| pending.interned.iter().flatten().map(|i| i.id).collect())
        .unwrap_or_default();
    let result = f(&|id| ids.contains(&id));
    drop(guard);
    result
}

/// Holds the lock across `fork()` (see the tracer's fork handlers): a thread without the
/// GIL holding it when another forks would leave it locked in the child for ever.
pub fn lock_for_fork() {
    std::mem::forget(lock());
}

/// # Safety
/// [`lock_for_fork`] was called by this thread, in this process or its parent.
pub unsafe fn unlock_after_fork() {
    PENDING.force_unlock();
}

/// Bytes kept here (the stacks and the waiting blocks), for the tracer's own memory figure.
pub fn memory_usage() -> usize {
    let guard = lock();
    let Some(pending) = guard.as_ref() else {
        return 0;
    };
    let frames: usize = pending
        .stacks
        .iter()
        .flat_map(|(frames, _)| frames.iter())
        .map(|frame| {
            std::mem::size_of::<LocatedFrame>()
                + frame.filename.len()
                + frame.function.as_ref().map_or(0, |(name, _)| name.len())
        })
        .sum();
    // Each stack is held twice (the index's key and `stacks`).
    2 * frames
        + pending.index.capacity() * std::mem::size_of::<(LocatedStack, u32)>()
        + pending.stacks.capacity() * std::mem::size_of::<LocatedStack>()
        + pending.interned.capacity() * std::mem::size_of::<Option<Interned>>()
        + pending.waiting.capacity() * std::mem::size_of::<(usize, (u32, bool))>()
        + pending.gone.capacity() * std::mem::size_of::<((u32, bool), (u64, u64))>()
        + pending.scratch.capacity() * std::mem::size_of::<RawFrame>()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(file: &str, line: u32) -> LocatedFrame {
        LocatedFrame {
            filename: file.as_bytes().into(),
            line,
            function: Some((b"f".as_slice().into(), 1)),
        }
    }

    /// Two stacks, three waiting blocks (one native, one freed before the settle): what is
    /// asked to be interned, what each block becomes, and what is left.
    #[test]
    fn waiting_blocks_settle_once_their_stack_is_interned() {
        reset(5, true);
        let a: LocatedStack = (vec![frame("a.py", 3)].into(), 1);
        let b: LocatedStack = (vec![frame("b.py", 7), frame("a.py", 9)].into(), 4);
        {
            let mut guard = lock();
            let pending = guard.get_or_insert_with(Pending::default);
            for (i, stack) in [&a, &b].into_iter().enumerate() {
                pending.index.insert(stack.clone(), i as u32);
                pending.stacks.push(stack.clone());
                pending.interned.push(None);
            }
            // (key, stack, native)
            for (key, stack, native) in [(0x1000, 0, false), (0x2001, 1, true), (0x3000, 1, false)]
            {
                pending.waiting.insert(key, (stack, native));
            }
            WAITING.store(3, Relaxed);
        }
        forget(0x3000, Some((300, 3)));
        assert!(any_waiting());
        let asked: Vec<u32> = to_intern().into_iter().map(|(i, _)| i).collect();
        assert_eq!(asked, vec![0, 1]);
        // Stack 1 is kept in domain 0 and rejected in the native domain; stack 0 is not
        // interned (no memory): its block waits.
        let done = [(
            1,
            Interned {
                id: 42,
                keep: true,
                keep_native: false,
            },
        )];
        let mut settled = Vec::new();
        let mut moved = Vec::new();
        finish(
            &done,
            |key, id| settled.push((key, id)),
            |native, allocated, id| moved.push((native, allocated, id)),
        );
        assert_eq!(settled, vec![(0x2001, None)]);
        // The freed block's counted allocation goes to its stack's traceback.
        assert_eq!(moved, vec![(false, (300, 3), Some(42))]);
        assert!(any_waiting());
        assert_eq!(
            to_intern().into_iter().map(|(i, _)| i).collect::<Vec<_>>(),
            vec![0]
        );
        forget_verdicts();
        reset(1, false);
        assert!(!any_waiting());
        assert!(to_intern().is_empty());
    }
}
