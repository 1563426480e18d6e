//! Exports of a snapshot to the formats other tools read: pprof (for `go tool pprof`,
//! Pyroscope, Parca, ...), folded stacks (for any flamegraph tool) and interactive SVG
//! flamegraphs, plain or differential.
//!
//! All three see the snapshot the same way: live memory per distinct stack, a stack being a
//! traceback's frames (tracemalloc's identity: tracebacks that differ only in their total
//! depth are one stack). A frame is shown with its function where the snapshot recorded it.
//!
//! A sampled snapshot exports estimated totals: every trace counts with its sampling weight
//! (as in `Snapshot.statistics()`), pprof says so with `period` = the sampling interval (the
//! values are written already scaled, as Go's heap profiles are) and a comment, and the
//! flamegraph subtitle says the bytes are estimated.
//!
//! The pprof messages are declared here with prost's derive rather than generated from
//! `profile.proto`: the subset a heap profile uses is small and stable, and this keeps protoc
//! and a build script out of the build.

use std::collections::HashMap;
use std::io::Write;

use flate2::write::GzEncoder;
use flate2::Compression;
use prost::Message;

use crate::analysis::sampling::count_from_units;
use crate::analysis::snapshot::{FrameId, Function, FunctionId, Snapshot, TracebackId};
use crate::error::{Error, Result};
use crate::platform::fallible;

/// The messages of google/pprof's `proto/profile.proto` that a heap profile uses, with the
/// same field numbers. String fields are indexes into `string_table`.
pub mod proto {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Profile {
        #[prost(message, repeated, tag = "1")]
        pub sample_type: Vec<ValueType>,
        #[prost(message, repeated, tag = "2")]
        pub sample: Vec<Sample>,
        #[prost(message, repeated, tag = "3")]
        pub mapping: Vec<Mapping>,
        #[prost(message, repeated, tag = "4")]
        pub location: Vec<Location>,
        #[prost(message, repeated, tag = "5")]
        pub function: Vec<Function>,
        #[prost(string, repeated, tag = "6")]
        pub string_table: Vec<String>,
        #[prost(int64, tag = "9")]
        pub time_nanos: i64,
        #[prost(int64, tag = "10")]
        pub duration_nanos: i64,
        #[prost(message, optional, tag = "11")]
        pub period_type: Option<ValueType>,
        #[prost(int64, tag = "12")]
        pub period: i64,
        #[prost(int64, repeated, tag = "13")]
        pub comment: Vec<i64>,
        #[prost(int64, tag = "14")]
        pub default_sample_type: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ValueType {
        #[prost(int64, tag = "1")]
        pub r#type: i64,
        #[prost(int64, tag = "2")]
        pub unit: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Sample {
        /// Leaf (most recent call) first.
        #[prost(uint64, repeated, tag = "1")]
        pub location_id: Vec<u64>,
        #[prost(int64, repeated, tag = "2")]
        pub value: Vec<i64>,
        #[prost(message, repeated, tag = "3")]
        pub label: Vec<Label>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Label {
        #[prost(int64, tag = "1")]
        pub key: i64,
        #[prost(int64, tag = "2")]
        pub str: i64,
        #[prost(int64, tag = "3")]
        pub num: i64,
        #[prost(int64, tag = "4")]
        pub num_unit: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Mapping {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(uint64, tag = "2")]
        pub memory_start: u64,
        #[prost(uint64, tag = "3")]
        pub memory_limit: u64,
        #[prost(uint64, tag = "4")]
        pub file_offset: u64,
        #[prost(int64, tag = "5")]
        pub filename: i64,
        #[prost(int64, tag = "6")]
        pub build_id: i64,
        #[prost(bool, tag = "7")]
        pub has_functions: bool,
        #[prost(bool, tag = "8")]
        pub has_filenames: bool,
        #[prost(bool, tag = "9")]
        pub has_line_numbers: bool,
        #[prost(bool, tag = "10")]
        pub has_inline_frames: bool,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Location {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(uint64, tag = "2")]
        pub mapping_id: u64,
        #[prost(uint64, tag = "3")]
        pub address: u64,
        #[prost(message, repeated, tag = "4")]
        pub line: Vec<Line>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Line {
        #[prost(uint64, tag = "1")]
        pub function_id: u64,
        #[prost(int64, tag = "2")]
        pub line: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Function {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(int64, tag = "2")]
        pub name: i64,
        #[prost(int64, tag = "3")]
        pub system_name: i64,
        #[prost(int64, tag = "4")]
        pub filename: i64,
        #[prost(int64, tag = "5")]
        pub start_line: i64,
    }
}

/// Shown where a frame's function is unknown (raw-tuple snapshots, older files).
const UNKNOWN_FUNCTION: &str = "<unknown>";

/// One distinct stack: a traceback standing for every traceback with the same frames and
/// functions, the domain (0 unless split by domain), block count and bytes.
#[derive(Clone, Copy)]
struct Stack {
    traceback: TracebackId,
    domain: u32,
    count: u64,
    size: u64,
}

/// Live memory per distinct stack, in order of first appearance so output does not depend
/// on hashing.
///
/// Two passes, so that the cost follows the distinct tracebacks and not the traces: the traces
/// are summed per traceback id (and domain) with one array index each, whatever their depth;
/// only then are the frames of each traceback hashed, once, to merge tracebacks with equal
/// frames and functions (ids that differ only in `total_nframe`, say). Hashing every trace's
/// frames made `export` and `flamegraph` of a 40M-trace, 25-frame snapshot take 18-22 s where
/// `stats` took 1.5 s.
fn stacks(snapshot: &Snapshot, by_domain: bool) -> Result<Vec<Stack>> {
    let sums = per_traceback(snapshot, by_domain)?;
    type Key<'a> = (&'a [FrameId], &'a [Option<FunctionId>], u32);
    let mut index: HashMap<Key<'_>, usize> = HashMap::new();
    index.try_reserve(sums.len())?;
    let mut out: Vec<Stack> = fallible::with_capacity(sums.len())?;
    for sum in sums {
        fallible::check()?;
        let t = sum.traceback;
        let frames: &[FrameId] = &snapshot.tracebacks[t as usize].frames;
        let functions: &[Option<FunctionId>] = snapshot
            .traceback_functions
            .get(t as usize)
            .map_or(&[], |f| &f[..]);
        let i = *index
            .entry((frames, functions, sum.domain))
            .or_insert_with(|| {
                out.push(Stack {
                    count: 0,
                    size: 0,
                    ..sum
                });
                out.len() - 1
            });
        // Counts in fixed point until every trace is in (see `sampling`).
        out[i].count += sum.count;
        out[i].size = out[i].size.saturating_add(sum.size);
    }
    for stack in &mut out {
        stack.count = count_from_units(stack.count);
    }
    Ok(out)
}

/// The traces summed per traceback id and domain (0 for all unless `by_domain`), in order of
/// first appearance, counts still in fixed point. Domain 0 (nearly every trace) is a dense
/// array by traceback id; other domains, rare, go through a map.
fn per_traceback(snapshot: &Snapshot, by_domain: bool) -> Result<Vec<Stack>> {
    const NONE: u32 = u32::MAX;
    let mut slot: Vec<u32> = fallible::filled(snapshot.tracebacks.len(), NONE)?;
    let mut other: HashMap<(TracebackId, u32), u32> = HashMap::new();
    let mut out: Vec<Stack> = Vec::new();
    let weighted = snapshot.weighted();
    for ((trace, trace_domain), (bytes, count)) in snapshot
        .traces
        .iter()
        .zip(snapshot.domains.iter())
        .zip(weighted)
    {
        let t = trace.traceback;
        let domain = if by_domain { trace_domain } else { 0 };
        let found = if domain == 0 {
            slot[t as usize]
        } else {
            other.get(&(t, domain)).copied().unwrap_or(NONE)
        };
        let i = if found != NONE {
            found as usize
        } else {
            fallible::room_for_one(&mut out)?;
            let i = out.len() as u32;
            if domain == 0 {
                slot[t as usize] = i;
            } else {
                fallible::map_room_for_one(&mut other)?;
                other.insert((t, domain), i);
            }
            out.push(Stack {
                traceback: t,
                domain,
                count: 0,
                size: 0,
            });
            i as usize
        };
        out[i].count += count;
        out[i].size = out[i].size.saturating_add(bytes);
    }
    Ok(out)
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// pprof's string table: index 0 is "", every other string once.
#[derive(Default)]
struct Strings {
    table: Vec<String>,
    index: HashMap<String, i64>,
}

impl Strings {
    fn new() -> Self {
        let mut s = Self::default();
        s.get("");
        s
    }

    fn get(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.table.len() as i64;
        self.table.push(s.to_owned());
        self.index.insert(s.to_owned(), i);
        i
    }
}

fn clamp(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The snapshot as a pprof heap profile (uncompressed message): sample types
/// `inuse_objects`/count and `inuse_space`/bytes, one sample per distinct stack and domain
/// (non-zero domains labelled `domain`), one Location per distinct frame and function
/// running there, one Function per distinct (function, filename, first line). An exact
/// snapshot counts every block, so `period` is 1; a sampled one has the sampling interval as
/// `period` and estimated (already scaled) values.
pub fn pprof_profile(snapshot: &Snapshot) -> Result<proto::Profile> {
    pprof_profile_with(snapshot, None)
}

/// [`pprof_profile`], and with `allocated` (an aggregate snapshot of what was allocated in
/// the profile's span, see `take_allocated_snapshot`) also `alloc_objects`/count and
/// `alloc_space`/bytes, first, in the order Go's heap profiles and pyroscope-io give the four
/// types. A stack that only allocated (nothing of it is alive) has zero `inuse_*` values; one
/// only alive, zero `alloc_*` values. The two snapshots have tables of their own, so their
/// stacks meet by content (file, line, function), not by id.
pub fn pprof_profile_with(
    snapshot: &Snapshot,
    allocated: Option<&Snapshot>,
) -> Result<proto::Profile> {
    use proto::*;
    let mut strings = Strings::new();
    let value_type = |strings: &mut Strings, t: &str, u: &str| ValueType {
        r#type: strings.get(t),
        unit: strings.get(u),
    };
    let mut sample_type = Vec::new();
    if allocated.is_some() {
        sample_type.push(value_type(&mut strings, "alloc_objects", "count"));
        sample_type.push(value_type(&mut strings, "alloc_space", "bytes"));
    }
    sample_type.push(value_type(&mut strings, "inuse_objects", "count"));
    sample_type.push(value_type(&mut strings, "inuse_space", "bytes"));
    let width = sample_type.len();
    let period_type = Some(value_type(&mut strings, "space", "bytes"));
    let default_sample_type = strings.get("inuse_space");
    let domain_key = strings.get("domain");

    let mut locations: Vec<Location> = Vec::new();
    // (function id, line) -> location id.
    let mut location_ids: HashMap<(u64, i64), u64> = HashMap::new();
    let mut functions: Vec<Function> = Vec::new();
    // (name, filename, first line) as string indexes -> function id.
    let mut function_ids: HashMap<(i64, i64, i64), u64> = HashMap::new();
    let mut samples: Vec<Sample> = Vec::new();
    let mut values: Vec<u64> = Vec::new();
    // Only needed to merge the stacks of two snapshots.
    let mut sample_ids: HashMap<(Vec<u64>, u32), usize> = HashMap::new();
    let mut parts = vec![(snapshot, width - 2)];
    if let Some(allocated) = allocated {
        parts.push((allocated, 0));
    }
    let merging = parts.len() > 1;
    for (snap, slot) in parts {
        // This snapshot's (frame, function) -> location id.
        let mut local: HashMap<(FrameId, Option<FunctionId>), u64> = HashMap::new();
        let stacks = stacks(snap, true)?;
        fallible::room_for(&mut samples, stacks.len())?;
        fallible::room_for(&mut values, stacks.len() * width)?;
        for stack in stacks {
            fallible::check()?;
            let frames = &snap.tracebacks[stack.traceback as usize].frames;
            let known = snap.traceback_functions.get(stack.traceback as usize);
            let mut location_id: Vec<u64> = fallible::with_capacity(frames.len())?;
            for (i, &f) in frames.iter().enumerate() {
                let function = known.and_then(|k| k.get(i).copied().flatten());
                fallible::map_room_for_one(&mut local)?;
                fallible::map_room_for_one(&mut location_ids)?;
                fallible::map_room_for_one(&mut function_ids)?;
                fallible::room_for_one(&mut locations)?;
                fallible::room_for_one(&mut functions)?;
                let id = *local.entry((f, function)).or_insert_with(|| {
                    let frame = snap.frames[f as usize];
                    let (name, start_line) = match function {
                        Some(k) => {
                            let k = &snap.functions[k as usize];
                            (lossy(&k.name), k.first_lineno)
                        }
                        None => (UNKNOWN_FUNCTION.to_owned(), 0),
                    };
                    let filename = lossy(&snap.filenames[frame.filename as usize]);
                    let key = (
                        strings.get(&name),
                        strings.get(&filename),
                        start_line as i64,
                    );
                    let function_id = *function_ids.entry(key).or_insert_with(|| {
                        // The system name identifies the code object (qualified name, file,
                        // first line). It must differ from the name: pprof takes a function
                        // whose two names are equal for a C++ symbol still to demangle, and
                        // strips `<module>` or `<lambda>` to nothing as template arguments.
                        let system_name = format!("{name} ({filename}:{start_line})");
                        functions.push(proto::Function {
                            id: functions.len() as u64 + 1,
                            name: key.0,
                            system_name: strings.get(&system_name),
                            filename: key.1,
                            start_line: key.2,
                        });
                        functions.len() as u64
                    });
                    *location_ids
                        .entry((function_id, frame.lineno as i64))
                        .or_insert_with(|| {
                            locations.push(Location {
                                id: locations.len() as u64 + 1,
                                mapping_id: 1,
                                address: 0,
                                line: vec![Line {
                                    function_id,
                                    line: frame.lineno as i64,
                                }],
                            });
                            locations.len() as u64
                        })
                });
                location_id.push(id);
            }
            let found = if merging {
                fallible::map_room_for_one(&mut sample_ids)?;
                let key = (fallible::cloned(&location_id)?, stack.domain);
                let next = samples.len();
                let i = *sample_ids.entry(key).or_insert(next);
                (i != next).then_some(i)
            } else {
                None
            };
            let i = match found {
                Some(i) => i,
                None => {
                    let label = if stack.domain != 0 {
                        vec![Label {
                            key: domain_key,
                            num: stack.domain as i64,
                            ..Label::default()
                        }]
                    } else {
                        Vec::new()
                    };
                    samples.push(Sample {
                        location_id,
                        value: Vec::new(),
                        label,
                    });
                    values.extend(std::iter::repeat_n(0, width));
                    samples.len() - 1
                }
            };
            let v = &mut values[i * width + slot..];
            v[0] = v[0].saturating_add(stack.count);
            v[1] = v[1].saturating_add(stack.size);
        }
    }
    for (i, sample) in samples.iter_mut().enumerate() {
        sample.value = values[i * width..(i + 1) * width]
            .iter()
            .map(|&v| clamp(v))
            .collect();
    }
    // One mapping that says symbols are already there, so pprof does not try to symbolize.
    let mapping = vec![Mapping {
        id: 1,
        filename: strings.get("python"),
        has_functions: true,
        has_filenames: true,
        has_line_numbers: true,
        ..Mapping::default()
    }];
    let mut comment = Vec::new();
    let md = &snapshot.metadata;
    if let Some((major, minor, micro)) = md.python_version {
        comment.push(strings.get(&format!("python {major}.{minor}.{micro}")));
    }
    if let Some(pid) = md.pid {
        comment.push(strings.get(&format!("pid {pid}")));
    }
    if let Some(interval) = snapshot.sample_interval {
        comment.push(strings.get(&format!(
            "sampled every {interval} bytes on average: values are estimates"
        )));
    }
    Ok(Profile {
        sample_type,
        sample: samples,
        mapping,
        location: locations,
        function: functions,
        string_table: strings.table,
        time_nanos: md
            .timestamp
            .filter(|t| t.is_finite() && *t > 0.0)
            .map_or(0, |t| (t * 1e9) as i64),
        duration_nanos: 0,
        period_type,
        period: snapshot.sample_interval.map_or(1, clamp),
        comment,
        default_sample_type,
    })
}

/// The gzipped pprof file's bytes.
pub fn pprof(snapshot: &Snapshot) -> Result<Vec<u8>> {
    gzip(encoded(pprof_profile(snapshot)?)?)
}

/// A profile of the time span `[time_nanos, time_nanos + duration_nanos]`, as a profile
/// pusher sends it: the profile's own time is the span's start (the snapshot's time is its
/// end), gzipped or not (the push API compresses the whole request instead).
pub fn pprof_span(
    snapshot: &Snapshot,
    allocated: Option<&Snapshot>,
    time_nanos: i64,
    duration_nanos: i64,
    compress: bool,
) -> Result<Vec<u8>> {
    let mut profile = pprof_profile_with(snapshot, allocated)?;
    profile.time_nanos = time_nanos;
    profile.duration_nanos = duration_nanos;
    let message = encoded(profile)?;
    if compress {
        gzip(message)
    } else {
        Ok(message)
    }
}

fn encoded(profile: proto::Profile) -> Result<Vec<u8>> {
    let mut message = fallible::with_capacity(profile.encoded_len())?;
    profile
        .encode(&mut message)
        .expect("the buffer was reserved for the whole message");
    Ok(message)
}

fn gzip(message: Vec<u8>) -> Result<Vec<u8>> {
    // Deflate never grows data by more than a few bytes per 16 KiB block: with this much
    // room reserved up front, the compressed output never reallocates (infallibly).
    let room = message.len() + message.len() / 1000 + 1024;
    let mut gz = GzEncoder::new(fallible::with_capacity(room)?, Compression::default());
    gz.write_all(&message)
        .expect("compressing into memory cannot fail");
    Ok(gz.finish().expect("compressing into memory cannot fail"))
}

/// One frame in folded-stack form: `function (file:line)`, or `file:line` where the function
/// is unknown. `;` separates frames and a line ends a stack, so both are replaced.
fn frame_label(snapshot: &Snapshot, f: FrameId, function: Option<&Function>) -> String {
    let frame = snapshot.frames[f as usize];
    let file = lossy(&snapshot.filenames[frame.filename as usize]);
    let label = match function {
        Some(function) => format!("{} ({file}:{})", lossy(&function.name), frame.lineno),
        None => format!("{file}:{}", frame.lineno),
    };
    label.replace(';', ",").replace(['\n', '\r'], " ")
}

/// Shown for a traceback with no frames (only raw tuples can make one).
const EMPTY_STACK: &str = "[no frames]";

/// Folded stacks and their live bytes, merged by text so two snapshots can be matched.
fn folded(snapshot: &Snapshot) -> Result<HashMap<String, u64>> {
    let mut labels: HashMap<(FrameId, Option<FunctionId>), String> = HashMap::new();
    let mut out: HashMap<String, u64> = HashMap::new();
    for stack in stacks(snapshot, false)? {
        fallible::check()?;
        let frames = &snapshot.tracebacks[stack.traceback as usize].frames;
        let known = snapshot.traceback_functions.get(stack.traceback as usize);
        let mut line = String::new();
        for (i, &f) in frames.iter().enumerate().rev() {
            if !line.is_empty() {
                line.push(';');
            }
            let function = known.and_then(|k| k.get(i).copied().flatten());
            fallible::map_room_for_one(&mut labels)?;
            let label = labels.entry((f, function)).or_insert_with(|| {
                frame_label(
                    snapshot,
                    f,
                    function.map(|id| &snapshot.functions[id as usize]),
                )
            });
            line.push_str(label);
        }
        if line.is_empty() {
            line.push_str(EMPTY_STACK);
        }
        fallible::map_room_for_one(&mut out)?;
        let total = out.entry(line).or_insert(0);
        *total = total.saturating_add(stack.size);
    }
    Ok(out)
}

/// Folded stacks (`root;...;leaf bytes`, oldest frame first), one line per distinct stack,
/// sorted by stack.
pub fn collapsed(snapshot: &Snapshot) -> Result<String> {
    let folded = folded(snapshot)?;
    let n = folded.len();
    let mut lines: Vec<(String, u64)> = fallible::collect_n(folded.into_iter(), n)?;
    lines.sort_unstable();
    // Each line: the stack, a space, at most 20 digits and a newline.
    let length = lines.iter().map(|(stack, _)| stack.len() + 22).sum();
    let mut out = String::new();
    out.try_reserve_exact(length)?;
    for (stack, size) in lines {
        out.push_str(&stack);
        out.push(' ');
        out.push_str(&size.to_string());
        out.push('\n');
    }
    Ok(out)
}

/// What a flamegraph node names: a frame and the function running there (where known), or
/// `None` for the node of stacks that have no frames.
pub type FlameFrame = Option<(FrameId, Option<FunctionId>)>;

/// A flamegraph of live memory as a tree cut to its largest nodes, for the HTML report.
pub struct Flame {
    /// The distinct frames the kept nodes name, in order of first use.
    pub frames: Vec<FlameFrame>,
    /// The kept nodes depth-first, a node's children by decreasing bytes (ties: first seen
    /// first): index into `frames` (`None` for the root, which stands for everything), bytes,
    /// depth (the root's is 0).
    pub nodes: Vec<(Option<u32>, u64, u32)>,
}

const NO_NODE: u32 = u32::MAX;

/// One node of the stack tree; children are a linked list, so a node costs 32 bytes however
/// many it has.
struct TreeNode {
    frame: FlameFrame,
    bytes: u64,
    depth: u32,
    first_child: u32,
    next_sibling: u32,
}

/// The tree of every stack of `snapshot` (oldest frame at the root's children) cut to the
/// `budget` nodes with the most bytes (the root included; on ties the shallower, then the first
/// made). A child never holds more than its parent and wins a tie against it by neither rule,
/// so what is kept is a tree; what is cut shows as the gap under its parent.
///
/// Built from the distinct stacks, so it costs what they cost, not what the traces do.
pub fn flame(snapshot: &Snapshot, budget: usize) -> Result<Flame> {
    let mut tree: Vec<TreeNode> = vec![TreeNode {
        frame: None,
        bytes: 0,
        depth: 0,
        first_child: NO_NODE,
        next_sibling: NO_NODE,
    }];
    let mut child_of: HashMap<(u32, FlameFrame), u32> = HashMap::new();
    for stack in stacks(snapshot, false)? {
        fallible::check()?;
        let frames = &snapshot.tracebacks[stack.traceback as usize].frames;
        let known = snapshot.traceback_functions.get(stack.traceback as usize);
        tree[0].bytes = tree[0].bytes.saturating_add(stack.size);
        let path = frames.iter().enumerate().rev().map(|(i, &f)| {
            let function = known.and_then(|k| k.get(i).copied().flatten());
            Some((f, function))
        });
        // A stack without frames is one node of its own under the root.
        let path: Box<dyn Iterator<Item = FlameFrame>> = if frames.is_empty() {
            Box::new(std::iter::once(None))
        } else {
            Box::new(path)
        };
        let mut node = 0u32;
        for frame in path {
            fallible::map_room_for_one(&mut child_of)?;
            let next = match child_of.get(&(node, frame)) {
                Some(&child) => child,
                None => {
                    fallible::room_for_one(&mut tree)?;
                    let child = tree.len() as u32;
                    let parent = &tree[node as usize];
                    let (depth, sibling) = (parent.depth + 1, parent.first_child);
                    tree.push(TreeNode {
                        frame,
                        bytes: 0,
                        depth,
                        first_child: NO_NODE,
                        next_sibling: sibling,
                    });
                    tree[node as usize].first_child = child;
                    child_of.insert((node, frame), child);
                    child
                }
            };
            tree[next as usize].bytes = tree[next as usize].bytes.saturating_add(stack.size);
            node = next;
        }
    }
    drop(child_of);
    let mut order: Vec<u32> = fallible::collect_n(0..tree.len() as u32, tree.len())?;
    order.sort_unstable_by_key(|&i| {
        let node = &tree[i as usize];
        (std::cmp::Reverse(node.bytes), node.depth, i)
    });
    let mut kept = fallible::filled(tree.len(), false)?;
    for &i in order.iter().take(budget.max(1)) {
        kept[i as usize] = true;
    }
    drop(order);
    let mut out = Flame {
        frames: Vec::new(),
        nodes: Vec::new(),
    };
    let mut frame_index: HashMap<FlameFrame, u32> = HashMap::new();
    let mut pending = vec![0u32];
    while let Some(i) = pending.pop() {
        fallible::check()?;
        let node = &tree[i as usize];
        let index = if i == 0 {
            None
        } else {
            let next = out.frames.len() as u32;
            let index = *frame_index.entry(node.frame).or_insert(next);
            if index == next {
                out.frames.push(node.frame);
            }
            Some(index)
        };
        out.nodes.push((index, node.bytes, node.depth));
        // Children were linked newest first: by decreasing bytes, the first made first, then
        // pushed in reverse so that the largest is visited next.
        let mut children = Vec::new();
        let mut child = node.first_child;
        while child != NO_NODE {
            if kept[child as usize] {
                children.push(child);
            }
            child = tree[child as usize].next_sibling;
        }
        children.sort_by_key(|&c| (std::cmp::Reverse(tree[c as usize].bytes), c));
        pending.extend(children.into_iter().rev());
    }
    Ok(out)
}

/// An interactive SVG flamegraph of live memory by stack; with `base`, a differential one of
/// the change since `base`: widths are the new sizes, red frames grew and blue ones shrank.
pub fn flamegraph(
    snapshot: &Snapshot,
    base: Option<&Snapshot>,
    title: Option<&str>,
) -> Result<Vec<u8>> {
    let new = folded(snapshot)?;
    let mut lines: Vec<String> = match base {
        None => {
            let lines = new
                .iter()
                .filter(|(_, &size)| size > 0)
                .map(|(stack, size)| format!("{stack} {size}"));
            fallible::collect_n(lines, new.len())?
        }
        Some(base) => {
            let old = folded(base)?;
            let n = new.len() + old.len();
            let mut stacks: Vec<&String> = fallible::collect_n(new.keys().chain(old.keys()), n)?;
            stacks.sort_unstable();
            stacks.dedup();
            let lines = stacks.iter().map(|s| {
                let before = old.get(*s).copied().unwrap_or(0);
                let after = new.get(*s).copied().unwrap_or(0);
                format!("{s} {before} {after}")
            });
            fallible::collect_n(lines, stacks.len())?
        }
    };
    if new.values().all(|&size| size == 0) {
        return Err(Error::InvalidArgument(
            "the snapshot holds no traced memory to draw a flamegraph of".into(),
        ));
    }
    lines.sort_unstable();
    let total: u64 = new.values().fold(0, |a, &b| a.saturating_add(b));
    let mut options = inferno::flamegraph::Options::default();
    options.title = title.map(str::to_owned).unwrap_or_else(|| match base {
        None => "Live memory by stack".into(),
        Some(_) => "Memory growth by stack".into(),
    });
    let estimated = match snapshot.sample_interval {
        Some(interval) => format!(" (estimated, sampled every {})", human_interval(interval)),
        None => String::new(),
    };
    let live = format!("{} live ({total} bytes){estimated}", human_size(total));
    options.subtitle = Some(match base {
        None => format!("{live}; widths are bytes"),
        Some(_) => format!("{live}; widths are new bytes, red grew, blue shrank"),
    });
    options.count_name = "bytes".into();
    options.name_type = "Frame:".into();
    options.colors =
        inferno::flamegraph::color::Palette::Basic(inferno::flamegraph::color::BasicPalette::Mem);
    options.hash = true;
    options.deterministic = true;
    // inferno allocates infallibly (about 1.2 times the lines' size, measured on a 32 MB
    // input): check that twice the lines' size can be had now, so that memory too short to
    // draw is a MemoryError here rather than an abort inside inferno.
    let input: usize = lines.iter().map(|line| line.len() + 16).sum();
    drop(fallible::with_capacity::<u8>(input.saturating_mul(2))?);
    let mut svg = Vec::new();
    inferno::flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), &mut svg)
        .map_err(|e| Error::InvalidArgument(format!("cannot draw the flamegraph: {e}")))?;
    Ok(svg)
}

/// A byte count for people, as the command line prints them (`_report.format_size`): `512 B`,
/// `35.9 MiB`. Exact counts are for machines; a subtitle is read.
fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// A sampling interval as the command line prints it (`_report.format_interval`): `512 KiB`
/// when it is a whole number of a unit, else as [`human_size`].
fn human_interval(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    for (power, unit) in UNITS.iter().enumerate().rev() {
        let scale = 1u64 << (10 * (power + 1));
        if bytes >= scale && bytes % scale == 0 {
            return format!("{} {unit}", bytes / scale);
        }
    }
    human_size(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::sampling::Weights;

    #[test]
    fn human_sizes_match_the_command_lines() {
        for (bytes, shown) in [
            (0, "0 B"),
            (1023, "1023 B"),
            (1024, "1.0 KiB"),
            (37_601_276, "35.9 MiB"),
            (524_288, "512.0 KiB"),
            (u64::MAX, "16384.0 PiB"),
        ] {
            assert_eq!(human_size(bytes), shown, "{bytes}");
        }
        for (bytes, shown) in [
            (1000, "1000 B"),
            (4096, "4 KiB"),
            (524_288, "512 KiB"),
            (3 << 20, "3 MiB"),
            (1536, "1.5 KiB"),
        ] {
            assert_eq!(human_interval(bytes), shown, "{bytes}");
        }
    }
    use crate::analysis::snapshot::SnapshotBuilder;

    /// main (app.py:10) -> load (app.py:3) -> two allocation sites, plus a second domain and
    /// a frame without a known function.
    fn sample() -> Snapshot {
        let mut b = SnapshotBuilder::new(5);
        let app = b.filename(b"app.py");
        let lib = b.filename(b"lib;x.py");
        let main = b.frame(app, 10);
        let load = b.frame(app, 3);
        let parse = b.frame(lib, 7);
        let other = b.frame(lib, 20);
        let module = b.function(b"<module>", 1);
        let loader = b.function(b"Loader.load", 2);
        let parser = b.function(b"parse", 5);
        let t1 = b.traceback(&[parse, load, main], Some(3));
        let t1_deeper = b.traceback(&[parse, load, main], Some(9));
        let t2 = b.traceback(&[other, main], Some(2));
        for t in [t1, t1_deeper] {
            b.traceback_functions(t, &[Some(parser), Some(loader), Some(module)]);
        }
        b.traceback_functions(t2, &[None, Some(module)]);
        b.trace(0, 100, t1);
        b.trace(0, 50, t1_deeper);
        b.trace(0, 30, t2);
        b.trace(7, 8, t2);
        b.metadata(crate::analysis::snapshot::Metadata {
            python_version: Some((3, 12, 1)),
            timestamp: Some(2.0),
            pid: Some(9),
            argv: Vec::new(),
            ..Default::default()
        });
        b.finish()
    }

    /// One trace of `sized` bytes at a.py:1 without function names, one of `frameless` bytes
    /// with an empty stack.
    fn one_frame_and_no_frames(sized: u64, frameless: u64) -> Snapshot {
        let mut b = SnapshotBuilder::new(1);
        let a = b.filename(b"a.py");
        let f = b.frame(a, 1);
        let t = b.traceback(&[f], None);
        let empty = b.traceback(&[], None);
        b.trace(0, sized, t);
        b.trace(0, frameless, empty);
        b.finish()
    }

    #[test]
    fn collapsed_lines() {
        let expected = "\
<module> (app.py:10);Loader.load (app.py:3);parse (lib,x.py:7) 150
<module> (app.py:10);lib,x.py:20 38
";
        assert_eq!(collapsed(&sample()).unwrap(), expected);
        // No functions recorded: file:line only.
        assert_eq!(
            collapsed(&one_frame_and_no_frames(5, 0)).unwrap(),
            "[no frames] 0\na.py:1 5\n"
        );
        assert_eq!(collapsed(&SnapshotBuilder::new(1).finish()).unwrap(), "");
        // One line running in two functions (a comprehension on its parent's line).
        let mut b = SnapshotBuilder::new(2);
        let a = b.filename(b"a.py");
        let f = b.frame(a, 5);
        let fill = b.function(b"fill", 4);
        let comp = b.function(b"fill.<locals>.<listcomp>", 5);
        let t = b.traceback(&[f, f], None);
        b.traceback_functions(t, &[Some(comp), Some(fill)]);
        b.trace(0, 3, t);
        let s = b.finish();
        assert_eq!(
            collapsed(&s).unwrap(),
            "fill (a.py:5);fill.<locals>.<listcomp> (a.py:5) 3\n"
        );
        let p = pprof_profile(&s).unwrap();
        assert_eq!((p.location.len(), p.function.len()), (2, 2));
    }

    /// The flame of `sample()`: names of the nodes depth-first as "file:line" (the root "all").
    fn flame_names(snapshot: &Snapshot, flame: &Flame) -> Vec<(String, u64, u32)> {
        flame
            .nodes
            .iter()
            .map(|&(index, bytes, depth)| {
                let name = match index.map(|i| flame.frames[i as usize]) {
                    None => "all".to_owned(),
                    Some(None) => EMPTY_STACK.to_owned(),
                    Some(Some((f, _))) => {
                        let frame = snapshot.frames[f as usize];
                        format!(
                            "{}:{}",
                            lossy(&snapshot.filenames[frame.filename as usize]),
                            frame.lineno
                        )
                    }
                };
                (name, bytes, depth)
            })
            .collect()
    }

    #[test]
    fn flame_tree_and_budget() {
        let s = sample();
        let full = flame(&s, 100).unwrap();
        let expected = [
            ("all", 188, 0),
            ("app.py:10", 188, 1),
            ("app.py:3", 150, 2),
            ("lib;x.py:7", 150, 3),
            ("lib;x.py:20", 38, 2),
        ];
        let names = flame_names(&s, &full);
        let got: Vec<(&str, u64, u32)> = names.iter().map(|(n, b, d)| (&n[..], *b, *d)).collect();
        assert_eq!(got, expected);
        // Frames are listed once each, with the function running there.
        assert_eq!(full.frames.len(), 4);
        assert!(full.frames.iter().all(|f| f.is_some_and(
            |(_, func)| func.is_some() || s.frames[f.unwrap().0 as usize].lineno == 20
        )));
        // Cut to the three largest: the root, main, and one of the 150-byte pair (the
        // shallower); the 38-byte branch is a gap.
        let cut = flame_names(&s, &flame(&s, 3).unwrap());
        let got: Vec<(&str, u64)> = cut.iter().map(|(n, b, _)| (&n[..], *b)).collect();
        assert_eq!(got, [("all", 188), ("app.py:10", 188), ("app.py:3", 150)]);
        // A budget of 0 still draws the root; stacks without frames are one node.
        assert_eq!(flame(&s, 0).unwrap().nodes.len(), 1);
        let e = one_frame_and_no_frames(5, 7);
        let names = flame_names(&e, &flame(&e, 10).unwrap());
        let got: Vec<(&str, u64, u32)> = names.iter().map(|(n, b, d)| (&n[..], *b, *d)).collect();
        assert_eq!(got, [("all", 12, 0), (EMPTY_STACK, 7, 1), ("a.py:1", 5, 1)]);
        assert!(
            flame(&SnapshotBuilder::new(1).finish(), 10)
                .unwrap()
                .nodes
                .len()
                == 1
        );
    }

    #[test]
    fn sampled_snapshots_export_estimates() {
        let mut b = SnapshotBuilder::new(1);
        let a = b.filename(b"a.py");
        let f = b.frame(a, 1);
        let t = b.traceback(&[f], None);
        b.trace(0, 100, t);
        b.trace(0, 4 << 20, t);
        b.sample_interval(Some(4096));
        let s = b.finish();
        let w = Weights::new(Some(4096));
        let bytes = w.bytes(100) + w.bytes(4 << 20);
        let count = count_from_units(w.count_units(100) + w.count_units(4 << 20));
        assert_eq!(collapsed(&s).unwrap(), format!("a.py:1 {bytes}\n"));
        let p = pprof_profile(&s).unwrap();
        assert_eq!(p.period, 4096);
        assert_eq!(p.sample[0].value, vec![count as i64, bytes as i64]);
        assert!(p
            .comment
            .iter()
            .any(|&c| p.string_table[c as usize].contains("estimates")));
        let svg = String::from_utf8(flamegraph(&s, None, None).unwrap()).unwrap();
        assert!(svg.contains("estimated, sampled every 4 KiB"));
    }

    /// In-use and allocated stacks from two snapshots meet by content: one sample per stack
    /// and domain with the four values in Go's order, zeros where one side has nothing.
    #[test]
    fn pprof_with_allocations_merges_stacks_by_content() {
        let live = sample();
        let mut b = SnapshotBuilder::new(5);
        // Tables in another order than the live snapshot's, so ids differ.
        let gone = b.filename(b"gone.py");
        let lib = b.filename(b"lib;x.py");
        let app = b.filename(b"app.py");
        let freed = b.frame(gone, 4);
        let main = b.frame(app, 10);
        let load = b.frame(app, 3);
        let parse = b.frame(lib, 7);
        let other = b.frame(lib, 20);
        let parser = b.function(b"parse", 5);
        let module = b.function(b"<module>", 1);
        let loader = b.function(b"Loader.load", 2);
        let t_freed = b.traceback(&[freed], Some(1));
        let t1 = b.traceback(&[parse, load, main], Some(3));
        let t2 = b.traceback(&[other, main], Some(2));
        b.traceback_functions(t1, &[Some(parser), Some(loader), Some(module)]);
        b.traceback_functions(t2, &[None, Some(module)]);
        b.aggregate(0, 4000, 40, t_freed);
        b.aggregate(0, 900, 9, t1);
        b.aggregate(7, 16, 2, t2);
        b.aggregates();
        let allocated = b.finish();
        let p = pprof_profile_with(&live, Some(&allocated)).unwrap();
        let st = |i: i64| p.string_table[i as usize].as_str();
        let types: Vec<_> = p
            .sample_type
            .iter()
            .map(|t| (st(t.r#type), st(t.unit)))
            .collect();
        assert_eq!(
            types,
            [
                ("alloc_objects", "count"),
                ("alloc_space", "bytes"),
                ("inuse_objects", "count"),
                ("inuse_space", "bytes"),
            ]
        );
        assert_eq!(st(p.default_sample_type), "inuse_space");
        let leaf = |s: &proto::Sample| {
            let location = &p.location[s.location_id[0] as usize - 1];
            let function = &p.function[location.line[0].function_id as usize - 1];
            let domain = s.label.first().map_or(0, |l| l.num);
            (
                format!("{}:{}", st(function.filename), location.line[0].line),
                s.location_id.len(),
                domain,
            )
        };
        let mut got: Vec<_> = p
            .sample
            .iter()
            .map(|s| (leaf(s), s.value.clone()))
            .collect();
        got.sort();
        assert_eq!(
            got,
            [
                (("gone.py:4".to_owned(), 1, 0), vec![40, 4000, 0, 0]),
                (("lib;x.py:20".to_owned(), 2, 0), vec![0, 0, 1, 30]),
                (("lib;x.py:20".to_owned(), 2, 7), vec![2, 16, 1, 8]),
                (("lib;x.py:7".to_owned(), 3, 0), vec![9, 900, 2, 150]),
            ]
        );
        // Every location and function once, whichever snapshot named it first.
        assert_eq!(p.location.len(), 5);
        assert_eq!(p.function.len(), 5);
        // Without allocations: the in-use profile as before.
        let plain = pprof_profile(&live).unwrap();
        assert_eq!(plain.sample_type.len(), 2);
        assert!(plain.sample.iter().all(|s| s.value.len() == 2));
    }

    #[test]
    fn pprof_span_stamps_the_interval() {
        let s = sample();
        let whole = {
            let data = pprof(&s).unwrap();
            let mut raw = Vec::new();
            std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&data[..]), &mut raw)
                .unwrap();
            proto::Profile::decode(&raw[..]).unwrap()
        };
        // (start, duration, compressed): the start and length replace the snapshot's time.
        for (start, duration, compress) in [(5, 7, false), (1_000, 0, true), (0, 1 << 40, false)] {
            let data = pprof_span(&s, None, start, duration, compress).unwrap();
            assert_eq!(data.starts_with(&[0x1f, 0x8b]), compress);
            let raw = if compress {
                let mut raw = Vec::new();
                std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&data[..]), &mut raw)
                    .unwrap();
                raw
            } else {
                data
            };
            let p = proto::Profile::decode(&raw[..]).unwrap();
            assert_eq!((p.time_nanos, p.duration_nanos), (start, duration));
            assert_eq!(p.sample, whole.sample);
            assert_eq!(p.string_table, whole.string_table);
        }
    }

    #[test]
    fn pprof_round_trip() {
        let s = sample();
        let data = pprof(&s).unwrap();
        let mut gz = flate2::read::GzDecoder::new(&data[..]);
        let mut raw = Vec::new();
        std::io::Read::read_to_end(&mut gz, &mut raw).unwrap();
        let p = proto::Profile::decode(&raw[..]).unwrap();
        let st = |i: i64| p.string_table[i as usize].as_str();
        assert_eq!(st(0), "");
        let types: Vec<_> = p
            .sample_type
            .iter()
            .map(|v| (st(v.r#type), st(v.unit)))
            .collect();
        assert_eq!(
            types,
            [("inuse_objects", "count"), ("inuse_space", "bytes")]
        );
        let period = p.period_type.as_ref().unwrap();
        assert_eq!(
            (st(period.r#type), st(period.unit), p.period),
            ("space", "bytes", 1)
        );
        assert_eq!(st(p.default_sample_type), "inuse_space");
        assert_eq!(p.time_nanos, 2_000_000_000);
        // Samples: stack of t1 and t1_deeper merged; t2 split by domain, domain 7 labelled.
        let describe = |loc: u64| {
            let l = p.location.iter().find(|l| l.id == loc).unwrap();
            let f = p
                .function
                .iter()
                .find(|f| f.id == l.line[0].function_id)
                .unwrap();
            format!(
                "{}@{}:{} (from {})",
                st(f.name),
                st(f.filename),
                l.line[0].line,
                f.start_line
            )
        };
        /// Locations described, values, labels.
        type Row = (Vec<String>, Vec<i64>, Vec<(String, i64)>);
        let samples: Vec<Row> = p
            .sample
            .iter()
            .map(|s| {
                (
                    s.location_id.iter().map(|&l| describe(l)).collect(),
                    s.value.clone(),
                    s.label
                        .iter()
                        .map(|l| (st(l.key).to_owned(), l.num))
                        .collect(),
                )
            })
            .collect();
        let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            samples,
            [
                (
                    strings(&[
                        "parse@lib;x.py:7 (from 5)",
                        "Loader.load@app.py:3 (from 2)",
                        "<module>@app.py:10 (from 1)"
                    ]),
                    vec![2, 150],
                    vec![]
                ),
                (
                    strings(&[
                        "<unknown>@lib;x.py:20 (from 0)",
                        "<module>@app.py:10 (from 1)"
                    ]),
                    vec![1, 30],
                    vec![]
                ),
                (
                    strings(&[
                        "<unknown>@lib;x.py:20 (from 0)",
                        "<module>@app.py:10 (from 1)"
                    ]),
                    vec![1, 8],
                    vec![("domain".to_owned(), 7)]
                ),
            ]
        );
        // One location per frame, one function per distinct function, no string twice.
        assert_eq!(p.location.len(), 4);
        assert_eq!(p.function.len(), 4);
        let f = p
            .function
            .iter()
            .find(|f| st(f.name) == "<module>")
            .unwrap();
        assert_eq!(st(f.system_name), "<module> (app.py:1)");
        let mut table = p.string_table.clone();
        table.sort();
        table.dedup();
        assert_eq!(table.len(), p.string_table.len());
    }

    #[test]
    fn flamegraph_svg_structure() {
        let s = sample();
        let svg = String::from_utf8(flamegraph(&s, None, Some("T&T")).unwrap()).unwrap();
        assert!(svg.starts_with("<?xml"));
        assert!(svg.contains("T&amp;T"));
        for title in [
            "<title>all (188 bytes, 100%)</title>",
            "<title>&lt;module&gt; (app.py:10) (188 bytes, 100.00%)</title>",
            "<title>parse (lib,x.py:7) (150 bytes, 79.79%)</title>",
            "<title>lib,x.py:20 (38 bytes, 20.21%)</title>",
        ] {
            assert!(svg.contains(title), "{title} missing");
        }
        // Differential: growth of the parse stack since a base without it.
        let mut b = SnapshotBuilder::new(5);
        let app = b.filename(b"app.py");
        let main = b.frame(app, 10);
        let module = b.function(b"<module>", 1);
        let lib = b.filename(b"lib;x.py");
        let other = b.frame(lib, 20);
        let t = b.traceback(&[other, main], None);
        b.traceback_functions(t, &[None, Some(module)]);
        b.trace(0, 38, t);
        let base = b.finish();
        let diff = String::from_utf8(flamegraph(&s, Some(&base), None).unwrap()).unwrap();
        assert!(diff.contains("Memory growth by stack"));
        assert!(
            diff.contains("parse (lib,x.py:7) (150 bytes, 79.79%; +79.79%)"),
            "{diff}"
        );
        // Nothing to draw is an error, not an empty picture.
        let err = flamegraph(&SnapshotBuilder::new(1).finish(), None, None).unwrap_err();
        assert!(err.to_string().contains("no traced memory"));
    }
}
