//! Clang offload bundles: what a `.hip_fatbin` section holds (formats.md §1).
//!
//! [`parse_fatbin`] takes the section's bytes and returns its bundles in
//! order: plain bundles borrow their code objects from the input; compressed
//! bundles (`CCOB` v1/v2/v3, zlib or zstd) are decompressed once and their
//! entries share that buffer. A compressed bundle may hold several
//! concatenated bundles; each counts as a bundle of its own for numbering.
//! Every count, offset and size is checked against the bytes available.
//!
//! [`write_bundle`] and [`compress_bundle`] build bundles (for tests and for
//! tools that need to make them); clang 19 only emits CCOB v2 with zstd.

#![deny(unsafe_code)]

use std::fmt;
use std::ops::{Deref, Range};
use std::sync::Arc;

use md5::{Digest, Md5};

use kpack_format::target::{is_host_triple, target_of_triple};

mod stream;

#[doc(hidden)]
pub mod fuzzing;

pub use stream::{
    check_fatbin, list_fatbin, FatbinStream, Streamed, LIST_CHECK_LIMIT, WHOLE_LIMIT,
};

/// Magic of an uncompressed bundle.
pub const BUNDLE_MAGIC: &[u8; 24] = b"__CLANG_OFFLOAD_BUNDLE__";
/// Magic of a compressed bundle.
pub const CCOB_MAGIC: &[u8; 4] = b"CCOB";
/// The largest decompressed size kpack accepts for one compressed bundle.
pub const MAX_UNCOMPRESSED: u64 = 1 << 34;

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

/// Compression method of a CCOB bundle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    Zlib,
    Zstd,
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Method::Zlib => "zlib",
            Method::Zstd => "zstd",
        })
    }
}

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

struct Reader<'d> {
    data: &'d [u8],
    pos: usize,
    bundle: usize,
    offset: usize,
}

impl<'d> Reader<'d> {
    fn take(&mut self, n: u64, field: &'static str) -> Result<&'d [u8], BundleError> {
        let have = (self.data.len() - self.pos) as u64;
        if n > have {
            return Err(BundleError::Truncated {
                bundle: self.bundle,
                offset: self.offset,
                field,
                need: n,
                have,
            });
        }
        let s = &self.data[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn u16(&mut self, field: &'static str) -> Result<u16, BundleError> {
        Ok(u16::from_le_bytes(
            self.take(2, field)?.try_into().expect("2 bytes"),
        ))
    }

    fn u32(&mut self, field: &'static str) -> Result<u64, BundleError> {
        Ok(u64::from(u32::from_le_bytes(
            self.take(4, field)?.try_into().expect("4 bytes"),
        )))
    }

    fn u64(&mut self, field: &'static str) -> Result<u64, BundleError> {
        Ok(u64::from_le_bytes(
            self.take(8, field)?.try_into().expect("8 bytes"),
        ))
    }
}

/// Parse one uncompressed bundle at the start of `data`. Returns the bundle
/// (range relative to `data`) and its length.
fn parse_plain<'a>(
    data: &[u8],
    index: usize,
    offset: usize,
    blob: impl Fn(Range<usize>) -> Blob<'a>,
) -> Result<(Bundle<'a>, usize), BundleError> {
    let (infos, len) = plain_table(data, index, offset)?;
    let entries = infos
        .into_iter()
        .map(|e| {
            let data = blob(e.offset as usize..(e.offset + e.size) as usize);
            Entry {
                triple: e.triple,
                offset: e.offset,
                data,
            }
        })
        .collect();
    let bundle = Bundle {
        index,
        range: 0..len,
        compressed: None,
        entries,
    };
    Ok((bundle, len))
}

/// The checked entry table of the uncompressed bundle at the start of
/// `data`, and the bundle's length.
fn plain_table(
    data: &[u8],
    index: usize,
    offset: usize,
) -> Result<(Vec<EntryInfo>, usize), BundleError> {
    let mut r = Reader {
        data,
        pos: 0,
        bundle: index,
        offset,
    };
    let raw = read_entry_table(&mut r)?;
    let table_len = r.pos as u64;
    let (entries, end) = check_entries(raw, table_len, data.len() as u64, index, offset)?;
    Ok((entries, end as usize))
}

/// Check a bundle's raw entries against the `have` bytes the bundle can
/// span (from its first byte); returns them and the bundle's length: it
/// ends after its table or its last entry's data, whichever is later.
pub(crate) fn check_entries(
    raw: Vec<(String, u64, u64)>,
    table_len: u64,
    have: u64,
    index: usize,
    offset: usize,
) -> Result<(Vec<EntryInfo>, u64), BundleError> {
    let mut end = table_len;
    let mut entries: Vec<EntryInfo> = Vec::with_capacity(raw.len());
    for (entry, (triple, start, size)) in raw.into_iter().enumerate() {
        let stop = check_entry(have, index, offset, entry, &triple, start, size, &entries)?;
        end = end.max(stop);
        entries.push(EntryInfo {
            triple,
            offset: start,
            size,
        });
    }
    Ok((entries, end))
}

/// Bytes an entry table is read from: a slice ([`Reader`]) or a
/// decompressing stream. `take` hands out the next `n` bytes (valid until
/// the next call), or says what is missing.
pub(crate) trait TableSource {
    fn take(&mut self, n: u64, field: &'static str) -> Result<&[u8], BundleError>;
    /// Bytes left from the current position.
    fn left(&self) -> u64;
    /// The bundle index and offset errors name.
    fn place(&self) -> (usize, usize);

    fn u64(&mut self, field: &'static str) -> Result<u64, BundleError> {
        Ok(u64::from_le_bytes(
            self.take(8, field)?.try_into().expect("8 bytes"),
        ))
    }
}

impl TableSource for Reader<'_> {
    fn take(&mut self, n: u64, field: &'static str) -> Result<&[u8], BundleError> {
        Reader::take(self, n, field)
    }

    fn left(&self) -> u64 {
        (self.data.len() - self.pos) as u64
    }

    fn place(&self) -> (usize, usize) {
        (self.bundle, self.offset)
    }
}

/// The magic, the entry count and the entries: (triple, offset, size).
pub(crate) fn read_entry_table(
    r: &mut impl TableSource,
) -> Result<Vec<(String, u64, u64)>, BundleError> {
    let (index, offset) = r.place();
    r.take(BUNDLE_MAGIC.len() as u64, "magic")?;
    let count = r.u64("entry count")?;
    let have = r.left();
    // Each entry needs at least three u64 fields.
    if count > have / 24 {
        return Err(BundleError::TooManyEntries {
            bundle: index,
            offset,
            count,
            have,
        });
    }
    let mut raw = Vec::with_capacity(count as usize);
    for entry in 0..count as usize {
        let start = r.u64("entry offset")?;
        let size = r.u64("entry size")?;
        let triple_len = r.u64("entry triple length")?;
        let triple = r.take(triple_len, "entry triple")?;
        let triple = std::str::from_utf8(triple)
            .ok()
            .filter(|t| t.is_ascii())
            .ok_or(BundleError::BadTriple {
                bundle: index,
                offset,
                entry,
            })?;
        raw.push((triple.to_string(), start, size));
    }
    Ok(raw)
}

/// Check one entry against the data and the entries before it; returns
/// the end of its data.
#[allow(clippy::too_many_arguments)]
fn check_entry(
    have: u64,
    bundle: usize,
    offset: usize,
    entry: usize,
    triple: &str,
    start: u64,
    size: u64,
    before: &[EntryInfo],
) -> Result<u64, BundleError> {
    let Some(stop) = start.checked_add(size).filter(|&s| s <= have) else {
        return Err(BundleError::EntryOutOfRange {
            bundle,
            offset,
            entry,
            triple: triple.into(),
            start,
            size,
            have,
        });
    };
    if is_host_triple(triple) {
        return Ok(stop);
    }
    // Targets name files and directories (archives, artifacts, extracted
    // code objects): nothing but target-ID characters, so that no triple
    // can name a path outside where they are written.
    let target = target_of_triple(triple);
    if !is_target_name(target) {
        return Err(BundleError::BadTarget {
            bundle,
            offset,
            entry,
            target: target.into(),
            triple: triple.into(),
        });
    }
    if before.iter().any(|e| !e.is_host() && e.target() == target) {
        return Err(BundleError::DuplicateTarget {
            bundle,
            offset,
            target: target.into(),
        });
    }
    Ok(stop)
}

/// Can `t` be a device entry's target? Non-empty, and only the characters
/// of target IDs (`gfx90a:xnack+`, `gfx9-4-generic`) and offload
/// architecture names such as `amdgcnspirv`.
fn is_target_name(t: &str) -> bool {
    !t.is_empty()
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b':' | b'+' | b'-'))
}

/// A CCOB header, read.
pub(crate) struct CcobHeader {
    pub(crate) version: u16,
    pub(crate) method: Method,
    /// Header and payload (v1: the rest of the data).
    pub(crate) total: u64,
    pub(crate) uncompressed: u64,
    pub(crate) hash: u64,
    pub(crate) header_len: u64,
}

/// Parse a compressed bundle at the start of `data`: its inner bundles and
/// the stored length.
fn parse_ccob(
    data: &[u8],
    first_index: usize,
    offset: usize,
) -> Result<(Vec<Bundle<'static>>, usize), BundleError> {
    let h = read_ccob_header(data, first_index, offset)?;
    let payload = &data[h.header_len as usize..h.total as usize];
    let decompressed = decompress(payload, h.method, h.uncompressed, offset)?;
    let digest = Md5::digest(&decompressed);
    let hash_matches = Some(md5_word(&digest) == h.hash);
    let mut inner = inner_bundles(Arc::from(decompressed), first_index, offset)?;
    let info = Arc::new(Ccob {
        version: h.version,
        method: h.method,
        stored_size: h.total,
        uncompressed_size: h.uncompressed,
        hash: h.hash,
        hash_matches,
        inner_bundles: inner.len(),
    });
    for (i, b) in inner.iter_mut().enumerate() {
        b.compressed = Some((info.clone(), i));
    }
    Ok((inner, h.total as usize))
}

/// The header of every CCOB version, checked against the data.
pub(crate) fn read_ccob_header(
    data: &[u8],
    first_index: usize,
    offset: usize,
) -> Result<CcobHeader, BundleError> {
    let mut r = Reader {
        data,
        pos: 0,
        bundle: first_index,
        offset,
    };
    r.take(4, "CCOB magic")?;
    let version = r.u16("CCOB version")?;
    let method_raw = r.u16("CCOB compression method")?;
    let (total, uncompressed, hash) = read_ccob_sizes(&mut r, version)?;
    let h = CcobHeader {
        version,
        method: ccob_method(method_raw, offset)?,
        total,
        uncompressed,
        hash,
        header_len: r.pos as u64,
    };
    check_ccob_sizes(&h, data.len() as u64, offset)?;
    Ok(h)
}

/// The fields after a CCOB's version and method, as `(total, uncompressed,
/// hash)`: v1 stores no total size (it is the rest of the data), v2 stores
/// 32-bit sizes and v3 64-bit ones.
fn read_ccob_sizes(r: &mut Reader, version: u16) -> Result<(u64, u64, u64), BundleError> {
    match version {
        1 => {
            let u = r.u32("CCOB uncompressed size")?;
            Ok((r.data.len() as u64, u, r.u64("CCOB hash")?))
        }
        2 => {
            let t = r.u32("CCOB total size")?;
            let u = r.u32("CCOB uncompressed size")?;
            Ok((t, u, r.u64("CCOB hash")?))
        }
        3 => {
            let t = r.u64("CCOB total size")?;
            let u = r.u64("CCOB uncompressed size")?;
            Ok((t, u, r.u64("CCOB hash")?))
        }
        v => Err(BundleError::UnsupportedVersion {
            offset: r.offset,
            version: v,
        }),
    }
}

/// A CCOB's compression method from its stored number.
fn ccob_method(raw: u16, offset: usize) -> Result<Method, BundleError> {
    match raw {
        0 => Ok(Method::Zlib),
        1 => Ok(Method::Zstd),
        m => Err(BundleError::UnsupportedMethod { offset, method: m }),
    }
}

/// Check a CCOB header's sizes against the `have` bytes of data: the total
/// size must cover the header and fit in the data, and the uncompressed
/// size must be at most [`MAX_UNCOMPRESSED`].
fn check_ccob_sizes(h: &CcobHeader, have: u64, offset: usize) -> Result<(), BundleError> {
    let bad_total = |problem| BundleError::BadTotalSize {
        offset,
        total: h.total,
        have,
        problem,
    };
    if h.total < h.header_len {
        return Err(bad_total("smaller than the header"));
    }
    if h.total > have {
        return Err(bad_total("past the end of the data"));
    }
    if h.uncompressed > MAX_UNCOMPRESSED {
        return Err(BundleError::TooLarge {
            offset,
            size: h.uncompressed,
            limit: MAX_UNCOMPRESSED,
        });
    }
    Ok(())
}

/// The plain bundles the decompressed data of a CCOB holds (zero padding
/// allowed between them), numbered from `first_index`.
fn inner_bundles(
    buf: Arc<[u8]>,
    first_index: usize,
    offset: usize,
) -> Result<Vec<Bundle<'static>>, BundleError> {
    let len = buf.len();
    inner_bundles_of(buf, len, first_index, offset)
}

/// [`inner_bundles`] of the first `len` bytes of `buf` (a reused buffer may
/// be longer than the data in it).
pub(crate) fn inner_bundles_of(
    buf: Arc<[u8]>,
    len: usize,
    first_index: usize,
    offset: usize,
) -> Result<Vec<Bundle<'static>>, BundleError> {
    let bad = |problem: String| BundleError::BadPayload { offset, problem };
    let data = &buf[..len];
    let mut inner = Vec::new();
    let mut pos = 0usize;
    loop {
        while pos < data.len() && data[pos] == 0 {
            pos += 1;
        }
        if pos >= data.len() {
            break;
        }
        let rest = &data[pos..];
        if !rest.starts_with(BUNDLE_MAGIC) {
            return Err(bad(format!(
                "not an uncompressed bundle at decompressed offset {pos:#x} ({})",
                describe(rest)
            )));
        }
        let base = pos;
        let (bundle, len) = parse_plain(rest, first_index + inner.len(), offset, |r| {
            Blob::Shared(buf.clone(), r.start + base..r.end + base)
        })
        .map_err(|e| bad(e.to_string()))?;
        inner.push(bundle);
        pos += len;
    }
    if inner.is_empty() {
        return Err(bad("empty".into()));
    }
    Ok(inner)
}

/// Decompress exactly `expected` bytes.
fn decompress(
    payload: &[u8],
    method: Method,
    expected: u64,
    offset: usize,
) -> Result<Vec<u8>, BundleError> {
    stream::decompress_all(payload, method, expected, offset)
}

/// The hash CCOB headers store: the first 8 bytes of an MD5 digest, read
/// as a little-endian `u64`.
pub(crate) fn md5_word(digest: &[u8]) -> u64 {
    u64::from_le_bytes(digest[..8].try_into().expect("8 bytes"))
}

/// Build an uncompressed bundle from (triple, data) entries, laid out as
/// clang does: the entry table, then each entry's data (aligned to
/// `align`, which clang sets to 4096 for code objects).
pub fn write_bundle(entries: &[(&str, &[u8])], align: usize) -> Vec<u8> {
    let sizes: Vec<(&str, usize)> = entries.iter().map(|(t, d)| (*t, d.len())).collect();
    let mut bundle = BundleBuf::new(&sizes, align);
    for (i, (_, d)) in entries.iter().enumerate() {
        bundle.put(i, d);
    }
    bundle.into_bytes()
}

/// [`write_bundle`] of entries it takes (their bytes owned, or shared as
/// a [`Blob`]): each entry's bytes are dropped once copied, so that the
/// entries and the bundle are not both held whole.
pub fn write_bundle_owned<D: Deref<Target = [u8]>>(
    entries: Vec<(String, D)>,
    align: usize,
) -> Vec<u8> {
    let sizes: Vec<(&str, usize)> = entries.iter().map(|(t, d)| (t.as_str(), d.len())).collect();
    let mut bundle = BundleBuf::new(&sizes, align);
    for (i, (_, d)) in entries.into_iter().enumerate() {
        bundle.put(i, &d);
    }
    bundle.into_bytes()
}

/// A bundle written in place: its table first, for entries whose sizes are
/// known, then each entry's bytes put at its offset as they come (so that
/// the entries are never all held next to the bundle). The same bytes as
/// [`write_bundle`] of the same entries.
pub struct BundleBuf {
    bytes: Vec<u8>,
    offsets: Vec<u64>,
    sizes: Vec<usize>,
}

impl BundleBuf {
    /// The bundle of entries of these (triple, size), zero-filled but for
    /// its table.
    pub fn new(entries: &[(&str, usize)], align: usize) -> BundleBuf {
        let (offsets, len) = bundle_layout(entries, align);
        let mut bytes = Vec::with_capacity(len as usize);
        write_table(&mut bytes, entries, &offsets);
        bytes.resize(len as usize, 0);
        let sizes = entries.iter().map(|(_, n)| *n).collect();
        BundleBuf {
            bytes,
            offsets,
            sizes,
        }
    }

    /// Put entry `i`'s bytes in place; `false` (and nothing written) when
    /// there is no entry `i` of that size.
    pub fn put(&mut self, i: usize, data: &[u8]) -> bool {
        if self.sizes.get(i) != Some(&data.len()) {
            return false;
        }
        let at = self.offsets[i] as usize;
        self.bytes[at..at + data.len()].copy_from_slice(data);
        true
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }
}

/// Where [`write_bundle`] puts entries of these (triple, size): their
/// offsets, and the bundle's length.
pub fn bundle_layout(entries: &[(&str, usize)], align: usize) -> (Vec<u64>, u64) {
    let align = align.max(1) as u64;
    let table_len: u64 = 32
        + entries
            .iter()
            .map(|(t, _)| 24 + t.len() as u64)
            .sum::<u64>();
    let mut offsets = Vec::with_capacity(entries.len());
    let mut pos = table_len;
    for (_, n) in entries {
        if *n > 0 {
            pos = pos.div_ceil(align) * align;
        }
        offsets.push(pos);
        pos += *n as u64;
    }
    (offsets, pos)
}

fn write_table(out: &mut Vec<u8>, entries: &[(&str, usize)], offsets: &[u64]) {
    out.extend_from_slice(BUNDLE_MAGIC);
    out.extend_from_slice(&(entries.len() as u64).to_le_bytes());
    for ((t, n), off) in entries.iter().zip(offsets) {
        out.extend_from_slice(&off.to_le_bytes());
        out.extend_from_slice(&(*n as u64).to_le_bytes());
        out.extend_from_slice(&(t.len() as u64).to_le_bytes());
        out.extend_from_slice(t.as_bytes());
    }
}

/// Wrap uncompressed bundle bytes (one or more bundles) in a CCOB header of
/// the given version (1, 2 or 3) and method.
pub fn compress_bundle(
    uncompressed: &[u8],
    version: u16,
    method: Method,
) -> std::io::Result<Vec<u8>> {
    compress_bundle_at(uncompressed, version, method, 3)
}

/// `compress(uncompressed, v)` (a CCOB of version `v`) of `version`, or of
/// version 3 where a size does not fit version 1 or 2's 32-bit fields (the
/// uncompressed size, or the compressed one).
pub fn compress_fitting(
    uncompressed: &[u8],
    version: u16,
    compress: impl Fn(&[u8], u16) -> std::io::Result<Vec<u8>>,
) -> std::io::Result<Vec<u8>> {
    let version = if u32::try_from(uncompressed.len()).is_err() {
        3
    } else {
        version
    };
    match compress(uncompressed, version) {
        Ok(b) if version < 3 && u32::try_from(b.len()).is_err() => compress(uncompressed, 3),
        Err(_) if version < 3 => compress(uncompressed, 3),
        r => r,
    }
}

/// [`compress_bundle`] at zstd level `level` (zlib: its default level).
pub fn compress_bundle_at(
    uncompressed: &[u8],
    version: u16,
    method: Method,
    level: i32,
) -> std::io::Result<Vec<u8>> {
    let payload = match method {
        Method::Zstd => compress_sized(&mut zstd::bulk::Compressor::new(level)?, uncompressed)?,
        Method::Zlib => zlib(uncompressed)?,
    };
    wrap_ccob(uncompressed, &payload, version, method)
}

/// `data` compressed by `c` into a buffer sized for a code-object bundle's
/// usual ratio (a quarter), and only when that is too small into one of
/// zstd's worst-case bound: that bound is the size of the input, which a
/// bundle of a compressed binary's (up to 120 MB) would hold twice. One-shot
/// compression gives the same bytes whatever the buffer.
fn compress_sized(c: &mut zstd::bulk::Compressor<'_>, data: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(data.len() / 4 + 4096);
    match c.compress_to_buffer(data, &mut out) {
        Ok(_) => Ok(out),
        Err(_) => c.compress(data),
    }
}

/// A CCOB (zstd) compressed as clang's `--offload-compress` does: level
/// `level` with long-distance matching (a window of up to 128 MiB, so that
/// the code objects of a bundle's many targets, much alike, are matched
/// against each other), no checksum. Much smaller than plain zstd on
/// bundles of many targets.
pub fn compress_bundle_long(
    uncompressed: &[u8],
    version: u16,
    level: i32,
) -> std::io::Result<Vec<u8>> {
    use zstd::zstd_safe::CParameter;
    let mut c = zstd::bulk::Compressor::new(level)?;
    c.set_parameter(CParameter::EnableLongDistanceMatching(true))?;
    c.set_parameter(CParameter::WindowLog(27))?;
    c.set_parameter(CParameter::ChecksumFlag(false))?;
    let payload = compress_sized(&mut c, uncompressed)?;
    wrap_ccob(uncompressed, &payload, version, Method::Zstd)
}

fn zlib(data: &[u8]) -> std::io::Result<Vec<u8>> {
    use std::io::Write;
    let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data)?;
    e.finish()
}

/// `payload` (the compressed `uncompressed`) behind a CCOB header.
fn wrap_ccob(
    uncompressed: &[u8],
    payload: &[u8],
    version: u16,
    method: Method,
) -> std::io::Result<Vec<u8>> {
    let hash = md5_word(&Md5::digest(uncompressed));
    let mut out = Vec::new();
    out.extend_from_slice(CCOB_MAGIC);
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&(if method == Method::Zlib { 0u16 } else { 1u16 }).to_le_bytes());
    let too_big = || std::io::Error::other("too large for this CCOB version");
    match version {
        1 => {
            out.extend_from_slice(
                &u32::try_from(uncompressed.len())
                    .map_err(|_| too_big())?
                    .to_le_bytes(),
            );
        }
        2 => {
            let total = u32::try_from(24 + payload.len()).map_err(|_| too_big())?;
            out.extend_from_slice(&total.to_le_bytes());
            out.extend_from_slice(
                &u32::try_from(uncompressed.len())
                    .map_err(|_| too_big())?
                    .to_le_bytes(),
            );
        }
        3 => {
            out.extend_from_slice(&(32 + payload.len() as u64).to_le_bytes());
            out.extend_from_slice(&(uncompressed.len() as u64).to_le_bytes());
        }
        _ => return Err(std::io::Error::other("unknown CCOB version")),
    }
    out.extend_from_slice(&hash.to_le_bytes());
    out.extend_from_slice(payload);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_bundles_are_laid_out_as_clang_does() {
        let host: &[u8] = &[];
        let a = vec![7u8; 5000];
        let b: Vec<u8> = (0..=255).collect();
        let entries = [
            ("host-x86_64-unknown-linux--", host),
            ("hipv4-amdgcn-amd-amdhsa--gfx1100", &a[..]),
            ("hipv4-amdgcn-amd-amdhsa--gfx942", &b[..]),
        ];
        let sizes: Vec<(&str, usize)> = entries.iter().map(|(t, d)| (*t, d.len())).collect();
        for align in [1, 16, 4096] {
            let bytes = write_bundle(&entries, align);
            // The table: magic, count, then (offset, size, triple) each.
            let table_len = 32 + entries.iter().map(|(t, _)| 24 + t.len()).sum::<usize>();
            let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
            assert_eq!(&bytes[..24], BUNDLE_MAGIC);
            assert_eq!(word(24), 3);
            let mut at = 32;
            let mut end = table_len;
            for (t, d) in &entries {
                let (off, size) = (word(at) as usize, word(at + 8) as usize);
                assert_eq!(size, d.len());
                assert_eq!(&bytes[at + 24..at + 24 + t.len()], t.as_bytes());
                let want = if d.is_empty() {
                    end
                } else {
                    end.div_ceil(align) * align
                };
                assert_eq!(off, want, "{t} at align {align}");
                assert!(bytes[end..off].iter().all(|&z| z == 0), "padding is zeros");
                assert_eq!(&bytes[off..off + size], *d);
                end = off + size;
                at += 24 + t.len();
            }
            assert_eq!(bytes.len(), end);
            assert_eq!(bundle_layout(&sizes, align).1 as usize, end);
            let owned = entries
                .iter()
                .map(|(t, d)| (t.to_string(), d.to_vec()))
                .collect();
            assert_eq!(write_bundle_owned(owned, align), bytes, "align {align}");

            let mut buf = BundleBuf::new(&sizes, align);
            assert!(!buf.put(1, &b), "a wrong size is refused");
            assert!(!buf.put(3, &b), "no entry 3");
            for (i, (_, d)) in entries.iter().enumerate() {
                assert!(buf.put(i, d));
            }
            assert_eq!(buf.into_bytes(), bytes, "align {align}");
        }
    }

    const G1: &str = "hipv4-amdgcn-amd-amdhsa--gfx1100";
    const G2: &str = "hipv4-amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-";
    const HOST: &str = "host-x86_64-unknown-linux--";

    fn sample() -> Vec<u8> {
        write_bundle(
            &[(HOST, b""), (G1, b"code-for-gfx1100"), (G2, &[7u8; 5000])],
            4096,
        )
    }

    #[test]
    fn plain_bundle_roundtrip() {
        let data = sample();
        let b = parse_fatbin(&data).unwrap();
        assert_eq!(b.len(), 1);
        assert_eq!(b[0].range, 0..data.len());
        let dev: Vec<_> = b[0]
            .device_entries()
            .map(|e| (e.target().to_string(), e.data.to_vec()))
            .collect();
        assert_eq!(
            dev,
            vec![
                ("gfx1100".into(), b"code-for-gfx1100".to_vec()),
                ("gfx942:sramecc+:xnack-".into(), vec![7u8; 5000])
            ]
        );
    }

    #[test]
    fn several_bundles_with_padding_and_every_ccob_flavour() {
        let a = sample();
        let b = write_bundle(&[(HOST, b""), (G1, b"second")], 1);
        let mut data = a.clone();
        data.resize(data.len().div_ceil(4096) * 4096, 0);
        data.extend_from_slice(&b);
        for (v, m) in [
            (2, Method::Zstd),
            (3, Method::Zstd),
            (2, Method::Zlib),
            (3, Method::Zlib),
        ] {
            data.extend_from_slice(&[0; 13]);
            data.extend_from_slice(&compress_bundle(&a, v, m).unwrap());
        }
        // v1 has no total size: its payload runs to the end, so it goes last.
        let mut inner = b.clone();
        inner.extend_from_slice(&[0; 3]);
        inner.extend_from_slice(&a);
        data.extend_from_slice(&compress_bundle(&inner, 1, Method::Zstd).unwrap());
        let bundles = parse_fatbin(&data).unwrap();
        assert_eq!(bundles.len(), 8);
        for (i, bd) in bundles.iter().enumerate() {
            assert_eq!(bd.index, i);
        }
        assert_eq!(&*bundles[1].entry_for("gfx1100").unwrap().data, b"second");
        for bd in &bundles[2..6] {
            let (c, pos) = bd.compressed.as_ref().unwrap();
            assert_eq!(c.hash_matches, Some(true));
            assert_eq!(*pos, 0);
            assert_eq!(
                &*bd.entry_for("gfx942:sramecc+:xnack-").unwrap().data,
                &[7u8; 5000][..]
            );
        }
        let (c, _) = bundles[6].compressed.as_ref().unwrap();
        assert_eq!((c.version, c.inner_bundles), (1, 2));
        assert_eq!(bundles[6].range, bundles[7].range);
        assert_eq!(&*bundles[6].entry_for("gfx1100").unwrap().data, b"second");
        assert_eq!(bundles[7].compressed.as_ref().unwrap().1, 1);
        assert_eq!(
            &*bundles[7].entry_for("gfx1100").unwrap().data,
            b"code-for-gfx1100"
        );
    }

    #[test]
    fn empty_and_zero_data_have_no_bundles() {
        assert!(parse_fatbin(&[]).unwrap().is_empty());
        assert!(parse_fatbin(&[0; 100]).unwrap().is_empty());
    }

    #[test]
    fn every_truncation_is_an_error() {
        let data = sample();
        let end_of_last = data.len();
        for cut in 1..end_of_last {
            let r = parse_fatbin(&data[..cut]);
            // Cuts inside zero fill between table and data may still parse
            // only if every entry fits, which it cannot once the last
            // entry's bytes are cut.
            assert!(r.is_err(), "cut at {cut} parsed");
        }
    }

    #[test]
    fn wrong_magic() {
        let mut data = sample();
        data[0] = b'X';
        assert!(matches!(
            parse_fatbin(&data),
            Err(BundleError::BadMagic { offset: 0, .. })
        ));
    }

    #[test]
    fn entry_past_end() {
        let mut data = sample();
        // Size of the last entry: make it huge.
        let table_entry2 = 32 + (24 + HOST.len()) + (24 + G1.len());
        data[table_entry2 + 8..table_entry2 + 16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(
            parse_fatbin(&data),
            Err(BundleError::EntryOutOfRange { entry: 2, .. })
        ));
    }

    #[test]
    fn huge_entry_count() {
        let mut data = sample();
        data[24..32].copy_from_slice(&(1u64 << 60).to_le_bytes());
        assert!(matches!(
            parse_fatbin(&data),
            Err(BundleError::TooManyEntries { .. })
        ));
    }

    #[test]
    fn ccob_bad_sizes_and_methods() {
        let a = sample();
        let good = compress_bundle(&a, 2, Method::Zstd).unwrap();
        let mut t = good.clone();
        t[8..12].copy_from_slice(&(good.len() as u32 + 1).to_le_bytes());
        assert!(matches!(
            parse_fatbin(&t),
            Err(BundleError::BadTotalSize { .. })
        ));
        let mut t = good.clone();
        t[8..12].copy_from_slice(&10u32.to_le_bytes());
        assert!(matches!(
            parse_fatbin(&t),
            Err(BundleError::BadTotalSize { .. })
        ));
        let mut u = good.clone();
        u[12..16].copy_from_slice(&(a.len() as u32 - 1).to_le_bytes());
        assert!(matches!(
            parse_fatbin(&u),
            Err(BundleError::SizeMismatch { .. })
        ));
        let mut u = good.clone();
        u[12..16].copy_from_slice(&(a.len() as u32 + 100).to_le_bytes());
        assert!(matches!(
            parse_fatbin(&u),
            Err(BundleError::SizeMismatch { .. })
        ));
        let mut m = good.clone();
        m[6] = 7;
        assert!(matches!(
            parse_fatbin(&m),
            Err(BundleError::UnsupportedMethod { method: 7, .. })
        ));
        let mut v = good.clone();
        v[4] = 9;
        assert!(matches!(
            parse_fatbin(&v),
            Err(BundleError::UnsupportedVersion { version: 9, .. })
        ));
        let mut c = good.clone();
        let n = c.len();
        c[30..n - 4].iter_mut().for_each(|b| *b ^= 0x5a);
        assert!(matches!(
            parse_fatbin(&c),
            Err(BundleError::Decompress { .. } | BundleError::SizeMismatch { .. })
        ));
        let mut h = good;
        h[16] ^= 1;
        let b = parse_fatbin(&h).unwrap();
        assert_eq!(
            b[0].compressed.as_ref().unwrap().0.hash_matches,
            Some(false)
        );
    }

    #[test]
    fn duplicate_target_in_one_bundle() {
        let d = write_bundle(&[(G1, b"a"), (G1, b"b")], 1);
        assert!(matches!(
            parse_fatbin(&d),
            Err(BundleError::DuplicateTarget { .. })
        ));
    }
}
