//! The hard limits of ROCm's HRX runtime, which reads offloaded binaries
//! and `.kpack` archives with a reader of its own (formats.md, "Other
//! readers' limits"). kpack's own runtime has none of these limits (or
//! larger ones); an output past one loads with kpack's runtime and fails
//! with HRX's. Writers warn when their output exceeds one, and `kpack
//! verify` reports it as a warning: the output is still valid.
//!
//! String limits are buffer sizes: a string fits when it and its
//! terminating NUL do.

use std::fmt;

use crate::archive::Archive;
use crate::hipk::HipkMetadata;
use crate::msgpack::{self, Value};
use crate::target::TargetId;

/// Archives one resolve (the search for one binary's code object) may
/// open.
pub const MAX_OPEN_ARCHIVES: usize = 64;
/// Search paths of one binary's HIPK metadata.
pub const MAX_SEARCH_PATHS: usize = 32;
/// Bytes of one binary's HIPK metadata (MessagePack).
pub const MAX_METADATA_BYTES: usize = 64 << 10;
/// Bytes of a target string, its NUL included.
pub const MAX_TARGET_BYTES: usize = 64;
/// Features (`:xnack-`...) of a target.
pub const MAX_TARGET_FEATURES: usize = 4;
/// Bytes of a lookup key (an archive's binary key, `lib/libfoo.so#0`), its
/// NUL included.
pub const MAX_KEY_BYTES: usize = 1024;
/// Bytes of one code object, decompressed.
pub const MAX_CODE_OBJECT_BYTES: u64 = 256 << 20;
/// Nesting of MessagePack arrays and maps (HIPK metadata, TOCs).
pub const MAX_MSGPACK_DEPTH: usize = 32;

/// One limit an output exceeds: what, how much, and HRX's limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exceeded {
    /// What exceeds it (`HIPK metadata`, `key "lib/x.so#0"`...).
    pub what: String,
    /// The quantity measured (`bytes`, `search paths`...).
    pub unit: &'static str,
    pub value: u64,
    pub limit: u64,
}

impl fmt::Display for Exceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} has {} {}, more than ROCm's HRX runtime reads (at most {}): it loads with kpack's runtime only",
            self.what, self.value, self.unit, self.limit
        )
    }
}

fn over(what: impl Into<String>, unit: &'static str, value: u64, limit: u64) -> Option<Exceeded> {
    (value > limit).then(|| Exceeded {
        what: what.into(),
        unit,
        value,
        limit,
    })
}

/// A string shortened for a message (keys past the limit are long).
fn shown(s: &str) -> String {
    const SHOWN: usize = 60;
    match s.char_indices().nth(SHOWN) {
        Some((i, _)) => format!("{:?}...", &s[..i]),
        None => format!("{s:?}"),
    }
}

/// Nesting depth of a MessagePack value (a scalar is 0, `[]` is 1).
pub fn depth(v: &Value) -> usize {
    match v {
        Value::Array(items) => 1 + items.iter().map(depth).max().unwrap_or(0),
        Value::Map(entries) => {
            let inner = entries.iter().map(|(k, v)| depth(k).max(depth(v)));
            1 + inner.max().unwrap_or(0)
        }
        _ => 0,
    }
}

/// The limits one binary's HIPK metadata exceeds: its encoded size, its
/// search paths, its nesting.
pub fn check_metadata(m: &HipkMetadata) -> Vec<Exceeded> {
    let bytes = m.encode();
    let mut v = Vec::new();
    v.extend(over(
        "HIPK metadata",
        "bytes",
        bytes.len() as u64,
        MAX_METADATA_BYTES as u64,
    ));
    v.extend(over(
        "HIPK metadata",
        "search paths",
        m.search_paths.len() as u64,
        MAX_SEARCH_PATHS as u64,
    ));
    if let Ok(value) = msgpack::decode(&bytes) {
        v.extend(over(
            "HIPK metadata",
            "levels of nesting",
            depth(&value) as u64,
            MAX_MSGPACK_DEPTH as u64,
        ));
    }
    v
}

/// The limits a target string exceeds: its length, its features.
pub fn check_target(target: &str) -> Vec<Exceeded> {
    let what = || format!("target {}", shown(target));
    let mut v = Vec::new();
    v.extend(over(
        what(),
        "bytes (with its NUL)",
        target.len() as u64 + 1,
        MAX_TARGET_BYTES as u64,
    ));
    let features = match TargetId::parse(target) {
        Ok(t) => t.features().len(),
        // Not a target ID kpack parses: count its `:` parts.
        Err(_) => target.split(':').count().saturating_sub(1),
    };
    v.extend(over(
        what(),
        "features",
        features as u64,
        MAX_TARGET_FEATURES as u64,
    ));
    v
}

/// The limit a lookup key (an archive's binary key) exceeds.
pub fn check_key(key: &str) -> Option<Exceeded> {
    over(
        format!("key {}", shown(key)),
        "bytes (with its NUL)",
        key.len() as u64 + 1,
        MAX_KEY_BYTES as u64,
    )
}

/// The limit a code object (`key` @ `target`, `size` bytes decompressed)
/// exceeds.
pub fn check_code_object(key: &str, target: &str, size: u64) -> Option<Exceeded> {
    over(
        format!("code object {} @ {target}", shown(key)),
        "bytes",
        size,
        MAX_CODE_OBJECT_BYTES,
    )
}

/// The limit a binary whose code objects are spread over `archives`
/// archives (one per target) exceeds: a resolve may open them all.
pub fn check_archive_count(archives: usize) -> Option<Exceeded> {
    over(
        "the binary's archives",
        "archives",
        archives as u64,
        MAX_OPEN_ARCHIVES as u64,
    )
}

/// What a writer adds to an archive: the limits one entry exceeds (its
/// key, its target, its size).
pub fn check_entry(key: &str, target: &str, size: u64) -> Vec<Exceeded> {
    let mut v: Vec<Exceeded> = check_key(key).into_iter().collect();
    v.extend(check_target(target));
    v.extend(check_code_object(key, target, size));
    v
}

/// The limits an archive exceeds: each of its entries' (each key and
/// target reported once), in TOC order.
pub fn check_archive(a: &Archive) -> Vec<Exceeded> {
    let mut v = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for target in a.gfx_arches() {
        if seen.insert(("target", target.as_str())) {
            v.extend(check_target(target));
        }
    }
    for e in a.entries() {
        if seen.insert(("key", e.key.as_str())) {
            v.extend(check_key(&e.key));
        }
        if seen.insert(("target", e.target.as_str())) {
            v.extend(check_target(&e.target));
        }
        v.extend(check_code_object(&e.key, &e.target, e.original_size));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msgpack::str_map;

    #[test]
    fn metadata_within_and_past_the_limits() {
        let ok = HipkMetadata::new("lib/libx.so", vec!["a_@GFXARCH@.kpack".into(); 32]);
        assert_eq!(check_metadata(&ok), []);
        let paths = HipkMetadata::new("lib/libx.so", vec!["a.kpack".into(); 33]);
        let v = check_metadata(&paths);
        assert_eq!(v.len(), 1);
        assert_eq!(
            (v[0].unit, v[0].value, v[0].limit),
            ("search paths", 33, 32)
        );
        assert!(v[0].to_string().contains("HRX"), "{}", v[0]);
        // 64 KiB of metadata in few paths.
        let big = HipkMetadata::new("lib/libx.so", vec!["p".repeat(40_000), "q".repeat(40_000)]);
        let v = check_metadata(&big);
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].unit, "bytes");
        assert!(v[0].value > 65536 && v[0].limit == 65536);
    }

    #[test]
    fn targets_keys_and_sizes() {
        assert_eq!(check_target("gfx942:sramecc+:xnack-"), []);
        assert_eq!(check_target(&format!("gfx{}", "9".repeat(60))), []);
        let long = format!("gfx{}", "9".repeat(61));
        assert_eq!(check_target(&long)[0].value, 65);
        let five = "gfx942:a+:b+:c+:d+:e+";
        let v = check_target(five);
        assert_eq!((v.len(), v[0].unit, v[0].value), (1, "features", 5));
        assert_eq!(check_target("gfx942:a+:b+:c+:d+"), []);

        let key = format!("{}#0", "k".repeat(1021));
        assert_eq!(key.len(), 1023);
        assert_eq!(check_key(&key), None);
        let e = check_key(&format!("{}#0", "k".repeat(1022))).unwrap();
        assert_eq!((e.value, e.limit), (1025, 1024));
        // The message shows the start of a long key only.
        assert!(e.to_string().len() < 300, "{e}");

        assert_eq!(check_code_object("k#0", "gfx942", 256 << 20), None);
        assert!(check_code_object("k#0", "gfx942", (256 << 20) + 1).is_some());
        assert_eq!(check_archive_count(64), None);
        assert_eq!(check_archive_count(65).unwrap().value, 65);
        let v = check_entry(&"k".repeat(2000), five, 1 << 30);
        assert_eq!(v.len(), 3, "{v:?}");
    }

    #[test]
    fn nesting_depth() {
        assert_eq!(depth(&Value::from(1)), 0);
        assert_eq!(depth(&Value::Array(vec![])), 1);
        let mut v = Value::from("x");
        for _ in 0..33 {
            v = str_map([("k", v)]);
        }
        assert_eq!(depth(&v), 33);
    }

    #[test]
    fn archives_past_the_limits() {
        use crate::archive::test_support::fixture;
        let bytes = std::fs::read(fixture("test_zstd.kpack")).unwrap();
        let a = Archive::from_bytes(bytes.clone()).unwrap();
        assert_eq!(check_archive(&a), []);
        // The same archive, its first binary key 1,100 bytes long.
        let toc_offset = crate::bytes::u64_at(&bytes, 8).unwrap() as usize;
        let mut toc = msgpack::decode(&bytes[toc_offset..]).unwrap();
        let long = format!("{}#0", "b".repeat(1098));
        if let Value::Map(top) = &mut toc {
            let (_, t) = top
                .iter_mut()
                .find(|(k, _)| k.as_str() == Some("toc"))
                .unwrap();
            if let Value::Map(keys) = t {
                keys[0].0 = Value::from(long.as_str());
            }
        }
        let mut b = bytes[..toc_offset].to_vec();
        b.extend(msgpack::encode(&toc));
        let a = Archive::from_bytes(b).unwrap();
        let v = check_archive(&a);
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!((v[0].value, v[0].limit), (1101, 1024));
    }
}
