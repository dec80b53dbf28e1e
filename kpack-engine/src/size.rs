//! `kpack size` and `kpack diff`: where the bytes of a package go.
//!
//! A path is a fat binary, an offloaded binary, a `.kpack` archive, a tree
//! (artifact tree, install tree: every regular file below it) or a wheel
//! (`.whl`, read through `zip`). Every file is classified by
//! [`kpack_host::binary::classify`] and read by kpack's own parsers (bundles,
//! archives, HIPK metadata); the report gives host bytes and device bytes,
//! per target and per binary, stored (compressed, as shipped) and
//! uncompressed, and the code objects archives share (stored once for
//! several binaries).
//!
//! Device bytes of an offloaded binary live in archives: an archive entry
//! `<kernel name>#N` counts for the binary of that kernel name in the same
//! tree (or, for an offloaded binary given alone, in the archives its
//! search paths find). The stored bytes of a compressed bundle are shared
//! out among its code objects by their uncompressed sizes.
//!
//! [`diff`] compares two reports of the same kind: targets, binaries and
//! code objects added, removed, grown or shrunk, with totals.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::archive::Archive;
use crate::hipk::HipkMetadata;
use crate::input::map_file;
use kpack_bundle::{list_fatbin, BundleInfo};
use kpack_host::binary::{classify_parsed, Class, HostBinary};
use kpack_host::{Error, Result, WithPath};

/// What a path is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    FatBinary,
    OffloadedBinary,
    Archive,
    Tree,
    Wheel,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::FatBinary => "fat binary",
            Kind::OffloadedBinary => "offloaded binary",
            Kind::Archive => "archive",
            Kind::Tree => "tree",
            Kind::Wheel => "wheel",
        }
    }
}

/// Bytes of one target (in a binary, an archive or a whole root).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TargetBytes {
    pub code_objects: usize,
    /// As stored: in bundles (a compressed bundle's bytes shared out) or in
    /// archives (zstd frames, each counted once).
    pub stored: u64,
    pub uncompressed: u64,
    /// Archive entries sharing an identical code object's bytes.
    pub shared: usize,
    /// Uncompressed bytes those entries did not store again.
    pub bytes_saved: u64,
}

impl TargetBytes {
    fn add(&mut self, o: &TargetBytes) {
        self.code_objects += o.code_objects;
        self.stored += o.stored;
        self.uncompressed += o.uncompressed;
        self.shared += o.shared;
        self.bytes_saved += o.bytes_saved;
    }
}

/// One binary: a host file (fat, offloaded or without device code), or a
/// kernel name found only in archives.
#[derive(Debug, Clone, Serialize)]
pub struct BinaryBytes {
    /// Its path in the root, or the kernel name (archives only).
    pub name: String,
    /// `fat`, `offloaded`, `host` (no device code) or `archived` (only in
    /// archives).
    pub kind: &'static str,
    /// Kernel name of an offloaded binary.
    pub kernel_name: Option<String>,
    /// Bytes of the file (0 for `archived`).
    pub file_bytes: u64,
    /// Host bytes: the file less its device bytes.
    pub host_bytes: u64,
    /// Device bytes in the file (`.hip_fatbin`, padding and bundle headers
    /// included).
    pub device_bytes_in_file: u64,
    pub targets: BTreeMap<String, TargetBytes>,
}

/// One archive.
#[derive(Debug, Clone, Serialize)]
pub struct ArchiveBytes {
    pub path: String,
    pub targets: Vec<String>,
    pub file_bytes: u64,
    /// Header, frame count and TOC.
    pub overhead: u64,
    pub code_objects: usize,
    pub stored: u64,
    pub uncompressed: u64,
    pub shared: usize,
    pub bytes_saved: u64,
}

/// One code object (for `diff`): its binary, `#N` key suffix and target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CodeObjectBytes {
    pub binary: String,
    pub index: String,
    pub target: String,
    pub stored: u64,
    pub uncompressed: u64,
}

/// The report for one path.
#[derive(Debug, Clone, Serialize)]
pub struct Root {
    pub path: String,
    pub kind: Kind,
    /// Bytes on disk (a tree: its regular files).
    pub bytes: u64,
    /// Wheels: the uncompressed size of their entries.
    pub unpacked_bytes: Option<u64>,
    pub files: usize,
    pub host_bytes: u64,
    /// Stored device bytes: code objects in bundles and archives.
    pub device_bytes: u64,
    /// Bundle headers and padding, archive headers and TOCs.
    pub overhead_bytes: u64,
    /// Files that are neither binaries nor archives (databases, data).
    pub other_bytes: u64,
    pub targets: BTreeMap<String, TargetBytes>,
    pub binaries: Vec<BinaryBytes>,
    pub archives: Vec<ArchiveBytes>,
    #[serde(skip)]
    pub code_objects: Vec<CodeObjectBytes>,
}

/// What `kpack size` reports.
#[derive(Debug, Clone, Serialize)]
pub struct SizeReport {
    pub roots: Vec<Root>,
}

/// The report for each of `paths`.
pub fn size(paths: &[PathBuf]) -> Result<SizeReport> {
    let roots = paths.iter().map(|p| root(p)).collect::<Result<_>>()?;
    Ok(SizeReport { roots })
}

/// The report for one path.
pub fn root(path: &Path) -> Result<Root> {
    let mut c = Collector::default();
    let meta = std::fs::metadata(path).with_path(path)?;
    let kind = if meta.is_dir() {
        for (rel, file) in walk(path)? {
            let mapped = map_file(&file)?;
            c.file(&rel, &mapped, &|| {
                kpack_loader::open_archive(&file).map_err(Into::into)
            })?;
        }
        Kind::Tree
    } else if is_wheel(path)? {
        c.unpacked = Some(wheel(path, &mut c)?);
        Kind::Wheel
    } else {
        let mapped = map_file(path)?;
        let name = path.display().to_string();
        let kind = c.file(&name, &mapped, &|| {
            kpack_loader::open_archive(path).map_err(Into::into)
        })?;
        let Some(kind) = kind else {
            return Err(Error::request(
                path,
                "not a fat or offloaded binary, archive, tree or wheel",
            ));
        };
        if kind == Kind::OffloadedBinary {
            c.archives_of_offloaded(path, &mapped)?;
        }
        kind
    };
    Ok(c.finish(path, kind, meta.len()))
}

/// Regular files below `dir` (symlinks not followed), sorted by relative
/// path (with `/`).
fn walk(dir: &Path) -> Result<Vec<(String, PathBuf)>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).with_path(&d)? {
            let e = e.with_path(&d)?;
            let t = e.file_type().with_path(e.path())?;
            if t.is_dir() {
                stack.push(e.path());
            } else if t.is_file() {
                let rel = e.path().strip_prefix(dir).expect("below dir").to_path_buf();
                let rel: Vec<String> = rel
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                out.push((rel.join("/"), e.path()));
            }
        }
    }
    out.sort();
    Ok(out)
}

fn is_wheel(path: &Path) -> Result<bool> {
    let mut head = [0u8; 4];
    let n = std::fs::File::open(path)
        .and_then(|mut f| f.read(&mut head))
        .with_path(path)?;
    Ok(n == 4 && &head == b"PK\x03\x04")
}

/// Every file entry of the wheel at `path`, sorted by name; returns the
/// entries' uncompressed size.
fn wheel(path: &Path, c: &mut Collector) -> Result<u64> {
    let bad =
        |e: zip::result::ZipError| Error::request(path, format!("not a readable wheel (zip): {e}"));
    let file = std::fs::File::open(path).with_path(path)?;
    let mut z = zip::ZipArchive::new(file).map_err(bad)?;
    let mut names: Vec<String> = z
        .file_names()
        .map(|n| n.map(|n| n.into_owned()))
        .collect::<std::result::Result<_, _>>()
        .map_err(bad)?;
    names.sort();
    let mut unpacked = 0;
    for name in names {
        let mut entry = z.by_name(&name).map_err(bad)?;
        if !entry.is_file() {
            continue;
        }
        unpacked += entry.size();
        let mut bytes = Vec::with_capacity(entry.size().min(1 << 30) as usize);
        entry.read_to_end(&mut bytes).with_path(path)?;
        let open = || {
            Archive::from_bytes(bytes.clone()).map_err(|source| Error::Archive {
                path: path.join(&name),
                source,
            })
        };
        c.file(&name, &bytes, &open)?;
    }
    Ok(unpacked)
}

/// What is being added up.
#[derive(Default)]
struct Collector {
    files: usize,
    bytes: u64,
    other: u64,
    overhead: u64,
    unpacked: Option<u64>,
    binaries: Vec<BinaryBytes>,
    archives: Vec<ArchiveBytes>,
    /// (kernel name, index, target, stored, uncompressed, shared, saved).
    archived: Vec<(String, CodeObjectBytes, bool)>,
    code_objects: Vec<CodeObjectBytes>,
}

impl Collector {
    /// Add one file; its kind when it is a binary or an archive.
    fn file(
        &mut self,
        name: &str,
        bytes: &[u8],
        open: &dyn Fn() -> Result<Archive>,
    ) -> Result<Option<Kind>> {
        self.files += 1;
        self.bytes += bytes.len() as u64;
        let path = Path::new(name);
        let file = classify_parsed(bytes);
        Ok(match file.class {
            Class::Fat => {
                self.fat(name, bytes, file.binary.ok()).with_path(path)?;
                Some(Kind::FatBinary)
            }
            Class::Offloaded => {
                let meta = file
                    .binary
                    .ok()
                    .and_then(|b| b.metadata().ok().flatten())
                    .and_then(|m| HipkMetadata::decode(m.data).ok());
                self.binaries
                    .push(host_binary(name, "offloaded", bytes.len() as u64, meta));
                Some(Kind::OffloadedBinary)
            }
            Class::Archive => {
                self.archive(name, &open()?).with_path(path)?;
                Some(Kind::Archive)
            }
            c if c.is_host_code() => {
                self.binaries
                    .push(host_binary(name, "host", bytes.len() as u64, None));
                None
            }
            _ => {
                self.other += bytes.len() as u64;
                None
            }
        })
    }

    /// A fat binary: its bundles' code objects, per target.
    fn fat(
        &mut self,
        name: &str,
        bytes: &[u8],
        bin: Option<HostBinary>,
    ) -> std::result::Result<(), kpack_bundle::BundleError> {
        let section = bin
            .and_then(|b| b.fatbin().ok().flatten())
            .map(|s| s.data)
            .unwrap_or_default();
        let bundles = list_fatbin(section)?;
        let mut b = host_binary(name, "fat", bytes.len() as u64, None);
        b.device_bytes_in_file = section.len() as u64;
        b.host_bytes = (bytes.len() - section.len()) as u64;
        let mut stored_total = 0;
        for group in bundles.chunk_by(|x, y| x.range == y.range) {
            for co in bundle_code_objects(name, group) {
                stored_total += co.stored;
                let t = b.targets.entry(co.target.clone()).or_default();
                t.code_objects += 1;
                t.stored += co.stored;
                t.uncompressed += co.uncompressed;
                self.code_objects.push(co);
            }
        }
        self.overhead += section.len() as u64 - stored_total;
        self.binaries.push(b);
        Ok(())
    }

    /// An archive: its entries, each ordinal's stored bytes counted once
    /// (for the first entry that has it).
    fn archive(
        &mut self,
        name: &str,
        a: &Archive,
    ) -> std::result::Result<(), crate::archive::ArchiveError> {
        let mut info = ArchiveBytes {
            path: name.to_string(),
            targets: a.gfx_arches().to_vec(),
            file_bytes: a.file_size(),
            overhead: 0,
            code_objects: 0,
            stored: 0,
            uncompressed: 0,
            shared: 0,
            bytes_saved: 0,
        };
        let mut seen = std::collections::HashSet::new();
        for (key, target, e) in a.entries_by_ordinal() {
            let first = seen.insert(e.ordinal);
            let stored = if first { a.stored_size(e)? } else { 0 };
            info.code_objects += 1;
            info.stored += stored;
            info.uncompressed += e.original_size;
            if !first {
                info.shared += 1;
                info.bytes_saved += e.original_size;
            }
            let (binary, index) = key.rsplit_once('#').unwrap_or((key, ""));
            let co = CodeObjectBytes {
                binary: binary.to_string(),
                index: index.to_string(),
                target: target.to_string(),
                stored,
                uncompressed: e.original_size,
            };
            self.archived.push((binary.to_string(), co, !first));
        }
        info.overhead = info.file_bytes - info.stored;
        self.overhead += info.overhead;
        self.archives.push(info);
        Ok(())
    }

    /// The archives an offloaded binary given alone names (found as the
    /// loader finds them), counted for it.
    fn archives_of_offloaded(&mut self, path: &Path, bytes: &[u8]) -> Result<()> {
        let Some(kernel_name) = self.binaries.last().and_then(|b| b.kernel_name.clone()) else {
            return Ok(());
        };
        let metadata = HostBinary::parse(bytes)
            .ok()
            .and_then(|b| b.metadata().ok().flatten())
            .and_then(|m| HipkMetadata::decode(m.data).ok());
        let Some(metadata) = metadata else {
            return Ok(());
        };
        let binary_path = std::fs::canonicalize(path).with_path(path)?;
        let loader = crate::loader::Loader::from_env();
        for (archive, _) in loader.available_archives(&metadata, &binary_path) {
            let a = kpack_loader::open_archive(&archive)?;
            let before = self.archived.len();
            self.archive(&archive.display().to_string(), &a)
                .with_path(&archive)?;
            // Only this binary's entries count.
            let mut i = before;
            while i < self.archived.len() {
                if self.archived[i].0 == kernel_name {
                    i += 1;
                } else {
                    self.archived.remove(i);
                }
            }
        }
        Ok(())
    }

    /// Attribute archive entries to binaries, add everything up.
    fn finish(mut self, path: &Path, kind: Kind, disk: u64) -> Root {
        for (binary, co, shared) in std::mem::take(&mut self.archived) {
            let i = match self.binaries.iter().position(|b| {
                b.kernel_name.as_deref() == Some(&binary)
                    || (b.kind == "archived" && b.name == binary)
            }) {
                Some(i) => i,
                None => {
                    let mut b = host_binary(&binary, "archived", 0, None);
                    b.host_bytes = 0;
                    self.binaries.push(b);
                    self.binaries.len() - 1
                }
            };
            let t = self.binaries[i]
                .targets
                .entry(co.target.clone())
                .or_default();
            t.code_objects += 1;
            t.stored += co.stored;
            t.uncompressed += co.uncompressed;
            if shared {
                t.shared += 1;
                t.bytes_saved += co.uncompressed;
            }
            self.code_objects.push(co);
        }
        let mut targets: BTreeMap<String, TargetBytes> = BTreeMap::new();
        for b in &self.binaries {
            for (t, v) in &b.targets {
                targets.entry(t.clone()).or_default().add(v);
            }
        }
        let device_bytes = targets.values().map(|t| t.stored).sum();
        let host_bytes = self.binaries.iter().map(|b| b.host_bytes).sum();
        let bytes = match kind {
            Kind::Tree => self.bytes,
            _ => disk,
        };
        Root {
            path: path.display().to_string(),
            kind,
            bytes,
            unpacked_bytes: self.unpacked,
            files: self.files,
            host_bytes,
            device_bytes,
            overhead_bytes: self.overhead,
            other_bytes: self.other,
            targets,
            binaries: self.binaries,
            archives: self.archives,
            code_objects: self.code_objects,
        }
    }
}

fn host_binary(
    name: &str,
    kind: &'static str,
    size: u64,
    meta: Option<HipkMetadata>,
) -> BinaryBytes {
    BinaryBytes {
        name: name.to_string(),
        kind,
        kernel_name: meta.map(|m| m.kernel_name),
        file_bytes: size,
        host_bytes: size,
        device_bytes_in_file: 0,
        targets: BTreeMap::new(),
    }
}

/// The code objects of one stored bundle (the inner bundles of a
/// compressed one together): uncompressed sizes, and the stored bytes (a
/// compressed bundle's shared out by uncompressed size).
fn bundle_code_objects(binary: &str, group: &[BundleInfo]) -> Vec<CodeObjectBytes> {
    let mut out: Vec<CodeObjectBytes> = group
        .iter()
        .flat_map(|b| {
            b.device_entries().map(move |e| CodeObjectBytes {
                binary: binary.to_string(),
                index: b.index.to_string(),
                target: e.target().to_string(),
                stored: e.size,
                uncompressed: e.size,
            })
        })
        .collect();
    if let Some((ccob, _)) = &group[0].compressed {
        let total: u64 = out.iter().map(|c| c.uncompressed).sum();
        let mut left = ccob.stored_size;
        let n = out.len();
        for (i, c) in out.iter_mut().enumerate() {
            c.stored = if i + 1 == n {
                left
            } else {
                (ccob.stored_size as u128 * c.uncompressed as u128 / total.max(1) as u128) as u64
            };
            left -= c.stored;
        }
    }
    out
}

/// How one thing changed between A and B.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    Added,
    Removed,
    Grown,
    Shrunk,
    Same,
}

fn change(a: Option<(u64, u64)>, b: Option<(u64, u64)>) -> Change {
    match (a, b) {
        (None, Some(_)) => Change::Added,
        (Some(_), None) => Change::Removed,
        (Some(x), Some(y)) if (y.1, y.0) > (x.1, x.0) => Change::Grown,
        (Some(x), Some(y)) if (y.1, y.0) < (x.1, x.0) => Change::Shrunk,
        _ => Change::Same,
    }
}

/// One compared item: stored and uncompressed bytes in A and B.
#[derive(Debug, Clone, Serialize)]
pub struct Compared {
    pub name: String,
    pub change: Change,
    pub stored_a: u64,
    pub stored_b: u64,
    pub uncompressed_a: u64,
    pub uncompressed_b: u64,
}

/// What `kpack diff` reports.
#[derive(Debug, Clone, Serialize)]
pub struct Diff {
    pub a: String,
    pub b: String,
    pub kind: Kind,
    pub bytes_a: u64,
    pub bytes_b: u64,
    pub host_bytes_a: u64,
    pub host_bytes_b: u64,
    pub device_bytes_a: u64,
    pub device_bytes_b: u64,
    /// Every target of either side.
    pub targets: Vec<Compared>,
    /// Binaries that changed (by host and device bytes).
    pub binaries: Vec<Compared>,
    /// Code objects (`binary#N @ target`) that changed.
    pub code_objects: Vec<Compared>,
}

/// Compare two paths of the same kind.
pub fn diff(a: &Path, b: &Path) -> Result<Diff> {
    let (ra, rb) = (root(a)?, root(b)?);
    if ra.kind != rb.kind {
        return Err(Error::request(
            b,
            format!(
                "is a {}, {} is a {}: diff compares two of the same kind",
                rb.kind.name(),
                a.display(),
                ra.kind.name()
            ),
        ));
    }
    let pair = |t: &TargetBytes| (t.stored, t.uncompressed);
    let targets = compare(
        ra.targets
            .iter()
            .map(|(k, v)| (k.clone(), pair(v)))
            .collect(),
        rb.targets
            .iter()
            .map(|(k, v)| (k.clone(), pair(v)))
            .collect(),
        true,
    );
    let binary = |r: &Root| -> BTreeMap<String, (u64, u64)> {
        r.binaries
            .iter()
            .map(|x| {
                let dev: u64 = x.targets.values().map(|t| t.stored).sum();
                (x.name.clone(), (x.host_bytes + dev, x.host_bytes + dev))
            })
            .collect()
    };
    let cos = |r: &Root| -> BTreeMap<String, (u64, u64)> {
        r.code_objects
            .iter()
            .map(|c| {
                (
                    format!("{}#{} @ {}", c.binary, c.index, c.target),
                    (c.stored, c.uncompressed),
                )
            })
            .collect()
    };
    Ok(Diff {
        a: ra.path.clone(),
        b: rb.path.clone(),
        kind: ra.kind,
        bytes_a: ra.bytes,
        bytes_b: rb.bytes,
        host_bytes_a: ra.host_bytes,
        host_bytes_b: rb.host_bytes,
        device_bytes_a: ra.device_bytes,
        device_bytes_b: rb.device_bytes,
        targets,
        binaries: compare(binary(&ra), binary(&rb), false),
        code_objects: compare(cos(&ra), cos(&rb), false),
    })
}

/// Items of A and B by name; with `all`, unchanged ones too.
fn compare(
    a: BTreeMap<String, (u64, u64)>,
    b: BTreeMap<String, (u64, u64)>,
    all: bool,
) -> Vec<Compared> {
    let mut names: Vec<&String> = a.keys().chain(b.keys()).collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .filter_map(|n| {
            let (x, y) = (a.get(n).copied(), b.get(n).copied());
            let c = change(x, y);
            (all || c != Change::Same || x.map(|v| v.0) != y.map(|v| v.0)).then(|| Compared {
                name: n.clone(),
                change: c,
                stored_a: x.map_or(0, |v| v.0),
                stored_b: y.map_or(0, |v| v.0),
                uncompressed_a: x.map_or(0, |v| v.1),
                uncompressed_b: y.map_or(0, |v| v.1),
            })
        })
        .collect()
}
