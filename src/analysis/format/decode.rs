//! Reading a snapshot from bytes: the header, the section structure, the checksum, then each
//! section against its own length. Every failure is a [`Reason`], never a panic.

use std::fmt;
use std::path::Path;

use crate::analysis::filter::is_surrogatepass_utf8;
use crate::analysis::parallel;
use crate::analysis::sampling::MAX_INTERVAL;
use crate::analysis::snapshot::{
    Domains, Frame, Function, FunctionId, Kinds, Metadata, SiteRetention, Snapshot, Trace,
    Traceback,
};
use crate::error::Error;
use crate::platform::fallible;
use crate::platform::machine::{Machine, MAX_HOSTNAME_LEN, MAX_ID_LEN};
use crate::platform::process_memory::ProcessMemory;

use super::columns::{decode_trace_columns, Traces};
use super::*;

/// Decodes section 12 (see [`put_peak_section`](super::encode::put_peak_section)) into
/// `(blocks, peak)`; `nested` is true inside a form-2 payload, where only form 1 may appear.
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
pub(super) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    pub(super) what: &'static str,
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
    pub(super) fn new(buf: &'a [u8], what: &'static str) -> Self {
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
    pub(super) fn take(&mut self, n: usize, field: &str) -> std::result::Result<&'a [u8], Reason> {
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

    pub(super) fn finish(&self) -> std::result::Result<(), Reason> {
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
pub(super) const MAX_TIMESTAMP: f64 = 253_402_300_800.0;

/// Checks the magic number and the version in the first bytes of a file (all of it, or at
/// least its first [`HEADER_LEN`] bytes); returns the version.
pub(super) fn check_header(data: &[u8]) -> std::result::Result<u32, Reason> {
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
pub(super) fn walk_sections(
    data: &[u8],
    total: usize,
    pos: &mut usize,
) -> std::result::Result<bool, Reason> {
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
    let machine = match section(TAG_MACHINE) {
        Some(payload) => Some(decode_machine(payload)?),
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
            machine,
        },
        sample_interval,
        kinds,
        retention,
        blocks,
        peak,
    };
    Ok((snapshot, attrs))
}

/// Section 14: the app-specific machine id and the hostname, each a length and UTF-8 bytes,
/// bounded (the id by [`MAX_ID_LEN`], the hostname by [`MAX_HOSTNAME_LEN`]). Whatever id a file
/// claims is taken as it is: the id is a fidelity guard, not an authentication.
pub(super) fn decode_machine(payload: &[u8]) -> std::result::Result<Machine, Reason> {
    let mut r = Reader::new(payload, "machine");
    let mut text = |field: &str, max: usize| -> std::result::Result<String, Reason> {
        let bytes = r.bytes(field)?;
        if bytes.len() > max {
            return Err(Reason::from(format!(
                "the machine section's {field} is {} bytes long, longer than {max}",
                bytes.len()
            )));
        }
        match std::str::from_utf8(bytes) {
            Ok(s) if !s.contains('\0') => Ok(s.to_owned()),
            _ => Err(Reason::from(format!(
                "the machine section's {field} is not text"
            ))),
        }
    };
    let id = text("id", MAX_ID_LEN)?;
    let hostname = text("hostname", MAX_HOSTNAME_LEN)?;
    r.finish()?;
    Ok(Machine { id, hostname })
}

/// Section 13: a field count, then RSS, anonymous, file-backed, shared and peak RSS in
/// bytes, LEB128; fields past those five (from a newer writer) are skipped.
pub(super) fn decode_process_memory(payload: &[u8]) -> std::result::Result<ProcessMemory, Reason> {
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
pub(super) fn trace_domains(
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

pub(super) fn bad_traceback(i: usize, tb: u64, tracebacks: usize) -> Reason {
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

/// Section 11: the report count, then per report the site's filename (bytes), lineno,
/// count, unreachable, size and retained (uleb128), the path count and paths, the pattern
/// line count and lines (each a string as bytes). Strings are checked to be surrogatepass
/// UTF-8, and `unreachable` to be at most `count`.
pub(super) fn decode_retention(payload: &[u8]) -> std::result::Result<Vec<SiteRetention>, Reason> {
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
pub(super) fn decode_kinds(payload: &[u8], ntraces: usize) -> std::result::Result<Kinds, Reason> {
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
