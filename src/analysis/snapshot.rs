//! The snapshot model: traces that point at interned tracebacks, which point at interned frames,
//! which point at interned filenames.
//!
//! A million traces typically come from a few thousand distinct tracebacks, so every analysis
//! (grouping, filtering, diffing) works per traceback or per frame first and only then per
//! trace. Ids are indexes into the snapshot's own tables; they mean nothing across snapshots,
//! so anything comparing two snapshots compares resolved contents (filename bytes, line).

use crate::platform::fallible;
use crate::platform::process_memory::ProcessMemory;
use serde::{Deserialize, Serialize};

use crate::analysis::sampling::{Weights, COUNT_SCALE};
use std::collections::HashMap;

/// Index into [`Snapshot::filenames`].
pub type FilenameId = u32;
/// Index into [`Snapshot::frames`].
pub type FrameId = u32;
/// Index into [`Snapshot::tracebacks`].
pub type TracebackId = u32;
/// Index into [`Snapshot::functions`].
pub type FunctionId = u32;

/// A filename exactly as Python had it.
///
/// Stored as UTF-8 in which lone surrogates are passed through (Python's `surrogatepass`), so
/// that a path Python decoded with `surrogateescape` survives a round trip. Byte order of this
/// encoding is code point order, which is how Python compares the `str`.
pub type Filename = Box<[u8]>;

/// One frame: `(filename, lineno)`, the identity `tracemalloc.Frame` compares by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Frame {
    pub filename: FilenameId,
    pub lineno: u32,
}

/// A function as its code object described itself when the snapshot was taken:
/// `co_qualname` (3.11+) or `co_name` (surrogatepass UTF-8, like filenames) and
/// `co_firstlineno`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Function {
    pub name: Filename,
    pub first_lineno: u32,
}

/// One traceback: frames most recent first (the order `_get_traces()` uses), plus the depth of
/// the stack it was cut from (`None` where the source did not say, as in 3-tuples).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Traceback {
    pub frames: Box<[FrameId]>,
    pub total_nframe: Option<u32>,
}

/// One live block's size and traceback; its domain is in [`Snapshot::domains`].
///
/// Twelve bytes, not sixteen: a million traces are what `load()` must allocate and fill and
/// what every analysis streams through, so they are packed (the 8-byte size at a 4-byte
/// alignment, which x86-64 reads unaligned at no cost), and the domain, the same for nearly
/// every block, is kept apart as runs. Fields are read by value (a reference to a field of
/// a packed struct is refused by the compiler).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(C, packed(4))]
pub struct Trace {
    pub size: u64,
    pub traceback: TracebackId,
}

/// The domain of each trace, stored as runs of equal domains: nearly every block is in
/// domain 0, so this is a handful of entries where a column would take 4 bytes a trace.
/// Runs are kept maximal (no two adjacent runs share a domain, none is empty), so two
/// snapshots whose traces have the same domains have equal `Domains`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Domains {
    /// The first trace and the domain of each run, in order.
    starts: Vec<(usize, u32)>,
    len: usize,
}

impl Domains {
    /// Appends one trace's domain.
    pub fn push(&mut self, domain: u32) {
        self.push_run(domain, 1);
    }

    /// Appends `n` traces of one domain.
    pub fn push_run(&mut self, domain: u32, n: usize) {
        if n == 0 {
            return;
        }
        if self.starts.last().is_none_or(|&(_, d)| d != domain) {
            self.starts.push((self.len, domain));
        }
        self.len += n;
    }

    /// The domain of trace `i`, which must be below [`Self::len`].
    pub fn get(&self, i: usize) -> u32 {
        assert!(i < self.len, "trace {i} of {}", self.len);
        let run = self.starts.partition_point(|&(start, _)| start <= i);
        self.starts[run - 1].1
    }

    /// The number of traces.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// `(domain, number of traces)` of each run, in order.
    pub fn runs(&self) -> impl Iterator<Item = (u32, usize)> + '_ {
        self.starts.iter().enumerate().map(|(k, &(start, domain))| {
            let end = self.starts.get(k + 1).map_or(self.len, |&(next, _)| next);
            (domain, end - start)
        })
    }

    /// Every trace's domain, in order.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.runs()
            .flat_map(|(domain, n)| std::iter::repeat_n(domain, n))
    }
}

impl FromIterator<u32> for Domains {
    fn from_iter<I: IntoIterator<Item = u32>>(domains: I) -> Self {
        let mut out = Domains::default();
        domains.into_iter().for_each(|d| out.push(d));
        out
    }
}

/// Where and when a snapshot was taken. Informational: never used to interpret the traces.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Metadata {
    /// `sys.version_info[:3]` of the traced interpreter; `None` for hand-built snapshots.
    pub python_version: Option<(u8, u8, u8)>,
    /// Seconds since the Unix epoch.
    pub timestamp: Option<f64>,
    pub pid: Option<u32>,
    pub argv: Vec<String>,
    /// The process's resident memory when the snapshot was taken (file section 13); `None`
    /// for hand-built snapshots, tracemalloc pickles and files written before it existed.
    #[serde(default)]
    pub process_memory: Option<ProcessMemory>,
    /// The machine it was taken on (file section 14); `None` for hand-built snapshots and
    /// files written before it was recorded. Decides whether readers show source lines.
    #[serde(default)]
    pub machine: Option<crate::platform::machine::Machine>,
}

/// An immutable snapshot. Built once (by [`SnapshotBuilder`]), then only read.
///
/// Invariant the analyses rely on: `filenames` and `frames` hold no two equal entries, so a
/// frame or filename id identifies its content within the snapshot (statistics group by id).
/// [`SnapshotBuilder`] guarantees it; the file loader checks it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    pub filenames: Vec<Filename>,
    pub frames: Vec<Frame>,
    /// Distinct functions.
    pub functions: Vec<Function>,
    /// Per traceback and frame position, the function running there, where known.
    ///
    /// Kept beside the tracebacks, not in the frames: a frame's identity stays
    /// `(filename, lineno)`, so grouping, equality and sorting are `tracemalloc`'s. It is per
    /// position rather than per frame because one line can run in two functions: a 3.11
    /// comprehension shares its parent's line, so `(file, 5)` is both `fill` and `<listcomp>`
    /// in one traceback. Either empty (nothing known: snapshots built from raw tuples, files
    /// written before functions were recorded) or one entry per traceback, each either empty
    /// (unknown) or as long as the traceback's frames.
    pub traceback_functions: Vec<Box<[Option<FunctionId>]>>,
    pub tracebacks: Vec<Traceback>,
    pub traces: Vec<Trace>,
    /// The domain of each trace (as many as `traces`).
    pub domains: Domains,
    /// `None`: every trace is one block (what the tracer sees now). `Some`: the traces are
    /// aggregates, one per traceback (a peak snapshot, see `take_snapshot(peak=True)`), and
    /// this holds, per trace, how many blocks it stands for; its `size` is their total. An
    /// aggregate's size and count are final: they are not reweighted by `sample_interval`
    /// (in a sampled peak they are already the estimates).
    pub blocks: Option<Vec<u64>>,
    /// The peak of the session this snapshot was taken in, stored with it (dumps written by
    /// `ALLOCTRACE_DUMP`); always an aggregate snapshot. `None` when not stored. Not kept by
    /// filters or comparisons: it is a separate snapshot, analysed as such.
    pub peak: Option<Box<Snapshot>>,
    pub traceback_limit: u32,
    pub metadata: Metadata,
    /// `Some(R)` if the tracer sampled with a mean of R bytes between samples: `traces` then
    /// hold only the sampled blocks, and every total is an estimate (see
    /// [`crate::analysis::sampling`]). `None` for an exact snapshot.
    pub sample_interval: Option<u64>,
    /// What each traced block is (`take_snapshot(objects=True)`); `None` when not captured.
    pub kinds: Option<Kinds>,
    /// Why the objects of some allocation sites were alive when the snapshot was taken
    /// (`take_snapshot(retention=N)`, dumps with `ALLOCTRACE_OBJECTS=1`); `None` when not
    /// captured. Reports describe the heap at capture time, not the traces, so nothing here
    /// is recomputed from them.
    pub retention: Option<Vec<SiteRetention>>,
}

/// The retention report of one allocation site. Paths and the pattern are stored as the
/// text they were rendered to at capture time: naming an edge (`dict['users']`) needs the
/// live objects, which a file cannot carry. Strings are surrogatepass UTF-8.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SiteRetention {
    pub filename: Box<[u8]>,
    pub lineno: u32,
    /// Live objects found allocated at the site.
    pub count: u64,
    /// How many of them no root reaches.
    pub unreachable: u64,
    /// Their own bytes together.
    pub size: u64,
    /// What releasing all of them would free.
    pub retained: u64,
    /// Sample reference chains from a root, rendered.
    pub paths: Vec<Box<[u8]>>,
    /// What holds them, grouped by holder kind and site, largest first.
    pub pattern: Vec<Box<[u8]>>,
}

/// Object kinds: per trace, an index into a table of kind names. A kind is an object's type
/// (`module.QualName`, builtins bare: `dict`, `app.cache.User`), a buffer named after its
/// owner's type (`list (items)`, `dict (keys)`), or [`RAW_KIND`] for a block the heap walk
/// could not attribute. Names are surrogatepass UTF-8, each once.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Kinds {
    pub names: Vec<Box<[u8]>>,
    /// One entry per trace, in trace order: `names[of_trace[i]]` is trace `i`'s kind.
    pub of_trace: Vec<u32>,
}

/// The kind of a traced block that is neither an object nor a buffer the walk attributed.
pub const RAW_KIND: &[u8] = b"raw";

impl Snapshot {
    pub fn frame_filename(&self, frame: FrameId) -> &[u8] {
        &self.filenames[self.frames[frame as usize].filename as usize]
    }

    /// The function at position `index` (most recent first) of a traceback, if recorded.
    pub fn function(&self, traceback: TracebackId, index: usize) -> Option<&Function> {
        let functions = self.traceback_functions.get(traceback as usize)?;
        let id = (*functions.get(index)?)?;
        Some(&self.functions[id as usize])
    }

    /// Blocks trace `i` stands for (1 unless the traces are aggregates).
    #[inline]
    pub fn blocks_of(&self, i: usize) -> u64 {
        self.blocks.as_ref().map_or(1, |blocks| blocks[i])
    }

    /// Per trace, `(estimated bytes, estimated blocks in COUNT_SCALE units)`: the sizes and
    /// counts every analysis sums. One block of its size per trace when exact, weighted by
    /// inverse sampling probability when sampled, and as recorded for aggregates.
    pub fn weighted(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let weights = Weights::new(self.sample_interval);
        self.traces.iter().enumerate().map(move |(i, tr)| {
            let size = tr.size;
            match &self.blocks {
                Some(blocks) => (size, blocks[i].saturating_mul(COUNT_SCALE)),
                None => (weights.bytes(size), weights.count_units(size)),
            }
        })
    }
}

/// Builds a [`Snapshot`], interning filenames, frames and tracebacks so that equal ones share
/// one id. Both the live tracer and the raw-tuple constructor go through it, which is what
/// makes "one entry per distinct traceback" hold for every snapshot.
#[derive(Default)]
pub struct SnapshotBuilder {
    snapshot: Snapshot,
    filename_ids: HashMap<Filename, FilenameId>,
    frame_ids: HashMap<Frame, FrameId>,
    traceback_ids: HashMap<Traceback, TracebackId>,
    function_ids: HashMap<Function, FunctionId>,
}

impl SnapshotBuilder {
    pub fn new(traceback_limit: u32) -> Self {
        let mut builder = Self::default();
        builder.snapshot.traceback_limit = traceback_limit;
        builder
    }

    pub fn filename(&mut self, name: &[u8]) -> FilenameId {
        if let Some(&id) = self.filename_ids.get(name) {
            return id;
        }
        let id = self.snapshot.filenames.len() as FilenameId;
        let owned: Filename = name.into();
        self.snapshot.filenames.push(owned.clone());
        self.filename_ids.insert(owned, id);
        id
    }

    pub fn frame(&mut self, filename: FilenameId, lineno: u32) -> FrameId {
        let frame = Frame { filename, lineno };
        let next = self.snapshot.frames.len() as FrameId;
        let id = *self.frame_ids.entry(frame).or_insert(next);
        if id == next {
            self.snapshot.frames.push(frame);
        }
        id
    }

    pub fn function(&mut self, name: &[u8], first_lineno: u32) -> FunctionId {
        let function = Function {
            name: name.into(),
            first_lineno,
        };
        if let Some(&id) = self.function_ids.get(&function) {
            return id;
        }
        let id = self.snapshot.functions.len() as FunctionId;
        self.snapshot.functions.push(function.clone());
        self.function_ids.insert(function, id);
        id
    }

    /// [`SnapshotBuilder::try_traceback_functions`] for snapshots built by hand (tests).
    #[cfg(test)]
    pub fn traceback_functions(
        &mut self,
        traceback: TracebackId,
        functions: &[Option<FunctionId>],
    ) {
        self.try_traceback_functions(traceback, functions)
            .expect("a small test snapshot fits in memory");
    }

    /// As [`SnapshotBuilder::traceback`], but a failure to get memory is an error rather than
    /// an abort: a deep program's tracebacks can be most of a snapshot (the live tracer's
    /// `take_snapshot()` raises `MemoryError` then, as `tracemalloc` does).
    pub fn try_traceback(
        &mut self,
        frames: &[FrameId],
        total_nframe: Option<u32>,
    ) -> crate::error::Result<TracebackId> {
        let owned = fallible::cloned(frames)?;
        let traceback = Traceback {
            frames: owned.into_boxed_slice(),
            total_nframe,
        };
        if let Some(&id) = self.traceback_ids.get(&traceback) {
            return Ok(id);
        }
        self.snapshot.tracebacks.try_reserve(1)?;
        self.traceback_ids.try_reserve(1)?;
        let id = self.snapshot.tracebacks.len() as TracebackId;
        // The table keeps its own copy of the frames.
        let key = fallible::cloned(frames)?;
        self.traceback_ids.insert(
            Traceback {
                frames: key.into_boxed_slice(),
                total_nframe,
            },
            id,
        );
        self.snapshot.tracebacks.push(traceback);
        Ok(id)
    }

    /// Records the functions running at each frame of `traceback` (as many as it has
    /// frames), unless some were recorded already: two stacks with the same lines in other
    /// functions are one traceback, and the first one seen names it. A failure to get memory
    /// is an error, as in [`SnapshotBuilder::try_traceback`].
    pub fn try_traceback_functions(
        &mut self,
        traceback: TracebackId,
        functions: &[Option<FunctionId>],
    ) -> crate::error::Result<()> {
        let frames = self.snapshot.tracebacks[traceback as usize].frames.len();
        assert_eq!(functions.len(), frames, "one function entry per frame");
        let all = &mut self.snapshot.traceback_functions;
        if all.len() <= traceback as usize {
            all.try_reserve(traceback as usize + 1 - all.len())?;
            all.resize(traceback as usize + 1, Box::default());
        }
        if all[traceback as usize].is_empty() {
            all[traceback as usize] = fallible::cloned(functions)?.into_boxed_slice();
        }
        Ok(())
    }

    /// Copies traceback `t` of `snapshot`, with its frames' file names and lines and the
    /// function names recorded for it, into this builder; its id here. `frames` is scratch
    /// space the caller keeps between calls.
    pub fn try_copy_traceback(
        &mut self,
        snapshot: &Snapshot,
        t: usize,
        frames: &mut Vec<FrameId>,
    ) -> crate::error::Result<TracebackId> {
        let tb = &snapshot.tracebacks[t];
        frames.clear();
        for &f in tb.frames.iter() {
            let fr = snapshot.frames[f as usize];
            let name = self.filename(&snapshot.filenames[fr.filename as usize]);
            frames.push(self.frame(name, fr.lineno));
        }
        let id = self.try_traceback(frames, tb.total_nframe)?;
        if let Some(known) = snapshot
            .traceback_functions
            .get(t)
            .filter(|k| !k.is_empty())
        {
            let ids: Vec<_> = known
                .iter()
                .map(|f| {
                    f.map(|f| {
                        let f = &snapshot.functions[f as usize];
                        self.function(&f.name, f.first_lineno)
                    })
                })
                .collect();
            self.try_traceback_functions(id, &ids)?;
        }
        Ok(id)
    }

    pub fn traceback(&mut self, frames: &[FrameId], total_nframe: Option<u32>) -> TracebackId {
        let traceback = Traceback {
            frames: frames.into(),
            total_nframe,
        };
        if let Some(&id) = self.traceback_ids.get(&traceback) {
            return id;
        }
        let id = self.snapshot.tracebacks.len() as TracebackId;
        self.snapshot.tracebacks.push(traceback.clone());
        self.traceback_ids.insert(traceback, id);
        id
    }

    pub fn trace(&mut self, domain: u32, size: u64, traceback: TracebackId) {
        self.snapshot.traces.push(Trace { size, traceback });
        self.snapshot.domains.push(domain);
    }

    /// Adds an aggregate trace: `blocks` blocks of `size` bytes together. A builder takes
    /// either plain traces or aggregates, not both.
    pub fn aggregate(&mut self, domain: u32, size: u64, blocks: u64, traceback: TracebackId) {
        let n = self.snapshot.traces.len();
        let column = self.snapshot.blocks.get_or_insert_with(Vec::new);
        assert_eq!(column.len(), n, "aggregates and plain traces mixed");
        column.push(blocks);
        self.trace(domain, size, traceback);
    }

    /// Marks the snapshot as made of aggregates even if it has none (an empty peak).
    pub fn aggregates(&mut self) {
        if self.snapshot.traces.is_empty() {
            self.snapshot.blocks.get_or_insert_with(Vec::new);
        }
    }

    pub fn reserve_traces(&mut self, additional: usize) {
        self.snapshot.traces.reserve(additional);
    }

    /// As [`SnapshotBuilder::reserve_traces`], fallibly (domains are runs: nothing to reserve).
    pub fn try_reserve_traces(&mut self, additional: usize) -> crate::error::Result<()> {
        Ok(self.snapshot.traces.try_reserve_exact(additional)?)
    }

    /// Sets the retention reports (`None`: not captured).
    pub fn retention(&mut self, retention: Option<Vec<SiteRetention>>) {
        self.snapshot.retention = retention;
    }

    pub fn metadata(&mut self, metadata: Metadata) {
        self.snapshot.metadata = metadata;
    }

    /// Marks the snapshot as sampled at `interval` bytes (`None`: exact).
    pub fn sample_interval(&mut self, interval: Option<u64>) {
        self.snapshot.sample_interval = interval;
    }

    /// Sets the object kinds; `of_trace` must line up with the traces added.
    pub fn kinds(&mut self, kinds: Option<Kinds>) {
        self.snapshot.kinds = kinds;
    }

    pub fn finish(mut self) -> Snapshot {
        if !self.snapshot.traceback_functions.is_empty() {
            let n = self.snapshot.tracebacks.len();
            self.snapshot.traceback_functions.resize(n, Box::default());
        }
        self.snapshot
    }
}

/// One snapshot holding the traces of all `snapshots` (the processes of a capture), so that
/// its statistics sum them per site and its exports name the functions each one recorded.
/// Tables are rebuilt through one [`SnapshotBuilder`], so equal file names, frames, functions
/// and tracebacks from different snapshots become one entry each. The traces keep their
/// domains; metadata, peaks, object kinds and retention reports are not merged (they belong
/// to one process). Peak snapshots (aggregates) are the caller's to refuse.
pub fn merged(
    snapshots: &[&Snapshot],
    traceback_limit: u32,
    sample_interval: Option<u64>,
) -> crate::error::Result<Snapshot> {
    let mut b = SnapshotBuilder::new(traceback_limit);
    b.sample_interval(sample_interval);
    b.try_reserve_traces(snapshots.iter().map(|s| s.traces.len()).sum())?;
    let mut frames = Vec::new();
    for snapshot in snapshots {
        let mut tb_map = fallible::filled(snapshot.tracebacks.len(), 0)?;
        for (t, id) in tb_map.iter_mut().enumerate() {
            *id = b.try_copy_traceback(snapshot, t, &mut frames)?;
        }
        for (tr, domain) in snapshot.traces.iter().zip(snapshot.domains.iter()) {
            b.trace(domain, tr.size, tb_map[tr.traceback as usize]);
        }
    }
    let mut merged = b.finish();
    // Snapshots of one machine name files of that machine: the merge keeps it (its source
    // lines stay shown); inputs from several machines, or none recorded, give none.
    merged.metadata.machine = snapshots
        .first()
        .and_then(|s| s.metadata.machine.clone())
        .filter(|m| {
            snapshots
                .iter()
                .all(|s| s.metadata.machine.as_ref() == Some(m))
        });
    Ok(merged)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_keeps_function_names_and_shares_tables() {
        let mut a = SnapshotBuilder::new(2);
        let fa = a.filename(b"app.py");
        let frame = a.frame(fa, 7);
        let t = a.traceback(&[frame], None);
        let work = a.function(b"work", 5);
        a.traceback_functions(t, &[Some(work)]);
        a.trace(0, 100, t);
        let a = a.finish();
        let mut b = SnapshotBuilder::new(2);
        let other = b.filename(b"other.py");
        let fb = b.filename(b"app.py");
        let f1 = b.frame(other, 1);
        let f2 = b.frame(fb, 7);
        let t1 = b.traceback(&[f1], None);
        let t2 = b.traceback(&[f2], None);
        b.trace(0, 10, t1);
        b.trace(2, 30, t2);
        let b = b.finish();
        let m = merged(&[&a, &b], 2, None).unwrap();
        assert_eq!(m.filenames.len(), 2);
        assert_eq!(m.tracebacks.len(), 2);
        let sizes: Vec<_> = m.traces.iter().map(|t| (t.size, t.traceback)).collect();
        assert_eq!(sizes, [(100, 0), (10, 1), (30, 0)]);
        assert_eq!(m.domains.iter().collect::<Vec<_>>(), [0, 0, 2]);
        // app.py:7 keeps the function its first snapshot recorded; other.py:1 knows none.
        assert_eq!(m.functions.len(), 1);
        assert_eq!(&*m.traceback_functions[0], &[Some(0)]);
        assert!(m.traceback_functions[1].is_empty());
    }

    #[test]
    fn traces_take_twelve_bytes() {
        assert_eq!(std::mem::size_of::<Trace>(), 12);
    }

    #[test]
    fn domains_are_kept_as_maximal_runs() {
        type Runs = &'static [(u32, usize)];
        // (runs pushed, the runs kept)
        let cases: [(Runs, Runs); 6] = [
            (&[], &[]),
            (&[(0, 0)], &[]),
            (&[(0, 3)], &[(0, 3)]),
            (&[(0, 2), (0, 1), (5, 0), (0, 4)], &[(0, 7)]),
            (&[(0, 2), (7, 1), (0, 3)], &[(0, 2), (7, 1), (0, 3)]),
            (
                &[(u32::MAX, 1), (0, 0), (u32::MAX, 2), (1, 1)],
                &[(u32::MAX, 3), (1, 1)],
            ),
        ];
        for (pushed, kept) in cases {
            let mut d = Domains::default();
            pushed.iter().for_each(|&(domain, n)| d.push_run(domain, n));
            assert_eq!(d.runs().collect::<Vec<_>>(), kept, "{pushed:?}");
            let each: Vec<u32> = kept
                .iter()
                .flat_map(|&(domain, n)| std::iter::repeat_n(domain, n))
                .collect();
            assert_eq!(d.len(), each.len());
            assert_eq!(d.iter().collect::<Vec<_>>(), each);
            for (i, &domain) in each.iter().enumerate() {
                assert_eq!(d.get(i), domain, "trace {i} of {pushed:?}");
            }
            // Built one trace at a time, the same runs: equal domains compare equal.
            assert_eq!(each.into_iter().collect::<Domains>(), d);
        }
    }

    #[test]
    fn interning_shares_ids() {
        let mut b = SnapshotBuilder::new(2);
        let a = b.filename(b"a.py");
        assert_eq!(b.filename(b"a.py"), a);
        let f1 = b.frame(a, 2);
        assert_eq!(b.frame(a, 2), f1);
        let f2 = b.frame(a, 3);
        assert_ne!(f1, f2);
        let t1 = b.traceback(&[f1, f2], Some(3));
        assert_eq!(b.traceback(&[f1, f2], Some(3)), t1);
        assert_ne!(b.traceback(&[f1, f2], Some(4)), t1);
        b.trace(0, 10, t1);
        let s = b.finish();
        assert_eq!(s.filenames.len(), 1);
        assert_eq!(s.frames.len(), 2);
        assert_eq!(s.tracebacks.len(), 2);
        assert_eq!(s.frame_filename(f2), b"a.py");
        assert!(s.traceback_functions.is_empty());
        assert_eq!(s.function(t1, 0), None);
    }

    #[test]
    fn first_functions_seen_name_a_traceback() {
        let mut b = SnapshotBuilder::new(1);
        let a = b.filename(b"a.py");
        let (f1, f2) = (b.frame(a, 1), b.frame(a, 2));
        let fill = b.function(b"fill", 1);
        let comp = b.function(b"fill.<locals>.<listcomp>", 2);
        assert_eq!(b.function(b"fill", 1), fill);
        // One line in two functions: the comprehension runs on its parent's line.
        let t1 = b.traceback(&[f2, f2, f1], None);
        b.traceback_functions(t1, &[Some(comp), Some(fill), None]);
        b.traceback_functions(t1, &[None, None, None]);
        let t2 = b.traceback(&[f1], None);
        let t3 = b.traceback(&[f2], None);
        b.traceback_functions(t2, &[Some(fill)]);
        let s = b.finish();
        // Padded to one entry per traceback; functions interned once.
        assert_eq!(s.traceback_functions.len(), 3);
        assert_eq!(s.functions.len(), 2);
        assert_eq!(
            s.function(t1, 0).unwrap().name[..],
            b"fill.<locals>.<listcomp>"[..]
        );
        assert_eq!(s.function(t1, 1).unwrap().name[..], b"fill"[..]);
        assert_eq!(s.function(t1, 2), None);
        assert_eq!(s.function(t2, 0).unwrap().first_lineno, 1);
        assert_eq!(s.function(t3, 0), None);
    }
}
