//! What each thread keeps for the allocation hooks, in one thread-local.
//!
//! An allocating hook needs the sampler's nesting depth and countdown ([`crate::hooks::sampler`])
//! and, when it records, the tracer's reentrancy flag ([`crate::hooks::tracer`]) and, from 3.12,
//! where the thread's interpreter keeps its thread state. They share one thread-local, looked
//! up once per hook; the hook's [`crate::hooks::sampler::Scope`] carries it to the tracer.
//!
//! How it is looked up matters: every traced allocation, free and reused object pays for it.
//! Rust's `thread_local!` in a shared library (our module is loaded with `dlopen`) compiles to
//! the general-dynamic model, a call to the dynamic loader's `__tls_get_addr` (about a dozen
//! instructions past the call). The initial-exec model (the thread pointer plus a fixed
//! offset, no call) would be cheapest, but a library using it can only be loaded while the
//! loader's small reserve of static TLS has room for all of its thread-locals (ours and those
//! of the standard library and our dependencies, 320 bytes): where it has not, `import` fails.
//! So the block is reached through a TLS descriptor instead: the loader places the module's
//! thread-locals in that reserve when it can, and the descriptor's function is then two
//! instructions; when it cannot, the descriptor takes a slower path and nothing fails. Rust
//! has no way to ask for either model, so the block is defined and reached in assembly.
//! Instructions (callgrind, `benches/loops.py`, 3.12): see docs/benchmarks.md, 2026-11-28.
//!
//! Zero-filled in every thread and without a destructor, so touching it never allocates and it
//! stays readable while the thread exits.

use std::cell::Cell;

use crate::hooks::sampler;

#[cfg_attr(test, derive(Debug, PartialEq))]
pub struct HookThread {
    /// Set while this thread is inside the tracer, so nothing the tracer does is traced and no
    /// hook re-enters tracer state it already holds (e.g. a shard lock held across `fork()`).
    pub(crate) in_tracer: Cell<bool>,
    pub(crate) sampler: sampler::State,
    /// Where this thread's interpreter keeps its current thread state (3.12 and later; see
    /// [`crate::capture::thread_state`]).
    #[cfg(Py_3_12)]
    pub(crate) tstate_slot: Cell<usize>,
}

/// Size of the thread-local block, in whole 16-byte units.
const BLOCK: usize = std::mem::size_of::<HookThread>().next_multiple_of(16);
const _: () = assert!(std::mem::align_of::<HookThread>() <= 16);

// The block (`.tbss`: zero-filled in every thread, including those that were running before
// the library was loaded). All-zero bytes are a `HookThread` in its initial state (see the
// `zeroed_is_initial` test). Hidden, so the symbol stays inside our library.
std::arch::global_asm!(
    ".pushsection .tbss,\"awT\",@nobits",
    ".p2align 4",
    ".globl alloctrace_hook_thread",
    ".hidden alloctrace_hook_thread",
    ".type alloctrace_hook_thread, @object",
    ".size alloctrace_hook_thread, {size}",
    "alloctrace_hook_thread:",
    ".zero {size}",
    ".popsection",
    size = const BLOCK,
);

/// This thread's state. `'static` only for as long as the thread runs: the reference cannot
/// leave the thread (`HookThread` is not `Sync`), and every use ends before the thread does.
#[inline(always)]
pub(crate) fn this() -> &'static HookThread {
    let thread: *const HookThread;
    // SAFETY: the TLS descriptor call sequence of the x86-64 ABI (the linker fills in the
    // descriptor's GOT slot): the function returns the block's offset from the thread pointer
    // in rax. It preserves every other register by contract; `clobber_abi("C")` all the same,
    // since some glibc versions' slow path did not keep the vector registers. The block is
    // zero-filled, which is a valid `HookThread` (see `zeroed_is_initial`).
    unsafe {
        std::arch::asm!(
            "leaq alloctrace_hook_thread@tlsdesc(%rip), %rax",
            "call *alloctrace_hook_thread@tlscall(%rax)",
            "addq %fs:0, %rax",
            out("rax") thread,
            clobber_abi("C"),
            options(att_syntax, pure, readonly),
        );
        &*thread
    }
}

/// Marks this thread as inside the tracer, or no longer, outside any hook's guard (the fork
/// handlers hold the table's locks across `fork()`).
pub(crate) fn set_in_tracer(inside: bool) {
    this().in_tracer.set(inside);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The block starts zero-filled: that must be each field's initial value.
    #[test]
    fn zeroed_is_initial() {
        let initial = HookThread {
            in_tracer: Cell::new(false),
            sampler: sampler::State::new(),
            #[cfg(Py_3_12)]
            tstate_slot: Cell::new(crate::capture::thread_state::NOT_LOOKED_UP),
        };
        // SAFETY: every field is a `Cell` of an integer or a bool, for which zero is valid.
        let zeroed: HookThread = unsafe { std::mem::zeroed() };
        assert_eq!(zeroed, initial);
    }

    /// Each thread reaches a block of its own, the same at every look-up, starting zeroed.
    #[test]
    fn each_thread_has_its_own_block() {
        const THREADS: usize = 4;
        let main = this();
        main.in_tracer.set(true);
        let all_running = std::sync::Barrier::new(THREADS);
        let mut blocks: Vec<usize> = std::thread::scope(|s| {
            let running: Vec<_> = (0..THREADS)
                .map(|_| {
                    s.spawn(|| {
                        let thread = this();
                        assert!(!thread.in_tracer.get());
                        thread.in_tracer.set(true);
                        // Every thread alive at once, so no two can share a block.
                        all_running.wait();
                        assert!(std::ptr::eq(this(), thread) && this().in_tracer.get());
                        thread as *const HookThread as usize
                    })
                })
                .collect();
            running.into_iter().map(|t| t.join().unwrap()).collect()
        });
        assert!(std::ptr::eq(this(), main) && main.in_tracer.get());
        main.in_tracer.set(false);
        blocks.push(main as *const HookThread as usize);
        blocks.sort_unstable();
        blocks.dedup();
        assert_eq!(blocks.len(), THREADS + 1);
    }
}
