//! Feeds arbitrary `fnmatch` patterns and filenames to the filter matcher (what
//! `Filter(filename_pattern=...)` compiles): errors are fine, panics and hangs are not.
//!
//! Input: pattern bytes, a NUL, then filename bytes. Checked properties: a pattern without
//! special characters (valid UTF-8) matches itself (modulo the `.pyc` → `.py` rule), and the
//! answer does not depend on the compiled-pattern cache (asking twice gives the same).
#![no_main]

use alloctrace::analysis::filter::{filename_matches, fnmatch_to_glob};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (pattern, filename) = match data.iter().position(|&b| b == 0) {
        Some(nul) => (&data[..nul], &data[nul + 1..]),
        None => (data, &b""[..]),
    };
    let _ = fnmatch_to_glob(pattern);
    let first = filename_matches(pattern, filename);
    let second = filename_matches(pattern, filename);
    assert_eq!(first.is_ok(), second.is_ok());
    if let (Ok(a), Ok(b)) = (&first, &second) {
        assert_eq!(a, b, "cached and fresh answers differ");
    }
    let special = |b: &u8| matches!(b, b'*' | b'?' | b'[');
    let literal = std::str::from_utf8(pattern).is_ok() && !pattern.iter().any(special);
    if first.is_ok() && literal && !pattern.ends_with(b".pyc") {
        assert_eq!(
            filename_matches(pattern, pattern).ok(),
            Some(true),
            "a literal pattern must match itself"
        );
    }
});
