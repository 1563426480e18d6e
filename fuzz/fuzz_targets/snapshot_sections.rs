//! Like `snapshot_decode`, but the input is only the section stream: the harness adds the
//! header and a valid end marker with the right checksum. Random bytes almost never carry a
//! valid CRC-32, so without this the fuzzer would rarely get past the checksum into the
//! section decoders (tables, LEB128 integers, attribute trees, cross-references). The first
//! input byte picks the format version written in the header (1 up to the current one), so the
//! traces sections of every version are reached.
#![no_main]

use alloctrace::analysis::format::{crc32, decode, encode, FORMAT_VERSION, MAGIC};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let Some((&pick, sections)) = input.split_first() else {
        return;
    };
    let version = 1 + u32::from(pick) % FORMAT_VERSION;
    let mut file = Vec::with_capacity(sections.len() + 28);
    file.extend_from_slice(MAGIC);
    file.extend_from_slice(&version.to_le_bytes());
    file.extend_from_slice(sections);
    file.extend_from_slice(&0u32.to_le_bytes());
    file.extend_from_slice(&4u64.to_le_bytes());
    let crc = crc32(&file);
    file.extend_from_slice(&crc.to_le_bytes());
    if let Ok((snapshot, attrs)) = decode(&file) {
        let once = encode(&snapshot, &attrs);
        let (again, again_attrs) = decode(&once).expect("re-decoding an encoded snapshot");
        assert_eq!(once, encode(&again, &again_attrs), "encoding is not stable");
    }
});
