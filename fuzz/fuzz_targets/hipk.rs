//! HIPK metadata decoding, from a slice and (as the C API does it) through
//! a window that grows over a pointer of unknown length.
//!
//! Invariants: no panic; both ways agree; the window never asks for more
//! than 64 KiB, and for valid metadata never for a byte past the end of the
//! map; valid metadata re-encodes and decodes to the same value.
#![no_main]

use kpack_core::hipk::{HipkMetadata, MAX_METADATA_SIZE};
use kpack_core::loader::decode_metadata_window;
use kpack_core::msgpack;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let direct = HipkMetadata::decode(data);
    let mut widest = 0usize;
    let windowed = decode_metadata_window(|n| {
        assert!(n <= MAX_METADATA_SIZE, "window of {n} bytes");
        widest = widest.max(n);
        &data[..n.min(data.len())]
    });
    assert_eq!(
        direct.is_ok(),
        windowed.is_ok(),
        "{direct:?} vs {windowed:?}"
    );
    if let Ok(m) = direct {
        assert_eq!(Some(&m), windowed.as_ref().ok());
        let (_, used) = msgpack::decode_prefix(&data[..data.len().min(MAX_METADATA_SIZE)])
            .expect("valid metadata is MessagePack");
        assert!(
            widest <= used,
            "window {widest} past the map's {used} bytes"
        );
        let again = HipkMetadata::decode(&m.encode()).expect("encoded metadata decodes");
        assert_eq!(again, m);
    }
});
