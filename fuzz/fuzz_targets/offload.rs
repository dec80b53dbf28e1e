//! The ELF offload transform on mutated fixture binaries (the seeds are the
//! fixtures of `cargo xtask fixtures` that fit in 64 KiB).
//!
//! Invariants:
//! - `binary::classify`, `code_objects`, `transform` and
//!   `verify_elf` never panic, whatever the bytes;
//! - when the transform produces a binary from an input whose segments are
//!   sound (the verifier finds no PT_LOAD/PT_PHDR problem in the input:
//!   congruent, ordered, not overlapping), the verifier accepts it, or every
//!   problem it reports is one the input already had (same message once
//!   numbers are masked: a PT_LOAD index shifts by one when the transform
//!   splits a segment). The transform validates what it needs of the
//!   layout, not every rule of formats.md §4.3: from an input whose segments are
//!   already out of order or overlapping it may produce a binary that is
//!   just as broken, which the offload driver (verifying every output
//!   before writing it) refuses. What it must never do is break a sound
//!   binary. Set `KPACK_FUZZ_STRICT=1` to require that every output
//!   verifies.
//! - the output is recognized as offloaded, and transforming it again is
//!   refused with an error (never a second rewrite);
//! - restoring the output with the input's own bundles (the rewrite of
//!   `kpack restore`) never panics, and what it writes is a fat binary
//!   the fat-binary verifier reads without panicking.
#![no_main]

use std::path::Path;
use std::sync::OnceLock;

use kpack_format::hipk::HipkMetadata;
use kpack_host::offload::verify::VerifyError;
use kpack_bundle::parse_fatbin;
use kpack_host::binary::{classify, Class, HostBinary};
use kpack_host::elf::ElfView;
use kpack_host::offload::{code_objects, elf, verify_elf, verify_fat};
use libfuzzer_sys::fuzz_target;

fn metadata() -> &'static [u8] {
    static META: OnceLock<Vec<u8>> = OnceLock::new();
    META.get_or_init(|| {
        HipkMetadata::new("lib/libfuzz.so", vec!["../.kpack/libfuzz_@GFXARCH@.kpack".into()])
        .encode()
    })
}

fn strict() -> bool {
    static S: OnceLock<bool> = OnceLock::new();
    *S.get_or_init(|| std::env::var_os("KPACK_FUZZ_STRICT").is_some_and(|v| v != "0"))
}

/// A problem message with every number (decimal or `0x` hex) masked.
fn kind(problem: &str) -> String {
    let b = problem.as_bytes();
    let mut out = String::with_capacity(problem.len());
    let mut i = 0;
    while i < b.len() {
        if b[i].is_ascii_digit() {
            i += if b[i] == b'0' && b.get(i + 1) == Some(&b'x') {
                2
            } else {
                0
            };
            while i < b.len() && b[i].is_ascii_hexdigit() {
                i += 1;
            }
            out.push('#');
        } else {
            let c = problem[i..].chars().next().expect("char");
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

fn problems(b: &[u8]) -> Vec<String> {
    match verify_elf(b, None) {
        Err(VerifyError::Problems(p)) => p.iter().map(|p| kind(p)).collect(),
        _ => Vec::new(),
    }
}

fuzz_target!(|data: &[u8]| {
    let class = classify(data);
    if let Ok(cos) = code_objects(Path::new("fuzz"), data) {
        for co in &cos {
            let _ = (co.bundle, co.target.len(), co.data.len());
        }
    }
    let Ok(t) = elf::transform(data, metadata()) else {
        return;
    };
    let t_bytes = t.to_vec();
    assert_eq!(class, Class::Fat, "transformed an input not classified fat");
    match verify_elf(&t_bytes, Some(t.bundles)) {
        Ok(v) => {
            assert_eq!(v.metadata_addr, t.metadata_addr);
            assert_eq!(v.co_indices.len(), t.wrappers.len());
        }
        // Broken segments in, a broken binary out (an unreadable one
        // included): refused by the driver's verification.
        Err(_) if !strict() && problems(data).iter().any(|h| h.starts_with("PT_")) => return,
        Err(VerifyError::Problems(p)) if !strict() => {
            let had = problems(data);
            for problem in &p {
                assert!(
                    had.contains(&kind(problem)),
                    "the transform introduced a problem: {problem}\n(input had: {had:?})"
                );
            }
            return;
        }
        Err(e) => panic!("transform output fails verification: {e}"),
    }
    assert_eq!(
        classify(&t_bytes),
        Class::Offloaded,
        "output not recognized as offloaded"
    );
    assert!(
        elf::transform(&t_bytes, metadata()).is_err(),
        "rewrote an offloaded binary"
    );
    restore_again(data, &t_bytes);
});

/// The offloaded binary `out` of `input` restored with the input's
/// bundles.
fn restore_again(input: &[u8], out: &[u8]) {
    let Some(section) = HostBinary::parse(input)
        .ok()
        .and_then(|b| b.fatbin().ok().flatten())
    else {
        return;
    };
    let Ok(bundles) = parse_fatbin(section.data) else {
        return;
    };
    let starts = bundles
        .iter()
        .map(|b| (b.index as u32, b.range.start as u64))
        .collect();
    let request = elf::Request::Restore {
        bundles: elf::Payload::Bytes(section.data),
        starts,
        align: 4096,
    };
    let Ok(elf) = ElfView::parse(out) else {
        return;
    };
    if let Ok(r) = elf::rewrite(elf, &request) {
        let restored = r.to_vec();
        let _ = verify_fat(&restored);
        assert_eq!(restored.len() as u64, r.len());
    }
}
