//! CPython 3.9 and 3.10: the depth of the stack below the captured frames, remembered per
//! frame object instead of walked on every allocation.
//!
//! `tracemalloc` reports each trace's full depth (`total_nframe`), so after the captured
//! frames the walk went on to the bottom of the stack: a load, an add and a branch per frame,
//! on every allocation. At one frame that tail was most of the capture's cost in a program 20
//! frames deep (the quick suite at one frame with the tail not counted at all, unsound and
//! for the measurement only, two runs each: 1.36x, 1.40x -> 1.32x, 1.32x on 3.10).
//!
//! A frame's depth can be remembered only as long as the frames under it stay the same. On
//! these versions a frame is a `PyFrameObject` that holds a strong reference to the frame
//! below (`f_back`), and CPython sets that link once, when it creates the frame, except for
//! generator and coroutine frames, whose link is set at each resumption and cleared at each
//! suspension. So, for a frame that is not a generator's, the frames below it down to the
//! first generator frame (or to the bottom) are fixed for as long as the frame object lives:
//! that count, and the generator frame where it stops, are what an entry keeps. The entry is
//! keyed by the frame's address, and a frame object is created at an address only through
//! `_Py_NewReference`, which alloctrace receives while it traces (the free-list patch, see
//! `crate::freelist`): every creation of a frame drops the entry at its address ([`created`]),
//! so an entry never outlives its frame. Entries are used only while that patch is in place
//! ([`activate`]), and forgotten when it is put in again, since frames were created unseen in
//! between. An entry also keeps the frame's link as it was and is used only while the link is
//! unchanged, in case code outside CPython re-links a frame.
//!
//! A lookup from the first frame below the captured ones then reads one entry, and walks the
//! frames below the generator frame where the entry stops, if any. A frame without an entry
//! (a call just made) is counted by walking down to a frame with an entry, noting each frame
//! passed on the way.
//!
//! 3.11 and later keep frames in the interpreter's own stack memory, pushed and popped without
//! any call alloctrace sees, so nothing tells an entry's frame from a later one at the same
//! address. Keeping the frames below as a list and checking it link by link instead of
//! walking (the same reads, but independent of one another) was tried there and was slower
//! than the walk it replaced: the walk costs its instructions more than its loads' latency
//! (quick suite at one frame, two runs each: 1.40x, 1.42x walking; 1.46x, 1.45x checking).
//! 3.12 and later count their frames themselves ([`super::depth`]).
//!
//! The entries are read and written by threads holding the GIL (every interpreter shares it on
//! these versions), so the statics are relaxed atomics for `Sync` only.

use std::ffi::c_void;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};

use pyo3::ffi;

use super::read_ptr;

/// Where a frame object keeps its link to the frame below and its code object, and where a
/// code object keeps its flags (a parameter so that the tests can build frames of their own).
#[derive(Clone, Copy)]
pub struct Layout {
    pub back: usize,
    pub code: usize,
    pub flags: usize,
}

/// CPython's own layout.
pub const FRAME_OBJECTS: Layout = Layout {
    back: super::layout::FRAME_BACK,
    code: super::layout::FRAME_CODE,
    flags: super::layout::CODE_FLAGS,
};

/// Code flags of the frames whose link to the frame below changes while they live.
const RELINKED: i32 = ffi::CO_GENERATOR | ffi::CO_COROUTINE | ffi::CO_ASYNC_GENERATOR;

/// Entries, direct-mapped by frame address (a power of two).
const SLOTS: usize = 256;

/// Frames a lookup notes at most on one walk; frames past them are counted, not noted.
const NOTED_AT_MOST: usize = 64;

/// What is remembered of one frame: the frames from it down to the first generator frame
/// (included) or to the bottom, and that generator frame (0 at the bottom).
struct Entry {
    frame: AtomicUsize,
    back: AtomicUsize,
    count: AtomicUsize,
    stop: AtomicUsize,
}

static ENTRIES: [Entry; SLOTS] = [const {
    Entry {
        frame: AtomicUsize::new(0),
        back: AtomicUsize::new(0),
        count: AtomicUsize::new(0),
        stop: AtomicUsize::new(0),
    }
}; SLOTS];

/// Whether every frame creation is being seen, so that entries may be used.
static ACTIVE: AtomicBool = AtomicBool::new(false);

#[inline(always)]
fn entry_of(frame: usize) -> &'static Entry {
    let hash = (frame as u64 >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56;
    &ENTRIES[hash as usize & (SLOTS - 1)]
}

/// Frame creations are seen from now on: entries may be made and used. Forgets every entry,
/// since frames may have been created unseen before.
pub fn activate() {
    for entry in &ENTRIES {
        entry.frame.store(0, Relaxed);
    }
    ACTIVE.store(true, Relaxed);
}

/// Frame creations are no longer seen: every lookup walks until [`activate`].
pub fn deactivate() {
    ACTIVE.store(false, Relaxed);
}

/// A frame object is being created at `frame`: an entry for a frame that lived there is gone.
#[inline(always)]
pub fn created(frame: usize) {
    let entry = entry_of(frame);
    if entry.frame.load(Relaxed) == frame {
        entry.frame.store(0, Relaxed);
    }
}

/// The entry of `frame`, if it has one: (count, stop).
///
/// # Safety
/// `frame` is a live frame.
#[inline(always)]
unsafe fn lookup(frame: *mut c_void, layout: Layout) -> Option<(usize, *mut c_void)> {
    let entry = entry_of(frame as usize);
    if entry.frame.load(Relaxed) != frame as usize
        || entry.back.load(Relaxed) != read_ptr(frame, layout.back) as usize
    {
        return None;
    }
    Some((
        entry.count.load(Relaxed),
        entry.stop.load(Relaxed) as *mut c_void,
    ))
}

/// The number of frames from `frame` (included) to the bottom of the stack.
///
/// # Safety
/// `frame` is a live frame object of the calling thread's stack, and the thread holds the GIL.
#[inline(always)]
pub unsafe fn depth(frame: *mut c_void, layout: Layout) -> usize {
    if !ACTIVE.load(Relaxed) {
        return walk(frame, layout);
    }
    match lookup(frame, layout) {
        Some((count, stop)) if stop.is_null() => count,
        Some((count, stop)) => count + walk(read_ptr(stop, layout.back), layout),
        None => note(frame, layout),
    }
}

#[inline(always)]
fn put(frame: usize, back: usize, count: usize, stop: usize) {
    let entry = entry_of(frame);
    entry.frame.store(frame, Relaxed);
    entry.back.store(back, Relaxed);
    entry.count.store(count, Relaxed);
    entry.stop.store(stop, Relaxed);
}

/// Counts to the bottom frame by frame: below a generator frame, whose link is not fixed.
#[inline(always)]
unsafe fn walk(mut frame: *mut c_void, layout: Layout) -> usize {
    let mut count = 0;
    while !frame.is_null() {
        count += 1;
        frame = read_ptr(frame, layout.back);
    }
    count
}

/// [`depth`] for a frame without an entry (a call just made, or a generator frame): counts
/// down to a frame with an entry, the first generator frame or the bottom, and notes an entry
/// for each frame passed, then counts the rest as its entry or a walk says.
///
/// Below a generator frame the frames are walked one by one, as they were before entries. A
/// first version went on from entry to entry there, reading each generator frame's code flags
/// (and clearing a list of 64 frames at each miss): in a stack of coroutines awaiting one
/// another, every frame a generator's, pyperformance's coroutines benchmark went from 1.70x
/// to 2.69x (3.10, one frame, quick suite).
///
/// # Safety
/// As [`depth`].
#[inline(never)]
unsafe fn note(frame: *mut c_void, layout: Layout) -> usize {
    let mut passed = [MaybeUninit::<usize>::uninit(); NOTED_AT_MOST];
    let mut n = 0;
    let mut at = frame;
    let (below, stop) = loop {
        if at.is_null() {
            break (0, std::ptr::null_mut());
        }
        if n > 0 {
            if let Some(found) = lookup(at, layout) {
                break found;
            }
        }
        let code = read_ptr(at, layout.code);
        if *(code.cast::<u8>().add(layout.flags) as *const i32) & RELINKED != 0 {
            if n == 0 {
                // The lookup began at a generator frame: its entry says so, and saves reading
                // its flags the next time (its link is read afresh at each lookup).
                put(
                    at as usize,
                    read_ptr(at, layout.back) as usize,
                    1,
                    at as usize,
                );
            }
            break (1, at);
        }
        if n < NOTED_AT_MOST {
            passed[n].write(at as usize);
        }
        n += 1;
        at = read_ptr(at, layout.back);
    };
    for (i, passed) in passed[..n.min(NOTED_AT_MOST)].iter().enumerate().rev() {
        let passed = passed.assume_init();
        let back = read_ptr(passed as *mut c_void, layout.back) as usize;
        put(passed, back, n - i + below, stop as usize);
    }
    if stop.is_null() {
        n + below
    } else {
        n + below + walk(read_ptr(stop, layout.back), layout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fake frames: `[back, code]`, the code being a word of flags.
    const LAYOUT: Layout = Layout {
        back: 0,
        code: 8,
        flags: 0,
    };

    fn code(flags: i32) -> usize {
        Box::into_raw(Box::new(flags)) as usize
    }

    fn frame(back: usize, code: usize) -> usize {
        Box::into_raw(Box::new([back, code])) as usize
    }

    fn relink(frame: usize, back: usize) {
        // SAFETY: a fake frame made by `frame`, never freed.
        unsafe { (*(frame as *mut [usize; 2]))[0] = back };
    }

    /// `n` new frames of `code` over `base` (0: none), top first.
    fn stack(n: usize, base: usize, code: usize) -> Vec<usize> {
        let mut frames = vec![];
        let mut back = base;
        for _ in 0..n {
            back = frame(back, code);
            frames.insert(0, back);
        }
        frames
    }

    fn depth_of(top: usize) -> usize {
        // SAFETY: fake frames, all readable; the statics are touched by this test only.
        unsafe { depth(top as *mut c_void, LAYOUT) }
    }

    fn walked(mut at: usize) -> usize {
        let mut n = 0;
        while at != 0 {
            n += 1;
            // SAFETY: as above.
            at = unsafe { *(at as *const usize) };
        }
        n
    }

    /// The one test that touches the statics. Each step changes the stacks as CPython could
    /// (creating frames at addresses that held others, resuming a generator from elsewhere)
    /// and checks the depth against a walk.
    #[test]
    fn entries_follow_frames_and_generators() {
        let plain = code(0);
        let generator = code(ffi::CO_GENERATOR);
        let coroutine = code(ffi::CO_COROUTINE);
        activate();

        let main = stack(5, 0, plain);
        let bottom = *main.last().unwrap();
        let caller = main[0];
        let call = frame(caller, plain);
        let steps = [
            ("first walk, noted", caller),
            ("from its entry", caller),
            ("lower in the stack, noted on the way", main[2]),
            ("a new frame over noted ones", call),
        ];
        for (what, top) in steps {
            assert_eq!(depth_of(top), walked(top), "{what}");
        }

        // A generator frame in the stack: the entries above it stop there, and its link is
        // read at each lookup.
        let home = stack(3, bottom, plain);
        let gen = frame(home[0], generator);
        let inside = stack(4, gen, plain);
        assert_eq!(depth_of(inside[0]), 4 + 1 + 3 + 1);
        assert_eq!(depth_of(inside[0]), 4 + 1 + 3 + 1, "from the entries");
        // Resumed from elsewhere (deeper): the same frames above it, a new depth.
        let elsewhere = stack(7, bottom, plain);
        relink(gen, elsewhere[0]);
        assert_eq!(
            depth_of(inside[0]),
            4 + 1 + 7 + 1,
            "generator resumed elsewhere"
        );
        // A lookup that begins at the generator frame itself.
        assert_eq!(depth_of(gen), 1 + 7 + 1, "from a generator frame");
        assert_eq!(depth_of(gen), 1 + 7 + 1, "from its entry");
        relink(gen, home[0]);
        assert_eq!(depth_of(gen), 1 + 3 + 1, "resumed elsewhere again");
        // Suspended while a frame above it is still referenced (a greenlet's stack).
        relink(gen, 0);
        assert_eq!(depth_of(inside[0]), 4 + 1, "generator suspended");
        let nested = frame(gen, coroutine);
        relink(gen, main[1]);
        assert_eq!(
            depth_of(nested),
            walked(nested),
            "a coroutine over the generator"
        );

        // Frames created where others had entries, over the same addresses: only the
        // creations tell the new frames from the old.
        let pair = stack(2, bottom, plain);
        assert_eq!(depth_of(pair[0]), 3);
        let deeper = stack(6, bottom, plain);
        created(pair[1]);
        relink(pair[1], deeper[0]);
        created(pair[0]);
        assert_eq!(depth_of(pair[0]), 2 + 7, "re-created over a deeper caller");
        let short = pair[0];

        // A frame re-linked without being created (not CPython, but possible outside it).
        relink(short, bottom);
        assert_eq!(depth_of(short), 2, "re-linked");

        // Deeper than the frames noted on one walk.
        let deep = stack(NOTED_AT_MOST + 30, 0, plain);
        assert_eq!(depth_of(deep[0]), NOTED_AT_MOST + 30);
        assert_eq!(depth_of(deep[0]), NOTED_AT_MOST + 30, "from its entry");
        assert_eq!(
            depth_of(deep[NOTED_AT_MOST + 5]),
            25,
            "below the noted ones"
        );

        // Inactive: entries unused, and forgotten when active again (frames below a noted one
        // changed unseen; the noted frame's own link did not).
        assert_eq!(depth_of(caller), 5, "noted again");
        deactivate();
        relink(main[1], 0);
        assert_eq!(depth_of(caller), 2, "walked while inactive");
        activate();
        assert_eq!(depth_of(caller), 2, "entries forgotten");
        relink(main[1], main[2]);
        created(caller);
        assert_eq!(depth_of(caller), 5);
    }
}
