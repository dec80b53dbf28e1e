//! HIPK metadata decoding, from a slice and (as the C API does it) as a
//! stream over a pointer of unknown length.
//!
//! Invariants: no panic; both ways agree; the stream is never asked for
//! more than 64 KiB, and for valid metadata never for a byte past the end
//! of the map; each byte is asked for once; valid metadata re-encodes and
//! decodes to the same value.
#![no_main]

use std::io::Read;

use kpack_format::hipk::{HipkMetadata, MAX_METADATA_SIZE};
use kpack_format::msgpack;
use libfuzzer_sys::fuzz_target;

/// The bytes of `data`, handed out as asked; remembers how far it was read.
struct Stream<'a> {
    data: &'a [u8],
    pos: usize,
}

impl Read for Stream<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        assert!(
            self.pos + buf.len() <= MAX_METADATA_SIZE,
            "asked for bytes past 64 KiB"
        );
        let n = buf.len().min(self.data.len() - self.pos);
        buf[..n].copy_from_slice(&self.data[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

fuzz_target!(|data: &[u8]| {
    let direct = HipkMetadata::decode(data);
    let mut stream = Stream { data, pos: 0 };
    let streamed = HipkMetadata::read(&mut stream);
    assert_eq!(direct, streamed);
    if let Ok(m) = direct {
        let (_, used) = msgpack::decode_prefix(&data[..data.len().min(MAX_METADATA_SIZE)])
            .expect("valid metadata is MessagePack");
        assert_eq!(stream.pos, used, "read past the map's {used} bytes");
        let again = HipkMetadata::decode(&m.encode()).expect("encoded metadata decodes");
        assert_eq!(again, m);
    }
});
