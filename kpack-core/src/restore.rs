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
    let host = host_triple(machine);
    let built = build(
        input,
        &loader,
        &metadata,
        &binary_path,
        &co_indices,
        &targets,
        &host,
    )?;
    let (t, compressed) = place(input, bytes, &built, opts.compression)?;
    let Built {
        bundles,
        archives,
        payload,
        ..
    } = built;
    // The output holds the bundles now.
    drop(payload);
    verify_fat(&t.bytes).map_err(|e| {
        request(
            input,
            format!("internal error: the restored binary fails verification: {e}"),
        )
    })?;
    fs::create_dir_all(parent_dir(output)).with_path(parent_dir(output))?;
    write_atomically_with_mode(output, Some(mode), |f| f.write_all(&t.bytes))?;
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

/// The uncompressed bundles, laid out back to back at 4 KiB offsets, and
/// what they hold.
struct Built {
    payload: Vec<u8>,
    /// Per code object index: its bundle's range in `payload`.
    ranges: Vec<(u32, std::ops::Range<usize>)>,
    bundles: Vec<BundleRestored>,
    archives: Vec<PathBuf>,
}

/// For each code object index, each target's code object through the
/// loader's search for exactly that target, made into a bundle as clang
/// writes one (the host entry, then the device entries sorted by target,
/// each at a 4 KiB offset) and appended to the payload at once, so that
/// only one bundle's code objects are held apart from it.
fn build(
    input: &Path,
    loader: &Loader,
    metadata: &HipkMetadata,
    binary_path: &Path,
    co_indices: &[u32],
    targets: &[String],
    host: &str,
) -> Result<Built> {
    let mut ids: Vec<(&String, TargetId)> = targets
        .iter()
        .filter_map(|t| TargetId::parse(t).ok().map(|id| (t, id)))
        .collect();
    ids.sort_by(|a, b| a.0.cmp(b.0));
    let mut out = Built {
        payload: Vec::new(),
        ranges: Vec::with_capacity(co_indices.len()),
        bundles: Vec::with_capacity(co_indices.len()),
        archives: Vec::new(),
    };
    for &co in co_indices {
        let mut found: Vec<(String, Vec<u8>)> = Vec::new();
        let mut names = Vec::new();
        for (name, id) in &ids {
            let hit = loader
                .load_target(metadata, binary_path, co, id)
                .map_err(|e| request(input, format!("{}#{co}: {e}", metadata.kernel_name)))?;
            if let Some((data, hit)) = hit {
                let triple = hit
                    .triple
                    .unwrap_or_else(|| format!("hipv4-amdgcn-amd-amdhsa--{name}"));
                found.push((triple, data));
                names.push(name.to_string());
                if !out.archives.contains(&hit.archive) {
                    out.archives.push(hit.archive);
                }
            }
        }
        let mut entries: Vec<(&str, &[u8])> = vec![(host, &[])];
        entries.extend(found.iter().map(|(t, d)| (t.as_str(), d.as_slice())));
        let bundle = write_bundle(&entries, 4096);
        let at = align_up(out.payload.len() as u64, 4096) as usize;
        out.payload.resize(at, 0);
        out.payload.extend_from_slice(&bundle);
        out.ranges.push((co, at..at + bundle.len()));
        out.bundles.push(BundleRestored {
            co_index: co,
            targets: names,
            bytes: bundle.len() as u64,
        });
    }
    out.archives.sort();
    if out.bundles.iter().all(|b| b.targets.is_empty()) {
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

/// The restored binary: the bundles uncompressed if that fits (and is
/// allowed), else compressed; whether they were compressed.
fn place(
    input: &Path,
    bytes: &[u8],
    built: &Built,
    compression: Compression,
) -> Result<(crate::offload::transform::Transformed, bool)> {
    // Uncompressed bundles at 4 KiB (their code objects aligned as clang
    // aligns them); compressed ones are decompressed before use: 16 bytes.
    let attempt = |payload: &[u8], starts: Vec<(u32, u64)>, align: u64| {
        rewrite(
            bytes,
            &Request::Restore {
                bundles: payload,
                starts,
                align,
            },
        )
    };
    let plain = || {
        let starts = built
            .ranges
            .iter()
            .map(|(co, r)| (*co, r.start as u64))
            .collect();
        attempt(&built.payload, starts, 4096)
    };
    let compressed = || -> Result<crate::offload::transform::Transformed> {
        use rayon::prelude::*;
        // In parallel; each bundle its own frame, so the bytes do not
        // depend on the threads.
        let each: Vec<Result<Vec<u8>>> = built
            .ranges
            .par_iter()
            .map(|(_, r)| {
                let p = &built.payload[r.clone()];
                let v = if u32::try_from(p.len()).is_ok() { 2 } else { 3 };
                compress_bundle(p, v, Method::Zstd)
                    .or_else(|_| compress_bundle(p, 3, Method::Zstd))
                    .map_err(|e| request(input, format!("compressing a bundle: {e}")))
            })
            .collect();
        let mut payload = Vec::new();
        let mut starts = Vec::with_capacity(built.ranges.len());
        for ((co, _), c) in built.ranges.iter().zip(each) {
            let c = c?;
            let at = align_up(payload.len() as u64, 16);
            payload.resize(at as usize, 0);
            payload.extend_from_slice(&c);
            starts.push((*co, at));
        }
        attempt(&payload, starts, 16).map_err(fail(input))
    };
    match compression {
        Compression::None => plain().map(|t| (t, false)).map_err(fail(input)),
        Compression::Zstd => compressed().map(|t| (t, true)),
        Compression::Auto => match plain() {
            Ok(t) => Ok((t, false)),
            Err(TransformError::RangeTooSmall { .. }) => compressed().map(|t| (t, true)),
            Err(e) => Err(fail(input)(e)),
        },
    }
}

fn fail(input: &Path) -> impl Fn(TransformError) -> Error + '_ {
    move |e| request(input, e.to_string())
}

fn request(path: &Path, what: impl Into<String>) -> Error {
    Error::Request {
        path: path.into(),
        what: what.into(),
    }
}
