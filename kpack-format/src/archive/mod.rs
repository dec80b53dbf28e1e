//! `.kpack` archives, format version 1 (formats.md §3).
//!
//! ```text
//! 0   "KPAK"              magic
//! 4   u32 version = 1
//! 8   u64 toc_offset
//! 16  zero padding to 64
//! 64  blob (scheme-specific)
//! ..  MessagePack TOC at toc_offset, to end of file
//! ```
//!
//! - Scheme `none`: the blob is the kernels concatenated; the TOC's `blobs`
//!   array gives each kernel's absolute `{offset, size}` by ordinal.
//! - Scheme `zstd-per-kernel`: the blob is `u32 num_kernels`, then per kernel
//!   `u32 frame_len` + one zstd frame; the TOC gives `zstd_offset` and
//!   `zstd_size` of the whole blob.
//!
//! [`Archive`] reads an archive (from any [`ArchiveBytes`]: the loader
//! passes a memory map) and decompresses single kernels on demand;
//! [`TocOut`] is what a writer serializes (kpack-host's `ArchiveWriter`
//! compresses kernels in parallel and streams them to a file); both go
//! through the one TOC schema of module `toc`. For the same
//! kernels, archives written here are byte-identical to the reference Python
//! writer's with scheme `none`, and with `zstd-per-kernel` too once content
//! checksums are turned off (the reference writes none; kpack does by
//! default, formats.md §3.2).

mod reader;
mod toc;

use std::fmt;
use std::io;
use std::sync::Arc;

pub use reader::{Archive, ArchiveBytes};
pub use toc::{EntryOut, Layout, TocOut};

use crate::msgpack::{DecodeError, Value};

/// The archive magic.
pub const MAGIC: &[u8; 4] = b"KPAK";
/// The only format version there is.
pub const FORMAT_VERSION: u32 = 1;
/// Size of the fixed header; the blob starts here.
pub const HEADER_SIZE: u64 = 64;
/// The `type` of every kernel entry.
pub(crate) const KERNEL_TYPE: &str = "hsaco";
/// Most frames a `zstd-per-kernel` blob may hold (the reference runtime's
/// limit).
pub const MAX_FRAMES: u64 = 1 << 20;
/// Largest single kernel read or written (4 GiB): a zstd frame's length is
/// a `u32`. Archives themselves may be larger (formats.md §3.5: offsets are 64-bit
/// throughout; upstream has met a 4.1 GB archive).
pub const MAX_KERNEL_SIZE: u64 = 1 << 32;
/// Largest zstd frame (its length prefix is a `u32`).
pub const MAX_FRAME_SIZE: u64 = u32::MAX as u64;
/// zstd level used unless told otherwise.
pub const DEFAULT_ZSTD_LEVEL: i32 = 3;

/// How the blob stores kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scheme {
    /// Kernels stored as they are (`"none"`).
    None,
    /// One zstd frame per kernel (`"zstd-per-kernel"`).
    ZstdPerKernel,
}

impl Scheme {
    /// The name written in the TOC's `compression_scheme`.
    pub fn name(self) -> &'static str {
        match self {
            Scheme::None => "none",
            Scheme::ZstdPerKernel => "zstd-per-kernel",
        }
    }

    /// The scheme named `name` in a TOC, if known.
    pub fn from_name(name: &str) -> Option<Scheme> {
        match name {
            "none" => Some(Scheme::None),
            "zstd-per-kernel" => Some(Scheme::ZstdPerKernel),
            _ => None,
        }
    }
}

impl fmt::Display for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Ordered metadata of a kernel entry: string keys, any values (the
/// splitter writes strings: `target`, `source_prefix`).
pub type Metadata = Vec<(String, Value)>;

/// One kernel of an archive, as listed in its TOC.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// The binary key, with its `#N` suffix (e.g. `lib/libfoo.so#0`).
    pub key: String,
    /// The target ID (e.g. `gfx942` or `gfx90a:xnack-`).
    pub target: String,
    /// The entry's `type` (`"hsaco"`), if the TOC gives one.
    pub kind: Option<String>,
    /// Index of the kernel in the blob.
    pub ordinal: u32,
    /// Size of the kernel, uncompressed.
    pub original_size: u64,
    /// The entry's `metadata` map, if any, in file order.
    pub metadata: Option<Metadata>,
}

/// What a reader may know of one kernel before reading it
/// ([`Archive::kernel_info`]): the C API's `kpack_get_kernel_info`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelInfo {
    /// Size of the kernel, uncompressed (what a read gives).
    pub original_size: u64,
    /// Bytes it takes in the blob ([`Archive::stored_size`]).
    pub stored_size: u64,
    /// How the archive stores it.
    pub scheme: Scheme,
}

impl Entry {
    /// The metadata value named `name`, if it is a string.
    pub fn metadata_str(&self, name: &str) -> Option<&str> {
        self.metadata
            .as_ref()?
            .iter()
            .find(|(k, _)| k == name)?
            .1
            .as_str()
    }
}

/// What is wrong with an archive, or with a request to read or write one.
///
/// Each variant is one failure a C API can map to its own code; the messages
/// say exactly which field, range or kernel was at fault. TOC field paths
/// look like `toc["lib/libfoo.so#0"]["gfx942"].ordinal`.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ArchiveError {
    #[error("not a kpack archive: magic is \"{}\", expected \"KPAK\"", found.escape_ascii())]
    BadMagic { found: [u8; 4] },
    #[error("unsupported kpack archive version {version} (supported: 1)")]
    UnsupportedVersion { version: u32 },
    #[error("truncated kpack archive: {len} bytes, shorter than the {HEADER_SIZE}-byte header")]
    TruncatedHeader { len: u64 },
    #[error("TOC offset {toc_offset} is outside the file (valid: {HEADER_SIZE}..{file_len})")]
    TocOffsetOutOfRange { toc_offset: u64, file_len: u64 },
    #[error("TOC at byte {toc_offset} is not valid MessagePack: {source}")]
    TocParse {
        toc_offset: u64,
        #[source]
        source: DecodeError,
    },
    #[error("TOC field `{field}` is missing")]
    TocFieldMissing { field: String },
    #[error("TOC field `{field}` is a {found}, expected {expected}")]
    TocFieldType {
        field: String,
        expected: &'static str,
        found: &'static str,
    },
    #[error("TOC field `{field}` is invalid: {reason}")]
    TocFieldValue { field: String, reason: String },
    /// The TOC's `format_version` is not [`FORMAT_VERSION`] (the header's
    /// version is [`ArchiveError::UnsupportedVersion`]).
    #[error("TOC field `format_version` is invalid: {version}, expected {FORMAT_VERSION}")]
    UnsupportedTocVersion { version: u64 },
    #[error("unknown compression scheme {scheme:?} (known: \"none\", \"zstd-per-kernel\")")]
    UnknownScheme { scheme: String },
    #[error(
        "blob {index} (offset {offset}, size {size}) lies outside the data area {start}..{end}"
    )]
    BlobOutOfRange {
        index: u64,
        offset: u64,
        size: u64,
        start: u64,
        end: u64,
    },
    #[error("zstd blob (zstd_offset {offset}, zstd_size {size}) lies outside the data area {start}..{end}")]
    ZstdBlobOutOfRange {
        offset: u64,
        size: u64,
        start: u64,
        end: u64,
    },
    #[error("zstd frame {index} (offset {offset}, size {size}) runs past the end of the zstd blob at {end}")]
    FrameOutOfRange {
        index: u64,
        offset: u64,
        size: u64,
        end: u64,
    },
    #[error("{count} kernels, more than the limit of {max} zstd frames")]
    TooManyFrames { count: u64, max: u64 },
    #[error("kernel {key} @ {target}: ordinal {ordinal} is not below the archive's kernel count {count}")]
    OrdinalOutOfRange {
        key: String,
        target: String,
        ordinal: u64,
        count: u64,
    },
    #[error("no kernel {key} @ {target} in the archive")]
    KernelNotFound { key: String, target: String },
    #[error("kernel {key} @ {target}: size {size} exceeds the limit of {max} bytes")]
    KernelTooLarge {
        key: String,
        target: String,
        size: u64,
        max: u64,
    },
    #[error("kernel {key} @ {target}: zstd decompression failed: {reason}")]
    Decompress {
        key: String,
        target: String,
        reason: String,
    },
    #[error("kernel {key} @ {target}: {actual} bytes, but original_size is {expected}")]
    SizeMismatch {
        key: String,
        target: String,
        expected: u64,
        actual: u64,
    },
    #[error(
        "kernel {key} @ {target}: its bytes have SHA-256 {actual}, but the TOC records {expected}"
    )]
    DigestMismatch {
        key: String,
        target: String,
        // Boxed: keeps every Result carrying an ArchiveError small.
        expected: Box<str>,
        actual: Box<str>,
    },
    #[error("duplicate kernel {key} @ {target}")]
    DuplicateKernel { key: String, target: String },
    #[error("invalid archive key {key:?}: {reason}")]
    InvalidKey { key: String, reason: &'static str },
    #[error("invalid zstd level {level} (valid: {min}..={max})")]
    InvalidZstdLevel { level: i32, min: i32, max: i32 },
    #[error("kernel {key} @ {target}: zstd compression failed: {reason}")]
    Compress {
        key: String,
        target: String,
        reason: String,
    },
    #[error("kernel {key} @ {target}: its zstd frame of {size} bytes exceeds the limit of {max} bytes (the frame length is a u32)")]
    FrameTooLarge {
        key: String,
        target: String,
        size: u64,
        max: u64,
    },
    #[error("cannot read the kernel's {len} bytes at offset {offset} of {}: {source}", path.display())]
    ReadInput {
        path: std::path::PathBuf,
        offset: u64,
        len: usize,
        #[source]
        source: Arc<io::Error>,
    },
    #[error("I/O error: {0}")]
    Io(#[source] Arc<io::Error>),
}

impl From<io::Error> for ArchiveError {
    fn from(e: io::Error) -> Self {
        ArchiveError::Io(Arc::new(e))
    }
}

#[cfg(any(test, feature = "test-support"))]
pub mod test_support {
    //! The reference archives and their documented contents.
    use std::path::PathBuf;

    pub fn fixture(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/data/reference-kpack")
            .join(name)
    }

    pub fn cat(parts: &[(&[u8], usize)]) -> Vec<u8> {
        let mut v = Vec::new();
        for (bytes, n) in parts {
            for _ in 0..*n {
                v.extend_from_slice(bytes);
            }
        }
        v
    }

    /// (key, target, bytes) of test_noop.kpack, in ordinal order.
    pub fn noop_kernels() -> Vec<(&'static str, &'static str, Vec<u8>)> {
        vec![
            (
                "lib/libtest.so#0",
                "gfx900",
                cat(&[(b"KERNEL1_GFX900_DATA", 1), (&[0], 100)]),
            ),
            (
                "lib/libtest.so#0",
                "gfx906",
                cat(&[(b"KERNEL2_GFX906_DATA", 1), (&[0], 200)]),
            ),
            (
                "bin/testapp#0",
                "gfx900",
                cat(&[(b"KERNEL3_APP_GFX900", 1), (&[0xff], 150)]),
            ),
        ]
    }

    /// (key, target, bytes) of test_zstd.kpack, in ordinal order.
    pub fn zstd_kernels() -> Vec<(&'static str, &'static str, Vec<u8>)> {
        vec![
            (
                "lib/libhip.so#0",
                "gfx1100",
                cat(&[(b"HIP_KERNEL_GFX1100_", 1), (b"A", 500), (b"B", 500)]),
            ),
            (
                "lib/libhip.so#0",
                "gfx1101",
                cat(&[(b"HIP_KERNEL_GFX1101_", 1), (b"X", 300), (b"Y", 300)]),
            ),
            (
                "bin/hiptest#0",
                "gfx1100",
                cat(&[(b"TEST_APP_KERNEL___", 1), (&[0x42], 1000)]),
            ),
        ]
    }
}
