//! `Snapshot.statistics` and `Snapshot.compare_to`: grouping by traceback, line or file
//! (optionally cumulative), or by object kind alone or per line (`'type'`, `'lineno+type'`,
//! snapshots taken with `objects=True`), diffing two snapshots, and sorting exactly as
//! `tracemalloc` sorts.
//!
//! A sampled snapshot's rows are estimates: each trace counts with its sampling weight
//! ([`crate::analysis::sampling`]), and counts are rounded per row. Comparing a sampled
//! snapshot with an exact one (or two sampled at different intervals) is allowed: both sides
//! estimate the same true totals, so the difference is an estimate of the true change.
//!
//! Traces are first summed per interned traceback (one pass, an index lookup per trace); keys
//! are then derived once per traceback. Keys hold resolved contents (filename bytes, line), so
//! they compare correctly across snapshots and regardless of how a snapshot's tables were
//! interned.

use hashbrown::HashMap;
use std::cmp::Ordering;

use crate::analysis::sampling::{count_from_units, Weights};
use crate::analysis::snapshot::{FilenameId, FrameId, Snapshot, TracebackId};
use crate::error::{Error, Result};
use crate::platform::fallible;

/// What statistics are grouped by, as `tracemalloc`'s `key_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyType {
    Traceback,
    Lineno,
    Filename,
    /// Object kind (`'type'`): what the blocks are, wherever they were allocated.
    Type,
    /// Most recent line and object kind (`'lineno+type'`).
    LinenoType,
}

/// The error for kind keys on a snapshot without object kinds.
pub const NO_KINDS: &str = "this snapshot has no object kinds: take the snapshot with \
     take_snapshot(objects=True) (or run with ALLOCTRACE_OBJECTS=1) to group by 'type' or \
     'lineno+type'";

impl KeyType {
    /// Whether the key groups by object kind (and so needs a snapshot with kinds).
    pub fn uses_kinds(self) -> bool {
        matches!(self, KeyType::Type | KeyType::LinenoType)
    }

    /// Checks that `snapshot` has what grouping by this key needs.
    pub fn check(self, snapshot: &Snapshot) -> Result<()> {
        if self.uses_kinds() && snapshot.kinds.is_none() {
            return Err(Error::InvalidArgument(NO_KINDS.into()));
        }
        Ok(())
    }

    /// Parses `key_type` and checks it against `cumulative` with `tracemalloc`'s messages.
    pub fn parse(key_type: &str, cumulative: bool) -> Result<Self> {
        let key = match key_type {
            "traceback" => KeyType::Traceback,
            "lineno" => KeyType::Lineno,
            "filename" => KeyType::Filename,
            "type" => KeyType::Type,
            "lineno+type" => KeyType::LinenoType,
            other => {
                return Err(Error::InvalidArgument(format!(
                    "unknown key_type: {}",
                    py_repr_str(other)
                )));
            }
        };
        // Cumulative kinds have no single obvious meaning (a block has one kind but many
        // frames), so they are refused rather than guessed.
        if cumulative
            && matches!(
                key,
                KeyType::Traceback | KeyType::Type | KeyType::LinenoType
            )
        {
            return Err(Error::InvalidArgument(format!(
                "cumulative mode cannot by used with key type {}",
                py_repr_str(key_type)
            )));
        }
        Ok(key)
    }
}

/// `repr()` of a plain string as Python writes it (the error message quotes the key).
fn py_repr_str(s: &str) -> String {
    if s.contains('\'') && !s.contains('"') {
        format!("\"{s}\"")
    } else {
        format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"))
    }
}

/// What a statistic groups by, as ids into the snapshot it came from (filenames and frames
/// are unique by content within a snapshot, see [`Snapshot`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GroupKey {
    /// The frames of this traceback (its `total_nframe` is not part of the key).
    Traceback(TracebackId),
    /// One frame: `(filename, lineno)`.
    Frame(FrameId),
    /// One file: `(filename, 0)`.
    Filename(FilenameId),
    /// The key of an empty traceback: no frames.
    Empty,
    /// An object kind (index into the snapshot's kind names), no frames.
    Kind(u32),
    /// A most recent frame (`None`: empty traceback) and an object kind.
    LineKind(Option<FrameId>, u32),
}

/// The kind name a key groups by, if it groups by kind.
pub fn key_kind(snapshot: &Snapshot, key: GroupKey) -> Option<&[u8]> {
    let id = match key {
        GroupKey::Kind(k) | GroupKey::LineKind(_, k) => k,
        _ => return None,
    };
    Some(&snapshot.kinds.as_ref()?.names[id as usize])
}

/// A key's frames, most recent first, resolved to `(filename bytes, lineno)`.
pub fn key_frames(snapshot: &Snapshot, key: GroupKey) -> KeyFrames<'_> {
    let one = |f: FrameId| {
        let fr = snapshot.frames[f as usize];
        (&snapshot.filenames[fr.filename as usize][..], fr.lineno)
    };
    match key {
        GroupKey::Traceback(t) => {
            KeyFrames::Frames(snapshot, snapshot.tracebacks[t as usize].frames.iter())
        }
        GroupKey::Frame(f) => KeyFrames::One(Some(one(f))),
        GroupKey::Filename(n) => KeyFrames::One(Some((&snapshot.filenames[n as usize][..], 0))),
        GroupKey::Empty | GroupKey::Kind(_) | GroupKey::LineKind(None, _) => KeyFrames::One(None),
        GroupKey::LineKind(Some(f), _) => KeyFrames::One(Some(one(f))),
    }
}

/// Iterator returned by [`key_frames`].
pub enum KeyFrames<'a> {
    Frames(&'a Snapshot, std::slice::Iter<'a, FrameId>),
    One(Option<(&'a [u8], u32)>),
}

impl<'a> KeyFrames<'a> {
    fn resolve(snapshot: &'a Snapshot, f: FrameId) -> (&'a [u8], u32) {
        let fr = snapshot.frames[f as usize];
        (&snapshot.filenames[fr.filename as usize][..], fr.lineno)
    }
}

impl<'a> Iterator for KeyFrames<'a> {
    type Item = (&'a [u8], u32);

    fn next(&mut self) -> Option<Self::Item> {
        match self {
            KeyFrames::Frames(s, it) => it.next().map(|&f| Self::resolve(s, f)),
            KeyFrames::One(one) => one.take(),
        }
    }
}

impl DoubleEndedIterator for KeyFrames<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        match self {
            KeyFrames::Frames(s, it) => it.next_back().map(|&f| Self::resolve(s, f)),
            KeyFrames::One(one) => one.take(),
        }
    }
}

/// A key by content, to match keys across snapshots.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Content<'a> {
    One(&'a [u8], u32),
    Many(Vec<(&'a [u8], u32)>),
    Kind(Option<(&'a [u8], u32)>, &'a [u8]),
}

fn content(snapshot: &Snapshot, key: GroupKey) -> Result<Content<'_>> {
    if let Some(kind) = key_kind(snapshot, key) {
        return Ok(Content::Kind(key_frames(snapshot, key).next(), kind));
    }
    Ok(match key {
        GroupKey::Traceback(_) | GroupKey::Empty => {
            let frames = key_frames(snapshot, key);
            let mut all = fallible::with_capacity(frames.size_hint().0)?;
            all.extend(frames);
            Content::Many(all)
        }
        _ => {
            let (name, line) = key_frames(snapshot, key).next().expect("one frame");
            Content::One(name, line)
        }
    })
}

/// `Traceback` ordering of two keys: the oldest-first tuples of `(filename, lineno)` compared
/// lexicographically (keys list frames most recent first, hence the reversal). Filename bytes
/// compare as the Python strings do (surrogatepass UTF-8 keeps code point order).
pub fn cmp_keys(a: (&Snapshot, GroupKey), b: (&Snapshot, GroupKey)) -> Ordering {
    if std::ptr::eq(a.0, b.0) && a.1 == b.1 {
        return Ordering::Equal;
    }
    key_frames(a.0, a.1)
        .rev()
        .cmp(key_frames(b.0, b.1).rev())
        .then_with(|| key_kind(a.0, a.1).cmp(&key_kind(b.0, b.1)))
}

/// One row of `statistics()`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stat {
    pub key: GroupKey,
    pub size: u128,
    pub count: u64,
}

/// One row of `compare_to()`; `in_new` says which snapshot `key` belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatDiff {
    pub key: GroupKey,
    pub in_new: bool,
    pub size: u128,
    pub size_diff: i128,
    pub count: u64,
    pub count_diff: i64,
}

/// Adds `size`/`count` into the slot of an id, remembering first-seen order.
struct Accumulator {
    size: Vec<u128>,
    count: Vec<u64>,
    order: Vec<u32>,
}

impl Accumulator {
    fn new(n: usize) -> Result<Self> {
        Ok(Self {
            size: fallible::filled(n, 0)?,
            count: fallible::filled(n, 0)?,
            order: fallible::with_capacity(n)?,
        })
    }

    fn add(&mut self, id: u32, size: u128, count: u64) {
        let i = id as usize;
        if self.count[i] == 0 {
            self.order.push(id);
        }
        self.size[i] += size;
        self.count[i] += count;
    }

    /// One row per id seen, with room for one more (the empty-traceback row).
    fn rows(self, key: impl Fn(u32) -> GroupKey) -> Result<Vec<Stat>> {
        let mut rows = fallible::with_capacity(self.order.len() + 1)?;
        rows.extend(self.order.iter().map(|&id| Stat {
            key: key(id),
            size: self.size[id as usize],
            count: self.count[id as usize],
        }));
        Ok(rows)
    }
}

/// Groups a snapshot's traces; the order of the result is unspecified.
///
/// One pass over the traces sums them per traceback; keys are then derived per traceback and
/// summed into tables indexed by frame or filename id (no hashing), or, for traceback keys,
/// merged by frame list (tracebacks differing only by `total_nframe` group together).
pub fn group(snapshot: &Snapshot, key_type: KeyType, cumulative: bool) -> Result<Vec<Stat>> {
    let weights = Weights::new(snapshot.sample_interval);
    if key_type.uses_kinds() {
        return group_kinds(snapshot, key_type == KeyType::LinenoType);
    }
    let ntb = snapshot.tracebacks.len();
    let mut tb_size = fallible::filled(ntb, 0u128)?;
    let mut tb_count = fallible::filled(ntb, 0u64)?;
    // Counts in fixed point until the rows are made, unless every trace is one block.
    let units = !weights.is_exact() || snapshot.blocks.is_some();
    if !units {
        for tr in &snapshot.traces {
            let t = tr.traceback as usize;
            tb_size[t] += tr.size as u128;
            tb_count[t] += 1;
        }
    } else {
        for (tr, (bytes, count)) in snapshot.traces.iter().zip(snapshot.weighted()) {
            let t = tr.traceback as usize;
            tb_size[t] += bytes as u128;
            tb_count[t] += count;
        }
    }
    let live = (0..ntb).filter(|&t| tb_count[t] > 0);
    let mut empty = (0u128, 0u64);
    let mut rows = match (key_type, cumulative) {
        (KeyType::Type, _) | (KeyType::LinenoType, _) => unreachable!("grouped above"),
        (KeyType::Traceback, _) => {
            let mut index: HashMap<&[FrameId], usize> = HashMap::new();
            index.try_reserve(ntb)?;
            let mut rows: Vec<Stat> = fallible::with_capacity(ntb + 1)?;
            for t in live {
                let frames: &[FrameId] = &snapshot.tracebacks[t].frames;
                match index.get(frames) {
                    Some(&i) => {
                        rows[i].size += tb_size[t];
                        rows[i].count += tb_count[t];
                    }
                    None => {
                        index.insert(frames, rows.len());
                        rows.push(Stat {
                            key: GroupKey::Traceback(t as TracebackId),
                            size: tb_size[t],
                            count: tb_count[t],
                        });
                    }
                }
            }
            rows
        }
        (KeyType::Lineno, _) => {
            let mut acc = Accumulator::new(snapshot.frames.len())?;
            for t in live {
                let frames = &snapshot.tracebacks[t].frames;
                // Cumulative: every frame counts, a repeated frame as often as it appears.
                let used = if cumulative {
                    &frames[..]
                } else {
                    &frames[..frames.len().min(1)]
                };
                if used.is_empty() {
                    empty.0 += tb_size[t];
                    empty.1 += tb_count[t];
                }
                for &f in used {
                    acc.add(f, tb_size[t], tb_count[t]);
                }
            }
            acc.rows(GroupKey::Frame)?
        }
        (KeyType::Filename, _) => {
            let mut acc = Accumulator::new(snapshot.filenames.len())?;
            for t in live {
                let frames = &snapshot.tracebacks[t].frames;
                let used = if cumulative {
                    &frames[..]
                } else {
                    &frames[..frames.len().min(1)]
                };
                if used.is_empty() {
                    empty.0 += tb_size[t];
                    empty.1 += tb_count[t];
                }
                for &f in used {
                    acc.add(
                        snapshot.frames[f as usize].filename,
                        tb_size[t],
                        tb_count[t],
                    );
                }
            }
            acc.rows(GroupKey::Filename)?
        }
    };
    if empty.1 > 0 && !cumulative {
        rows.push(Stat {
            key: GroupKey::Empty,
            size: empty.0,
            count: empty.1,
        });
    }
    if units {
        for row in &mut rows {
            row.count = count_from_units(row.count);
        }
    }
    Ok(rows)
}

/// Groups by kind, or by (most recent frame, kind): a pass over the traces with their kind
/// column. A snapshot without kinds groups to nothing (callers check with
/// [`KeyType::check`] first and report [`NO_KINDS`]). Sampled traces count with their
/// weights, as in [`group`].
fn group_kinds(snapshot: &Snapshot, per_line: bool) -> Result<Vec<Stat>> {
    let Some(kinds) = &snapshot.kinds else {
        return Ok(Vec::new());
    };
    let mut index: HashMap<(Option<FrameId>, u32), usize> = HashMap::new();
    let mut rows: Vec<Stat> = Vec::new();
    let weighted = snapshot.weighted();
    for ((tr, &kind), (bytes, count)) in snapshot.traces.iter().zip(&kinds.of_trace).zip(weighted) {
        let frame = if per_line {
            snapshot.tracebacks[tr.traceback as usize]
                .frames
                .first()
                .copied()
        } else {
            None
        };
        if index.len() == index.capacity() {
            index.try_reserve(index.len().max(16))?;
        }
        rows.try_reserve(1)?;
        let i = *index.entry((frame, kind)).or_insert_with(|| {
            rows.push(Stat {
                key: if per_line {
                    GroupKey::LineKind(frame, kind)
                } else {
                    GroupKey::Kind(kind)
                },
                size: 0,
                count: 0,
            });
            rows.len() - 1
        });
        rows[i].size += bytes as u128;
        rows[i].count += count;
    }
    for row in &mut rows {
        row.count = count_from_units(row.count);
    }
    Ok(rows)
}

/// `Snapshot.statistics`: grouped and sorted by (size, count, traceback), largest first.
pub fn statistics(snapshot: &Snapshot, key_type: KeyType, cumulative: bool) -> Result<Vec<Stat>> {
    let mut stats = group(snapshot, key_type, cumulative)?;
    stats.sort_unstable_by(|a, b| {
        b.size
            .cmp(&a.size)
            .then(b.count.cmp(&a.count))
            .then_with(|| cmp_keys((snapshot, b.key), (snapshot, a.key)))
    });
    Ok(stats)
}

/// `Snapshot.compare_to`: `new` against `old`, keys matched by content, sorted by
/// (|size_diff|, size, |count_diff|, count, traceback), largest first.
pub fn compare(
    new: &Snapshot,
    old: &Snapshot,
    key_type: KeyType,
    cumulative: bool,
) -> Result<Vec<StatDiff>> {
    let new_stats = group(new, key_type, cumulative)?;
    let old_stats = group(old, key_type, cumulative)?;
    let mut old_index: HashMap<Content<'_>, usize> = HashMap::new();
    old_index.try_reserve(old_stats.len())?;
    for (i, s) in old_stats.iter().enumerate() {
        old_index.insert(content(old, s.key)?, i);
    }
    let mut seen_old = fallible::filled(old_stats.len(), false)?;
    let mut diffs = fallible::with_capacity(new_stats.len() + old_stats.len())?;
    for s in &new_stats {
        let (size_diff, count_diff) = match old_index.remove(&content(new, s.key)?) {
            Some(i) => {
                seen_old[i] = true;
                let o = &old_stats[i];
                (
                    s.size as i128 - o.size as i128,
                    s.count as i64 - o.count as i64,
                )
            }
            None => (s.size as i128, s.count as i64),
        };
        diffs.push(StatDiff {
            key: s.key,
            in_new: true,
            size: s.size,
            size_diff,
            count: s.count,
            count_diff,
        });
    }
    for (o, seen) in old_stats.iter().zip(seen_old) {
        if !seen {
            diffs.push(StatDiff {
                key: o.key,
                in_new: false,
                size: 0,
                size_diff: -(o.size as i128),
                count: 0,
                count_diff: -(o.count as i64),
            });
        }
    }
    let side = |d: &StatDiff| (if d.in_new { new } else { old }, d.key);
    diffs.sort_unstable_by(|a, b| {
        b.size_diff
            .unsigned_abs()
            .cmp(&a.size_diff.unsigned_abs())
            .then(b.size.cmp(&a.size))
            .then(
                b.count_diff
                    .unsigned_abs()
                    .cmp(&a.count_diff.unsigned_abs()),
            )
            .then(b.count.cmp(&a.count))
            .then_with(|| cmp_keys(side(b), side(a)))
    });
    Ok(diffs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::snapshot::SnapshotBuilder;

    #[test]
    fn sampled_snapshots_report_weighted_estimates() {
        let interval = 1024;
        let w = Weights::new(Some(interval));
        // (size, line): three small blocks on line 1, one large on line 2.
        let traces: &[(u64, u32)] = &[(100, 1), (100, 1), (50, 1), (1 << 20, 2)];
        let raw: Vec<Raw<'_>> = traces
            .iter()
            .map(|&(size, line)| {
                let frames: &[(&str, u32)] = if line == 1 {
                    &[("a.py", 1)]
                } else {
                    &[("a.py", 2)]
                };
                (0, size, frames)
            })
            .collect();
        let mut s = build(&raw);
        let exact = s.clone();
        s.sample_interval = Some(interval);
        let rows = statistics(&s, KeyType::Lineno, false).unwrap();
        let small_bytes = 2 * w.bytes(100) + w.bytes(50);
        let small_units = 2 * w.count_units(100) + w.count_units(50);
        // The small blocks stand for many more bytes than they hold; the large one for itself.
        assert_eq!(
            rows.iter().map(|r| (r.size, r.count)).collect::<Vec<_>>(),
            vec![
                (1 << 20, 1),
                (small_bytes as u128, count_from_units(small_units))
            ]
        );
        assert!(small_bytes > 10 * 250, "{small_bytes}");
        // Sampled against exact: the difference of the estimate and the exact figure.
        let diffs = compare(&s, &exact, KeyType::Lineno, false).unwrap();
        let small = diffs.iter().find(|d| d.size != 1 << 20).unwrap();
        assert_eq!(small.size_diff, small_bytes as i128 - 250);
        assert_eq!(small.count_diff, count_from_units(small_units) as i64 - 3);
        let large = diffs.iter().find(|d| d.size == 1 << 20).unwrap();
        assert_eq!((large.size_diff, large.count_diff), (0, 0));
    }

    #[test]
    fn aggregate_traces_count_their_blocks_and_are_not_reweighted() {
        for interval in [None, Some(4096)] {
            let mut b = SnapshotBuilder::new(1);
            let a = b.filename(b"a.py");
            let (f1, f2) = (b.frame(a, 1), b.frame(a, 2));
            let (t1, t2, t3) = (
                b.traceback(&[f1], None),
                b.traceback(&[f2], Some(1)),
                b.traceback(&[f2], Some(2)),
            );
            b.aggregate(0, 1000, 7, t1);
            b.aggregate(0, 64, 2, t2);
            b.aggregate(0, 36, 1, t3);
            b.sample_interval(interval);
            let s = b.finish();
            let rows: Vec<(u128, u64)> = statistics(&s, KeyType::Lineno, false)
                .unwrap()
                .iter()
                .map(|r| (r.size, r.count))
                .collect();
            assert_eq!(rows, vec![(1000, 7), (100, 3)], "{interval:?}");
        }
    }

    #[test]
    fn sampled_snapshots_weight_kinds_too() {
        let interval = 1024;
        let w = Weights::new(Some(interval));
        let raw: Vec<Raw<'_>> = [100u64, 100, 1 << 20]
            .iter()
            .map(|&size| (0, size, &[("a.py", 1)][..]))
            .collect();
        let mut s = with_kinds(build(&raw), &["dict", "bytes"], &[0, 0, 1]);
        s.sample_interval = Some(interval);
        for key in [KeyType::Type, KeyType::LinenoType] {
            let rows: Vec<(u128, u64)> = statistics(&s, key, false)
                .unwrap()
                .iter()
                .map(|r| (r.size, r.count))
                .collect();
            assert_eq!(
                rows,
                vec![
                    (1 << 20, 1),
                    (
                        2 * w.bytes(100) as u128,
                        count_from_units(2 * w.count_units(100))
                    )
                ],
                "{key:?}"
            );
        }
    }

    type Raw<'a> = (u32, u64, &'a [(&'a str, u32)]);

    fn build(traces: &[Raw<'_>]) -> Snapshot {
        let mut b = SnapshotBuilder::new(2);
        for &(domain, size, frames) in traces {
            let ids: Vec<u32> = frames
                .iter()
                .map(|&(n, l)| {
                    let f = b.filename(n.as_bytes());
                    b.frame(f, l)
                })
                .collect();
            let tb = b.traceback(&ids, Some(frames.len() as u32));
            b.trace(domain, size, tb);
        }
        b.finish()
    }

    fn with_kinds(mut s: Snapshot, names: &[&str], of_trace: &[u32]) -> Snapshot {
        s.kinds = Some(crate::analysis::snapshot::Kinds {
            names: names.iter().map(|n| n.as_bytes().into()).collect(),
            of_trace: of_trace.to_vec(),
        });
        s
    }

    fn kind_rows(s: &Snapshot, stats: &[Stat]) -> Vec<(String, u128, u64)> {
        stats
            .iter()
            .map(|st| {
                let line = key_frames(s, st.key)
                    .next()
                    .map(|(n, l)| format!("{}:{l} ", String::from_utf8_lossy(n)))
                    .unwrap_or_default();
                let kind = String::from_utf8_lossy(key_kind(s, st.key).unwrap()).into_owned();
                (format!("{line}{kind}"), st.size, st.count)
            })
            .collect()
    }

    #[test]
    fn grouping_by_kind_and_by_line_and_kind() {
        // first(): traces 10,10,10 @a.py:2; 2 @a.py:5; 66 @b.py:1; 7 @<unknown>:0
        let s = with_kinds(
            first(),
            &["dict", "list (items)", "raw"],
            &[0, 0, 1, 0, 1, 2],
        );
        type Row = (&'static str, u128, u64);
        let table: &[(KeyType, &[Row])] = &[
            (
                KeyType::Type,
                &[("list (items)", 76, 2), ("dict", 22, 3), ("raw", 7, 1)],
            ),
            (
                KeyType::LinenoType,
                &[
                    ("b.py:1 list (items)", 66, 1),
                    ("a.py:2 dict", 20, 2),
                    ("a.py:2 list (items)", 10, 1),
                    ("<unknown>:0 raw", 7, 1),
                    ("a.py:5 dict", 2, 1),
                ],
            ),
        ];
        for &(key, want) in table {
            let got = kind_rows(&s, &statistics(&s, key, false).unwrap());
            let want: Vec<_> = want
                .iter()
                .map(|&(k, sz, c)| (k.to_string(), sz, c))
                .collect();
            assert_eq!(got, want, "{key:?}");
        }
    }

    #[test]
    fn kinds_compare_by_name_across_snapshots_and_need_kinds() {
        // Names interned in a different order in each snapshot still match by content.
        let old = with_kinds(first(), &["raw", "dict"], &[1, 1, 1, 1, 1, 0]);
        let new = with_kinds(second(), &["dict", "bytes"], &[0, 0, 0, 0, 1, 1]);
        let got: Vec<(String, i128, i64)> = compare(&new, &old, KeyType::Type, false)
            .unwrap()
            .iter()
            .map(|d| {
                let side = if d.in_new { &new } else { &old };
                let kind = String::from_utf8_lossy(key_kind(side, d.key).unwrap()).into_owned();
                (kind, d.size_diff, d.count_diff)
            })
            .collect();
        assert_eq!(
            got,
            vec![
                ("bytes".to_string(), 5400, 2),
                ("dict".to_string(), -66, -1),
                ("raw".to_string(), -7, -1),
            ]
        );
        let plain = first();
        assert!(KeyType::Type
            .check(&plain)
            .unwrap_err()
            .to_string()
            .contains("objects=True"));
        assert!(KeyType::Lineno.check(&plain).is_ok());
        assert!(KeyType::parse("type", true).is_err());
        assert!(KeyType::parse("lineno+type", true).is_err());
        assert_eq!(
            KeyType::parse("lineno+type", false).unwrap(),
            KeyType::LinenoType
        );
    }

    fn first() -> Snapshot {
        build(&[
            (0, 10, &[("a.py", 2), ("b.py", 4)]),
            (0, 10, &[("a.py", 2), ("b.py", 4)]),
            (0, 10, &[("a.py", 2), ("b.py", 4)]),
            (1, 2, &[("a.py", 5), ("b.py", 4)]),
            (2, 66, &[("b.py", 1)]),
            (3, 7, &[("<unknown>", 0)]),
        ])
    }

    fn second() -> Snapshot {
        build(&[
            (0, 10, &[("a.py", 2), ("b.py", 4)]),
            (0, 10, &[("a.py", 2), ("b.py", 4)]),
            (0, 10, &[("a.py", 2), ("b.py", 4)]),
            (2, 2, &[("a.py", 5), ("b.py", 4)]),
            (2, 5000, &[("a.py", 5), ("b.py", 4)]),
            (4, 400, &[("c.py", 578)]),
        ])
    }

    fn rows(snapshot: &Snapshot, stats: &[Stat]) -> Vec<(String, u128, u64)> {
        stats
            .iter()
            .map(|s| (key_text(snapshot, s.key), s.size, s.count))
            .collect()
    }

    fn key_text(snapshot: &Snapshot, key: GroupKey) -> String {
        key_frames(snapshot, key)
            .map(|(n, l)| format!("{}:{l}", String::from_utf8_lossy(n)))
            .collect::<Vec<_>>()
            .join(",")
    }

    #[test]
    fn statistics_table() {
        let s = first();
        type Case<'k> = (KeyType, bool, Vec<(&'k str, u128, u64)>);
        let cases: Vec<Case<'_>> = vec![
            (
                KeyType::Lineno,
                false,
                vec![
                    ("b.py:1", 66, 1),
                    ("a.py:2", 30, 3),
                    ("<unknown>:0", 7, 1),
                    ("a.py:5", 2, 1),
                ],
            ),
            (
                KeyType::Filename,
                false,
                vec![("b.py:0", 66, 1), ("a.py:0", 32, 4), ("<unknown>:0", 7, 1)],
            ),
            (
                KeyType::Traceback,
                false,
                vec![
                    ("b.py:1", 66, 1),
                    ("a.py:2,b.py:4", 30, 3),
                    ("<unknown>:0", 7, 1),
                    ("a.py:5,b.py:4", 2, 1),
                ],
            ),
            (
                KeyType::Filename,
                true,
                vec![("b.py:0", 98, 5), ("a.py:0", 32, 4), ("<unknown>:0", 7, 1)],
            ),
            (
                KeyType::Lineno,
                true,
                vec![
                    ("b.py:1", 66, 1),
                    ("b.py:4", 32, 4),
                    ("a.py:2", 30, 3),
                    ("<unknown>:0", 7, 1),
                    ("a.py:5", 2, 1),
                ],
            ),
        ];
        for (key, cumulative, expected) in cases {
            let got = rows(&s, &statistics(&s, key, cumulative).unwrap());
            let expected: Vec<(String, u128, u64)> = expected
                .into_iter()
                .map(|(k, s, c)| (k.to_string(), s, c))
                .collect();
            assert_eq!(got, expected, "{key:?} cumulative={cumulative}");
        }
    }

    #[test]
    fn compare_table() {
        let (old, new) = (first(), second());
        let got: Vec<(String, u128, i128, u64, i64)> = compare(&new, &old, KeyType::Lineno, false)
            .unwrap()
            .iter()
            .map(|d| {
                let snap = if d.in_new { &new } else { &old };
                (
                    key_text(snap, d.key),
                    d.size,
                    d.size_diff,
                    d.count,
                    d.count_diff,
                )
            })
            .collect();
        let expected = vec![
            ("a.py:5", 5002, 5000, 2, 1),
            ("c.py:578", 400, 400, 1, 1),
            ("b.py:1", 0, -66, 0, -1),
            ("<unknown>:0", 0, -7, 0, -1),
            ("a.py:2", 30, 0, 3, 0),
        ];
        let expected: Vec<_> = expected
            .into_iter()
            .map(|(k, a, b, c, d)| (k.to_string(), a, b, c, d))
            .collect();
        assert_eq!(got, expected);
    }

    #[test]
    fn ties_fall_back_to_traceback_order() {
        // Equal size and count: larger traceback (oldest frame first) sorts first.
        let s = build(&[
            (0, 5, &[("b.py", 1)]),
            (0, 5, &[("a.py", 9)]),
            (0, 5, &[("a.py", 10)]),
            (0, 5, &[("x.py", 1), ("a.py", 1)]),
            (0, 5, &[("a.py", 1)]),
        ]);
        let got: Vec<String> = statistics(&s, KeyType::Traceback, false)
            .unwrap()
            .iter()
            .map(|st| key_text(&s, st.key))
            .collect();
        assert_eq!(
            got,
            ["b.py:1", "a.py:10", "a.py:9", "x.py:1,a.py:1", "a.py:1"]
        );
    }

    #[test]
    fn recursion_counts_every_frame_and_total_nframe_is_not_a_key() {
        let mut b = SnapshotBuilder::new(3);
        let a = b.filename(b"a.py");
        let f = b.frame(a, 1);
        let t1 = b.traceback(&[f, f], Some(2));
        let t2 = b.traceback(&[f, f], Some(7));
        b.trace(0, 3, t1);
        b.trace(0, 4, t2);
        let s = b.finish();
        assert_eq!(
            rows(&s, &statistics(&s, KeyType::Lineno, true).unwrap()),
            vec![("a.py:1".into(), 14, 4)]
        );
        assert_eq!(
            rows(&s, &statistics(&s, KeyType::Traceback, false).unwrap()),
            vec![("a.py:1,a.py:1".into(), 7, 2)]
        );
    }

    #[test]
    fn key_type_errors() {
        assert!(KeyType::parse("lineno", true).is_ok());
        let e = KeyType::parse("bogus", false).unwrap_err().to_string();
        assert_eq!(e, "unknown key_type: 'bogus'");
        let e = KeyType::parse("traceback", true).unwrap_err().to_string();
        assert_eq!(
            e,
            "cumulative mode cannot by used with key type 'traceback'"
        );
    }
}
