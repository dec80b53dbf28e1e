//! Target-ID parsing and matching on arbitrary text (the loader parses the
//! architectures the HIP runtime passes; bundles and archives carry target
//! strings).
//!
//! Invariants: no panic, no blow-up; printing is canonical (parse → print →
//! parse is the identity); an agent accepts each of its compatible targets,
//! and the first one is itself.
#![no_main]

use kpack_format::target::{is_host_triple, target_of_triple, TargetId};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = (target_of_triple(text), is_host_triple(text));
    // "agent\ncode object": two target IDs to match against each other.
    let (text, code_object) = text.split_once('\n').unwrap_or((text, ""));
    let Ok(t) = TargetId::parse(text) else {
        return;
    };
    let printed = t.to_string();
    let again = TargetId::parse(&printed).expect("printed target ID parses");
    assert_eq!(again, t);
    assert_eq!(again.to_string(), printed);
    let compatible = t.compatible_targets();
    assert_eq!(compatible.first(), Some(&t));
    for c in &compatible {
        assert!(t.accepts(c), "{t} does not accept its compatible {c}");
    }
    // The other way round: something is accepted only if listed.
    if let Ok(other) = TargetId::parse(code_object) {
        assert_eq!(t.accepts(&other), compatible.contains(&other));
    }
});
