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

mod de;

use serde::ser::{Serialize, SerializeMap, Serializer};
use serde::Deserialize;

use super::{ArchiveError, Entry, Metadata, Scheme, FORMAT_VERSION, HEADER_SIZE, MAX_FRAMES};
use crate::bytes;
use crate::msgpack::Value;

/// The field names, in the order the writer writes them. The reader's
/// structs (`*In`, below) name the same fields; `written_toc_parses_back`
/// keeps the two in step.
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
//
// serde decodes the TOC into the structs below (`de` hands their fields
// over in declaration order, so the order of the fields here is the order
// in which faults are found, and it reports errors with the field's path);
// `parse` then checks what types cannot say: ranges against the data area,
// the frame count, ordinals against the kernel count, no kernel twice.
// The TOC is read in four passes over the root map, each looking only at
// its own fields: the version first (a TOC of another version is reported
// as that, whatever else it holds), then the fields every TOC has, then the
// fields of its scheme (the other scheme's are not looked at), then the
// kernels.

/// Pass 1: the version.
#[derive(Deserialize)]
struct VersionIn {
    format_version: Option<u64>,
}

/// Pass 2: the fields every TOC has.
#[derive(Deserialize)]
struct HeadIn {
    group_name: String,
    gfx_arch_family: String,
    gfx_arches: Vec<String>,
    /// A TOC without one is scheme `none`.
    compression_scheme: Option<String>,
}

/// Pass 3, scheme `none`: where each kernel is, by ordinal.
#[derive(Deserialize)]
struct BlobsIn {
    blobs: Vec<BlobIn>,
}

#[derive(Deserialize)]
struct BlobIn {
    offset: u64,
    size: u64,
}

/// Pass 3, scheme `zstd-per-kernel`: where the frames are.
#[derive(Deserialize)]
struct ZstdIn {
    zstd_offset: u64,
    zstd_size: u64,
}

/// Pass 4: the kernels, key -> target -> entry, in file order (a key may
/// be listed twice).
#[derive(Deserialize)]
struct KernelsIn<'a> {
    #[serde(borrow)]
    toc: Pairs<&'a str, Pairs<&'a str, EntryIn>>,
}

#[derive(Deserialize)]
struct EntryIn {
    #[serde(rename = "type")]
    kind: Option<String>,
    ordinal: u32,
    original_size: u64,
    metadata: Option<Pairs<String, Value>>,
}

/// A map's entries in file order, repeated keys included.
struct Pairs<K, V>(Vec<(K, V)>);

impl<'de, K: Deserialize<'de>, V: Deserialize<'de>> Deserialize<'de> for Pairs<K, V> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct PairsVisitor<K, V>(std::marker::PhantomData<(K, V)>);

        impl<'de, K: Deserialize<'de>, V: Deserialize<'de>> serde::de::Visitor<'de> for PairsVisitor<K, V> {
            type Value = Pairs<K, V>;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a map")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                // The length of a map already decoded: no claim to distrust.
                let mut pairs = Vec::with_capacity(map.size_hint().unwrap_or(0));
                while let Some(k) = map.next_key()? {
                    pairs.push((k, map.next_value()?));
                }
                Ok(Pairs(pairs))
            }
        }

        d.deserialize_map(PairsVisitor(std::marker::PhantomData))
    }
}

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
    let VersionIn { format_version } = de::from_value(toc)?;
    if let Some(version) = format_version {
        if version != u64::from(FORMAT_VERSION) {
            return Err(ArchiveError::UnsupportedTocVersion { version });
        }
    }
    let head: HeadIn = de::from_value(toc)?;
    let scheme = match head.compression_scheme {
        None => Scheme::None,
        Some(name) => {
            Scheme::from_name(&name).ok_or(ArchiveError::UnknownScheme { scheme: name })?
        }
    };
    let layout = match scheme {
        Scheme::None => blobs_layout(de::from_value(toc)?, toc_offset)?,
        Scheme::ZstdPerKernel => zstd_layout(de::from_value(toc)?, data, toc_offset)?,
    };
    let kernel_count = match &layout {
        Layout::Blobs(b) => b.len() as u64,
        Layout::Zstd { count, .. } => *count,
    };
    let entries = entries(de::from_value(toc)?, kernel_count)?;
    Ok(ParsedToc {
        group_name: head.group_name,
        gfx_arch_family: head.gfx_arch_family,
        gfx_arches: head.gfx_arches,
        scheme,
        entries,
        layout,
    })
}

/// Whether `offset..offset + size` lies in the data area: between the
/// header and the TOC.
fn in_data_area(offset: u64, size: u64, toc_offset: u64) -> bool {
    offset >= HEADER_SIZE && offset.checked_add(size).is_some_and(|e| e <= toc_offset)
}

/// Scheme `none`: every blob's range, checked.
fn blobs_layout(b: BlobsIn, toc_offset: u64) -> Result<Layout, ArchiveError> {
    let mut ranges = Vec::with_capacity(b.blobs.len());
    for (i, BlobIn { offset, size }) in b.blobs.into_iter().enumerate() {
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
fn zstd_layout(z: ZstdIn, data: &[u8], toc_offset: u64) -> Result<Layout, ArchiveError> {
    let ZstdIn {
        zstd_offset: offset,
        zstd_size: size,
    } = z;
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

/// The kernels as entries, in file order; ordinals below `kernel_count`,
/// no (key, target) twice: a target repeated within a key is reported where
/// it repeats, a key listed twice once all are read.
fn entries(k: KernelsIn<'_>, kernel_count: u64) -> Result<Vec<Entry>, ArchiveError> {
    let count = k.toc.0.iter().map(|(_, targets)| targets.0.len()).sum();
    let mut entries: Vec<Entry> = Vec::with_capacity(count);
    for (key, targets) in k.toc.0 {
        let first = entries.len();
        for (target, e) in targets.0 {
            if entries[first..].iter().any(|x| x.target == target) {
                return Err(duplicate(key, target));
            }
            if u64::from(e.ordinal) >= kernel_count {
                return Err(ArchiveError::OrdinalOutOfRange {
                    key: key.to_owned(),
                    target: target.to_owned(),
                    ordinal: e.ordinal.into(),
                    count: kernel_count,
                });
            }
            entries.push(Entry {
                key: key.to_owned(),
                target: target.to_owned(),
                kind: e.kind,
                ordinal: e.ordinal,
                original_size: e.original_size,
                metadata: e.metadata.map(|m| m.0),
            });
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msgpack;

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

        // And the fields of scheme zstd-per-kernel.
        let zstd = TocOut {
            scheme: Scheme::ZstdPerKernel,
            layout: Layout::Zstd {
                offset: 64,
                size: 8,
                count: 1,
            },
            keys: vec![(
                "a#0",
                vec![EntryOut {
                    target: "gfx900",
                    ordinal: 0,
                    original_size: 3,
                    metadata: None,
                }],
            )],
            ..out
        };
        let value = msgpack::decode(&msgpack::to_vec(&zstd)).unwrap();
        let names: Vec<_> = value
            .as_map()
            .unwrap()
            .iter()
            .map(|(k, _)| k.as_str().unwrap())
            .collect();
        assert_eq!(names[5..], [COMPRESSION_SCHEME, ZSTD_OFFSET, ZSTD_SIZE]);
        let mut data = vec![0u8; 72];
        data[64..68].copy_from_slice(&1u32.to_le_bytes());
        let parsed = parse(&value, &data, 72).unwrap();
        assert_eq!(parsed.scheme, Scheme::ZstdPerKernel);
        assert_eq!(parsed.layout, zstd.layout);
        assert_eq!(parsed.entries[0].metadata, None);
    }

    // What a hand-made TOC reads as: the reader's rules beyond the
    // writer's output (unknown and repeated keys, the other scheme's
    // fields, which fault is reported first).

    fn s(x: &str) -> Value {
        Value::from(x)
    }

    fn map(entries: Vec<(Value, Value)>) -> Value {
        Value::Map(entries)
    }

    fn entry(ordinal: u64) -> Value {
        msgpack::str_map([
            ("type", s("hsaco")),
            ("ordinal", Value::from(ordinal)),
            ("original_size", Value::from(3u64)),
        ])
    }

    /// A valid scheme-`none` TOC: `a#0` @ gfx900 and gfx906, `b#0` @
    /// gfx900, three 3-byte blobs at 64, 67, 70 (the TOC at 73).
    fn toc_none() -> Value {
        msgpack::str_map([
            ("format_version", Value::from(1u64)),
            ("group_name", s("g")),
            ("gfx_arch_family", s("gfx9")),
            ("gfx_arches", Value::Array(vec![s("gfx900"), s("gfx906")])),
            (
                "toc",
                msgpack::str_map([
                    (
                        "a#0",
                        msgpack::str_map([("gfx900", entry(0)), ("gfx906", entry(1))]),
                    ),
                    ("b#0", msgpack::str_map([("gfx900", entry(2))])),
                ]),
            ),
            ("compression_scheme", s("none")),
            (
                "blobs",
                Value::Array(
                    [64u64, 67, 70]
                        .iter()
                        .map(|&o| {
                            msgpack::str_map([
                                ("offset", Value::from(o)),
                                ("size", Value::from(3u64)),
                            ])
                        })
                        .collect(),
                ),
            ),
        ])
    }

    const TOC_AT: u64 = 73;

    /// A valid scheme-`zstd-per-kernel` TOC (one key, two targets) and the
    /// archive bytes before it: the blob at 64..72 says 2 frames.
    fn toc_zstd() -> (Value, Vec<u8>) {
        let toc = msgpack::str_map([
            ("group_name", s("g")),
            ("gfx_arch_family", s("gfx9")),
            ("gfx_arches", Value::Array(vec![])),
            (
                "toc",
                msgpack::str_map([(
                    "a#0",
                    msgpack::str_map([("gfx900", entry(0)), ("gfx906", entry(1))]),
                )]),
            ),
            ("compression_scheme", s("zstd-per-kernel")),
            ("zstd_offset", Value::from(64u64)),
            ("zstd_size", Value::from(8u64)),
        ]);
        let mut data = vec![0u8; 72];
        data[64..68].copy_from_slice(&2u32.to_le_bytes());
        (toc, data)
    }

    fn parse_none(toc: &Value) -> Result<ParsedToc, ArchiveError> {
        parse(toc, &[0u8; TOC_AT as usize], TOC_AT)
    }

    /// The value at `path` (string keys / array indices) in `v`.
    fn at<'v>(v: &'v mut Value, path: &[&str]) -> &'v mut Value {
        let mut v = v;
        for p in path {
            v = match v {
                Value::Map(m) => &mut m.iter_mut().find(|(k, _)| k.as_str() == Some(p)).unwrap().1,
                Value::Array(a) => &mut a[p.parse::<usize>().unwrap()],
                _ => panic!("no {p}"),
            };
        }
        v
    }

    fn push(v: &mut Value, k: Value, x: Value) {
        let Value::Map(m) = v else { panic!() };
        m.push((k, x));
    }

    fn remove(v: &mut Value, key: &str) {
        let Value::Map(m) = v else { panic!() };
        m.retain(|(k, _)| k.as_str() != Some(key));
    }

    fn field_of(e: ArchiveError) -> String {
        match e {
            ArchiveError::TocFieldType { field, .. }
            | ArchiveError::TocFieldMissing { field }
            | ArchiveError::TocFieldValue { field, .. } => field,
            other => panic!("{other}"),
        }
    }

    #[test]
    fn hand_made_tocs_parse() {
        let p = parse_none(&toc_none()).unwrap();
        let names: Vec<_> = p
            .entries
            .iter()
            .map(|e| (e.key.as_str(), e.target.as_str(), e.ordinal))
            .collect();
        assert_eq!(
            names,
            [
                ("a#0", "gfx900", 0),
                ("a#0", "gfx906", 1),
                ("b#0", "gfx900", 2)
            ]
        );
        assert_eq!(p.layout, Layout::Blobs(vec![(64, 3), (67, 3), (70, 3)]));
        let (toc, data) = toc_zstd();
        let p = parse(&toc, &data, 72).unwrap();
        assert_eq!(p.scheme, Scheme::ZstdPerKernel);
        assert_eq!(
            p.layout,
            Layout::Zstd {
                offset: 64,
                size: 8,
                count: 2
            }
        );
    }

    /// Keys the schema does not name, and keys that are not strings in
    /// the maps of fixed fields, are ignored.
    #[test]
    fn unknown_and_non_str_keys_are_ignored() {
        let mut t = toc_none();
        push(&mut t, s("zzz"), Value::Array(vec![Value::Nil]));
        push(&mut t, Value::from(5u64), s("x"));
        push(&mut t, Value::Nil, Value::Nil);
        let e = at(&mut t, &["toc", "a#0", "gfx906"]);
        push(e, s("extra"), map(vec![(Value::from(1u64), Value::Nil)]));
        push(e, Value::Boolean(true), Value::from(-1i64));
        push(
            at(&mut t, &["blobs", "1"]),
            s("crc"),
            Value::Binary(vec![1]),
        );
        let p = parse_none(&t).unwrap();
        assert_eq!(p.entries.len(), 3);
        assert_eq!(p.entries[1].metadata, None);
    }

    /// A field given twice in a map of fixed fields: the first one counts.
    #[test]
    fn first_of_repeated_fields_wins() {
        let mut t = toc_none();
        push(&mut t, s("group_name"), Value::from(7u64));
        push(&mut t, s("format_version"), Value::from(2u64));
        push(&mut t, s("blobs"), Value::Nil);
        push(
            at(&mut t, &["toc", "b#0", "gfx900"]),
            s("ordinal"),
            s("bad"),
        );
        push(at(&mut t, &["blobs", "2"]), s("size"), Value::from(-1i64));
        let p = parse_none(&t).unwrap();
        assert_eq!(p.group_name, "g");
        assert_eq!(p.entries[2].ordinal, 2);
        assert_eq!(p.layout, Layout::Blobs(vec![(64, 3), (67, 3), (70, 3)]));
    }

    /// The fields of the other scheme are not looked at.
    #[test]
    fn fields_of_the_other_scheme_are_ignored() {
        let mut t = toc_none();
        push(&mut t, s("zstd_offset"), s("x"));
        push(&mut t, s("zstd_size"), Value::Nil);
        parse_none(&t).unwrap();
        let (mut t, data) = toc_zstd();
        push(&mut t, s("blobs"), Value::from(5u64));
        parse(&t, &data, 72).unwrap();
    }

    /// Optional fields may be left out, but not given as nil.
    #[test]
    fn optional_fields() {
        let mut t = toc_none();
        remove(&mut t, "format_version");
        remove(&mut t, "compression_scheme");
        remove(at(&mut t, &["toc", "a#0", "gfx900"]), "type");
        let p = parse_none(&t).unwrap();
        assert_eq!(
            (p.scheme, p.entries[0].kind.as_deref()),
            (Scheme::None, None)
        );
        for (path, want) in [
            (&["format_version"][..], "format_version"),
            (&["compression_scheme"][..], "compression_scheme"),
            (
                &["toc", "a#0", "gfx900", "type"][..],
                r#"toc["a#0"]["gfx900"].type"#,
            ),
        ] {
            let mut t = toc_none();
            *at(&mut t, path) = Value::Nil;
            match parse_none(&t) {
                Err(ArchiveError::TocFieldType {
                    field,
                    found: "nil",
                    ..
                }) => assert_eq!(field, want),
                Err(other) => panic!("{want}: {other}"),
                Ok(_) => panic!("{want}: parsed"),
            }
        }
        let mut t = toc_none();
        push(
            at(&mut t, &["toc", "a#0", "gfx900"]),
            s("metadata"),
            Value::Nil,
        );
        let e = parse_none(&t).err().unwrap();
        assert!(
            matches!(
                e,
                ArchiveError::TocFieldType {
                    expected: "map",
                    found: "nil",
                    ..
                }
            ),
            "{e}"
        );
        assert_eq!(field_of(e), r#"toc["a#0"]["gfx900"].metadata"#);
    }

    /// Metadata is kept as written: any values, keys repeated, in order.
    #[test]
    fn metadata_is_kept_as_written() {
        let md = vec![
            ("target".to_string(), s("hipv4-amdgcn--gfx900")),
            ("n".to_string(), Value::from(-3i64)),
            ("big".to_string(), Value::from(u64::MAX)),
            ("f".to_string(), Value::F32(1.5)),
            ("d".to_string(), Value::F64(-0.25)),
            ("bin".to_string(), Value::Binary(vec![0, 0xff])),
            (
                "nested".to_string(),
                map(vec![
                    (
                        Value::from(1u64),
                        Value::Array(vec![Value::Nil, Value::Boolean(false)]),
                    ),
                    (Value::Binary(vec![1]), map(vec![])),
                ]),
            ),
            ("n".to_string(), s("again")),
        ];
        let mut t = toc_none();
        push(
            at(&mut t, &["toc", "b#0", "gfx900"]),
            s("metadata"),
            map(md.iter().map(|(k, v)| (s(k), v.clone())).collect()),
        );
        let p = parse_none(&t).unwrap();
        assert_eq!(p.entries[2].metadata.as_ref(), Some(&md));
        assert_eq!(p.entries[0].metadata, None);
    }

    #[test]
    fn field_paths() {
        let cases: Vec<(Vec<&str>, Value, &str)> = vec![
            (vec!["format_version"], s("1"), "format_version"),
            (
                vec!["gfx_arch_family"],
                Value::Binary(vec![]),
                "gfx_arch_family",
            ),
            (vec!["gfx_arches", "0"], Value::from(1u64), "gfx_arches[0]"),
            (
                vec!["toc", "a#0", "gfx906"],
                Value::Array(vec![]),
                r#"toc["a#0"]["gfx906"]"#,
            ),
            (
                vec!["toc", "a#0", "gfx906", "ordinal"],
                Value::F64(1.0),
                r#"toc["a#0"]["gfx906"].ordinal"#,
            ),
            (vec!["blobs"], map(vec![]), "blobs"),
            (vec!["blobs", "1", "offset"], Value::Nil, "blobs[1].offset"),
        ];
        for (path, v, want) in cases {
            let mut t = toc_none();
            *at(&mut t, &path) = v;
            assert_eq!(field_of(parse_none(&t).err().unwrap()), want);
        }
        // Keys of maps of kernels must be strings.
        let mut t = toc_none();
        push(at(&mut t, &["toc"]), Value::from(1u64), map(vec![]));
        assert_eq!(field_of(parse_none(&t).err().unwrap()), "toc (a key)");
        let mut t = toc_none();
        push(at(&mut t, &["toc", "b#0"]), Value::Nil, entry(0));
        assert_eq!(
            field_of(parse_none(&t).err().unwrap()),
            r#"toc["b#0"] (a key)"#
        );
        let mut t = toc_none();
        push(
            at(&mut t, &["toc", "b#0", "gfx900"]),
            s("metadata"),
            map(vec![
                (s("ok"), Value::Nil),
                (Value::Binary(vec![]), Value::Nil),
            ]),
        );
        let e = parse_none(&t).err().unwrap();
        assert!(
            matches!(
                e,
                ArchiveError::TocFieldType {
                    expected: "str",
                    found: "bin",
                    ..
                }
            ),
            "{e}"
        );
        assert_eq!(field_of(e), r#"toc["b#0"]["gfx900"].metadata (a key)"#);
        // The root.
        let e = parse_none(&Value::from(1u64)).err().unwrap();
        assert_eq!(
            e.to_string(),
            "TOC field `(TOC root)` is a int, expected map"
        );
        // Values out of range.
        let mut t = toc_none();
        *at(&mut t, &["format_version"]) = Value::from(-1i64);
        let e = parse_none(&t).err().unwrap();
        assert_eq!(
            e.to_string(),
            "TOC field `format_version` is invalid: -1 is negative"
        );
        let mut t = toc_none();
        *at(&mut t, &["toc", "a#0", "gfx906", "ordinal"]) = Value::from(1u64 << 32);
        let e = parse_none(&t).err().unwrap();
        assert_eq!(
            e.to_string(),
            r#"TOC field `toc["a#0"]["gfx906"].ordinal` is invalid: 4294967296 does not fit in 32 bits"#
        );
        let (mut t, data) = toc_zstd();
        *at(&mut t, &["zstd_size"]) = Value::from(3u64);
        let e = parse(&t, &data, 72).err().unwrap();
        assert_eq!(
            e.to_string(),
            "TOC field `zstd_size` is invalid: 3 is too small to hold the frame count"
        );
    }

    /// With several faults, the one reported is the first in this order:
    /// the version, the root fields in schema order, the scheme, the
    /// layout (and its ranges), then the kernels.
    #[test]
    fn which_fault_is_reported() {
        // The version before anything else.
        let mut t = toc_none();
        *at(&mut t, &["format_version"]) = Value::from(2u64);
        remove(&mut t, "group_name");
        *at(&mut t, &["toc"]) = Value::Nil;
        assert!(matches!(
            parse_none(&t),
            Err(ArchiveError::UnsupportedTocVersion { version: 2 })
        ));
        let mut t = toc_none();
        remove(&mut t, "format_version");
        push(&mut t, s("format_version"), Value::from(0u64));
        remove(&mut t, "group_name");
        assert!(matches!(
            parse_none(&t),
            Err(ArchiveError::UnsupportedTocVersion { version: 0 })
        ));
        // Root fields in schema order, whatever the file's order.
        let mut t = toc_none();
        *at(&mut t, &["gfx_arches"]) = Value::Nil;
        remove(&mut t, "group_name");
        assert_eq!(field_of(parse_none(&t).err().unwrap()), "group_name");
        let mut t = toc_none();
        *at(&mut t, &["gfx_arches"]) = Value::Nil;
        *at(&mut t, &["compression_scheme"]) = s("lz4");
        assert_eq!(field_of(parse_none(&t).err().unwrap()), "gfx_arches");
        // The scheme before the layout, the layout before the kernels.
        let mut t = toc_none();
        *at(&mut t, &["compression_scheme"]) = s("lz4");
        remove(&mut t, "blobs");
        assert!(matches!(
            parse_none(&t),
            Err(ArchiveError::UnknownScheme { .. })
        ));
        let mut t = toc_none();
        *at(&mut t, &["toc"]) = Value::Nil;
        remove(&mut t, "blobs");
        assert_eq!(field_of(parse_none(&t).err().unwrap()), "blobs");
        let mut t = toc_none();
        *at(&mut t, &["toc"]) = Value::Nil;
        *at(&mut t, &["blobs", "2", "size"]) = Value::from(4u64);
        assert!(matches!(
            parse_none(&t),
            Err(ArchiveError::BlobOutOfRange { index: 2, .. })
        ));
        let (mut t, mut data) = toc_zstd();
        *at(&mut t, &["toc"]) = Value::Nil;
        data[64..68].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            parse(&t, &data, 72),
            Err(ArchiveError::TooManyFrames { .. })
        ));
        // Within a key, a repeated target is reported where it repeats;
        // a key listed twice, once all keys are read.
        let mut t = toc_none();
        let again = at(&mut t, &["toc", "a#0"]).clone();
        push(at(&mut t, &["toc"]), s("a#0"), again);
        push(at(&mut t, &["toc", "b#0"]), s("gfx900"), entry(0));
        assert!(matches!(
            parse_none(&t),
            Err(ArchiveError::DuplicateKernel { ref key, ref target }) if key == "b#0" && target == "gfx900"
        ));
        let mut t = toc_none();
        *at(&mut t, &["toc", "b#0", "gfx900", "ordinal"]) = Value::from(3u64);
        assert!(matches!(
            parse_none(&t),
            Err(ArchiveError::OrdinalOutOfRange {
                ordinal: 3,
                count: 3,
                ..
            })
        ));
    }
}
