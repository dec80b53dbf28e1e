//! `kpack restore`: the way back from an offloaded binary. Its code objects
//! are found the way the runtime finds them (the loader's search, with
//! `ROCM_KPACK_PATH` and friends honoured), one bundle per code object index
//! its wrappers name, and put back into the address range the device code
//! had: `.hip_fatbin` PROGBITS again, HIPF wrappers, the removed pages back
//! in the file ([`crate::offload::transform::rewrite`] with
//! [`Request::Restore`]: the inverse cut). A HIP runtime built without kpack
//! (CLR's `ROCM_KPACK_ENABLED` off: HIPK binaries fail with
//! `hipErrorNotSupported`) loads the result.
//!
//! Bundles are written as clang does (host entry first, device entries
//! sorted, each at a 4 KiB offset), uncompressed when they fit the range and
//! otherwise compressed (CCOB v2, zstd; v3 where a size needs it); when even
//! that does not fit, a clear error and nothing written.

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::binary::{classify, Class};
use crate::bundle::{compress_bundle, write_bundle, Method};
use crate::error::{Error, Result, WithPath};
use crate::fatbin::{read_device_code, DeviceCode};
use crate::hipk::HipkMetadata;
use crate::input::map_file;
use crate::loader::Loader;
use crate::offload::transform::{align_up, rewrite, Request, TransformError};
use crate::offload::verify_fat;
use crate::output::{parent_dir, write_atomically_with_mode};
use crate::prune::{keeps, Selection};
use crate::target::TargetId;

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
    let (metadata, co_indices, machine) = offloaded(input, bytes)?;
    // The runtime sees the mapped file's real path.
    let binary_path = fs::canonicalize(input).with_path(input)?;
    let loader = Loader::from_env();
    let targets = chosen_targets(input, &loader, &metadata, &binary_path, opts)?;
    let found = collect(
        input,
        &loader,
        &metadata,
        &binary_path,
        &co_indices,
        &targets,
    )?;
    let host = host_triple(machine);
    let plain: Vec<Vec<u8>> = found.iter().map(|b| bundle_of(&host, b)).collect();
    let (t, compressed) = place(input, bytes, &plain, &co_indices, opts.compression)?;
    verify_fat(&t.bytes).map_err(|e| {
        request(
            input,
            format!("internal error: the restored binary fails verification: {e}"),
        )
    })?;
    fs::create_dir_all(parent_dir(output)).with_path(parent_dir(output))?;
    write_atomically_with_mode(output, Some(mode), |f| f.write_all(&t.bytes))?;
    let mut archives: Vec<PathBuf> = found
        .iter()
        .flat_map(|b| b.iter().map(|c| c.archive.clone()))
        .collect();
    archives.sort();
    archives.dedup();
    let bundles = co_indices
        .iter()
        .zip(&found)
        .zip(&plain)
        .map(|((&co_index, b), p)| BundleRestored {
            co_index,
            targets: b.iter().map(|c| c.target.clone()).collect(),
            bytes: p.len() as u64,
        })
        .collect();
    Ok(RestoreSummary {
        input: input.into(),
        output: output.into(),
        targets,
        archives,
        bundles,
        compressed,
        wrappers: t.wrappers.len(),
        input_size: bytes.len() as u64,
        output_size: t.bytes.len() as u64,
        seconds: clock.elapsed().as_secs_f64(),
    })
}

/// The HIPK metadata, the distinct code object indices of the wrappers
/// (sorted) and the machine of an offloaded binary; anything else is
/// refused, saying what it is.
fn offloaded(input: &Path, bytes: &[u8]) -> Result<(HipkMetadata, Vec<u32>, u16)> {
    match classify(bytes) {
        Class::Offloaded => {}
        Class::Fat => return Err(request(input, "a fat binary already (nothing to restore)")),
        Class::Inconsistent(why) => return Err(request(input, why)),
        Class::HostOnly | Class::DebugOnly => {
            return Err(request(
                input,
                "not an offloaded binary (no HIPK wrappers and metadata)",
            ))
        }
        _ => return Err(request(input, "not an offloaded host binary")),
    }
    let DeviceCode::Offloaded(o) = read_device_code(input, bytes)? else {
        return Err(request(input, "not an offloaded host binary"));
    };
    let mut cos = Vec::with_capacity(o.wrappers.len());
    for w in &o.wrappers {
        let co = u32::try_from(w.reserved1)
            .map_err(|_| request(input, "a wrapper's code object index does not fit 32 bits"))?;
        cos.push(co);
    }
    cos.sort_unstable();
    cos.dedup();
    if cos.is_empty() {
        return Err(request(input, "no wrappers: nothing to restore"));
    }
    let machine = crate::elf::ElfView::parse(bytes)
        .with_path(input)?
        .machine();
    Ok((o.metadata, cos, machine))
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
        return Err(request(
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
        return Err(request(
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

/// One code object found for a bundle.
struct Found {
    target: String,
    triple: String,
    data: Vec<u8>,
    archive: PathBuf,
}

/// The code objects of each code object index, for each target, through
/// the loader's search for exactly that target.
fn collect(
    input: &Path,
    loader: &Loader,
    metadata: &HipkMetadata,
    binary_path: &Path,
    co_indices: &[u32],
    targets: &[String],
) -> Result<Vec<Vec<Found>>> {
    let ids: Vec<(&String, TargetId)> = targets
        .iter()
        .filter_map(|t| TargetId::parse(t).ok().map(|id| (t, id)))
        .collect();
    let mut out = Vec::with_capacity(co_indices.len());
    for &co in co_indices {
        let mut bundle = Vec::new();
        for (name, id) in &ids {
            let hit = loader
                .load_target(metadata, binary_path, co, id)
                .map_err(|e| request(input, format!("{}#{co}: {e}", metadata.kernel_name)))?;
            if let Some((data, hit)) = hit {
                bundle.push(Found {
                    target: name.to_string(),
                    triple: hit
                        .triple
                        .unwrap_or_else(|| format!("hipv4-amdgcn-amd-amdhsa--{name}")),
                    data,
                    archive: hit.archive,
                });
            }
        }
        out.push(bundle);
    }
    if out.iter().all(Vec::is_empty) {
        return Err(request(
            input,
            format!(
                "the archives hold no code object of {} for {}",
                metadata.kernel_name,
                targets.join(", ")
            ),
        ));
    }
    Ok(out)
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

/// An uncompressed bundle as clang writes one: the host entry, then the
/// device entries sorted by target, each at a 4 KiB offset.
fn bundle_of(host: &str, found: &[Found]) -> Vec<u8> {
    let mut sorted: Vec<&Found> = found.iter().collect();
    sorted.sort_by(|a, b| a.target.cmp(&b.target));
    let mut entries: Vec<(&str, &[u8])> = vec![(host, &[])];
    entries.extend(
        sorted
            .iter()
            .map(|f| (f.triple.as_str(), f.data.as_slice())),
    );
    write_bundle(&entries, 4096)
}

/// The restored binary: the bundles uncompressed if that fits (and is
/// allowed), else compressed; whether they were compressed.
fn place(
    input: &Path,
    bytes: &[u8],
    plain: &[Vec<u8>],
    co_indices: &[u32],
    compression: Compression,
) -> Result<(crate::offload::transform::Transformed, bool)> {
    // Uncompressed bundles at 4 KiB (their code objects aligned as clang
    // aligns them); compressed ones are decompressed before use: 16 bytes.
    let attempt = |bundles: &[Vec<u8>], align: u64| {
        let (payload, starts) = lay_out(bundles, co_indices, align);
        rewrite(
            bytes,
            &Request::Restore {
                bundles: &payload,
                starts,
                align,
            },
        )
    };
    let compressed = || -> Result<Vec<Vec<u8>>> {
        plain
            .iter()
            .map(|p| {
                let v = if u32::try_from(p.len()).is_ok() { 2 } else { 3 };
                compress_bundle(p, v, Method::Zstd)
                    .or_else(|_| compress_bundle(p, 3, Method::Zstd))
                    .map_err(|e| request(input, format!("compressing a bundle: {e}")))
            })
            .collect()
    };
    let fail = |e: TransformError| request(input, e.to_string());
    match compression {
        Compression::None => attempt(plain, 4096).map(|t| (t, false)).map_err(fail),
        Compression::Zstd => attempt(&compressed()?, 16).map(|t| (t, true)).map_err(fail),
        Compression::Auto => match attempt(plain, 4096) {
            Ok(t) => Ok((t, false)),
            Err(TransformError::RangeTooSmall { .. }) => {
                attempt(&compressed()?, 16).map(|t| (t, true)).map_err(fail)
            }
            Err(e) => Err(fail(e)),
        },
    }
}

/// The bundles back to back, each at a multiple of `align`, and where each
/// code object index's bundle starts.
fn lay_out(bundles: &[Vec<u8>], co_indices: &[u32], align: u64) -> (Vec<u8>, Vec<(u32, u64)>) {
    let mut out = Vec::new();
    let mut starts = Vec::with_capacity(bundles.len());
    for (b, &co) in bundles.iter().zip(co_indices) {
        let at = align_up(out.len() as u64, align);
        out.resize(at as usize, 0);
        starts.push((co, at));
        out.extend_from_slice(b);
    }
    (out, starts)
}

fn request(path: &Path, what: impl Into<String>) -> Error {
    Error::Request {
        path: path.into(),
        what: what.into(),
    }
}
