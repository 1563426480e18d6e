//! Writing a snapshot: the sections in order, each appended straight to the output, which
//! grows fallibly (a snapshot too large for the memory left is `MemoryError`, not an abort).

use crate::analysis::parallel;
use crate::analysis::snapshot::Snapshot;
use crate::error::Result;
use crate::platform::fallible;

use super::columns::TraceColumns;
use super::*;

#[inline(always)]
pub(super) fn put_uleb(out: &mut Vec<u8>, mut v: u64) {
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

pub(super) fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_uleb(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// Writes a section whose payload `write` appends straight to `out`, then fills in its
/// length: the large sections are not built in a scratch buffer and copied.
fn section_with(
    out: &mut Vec<u8>,
    tag: u32,
    write: impl FnOnce(&mut Vec<u8>) -> Result<()>,
) -> Result<()> {
    fallible::room_for(out, SECTION_HEADER_LEN)?;
    out.extend_from_slice(&tag.to_le_bytes());
    let len_at = out.len();
    out.extend_from_slice(&0u64.to_le_bytes());
    write(out)?;
    let len = (out.len() - len_at - 8) as u64;
    out[len_at..len_at + 8].copy_from_slice(&len.to_le_bytes());
    Ok(())
}

pub(super) fn section(out: &mut Vec<u8>, tag: u32, payload: &[u8]) -> Result<()> {
    fallible::room_for(out, SECTION_HEADER_LEN + payload.len())?;
    out.extend_from_slice(&tag.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(payload);
    Ok(())
}

/// The most bytes one `put_uleb` writes.
pub(super) const MAX_ULEB: usize = 10;

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
pub(super) struct Encoder {
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
    pub(super) fn new(
        snapshot: &Snapshot,
        attrs: &Attributes,
        parts_for: fn(usize) -> usize,
    ) -> Result<Self> {
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
        fallible::room_for(&mut out, SECTION_HEADER_LEN)?;
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

        if let Some(machine) = &md.machine {
            buf.clear();
            put_bytes_in_room(&mut buf, machine.id.as_bytes())?;
            put_bytes_in_room(&mut buf, machine.hostname.as_bytes())?;
            section(&mut out, TAG_MACHINE, &buf)?;
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

        fallible::room_for(&mut out, SECTION_HEADER_LEN)?;
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
    pub(super) fn pieces(&self) -> Vec<&[u8]> {
        let mut pieces = vec![&self.head[..]];
        pieces.extend(self.columns.pieces());
        pieces.extend([&self.tail[..], &self.crc[..]]);
        pieces
    }

    /// The whole file in one buffer.
    pub(super) fn to_vec(&self) -> Result<Vec<u8>> {
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
pub(super) fn put_peak_section(out: &mut Vec<u8>, snapshot: &Snapshot) -> Result<()> {
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
