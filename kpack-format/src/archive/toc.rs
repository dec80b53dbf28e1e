//! The TOC of a `.kpack` archive (formats.md §3.3): its one schema, written by
//! [`TocOut`] (through `serde`, bytes as the reference writes them) and read
//! by [`parse`] (from a decoded [`Value`], every field checked, errors
//! naming the field).
//!
//! ```text
//! { "format_version": 1, "group_name": str, "gfx_arch_family": str,
//!   "gfx_arches": [str, ...],
//!   "toc": { key: { target: { "type": "hsaco", "ordinal": int,
//!                             "original_size": int, "metadata"?: map } } },
//!   "compression_scheme": "none" | "zstd-per-kernel",
//!   "blobs": [{ "offset": int, "size": int }, ...]        (none)
//!   "zstd_offset": int, "zstd_size": int }                (zstd-per-kernel)
//! ```

use serde::ser::{Serialize, SerializeMap, Serializer};

use super::{ArchiveError, Entry, Metadata, Scheme, FORMAT_VERSION, HEADER_SIZE, MAX_FRAMES};
use crate::bytes;
use crate::msgpack::{self, Value};

/// The field names, in the order the writer writes them.
pub(super) const FORMAT_VERSION_FIELD: &str = "format_version";
pub(super) const GROUP_NAME: &str = "group_name";
pub(super) const GFX_ARCH_FAMILY: &str = "gfx_arch_family";
pub(super) const GFX_ARCHES: &str = "gfx_arches";
pub(super) const TOC: &str = "toc";
pub(super) const COMPRESSION_SCHEME: &str = "compression_scheme";
pub(super) const BLOBS: &str = "blobs";
pub(super) const ZSTD_OFFSET: &str = "zstd_offset";
pub(super) const ZSTD_SIZE: &str = "zstd_size";
/// Fields of a kernel entry.
pub(super) const TYPE: &str = "type";
pub(super) const ORDINAL: &str = "ordinal";
pub(super) const ORIGINAL_SIZE: &str = "original_size";
pub(super) const METADATA: &str = "metadata";
/// Fields of a `blobs` element.
pub(super) const OFFSET: &str = "offset";
pub(super) const SIZE: &str = "size";

/// Where the kernels are, per scheme.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    /// `none`: `(offset, size)` per ordinal.
    Blobs(Vec<(u64, u64)>),
    /// `zstd-per-kernel`: the blob's range and (reader only) its frame
    /// count.
    Zstd { offset: u64, size: u64, count: u64 },
}

// ---------------------------------------------------------------------------
// Writing.

/// A TOC to write.
pub struct TocOut<'a> {
    pub group_name: &'a str,
    pub gfx_arch_family: &'a str,
    pub gfx_arches: &'a [String],
    pub scheme: Scheme,
    /// Keys in first-insertion order, each with its targets in order.
    pub keys: Vec<(&'a str, Vec<EntryOut<'a>>)>,
    pub layout: Layout,
}

/// One kernel entry to write.
pub struct EntryOut<'a> {
    pub target: &'a str,
    pub ordinal: usize,
    pub original_size: u64,
    pub metadata: Option<&'a Metadata>,
}

impl Serialize for TocOut<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let layout_fields = match self.layout {
            Layout::Blobs(_) => 1,
            Layout::Zstd { .. } => 2,
        };
        let mut m = s.serialize_map(Some(6 + layout_fields))?;
        m.serialize_entry(FORMAT_VERSION_FIELD, &FORMAT_VERSION)?;
        m.serialize_entry(GROUP_NAME, self.group_name)?;
        m.serialize_entry(GFX_ARCH_FAMILY, self.gfx_arch_family)?;
        m.serialize_entry(GFX_ARCHES, self.gfx_arches)?;
        m.serialize_entry(TOC, &KeysOut(&self.keys))?;
        m.serialize_entry(COMPRESSION_SCHEME, self.scheme.name())?;
        match &self.layout {
            Layout::Blobs(blobs) => m.serialize_entry(BLOBS, &BlobsOut(blobs))?,
            Layout::Zstd { offset, size, .. } => {
                m.serialize_entry(ZSTD_OFFSET, offset)?;
                m.serialize_entry(ZSTD_SIZE, size)?;
            }
        }
        m.end()
    }
}

/// The `toc` map: key -> target -> entry.
struct KeysOut<'a, 'b>(&'b [(&'a str, Vec<EntryOut<'a>>)]);

impl Serialize for KeysOut<'_, '_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(key, entries)| {
            let targets = TargetsOut(entries);
            (*key, targets)
        }))
    }
}

struct TargetsOut<'a, 'b>(&'b [EntryOut<'a>]);

impl Serialize for TargetsOut<'_, '_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|e| (e.target, e)))
    }
}

impl Serialize for EntryOut<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(3 + usize::from(self.metadata.is_some())))?;
        m.serialize_entry(TYPE, super::KERNEL_TYPE)?;
        m.serialize_entry(ORDINAL, &self.ordinal)?;
        m.serialize_entry(ORIGINAL_SIZE, &self.original_size)?;
        if let Some(md) = self.metadata {
            m.serialize_entry(METADATA, &MetadataOut(md))?;
        }
        m.end()
    }
}

struct MetadataOut<'a>(&'a Metadata);

impl Serialize for MetadataOut<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(k, v)| (k, v)))
    }
}

struct BlobsOut<'a>(&'a [(u64, u64)]);

impl Serialize for BlobsOut<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(
            self.0
                .iter()
                .map(|&(offset, size)| BlobOut { offset, size }),
        )
    }
}

struct BlobOut {
    offset: u64,
    size: u64,
}

impl Serialize for BlobOut {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(2))?;
        m.serialize_entry(OFFSET, &self.offset)?;
        m.serialize_entry(SIZE, &self.size)?;
        m.end()
    }
}

// ---------------------------------------------------------------------------
// Reading.

/// A TOC as read and validated.
pub(super) struct ParsedToc {
    pub group_name: String,
    pub gfx_arch_family: String,
    pub gfx_arches: Vec<String>,
    pub scheme: Scheme,
    /// Keys in file order, targets in file order within a key.
    pub entries: Vec<Entry>,
    pub layout: Layout,
}

/// Validate the decoded TOC `toc` of the archive `data` (whose TOC starts
/// at `toc_offset`): types, ranges against the data area, ordinals against
/// the kernel count, no kernel twice.
pub(super) fn parse(toc: &Value, data: &[u8], toc_offset: u64) -> Result<ParsedToc, ArchiveError> {
    if toc.as_map().is_none() {
        return Err(wrong_type("(TOC root)", "map", toc));
    }
    check_format_version(toc)?;
    let group_name = as_str(require(toc, "", GROUP_NAME)?, GROUP_NAME)?.to_owned();
    let gfx_arch_family = as_str(require(toc, "", GFX_ARCH_FAMILY)?, GFX_ARCH_FAMILY)?.to_owned();
    let gfx_arches = arches(toc)?;
    let scheme = scheme(toc)?;
    let layout = match scheme {
        Scheme::None => blobs_layout(toc, toc_offset)?,
        Scheme::ZstdPerKernel => zstd_layout(toc, data, toc_offset)?,
    };
    let kernel_count = match &layout {
        Layout::Blobs(b) => b.len() as u64,
        Layout::Zstd { count, .. } => *count,
    };
    let entries = entries(toc, kernel_count)?;
    Ok(ParsedToc {
        group_name,
        gfx_arch_family,
        gfx_arches,
        scheme,
        entries,
        layout,
    })
}

/// `format_version`, when given, must be the one there is.
fn check_format_version(toc: &Value) -> Result<(), ArchiveError> {
    let Some(v) = msgpack::get(toc, FORMAT_VERSION_FIELD) else {
        return Ok(());
    };
    let version = as_u64(v, FORMAT_VERSION_FIELD)?;
    if version != u64::from(FORMAT_VERSION) {
        return Err(ArchiveError::UnsupportedTocVersion { version });
    }
    Ok(())
}

fn arches(toc: &Value) -> Result<Vec<String>, ArchiveError> {
    as_array(require(toc, "", GFX_ARCHES)?, GFX_ARCHES)?
        .iter()
        .enumerate()
        .map(|(i, v)| as_str(v, format!("{GFX_ARCHES}[{i}]")).map(str::to_owned))
        .collect()
}

/// `compression_scheme`; a TOC without one is scheme `none`.
fn scheme(toc: &Value) -> Result<Scheme, ArchiveError> {
    let Some(v) = msgpack::get(toc, COMPRESSION_SCHEME) else {
        return Ok(Scheme::None);
    };
    let name = as_str(v, COMPRESSION_SCHEME)?;
    Scheme::from_name(name).ok_or_else(|| ArchiveError::UnknownScheme {
        scheme: name.to_owned(),
    })
}

/// Whether `offset..offset + size` lies in the data area: between the
/// header and the TOC.
fn in_data_area(offset: u64, size: u64, toc_offset: u64) -> bool {
    offset >= HEADER_SIZE && offset.checked_add(size).is_some_and(|e| e <= toc_offset)
}

/// Scheme `none`: every blob's range, checked.
fn blobs_layout(toc: &Value, toc_offset: u64) -> Result<Layout, ArchiveError> {
    let blobs = as_array(require(toc, "", BLOBS)?, BLOBS)?;
    let mut ranges = Vec::with_capacity(blobs.len());
    for (i, b) in blobs.iter().enumerate() {
        let path = move || format!("{BLOBS}[{i}]");
        let at = move |f: &'static str| Lazy(move || sub(&path(), f));
        as_map(b, Lazy(path))?;
        let offset = as_u64(require(b, Lazy(path), OFFSET)?, at(OFFSET))?;
        let size = as_u64(require(b, Lazy(path), SIZE)?, at(SIZE))?;
        if !in_data_area(offset, size, toc_offset) {
            return Err(ArchiveError::BlobOutOfRange {
                index: i as u64,
                offset,
                size,
                start: HEADER_SIZE,
                end: toc_offset,
            });
        }
        ranges.push((offset, size));
    }
    Ok(Layout::Blobs(ranges))
}

/// Scheme `zstd-per-kernel`: the blob's range, checked, and the frame
/// count at its start.
fn zstd_layout(toc: &Value, data: &[u8], toc_offset: u64) -> Result<Layout, ArchiveError> {
    let offset = as_u64(require(toc, "", ZSTD_OFFSET)?, ZSTD_OFFSET)?;
    let size = as_u64(require(toc, "", ZSTD_SIZE)?, ZSTD_SIZE)?;
    if !in_data_area(offset, size, toc_offset) {
        return Err(ArchiveError::ZstdBlobOutOfRange {
            offset,
            size,
            start: HEADER_SIZE,
            end: toc_offset,
        });
    }
    if size < 4 {
        return Err(ArchiveError::TocFieldValue {
            field: ZSTD_SIZE.into(),
            reason: format!("{size} is too small to hold the frame count"),
        });
    }
    // In the data area, so inside `data`.
    let count = u64::from(bytes::u32_at(data, offset).unwrap_or_default());
    if count > MAX_FRAMES {
        return Err(ArchiveError::TooManyFrames {
            count,
            max: MAX_FRAMES,
        });
    }
    Ok(Layout::Zstd {
        offset,
        size,
        count,
    })
}

/// The `toc` map's entries, in file order; no (key, target) twice, also
/// when a key is listed twice.
fn entries(toc: &Value, kernel_count: u64) -> Result<Vec<Entry>, ArchiveError> {
    let mut entries: Vec<Entry> = Vec::new();
    for (k, targets) in as_map(require(toc, "", TOC)?, TOC)? {
        let key = key_str(k, TOC)?;
        let key_path = move || format!("{TOC}[{key:?}]");
        let first = entries.len();
        for (t, e) in as_map(targets, Lazy(key_path))? {
            let target = key_str(t, Lazy(key_path))?;
            if entries[first..].iter().any(|x| x.target == target) {
                return Err(duplicate(key, target));
            }
            entries.push(entry(key, target, e, kernel_count)?);
        }
    }
    let mut seen = std::collections::HashSet::new();
    match entries
        .iter()
        .find(|e| !seen.insert((e.key.as_str(), e.target.as_str())))
    {
        Some(e) => Err(duplicate(&e.key, &e.target)),
        None => Ok(entries),
    }
}

fn duplicate(key: &str, target: &str) -> ArchiveError {
    ArchiveError::DuplicateKernel {
        key: key.to_owned(),
        target: target.to_owned(),
    }
}

/// The entry of `key` @ `target` (the map `e`).
fn entry(key: &str, target: &str, e: &Value, kernel_count: u64) -> Result<Entry, ArchiveError> {
    let path = move || format!("{TOC}[{key:?}][{target:?}]");
    let at = move |f: &'static str| Lazy(move || sub(&path(), f));
    as_map(e, Lazy(path))?;
    let kind = match msgpack::get(e, TYPE) {
        None => None,
        Some(v) => Some(as_str(v, at(TYPE))?.to_owned()),
    };
    let ordinal = as_u64(require(e, Lazy(path), ORDINAL)?, at(ORDINAL))?;
    let ordinal = u32::try_from(ordinal).map_err(|_| ArchiveError::TocFieldValue {
        field: at(ORDINAL).into_path(),
        reason: format!("{ordinal} does not fit in 32 bits"),
    })?;
    if u64::from(ordinal) >= kernel_count {
        return Err(ArchiveError::OrdinalOutOfRange {
            key: key.to_owned(),
            target: target.to_owned(),
            ordinal: ordinal.into(),
            count: kernel_count,
        });
    }
    let original_size = as_u64(require(e, Lazy(path), ORIGINAL_SIZE)?, at(ORIGINAL_SIZE))?;
    let metadata = match msgpack::get(e, METADATA) {
        None => None,
        Some(m) => Some(
            as_map(m, at(METADATA))?
                .iter()
                .map(|(mk, mv)| Ok((key_str(mk, at(METADATA))?.to_owned(), mv.clone())))
                .collect::<Result<Metadata, ArchiveError>>()?,
        ),
    };
    Ok(Entry {
        key: key.to_owned(),
        target: target.to_owned(),
        kind,
        ordinal,
        original_size,
        metadata,
    })
}

/// `path.key`, or `key` at the root.
fn sub(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

/// A TOC field path for an error message. Paths of per-kernel fields are
/// passed as [`Lazy`] closures: formatting them for every entry of a large
/// TOC, error or not, was a good part of the time `open` took.
trait FieldPath {
    fn into_path(self) -> String;
}

impl FieldPath for &str {
    fn into_path(self) -> String {
        self.to_owned()
    }
}

impl FieldPath for String {
    fn into_path(self) -> String {
        self
    }
}

/// A field path built only if an error needs it.
#[derive(Clone, Copy)]
struct Lazy<F>(F);

impl<F: FnOnce() -> String> FieldPath for Lazy<F> {
    fn into_path(self) -> String {
        (self.0)()
    }
}

fn wrong_type(field: impl FieldPath, expected: &'static str, v: &Value) -> ArchiveError {
    ArchiveError::TocFieldType {
        field: field.into_path(),
        expected,
        found: msgpack::type_name(v),
    }
}

fn require<'v>(map: &'v Value, path: impl FieldPath, key: &str) -> Result<&'v Value, ArchiveError> {
    msgpack::get(map, key).ok_or_else(|| ArchiveError::TocFieldMissing {
        field: sub(&path.into_path(), key),
    })
}

fn as_str(v: &Value, field: impl FieldPath) -> Result<&str, ArchiveError> {
    v.as_str().ok_or_else(|| wrong_type(field, "str", v))
}

fn as_u64(v: &Value, field: impl FieldPath) -> Result<u64, ArchiveError> {
    match v {
        Value::Integer(i) => match (i.as_u64(), i.as_i64()) {
            (Some(u), _) => Ok(u),
            (None, i) => Err(ArchiveError::TocFieldValue {
                field: field.into_path(),
                reason: format!("{} is negative", i.unwrap_or_default()),
            }),
        },
        other => Err(wrong_type(field, "int", other)),
    }
}

fn as_map(v: &Value, field: impl FieldPath) -> Result<&[(Value, Value)], ArchiveError> {
    v.as_map()
        .map(Vec::as_slice)
        .ok_or_else(|| wrong_type(field, "map", v))
}

fn as_array(v: &Value, field: impl FieldPath) -> Result<&[Value], ArchiveError> {
    v.as_array()
        .map(Vec::as_slice)
        .ok_or_else(|| wrong_type(field, "array", v))
}

/// A map key that must be a str.
fn key_str(k: &Value, map_field: impl FieldPath) -> Result<&str, ArchiveError> {
    k.as_str()
        .ok_or_else(|| wrong_type(format!("{} (a key)", map_field.into_path()), "str", k))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the writer writes is what the reader reads: every field name
    /// above, in the writer's order, and back.
    #[test]
    fn written_toc_parses_back() {
        let md: Metadata = vec![("target".into(), Value::from("hipv4-amdgcn--gfx900"))];
        let arches = vec!["gfx900".to_string()];
        let out = TocOut {
            group_name: "g",
            gfx_arch_family: "gfx900",
            gfx_arches: &arches,
            scheme: Scheme::None,
            keys: vec![(
                "a#0",
                vec![EntryOut {
                    target: "gfx900",
                    ordinal: 0,
                    original_size: 3,
                    metadata: Some(&md),
                }],
            )],
            layout: Layout::Blobs(vec![(64, 3)]),
        };
        let bytes = msgpack::to_vec(&out);
        let value = msgpack::decode(&bytes).unwrap();
        let names: Vec<_> = value
            .as_map()
            .unwrap()
            .iter()
            .map(|(k, _)| k.as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                FORMAT_VERSION_FIELD,
                GROUP_NAME,
                GFX_ARCH_FAMILY,
                GFX_ARCHES,
                TOC,
                COMPRESSION_SCHEME,
                BLOBS
            ]
        );
        let data = vec![0u8; 67];
        let parsed = parse(&value, &data, 67).unwrap();
        assert_eq!(parsed.group_name, "g");
        assert_eq!(parsed.gfx_arches, arches);
        assert_eq!(parsed.layout, Layout::Blobs(vec![(64, 3)]));
        assert_eq!(parsed.entries.len(), 1);
        let e = &parsed.entries[0];
        assert_eq!((e.key.as_str(), e.target.as_str()), ("a#0", "gfx900"));
        assert_eq!(e.kind.as_deref(), Some(super::super::KERNEL_TYPE));
        assert_eq!((e.ordinal, e.original_size), (0, 3));
        assert_eq!(e.metadata.as_ref(), Some(&md));
    }
}
