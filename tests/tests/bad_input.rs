//! Bad input: a specific error naming the file, exit code 1, no panic, and
//! no output left behind.

use std::path::{Path, PathBuf};

use crate::common::*;

fn reference(name: &str) -> Vec<u8> {
    std::fs::read(reference_archive(name)).expect("reference archive")
}

/// A real bundle: the first bundle of libvadd.so's .hip_fatbin.
fn real_bundle(scratch: &Path) -> Vec<u8> {
    let f = fixture("libvadd.so");
    split_bundles(&objcopy_section(&f.path, ".hip_fatbin", scratch)).remove(0)
}

fn real_ccob(scratch: &Path) -> Vec<u8> {
    let f = fixture("libvadd_compressed.so");
    let b = split_bundles(&objcopy_section(&f.path, ".hip_fatbin", scratch)).remove(0);
    assert!(b.starts_with(b"CCOB"));
    b
}

/// `ls` and `extract` both fail on the file with a message containing each
/// of `needles`, and `extract` leaves nothing behind.
fn rejects(name: &str, bytes: &[u8], needles: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join(name);
    std::fs::write(&file, bytes).unwrap();
    let out: PathBuf = dir.path().join("out");
    for err in [
        kpack_fails(&[&"ls", &file]),
        kpack_fails(&[&"extract", &file, &"-o", &out]),
    ] {
        assert!(err.contains(name), "error does not name the file: {err}");
        for n in needles {
            assert!(err.contains(n), "error lacks '{n}': {err}");
        }
    }
    assert!(!out.exists(), "output left behind");
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left.len(), 1, "stray files: {left:?}");
}

#[test]
fn truncated_bundle() {
    let dir = tempfile::tempdir().unwrap();
    let b = real_bundle(dir.path());
    rejects("truncated.bin", &b[..b.len() - 100], &["runs past"]);
    rejects("truncated-table.bin", &b[..40], &["cannot fit"]);
    let mut one = b[..60].to_vec();
    one[24..32].copy_from_slice(&1u64.to_le_bytes());
    rejects("truncated-triple.bin", &one, &["entry triple needs"]);
}

#[test]
fn wrong_magic() {
    let dir = tempfile::tempdir().unwrap();
    let mut b = real_bundle(dir.path());
    // A second "bundle" with a damaged magic after the first.
    let first = b.clone();
    b.extend_from_slice(&first);
    let at = first.len();
    b[at] = b'X';
    rejects(
        "badmagic.bin",
        &b,
        &["unrecognized data", &format!("{at:#x}")],
    );
}

#[test]
fn entry_running_past_the_data() {
    let dir = tempfile::tempdir().unwrap();
    let mut b = real_bundle(dir.path());
    // Entry 1's size field: after magic, count, entry 0 (3 u64 + triple).
    let tl0 = u64::from_le_bytes(b[48..56].try_into().unwrap()) as usize;
    let e1 = 32 + 24 + tl0;
    let len = b.len() as u64;
    b[e1 + 8..e1 + 16].copy_from_slice(&len.to_le_bytes());
    rejects("pastend.bin", &b, &["entry 1", "runs past"]);
}

#[test]
fn ccob_wrong_total_size() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = real_ccob(dir.path());
    let total = c.len() as u32 + 64;
    c[8..12].copy_from_slice(&total.to_le_bytes());
    rejects("total.bin", &c, &["total size", "past the end"]);
}

#[test]
fn ccob_wrong_uncompressed_size() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = real_ccob(dir.path());
    let u = u32::from_le_bytes(c[12..16].try_into().unwrap());
    c[12..16].copy_from_slice(&(u - 1).to_le_bytes());
    rejects("usize.bin", &c, &["uncompressed bytes"]);
}

#[test]
fn unsupported_compression_method() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = real_ccob(dir.path());
    c[6] = 5;
    rejects("method.bin", &c, &["compression method 5"]);
}

#[test]
fn damaged_fat_binary() {
    let f = fixture("libvadd.so");
    let mut bytes = std::fs::read(&f.path).unwrap();
    let at = bytes
        .windows(24)
        .position(|w| w == b"__CLANG_OFFLOAD_BUNDLE__")
        .unwrap();
    bytes[at + 24..at + 32].copy_from_slice(&u64::MAX.to_le_bytes());
    rejects("libdamaged.so", &bytes, &["entries cannot fit"]);
}

#[test]
fn archive_toc_offset_past_end() {
    let mut a = reference("test_noop.kpack");
    let past = a.len() as u64 + 10;
    a[8..16].copy_from_slice(&past.to_le_bytes());
    rejects("tocoff.kpack", &a, &["TOC"]);
}

#[test]
fn archive_wrong_magic_and_version() {
    let mut a = reference("test_noop.kpack");
    a[1] = b'Q';
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("magic.kpack");
    std::fs::write(&file, &a).unwrap();
    kpack_fails(&[&"ls", &file]);
    let mut a = reference("test_noop.kpack");
    a[4] = 2;
    rejects("version.kpack", &a, &["version 2"]);
}

fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len())
        .position(|w| w == needle)
        .expect("pattern in reference archive")
}

#[test]
fn archive_toc_field_of_wrong_type() {
    let mut a = reference("test_noop.kpack");
    // The first original_size (positive fixint 119 = 'w') becomes nil.
    let at = find(&a, b"original_size") + b"original_size".len();
    assert_eq!(a[at], 119);
    a[at] = 0xc0;
    rejects("type.kpack", &a, &["original_size"]);
}

#[test]
fn archive_blob_outside_the_file() {
    let mut a = reference("test_noop.kpack");
    // The third blob's offset, uint16 402 (cd 01 92), moves past the end.
    let at = find(
        &a,
        &[0xa6, b'o', b'f', b'f', b's', b'e', b't', 0xcd, 0x01, 0x92],
    ) + 7;
    a[at + 1] = 0x03;
    rejects("blob.kpack", &a, &["outside"]);
}

#[test]
fn archive_unknown_compression_scheme() {
    let mut a = reference("test_noop.kpack");
    let at = find(&a, b"\xa4none");
    a[at + 1..at + 5].copy_from_slice(b"lz4x");
    rejects("scheme.kpack", &a, &["lz4x"]);
}

#[test]
fn archive_corrupt_zstd_frame() {
    let mut a = reference("test_zstd.kpack");
    // Damage the compressed bytes of the first frame (after its header).
    let frame = find(&a, &[0x28, 0xb5, 0x2f, 0xfd]);
    for b in &mut a[frame + 8..frame + 20] {
        *b ^= 0xa5;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("frame.kpack");
    std::fs::write(&file, &a).unwrap();
    let out = dir.path().join("out");
    let err = kpack_fails(&[&"extract", &file, &"-o", &out]);
    assert!(err.contains("frame.kpack"), "{err}");
    assert!(!out.exists());
}
