//! `Snapshot.statistics` and `Snapshot.compare_to`: grouping by traceback, line or file
//! (optionally cumulative), diffing two snapshots, and sorting exactly as `tracemalloc` sorts.
//!
//! Traces are first summed per interned traceback (one pass, an index lookup per trace); keys
//! are then derived once per traceback. Keys hold resolved contents (filename bytes, line), so
//! they compare correctly across snapshots and regardless of how a snapshot's tables were
//! interned.

use std::cmp::Ordering;
use std::collections::HashMap;

use crate::analysis::snapshot::Snapshot;
use crate::error::{Error, Result};

/// What statistics are grouped by, as `tracemalloc`'s `key_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyType {
    Traceback,
    Lineno,
    Filename,
}

impl KeyType {
    /// Parses `key_type` and checks it against `cumulative` with `tracemalloc`'s messages.
    pub fn parse(key_type: &str, cumulative: bool) -> Result<Self> {
        let key = match key_type {
            "traceback" => KeyType::Traceback,
            "lineno" => KeyType::Lineno,
            "filename" => KeyType::Filename,
            other => {
                return Err(Error::InvalidArgument(format!(
                    "unknown key_type: {}",
                    py_repr_str(other)
                )));
            }
        };
        if cumulative && key == KeyType::Traceback {
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

/// A group key: frames most recent first, as `(filename, lineno)`. For `Lineno` and `Filename`
/// keys it holds one frame (lineno 0 for `Filename`), or none for an empty traceback.
pub type Key<'a> = Vec<(&'a [u8], u32)>;

/// One row of `statistics()`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stat<'a> {
    pub key: Key<'a>,
    pub size: u128,
    pub count: u64,
}

/// One row of `compare_to()`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatDiff<'a> {
    pub key: Key<'a>,
    pub size: u128,
    pub size_diff: i128,
    pub count: u64,
    pub count_diff: i64,
}

/// `Traceback` ordering: the oldest-first tuples of `(filename, lineno)` compared
/// lexicographically. Keys are stored most recent first, hence the reversal; filename bytes
/// compare as the Python strings do (surrogatepass UTF-8 keeps code point order).
pub fn cmp_keys(a: &Key<'_>, b: &Key<'_>) -> Ordering {
    a.iter().rev().cmp(b.iter().rev())
}

/// Groups a snapshot's traces; the order of the result is unspecified.
pub fn group<'a>(snapshot: &'a Snapshot, key_type: KeyType, cumulative: bool) -> Vec<Stat<'a>> {
    let ntb = snapshot.tracebacks.len();
    let mut tb_size = vec![0u128; ntb];
    let mut tb_count = vec![0u64; ntb];
    for tr in &snapshot.traces {
        let t = tr.traceback as usize;
        tb_size[t] += tr.size as u128;
        tb_count[t] += 1;
    }
    let frame = |f: u32, with_line: bool| {
        let fr = snapshot.frames[f as usize];
        let line = if with_line { fr.lineno } else { 0 };
        (&snapshot.filenames[fr.filename as usize][..], line)
    };
    let mut index: HashMap<Key<'a>, usize> = HashMap::new();
    let mut stats: Vec<Stat<'a>> = Vec::new();
    let mut add = |key: Key<'a>, size: u128, count: u64| match index.get(&key) {
        Some(&i) => {
            stats[i].size += size;
            stats[i].count += count;
        }
        None => {
            index.insert(key.clone(), stats.len());
            stats.push(Stat { key, size, count });
        }
    };
    for (t, tb) in snapshot.tracebacks.iter().enumerate() {
        if tb_count[t] == 0 {
            continue;
        }
        let (size, count) = (tb_size[t], tb_count[t]);
        if cumulative {
            // Every frame counts, a frame repeated in one traceback as often as it appears.
            let with_line = key_type == KeyType::Lineno;
            for &f in tb.frames.iter() {
                add(vec![frame(f, with_line)], size, count);
            }
        } else {
            let key: Key<'a> = match key_type {
                KeyType::Traceback => tb.frames.iter().map(|&f| frame(f, true)).collect(),
                KeyType::Lineno => tb
                    .frames
                    .first()
                    .map(|&f| frame(f, true))
                    .into_iter()
                    .collect(),
                KeyType::Filename => tb
                    .frames
                    .first()
                    .map(|&f| frame(f, false))
                    .into_iter()
                    .collect(),
            };
            add(key, size, count);
        }
    }
    stats
}

/// `Snapshot.statistics`: grouped and sorted by (size, count, traceback), largest first.
pub fn statistics(snapshot: &Snapshot, key_type: KeyType, cumulative: bool) -> Vec<Stat<'_>> {
    let mut stats = group(snapshot, key_type, cumulative);
    stats.sort_unstable_by(|a, b| {
        b.size
            .cmp(&a.size)
            .then(b.count.cmp(&a.count))
            .then_with(|| cmp_keys(&b.key, &a.key))
    });
    stats
}

/// `Snapshot.compare_to`: `new` against `old`, keys matched by content, sorted by
/// (|size_diff|, size, |count_diff|, count, traceback), largest first.
pub fn compare<'a>(
    new: &'a Snapshot,
    old: &'a Snapshot,
    key_type: KeyType,
    cumulative: bool,
) -> Vec<StatDiff<'a>> {
    let new_stats = group(new, key_type, cumulative);
    let old_stats = group(old, key_type, cumulative);
    let mut old_index: HashMap<&Key<'a>, usize> = old_stats
        .iter()
        .enumerate()
        .map(|(i, s)| (&s.key, i))
        .collect();
    let mut seen_old = vec![false; old_stats.len()];
    let mut diffs = Vec::with_capacity(new_stats.len() + old_stats.len());
    for s in &new_stats {
        let (size_diff, count_diff) = match old_index.remove(&s.key) {
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
            key: s.key.clone(),
            size: s.size,
            size_diff,
            count: s.count,
            count_diff,
        });
    }
    for (o, seen) in old_stats.iter().zip(seen_old) {
        if !seen {
            diffs.push(StatDiff {
                key: o.key.clone(),
                size: 0,
                size_diff: -(o.size as i128),
                count: 0,
                count_diff: -(o.count as i64),
            });
        }
    }
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
            .then_with(|| cmp_keys(&b.key, &a.key))
    });
    diffs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::snapshot::SnapshotBuilder;

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

    fn rows(stats: &[Stat<'_>]) -> Vec<(String, u128, u64)> {
        stats
            .iter()
            .map(|s| (key_text(&s.key), s.size, s.count))
            .collect()
    }

    fn key_text(key: &Key<'_>) -> String {
        key.iter()
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
            let got = rows(&statistics(&s, key, cumulative));
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
            .iter()
            .map(|d| (key_text(&d.key), d.size, d.size_diff, d.count, d.count_diff))
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
            .iter()
            .map(|s| key_text(&s.key))
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
            rows(&statistics(&s, KeyType::Lineno, true)),
            vec![("a.py:1".into(), 14, 4)]
        );
        assert_eq!(
            rows(&statistics(&s, KeyType::Traceback, false)),
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
