//! The snapshot file format: compact, versioned, checksummed, and safe to read from untrusted
//! files (no pickle, no code execution, no allocation sized by a number read from the file).
//!
//! Layout (all fixed-width integers little-endian):
//!
//! ```text
//! magic            8 bytes  b"ALCTRSNP"
//! format version   u32      1, or 2 with sampling (section 9); bumped only for changes old
//!                           readers cannot skip
//! section*         tag u32, length u64, payload[length]
//! end section      tag 0, length 4, CRC-32 (IEEE) of every byte before the CRC itself
//! ```
//!
//! Sections: 1 metadata (bincode + serde), 2 filenames, 3 frames, 4 tracebacks, 5 traces
//! (version 1), 6 user attributes, 7 functions per traceback frame (optional: absent in files written before function
//! names were recorded, which load with every function unknown), 8 traces (version 2, below),
//! 9 sampling interval (below), 10 object kinds (optional:
//! the kind-name table, then one kind id per trace, in trace order; written only for
//! snapshots taken with `objects=True`), 11 retention reports (optional: see
//! [`decode_retention`]), 12 the peak (optional: see [`put_peak_section`]). Tables are written once and referenced by index; integers inside the
//! tables are unsigned LEB128, and traces are stored by column (run-length domains, sizes,
//! traceback ids) because that is what makes a 1M-trace dump a few MB.
//!
//! Extending: a reader skips section tags it does not know, so new information (function
//! names for pprof export, say) goes in a new section and old readers still load the file.
//! The version is bumped only if an existing section changes meaning; a reader refuses a file
//! with a newer version and names both versions.
//!
//! Section 9, sampling (uleb128 interval R in bytes, 1..=2^40), is present only in snapshots
//! taken in sampled mode. It is an addition old readers must not skip: without it the
//! sampled traces would load as an exact snapshot and every total would be silently wrong
//! (a few hundred sampled blocks shown as the whole heap). Sampled mode came with version 2,
//! which a version-1 reader refuses by its number, so no release can misread a sampled file.
//! A file without the section loads as exact.
//!
//! Versions: 1 stored the traces in section 5, sizes and traceback ids as LEB128. Decoding
//! those branches on every byte's continuation bit, unpredictably (sizes straddle 1 and 2
//! bytes), which made `load()` of a million traces cost ~86 instructions and several branch
//! misses per trace. Version 2 (written now) stores them in section 8 instead: domain runs as
//! before, then the sizes and the traceback ids each as a column of blocks of 16 values, one
//! width code per block (1, 2, 4 or 8 bytes; ids at most 4) and the block's values at that
//! width, which decode in one fixed-width loop per block. A file holds the traces section of
//! its own version only; files of version 1 keep loading. A version-1 reader refuses version-2
//! files by their version number rather than failing for want of section 5.
//!
//! Reading checks the structure (truncation, trailing bytes), then the checksum, then decodes
//! every section against its own length: every count is checked against the bytes left before
//! anything is reserved, every id against the table it indexes, nesting of attribute values is
//! bounded. Any failure is an `Err` with a reason, never a panic.

use std::fmt;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::analysis::filter::is_surrogatepass_utf8;
use crate::analysis::parallel;
use crate::analysis::sampling::MAX_INTERVAL;
use crate::analysis::snapshot::{
    Domains, Frame, Function, FunctionId, Kinds, Metadata, SiteRetention, Snapshot, Trace,
    Traceback,
};
use crate::error::{Error, Result};
use crate::fallible;
use crate::process_memory::ProcessMemory;

pub const MAGIC: &[u8; 8] = b"ALCTRSNP";
/// The version this build writes and the newest it reads.
pub const FORMAT_VERSION: u32 = 2;

const TAG_END: u32 = 0;
const TAG_META: u32 = 1;
const TAG_FILENAMES: u32 = 2;
const TAG_FRAMES: u32 = 3;
const TAG_TRACEBACKS: u32 = 4;
const TAG_TRACES: u32 = 5;
const TAG_ATTRS: u32 = 6;
const TAG_FUNCTIONS: u32 = 7;
const TAG_TRACE_COLUMNS: u32 = 8;
const TAG_SAMPLING: u32 = 9;
/// Object kinds per trace (optional; see [`decode_kinds`]).
const TAG_KINDS: u32 = 10;
/// Retention reports (optional; see [`decode_retention`]).
const TAG_RETENTION: u32 = 11;
/// The process's resident memory at capture time (optional; see [`decode_process_memory`]).
const TAG_PROCESS_MEMORY: u32 = 13;
/// Fields section 13 holds today; a later writer may append more, which this reader skips.
const PROCESS_MEMORY_FIELDS: u64 = 5;
/// The peak (section 12): see [`put_peak_section`].
const TAG_PEAK: u32 = 12;
const HEADER_LEN: usize = 12;
const SECTION_HEADER_LEN: usize = 12;
/// Deepest nesting of list/tuple/dict attribute values accepted, when storing and loading.
pub const MAX_ATTR_DEPTH: usize = 64;

/// A user attribute's value (`snapshot.some_name = value`), stored as a tagged tree rather
/// than pickled so that loading a file can never run code.
#[derive(Clone, Debug, PartialEq)]
pub enum AttrValue {
    None,
    Bool(bool),
    Int(i64),
    /// An int outside i64: signed little-endian two's complement bytes.
    BigInt(Vec<u8>),
    Float(f64),
    /// surrogatepass UTF-8.
    Str(Vec<u8>),
    Bytes(Vec<u8>),
    List(Vec<AttrValue>),
    Tuple(Vec<AttrValue>),
    /// Keys are surrogatepass UTF-8 strings; insertion order is kept.
    Dict(Vec<(Vec<u8>, AttrValue)>),
}

/// Named attributes in the order they were set.
pub type Attributes = Vec<(Vec<u8>, AttrValue)>;

/// Section 1. A new field means a new section, never a change here (bincode is not
/// self-describing).
#[derive(Serialize, Deserialize)]
struct MetaSection {
    traceback_limit: u32,
    python_version: Option<(u8, u8, u8)>,
    timestamp: Option<f64>,
    pid: Option<u32>,
    argv: Vec<String>,
}

/// CRC-32 (IEEE 802.3, the same value as `zlib.crc32`): detects every single-byte change and
/// every burst up to 32 bits. Computed by `crc32fast`, which folds with the CPU's carry-less
/// multiply where there is one: several times faster than a table-driven loop, which matters
/// because a load checksums the whole file before decoding it.
pub fn crc32(data: &[u8]) -> u32 {
    crc32fast::hash(data)
}

#[inline(always)]
fn put_uleb(out: &mut Vec<u8>, mut v: u64) {
    loop {
        let byte = (v & 0x7F) as u8;
        v >>= 7;
        if v == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_uleb(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// Byte width of each width code of a column.
const WIDTHS: [usize; 4] = [1, 2, 4, 8];
/// Values per width code in a column: small enough that one large value widens only its own
/// few neighbours, large enough that each run of one width decodes as a vectorised loop.
const COLUMN_BLOCK: usize = 16;
/// Traces decoded per block: the column buffers stay in the L1 cache. A multiple of
/// `COLUMN_BLOCK`, so every decode block starts a column block.
const DECODE_BLOCK: usize = 256;

/// The smallest width code that holds `v`.
fn width_code(v: u64) -> u8 {
    (v > 0xFF) as u8 + (v > 0xFFFF) as u8 + (v > 0xFFFF_FFFF) as u8
}

/// Section 8's payload, encoded: the traces' count, the domain runs (count, then domain and
/// length of each), then the sizes and the traceback ids each as a column: one width code
/// (0 to 3: 1, 2, 4 or 8 bytes) per block of `COLUMN_BLOCK` values (the last block may be
/// shorter), then each block's values at its width, little-endian, back to back.
///
/// A million traces are 12 MB in memory against a 3 MB file, so the cost is reading them,
/// and they are read once: each block's width comes from the OR of its values (which needs
/// as many bytes as their maximum), and its values are stored while the block is still in
/// the cache. The traces are taken in parts (see [`parallel`]), each part's codes and values
/// kept in buffers of its own, which are written out in file order and never copied
/// into one (the fresh pages of one 3 MB buffer, faulted in by one thread, cost as much as
/// the encoding). The domain runs are the snapshot's own (see [`Domains`]), and the parts'
/// CRC states are combined, so the bytes are the same for any number of parts.
struct TraceColumns {
    /// The count, the domain runs and the sizes' width codes: all before the sizes' values.
    head: Vec<u8>,
    parts: Vec<EncodedPart>,
    /// The ids' width codes, between the two columns' values.
    id_codes: Vec<u8>,
    /// The CRC state of the whole payload.
    crc: crc32fast::Hasher,
}

impl TraceColumns {
    /// Encodes `traces`, whose domains are `domains`, in `parts` parts.
    fn encode(traces: &[Trace], domains: &Domains, parts: usize) -> Result<Self> {
        let jobs = parallel::split(traces.len(), parts, COLUMN_BLOCK)
            .into_iter()
            .map(|r| {
                let part = &traces[r];
                move || EncodedPart::of(part)
            })
            .collect();
        let parts = parallel::run(jobs)
            .into_iter()
            .collect::<Result<Vec<EncodedPart>>>()?;
        let mut head = Vec::new();
        fallible::room_for(&mut head, 2 * MAX_ULEB)?;
        put_uleb(&mut head, traces.len() as u64);
        put_uleb(&mut head, domains.runs().count() as u64);
        for (domain, len) in domains.runs() {
            fallible::room_for(&mut head, 2 * MAX_ULEB)?;
            put_uleb(&mut head, domain as u64);
            put_uleb(&mut head, len as u64);
        }
        let mut id_codes = fallible::with_capacity(traces.len().div_ceil(COLUMN_BLOCK))?;
        for p in &parts {
            fallible::room_for(&mut head, p.size_codes.len())?;
            head.extend_from_slice(&p.size_codes);
            id_codes.extend_from_slice(&p.id_codes);
        }
        let mut crc = crc32fast::Hasher::new();
        crc.update(&head);
        parts.iter().for_each(|p| crc.combine(&p.sizes_crc));
        crc.update(&id_codes);
        parts.iter().for_each(|p| crc.combine(&p.ids_crc));
        Ok(Self {
            head,
            parts,
            id_codes,
            crc,
        })
    }

    /// The payload, as pieces in file order.
    fn pieces(&self) -> impl Iterator<Item = &[u8]> {
        std::iter::once(&self.head[..])
            .chain(self.parts.iter().map(|p| &p.sizes[..]))
            .chain(std::iter::once(&self.id_codes[..]))
            .chain(self.parts.iter().map(|p| &p.ids[..]))
    }

    /// The payload's length in bytes.
    fn len(&self) -> usize {
        self.pieces().map(<[u8]>::len).sum()
    }
}

/// A part of the traces, encoded (see [`TraceColumns`]).
struct EncodedPart {
    size_codes: Vec<u8>,
    id_codes: Vec<u8>,
    sizes: Vec<u8>,
    sizes_crc: crc32fast::Hasher,
    ids: Vec<u8>,
    ids_crc: crc32fast::Hasher,
}

impl EncodedPart {
    /// Encodes `traces`, whose first trace starts a column block.
    fn of(traces: &[Trace]) -> Result<Self> {
        let nblocks = traces.len().div_ceil(COLUMN_BLOCK);
        let mut size_codes = fallible::with_capacity(nblocks)?;
        let mut id_codes = fallible::with_capacity(nblocks)?;
        // Room for the usual widths (sizes below 64 KiB, ids below 256); wider data grows
        // the buffers, doubling.
        let mut sizes = fallible::with_capacity(traces.len() * 2)?;
        let mut ids = fallible::with_capacity(traces.len())?;
        for block in traces.chunks(COLUMN_BLOCK) {
            fallible::room_for(&mut sizes, block.len() * 8)?;
            fallible::room_for(&mut ids, block.len() * 8)?;
            let (mut size_or, mut id_or) = (0u64, 0u32);
            for t in block {
                size_or |= t.size;
                id_or |= t.traceback;
            }
            let (size_code, id_code) = (width_code(size_or), width_code(id_or as u64));
            size_codes.push(size_code);
            id_codes.push(id_code);
            put_block(&mut sizes, size_code, block.iter().map(|t| t.size));
            put_block(&mut ids, id_code, block.iter().map(|t| t.traceback as u64));
        }
        let (mut sizes_crc, mut ids_crc) = (crc32fast::Hasher::new(), crc32fast::Hasher::new());
        sizes_crc.update(&sizes);
        ids_crc.update(&ids);
        Ok(EncodedPart {
            size_codes,
            id_codes,
            sizes,
            sizes_crc,
            ids,
            ids_crc,
        })
    }
}

/// Appends one column block's values to `dst` at width code `code`: one capacity check per
/// block, not per value.
fn put_block(dst: &mut Vec<u8>, code: u8, values: impl ExactSizeIterator<Item = u64>) {
    let at = dst.len();
    dst.resize(at + values.len() * WIDTHS[code as usize], 0);
    let dst = &mut dst[at..];
    match code {
        0 => dst.iter_mut().zip(values).for_each(|(d, v)| *d = v as u8),
        1 => dst
            .chunks_exact_mut(2)
            .zip(values)
            .for_each(|(d, v)| d.copy_from_slice(&(v as u16).to_le_bytes())),
        2 => dst
            .chunks_exact_mut(4)
            .zip(values)
            .for_each(|(d, v)| d.copy_from_slice(&(v as u32).to_le_bytes())),
        _ => dst
            .chunks_exact_mut(8)
            .zip(values)
            .for_each(|(d, v)| d.copy_from_slice(&v.to_le_bytes())),
    }
}

/// Writes a section whose payload `write` appends straight to `out`, then fills in its
/// length: the large sections are not built in a scratch buffer and copied.
fn section_with(
    out: &mut Vec<u8>,
    tag: u32,
    write: impl FnOnce(&mut Vec<u8>) -> Result<()>,
) -> Result<()> {
    fallible::room_for(out, SECTION_HEADER)?;
    out.extend_from_slice(&tag.to_le_bytes());
    let len_at = out.len();
    out.extend_from_slice(&0u64.to_le_bytes());
    write(out)?;
    let len = (out.len() - len_at - 8) as u64;
    out[len_at..len_at + 8].copy_from_slice(&len.to_le_bytes());
    Ok(())
}

fn section(out: &mut Vec<u8>, tag: u32, payload: &[u8]) -> Result<()> {
    fallible::room_for(out, SECTION_HEADER + payload.len())?;
    out.extend_from_slice(&tag.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(payload);
    Ok(())
}

/// The most bytes one `put_uleb` writes.
const MAX_ULEB: usize = 10;
/// A section's tag and length.
const SECTION_HEADER: usize = 12;

/// [`put_bytes`] after making room for it (the encoder's output grows fallibly: a snapshot
/// too large for the memory left is `MemoryError`, not an abort).
fn put_bytes_in_room(out: &mut Vec<u8>, b: &[u8]) -> Result<()> {
    fallible::room_for(out, MAX_ULEB + b.len())?;
    put_bytes(out, b);
    Ok(())
}

fn put_attr(out: &mut Vec<u8>, v: &AttrValue) -> Result<()> {
    // The tag and a number; strings and containers make room for their parts below.
    fallible::room_for(out, 1 + MAX_ULEB.max(8))?;
    match v {
        AttrValue::None => out.push(0),
        AttrValue::Bool(false) => out.push(1),
        AttrValue::Bool(true) => out.push(2),
        AttrValue::Int(i) => {
            out.push(3);
            // zigzag, so small negative numbers stay small
            put_uleb(out, ((*i << 1) ^ (*i >> 63)) as u64);
        }
        AttrValue::BigInt(b) => {
            out.push(4);
            put_bytes_in_room(out, b)?;
        }
        AttrValue::Float(f) => {
            out.push(5);
            out.extend_from_slice(&f.to_le_bytes());
        }
        AttrValue::Str(s) => {
            out.push(6);
            put_bytes_in_room(out, s)?;
        }
        AttrValue::Bytes(b) => {
            out.push(7);
            put_bytes_in_room(out, b)?;
        }
        AttrValue::List(items) | AttrValue::Tuple(items) => {
            out.push(if matches!(v, AttrValue::List(_)) {
                8
            } else {
                9
            });
            put_uleb(out, items.len() as u64);
            for item in items {
                put_attr(out, item)?;
            }
        }
        AttrValue::Dict(items) => {
            out.push(10);
            put_uleb(out, items.len() as u64);
            for (k, item) in items {
                put_bytes_in_room(out, k)?;
                put_attr(out, item)?;
            }
        }
    }
    Ok(())
}

/// Encodes a snapshot and its user attributes.
pub fn encode(snapshot: &Snapshot, attrs: &Attributes) -> Result<Vec<u8>> {
    Encoder::new(snapshot, attrs, parallel::parts_for)?.to_vec()
}

/// A snapshot file encoded, in pieces (see [`TraceColumns`]) that are written out in order.
struct Encoder {
    /// Everything before the traces section's payload.
    head: Vec<u8>,
    columns: TraceColumns,
    /// Everything after the traces section, up to the end marker's CRC.
    tail: Vec<u8>,
    /// The end marker's CRC, of every byte before it.
    crc: [u8; 4],
}

impl Encoder {
    /// Encodes the file, passing over the traces in `parts_for(traces)` parts (the bytes are
    /// the same for any).
    fn new(snapshot: &Snapshot, attrs: &Attributes, parts_for: fn(usize) -> usize) -> Result<Self> {
        let traces = &snapshot.traces;
        let columns = TraceColumns::encode(traces, &snapshot.domains, parts_for(traces.len()))?;
        let mut out = Vec::new();
        fallible::room_for(&mut out, MAGIC.len() + 4)?;
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        let md = &snapshot.metadata;
        let meta = MetaSection {
            traceback_limit: snapshot.traceback_limit,
            python_version: md.python_version,
            timestamp: md.timestamp,
            pid: md.pid,
            argv: md.argv.clone(),
        };
        let meta = bincode::serde::encode_to_vec(&meta, bincode::config::standard())
            .expect("encoding plain data into a Vec cannot fail");
        section(&mut out, TAG_META, &meta)?;

        // Every write below is preceded by room for it (`fallible::room_for`), so the buffers
        // only grow fallibly.
        let mut buf = Vec::new();
        fallible::room_for(&mut buf, MAX_ULEB)?;
        put_uleb(&mut buf, snapshot.filenames.len() as u64);
        for name in &snapshot.filenames {
            put_bytes_in_room(&mut buf, name)?;
        }
        section(&mut out, TAG_FILENAMES, &buf)?;

        buf.clear();
        fallible::room_for(&mut buf, MAX_ULEB)?;
        put_uleb(&mut buf, snapshot.frames.len() as u64);
        for f in &snapshot.frames {
            fallible::room_for(&mut buf, 2 * MAX_ULEB)?;
            put_uleb(&mut buf, f.filename as u64);
            put_uleb(&mut buf, f.lineno as u64);
        }
        section(&mut out, TAG_FRAMES, &buf)?;

        buf.clear();
        fallible::room_for(&mut buf, MAX_ULEB)?;
        put_uleb(&mut buf, snapshot.tracebacks.len() as u64);
        for tb in &snapshot.tracebacks {
            fallible::room_for(&mut buf, (2 + tb.frames.len()) * MAX_ULEB)?;
            put_uleb(&mut buf, tb.total_nframe.map_or(0, |n| n as u64 + 1));
            put_uleb(&mut buf, tb.frames.len() as u64);
            for &f in tb.frames.iter() {
                put_uleb(&mut buf, f as u64);
            }
        }
        section(&mut out, TAG_TRACEBACKS, &buf)?;
        fallible::room_for(&mut out, SECTION_HEADER)?;
        out.extend_from_slice(&TAG_TRACE_COLUMNS.to_le_bytes());
        out.extend_from_slice(&(columns.len() as u64).to_le_bytes());
        let head = out;

        // The sections after the traces, and the end marker but for its CRC.
        let mut out = Vec::new();
        if !snapshot.traceback_functions.is_empty() {
            // The function table (name, first line), then per traceback its entry count (0 or
            // its frame count) and per entry 0 (unknown) or function id + 1.
            buf.clear();
            fallible::room_for(&mut buf, MAX_ULEB)?;
            put_uleb(&mut buf, snapshot.functions.len() as u64);
            for f in &snapshot.functions {
                put_bytes_in_room(&mut buf, &f.name)?;
                fallible::room_for(&mut buf, MAX_ULEB)?;
                put_uleb(&mut buf, f.first_lineno as u64);
            }
            fallible::room_for(&mut buf, MAX_ULEB)?;
            put_uleb(&mut buf, snapshot.traceback_functions.len() as u64);
            for functions in &snapshot.traceback_functions {
                fallible::room_for(&mut buf, (1 + functions.len()) * MAX_ULEB)?;
                put_uleb(&mut buf, functions.len() as u64);
                for f in functions.iter() {
                    put_uleb(&mut buf, f.map_or(0, |id| id as u64 + 1));
                }
            }
            section(&mut out, TAG_FUNCTIONS, &buf)?;
        }

        if let Some(interval) = snapshot.sample_interval {
            buf.clear();
            fallible::room_for(&mut buf, MAX_ULEB)?;
            put_uleb(&mut buf, interval);
            section(&mut out, TAG_SAMPLING, &buf)?;
        }

        if let Some(kinds) = &snapshot.kinds {
            section_with(&mut out, TAG_KINDS, |out| {
                fallible::room_for(out, MAX_ULEB)?;
                put_uleb(out, kinds.names.len() as u64);
                for name in &kinds.names {
                    put_bytes_in_room(out, name)?;
                }
                fallible::room_for(out, (1 + kinds.of_trace.len()) * MAX_ULEB)?;
                put_uleb(out, kinds.of_trace.len() as u64);
                for &id in &kinds.of_trace {
                    put_uleb(out, id as u64);
                }
                Ok(())
            })?;
        }

        if let Some(reports) = &snapshot.retention {
            buf.clear();
            fallible::room_for(&mut buf, MAX_ULEB)?;
            put_uleb(&mut buf, reports.len() as u64);
            for r in reports {
                put_bytes_in_room(&mut buf, &r.filename)?;
                fallible::room_for(&mut buf, 5 * MAX_ULEB)?;
                for v in [r.lineno as u64, r.count, r.unreachable, r.size, r.retained] {
                    put_uleb(&mut buf, v);
                }
                for lines in [&r.paths, &r.pattern] {
                    fallible::room_for(&mut buf, MAX_ULEB)?;
                    put_uleb(&mut buf, lines.len() as u64);
                    for line in lines {
                        put_bytes_in_room(&mut buf, line)?;
                    }
                }
            }
            section(&mut out, TAG_RETENTION, &buf)?;
        }

        if let Some(pm) = &md.process_memory {
            buf.clear();
            fallible::room_for(&mut buf, 6 * MAX_ULEB)?;
            put_uleb(&mut buf, PROCESS_MEMORY_FIELDS);
            for v in [pm.rss, pm.anon, pm.file, pm.shmem, pm.peak_rss] {
                put_uleb(&mut buf, v);
            }
            section(&mut out, TAG_PROCESS_MEMORY, &buf)?;
        }

        put_peak_section(&mut out, snapshot)?;

        if !attrs.is_empty() {
            buf.clear();
            fallible::room_for(&mut buf, MAX_ULEB)?;
            put_uleb(&mut buf, attrs.len() as u64);
            for (name, v) in attrs {
                put_bytes_in_room(&mut buf, name)?;
                put_attr(&mut buf, v)?;
            }
            section(&mut out, TAG_ATTRS, &buf)?;
        }

        fallible::room_for(&mut out, SECTION_HEADER)?;
        out.extend_from_slice(&TAG_END.to_le_bytes());
        out.extend_from_slice(&4u64.to_le_bytes());
        let mut crc = crc32fast::Hasher::new();
        crc.update(&head);
        crc.combine(&columns.crc);
        crc.update(&out);
        Ok(Self {
            head,
            columns,
            tail: out,
            crc: crc.finalize().to_le_bytes(),
        })
    }

    /// The whole file, as pieces in order.
    fn pieces(&self) -> Vec<&[u8]> {
        let mut pieces = vec![&self.head[..]];
        pieces.extend(self.columns.pieces());
        pieces.extend([&self.tail[..], &self.crc[..]]);
        pieces
    }

    /// The whole file in one buffer.
    fn to_vec(&self) -> Result<Vec<u8>> {
        let pieces = self.pieces();
        let mut out = fallible::with_capacity(pieces.iter().map(|p| p.len()).sum())?;
        pieces.iter().for_each(|p| out.extend_from_slice(p));
        Ok(out)
    }
}

/// Section 12, the peak, in one of two forms (a file holds at most one):
///
/// - form 1, `[1, uleb n, n × uleb blocks]`: this file's traces are aggregates (a peak
///   snapshot, one trace per traceback), and trace `i` stands for `blocks[i]` blocks; its size
///   is their total. A reader that skips the section loads every size right and counts one
///   block per traceback;
/// - form 2, `[2, a whole snapshot file]`: the peak of the session this file's snapshot was
///   taken in (dumps); the nested file holds form 1 and no form 2 (one level only), and its
///   user attributes are not used. A reader that skips it loads the snapshot unchanged.
fn put_peak_section(out: &mut Vec<u8>, snapshot: &Snapshot) -> Result<()> {
    if let Some(blocks) = &snapshot.blocks {
        section_with(out, TAG_PEAK, |out| {
            fallible::room_for(out, 1 + (1 + blocks.len()) * MAX_ULEB)?;
            out.push(1);
            put_uleb(out, blocks.len() as u64);
            for &n in blocks {
                put_uleb(out, n);
            }
            Ok(())
        })
    } else if let Some(peak) = &snapshot.peak {
        let nested = encode(peak, &Vec::new())?;
        section_with(out, TAG_PEAK, |out| {
            fallible::room_for(out, 1 + nested.len())?;
            out.push(2);
            out.extend_from_slice(&nested);
            Ok(())
        })
    } else {
        Ok(())
    }
}

/// Decodes section 12 (see [`put_peak_section`]) into `(blocks, peak)`; `nested` is true
/// inside a form-2 payload, where only form 1 may appear.
#[allow(clippy::type_complexity)]
fn decode_peak_section(
    payload: &[u8],
    ntraces: usize,
    nested: bool,
) -> std::result::Result<(Option<Vec<u64>>, Option<Box<Snapshot>>), Reason> {
    let mut r = Reader::new(payload, "peak");
    match r.byte()? {
        1 => {
            let n = r.count(1, "block counts")?;
            if n != ntraces {
                return Err(Reason::from(format!(
                    "peak section: {n} block counts for {ntraces} traces"
                )));
            }
            let mut blocks = fallible::with_capacity(n)?;
            for _ in 0..n {
                blocks.push(r.uleb()?);
            }
            r.finish()?;
            Ok((Some(blocks), None))
        }
        2 if nested => Err("peak section: a peak holds another peak".into()),
        2 => {
            let (peak, _) = decode_file(&payload[1..], true).map_err(|reason| match reason {
                Reason::Invalid(reason) => Reason::Invalid(format!("peak section: {reason}")),
                out_of_memory => out_of_memory,
            })?;
            if peak.blocks.is_none() {
                return Err("peak section: the peak's traces have no block counts".into());
            }
            Ok((None, Some(Box::new(peak))))
        }
        form => Err(Reason::from(format!("peak section: unknown form {form}"))),
    }
}

/// A bounds-checked cursor over one section's payload.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    what: &'static str,
}

/// Why bytes could not be decoded: what is wrong with them, or that memory for the result
/// ran out (the only reason that is not about the file). Reads as its message.
#[derive(Debug, PartialEq)]
pub enum Reason {
    Invalid(String),
    OutOfMemory,
}

impl Reason {
    /// The crate error for a file at `path`: `SnapshotFormatError` or `MemoryError`.
    pub fn at(self, path: &Path) -> Error {
        match self {
            Reason::Invalid(reason) => Error::Format {
                path: path.to_path_buf(),
                reason,
            },
            Reason::OutOfMemory => Error::OutOfMemory,
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self)
    }
}

impl std::ops::Deref for Reason {
    type Target = str;
    fn deref(&self) -> &str {
        match self {
            Reason::Invalid(reason) => reason,
            Reason::OutOfMemory => "out of memory",
        }
    }
}

impl From<String> for Reason {
    fn from(reason: String) -> Self {
        Reason::Invalid(reason)
    }
}

impl From<&str> for Reason {
    fn from(reason: &str) -> Self {
        Reason::Invalid(reason.to_owned())
    }
}

impl From<std::collections::TryReserveError> for Reason {
    fn from(_: std::collections::TryReserveError) -> Self {
        Reason::OutOfMemory
    }
}

impl From<hashbrown::TryReserveError> for Reason {
    fn from(_: hashbrown::TryReserveError) -> Self {
        Reason::OutOfMemory
    }
}

impl From<Error> for Reason {
    /// Only [`Error::OutOfMemory`] arises while decoding (from [`fallible`]).
    fn from(err: Error) -> Self {
        match err {
            Error::OutOfMemory => Reason::OutOfMemory,
            other => Reason::Invalid(other.to_string()),
        }
    }
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8], what: &'static str) -> Self {
        Self { buf, pos: 0, what }
    }

    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    #[inline(always)]
    fn uleb(&mut self) -> std::result::Result<u64, Reason> {
        // Fast path away from the end of the buffer: no per-byte bounds checks, and the
        // common one-to-three-byte numbers leave after one to three iterations.
        if let Some(chunk) = self.buf.get(self.pos..self.pos + 10) {
            let mut v = 0u64;
            for (i, &b) in chunk.iter().enumerate().take(9) {
                v |= ((b & 0x7F) as u64) << (7 * i);
                if b < 0x80 {
                    self.pos += i + 1;
                    return Ok(v);
                }
            }
        }
        self.uleb_slow()
    }

    #[cold]
    fn uleb_slow(&mut self) -> std::result::Result<u64, Reason> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let Some(&b) = self.buf.get(self.pos) else {
                return Err(Reason::from(format!(
                    "{} section ends inside a number",
                    self.what
                )));
            };
            self.pos += 1;
            let bits = (b & 0x7F) as u64;
            if shift == 63 && bits > 1 {
                break;
            }
            v |= bits << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(Reason::from(format!(
            "{} section holds an oversized number",
            self.what
        )))
    }

    #[inline(always)]
    fn u32(&mut self, field: &str) -> std::result::Result<u32, Reason> {
        let v = self.uleb()?;
        u32::try_from(v)
            .map_err(|_| format!("{} section: {field} {v} is out of range", self.what).into())
    }

    /// A count of items each taking at least `min_each` bytes: checked against what is left
    /// so that a forged count cannot make us reserve memory.
    fn count(&mut self, min_each: usize, field: &str) -> std::result::Result<usize, Reason> {
        let n = self.uleb()?;
        let left = self.remaining() as u64;
        if n.saturating_mul(min_each as u64) > left {
            return Err(Reason::from(format!(
                "{} section declares {n} {field} but only {left} bytes remain (truncated or corrupted)",
                self.what
            )));
        }
        Ok(n as usize)
    }

    fn bytes(&mut self, field: &str) -> std::result::Result<&'a [u8], Reason> {
        let n = self.uleb()?;
        if n > self.remaining() as u64 {
            return Err(Reason::from(format!(
                "{} section: {field} declares {n} bytes but only {} remain",
                self.what,
                self.remaining()
            )));
        }
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    /// The next `n` bytes.
    fn take(&mut self, n: usize, field: &str) -> std::result::Result<&'a [u8], Reason> {
        if n > self.remaining() {
            return Err(Reason::from(format!(
                "{} section: {field} need {n} bytes but only {} remain",
                self.what,
                self.remaining()
            )));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn byte(&mut self) -> std::result::Result<u8, Reason> {
        let b = *self
            .buf
            .get(self.pos)
            .ok_or_else(|| format!("{} section is truncated", self.what))?;
        self.pos += 1;
        Ok(b)
    }

    fn finish(&self) -> std::result::Result<(), Reason> {
        if self.pos != self.buf.len() {
            return Err(Reason::from(format!(
                "{} section has {} unexpected bytes at its end",
                self.what,
                self.remaining()
            )));
        }
        Ok(())
    }
}

fn read_attr(r: &mut Reader<'_>, depth: usize) -> std::result::Result<AttrValue, Reason> {
    if depth > MAX_ATTR_DEPTH {
        return Err(Reason::from(format!(
            "attribute values nest deeper than {MAX_ATTR_DEPTH} levels"
        )));
    }
    Ok(match r.byte()? {
        0 => AttrValue::None,
        1 => AttrValue::Bool(false),
        2 => AttrValue::Bool(true),
        3 => {
            let z = r.uleb()?;
            AttrValue::Int(((z >> 1) as i64) ^ -((z & 1) as i64))
        }
        4 => {
            let b = r.bytes("integer")?;
            if b.is_empty() {
                return Err("attributes section holds an empty integer".into());
            }
            AttrValue::BigInt(b.to_vec())
        }
        5 => {
            let mut f = [0u8; 8];
            for x in &mut f {
                *x = r.byte()?;
            }
            AttrValue::Float(f64::from_le_bytes(f))
        }
        6 => {
            let s = r.bytes("string")?;
            if !is_surrogatepass_utf8(s) {
                return Err("attributes section holds a string that is not UTF-8".into());
            }
            AttrValue::Str(s.to_vec())
        }
        7 => AttrValue::Bytes(r.bytes("bytes")?.to_vec()),
        tag @ (8 | 9) => {
            let n = r.count(1, "items")?;
            let mut items = fallible::with_capacity(n)?;
            for _ in 0..n {
                items.push(read_attr(r, depth + 1)?);
            }
            if tag == 8 {
                AttrValue::List(items)
            } else {
                AttrValue::Tuple(items)
            }
        }
        10 => {
            let n = r.count(2, "dict items")?;
            let mut items = fallible::with_capacity(n)?;
            for _ in 0..n {
                let k = r.bytes("dict key")?;
                if !is_surrogatepass_utf8(k) {
                    return Err("attributes section holds a dict key that is not UTF-8".into());
                }
                items.push((k.to_vec(), read_attr(r, depth + 1)?));
            }
            AttrValue::Dict(items)
        }
        other => {
            return Err(Reason::from(format!(
                "attributes section holds unknown value tag {other}"
            )))
        }
    })
}

/// Looks like a pickle (protocol 2 or later starts with PROTO 0x80, then the protocol).
fn looks_like_pickle(data: &[u8]) -> bool {
    data.len() >= 2 && data[0] == 0x80 && (2..=5).contains(&data[1])
}

/// The largest timestamp a file may hold: the start of the year 10000, past which no date
/// can be shown (Python's `datetime` ends there). NaN, infinities and negative values are
/// refused as well, so that every loaded snapshot's time can be rendered.
const MAX_TIMESTAMP: f64 = 253_402_300_800.0;

/// Checks the magic number and the version in the first bytes of a file (all of it, or at
/// least its first [`HEADER_LEN`] bytes); returns the version.
fn check_header(data: &[u8]) -> std::result::Result<u32, Reason> {
    if data.is_empty() {
        return Err("the file is empty".into());
    }
    if data.len() < MAGIC.len() || &data[..MAGIC.len()] != MAGIC {
        if looks_like_pickle(data) {
            return Err("it looks like a tracemalloc (pickle) dump; \
                 Snapshot.load(filename, allow_pickle=True) loads it, but unpickling can \
                 execute arbitrary code, so only do that for files you trust"
                .into());
        }
        if data.len() < MAGIC.len() && MAGIC.starts_with(data) {
            return Err(Reason::from(format!(
                "truncated: only {} bytes",
                data.len()
            )));
        }
        return Err("not an alloctrace snapshot (bad magic number)".into());
    }
    if data.len() < HEADER_LEN {
        return Err(Reason::from(format!(
            "truncated: only {} bytes",
            data.len()
        )));
    }
    let version = u32::from_le_bytes(data[8..12].try_into().unwrap());
    if version > FORMAT_VERSION {
        return Err(Reason::from(format!(
            "format version {version} is newer than this alloctrace supports (version \
             {FORMAT_VERSION}); upgrade alloctrace to read it"
        )));
    }
    if version == 0 {
        return Err("unknown format version 0 (corrupted header)".into());
    }
    Ok(version)
}

/// Steps over the section headers found in `data`, the first bytes of a file of `total`
/// bytes, from `*pos` (a section boundary) on: `Ok(true)` once the end marker is reached and
/// ends the file, `Ok(false)` if `data` ends before that. Errors as soon as the structure is
/// wrong, so a file being read can be refused before the rest of it is read.
fn walk_sections(data: &[u8], total: usize, pos: &mut usize) -> std::result::Result<bool, Reason> {
    // `pos` is past the bytes read so far while a section longer than the chunks read is
    // still coming in.
    while data.len().saturating_sub(*pos) >= SECTION_HEADER_LEN {
        let at = *pos;
        let tag = u32::from_le_bytes(data[at..at + 4].try_into().unwrap());
        let len = u64::from_le_bytes(data[at + 4..at + 12].try_into().unwrap());
        let left = (total - at - SECTION_HEADER_LEN) as u64;
        if len > left {
            return Err(Reason::from(format!(
                "truncated: section {tag} at byte {at} declares {len} bytes but only {left} \
                 remain"
            )));
        }
        *pos = at + SECTION_HEADER_LEN + len as usize;
        if tag == TAG_END {
            if len != 4 {
                return Err(Reason::from(format!(
                    "corrupted: end marker declares {len} bytes instead of 4"
                )));
            }
            if *pos != total {
                return Err(Reason::from(format!(
                    "{} bytes of trailing garbage after the end marker",
                    total - *pos
                )));
            }
            return Ok(true);
        }
    }
    if data.len() == total {
        return Err(Reason::from(format!(
            "truncated: the file ends at byte {total} without its end marker"
        )));
    }
    Ok(false)
}

/// Decodes a snapshot file's bytes; the error is the reason, for [`Error::Format`].
pub fn decode(data: &[u8]) -> std::result::Result<(Snapshot, Attributes), Reason> {
    decode_file(data, false)
}

/// Decodes a whole file, or with `nested` the snapshot file inside a peak section.
fn decode_file(data: &[u8], nested: bool) -> std::result::Result<(Snapshot, Attributes), Reason> {
    let version = check_header(data)?;
    // Structure first, in one pass over the section headers: the sections must tile the
    // file exactly up to the end marker, whose checksum covers every byte before it. Only
    // then is any section looked at, each in constant time.
    // With all of the file at hand, the walk ends at the end marker or fails.
    let mut pos = HEADER_LEN;
    walk_sections(data, data.len(), &mut pos)?;
    let stored = u32::from_le_bytes(data[data.len() - 4..].try_into().unwrap());
    let actual = crc32(&data[..data.len() - 4]);
    if stored != actual {
        return Err(Reason::from(format!(
            "corrupted: checksum mismatch (stored {stored:#010x}, computed {actual:#010x})"
        )));
    }
    let mut sections: hashbrown::HashMap<u32, &[u8]> = hashbrown::HashMap::new();
    let mut pos = HEADER_LEN;
    loop {
        let tag = u32::from_le_bytes(data[pos..pos + 4].try_into().unwrap());
        let len = u64::from_le_bytes(data[pos + 4..pos + 12].try_into().unwrap()) as usize;
        pos += SECTION_HEADER_LEN;
        if tag == TAG_END {
            break;
        }
        if sections.insert(tag, &data[pos..pos + len]).is_some() {
            return Err(Reason::from(format!(
                "corrupted: section {tag} appears twice"
            )));
        }
        pos += len;
    }
    let section = |tag: u32| sections.get(&tag).copied();
    let find =
        |tag: u32, name: &str| section(tag).ok_or_else(|| format!("the {name} section is missing"));

    let meta = find(TAG_META, "metadata")?;
    let config = bincode::config::standard().with_limit::<{ 1 << 20 }>();
    let (meta, used): (MetaSection, usize) = bincode::serde::decode_from_slice(meta, config)
        .map_err(|e| format!("metadata section is unreadable: {e}"))?;
    if used != find(TAG_META, "metadata")?.len() {
        return Err("metadata section has unexpected bytes at its end".into());
    }
    if let Some(t) = meta.timestamp {
        if !(0.0..MAX_TIMESTAMP).contains(&t) {
            return Err(Reason::from(format!(
                "the metadata timestamp {t} is not a time (seconds since 1970 before the \
                 year 10000)"
            )));
        }
    }

    let mut r = Reader::new(find(TAG_FILENAMES, "filenames")?, "filenames");
    let n = r.count(1, "filenames")?;
    let mut filenames: Vec<Box<[u8]>> = fallible::with_capacity(n)?;
    for i in 0..n {
        let name = r.bytes("filename")?;
        if !is_surrogatepass_utf8(name) {
            return Err(Reason::from(format!("filename {i} is not valid UTF-8")));
        }
        filenames.push(fallible::cloned(name)?.into_boxed_slice());
    }
    r.finish()?;
    // Analyses rely on tables being unique by content (one id per filename and per frame).
    let mut seen = hashbrown::HashSet::new();
    seen.try_reserve(filenames.len())?;
    for (i, name) in filenames.iter().enumerate() {
        if !seen.insert(&name[..]) {
            return Err(Reason::from(format!(
                "filename {i} repeats an earlier entry"
            )));
        }
    }
    drop(seen);

    let mut r = Reader::new(find(TAG_FRAMES, "frames")?, "frames");
    let n = r.count(2, "frames")?;
    let mut frames = fallible::with_capacity(n)?;
    for i in 0..n {
        let filename = r.u32("filename id")?;
        if filename as usize >= filenames.len() {
            return Err(Reason::from(format!(
                "frame {i} refers to filename {filename}, but there are only {}",
                filenames.len()
            )));
        }
        let lineno = r.u32("line number")?;
        frames.push(Frame { filename, lineno });
    }
    r.finish()?;
    let mut seen = hashbrown::HashSet::new();
    seen.try_reserve(frames.len())?;
    for (i, frame) in frames.iter().enumerate() {
        if !seen.insert(frame) {
            return Err(Reason::from(format!("frame {i} repeats an earlier entry")));
        }
    }
    drop(seen);

    let mut r = Reader::new(find(TAG_TRACEBACKS, "tracebacks")?, "tracebacks");
    let n = r.count(2, "tracebacks")?;
    let mut tracebacks = fallible::with_capacity(n)?;
    for i in 0..n {
        let total = r.uleb()?;
        let total_nframe = match total {
            0 => None,
            t => Some(u32::try_from(t - 1).map_err(|_| {
                format!(
                    "traceback {i} declares an out-of-range total_nframe {}",
                    t - 1
                )
            })?),
        };
        let nf = r.count(1, "frame ids")?;
        let mut ids = fallible::with_capacity(nf)?;
        for _ in 0..nf {
            let f = r.u32("frame id")?;
            if f as usize >= frames.len() {
                return Err(Reason::from(format!(
                    "traceback {i} refers to frame {f}, but there are only {}",
                    frames.len()
                )));
            }
            ids.push(f);
        }
        tracebacks.push(Traceback {
            frames: ids.into(),
            total_nframe,
        });
    }
    r.finish()?;

    // Version 1 stored the traces as LEB128 (section 5); version 2 as width-coded columns
    // (section 8). Each version's file must hold its own and not the other.
    let (tag, other) = if version >= 2 {
        (TAG_TRACE_COLUMNS, TAG_TRACES)
    } else {
        (TAG_TRACES, TAG_TRACE_COLUMNS)
    };
    if section(other).is_some() {
        return Err(Reason::from(format!(
            "corrupted: section {other} does not belong in a version {version} file"
        )));
    }
    let payload = find(tag, "traces")?;
    let (traces, domains) = if version >= 2 {
        decode_trace_columns(payload, tracebacks.len(), parallel::parts_for)?
    } else {
        decode_traces_v1(payload, tracebacks.len())?
    };

    let (functions, traceback_functions) = match section(TAG_FUNCTIONS) {
        Some(payload) => decode_functions(payload, &tracebacks)?,
        None => (Vec::new(), Vec::new()),
    };

    let sample_interval = match section(TAG_SAMPLING) {
        Some(payload) => {
            let mut r = Reader::new(payload, "sampling");
            let interval = r.uleb()?;
            r.finish()?;
            if interval == 0 || interval > MAX_INTERVAL {
                return Err(Reason::from(format!(
                    "the sampling section holds interval {interval}, outside 1..={MAX_INTERVAL}"
                )));
            }
            Some(interval)
        }
        None => None,
    };

    let kinds = match section(TAG_KINDS) {
        Some(payload) => Some(decode_kinds(payload, traces.len())?),
        None => None,
    };

    let mut attrs = Vec::new();
    if let Some(payload) = section(TAG_ATTRS) {
        let mut r = Reader::new(payload, "attributes");
        let n = r.count(2, "attributes")?;
        for _ in 0..n {
            let name = r.bytes("attribute name")?;
            if !is_surrogatepass_utf8(name) {
                return Err("an attribute name is not valid UTF-8".into());
            }
            attrs.push((name.to_vec(), read_attr(&mut r, 0)?));
        }
        r.finish()?;
    }
    let retention = match section(TAG_RETENTION) {
        Some(payload) => Some(decode_retention(payload)?),
        None => None,
    };
    let process_memory = match section(TAG_PROCESS_MEMORY) {
        Some(payload) => Some(decode_process_memory(payload)?),
        None => None,
    };
    let (blocks, peak) = match section(TAG_PEAK) {
        Some(payload) => decode_peak_section(payload, traces.len(), nested)?,
        None => (None, None),
    };

    let snapshot = Snapshot {
        filenames,
        frames,
        functions,
        traceback_functions,
        tracebacks,
        traces,
        domains,
        traceback_limit: meta.traceback_limit,
        metadata: Metadata {
            python_version: meta.python_version,
            timestamp: meta.timestamp,
            pid: meta.pid,
            argv: meta.argv,
            process_memory,
        },
        sample_interval,
        kinds,
        retention,
        blocks,
        peak,
    };
    Ok((snapshot, attrs))
}

/// Section 13: a field count, then RSS, anonymous, file-backed, shared and peak RSS in
/// bytes, LEB128; fields past those five (from a newer writer) are skipped.
fn decode_process_memory(payload: &[u8]) -> std::result::Result<ProcessMemory, Reason> {
    let mut r = Reader::new(payload, "process memory");
    let n = r.uleb()?;
    if n < PROCESS_MEMORY_FIELDS {
        return Err(Reason::from(format!(
            "the process memory section holds {n} fields, fewer than the \
             {PROCESS_MEMORY_FIELDS} it must"
        )));
    }
    let mut v = [0u64; PROCESS_MEMORY_FIELDS as usize];
    for slot in v.iter_mut() {
        *slot = r.uleb()?;
    }
    for _ in PROCESS_MEMORY_FIELDS..n {
        r.uleb()?;
    }
    r.finish()?;
    let [rss, anon, file, shmem, peak_rss] = v;
    let pm = ProcessMemory {
        rss,
        anon,
        file,
        shmem,
        peak_rss,
    };
    match pm.inconsistency() {
        Some(why) => Err(Reason::from(format!(
            "the process memory section is inconsistent: {why}"
        ))),
        None => Ok(pm),
    }
}

/// The trace count and domain runs that both traces sections open with; the runs must cover
/// exactly the declared traces.
fn trace_domains(
    r: &mut Reader<'_>,
    min_bytes_per_trace: usize,
) -> std::result::Result<(usize, Domains), Reason> {
    let n = r.count(min_bytes_per_trace, "traces")?;
    let runs = r.count(2, "domain runs")?;
    let mut domains = Domains::default();
    let mut covered = 0u64;
    for _ in 0..runs {
        let d = r.u32("domain")?;
        let len = r.uleb()?;
        covered = covered.saturating_add(len);
        if covered <= n as u64 {
            domains.push_run(d, len as usize);
        }
    }
    if covered != n as u64 {
        return Err(Reason::from(format!(
            "traces section: domain runs cover {covered} traces, expected {n}"
        )));
    }
    Ok((n, domains))
}

fn bad_traceback(i: usize, tb: u64, tracebacks: usize) -> Reason {
    format!("trace {i} refers to traceback {tb}, but there are only {tracebacks}").into()
}

/// Section 5 (format version 1): domain runs, then every size, then every traceback id, all
/// LEB128.
fn decode_traces_v1(payload: &[u8], tracebacks: usize) -> std::result::Result<Traces, Reason> {
    let mut r = Reader::new(payload, "traces");
    // Each trace needs at least one byte for its size and one for its traceback id.
    let (n, domains) = trace_domains(&mut r, 2)?;
    let mut traces = fallible::with_capacity(n)?;
    for _ in 0..n {
        let size = r.uleb()?;
        traces.push(Trace { size, traceback: 0 });
    }
    for (i, t) in traces.iter_mut().enumerate() {
        let tb = r.u32("traceback id")?;
        if tb as usize >= tracebacks {
            return Err(bad_traceback(i, tb as u64, tracebacks));
        }
        t.traceback = tb;
    }
    r.finish()?;
    Ok((traces, domains))
}

/// A traces section, decoded.
type Traces = (Vec<Trace>, Domains);

/// What a column decodes into: sizes into `u64`, traceback ids into `u32` (whose columns
/// are refused with 8-byte blocks, so `from_u64` never narrows one).
trait Widen: Copy {
    fn from_u8(v: u8) -> Self;
    fn from_u16(v: u16) -> Self;
    fn from_u32(v: u32) -> Self;
    fn from_u64(v: u64) -> Self;
}

impl Widen for u64 {
    fn from_u8(v: u8) -> Self {
        v.into()
    }
    fn from_u16(v: u16) -> Self {
        v.into()
    }
    fn from_u32(v: u32) -> Self {
        v.into()
    }
    fn from_u64(v: u64) -> Self {
        v
    }
}

impl Widen for u32 {
    fn from_u8(v: u8) -> Self {
        v.into()
    }
    fn from_u16(v: u16) -> Self {
        v.into()
    }
    fn from_u32(v: u32) -> Self {
        v
    }
    fn from_u64(v: u64) -> Self {
        v as u32
    }
}

/// A column (see [`TraceColumns`]) being read block by block. Its extent was checked when it
/// was opened, so reading it cannot fail.
struct Column<'a> {
    codes: &'a [u8],
    /// Exactly the column's value bytes.
    data: &'a [u8],
    pos: usize,
    block: usize,
}

impl<'a> Column<'a> {
    /// Opens a column of `n` values at the reader's position and moves the reader past it.
    /// `widest` is the largest width code the values may use.
    fn open(
        r: &mut Reader<'a>,
        n: usize,
        field: &str,
        widest: u8,
    ) -> std::result::Result<Self, Reason> {
        let what = r.what;
        let codes = r.take(n.div_ceil(COLUMN_BLOCK), field)?;
        let mut len = 0usize;
        for (b, &code) in codes.iter().enumerate() {
            if code > widest {
                return Err(Reason::from(format!(
                    "{what} section: {field} block {b} has width code {code} (at most {widest})"
                )));
            }
            let width = WIDTHS[code as usize];
            len += width * COLUMN_BLOCK.min(n - b * COLUMN_BLOCK);
        }
        let data = r.take(len, field)?;
        Ok(Self {
            codes,
            data,
            pos: 0,
            block: 0,
        })
    }

    /// The column positioned at value `first`, a multiple of `COLUMN_BLOCK`, for a part of a
    /// parallel decode.
    fn at(&self, first: usize) -> Self {
        debug_assert_eq!(first % COLUMN_BLOCK, 0);
        let block = first / COLUMN_BLOCK;
        let pos = self.codes[..block]
            .iter()
            .map(|&code| WIDTHS[code as usize & 3] * COLUMN_BLOCK)
            .sum();
        Self {
            codes: self.codes,
            data: self.data,
            pos,
            block,
        }
    }

    /// Decodes the next `out.len()` values into `out`: whole blocks, but for the column's
    /// last, shorter one.
    #[inline(always)]
    fn fill<T: Widen>(&mut self, out: &mut [T]) {
        for chunk in out.chunks_mut(COLUMN_BLOCK) {
            let code = self.codes[self.block];
            self.block += 1;
            let width = WIDTHS[code as usize & 3];
            let bytes = &self.data[self.pos..self.pos + width * chunk.len()];
            self.pos += bytes.len();
            // One loop per width, each of fixed-size loads, so the compiler vectorises them.
            match width {
                1 => {
                    for (v, b) in chunk.iter_mut().zip(bytes) {
                        *v = T::from_u8(*b);
                    }
                }
                2 => {
                    for (v, b) in chunk.iter_mut().zip(bytes.chunks_exact(2)) {
                        *v = T::from_u16(u16::from_le_bytes([b[0], b[1]]));
                    }
                }
                4 => {
                    for (v, b) in chunk.iter_mut().zip(bytes.chunks_exact(4)) {
                        *v = T::from_u32(u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
                    }
                }
                _ => {
                    for (v, b) in chunk.iter_mut().zip(bytes.chunks_exact(8)) {
                        *v = T::from_u64(u64::from_le_bytes(b.try_into().expect("8 bytes")));
                    }
                }
            }
        }
    }

    /// Every value, for the rare second look (finding the trace with a bad id).
    fn all(mut self, n: usize) -> Result<Vec<u32>> {
        let mut out = fallible::filled(n, 0u32)?;
        self.fill(&mut out);
        Ok(out)
    }
}

/// Has the kernel map a large new buffer's pages before it is written, in one call. A
/// million traces take 12 MB, which the first writes would otherwise fault in 4 KiB at a time
/// (3,000 page faults, each a trap; measured when traces took 16 bytes: 20 loads kept alive
/// took 81,800 faults and 240 ms of system time, 3,700 and 160 ms with this). Huge pages were
/// tried too and dropped: the kernel's compaction for them made some loads take ten times
/// longer. Advisory only: where the kernel does not know the advice (before Linux 5.14)
/// nothing changes but speed. Each part of a parallel decode maps its own slice, so the kernel's zeroing of the pages is
/// shared out too.
fn prefault<T>(buffer: &mut [T]) {
    let bytes = std::mem::size_of_val(buffer);
    if bytes < 1 << 20 {
        return;
    }
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
    let start = buffer.as_mut_ptr() as usize & !(page - 1);
    let len = buffer.as_mut_ptr() as usize + bytes - start;
    // SAFETY: the range covers the buffer's own (mapped) pages, the first one from its start;
    // populating pages changes no byte in them, whoever else uses part of the first and last.
    unsafe {
        libc::madvise(start as *mut libc::c_void, len, libc::MADV_POPULATE_WRITE);
    }
}

/// Section 8 (format version 2): domain runs, then the sizes and the traceback ids as
/// width-coded columns, which decode without a branch on each value's length. The traces are
/// decoded in as many parts as `parts_for` says for their count (see [`parallel`]), each part
/// straight into its own slice of the result.
fn decode_trace_columns(
    payload: &[u8],
    tracebacks: usize,
    parts_for: fn(usize) -> usize,
) -> std::result::Result<Traces, Reason> {
    let mut r = Reader::new(payload, "traces");
    // Each trace needs a byte of size and a byte of traceback id (plus its width codes).
    let (n, domains) = trace_domains(&mut r, 2)?;
    let sizes = Column::open(&mut r, n, "sizes", 3)?;
    // Ids are u32: at most 4 bytes wide.
    let ids = Column::open(&mut r, n, "traceback ids", 2)?;
    r.finish()?;
    let limit = tracebacks
        .checked_sub(1)
        .and_then(|l| u32::try_from(l).ok())
        .filter(|&l| l < 1 << 31);
    let mut traces: Vec<Trace> = fallible::with_capacity(n)?;
    let ranges = parallel::split(n, parts_for(n), DECODE_BLOCK);
    let mut slots = &mut traces.spare_capacity_mut()[..n];
    let mut jobs = fallible::with_capacity(ranges.len())?;
    for range in &ranges {
        let (out, rest) = slots.split_at_mut(range.len());
        slots = rest;
        let (sizes, ids) = (sizes.at(range.start), ids.at(range.start));
        jobs.push(move || {
            prefault(out);
            decode_part(sizes, ids, out, limit, tracebacks)
        });
    }
    let bad_id = parallel::run(jobs).into_iter().any(|bad| bad);
    // SAFETY: the parts tile `0..n` and each initialised every slot of its slice.
    unsafe { traces.set_len(n) };
    if bad_id {
        let ids = ids.all(n)?;
        let i = ids
            .iter()
            .position(|&id| id as usize >= tracebacks)
            .expect("an id is out of range");
        return Err(bad_traceback(i, ids[i] as u64, tracebacks));
    }
    Ok((traces, domains))
}

/// Decodes the next `out.len()` traces of the columns into `out`, every slot of it; true if
/// a traceback id is `tracebacks` or more (`limit` is the largest valid id where that is
/// below 2^31). The offending trace is looked for afterwards.
fn decode_part(
    mut sizes: Column<'_>,
    mut ids: Column<'_>,
    out: &mut [std::mem::MaybeUninit<Trace>],
    limit: Option<u32>,
    tracebacks: usize,
) -> bool {
    // Block by block: each column decodes into a small buffer (a tight loop per width), then
    // the traces are written from the two buffers, once each.
    let mut size_buf = [0u64; DECODE_BLOCK];
    let mut id_buf = [0u32; DECODE_BLOCK];
    let mut bad_id = false;
    for out in out.chunks_mut(DECODE_BLOCK) {
        let m = out.len();
        sizes.fill(&mut size_buf[..m]);
        ids.fill(&mut id_buf[..m]);
        let block = &id_buf[..m];
        bad_id |= match limit {
            // `limit - id` wraps negative exactly when `id > limit`, as long as both are below
            // 2^31 (an id that is not sets the sign bit itself): a test by OR alone, which
            // vectorises.
            Some(limit) => {
                block
                    .iter()
                    .fold(0, |a, &id| a | limit.wrapping_sub(id) | id)
                    >> 31
                    != 0
            }
            None => block.iter().any(|&id| id as usize >= tracebacks),
        };
        for (slot, (&size, &traceback)) in out.iter_mut().zip(size_buf.iter().zip(block)) {
            slot.write(Trace { size, traceback });
        }
    }
    bad_id
}

/// Section 11: the report count, then per report the site's filename (bytes), lineno,
/// count, unreachable, size and retained (uleb128), the path count and paths, the pattern
/// line count and lines (each a string as bytes). Strings are checked to be surrogatepass
/// UTF-8, and `unreachable` to be at most `count`.
fn decode_retention(payload: &[u8]) -> std::result::Result<Vec<SiteRetention>, Reason> {
    let mut r = Reader::new(payload, "retention reports");
    // A report takes at least 8 bytes: an empty filename, five numbers and two counts.
    let n = r.count(8, "reports")?;
    let mut reports = fallible::with_capacity(n)?;
    for i in 0..n {
        let filename = retention_str(&mut r, i, "filename")?;
        let lineno = r.u32("lineno")?;
        let [count, unreachable, size, retained] = [r.uleb()?, r.uleb()?, r.uleb()?, r.uleb()?];
        if unreachable > count {
            return Err(Reason::from(format!(
                "retention report {i} counts {unreachable} unreachable objects of {count}"
            )));
        }
        let mut lists = [Vec::new(), Vec::new()];
        for (list, what) in lists.iter_mut().zip(["paths", "pattern lines"]) {
            let k = r.count(1, what)?;
            list.reserve(k);
            for _ in 0..k {
                list.push(retention_str(&mut r, i, what)?);
            }
        }
        let [paths, pattern] = lists;
        reports.push(SiteRetention {
            filename,
            lineno,
            count,
            unreachable,
            size,
            retained,
            paths,
            pattern,
        });
    }
    r.finish()?;
    Ok(reports)
}

fn retention_str(
    r: &mut Reader<'_>,
    report: usize,
    what: &str,
) -> std::result::Result<Box<[u8]>, Reason> {
    let s = r.bytes(what)?;
    if !is_surrogatepass_utf8(s) {
        return Err(Reason::from(format!(
            "retention report {report} holds a {what} string that is not UTF-8"
        )));
    }
    Ok(s.into())
}

/// Section 10: the kind names, then one kind id per trace (exactly as many as traces).
fn decode_kinds(payload: &[u8], ntraces: usize) -> std::result::Result<Kinds, Reason> {
    let mut r = Reader::new(payload, "object kinds");
    let n = r.count(1, "kind names")?;
    let mut names = fallible::with_capacity(n)?;
    for _ in 0..n {
        let name = r.bytes("kind name")?;
        if !is_surrogatepass_utf8(name) {
            return Err("a kind name is not valid UTF-8".into());
        }
        names.push(Box::from(name));
    }
    let count = r.count(1, "kinds")?;
    if count != ntraces {
        return Err(Reason::from(format!(
            "the object kinds section has {count} entries for {ntraces} traces"
        )));
    }
    let mut of_trace = fallible::with_capacity(count)?;
    for i in 0..count {
        let id = r.u32("kind id")?;
        if id as usize >= names.len() {
            return Err(Reason::from(format!(
                "trace {i} has kind {id}, but there are only {} kind names",
                names.len()
            )));
        }
        of_trace.push(id);
    }
    r.finish()?;
    Ok(Kinds { names, of_trace })
}

type Functions = (Vec<Function>, Vec<Box<[Option<FunctionId>]>>);

/// Section 7: the function table and the functions of each traceback's frames.
fn decode_functions(
    payload: &[u8],
    tracebacks: &[Traceback],
) -> std::result::Result<Functions, Reason> {
    let mut r = Reader::new(payload, "functions");
    let n = r.count(2, "functions")?;
    let mut functions: Vec<Function> = fallible::with_capacity(n)?;
    for i in 0..n {
        let name = r.bytes("function name")?;
        if !is_surrogatepass_utf8(name) {
            return Err(Reason::from(format!(
                "function {i} has a name that is not valid UTF-8"
            )));
        }
        let first_lineno = r.u32("first line number")?;
        functions.push(Function {
            name: name.into(),
            first_lineno,
        });
    }
    let mut seen = hashbrown::HashSet::new();
    seen.try_reserve(n)?;
    for (i, f) in functions.iter().enumerate() {
        if !seen.insert(f) {
            return Err(Reason::from(format!(
                "function {i} repeats an earlier entry"
            )));
        }
    }
    drop(seen);
    let count = r.count(1, "tracebacks")?;
    if count != tracebacks.len() {
        return Err(Reason::from(format!(
            "functions section describes {count} tracebacks, but there are {}",
            tracebacks.len()
        )));
    }
    let mut per_traceback = fallible::with_capacity(count)?;
    for (t, tb) in tracebacks.iter().enumerate() {
        let k = r.count(1, "function entries")?;
        if k != 0 && k != tb.frames.len() {
            return Err(Reason::from(format!(
                "functions section gives traceback {t} {k} functions for {} frames",
                tb.frames.len()
            )));
        }
        let mut ids = fallible::with_capacity(k)?;
        for _ in 0..k {
            let id = r.u32("function id")?;
            if id as usize > functions.len() {
                return Err(Reason::from(format!(
                    "traceback {t} refers to function {}, but there are only {}",
                    id - 1,
                    functions.len()
                )));
            }
            ids.push(id.checked_sub(1));
        }
        per_traceback.push(ids.into());
    }
    r.finish()?;
    Ok((functions, per_traceback))
}

/// Reads and decodes a snapshot file.
pub fn load(path: &Path) -> Result<(Snapshot, Attributes)> {
    load_interruptible(path, &mut || Ok(()))
}

/// [`load`], calling `check` between two chunks of the read (every [`READ_CHUNK`] bytes and
/// after a read interrupted by a signal) and giving up with its error: the pyo3 layer
/// passes a check of pending signals, so that Ctrl-C stops the read of a large file
/// instead of waiting for its end.
pub fn load_interruptible(
    path: &Path,
    check: &mut dyn FnMut() -> Result<()>,
) -> Result<(Snapshot, Attributes)> {
    let format_err = |reason: Reason| reason.at(path);
    let data = read_snapshot_file(path, check)?.map_err(format_err)?;
    decode(&data).map_err(format_err)
}

/// Bytes read per `read()` call: small enough that a structure error shows before much of a
/// large file is read, large enough to cost nothing in system calls.
const READ_CHUNK: usize = 8 << 20;
/// Reserved at once for a file up to this size; larger files grow as they are read, so a
/// file that claims to be huge (a sparse file) costs memory only for the bytes actually read
/// before it is refused.
const READ_RESERVE: usize = 64 << 20;

/// Reads a snapshot file whole, checking it as it comes: `Ok(Err(reason))` for a file that is
/// not a snapshot.
///
/// Only a regular file is read: a FIFO, a device or a socket is refused before any read, and
/// opened without blocking, since reading `/dev/zero` or a FIFO without a writer would never
/// end. The header is checked from the first 12 bytes and the section structure as each
/// chunk arrives, so a file that is not a snapshot costs one small read however large it
/// says it is; nothing past the size the file had when opened is read.
fn read_snapshot_file(
    path: &Path,
    check: &mut dyn FnMut() -> Result<()>,
) -> Result<std::result::Result<Vec<u8>, Reason>> {
    use std::io::Read;
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let io_err = |action: &'static str| {
        move |source| Error::Io {
            path: path.to_path_buf(),
            action,
            source,
        }
    };
    let mut file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(io_err("read"))?;
    let meta = file.metadata().map_err(io_err("read"))?;
    let kind = meta.file_type();
    if kind.is_dir() {
        return Err(io_err("read")(std::io::Error::from_raw_os_error(
            libc::EISDIR,
        )));
    }
    if !kind.is_file() {
        let what = if kind.is_fifo() {
            "a FIFO"
        } else if kind.is_char_device() {
            "a character device"
        } else if kind.is_block_device() {
            "a block device"
        } else if kind.is_socket() {
            "a socket"
        } else {
            "a special file"
        };
        return Ok(Err(Reason::from(format!(
            "it is {what}, not a regular file (snapshots are read from regular files only)"
        ))));
    }
    let total = usize::try_from(meta.len()).unwrap_or(usize::MAX);
    let mut data: Vec<u8> = Vec::new();
    // MemoryError, as for every other result too large to hold, not an OSError: the read
    // went fine, the file is simply larger than the memory left.
    let out_of_memory = || Error::OutOfMemory;
    data.try_reserve_exact(total.min(READ_RESERVE))
        .map_err(|_| out_of_memory())?;
    let mut pos = HEADER_LEN;
    let mut header_checked = false;
    while data.len() < total {
        check()?;
        // The header alone first, then chunks.
        let want = match header_checked {
            false => HEADER_LEN,
            true => READ_CHUNK,
        }
        .min(total - data.len());
        if data.capacity() - data.len() < want {
            let grow = want.max(data.len().min(total - data.len()));
            data.try_reserve_exact(grow).map_err(|_| out_of_memory())?;
        }
        let start = data.len();
        data.resize(start + want, 0);
        let mut got = 0;
        while got < want {
            match file.read(&mut data[start + got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => check()?,
                Err(e) => return Err(io_err("read")(e)),
            }
        }
        data.truncate(start + got);
        if got < want {
            // The file shrank while being read: decode reports it truncated.
            break;
        }
        if !header_checked {
            if let Err(reason) = check_header(&data) {
                return Ok(Err(reason));
            }
            header_checked = true;
        }
        if let Err(reason) = walk_sections(&data, total, &mut pos) {
            return Ok(Err(reason));
        }
    }
    Ok(Ok(data))
}

/// Writes a snapshot file atomically and durably (see [`write_atomic`]).
pub fn dump(path: &Path, snapshot: &Snapshot, attrs: &Attributes) -> Result<()> {
    let encoder = Encoder::new(snapshot, attrs, parallel::parts_for)?;
    replace_file(path, &encoder.pieces())
}

/// Writes a file atomically: the bytes go to a temporary file in the same directory, synced
/// to disk, then renamed over `path`, and the directory is synced, so neither a failed or
/// interrupted write nor a crash soon after leaves a partial or empty file at `path`. On any
/// error before the rename the temporary file is removed and an existing file at `path` is
/// left untouched. Snapshot dumps and exports share it.
pub fn write_atomic(path: &Path, data: &[u8]) -> Result<()> {
    replace_file(path, &[data])
}

/// [`write_atomic`] of the concatenation of `pieces`, which are written one after the
/// other, never copied into one buffer.
fn replace_file(path: &Path, pieces: &[&[u8]]) -> Result<()> {
    let write = |mut f: &fs::File| pieces.iter().try_for_each(|p| f.write_all(p));
    let io_err = |action: &'static str, p: &Path| {
        let p = p.to_path_buf();
        move |source| Error::Io {
            path: p,
            action,
            source,
        }
    };
    // Replacing by rename is only right for a regular file (or no file yet). A device or a
    // FIFO is written to, as `open()` would, instead of being replaced by a regular file; a
    // symbolic link keeps pointing where it did, at the file that gets replaced.
    let path = match fs::metadata(path) {
        Ok(meta) if !meta.is_file() => {
            let f = fs::OpenOptions::new()
                .write(true)
                .open(path)
                .map_err(io_err("open", path))?;
            return write(&f).map_err(io_err("write", path));
        }
        Ok(_) => fs::canonicalize(path).map_err(io_err("resolve", path))?,
        Err(_) => path.to_path_buf(),
    };
    let path = path.as_path();
    // The file being replaced, held open across the rename so that the rename only unlinks
    // it: freeing its blocks happens at the last close instead, which `close_in_background`
    // does off the caller's thread (measured: 2-8 ms inside `rename` for a 3 MB file on
    // ext4). Not readable, or not there: nothing to hold.
    let replaced = fs::File::open(path).ok();
    let tmp = temp_path(path);
    let result = (|| {
        let f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(io_err("create", &tmp))?;
        write(&f).map_err(io_err("write", &tmp))?;
        // On disk before it gets the good name: after a crash the name holds either the old
        // file or the complete new one, never an empty or partial file.
        f.sync_data().map_err(io_err("sync", &tmp))?;
        drop(f);
        fs::rename(&tmp, path).map_err(io_err("replace", path))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
        return result;
    }
    let synced = sync_parent(path);
    if let Some(file) = replaced {
        close_in_background(file);
    }
    synced
}

/// Closes a file on a short-lived thread of its own, or here if no thread can be started.
/// For a file already unlinked, the close is what frees its blocks.
///
/// A process that forks before the thread has closed it leaves the child a descriptor of
/// the old file, which keeps its blocks until the child closes it or exits: the price of not
/// making every `dump()` wait for them.
fn close_in_background(file: fs::File) {
    // A thread that cannot be started drops its closure, and the file with it, right here.
    let _ = std::thread::Builder::new()
        .name("alloctrace-close".into())
        .spawn(move || drop(file));
}

/// Makes a rename in `path`'s directory durable. Filesystems that cannot sync a directory
/// (they answer EINVAL) are let be: there is nothing more to do on them.
fn sync_parent(path: &Path) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let synced = fs::File::open(dir).and_then(|d| d.sync_all());
    match synced {
        Err(e) if e.raw_os_error() != Some(libc::EINVAL) => Err(Error::Io {
            path: dir.to_path_buf(),
            action: "sync",
            source: e,
        }),
        _ => Ok(()),
    }
}

/// `.NAME.PID.N.tmp` next to `path`, with NAME cut short where needed so that the whole
/// name fits in the 255 bytes a file name may have: any name that fits there can be
/// dumped to.
fn temp_path(path: &Path) -> PathBuf {
    use std::ffi::OsStr;
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    const NAME_MAX: usize = 255;
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let suffix = format!(".{}.{n}.tmp", std::process::id());
    let name = path.file_name().map(OsStr::as_bytes).unwrap_or_default();
    let keep = name.len().min(NAME_MAX - 1 - suffix.len());
    let mut tmp = Vec::with_capacity(NAME_MAX);
    tmp.push(b'.');
    tmp.extend_from_slice(&name[..keep]);
    tmp.extend_from_slice(suffix.as_bytes());
    path.with_file_name(std::ffi::OsString::from_vec(tmp))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::snapshot::SnapshotBuilder;

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
    const VERSION_1_FILE: &[u8] = include_bytes!("../../tests/data/format-version-1.alct");

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
        let strs = |items: &[&str]| -> Vec<Box<[u8]>> {
            items.iter().map(|s| s.as_bytes().into()).collect()
        };
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
}
