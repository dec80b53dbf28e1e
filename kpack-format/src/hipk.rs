//! The host side of an offloaded binary (formats.md §4.1, §4.2): the 24-byte
//! `__CudaFatBinaryWrapper` records of `.hipFatBinSegment`, where they lie in
//! a table that may be padded ([`record_offsets`]), and the HIPK metadata
//! blob (section `.rocm_kpack_ref`) that a `HIPK` wrapper points at.
//!
//! The metadata is a MessagePack map
//! `{"kpack_search_paths": [str, ...], "kernel_name": str}`, to which kpack
//! adds optional keys the reference's readers ignore (`kpack_targets`:
//! the targets the binary's code objects were split for; `kpack_device_sha256`:
//! the digest of the device code it was split from; `kpack_co_targets`:
//! which code object indices were built for fewer of those targets).
//! [`HipkMetadata::encode`] writes the two keys byte for byte as the
//! reference (Python `msgpack.packb(..., use_bin_type=True)`) does, then
//! each optional key that is present; [`HipkMetadata::decode`] accepts any
//! key order and ignores keys it does not know.

use std::io::Read;

use serde::ser::{Serialize, SerializeMap, Serializer};

use crate::bytes;
use crate::msgpack::{self, DecodeError, Value};

/// Wrapper magic of an inline fat binary: `"FPIH"` little-endian.
pub const HIPF_MAGIC: u32 = 0x4849_5046;
/// Wrapper magic of an offloaded (kpack'd) binary: `"HIPK"` little-endian.
pub const HIPK_MAGIC: u32 = 0x4B50_4948;
/// The wrapper version both kinds carry.
pub const WRAPPER_VERSION: u32 = 1;
/// Size of one wrapper record in bytes.
pub const WRAPPER_SIZE: usize = 24;
/// Records start on multiples of this (relative to the table's start).
pub const RECORD_ALIGN: usize = 8;
/// The runtime reads at most this many bytes of metadata.
pub const MAX_METADATA_SIZE: usize = 64 * 1024;

/// Key of the search path list in the metadata map.
pub(crate) const KEY_SEARCH_PATHS: &str = "kpack_search_paths";
/// Key of the kernel name in the metadata map.
pub(crate) const KEY_KERNEL_NAME: &str = "kernel_name";
/// Key of the optional list of targets the code objects were split for.
pub const KEY_TARGETS: &str = "kpack_targets";
/// Key of the optional device digest: the SHA-256 of the code objects the
/// binary was split from (see [`crate::provenance`]).
pub const KEY_DEVICE_DIGEST: &str = "kpack_device_sha256";
/// Key of the optional per-bundle targets: for the code object indices
/// whose bundles do not hold every target of `kpack_targets`, which ones
/// they hold (see [`CoTargets`]).
pub const KEY_CO_TARGETS: &str = "kpack_co_targets";
/// Stands for a target ID in search paths (`lib_@GFXARCH@.kpack`).
pub const GFXARCH: &str = "@GFXARCH@";

/// One `__CudaFatBinaryWrapper` (24 bytes, little-endian).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wrapper {
    /// [`HIPF_MAGIC`] or [`HIPK_MAGIC`] (anything else is not a HIP wrapper).
    pub magic: u32,
    /// [`WRAPPER_VERSION`].
    pub version: u32,
    /// Address of the bundle (HIPF) or of the HIPK metadata (HIPK).
    pub binary: u64,
    /// For HIPK: the code object index `co_index`.
    pub reserved1: u64,
}

impl Wrapper {
    /// Decode a wrapper record. Any bytes are a wrapper; check
    /// [`Wrapper::is_hipf`] / [`Wrapper::is_hipk`].
    pub fn parse(b: &[u8; WRAPPER_SIZE]) -> Wrapper {
        // Every field lies inside the 24 bytes: the reads cannot fail.
        Wrapper {
            magic: bytes::u32_at(b, 0).unwrap_or_default(),
            version: bytes::u32_at(b, 4).unwrap_or_default(),
            binary: bytes::u64_at(b, 8).unwrap_or_default(),
            reserved1: bytes::u64_at(b, 16).unwrap_or_default(),
        }
    }

    /// Encode the wrapper record.
    pub fn to_bytes(&self) -> [u8; WRAPPER_SIZE] {
        let mut b = [0u8; WRAPPER_SIZE];
        bytes::put_u32(&mut b, 0, self.magic);
        bytes::put_u32(&mut b, 4, self.version);
        bytes::put_u64(&mut b, 8, self.binary);
        bytes::put_u64(&mut b, 16, self.reserved1);
        b
    }

    /// An inline fat binary wrapper.
    pub fn is_hipf(&self) -> bool {
        self.magic == HIPF_MAGIC
    }

    /// An offloaded (kpack'd) wrapper.
    pub fn is_hipk(&self) -> bool {
        self.magic == HIPK_MAGIC
    }
}

/// Why the bytes of a wrapper table do not lay out as records
/// ([`record_offsets`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TableError {
    #[error("size {size} is not a multiple of {RECORD_ALIGN}")]
    Unaligned { size: usize },
    #[error("a record at +{at:#x} runs past the end of the table ({size} bytes)")]
    Truncated { at: usize, size: usize },
    #[error("{size} bytes, all zero: no wrapper record")]
    Empty { size: usize },
}

/// Where the records of a wrapper table start, in order (formats.md §4.1).
///
/// A plain table is an array of 24-byte records; an AddressSanitizer build
/// follows each record with a zero red zone (64-byte slots), and a link that
/// mixes both has no constant stride. The records are found by layout, not
/// by `index × 24` and not by looking for a magic: every 8-aligned position
/// whose 8 bytes are not all zero starts a 24-byte record, and the search
/// goes on after it. A record with a wrong magic is thus still a record (the
/// caller reports its magic), never padding. A table whose size is not a
/// multiple of 8, whose last record is cut short, or that holds only zero
/// bytes is refused.
pub fn record_offsets(table: &[u8]) -> Result<Vec<usize>, TableError> {
    let size = table.len();
    if !size.is_multiple_of(RECORD_ALIGN) {
        return Err(TableError::Unaligned { size });
    }
    let mut out = Vec::with_capacity(size / WRAPPER_SIZE);
    let mut at = 0;
    while at < size {
        if table[at..at + RECORD_ALIGN].iter().all(|&b| b == 0) {
            at += RECORD_ALIGN;
            continue;
        }
        if size - at < WRAPPER_SIZE {
            return Err(TableError::Truncated { at, size });
        }
        out.push(at);
        at += WRAPPER_SIZE;
    }
    if out.is_empty() && size > 0 {
        return Err(TableError::Empty { size });
    }
    Ok(out)
}

/// Why bytes are not valid HIPK metadata.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HipkError {
    #[error("HIPK metadata is not valid MessagePack: {0}")]
    Msgpack(#[from] DecodeError),
    #[error("HIPK metadata is a MessagePack {found}, expected a map")]
    NotAMap { found: &'static str },
    #[error("HIPK metadata has no `{field}` field")]
    MissingField { field: &'static str },
    #[error("HIPK metadata field `{field}` is a {found}, expected {expected}")]
    WrongType {
        field: String,
        expected: &'static str,
        found: &'static str,
    },
    #[error("HIPK metadata field `kpack_search_paths` is empty")]
    NoSearchPaths,
}

/// The HIPK metadata of an offloaded binary.
///
/// Built with [`HipkMetadata::new`] and the `with_*` methods (the struct is
/// `non_exhaustive`: an optional key added later is one more field, and no
/// caller changes). Optional keys are `None` when absent: a binary written
/// by the reference tools or an older kpack has none of them.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct HipkMetadata {
    /// The binary's key in archive TOCs, without the `#N` suffix.
    pub kernel_name: String,
    /// Archive paths (relative to the binary's directory unless absolute);
    /// `@GFXARCH@` stands for a target ID.
    pub search_paths: Vec<String>,
    /// `kpack_targets`: the target IDs whose code objects were split out of
    /// the binary into archives (sorted, each once), as the archives spell
    /// them; `None` when the key is absent (or not a list of strings, which
    /// readers ignore as they ignore unknown keys).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub targets: Option<Vec<String>>,
    /// `kpack_device_sha256`: the device digest of the fat binary it was
    /// split from ([`crate::provenance::device_digest`]); `None` when absent
    /// (or not 64 hex digits, which readers ignore).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_digest: Option<String>,
    /// `kpack_co_targets`: the code object indices whose bundles were
    /// built for fewer targets than `kpack_targets` lists, and which;
    /// `None` when the key is absent (every bundle holds every target) or
    /// malformed (ignored, as an unknown key).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub co_targets: Option<CoTargets>,
}

/// `kpack_co_targets` (formats.md §4.2): groups of code object indices
/// that hold the same targets, each `[[positions in kpack_targets],
/// [co indices]]`. A code object index in no group holds every target of
/// `kpack_targets`. Written only when the bundles' target sets differ.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct CoTargets {
    /// Each group: positions into `kpack_targets`, the indices holding
    /// them (both ascending, each once; no index in two groups).
    pub groups: Vec<(Vec<u32>, Vec<u64>)>,
}

impl CoTargets {
    /// From each code object index and the targets its bundle holds, all
    /// among `all` (sorted): the groups of those that do not hold all of
    /// `all`, or `None` when every one does.
    pub fn from_bundles(all: &[String], bundles: &[(u64, Vec<String>)]) -> Option<CoTargets> {
        let mut by_set: std::collections::BTreeMap<Vec<u32>, Vec<u64>> = Default::default();
        for (co, targets) in bundles {
            let mut pos: Vec<u32> = (targets.iter())
                .filter_map(|t| all.iter().position(|a| a == t))
                .filter_map(|p| u32::try_from(p).ok())
                .collect();
            pos.sort_unstable();
            pos.dedup();
            if pos.len() != all.len() {
                by_set.entry(pos).or_default().push(*co);
            }
        }
        if by_set.is_empty() {
            return None;
        }
        let groups = (by_set.into_iter())
            .map(|(p, mut cos)| {
                cos.sort_unstable();
                cos.dedup();
                (p, cos)
            })
            .collect();
        Some(CoTargets { groups })
    }

    /// The positions (into `kpack_targets`) code object `co` holds, when
    /// it is in a group (`None`: all of them).
    pub fn positions(&self, co: u64) -> Option<&[u32]> {
        (self.groups.iter())
            .find(|(_, cos)| cos.binary_search(&co).is_ok())
            .map(|(p, _)| p.as_slice())
    }

    /// Decode the key's value against `kpack_targets` of `n` targets:
    /// `None` (ignored) unless it is an array of `[[int], [int]]` pairs,
    /// positions below `n`, ascending, no index in two groups.
    fn decode(v: &Value, n: usize) -> Option<CoTargets> {
        let Value::Array(items) = v else { return None };
        let mut groups = Vec::with_capacity(items.len());
        let mut seen = std::collections::BTreeSet::new();
        for g in items {
            let Value::Array(pair) = g else { return None };
            let [pos, cos] = pair.as_slice() else {
                return None;
            };
            let pos: Vec<u32> = ascending_ints(pos)?;
            if pos.last().is_some_and(|&p| p as usize >= n) {
                return None;
            }
            let cos: Vec<u64> = ascending_ints(cos)?;
            if cos.is_empty() || !cos.iter().all(|c| seen.insert(*c)) {
                return None;
            }
            groups.push((pos, cos));
        }
        Some(CoTargets { groups })
    }
}

/// An array of non-negative ints, strictly ascending, each fitting `T`.
fn ascending_ints<T: TryFrom<u64> + Ord + Copy>(v: &Value) -> Option<Vec<T>> {
    let Value::Array(items) = v else { return None };
    let out: Vec<T> = (items.iter())
        .map(|i| i.as_u64().and_then(|u| T::try_from(u).ok()))
        .collect::<Option<_>>()?;
    out.windows(2).all(|w| w[0] < w[1]).then_some(out)
}

impl HipkMetadata {
    /// Metadata with the two keys every reader knows, and no optional one.
    pub fn new(kernel_name: impl Into<String>, search_paths: Vec<String>) -> HipkMetadata {
        HipkMetadata {
            kernel_name: kernel_name.into(),
            search_paths,
            targets: None,
            device_digest: None,
            co_targets: None,
        }
    }

    /// The same with `kpack_device_sha256` set (`None`: without it).
    pub fn with_device_digest(mut self, digest: Option<String>) -> Self {
        self.device_digest = digest.as_deref().and_then(crate::provenance::parse);
        self
    }

    /// The same with `kpack_targets` set to `targets` (sorted, each once).
    pub fn with_targets<T: Into<String>>(mut self, targets: impl IntoIterator<Item = T>) -> Self {
        let mut t: Vec<String> = targets.into_iter().map(Into::into).collect();
        t.sort();
        t.dedup();
        self.targets = Some(t);
        self
    }

    /// The same with `kpack_targets` the union of the bundles' targets
    /// (each code object index and the targets its bundle holds), and
    /// `kpack_co_targets` set when the bundles do not all hold the same.
    pub fn with_bundle_targets(mut self, bundles: &[(u64, Vec<String>)]) -> Self {
        self = self.with_targets(bundles.iter().flat_map(|(_, t)| t.iter().cloned()));
        let all = self.targets.as_deref().unwrap_or_default();
        self.co_targets = CoTargets::from_bundles(all, bundles);
        self
    }

    /// The targets code object index `co`'s bundle was built for, as
    /// recorded: `kpack_co_targets`' group, else every target of
    /// `kpack_targets`; `None` when the binary records no targets.
    pub fn co_index_targets(&self, co: u64) -> Option<Vec<&str>> {
        let all = self.targets.as_deref()?;
        let Some(pos) = self.co_targets.as_ref().and_then(|c| c.positions(co)) else {
            return Some(all.iter().map(String::as_str).collect());
        };
        Some(
            pos.iter()
                .filter_map(|&p| all.get(p as usize))
                .map(String::as_str)
                .collect(),
        )
    }

    /// The same with other search paths (every other key kept).
    pub fn with_search_paths(mut self, search_paths: Vec<String>) -> Self {
        self.search_paths = search_paths;
        self
    }

    /// Encode as the reference does: keys `kpack_search_paths` then
    /// `kernel_name`; then the optional keys that are present
    /// (`kpack_targets`, `kpack_device_sha256`, `kpack_co_targets`).
    pub fn encode(&self) -> Vec<u8> {
        msgpack::to_vec(&Wire(self))
    }

    /// Decode metadata starting at `bytes[0]`. Only the first
    /// [`MAX_METADATA_SIZE`] bytes are looked at; bytes after the map are
    /// ignored (the runtime gets a pointer, not a length). See
    /// [`HipkMetadata::read`].
    pub fn decode(bytes: &[u8]) -> Result<HipkMetadata, HipkError> {
        HipkMetadata::read(bytes)
    }

    /// Decode metadata from the stream `rd`, in one pass, reading exactly
    /// the map's bytes (never one after it) and at most
    /// [`MAX_METADATA_SIZE`] bytes in all: the C API reads it through a
    /// pointer with no length. Keys may come in any order and unknown keys
    /// are ignored (the first of a repeated key counts); `kernel_name` must
    /// be a str and `kpack_search_paths` an array of at least one str. An
    /// optional key of the wrong type is ignored, as an unknown key is:
    /// what the runtime loads never depends on it.
    pub fn read(rd: impl Read) -> Result<HipkMetadata, HipkError> {
        let (value, _) = msgpack::read(rd.take(MAX_METADATA_SIZE as u64))?;
        if value.as_map().is_none() {
            return Err(HipkError::NotAMap {
                found: msgpack::type_name(&value),
            });
        }
        let targets = str_list(&value, KEY_TARGETS);
        let co_targets = match (&targets, msgpack::get(&value, KEY_CO_TARGETS)) {
            (Some(t), Some(v)) => CoTargets::decode(v, t.len()),
            _ => None,
        };
        Ok(HipkMetadata {
            kernel_name: kernel_name(&value)?,
            search_paths: search_paths(&value)?,
            targets,
            device_digest: msgpack::get(&value, KEY_DEVICE_DIGEST)
                .and_then(Value::as_str)
                .and_then(crate::provenance::parse),
            co_targets,
        })
    }
}

/// The optional field `key`, if it is an array of str.
fn str_list(map: &Value, key: &str) -> Option<Vec<String>> {
    let Value::Array(items) = msgpack::get(map, key)? else {
        return None;
    };
    items
        .iter()
        .map(|v| v.as_str().map(str::to_owned))
        .collect()
}

/// The field `key` of the metadata map `map`.
fn field<'v>(map: &'v Value, key: &'static str) -> Result<&'v Value, HipkError> {
    msgpack::get(map, key).ok_or(HipkError::MissingField { field: key })
}

fn kernel_name(map: &Value) -> Result<String, HipkError> {
    let v = field(map, KEY_KERNEL_NAME)?;
    v.as_str()
        .map(str::to_owned)
        .ok_or_else(|| HipkError::WrongType {
            field: KEY_KERNEL_NAME.into(),
            expected: "str",
            found: msgpack::type_name(v),
        })
}

fn search_paths(map: &Value) -> Result<Vec<String>, HipkError> {
    let paths = match field(map, KEY_SEARCH_PATHS)? {
        Value::Array(a) if a.is_empty() => return Err(HipkError::NoSearchPaths),
        Value::Array(a) => a,
        other => {
            return Err(HipkError::WrongType {
                field: KEY_SEARCH_PATHS.into(),
                expected: "array of str",
                found: msgpack::type_name(other),
            })
        }
    };
    paths
        .iter()
        .enumerate()
        .map(|(i, p)| {
            p.as_str()
                .map(str::to_owned)
                .ok_or_else(|| HipkError::WrongType {
                    field: format!("{KEY_SEARCH_PATHS}[{i}]"),
                    expected: "str",
                    found: msgpack::type_name(p),
                })
        })
        .collect()
}

/// The metadata as MessagePack writes it: the reference's two keys in its
/// order (search paths first), then each optional key that is present.
struct Wire<'a>(&'a HipkMetadata);

impl Serialize for Wire<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let md = self.0;
        let optional = usize::from(md.targets.is_some())
            + usize::from(md.device_digest.is_some())
            + usize::from(md.co_targets.is_some());
        let mut m = s.serialize_map(Some(2 + optional))?;
        m.serialize_entry(KEY_SEARCH_PATHS, &md.search_paths)?;
        m.serialize_entry(KEY_KERNEL_NAME, &md.kernel_name)?;
        if let Some(t) = &md.targets {
            m.serialize_entry(KEY_TARGETS, t)?;
        }
        if let Some(d) = &md.device_digest {
            m.serialize_entry(KEY_DEVICE_DIGEST, d)?;
        }
        if let Some(c) = &md.co_targets {
            m.serialize_entry(KEY_CO_TARGETS, &c.groups)?;
        }
        m.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn sample() -> HipkMetadata {
        HipkMetadata::new("bin/x", vec!["a".into(), "/abs/b_@GFXARCH@.kpack".into()])
    }

    /// Python: msgpack.packb({"kpack_search_paths": ["a", "/abs/b_@GFXARCH@.kpack"],
    /// "kernel_name": "bin/x"}, use_bin_type=True)
    const SAMPLE_PY: &str =
        "82b26b7061636b5f7365617263685f706174687392a161b62f6162732f625f404746584152434840\
                             2e6b7061636bab6b65726e656c5f6e616d65a562696e2f78";

    #[test]
    fn encode_matches_python() {
        assert_eq!(sample().encode(), unhex(SAMPLE_PY));
        let one = HipkMetadata::new(
            "lib/librocblas.so",
            vec!["../.kpack/blas_@GFXARCH@.kpack".into()],
        );
        assert_eq!(
            one.encode(),
            unhex(
                "82b26b7061636b5f7365617263685f706174687391be2e2e2f2e6b7061636b2f626c61735f4047\
                 465841524348402e6b7061636bab6b65726e656c5f6e616d65b16c69622f6c6962726f63626c61732e736f"
            )
        );
    }

    /// Python: msgpack.packb({"kpack_search_paths": [...], "kernel_name":
    /// "bin/x", "kpack_targets": ["gfx1100", "gfx90a:xnack-"]},
    /// use_bin_type=True): the reference's two keys first, as it writes
    /// them, then the optional key.
    const SAMPLE_TARGETS_PY: &str =
        "83b26b7061636b5f7365617263685f706174687392a161b62f6162732f625f40474658415243484\
         02e6b7061636bab6b65726e656c5f6e616d65a562696e2f78ad6b7061636b5f7461726765747392a7\
         67667831313030ad6766783930613a786e61636b2d";

    #[test]
    fn targets_key_encodes_after_the_reference_keys() {
        let m = sample().with_targets(["gfx90a:xnack-", "gfx1100", "gfx1100"]);
        assert_eq!(
            m.targets.as_deref(),
            Some(&["gfx1100".to_string(), "gfx90a:xnack-".into()][..])
        );
        let b = m.encode();
        assert_eq!(b, unhex(SAMPLE_TARGETS_PY));
        // The reference's bytes are a prefix, but for the map's size.
        assert_eq!(b[1..unhex(SAMPLE_PY).len()], unhex(SAMPLE_PY)[1..]);
        assert_eq!(HipkMetadata::decode(&b).unwrap(), m);
        // Without the key, as before.
        assert_eq!(
            HipkMetadata::decode(&unhex(SAMPLE_PY)).unwrap().targets,
            None
        );
        let none: [&str; 0] = [];
        let empty = sample().with_targets(none);
        assert_eq!(HipkMetadata::decode(&empty.encode()).unwrap(), empty);
    }

    #[test]
    fn device_digest_key_encodes_last_and_reads_back() {
        let d = crate::provenance::code_object_digest(b"abc");
        let m = sample()
            .with_targets(["gfx942"])
            .with_device_digest(Some(d.clone()));
        let b = m.encode();
        assert_eq!(b[0], 0x84);
        // The reference's two keys first, as they are written without it.
        assert_eq!(b[1..unhex(SAMPLE_PY).len()], unhex(SAMPLE_PY)[1..]);
        let back = HipkMetadata::decode(&b).unwrap();
        assert_eq!(back.device_digest.as_deref(), Some(d.as_str()));
        assert_eq!(back, m);
        // Kept when the search paths change (`kpack bundle`).
        let moved = back.with_search_paths(vec!["elsewhere".into()]);
        assert_eq!(moved.device_digest.as_deref(), Some(d.as_str()));
        // A malformed value is ignored.
        let v = msgpack::str_map([
            ("kernel_name", Value::from("k")),
            ("kpack_search_paths", Value::Array(vec!["p".into()])),
            (KEY_DEVICE_DIGEST, Value::from("xyz")),
        ]);
        let m = HipkMetadata::decode(&msgpack::encode(&v)).unwrap();
        assert_eq!(m.device_digest, None);
    }

    #[test]
    fn a_malformed_targets_key_is_ignored() {
        for bad in [
            Value::from(3i64),
            Value::from("gfx942"),
            Value::Array(vec!["gfx942".into(), Value::from(1i64)]),
        ] {
            let v = msgpack::str_map([
                ("kernel_name", Value::from("k")),
                ("kpack_search_paths", Value::Array(vec!["p".into()])),
                (KEY_TARGETS, bad),
            ]);
            let m = HipkMetadata::decode(&msgpack::encode(&v)).unwrap();
            assert_eq!(m, HipkMetadata::new("k", vec!["p".into()]));
        }
    }

    fn bundles(sets: &[&[&str]]) -> Vec<(u64, Vec<String>)> {
        (sets.iter().enumerate())
            .map(|(i, t)| (i as u64, t.iter().map(|s| s.to_string()).collect()))
            .collect()
    }

    #[test]
    fn co_targets_only_when_the_bundles_differ() {
        let same = sample().with_bundle_targets(&bundles(&[&["gfx942", "gfx90a"] as &[&str]; 3]));
        assert_eq!(same.co_targets, None);
        // Byte for byte what with_targets writes.
        assert_eq!(
            same.encode(),
            sample().with_targets(["gfx90a", "gfx942"]).encode()
        );
        assert_eq!(same.co_index_targets(2), Some(vec!["gfx90a", "gfx942"]));
        let mixed = sample().with_bundle_targets(&bundles(&[
            &["gfx942", "gfx90a"],
            &["gfx942"],
            &["gfx90a", "gfx942"],
            &["gfx942"],
            &[],
        ]));
        let c = mixed.co_targets.clone().unwrap();
        // kpack_targets = [gfx90a, gfx942]: #1 and #3 hold position 1, #4 none.
        assert_eq!(c.groups, vec![(vec![], vec![4]), (vec![1], vec![1, 3])]);
        assert_eq!(mixed.co_index_targets(3), Some(vec!["gfx942"]));
        assert_eq!(mixed.co_index_targets(4), Some(vec![]));
        assert_eq!(mixed.co_index_targets(0), Some(vec!["gfx90a", "gfx942"]));
        let b = mixed.encode();
        assert_eq!(HipkMetadata::decode(&b).unwrap(), mixed);
        // The reference's two keys first; the new key last.
        assert_eq!(b[1..unhex(SAMPLE_PY).len()], unhex(SAMPLE_PY)[1..]);
        let v = msgpack::decode(&b).unwrap();
        assert_eq!(
            msgpack::encode(msgpack::get(&v, KEY_CO_TARGETS).unwrap()),
            // [[[], [4]], [[1], [1, 3]]]
            vec![0x92, 0x92, 0x90, 0x91, 4, 0x92, 0x91, 1, 0x92, 1, 3]
        );
        // Without recorded targets nothing is known.
        assert_eq!(sample().co_index_targets(0), None);
    }

    #[test]
    fn a_malformed_co_targets_key_is_ignored() {
        let arr = Value::Array;
        let ints = |v: &[i64]| arr(v.iter().map(|&i| Value::from(i)).collect());
        let group = |p: &[i64], c: &[i64]| arr(vec![ints(p), ints(c)]);
        let with = |targets: Option<Value>, co: Value| {
            let mut entries = vec![
                ("kernel_name", Value::from("k")),
                ("kpack_search_paths", arr(vec!["p".into()])),
                (KEY_CO_TARGETS, co),
            ];
            if let Some(t) = targets {
                entries.push((KEY_TARGETS, t));
            }
            HipkMetadata::decode(&msgpack::encode(&msgpack::str_map(entries))).unwrap()
        };
        let two = || Some(arr(vec!["gfx1100".into(), "gfx90a".into()]));
        assert_eq!(
            with(two(), arr(vec![group(&[0], &[1, 5])])).co_index_targets(5),
            Some(vec!["gfx1100"])
        );
        for bad in [
            Value::from(3i64),
            arr(vec![ints(&[0])]),
            arr(vec![group(&[2], &[1])]),
            arr(vec![group(&[1, 0], &[1])]),
            arr(vec![group(&[0], &[3, 1])]),
            arr(vec![group(&[0], &[])]),
            arr(vec![group(&[0], &[1]), group(&[1], &[1])]),
            arr(vec![group(&[-1], &[1])]),
            arr(vec![arr(vec![ints(&[0]), ints(&[1]), ints(&[2])])]),
        ] {
            assert_eq!(with(two(), bad.clone()).co_targets, None, "{bad:?}");
        }
        // Without kpack_targets the key means nothing.
        assert_eq!(with(None, arr(vec![group(&[0], &[1])])).co_targets, None);
    }

    #[test]
    fn decode_roundtrip_with_trailing_bytes() {
        let mut b = unhex(SAMPLE_PY);
        assert_eq!(HipkMetadata::decode(&b).unwrap(), sample());
        b.extend_from_slice(&[0xde, 0xad, 0, 0, 0]);
        assert_eq!(HipkMetadata::decode(&b).unwrap(), sample());
    }

    #[test]
    fn decode_any_order_and_unknown_keys() {
        let v = msgpack::str_map([
            ("extra", Value::from(7i64)),
            ("kernel_name", "k".into()),
            ("kpack_search_paths", Value::Array(vec!["p".into()])),
        ]);
        let m = HipkMetadata::decode(&msgpack::encode(&v)).unwrap();
        assert_eq!(m, HipkMetadata::new("k", vec!["p".into()]));
    }

    #[test]
    fn decode_errors() {
        let enc = |v: Value| msgpack::encode(&v);
        assert!(matches!(
            HipkMetadata::decode(&[]),
            Err(HipkError::Msgpack(_))
        ));
        assert_eq!(
            HipkMetadata::decode(&enc(Value::Array(vec![]))),
            Err(HipkError::NotAMap { found: "array" })
        );
        assert_eq!(
            HipkMetadata::decode(&enc(msgpack::str_map([(
                "kpack_search_paths",
                Value::Array(vec!["p".into()])
            )]))),
            Err(HipkError::MissingField {
                field: "kernel_name"
            })
        );
        assert_eq!(
            HipkMetadata::decode(&enc(msgpack::str_map([("kernel_name", Value::from("k"))]))),
            Err(HipkError::MissingField {
                field: "kpack_search_paths"
            })
        );
        assert!(matches!(
            HipkMetadata::decode(&enc(msgpack::str_map([
                ("kernel_name", Value::Binary(b"k".to_vec())),
                ("kpack_search_paths", Value::Array(vec!["p".into()])),
            ]))),
            Err(HipkError::WrongType { found: "bin", .. })
        ));
        assert_eq!(
            HipkMetadata::decode(&enc(msgpack::str_map([
                ("kernel_name", Value::from("k")),
                ("kpack_search_paths", Value::Array(vec![])),
            ]))),
            Err(HipkError::NoSearchPaths)
        );
        assert_eq!(
            HipkMetadata::decode(&enc(msgpack::str_map([
                ("kernel_name", Value::from("k")),
                (
                    "kpack_search_paths",
                    Value::Array(vec!["p".into(), Value::from(3i64)])
                ),
            ]))),
            Err(HipkError::WrongType {
                field: "kpack_search_paths[1]".into(),
                expected: "str",
                found: "int"
            })
        );
        assert!(matches!(
            HipkMetadata::decode(&enc(msgpack::str_map([
                ("kernel_name", Value::from("k")),
                ("kpack_search_paths", Value::from("p")),
            ]))),
            Err(HipkError::WrongType { found: "str", .. })
        ));
    }

    #[test]
    fn reads_at_most_64k() {
        let big = HipkMetadata::new("k".repeat(MAX_METADATA_SIZE), vec!["p".into()]);
        let b = big.encode();
        assert!(matches!(
            HipkMetadata::decode(&b),
            Err(HipkError::Msgpack(DecodeError::Truncated { .. }))
        ));
        let fits = HipkMetadata::new("k".repeat(60_000), vec!["p".into()]);
        assert_eq!(HipkMetadata::decode(&fits.encode()).unwrap(), fits);
    }

    fn record(magic: u32, pointer: u64) -> [u8; WRAPPER_SIZE] {
        Wrapper {
            magic,
            version: WRAPPER_VERSION,
            binary: pointer,
            reserved1: 0,
        }
        .to_bytes()
    }

    #[test]
    fn records_by_layout() {
        // Plain: a 24-byte stride (pointers zero in the file: RELA).
        let plain: Vec<u8> = (0..3).flat_map(|_| record(HIPF_MAGIC, 0)).collect();
        assert_eq!(record_offsets(&plain).unwrap(), vec![0, 24, 48]);
        // ASan: 64-byte slots, three of them (192 = 8 × 24 bytes).
        let mut asan = vec![0u8; 192];
        for i in 0..3 {
            asan[i * 64..i * 64 + 24].copy_from_slice(&record(HIPF_MAGIC, 0));
        }
        assert_eq!(record_offsets(&asan).unwrap(), vec![0, 64, 128]);
        // Mixed: a plain record, an 8-byte gap, two padded slots.
        let mut mixed = vec![0u8; 160];
        for at in [0, 32, 96] {
            mixed[at..at + 24].copy_from_slice(&record(HIPF_MAGIC, 0));
        }
        assert_eq!(record_offsets(&mixed).unwrap(), vec![0, 32, 96]);
        // A record with a wrong magic is a record, not padding.
        mixed[32..36].copy_from_slice(b"XXXX");
        assert_eq!(record_offsets(&mixed).unwrap(), vec![0, 32, 96]);
        // A zeroed magic and version with a pointer in the file (ET_EXEC):
        // the pointer is taken for the start of a record, whose "magic"
        // the caller refuses.
        mixed[32..40].fill(0);
        mixed[40..48].copy_from_slice(&0x1234u64.to_le_bytes());
        assert_eq!(record_offsets(&mixed).unwrap(), vec![0, 40, 96]);
        assert_eq!(record_offsets(&[]).unwrap(), Vec::<usize>::new());
    }

    #[test]
    fn bad_tables() {
        assert_eq!(
            record_offsets(&[0u8; 20]),
            Err(TableError::Unaligned { size: 20 })
        );
        assert_eq!(
            record_offsets(&[0u8; 64]),
            Err(TableError::Empty { size: 64 })
        );
        let mut t = vec![0u8; 40];
        t[24..32].copy_from_slice(&record(HIPF_MAGIC, 0)[..8]);
        assert_eq!(
            record_offsets(&t),
            Err(TableError::Truncated { at: 24, size: 40 })
        );
    }

    #[test]
    fn wrapper_roundtrip() {
        let w = Wrapper {
            magic: HIPK_MAGIC,
            version: WRAPPER_VERSION,
            binary: 0x1122_3344_5566_7788,
            reserved1: 3,
        };
        let b = w.to_bytes();
        assert_eq!(&b[0..4], b"HIPK");
        assert_eq!(&b[8..16], &[0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11]);
        assert_eq!(Wrapper::parse(&b), w);
        assert!(w.is_hipk() && !w.is_hipf());
        let mut f = [0u8; WRAPPER_SIZE];
        f[..8].copy_from_slice(&[b'F', b'P', b'I', b'H', 1, 0, 0, 0]);
        let w = Wrapper::parse(&f);
        assert!(w.is_hipf());
        assert_eq!(w.version, 1);
    }
}
