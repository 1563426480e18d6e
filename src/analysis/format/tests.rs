//! Tests of the format: round trips, and refusals of damaged or hostile files.

use std::fs;
use std::io::Write;
use std::path::Path;

use crate::analysis::sampling::MAX_INTERVAL;
use crate::analysis::snapshot::{Kinds, Metadata, SiteRetention, Snapshot, SnapshotBuilder, Trace};
use crate::error::Error;
use crate::platform::process_memory::ProcessMemory;

use super::columns::{decode_trace_columns, width_code, TraceColumns, COLUMN_BLOCK, WIDTHS};
use super::decode::MAX_TIMESTAMP;
use super::encode::{put_bytes, put_uleb, section, Encoder};
use super::file::{temp_path, READ_CHUNK};
use super::*;

/// The encoder, for tests of what it writes: memory does not run out here.
fn encode(snapshot: &Snapshot, attrs: &Attributes) -> Vec<u8> {
    super::encode(snapshot, attrs).unwrap()
}

fn sample() -> (Snapshot, Attributes) {
    let mut b = SnapshotBuilder::new(3);
    let a = b.filename(b"a.py");
    let s = b.filename(b"s\xed\xb3\xbf.py");
    let f1 = b.frame(a, 2);
    let f2 = b.frame(s, 70000);
    let t1 = b.traceback(&[f1, f2], Some(9));
    let t2 = b.traceback(&[f2], None);
    // t1's functions are known (but for its oldest frame), t2's are not.
    let m = b.function(b"Outer.m\xed\xb3\xbf", 1);
    b.traceback_functions(t1, &[Some(m), None]);
    b.trace(0, 10, t1);
    b.trace(0, 300, t2);
    b.trace(5, u64::MAX, t1);
    b.metadata(Metadata {
        python_version: Some((3, 11, 7)),
        timestamp: Some(1.5e9),
        pid: Some(42),
        argv: vec!["x.py".into(), "-v".into()],
        process_memory: None,
        machine: None,
    });
    let attrs = vec![
        (b"test_attr".to_vec(), AttrValue::Str(b"new".to_vec())),
        (
            b"nested".to_vec(),
            AttrValue::Dict(vec![(
                b"k".to_vec(),
                AttrValue::List(vec![
                    AttrValue::None,
                    AttrValue::Bool(true),
                    AttrValue::Int(-5),
                    AttrValue::Int(i64::MIN),
                    AttrValue::BigInt(vec![0, 0, 0, 0, 0, 0, 0, 0, 1]),
                    AttrValue::Float(0.25),
                    AttrValue::Bytes(vec![0, 255]),
                    AttrValue::Tuple(vec![]),
                ]),
            )]),
        ),
    ];
    (b.finish(), attrs)
}

fn with_kinds() -> Snapshot {
    let (mut s, _) = sample();
    s.kinds = Some(Kinds {
        names: vec![b"dict".to_vec().into(), b"list (items)".to_vec().into()],
        of_trace: vec![1, 0, 1],
    });
    s
}

#[test]
fn kinds_round_trip_and_old_files_load_without_them() {
    let s = with_kinds();
    let data = encode(&s, &vec![]);
    assert_eq!(decode(&data).unwrap().0, s);
    let (old, _) = decode(&without_section(&data, TAG_KINDS)).unwrap();
    assert_eq!(old.kinds, None);
    assert_eq!(
        old,
        Snapshot {
            kinds: None,
            ..s.clone()
        }
    );
    // Without kinds, no section is written: files stay what they were.
    let plain = Snapshot { kinds: None, ..s };
    assert_eq!(encode(&plain, &vec![]), without_section(&data, TAG_KINDS));
}

#[test]
fn hostile_kinds_sections_are_errors() {
    let data = encode(&with_kinds(), &vec![]);
    let at = section_payload_offset(&data, TAG_KINDS);
    // Payload: 2 names (1 + 4 "dict", 1 + 12 "list (items)"), count 3, ids 1 0 1.
    let ids_at = at + 1 + 5 + 13 + 1;
    let mut bad_id = data.clone();
    bad_id[ids_at + 1] = 2;
    let e = decode(&reseal(bad_id)).unwrap_err();
    assert!(e.contains("trace 1 has kind 2"), "{e}");
    let mut bad_count = data.clone();
    bad_count[ids_at - 1] = 2;
    let e = decode(&reseal(bad_count)).unwrap_err();
    assert!(
        e.contains("2 entries for 3 traces") || e.contains("object kinds"),
        "{e}"
    );
    let mut bad_name = data.clone();
    bad_name[at + 2] = 0xff;
    let e = decode(&reseal(bad_name)).unwrap_err();
    assert!(e.contains("kind name is not valid UTF-8"), "{e}");
    for n in 0..data.len() {
        assert!(decode(&data[..n]).is_err(), "truncated at {n}");
    }
}

#[test]
fn crc_matches_the_standard_check_value() {
    assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
    assert_eq!(crc32(b""), 0);
    // every length around the folding widths, against the bit-at-a-time definition
    let data: Vec<u8> = (0..300u32).map(|i| (i * 7 + 3) as u8).collect();
    for n in 0..data.len() {
        let mut slow = !0u32;
        for &b in &data[..n] {
            slow ^= b as u32;
            for _ in 0..8 {
                slow = if slow & 1 != 0 {
                    0xEDB8_8320 ^ (slow >> 1)
                } else {
                    slow >> 1
                };
            }
        }
        assert_eq!(crc32(&data[..n]), !slow, "length {n}");
    }
}

#[test]
fn round_trip() {
    let (s, attrs) = sample();
    let data = encode(&s, &attrs);
    let (s2, attrs2) = decode(&data).unwrap();
    assert_eq!(s2, s);
    assert_eq!(attrs2, attrs);
    let empty = SnapshotBuilder::new(1).finish();
    assert_eq!(decode(&encode(&empty, &vec![])).unwrap().0, empty);
}

#[test]
fn every_truncation_is_an_error() {
    let (s, attrs) = sample();
    let data = encode(&s, &attrs);
    for len in 0..data.len() {
        assert!(
            decode(&data[..len]).is_err(),
            "prefix of {len} bytes accepted"
        );
    }
}

#[test]
fn every_flipped_byte_is_an_error() {
    let (s, attrs) = sample();
    let data = encode(&s, &attrs);
    for i in 0..data.len() {
        for mask in [0x01u8, 0x80, 0xFF] {
            let mut bad = data.clone();
            bad[i] ^= mask;
            assert!(decode(&bad).is_err(), "byte {i} ^ {mask:#x} accepted");
        }
    }
}

/// Re-seals a modified file so the checksum passes and the decoder's own checks are hit.
fn reseal(mut data: Vec<u8>) -> Vec<u8> {
    let n = data.len();
    let crc = crc32(&data[..n - 4]);
    data[n - 4..].copy_from_slice(&crc.to_le_bytes());
    data
}

fn section_payload_offset(data: &[u8], tag: u32) -> usize {
    let mut pos = HEADER_LEN;
    loop {
        let t = u32::from_le_bytes(data[pos..pos + 4].try_into().unwrap());
        let len = u64::from_le_bytes(data[pos + 4..pos + 12].try_into().unwrap()) as usize;
        if t == tag {
            return pos + 12;
        }
        pos += 12 + len;
    }
}

#[test]
fn hostile_files_table() {
    let (s, attrs) = sample();
    let good = encode(&s, &attrs);
    let mut cases: Vec<(Vec<u8>, &str)> = vec![
        (Vec::new(), "empty"),
        (b"\x80\x04\x95junk".to_vec(), "tracemalloc (pickle)"),
        (b"GIF89a.........".to_vec(), "not an alloctrace snapshot"),
        (b"ALCT".to_vec(), "truncated"),
    ];
    let mut future = good.clone();
    future[8..12].copy_from_slice(&7u32.to_le_bytes());
    cases.push((future, "format version 7 is newer"));
    let mut trailing = good.clone();
    trailing.extend_from_slice(b"xyz");
    cases.push((trailing, "trailing garbage"));
    // A section declaring an enormous length.
    let mut huge = good.clone();
    huge[HEADER_LEN + 4..HEADER_LEN + 12].copy_from_slice(&u64::MAX.to_le_bytes());
    cases.push((huge, "declares"));
    // A resealed file whose trace count claims billions of traces.
    let mut many = good.clone();
    let at = section_payload_offset(&many, TAG_TRACE_COLUMNS);
    many[at] = 0xFF;
    many.insert(at + 1, 0xFF);
    many.insert(at + 2, 0x7F);
    // fix the section length (+2 bytes) before resealing
    let len_at = at - 8;
    let len = u64::from_le_bytes(many[len_at..at].try_into().unwrap()) + 2;
    many[len_at..at].copy_from_slice(&len.to_le_bytes());
    cases.push((reseal(many), "declares"));
    // A resealed file with a frame pointing past the filename table.
    let mut bad_id = good.clone();
    let at = section_payload_offset(&bad_id, TAG_FRAMES);
    bad_id[at + 1] = 9;
    cases.push((reseal(bad_id), "refers to filename 9"));
    // Resealed files whose tables repeat an entry: x.py/y.py becomes x.py/x.py, and
    // frames (x.py, 1)/(x.py, 2) become (x.py, 1)/(x.py, 1).
    let two_files = {
        let mut b = SnapshotBuilder::new(1);
        let (x, y) = (b.filename(b"x.py"), b.filename(b"y.py"));
        let (f, g) = (b.frame(x, 1), b.frame(y, 2));
        let t = b.traceback(&[f, g], None);
        b.trace(0, 1, t);
        encode(&b.finish(), &vec![])
    };
    let mut dup_name = two_files.clone();
    // payload: count=2, len=4, "x.py", len=4, "y.py"
    let at = section_payload_offset(&dup_name, TAG_FILENAMES) + 1 + 1 + 4 + 1;
    dup_name[at] = b'x';
    cases.push((reseal(dup_name), "filename 1 repeats"));
    let mut dup_frame = two_files.clone();
    // payload: count=2, (0, 1), (1, 2)
    let at = section_payload_offset(&dup_frame, TAG_FRAMES) + 1 + 2;
    dup_frame[at] = 0;
    dup_frame[at + 1] = 1;
    cases.push((reseal(dup_frame), "frame 1 repeats"));
    for (data, expected) in cases {
        let err = decode(&data).unwrap_err();
        assert!(err.contains(expected), "{expected:?} not in {err:?}");
    }
}

#[test]
fn sampled_snapshots_round_trip_and_refuse_old_readers() {
    let (mut s, attrs) = sample();
    let exact = encode(&s, &attrs);
    assert_eq!(decode(&exact).unwrap().0.sample_interval, None);
    s.sample_interval = Some(512 * 1024);
    let data = encode(&s, &attrs);
    // Version 2 at least, which readers from before sampled mode refuse.
    assert!(u32::from_le_bytes(data[8..12].try_into().unwrap()) >= 2);
    assert_eq!(decode(&data).unwrap().0, s);
    // Without the section, a file loads as exact whatever its version.
    let bare = without_section(&data, TAG_SAMPLING);
    assert_eq!(decode(&bare).unwrap().0.sample_interval, None);
    // (interval, error) for intervals no writer produces.
    for (interval, expected) in [(0u64, "interval 0"), (MAX_INTERVAL + 1, "outside")] {
        s.sample_interval = Some(interval);
        let err = decode(&encode(&s, &attrs)).unwrap_err();
        assert!(err.contains(expected), "{expected:?} not in {err:?}");
    }
    // A section with trailing bytes is refused too.
    s.sample_interval = Some(4096);
    let mut data = without_section(&encode(&s, &attrs), TAG_SAMPLING);
    let end = data.len() - 16;
    data.truncate(end);
    section(&mut data, TAG_SAMPLING, &[0x80, 0x20, 0x00]).unwrap();
    let data = reseal_end(data);
    assert!(decode(&data).unwrap_err().contains("sampling"));
}

/// Appends the end marker and checksum to a file cut just before them.
fn reseal_end(mut data: Vec<u8>) -> Vec<u8> {
    data.extend_from_slice(&TAG_END.to_le_bytes());
    data.extend_from_slice(&4u64.to_le_bytes());
    let crc = crc32(&data);
    data.extend_from_slice(&crc.to_le_bytes());
    data
}

#[test]
fn unknown_sections_are_skipped() {
    let (s, attrs) = sample();
    let good = encode(&s, &attrs);
    // Insert a section with tag 99 before the end marker, as a newer writer might.
    let end = good.len() - 16;
    let mut data = good[..end].to_vec();
    section(&mut data, 99, b"future data").unwrap();
    data.extend_from_slice(&TAG_END.to_le_bytes());
    data.extend_from_slice(&4u64.to_le_bytes());
    let crc = crc32(&data);
    data.extend_from_slice(&crc.to_le_bytes());
    assert_eq!(decode(&data).unwrap().0, s);
}

/// The file as a writer that predates function names made it: no section 7.
fn without_section(data: &[u8], tag: u32) -> Vec<u8> {
    let mut out = data[..HEADER_LEN].to_vec();
    let mut pos = HEADER_LEN;
    loop {
        let t = u32::from_le_bytes(data[pos..pos + 4].try_into().unwrap());
        let len = u64::from_le_bytes(data[pos + 4..pos + 12].try_into().unwrap()) as usize;
        if t == TAG_END {
            break;
        }
        if t != tag {
            out.extend_from_slice(&data[pos..pos + 12 + len]);
        }
        pos += 12 + len;
    }
    out.extend_from_slice(&TAG_END.to_le_bytes());
    out.extend_from_slice(&4u64.to_le_bytes());
    let crc = crc32(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

#[test]
fn function_names_are_optional() {
    let (s, attrs) = sample();
    assert_eq!(
        s.function(0, 0).unwrap().name[..],
        b"Outer.m\xed\xb3\xbf"[..]
    );
    let data = encode(&s, &attrs);
    assert_eq!(decode(&data).unwrap().0.function(0, 0), s.function(0, 0));
    // An older file: everything but the names loads.
    let (old, old_attrs) = decode(&without_section(&data, TAG_FUNCTIONS)).unwrap();
    assert!(old.functions.is_empty() && old.traceback_functions.is_empty());
    assert_eq!(old.function(0, 0), None);
    let expected = Snapshot {
        functions: Vec::new(),
        traceback_functions: Vec::new(),
        ..s.clone()
    };
    assert_eq!(old, expected);
    assert_eq!(old_attrs, attrs);
    // And a snapshot without names writes no section at all.
    assert_eq!(
        encode(&expected, &attrs),
        without_section(&data, TAG_FUNCTIONS)
    );
}

#[test]
fn hostile_function_sections() {
    let (s, attrs) = sample();
    let good = encode(&s, &attrs);
    // payload: 1 function (name of 10 bytes, line 1); 2 tracebacks: [2: 1, 0], [0]
    let at = section_payload_offset(&good, TAG_FUNCTIONS);
    let tb_at = at + 1 + 1 + 10 + 1;
    let mut wrong_count = good.clone();
    wrong_count[tb_at] = 3;
    let mut wrong_len = good.clone();
    wrong_len[tb_at + 1] = 1;
    let mut bad_id = good.clone();
    bad_id[tb_at + 2] = 5;
    let mut bad_utf8 = good.clone();
    bad_utf8[at + 2] = 0xFF;
    let cases = [
        (wrong_count, "describes 3 tracebacks, but there are 2"),
        (wrong_len, "gives traceback 0 1 functions for 2 frames"),
        (bad_id, "refers to function 4"),
        (bad_utf8, "function 0 has a name that is not valid UTF-8"),
    ];
    for (data, expected) in cases {
        let err = decode(&reseal(data)).unwrap_err();
        assert!(err.contains(expected), "{expected:?} not in {err:?}");
    }
}

/// A snapshot of `n` traces whose sizes need every width, in several domain runs.
fn many(n: usize) -> Snapshot {
    let mut b = SnapshotBuilder::new(2);
    let f = b.filename(b"m.py");
    let tbs: Vec<_> = (0..300)
        .map(|k| {
            let frame = b.frame(f, k);
            b.traceback(&[frame], Some(k))
        })
        .collect();
    let widths = [0, 1, 255, 256, 65535, 65536, 1 << 32, u64::MAX];
    for i in 0..n {
        let size = if i % 37 == 0 {
            widths[i % widths.len()]
        } else {
            i as u64 % 200
        };
        let tb = if i % 50 == 0 { 299 } else { i % 7 };
        b.trace((i / 100 % 3) as u32, size, tbs[tb]);
    }
    b.finish()
}

#[test]
fn trace_columns_round_trip_at_every_block_boundary() {
    for n in [0, 1, 15, 16, 17, 255, 256, 257, 1000, 4099] {
        let s = many(n);
        assert_eq!(decode(&encode(&s, &vec![])).unwrap().0, s, "{n} traces");
    }
}

/// Splitting the passes over the traces into parts (see [`parallel`]) changes neither the
/// bytes written nor the traces read back: with part edges inside a domain run (2 parts
/// of 4099 traces meet at 2064 when encoding, 2304 when decoding), on a change of domain
/// (2 parts of 3200 meet at 1600 when encoding; of 204,800, at 102,400 both ways), and
/// with more parts than blocks.
#[test]
fn parts_change_neither_bytes_nor_traces() {
    let counts: [fn(usize) -> usize; 4] = [|_| 1, |_| 2, |_| 3, |_| 4];
    for n in [0, 1, 16, 17, 300, 3200, 4099, 204_800] {
        let s = many(n);
        let one = Encoder::new(&s, &vec![], counts[0])
            .unwrap()
            .to_vec()
            .unwrap();
        let at = section_payload_offset(&one, TAG_TRACE_COLUMNS);
        let len = u64::from_le_bytes(one[at - 8..at].try_into().unwrap()) as usize;
        let payload = &one[at..at + len];
        for parts_for in counts {
            let data = Encoder::new(&s, &vec![], parts_for)
                .unwrap()
                .to_vec()
                .unwrap();
            assert_eq!(data, one, "{n} traces in {} parts", parts_for(n));
            let traces = decode_trace_columns(payload, s.tracebacks.len(), parts_for);
            assert_eq!(
                traces.unwrap(),
                (s.traces.clone(), s.domains.clone()),
                "{n} traces in {} parts",
                parts_for(n)
            );
        }
    }
}

/// A bad traceback id in any part is reported by the first trace that holds one.
#[test]
fn bad_ids_are_found_in_any_part() {
    let s = many(5000);
    let tracebacks = s.tracebacks.len();
    for (bad, first) in [
        (&[4999][..], 4999),
        (&[4000, 2600][..], 2600),
        (&[10, 4999], 10),
    ] {
        let mut s = s.clone();
        for (k, &i) in bad.iter().enumerate() {
            s.traces[i].traceback = (tracebacks + k) as u32;
        }
        let data = Encoder::new(&s, &vec![], |_| 3).unwrap().to_vec().unwrap();
        let at = section_payload_offset(&data, TAG_TRACE_COLUMNS);
        let len = u64::from_le_bytes(data[at - 8..at].try_into().unwrap()) as usize;
        let err = decode_trace_columns(&data[at..at + len], tracebacks, |_| 3).unwrap_err();
        let id = s.traces[first].traceback;
        let expected = format!("trace {first} refers to traceback {id}, but there are only");
        assert!(err.contains(&expected), "{expected:?} not in {err:?}");
    }
}

/// The traces section's exact bytes, against the layout spelled out one value at a time:
/// the fast two-pass writer must not change the format that readers and the fuzz seeds
/// expect.
#[test]
fn trace_column_bytes_follow_the_documented_layout() {
    fn column(values: &[u64]) -> Vec<u8> {
        let code = |block: &[u64]| width_code(*block.iter().max().unwrap());
        let mut out: Vec<u8> = values.chunks(COLUMN_BLOCK).map(code).collect();
        for block in values.chunks(COLUMN_BLOCK) {
            for v in block {
                out.extend_from_slice(&v.to_le_bytes()[..WIDTHS[code(block) as usize]]);
            }
        }
        out
    }
    let edge = [
        0,
        1,
        0xFF,
        0x100,
        0xFFFF,
        0x1_0000,
        0xFFFF_FFFF,
        0x1_0000_0000,
        u64::MAX,
    ];
    for n in [0usize, 1, 15, 16, 17, 40, 100, 300] {
        let domains: Vec<u32> = (0..n)
            .map(|i| [0, 0, 0, 7, 7, 1 << 31][i / 9 % 6])
            .collect();
        let traces: Vec<Trace> = (0..n)
            .map(|i| Trace {
                size: if n == 100 && i == 50 {
                    1 << 40
                } else {
                    edge[i % edge.len()]
                },
                traceback: [0, 255, 256, 65_535, 65_536, u32::MAX][i / 5 % 6],
            })
            .collect();
        let mut expected = Vec::new();
        put_uleb(&mut expected, n as u64);
        let mut runs: Vec<(u32, u64)> = Vec::new();
        for &domain in &domains {
            match runs.last_mut() {
                Some((d, len)) if *d == domain => *len += 1,
                _ => runs.push((domain, 1)),
            }
        }
        put_uleb(&mut expected, runs.len() as u64);
        for (d, len) in runs {
            put_uleb(&mut expected, d as u64);
            put_uleb(&mut expected, len);
        }
        let sizes: Vec<u64> = traces.iter().map(|t| t.size).collect();
        let ids: Vec<u64> = traces.iter().map(|t| t.traceback as u64).collect();
        expected.extend(column(&sizes));
        expected.extend(column(&ids));
        let columns = TraceColumns::encode(&traces, &domains.into_iter().collect(), 1).unwrap();
        let out = columns.pieces().collect::<Vec<_>>().concat();
        let crc = columns.crc.clone();
        assert_eq!(out.len(), columns.len());
        assert_eq!(out, expected, "{n} traces");
        assert_eq!(crc.finalize(), crc32(&expected), "{n} traces");
    }
}

/// Written by the format version 1 writer (tests/data holds it for pytest too).
const VERSION_1_FILE: &[u8] = include_bytes!("../../../tests/data/format-version-1.alct");

#[test]
fn version_1_files_still_load() {
    assert_eq!(
        u32::from_le_bytes(VERSION_1_FILE[8..12].try_into().unwrap()),
        1
    );
    let (old, attrs) = decode(VERSION_1_FILE).unwrap();
    assert_eq!(old.traces.len(), 700);
    assert!(old.traces.iter().any(|t| t.size == u64::MAX));
    let again = encode(&old, &attrs);
    assert_eq!(u32::from_le_bytes(again[8..12].try_into().unwrap()), 2);
    assert_eq!(decode(&again).unwrap(), (old, attrs));
}

#[test]
fn each_version_holds_its_own_traces_section() {
    let (s, attrs) = sample();
    let v2 = encode(&s, &attrs);
    // A version-2 body under a version-1 header.
    let mut v1_header = v2.clone();
    v1_header[8..12].copy_from_slice(&1u32.to_le_bytes());
    let err = decode(&reseal(v1_header)).unwrap_err();
    assert!(
        err.contains("section 8 does not belong in a version 1 file"),
        "{err}"
    );
    // A version-1 traces section added to a version-2 file.
    let end = v2.len() - 16;
    let mut both = v2[..end].to_vec();
    section(&mut both, TAG_TRACES, &[0, 0]).unwrap();
    both.extend_from_slice(&v2[end..]);
    let err = decode(&reseal(both)).unwrap_err();
    assert!(
        err.contains("section 5 does not belong in a version 2 file"),
        "{err}"
    );
    // The version-2 traces section missing.
    let err = decode(&without_section(&v2, TAG_TRACE_COLUMNS)).unwrap_err();
    assert!(err.contains("the traces section is missing"), "{err}");
}

#[test]
fn hostile_trace_columns() {
    let (s, attrs) = sample();
    let good = encode(&s, &attrs);
    // payload: 3 traces; 2 runs (0 x2, 5 x1); size width code 3, 24 size bytes; id
    // width code 0, ids 0 1 0.
    let at = section_payload_offset(&good, TAG_TRACE_COLUMNS);
    let sizes_at = at + 6;
    let ids_at = sizes_at + 1 + 24;
    assert_eq!(good[sizes_at], 3);
    assert_eq!(&good[ids_at..ids_at + 4], &[0, 0, 1, 0]);
    let mut bad_id = good.clone();
    bad_id[ids_at + 2] = 7;
    let mut huge_id = good.clone();
    huge_id[ids_at + 3] = 0xFF;
    let mut wide_ids = good.clone();
    wide_ids[ids_at] = 3;
    let mut unknown_width = good.clone();
    unknown_width[sizes_at] = 4;
    let mut narrow_sizes = good.clone();
    narrow_sizes[sizes_at] = 0;
    // The last id byte cut off, the section length and the file shortened to match.
    let mut truncated = good.clone();
    truncated.remove(ids_at + 3);
    let len = u64::from_le_bytes(truncated[at - 8..at].try_into().unwrap()) - 1;
    truncated[at - 8..at].copy_from_slice(&len.to_le_bytes());
    let cases = [
        (
            bad_id,
            "trace 1 refers to traceback 7, but there are only 2",
        ),
        (
            huge_id,
            "trace 2 refers to traceback 255, but there are only 2",
        ),
        (
            wide_ids,
            "traceback ids block 0 has width code 3 (at most 2)",
        ),
        (unknown_width, "sizes block 0 has width code 4 (at most 3)"),
        (
            narrow_sizes,
            "traces section has 21 unexpected bytes at its end",
        ),
        (truncated, "traceback ids need 3 bytes but only 2 remain"),
    ];
    for (data, expected) in cases {
        let err = decode(&reseal(data)).unwrap_err();
        assert!(err.contains(expected), "{expected:?} not in {err:?}");
    }
    // An out-of-range id far into a large snapshot is found and named.
    let mut b = SnapshotBuilder::new(1);
    let f = b.filename(b"x.py");
    let tbs: Vec<_> = (0..7)
        .map(|k| {
            let frame = b.frame(f, k);
            b.traceback(&[frame], None)
        })
        .collect();
    for i in 0..5000 {
        b.trace(0, i as u64, tbs[i % 7]);
    }
    let mut data = encode(&b.finish(), &vec![]);
    let at = section_payload_offset(&data, TAG_TRACE_COLUMNS);
    let len = u64::from_le_bytes(data[at - 8..at].try_into().unwrap()) as usize;
    // The ids column is last and 1 byte wide (every id < 256): its last byte is the
    // last trace's id.
    data[at + len - 1] = 250;
    let err = decode(&reseal(data)).unwrap_err();
    assert!(
        err.contains("trace 4999 refers to traceback 250, but there are only 7"),
        "{err}"
    );
}

#[test]
fn deep_attribute_nesting_is_refused() {
    let mut v = AttrValue::None;
    for _ in 0..(MAX_ATTR_DEPTH + 5) {
        v = AttrValue::List(vec![v]);
    }
    let s = SnapshotBuilder::new(1).finish();
    let data = encode(&s, &vec![(b"deep".to_vec(), v)]);
    assert!(decode(&data).unwrap_err().contains("nest deeper"));
}

/// The structure is walked once and sections are found by tag in constant time: a
/// million empty sections of unknown tags decode (or fail their checksum) in linear
/// time; the duplicate scan used to be quadratic (694 s for this file).
#[test]
fn many_sections_load_in_linear_time() {
    let (s, attrs) = sample();
    let good = encode(&s, &attrs);
    let mut data = good[..good.len() - 16].to_vec();
    for tag in 0..1_000_000u32 {
        section(&mut data, 1000 + tag, b"").unwrap();
    }
    let data = reseal_end(data);
    assert_eq!(decode(&data).unwrap().0, s);
    let mut bad = data.clone();
    *bad.last_mut().unwrap() ^= 1;
    assert!(decode(&bad).unwrap_err().contains("checksum mismatch"));
    // A repeated tag among them is still found, once the checksum holds.
    let mut twice = good[..good.len() - 16].to_vec();
    for tag in 0..100_000u32 {
        section(&mut twice, 1000 + tag % 99_999, b"").unwrap();
    }
    let err = decode(&reseal_end(twice)).unwrap_err();
    assert!(err.contains("section 1000 appears twice"), "{err}");
}

/// Every loaded snapshot's time can be shown: one rule, checked at load.
#[test]
fn timestamps_that_are_not_times_are_refused() {
    let (s, attrs) = sample();
    for (t, ok) in [
        (f64::NAN, false),
        (f64::INFINITY, false),
        (f64::NEG_INFINITY, false),
        (1e20, false),
        (-1.0, false),
        (MAX_TIMESTAMP, false),
        (0.0, true),
        (MAX_TIMESTAMP - 1.0, true),
    ] {
        let mut s = s.clone();
        s.metadata.timestamp = Some(t);
        let result = decode(&encode(&s, &attrs));
        match ok {
            true => assert_eq!(result.unwrap().0.metadata.timestamp, Some(t)),
            false => {
                let err = result.unwrap_err();
                assert!(
                    err.contains("timestamp") && err.contains("is not a time"),
                    "{err}"
                );
            }
        }
    }
}

/// A file name that fits the file system's 255 bytes can be dumped to: the temporary
/// name is cut to fit as well.
#[test]
fn temporary_names_fit_name_max() {
    for len in [1, 200, 230, 245, 255] {
        let name = "n".repeat(len);
        let tmp = temp_path(Path::new("/some/dir").join(&name).as_path());
        let tmp_name = tmp.file_name().unwrap().len();
        assert!(tmp_name <= 255, "{len}: {tmp_name}");
        assert_eq!(tmp.parent(), Some(Path::new("/some/dir")));
    }
    let dir = std::env::temp_dir().join(format!("alloctrace-long-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let path = dir.join("x".repeat(245));
    let (s, attrs) = sample();
    dump(&path, &s, &attrs).unwrap();
    assert_eq!(load(&path).unwrap().0, s);
    fs::remove_dir_all(&dir).unwrap();
}

/// Special files are refused before any read; a regular file that is not a snapshot
/// costs one small read, whatever size it claims (a sparse file).
#[test]
fn only_regular_files_are_read() {
    for dev in ["/dev/zero", "/dev/urandom", "/dev/null"] {
        let Err(Error::Format { reason, .. }) = load(Path::new(dev)) else {
            panic!("{dev} was not refused as a format error");
        };
        assert!(
            reason.contains("a character device, not a regular file"),
            "{reason}"
        );
    }
    let dir = std::env::temp_dir().join(format!("alloctrace-special-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let fifo = dir.join("fifo");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let Err(Error::Format { reason, .. }) = load(&fifo) else {
        panic!("the FIFO was not refused");
    };
    assert!(reason.contains("a FIFO"), "{reason}");
    // Sparse: 1 TB claimed, nothing on disk; a bad header, then a good header and a hole.
    let sparse = dir.join("sparse");
    let f = fs::File::create(&sparse).unwrap();
    f.set_len(1 << 40).unwrap();
    let Err(Error::Format { reason, .. }) = load(&sparse) else {
        panic!("the sparse file was not refused");
    };
    assert!(reason.contains("bad magic number"), "{reason}");
    let mut head = MAGIC.to_vec();
    head.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    (&f).write_all(&head).unwrap();
    let Err(Error::Format { reason, .. }) = load(&sparse) else {
        panic!("the sparse file with a header was not refused");
    };
    assert!(reason.contains("end marker declares 0 bytes"), "{reason}");
    assert!(
        matches!(load(&dir), Err(Error::Io { .. })),
        "a directory is an OSError"
    );
    fs::remove_dir_all(&dir).unwrap();
}

/// A file whose structure holds up to its end marker, `len` bytes long and sparse: one
/// section of an unknown tag over nearly all of it (its checksum is wrong, which only the
/// decoding after the read can tell).
fn sparse_structured_file(path: &Path, len: u64) {
    let f = fs::File::create(path).unwrap();
    f.set_len(len).unwrap();
    let mut head = MAGIC.to_vec();
    head.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    head.extend_from_slice(&999u32.to_le_bytes());
    let body = len - (HEADER_LEN + 2 * SECTION_HEADER_LEN + 4) as u64;
    head.extend_from_slice(&body.to_le_bytes());
    (&f).write_all(&head).unwrap();
    let mut end = TAG_END.to_le_bytes().to_vec();
    end.extend_from_slice(&4u64.to_le_bytes());
    end.extend_from_slice(&[0; 4]);
    std::os::unix::fs::FileExt::write_all_at(&f, &end, len - end.len() as u64).unwrap();
}

#[test]
fn a_check_between_chunks_stops_the_read() {
    let dir = std::env::temp_dir().join(format!("alloctrace-chunks-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let path = dir.join("big.snap");
    sparse_structured_file(&path, 8 * READ_CHUNK as u64);
    // Every chunk is read and checked: the file fails only once whole, on its checksum.
    let mut calls = 0;
    let result = load_interruptible(&path, &mut || {
        calls += 1;
        Ok(())
    });
    let Err(Error::Format { reason, .. }) = result else {
        panic!("the bad checksum was not found");
    };
    assert!(reason.contains("checksum"), "{reason}");
    assert!(
        calls >= 9,
        "checked {calls} times for a header and 8 chunks"
    );
    // A check that fails ends the read there, with its error.
    let mut calls = 0;
    let result = load_interruptible(&path, &mut || {
        calls += 1;
        if calls == 3 {
            Err(Error::Interrupted)
        } else {
            Ok(())
        }
    });
    assert!(matches!(result, Err(Error::Interrupted)));
    assert_eq!(calls, 3);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn dump_is_atomic_and_cleans_up() {
    let dir = std::env::temp_dir().join(format!("alloctrace-fmt-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let path = dir.join("snap.bin");
    let (s, attrs) = sample();
    dump(&path, &s, &attrs).unwrap();
    assert_eq!(load(&path).unwrap().0, s);
    assert_eq!(fs::read(&path).unwrap(), encode(&s, &attrs));
    // Replacing it: the new contents under the name, no temporary file left.
    let bigger = many(20_000);
    dump(&path, &bigger, &vec![]).unwrap();
    assert_eq!(load(&path).unwrap().0, bigger);
    assert_eq!(fs::read(&path).unwrap(), encode(&bigger, &vec![]));
    // Dumping into a missing directory fails and leaves nothing behind.
    let missing = dir.join("missing").join("snap.bin");
    assert!(dump(&missing, &s, &attrs).is_err());
    let left: Vec<_> = fs::read_dir(&dir).unwrap().collect();
    assert_eq!(left.len(), 1);
    fs::remove_dir_all(&dir).unwrap();
}

fn report(filename: &[u8], lineno: u32) -> SiteRetention {
    let strs =
        |items: &[&str]| -> Vec<Box<[u8]>> { items.iter().map(|s| s.as_bytes().into()).collect() };
    SiteRetention {
        filename: filename.into(),
        lineno,
        count: 3,
        unreachable: 1,
        size: 300,
        retained: 900,
        paths: strs(&["module app → app.cache", "x"]),
        pattern: strs(&["3 × list ← 3 × dict"]),
    }
}

fn with_retention(reports: Vec<SiteRetention>) -> (Snapshot, Attributes) {
    let (mut s, attrs) = sample();
    s.retention = Some(reports);
    (s, attrs)
}

#[test]
fn retention_section_round_trips_and_truncations_fail() {
    let mut empty = report(b"", 0);
    empty.paths.clear();
    empty.pattern.clear();
    for reports in [
        vec![report(b"a.py", 2), report(b"b.py", 0), empty],
        Vec::new(),
    ] {
        let (s, attrs) = with_retention(reports);
        let data = encode(&s, &attrs);
        assert_ne!(section_payload_offset(&data, TAG_RETENTION), 0);
        let (s2, attrs2) = decode(&data).unwrap();
        assert_eq!(s2, s);
        assert_eq!(attrs2, attrs);
        for len in 0..data.len() {
            assert!(
                decode(&data[..len]).is_err(),
                "prefix of {len} bytes accepted"
            );
        }
    }
    // A file without the section (as every file before it) has no retention reports.
    let (s, attrs) = sample();
    let (plain, _) = decode(&encode(&s, &attrs)).unwrap();
    assert_eq!(plain.retention, None);
    // An attribute may have any name: none is reserved for the reports any more.
    let attrs = vec![(b"\0retention".to_vec(), AttrValue::Int(1))];
    let (_, back) = decode(&encode(&s, &attrs)).unwrap();
    assert_eq!(back, attrs);
}

fn with_process_memory() -> (Snapshot, Attributes) {
    let (mut s, attrs) = sample();
    s.metadata.process_memory = Some(ProcessMemory {
        rss: 300 << 20,
        anon: 200 << 20,
        file: 90 << 20,
        shmem: 1 << 20,
        peak_rss: 400 << 20,
    });
    (s, attrs)
}

#[test]
fn process_memory_section_round_trips_and_old_files_have_none() {
    let (s, attrs) = with_process_memory();
    let data = encode(&s, &attrs);
    assert_ne!(section_payload_offset(&data, TAG_PROCESS_MEMORY), 0);
    assert_eq!(decode(&data).unwrap().0, s);
    for len in 0..data.len() {
        assert!(decode(&data[..len]).is_err(), "prefix of {len} accepted");
    }
    // Without it (files from before, snapshots without figures): None.
    let bare = without_section(&data, TAG_PROCESS_MEMORY);
    assert_eq!(decode(&bare).unwrap().0.metadata.process_memory, None);
    let (plain, attrs) = sample();
    assert_eq!(decode(&encode(&plain, &attrs)).unwrap().0, plain);
}

/// Rewrites section 13's payload and reseals the file.
fn with_process_memory_payload(payload: &[u8]) -> Vec<u8> {
    let (s, attrs) = with_process_memory();
    with_payload(&encode(&s, &attrs), TAG_PROCESS_MEMORY, payload)
}

/// A peak snapshot (aggregates) and a snapshot carrying it.
fn peak_pair() -> (Snapshot, Snapshot) {
    let mut b = SnapshotBuilder::new(2);
    let a = b.filename(b"a.py");
    let (f1, f2) = (b.frame(a, 1), b.frame(a, 2));
    let (t1, t2) = (b.traceback(&[f1], Some(1)), b.traceback(&[f2, f1], Some(3)));
    b.aggregate(0, 5000, 40, t1);
    b.aggregate(0, 0, 3, t2);
    let peak = b.finish();
    let (mut now, _) = sample();
    now.peak = Some(Box::new(peak.clone()));
    (peak, now)
}

/// Replaces the payload of section `tag` (fixing its length) and reseals the file.
fn with_payload(data: &[u8], tag: u32, payload: &[u8]) -> Vec<u8> {
    let at = section_payload_offset(data, tag);
    let old_len = u64::from_le_bytes(data[at - 8..at].try_into().unwrap()) as usize;
    let mut out = data[..at - 8].to_vec();
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(payload);
    out.extend_from_slice(&data[at + old_len..]);
    reseal(out)
}

#[test]
fn process_memory_section_hostile_payloads_are_refused() {
    let payload = |fields: &[u64]| {
        let mut p = Vec::new();
        for &v in fields {
            put_uleb(&mut p, v);
        }
        p
    };
    // A newer writer's extra fields are skipped.
    let (s, _) = decode(&with_process_memory_payload(&payload(&[
        7, 10, 4, 3, 2, 20, 1, 2,
    ])))
    .unwrap();
    let pm = s.metadata.process_memory.unwrap();
    assert_eq!(
        (pm.rss, pm.anon, pm.file, pm.shmem, pm.peak_rss),
        (10, 4, 3, 2, 20)
    );
    // (payload, expected fragment of the error)
    let mut oversized = payload(&[5, 1]);
    oversized.extend_from_slice(&[0xFF; 11]);
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (Vec::new(), "process memory section"),
        (
            payload(&[4, 10, 4, 3, 2]),
            "holds 4 fields, fewer than the 5",
        ),
        (payload(&[0]), "holds 0 fields"),
        (payload(&[5, 10, 4, 3]), "process memory section"),
        (payload(&[5, 10, 4, 3, 2, 20, 9]), "unexpected bytes"),
        (payload(&[6, 10, 4, 3, 2, 20]), "process memory section"),
        (payload(&[5, 10, 8, 3, 2, 20]), "exceed the RSS of 10 bytes"),
        (payload(&[5, 10, u64::MAX, 3, 0, 20]), "exceed the RSS"),
        (
            payload(&[u64::MAX, 10, 4, 3, 2, 20]),
            "process memory section",
        ),
        (oversized, "oversized number"),
    ];
    for (p, expected) in cases {
        let err = decode(&with_process_memory_payload(&p)).unwrap_err();
        assert!(err.contains(expected), "{expected:?} not in {err:?}");
    }
}

#[test]
fn peak_section_round_trips_and_readers_without_it_skip_it() {
    let (peak, now) = peak_pair();
    for s in [&peak, &now] {
        let data = encode(s, &vec![]);
        assert_eq!(&decode(&data).unwrap().0, s);
        // A reader that does not know section 12 skips it (as for any unknown tag): the
        // snapshot without its peak; a peak with its sizes, one block per traceback.
        let (old, _) = decode(&without_section(&data, TAG_PEAK)).unwrap();
        let expected = Snapshot {
            blocks: None,
            peak: None,
            ..s.clone()
        };
        assert_eq!(old, expected);
        assert_eq!(encode(&expected, &vec![]), without_section(&data, TAG_PEAK));
    }
    let (loaded, _) = decode(&encode(&now, &vec![])).unwrap();
    assert_eq!(loaded.peak.unwrap().blocks, Some(vec![40, 3]));
    // An empty peak is still a peak.
    let mut b = SnapshotBuilder::new(1);
    b.aggregates();
    let empty = b.finish();
    assert_eq!(empty.blocks, Some(vec![]));
    assert_eq!(decode(&encode(&empty, &vec![])).unwrap().0, empty);
}

#[test]
fn hostile_peak_sections_are_refused() {
    let (peak, now) = peak_pair();
    let peak_file = encode(&peak, &vec![]);
    let now_file = encode(&now, &vec![]);
    let nested = |file: &[u8]| [&[2u8][..], file].concat();
    let mut corrupt_nested = peak_file.clone();
    let mid = corrupt_nested.len() / 2;
    corrupt_nested[mid] ^= 0x55;
    let plain = encode(&sample().0, &vec![]);
    // (file holding section 12, payload, expected reason)
    let cases: Vec<(&[u8], Vec<u8>, &str)> = vec![
        (&peak_file, vec![], "peak section is truncated"),
        (&peak_file, vec![0], "unknown form 0"),
        (&peak_file, vec![3, 0], "unknown form 3"),
        (&peak_file, vec![1, 1, 40], "1 block counts for 2 traces"),
        (&peak_file, vec![1, 2, 40], "truncated"),
        (&peak_file, vec![1, 2, 40, 3, 0], "unexpected bytes"),
        (&peak_file, vec![1, 0xFF, 0xFF, 0xFF, 0x7F], "declares"),
        (
            &now_file,
            nested(&peak_file[..peak_file.len() - 1]),
            "peak section: ",
        ),
        (&now_file, nested(&corrupt_nested), "peak section: "),
        (&now_file, nested(b"GIF89a"), "peak section: "),
        (&now_file, nested(&now_file), "a peak holds another peak"),
        (&now_file, nested(&plain), "have no block counts"),
    ];
    for (file, payload, reason) in cases {
        let err = decode(&with_payload(file, TAG_PEAK, &payload)).unwrap_err();
        assert!(err.contains(reason), "{payload:?}: {err}");
    }
    // Form 1 at the top of a peak's nested file is what makes it a peak: fine.
    assert!(decode(&with_payload(&now_file, TAG_PEAK, &nested(&peak_file))).is_ok());
}

/// Rewrites section 11's payload (header length included) and reseals the file.
fn with_retention_payload(payload: &[u8]) -> Vec<u8> {
    let (s, attrs) = with_retention(vec![report(b"a.py", 1)]);
    with_payload(&encode(&s, &attrs), TAG_RETENTION, payload)
}

#[test]
fn retention_section_hostile_payloads_are_refused() {
    let mut good = Vec::new();
    put_uleb(&mut good, 1);
    put_bytes(&mut good, b"a.py");
    for v in [7u64, 3, 1, 300, 900] {
        put_uleb(&mut good, v);
    }
    put_uleb(&mut good, 1);
    put_bytes(&mut good, b"p");
    put_uleb(&mut good, 0);
    let (s, _) = decode(&with_retention_payload(&good)).unwrap();
    assert_eq!(s.retention.unwrap()[0].paths, vec![Box::from(&b"p"[..])]);

    let bad_utf8 = {
        let mut p = good.clone();
        let at = p.len() - 2; // the path's byte
        p[at] = 0xFF;
        p
    };
    let more_unreachable = {
        let mut p = good.clone();
        p[8] = 4; // unreachable 4 of count 3
        p
    };
    let trailing = {
        let mut p = good.clone();
        p.push(0);
        p
    };
    let huge_count = {
        let mut p = Vec::new();
        put_uleb(&mut p, u64::MAX >> 1);
        p
    };
    let huge_paths = {
        let mut p = good[..good.len() - 4].to_vec();
        put_uleb(&mut p, 1 << 40);
        p
    };
    let big_lineno = {
        let mut p = Vec::new();
        put_uleb(&mut p, 1);
        put_bytes(&mut p, b"a.py");
        put_uleb(&mut p, 1 << 33);
        p.extend_from_slice(&[0; 6]);
        p
    };
    let cases: &[(&[u8], &str)] = &[
        (&bad_utf8, "not UTF-8"),
        (&more_unreachable, "4 unreachable objects of 3"),
        (&trailing, "unexpected bytes"),
        (&huge_count, "reports but only"),
        (&huge_paths, "paths but only"),
        (&big_lineno, "lineno"),
        (&[], "ends inside a number"),
    ];
    for (payload, want) in cases {
        let err = decode(&with_retention_payload(payload)).unwrap_err();
        assert!(err.contains(want), "{err:?} lacks {want:?}");
    }
}

fn with_machine() -> (Snapshot, Attributes) {
    let (mut s, attrs) = sample();
    s.metadata.machine = Some(crate::platform::machine::Machine {
        id: "0123456789abcdef0123456789abcdef".into(),
        hostname: "build-7.example".into(),
    });
    (s, attrs)
}

#[test]
fn machine_section_round_trips_and_old_files_have_none() {
    let (s, attrs) = with_machine();
    let data = encode(&s, &attrs);
    assert_ne!(section_payload_offset(&data, TAG_MACHINE), 0);
    assert_eq!(decode(&data).unwrap().0, s);
    for len in 0..data.len() {
        assert!(decode(&data[..len]).is_err(), "prefix of {len} accepted");
    }
    // Files from before the section existed load as "machine unknown".
    let bare = without_section(&data, TAG_MACHINE);
    assert_eq!(decode(&bare).unwrap().0.metadata.machine, None);
}

#[test]
fn machine_section_hostile_payloads_are_refused() {
    let (s, attrs) = with_machine();
    let data = encode(&s, &attrs);
    let field = |b: &[u8]| {
        let mut p = Vec::new();
        put_uleb(&mut p, b.len() as u64);
        p.extend_from_slice(b);
        p
    };
    let long_id = [b'a'; 65];
    let long_host = [b'h'; 256];
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (Vec::new(), "machine section"),
        (field(b"abc"), "machine section"),
        ([field(&long_id), field(b"h")].concat(), "longer than 64"),
        (
            [field(b"abc"), field(&long_host)].concat(),
            "longer than 255",
        ),
        ([field(b"a\xffc"), field(b"h")].concat(), "id is not text"),
        (
            [field(b"abc"), field(b"h\0")].concat(),
            "hostname is not text",
        ),
        (
            [field(b"abc"), field(b"h"), vec![0]].concat(),
            "unexpected bytes",
        ),
        ([vec![0xFF; 11], field(b"h")].concat(), "oversized number"),
    ];
    for (p, expected) in cases {
        let err = decode(&with_payload(&data, TAG_MACHINE, &p)).unwrap_err();
        assert!(err.contains(expected), "{expected:?} not in {err:?}");
    }
    // Any id is taken as it is (a fidelity guard, not an authentication).
    let (back, _) = decode(&with_payload(
        &data,
        TAG_MACHINE,
        &[field(b"claimed"), field(b"")].concat(),
    ))
    .unwrap();
    assert_eq!(back.metadata.machine.unwrap().id, "claimed");
}
