//! What reading a bundle can find wrong with it.

use crate::Method;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BundleError {
    #[error(
        "bundle {bundle} at offset {offset:#x}: {field} needs {need} bytes, only {have} remain"
    )]
    Truncated {
        bundle: usize,
        offset: usize,
        field: &'static str,
        need: u64,
        have: u64,
    },
    #[error("unrecognized data at offset {offset:#x} (expected a bundle magic '__CLANG_OFFLOAD_BUNDLE__' or 'CCOB', found {found})")]
    BadMagic { offset: usize, found: String },
    #[error("bundle {bundle} at offset {offset:#x}: {count} entries cannot fit in the {have} bytes that remain")]
    TooManyEntries {
        bundle: usize,
        offset: usize,
        count: u64,
        have: u64,
    },
    #[error("bundle {bundle} at offset {offset:#x}: entry {entry} ({triple}) data [{start:#x}, +{size:#x}) runs past the {have} bytes available")]
    EntryOutOfRange {
        bundle: usize,
        offset: usize,
        entry: usize,
        triple: String,
        start: u64,
        size: u64,
        have: u64,
    },
    #[error(
        "bundle {bundle} at offset {offset:#x}: entry {entry} has a triple that is not ASCII text"
    )]
    BadTriple {
        bundle: usize,
        offset: usize,
        entry: usize,
    },
    #[error("bundle {bundle} at offset {offset:#x}: entry {entry} ({triple}) names target {target:?}, which is not a target ID (ASCII letters, digits, '_', ':', '+', '-')")]
    BadTarget {
        bundle: usize,
        offset: usize,
        entry: usize,
        triple: String,
        target: String,
    },
    #[error("bundle {bundle} at offset {offset:#x}: target {target} occurs twice")]
    DuplicateTarget {
        bundle: usize,
        offset: usize,
        target: String,
    },
    #[error("compressed bundle at offset {offset:#x}: unsupported CCOB version {version} (known: 1, 2, 3)")]
    UnsupportedVersion { offset: usize, version: u16 },
    #[error("compressed bundle at offset {offset:#x}: unsupported compression method {method} (known: 0 = zlib, 1 = zstd)")]
    UnsupportedMethod { offset: usize, method: u16 },
    #[error("compressed bundle at offset {offset:#x}: total size {total} is {problem} ({have} bytes available from the bundle's start)")]
    BadTotalSize {
        offset: usize,
        total: u64,
        have: u64,
        problem: &'static str,
    },
    #[error("compressed bundle at offset {offset:#x}: uncompressed size {size} exceeds the limit of {limit} bytes")]
    TooLarge {
        offset: usize,
        size: u64,
        limit: u64,
    },
    #[error("compressed bundle at offset {offset:#x}: {method} decompression failed: {message}")]
    Decompress {
        offset: usize,
        method: Method,
        message: String,
    },
    #[error("compressed bundle at offset {offset:#x}: header says {expected} uncompressed bytes, payload decompresses to {actual}")]
    SizeMismatch {
        offset: usize,
        expected: u64,
        actual: u64,
    },
    #[error("compressed bundle at offset {offset:#x}: decompressed data is {problem}")]
    BadPayload { offset: usize, problem: String },
}
