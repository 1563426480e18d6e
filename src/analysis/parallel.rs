//! Splitting one large pass over the traces into parts that run on several cores.
//!
//! Dumping and loading a million traces is bound by memory, not by instructions: `load()`
//! stores 12 MB of traces and `dump()` reads them (see the format's notes). One core
//! cannot keep enough cache misses in flight to use the memory's bandwidth, so two or more
//! cores each streaming their own part finish sooner. The parts are independent by
//! construction (each writes only its own slice of the output), so no locking is involved,
//! and the result does not depend on how many parts there were: the format tests encode and
//! decode with every part count and compare.
//!
//! Below [`MIN_PER_PART`] items a part is not worth a thread, and a thread that cannot be
//! started (a process at its thread limit) just means its part runs on the calling thread.

use parking_lot::Mutex;
use std::ops::Range;
use std::sync::OnceLock;

/// The fewest items a part is given. Starting and joining a thread costs tens of
/// microseconds; a quarter of a million traces take a millisecond or more to pass over.
pub const MIN_PER_PART: usize = 1 << 18;

/// The most parts: memory bandwidth, not cores, limits these passes, and it is used up by a
/// few streams.
const MAX_PARTS: usize = 4;

/// How many parts a pass over `n` items should use on this machine.
pub fn parts_for(n: usize) -> usize {
    static CORES: OnceLock<usize> = OnceLock::new();
    // Read once: `available_parallelism` reads cgroup files on Linux.
    let cores = *CORES
        .get_or_init(|| std::thread::available_parallelism().map_or(1, |c| c.get().min(MAX_PARTS)));
    cores.min(n / MIN_PER_PART).max(1)
}

/// `0..n` cut into `parts` consecutive ranges (fewer if `n` is small), each of equal length
/// but for the last, and each starting at a multiple of `align`, so that a part never splits a
/// block of the format.
pub fn split(n: usize, parts: usize, align: usize) -> Vec<Range<usize>> {
    assert!(align > 0, "alignment must be positive");
    let per = n.div_ceil(parts.max(1)).next_multiple_of(align).max(align);
    (0..n)
        .step_by(per)
        .map(|start| start..(start + per).min(n))
        .collect()
}

/// Runs every job and returns their results in order: all but the first on threads of their
/// own, the first on the calling thread. A job whose thread cannot be started runs on the
/// calling thread instead. A panic in a job is resumed here, as if the job had run inline.
pub fn run<T, F>(jobs: Vec<F>) -> Vec<T>
where
    T: Send,
    F: FnOnce() -> T + Send,
{
    // Each job waits in a slot that its thread borrows and empties, so a job whose thread
    // could not be started is still there to run here.
    let slots: Vec<Mutex<Option<F>>> = jobs.into_iter().map(|j| Mutex::new(Some(j))).collect();
    let take = |slot: &Mutex<Option<F>>| slot.lock().take().expect("each job runs once");
    let Some((first, rest)) = slots.split_first() else {
        return Vec::new();
    };
    std::thread::scope(|scope| {
        let handles: Vec<_> = rest
            .iter()
            .map(|slot| {
                std::thread::Builder::new()
                    .name("alloctrace-part".into())
                    .spawn_scoped(scope, move || take(slot)())
                    .ok()
            })
            .collect();
        let mut results = Vec::with_capacity(slots.len());
        results.push(take(first)());
        for (slot, handle) in rest.iter().zip(handles) {
            results.push(match handle {
                Some(h) => h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)),
                None => take(slot)(),
            });
        }
        results
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_covers_everything_in_aligned_parts() {
        let cases = [
            // (n, parts, align, expected starts)
            (0, 2, 16, vec![]),
            (1, 2, 16, vec![0]),
            (16, 2, 16, vec![0]),
            (17, 2, 16, vec![0, 16]),
            (100, 1, 16, vec![0]),
            (100, 2, 16, vec![0, 64]),
            (100, 3, 16, vec![0, 48, 96]),
            (1000, 4, 256, vec![0, 256, 512, 768]),
            (1000, 4, 1, vec![0, 250, 500, 750]),
            (10, 0, 1, vec![0]),
        ];
        for (n, parts, align, starts) in cases {
            let ranges = split(n, parts, align);
            let got: Vec<usize> = ranges.iter().map(|r| r.start).collect();
            assert_eq!(got, starts, "split({n}, {parts}, {align})");
            assert!(ranges.len() <= parts.max(1));
            // Consecutive, aligned, and ending at n.
            let mut at = 0;
            for r in &ranges {
                assert_eq!(r.start, at);
                assert_eq!(r.start % align, 0);
                assert!(r.end > r.start);
                at = r.end;
            }
            assert_eq!(at, n);
        }
    }

    #[test]
    fn parts_need_enough_items_each() {
        assert_eq!(parts_for(0), 1);
        assert_eq!(parts_for(MIN_PER_PART * 2 - 1), 1);
        assert!(parts_for(MIN_PER_PART * 64) <= MAX_PARTS);
    }

    #[test]
    fn run_returns_results_in_order() {
        let jobs: Vec<_> = (0..5).map(|i| move || i * 10).collect();
        assert_eq!(run(jobs), vec![0, 10, 20, 30, 40]);
        let none: Vec<fn() -> u8> = Vec::new();
        assert!(run(none).is_empty());
    }

    #[test]
    fn jobs_write_disjoint_slices() {
        let mut out = vec![0u32; 1000];
        let jobs: Vec<_> = out
            .chunks_mut(300)
            .enumerate()
            .map(|(i, part)| {
                move || {
                    part.iter_mut().for_each(|v| *v = i as u32 + 1);
                    part.len()
                }
            })
            .collect();
        assert_eq!(run(jobs), vec![300, 300, 300, 100]);
        assert!(out[..300].iter().all(|&v| v == 1));
        assert!(out[900..].iter().all(|&v| v == 4));
    }
}
