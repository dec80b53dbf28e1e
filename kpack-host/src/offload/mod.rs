//! Offloading a fat binary: its code objects go into per-target `.kpack`
//! archives and the binary is rewritten into a host-only one whose wrappers
//! point at HIPK metadata naming those archives (formats.md §3, §4).
//!
//! [`offload`] is the engine behind `kpack offload`, and behind split,
//! pack-tree and CMake's `kpack_offload_target()`: it reads the input
//! through a memory map, rewrites the binary as pieces of it
//! ([`crate::image::Image`]), streams that into a temporary file beside the
//! output and checks the file as written ([`write_checked`]), writes the
//! archives, and renames the binary into place last. ELF binaries go through
//! [`elf::transform`] and [`elf::verify::verify_elf`], PE images through [`pe`]; the
//! rest (archives, metadata, atomic output, re-runs) is the same for both.

pub mod collect;
pub mod digest;
pub mod elf;
pub mod pe;
pub mod rewritten;
pub mod section;
pub mod wrappers;

pub mod verify;

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use serde::Serialize;

use crate::archive::{Scheme, DEFAULT_ZSTD_LEVEL};
use crate::binary::{classify_parsed, Class, Classified, HostBinary};
use crate::bundle::{list_fatbin, parse_fatbin, BundleInfo};
use crate::error::{Error, Result, WithPath};
use crate::hipk::HipkMetadata;
use crate::input::{map_file, Mapped};
use crate::output::{parent_dir, write_atomically_with_mode, Pending, ScratchDir};
use crate::{ArchiveWriter, FileRange, FrameParams, KernelData};

use collect::{collect, CollectOptions, Located};

pub use elf::verify::{verify_elf, verify_fat, verify_fat_layout, VerifiedFat};
pub use elf::TransformError;
pub use pe::PeTransformError;
pub use rewritten::{Transformed, WrapperChange};
pub use verify::{Verified, VerifyError};

/// The placeholder for a target ID in search paths.
pub use crate::hipk::GFXARCH;

/// How to offload.
#[derive(Debug, Clone)]
pub struct OffloadOptions {
    /// Where the archives go.
    pub archive_dir: PathBuf,
    /// The binary's key in archive TOCs (without `#N`); default: the output
    /// file's name.
    pub kernel_name: Option<String>,
    /// Search paths written into the metadata; default: one,
    /// `<relative path from the output's directory to archive_dir>/<group>_@GFXARCH@.kpack`.
    pub search_paths: Vec<String>,
    /// Search paths written after those (e.g. the installed layout's, when
    /// it differs from the build tree's).
    pub extra_search_paths: Vec<String>,
    /// Archive name prefix; default: the output file's name up to its first
    /// `.` (`libfoo.so.1` → `libfoo`).
    pub group: Option<String>,
    pub scheme: Scheme,
    pub level: i32,
}

impl OffloadOptions {
    pub fn new(archive_dir: impl Into<PathBuf>) -> Self {
        OffloadOptions {
            archive_dir: archive_dir.into(),
            kernel_name: None,
            search_paths: Vec::new(),
            extra_search_paths: Vec::new(),
            group: None,
            scheme: Scheme::ZstdPerKernel,
            level: DEFAULT_ZSTD_LEVEL,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Device code moved to archives, host binary rewritten.
    Offloaded,
    /// The input was offloaded already: left as it is (copied if the output
    /// is another path).
    AlreadyOffloaded,
    /// A relocatable object or static archive: a link input, copied
    /// unchanged.
    LinkInput,
    /// A debug-info file (`objcopy --only-keep-debug`): no device code,
    /// copied unchanged.
    DebugOnly,
    /// A host binary without device code (no `.hip_fatbin`, or one that
    /// holds none): copied unchanged, no archive.
    HostOnly,
}

/// One archive written.
#[derive(Debug, Clone, Serialize)]
pub struct ArchiveWritten {
    pub path: PathBuf,
    pub target: String,
    pub kernels: usize,
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// Code objects stored once for several bundles (same target, same
    /// bytes): entries sharing an ordinal.
    pub shared_code_objects: usize,
    /// Uncompressed bytes those entries did not store again.
    pub bytes_saved: u64,
    /// The limits of ROCm's HRX runtime the archive exceeds
    /// ([`ArchiveWriter::hrx_limits`]); in [`OffloadSummary::warnings`] too.
    #[serde(skip)]
    pub hrx_limits: Vec<kpack_format::hrx::Exceeded>,
}

/// What [`offload`] did.
#[derive(Debug, Clone, Serialize)]
pub struct OffloadSummary {
    pub input: PathBuf,
    pub output: PathBuf,
    pub outcome: Outcome,
    pub note: Option<String>,
    /// What the user should see: the limits of other readers (ROCm's HRX
    /// runtime, [`kpack_format::hrx`]) the outputs exceed. The outputs are
    /// valid all the same.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    pub kernel_name: Option<String>,
    pub search_paths: Vec<String>,
    pub bundles: usize,
    pub wrappers: Vec<WrapperChange>,
    pub archives: Vec<ArchiveWritten>,
    pub input_size: u64,
    pub output_size: u64,
    /// Wall time of the binary's rewrite and its verification.
    pub transform_seconds: f64,
    /// Wall time of writing the archives (compression included).
    pub archive_seconds: f64,
}

/// A code object found in a fat binary, ready to archive.
#[derive(Debug, Clone)]
pub struct CodeObject<'a> {
    pub bundle: usize,
    pub triple: String,
    pub target: String,
    pub data: crate::bundle::Blob<'a>,
}

impl CodeObject<'_> {
    /// Its bytes for an archive writer: a range of `input`'s file when they
    /// are a slice of that map (read when written, not held), otherwise
    /// (decompressed) the bytes.
    pub fn source(&self, input: &Mapped) -> KernelData<'_> {
        match FileRange::of_slice(input, &self.data) {
            Some(range) => KernelData::File(range),
            None => KernelData::from(&self.data[..]),
        }
    }
}

/// The archive key of a binary's code object: `name#co_index`.
pub fn archive_key(kernel_name: &str, co_index: usize) -> String {
    format!("{kernel_name}#{co_index}")
}

/// The archive file name for a group and target.
pub fn archive_file_name(group: &str, target: &str) -> String {
    format!("{group}_{target}.kpack")
}

/// `to` relative to `from` (both absolute and normalized), with `/`.
pub fn relative_path(from: &Path, to: &Path) -> String {
    let f: Vec<Component> = from.components().collect();
    let t: Vec<Component> = to.components().collect();
    let common = f.iter().zip(&t).take_while(|(a, b)| a == b).count();
    let mut parts: Vec<String> = vec!["..".to_string(); f.len() - common];
    parts.extend(
        t[common..]
            .iter()
            .map(|c| c.as_os_str().to_string_lossy().into_owned()),
    );
    if parts.is_empty() {
        ".".into()
    } else {
        parts.join("/")
    }
}

/// An absolute, normalized form of a path whose last components may not
/// exist yet.
fn absolute(path: &Path) -> Result<PathBuf> {
    let abs = std::path::absolute(path).with_path(path)?;
    // Resolve symlinks of the longest existing ancestor, keep the rest.
    let mut existing = abs.clone();
    let mut rest = Vec::new();
    while !existing.exists() {
        match (existing.file_name(), existing.parent()) {
            (Some(n), Some(p)) => {
                rest.push(n.to_os_string());
                existing = p.to_path_buf();
            }
            _ => break,
        }
    }
    let mut out = fs::canonicalize(&existing).with_path(&existing)?;
    for n in rest.into_iter().rev() {
        out.push(n);
    }
    Ok(out)
}

fn default_group(output: &Path) -> String {
    let name = output
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    match name.split('.').next() {
        Some(stem) if !stem.is_empty() => stem.to_string(),
        _ => name,
    }
}

/// Offload `input` to `output` (which may be the same path), writing
/// archives to `opts.archive_dir`.
pub fn offload(input: &Path, output: &Path, opts: &OffloadOptions) -> Result<OffloadSummary> {
    let mapped = map_file(input)?;
    let bytes: &[u8] = &mapped;
    let mode = fs::metadata(input).with_path(input)?.permissions().mode();
    let mut summary = OffloadSummary {
        input: input.to_path_buf(),
        output: output.to_path_buf(),
        outcome: Outcome::Offloaded,
        note: None,
        warnings: Vec::new(),
        kernel_name: None,
        search_paths: Vec::new(),
        bundles: 0,
        wrappers: Vec::new(),
        archives: Vec::new(),
        input_size: bytes.len() as u64,
        output_size: bytes.len() as u64,
        transform_seconds: 0.0,
        archive_seconds: 0.0,
    };
    let file = classify_parsed(bytes);
    if let Some((outcome, note)) = pass_through(input, &file)? {
        if !same_file(input, output) {
            fs::create_dir_all(parent_dir(output)).with_path(parent_dir(output))?;
            write_atomically_with_mode(output, Some(mode), |f| f.write_all(bytes))?;
        }
        summary.outcome = outcome;
        summary.note = Some(note);
        return Ok(summary);
    }
    // A fat binary: parsed as it was classified.
    let bin = file.binary.with_path(input)?;
    let section = bin
        .fatbin()
        .with_path(input)?
        .ok_or_else(|| not_fat(input, Some(&bin)))?;
    // The bundles, from their entry tables.
    let bundles = list_fatbin(section.data).with_path(input)?;
    let compressed = bundles.iter().any(|b| b.compressed.is_some());
    let digests = digest::digests(input, &mapped, section.data)?;
    let metadata = metadata_for(output, opts)?
        .with_bundle_targets(&split_targets(&bundles, None))
        .with_device_digest(Some(digests.device.clone()));
    // The host binary, written beside the output and checked before any
    // archive is written; renamed into place last. Directories made for it
    // and the archives are removed again if anything fails.
    let clock = std::time::Instant::now();
    let t = rewrite_binary(input, &bin, &metadata)?;
    let out_dirs = NewDirs::create(parent_dir(output))?;
    // A killed run's temporary binary, if any, goes first.
    crate::output::sweep_stale(parent_dir(output));
    let mut pending = Pending::create(output, Some(mode))?;
    let source = File::open(input).with_path(input)?;
    write_rewritten(input, &t, Some(&source), pending.file())?;
    // What the rewrite read of the host part (headers, symbol and
    // relocation tables) is not needed again.
    mapped.release(0..bytes.len());
    summary.transform_seconds = clock.elapsed().as_secs_f64();
    let clock = std::time::Instant::now();
    // The archive directory holds the scratch file of decompressed code
    // objects; bad input found while they are read (a damaged compressed
    // bundle) removes what was created.
    let dirs = NewDirs::create(&opts.archive_dir)?;
    let scratch = match compressed {
        true => Some(ScratchDir::new(&opts.archive_dir)?),
        false => None,
    };
    let spill = scratch
        .as_ref()
        .map(|s| s.path().join("code-objects.bin"))
        .unwrap_or_default();
    let collected = collect(
        input,
        &mapped,
        section.data,
        &CollectOptions::new(spill, frame_params(opts)),
    )?;
    let code = by_target(collected.code_objects);
    // Archives first, then the binary that names them.
    let group = opts.group.clone().unwrap_or_else(|| default_group(output));
    summary.archives = write_archives(code, &group, &metadata.kernel_name, &digests, opts)?;
    summary.archive_seconds = clock.elapsed().as_secs_f64();
    summary.warnings = hrx_warnings(output, &metadata, &summary.archives);
    drop(scratch);
    mapped.release(0..bytes.len());
    pending.commit()?;
    dirs.keep();
    out_dirs.keep();
    summary.kernel_name = Some(metadata.kernel_name);
    summary.search_paths = metadata.search_paths;
    summary.bundles = t.bundles;
    summary.output_size = t.len();
    summary.wrappers = t.wrappers;
    Ok(summary)
}

/// The limits of ROCm's HRX runtime an offload's outputs exceed: the
/// binary's metadata (and how many archives it spreads over), then each
/// archive's, each message naming its file.
fn hrx_warnings(
    output: &Path,
    metadata: &HipkMetadata,
    archives: &[ArchiveWritten],
) -> Vec<String> {
    use kpack_format::hrx;
    let of_binary = hrx::check_metadata(metadata)
        .into_iter()
        .chain(hrx::check_archive_count(archives.len()));
    let mut v: Vec<String> = of_binary
        .map(|e| format!("{}: {e}", output.display()))
        .collect();
    for a in archives {
        v.extend(
            a.hrx_limits
                .iter()
                .map(|e| format!("{}: {e}", a.path.display())),
        );
    }
    v
}

/// What to do with an input that is not a fat binary: copy it unchanged
/// (with this outcome and note), or refuse it. `None` for a fat binary.
fn pass_through(input: &Path, file: &Classified) -> Result<Option<(Outcome, String)>> {
    let outcome = match &file.class {
        Class::Fat => return Ok(None),
        Class::StaticArchive | Class::Relocatable { .. } => Outcome::LinkInput,
        Class::Offloaded => Outcome::AlreadyOffloaded,
        Class::DebugOnly => Outcome::DebugOnly,
        Class::Inconsistent(why) => return Err(why.clone()).with_path(input),
        Class::HostOnly => Outcome::HostOnly,
        Class::CodeObject => {
            return Err(Error::request(
                input,
                "an AMDGPU code object (device code on its own), not a host binary",
            ))
        }
        Class::Bundle | Class::Archive | Class::Other => {
            return Err(match &file.binary {
                Err(e) => Error::binary(input, e.clone()),
                Ok(_) => Error::request(input, "not a host binary"),
            })
        }
    };
    // The words every command uses for such a file, else offload's own.
    let note = match (crate::binary::as_is_note(file), &file.class) {
        (Some(n), Class::Offloaded) => format!("{n}: left as it is"),
        (Some(n), _) => format!("{n}: copied unchanged"),
        (None, Class::StaticArchive) => "a link input (static archive): copied unchanged".into(),
        (None, Class::Relocatable { .. }) => {
            "a link input (relocatable object): copied unchanged".into()
        }
        (None, _) => {
            let bin = file.binary.as_ref().ok();
            let Some(why) = bin.and_then(crate::binary::no_device_code) else {
                return Err(not_fat(input, bin));
            };
            format!("no device code ({why}): copied unchanged, no archive")
        }
    };
    Ok(Some((outcome, note)))
}

/// The HIPK metadata for `output`: the kernel name (default: the output's
/// file name) and search paths (default: the archive directory relative to
/// the output's, `<group>_@GFXARCH@.kpack`), then the extra ones.
fn metadata_for(output: &Path, opts: &OffloadOptions) -> Result<HipkMetadata> {
    let kernel_name = opts.kernel_name.clone().unwrap_or_else(|| {
        output
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    });
    let mut search_paths = if opts.search_paths.is_empty() {
        let group = opts.group.clone().unwrap_or_else(|| default_group(output));
        let from = absolute(parent_dir(output))?;
        let to = absolute(&opts.archive_dir)?;
        let rel = relative_path(&from, &to);
        vec![format!("{rel}/{}", archive_file_name(&group, GFXARCH))]
    } else {
        opts.search_paths.clone()
    };
    for p in &opts.extra_search_paths {
        if !search_paths.contains(p) {
            search_paths.push(p.clone());
        }
    }
    Ok(HipkMetadata::new(kernel_name, search_paths))
}

/// The targets whose code objects an offload of a binary with these
/// bundles puts into archives (those `keep` takes; all without it), by
/// code object index (bundle index), each bundle's sorted: what its
/// metadata records as `kpack_targets` (their union) and, when they
/// differ, `kpack_co_targets` ([`HipkMetadata::with_bundle_targets`]).
pub fn split_targets(
    bundles: &[BundleInfo],
    keep: Option<&dyn Fn(&str) -> bool>,
) -> Vec<(u64, Vec<String>)> {
    bundles
        .iter()
        .map(|b| {
            let targets: std::collections::BTreeSet<&str> = b
                .device_entries()
                .map(|e| e.target())
                .filter(|t| keep.is_none_or(|k| k(t)))
                .collect();
            let targets = targets.into_iter().map(str::to_owned).collect();
            (b.index as u64, targets)
        })
        .collect()
}

/// [`split_targets`] of every bundle of a parsed binary (none when it has
/// no bundle section).
pub fn fat_targets(path: &Path, bin: &HostBinary) -> Result<Vec<(u64, Vec<String>)>> {
    let Some(section) = bin.fatbin().with_path(path)? else {
        return Ok(Vec::new());
    };
    let bundles = list_fatbin(section.data).with_path(path)?;
    Ok(split_targets(&bundles, None))
}

/// The frames the archive writers for `opts` make, if they compress.
fn frame_params(opts: &OffloadOptions) -> Option<FrameParams> {
    archive_writer("", "", opts).frames()
}

fn archive_writer(group: &str, target: &str, opts: &OffloadOptions) -> ArchiveWriter<'static> {
    ArchiveWriter::new(
        group.to_string(),
        target.to_string(),
        vec![target.to_string()],
    )
    .scheme(opts.scheme)
    .zstd_level(opts.level)
}

type ByTarget = BTreeMap<String, Vec<Located>>;

/// Code objects by target, each target's in bundle order.
fn by_target(code_objects: Vec<Located>) -> ByTarget {
    let mut by_target = ByTarget::new();
    for co in code_objects {
        by_target.entry(co.target.clone()).or_default().push(co);
    }
    by_target
}

/// Directories made for output, removed again (those still empty, deepest
/// first) unless [`NewDirs::keep`] is called: bad input found part-way
/// leaves nothing behind.
struct NewDirs {
    made: Vec<PathBuf>,
}

impl NewDirs {
    fn create(dir: &Path) -> Result<NewDirs> {
        let mut made = Vec::new();
        let mut d = Some(dir);
        while let Some(p) = d.filter(|p| !p.as_os_str().is_empty() && !p.exists()) {
            made.push(p.to_path_buf());
            d = p.parent();
        }
        fs::create_dir_all(dir).with_path(dir)?;
        Ok(NewDirs { made })
    }

    fn keep(mut self) {
        self.made.clear();
    }
}

impl Drop for NewDirs {
    fn drop(&mut self) {
        for d in &self.made {
            let _ = fs::remove_dir(d);
        }
    }
}

/// One archive per target, `<group>_<target>.kpack`, with the code objects
/// found (read from their files as they are written).
fn write_archives(
    by_target: ByTarget,
    group: &str,
    kernel_name: &str,
    digests: &digest::Digests,
    opts: &OffloadOptions,
) -> Result<Vec<ArchiveWritten>> {
    use rayon::prelude::*;
    // Archives side by side (each compresses in parallel too); the first
    // error in target order is reported.
    let by_target: Vec<(&String, &Vec<Located>)> = by_target.iter().collect();
    by_target
        .par_iter()
        .map(|(target, cos)| write_archive(target, cos, group, kernel_name, digests, opts))
        .collect::<Vec<_>>()
        .into_iter()
        .collect()
}

/// The archive of one target.
fn write_archive(
    target: &str,
    cos: &[Located],
    group: &str,
    kernel_name: &str,
    digests: &digest::Digests,
    opts: &OffloadOptions,
) -> Result<ArchiveWritten> {
    let path = opts.archive_dir.join(archive_file_name(group, target));
    let mut w = archive_writer(group, target, opts);
    for co in cos {
        let mut meta = vec![("target".to_string(), co.triple.as_str().into())];
        meta.extend(digests.entry_metadata(co.bundle, co.entry));
        w.add(
            archive_key(kernel_name, co.bundle),
            target.to_string(),
            co.data.clone(),
            Some(meta),
        )
        .map_err(|e| Error::Archive {
            path: path.clone(),
            source: e,
        })?;
    }
    let s = w.write(&path)?;
    Ok(ArchiveWritten {
        path,
        target: target.to_string(),
        kernels: s.kernels,
        bytes_in: s.bytes_in,
        bytes_out: s.bytes_out,
        shared_code_objects: s.shared,
        bytes_saved: s.bytes_saved,
        hrx_limits: w.hrx_limits(),
    })
}

/// Every device code object of a fat binary's `.hip_fatbin`, in bundle
/// order.
pub fn code_objects<'a>(path: &Path, bytes: &'a [u8]) -> Result<Vec<CodeObject<'a>>> {
    code_objects_of(path, &HostBinary::parse(bytes).with_path(path)?)
}

/// [`code_objects`] of a parsed binary.
pub fn code_objects_of<'a>(path: &Path, bin: &HostBinary<'a>) -> Result<Vec<CodeObject<'a>>> {
    let section = bin
        .fatbin()
        .with_path(path)?
        .ok_or_else(|| not_fat(path, Some(bin)))?;
    let bundles = parse_fatbin(section.data).with_path(path)?;
    let mut out = Vec::new();
    for b in &bundles {
        for e in b.device_entries() {
            out.push(CodeObject {
                bundle: b.index,
                triple: e.triple.clone(),
                target: e.target().to_string(),
                data: e.data.clone(),
            });
        }
    }
    Ok(out)
}

/// The host-only form of a fat binary (ELF or PE) with this metadata, as
/// pieces of `bytes` and new bytes. Writes nothing: [`write_rewritten`]
/// writes and checks it.
pub fn rewrite<'a>(
    path: &Path,
    bytes: &'a [u8],
    metadata: &HipkMetadata,
) -> Result<Transformed<'a>> {
    rewrite_binary(path, &HostBinary::parse(bytes).with_path(path)?, metadata)
}

/// [`rewrite`] of a parsed binary.
pub fn rewrite_binary<'a>(
    path: &Path,
    bin: &HostBinary<'a>,
    metadata: &HipkMetadata,
) -> Result<Transformed<'a>> {
    let encoded = metadata.encode();
    Ok(match *bin {
        HostBinary::Pe(pe) => pe::rewrite(pe, &encoded).with_path(path)?,
        HostBinary::Elf(elf) => {
            let request = elf::Request::Offload { metadata: &encoded };
            elf::rewrite(elf, &request).with_path(path)?
        }
    })
}

/// Write the rewritten binary `t` of `path` into `out` and check what was
/// written ([`verify_written`]):
/// [`write_checked`].
pub fn write_rewritten(
    path: &Path,
    t: &Transformed,
    input: Option<&File>,
    out: &mut File,
) -> Result<Verified> {
    write_checked(path, "rewritten", t, input, out, |b| {
        verify_written(b, t.bundles)
    })
}

/// Stream a rewrite of `path` into `out` (at its start; the input's pieces
/// copied from `input`, the file `t`'s bytes were mapped from, by the
/// kernel where it can: [`crate::image::Image::write_to`]), fill in a PE
/// checksum over what was written, and run `check` (a verifier) over the
/// file as written, mapped for the check and unmapped after it: the
/// self-check of every rewrite, which sees the bytes a reader will, and
/// holds none of them. A failed check is [`Error::SelfCheck`] naming
/// `output` (what kind of output it is).
pub fn write_checked<T>(
    path: &Path,
    output: &'static str,
    t: &Transformed,
    input: Option<&File>,
    out: &mut File,
    check: impl FnOnce(&[u8]) -> Result<T, VerifyError>,
) -> Result<T> {
    t.image.write_to(out, input).with_path(path)?;
    if let Some(at) = t.checksum_at {
        crate::pe::fill_checksum(out, at).with_path(path)?;
    }
    let written = crate::input::map_open(path, out)?;
    check(&written).map_err(|source| Error::SelfCheck {
        path: path.into(),
        output,
        source,
    })
}

/// Check a binary kpack has just rewritten and written, ELF
/// ([`verify_elf`]) or PE ([`pe::verify_pe`]; its checksum is the one
/// [`write_checked`] computed over this file, so not summed again), and
/// that every wrapper's code object index names one of `bundles` bundles.
fn verify_written(b: &[u8], bundles: usize) -> Result<Verified, VerifyError> {
    if crate::pe::is_pe(b) {
        pe::verify::verify_pe_with(b, Some(bundles), pe::verify::Checksum::Trust)
    } else {
        verify_elf(b, Some(bundles))
    }
}

/// "Not a fat binary", naming the container's bundle section.
fn not_fat(path: &Path, bin: Option<&HostBinary>) -> Error {
    let path = path.into();
    match bin {
        Some(HostBinary::Pe(_)) => Error::PeTransform {
            path,
            source: section::SectionError::NotFat(section::Container::Pe).into(),
        },
        _ => Error::Transform {
            path,
            source: section::SectionError::NotFat(section::Container::Elf).into(),
        },
    }
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (fs::canonicalize(a), fs::canonicalize(b)) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}

/// Check a fat binary on disk, as prune and restore write them
/// ([`verify_fat`]).
pub fn verify_fat_file(path: &Path) -> Result<VerifiedFat> {
    let mapped = map_file(path)?;
    verify_fat(&mapped).with_path(path)
}

/// Check an offloaded binary (ELF or PE) on disk (`kpack verify-binary`,
/// `kpack verify-elf`, artifact verification): whoever wrote it, so the
/// reference tools' shipped defects are accepted with warnings
/// ([`elf::verify::Rules::Shipped`]).
pub fn verify_file(path: &Path) -> Result<Verified> {
    let mapped = map_file(path)?;
    verify_shipped(&mapped).with_path(path)
}

/// Check an offloaded binary (ELF or PE) whoever wrote it: the reference
/// tools' shipped defects are accepted with warnings
/// ([`elf::verify::Rules::Shipped`]).
pub fn verify_shipped(b: &[u8]) -> Result<Verified, VerifyError> {
    let mut v = if crate::pe::is_pe(b) {
        pe::verify_pe(b, None)?
    } else {
        elf::verify::verify_elf_with(b, None, elf::verify::Rules::Shipped)?
    };
    // Valid, but past what ROCm's HRX runtime reads: a warning too.
    let targets = v.metadata.targets.as_ref().map_or(0, Vec::len);
    let hrx = kpack_format::hrx::check_metadata(&v.metadata)
        .into_iter()
        .chain(kpack_format::hrx::check_archive_count(targets));
    v.warnings.extend(hrx.map(|e| e.to_string()));
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths() {
        assert_eq!(
            relative_path(Path::new("/a/b/lib"), Path::new("/a/b/.kpack")),
            "../.kpack"
        );
        assert_eq!(
            relative_path(Path::new("/a/b"), Path::new("/a/b/.kpack")),
            ".kpack"
        );
        assert_eq!(relative_path(Path::new("/a/b"), Path::new("/a/b")), ".");
        assert_eq!(
            relative_path(Path::new("/x/y/z"), Path::new("/a")),
            "../../../a"
        );
    }

    #[test]
    fn default_groups() {
        assert_eq!(default_group(Path::new("out/libfoo.so.1.2")), "libfoo");
        assert_eq!(default_group(Path::new(".hidden")), ".hidden");
    }
}
