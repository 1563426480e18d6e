//! Byte-based Poisson sampling for the allocation hooks (sampled mode).
//!
//! Every byte requested is a sampling point with probability 1/R, R being the interval. The
//! distance to the next sampling point is exponential with mean R, so each thread keeps a
//! countdown of bytes: an allocation of `size` bytes subtracts `size + 1` (the `+ 1` lets
//! zero-byte requests be sampled) and is recorded when the countdown goes below zero, after
//! which a new distance is drawn. Because the exponential (and its floor, the geometric) is
//! memoryless, each allocation is then sampled independently with probability
//! `1 - exp(-(size + 1) / R)`, which is what `crate::analysis::sampling` weights by.
//!
//! One allocation is seen once. The wrapped allocators nest: pymalloc serves a request above
//! 512 bytes (and grows its arena table) from `PyMem_RawMalloc`/`PyMem_RawRealloc`, so one
//! `PyObject_Malloc` runs our OBJ hook and, inside it, our RAW hook for the same memory. Under
//! the debug allocator hooks (`PYTHONMALLOC=debug`, `-X dev`) the two calls even return
//! different addresses (each debug layer adds its own header), so recording both would count
//! the block twice. So each allocating hook opens a [`Scope`] around the call it wraps, and
//! only the outermost one on the thread records (and, when sampling, consults the countdown),
//! as tracemalloc ignores its reentrant calls; nested frees and reallocations still forget
//! whatever they free.
//!
//! The fast path is one thread-local lookup, a subtraction and a branch, before any stack
//! walk or table access; the draw (a logarithm and a few multiplies) runs once per sample,
//! about once every R bytes. The state lives in [`crate::hooks::hook_thread`]'s thread-local,
//! beside the reentrancy guard's flag, so touching it never allocates.
//!
//! Seeding: each thread's generator (wyrand) is seeded from the global seed and a thread
//! counter the first time it draws in an epoch. `start()` begins a new epoch (with the seed
//! given, or a fresh one) and resets the calling thread, so a single-threaded run with a
//! given seed samples the same allocations every time. Other threads pick up the new epoch at
//! their next sample. A fork child gets a new seed and epoch (`pthread_atfork`), or parent
//! and child would sample the same allocations.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::hooks::hook_thread::{self, HookThread};

/// Mean bytes between samples; 0 while tracing exactly (every block recorded).
static INTERVAL: AtomicU64 = AtomicU64::new(0);
static SEED: AtomicU64 = AtomicU64::new(0);
/// Thread states drawn in an older epoch are reseeded at their next sample.
static EPOCH: AtomicU64 = AtomicU64::new(1);
/// Threads seeded in this epoch: each gets its own stream.
static THREADS: AtomicU64 = AtomicU64::new(0);

/// A thread's sampling state (kept in [`HookThread`]).
#[cfg_attr(test, derive(Debug, PartialEq))]
pub(crate) struct State {
    /// Bytes left before the next sample; never stored negative.
    countdown: Cell<i64>,
    /// Hooks of this thread inside a wrapped allocator call (see [`Scope`]).
    depth: Cell<u32>,
    /// wyrand state.
    rng: Cell<u64>,
    /// The epoch `rng` was seeded in (0: never).
    epoch: Cell<u64>,
}

impl State {
    /// The state of a thread that never allocated (all zero: see `crate::hooks::hook_thread`).
    #[cfg(test)]
    pub(crate) const fn new() -> State {
        State {
            countdown: Cell::new(0),
            depth: Cell::new(0),
            rng: Cell::new(0),
            epoch: Cell::new(0),
        }
    }
}

/// The sampling interval in bytes, `None` when exact.
pub fn interval() -> Option<u64> {
    Some(INTERVAL.load(Relaxed)).filter(|&i| i > 0)
}

/// Sets the mode for the next tracing session: `interval` 0 for exact tracing. Without a
/// seed, one is made from the clock and the process id.
pub fn configure(interval: u64, seed: Option<u64>) {
    INTERVAL.store(interval, Relaxed);
    SEED.store(seed.unwrap_or_else(fresh_seed), Relaxed);
    THREADS.store(0, Relaxed);
    EPOCH.fetch_add(1, Relaxed);
    reset_this_thread();
}

/// In a fork child: a new seed and epoch, so the child does not repeat the parent's draws.
/// Runs in an atfork handler: no allocation, no lock.
pub fn reseed_after_fork() {
    let seed = mix(SEED.load(Relaxed) ^ fresh_seed());
    SEED.store(seed, Relaxed);
    THREADS.store(0, Relaxed);
    EPOCH.fetch_add(1, Relaxed);
    reset_this_thread();
}

/// Makes this thread's next allocation reseed and draw a fresh distance.
fn reset_this_thread() {
    let state = &hook_thread::this().sampler;
    state.countdown.set(0);
    state.epoch.set(0);
}

fn fresh_seed() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer; clock_gettime neither allocates nor locks.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    let pid = u64::from(std::process::id());
    let stack = &ts as *const _ as u64;
    mix((ts.tv_sec as u64) << 30 ^ ts.tv_nsec as u64 ^ pid << 48 ^ stack)
}

/// splitmix64's finaliser: spreads a seed over all 64 bits.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// One hook's call into the allocator it wraps, while sampling: marks the thread as inside
/// it, so that hooks nested in that call (pymalloc falling back on the RAW allocator) leave the
/// countdown alone. Holds this thread's [`HookThread`], so the hook (and the tracer's
/// reentrancy guard, see [`Scope::thread`]) looks the thread-local up once.
pub struct Scope(&'static HookThread);

impl Scope {
    /// Enters: one thread-local lookup and an increment.
    #[inline(always)]
    pub fn enter() -> Scope {
        let thread = hook_thread::this();
        let depth = &thread.sampler.depth;
        depth.set(depth.get() + 1);
        Scope(thread)
    }

    /// This thread's state, for the tracer's reentrancy guard.
    #[inline(always)]
    pub(crate) fn thread(&self) -> &'static HookThread {
        self.0
    }

    /// Whether the allocation of `size` bytes this scope wrapped is to be recorded: if this
    /// is the outermost hook on the thread and, when sampling, the allocation crosses the
    /// countdown.
    #[inline(always)]
    pub fn keep(&self, size: usize) -> bool {
        let state = &self.0.sampler;
        if state.depth.get() != 1 {
            return false;
        }
        match INTERVAL.load(Relaxed) {
            0 => true,
            interval => hit(state, size, interval),
        }
    }
}

impl Drop for Scope {
    #[inline(always)]
    fn drop(&mut self) {
        let depth = &self.0.sampler.depth;
        depth.set(depth.get() - 1);
    }
}

#[inline(always)]
fn hit(state: &State, size: usize, interval: u64) -> bool {
    // At most i64::MAX: a larger request cannot succeed anyway.
    let charge = (size as u64).saturating_add(1).min(i64::MAX as u64) as i64;
    let left = state.countdown.get() - charge;
    if left >= 0 {
        state.countdown.set(left);
        return false;
    }
    crossed(state, charge, interval)
}

/// The countdown ran out: sample, unless it was a stale state from an older epoch (then
/// reseed and decide again with a fresh distance).
#[cold]
#[inline(never)]
fn crossed(state: &State, charge: i64, interval: u64) -> bool {
    let epoch = EPOCH.load(Relaxed);
    if state.epoch.get() != epoch {
        let thread = THREADS.fetch_add(1, Relaxed);
        state.rng.set(mix(SEED.load(Relaxed) ^ mix(thread)));
        state.epoch.set(epoch);
        let left = draw(state, interval) - charge;
        if left >= 0 {
            state.countdown.set(left);
            return false;
        }
    }
    state.countdown.set(draw(state, interval));
    true
}

/// wyrand: one multiply per 64 bits, good enough statistics for sampling.
fn next(state: &State) -> u64 {
    let s = state.rng.get().wrapping_add(0xA076_1D64_78BD_642F);
    state.rng.set(s);
    let t = u128::from(s) * u128::from(s ^ 0xE703_7ED1_A0B4_28DB);
    (t as u64) ^ ((t >> 64) as u64)
}

/// A distance to the next sample: floor of an exponential with mean `interval` (geometric,
/// so memoryless over whole bytes). At most ~37 x interval, far from overflow.
fn draw(state: &State, interval: u64) -> i64 {
    // Uniform in (0, 1]: never 0, whose logarithm is infinite.
    let u = ((next(state) >> 11) + 1) as f64 * (1.0 / (1u64 << 53) as f64);
    (-u.ln() * interval as f64) as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One hook's decision on an allocation of `size`.
    fn keep(size: usize) -> bool {
        Scope::enter().keep(size)
    }

    /// Runs `sizes` through a fresh sampler on a new thread (thread-locals start clean).
    fn sampled(interval: u64, seed: u64, sizes: Vec<usize>) -> Vec<bool> {
        std::thread::spawn(move || {
            // Only this test module configures the sampler; the tests share the statics, so
            // they run under one lock.
            let _lock = LOCK.lock().unwrap();
            configure(interval, Some(seed));
            sizes.into_iter().map(keep).collect()
        })
        .join()
        .unwrap()
    }

    #[test]
    fn nested_hooks_charge_the_countdown_once() {
        let (outer, inner) = std::thread::spawn(|| {
            let _lock = LOCK.lock().unwrap();
            configure(1 << 20, Some(1));
            // Every block far above the interval is sampled; nested ones never are.
            let outer = Scope::enter();
            let inner = Scope::enter();
            let inner_kept = inner.keep(64 << 20);
            drop(inner);
            let outer_kept = outer.keep(64 << 20);
            drop(outer);
            assert!(keep(64 << 20), "depth back to zero after both scopes");
            (outer_kept, inner_kept)
        })
        .join()
        .unwrap();
        assert!(outer && !inner);
    }

    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// The debug allocator hooks give the nested RAW call another address than the OBJ call
    /// around it, so only the outermost hook may record, in exact mode too.
    #[test]
    fn nested_hooks_never_record_when_exact() {
        std::thread::spawn(|| {
            let _lock = LOCK.lock().unwrap();
            configure(0, Some(1));
            let outer = Scope::enter();
            let inner = Scope::enter();
            assert!(!inner.keep(1000), "nested");
            drop(inner);
            assert!(outer.keep(1000), "outermost");
            drop(outer);
            assert!(keep(1000), "depth back to zero");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn sampling_rate_matches_the_interval_and_seeds_reproduce() {
        let sizes: Vec<usize> = (0..200_000).map(|i| 16 + (i * 7919) % 2000).collect();
        let total: usize = sizes.iter().map(|s| s + 1).sum();
        let a = sampled(4096, 7, sizes.clone());
        assert_eq!(
            a,
            sampled(4096, 7, sizes.clone()),
            "same seed, same samples"
        );
        let b = sampled(4096, 8, sizes.clone());
        assert_ne!(a, b, "another seed, other samples");
        // Expected samples: Σ p(size) ≈ n·(1 - exp(-s/R)); well within 5 standard deviations.
        let expected: f64 = sizes
            .iter()
            .map(|&s| 1.0 - (-((s + 1) as f64) / 4096.0).exp())
            .sum();
        let got = a.iter().filter(|&&x| x).count() as f64;
        assert!(
            (got - expected).abs() < 5.0 * expected.sqrt(),
            "{got} samples, expected {expected:.0} ({total} bytes)"
        );
        // Blocks much larger than the interval are always sampled.
        assert!(sampled(64, 1, vec![1 << 20; 100]).iter().all(|&x| x));
        // Exact mode keeps everything.
        assert!(sampled(0, 1, vec![1; 100]).iter().all(|&x| x));
    }

    #[test]
    fn a_fork_style_reseed_changes_the_stream() {
        let sizes: Vec<usize> = (0..50_000).map(|i| 100 + i % 900).collect();
        let (first, after) = std::thread::spawn(move || {
            let _lock = LOCK.lock().unwrap();
            configure(4096, Some(3));
            let first: Vec<bool> = sizes.iter().map(|&s| keep(s)).collect();
            configure(4096, Some(3));
            reseed_after_fork();
            let after: Vec<bool> = sizes.iter().map(|&s| keep(s)).collect();
            (first, after)
        })
        .join()
        .unwrap();
        assert_ne!(first, after);
    }

    #[test]
    fn draws_are_exponential() {
        let state = State {
            countdown: Cell::new(0),
            depth: Cell::new(0),
            rng: Cell::new(mix(42)),
            epoch: Cell::new(1),
        };
        let n = 100_000;
        let draws: Vec<f64> = (0..n).map(|_| draw(&state, 1000) as f64).collect();
        let mean = draws.iter().sum::<f64>() / n as f64;
        // Floor of Exp(1000) has mean ~999.5 and sd ~1000: the mean is within 2%.
        assert!((mean - 999.5).abs() < 20.0, "mean {mean}");
        // P(X >= 1000) = e^-1.
        let above = draws.iter().filter(|&&d| d >= 1000.0).count() as f64 / n as f64;
        assert!((above - (-1.0f64).exp()).abs() < 0.01, "{above}");
    }
}
