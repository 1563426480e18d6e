//! The traces section of version 2 (section 8): sizes and traceback ids stored by column, in
//! blocks of [`COLUMN_BLOCK`] values of one width each, so that decoding runs fixed-width
//! loops instead of branching on every byte (see the module docs of `format`).

use crate::analysis::parallel;
use crate::analysis::snapshot::{Domains, Trace};
use crate::error::Result;
use crate::platform::fallible;

use super::decode::{bad_traceback, trace_domains, Reader};
use super::encode::{put_uleb, MAX_ULEB};
use super::*;

/// Byte width of each width code of a column.
pub(super) const WIDTHS: [usize; 4] = [1, 2, 4, 8];
/// Values per width code in a column: small enough that one large value widens only its own
/// few neighbours, large enough that each run of one width decodes as a vectorised loop.
pub(super) const COLUMN_BLOCK: usize = 16;
/// Traces decoded per block: the column buffers stay in the L1 cache. A multiple of
/// `COLUMN_BLOCK`, so every decode block starts a column block.
const DECODE_BLOCK: usize = 256;

/// The smallest width code that holds `v`.
pub(super) fn width_code(v: u64) -> u8 {
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
pub(super) struct TraceColumns {
    /// The count, the domain runs and the sizes' width codes: all before the sizes' values.
    head: Vec<u8>,
    parts: Vec<EncodedPart>,
    /// The ids' width codes, between the two columns' values.
    id_codes: Vec<u8>,
    /// The CRC state of the whole payload.
    pub(super) crc: crc32fast::Hasher,
}

impl TraceColumns {
    /// Encodes `traces`, whose domains are `domains`, in `parts` parts.
    pub(super) fn encode(traces: &[Trace], domains: &Domains, parts: usize) -> Result<Self> {
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
    pub(super) fn pieces(&self) -> impl Iterator<Item = &[u8]> {
        std::iter::once(&self.head[..])
            .chain(self.parts.iter().map(|p| &p.sizes[..]))
            .chain(std::iter::once(&self.id_codes[..]))
            .chain(self.parts.iter().map(|p| &p.ids[..]))
    }

    /// The payload's length in bytes.
    pub(super) fn len(&self) -> usize {
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

/// A traces section, decoded.
pub(super) type Traces = (Vec<Trace>, Domains);

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
pub(super) fn decode_trace_columns(
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
