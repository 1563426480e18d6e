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
//! Sections: 1 metadata (bincode + serde), 2 filenames, 3 frames, 4 tracebacks, 5 traces (version
//! 1), 6 user attributes, 7 functions per traceback frame (optional: absent in files written before
//! function names were recorded, which load with every function unknown), 8 traces (version 2,
//! below), 9 sampling interval (below), 10 object kinds (optional: the kind-name table, then one
//! kind id per trace, in trace order; written only for snapshots taken with `objects=True`), 11
//! retention reports (optional: see [`decode_retention`](decode::decode_retention)), 12 the peak
//! (optional: see [`put_peak_section`](encode::put_peak_section)), 13 the process's memory, 14 the
//! machine (optional: the app-specific machine id and the hostname, each a LEB128 length and
//! UTF-8 bytes; files without it are from before it was recorded). Tables are written once and
//! referenced by index; integers inside the tables are unsigned LEB128, and traces are stored by
//! column (run-length domains, sizes, traceback ids) because that is what makes a 1M-trace dump a
//! few MB.
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
//!
//! The code, one file per job: `encode` writes the sections, `decode` checks and reads
//! them, `columns` is the version-2 traces codec both use, and `file` reads a snapshot file
//! (regular files only, checked as they arrive) and replaces a file atomically, which the
//! exports use too.

mod columns;
mod decode;
mod encode;
mod file;
#[cfg(test)]
mod tests;

pub use decode::{decode, Reason};
pub use encode::encode;
pub use file::{dump, load, load_interruptible, write_atomic};

use serde::{Deserialize, Serialize};

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
/// Object kinds per trace (optional; see [`decode_kinds`](decode::decode_kinds)).
const TAG_KINDS: u32 = 10;
/// Retention reports (optional; see [`decode_retention`](decode::decode_retention)).
const TAG_RETENTION: u32 = 11;
/// The process's resident memory at capture time (optional; see
/// [`decode_process_memory`](decode::decode_process_memory)).
const TAG_PROCESS_MEMORY: u32 = 13;
/// Fields section 13 holds today; a later writer may append more, which this reader skips.
const PROCESS_MEMORY_FIELDS: u64 = 5;
/// The machine the snapshot was taken on (optional; see
/// [`decode_machine`](decode::decode_machine)).
const TAG_MACHINE: u32 = 14;
/// The peak (section 12): see [`put_peak_section`](encode::put_peak_section).
const TAG_PEAK: u32 = 12;
const HEADER_LEN: usize = 12;
/// A section's tag and length.
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
