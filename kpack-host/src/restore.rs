//! `kpack restore`: the way back from an offloaded binary. Its code objects
//! are found the way the runtime finds them (the loader's search, with
//! `ROCM_KPACK_PATH` and friends honoured), one bundle per code object index
//! its wrappers name, and put back into the address range the device code
//! had: `.hip_fatbin` PROGBITS again, HIPF wrappers, the removed pages back
//! in the file ([`crate::offload::elf::rewrite`] with
//! [`Request::Restore`]: the inverse cut). A HIP runtime built without kpack
//! (CLR's `ROCM_KPACK_ENABLED` off: HIPK binaries fail with
//! `hipErrorNotSupported`) loads the result.
//!
//! Bundles are written as clang does (host entry first, device entries
//! sorted, each at a 4 KiB offset), uncompressed when they fit the range and
//! otherwise compressed as clang's `--offload-compress` compresses them
//! (CCOB v2, zstd with long-distance matching; v3 where a size needs it:
//! the code objects of a bundle's targets are matched against each other,
//! which is what lets clang's compressed bundles be small); when even
//! that does not fit, a clear error and nothing written.

use std::fs::{self, File};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;

use crate::binary::{classify_parsed, Class, Classified, HostBinary};
use crate::bundle::{bundle_layout, BundleBuf, Compressor, Method};
use crate::elf::{ElfError, ElfView};
use crate::error::{Error, Result, WithPath};
use crate::fatbin::{device_code, DeviceCode};
use crate::hipk::HipkMetadata;
use crate::input::map_file;
use crate::loader::Loader;
use crate::offload::elf::{align_up, restore_room, rewrite, Payload, Request, TransformError};
use crate::offload::rewritten::Transformed;
use crate::offload::{archive_key, verify_fat_layout, write_checked};
use crate::output::{parent_dir, write_atomically_as};
use crate::prune::{keeps, Selection};
use crate::target::TargetId;

/// The zstd level of a second try when bundles compressed at level 3 do
/// not fit the range.
const STRONGEST_LEVEL: i32 = 19;

/// How restored bundles are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// Uncompressed when they fit the range, else compressed.
    #[default]
    Auto,
    None,
    Zstd,
}

/// How to restore.
#[derive(Debug, Clone, Default)]
pub struct RestoreOptions {
    /// Targets to restore, matched as prune matches them; empty: every
    /// target the archives have.
    pub targets: Vec<String>,
    pub keep_generic: bool,
    pub compression: Compression,
}

/// One bundle put back.
#[derive(Debug, Clone, Serialize)]
pub struct BundleRestored {
    /// The code object index the wrappers name (the bundle index before
    /// offload).
    pub co_index: u32,
    pub targets: Vec<String>,
    pub bytes: u64,
}

/// What [`restore`] did.
#[derive(Debug, Clone, Serialize)]
pub struct RestoreSummary {
    pub input: PathBuf,
    pub output: PathBuf,
    /// Targets put back (sorted).
    pub targets: Vec<String>,
    /// The archives the code objects came from.
    pub archives: Vec<PathBuf>,
    pub bundles: Vec<BundleRestored>,
    pub compressed: bool,
    pub wrappers: usize,
    pub input_size: u64,
    pub output_size: u64,
    pub seconds: f64,
}

/// Restore `input` (an offloaded binary) to `output` (may be the same path;
/// its mode is the input's).
pub fn restore(input: &Path, output: &Path, opts: &RestoreOptions) -> Result<RestoreSummary> {
    let clock = std::time::Instant::now();
    let mapped = map_file(input)?;
    let bytes: &[u8] = &mapped;
    let mode = fs::metadata(input).with_path(input)?.permissions().mode();
    let (metadata, co_indices, elf) = offloaded(input, &classify_parsed(bytes))?;
    // The runtime sees the mapped file's real path.
    let binary_path = fs::canonicalize(input).with_path(input)?;
    let loader = Loader::from_env();
    let targets = chosen_targets(input, &loader, &metadata, &binary_path, opts)?;
    let host = host_triple(elf.machine());
    let mut ids: Vec<(&String, TargetId)> = targets
        .iter()
        .filter_map(|t| TargetId::parse(t).ok().map(|id| (t, id)))
        .collect();
    ids.sort_by(|a, b| a.0.cmp(b.0));
    // The spill goes where the output will (the same file system), or to
    // the temporary directory while that does not exist yet.
    let scratch = match parent_dir(output) {
        d if d.is_dir() => d.to_path_buf(),
        _ => std::env::temp_dir(),
    };
    let src = Source {
        input,
        scratch: &scratch,
        loader: &loader,
        metadata: &metadata,
        binary_path: &binary_path,
        ids,
        host: &host,
    };
    let (t, built, compressed) = place(&src, elf, &co_indices, opts.compression)?;
    fs::create_dir_all(parent_dir(output)).with_path(parent_dir(output))?;
    // The check reads the bundles' layout, headers and entry tables; their
    // contents are what was just compressed (`kpack verify-elf`
    // decompresses them all).
    let source = File::open(input).with_path(input)?;
    write_atomically_as(output, Some(mode), |f| {
        write_checked(input, "restored", &t, Some(&source), f, verify_fat_layout)
    })?;
    let (output_size, wrappers) = (t.len(), t.wrappers.len());
    drop(t);
    let Built {
        bundles, archives, ..
    } = built;
    Ok(RestoreSummary {
        input: input.into(),
        output: output.into(),
        targets,
        archives,
        bundles,
        compressed,
        wrappers,
        input_size: bytes.len() as u64,
        output_size,
        seconds: clock.elapsed().as_secs_f64(),
    })
}

/// The HIPK metadata, the distinct code object indices of the wrappers
/// (sorted) and the ELF view of an offloaded binary; anything else is
/// refused, saying what it is.
fn offloaded<'a>(
    input: &Path,
    file: &Classified<'a>,
) -> Result<(HipkMetadata, Vec<u32>, ElfView<'a>)> {
    match &file.class {
        Class::Offloaded => {}
        Class::Fat => {
            return Err(Error::request(
                input,
                "a fat binary already (nothing to restore)",
            ))
        }
        Class::Inconsistent(why) => return Err(why.clone()).with_path(input),
        Class::HostOnly | Class::DebugOnly => {
            return Err(Error::request(
                input,
                "not an offloaded binary (no HIPK wrappers and metadata)",
            ))
        }
        _ => return Err(Error::request(input, "not an offloaded host binary")),
    }
    let DeviceCode::Offloaded(o) = device_code(input, file)? else {
        return Err(Error::request(input, "not an offloaded host binary"));
    };
    let mut cos = Vec::with_capacity(o.wrappers.len());
    for w in &o.wrappers {
        let co = u32::try_from(w.reserved1).map_err(|_| {
            Error::request(input, "a wrapper's code object index does not fit 32 bits")
        })?;
        cos.push(co);
    }
    cos.sort_unstable();
    cos.dedup();
    if cos.is_empty() {
        return Err(Error::request(input, "no wrappers: nothing to restore"));
    }
    let elf = match file.binary.clone().with_path(input)? {
        HostBinary::Elf(elf) => elf,
        HostBinary::Pe(_) => return Err(ElfError::NotElf).with_path(input),
    };
    Ok((o.metadata, cos, elf))
}

/// The targets to restore: those of the archives the search finds that
/// the options take (all of them by default).
fn chosen_targets(
    input: &Path,
    loader: &Loader,
    metadata: &HipkMetadata,
    binary_path: &Path,
    opts: &RestoreOptions,
) -> Result<Vec<String>> {
    let mut available: Vec<String> = loader
        .available_archives(metadata, binary_path)
        .into_iter()
        .flat_map(|(_, t)| t)
        .collect();
    available.sort();
    available.dedup();
    if available.is_empty() {
        return Err(Error::request(
            input,
            format!(
                "no archive found along its search paths ({}; ROCM_KPACK_PATH and ROCM_KPACK_PATH_PREFIX honoured)",
                metadata.search_paths.join(", ")
            ),
        ));
    }
    if opts.targets.is_empty() {
        return Ok(available);
    }
    let wanted = Selection {
        targets: opts.targets.clone(),
        keep_generic: opts.keep_generic,
    }
    .parsed(input)?;
    let chosen: Vec<String> = available
        .iter()
        .filter(|t| keeps(&wanted, opts.keep_generic, t))
        .cloned()
        .collect();
    if chosen.is_empty() {
        return Err(Error::request(
            input,
            format!(
                "the archives have no code objects for {} (they have {})",
                opts.targets.join(", "),
                available.join(", ")
            ),
        ));
    }
    Ok(chosen)
}

/// Where the code objects come from: the loader's search for one binary.
struct Source<'a> {
    input: &'a Path,
    /// Where the bundles are spilled while they are built: the output's
    /// directory.
    scratch: &'a Path,
    loader: &'a Loader,
    metadata: &'a HipkMetadata,
    binary_path: &'a Path,
    /// The targets to restore, sorted by name.
    ids: Vec<(&'a String, TargetId)>,
    host: &'a str,
}

/// One restored bundle: its bytes (uncompressed, or compressed), its
/// summary and the archives its code objects came from.
struct OneBundle {
    bytes: Vec<u8>,
    summary: BundleRestored,
    archives: Vec<PathBuf>,
}

impl Source<'_> {
    /// Each target's code object `co` through the loader's search for
    /// exactly that target, handed to `f` as found: (triple, bytes); the
    /// targets and archives it came from.
    fn each_code_object(
        &self,
        co: u32,
        mut f: impl FnMut(String, Vec<u8>),
    ) -> Result<(Vec<String>, Vec<PathBuf>)> {
        let (mut targets, mut archives) = (Vec::new(), Vec::new());
        for (name, id) in &self.ids {
            let hit = self
                .loader
                .load_target(self.metadata, self.binary_path, co, id)
                .map_err(|e| Error::Load {
                    path: self.input.into(),
                    key: archive_key(&self.metadata.kernel_name, co as usize),
                    source: Box::new(e),
                })?;
            if let Some((data, hit)) = hit {
                let triple = hit
                    .triple
                    .unwrap_or_else(|| format!("hipv4-amdgcn-amd-amdhsa--{name}"));
                f(triple, data);
                targets.push(name.to_string());
                archives.push(hit.archive);
            }
        }
        Ok((targets, archives))
    }

    /// Code object index `co` as a bundle written as clang writes one (the
    /// host entry, then the device entries sorted by target, each at a
    /// 4 KiB offset): each target's code object through the loader's
    /// search for exactly that target. Read twice, one code object at a
    /// time: for the sizes, then into the bundle's place (a bundle of a
    /// compressed binary's is up to 120 MB; its code objects are not held
    /// next to it).
    fn bundle(&self, co: u32) -> Result<OneBundle> {
        let mut sizes: Vec<(String, usize)> = vec![(self.host.to_string(), 0)];
        self.each_code_object(co, |t, d| sizes.push((t, d.len())))?;
        let table: Vec<(&str, usize)> = sizes.iter().map(|(t, n)| (t.as_str(), *n)).collect();
        let mut buf = BundleBuf::new(&table, 4096);
        let (mut next, mut all_placed) = (1, true);
        let (targets, archives) = self.each_code_object(co, |_, d| {
            all_placed &= buf.put(next, &d);
            next += 1;
        })?;
        if !all_placed || next != sizes.len() {
            return Err(Error::request(
                self.input,
                format!(
                    "the archives of {} changed while it was read",
                    archive_key(&self.metadata.kernel_name, co as usize)
                ),
            ));
        }
        let bytes = buf.into_bytes();
        let summary = BundleRestored {
            co_index: co,
            targets,
            bytes: bytes.len() as u64,
        };
        Ok(OneBundle {
            bytes,
            summary,
            archives,
        })
    }

    /// The size of [`Source::bundle`], holding one code object at a time.
    fn bundle_size(&self, co: u32) -> Result<u64> {
        let mut sizes: Vec<(String, usize)> = vec![(self.host.to_string(), 0)];
        self.each_code_object(co, |t, d| sizes.push((t, d.len())))?;
        let sizes: Vec<(&str, usize)> = sizes.iter().map(|(t, n)| (t.as_str(), *n)).collect();
        Ok(bundle_layout(&sizes, 4096).1)
    }

    /// The same bundle compressed (CCOB v2, zstd at `level` with
    /// long-distance matching; v3 where a
    /// size needs it); the plain one is dropped at once.
    fn compressed_bundle(&self, co: u32, level: i32) -> Result<OneBundle> {
        let mut b = self.bundle(co)?;
        b.bytes = Compressor::new(Method::Zstd)
            .version(2)
            .level(level)
            .long_distance(true)
            .fitting(true)
            .compress(&b.bytes)
            .map_err(|source| Error::Compress {
                path: self.input.into(),
                what: "a bundle",
                source,
            })?;
        Ok(b)
    }

    /// The size the uncompressed bundles take back to back at 4 KiB
    /// offsets, without building them (each code object is loaded,
    /// measured, dropped).
    fn plain_size(&self, co_indices: &[u32]) -> Result<u64> {
        use rayon::prelude::*;
        let sizes: Vec<Result<u64>> = co_indices
            .par_iter()
            .map(|&co| {
                let size = self.bundle_size(co);
                // What was read of the archives stays in the page cache.
                self.loader.release_pages();
                size
            })
            .collect();
        let mut end = 0;
        for size in sizes {
            end = align_up(end, 4096) + size?;
        }
        Ok(end)
    }
}

/// The bundles laid out back to back (each start a multiple of `align`)
/// in a spill file, what they hold and where their code objects came from.
/// Only the bundle being built is in memory, then the output binary.
struct Built {
    spill: Spill,
    starts: Vec<(u32, u64)>,
    align: u64,
    bundles: Vec<BundleRestored>,
    archives: Vec<PathBuf>,
}

impl Built {
    /// Lay out `each` (in code object order). Refused when no bundle holds
    /// a code object.
    fn new(
        src: &Source,
        each: impl IntoIterator<Item = Result<OneBundle>>,
        align: u64,
    ) -> Result<Built> {
        let mut out = Built {
            spill: Spill::new(src)?,
            starts: Vec::new(),
            align,
            bundles: Vec::new(),
            archives: Vec::new(),
        };
        for b in each {
            let b = b?;
            let at = out.spill.append(src, &b.bytes, align)?;
            // What was read of the archives stays in the page cache.
            src.loader.release_pages();
            out.starts.push((b.summary.co_index, at));
            out.bundles.push(b.summary);
            out.archives.extend(b.archives);
        }
        out.archives.sort();
        out.archives.dedup();
        if out.bundles.iter().all(|b| b.targets.is_empty()) {
            return Err(Error::request(
                src.input,
                format!(
                    "the archives hold no code object of {} for {}",
                    src.metadata.kernel_name,
                    src.ids
                        .iter()
                        .map(|(t, _)| t.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
        Ok(out)
    }

    /// Uncompressed bundles at 4 KiB (their code objects aligned as clang
    /// aligns them), built one at a time.
    fn plain(src: &Source, co_indices: &[u32]) -> Result<Built> {
        Built::new(src, co_indices.iter().map(|&co| src.bundle(co)), 4096)
    }

    /// Compressed bundles at 16 bytes (they are decompressed before use),
    /// built and compressed one at a time, only the compressed ones kept:
    /// a bundle of a compressed binary's is tens of megabytes, and two
    /// side by side (with their compressors' windows) would double what is
    /// held.
    fn compressed(src: &Source, co_indices: &[u32], level: i32) -> Result<Built> {
        Built::new(
            src,
            co_indices
                .iter()
                .map(|&co| src.compressed_bundle(co, level)),
            16,
        )
    }

    /// The restored binary: the bundles are read from the spill when it
    /// is written.
    fn rewrite<'a>(
        &self,
        elf: ElfView<'a>,
    ) -> std::result::Result<Transformed<'a>, TransformError> {
        let request = Request::Restore {
            bundles: Payload::File(self.spill.file.clone(), self.spill.len),
            starts: self.starts.clone(),
            align: self.align,
        };
        rewrite(elf, &request)
    }
}

/// The bundles' bytes, back to back, in an unnamed file.
struct Spill {
    file: Arc<fs::File>,
    len: u64,
}

impl Spill {
    fn new(src: &Source) -> Result<Spill> {
        let file = tempfile::tempfile_in(src.scratch).with_path(src.scratch)?;
        Ok(Spill {
            file: Arc::new(file),
            len: 0,
        })
    }

    /// Append `bytes` at the next multiple of `align`; where they start.
    fn append(&mut self, src: &Source, bytes: &[u8], align: u64) -> Result<u64> {
        use std::os::unix::fs::FileExt;
        let at = align_up(self.len, align);
        self.file.write_all_at(bytes, at).with_path(src.scratch)?;
        self.len = at + bytes.len() as u64;
        Ok(at)
    }
}

/// The host entry's triple, as clang 19 writes it for this machine.
fn host_triple(machine: u16) -> String {
    let arch = match machine {
        object::elf::EM_AARCH64 => "aarch64",
        object::elf::EM_PPC64 => "powerpc64le",
        _ => "x86_64",
    };
    format!("host-{arch}-unknown-linux--")
}

/// The restored binary: the bundles uncompressed if that fits (and is
/// allowed), else compressed; what they hold. Only one form of the bundles
/// is ever held: for `auto`, their uncompressed size is measured first.
fn place<'a>(
    src: &Source,
    elf: ElfView<'a>,
    co_indices: &[u32],
    compression: Compression,
) -> Result<(Transformed<'a>, Built, bool)> {
    let input = src.input;
    // zstd -3 first; where that does not fit (small bundles compress
    // worse than clang's own), the strongest level.
    let compressed = || -> Result<(Transformed<'a>, Built, bool)> {
        let mut built = Built::compressed(src, co_indices, 3)?;
        let t = match built.rewrite(elf) {
            Err(TransformError::RangeTooSmall { .. }) => {
                built = Built::compressed(src, co_indices, STRONGEST_LEVEL)?;
                built.rewrite(elf)
            }
            t => t,
        }
        .with_path(input)?;
        Ok((t, built, true))
    };
    type Placed<'a> = std::result::Result<(Transformed<'a>, Built, bool), TransformError>;
    let plain = || -> Result<Placed<'a>> {
        let built = Built::plain(src, co_indices)?;
        Ok(built.rewrite(elf).map(|t| (t, built, false)))
    };
    match compression {
        Compression::None => plain()?.with_path(input),
        Compression::Zstd => compressed(),
        Compression::Auto => {
            let room = restore_room(elf).with_path(input)?;
            let need = src.plain_size(co_indices)?;
            if align_up(room.start, 4096).saturating_add(need) > room.end {
                return compressed();
            }
            match plain()? {
                Err(TransformError::RangeTooSmall { .. }) => compressed(),
                other => other.with_path(input),
            }
        }
    }
}
