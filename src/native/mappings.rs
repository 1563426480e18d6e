//! The anonymous mappings native mode has seen made, by address range, so that an `munmap`
//! of any whole pages of one (its tail, its middle, or a range across several) leaves exactly
//! the pieces still mapped traced.
//!
//! The trace table is keyed by a block's first address and cannot answer "which block holds
//! this address". A mapping is different from a `malloc` block: the kernel lets a program
//! give back any pages of it, and an allocator that maps a large region and returns parts of
//! it (an arena trimming its tail, a stack guard carved out of the middle) does exactly that.
//! So the mappings are kept here too, page-rounded and never overlapping, and each unmapped
//! range is cut out of them ([`Ranges::cut`], plain logic tested below); the hooks then move
//! the traces to match: the mapping's trace leaves the table, and each piece left mapped is
//! recorded under its own first address, with the mapping's traceback and its own size.
//!
//! The lock is a leaf: nothing is called while it is held but the allocator, and it is taken
//! without parking and held across `fork()` (see [`crate::platform::nopark`]), so that a child never
//! inherits it locked by a thread that does not exist there.

use std::collections::BTreeMap;
use std::sync::Once;

use parking_lot::{Mutex, MutexGuard};

const PAGE: usize = 4096;

/// `len` rounded up to whole pages, as the kernel rounds `mmap` and `munmap` lengths.
pub fn page_round(len: usize) -> usize {
    len.saturating_add(PAGE - 1) & !(PAGE - 1)
}

/// What cutting a range out did to one mapping: it started at `start`; `head` and `tail` are
/// the pieces, `(start, length)`, still mapped before and after the range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cut {
    pub start: usize,
    pub head: Option<(usize, usize)>,
    pub tail: Option<(usize, usize)>,
}

/// Non-overlapping mappings: start to end (exclusive), whole pages.
#[derive(Debug, Default)]
pub struct Ranges {
    by_start: BTreeMap<usize, usize>,
}

impl Ranges {
    pub const fn new() -> Self {
        Ranges {
            by_start: BTreeMap::new(),
        }
    }

    /// A new mapping of `len` bytes at `start`. Whatever it overlaps was unmapped by the
    /// kernel already (`MAP_FIXED` replaces; otherwise the stale entry of a mapping this
    /// module never saw go): callers cut the range first, so that overlaps never remain.
    pub fn add(&mut self, start: usize, len: usize) {
        let len = page_round(len);
        if len > 0 {
            self.by_start.insert(start, start.saturating_add(len));
        }
    }

    /// Takes `[start, start + len)` (whole pages) out of the mappings; appends to `cuts` one
    /// entry per mapping it overlapped, in address order.
    pub fn cut(&mut self, start: usize, len: usize, cuts: &mut Vec<Cut>) {
        let end = start.saturating_add(page_round(len));
        if end <= start {
            return;
        }
        // Mappings never overlap, so their ends are in the order of their starts: walking
        // down from the last start below `end`, the first that ends at or before `start`
        // ends the overlapping run.
        let first = cuts.len();
        for (&m_start, &m_end) in self.by_start.range(..end).rev() {
            if m_end <= start {
                break;
            }
            cuts.push(Cut {
                start: m_start,
                head: (m_start < start).then(|| (m_start, start - m_start)),
                tail: (m_end > end).then(|| (end, m_end - end)),
            });
        }
        cuts[first..].reverse();
        for cut in &cuts[first..] {
            self.by_start.remove(&cut.start);
            if let Some((s, l)) = cut.head {
                self.by_start.insert(s, s + l);
            }
            if let Some((s, l)) = cut.tail {
                self.by_start.insert(s, s + l);
            }
        }
    }

    pub fn clear(&mut self) {
        self.by_start.clear();
    }

    pub fn len(&self) -> usize {
        self.by_start.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_start.is_empty()
    }
}

static MAPPINGS: Mutex<Ranges> = Mutex::new(Ranges::new());

/// The process's mappings, taken without parking; the fork handlers are registered first.
pub fn lock() -> MutexGuard<'static, Ranges> {
    static FORK_HANDLERS: Once = Once::new();
    FORK_HANDLERS.call_once(|| {
        // SAFETY: the handlers only take and release a process-lifetime lock.
        unsafe { libc::pthread_atfork(Some(before_fork), Some(after_fork), Some(after_fork)) };
    });
    crate::platform::nopark::acquire(|| MAPPINGS.try_lock())
}

extern "C" fn before_fork() {
    // Released by `after_fork` in the parent and the child, on this same thread.
    std::mem::forget(crate::platform::nopark::acquire(|| MAPPINGS.try_lock()));
}

extern "C" fn after_fork() {
    // SAFETY: `before_fork` locked it on this thread and forgot the guard.
    unsafe { MAPPINGS.force_unlock() };
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: usize = PAGE;

    /// A range cut, the cuts it makes, and what stays mapped.
    type Case = ((usize, usize), Vec<Cut>, Vec<(usize, usize)>);

    fn cut(ranges: &mut Ranges, start: usize, len: usize) -> Vec<Cut> {
        let mut cuts = Vec::new();
        ranges.cut(start, len, &mut cuts);
        cuts
    }

    fn mapped(ranges: &Ranges) -> Vec<(usize, usize)> {
        ranges.by_start.iter().map(|(&s, &e)| (s, e)).collect()
    }

    #[test]
    fn cuts_of_one_mapping() {
        // (range cut, cuts, what stays mapped), each from a fresh mapping of pages 10..20.
        let cases: &[Case] = &[
            // the head
            (
                (10 * P, 3 * P),
                vec![Cut {
                    start: 10 * P,
                    head: None,
                    tail: Some((13 * P, 7 * P)),
                }],
                vec![(13 * P, 20 * P)],
            ),
            // the tail, with a length short of a page: whole pages go
            (
                (17 * P, 3 * P - 100),
                vec![Cut {
                    start: 10 * P,
                    head: Some((10 * P, 7 * P)),
                    tail: None,
                }],
                vec![(10 * P, 17 * P)],
            ),
            // the middle
            (
                (12 * P, 2 * P),
                vec![Cut {
                    start: 10 * P,
                    head: Some((10 * P, 2 * P)),
                    tail: Some((14 * P, 6 * P)),
                }],
                vec![(10 * P, 12 * P), (14 * P, 20 * P)],
            ),
            // all of it and more
            (
                (5 * P, 30 * P),
                vec![Cut {
                    start: 10 * P,
                    head: None,
                    tail: None,
                }],
                vec![],
            ),
            // before it, after it, nothing
            ((2 * P, 8 * P), vec![], vec![(10 * P, 20 * P)]),
            ((20 * P, 8 * P), vec![], vec![(10 * P, 20 * P)]),
            ((12 * P, 0), vec![], vec![(10 * P, 20 * P)]),
        ];
        for ((start, len), want_cuts, want_mapped) in cases {
            let mut ranges = Ranges::new();
            ranges.add(10 * P, 10 * P);
            assert_eq!(
                &cut(&mut ranges, *start, *len),
                want_cuts,
                "cut {start:#x}+{len:#x}"
            );
            assert_eq!(&mapped(&ranges), want_mapped, "after {start:#x}+{len:#x}");
        }
    }

    #[test]
    fn a_cut_across_mappings_and_holes() {
        let mut ranges = Ranges::new();
        ranges.add(0, 4 * P);
        ranges.add(6 * P, 2 * P);
        ranges.add(10 * P, 5 * P + 1); // rounded up to 6 pages
        let cuts = cut(&mut ranges, 2 * P, 10 * P);
        assert_eq!(
            cuts,
            vec![
                Cut {
                    start: 0,
                    head: Some((0, 2 * P)),
                    tail: None
                },
                Cut {
                    start: 6 * P,
                    head: None,
                    tail: None
                },
                Cut {
                    start: 10 * P,
                    head: None,
                    tail: Some((12 * P, 4 * P))
                },
            ]
        );
        assert_eq!(mapped(&ranges), vec![(0, 2 * P), (12 * P, 16 * P)]);
        assert_eq!(ranges.len(), 2);
    }

    #[test]
    fn ranges_at_the_top_of_the_address_space_do_not_overflow() {
        let mut ranges = Ranges::new();
        let top = usize::MAX & !(P - 1);
        ranges.add(top - 2 * P, 2 * P);
        assert!(cut(&mut ranges, top - P, usize::MAX).len() == 1);
        assert_eq!(mapped(&ranges), vec![(top - 2 * P, top - P)]);
    }
}
