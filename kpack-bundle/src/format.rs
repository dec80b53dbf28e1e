//! What reading and writing share: the magics, the limits, the CCOB
//! compression methods and hash.

use std::fmt;

/// Magic of an uncompressed bundle.
pub const BUNDLE_MAGIC: &[u8; 24] = b"__CLANG_OFFLOAD_BUNDLE__";
/// Magic of a compressed bundle.
pub const CCOB_MAGIC: &[u8; 4] = b"CCOB";
/// The largest decompressed size kpack accepts for one compressed bundle.
pub const MAX_UNCOMPRESSED: u64 = 1 << 34;

/// Compression method of a CCOB bundle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    Zlib,
    Zstd,
}

impl Method {
    /// The number a CCOB header stores for it.
    pub(crate) fn code(self) -> u16 {
        match self {
            Method::Zlib => 0,
            Method::Zstd => 1,
        }
    }

    /// The method a CCOB header's number names.
    pub(crate) fn from_code(code: u16) -> Option<Method> {
        match code {
            0 => Some(Method::Zlib),
            1 => Some(Method::Zstd),
            _ => None,
        }
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Method::Zlib => "zlib",
            Method::Zstd => "zstd",
        })
    }
}

/// The hash CCOB headers store: the first 8 bytes of an MD5 digest, read
/// as a little-endian `u64`.
pub(crate) fn md5_word(digest: &[u8]) -> u64 {
    u64::from_le_bytes(digest[..8].try_into().expect("8 bytes"))
}
