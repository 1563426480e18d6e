//! Feeds arbitrary bytes to the snapshot file decoder, as `Snapshot.load()` would read them
//! from an untrusted file: it must return `Ok` or `Err`, never panic, hang or allocate more
//! than the input justifies (run.sh sets libFuzzer's memory limits for that).
//!
//! Whatever decodes must also survive a round trip: encoding it and decoding the result gives
//! the same bytes again (compared as bytes, so NaN floats in attributes compare equal).
#![no_main]

use alloctrace::analysis::format::{decode, encode};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok((snapshot, attrs)) = decode(data) {
        let once = encode(&snapshot, &attrs);
        let (again, again_attrs) = decode(&once).expect("re-decoding an encoded snapshot");
        assert_eq!(once, encode(&again, &again_attrs), "encoding is not stable");
    }
});
