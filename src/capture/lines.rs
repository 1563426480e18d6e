//! Line numbers of many offsets in one code object, reading its line table once.
//!
//! `PyCode_Addr2Line` decodes the line table from its start on every call, so resolving k
//! offsets of a code object whose table has n entries costs about k·n/2 steps. That is
//! quadratic where it matters most: a module's top-level code object allocates at nearly
//! every statement and dies after the import, and when the sweep buries it
//! ([`crate::hooks::intern`]) every offset used needs its line. Importing sympy under tracing spent
//! 400 million instructions (16% of the run) there. Given the offsets in ascending order, one
//! cursor over the table answers them all in about n + k steps.
//!
//! The answers are `PyCode_Addr2Line`'s: 3.10+ move CPython's own cursor
//! (`_PyCode_CheckLineNumber`, declared in `cpython/code.h`) over the table, started as
//! `_PyCode_InitAddressRange` starts it; 3.9's table (`co_lnotab`) is simple enough to replay
//! here, step for step as 3.9's `PyCode_Addr2Line` reads it. (While `sys.monitoring` line
//! events are on, 3.12+ answer `PyCode_Addr2Line` from a per-instruction copy of the lines
//! that CPython computes with this same cursor, so the answers agree.)

use std::ffi::c_void;

use pyo3::ffi;

use super::layout;

/// The first line and the line table (`co_linetable`, or `co_lnotab` on 3.9) of a code
/// object. The slice lives as long as the code object.
///
/// # Safety
/// `code` is a live code object, the GIL is held, and the slice is not used after `code`
/// dies.
unsafe fn table_of<'a>(code: *mut ffi::PyObject) -> (i32, &'a [u8]) {
    let first = *(code.cast::<u8>().add(layout::CODE_FIRSTLINENO) as *const i32);
    let table: *mut ffi::PyObject =
        super::read_ptr(code as *const c_void, layout::CODE_LINETABLE).cast();
    if table.is_null() || ffi::PyBytes_Check(table) == 0 {
        // Cannot happen for a code object; the table then reads as empty.
        return (first, &[]);
    }
    // Neither call can fail on a bytes object.
    let start = ffi::PyBytes_AsString(table);
    let len = ffi::PyBytes_Size(table);
    (
        first,
        std::slice::from_raw_parts(start.cast(), len as usize),
    )
}

/// 3.10+: `PyCodeAddressRange`, the cursor `_PyCode_CheckLineNumber` moves.
#[cfg(Py_3_10)]
#[repr(C)]
struct AddressRange {
    ar_start: i32,
    ar_end: i32,
    ar_line: i32,
    opaque: Opaque,
}

/// Its `struct _opaque`: where the decoding stands.
#[cfg(Py_3_10)]
#[repr(C)]
struct Opaque {
    computed_line: i32,
    lo_next: *const u8,
    limit: *const u8,
}

#[cfg(Py_3_10)]
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<AddressRange>() == layout::ADDRESS_RANGE_SIZE);
    assert!(offset_of!(AddressRange, ar_start) == layout::ADDRESS_RANGE_START);
    assert!(offset_of!(AddressRange, ar_end) == layout::ADDRESS_RANGE_END);
    assert!(offset_of!(AddressRange, ar_line) == layout::ADDRESS_RANGE_LINE);
    let opaque = offset_of!(AddressRange, opaque);
    assert!(opaque + offset_of!(Opaque, computed_line) == layout::ADDRESS_RANGE_COMPUTED_LINE);
    assert!(opaque + offset_of!(Opaque, lo_next) == layout::ADDRESS_RANGE_NEXT);
    assert!(opaque + offset_of!(Opaque, limit) == layout::ADDRESS_RANGE_LIMIT);
};

#[cfg(Py_3_10)]
impl AddressRange {
    /// A cursor before the first entry of a line table, as `_PyCode_InitAddressRange` starts
    /// it; `table` must outlive its use.
    fn before(first: i32, table: &[u8]) -> Self {
        AddressRange {
            ar_start: -1,
            ar_end: 0,
            ar_line: -1,
            opaque: Opaque {
                computed_line: first,
                lo_next: table.as_ptr(),
                limit: table.as_ptr_range().end,
            },
        }
    }
}

#[cfg(Py_3_10)]
extern "C" {
    fn _PyCode_CheckLineNumber(lasti: i32, bounds: *mut AddressRange) -> i32;
}

/// 3.10+: the line of each byte offset in `offsets` (ascending for one pass; any order is
/// still answered correctly), as `PyCode_Addr2Line` gives it: the first line for a negative
/// offset, -1 where the table has no line.
///
/// # Safety
/// `code` is a live code object and the GIL is held.
#[cfg(Py_3_10)]
pub unsafe fn by_address_ranges(code: *mut ffi::PyObject, offsets: &[i32], out: &mut Vec<i32>) {
    let (first, table) = table_of(code);
    let mut range = AddressRange::before(first, table);
    out.extend(offsets.iter().map(|&offset| {
        if offset < 0 {
            first
        } else {
            _PyCode_CheckLineNumber(offset, &mut range)
        }
    }));
}

/// 3.10+: the code object's line table as runs `(first byte offset, line)`, ascending, each
/// run's line holding up to the next run's offset; the last run, `(end, -1)`, stands for the
/// offsets past the table, which `PyCode_Addr2Line` answers with -1. The interner reads this
/// once per code object to tell which offsets share a line (see [`crate::hooks::intern`]). Runs in
/// hooks, so `out` grows only by a fallible reservation made first (a table entry is at least
/// a byte, so there are at most as many runs as bytes, plus the last); `None` without it.
///
/// # Safety
/// `code` is a live code object and the GIL is held.
#[cfg(Py_3_10)]
pub unsafe fn runs_by_address_ranges(
    code: *mut ffi::PyObject,
    out: &mut Vec<(i32, i32)>,
) -> Option<()> {
    let (first, table) = table_of(code);
    out.clear();
    out.try_reserve(table.len() + 1).ok()?;
    let mut range = AddressRange::before(first, table);
    let mut offset = 0;
    loop {
        let line = _PyCode_CheckLineNumber(offset, &mut range);
        if range.ar_end <= offset || out.len() == table.len() {
            // The table is exhausted: the cursor did not move past `offset`.
            break;
        }
        out.push((offset, line));
        offset = range.ar_end;
    }
    out.push((offset, -1));
    Some(())
}

/// 3.9: as [`runs_by_address_ranges`], over `co_lnotab`; its last line holds for every offset
/// past the table, as 3.9's `PyCode_Addr2Line` reads it.
///
/// # Safety
/// `code` is a live code object and the GIL is held.
#[cfg(not(Py_3_10))]
pub unsafe fn runs_by_lnotab(code: *mut ffi::PyObject, out: &mut Vec<(i32, i32)>) -> Option<()> {
    let (first, table) = table_of(code);
    lnotab_runs(table, first, out)
}

/// The runs of a 3.9 `co_lnotab` (see [`LnotabCursor`] for how it reads): a pair with a
/// bytecode increment ends a run at its offset; pairs with none only move the line.
#[cfg_attr(Py_3_10, allow(dead_code))]
fn lnotab_runs(table: &[u8], first: i32, out: &mut Vec<(i32, i32)>) -> Option<()> {
    out.clear();
    out.try_reserve(table.len() / 2 + 1).ok()?;
    let (mut address, mut line) = (0, first);
    for pair in table.chunks_exact(2) {
        if pair[0] != 0 {
            out.push((address, line));
            address += i32::from(pair[0]);
        }
        line += i32::from(pair[1] as i8);
    }
    out.push((address, line));
    Some(())
}

/// 3.9: as [`by_address_ranges`], over `co_lnotab`.
///
/// # Safety
/// `code` is a live code object and the GIL is held.
#[cfg(not(Py_3_10))]
pub unsafe fn by_lnotab(code: *mut ffi::PyObject, offsets: &[i32], out: &mut Vec<i32>) {
    let (first, table) = table_of(code);
    let mut cursor = LnotabCursor::new(table, first);
    out.extend(offsets.iter().map(|&offset| cursor.line_at(offset)));
}

/// A forward-only reading of a 3.9 `co_lnotab`: pairs of (bytecode increment, signed line
/// increment). The line of an offset is the first line plus the line increments of every
/// pair whose cumulative bytecode offset does not pass it, exactly as 3.9's
/// `PyCode_Addr2Line` sums them. A query before the current position restarts the reading.
#[cfg_attr(Py_3_10, allow(dead_code))]
struct LnotabCursor<'a> {
    table: &'a [u8],
    first: i32,
    /// Pairs consumed, and the bytecode offset and line after them.
    pairs: usize,
    address: i32,
    line: i32,
}

#[cfg_attr(Py_3_10, allow(dead_code))]
impl<'a> LnotabCursor<'a> {
    fn new(table: &'a [u8], first: i32) -> Self {
        Self {
            table,
            first,
            pairs: 0,
            address: 0,
            line: first,
        }
    }

    fn line_at(&mut self, offset: i32) -> i32 {
        if offset < self.address {
            *self = Self::new(self.table, self.first);
        }
        while let Some(pair) = self.table.get(2 * self.pairs..2 * self.pairs + 2) {
            let next = self.address + i32::from(pair[0]);
            if next > offset {
                break;
            }
            self.address = next;
            self.line += i32::from(pair[1] as i8);
            self.pairs += 1;
        }
        self.line
    }
}

#[cfg(test)]
mod tests {
    use super::LnotabCursor;

    /// 3.9's `PyCode_Addr2Line`, one call per offset, to check the cursor against.
    fn addr2line(table: &[u8], first: i32, offset: i32) -> i32 {
        let mut line = first;
        let mut address = 0;
        for pair in table.chunks_exact(2) {
            address += i32::from(pair[0]);
            if address > offset {
                break;
            }
            line += i32::from(pair[1] as i8);
        }
        line
    }

    /// 3.9 line tables, with 40 as the first line.
    const TABLES: &[&[u8]] = &[
        &[],
        &[0, 1],
        &[6, 1, 8, 1, 0, 2, 10, 255, 4, 3],
        // A jump of more than 255 bytes is split into (255, 0) pairs; a line decrease is a
        // negative increment.
        &[255, 0, 45, 1, 2, 128, 0, 127, 12, 246],
    ];

    #[test]
    fn lnotab_runs_answer_as_addr2line() {
        for (t, table) in TABLES.iter().enumerate() {
            let mut runs = Vec::new();
            super::lnotab_runs(table, 40, &mut runs).unwrap();
            assert!(
                runs.windows(2).all(|w| w[0].0 < w[1].0),
                "table {t}: {runs:?}"
            );
            for offset in 0..320 {
                let run = runs.partition_point(|&(start, _)| start <= offset) - 1;
                assert_eq!(
                    runs[run].1,
                    addr2line(table, 40, offset),
                    "table {t}, offset {offset}"
                );
            }
        }
    }

    #[test]
    fn lnotab_cursor_answers_as_addr2line_in_any_order() {
        for (t, table) in TABLES.iter().enumerate() {
            let ascending: Vec<i32> = (-2..320).collect();
            let mut scrambled = ascending.clone();
            scrambled.reverse();
            scrambled.rotate_left(100);
            for offsets in [&ascending, &scrambled] {
                let mut cursor = LnotabCursor::new(table, 40);
                for &offset in offsets {
                    assert_eq!(
                        cursor.line_at(offset),
                        addr2line(table, 40, offset),
                        "table {t}, offset {offset}"
                    );
                }
            }
        }
    }
}
