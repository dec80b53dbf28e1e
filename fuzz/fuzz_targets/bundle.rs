//! The offload-bundle parser (`.hip_fatbin` bytes: plain bundles and CCOB
//! v1/v2/v3, zlib or zstd) on arbitrary bytes.
//!
//! Invariants: no panic; on success the bundles are numbered 0.., their
//! ranges lie inside the input, and writing a plain bundle back from the
//! parsed entries and parsing it again gives the same triples and bytes.
#![no_main]

use kpack_bundle::{parse_fatbin, write_bundle};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(bundles) = parse_fatbin(data) else {
        return;
    };
    for (i, b) in bundles.iter().enumerate() {
        assert_eq!(b.index, i);
        assert!(b.range.start < b.range.end && b.range.end <= data.len());
        for e in &b.entries {
            // Entries' targets and host flags are computable; data derefs.
            let _ = (e.target(), e.is_host(), e.data.len());
        }
        let entries: Vec<(&str, &[u8])> = b
            .entries
            .iter()
            .map(|e| (e.triple.as_str(), &e.data[..]))
            .collect();
        let again = write_bundle(&entries, 1);
        let parsed = parse_fatbin(&again).expect("a re-written bundle parses");
        // A bundle whose entries are all empty and whose table is... still
        // one bundle: the magic is never zero.
        assert_eq!(parsed.len(), 1, "re-written bundle {i} splits");
        let p = &parsed[0];
        assert_eq!(p.entries.len(), b.entries.len());
        for (x, y) in p.entries.iter().zip(&b.entries) {
            assert_eq!(x.triple, y.triple);
            assert_eq!(&x.data[..], &y.data[..]);
        }
    }
});
