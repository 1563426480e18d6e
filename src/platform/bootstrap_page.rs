//! Giving back the page `alloctrace attach` mapped in this process for its bootstrap lines.
//!
//! The debugger maps one anonymous page in the target, writes the bootstrap's Python text
//! into it and queues `PyRun_SimpleString` on it. CPython compiles the text before running it,
//! so once the lines run, nothing reads the page again and they can unmap it themselves;
//! otherwise each attach and detach would leave 4 KiB behind for good.
//!
//! The address comes from the text itself (the debugger writes it there), so it is checked
//! before anything is unmapped: page-aligned, inside one anonymous read-write mapping of this
//! process, and holding the text's first bytes. Anything else is left alone.

use crate::error::{Error, Result};

const PAGE: usize = 4096;

/// Unmaps `[address, address + size)` if it is the bootstrap page whose text starts with
/// `prefix`; returns whether it did.
pub fn release(address: usize, size: usize, prefix: &[u8]) -> Result<bool> {
    if address == 0 || address % PAGE != 0 || size == 0 || size % PAGE != 0 || size > 1 << 20 {
        return Err(Error::InvalidArgument(format!(
            "not a bootstrap page: address {address:#x}, size {size}"
        )));
    }
    if prefix.is_empty() || prefix.len() > size {
        return Err(Error::InvalidArgument(format!(
            "a prefix of 1 to {size} bytes is needed, not {}",
            prefix.len()
        )));
    }
    let maps = std::fs::read_to_string("/proc/self/maps").map_err(|source| Error::Io {
        path: "/proc/self/maps".into(),
        action: "read",
        source,
    })?;
    if !within_anonymous_rw(&maps, address, address + size) {
        return Ok(false);
    }
    // SAFETY: the range lies inside a mapping that is readable (checked just above), and the
    // caller's own text, which it is still running from a compiled copy, is what is read.
    let head = unsafe { std::slice::from_raw_parts(address as *const u8, prefix.len()) };
    if head != prefix {
        return Ok(false);
    }
    // SAFETY: the page holds the bootstrap text, which nothing refers to once compiled.
    Ok(unsafe { libc::munmap(address as *mut libc::c_void, size) } == 0)
}

/// Whether `[start, end)` lies inside one mapping of a `/proc/self/maps` text that is
/// anonymous (no name) and readable and writable.
fn within_anonymous_rw(maps: &str, start: usize, end: usize) -> bool {
    maps.lines().any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let Some((low, high)) = fields.first().and_then(|range| range.split_once('-')) else {
            return false;
        };
        let (Ok(low), Ok(high)) = (
            usize::from_str_radix(low, 16),
            usize::from_str_radix(high, 16),
        ) else {
            return false;
        };
        fields.len() == 5 && fields[1].starts_with("rw") && low <= start && end <= high
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55d0c0a00000-55d0c0a21000 rw-p 00000000 00:00 0                          [heap]
7f0000000000-7f0000003000 rw-p 00000000 00:00 0 
7f0000003000-7f0000004000 r--p 00000000 00:00 0 
7f0000004000-7f0000005000 rw-p 00001000 08:01 1234                       /usr/lib/libx.so
";

    #[test]
    fn only_inside_an_anonymous_read_write_mapping() {
        let cases = [
            (0x7f00_0000_0000, 0x7f00_0000_1000, true),
            (0x7f00_0000_2000, 0x7f00_0000_3000, true),
            (0x7f00_0000_2000, 0x7f00_0000_4000, false), // runs into the read-only one
            (0x7f00_0000_3000, 0x7f00_0000_4000, false), // read-only
            (0x7f00_0000_4000, 0x7f00_0000_5000, false), // a file's
            (0x55d0_c0a0_0000, 0x55d0_c0a0_1000, false), // [heap] has a name
            (0x1000, 0x2000, false),                     // not mapped
        ];
        for (start, end, expected) in cases {
            assert_eq!(
                within_anonymous_rw(MAPS, start, end),
                expected,
                "{start:#x}"
            );
        }
    }

    #[test]
    fn refuses_what_is_not_a_page() {
        assert!(release(0, PAGE, b"x").is_err());
        assert!(release(PAGE + 1, PAGE, b"x").is_err());
        assert!(release(PAGE, 100, b"x").is_err());
        assert!(release(PAGE, PAGE, b"").is_err());
    }

    #[test]
    fn releases_a_page_with_the_prefix_and_keeps_others() {
        // SAFETY: a fresh anonymous page of our own.
        let page = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                PAGE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(page, libc::MAP_FAILED);
        // SAFETY: the page is ours and writable.
        unsafe { std::ptr::copy_nonoverlapping(b"boot".as_ptr(), page as *mut u8, 4) };
        assert!(!release(page as usize, PAGE, b"other").unwrap());
        assert!(release(page as usize, PAGE, b"boot").unwrap());
    }
}
