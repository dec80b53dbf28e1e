//! The MessagePack decoder (archive TOCs, HIPK metadata) on arbitrary
//! bytes.
//!
//! Invariants: no panic, no unbounded allocation; a decoded value
//! re-encodes to bytes that decode to a value encoding the same way;
//! `decode` succeeds exactly when `decode_prefix` uses every byte.
#![no_main]

use kpack_format::msgpack::{decode, decode_prefix, encode};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let whole = decode(data);
    let prefix = decode_prefix(data);
    match (&whole, &prefix) {
        (Ok(v), Ok((p, used))) => {
            assert_eq!(*used, data.len());
            assert_eq!(encode(v), encode(p));
        }
        (Err(_), Ok((_, used))) => assert!(*used < data.len()),
        (Ok(_), Err(e)) => panic!("decode succeeded, decode_prefix failed: {e}"),
        (Err(_), Err(_)) => {}
    }
    if let Ok((v, used)) = prefix {
        assert!(used <= data.len());
        let bytes = encode(&v);
        let again = decode(&bytes).expect("encoded value decodes");
        assert_eq!(encode(&again), bytes, "encode/decode round trip");
        // Canonical encoding never takes more room than the input did.
        assert!(bytes.len() <= used, "{} > {used}", bytes.len());
    }
});
