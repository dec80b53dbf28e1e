//! Reading bundles: whole ([`parse_fatbin`], [`for_each_bundle`]), from
//! their entry tables ([`list_fatbin`], [`check_fatbin`]), or one code
//! object at a time ([`FatbinStream`]).

use std::fmt;
use std::ops::{Deref, Range};
use std::sync::Arc;

use kpack_format::target::{is_host_triple, target_of_triple};

use crate::{BundleError, Method, BUNDLE_MAGIC, CCOB_MAGIC};

mod ccob;
mod cursor;
mod list;
mod payload;
mod stream;
mod streamed;
mod table;
#[cfg(test)]
mod tests;

pub use list::{check_fatbin, list_fatbin, LIST_CHECK_LIMIT};
pub use stream::{FatbinStream, WHOLE_LIMIT};
pub use streamed::Streamed;

use ccob::parse_ccob;
use table::parse_plain;

/// Bytes of a code object: borrowed from the input, or a range of a shared
/// decompressed buffer.
#[derive(Clone)]
pub enum Blob<'a> {
    Borrowed(&'a [u8]),
    Shared(Arc<[u8]>, Range<usize>),
}

impl Deref for Blob<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Blob::Borrowed(b) => b,
            Blob::Shared(buf, r) => &buf[r.clone()],
        }
    }
}

impl fmt::Debug for Blob<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Blob({} bytes)", self.len())
    }
}

/// What a compressed bundle's header said.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Ccob {
    pub version: u16,
    pub method: Method,
    /// Header plus payload, as stored.
    pub stored_size: u64,
    pub uncompressed_size: u64,
    pub hash: u64,
    /// Whether `hash` equals the low 8 bytes of the MD5 of the decompressed
    /// data (LLVM never rejects a mismatch; kpack reports it). `None` when
    /// the bundle was listed from its entry table alone ([`list_fatbin`]):
    /// the hash needs every decompressed byte.
    pub hash_matches: Option<bool>,
    /// How many bundles the decompressed data holds.
    pub inner_bundles: usize,
}

/// One entry of a bundle.
#[derive(Debug, Clone)]
pub struct Entry<'a> {
    /// The full triple, e.g. `hipv4-amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-`.
    pub triple: String,
    /// The entry's offset from the start of its (uncompressed) bundle.
    pub offset: u64,
    pub data: Blob<'a>,
}

impl Entry<'_> {
    /// The target ID as written in the triple (text after the last `--`).
    pub fn target(&self) -> &str {
        target_of_triple(&self.triple)
    }

    /// Host entries (`host-...`) carry no device code.
    pub fn is_host(&self) -> bool {
        is_host_triple(&self.triple)
    }
}

/// One bundle, in the order of the section.
#[derive(Debug, Clone)]
pub struct Bundle<'a> {
    /// Bundle index: position in the list of bundles, inner bundles of a
    /// compressed bundle counted one by one.
    pub index: usize,
    /// Byte range in the input: of this bundle, or of the compressed bundle
    /// it came from.
    pub range: Range<usize>,
    /// The compressed bundle this one came from, and its position in it.
    pub compressed: Option<(Arc<Ccob>, usize)>,
    /// All entries, host entries included, in table order.
    pub entries: Vec<Entry<'a>>,
}

impl<'a> Bundle<'a> {
    /// Entries with device code (host entries skipped).
    pub fn device_entries(&self) -> impl Iterator<Item = &Entry<'a>> {
        self.entries.iter().filter(|e| !e.is_host())
    }

    /// The device entry for a target ID, written exactly as in the triple.
    pub fn entry_for(&self, target: &str) -> Option<&Entry<'a>> {
        self.device_entries().find(|e| e.target() == target)
    }
}

/// One entry of a bundle as its table describes it: no bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryInfo {
    /// The full triple.
    pub triple: String,
    /// The entry's offset from the start of its (uncompressed) bundle.
    pub offset: u64,
    pub size: u64,
}

impl EntryInfo {
    /// The target ID as written in the triple (text after the last `--`).
    pub fn target(&self) -> &str {
        target_of_triple(&self.triple)
    }

    /// Host entries (`host-...`) carry no device code.
    pub fn is_host(&self) -> bool {
        is_host_triple(&self.triple)
    }
}

/// One bundle as its header and entry table describe it
/// ([`list_fatbin`], [`check_fatbin`]): what `ls`, `size` and planning
/// need, without the code objects.
#[derive(Debug, Clone)]
pub struct BundleInfo {
    /// Bundle index (formats.md §1.4).
    pub index: usize,
    /// Byte range in the input: of this bundle, or of the compressed bundle
    /// it came from.
    pub range: Range<usize>,
    /// The compressed bundle this one came from, and its position in it.
    pub compressed: Option<(Arc<Ccob>, usize)>,
    /// All entries, host entries included, in table order.
    pub entries: Vec<EntryInfo>,
}

impl BundleInfo {
    /// Entries with device code (host entries skipped).
    pub fn device_entries(&self) -> impl Iterator<Item = &EntryInfo> {
        self.entries.iter().filter(|e| !e.is_host())
    }

    /// The device entry for a target ID, written exactly as in the triple.
    pub fn entry_for(&self, target: &str) -> Option<&EntryInfo> {
        self.device_entries().find(|e| e.target() == target)
    }
}

impl From<&Bundle<'_>> for BundleInfo {
    fn from(b: &Bundle<'_>) -> Self {
        BundleInfo {
            index: b.index,
            range: b.range.clone(),
            compressed: b.compressed.clone(),
            entries: b
                .entries
                .iter()
                .map(|e| EntryInfo {
                    triple: e.triple.clone(),
                    offset: e.offset,
                    size: e.data.len() as u64,
                })
                .collect(),
        }
    }
}

/// Parse the bytes of a `.hip_fatbin` section (or a bundle file): bundles
/// back to back, zero padding allowed between them. Empty or all-zero data
/// gives no bundles.
pub fn parse_fatbin(data: &[u8]) -> Result<Vec<Bundle<'_>>, BundleError> {
    let mut bundles = Vec::new();
    for_each_bundle(data, |b| bundles.push(b))?;
    Ok(bundles)
}

/// [`parse_fatbin`], handing each bundle to `f` as it is parsed instead of
/// keeping them all: the decompressed bytes of a compressed bundle live
/// only as long as `f` keeps its bundles (a verifier of a binary holding
/// 1.3 GB of compressed code then never holds it all at once).
pub fn for_each_bundle<'a>(
    data: &'a [u8],
    mut f: impl FnMut(Bundle<'a>),
) -> Result<(), BundleError> {
    let (mut pos, mut count) = (0usize, 0usize);
    loop {
        while pos < data.len() && data[pos] == 0 {
            pos += 1;
        }
        if pos >= data.len() {
            break;
        }
        let rest = &data[pos..];
        if rest.starts_with(BUNDLE_MAGIC) {
            let (bundle, len) = parse_plain(rest, count, pos, |r| Blob::Borrowed(&rest[r]))?;
            count += 1;
            f(Bundle {
                range: pos..pos + len,
                ..bundle
            });
            pos += len;
        } else if rest.starts_with(CCOB_MAGIC) {
            let (inner, len) = parse_ccob(rest, count, pos)?;
            for mut b in inner {
                b.range = pos..pos + len;
                count += 1;
                f(b);
            }
            pos += len;
        } else {
            return Err(BundleError::BadMagic {
                offset: pos,
                found: describe(rest),
            });
        }
    }
    Ok(())
}

pub(crate) fn describe(bytes: &[u8]) -> String {
    let head = &bytes[..bytes.len().min(8)];
    let hex: Vec<String> = head.iter().map(|b| format!("{b:02x}")).collect();
    format!("bytes {}", hex.join(" "))
}

/// The offset of the next bundle at or after `pos` (zero bytes skipped),
/// or `None` at the end of the data.
fn next_bundle_start(data: &[u8], pos: usize) -> Option<usize> {
    data.get(pos..)?
        .iter()
        .position(|&b| b != 0)
        .map(|i| pos + i)
}
