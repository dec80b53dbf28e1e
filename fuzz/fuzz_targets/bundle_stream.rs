//! Listing and streaming offload bundles (`kpack_bundle::list_fatbin`,
//! `check_fatbin`, `FatbinStream`: compressed bundles read as a stream,
//! entries in offset order) on arbitrary bytes.
//!
//! Invariants (`kpack_bundle::fuzzing::stream_agrees`): no panic; checking
//! gives what `parse_fatbin` gives (bundles or the same error); listing
//! succeeds where parsing does, with the same bundles; streaming hands out
//! the same code objects, or fails with the same error. The crate's tests
//! run the same checks over generated sections.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    kpack_bundle::fuzzing::stream_agrees(data);
});
