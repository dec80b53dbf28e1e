//! `kpack prune` (what CUDA's nvprune does for fat binaries): keep only
//! some targets inside a fat binary's own bundles. The output is still an
//! ordinary fat binary (HIPF wrappers, `.hip_fatbin` PROGBITS) that a HIP
//! runtime without kpack loads, with every other target's bytes gone from
//! the file.
//!
//! The steps: the bundles are listed from their entry tables
//! (`list_fatbin`: a compressed bundle is not decompressed whole), which
//! says what stays; [`plan_bundles`] rebuilds each bundle with the kept
//! entries (host entries always stay, so a bundle left without device code
//! is still a valid, empty bundle; compressed bundles are compressed again
//! with their method, in their CCOB version or v3 where a size needs it)
//! and lays them out back to back at the section's alignment, one bundle at
//! a time: the kept entries of a compressed bundle are read by
//! `FatbinStream`, and only the compressed result is kept before the next
//! bundle is read, so what is held does not grow with the number of
//! bundles; the ELF transform
//! ([`crate::offload::elf::rewrite`], the machinery of offload) keeps
//! them at the start of `.hip_fatbin`, removes the whole pages after them
//! and points each wrapper at its bundle's new place; [`verify_fat`] checks
//! the result before it is renamed into place.

use std::fs::{self, File};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::binary::{classify_parsed, Class, Classified, HostBinary};
use crate::bundle::{
    list_fatbin, write_bundle_owned, Blob, BundleInfo, Ccob, Compressor, FatbinStream,
};
use crate::elf::ElfView;
use crate::error::{Error, Result, WithPath};
use crate::input::{map_file, Mapped};
use crate::offload::collect::Pages;
use crate::offload::elf::{align_up, rewrite, Request};
use crate::offload::{verify_fat, write_checked};
use crate::output::{parent_dir, write_atomically_as};
use crate::target::TargetId;

/// Which code objects to keep.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    /// Requested targets (target IDs, or exact entry target names such as
    /// `amdgcnspirv`).
    pub targets: Vec<String>,
    /// Also keep every generic target (`gfx11-generic`, ...).
    pub keep_generic: bool,
}

impl Selection {
    /// Check the requested targets: each is a target ID or at least a plain
    /// target name.
    pub fn parsed(&self, path: &Path) -> Result<Vec<(String, Option<TargetId>)>> {
        if self.targets.is_empty() {
            return Err(Error::request(path, "no target given (--targets)"));
        }
        self.targets
            .iter()
            .map(|t| match TargetId::parse(t) {
                Ok(id) => Ok((t.clone(), Some(id))),
                Err(_) if is_plain_name(t) => Ok((t.clone(), None)),
                Err(source) => Err(Error::Target {
                    path: path.into(),
                    target: t.clone(),
                    source,
                }),
            })
            .collect()
    }
}

fn is_plain_name(t: &str) -> bool {
    !t.is_empty() && t.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Does the selection keep a code object for `target` (as a bundle entry
/// spells it)? The same name, or a requested target that takes it
/// ([`TargetId::takes`]), or a generic target with `keep_generic`.
pub fn keeps(wanted: &[(String, Option<TargetId>)], keep_generic: bool, target: &str) -> bool {
    let parsed = TargetId::parse(target).ok();
    wanted.iter().any(|(name, id)| {
        name == target || matches!((id, &parsed), (Some(want), Some(have)) if want.takes(have))
    }) || (keep_generic && parsed.is_some_and(|t| t.is_generic()))
}

/// What happened to one bundle.
#[derive(Debug, Clone, Serialize)]
pub struct BundlePruned {
    pub index: usize,
    /// CCOB version and method, for a compressed bundle.
    pub compressed: Option<String>,
    pub kept: Vec<String>,
    pub dropped: Vec<String>,
    /// Stored bytes before and after.
    pub bytes_before: u64,
    pub bytes_after: u64,
}

/// What [`prune`] did.
#[derive(Debug, Clone, Serialize)]
pub struct PruneSummary {
    pub input: PathBuf,
    pub output: PathBuf,
    /// Targets kept, and dropped, over all bundles (sorted).
    pub kept_targets: Vec<String>,
    pub dropped_targets: Vec<String>,
    pub bundles: Vec<BundlePruned>,
    pub wrappers: usize,
    /// `.hip_fatbin` bytes before and after.
    pub section_before: u64,
    pub section_after: u64,
    pub input_size: u64,
    pub output_size: u64,
    pub seconds: f64,
}

/// The pruned bundles laid out as the new section's payload.
#[derive(Default)]
pub struct Layout {
    pub bytes: Vec<u8>,
    /// (old offset in the section, new offset) of each top-level bundle.
    pub starts: Vec<(u64, u64)>,
    pub bundles: Vec<BundlePruned>,
}

/// Prune `input` to the targets of `selection`, writing `output` (which may
/// be the same path; its mode is the input's).
pub fn prune(input: &Path, output: &Path, selection: &Selection) -> Result<PruneSummary> {
    let clock = std::time::Instant::now();
    let wanted = selection.parsed(input)?;
    let mapped = map_file(input)?;
    let bytes: &[u8] = &mapped;
    let mode = fs::metadata(input).with_path(input)?.permissions().mode();
    let elf = fat_elf(input, &classify_parsed(bytes))?;
    let section = HostBinary::Elf(elf)
        .fatbin()
        .with_path(input)?
        .ok_or_else(|| Error::request(input, "no .hip_fatbin section"))?;
    let listed = list_fatbin(section.data).with_path(input)?;
    let keep = |t: &str| keeps(&wanted, selection.keep_generic, t);
    let (kept, dropped) = kept_and_dropped(input, selection, &listed, &keep)?;
    let align = section_alignment(&elf);
    let layout = plan_bundles(input, section.data, &listed, align, &keep, Some(&mapped))?;
    let req = Request::Prune {
        bundles: &layout.bytes,
        starts: layout.starts.clone(),
    };
    let t = rewrite(elf, &req).with_path(input)?;
    fs::create_dir_all(parent_dir(output)).with_path(parent_dir(output))?;
    let source = File::open(input).with_path(input)?;
    let v = write_atomically_as(output, Some(mode), |f| {
        write_checked(input, "pruned", &t, Some(&source), f, verify_fat)
    })?;
    Ok(PruneSummary {
        input: input.into(),
        output: output.into(),
        kept_targets: kept,
        dropped_targets: dropped,
        bundles: layout.bundles,
        wrappers: v.wrapper_bundles.len(),
        section_before: section.size,
        section_after: layout.bytes.len() as u64,
        input_size: bytes.len() as u64,
        output_size: t.len(),
        seconds: clock.elapsed().as_secs_f64(),
    })
}

/// The fat ELF binary of a file; anything else (a PE file too) is refused,
/// saying what it is.
fn fat_elf<'a>(input: &Path, file: &Classified<'a>) -> Result<ElfView<'a>> {
    check_class(input, file)?;
    match file.binary.clone().with_path(input)? {
        HostBinary::Elf(elf) => Ok(elf),
        HostBinary::Pe(_) => Err(Error::request(
            input,
            "a PE file: prune rewrites ELF binaries only (offload handles both)",
        )),
    }
}

/// Only a fat binary can be pruned; anything else is refused, saying what
/// it is.
fn check_class(input: &Path, file: &Classified) -> Result<()> {
    let what = match &file.class {
        Class::Fat => return Ok(()),
        Class::Offloaded => "an offloaded binary: its device code is in archives (kpack restore --targets puts chosen targets back)",
        Class::HostOnly => "a host binary without device code (no .hip_fatbin)",
        Class::DebugOnly => "a debug-info file: no device code",
        Class::Relocatable { .. } | Class::StaticArchive => "a link input, not a run-time binary",
        Class::CodeObject => "an AMDGPU code object, not a host binary",
        Class::Bundle => "a raw offload bundle, not a host binary",
        Class::Archive => "a .kpack archive, not a binary",
        Class::Inconsistent(why) => return Err(why.clone()).with_path(input),
        Class::Other => {
            return Err(match &file.binary {
                Err(e) => Error::binary(input, e.clone()),
                Ok(_) => Error::request(input, "not a host binary"),
            })
        }
    };
    Err(Error::request(input, what))
}

/// The alignment of bundles in the section: its own, at most a page.
fn section_alignment(elf: &ElfView) -> u64 {
    use object::read::elf::SectionHeader as _;
    elf.section_index(crate::elf::FATBIN_SECTION)
        .map(|i| elf.shdrs()[i].sh_addralign(crate::elf::LE))
        .unwrap_or(1)
        .clamp(8, 4096)
}

/// Which entries `keep` (a target's name to whether it stays) takes.
type Keep<'k> = &'k (dyn Fn(&str) -> bool + Sync);

/// Rebuild every bundle of `data` (as `listed`) with the entries `keep`
/// says, in order, each top-level bundle at a multiple of `align`. One
/// top-level bundle at a time: its kept entries are read (a compressed
/// bundle's by [`FatbinStream`], decompressing it once), the pruned bundle
/// is written and, if it was compressed, compressed again, and only that is
/// kept. The pages of `mapped` (holding `data`) read are released as it
/// goes. A damaged compressed bundle is an error naming `input`, the bundle
/// and the problem.
pub(crate) fn plan_bundles(
    input: &Path,
    data: &[u8],
    listed: &[BundleInfo],
    align: u64,
    keep: Keep,
    mapped: Option<&Mapped>,
) -> Result<Layout> {
    let mut stream = FatbinStream::new(data).keep(keep).with_host_entries();
    let mut pages = mapped.map(|m| Pages::new(m, data));
    let mut out = Layout::default();
    for group in listed.chunk_by(|a, b| a.range == b.range) {
        let stored = pruned_group(input, group, &mut stream, keep, &mut out.bundles)?;
        let start = align_up(out.bytes.len() as u64, align);
        out.bytes.resize(start as usize, 0);
        out.bytes.extend_from_slice(&stored);
        out.starts.push((group[0].range.start as u64, start));
        if let Some(p) = pages.as_mut() {
            p.release(&stream);
        }
    }
    // The end of the last compressed bundle, past its last kept entry.
    match stream.next().with_path(input)? {
        None => Ok(out),
        Some(s) => Err(disagree(input, s.bundle)),
    }
}

/// One top-level bundle (a plain bundle, or the inner bundles of a
/// compressed one) with the entries `keep` says, read from `stream`:
/// its stored bytes (compressed again as it was); what happened to each of
/// its bundles is pushed to `summary`.
fn pruned_group(
    input: &Path,
    group: &[BundleInfo],
    stream: &mut FatbinStream,
    keep: Keep,
    summary: &mut Vec<BundlePruned>,
) -> Result<Vec<u8>> {
    let mut plain = Vec::new();
    for b in group {
        let entries = kept_entries(input, b, stream, keep)?;
        let bytes = write_bundle_owned(entries, entry_alignment(b));
        if plain.is_empty() {
            plain = bytes;
        } else {
            plain.extend_from_slice(&bytes);
        }
        let (kept, dropped) = partition(b, keep);
        summary.push(BundlePruned {
            index: b.index,
            compressed: None,
            kept,
            dropped,
            bytes_before: group[0].range.len() as u64,
            bytes_after: 0,
        });
    }
    let (stored, compressed) = match &group[0].compressed {
        Some((ccob, _)) => {
            let stored = recompress(input, &plain, ccob)?;
            let label = format!("CCOB v{} {}", ccob_version(&stored), ccob.method);
            (stored, Some(label))
        }
        None => (plain, None),
    };
    let n = summary.len();
    for b in &mut summary[n - group.len()..] {
        b.bytes_after = stored.len() as u64;
        b.compressed.clone_from(&compressed);
    }
    Ok(stored)
}

/// The entries of `b` that stay (its host entries, and the device entries
/// `keep` says) in table order, their bytes the next ones `stream` hands
/// out.
fn kept_entries<'a>(
    input: &Path,
    b: &BundleInfo,
    stream: &mut FatbinStream<'a>,
    keep: Keep,
) -> Result<Vec<(String, Blob<'a>)>> {
    let stays: Vec<bool> = b
        .entries
        .iter()
        .map(|e| e.is_host() || keep(e.target()))
        .collect();
    let mut data: Vec<Option<Blob<'a>>> = vec![None; b.entries.len()];
    for _ in stays.iter().filter(|s| **s) {
        match stream.next().with_path(input)? {
            // Its place: an entry that stays, not handed out before.
            Some(s)
                if s.bundle == b.index
                    && stays.get(s.entry) == Some(&true)
                    && data[s.entry].is_none() =>
            {
                data[s.entry] = Some(s.data);
            }
            _ => return Err(disagree(input, b.index)),
        }
    }
    Ok(b.entries
        .iter()
        .zip(data)
        .filter_map(|(e, d)| Some((e.triple.clone(), d?)))
        .collect())
}

/// Reading bundle `index` did not give the entries its table lists (a bug:
/// both read the same bytes).
fn disagree(input: &Path, index: usize) -> Error {
    Error::request(
        input,
        format!("internal error: bundle {index} does not read as its entry table lists it"),
    )
}

/// The device targets of `b` that `keep` keeps, and those it drops.
fn partition(b: &BundleInfo, keep: Keep) -> (Vec<String>, Vec<String>) {
    b.device_entries()
        .map(|e| e.target().to_string())
        .partition(|t| keep(t.as_str()))
}

/// The alignment of a bundle's device entries: the largest power of two,
/// at most 4096 (clang's), dividing each non-empty entry's offset.
fn entry_alignment(b: &BundleInfo) -> usize {
    b.device_entries()
        .filter(|e| e.size > 0)
        .map(|e| 1u64 << e.offset.trailing_zeros().min(12))
        .min()
        .unwrap_or(1) as usize
}

/// The CCOB version of a compressed bundle written by [`recompress`].
fn ccob_version(stored: &[u8]) -> u16 {
    u16::from_le_bytes([stored[4], stored[5]])
}

/// Compress `plain` as the compressed bundle `ccob` was: same method, same
/// version unless a size needs v3.
fn recompress(input: &Path, plain: &[u8], ccob: &Ccob) -> Result<Vec<u8>> {
    Compressor::new(ccob.method)
        .version(ccob.version)
        .fitting(true)
        .compress(plain)
        .map_err(|source| Error::Compress {
            path: input.into(),
            what: "a pruned bundle",
            source,
        })
}

/// The targets kept and dropped, over all bundles, sorted; refused when
/// nothing is kept.
fn kept_and_dropped(
    input: &Path,
    selection: &Selection,
    bundles: &[BundleInfo],
    keep: Keep,
) -> Result<(Vec<String>, Vec<String>)> {
    let (mut kept, mut dropped) = (Vec::new(), Vec::new());
    for b in bundles {
        let (k, d) = partition(b, keep);
        kept.extend(k);
        dropped.extend(d);
    }
    for v in [&mut kept, &mut dropped] {
        v.sort();
        v.dedup();
    }
    if kept.is_empty() {
        return Err(Error::request(
            input,
            format!(
                "none of its code objects is for {} (it has {})",
                selection.targets.join(", "),
                dropped.join(", ")
            ),
        ));
    }
    Ok((kept, dropped))
}

#[cfg(test)]
mod tests;
