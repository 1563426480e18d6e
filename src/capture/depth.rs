//! A stack's full depth (`total_nframe`) without walking all of it, where CPython counts it.
//!
//! `tracemalloc` reports every trace's full depth, so the walk went on past the captured frames
//! to the bottom of the stack on every allocation: a dependent load per frame, most of the cost
//! of one frame on a program 20 frames deep (the quick suite at one frame, two runs each:
//! 1.40x, 1.42x walking to the bottom on 3.12, 1.36x, 1.34x with the counter below; 3.13
//! 1.39x, 1.39x and 1.34x, 1.34x).
//!
//! (3.9 and 3.10 remember depths per frame object instead, see `super::frame_depths`; 3.11
//! walks.) From 3.12 CPython keeps that depth itself: `py_recursion_limit -
//! py_recursion_remaining` is the number of Python frames this thread has entered and not left.
//! A frame is counted where it is linked into the chain (the interpreter's entry, an inlined
//! call) and uncounted where it is unlinked (return, yield, unwinding); shim frames are never
//! counted, and `tracemalloc` never counts them either. Within CPython the counter and the chain
//! disagree only about a frame linked but not yet started (the entry path raises its C-stack
//! `RecursionError` before counting the frame it just linked). Such a frame is incomplete, and
//! `tracemalloc` skips incomplete frames where the counter counts them, so the walker uses the
//! counter only when every frame it passed was complete or one in its prologue known to be
//! counted (`super::counted_in_prologue`), and takes those off the counter's figure
//! ([`super::walk_interpreter_frames`]). A generator's frame, though, is never incomplete to
//! `tracemalloc`, started or not: one resumed from C at the C recursion limit is linked, refused
//! and counted by `tracemalloc` in the allocations of its `RecursionError`, one frame more than
//! the counter says. CPython sets the thread's `recursion_headroom` while it makes that error
//! (and otherwise only while it normalizes an exception, which is rare), so while it is set the
//! counter is not read at all.
//!
//! 3.13's counter also counts, under each `__init__` called through a specialized class call
//! (`CALL_ALLOC_AND_ENTER_INIT`), the trampoline frame CPython pushes under it
//! (`super::is_trampoline`), which stays incomplete, so `tracemalloc` does not count it. Such
//! frames may be anywhere below the captured ones and nothing short of a walk says how many
//! there are, so on 3.13 the counter answers only on a home stack known to hold none. Every
//! trampoline is pushed right after its object is allocated, by the calling frame, whose
//! current instruction is then that specialized call: the walk of that allocation sees it
//! ([`Counter::calling_init`]) and notes the caller's depth. A trampoline is gone once the
//! counter is at or below its caller's depth, so the counter answers again once it has been
//! seen there (inside the `__init__` and whatever it calls, allocations are walked), and each
//! walk to the bottom on the home stack replaces what was noted by the trampolines it found
//! ([`TRAMPOLINE_FLOOR`]). An allocation that no walk sees would hide a trampoline: in sampled
//! mode 3.13 does not use the counter (nor in a build with the tier-2 optimizer, whose code may
//! not point the frame at the call), and [`forget_trampolines`] starts over whenever recording
//! starts. Without this, 3.13 walking to the bottom on every allocation cost the quick suite at
//! one frame 1.28x -> 1.36x; using the counter regardless gave `total_nframe` one too many for
//! every block allocated under such an `__init__`.
//!
//! Outside CPython, a stack switcher moves the chain and sets the counter its own way: a new
//! greenlet starts with an empty chain and its parent's count. Such a switcher also gives each
//! stack a data stack of its own (the chunks frames are allocated from), so the counter is
//! used only on the *home* stack: the thread state and root chunk where a full walk last
//! agreed with it. Any other stack is walked to the bottom, and becomes home when the walk
//! agrees (a thread taking the GIL, the main greenlet switched back to). On the home stack the
//! counter is still checked against a full walk every [`CHECK_EVERY`]-th use and wherever the
//! walk reached the bottom anyway; one disagreement there and every stack is walked to the
//! bottom for the rest of the process.
//!
//! All of it runs with the main interpreter's GIL held (only its threads' stacks are read), so
//! the statics below are atomics for `Sync` only, read and written relaxed.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::Relaxed};

use pyo3::ffi;

/// How often the counter is checked against a walk on its home stack, in uses: often enough to
/// notice a counter gone wrong within a few thousand allocations, rarely enough to cost nothing
/// measurable (the check is the walk the counter saves).
pub const CHECK_EVERY: u32 = 64;

/// Whether the counter may be used; cleared for good at a disagreement on the home stack.
static TRUSTED: AtomicBool = AtomicBool::new(true);

/// The home stack: a thread state and the root chunk of its data stack (0, 0: none yet).
static HOME_THREAD: AtomicUsize = AtomicUsize::new(0);
static HOME_ROOT: AtomicUsize = AtomicUsize::new(0);

/// Uses of the counter until the next check, and the interval it restarts from.
static COUNTDOWN: AtomicU32 = AtomicU32::new(CHECK_EVERY);
static INTERVAL: AtomicU32 = AtomicU32::new(CHECK_EVERY);

static CHECKED: AtomicU64 = AtomicU64::new(0);
static DISAGREED: AtomicU64 = AtomicU64::new(0);

/// 3.13: the depth of the lowest frame on the home stack that may have an `__init__`
/// trampoline above it (`usize::MAX`: none may; 0: unknown, as before any walk). The counter
/// answers only at or below it (see the module's documentation).
static TRAMPOLINE_FLOOR: AtomicUsize = AtomicUsize::new(0);

/// Forgets what is known of the home stack's `__init__` trampolines, until a walk to its bottom:
/// allocations may have been made that no walk saw (before tracing, while not recording).
pub fn forget_trampolines() {
    TRAMPOLINE_FLOOR.store(0, Relaxed);
}

/// 3.13: the home stack holds no trampoline any more, where `floor` was what was noted of them.
/// The store is skipped when nothing was noted, so that the common case writes nothing.
#[inline(always)]
fn trampolines_gone(floor: usize) {
    if floor != usize::MAX {
        TRAMPOLINE_FLOOR.store(usize::MAX, Relaxed);
    }
}

/// What CPython's counter says about the stack being walked.
#[derive(Clone, Copy)]
pub struct Counter {
    /// Python frames entered and not left; `usize::MAX` where there is no counter to read.
    entered: usize,
    thread: usize,
    root: usize,
}

impl Counter {
    pub const NONE: Counter = Counter {
        entered: usize::MAX,
        thread: 0,
        root: 0,
    };

    /// The counter of `tstate` (3.12+), unless a disagreement put it out of use (or, on 3.13,
    /// in sampled mode: see the module's documentation).
    ///
    /// # Safety
    /// `tstate` is the calling thread's state and it holds the main interpreter's GIL.
    #[cfg(Py_3_12)]
    #[inline(always)]
    pub unsafe fn read(tstate: *mut ffi::PyThreadState) -> Counter {
        use super::layout;
        #[cfg(Py_3_13)]
        if layout::TIER2 || crate::hooks::sampler::interval().is_some() {
            return Counter::NONE;
        }
        if !TRUSTED.load(Relaxed) {
            return Counter::NONE;
        }
        let base = tstate.cast::<u8>();
        let int = |offset: usize| i64::from(*(base.add(offset) as *const std::os::raw::c_int));
        // A `RecursionError` may be being made: the frame on top may be one that the entry
        // linked and refused (see the module's documentation).
        if int(layout::TSTATE_RECURSION_HEADROOM) != 0 {
            return Counter::NONE;
        }
        let entered =
            int(layout::TSTATE_PY_RECURSION_LIMIT) - int(layout::TSTATE_PY_RECURSION_REMAINING);
        // The root chunk: its `previous` (the chunk's first field) is null. The first chunk
        // (16 KiB) holds a few dozen frames, so this is a load or two.
        let mut root = super::read_ptr(base.cast(), layout::TSTATE_DATASTACK_CHUNK);
        while !root.is_null() {
            let previous = super::read_ptr(root, 0);
            if previous.is_null() {
                break;
            }
            root = previous;
        }
        Counter {
            // Negative only if something tore the two fields apart: then the walk decides.
            entered: usize::try_from(entered).unwrap_or(usize::MAX),
            thread: tstate as usize,
            root: root as usize,
        }
    }

    /// Before 3.12 the recursion counter also counts C-level recursion guards: never a depth.
    ///
    /// # Safety
    /// None; the signature is the 3.12+ one's.
    #[cfg(not(Py_3_12))]
    #[inline(always)]
    pub unsafe fn read(_tstate: *mut ffi::PyThreadState) -> Counter {
        Counter::NONE
    }

    /// The counter without `frames` that it counts and `tracemalloc` does not (frames in
    /// their prologue); no counter if it says fewer.
    #[inline(always)]
    pub fn less(self, frames: usize) -> Counter {
        Counter {
            entered: match self.entered {
                usize::MAX => usize::MAX,
                entered => entered.checked_sub(frames).unwrap_or(usize::MAX),
            },
            ..self
        }
    }

    fn is_home(&self) -> bool {
        self.entered != usize::MAX
            && HOME_THREAD.load(Relaxed) == self.thread
            && HOME_ROOT.load(Relaxed) == self.root
    }

    /// The stack's full depth, if the counter may answer for a stack whose first `captured`
    /// frames were all complete; `None` when the walk must go on to the bottom (and then
    /// [`Counter::walked`] be told what it found).
    #[inline(always)]
    pub fn depth(&self, captured: usize) -> Option<usize> {
        if !self.is_home() || self.entered < captured || !self.no_trampolines() {
            return None;
        }
        let left = COUNTDOWN.load(Relaxed);
        if left > 1 {
            COUNTDOWN.store(left - 1, Relaxed);
            return Some(self.entered);
        }
        COUNTDOWN.store(INTERVAL.load(Relaxed).max(1), Relaxed);
        None
    }

    /// 3.13: whether the home stack (this one, the caller checked) holds no `__init__`
    /// trampoline: none was noted, or the counter is at or below the lowest frame that may have
    /// one above it, which is then gone (and forgotten). Always true before 3.13.
    #[inline(always)]
    fn no_trampolines(&self) -> bool {
        if !cfg!(Py_3_13) {
            return true;
        }
        let floor = TRAMPOLINE_FLOOR.load(Relaxed);
        if self.entered > floor {
            return false;
        }
        trampolines_gone(floor);
        true
    }

    /// 3.13: the frame on top of this stack is calling a class through the specialized call
    /// that pushes an `__init__` trampoline once the object (this allocation) is made: on the
    /// home stack, the counter does not answer above this frame until it has been seen back at
    /// its depth. Called after everything else the walk of this allocation told the counter.
    #[cold]
    pub fn calling_init(&self) {
        if self.is_home() {
            TRAMPOLINE_FLOOR.fetch_min(self.entered, Relaxed);
        }
    }

    /// A walk of a stack whose captured frames were all complete found `walked` frames to the
    /// bottom as the counter counts them, for a check or because the counter could not answer;
    /// on 3.13, `floor` is the depth of the frame under the lowest `__init__` trampoline among
    /// them (`usize::MAX` if none). Cold: the counter answers most of the time.
    #[cold]
    pub fn walked(&self, walked: usize, floor: usize) {
        if self.entered != usize::MAX {
            self.compare(walked, floor, true);
        }
    }

    /// The captured frames, all complete, were the whole stack: a check for free, apart from
    /// [`Counter::walked`] because it is common (at 25 frames, most stacks) and agreeing at home
    /// needs nothing done, not even counting the check (on 3.13, the stack holds no trampoline:
    /// one would have been a frame not captured).
    #[inline(always)]
    pub fn whole(&self, captured: usize) {
        if self.entered != usize::MAX {
            if self.entered != captured || !self.is_home() {
                self.compare(captured, usize::MAX, false);
            } else if cfg!(Py_3_13) {
                trampolines_gone(TRAMPOLINE_FLOOR.load(Relaxed));
            }
        }
    }

    /// What a walk that found `walked` frames (and the trampolines of `floor`) means: at home,
    /// a check (counted if `count`), and the end of the counter if it disagrees; elsewhere, a
    /// new home if it agrees. Either way the home stack's trampolines are now known.
    #[cold]
    fn compare(&self, walked: usize, floor: usize, count: bool) {
        if self.is_home() {
            if count {
                CHECKED.fetch_add(1, Relaxed);
            }
            if walked != self.entered {
                disagree();
            }
        } else if walked == self.entered {
            self.make_home();
        } else {
            return;
        }
        TRAMPOLINE_FLOOR.store(floor, Relaxed);
    }

    #[cold]
    fn make_home(&self) {
        HOME_THREAD.store(self.thread, Relaxed);
        HOME_ROOT.store(self.root, Relaxed);
    }
}

/// The counter disagreed with a walk on its home stack: from now on every stack is walked.
#[cold]
fn disagree() {
    DISAGREED.fetch_add(1, Relaxed);
    TRUSTED.store(false, Relaxed);
}

/// For the tests: whether the counter is in use, how many times it was checked on its home
/// stack and how many of those it disagreed with the walk. `check_every` (at least 1) replaces
/// [`CHECK_EVERY`]; 1 checks every use.
pub fn state(check_every: Option<u32>) -> (bool, u64, u64) {
    if let Some(every) = check_every {
        INTERVAL.store(every.max(1), Relaxed);
        COUNTDOWN.store(every.max(1), Relaxed);
    }
    let usable = cfg!(Py_3_12) && TRUSTED.load(Relaxed);
    (usable, CHECKED.load(Relaxed), DISAGREED.load(Relaxed))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What happens, the stack, frames captured, its depth by a walk (if walked), what the
    /// counter answers.
    type Step = (&'static str, Counter, usize, Option<usize>, Option<usize>);

    /// The one test that touches the statics: a stack becomes home when a walk agrees, the
    /// counter then answers (and is checked), another stack is walked, and one disagreement
    /// at home puts the counter out of use.
    #[test]
    fn the_counter_answers_only_on_its_home_stack() {
        let home = Counter {
            entered: 30,
            thread: 1,
            root: 10,
        };
        let greenlet = Counter {
            entered: 40,
            thread: 1,
            root: 20,
        };
        state(Some(4));
        let steps: &[Step] = &[
            ("not home yet: walked", home, 1, Some(30), None),
            ("home: answered", home, 1, None, Some(30)),
            ("home: answered", home, 1, None, Some(30)),
            ("home: answered", home, 1, None, Some(30)),
            ("every 4th use: walked, agrees", home, 1, Some(30), None),
            (
                "another stack, the counter off: walked",
                greenlet,
                1,
                Some(12),
                None,
            ),
            ("still not home", greenlet, 1, Some(12), None),
            (
                "more captured than counted: walked",
                home,
                31,
                Some(31),
                None,
            ),
            (
                "out of use after that disagreement",
                home,
                1,
                Some(30),
                None,
            ),
        ];
        for (i, &(what, counter, captured, walked, answer)) in steps.iter().enumerate() {
            let counter = if TRUSTED.load(Relaxed) {
                counter
            } else {
                Counter::NONE
            };
            assert_eq!(counter.depth(captured), answer, "step {i}: {what}");
            if let Some(walked) = walked {
                counter.walked(walked, usize::MAX);
            }
        }
        assert_eq!((TRUSTED.load(Relaxed), DISAGREED.load(Relaxed)), (false, 1));
    }
}
